//! The bounds the contract states. The server enforces its own constants (the domain's
//! and the API's); `tests/openapi.rs` holds these to them, so the document never states
//! a bound the server does not keep.

/// Most events one append may carry.
pub const MAX_BATCH_EVENTS: usize = 99;
/// Largest request body, in bytes (larger is 413).
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Longest id (`run_id`, `request_id`, `tool_call_id`, `approval_id`, `delivery_id`).
pub const MAX_ID_BYTES: usize = 128;
/// The characters of an id, as a regular expression.
pub const ID_PATTERN: &str = "^[A-Za-z0-9_.:-]{1,128}$";
/// Most events one replay page answers (`limit`).
pub const MAX_PAGE_EVENTS: usize = 1000;
/// Longest `tool_name`, in bytes.
pub const MAX_TOOL_NAME: usize = 128;
/// Longest `url`, in bytes.
pub const MAX_URL: usize = 2048;
/// Longest `intention` or `message`, in bytes.
pub const MAX_TEXT: usize = 4096;
/// Longest `arguments_hash`, in bytes.
pub const MAX_HASH: usize = 256;
/// Longest decision `reason`, in characters.
pub const MAX_REASON: usize = 1024;
/// A decision `reason`: no control characters.
pub const REASON_PATTERN: &str = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$";
/// Largest `arguments_preview`, serialized after redaction and truncation, in bytes.
pub const MAX_PREVIEW_BYTES: usize = 4096;
/// Deepest `arguments_preview`: the object itself is level 1.
pub const MAX_PREVIEW_DEPTH: usize = 4;
/// Longest string in an `arguments_preview`, in characters; a longer one is cut there
/// and ends with `PREVIEW_TRUNCATED`.
pub const MAX_PREVIEW_STRING: usize = 256;
/// What ends a string an `arguments_preview` cut.
pub const PREVIEW_TRUNCATED: &str = "…[truncated]";
/// What replaces a value under a secret-looking key in an `arguments_preview`.
pub const PREVIEW_REDACTED: &str = "[redacted]";
/// A key whose value an `arguments_preview` never shows contains, normalised (lower-cased,
/// every character that is not a letter or digit dropped: `X-Api-Key` reads `xapikey`),
/// one of these. Substrings over-redact on purpose (`max_tokens` contains `token`).
pub const PREVIEW_SECRET_KEYS: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "pwd",
    "secret",
    "token",
    "apikey",
    "authorization",
    "cookie",
    "privatekey",
    "credential",
    "session",
    "signature",
    "dsn",
    "databaseurl",
    "connectionstring",
];
/// A normalised key is secret too when it begins or ends with this (`auth`, `basicauth`,
/// `authheader`), except where it begins with `author` (`author`, `authority`).
pub const PREVIEW_SECRET_AUTH: &str = "auth";
/// Longest a card may wait (a deployment may cap it lower:
/// `TOLLGATE_MAX_CARD_TIMEOUT_SECONDS`, 24 h unless set).
pub const MAX_TIMEOUT_SECONDS: u64 = 7 * 24 * 3600;
/// Longest `owner`, `project_id`, `channel_id`, `delivery_id`, in characters.
pub const MAX_HEAD_TEXT: usize = 256;
/// Longest `agenthost_origin`, in characters.
pub const MAX_ORIGIN: usize = 2048;
/// Most tools a run's `budget.tools` may name.
pub const MAX_BUDGET_TOOLS: usize = 64;
/// Most cards one `GET /api/approvals` page answers (`limit`).
pub const MAX_LISTED_CARDS: usize = 500;
/// Most grants one `GET /api/policies` page answers (`limit`).
pub const MAX_LISTED_POLICIES: usize = 500;
/// Most runs one `GET /api/runs` page answers (`limit`).
pub const MAX_LISTED_RUNS: usize = 200;
/// Most runs one `GET /api/runs` page reads, whatever its filters match.
pub const MAX_RUNS_EXAMINED: usize = 1000;
/// Most bytes of `GET /api/runs`' `owner` and `q`.
pub const MAX_RUN_FILTER: usize = 256;
/// Most records one `GET /api/runs/{run_id}/mutations` answers (`limit`).
pub const MAX_LISTED_MUTATIONS: usize = 1000;
/// A producer event's `type`, as a regular expression (server-owned types, and types
/// that start with one's name, are refused besides).
pub const EVENT_TYPE_PATTERN: &str = "^[a-z][a-z0-9_.]{0,63}$";
/// Longest producer `event_id`, in characters.
pub const MAX_EVENT_ID: usize = 128;

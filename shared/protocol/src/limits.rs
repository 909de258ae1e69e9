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

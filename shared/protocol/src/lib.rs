//! Tollgate's HTTP contract as types (`docs/architecture.md` §5): the bodies every public
//! route takes and answers, the error body, the event envelope of replay and the live
//! stream, and [`operations::OPERATIONS`], the one list of the routes with the bodies,
//! credentials and statuses each carries. The server (`shared/api`) parses and answers
//! through these types, and with the feature `schema` [`openapi::document`] generates the
//! OpenAPI 3.1 document from them (committed as `openapi.json`, served by
//! `tollgate serve` at `GET /api/openapi.json`).
//!
//! The domain crate keeps the rules; this crate keeps the shapes. Bounds a field carries
//! (lengths, counts) are in [`limits`], stated once for the server's checks and the
//! document.

pub mod approvals;
pub mod console;
pub mod errors;
pub mod events;
pub mod execution;
pub mod limits;
pub mod notifications;
pub mod operations;
pub mod payloads;
pub mod runs;
pub mod slack;
pub mod ws;

#[cfg(feature = "schema")]
pub mod openapi;

pub use errors::ErrorBody;
pub use events::Event;

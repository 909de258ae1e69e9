//! Request-body and query parsing with the contract's limits and JSON errors.

use axum::body::Body;
use axum::extract::FromRequest;
use axum::http::Request;
use serde_json::Value;

use crate::ApiError;

/// Bodies over 256 KiB are refused with 413 before they are parsed.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// Beyond this a body is not even read to the end (the connection is closed).
const DRAIN_LIMIT_BYTES: usize = 8 * 1024 * 1024;

/// A request body, read only when the handler asks — after it has checked the caller,
/// so an unauthenticated request never makes the server buffer or parse its body.
/// Empty bodies read as `Value::Null`; malformed JSON is a 400 naming the position;
/// oversized bodies a 413.
pub struct JsonBody(Body);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = std::convert::Infallible;

    async fn from_request(req: Request<Body>, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(JsonBody(req.into_body()))
    }
}

impl JsonBody {
    pub async fn value(self) -> Result<Value, ApiError> {
        // Read (and discard) oversized bodies up to a bound before answering 413, so a
        // client still sending is not cut off mid-request with a connection reset.
        let bytes = axum::body::to_bytes(self.0, DRAIN_LIMIT_BYTES)
            .await
            .map_err(|_| ApiError::payload_too_large())?;
        if bytes.len() > MAX_BODY_BYTES {
            return Err(ApiError::payload_too_large());
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}")))
    }

    /// The body as an object (`null`/empty allowed when `optional`).
    pub async fn object(self, optional: bool) -> Result<serde_json::Map<String, Value>, ApiError> {
        match self.value().await? {
            Value::Object(map) => Ok(map),
            Value::Null if optional => Ok(serde_json::Map::new()),
            _ => Err(ApiError::bad_request("request body must be a JSON object")),
        }
    }
}

/// Parses `key=value` pairs of a query string (percent-decoding is not needed for the
/// numeric parameters we read).
pub fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

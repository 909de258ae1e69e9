//! Every error leaves as JSON `{"error": "...", "state"?: "..."}` with the status the
//! contract names. Nothing is written when a 4xx is returned: handlers validate fully
//! before they call a use-case.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tollgate_app::ErrorState;
use tollgate_store::StoreError;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub error: String,
    pub state: Option<ErrorState>,
    pub extra: Option<serde_json::Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, error: impl Into<String>) -> Self {
        Self {
            status,
            error: error.into(),
            state: None,
            extra: None,
        }
    }

    pub fn with_state(mut self, state: ErrorState) -> Self {
        self.state = Some(state);
        self
    }

    /// The same error, its message prefixed (e.g. with the field it is about).
    pub fn prefixed(mut self, prefix: &str) -> Self {
        self.error = format!("{prefix}{}", self.error);
        self
    }

    pub fn bad_request(msg: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, msg)
    }

    pub fn unauthorized(msg: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, msg)
    }

    pub fn forbidden(msg: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, msg)
    }

    pub fn not_found(msg: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, msg)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed on this route",
        )
    }

    pub fn payload_too_large() -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body is over 256 KiB",
        )
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::NotFound => ApiError::not_found("run not found"),
            StoreError::RunTerminal {
                status,
                terminal_seq,
            } => ApiError {
                status: StatusCode::CONFLICT,
                error: format!("run has ended ({})", status.as_str()),
                state: Some(ErrorState::RunTerminal),
                extra: Some(json!({"status": status.as_str(), "terminal_sequence": terminal_seq})),
            },
            StoreError::Conflict(msg) => ApiError::new(StatusCode::CONFLICT, msg),
            StoreError::Invalid(msg) => ApiError::bad_request(msg),
            StoreError::InvalidCursor => {
                ApiError::bad_request("cursor is not one this listing handed out")
            }
            StoreError::Limit(msg) => ApiError::new(StatusCode::TOO_MANY_REQUESTS, msg)
                .with_state(ErrorState::LimitReached),
            StoreError::Unavailable(detail) => {
                // The detail may name tables or SDK internals: log it, don't serve it.
                tracing::error!(%detail, "storage unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "storage is unavailable; retry",
                )
                .with_state(ErrorState::Unavailable)
            }
        }
    }
}

/// Every use-case refusal as HTTP, in one place.
impl From<tollgate_app::AppError> for ApiError {
    fn from(err: tollgate_app::AppError) -> Self {
        use tollgate_app::AppError;
        match err {
            AppError::NotFound { message, state } => {
                let e = ApiError::not_found(message);
                match state {
                    Some(state) => e.with_state(state),
                    None => e,
                }
            }
            AppError::Forbidden(message) => ApiError::forbidden(message),
            AppError::Invalid(message) => ApiError::bad_request(message),
            AppError::Conflict { message, state } => {
                let e = ApiError::new(StatusCode::CONFLICT, message);
                match state {
                    Some(state) => e.with_state(state),
                    None => e,
                }
            }
            AppError::Store(e) => e.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.error });
        if let Some(state) = self.state {
            body["state"] = state.as_str().into();
        }
        if let Some(serde_json::Value::Object(extra)) = self.extra {
            for (k, v) in extra {
                body[k] = v;
            }
        }
        let mut response = (self.status, axum::Json(body)).into_response();
        // Both ask the client to come back: say when (a client backs off from here).
        if self.status == StatusCode::SERVICE_UNAVAILABLE
            || self.status == StatusCode::TOO_MANY_REQUESTS
        {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

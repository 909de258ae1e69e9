//! Every error leaves as JSON `{"error": "...", "code": "...", "state"?: "...",
//! "request_id": "..."}` with the status the contract names: `error` is for people,
//! `code` ([`ErrorCode`]) for programs, `state` ([`ErrorState`]) says what stands, and
//! `request_id` is added on the way out ([`crate::request_id`]). Nothing is written when
//! a 4xx is returned: handlers validate fully before they call a use-case.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tollgate_app::ErrorState;
pub use tollgate_protocol::errors::ErrorCode;
use tollgate_protocol::ErrorBody;
use tollgate_store::StoreError;

/// The code of an error, for a program ([`ErrorCode`], the contract's closed set), from
/// what the server knows: its status, and the [`ErrorState`] that stands.
pub trait ErrorCodeFor {
    /// The code of an error that says no more than its status.
    fn for_status(status: StatusCode) -> ErrorCode;
    /// The code of an error whose `state` is `state` (at `status`).
    fn for_state(state: ErrorState, status: StatusCode) -> ErrorCode;
}

impl ErrorCodeFor for ErrorCode {
    fn for_status(status: StatusCode) -> ErrorCode {
        match status {
            StatusCode::BAD_REQUEST => ErrorCode::InvalidRequest,
            StatusCode::UNAUTHORIZED => ErrorCode::Unauthorized,
            StatusCode::FORBIDDEN => ErrorCode::Forbidden,
            StatusCode::NOT_FOUND => ErrorCode::NotFound,
            StatusCode::METHOD_NOT_ALLOWED => ErrorCode::MethodNotAllowed,
            StatusCode::CONFLICT => ErrorCode::Conflict,
            StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
            StatusCode::TOO_MANY_REQUESTS => ErrorCode::LimitReached,
            StatusCode::SERVICE_UNAVAILABLE => ErrorCode::Unavailable,
            s if s.is_client_error() => ErrorCode::InvalidRequest,
            _ => ErrorCode::Internal,
        }
    }

    fn for_state(state: ErrorState, status: StatusCode) -> ErrorCode {
        let code = match state {
            ErrorState::Unknown => ErrorCode::NotFound,
            ErrorState::Pending => ErrorCode::ApprovalPending,
            ErrorState::RunExists => ErrorCode::RunExists,
            ErrorState::RunTerminal => ErrorCode::RunTerminal,
            ErrorState::LimitReached => ErrorCode::LimitReached,
            ErrorState::Unavailable => ErrorCode::Unavailable,
            ErrorState::TimeoutTooLong => ErrorCode::TimeoutTooLong,
            ErrorState::RequestIdInUse => ErrorCode::RequestIdInUse,
            ErrorState::AgenthostUnreachable => ErrorCode::AgenthostUnreachable,
            ErrorState::TooManyStreams => ErrorCode::TooManyStreams,
        };
        // The state's code when it fits `status`'s class, else the status's own (a state
        // used at an unexpected status never makes the code contradict the status).
        let fits = match code {
            ErrorCode::InvalidRequest | ErrorCode::TimeoutTooLong => {
                status == StatusCode::BAD_REQUEST
            }
            ErrorCode::NotFound => status == StatusCode::NOT_FOUND,
            ErrorCode::Conflict
            | ErrorCode::RunExists
            | ErrorCode::RunTerminal
            | ErrorCode::RequestIdInUse
            | ErrorCode::ApprovalPending => status == StatusCode::CONFLICT,
            ErrorCode::LimitReached | ErrorCode::TooManyStreams => {
                status == StatusCode::TOO_MANY_REQUESTS
            }
            ErrorCode::Unavailable | ErrorCode::AgenthostUnreachable => {
                status == StatusCode::SERVICE_UNAVAILABLE
            }
            _ => ErrorCode::for_status(status) == code,
        };
        if fits {
            code
        } else {
            ErrorCode::for_status(status)
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub error: String,
    /// What the error means, for a program (follows `state` when there is one).
    pub code: ErrorCode,
    pub state: Option<ErrorState>,
    /// A run that has ended: its status and the sequence of its terminal event.
    pub run_ended: Option<(&'static str, u64)>,
    /// A refused execution step: the attempt's (or card's) state and facts.
    pub execution: Option<ExecutionRefusal>,
}

/// What a refused execution step answers beside `error` (docs/architecture.md §7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionRefusal {
    /// The attempt's state (or, before any attempt, the card's).
    pub state: &'static str,
    /// Why a `not_executed` attempt did not execute.
    pub reason: Option<&'static str>,
    /// The attempt that blocks a new start.
    pub approval_id: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, error: impl Into<String>) -> Self {
        Self {
            status,
            error: error.into(),
            code: ErrorCode::for_status(status),
            state: None,
            run_ended: None,
            execution: None,
        }
    }

    /// The state that stands; the code follows it.
    pub fn with_state(mut self, state: ErrorState) -> Self {
        self.state = Some(state);
        self.code = ErrorCode::for_state(state, self.status);
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
                run_ended: Some((status.as_str(), terminal_seq)),
                ..ApiError::new(
                    StatusCode::CONFLICT,
                    format!("run has ended ({})", status.as_str()),
                )
                .with_state(ErrorState::RunTerminal)
            },
            StoreError::Conflict(msg) => ApiError::new(StatusCode::CONFLICT, msg),
            StoreError::Invalid(msg) => ApiError::bad_request(msg),
            StoreError::InvalidCursor => {
                ApiError::bad_request("cursor is not one this listing handed out")
            }
            StoreError::Limit(msg) => ApiError::new(StatusCode::TOO_MANY_REQUESTS, msg)
                .with_state(ErrorState::LimitReached),
            // Cards armed while the run was ending, round after round: retrying ends them.
            StoreError::CardsOpen(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "approval requests were being armed while the run ended; retry",
            )
            .with_state(ErrorState::Unavailable),
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

impl ApiError {
    /// The error as its JSON body says it (a WebSocket `error` frame's `data`).
    pub fn body(&self, request_id: &str) -> ErrorBody {
        let (state, reason, approval_id) = match &self.execution {
            Some(x) => (Some(x.state), x.reason, x.approval_id.clone()),
            None => (self.state.map(ErrorState::as_str), None, None),
        };
        ErrorBody {
            error: self.error.clone(),
            code: self.code.as_str().into(),
            state: state.map(Into::into),
            request_id: request_id.to_owned(),
            status: self.run_ended.map(|(status, _)| status.into()),
            terminal_sequence: self.run_ended.map(|(_, sequence)| sequence),
            reason: reason.map(Into::into),
            approval_id,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // `request_id` is filled in by the request-id layer, which knows the request
        // (request_id.rs).
        let body = self.body("");
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

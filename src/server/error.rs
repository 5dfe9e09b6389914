//! OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}` with the HTTP
//! status that says whose fault it was.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `not_found_error`, ...
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 about the request body; `param` names the field when there is one.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn with_status(mut self, status: StatusCode, kind: &'static str) -> ApiError {
        self.status = status;
        self.kind = kind;
        self
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::invalid(message, None).with_status(StatusCode::NOT_FOUND, "not_found_error")
    }

    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError::invalid(message, None).with_status(StatusCode::INTERNAL_SERVER_ERROR, "server_error")
    }

    /// 503: the server cannot take the request now (busy, shutting down); the client may retry.
    pub fn unavailable(message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError::server(message)
            .with_status(StatusCode::SERVICE_UNAVAILABLE, "server_error")
            .with_code(code)
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// Engine errors a request can cause are the client's (400); the rest are the server's (500).
impl From<crate::Error> for ApiError {
    fn from(e: crate::Error) -> ApiError {
        use crate::Error as E;
        match e {
            E::ContextOverflow { .. } => {
                ApiError::invalid(e.to_string(), Some("messages")).with_code("context_length_exceeded")
            }
            E::InvalidArgument(_) | E::Tokenizer(_) => ApiError::invalid(e.to_string(), None),
            other => ApiError::server(other.to_string()),
        }
    }
}

//! Kubernetes `Status` errors: the reason, the HTTP code, and causes naming the field.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An API error, rendered as a `Status` object.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: StatusCode,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    pub fn not_found(kind: &str, name: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{kind} {name:?} not found"),
        );
        e.details = Some(json!({"name": name, "kind": kind}));
        e
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", message)
    }

    /// 422 Invalid with one cause naming `field`.
    pub fn invalid(kind: &str, name: &str, field: &str, detail: &str) -> Self {
        let (cause_reason, cause_message) = if detail.starts_with("Required value") {
            ("FieldValueRequired", detail.to_owned())
        } else if detail.starts_with("Unsupported value") {
            ("FieldValueNotSupported", detail.to_owned())
        } else {
            ("FieldValueInvalid", detail.to_owned())
        };
        let mut e = Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("{kind} {name:?} is invalid: {field}: {detail}"),
        );
        e.details = Some(json!({
            "name": name,
            "kind": kind,
            "causes": [{"reason": cause_reason, "message": cause_message, "field": field}],
        }));
        e
    }

    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code.as_u16(),
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.code,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.to_status().to_string(),
        )
            .into_response()
    }
}

//! Kubernetes `Status` errors: the reason, the HTTP code, and causes naming the field.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use shoal_state::{ObjectError, StoreError};

use crate::replication::WriteError;

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

/// The Status of an object refused before it is written (`kind`/`name` for its details).
pub(crate) fn object_error(kind: &str, name: &str, e: ObjectError) -> ApiError {
    match e {
        ObjectError::TooLarge { .. } => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            e.to_string(),
        ),
        ObjectError::UnknownKind { .. } => ApiError::bad_request(e.to_string()),
        ObjectError::Invalid { field, reason } => ApiError::invalid(kind, name, &field, &reason),
    }
}

/// The Status of a write the replicated store refused or could not make durable: a write
/// below its quorum is 503 with a cause saying whether a retry may find it done.
pub(crate) fn write_error(kind: &str, name: &str, e: WriteError) -> ApiError {
    match e {
        WriteError::Store(e) => store_error(kind, name, e),
        e @ (WriteError::NotDurable { .. }
        | WriteError::Unavailable { .. }
        | WriteError::Home { .. }) => {
            // The cause tells a client whether a retry may find the write done: `NotDurable`
            // was stored here and replicates later; `Unavailable` stored nothing.
            let cause = match e {
                WriteError::NotDurable { .. } => "NotDurable",
                WriteError::Home { .. } => "HomeUnavailable",
                _ => "Unavailable",
            };
            let message = e.to_string();
            let mut err = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                &message,
            );
            err.details = Some(json!({"name": name, "kind": kind.to_lowercase(),
                "causes": [{"reason": cause, "message": message}], "retryAfterSeconds": 1}));
            err
        }
    }
}

/// The Status of a store error: not found, already exists, conflict, expired.
pub(crate) fn store_error(kind: &str, name: &str, e: StoreError) -> ApiError {
    let plural_kind = kind.to_lowercase();
    match e {
        StoreError::NotFound { .. } => ApiError::not_found(&plural_kind, name),
        StoreError::AlreadyExists { .. } => {
            let mut err = ApiError::new(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{plural_kind} {name:?} already exists"),
            );
            err.details = Some(json!({"name": name, "kind": plural_kind}));
            err
        }
        StoreError::Conflict { reason, .. } => {
            let mut err = ApiError::new(
                StatusCode::CONFLICT,
                "Conflict",
                format!("Operation cannot be fulfilled on {plural_kind} {name:?}: {reason}"),
            );
            err.details = Some(json!({"name": name, "kind": plural_kind}));
            err
        }
        StoreError::Expired { .. } => ApiError::new(StatusCode::GONE, "Expired", e.to_string()),
        other => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            other.to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_below_quorum_says_whether_it_was_stored() {
        let stored = write_error(
            "ConfigMap",
            "c",
            WriteError::NotDurable {
                acked: 1,
                needed: 2,
                why: "confirmed it within 5s".into(),
            },
        )
        .to_status();
        let nothing = write_error(
            "ConfigMap",
            "c",
            WriteError::Unavailable {
                reachable: 1,
                needed: 2,
            },
        )
        .to_status();
        for (status, cause) in [(&stored, "NotDurable"), (&nothing, "Unavailable")] {
            assert_eq!(status["code"], 503);
            assert_eq!(status["reason"], "ServiceUnavailable");
            assert_eq!(status["details"]["causes"][0]["reason"], cause, "{status}");
            assert_eq!(status["details"]["name"], "c");
        }
        assert!(
            nothing["message"]
                .as_str()
                .unwrap()
                .contains("nothing was written")
        );
    }
}

//! The API's error value and its OpenAI-shaped JSON body (`{"error": {"message", "type", "param",
//! "code"}}`), which the `openai` client turns into its typed exceptions.
//!
//! Owns the status codes and error codes of every refusal. Must not do I/O.

use serde_json::{Value, json};

/// One refused or failed request: the HTTP status and a one-line message naming the problem.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// The request field at fault (`messages[1].role`), when one is.
    pub param: Option<String>,
    /// A stable machine-readable code (`context_length_exceeded`, `model_not_found`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 about one field: the message starts with the field's name.
    pub fn field(param: impl Into<String>, why: impl std::fmt::Display) -> ApiError {
        let param = param.into();
        ApiError {
            status: 400,
            message: format!("{param}: {why}"),
            param: Some(param),
            code: None,
        }
    }

    /// A request-level error with `status` and no field.
    pub fn status(status: u16, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// The OpenAI error type for the status.
    fn kind(&self) -> &'static str {
        match self.status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }

    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}

/// The reason phrase of the statuses the server sends.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_errors_name_the_field_in_message_and_param() {
        let e = ApiError::field("temperature", "must be a number");
        assert_eq!(e.status, 400);
        let b = e.body();
        assert_eq!(b["error"]["message"], "temperature: must be a number");
        assert_eq!(b["error"]["param"], "temperature");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["code"], Value::Null);
        let q = ApiError::status(429, "queue full").with_code("rate_limit_exceeded");
        assert_eq!(q.body()["error"]["type"], "rate_limit_error");
        assert_eq!(q.body()["error"]["code"], "rate_limit_exceeded");
    }
}

//! Who may use the API: the bind policy (loopback is open; any other address needs an API key) and
//! the key check (a Bearer token, or Anthropic's `x-api-key` header), compared in constant time
//! (`subtle`) so response timing does not reveal how much of a guessed key was right.
//!
//! Owns the key and the check. Must not do network I/O.

use std::net::SocketAddr;

use subtle::ConstantTimeEq;

use super::error::ApiError;

/// The API key clients must present, if any.
#[derive(Clone, Default)]
pub struct ApiKey(Option<Vec<u8>>);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ApiKey(set)"
        } else {
            "ApiKey(none)"
        })
    }
}

impl ApiKey {
    pub fn none() -> ApiKey {
        ApiKey(None)
    }

    /// The key in environment variable `var` (`--api-key-env VAR`); it must be set and not empty.
    pub fn from_env(var: &str) -> Result<ApiKey, String> {
        match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => Ok(ApiKey(Some(v.trim().as_bytes().to_vec()))),
            Ok(_) => Err(format!("--api-key-env {var}: the variable is empty")),
            Err(_) => Err(format!("--api-key-env {var}: the variable is not set")),
        }
    }

    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// Check a request's key: `x-api-key` when sent (Anthropic's clients), else `Authorization`.
    pub fn check_request(&self, req: &super::http::Request) -> Result<(), ApiError> {
        match (&self.0, req.header("x-api-key")) {
            (Some(key), Some(given)) => {
                if bool::from(given.trim().as_bytes().ct_eq(key)) {
                    Ok(())
                } else {
                    Err(ApiError::status(401, "invalid API key").with_code("invalid_api_key"))
                }
            }
            _ => self.check(req.header("authorization")),
        }
    }

    /// Check an `Authorization` header value against the key (always passes without a key).
    pub fn check(&self, authorization: Option<&str>) -> Result<(), ApiError> {
        let Some(key) = &self.0 else { return Ok(()) };
        let unauthorized = |why: &str| ApiError::status(401, why).with_code("invalid_api_key");
        let Some(value) = authorization else {
            return Err(unauthorized(
                "missing API key: send Authorization: Bearer <key> (or x-api-key: <key>)",
            ));
        };
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .map(str::trim)
            .ok_or_else(|| unauthorized("Authorization must be \"Bearer <key>\""))?;
        if bool::from(token.as_bytes().ct_eq(key)) {
            Ok(())
        } else {
            Err(unauthorized("invalid API key"))
        }
    }
}

/// Whether serving on `addr` without a key is allowed: only loopback addresses are.
pub fn check_bind(addr: &SocketAddr, key: &ApiKey) -> Result<(), String> {
    if addr.ip().is_loopback() || key.is_set() {
        Ok(())
    } else {
        Err(format!(
            "binding to {} (not loopback) needs an API key: pass --api-key-env VAR with the key in $VAR",
            addr.ip()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_key_is_required_and_compared() {
        let k = ApiKey(Some(b"s3cret".to_vec()));
        assert!(k.check(Some("Bearer s3cret")).is_ok());
        assert_eq!(k.check(Some("Bearer s3cre")).unwrap_err().status, 401);
        assert_eq!(k.check(Some("Bearer s3cretX")).unwrap_err().status, 401);
        assert_eq!(k.check(Some("s3cret")).unwrap_err().status, 401);
        assert_eq!(k.check(None).unwrap_err().status, 401);
        assert!(ApiKey::none().check(None).is_ok());
    }

    #[test]
    fn only_loopback_binds_without_a_key() {
        let key = ApiKey(Some(b"k".to_vec()));
        assert!(check_bind(&"127.0.0.1:8000".parse().unwrap(), &ApiKey::none()).is_ok());
        assert!(check_bind(&"[::1]:8000".parse().unwrap(), &ApiKey::none()).is_ok());
        let e = check_bind(&"0.0.0.0:8000".parse().unwrap(), &ApiKey::none()).unwrap_err();
        assert!(e.contains("--api-key-env"), "{e}");
        assert!(check_bind(&"0.0.0.0:8000".parse().unwrap(), &key).is_ok());
    }
}

//! Where a remote worker sends its requests: the endpoint's base URL (`…/v1`), the model asked for,
//! the API key and how long the server may stay silent.
//!
//! Owns checking and normalising what the user wrote (`--remote`, `--model`, `--api-key-env`,
//! the `[remote]` config table) into one value, with one-line errors naming the problem.

use std::time::Duration;

/// Default time the server may send nothing (no response headers, no stream bytes) before the turn
/// gives up. A long prompt's prefill happens before the first byte on some servers.
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// A checked endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteTarget {
    /// Base URL of the OpenAI API, ending in `/v1` (no trailing slash).
    pub base: String,
    /// The model to ask for; `None`: the first one the server lists.
    pub model: Option<String>,
    /// Sent as `Authorization: Bearer …`.
    pub api_key: Option<String>,
    /// Longest silence accepted from the server.
    pub timeout: Duration,
}

impl RemoteTarget {
    /// Checks `url` (http:// or https://; with or without the `/v1` suffix) and reads the API key
    /// from the environment variable `api_key_env` when one is named.
    pub fn new(
        url: &str,
        model: Option<String>,
        api_key_env: Option<&str>,
        timeout_secs: u64,
    ) -> Result<RemoteTarget, String> {
        let base = base_url(url)?;
        let api_key = match api_key_env {
            None => None,
            Some(var) => match std::env::var(var) {
                Ok(v) if !v.trim().is_empty() => Some(v.trim().to_string()),
                Ok(_) => return Err(format!("the API key variable {var} is empty")),
                Err(_) => return Err(format!("the API key variable {var} is not set")),
            },
        };
        if timeout_secs == 0 {
            return Err("the remote timeout must be at least 1 second".into());
        }
        Ok(RemoteTarget {
            base,
            model: model.filter(|m| !m.trim().is_empty()),
            api_key,
            timeout: Duration::from_secs(timeout_secs),
        })
    }

    /// The URL of an API path under the base (`"models"`, `"chat/completions"`).
    pub fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.base)
    }
}

/// `http://host:port[/prefix]` → `http://host:port[/prefix]/v1`.
pub fn base_url(url: &str) -> Result<String, String> {
    let url = url.trim();
    let rest = if let Some(r) = url.strip_prefix("http://") {
        r
    } else if let Some(r) = url.strip_prefix("https://") {
        if !cfg!(feature = "tls") {
            return Err(format!(
                "{url}: https needs a build with TLS (cargo build --release --features tls); http:// works without"
            ));
        }
        r
    } else {
        return Err(format!(
            "{url}: not an http:// or https:// URL (e.g. http://127.0.0.1:8000/v1)"
        ));
    };
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() {
        return Err(format!("{url}: the URL names no host"));
    }
    if rest.contains(['?', '#', ' ']) {
        return Err(format!("{url}: give the server's base URL, without a query or spaces"));
    }
    let trimmed = url.trim_end_matches('/');
    Ok(if trimmed.ends_with("/v1") {
        trimmed.to_string()
    } else {
        format!("{trimmed}/v1")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_end_in_v1() {
        assert_eq!(base_url("http://127.0.0.1:8000").unwrap(), "http://127.0.0.1:8000/v1");
        assert_eq!(base_url("http://h:1/v1/").unwrap(), "http://h:1/v1");
        assert_eq!(base_url(" http://h/api/ ").unwrap(), "http://h/api/v1");
        let t = RemoteTarget::new("http://h:8000/v1", Some("m".into()), None, 5).unwrap();
        assert_eq!(t.url("chat/completions"), "http://h:8000/v1/chat/completions");
    }

    #[test]
    fn bad_urls_are_one_line_errors() {
        for bad in ["h:8000", "ftp://h", "http://", "http:///v1", "http://h/?x=1"] {
            let e = base_url(bad).unwrap_err();
            assert!(e.contains(bad.trim()) && !e.contains('\n'), "{bad}: {e}");
        }
        assert!(RemoteTarget::new("http://h", None, None, 0).is_err());
        let e = RemoteTarget::new("http://h", None, Some("DS4_TEST_UNSET_KEY_VAR"), 5).unwrap_err();
        assert!(e.contains("DS4_TEST_UNSET_KEY_VAR"), "{e}");
    }
}

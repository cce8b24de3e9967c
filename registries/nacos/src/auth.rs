//! Credentials on the wire: the access token (from `/v1/auth/login` with the
//! username and password, or from a token file) and the access-key signature.
//!
//! - gRPC: `accessToken`, and `ak`, `data`, `signature` in `Metadata.headers`.
//! - HTTP: `Authorization: Bearer <token>` (Nacos reads it before the `accessToken`
//!   parameter, and a header never lands in a URL that an error message could print),
//!   and the same `ak`, `data`, `signature` headers.
//!
//! The signature is Nacos's naming signature: `data` is `<ms timestamp>@@<group>@@
//! <service>` for a service's requests and `<ms timestamp>` otherwise; `signature` is
//! base64(HmacSHA1(secret key, data)). A login token is renewed when nine tenths of
//! its `tokenTtl` have passed, and dropped when Nacos refuses it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use tokio::time::Instant;

use crate::api::{ApiError, NacosHttp};
use crate::config::Credentials;

/// A token and when to renew it (`None`: a token file's, never renewed by login).
#[derive(Clone, Debug)]
struct Token {
    value: String,
    renew_at: Option<Instant>,
}

/// The credentials and the token they gave.
#[derive(Debug)]
pub(crate) struct Auth {
    credentials: Credentials,
    token: Mutex<Option<Token>>,
}

/// base64(HmacSHA1(key, data)), as Nacos clients sign.
pub fn sign(data: &str, key: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, key.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(ring::hmac::sign(&key, data.as_bytes()))
}

impl Auth {
    pub(crate) fn new(credentials: Credentials) -> Auth {
        Auth {
            credentials,
            token: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Token>> {
        self.token.lock().expect("token poisoned")
    }

    /// Makes sure a usable token is held: reads the token file, or logs in at
    /// `server` when there is no token or it is due for renewal.
    pub(crate) async fn ensure(&self, http: &NacosHttp, server: &str) -> Result<(), ApiError> {
        let c = &self.credentials;
        if let Some(path) = &c.token_file {
            let value = std::fs::read_to_string(path)
                .map_err(|e| {
                    ApiError::Credentials(format!("the token file {}: {e}", path.display()))
                })?
                .trim()
                .to_string();
            *self.lock() = Some(Token {
                value,
                renew_at: None,
            });
            return Ok(());
        }
        let (Some(user), Some(password)) = (&c.username, &c.password) else {
            return Ok(());
        };
        let due = match &*self.lock() {
            Some(t) => t.renew_at.is_some_and(|at| Instant::now() >= at),
            None => true,
        };
        if !due {
            return Ok(());
        }
        let (value, ttl) = http.login(server, user, password).await?;
        let ttl = Duration::from_secs(ttl.max(1));
        *self.lock() = Some(Token {
            value,
            renew_at: Some(Instant::now() + ttl - ttl / 10),
        });
        Ok(())
    }

    /// Forgets a token Nacos refused, so that the next [`Auth::ensure`] logs in again.
    pub(crate) fn refused(&self) {
        let mut token = self.lock();
        if token.as_ref().is_some_and(|t| t.renew_at.is_some()) {
            *token = None;
        }
    }

    /// Whether any credential is configured.
    pub(crate) fn configured(&self) -> bool {
        let c = &self.credentials;
        c.username.is_some() || c.token_file.is_some() || c.access_key.is_some()
    }

    /// The credential headers of a request, for service `resource` (group, name)
    /// when it is about one. Header names as Nacos's gRPC clients send them.
    pub(crate) fn headers(&self, resource: Option<(&str, &str)>) -> BTreeMap<String, String> {
        let mut headers = BTreeMap::new();
        if let Some(token) = &*self.lock() {
            headers.insert("accessToken".to_string(), token.value.clone());
        }
        if let (Some(ak), Some(sk)) = (&self.credentials.access_key, &self.credentials.secret_key) {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis();
            let data = match resource {
                Some((group, service)) => format!("{now}@@{group}@@{service}"),
                None => now.to_string(),
            };
            headers.insert("signature".into(), sign(&data, sk));
            headers.insert("data".into(), data);
            headers.insert("ak".into(), ak.clone());
        }
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_java_client() {
        // The value Nacos's Java SignUtil gives for ("test", "test").
        assert_eq!(sign("test", "test"), "DJRRXBXlCVuKh6ULoN87847QX+Y=");
    }

    #[test]
    fn access_key_headers_sign_the_grouped_service() {
        let auth = Auth::new(Credentials {
            access_key: Some("ak1".into()),
            secret_key: Some("sk1".into()),
            ..Credentials::default()
        });
        let h = auth.headers(Some(("DEFAULT_GROUP", "web")));
        assert!(h["data"].ends_with("@@DEFAULT_GROUP@@web"), "{h:?}");
        assert_eq!(h["signature"], sign(&h["data"], "sk1"));
        assert_eq!(h["ak"], "ak1");
        assert!(!h.contains_key("accessToken"));
        assert!(!auth.headers(None)["data"].contains("@@"));
    }
}

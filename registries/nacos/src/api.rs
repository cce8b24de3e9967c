//! Errors of talking to Nacos ([`ApiError`], one vocabulary for both transports) and
//! the client of the 1.x HTTP open API ([`NacosHttp`]):
//!
//! - `POST /v1/auth/login` (form `username`, `password`): `{"accessToken", "tokenTtl"}`;
//! - `GET /v1/ns/service/list?pageNo&pageSize&namespaceId&groupName`:
//!   `{"count", "doms": [names]}`;
//! - `GET /v1/ns/instance/list?serviceName&groupName&namespaceId&healthyOnly=false`:
//!   a `ServiceInfo`.
//!
//! Paths are under the server's context path (`/nacos`). Credentials travel in
//! headers only, and error messages name the path, never a URL with a query.

use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;
use std::collections::BTreeMap;

use crate::config::{Error, NacosConfig, Result};

/// Why a request failed. Every kind is retried by the registry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// No answer: connection refused or reset, timeout, a gRPC stream that ended.
    #[error("cannot reach Nacos: {0}")]
    Transport(String),
    /// Nacos refused the credentials (HTTP 401/403, or a gRPC response with error
    /// code 401/403).
    #[error(
        "Nacos refused the credentials ({code}) for {what}: check the Nacos username and \
         password, token or access key, and their permissions: {message}"
    )]
    Denied {
        /// HTTP status or Nacos error code.
        code: i64,
        /// The refused path or request type (never a credential).
        what: String,
        /// Nacos's message.
        message: String,
    },
    /// A credential could not be read (the token file).
    #[error("Nacos credentials: {0}")]
    Credentials(String),
    /// Any other failure answer.
    #[error("Nacos answered {what} with {code}: {message}")]
    Status {
        /// The path or request type.
        what: String,
        /// HTTP status or Nacos error code.
        code: i64,
        /// Nacos's message.
        message: String,
    },
    /// The answer is not the expected JSON.
    #[error("Nacos's answer cannot be decoded: {0}")]
    Decode(String),
}

impl ApiError {
    /// A failure answer: `Denied` for 401 and 403, else `Status`.
    pub fn answer(code: i64, what: &str, message: &str) -> ApiError {
        let message: String = message.trim().chars().take(300).collect();
        if code == 401 || code == 403 {
            ApiError::Denied {
                code,
                what: what.to_string(),
                message,
            }
        } else {
            ApiError::Status {
                what: what.to_string(),
                code,
                message,
            }
        }
    }

    /// Whether Nacos refused the credentials.
    pub fn is_denied(&self) -> bool {
        matches!(self, ApiError::Denied { .. })
    }
}

/// The Nacos HTTP API client. Cheap to clone.
#[derive(Clone, Debug)]
pub struct NacosHttp {
    http: reqwest::Client,
}

fn transport(err: reqwest::Error) -> ApiError {
    // Without the URL: a query could hold what a server echoed back.
    let err = err.without_url();
    let mut message = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        message = format!("{message}: {s}");
        source = s.source();
    }
    ApiError::Transport(message)
}

impl NacosHttp {
    /// A client with the configured timeouts. Installs ring as the process's rustls
    /// crypto provider if none is installed (for `https` servers).
    pub fn new(config: &NacosConfig) -> Result<NacosHttp> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(config.request_timeout)
            .timeout(config.request_timeout * 2)
            .user_agent(concat!("meshfed-nacos/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::Client(e.to_string()))?;
        Ok(NacosHttp { http })
    }

    /// `POST <server>/v1/auth/login`: the access token and its time to live (s).
    pub async fn login(
        &self,
        server: &str,
        username: &str,
        password: &str,
    ) -> Result<(String, u64), ApiError> {
        let mut form = reqwest::Url::parse("http://form/").expect("a valid URL");
        form.query_pairs_mut()
            .append_pair("username", username)
            .append_pair("password", password);
        let body = form.query().unwrap_or_default().to_string();
        let request = self
            .http
            .post(format!("{server}/v1/auth/login"))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(body);
        let value = self.send("/v1/auth/login", request).await?;
        let token = value["accessToken"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ApiError::Decode("the login answer has no accessToken".into()))?;
        let ttl = value["tokenTtl"].as_u64().unwrap_or(18_000);
        Ok((token.to_string(), ttl))
    }

    /// `GET <server>/v1/ns/service/list`: the total count and this page's names.
    pub async fn service_list(
        &self,
        server: &str,
        headers: &BTreeMap<String, String>,
        (namespace, group): (&str, &str),
        page_no: u32,
        page_size: u32,
    ) -> Result<(u64, Vec<String>), ApiError> {
        let request = self
            .http
            .get(url(
                server,
                "/v1/ns/service/list",
                &[
                    ("pageNo", &page_no.to_string()),
                    ("pageSize", &page_size.to_string()),
                    ("namespaceId", namespace),
                    ("groupName", group),
                ],
            )?)
            .headers(http_headers(headers)?);
        let value = self.send("/v1/ns/service/list", request).await?;
        let names = match &value["doms"] {
            Value::Array(names) => names
                .iter()
                .filter_map(|n| n.as_str().map(str::to_string))
                .collect(),
            Value::Null => Vec::new(),
            other => return Err(ApiError::Decode(format!("doms is not a list: {other}"))),
        };
        Ok((value["count"].as_u64().unwrap_or(0), names))
    }

    /// `GET <server>/v1/ns/instance/list` (every instance, healthy or not).
    pub async fn instance_list(
        &self,
        server: &str,
        headers: &BTreeMap<String, String>,
        (namespace, group, service): (&str, &str, &str),
    ) -> Result<Value, ApiError> {
        let request = self
            .http
            .get(url(
                server,
                "/v1/ns/instance/list",
                &[
                    ("serviceName", service),
                    ("groupName", group),
                    ("namespaceId", namespace),
                    ("healthyOnly", "false"),
                ],
            )?)
            .headers(http_headers(headers)?);
        self.send("/v1/ns/instance/list", request).await
    }

    async fn send(&self, path: &str, request: reqwest::RequestBuilder) -> Result<Value, ApiError> {
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        let body = response.bytes().await.map_err(transport)?;
        if !status.is_success() {
            let message = String::from_utf8_lossy(&body);
            let code = i64::from(status.as_u16());
            return Err(match status {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    ApiError::answer(code, path, &message)
                }
                _ => ApiError::Status {
                    what: path.to_string(),
                    code,
                    message: message.trim().chars().take(300).collect(),
                },
            });
        }
        serde_json::from_slice(&body).map_err(|e| ApiError::Decode(format!("{path}: {e}")))
    }
}

fn url(server: &str, path: &str, query: &[(&str, &str)]) -> Result<reqwest::Url, ApiError> {
    let mut url = reqwest::Url::parse(&format!("{server}{path}"))
        .map_err(|e| ApiError::Transport(format!("{server}{path}: {e}")))?;
    url.query_pairs_mut().extend_pairs(query);
    Ok(url)
}

/// The credential headers for HTTP: the token as `Authorization: Bearer`, the rest
/// as they are; every value marked sensitive.
fn http_headers(headers: &BTreeMap<String, String>) -> Result<HeaderMap, ApiError> {
    let bad = |name: &str| ApiError::Credentials(format!("{name} is not a valid header value"));
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let (name, value) = if name == "accessToken" {
            (AUTHORIZATION, format!("Bearer {value}"))
        } else {
            (
                HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad(name))?,
                value.clone(),
            )
        };
        let mut value = HeaderValue::from_str(&value).map_err(|_| bad(name.as_str()))?;
        value.set_sensitive(true);
        map.insert(name, value);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denied_is_told_apart_and_never_holds_a_credential() {
        let e = ApiError::answer(403, "/v1/ns/service/list", "token invalid!");
        assert!(e.is_denied());
        assert!(e.to_string().contains("/v1/ns/service/list"));
        assert!(!ApiError::answer(500, "x", "boom").is_denied());
    }

    #[test]
    fn tokens_go_in_the_authorization_header() {
        let h = BTreeMap::from([("accessToken".to_string(), "t0k".to_string())]);
        let map = http_headers(&h).unwrap();
        assert_eq!(map[AUTHORIZATION], "Bearer t0k");
        assert!(map[AUTHORIZATION].is_sensitive());
    }
}

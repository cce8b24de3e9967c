//! A small client for the parts of Consul's HTTP API the registry reads, and the wire
//! shapes of their answers.
//!
//! - `GET /v1/catalog/services`: `{"<name>": ["<tag>", ...], ...}`, blocking.
//! - `GET /v1/health/service/<name>`: `[{"Node": {...}, "Service": {...}, "Checks":
//!   [...]}, ...]`, blocking. Entries are returned as raw JSON so that one malformed
//!   entry can be skipped without losing the others ([`HealthEntry::parse`]).
//! - `GET /v1/agent/self` and `GET /v1/catalog/datacenters`: the local datacenter.
//!
//! Blocking queries send `index` (the last `X-Consul-Index` seen) and `wait`; the
//! token goes in the `X-Consul-Token` header, never in the URL.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::config::{ConsulConfig, Error, Result};

/// The header carrying the ACL token.
pub const TOKEN_HEADER: &str = "X-Consul-Token";
/// The header carrying a blocking endpoint's index.
pub const INDEX_HEADER: &str = "X-Consul-Index";

/// Why a request failed. Every kind is retried by the registry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// No answer: connection refused or reset, timeout, TLS failure.
    #[error("cannot reach Consul: {0}")]
    Transport(String),
    /// The token is missing, unknown or lacks a permission (401/403).
    #[error(
        "Consul refused the ACL token (HTTP {status}) for {path}: check --consulToken \
         (or --consulTokenFile) and the token's ACL policy: {message}"
    )]
    Denied {
        /// HTTP status.
        status: u16,
        /// The refused endpoint's path (never the token, which is only ever sent in
        /// a header).
        path: String,
        /// Consul's message.
        message: String,
    },
    /// Any other non-success answer.
    #[error("Consul answered HTTP {status}: {message}")]
    Status {
        /// HTTP status.
        status: u16,
        /// Consul's message.
        message: String,
    },
    /// The body is not the expected JSON.
    #[error("Consul's answer cannot be decoded: {0}")]
    Decode(String),
}

/// A blocking endpoint's answer: the body and the `X-Consul-Index` header (`None`
/// when absent or not a number).
#[derive(Clone, Debug, PartialEq)]
pub struct Indexed<T> {
    /// `X-Consul-Index`.
    pub index: Option<u64>,
    /// The decoded body.
    pub value: T,
}

/// `GET /v1/agent/self`, the part the registry reads.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AgentSelf {
    /// The agent's configuration.
    pub config: AgentConfig,
}

/// `Config` of `/v1/agent/self`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AgentConfig {
    /// The agent's datacenter.
    pub datacenter: String,
    /// The agent's node name.
    #[serde(default)]
    pub node_name: String,
}

/// One entry of `/v1/health/service/<name>`: an instance, its node and its checks.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct HealthEntry {
    /// The node the instance is registered on.
    pub node: Node,
    /// The instance.
    pub service: AgentService,
    /// Node-level and instance-level checks.
    #[serde(default, deserialize_with = "null_default")]
    pub checks: Vec<HealthCheck>,
}

impl HealthEntry {
    /// Decodes one raw entry.
    pub fn parse(raw: &Value) -> Result<HealthEntry, String> {
        HealthEntry::deserialize(raw).map_err(|e| e.to_string())
    }
}

/// A catalog node.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Node {
    /// Node name.
    #[serde(rename = "Node")]
    pub name: String,
    /// Node address (the instance address when the service has none).
    pub address: String,
    /// The node's datacenter.
    #[serde(default, deserialize_with = "null_default")]
    pub datacenter: String,
}

/// A registered service instance.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AgentService {
    /// Instance id, unique on its node.
    #[serde(rename = "ID")]
    pub id: String,
    /// Service name.
    #[serde(rename = "Service")]
    pub name: String,
    /// Tags.
    #[serde(default, deserialize_with = "null_default")]
    pub tags: Vec<String>,
    /// Instance address; empty means the node's.
    #[serde(default, deserialize_with = "null_default")]
    pub address: String,
    /// Service metadata.
    #[serde(default, deserialize_with = "null_default")]
    pub meta: BTreeMap<String, String>,
    /// Port.
    pub port: u16,
    /// DNS SRV weights.
    #[serde(default)]
    pub weights: Option<Weights>,
}

/// `Weights` of an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Weights {
    /// Weight while passing.
    #[serde(default)]
    pub passing: u32,
    /// Weight while warning.
    #[serde(default)]
    pub warning: u32,
}

/// A health check.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct HealthCheck {
    /// Check id.
    #[serde(rename = "CheckID", default)]
    pub check_id: String,
    /// `passing`, `warning`, `critical` or `maintenance`.
    pub status: String,
    /// The instance the check belongs to; empty for node checks.
    #[serde(rename = "ServiceID", default, deserialize_with = "null_default")]
    pub service_id: String,
}

fn null_default<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A Consul HTTP API client. Cheap to clone (one shared connection pool).
#[derive(Clone, Debug)]
pub struct ConsulClient {
    http: reqwest::Client,
    base: Url,
    datacenter: Option<String>,
}

impl ConsulClient {
    /// A client for `config.url` with its token, CA certificate and datacenter.
    /// Installs ring as the process's rustls crypto provider if none is installed.
    pub fn new(config: &ConsulConfig) -> Result<ConsulClient> {
        let mut base = Url::parse(&config.url)
            .map_err(|e| Error::Config(format!("the Consul URL {:?}: {e}", config.url)))?;
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        // reqwest is built without a crypto provider of its own (only ring is in the
        // build); it panics when none is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut headers = HeaderMap::new();
        if let Some(token) = config.token.as_deref().filter(|t| !t.is_empty()) {
            let mut value = HeaderValue::from_str(token)
                .map_err(|_| Error::Config("the ACL token is not a valid header value".into()))?;
            value.set_sensitive(true);
            headers.insert(TOKEN_HEADER, value);
        }
        let mut builder = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(config.connect_timeout)
            .user_agent(concat!("meshfed-consul/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &config.ca_cert {
            let ca_error = |reason: String| Error::CaCert {
                path: path.clone(),
                reason,
            };
            let pem = std::fs::read(path).map_err(|e| ca_error(e.to_string()))?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| ca_error(e.to_string()))?;
            if certs.is_empty() {
                return Err(ca_error("no PEM certificate in the file".into()));
            }
            builder = builder.tls_certs_only(certs);
        }
        let http = builder.build().map_err(|e| Error::Client(e.to_string()))?;
        Ok(ConsulClient {
            http,
            base,
            datacenter: config.datacenter.clone(),
        })
    }

    /// The API base URL.
    pub fn base_url(&self) -> &Url {
        &self.base
    }

    /// `GET /v1/catalog/services`: service name -> tags. `index` 0 does not block.
    pub async fn catalog_services(
        &self,
        index: u64,
        wait: Duration,
    ) -> Result<Indexed<BTreeMap<String, Value>>, ApiError> {
        let url = self.url(&["v1", "catalog", "services"]);
        self.blocking(url, index, wait).await
    }

    /// `GET /v1/health/service/<name>`: every instance (any health) as raw JSON.
    /// `index` 0 does not block.
    pub async fn health_service(
        &self,
        name: &str,
        index: u64,
        wait: Duration,
    ) -> Result<Indexed<Vec<Value>>, ApiError> {
        let url = self.url(&["v1", "health", "service", name]);
        self.blocking(url, index, wait).await
    }

    /// `GET /v1/agent/self`.
    pub async fn agent_self(&self) -> Result<AgentSelf, ApiError> {
        let request = self
            .http
            .get(self.url(&["v1", "agent", "self"]))
            .timeout(Duration::from_secs(10));
        Ok(self.send(request).await?.1)
    }

    /// `GET /v1/catalog/datacenters`: known datacenters, nearest (the local one) first.
    pub async fn datacenters(&self) -> Result<Vec<String>, ApiError> {
        let request = self
            .http
            .get(self.url(&["v1", "catalog", "datacenters"]))
            .timeout(Duration::from_secs(10));
        Ok(self.send(request).await?.1)
    }

    /// The local datacenter: `/v1/agent/self`, else (the token may lack `agent:read`)
    /// the first of `/v1/catalog/datacenters`.
    pub async fn local_datacenter(&self) -> Result<String, ApiError> {
        match self.agent_self().await {
            Ok(agent) if !agent.config.datacenter.is_empty() => Ok(agent.config.datacenter),
            Ok(_) | Err(ApiError::Denied { .. } | ApiError::Decode(_)) => self
                .datacenters()
                .await?
                .into_iter()
                .next()
                .ok_or_else(|| ApiError::Decode("no datacenter listed".into())),
            Err(err) => Err(err),
        }
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        {
            let mut path = url.path_segments_mut().expect("http(s) URLs have a path");
            path.pop_if_empty();
            path.extend(segments);
        }
        if let Some(dc) = &self.datacenter {
            url.query_pairs_mut().append_pair("dc", dc);
        }
        url
    }

    async fn blocking<T: DeserializeOwned>(
        &self,
        mut url: Url,
        index: u64,
        wait: Duration,
    ) -> Result<Indexed<T>, ApiError> {
        // Consul adds up to wait/16 of jitter before answering an idle query.
        let mut timeout = Duration::from_secs(10);
        if index > 0 {
            url.query_pairs_mut()
                .append_pair("index", &index.to_string())
                .append_pair("wait", &format!("{}ms", wait.as_millis()));
            timeout += wait + wait / 16;
        }
        let (headers, value) = self.send(self.http.get(url).timeout(timeout)).await?;
        let index = headers
            .get(INDEX_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        Ok(Indexed { index, value })
    }

    async fn send<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(HeaderMap, T), ApiError> {
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        let path = response.url().path().to_string();
        let headers = response.headers().clone();
        let body = response.bytes().await.map_err(transport)?;
        if !status.is_success() {
            let message = String::from_utf8_lossy(&body)
                .trim()
                .chars()
                .take(300)
                .collect();
            return Err(match status {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ApiError::Denied {
                    status: status.as_u16(),
                    path,
                    message,
                },
                _ => ApiError::Status {
                    status: status.as_u16(),
                    message,
                },
            });
        }
        let value = serde_json::from_slice(&body).map_err(|e| ApiError::Decode(e.to_string()))?;
        Ok((headers, value))
    }
}

fn transport(err: reqwest::Error) -> ApiError {
    // The chain says what happened (connection refused, reset, ...).
    let mut message = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        message = format!("{message}: {s}");
        source = s.source();
    }
    ApiError::Transport(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn entries_decode_with_nulls_and_reject_bad_ports() {
        let raw = json!({
            "Node": {"ID": "x", "Node": "n1", "Address": "10.0.0.1", "Datacenter": "dc1",
                     "TaggedAddresses": null, "Meta": null},
            "Service": {"ID": "web-1", "Service": "web", "Tags": null, "Address": "",
                        "Meta": null, "Port": 8080, "Weights": {"Passing": 3, "Warning": 1}},
            "Checks": [{"CheckID": "serfHealth", "Status": "passing", "ServiceID": ""}]
        });
        let e = HealthEntry::parse(&raw).unwrap();
        assert_eq!(e.service.port, 8080);
        assert!(e.service.tags.is_empty());
        assert_eq!(e.service.weights.unwrap().passing, 3);
        let mut bad = raw.clone();
        bad["Service"]["Port"] = json!(70000);
        assert!(HealthEntry::parse(&bad).is_err());
        let mut bad = raw;
        bad["Node"] = json!("n1");
        assert!(HealthEntry::parse(&bad).is_err());
    }

    #[test]
    fn urls_keep_a_base_path_and_add_the_datacenter() {
        let config = ConsulConfig {
            datacenter: Some("dc2".into()),
            ..ConsulConfig::new("http://consul.local:8500/proxy")
        };
        let client = ConsulClient::new(&config).unwrap();
        assert_eq!(
            client.url(&["v1", "health", "service", "web"]).as_str(),
            "http://consul.local:8500/proxy/v1/health/service/web?dc=dc2"
        );
    }
}

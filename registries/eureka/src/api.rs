//! The Eureka REST API as the registry reads it, and the wire shapes of its answers.
//!
//! - `GET <service URL>/apps`: every application and instance,
//!   `{"applications": {"versions__delta", "apps__hashcode", "application": [...]}}`.
//! - `GET <service URL>/apps/delta`: the instances changed within the server's delta
//!   window (3 minutes by default), each with its `actionType` (`ADDED`, `MODIFIED`,
//!   `DELETED`), and the `apps__hashcode` of the whole registry as it is now.
//!
//! Both are asked with `Accept: application/json`. Eureka's JSON has quirks the
//! decoding takes as they come: a list of one element may be the element itself (the
//! XStream-era servers), `application` may be missing when there are none, ports are
//! `{"$": 8080, "@enabled": "true"}` with the number possibly a string, `metadata`
//! may carry an `@class` marker (`java.util.Collections$EmptyMap`), and the overridden
//! status is spelled `overriddenstatus` or `overriddenStatus`. Instances stay raw JSON
//! until [`Instance::parse`], so one malformed instance is skipped alone.
//!
//! Requests go to the servers in order ([`EurekaClient`]); credentials are sent as a
//! basic-auth header, never in a URL, and no URL the client builds holds any.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use reqwest::StatusCode;
use reqwest::header::{ACCEPT, HeaderValue};
use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer};
use serde_json::Value;
use tracing::{info, warn};

use crate::config::{Credentials, Error, EurekaConfig, Result};

/// Why a request failed. Every kind is retried by the registry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// No answer: connection refused or reset, timeout, TLS failure.
    #[error("cannot reach Eureka at {server}: {message}")]
    Transport {
        /// The server's URL (no credentials).
        server: String,
        /// What happened.
        message: String,
    },
    /// The credentials are missing or refused (HTTP 401), or the server forbids
    /// the request (HTTP 403: a role missing, or Eureka itself refusing access
    /// while it waits for its peers at start-up).
    #[error(
        "Eureka refused the request (HTTP {status}) for {url}: check the credentials \
         (user info of --eurekaServerURL, or --eurekaUsername/--eurekaPasswordFile){body}"
    )]
    Denied {
        /// 401 or 403.
        status: u16,
        /// The refused URL (no credentials).
        url: String,
        /// `: <the server's message>`, or empty.
        body: String,
    },
    /// Any other non-success answer.
    #[error("Eureka answered HTTP {status} for {url}{body}")]
    Status {
        /// HTTP status.
        status: u16,
        /// The URL (no credentials).
        url: String,
        /// `: <the server's message>`, or empty.
        body: String,
    },
    /// The body is not Eureka's JSON.
    #[error("Eureka's answer from {url} cannot be decoded: {message}")]
    Decode {
        /// The URL (no credentials).
        url: String,
        /// What is wrong.
        message: String,
    },
}

impl ApiError {
    /// Whether another server may do better (unreachable, or a 5xx).
    fn fails_over(&self) -> bool {
        match self {
            ApiError::Transport { .. } => true,
            ApiError::Status { status, .. } => *status >= 500,
            ApiError::Denied { .. } | ApiError::Decode { .. } => false,
        }
    }
}

/// `applications` of `/apps` and `/apps/delta`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Applications {
    /// `versions__delta` (a number or a string).
    #[serde(
        rename = "versions__delta",
        default,
        deserialize_with = "scalar_string"
    )]
    pub versions_delta: Option<String>,
    /// `apps__hashcode`: the server's reconcile hash code of its whole registry.
    #[serde(rename = "apps__hashcode", default, deserialize_with = "scalar_string")]
    pub apps_hashcode: Option<String>,
    /// The applications.
    #[serde(default, deserialize_with = "one_or_many")]
    pub application: Vec<Application>,
}

#[derive(Deserialize)]
struct Envelope {
    applications: Applications,
}

/// One application: its name and its instances (raw, see [`Instance::parse`]).
#[derive(Clone, Debug, Deserialize)]
pub struct Application {
    /// The application name (Eureka upper-cases it).
    pub name: String,
    /// Raw instances.
    #[serde(default, deserialize_with = "one_or_many")]
    pub instance: Vec<Value>,
}

/// An instance's `status` (Eureka's `InstanceStatus`); any other value is
/// [`InstanceStatus::Unknown`], as Eureka reads it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum InstanceStatus {
    /// Taking traffic.
    Up,
    /// Failed its health check.
    Down,
    /// Starting up.
    Starting,
    /// Taken out of service by an operator.
    OutOfService,
    /// Anything else.
    Unknown,
}

impl InstanceStatus {
    /// Eureka's reading of a status string.
    pub fn parse(s: &str) -> InstanceStatus {
        match s.trim().to_ascii_uppercase().as_str() {
            "UP" => InstanceStatus::Up,
            "DOWN" => InstanceStatus::Down,
            "STARTING" => InstanceStatus::Starting,
            "OUT_OF_SERVICE" => InstanceStatus::OutOfService,
            _ => InstanceStatus::Unknown,
        }
    }

    /// Eureka's name (what the reconcile hash code counts).
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceStatus::Up => "UP",
            InstanceStatus::Down => "DOWN",
            InstanceStatus::Starting => "STARTING",
            InstanceStatus::OutOfService => "OUT_OF_SERVICE",
            InstanceStatus::Unknown => "UNKNOWN",
        }
    }
}

impl fmt::Display for InstanceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A delta entry's `actionType`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ActionType {
    /// Registered.
    Added,
    /// Changed (status, metadata, ...).
    Modified,
    /// Cancelled or expired.
    Deleted,
}

/// A port of an instance: `{"$": 8080, "@enabled": "true"}`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct PortInfo {
    /// The number (0 when absent or out of range).
    pub port: u16,
    /// `@enabled`.
    pub enabled: bool,
}

/// One instance as the registry uses it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Instance {
    /// Eureka's instance id: `instanceId`, else the AWS `instance-id`, else the host
    /// name (Eureka's `InstanceInfo.getId`).
    pub id: String,
    /// `app`.
    pub app: String,
    /// `ipAddr` as given.
    pub ip_addr: String,
    /// `status`.
    pub status: InstanceStatus,
    /// `overriddenstatus` / `overriddenStatus` (`Unknown` when absent).
    pub overridden_status: InstanceStatus,
    /// `port`.
    pub port: PortInfo,
    /// `securePort`.
    pub secure_port: PortInfo,
    /// `metadata` without the `@class` marker; values that are not strings kept as
    /// their JSON text (reported when they cannot be labels).
    pub metadata: BTreeMap<String, String>,
    /// Metadata entries whose value is an object, array or null (never labels).
    pub bad_metadata: Vec<String>,
    /// `dataCenterInfo.name` (`MyOwn`, `Amazon`).
    pub data_center: String,
    /// `dataCenterInfo.metadata["availability-zone"]` (AWS).
    pub availability_zone: Option<String>,
    /// `actionType` (deltas).
    pub action: Option<ActionType>,
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn port_of(v: Option<&Value>) -> PortInfo {
    let number = |v: Option<&Value>| {
        text(v)
            .and_then(|s| s.trim().parse::<u16>().ok())
            .unwrap_or(0)
    };
    match v {
        Some(Value::Object(o)) => PortInfo {
            port: number(o.get("$")),
            // Eureka writes "true"/"false"; absent means enabled (Eureka's default
            // for the non-secure port is on, and a port without the flag is a port).
            enabled: text(o.get("@enabled")).is_none_or(|e| e.eq_ignore_ascii_case("true")),
        },
        other => PortInfo {
            port: number(other),
            enabled: other.is_some(),
        },
    }
}

impl Instance {
    /// Decodes one raw instance. Fails only when it is not an object or has no
    /// identity (no `instanceId` and no `hostName`); what cannot be converted to an
    /// endpoint is the conversion's to report.
    pub fn parse(raw: &Value) -> std::result::Result<Instance, String> {
        let Value::Object(o) = raw else {
            return Err("not a JSON object".into());
        };
        let dc = o.get("dataCenterInfo");
        let dc_meta = dc.and_then(|d| d.get("metadata"));
        let id = [
            text(o.get("instanceId")),
            text(dc_meta.and_then(|m| m.get("instance-id"))),
            text(o.get("hostName")),
        ]
        .into_iter()
        .flatten()
        .find(|s| !s.is_empty())
        .ok_or("no instanceId or hostName")?;
        let mut metadata = BTreeMap::new();
        let mut bad_metadata = Vec::new();
        if let Some(Value::Object(m)) = o.get("metadata") {
            for (k, v) in m {
                if k == "@class" {
                    continue;
                }
                match text(Some(v)) {
                    Some(s) => {
                        metadata.insert(k.clone(), s);
                    }
                    None => bad_metadata.push(k.clone()),
                }
            }
        }
        let overridden =
            text(o.get("overriddenstatus")).or_else(|| text(o.get("overriddenStatus")));
        Ok(Instance {
            id,
            app: text(o.get("app")).unwrap_or_default(),
            ip_addr: text(o.get("ipAddr")).unwrap_or_default(),
            status: text(o.get("status"))
                .map_or(InstanceStatus::Unknown, |s| InstanceStatus::parse(&s)),
            overridden_status: overridden
                .map_or(InstanceStatus::Unknown, |s| InstanceStatus::parse(&s)),
            port: port_of(o.get("port")),
            secure_port: {
                let p = port_of(o.get("securePort"));
                // A bare securePort number says nothing of its flag: off, as Eureka's default.
                if matches!(o.get("securePort"), Some(Value::Object(_))) {
                    p
                } else {
                    PortInfo {
                        enabled: false,
                        ..p
                    }
                }
            },
            metadata,
            bad_metadata,
            data_center: text(dc.and_then(|d| d.get("name"))).unwrap_or_default(),
            availability_zone: text(dc_meta.and_then(|m| m.get("availability-zone"))),
            action: match text(o.get("actionType")).as_deref() {
                Some("ADDED") => Some(ActionType::Added),
                Some("MODIFIED") => Some(ActionType::Modified),
                Some("DELETED") => Some(ActionType::Deleted),
                _ => None,
            },
        })
    }

    /// The status the instance is served with: its own `DOWN` or `STARTING` wins
    /// (it knows it is not ready), else an operator's override (not `UNKNOWN`), else
    /// its status: Eureka's own rule for overridden statuses.
    pub fn effective_status(&self) -> InstanceStatus {
        match (self.status, self.overridden_status) {
            (InstanceStatus::Down | InstanceStatus::Starting, _) => self.status,
            (_, InstanceStatus::Unknown) => self.status,
            (_, overridden) => overridden,
        }
    }
}

/// A value or a list of them (Eureka's single-element lists); `null` is empty.
fn one_or_many<'de, D, T>(d: D) -> std::result::Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany<T> {
        Many(Vec<T>),
        One(T),
    }
    Ok(match Option::<OneOrMany<T>>::deserialize(d)? {
        None => Vec::new(),
        Some(OneOrMany::Many(v)) => v,
        Some(OneOrMany::One(v)) => vec![v],
    })
}

fn scalar_string<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<String>, D::Error> {
    Ok(text(Option::<Value>::deserialize(d)?.as_ref()))
}

/// Decodes an `/apps` or `/apps/delta` body.
pub fn decode_applications(body: &[u8]) -> std::result::Result<Applications, String> {
    if body.trim_ascii_start().starts_with(b"<") {
        return Err(
            "an XML answer: the registry reads Eureka's JSON and asks for it with \
             Accept: application/json (does a proxy in between drop that header?)"
                .into(),
        );
    }
    serde_json::from_slice::<Envelope>(body)
        .map(|e| e.applications)
        .map_err(|e| e.to_string())
}

/// A Eureka client over the configured servers. Cheap to clone.
#[derive(Clone, Debug)]
pub struct EurekaClient {
    http: reqwest::Client,
    servers: Arc<[crate::config::EurekaServer]>,
    default_credentials: Option<Credentials>,
    /// The server asked first (the last one that answered).
    current: Arc<AtomicUsize>,
    failovers: Arc<std::sync::atomic::AtomicU64>,
}

impl EurekaClient {
    /// A client for `config`'s servers. Installs ring as the process's rustls crypto
    /// provider if none is installed.
    pub fn new(config: &EurekaConfig) -> Result<EurekaClient> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .user_agent(concat!("meshfed-eureka/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::Client(e.to_string()))?;
        Ok(EurekaClient {
            http,
            servers: config.servers.clone().into(),
            default_credentials: config.credentials.clone(),
            current: Arc::default(),
            failovers: Arc::default(),
        })
    }

    /// Times a request went to another server than the one asked first.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    /// The server asked first (its URL, no credentials).
    pub fn current_server(&self) -> String {
        self.servers[self.current.load(Ordering::Relaxed) % self.servers.len()]
            .url
            .to_string()
    }

    /// `GET apps`: the whole registry.
    pub async fn applications(&self) -> Result<Applications, ApiError> {
        self.get("apps").await
    }

    /// `GET apps/delta`: the recent changes.
    pub async fn delta(&self) -> Result<Applications, ApiError> {
        self.get("apps/delta").await
    }

    async fn get(&self, path: &str) -> Result<Applications, ApiError> {
        let first = self.current.load(Ordering::Relaxed);
        let n = self.servers.len();
        let mut last = None;
        for attempt in 0..n {
            let index = (first + attempt) % n;
            match self.get_from(index, path).await {
                Ok(apps) => {
                    if attempt > 0 {
                        self.failovers.fetch_add(attempt as u64, Ordering::Relaxed);
                        self.current.store(index, Ordering::Relaxed);
                        info!(server = %self.servers[index].url, "eureka: now asking this server first");
                    }
                    return Ok(apps);
                }
                Err(err) if err.fails_over() && attempt + 1 < n => {
                    warn!("{err}; trying the next Eureka server");
                    last = Some(err);
                }
                Err(err) => {
                    if attempt > 0 {
                        self.failovers.fetch_add(attempt as u64, Ordering::Relaxed);
                    }
                    return Err(err);
                }
            }
        }
        Err(last.expect("at least one server"))
    }

    async fn get_from(&self, index: usize, path: &str) -> Result<Applications, ApiError> {
        let server = &self.servers[index];
        let url = server.url.join(path).expect("a relative path joins");
        let shown = url.to_string();
        let mut request = self
            .http
            .get(url)
            .header(ACCEPT, HeaderValue::from_static("application/json"));
        if let Some(c) = server
            .credentials
            .as_ref()
            .or(self.default_credentials.as_ref())
        {
            request = request.basic_auth(&c.username, Some(&c.password));
        }
        let transport = |e: reqwest::Error| ApiError::Transport {
            server: server.url.to_string(),
            message: error_chain(&e),
        };
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        let body = response.bytes().await.map_err(transport)?;
        if !status.is_success() {
            let text: String = String::from_utf8_lossy(&body)
                .trim()
                .chars()
                .take(300)
                .collect();
            let body = if text.is_empty() {
                String::new()
            } else {
                format!(": {text}")
            };
            return Err(match status {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ApiError::Denied {
                    status: status.as_u16(),
                    url: shown,
                    body,
                },
                _ => ApiError::Status {
                    status: status.as_u16(),
                    url: shown,
                    body,
                },
            });
        }
        decode_applications(&body).map_err(|message| ApiError::Decode {
            url: shown,
            message,
        })
    }
}

fn error_chain(err: &reqwest::Error) -> String {
    // reqwest's message names the URL, which never holds credentials here.
    let mut message = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        message = format!("{message}: {s}");
        source = s.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn applications_decode_with_eurekas_quirks() {
        // XStream era: one application, one instance, as objects; "$" as a string.
        let old = json!({"applications": {"versions__delta": 1, "apps__hashcode": "UP_1_",
            "application": {"name": "WEB", "instance": {
                "hostName": "web-1.local", "app": "WEB", "ipAddr": "10.0.0.1", "status": "UP",
                "overriddenstatus": "UNKNOWN",
                "port": {"@enabled": "true", "$": "8080"},
                "securePort": {"@enabled": "false", "$": "443"},
                "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"},
                "metadata": {"@class": "java.util.Collections$EmptyMap"}}}}});
        let apps = decode_applications(old.to_string().as_bytes()).unwrap();
        assert_eq!(apps.versions_delta.as_deref(), Some("1"));
        assert_eq!(apps.application.len(), 1);
        let i = Instance::parse(&apps.application[0].instance[0]).unwrap();
        assert_eq!(i.id, "web-1.local", "no instanceId: the host name");
        assert_eq!(
            i.port,
            PortInfo {
                port: 8080,
                enabled: true
            }
        );
        assert_eq!(
            i.secure_port,
            PortInfo {
                port: 443,
                enabled: false
            }
        );
        assert!(i.metadata.is_empty());
        // None at all.
        let empty =
            decode_applications(br#"{"applications":{"versions__delta":"1","apps__hashcode":""}}"#)
                .unwrap();
        assert!(empty.application.is_empty());
        let xml = decode_applications(b"  <applications/>").unwrap_err();
        assert!(xml.contains("XML"), "{xml}");
        assert!(decode_applications(b"{}").is_err());
    }

    #[test]
    fn instances_take_aws_ids_zones_and_statuses() {
        let raw = json!({"hostName": "ip-10-0-0-1", "app": "WEB", "ipAddr": "10.0.0.1",
            "status": "up", "overriddenStatus": "OUT_OF_SERVICE", "actionType": "MODIFIED",
            "port": {"$": 8080, "@enabled": "true"}, "securePort": {"$": 8443, "@enabled": "true"},
            "dataCenterInfo": {"@class": "com.netflix.appinfo.AmazonInfo", "name": "Amazon",
                "metadata": {"instance-id": "i-0abc", "availability-zone": "us-east-1a"}},
            "metadata": {"version": "v1", "weight": 3, "nested": {"a": 1}}});
        let i = Instance::parse(&raw).unwrap();
        assert_eq!(i.id, "i-0abc");
        assert_eq!(i.status, InstanceStatus::Up);
        assert_eq!(
            i.effective_status(),
            InstanceStatus::OutOfService,
            "the override wins over UP"
        );
        assert_eq!(i.availability_zone.as_deref(), Some("us-east-1a"));
        assert_eq!(i.action, Some(ActionType::Modified));
        assert_eq!(i.metadata.get("weight").map(String::as_str), Some("3"));
        assert_eq!(i.bad_metadata, ["nested"]);
        let down = Instance {
            status: InstanceStatus::Down,
            ..i
        };
        assert_eq!(
            down.effective_status(),
            InstanceStatus::Down,
            "its own DOWN wins"
        );
        assert_eq!(InstanceStatus::parse("SLEEPY"), InstanceStatus::Unknown);
        assert!(Instance::parse(&json!({"app": "WEB"})).is_err());
        assert!(Instance::parse(&json!("x")).is_err());
    }
}

//! The mock registry fed from a watched YAML file: services and endpoints for demos,
//! laptops and tests, without Kubernetes or Consul.
//!
//! # File format
//!
//! ```yaml
//! services:
//! - hostname: echo.default.svc.cluster.local   # required
//!   namespace: default        # optional, default "default"
//!   ports:                    # required (may be empty); names must be unique, numbers too
//!   - {name: grpc, port: 7070, protocol: GRPC}   # protocol optional (absent = sniffed)
//!   addresses: [10.96.0.10]   # optional: the VIP(s) of the service in this registry's cluster
//!   resolution: STATIC        # optional: STATIC (EDS, default) | DNS | DNS_ROUND_ROBIN | NONE (passthrough)
//!   location: MESH_INTERNAL   # optional: MESH_INTERNAL (default) | MESH_EXTERNAL
//!   labels: {app: echo}       # optional
//!   exportTo: ["*"]           # optional: namespaces that may see the service
//!   serviceAccounts: [spiffe://cluster.local/ns/default/sa/echo]   # optional
//!   endpoints:                # optional
//!   - address: 127.0.0.1      # required: an IPv4 or IPv6 address
//!     ports: {grpc: 17070}    # optional: service port name -> target port
//!     labels: {version: v1}   # optional
//!     locality: r1/z1         # optional: region/zone/subzone
//!     network: n1             # optional
//!     weight: 1               # optional, default 1
//!     health: HEALTHY         # optional: HEALTHY (default) | UNHEALTHY | DRAINING | TERMINATING
//!     tlsMode: istio          # optional: disabled | istio; absent: the label below
//!     serviceAccount: spiffe://cluster.local/ns/default/sa/echo   # optional
//! ```
//!
//! - An endpoint's TLS mode is its `tlsMode` field when given; otherwise, as Istio reads
//!   pods and WorkloadEntries, the `security.istio.io/tlsMode` label in its `labels`
//!   (`istio` means istio, any other value or no label means disabled). The explicit
//!   field wins over the label.
//! - An endpoint without `ports` (or with `ports: {}`) serves every service port on the
//!   port's own number.
//! - An empty file, a file of comments, `services:` and `services: []` are all a valid,
//!   empty registry.
//! - The same document may be written as JSON (`{"services": [...]}`), which reads
//!   several times faster than YAML: a file whose first character (after whitespace)
//!   is `{` is parsed as JSON, with the same fields and checks.
//! - Field names are exact (camelCase); an unknown field is an error, so typos do not
//!   pass silently. Port numbers are 1..=65535, protocols are Istio's names (any case:
//!   GRPC, GRPC-Web, HTTP, HTTP_PROXY, HTTP2, HTTPS, TCP, TLS, UDP, Mongo, Redis, MySQL),
//!   addresses are IPs, endpoint port names must name a port of their service, and a
//!   hostname appears at most once per namespace.
//! - Every error names the file, the line and the service and field at fault, e.g.
//!   `mock.yaml:7: services[0] (echo.default.svc.cluster.local): endpoints[1] (127.0.0.2):
//!   port "grpcx" is not a port of the service (its ports: grpc)`.
//! - Every service gets the fixed creation time `UNIX_EPOCH`, so reloading the same file
//!   gives the same merged view. Provider and cluster are set by the registry; VIPs
//!   (`addresses`) are filed under the empty cluster id, which
//!   [`MemoryRegistry::replace_all`] moves to the registry's cluster.
//!
//! # Reloading
//!
//! [`run_mock_file`] loads the file, marks the registry synced and then follows every
//! change to the file (see [`crate::watch`]). The file is read under the rules of
//! [`crate::read`]: a regular file only, within a size limit, and only content that
//! did not change while it was read counts. Content that fails to parse is logged
//! with its file:line and the last good content stays in force; a deleted file also
//! keeps the last good content; a failed read is retried with backoff. A file emptied
//! while the registry holds services withdraws them only once it has stayed empty for
//! a settle period ([`DEFAULT_EMPTY_SETTLE`]). [`MockFileStatus`] counts loads,
//! retries and withdrawals for metrics.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::num::NonZeroU16;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer};
use tokio::time::Instant;

use crate::config::validate::Segment;
use crate::memory::{MemoryRegistry, ServiceWithEndpoints};
use crate::metrics::encode_gauges;
use crate::model::{
    ClusterId, Endpoint, ExportTo, HealthStatus, Locality, MeshLocation, NetworkId, Port, Protocol,
    ProviderId, Resolution, Service, ServiceKey, TlsMode,
};
use crate::read::{
    Backoff, DEFAULT_MAX_FILE_SIZE, ReadError, read_watched_file, read_watched_file_blocking,
};
use crate::registry::ServiceRegistry;
use crate::watch::{PathWatcher, WatchError};

/// Why a mock registry file could not be loaded. Every variant's message starts with
/// the file (and the line, where known).
#[derive(Debug, thiserror::Error)]
pub enum MockFileError {
    /// The file could not be read (missing, not a regular file, over the size limit,
    /// permissions, ...); the message starts with the file.
    #[error("{source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why, per [`crate::read`].
        #[source]
        source: ReadError,
    },
    /// The text is not valid UTF-8 or YAML, or does not fit the format: unknown or
    /// missing field, wrong type, port out of range, unknown protocol, bad IP address.
    #[error("{}: {message}", FileLine(.path, *.line))]
    Syntax {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error, when known.
        line: Option<usize>,
        /// Which item is wrong and why.
        message: String,
    },
    /// The file parses but is inconsistent: an endpoint port that is not a service port,
    /// a duplicate hostname, port name or port number, an empty name.
    #[error("{}: {message}", FileLine(.path, *.line))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// 1-based line of the offending item, when it could be found.
        line: Option<usize>,
        /// Which item is wrong and why.
        message: String,
    },
}

impl MockFileError {
    /// The 1-based line the error points at, when known.
    pub fn line(&self) -> Option<usize> {
        match self {
            MockFileError::Read { .. } => None,
            MockFileError::Syntax { line, .. } | MockFileError::Invalid { line, .. } => *line,
        }
    }
}

/// Renders `path:line` (or just `path`).
struct FileLine<'a>(&'a Path, Option<usize>);

impl fmt::Display for FileLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Some(line) => write!(f, "{}:{line}", self.0.display()),
            None => write!(f, "{}", self.0.display()),
        }
    }
}

// ----------------------------------------------------------------------------------
// The file as written.

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    rename_all = "camelCase",
    expecting = "a mapping with a `services` list"
)]
struct MockFile {
    #[serde(default)]
    services: Option<Vec<ServiceSpec>>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    rename_all = "camelCase",
    expecting = "a service (a mapping with hostname and ports)"
)]
struct ServiceSpec {
    hostname: String,
    #[serde(default)]
    namespace: Option<String>,
    ports: Vec<PortSpec>,
    #[serde(default)]
    addresses: Vec<IpAddr>,
    #[serde(default)]
    resolution: ResolutionSpec,
    #[serde(default)]
    location: LocationSpec,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    export_to: Vec<String>,
    #[serde(default)]
    service_accounts: Vec<String>,
    #[serde(default)]
    endpoints: Vec<EndpointSpec>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    rename_all = "camelCase",
    expecting = "a port (a mapping with name and port)"
)]
struct PortSpec {
    name: String,
    port: PortNumber,
    #[serde(default)]
    protocol: Option<ProtocolName>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    rename_all = "camelCase",
    expecting = "an endpoint (a mapping with an address)"
)]
struct EndpointSpec {
    address: IpAddr,
    #[serde(default)]
    ports: BTreeMap<String, PortNumber>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    locality: Option<String>,
    #[serde(default)]
    network: Option<String>,
    #[serde(default)]
    weight: Option<u32>,
    #[serde(default)]
    health: HealthSpec,
    #[serde(default)]
    tls_mode: Option<TlsModeSpec>,
    #[serde(default)]
    service_account: Option<String>,
}

#[derive(Deserialize, Default, Clone, Copy)]
enum ResolutionSpec {
    #[default]
    #[serde(rename = "STATIC")]
    Static,
    #[serde(rename = "DNS")]
    Dns,
    #[serde(rename = "DNS_ROUND_ROBIN")]
    DnsRoundRobin,
    #[serde(rename = "NONE")]
    None,
}

#[derive(Deserialize, Default, Clone, Copy)]
enum LocationSpec {
    #[default]
    #[serde(rename = "MESH_INTERNAL")]
    MeshInternal,
    #[serde(rename = "MESH_EXTERNAL")]
    MeshExternal,
}

#[derive(Deserialize, Default, Clone, Copy)]
enum HealthSpec {
    #[default]
    #[serde(rename = "HEALTHY")]
    Healthy,
    #[serde(rename = "UNHEALTHY")]
    Unhealthy,
    #[serde(rename = "DRAINING")]
    Draining,
    #[serde(rename = "TERMINATING")]
    Terminating,
}

#[derive(Deserialize, Clone, Copy)]
enum TlsModeSpec {
    #[serde(rename = "disabled")]
    Disabled,
    #[serde(rename = "istio")]
    Istio,
}

/// A port number in 1..=65535; anything else is an error at the number's own line.
#[derive(Clone, Copy)]
struct PortNumber(NonZeroU16);

impl<'de> Deserialize<'de> for PortNumber {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = PortNumber;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number (1..=65535)")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<PortNumber, E> {
                u16::try_from(n)
                    .ok()
                    .and_then(NonZeroU16::new)
                    .map(PortNumber)
                    .ok_or_else(|| {
                        E::custom(format_args!("port {n} is out of range (must be 1..=65535)"))
                    })
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<PortNumber, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(format_args!(
                        "port {n} is out of range (must be 1..=65535)"
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A protocol name Istio knows (any case).
#[derive(Clone, Copy)]
struct ProtocolName(Protocol);

impl<'de> Deserialize<'de> for ProtocolName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Checked inside the visitor so that the error carries the name's own position.
        struct V;
        impl Visitor<'_> for V {
            type Value = ProtocolName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an Istio protocol name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<ProtocolName, E> {
                Protocol::parse_known(name).map(ProtocolName).ok_or_else(|| {
                    E::custom(format_args!(
                        "unknown protocol {name:?} (expected one of GRPC, GRPC-Web, HTTP, HTTP_PROXY, HTTP2, HTTPS, \
                         TCP, TLS, UDP, Mongo, Redis, MySQL)"
                    ))
                })
            }
        }
        d.deserialize_str(V)
    }
}

// ----------------------------------------------------------------------------------
// Parsing.

/// Reads and parses a mock registry file under the rules of [`crate::read`] (a
/// regular file of at most [`DEFAULT_MAX_FILE_SIZE`] bytes). A missing file is a
/// [`MockFileError::Read`] error; an empty file is an empty registry.
pub fn load_mock_registry(
    path: impl AsRef<Path>,
) -> Result<Vec<ServiceWithEndpoints>, MockFileError> {
    let path = path.as_ref();
    let bytes = read_watched_file_blocking(path, DEFAULT_MAX_FILE_SIZE).map_err(|source| {
        MockFileError::Read {
            path: path.to_path_buf(),
            source,
        }
    })?;
    parse_mock_registry_bytes(path, &bytes)
}

/// Parses file bytes, reporting invalid UTF-8 with its line.
fn parse_mock_registry_bytes(
    path: &Path,
    bytes: &[u8],
) -> Result<Vec<ServiceWithEndpoints>, MockFileError> {
    match std::str::from_utf8(bytes) {
        Ok(text) => parse_mock_registry(path, text),
        Err(e) => {
            let line = bytes[..e.valid_up_to()]
                .iter()
                .filter(|b| **b == b'\n')
                .count()
                + 1;
            Err(MockFileError::Syntax {
                path: path.to_path_buf(),
                line: Some(line),
                message: "the file is not valid UTF-8".to_string(),
            })
        }
    }
}

/// Parses the text of a mock registry file (`path_for_messages` only names the file in
/// errors). Services come back in file order, with provider `Mock`, an empty cluster id
/// and their VIPs filed under the empty cluster id (the registry's cluster, once
/// given to [`MemoryRegistry::replace_all`]).
pub fn parse_mock_registry(
    path_for_messages: &Path,
    text: &str,
) -> Result<Vec<ServiceWithEndpoints>, MockFileError> {
    // JSON is YAML too, but a YAML parser reads a large generated file several times
    // slower than a JSON one: a document that opens with `{` is read as JSON.
    let file: Option<MockFile> = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| json_syntax_error(path_for_messages, text, e))?
    } else {
        serde_norway::from_str(text).map_err(|e| syntax_error(path_for_messages, text, e))?
    };
    let specs = file.and_then(|f| f.services).unwrap_or_default();
    let invalid = |path: &[Seg], message: String| MockFileError::Invalid {
        path: path_for_messages.to_path_buf(),
        line: locate(text, path),
        message,
    };

    let mut out = Vec::with_capacity(specs.len());
    let mut seen: BTreeMap<ServiceKey, usize> = BTreeMap::new();
    for (i, spec) in specs.into_iter().enumerate() {
        let item = format!("services[{i}] ({})", spec.hostname);
        let entry = convert_service(spec).map_err(|(mut at, reason)| {
            let mut path = vec![field("services"), Segment::Index(i)];
            path.append(&mut at);
            invalid(&path, format!("{item}: {reason}"))
        })?;
        let key = entry.service.key();
        if let Some(first) = seen.insert(key.clone(), i) {
            let first_line = locate(
                text,
                &[field("services"), Segment::Index(first), field("hostname")],
            );
            let where_first = match first_line {
                Some(l) => format!("services[{first}] (line {l})"),
                None => format!("services[{first}]"),
            };
            return Err(invalid(
                &[field("services"), Segment::Index(i), field("hostname")],
                format!(
                    "{item}: hostname is already declared in namespace {:?} by {where_first}",
                    key.namespace.as_str()
                ),
            ));
        }
        out.push(entry);
    }
    Ok(out)
}

/// One step of a path into the YAML document (keys match exactly).
type Seg = Segment;

fn field(k: &str) -> Seg {
    Segment::Key(k.to_string())
}

/// A semantic error: where in the service it is (relative path) and why.
type Fault = (Vec<Seg>, String);

fn convert_service(spec: ServiceSpec) -> Result<ServiceWithEndpoints, Fault> {
    let hostname = spec.hostname.as_str();
    if hostname.is_empty() || hostname.contains(char::is_whitespace) {
        return Err((
            vec![field("hostname")],
            format!("hostname {:?} is not a host name", spec.hostname),
        ));
    }
    let namespace = spec.namespace.unwrap_or_else(|| "default".to_string());
    if namespace.is_empty() {
        return Err((
            vec![field("namespace")],
            "namespace must not be empty".to_string(),
        ));
    }
    let mut service = Service::new(hostname, namespace.as_str(), ProviderId::Mock, "");
    for (p, port) in spec.ports.iter().enumerate() {
        let at = || vec![field("ports"), Segment::Index(p)];
        if port.name.is_empty() {
            return Err((at(), format!("ports[{p}]: the port name must not be empty")));
        }
        if service.port_by_name(&port.name).is_some() {
            return Err((
                at(),
                format!("ports[{p}]: port name {:?} is used twice", port.name),
            ));
        }
        if service.port(port.port.0.get()).is_some() {
            return Err((
                at(),
                format!("ports[{p}]: port number {} is used twice", port.port.0),
            ));
        }
        let protocol = port.protocol.map_or(Protocol::Unsupported, |p| p.0);
        service.ports.push(Port {
            name: Arc::from(port.name.as_str()),
            port: port.port.0,
            protocol,
        });
    }
    if !spec.addresses.is_empty() {
        service
            .cluster_vips
            .insert(ClusterId::default(), spec.addresses);
    }
    service.resolution = match spec.resolution {
        ResolutionSpec::Static => Resolution::ClientSideLb,
        ResolutionSpec::Dns => Resolution::DnsLb,
        ResolutionSpec::DnsRoundRobin => Resolution::DnsRoundRobinLb,
        ResolutionSpec::None => Resolution::Passthrough,
    };
    service.location = match spec.location {
        LocationSpec::MeshInternal => MeshLocation::MeshInternal,
        LocationSpec::MeshExternal => MeshLocation::MeshExternal,
    };
    service.labels = spec.labels;
    service.export_to = ExportTo(spec.export_to.into_iter().collect());
    service.service_accounts = spec.service_accounts.into_iter().collect::<BTreeSet<_>>();
    // Fixed, so that reloading the same file yields the same merged view.
    service.creation_time = std::time::SystemTime::UNIX_EPOCH;

    let mut endpoints = Vec::with_capacity(spec.endpoints.len());
    for (e, ep) in spec.endpoints.into_iter().enumerate() {
        let mut endpoint = Endpoint::new(ep.address);
        if ep.ports.is_empty() {
            for port in &service.ports {
                endpoint.ports.insert(port.name.clone(), port.port.get());
            }
        }
        for (name, target) in &ep.ports {
            let Some(port) = service.port_by_name(name) else {
                let names: Vec<&str> = service.ports.iter().map(|p| &*p.name).collect();
                let known = if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                };
                return Err((
                    vec![
                        field("endpoints"),
                        Segment::Index(e),
                        field("ports"),
                        field(name),
                    ],
                    format!(
                        "endpoints[{e}] ({}): port {name:?} is not a port of the service (its ports: {known})",
                        ep.address
                    ),
                ));
            };
            endpoint.ports.insert(port.name.clone(), target.0.get());
        }
        endpoint.labels = ep.labels;
        endpoint.locality = ep
            .locality
            .as_deref()
            .map(Locality::parse)
            .unwrap_or_default();
        endpoint.network = ep.network.map(NetworkId::from).unwrap_or_default();
        endpoint.weight = ep.weight.unwrap_or(1);
        endpoint.health = match ep.health {
            HealthSpec::Healthy => HealthStatus::Healthy,
            HealthSpec::Unhealthy => HealthStatus::Unhealthy,
            HealthSpec::Draining => HealthStatus::Draining,
            HealthSpec::Terminating => HealthStatus::Terminating,
        };
        endpoint.tls_mode = match ep.tls_mode {
            Some(TlsModeSpec::Disabled) => TlsMode::Disabled,
            Some(TlsModeSpec::Istio) => TlsMode::Istio,
            // As Istio reads pods and WorkloadEntries: the label, `istio` or nothing.
            None => match endpoint.labels.get(crate::serviceentry::LABEL_TLS_MODE) {
                Some(mode) if mode == TlsMode::Istio.as_str() => TlsMode::Istio,
                _ => TlsMode::Disabled,
            },
        };
        endpoint.service_account = ep.service_account;
        endpoints.push(endpoint);
    }
    Ok(ServiceWithEndpoints { service, endpoints })
}

/// Turns a serde_norway error into a [`MockFileError::Syntax`] that names the service
/// by index and hostname and moves the position into the `file:line` prefix.
fn syntax_error(path: &Path, text: &str, err: serde_norway::Error) -> MockFileError {
    let location = err.location();
    let mut message = err.to_string();
    if let Some(loc) = &location {
        message = message.replacen(
            &format!(" at line {} column {}", loc.line(), loc.column()),
            "",
            1,
        );
    }
    // serde_norway prefixes the path of the bad value (`services[0].ports[0].port: ...`).
    if let Some(rest) = message.strip_prefix("services[")
        && let Some((index, tail)) = rest.split_once(']')
        && let Ok(i) = index.parse::<usize>()
    {
        let item = match hostname_of(text, i) {
            Some(host) => format!("services[{i}] ({host})"),
            None => format!("services[{i}]"),
        };
        let tail = tail
            .strip_prefix('.')
            .or_else(|| tail.strip_prefix(": "))
            .unwrap_or(tail);
        message = format!("{item}: {tail}");
    }
    MockFileError::Syntax {
        path: path.to_path_buf(),
        line: location.map(|l| l.line()),
        message,
    }
}

/// A serde_json error as a [`MockFileError::Syntax`]: its position moves into the
/// `file:line` prefix, and the service is named (index and hostname) when the error
/// sits inside one.
fn json_syntax_error(path: &Path, text: &str, err: serde_json::Error) -> MockFileError {
    let line = err.line();
    let message = err.to_string();
    let message = message
        .rsplit_once(" at line ")
        .map_or(message.as_str(), |(m, _)| m)
        .to_string();
    // The service the error is in: the number of `"hostname"` keys up to the error.
    let upto: usize = text
        .split_inclusive('\n')
        .take(line)
        .map(str::len)
        .sum::<usize>()
        .min(text.len());
    let index = text[..upto].matches("\"hostname\"").count().checked_sub(1);
    let message = match index {
        Some(i) => match hostname_of(text, i) {
            Some(host) => format!("services[{i}] ({host}): {message}"),
            None => format!("services[{i}]: {message}"),
        },
        None => message,
    };
    MockFileError::Syntax {
        path: path.to_path_buf(),
        line: (line > 0).then_some(line),
        message,
    }
}

/// The hostname of `services[index]`, if the text is YAML and has one.
fn hostname_of(text: &str, index: usize) -> Option<String> {
    let doc: serde_norway::Value = serde_norway::from_str(text).ok()?;
    Some(
        doc.get("services")?
            .get(index)?
            .get("hostname")?
            .as_str()?
            .to_string(),
    )
}

/// The 1-based line of the node at `path` in the YAML text (or of its nearest
/// existing ancestor): the config files' locator, shared.
fn locate(text: &str, path: &[Seg]) -> Option<usize> {
    crate::config::locate::line_of(text, path)
}

// ----------------------------------------------------------------------------------
// Following the file.

/// How long an empty (or comment-only) mock registry file must stay so before it
/// withdraws the services the registry holds: a writer that truncates the file and
/// writes it later (`{ sleep 1; cat good.yaml; } > mock.yaml`) is not a withdrawal.
pub const DEFAULT_EMPTY_SETTLE: Duration = crate::read::EMPTY_SETTLE;

/// How [`run_mock_file`] reads the file.
#[derive(Clone, Copy, Debug)]
pub struct MockFileOptions {
    /// The size limit of the file in bytes (`--maxConfigFileSize`).
    pub max_file_size: u64,
    /// How long an emptied file must stay empty before it withdraws the services.
    pub empty_settle: Duration,
}

impl Default for MockFileOptions {
    fn default() -> Self {
        MockFileOptions {
            max_file_size: DEFAULT_MAX_FILE_SIZE,
            empty_settle: DEFAULT_EMPTY_SETTLE,
        }
    }
}

/// Load counters of a [`run_mock_file`] task, for metrics and debug pages. Cheap to
/// clone; clones share the counters.
#[derive(Clone, Debug, Default)]
pub struct MockFileStatus {
    /// Loads that applied the file's content, the first one included.
    pub reloads_ok: Arc<AtomicU64>,
    /// Loads that failed (the file was invalid, unreadable, missing or deleted); the
    /// last good content stayed in force.
    pub reloads_failed: Arc<AtomicU64>,
    /// Reads retried after a failure (an I/O error, not a regular file, over the size
    /// limit, or a writer still at work).
    pub read_retries: Arc<AtomicU64>,
    /// Times an emptied file, having stayed empty for the settle period, withdrew the
    /// services the registry held.
    pub empty_withdrawals: Arc<AtomicU64>,
    /// The message of the last failed load (with file:line), cleared by the next
    /// successful one.
    pub last_error: Arc<Mutex<Option<String>>>,
}

impl MockFileStatus {
    /// Fresh counters.
    pub fn new() -> MockFileStatus {
        MockFileStatus::default()
    }

    /// The message of the last failed load, if the last load failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn succeeded(&self) {
        self.reloads_ok.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn failed(&self, message: String) {
        self.reloads_failed.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(message);
    }

    /// Registers `meshfed_mock_file_reloads{result="ok"|"failed"}`,
    /// `meshfed_mock_file_read_retries{reason="read_error"}` and
    /// `meshfed_mock_file_empty_withdrawals{result="withdrawn"}` into `registry`, read
    /// from these counters on every scrape.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(MockFileMetrics(self.clone())));
    }
}

#[derive(Debug)]
struct MockFileMetrics(MockFileStatus);

impl Collector for MockFileMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let status = &self.0;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed) as i64;
        encode_gauges(
            &mut encoder,
            "meshfed_mock_file_reloads",
            "Mock registry file loads by result (failed loads keep the last good content)",
            "result",
            [
                ("ok", load(&status.reloads_ok)),
                ("failed", load(&status.reloads_failed)),
            ],
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_mock_file_read_retries",
            "Mock registry file reads retried after a failure or a read that raced a writer",
            "reason",
            [("read_error", load(&status.read_retries))],
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_mock_file_empty_withdrawals",
            "Times an emptied mock registry file withdrew its services after the settle period",
            "result",
            [("withdrawn", load(&status.empty_withdrawals))],
        )
    }
}

/// Feeds `registry` from the mock registry file at `path` until `shutdown` completes.
///
/// - The watch starts first, then the file is loaded and the registry is marked synced
///   **whatever the outcome**: a missing or invalid file at startup is logged (with
///   file:line) and the registry serves nothing until the file is fixed. For a laptop
///   demo that beats a control plane that never becomes ready.
/// - Every change to the file (in place, atomic replace, ConfigMap symlink swap,
///   creation) re-reads it, under the rules of [`crate::read`]: a regular file of at
///   most `options.max_file_size` bytes, whose content did not change during the read.
///   Identical bytes do nothing. Valid content replaces the registry's (only
///   differences are pushed) and logs `mock registry reloaded: N services, M
///   endpoints`. Invalid content is logged as an error and the last good content
///   stays. A deleted file logs a warning and the last good content stays.
/// - A read that fails for any other reason than a missing file (too many open files,
///   not a regular file, over the size limit, a writer at work) is retried with
///   backoff (100 ms doubling to 30 s) until it succeeds; the last good content stays
///   meanwhile.
/// - Content with no services, while the registry holds some, applies only once the
///   file has stayed so for `options.empty_settle`, with a warning naming how many
///   services go; content with services arriving before then applies as usual.
/// - Loads, retries and withdrawals are counted in `status`.
/// - Shutdown ends the task at once, even in the middle of a read.
///
/// Returns an error, without touching the registry, if the watch cannot start (e.g. the
/// file's directory does not exist), and if the watcher stops later.
pub async fn run_mock_file(
    path: PathBuf,
    registry: MemoryRegistry,
    status: MockFileStatus,
    options: MockFileOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WatchError> {
    // Watch before the first read, so that a change in between is not lost.
    let watcher = PathWatcher::watch(&path, false)?;
    follow(
        watcher,
        Reloader::new(path, registry, status, options),
        shutdown,
    )
    .await
}

/// The loop of [`run_mock_file`] over a started watch.
async fn follow(
    mut watcher: PathWatcher,
    mut reloader: Reloader,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WatchError> {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut again = tokio::select! {
        () = &mut shutdown => return Ok(()),
        next = reloader.reload() => next,
    };
    reloader.registry.mark_synced();
    loop {
        let retry = async {
            match again {
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = retry => {}
            tick = watcher.changed() => if tick.is_none() {
                let err = WatchError::Stopped { path: reloader.path };
                tracing::error!("{err}; the mock registry keeps its current content");
                return Err(err);
            },
        }
        again = tokio::select! {
            () = &mut shutdown => return Ok(()),
            next = reloader.reload() => next,
        };
    }
}

/// The reload step of [`run_mock_file`], apart from the watching.
struct Reloader {
    path: PathBuf,
    registry: MemoryRegistry,
    status: MockFileStatus,
    options: MockFileOptions,
    /// What the last read gave: the bytes, or the read error's message.
    seen: Option<Result<Vec<u8>, String>>,
    /// Since when the file has had no services while the registry still holds some.
    empty_since: Option<Instant>,
    backoff: Backoff,
}

impl Reloader {
    fn new(
        path: PathBuf,
        registry: MemoryRegistry,
        status: MockFileStatus,
        options: MockFileOptions,
    ) -> Reloader {
        Reloader {
            path,
            registry,
            status,
            options,
            seen: None,
            empty_since: None,
            backoff: Backoff::default(),
        }
    }

    /// Reads the file once and applies what it says. Returns when to read again
    /// without waiting for a change: `None` to wait for the next change.
    async fn reload(&mut self) -> Option<Duration> {
        match read_watched_file(&self.path, self.options.max_file_size).await {
            Ok(bytes) => {
                self.backoff.reset();
                self.apply(bytes)
            }
            Err(e) => self.read_failed(e),
        }
    }

    fn apply(&mut self, bytes: Vec<u8>) -> Option<Duration> {
        let same = matches!(&self.seen, Some(Ok(seen)) if *seen == bytes);
        if same && self.empty_since.is_none() {
            return None;
        }
        let parsed = parse_mock_registry_bytes(&self.path, &bytes);
        self.seen = Some(Ok(bytes));
        let services = match parsed {
            Ok(services) => services,
            Err(e) => {
                self.empty_since = None;
                tracing::error!(path = %self.path.display(), "{e} (keeping the last good mock registry content)");
                self.status.failed(e.to_string());
                return None;
            }
        };
        let held = self.registry.services().len();
        if services.is_empty() && held > 0 {
            // Emptied: a writer may have truncated the file and not written yet. Only
            // an emptiness that lasts withdraws.
            let now = Instant::now();
            let since = *self.empty_since.get_or_insert(now);
            let waited = now.duration_since(since);
            if waited < self.options.empty_settle {
                if waited.is_zero() {
                    tracing::info!(
                        path = %self.path.display(),
                        "mock registry file has no services; its {held} services stay unless it stays so for {:?}",
                        self.options.empty_settle
                    );
                }
                return Some(self.options.empty_settle - waited);
            }
            tracing::warn!(
                path = %self.path.display(),
                "mock registry file {} is empty: withdrawing {held} services",
                self.path.display()
            );
            self.status
                .empty_withdrawals
                .fetch_add(1, Ordering::Relaxed);
        }
        self.empty_since = None;
        let n = services.len();
        let m: usize = services.iter().map(|s| s.endpoints.len()).sum();
        self.registry.replace_all(services);
        self.status.succeeded();
        tracing::info!(path = %self.path.display(), "mock registry reloaded: {n} services, {m} endpoints");
        None
    }

    fn read_failed(&mut self, err: ReadError) -> Option<Duration> {
        if err.is_changing() {
            // A writer is at work: read again soon (its next write also ticks).
            let delay = self.backoff.next_delay();
            self.status.read_retries.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(path = %self.path.display(), "{err}; reading again in {delay:?}");
            return Some(delay);
        }
        self.empty_since = None;
        let missing = err.is_missing();
        let message = err.to_string();
        let repeated = matches!(&self.seen, Some(Err(seen)) if *seen == message);
        let had_content = matches!(self.seen, Some(Ok(_)));
        if !repeated {
            self.seen = Some(Err(message.clone()));
            self.status.failed(message.clone());
        }
        if missing {
            if !repeated {
                if had_content {
                    tracing::warn!(
                        path = %self.path.display(),
                        "{message}: the mock registry file was deleted; keeping the last good content"
                    );
                } else {
                    tracing::warn!(
                        path = %self.path.display(),
                        "{message}; the mock registry stays empty until the file is created"
                    );
                }
            }
            return None;
        }
        let delay = self.backoff.next_delay();
        self.status.read_retries.fetch_add(1, Ordering::Relaxed);
        if repeated {
            tracing::debug!(path = %self.path.display(), "{message}; retrying in {delay:?}");
        } else {
            tracing::error!(
                path = %self.path.display(),
                "{message} (keeping the last good mock registry content; retrying in {delay:?})"
            );
        }
        Some(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoints::EndpointIndex;
    use crate::events::UpdateSink;
    use std::time::Duration;

    const EXAMPLE: &str = r#"# The example from the module docs, plus a second service.
services:
- hostname: echo.default.svc.cluster.local
  namespace: default
  ports: [{name: grpc, port: 7070, protocol: GRPC}, {name: http, port: 8080, protocol: http}]
  addresses: [10.96.0.10]
  resolution: STATIC
  location: MESH_INTERNAL
  labels: {app: echo}
  exportTo: ["*"]
  serviceAccounts: ["spiffe://cluster.local/ns/default/sa/echo"]
  endpoints:
  - {address: 127.0.0.1, ports: {grpc: 17070}, labels: {version: v1}, locality: r1/z1, network: n1,
     weight: 2, health: DRAINING, tlsMode: istio, serviceAccount: "spiffe://cluster.local/ns/default/sa/echo"}
  - address: "::1"
- hostname: api.example.com
  namespace: egress
  ports:
  - name: tls
    port: 443
    protocol: TLS
  resolution: DNS
  location: MESH_EXTERNAL
"#;

    fn parse(text: &str) -> Result<Vec<ServiceWithEndpoints>, MockFileError> {
        parse_mock_registry(Path::new("mock.yaml"), text)
    }

    /// Parses text that must fail; returns the message and checks the `file:line:`
    /// prefix.
    fn fails(text: &str, line: usize) -> String {
        let err = parse(text).expect_err("the text must be rejected");
        let msg = err.to_string();
        assert_eq!(err.line(), Some(line), "wrong line in {msg:?}");
        assert!(msg.starts_with(&format!("mock.yaml:{line}: ")), "{msg}");
        msg
    }

    #[test]
    fn parses_the_documented_example() {
        let all = parse(EXAMPLE).unwrap();
        assert_eq!(all.len(), 2);
        let echo = &all[0];
        let s = &echo.service;
        assert_eq!(s.hostname.as_str(), "echo.default.svc.cluster.local");
        assert_eq!(s.namespace.as_str(), "default");
        assert_eq!(
            s.ports,
            vec![
                Port::new("grpc", 7070, Protocol::Grpc).unwrap(),
                Port::new("http", 8080, Protocol::Http).unwrap()
            ]
        );
        assert_eq!(
            s.cluster_vips[&ClusterId::default()],
            vec!["10.96.0.10".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(s.resolution, Resolution::ClientSideLb);
        assert_eq!(s.location, MeshLocation::MeshInternal);
        assert_eq!(s.labels["app"], "echo");
        assert_eq!(s.export_to, ExportTo::public());
        assert!(
            s.service_accounts
                .contains("spiffe://cluster.local/ns/default/sa/echo")
        );
        assert_eq!(s.creation_time, std::time::SystemTime::UNIX_EPOCH);
        assert_eq!(s.provider, ProviderId::Mock);

        let e0 = &echo.endpoints[0];
        assert_eq!(e0.address, "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(e0.ports.len(), 1);
        assert_eq!(e0.ports["grpc"], 17070);
        assert_eq!(e0.labels["version"], "v1");
        assert_eq!(e0.locality, Locality::parse("r1/z1"));
        assert_eq!(e0.network.as_str(), "n1");
        assert_eq!(e0.weight, 2);
        assert_eq!(e0.health, HealthStatus::Draining);
        assert_eq!(e0.tls_mode, TlsMode::Istio);
        assert_eq!(
            e0.service_account.as_deref(),
            Some("spiffe://cluster.local/ns/default/sa/echo")
        );

        // No `ports`: every service port on its own number; the defaults elsewhere.
        let e1 = &echo.endpoints[1];
        assert_eq!(e1.address, "::1".parse::<IpAddr>().unwrap());
        assert_eq!(
            e1.ports.iter().map(|(k, v)| (&**k, *v)).collect::<Vec<_>>(),
            vec![("grpc", 7070), ("http", 8080)]
        );
        assert_eq!(e1.weight, 1);
        assert_eq!(e1.health, HealthStatus::Healthy);
        assert_eq!(e1.tls_mode, TlsMode::Disabled);
        assert!(e1.locality.is_empty() && e1.network.is_empty() && e1.service_account.is_none());

        let api = &all[1].service;
        assert_eq!(api.namespace.as_str(), "egress");
        assert_eq!(
            api.ports,
            vec![Port::new("tls", 443, Protocol::Tls).unwrap()]
        );
        assert_eq!(api.resolution, Resolution::DnsLb);
        assert_eq!(api.location, MeshLocation::MeshExternal);
        assert!(api.cluster_vips.is_empty());
        assert!(all[1].endpoints.is_empty());

        // Parsing is deterministic: the same text gives the same services.
        assert_eq!(parse(EXAMPLE).unwrap(), all);
    }

    #[test]
    fn other_keywords_and_defaults() {
        let all = parse(
            "services:\n- hostname: a.b\n  ports: [{name: x, port: 1}]\n  resolution: NONE\n- hostname: c.d\n  \
             ports: []\n  resolution: DNS_ROUND_ROBIN\n  endpoints: [{address: 10.0.0.1, health: TERMINATING}, \
             {address: 10.0.0.2, health: UNHEALTHY, tlsMode: disabled, ports: {}}]\n",
        )
        .unwrap();
        assert_eq!(all[0].service.namespace.as_str(), "default");
        assert_eq!(all[0].service.resolution, Resolution::Passthrough);
        assert_eq!(
            all[0].service.ports[0].protocol,
            Protocol::Unsupported,
            "no protocol = sniffed"
        );
        assert_eq!(all[1].service.resolution, Resolution::DnsRoundRobinLb);
        assert_eq!(all[1].endpoints[0].health, HealthStatus::Terminating);
        assert_eq!(all[1].endpoints[1].health, HealthStatus::Unhealthy);
        assert!(
            all[1].endpoints[1].ports.is_empty(),
            "a service without ports gives endpoints without ports"
        );
    }

    #[test]
    fn the_tls_mode_label_counts_unless_the_field_is_given() {
        let all = parse(
            "services:\n- hostname: a.b\n  ports: [{name: x, port: 1}]\n  endpoints:\n  \
             - {address: 10.0.0.1, labels: {security.istio.io/tlsMode: istio}}\n  \
             - {address: 10.0.0.2, labels: {security.istio.io/tlsMode: disabled}}\n  \
             - {address: 10.0.0.3, labels: {security.istio.io/tlsMode: other}}\n  \
             - {address: 10.0.0.4}\n  \
             - {address: 10.0.0.5, tlsMode: disabled, labels: {security.istio.io/tlsMode: istio}}\n  \
             - {address: 10.0.0.6, tlsMode: istio, labels: {security.istio.io/tlsMode: disabled}}\n",
        )
        .unwrap();
        let modes: Vec<TlsMode> = all[0].endpoints.iter().map(|e| e.tls_mode).collect();
        assert_eq!(
            modes,
            [
                TlsMode::Istio,
                TlsMode::Disabled,
                TlsMode::Disabled,
                TlsMode::Disabled,
                TlsMode::Disabled,
                TlsMode::Istio,
            ]
        );
        // The label stays among the endpoint's labels, as on a pod.
        assert_eq!(
            all[0].endpoints[0]
                .labels
                .get("security.istio.io/tlsMode")
                .map(String::as_str),
            Some("istio")
        );
    }

    #[test]
    fn empty_files_are_empty_registries() {
        for text in [
            "",
            "\n",
            "# nothing yet\n",
            "services:\n",
            "services: []\n",
            "---\n",
        ] {
            assert_eq!(parse(text).unwrap(), vec![], "{text:?}");
        }
    }

    #[test]
    fn yaml_syntax_errors_have_file_and_line() {
        let msg = fails(
            "services:\n- hostname: a.b\n  ports: [{name: http, port: 80}\n  endpoints: []\n",
            4,
        );
        assert!(
            msg.contains("flow sequence") || msg.contains("expected"),
            "{msg}"
        );
        let msg = fails("services:\n- hostname: a.b\n\tports: []\n", 3);
        assert!(
            msg.contains("tab") || msg.contains("found character"),
            "{msg}"
        );
    }

    #[test]
    fn json_files_read_like_yaml_ones() {
        let doc: serde_norway::Value = serde_norway::from_str(EXAMPLE).unwrap();
        let json = serde_json::to_string_pretty(&doc).unwrap();
        assert!(json.starts_with('{'));
        assert_eq!(parse(&json).unwrap(), parse(EXAMPLE).unwrap());
        assert_eq!(parse("  {}").unwrap(), vec![]);
        // Syntax errors and invalid values name the line, the service and the field.
        let text = "{\"services\": [\n {\"hostname\": \"a.b\", \"ports\": []},\n {\"hostname\": \"c.d\", \"ports\": [}\n]}";
        let msg = fails(text, 3);
        assert!(msg.contains("services[1]"), "{msg}");
        let text = "{\"services\": [\n {\"hostname\": \"a.b\",\n  \"ports\": [{\"name\": \"http\", \"port\": 0}]}\n]}";
        let msg = fails(text, 3);
        assert!(msg.contains("services[0] (a.b): port 0"), "{msg}");
        let text = "{\"services\": [{\"hostname\": \"a.b\", \"ports\": [], \"colour\": 1}]}";
        let msg = fails(text, 1);
        assert!(msg.contains("unknown field `colour`"), "{msg}");
    }

    #[test]
    fn a_missing_hostname_names_the_service_line() {
        let msg = fails("services:\n- namespace: x\n  ports: []\n", 2);
        assert!(
            msg.contains("services[0]") && msg.contains("missing field `hostname`"),
            "{msg}"
        );
    }

    #[test]
    fn port_numbers_must_be_in_range() {
        let text = "services:\n- hostname: a.b\n  ports:\n  - name: http\n    port: 0\n";
        let msg = fails(text, 5);
        assert!(
            msg.contains(
                "services[0] (a.b): ports[0].port: port 0 is out of range (must be 1..=65535)"
            ),
            "{msg}"
        );
        let msg = fails(&text.replace("port: 0", "port: 70000"), 5);
        assert!(msg.contains("port 70000 is out of range"), "{msg}");
        let msg = fails(&text.replace("port: 0", "port: -1"), 5);
        assert!(msg.contains("port -1 is out of range"), "{msg}");
        let msg = fails(&text.replace("port: 0", "port: http"), 5);
        assert!(msg.contains("expected a port number (1..=65535)"), "{msg}");
        // Endpoint target ports too.
        let text = "services:\n- hostname: a.b\n  ports: [{name: http, port: 80}]\n  endpoints:\n  - address: \
                    10.0.0.1\n    ports: {http: 0}\n";
        let msg = fails(text, 6);
        assert!(
            msg.contains("services[0] (a.b): endpoints[0].ports.http: port 0 is out of range"),
            "{msg}"
        );
    }

    #[test]
    fn protocols_must_be_known() {
        let msg = fails(
            "services:\n- hostname: a.b\n  ports:\n  - {name: g, port: 1, protocol: GRPCX}\n",
            4,
        );
        assert!(
            msg.contains("services[0] (a.b): ports[0].protocol: unknown protocol \"GRPCX\""),
            "{msg}"
        );
        // Block style: the line of the protocol itself.
        let msg = fails(
            "services:\n- hostname: a.b\n  ports:\n  - name: g\n    port: 1\n    protocol: 7\n",
            6,
        );
        assert!(msg.contains("unknown protocol \"7\""), "{msg}");
        assert!(
            msg.contains("HTTP2"),
            "the message lists the known names: {msg}"
        );
        assert_eq!(
            parse(
                "services:\n- {hostname: a.b, ports: [{name: g, port: 1, protocol: grpc-WEB}]}\n"
            )
            .unwrap()[0]
                .service
                .ports[0]
                .protocol,
            Protocol::GrpcWeb
        );
    }

    #[test]
    fn unknown_fields_are_errors() {
        let msg = fails(
            "services:\n- hostname: a.b\n  ports: []\n  endpoint: []\n",
            4,
        );
        assert!(
            msg.contains("services[0] (a.b)") && msg.contains("unknown field `endpoint`"),
            "{msg}"
        );
        assert!(msg.contains("expected one of"), "{msg}");
        let msg = fails(
            "services:\n- hostname: a.b\n  ports: []\n  endpoints:\n  - address: 10.0.0.1\n    tlsmode: istio\n",
            6,
        );
        assert!(msg.contains("unknown field `tlsmode`"), "{msg}");
        let msg = fails("service: []\n", 1);
        assert!(msg.contains("unknown field `service`"), "{msg}");
    }

    #[test]
    fn unknown_keywords_are_errors() {
        let msg = fails(
            "services:\n- hostname: a.b\n  ports: []\n  resolution: EDS\n",
            4,
        );
        assert!(
            msg.contains("services[0] (a.b): resolution: unknown variant `EDS`"),
            "{msg}"
        );
        let msg = fails(
            "services:\n- hostname: a.b\n  ports: []\n  endpoints: [{address: 10.0.0.1, health: OK}]\n",
            4,
        );
        assert!(msg.contains("unknown variant `OK`"), "{msg}");
    }

    #[test]
    fn endpoint_ports_must_name_a_service_port() {
        let text = "services:\n- hostname: echo.default.svc.cluster.local\n  ports: [{name: grpc, port: 7070}]\n  \
                    endpoints:\n  - address: 127.0.0.1\n  - address: 127.0.0.2\n    ports:\n      grpcx: 17070\n";
        let msg = fails(text, 8);
        assert_eq!(
            msg,
            "mock.yaml:8: services[0] (echo.default.svc.cluster.local): endpoints[1] (127.0.0.2): port \"grpcx\" is \
             not a port of the service (its ports: grpc)"
        );
        // Flow style: the line of the endpoint.
        let text = "services:\n- hostname: a.b\n  ports: [{name: grpc, port: 7070}]\n  endpoints:\n  - {address: \
                    127.0.0.1}\n  - {address: 127.0.0.2, ports: {http: 80}}\n";
        let msg = fails(text, 6);
        assert!(
            msg.contains("port \"http\" is not a port of the service"),
            "{msg}"
        );
    }

    #[test]
    fn addresses_must_be_ips() {
        let text =
            "services:\n- hostname: a.b\n  ports: []\n  endpoints:\n  - address: 127.0.0.300\n";
        let msg = fails(text, 5);
        assert!(
            msg.contains("services[0] (a.b): endpoints[0].address: invalid IP address syntax"),
            "{msg}"
        );
        let msg = fails(
            "services:\n- hostname: a.b\n  ports: []\n  addresses: [10.96.0.10, vip.local]\n",
            4,
        );
        assert!(
            msg.contains("addresses[1]: invalid IP address syntax"),
            "{msg}"
        );
    }

    #[test]
    fn hostnames_are_unique_per_namespace() {
        let text = "services:\n- hostname: a.b\n  ports: []\n- hostname: a.b\n  namespace: other\n  ports: []\n- \
                    hostname: a.b\n  ports: []\n";
        let msg = fails(text, 7);
        assert!(
            msg.contains("services[2] (a.b): hostname is already declared in namespace \"default\" by services[0] (line 2)"),
            "{msg}"
        );
    }

    #[test]
    fn names_must_be_sane() {
        let msg = fails("services:\n- hostname: \"\"\n  ports: []\n", 2);
        assert!(msg.contains("hostname \"\" is not a host name"), "{msg}");
        let msg = fails(
            "services:\n- hostname: a.b\n  ports:\n  - {name: http, port: 80}\n  - {name: http, port: 81}\n",
            5,
        );
        assert!(
            msg.contains("services[0] (a.b): ports[1]: port name \"http\" is used twice"),
            "{msg}"
        );
        let msg = fails(
            "services:\n- hostname: a.b\n  ports:\n  - {name: http, port: 80}\n  - {name: web, port: 80}\n",
            5,
        );
        assert!(msg.contains("port number 80 is used twice"), "{msg}");
        let msg = fails(
            "services:\n- hostname: a.b\n  namespace: \"\"\n  ports: []\n",
            3,
        );
        assert!(msg.contains("namespace must not be empty"), "{msg}");
    }

    #[test]
    fn invalid_utf8_is_reported_with_its_line() {
        let err =
            parse_mock_registry_bytes(Path::new("mock.yaml"), b"services:\n- hostname: \xff\n")
                .unwrap_err();
        assert_eq!(err.to_string(), "mock.yaml:2: the file is not valid UTF-8");
    }

    #[test]
    fn load_reads_files_and_names_missing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mock.yaml");
        let err = load_mock_registry(&path).unwrap_err();
        assert!(matches!(err, MockFileError::Read { .. }));
        assert_eq!(
            err.to_string(),
            format!("{}: the file does not exist", path.display())
        );
        std::fs::write(&path, EXAMPLE).unwrap();
        assert_eq!(load_mock_registry(&path).unwrap().len(), 2);
    }

    // ------------------------------------------------------------------------------
    // Reloading.

    const ONE: &str = "services:\n- hostname: a.x\n  ports: [{name: http, port: 80}]\n  addresses: [10.96.0.1]\n  \
                       endpoints: [{address: 10.0.0.1}]\n";
    const TWO: &str = "services:\n- hostname: a.x\n  ports: [{name: http, port: 80}]\n  endpoints: [{address: \
                       10.0.0.2}, {address: 10.0.0.3}]\n- hostname: b.x\n  ports: [{name: tcp, port: 9000}]\n";
    const BAD: &str = "services:\n- hostname: a.x\n  ports: [{name: http, port: 0}]\n";

    fn registry() -> MemoryRegistry {
        let (sink, _rx) = UpdateSink::new(Arc::new(EndpointIndex::new()));
        MemoryRegistry::new_unsynced("c1", sink)
    }

    fn hosts(reg: &MemoryRegistry) -> Vec<String> {
        let mut hosts: Vec<String> = reg
            .services()
            .iter()
            .map(|s| s.hostname.to_string())
            .collect();
        hosts.sort();
        hosts
    }

    fn ips(reg: &MemoryRegistry, host: &str) -> Vec<String> {
        reg.endpoints(&ServiceKey::new(host, "default"))
            .iter()
            .map(|e| e.address.to_string())
            .collect()
    }

    fn counts(status: &MockFileStatus) -> (u64, u64) {
        (
            status.reloads_ok.load(Ordering::Relaxed),
            status.reloads_failed.load(Ordering::Relaxed),
        )
    }

    #[tokio::test]
    async fn metrics_report_the_load_counters_under_their_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mock.yaml");
        let status = MockFileStatus::new();
        let mut metrics = Registry::default();
        status.register_metrics(&mut metrics);
        let mut r = Reloader::new(
            path.clone(),
            registry(),
            status.clone(),
            MockFileOptions::default(),
        );
        for text in [ONE, BAD, TWO] {
            std::fs::write(&path, text).unwrap();
            r.reload().await;
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &metrics).unwrap();
        assert_eq!(
            text,
            "# HELP meshfed_mock_file_reloads Mock registry file loads by result (failed loads keep the last good content)\n\
             # TYPE meshfed_mock_file_reloads gauge\n\
             meshfed_mock_file_reloads{result=\"ok\"} 2\n\
             meshfed_mock_file_reloads{result=\"failed\"} 1\n\
             # HELP meshfed_mock_file_read_retries Mock registry file reads retried after a failure or a read that raced a writer\n\
             # TYPE meshfed_mock_file_read_retries gauge\n\
             meshfed_mock_file_read_retries{reason=\"read_error\"} 0\n\
             # HELP meshfed_mock_file_empty_withdrawals Times an emptied mock registry file withdrew its services after the settle period\n\
             # TYPE meshfed_mock_file_empty_withdrawals gauge\n\
             meshfed_mock_file_empty_withdrawals{result=\"withdrawn\"} 0\n\
             # EOF\n"
        );
    }

    #[tokio::test]
    async fn reload_skips_identical_bytes_and_keeps_the_last_good_content() {
        let (_dir, path, reg, status, mut r) = fixture(MockFileOptions::default());

        r.reload().await;
        assert_eq!(counts(&status), (0, 1), "a missing file is a failed load");
        assert!(status.last_error().unwrap().contains("does not exist"));
        r.reload().await;
        assert_eq!(
            counts(&status),
            (0, 1),
            "the same missing file is not counted twice"
        );

        std::fs::write(&path, ONE).unwrap();
        r.reload().await;
        assert_eq!(counts(&status), (1, 1));
        assert_eq!(status.last_error(), None);
        assert_eq!(hosts(&reg), vec!["a.x"]);
        let vips = &reg.services()[0].cluster_vips;
        assert_eq!(
            vips.keys().map(|c| c.as_str()).collect::<Vec<_>>(),
            vec!["c1"],
            "VIPs under the registry's cluster"
        );
        r.reload().await;
        assert_eq!(counts(&status), (1, 1), "identical bytes do nothing");

        std::fs::write(&path, BAD).unwrap();
        r.reload().await;
        assert_eq!(counts(&status), (1, 2));
        let err = status.last_error().unwrap();
        assert!(
            err.contains("mock.yaml:3: services[0] (a.x): ports[0].port: port 0"),
            "{err}"
        );
        assert_eq!(hosts(&reg), vec!["a.x"], "the last good content stays");
        r.reload().await;
        assert_eq!(
            counts(&status),
            (1, 2),
            "the same bad bytes are not counted twice"
        );

        std::fs::remove_file(&path).unwrap();
        r.reload().await;
        assert_eq!(counts(&status), (1, 3));
        assert_eq!(
            ips(&reg, "a.x"),
            vec!["10.0.0.1"],
            "a deleted file keeps the last good content"
        );

        std::fs::write(&path, ONE).unwrap();
        r.reload().await;
        assert_eq!(
            counts(&status),
            (2, 3),
            "re-created after a deletion: applied again"
        );
    }

    /// Polls `cond` until it holds, for at most 10 s.
    async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
        let wait = async {
            while !cond() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .is_err()
        {
            panic!("timed out waiting for: {what}");
        }
    }

    /// Replaces the file atomically, the way editors and config tools do.
    fn replace(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[tokio::test]
    async fn run_mock_file_follows_edits_and_survives_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mock.yaml");
        std::fs::write(&path, ONE).unwrap();
        let reg = registry();
        let status = MockFileStatus::new();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run_mock_file(
            path.clone(),
            reg.clone(),
            status.clone(),
            MockFileOptions::default(),
            async {
                let _ = stopped.await;
            },
        ));

        eventually("initial load", || {
            reg.has_synced() && counts(&status) == (1, 0)
        })
        .await;
        assert_eq!(hosts(&reg), vec!["a.x"]);
        assert_eq!(ips(&reg, "a.x"), vec!["10.0.0.1"]);

        // Atomic replace.
        replace(&path, TWO);
        eventually("second content", || hosts(&reg) == ["a.x", "b.x"]).await;
        assert_eq!(ips(&reg, "a.x"), vec!["10.0.0.2", "10.0.0.3"]);

        // A bad edit in place: logged and counted, the content stays.
        std::fs::write(&path, BAD).unwrap();
        eventually("failed reload", || counts(&status).1 == 1).await;
        assert!(
            status
                .last_error()
                .unwrap()
                .contains(":3: services[0] (a.x): ports[0].port")
        );
        assert_eq!(hosts(&reg), vec!["a.x", "b.x"]);

        // The next good edit recovers.
        std::fs::write(&path, ONE).unwrap();
        eventually("recovery", || hosts(&reg) == ["a.x"]).await;
        assert_eq!(ips(&reg, "a.x"), vec!["10.0.0.1"]);
        assert_eq!(status.last_error(), None);

        // Deleted: warned, counted, the content stays.
        std::fs::remove_file(&path).unwrap();
        eventually("deletion noticed", || counts(&status).1 == 2).await;
        assert_eq!(hosts(&reg), vec!["a.x"]);

        // Re-created.
        replace(&path, TWO);
        eventually("re-created", || hosts(&reg) == ["a.x", "b.x"]).await;

        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn run_mock_file_serves_empty_and_synced_when_the_first_load_fails() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mock.yaml");
        std::fs::write(&path, BAD).unwrap();
        let reg = registry();
        let status = MockFileStatus::new();
        let task = tokio::spawn(run_mock_file(
            path.clone(),
            reg.clone(),
            status.clone(),
            MockFileOptions::default(),
            std::future::pending(),
        ));
        eventually("synced despite the bad file", || reg.has_synced()).await;
        assert_eq!(counts(&status), (0, 1));
        assert!(reg.services().is_empty());
        replace(&path, ONE);
        eventually("fixed file loaded", || hosts(&reg) == ["a.x"]).await;
        task.abort();
    }

    #[tokio::test]
    async fn run_mock_file_picks_up_a_file_created_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mock.yaml");
        let reg = registry();
        let status = MockFileStatus::new();
        let task = tokio::spawn(run_mock_file(
            path.clone(),
            reg.clone(),
            status.clone(),
            MockFileOptions::default(),
            std::future::pending(),
        ));
        eventually("synced without a file", || reg.has_synced()).await;
        std::fs::write(&path, ONE).unwrap();
        eventually("created file loaded", || hosts(&reg) == ["a.x"]).await;
        task.abort();
    }

    #[tokio::test]
    async fn run_mock_file_fails_fast_without_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry();
        let err = run_mock_file(
            dir.path().join("nope/mock.yaml"),
            reg.clone(),
            MockFileStatus::new(),
            MockFileOptions::default(),
            async {},
        )
        .await
        .unwrap_err();
        assert!(matches!(err, WatchError::DirMissing { .. }), "{err}");
        assert!(!reg.has_synced());
    }

    // ------------------------------------------------------------------------------
    // Hostile writers and files.

    /// Captures what is logged on this thread while the guard lives.
    fn capture_logs() -> (Arc<Mutex<Vec<u8>>>, tracing::subscriber::DefaultGuard) {
        #[derive(Clone)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = Buf(buf.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (buf, tracing::subscriber::set_default(subscriber))
    }

    fn logged(buf: &Arc<Mutex<Vec<u8>>>) -> String {
        String::from_utf8_lossy(&buf.lock().unwrap()).into_owned()
    }

    fn withdrawals(status: &MockFileStatus) -> u64 {
        status.empty_withdrawals.load(Ordering::Relaxed)
    }

    fn retries(status: &MockFileStatus) -> u64 {
        status.read_retries.load(Ordering::Relaxed)
    }

    /// Truncates the file in place, as the shell's `>` does before the writer writes.
    fn truncate(path: &Path) {
        std::fs::File::create(path).unwrap();
    }

    /// A reloader of `mock.yaml` in a scratch directory (the file not yet written).
    fn fixture(
        options: MockFileOptions,
    ) -> (
        tempfile::TempDir,
        PathBuf,
        MemoryRegistry,
        MockFileStatus,
        Reloader,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mock.yaml");
        let reg = registry();
        let status = MockFileStatus::new();
        let r = Reloader::new(path.clone(), reg.clone(), status.clone(), options);
        (dir, path, reg, status, r)
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_writer_does_not_withdraw_services() {
        // `{ sleep 0.3; cat good.yaml; } > mock.yaml`: the shell truncates the file, the
        // content comes 300 ms later, well after the watcher's 50 ms quiet window.
        let (_dir, path, reg, status, mut r) = fixture(MockFileOptions::default());
        std::fs::write(&path, ONE).unwrap();
        assert_eq!(r.reload().await, None);
        assert_eq!(hosts(&reg), vec!["a.x"]);

        truncate(&path);
        assert_eq!(
            r.reload().await,
            Some(DEFAULT_EMPTY_SETTLE),
            "the empty read waits for the file to settle"
        );
        assert_eq!(hosts(&reg), vec!["a.x"], "the services stay meanwhile");

        tokio::time::advance(Duration::from_millis(300)).await;
        std::fs::write(&path, TWO).unwrap();
        assert_eq!(r.reload().await, None);
        assert_eq!(hosts(&reg), vec!["a.x", "b.x"]);
        assert_eq!(withdrawals(&status), 0);

        // The pending withdrawal is gone with the emptiness: a later read does nothing.
        tokio::time::advance(DEFAULT_EMPTY_SETTLE * 2).await;
        assert_eq!(r.reload().await, None);
        assert_eq!(hosts(&reg), vec!["a.x", "b.x"]);
        assert_eq!(withdrawals(&status), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_emptied_file_withdraws_only_after_the_settle_period() {
        let (logs, _guard) = capture_logs();
        let (_dir, path, reg, status, mut r) = fixture(MockFileOptions::default());
        std::fs::write(&path, TWO).unwrap();
        r.reload().await;
        assert_eq!(hosts(&reg), vec!["a.x", "b.x"]);

        // `: > mock.yaml`, then a comment-only edit: still no services.
        truncate(&path);
        assert_eq!(r.reload().await, Some(DEFAULT_EMPTY_SETTLE));
        tokio::time::advance(Duration::from_secs(4)).await;
        std::fs::write(&path, "# nothing here yet\n").unwrap();
        assert_eq!(
            r.reload().await,
            Some(Duration::from_secs(1)),
            "the settle period runs from the first empty read"
        );
        assert_eq!(hosts(&reg), vec!["a.x", "b.x"]);
        assert_eq!(withdrawals(&status), 0);
        assert!(!logged(&logs).contains("withdrawing"));

        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(r.reload().await, None);
        assert!(hosts(&reg).is_empty(), "withdrawn once it stayed empty");
        assert_eq!(withdrawals(&status), 1);
        let text = logged(&logs);
        assert!(
            text.contains("WARN")
                && text.contains(&format!(
                    "mock registry file {} is empty: withdrawing 2 services",
                    path.display()
                )),
            "{text}"
        );

        // Empty and nothing held: nothing to wait for.
        std::fs::write(&path, "").unwrap();
        assert_eq!(r.reload().await, None);
        assert_eq!(withdrawals(&status), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_follow_loop_withdraws_an_emptied_file_on_its_own_timer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mock.yaml");
        std::fs::write(&path, ONE).unwrap();
        let reg = registry();
        let status = MockFileStatus::new();
        let (tick, watcher) = PathWatcher::manual(&path);
        let r = Reloader::new(
            path.clone(),
            reg.clone(),
            status.clone(),
            MockFileOptions::default(),
        );
        let task = tokio::spawn(follow(watcher, r, std::future::pending()));
        eventually("initial load", || hosts(&reg) == ["a.x"]).await;

        truncate(&path);
        tick.send(()).await.unwrap();
        let emptied = Instant::now();
        // One notification only: the loop re-reads by itself once the period is over.
        tokio::time::sleep(DEFAULT_EMPTY_SETTLE - Duration::from_millis(100)).await;
        assert_eq!(hosts(&reg), vec!["a.x"], "not yet");
        eventually("withdrawn", || hosts(&reg).is_empty()).await;
        assert!(emptied.elapsed() >= DEFAULT_EMPTY_SETTLE);
        assert_eq!(withdrawals(&status), 1);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_is_retried_with_backoff_until_it_succeeds() {
        let (_dir, path, reg, status, mut r) = fixture(MockFileOptions::default());
        // A directory where the file should be: every read fails (as EMFILE would).
        std::fs::create_dir(&path).unwrap();
        assert_eq!(r.reload().await, Some(Duration::from_millis(100)));
        assert_eq!(r.reload().await, Some(Duration::from_millis(200)));
        assert_eq!(r.reload().await, Some(Duration::from_millis(400)));
        assert_eq!(counts(&status), (0, 1), "one failure, retried");
        assert_eq!(retries(&status), 3);
        let err = status.last_error().unwrap();
        assert!(
            err.contains("not a regular file (it is a directory)"),
            "{err}"
        );

        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, ONE).unwrap();
        assert_eq!(r.reload().await, None, "success: no more retries");
        assert_eq!(hosts(&reg), vec!["a.x"]);

        // The backoff starts over after a success.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert_eq!(r.reload().await, Some(Duration::from_millis(100)));
        assert_eq!(hosts(&reg), vec!["a.x"], "the last good content stays");
    }

    #[tokio::test(start_paused = true)]
    async fn the_follow_loop_retries_a_failed_read_without_a_notification() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mock.yaml");
        std::fs::create_dir(&path).unwrap();
        let reg = registry();
        let status = MockFileStatus::new();
        // No notification is ever sent: only the retry can pick the fix up.
        let (_tick, watcher) = PathWatcher::manual(&path);
        let r = Reloader::new(
            path.clone(),
            reg.clone(),
            status.clone(),
            MockFileOptions::default(),
        );
        let task = tokio::spawn(follow(watcher, r, std::future::pending()));
        eventually("synced despite the failed read", || reg.has_synced()).await;
        eventually("a few retries", || retries(&status) >= 3).await;
        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, ONE).unwrap();
        eventually("picked up by a retry", || hosts(&reg) == ["a.x"]).await;
        let done = retries(&status);
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(retries(&status), done, "no retries after the success");
        task.abort();
    }

    #[tokio::test]
    async fn a_file_over_the_size_limit_keeps_the_last_good_content() {
        let (_dir, path, reg, status, mut r) = fixture(MockFileOptions {
            max_file_size: ONE.len() as u64,
            ..MockFileOptions::default()
        });
        std::fs::write(&path, ONE).unwrap();
        assert_eq!(r.reload().await, None, "exactly at the limit");
        std::fs::write(&path, TWO).unwrap();
        assert!(TWO.len() > ONE.len());
        assert!(r.reload().await.is_some(), "retried");
        let err = status.last_error().unwrap();
        assert!(
            err.contains(&format!(
                "larger than the size limit of {} bytes",
                ONE.len()
            )) && err.contains("--maxConfigFileSize"),
            "{err}"
        );
        assert_eq!(hosts(&reg), vec!["a.x"]);
    }

    #[tokio::test]
    async fn a_device_is_refused_and_shutdown_is_prompt() {
        // `--mockRegistryFile /dev/zero` used to read forever, growing without bound.
        let reg = registry();
        let status = MockFileStatus::new();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run_mock_file(
            PathBuf::from("/dev/zero"),
            reg.clone(),
            status.clone(),
            MockFileOptions::default(),
            async {
                let _ = stopped.await;
            },
        ));
        eventually("synced, the device refused", || reg.has_synced()).await;
        let err = status.last_error().unwrap();
        assert!(
            err.contains("/dev/zero: not a regular file (it is a character device)"),
            "{err}"
        );
        assert!(reg.services().is_empty());
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the task ends at shutdown")
            .unwrap()
            .unwrap();
    }
}

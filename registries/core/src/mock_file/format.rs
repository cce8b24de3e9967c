//! The mock registry file format: the file as written, its parsing and its checks,
//! and errors that name the file, the line and the service and field at fault.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::num::NonZeroU16;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer};

use crate::config::validate::Segment;
use crate::memory::ServiceWithEndpoints;
use crate::model::{
    ClusterId, Endpoint, ExportTo, HealthStatus, Locality, MeshLocation, NetworkId, Port, Protocol,
    ProviderId, Resolution, Service, ServiceKey, TlsMode, WorkloadKind, WorkloadMeta,
};
use crate::read::{DEFAULT_MAX_FILE_SIZE, ReadError, read_watched_file_blocking};

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
    /// The workload's name (default: the address); with `node`, what ambient
    /// workloads and ztunnel certificates are keyed by.
    #[serde(default)]
    name: Option<String>,
    /// The node the workload runs on.
    #[serde(default)]
    node: Option<String>,
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
pub(super) fn parse_mock_registry_bytes(
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
/// given to [`MemoryRegistry::replace_all`](crate::memory::MemoryRegistry::replace_all)).
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
        let name = ep.name.unwrap_or_else(|| ep.address.to_string());
        let namespace = service.namespace.to_string();
        let label = |k: &str| endpoint.labels.get(k).cloned().unwrap_or_default();
        endpoint.workload = Some(Arc::new(WorkloadMeta {
            kind: WorkloadKind::External,
            uid: format!(
                "{}/mock/{namespace}/{}/{name}",
                service.cluster_id, service.hostname
            ),
            workload_name: name.clone(),
            name,
            namespace,
            node_name: ep.node.unwrap_or_default(),
            dataplane_mode: label("istio.io/dataplane-mode"),
            use_waypoint: label("istio.io/use-waypoint"),
            use_waypoint_namespace: label("istio.io/use-waypoint-namespace"),
            ..WorkloadMeta::default()
        }));
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

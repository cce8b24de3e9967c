//! Pure conversions from Consul's answers to the mesh model (reference §5.2, with the
//! improvements listed in its "Build" note).
//!
//! - A catalog service `web` is one service `web.<suffix>` in the configured namespace,
//!   client-side load balanced, created at the epoch (Consul keeps no creation time; a
//!   fixed time keeps the merge policy deterministic).
//! - Ports: the union of the instances' ports. The protocol of an instance is its
//!   service meta `protocol`, else its first tag that names a protocol (`http`,
//!   `grpc`, ...), else TCP; a port number claimed with two protocols keeps the first
//!   (instances in node, id order). A port is named after its protocol (`http`), or
//!   `<protocol>-<port>` when the service has several ports with that protocol.
//! - An endpoint per instance: the service address, else the node's; labels from tags
//!   `key|value` (other tags are ignored) and then the service meta; the node's
//!   datacenter as locality region; health from every check of the entry; TLS mode
//!   and network from the labels `security.istio.io/tlsMode` and
//!   `topology.istio.io/network`; weight from `Weights.Passing`.
//! - An entry that cannot be converted (bad JSON shape, no IP address, port 0, another
//!   service's entry) is skipped with the reason; the others are kept.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use meshfed_registry::{
    ClusterId, Endpoint, HealthStatus, Locality, MeshLocation, NetworkId, Port, Protocol,
    ProviderId, Resolution, Service, TlsMode, WorkloadKind, WorkloadMeta,
};
use serde_json::Value;

use crate::api::{HealthCheck, HealthEntry};
use crate::config::ConsulConfig;

/// Label carrying an endpoint's TLS mode.
pub const TLS_MODE_LABEL: &str = "security.istio.io/tlsMode";
/// Label carrying an endpoint's network.
pub const NETWORK_LABEL: &str = "topology.istio.io/network";
/// Service meta key carrying the protocol.
pub const PROTOCOL_META: &str = "protocol";
/// Service meta key marking the service as outside the mesh (any non-empty value).
pub const EXTERNAL_META: &str = "external";

/// Whether `name` can be a DNS label of a mesh hostname: 1 to 63 ASCII letters,
/// digits, `-` or `_`, not starting or ending with `-`.
pub fn check_service_name(name: &str) -> Result<(), String> {
    let valid_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if name.is_empty() || name.len() > 63 || !valid_chars {
        return Err(format!(
            "service name {name:?} is not a DNS label (1-63 letters, digits, '-' or '_')"
        ));
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(format!(
            "service name {name:?} starts or ends with '-' (not a DNS label)"
        ));
    }
    Ok(())
}

/// What the registry needs to convert: its settings, datacenter and cluster id.
#[derive(Clone, Debug)]
pub struct Context {
    /// The registry settings.
    pub config: Arc<ConsulConfig>,
    /// The datacenter read (hostnames with `{dc}`, default locality).
    pub datacenter: String,
    /// The registry's cluster id.
    pub cluster: ClusterId,
}

/// One converted catalog service.
#[derive(Clone, Debug, PartialEq)]
pub struct Converted {
    /// The service; `None` when no instance could be converted.
    pub service: Option<Service>,
    /// Its endpoints, sorted by address and ports.
    pub endpoints: Vec<Endpoint>,
    /// Entries skipped, each with its reason.
    pub skipped: Vec<String>,
    /// Things worth a warning that did not skip anything (port protocol conflicts).
    pub warnings: Vec<String>,
}

/// The health of an instance from every check of its entry: any `critical` (or
/// `maintenance`, or an unknown status) makes it unhealthy, otherwise any `warning`
/// gives `warning_health`, otherwise (all passing, or no check) healthy.
pub fn health_of(checks: &[HealthCheck], warning_health: HealthStatus) -> HealthStatus {
    let mut health = HealthStatus::Healthy;
    for check in checks {
        match check.status.as_str() {
            "passing" => {}
            "warning" => health = warning_health,
            _ => return HealthStatus::Unhealthy,
        }
    }
    health
}

/// The protocol of an instance: meta `protocol`, else the first protocol-naming tag,
/// else TCP. Unknown names in the meta are TCP, as in Istio's Consul registry.
pub fn protocol_of(meta: &BTreeMap<String, String>, tags: &[String]) -> Protocol {
    if let Some(p) = meta.get(PROTOCOL_META) {
        return match Protocol::parse(p) {
            Protocol::Unsupported => Protocol::Tcp,
            p => p,
        };
    }
    tags.iter()
        .find_map(|t| Protocol::parse_known(t).filter(|p| *p != Protocol::Unsupported))
        .unwrap_or(Protocol::Tcp)
}

/// Endpoint labels: tags `key|value` (others ignored), then the service meta.
pub fn labels_of(tags: &[String], meta: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = tags
        .iter()
        .filter_map(|t| t.split_once('|'))
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.extend(meta.iter().map(|(k, v)| (k.clone(), v.clone())));
    labels
}

/// Converts the health entries of Consul service `name`.
pub fn convert_service(name: &str, entries: &[Value], ctx: &Context) -> Converted {
    let mut skipped = Vec::new();
    let mut warnings = Vec::new();
    let mut instances: Vec<(HealthEntry, IpAddr)> = Vec::new();
    for raw in entries {
        let entry = match HealthEntry::parse(raw) {
            Ok(e) => e,
            Err(err) => {
                let id = raw
                    .pointer("/Service/ID")
                    .and_then(Value::as_str)
                    .unwrap_or("<no id>");
                skipped.push(format!("instance {id}: malformed entry: {err}"));
                continue;
            }
        };
        let id = &entry.service.id;
        if entry.service.name != name {
            skipped.push(format!(
                "instance {id}: belongs to service {:?}",
                entry.service.name
            ));
            continue;
        }
        if entry.service.port == 0 {
            skipped.push(format!("instance {id}: no port"));
            continue;
        }
        let address = if entry.service.address.is_empty() {
            &entry.node.address
        } else {
            &entry.service.address
        };
        let Ok(ip) = address.parse::<IpAddr>() else {
            skipped.push(format!(
                "instance {id}: address {address:?} is not an IP address"
            ));
            continue;
        };
        instances.push((entry, ip));
    }
    instances.sort_by(|(a, _), (b, _)| {
        (&a.node.name, &a.service.id).cmp(&(&b.node.name, &b.service.id))
    });

    // Ports: first protocol seen per number wins.
    let mut by_number: BTreeMap<u16, Protocol> = BTreeMap::new();
    for (entry, _) in &instances {
        let protocol = protocol_of(&entry.service.meta, &entry.service.tags);
        let port = entry.service.port;
        match by_number.get(&port) {
            None => {
                by_number.insert(port, protocol);
            }
            Some(first) if *first != protocol => warnings.push(format!(
                "port {port}: instance {} says {protocol}, keeping {first}",
                entry.service.id
            )),
            Some(_) => {}
        }
    }
    let mut per_protocol: BTreeMap<Protocol, usize> = BTreeMap::new();
    for p in by_number.values() {
        *per_protocol.entry(*p).or_default() += 1;
    }
    let ports: Vec<Port> = by_number
        .iter()
        .filter_map(|(number, protocol)| {
            let base = protocol.as_str().to_ascii_lowercase();
            let name = if per_protocol[protocol] > 1 {
                format!("{base}-{number}")
            } else {
                base
            };
            Port::new(&name, *number, *protocol)
        })
        .collect();
    let port_names: BTreeMap<u16, Arc<str>> = ports
        .iter()
        .map(|p| (p.port.get(), p.name.clone()))
        .collect();

    let mut external = false;
    let mut endpoints: Vec<Endpoint> = instances
        .iter()
        .map(|(entry, ip)| {
            let svc = &entry.service;
            external |= svc.meta.get(EXTERNAL_META).is_some_and(|v| !v.is_empty());
            let labels = labels_of(&svc.tags, &svc.meta);
            let mut endpoint = Endpoint::new(*ip);
            endpoint
                .ports
                .insert(port_names[&svc.port].clone(), svc.port);
            endpoint.locality = Locality {
                region: if entry.node.datacenter.is_empty() {
                    ctx.datacenter.clone()
                } else {
                    entry.node.datacenter.clone()
                },
                ..Locality::default()
            };
            endpoint.network = labels
                .get(NETWORK_LABEL)
                .map(NetworkId::new)
                .unwrap_or_default();
            endpoint.tls_mode = match labels.get(TLS_MODE_LABEL).map(String::as_str) {
                Some("istio") => TlsMode::Istio,
                _ => TlsMode::Disabled,
            };
            endpoint.health = health_of(&entry.checks, ctx.config.warning_health);
            endpoint.weight = svc.weights.map(|w| w.passing).unwrap_or(1).max(1);
            endpoint.cluster_id = ctx.cluster.clone();
            let namespace = ctx.config.namespace.as_str();
            endpoint.workload = Some(std::sync::Arc::new(WorkloadMeta {
                kind: WorkloadKind::External,
                name: svc.id.clone(),
                namespace: namespace.to_string(),
                uid: format!("{}/consul/{namespace}/{}/{}", ctx.cluster, name, svc.id),
                node_name: entry.node.name.clone(),
                workload_name: name.to_string(),
                dataplane_mode: labels
                    .get("istio.io/dataplane-mode")
                    .cloned()
                    .unwrap_or_default(),
                use_waypoint: labels
                    .get("istio.io/use-waypoint")
                    .cloned()
                    .unwrap_or_default(),
                ..WorkloadMeta::default()
            }));
            endpoint.labels = labels;
            endpoint
        })
        .collect();
    endpoints.sort_by(|a, b| (a.address, &a.ports).cmp(&(b.address, &b.ports)));

    let service = (!ports.is_empty()).then(|| {
        let mut service = Service::new(
            ctx.config.hostname(name, &ctx.datacenter),
            ctx.config.namespace.clone(),
            ProviderId::Consul,
            ctx.cluster.clone(),
        );
        service.ports = ports;
        service.resolution = Resolution::ClientSideLb;
        service.location = if external {
            MeshLocation::MeshExternal
        } else {
            MeshLocation::MeshInternal
        };
        service.creation_time = SystemTime::UNIX_EPOCH;
        service
    });
    Converted {
        service,
        endpoints,
        skipped,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx() -> Context {
        Context {
            config: Arc::new(ConsulConfig::default()),
            datacenter: "dc1".into(),
            cluster: ClusterId::new("dc1"),
        }
    }

    fn entry(
        id: &str,
        node_addr: &str,
        addr: &str,
        port: u16,
        tags: &[&str],
        meta: Value,
    ) -> Value {
        json!({
            "Node": {"Node": format!("node-{id}"), "Address": node_addr, "Datacenter": "dc1"},
            "Service": {"ID": id, "Service": "web", "Tags": tags, "Address": addr,
                        "Meta": meta, "Port": port},
            "Checks": [{"CheckID": "serfHealth", "Status": "passing", "ServiceID": ""}]
        })
    }

    #[test]
    fn service_ports_protocols_and_endpoints() {
        let entries = vec![
            entry(
                "web-2",
                "10.0.0.2",
                "",
                8080,
                &["v1", "version|v1"],
                json!({"protocol": "http"}),
            ),
            entry("web-1", "10.0.0.9", "10.0.0.1", 8080, &["grpc"], json!({})),
            entry(
                "web-3",
                "10.0.0.3",
                "",
                9090,
                &["grpc"],
                json!({"team": "a"}),
            ),
        ];
        let c = convert_service("web", &entries, &ctx());
        let s = c.service.unwrap();
        assert_eq!(s.hostname.as_str(), "web.service.consul");
        assert_eq!(s.namespace.as_str(), "default");
        assert_eq!(s.provider, ProviderId::Consul);
        assert_eq!(s.cluster_id.as_str(), "dc1");
        // web-1 sorts first (node-web-1), so port 8080 is gRPC; web-2's "http" is a conflict.
        let ports: Vec<_> = s
            .ports
            .iter()
            .map(|p| (&*p.name, p.port.get(), p.protocol))
            .collect();
        assert_eq!(
            ports,
            vec![
                ("grpc-8080", 8080, Protocol::Grpc),
                ("grpc-9090", 9090, Protocol::Grpc)
            ]
        );
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        let addrs: Vec<String> = c.endpoints.iter().map(|e| e.address.to_string()).collect();
        assert_eq!(
            addrs,
            ["10.0.0.1", "10.0.0.2", "10.0.0.3"],
            "service address first, else node"
        );
        let web2 = &c.endpoints[1];
        assert_eq!(web2.labels.get("version").map(String::as_str), Some("v1"));
        assert!(!web2.labels.contains_key("v1"), "plain tags are not labels");
        assert_eq!(
            web2.labels.get("protocol").map(String::as_str),
            Some("http")
        );
        assert_eq!(web2.locality.region, "dc1");
        assert_eq!(c.endpoints[2].ports.get("grpc-9090"), Some(&9090));
    }

    #[test]
    fn single_port_is_named_after_its_protocol_and_default_is_tcp() {
        let c = convert_service(
            "web",
            &[entry("a", "10.0.0.1", "", 5432, &[], json!({}))],
            &ctx(),
        );
        let s = c.service.unwrap();
        assert_eq!(&*s.ports[0].name, "tcp");
        assert_eq!(s.ports[0].protocol, Protocol::Tcp);
        let c = convert_service(
            "web",
            &[entry(
                "a",
                "10.0.0.1",
                "",
                80,
                &[],
                json!({"protocol": "HTTP2"}),
            )],
            &ctx(),
        );
        assert_eq!(c.service.unwrap().ports[0].protocol, Protocol::Http2);
    }

    #[test]
    fn malformed_entries_are_skipped_alone() {
        let mut no_port = entry("b", "10.0.0.2", "", 0, &[], json!({}));
        no_port["Service"]["Port"] = json!(0);
        let entries = vec![
            entry("a", "10.0.0.1", "", 80, &["http"], json!({})),
            no_port,
            entry("c", "db.example.com", "", 80, &[], json!({})),
            json!({"Node": 7}),
            json!({"Service": {"ID": "d", "Service": "web", "Port": "eighty"}}),
        ];
        let c = convert_service("web", &entries, &ctx());
        assert_eq!(c.endpoints.len(), 1);
        assert_eq!(c.skipped.len(), 4, "{:?}", c.skipped);
        assert!(c.skipped.iter().any(|s| s.contains("not an IP")));
        assert!(c.skipped.iter().any(|s| s.starts_with("instance d:")));
        let none = convert_service("web", &[json!(null)], &ctx());
        assert!(none.service.is_none());
    }

    #[test]
    fn health_tls_network_and_external() {
        let mut e = entry(
            "a",
            "10.0.0.1",
            "",
            80,
            &[
                "security.istio.io/tlsMode|istio",
                "topology.istio.io/network|vm-net",
            ],
            json!({"external": "true"}),
        );
        e["Checks"] = json!([
            {"CheckID": "serfHealth", "Status": "passing", "ServiceID": ""},
            {"CheckID": "service:a", "Status": "warning", "ServiceID": "a"}
        ]);
        let c = convert_service("web", std::slice::from_ref(&e), &ctx());
        let ep = &c.endpoints[0];
        assert_eq!(
            ep.health,
            HealthStatus::Healthy,
            "warning is healthy by default"
        );
        assert_eq!(ep.tls_mode, TlsMode::Istio);
        assert_eq!(ep.network.as_str(), "vm-net");
        assert_eq!(c.service.unwrap().location, MeshLocation::MeshExternal);
        let mut strict = ctx();
        strict.config = Arc::new(ConsulConfig {
            warning_health: HealthStatus::Unhealthy,
            ..ConsulConfig::default()
        });
        let c = convert_service("web", std::slice::from_ref(&e), &strict);
        assert_eq!(c.endpoints[0].health, HealthStatus::Unhealthy);
        e["Checks"][0]["Status"] = json!("critical");
        let c = convert_service("web", &[e], &ctx());
        assert_eq!(
            c.endpoints[0].health,
            HealthStatus::Unhealthy,
            "a critical node check counts"
        );
    }

    #[test]
    fn service_names_must_be_dns_labels() {
        assert!(check_service_name("web").is_ok());
        assert!(check_service_name("my_svc-2").is_ok());
        assert!(check_service_name("").is_err());
        assert!(check_service_name("a.b").is_err());
        assert!(check_service_name("-a").is_err());
        assert!(check_service_name(&"x".repeat(64)).is_err());
    }
}

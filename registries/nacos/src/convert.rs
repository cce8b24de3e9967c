//! Pure conversions from Nacos instances to the mesh model.
//!
//! - A Nacos service `web` of group `G` in namespace `ns` is one service
//!   `web.g.ns.<suffix>` in the configured mesh namespace, client-side load balanced,
//!   mesh internal, created at the epoch (a fixed time keeps the merge deterministic).
//! - Ports: the union of the instances' ports; the protocol of an instance is its
//!   metadata `protocol` (an unknown name is TCP), else HTTP, as Higress maps it; a
//!   port claimed with two protocols keeps the first (instances in `ip`, `port`
//!   order). A port is named after its protocol, or `<protocol>-<port>` when the
//!   service has several ports with that protocol.
//! - An endpoint per instance: `ip` and `port`; `healthy: false` is an unhealthy
//!   endpoint (kept, not ready); `enabled: false` or a weight of 0 takes it out
//!   (Nacos clients never pick such instances); the weight is rounded to an integer
//!   of at least 1; the locality is the one configured for its `clusterName`;
//!   metadata becomes labels, except keys or values that are not valid label text,
//!   which are reported and left out; TLS mode and network from the labels
//!   `security.istio.io/tlsMode` and `topology.istio.io/network`.
//! - An instance that cannot be converted (bad JSON shape, no IP address, port 0) is
//!   skipped with the reason; the others are kept.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use meshfed_registry::{
    ClusterId, Endpoint, HealthStatus, MeshLocation, NetworkId, Port, Protocol, ProviderId,
    Resolution, Service, TlsMode,
};
use serde_json::Value;

use crate::config::NacosConfig;
use crate::wire::Instance;

/// The provider name of Nacos services and shards.
pub const PROVIDER: ProviderId = ProviderId::Named("Nacos");
/// Label carrying an endpoint's TLS mode.
pub const TLS_MODE_LABEL: &str = "security.istio.io/tlsMode";
/// Label carrying an endpoint's network.
pub const NETWORK_LABEL: &str = "topology.istio.io/network";
/// Metadata key carrying the protocol.
pub const PROTOCOL_META: &str = "protocol";

/// A Nacos service: namespace id, group and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceName {
    /// Namespace id.
    pub namespace: String,
    /// Group.
    pub group: String,
    /// Service name.
    pub name: String,
}

impl std::fmt::Display for ServiceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}@@{}", self.namespace, self.group, self.name)
    }
}

/// Whether a service name can be the first label of a mesh hostname: 1 to 63 ASCII
/// letters, digits, `-` or `_`, not starting or ending with `-`.
pub fn check_service_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('-')
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "service name {name:?} cannot be a hostname label (1-63 letters, digits, '-' or '_')"
        ))
    }
}

/// A Kubernetes label key: an optional DNS subdomain and `/`, then 1-63 letters,
/// digits, `-`, `_`, `.`, starting and ending with a letter or digit.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    if prefix_ok && name.len() <= 63 && is_qualified(name) {
        Ok(())
    } else {
        Err(format!("label key {key:?} is not a valid label key"))
    }
}

/// A label value: empty, or up to 63 letters, digits, `-`, `_`, `.`, starting and
/// ending with a letter or digit.
pub fn check_label_value(key: &str, value: &str) -> Result<(), String> {
    if value.is_empty() || (value.len() <= 63 && is_qualified(value)) {
        Ok(())
    } else {
        Err(format!(
            "label {key:?}: value {value:?} is not a valid label value"
        ))
    }
}

fn is_qualified(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// What the registry needs to convert.
#[derive(Clone, Debug)]
pub struct Context {
    /// The registry settings.
    pub config: Arc<NacosConfig>,
    /// The registry's cluster id.
    pub cluster: ClusterId,
}

/// One converted Nacos service.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Converted {
    /// The service; `None` when no instance could be converted.
    pub service: Option<Service>,
    /// Its endpoints, sorted by address and ports.
    pub endpoints: Vec<Endpoint>,
    /// Instances skipped, each with its reason.
    pub skipped: Vec<String>,
    /// Instances taken out of traffic in Nacos (disabled or weight 0).
    pub excluded: usize,
    /// Metadata entries left out of the labels, each with its reason.
    pub invalid_labels: Vec<String>,
    /// Worth a warning without skipping anything (port protocol conflicts).
    pub warnings: Vec<String>,
}

/// The protocol of an instance: metadata `protocol` (unknown names are TCP), else
/// HTTP.
pub fn protocol_of(meta: &BTreeMap<String, String>) -> Protocol {
    match meta.get(PROTOCOL_META) {
        Some(p) => match Protocol::parse(p) {
            Protocol::Unsupported => Protocol::Tcp,
            p => p,
        },
        None => Protocol::Http,
    }
}

/// Converts the hosts of Nacos service `name`.
pub fn convert_service(name: &ServiceName, hosts: &[Value], ctx: &Context) -> Converted {
    let mut out = Converted::default();
    let mut instances: Vec<(Instance, IpAddr)> = Vec::with_capacity(hosts.len());
    for raw in hosts {
        let instance = match Instance::parse(raw) {
            Ok(i) => i,
            Err(err) => {
                let id = Instance::describe(raw);
                out.skipped.push(format!("instance {id}: malformed: {err}"));
                continue;
            }
        };
        if instance.port == 0 {
            out.skipped
                .push(format!("instance {}: no port", Instance::describe(raw)));
            continue;
        }
        let Ok(ip) = instance.ip.parse::<IpAddr>() else {
            out.skipped.push(format!(
                "instance {}: address {:?} is not an IP address",
                Instance::describe(raw),
                instance.ip
            ));
            continue;
        };
        if !instance.enabled || instance.weight <= 0.0 || instance.weight.is_nan() {
            out.excluded += 1;
            continue;
        }
        instances.push((instance, ip));
    }
    instances.sort_by(|(a, ai), (b, bi)| (ai, a.port).cmp(&(bi, b.port)));

    let mut by_number: BTreeMap<u16, Protocol> = BTreeMap::new();
    for (instance, ip) in &instances {
        let protocol = protocol_of(&instance.metadata);
        match by_number.get(&instance.port) {
            None => {
                by_number.insert(instance.port, protocol);
            }
            Some(first) if *first != protocol => out.warnings.push(format!(
                "port {}: instance {ip} says {protocol}, keeping {first}",
                instance.port
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
            let port_name = if per_protocol[protocol] > 1 {
                format!("{base}-{number}")
            } else {
                base
            };
            Port::new(&port_name, *number, *protocol)
        })
        .collect();
    let port_names: BTreeMap<u16, Arc<str>> = ports
        .iter()
        .map(|p| (p.port.get(), p.name.clone()))
        .collect();

    for (instance, ip) in instances {
        let mut labels = BTreeMap::new();
        for (key, value) in &instance.metadata {
            match check_label_key(key).and_then(|()| check_label_value(key, value)) {
                Ok(()) => {
                    labels.insert(key.clone(), value.clone());
                }
                Err(reason) => out.invalid_labels.push(format!("instance {ip}: {reason}")),
            }
        }
        let Some(port_name) = port_names.get(&instance.port) else {
            continue;
        };
        let mut endpoint = Endpoint::new(ip);
        endpoint.ports.insert(port_name.clone(), instance.port);
        endpoint.locality = ctx.config.locality(&instance.cluster_name);
        endpoint.network = labels
            .get(NETWORK_LABEL)
            .map(NetworkId::new)
            .unwrap_or_default();
        endpoint.tls_mode = match labels.get(TLS_MODE_LABEL).map(String::as_str) {
            Some("istio") => TlsMode::Istio,
            _ => TlsMode::Disabled,
        };
        endpoint.health = if instance.healthy {
            HealthStatus::Healthy
        } else {
            HealthStatus::Unhealthy
        };
        endpoint.weight = instance.weight.round().clamp(1.0, 1_000_000.0) as u32;
        endpoint.cluster_id = ctx.cluster.clone();
        endpoint.labels = labels;
        out.endpoints.push(endpoint);
    }
    out.endpoints
        .sort_by(|a, b| (a.address, &a.ports).cmp(&(b.address, &b.ports)));

    out.service = (!ports.is_empty()).then(|| {
        let mut service = Service::new(
            ctx.config
                .hostname(&name.namespace, &name.group, &name.name),
            ctx.config.mesh_namespace.clone(),
            PROVIDER,
            ctx.cluster.clone(),
        );
        service.ports = ports;
        service.resolution = Resolution::ClientSideLb;
        service.location = MeshLocation::MeshInternal;
        service.creation_time = SystemTime::UNIX_EPOCH;
        service
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshfed_registry::Locality;
    use serde_json::json;

    fn ctx() -> Context {
        let mut config = NacosConfig::default();
        config
            .localities
            .insert("HZ".into(), Locality::parse("cn-hangzhou/cn-hangzhou-a"));
        Context {
            config: Arc::new(config),
            cluster: ClusterId::new("nacos"),
        }
    }

    fn web() -> ServiceName {
        ServiceName {
            namespace: "public".into(),
            group: "DEFAULT_GROUP".into(),
            name: "web".into(),
        }
    }

    fn host(ip: &str, port: u16, meta: Value) -> Value {
        json!({"instanceId": format!("{ip}#{port}#DEFAULT#DEFAULT_GROUP@@web"), "ip": ip,
               "port": port, "weight": 1.0, "healthy": true, "enabled": true,
               "ephemeral": true, "clusterName": "DEFAULT",
               "serviceName": "DEFAULT_GROUP@@web", "metadata": meta})
    }

    #[test]
    fn service_ports_protocols_and_endpoints() {
        let mut grpc = host(
            "10.0.0.3",
            9090,
            json!({"protocol": "grpc", "version": "v2"}),
        );
        grpc["clusterName"] = json!("HZ");
        grpc["weight"] = json!(2.6);
        let hosts = vec![
            host("10.0.0.2", 8080, json!({"version": "v1"})),
            grpc,
            host("10.0.0.1", 8080, json!({"protocol": "dubbo"})),
        ];
        let c = convert_service(&web(), &hosts, &ctx());
        let s = c.service.unwrap();
        assert_eq!(s.hostname.as_str(), "web.default-group.public.nacos");
        assert_eq!(s.provider, PROVIDER);
        let ports: Vec<_> = s
            .ports
            .iter()
            .map(|p| (&*p.name, p.port.get(), p.protocol))
            .collect();
        // 10.0.0.1 sorts first: its dubbo (unknown, so TCP) wins port 8080.
        assert_eq!(
            ports,
            vec![("tcp", 8080, Protocol::Tcp), ("grpc", 9090, Protocol::Grpc)]
        );
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        let e = &c.endpoints[2];
        assert_eq!(e.address.to_string(), "10.0.0.3");
        assert_eq!(e.weight, 3);
        assert_eq!(e.locality.zone, "cn-hangzhou-a");
        assert_eq!(e.labels["version"], "v2");
        assert!(
            c.endpoints[0].locality.is_empty(),
            "cluster DEFAULT has none"
        );
    }

    #[test]
    fn health_enabled_weight_and_bad_instances() {
        let mut sick = host("10.0.0.1", 80, json!({}));
        sick["healthy"] = json!(false);
        let mut off = host("10.0.0.2", 80, json!({}));
        off["enabled"] = json!(false);
        let mut zero = host("10.0.0.3", 80, json!({}));
        zero["weight"] = json!(0.0);
        let hosts = vec![
            sick,
            off,
            zero,
            host("web.example", 80, json!({})),
            host("10.0.0.5", 0, json!({})),
            json!({"ip": 7}),
        ];
        let c = convert_service(&web(), &hosts, &ctx());
        assert_eq!(c.endpoints.len(), 1);
        assert_eq!(c.endpoints[0].health, HealthStatus::Unhealthy);
        assert_eq!(c.excluded, 2);
        assert_eq!(c.skipped.len(), 3, "{:?}", c.skipped);
        assert!(c.skipped.iter().any(|s| s.contains("not an IP")));
        let none = convert_service(&web(), &[], &ctx());
        assert!(none.service.is_none());
    }

    #[test]
    fn invalid_label_keys_and_values_are_reported_not_kept() {
        let meta = json!({"preserved.register.source": "SPRING_CLOUD", "bad key": "x",
                          "ok": "this value has spaces", "topology.istio.io/network": "n1",
                          "security.istio.io/tlsMode": "istio"});
        let c = convert_service(&web(), &[host("10.0.0.1", 80, meta)], &ctx());
        let e = &c.endpoints[0];
        assert_eq!(e.labels.len(), 3, "{:?}", e.labels);
        assert_eq!(c.invalid_labels.len(), 2, "{:?}", c.invalid_labels);
        assert_eq!(e.network.as_str(), "n1");
        assert_eq!(e.tls_mode, TlsMode::Istio);
    }

    #[test]
    fn service_names_must_be_labels() {
        assert!(check_service_name("web_1").is_ok());
        assert!(check_service_name("providers:com.foo.Bar::").is_err());
        assert!(check_service_name("-a").is_err());
        assert!(check_label_key("app.kubernetes.io/name").is_ok());
        assert!(check_label_key("Bad.Prefix/x").is_err());
    }
}

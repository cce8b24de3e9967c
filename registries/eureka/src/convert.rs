//! Pure conversions from a Eureka application to the mesh model.
//!
//! - Application `WEB` is one service `web.<suffix>` in the configured namespace,
//!   client-side load balanced, mesh internal (metadata `external` on any instance:
//!   mesh external), created at the epoch (a fixed time keeps the merge policy
//!   deterministic).
//! - Ports: `http` for the non-secure port and `https` (protocol HTTPS) for the
//!   secure one, each present when at least one instance enables it. The service port
//!   is the number most instances use (ties: the lowest); every endpoint keeps its
//!   own number as its target port. The `http` port's protocol is the first valid
//!   metadata `protocol` among the instances (by id), else HTTP. A secure port with
//!   the number of the non-secure one is left out, with a warning.
//! - An endpoint per instance at `ipAddr`: healthy when its status is `UP` (after
//!   Eureka's override rule, [`Instance::effective_status`]), otherwise unhealthy:
//!   kept in the registry and `/debug/endpointz`, and left out of EDS as Istio does
//!   with endpoints that are not ready. Labels from the metadata; a key or value that
//!   cannot be a Kubernetes label is reported, never silently dropped. Locality from
//!   metadata `zone` or the AWS `availability-zone` (see [`locality_of`]); TLS mode
//!   and network from the labels `security.istio.io/tlsMode` and
//!   `topology.istio.io/network`.
//! - An instance that cannot be an endpoint (no IP address, no enabled port) is
//!   skipped with its reason; the others are kept.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use meshfed_registry::{
    ClusterId, Endpoint, HealthStatus, Locality, MeshLocation, NetworkId, Port, Protocol,
    ProviderId, Resolution, Service, TlsMode,
};

use crate::api::{Instance, InstanceStatus};
use crate::config::EurekaConfig;

/// The provider of every Eureka service and shard.
pub const PROVIDER: ProviderId = ProviderId::Named("Eureka");
/// Name of the non-secure port.
pub const HTTP_PORT: &str = "http";
/// Name of the secure port.
pub const HTTPS_PORT: &str = "https";
/// Label carrying an endpoint's TLS mode.
pub const TLS_MODE_LABEL: &str = "security.istio.io/tlsMode";
/// Label carrying an endpoint's network.
pub const NETWORK_LABEL: &str = "topology.istio.io/network";
/// Metadata key carrying the non-secure port's protocol.
pub const PROTOCOL_META: &str = "protocol";
/// Metadata key carrying the zone (Spring Cloud's `eureka.instance.metadata-map.zone`).
pub const ZONE_META: &str = "zone";
/// Metadata key marking the application as outside the mesh (any non-empty value).
pub const EXTERNAL_META: &str = "external";

/// Whether a lower-cased application name can be a DNS label of a mesh hostname.
pub fn check_app_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "application name {name:?} is not a DNS label (1-63 letters, digits, '-' or '_', \
             not starting or ending with '-')"
        ))
    }
}

fn qualified(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Why a metadata entry cannot be a Kubernetes label, if it cannot.
pub fn check_label(key: &str, value: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && (p.is_empty()
            || p.len() > 253
            || !p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            }))
    {
        return Err(format!(
            "key {key:?}: the prefix before '/' is not a DNS subdomain"
        ));
    }
    if !qualified(name) {
        return Err(format!(
            "key {key:?}: not a label name (1-63 letters, digits, '-', '_', '.', starting and ending \
             with a letter or digit)"
        ));
    }
    if !value.is_empty() && !qualified(value) {
        return Err(format!(
            "value of {key:?} ({value:?}): not a label value (at most 63 letters, digits, '-', '_', '.', \
             starting and ending with a letter or digit)"
        ));
    }
    Ok(())
}

/// An instance's locality: a configured zone mapping first, else the configured
/// region (or, for an AWS availability zone, the zone without its last letter) and
/// the zone. No zone: the configured region alone.
pub fn locality_of(instance: &Instance, config: &EurekaConfig) -> Locality {
    let meta_zone = instance.metadata.get(ZONE_META).filter(|z| !z.is_empty());
    let zone = meta_zone.or(instance.availability_zone.as_ref());
    if let Some(l) = zone.and_then(|z| config.zone_localities.get(z)) {
        return l.clone();
    }
    let aws_region = instance
        .availability_zone
        .as_deref()
        .filter(|az| az.len() > 1 && az.ends_with(|c: char| c.is_ascii_lowercase()))
        .map(|az| az[..az.len() - 1].to_string());
    Locality {
        region: config.region.clone().or(aws_region).unwrap_or_default(),
        zone: zone.cloned().unwrap_or_default(),
        subzone: String::new(),
    }
}

/// One converted application.
#[derive(Clone, Debug, PartialEq)]
pub struct Converted {
    /// The service; `None` when no instance could be converted.
    pub service: Option<Service>,
    /// Its endpoints, sorted by address and ports.
    pub endpoints: Vec<Endpoint>,
    /// Instances skipped, each with its reason.
    pub skipped: Vec<String>,
    /// Metadata entries not made labels, each with its reason.
    pub invalid_labels: Vec<String>,
    /// Things worth a warning that skipped nothing.
    pub warnings: Vec<String>,
}

/// The number most of `ports` use (ties: the lowest).
fn most_used(ports: impl Iterator<Item = u16>) -> Option<u16> {
    let mut counts: BTreeMap<u16, usize> = BTreeMap::new();
    for p in ports {
        *counts.entry(p).or_default() += 1;
    }
    let top = counts.values().copied().max()?;
    counts.into_iter().find(|(_, n)| *n == top).map(|(p, _)| p)
}

/// Converts application `app` (upper-cased, as Eureka names it) and its instances.
pub fn convert_app(
    app: &str,
    instances: &BTreeMap<String, Arc<Instance>>,
    config: &EurekaConfig,
    cluster: &ClusterId,
) -> Converted {
    let mut skipped = Vec::new();
    let mut invalid_labels = Vec::new();
    let mut warnings = Vec::new();
    let mut usable: Vec<(&Instance, IpAddr)> = Vec::new();
    for i in instances.values() {
        let Ok(ip) = i.ip_addr.trim().parse::<IpAddr>() else {
            skipped.push(format!(
                "instance {}: ipAddr {:?} is not an IP address",
                i.id, i.ip_addr
            ));
            continue;
        };
        let http = i.port.enabled && i.port.port != 0;
        let https = i.secure_port.enabled && i.secure_port.port != 0;
        if !http && !https {
            skipped.push(format!("instance {}: no enabled port", i.id));
            continue;
        }
        usable.push((i, ip));
    }
    let http_port = most_used(
        usable
            .iter()
            .filter(|(i, _)| i.port.enabled && i.port.port != 0)
            .map(|(i, _)| i.port.port),
    );
    let mut https_port = most_used(
        usable
            .iter()
            .filter(|(i, _)| i.secure_port.enabled && i.secure_port.port != 0)
            .map(|(i, _)| i.secure_port.port),
    );
    if https_port.is_some() && https_port == http_port {
        warnings.push(format!(
            "the secure port {} is also the non-secure port: serving it as {HTTP_PORT} only",
            https_port.unwrap_or_default()
        ));
        https_port = None;
    }
    let protocol = usable
        .iter()
        .filter_map(|(i, _)| i.metadata.get(PROTOCOL_META))
        .find_map(|p| Protocol::parse_known(p).filter(|p| *p != Protocol::Unsupported))
        .unwrap_or(Protocol::Http);
    let mut ports = Vec::new();
    ports.extend(http_port.and_then(|p| Port::new(HTTP_PORT, p, protocol)));
    ports.extend(https_port.and_then(|p| Port::new(HTTPS_PORT, p, Protocol::Https)));
    let http_name: Arc<str> = Arc::from(HTTP_PORT);
    let https_name: Arc<str> = Arc::from(HTTPS_PORT);

    let mut external = false;
    let mut endpoints: Vec<Endpoint> = Vec::with_capacity(usable.len());
    for (i, ip) in &usable {
        external |= i.metadata.get(EXTERNAL_META).is_some_and(|v| !v.is_empty());
        let mut endpoint = Endpoint::new(*ip);
        if http_port.is_some() && i.port.enabled && i.port.port != 0 {
            endpoint.ports.insert(http_name.clone(), i.port.port);
        }
        if https_port.is_some() && i.secure_port.enabled && i.secure_port.port != 0 {
            endpoint
                .ports
                .insert(https_name.clone(), i.secure_port.port);
        }
        if endpoint.ports.is_empty() {
            skipped.push(format!(
                "instance {}: its only enabled port is the secure port {}, which is the non-secure port of the others",
                i.id, i.secure_port.port
            ));
            continue;
        }
        for key in &i.bad_metadata {
            invalid_labels.push(format!(
                "instance {}: metadata {key:?} is not a string",
                i.id
            ));
        }
        for (key, value) in &i.metadata {
            match check_label(key, value) {
                Ok(()) => {
                    endpoint.labels.insert(key.clone(), value.clone());
                }
                Err(why) => invalid_labels.push(format!("instance {}: metadata {why}", i.id)),
            }
        }
        endpoint.locality = locality_of(i, config);
        endpoint.network = endpoint
            .labels
            .get(NETWORK_LABEL)
            .map(NetworkId::new)
            .unwrap_or_default();
        endpoint.tls_mode = match endpoint.labels.get(TLS_MODE_LABEL).map(String::as_str) {
            Some("istio") => TlsMode::Istio,
            _ => TlsMode::Disabled,
        };
        endpoint.health = if i.effective_status() == InstanceStatus::Up {
            HealthStatus::Healthy
        } else {
            HealthStatus::Unhealthy
        };
        endpoint.cluster_id = cluster.clone();
        endpoints.push(endpoint);
    }
    endpoints.sort_by(|a, b| (a.address, &a.ports).cmp(&(b.address, &b.ports)));

    let service = (!endpoints.is_empty()).then(|| {
        let mut service = Service::new(
            config.hostname(app),
            config.namespace.clone(),
            PROVIDER,
            cluster.clone(),
        );
        service.ports = ports;
        service.resolution = Resolution::ClientSideLb;
        service.location = if external {
            MeshLocation::MeshExternal
        } else {
            MeshLocation::MeshInternal
        };
        service
    });
    Converted {
        service,
        endpoints,
        skipped,
        invalid_labels,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PortInfo;

    fn inst(id: &str, ip: &str, port: u16, secure: Option<u16>) -> Instance {
        Instance {
            id: id.into(),
            app: "WEB".into(),
            ip_addr: ip.into(),
            status: InstanceStatus::Up,
            overridden_status: InstanceStatus::Unknown,
            port: PortInfo {
                port,
                enabled: port != 0,
            },
            secure_port: PortInfo {
                port: secure.unwrap_or(443),
                enabled: secure.is_some(),
            },
            metadata: BTreeMap::new(),
            bad_metadata: Vec::new(),
            data_center: "MyOwn".into(),
            availability_zone: None,
            action: None,
        }
    }

    fn map(list: Vec<Instance>) -> BTreeMap<String, Arc<Instance>> {
        list.into_iter()
            .map(|i| (i.id.clone(), Arc::new(i)))
            .collect()
    }

    fn config() -> EurekaConfig {
        EurekaConfig::new("http://127.0.0.1:8761/eureka").unwrap()
    }

    #[test]
    fn ports_health_and_target_ports() {
        let mut down = inst("c", "10.0.0.3", 9090, None);
        down.status = InstanceStatus::Down;
        let instances = map(vec![
            inst("a", "10.0.0.1", 8080, Some(8443)),
            inst("b", "10.0.0.2", 8080, None),
            down,
        ]);
        let c = convert_app("WEB", &instances, &config(), &ClusterId::new("eureka"));
        let s = c.service.unwrap();
        assert_eq!(s.hostname.as_str(), "web.eureka");
        assert_eq!(s.provider, PROVIDER);
        let ports: Vec<_> = s
            .ports
            .iter()
            .map(|p| (&*p.name, p.port.get(), p.protocol))
            .collect();
        assert_eq!(
            ports,
            [
                ("http", 8080, Protocol::Http),
                ("https", 8443, Protocol::Https)
            ]
        );
        assert_eq!(c.endpoints.len(), 3);
        assert_eq!(c.endpoints[0].ports.len(), 2);
        assert_eq!(
            c.endpoints[2].ports.get("http"),
            Some(&9090),
            "its own target port"
        );
        assert_eq!(c.endpoints[2].health, HealthStatus::Unhealthy);
        assert_eq!(c.endpoints[0].health, HealthStatus::Healthy);
    }

    #[test]
    fn bad_instances_and_labels_are_reported() {
        let mut meta = inst("a", "10.0.0.1", 80, None);
        meta.metadata.insert("version".into(), "v1".into());
        meta.metadata
            .insert("management.port".into(), "8081".into());
        meta.metadata.insert("homepage".into(), "http://x/".into());
        meta.metadata.insert("Bad Key".into(), "x".into());
        meta.metadata.insert(PROTOCOL_META.into(), "grpc".into());
        meta.bad_metadata.push("nested".into());
        let instances = map(vec![
            meta,
            inst("b", "web-2.local", 80, None),
            inst("c", "10.0.0.3", 0, None),
        ]);
        let c = convert_app("WEB", &instances, &config(), &ClusterId::new("eureka"));
        assert_eq!(c.skipped.len(), 2, "{:?}", c.skipped);
        assert_eq!(c.invalid_labels.len(), 3, "{:?}", c.invalid_labels);
        let labels = &c.endpoints[0].labels;
        assert_eq!(labels.get("version").map(String::as_str), Some("v1"));
        assert!(labels.contains_key("management.port"));
        assert!(!labels.contains_key("homepage"));
        assert_eq!(c.service.unwrap().ports[0].protocol, Protocol::Grpc);
    }

    #[test]
    fn zones_become_localities() {
        let mut config = config();
        let mut i = inst("a", "10.0.0.1", 80, None);
        assert!(locality_of(&i, &config).is_empty());
        i.availability_zone = Some("us-east-1a".into());
        let l = locality_of(&i, &config);
        assert_eq!(
            (l.region.as_str(), l.zone.as_str()),
            ("us-east-1", "us-east-1a")
        );
        i.metadata.insert(ZONE_META.into(), "zone1".into());
        config.region = Some("dc-east".into());
        let l = locality_of(&i, &config);
        assert_eq!((l.region.as_str(), l.zone.as_str()), ("dc-east", "zone1"));
        config
            .zone_localities
            .insert("zone1".into(), Locality::parse("east/rack-1/row-2"));
        assert_eq!(
            locality_of(&i, &config),
            Locality::parse("east/rack-1/row-2")
        );
    }

    #[test]
    fn names_and_labels() {
        assert!(check_app_name("web-api").is_ok());
        assert!(check_app_name("my_app").is_ok());
        assert!(check_app_name("a.b").is_err());
        assert!(check_app_name("").is_err());
        assert!(check_label("topology.istio.io/network", "net-1").is_ok());
        assert!(check_label("/x", "y").is_err());
        assert!(check_label("x", &"v".repeat(64)).is_err());
        assert!(check_label("x", "").is_ok());
    }
}

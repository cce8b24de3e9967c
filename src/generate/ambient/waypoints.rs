//! The waypoints of a snapshot, read from Gateway API `Gateway`s as istiod's ambient
//! index reads them (`ambient/waypoints.go`), and the look-up that decides which
//! waypoint a workload or service uses.
//!
//! - A Gateway is a waypoint once it is ready: its `status.addresses` has an entry.
//!   Its address is the first `Hostname` status address (namespaced by the Gateway),
//!   else the first IP one. A Gateway with no status addresses whose Service
//!   (`<name>.<namespace>.svc.<domain>`) exists in the registries counts as reporting
//!   that host name: what istiod's Gateway status reports once the waypoint's Service
//!   is there, which nothing writes when meshfed runs without istiod.
//! - Traffic type (`istio.io/waypoint-for`): the Gateway's label, else its
//!   GatewayClass's, else `service`. A `service` waypoint is set on services, a
//!   `workload` one on workloads, `all` on both, anything else on neither.
//! - Inbound binding (`ambient.istio.io/waypoint-inbound-binding`, `PROTOCOL` or
//!   `PROTOCOL/port`, on the Gateway, else its GatewayClass): the waypoint's own
//!   instances (pods labelled `gateway.networking.k8s.io/gateway-name`) carry it as
//!   their `application_tunnel`.
//! - Use from another namespace follows the `allowedRoutes.namespaces` of the bound
//!   listener (the binding's port, else its `istio.io/PROXY` listener), else of the
//!   HBONE listener on 15008, else `Same`.
//! - `istio.io/use-waypoint` on the object (with `istio.io/use-waypoint-namespace`),
//!   else on its namespace, names the waypoint; `none` opts out. A name that is no
//!   ready waypoint, or one the waypoint does not admit, gives none (the object's own
//!   label is not passed over for its namespace's).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use meshfed_api::workload as wl;
use meshfed_registry::config::gateway_api::types::{
    GatewayClassSpec, GatewaySpec, LabelSelector, Listener,
};
use meshfed_registry::config::{ConfigObject, NamespaceLabels};

use super::{HBONE_PORT, ip_bytes};

/// The label that names a waypoint (`none` opts out).
pub const LABEL_USE_WAYPOINT: &str = "istio.io/use-waypoint";
/// The namespace of the waypoint named by [`LABEL_USE_WAYPOINT`].
pub const LABEL_USE_WAYPOINT_NAMESPACE: &str = "istio.io/use-waypoint-namespace";
/// The traffic a waypoint takes (`service`, `workload`, `all`, `none`).
pub const LABEL_WAYPOINT_FOR: &str = "istio.io/waypoint-for";
/// How ztunnel hands inbound traffic to a waypoint's own instances.
pub const ANNOTATION_INBOUND_BINDING: &str = "ambient.istio.io/waypoint-inbound-binding";
/// The label naming the Gateway a pod is an instance of.
pub const LABEL_GATEWAY_NAME: &str = "gateway.networking.k8s.io/gateway-name";
/// The listener protocol of a waypoint's PROXY-protocol listener.
const PROXY_LISTENER_PROTOCOL: &str = "istio.io/PROXY";

/// What a waypoint takes traffic for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Traffic {
    Service,
    Workload,
    All,
    /// `none`, or a value Istio does not know.
    Neither,
}

impl Traffic {
    fn parse(value: &str) -> Traffic {
        match value {
            "service" => Traffic::Service,
            "workload" => Traffic::Workload,
            "all" => Traffic::All,
            _ => Traffic::Neither,
        }
    }

    fn for_services(self) -> bool {
        matches!(self, Traffic::Service | Traffic::All)
    }

    fn for_workloads(self) -> bool {
        matches!(self, Traffic::Workload | Traffic::All)
    }
}

/// The namespaces whose objects may use a waypoint.
#[derive(Clone, Debug, PartialEq)]
pub enum Allowed {
    Same,
    All,
    /// Namespaces whose labels match (no selector: none).
    Selector(Option<LabelSelector>),
}

/// One ready waypoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Waypoint {
    pub namespace: String,
    pub name: String,
    /// Where ztunnel sends its traffic.
    pub address: wl::GatewayAddress,
    /// The inbound binding of its instances.
    pub binding: Option<wl::ApplicationTunnel>,
    pub traffic: Traffic,
    pub allowed: Allowed,
}

/// Every ready waypoint, by `(namespace, name)`, with the namespace labels; and the
/// network gateways the same Gateway objects declare.
#[derive(Clone, Debug, Default)]
pub struct Waypoints {
    by_name: BTreeMap<(String, String), Waypoint>,
    namespaces: Arc<NamespaceLabels>,
    /// Network -> the gateways into it declared by Gateways of class `istio-remote`
    /// ([`network_gateways`]), by Gateway namespace and name.
    network_gateways: BTreeMap<String, Vec<wl::GatewayAddress>>,
}

/// The class of the Gateways that declare another network's gateway.
pub const REMOTE_GATEWAY_CLASS: &str = "istio-remote";
/// The label naming a network.
const LABEL_NETWORK: &str = "topology.istio.io/network";

/// The network gateways among `objects`, as istiod's ambient index reads them
/// (`ambient/networks.go`): Gateways of class `istio-remote` labelled
/// `topology.istio.io/network`, at each of their `IPAddress` and `Hostname` addresses
/// (`status.addresses`, else `spec.addresses`), on the port of their first `HBONE`
/// listener. A host name is namespaced by the Gateway.
pub fn network_gateways(
    objects: &[Arc<ConfigObject>],
) -> BTreeMap<String, Vec<wl::GatewayAddress>> {
    let mut out: BTreeMap<String, Vec<wl::GatewayAddress>> = BTreeMap::new();
    let mut sorted: Vec<&Arc<ConfigObject>> = objects.iter().collect();
    sorted.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    for o in sorted {
        let Some(spec) = o.spec.get::<GatewaySpec>() else {
            continue;
        };
        let Some(network) = o.labels.get(LABEL_NETWORK).filter(|n| !n.is_empty()) else {
            continue;
        };
        if spec.gateway_class_name != REMOTE_GATEWAY_CLASS {
            continue;
        }
        let Some(port) = spec
            .listeners
            .iter()
            .find(|l| l.protocol == "HBONE")
            .map(|l| l.port)
            .filter(|p| *p != 0)
        else {
            continue;
        };
        let addresses: Vec<(&str, &str)> = if o.status_addresses.is_empty() {
            spec.addresses
                .iter()
                .filter_map(|a| Some((a.kind.as_deref()?, a.value.as_str())))
                .collect()
        } else {
            o.status_addresses
                .iter()
                .map(|a| (a.kind.as_str(), a.value.as_str()))
                .collect()
        };
        for (kind, value) in addresses {
            let destination = match kind {
                "IPAddress" => {
                    let Ok(ip) = value.parse::<IpAddr>() else {
                        continue;
                    };
                    wl::gateway_address::Destination::Address(wl::NetworkAddress {
                        network: network.clone(),
                        address: ip_bytes(ip),
                    })
                }
                "Hostname" => wl::gateway_address::Destination::Hostname(wl::NamespacedHostname {
                    namespace: o.namespace.clone(),
                    hostname: value.to_string(),
                }),
                _ => continue,
            };
            out.entry(network.clone())
                .or_default()
                .push(wl::GatewayAddress {
                    destination: Some(destination),
                    hbone_mtls_port: port,
                });
        }
    }
    out
}

/// What reading the waypoints needs beside the Gateways.
pub struct WaypointInputs<'a> {
    /// The cluster DNS domain.
    pub domain: &'a str,
    /// Whether a service host name exists in the registries.
    pub service_exists: &'a dyn Fn(&str) -> bool,
    /// The network of an IP status address.
    pub network_of: &'a dyn Fn(IpAddr) -> String,
    /// Namespace labels (`istio.io/use-waypoint` of a namespace, allowed-routes
    /// selectors).
    pub namespaces: Arc<NamespaceLabels>,
}

impl Waypoints {
    /// The waypoints among `objects` (Gateways and GatewayClasses among others).
    pub fn read(objects: &[Arc<ConfigObject>], inputs: WaypointInputs<'_>) -> Waypoints {
        let classes: BTreeMap<&str, &ConfigObject> = objects
            .iter()
            .filter(|o| o.spec.get::<GatewayClassSpec>().is_some())
            .map(|o| (o.name.as_str(), &**o))
            .collect();
        let mut by_name = BTreeMap::new();
        for o in objects {
            let Some(spec) = o.spec.get::<GatewaySpec>() else {
                continue;
            };
            let class = classes.get(spec.gateway_class_name.as_str()).copied();
            let Some(address) = address(o, &inputs) else {
                continue;
            };
            let traffic = o
                .labels
                .get(LABEL_WAYPOINT_FOR)
                .or_else(|| class.and_then(|c| c.labels.get(LABEL_WAYPOINT_FOR)))
                .map(|v| Traffic::parse(v))
                .unwrap_or(Traffic::Service);
            let binding = o
                .annotations
                .get(ANNOTATION_INBOUND_BINDING)
                .or_else(|| class.and_then(|c| c.annotations.get(ANNOTATION_INBOUND_BINDING)))
                .and_then(|v| parse_binding(v));
            let allowed = allowed_routes(spec, binding.as_ref());
            by_name.insert(
                (o.namespace.clone(), o.name.clone()),
                Waypoint {
                    namespace: o.namespace.clone(),
                    name: o.name.clone(),
                    address,
                    binding,
                    traffic,
                    allowed,
                },
            );
        }
        Waypoints {
            by_name,
            namespaces: inputs.namespaces,
            network_gateways: network_gateways(objects),
        }
    }

    /// The first gateway into `network` a Gateway of class `istio-remote` declares.
    pub fn network_gateway(&self, network: &str) -> Option<&wl::GatewayAddress> {
        self.network_gateways.get(network)?.first()
    }

    /// Waypoints given whole, with the namespace labels (the builders' tests).
    #[cfg(test)]
    pub fn of(list: impl IntoIterator<Item = Waypoint>, namespaces: NamespaceLabels) -> Waypoints {
        Waypoints {
            by_name: list
                .into_iter()
                .map(|w| ((w.namespace.clone(), w.name.clone()), w))
                .collect(),
            namespaces: Arc::new(namespaces),
            network_gateways: BTreeMap::new(),
        }
    }

    /// The labels of `namespace` (none known: none).
    pub fn namespace_labels(&self, namespace: &str) -> Option<&BTreeMap<String, String>> {
        self.namespaces.get(namespace)
    }

    /// The waypoint `pod_labels` make a pod of `namespace` an instance of.
    pub fn instance_of(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Option<&Waypoint> {
        let name = labels.get(LABEL_GATEWAY_NAME)?;
        self.by_name.get(&(namespace.to_string(), name.clone()))
    }

    /// The waypoint of a workload of `namespace` whose own (or, when it has none, its
    /// namespace's) `istio.io/use-waypoint` is `name` (`ns`: the waypoint's
    /// namespace label): `Ok(None)` when it names none, an error when the one it
    /// names cannot be used for workloads.
    pub fn for_workload(
        &self,
        name: &str,
        ns: &str,
        namespace: &str,
    ) -> Result<Option<&Waypoint>, Unbound> {
        match self.named(Some(name), Some(ns), namespace)? {
            Some(w) if !w.traffic.for_workloads() => {
                Err(Unbound::UnsupportedTraffic(w.key(), "workload"))
            }
            found => Ok(found),
        }
    }

    /// The waypoint of a service of `namespace` with `labels` (else its namespace's
    /// labels), as [`Waypoints::for_workload`].
    pub fn for_service(
        &self,
        labels: &BTreeMap<String, String>,
        namespace: &str,
    ) -> Result<Option<&Waypoint>, Unbound> {
        let own = labels.get(LABEL_USE_WAYPOINT);
        let found = if own.is_some() {
            self.named(
                own.map(String::as_str),
                labels.get(LABEL_USE_WAYPOINT_NAMESPACE).map(String::as_str),
                namespace,
            )?
        } else {
            let ns = self.namespaces.get(namespace);
            self.named(
                ns.and_then(|l| l.get(LABEL_USE_WAYPOINT))
                    .map(String::as_str),
                ns.and_then(|l| l.get(LABEL_USE_WAYPOINT_NAMESPACE))
                    .map(String::as_str),
                namespace,
            )?
        };
        match found {
            Some(w) if !w.traffic.for_services() => {
                Err(Unbound::UnsupportedTraffic(w.key(), "service"))
            }
            found => Ok(found),
        }
    }

    /// The waypoint `name` (in `ns`, else `namespace`) if it is ready and admits
    /// objects of `namespace`; `Ok(None)` for no name or `none`.
    fn named(
        &self,
        name: Option<&str>,
        ns: Option<&str>,
        namespace: &str,
    ) -> Result<Option<&Waypoint>, Unbound> {
        let Some(name) = name.filter(|n| !n.is_empty() && *n != "none") else {
            return Ok(None);
        };
        let ns = ns.filter(|n| !n.is_empty()).unwrap_or(namespace);
        let Some(w) = self.by_name.get(&(ns.to_string(), name.to_string())) else {
            return Err(Unbound::NotReady(format!("{ns}/{name}")));
        };
        let admitted = match &w.allowed {
            Allowed::All => true,
            Allowed::Same => w.namespace == namespace,
            Allowed::Selector(sel) => {
                let empty = BTreeMap::new();
                sel.as_ref().is_some_and(|sel| {
                    sel.matches(self.namespaces.get(namespace).unwrap_or(&empty))
                })
            }
        };
        if admitted {
            Ok(Some(w))
        } else {
            Err(Unbound::Denied(w.key()))
        }
    }
}

impl Waypoint {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Why an object's `istio.io/use-waypoint` gives it no waypoint (istiod's status
/// messages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unbound {
    /// No ready waypoint of that name (`namespace/name`).
    NotReady(String),
    /// The waypoint does not admit the object's namespace.
    Denied(String),
    /// The waypoint does not take this traffic type (`service`, `workload`).
    UnsupportedTraffic(String, &'static str),
}

impl Unbound {
    /// istiod's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Unbound::NotReady(_) => "WaypointIsNotReady",
            Unbound::Denied(_) => "AttachmentDenied",
            Unbound::UnsupportedTraffic(..) => "UnsupportedTrafficType",
        }
    }

    /// istiod's message.
    pub fn message(&self) -> String {
        match self {
            Unbound::NotReady(w) => format!("waypoint {w:?} is not ready"),
            Unbound::Denied(w) => {
                format!("we are not permitted to attach to waypoint {w:?} (missing allowedRoutes?)")
            }
            Unbound::UnsupportedTraffic(w, t) => format!(
                "attempting to bind to traffic type {t:?} which the waypoint {w:?} does not support"
            ),
        }
    }
}

/// The Gateway's address: the first Hostname status address, else the first IP one;
/// with none, its Service's host name when that Service exists.
fn address(o: &ConfigObject, inputs: &WaypointInputs<'_>) -> Option<wl::GatewayAddress> {
    let hostname = |h: String| wl::GatewayAddress {
        destination: Some(wl::gateway_address::Destination::Hostname(
            wl::NamespacedHostname {
                namespace: o.namespace.clone(),
                hostname: h,
            },
        )),
        hbone_mtls_port: HBONE_PORT,
    };
    if o.status_addresses.is_empty() {
        let host = format!("{}.{}.svc.{}", o.name, o.namespace, inputs.domain);
        return (inputs.service_exists)(&host).then(|| hostname(host));
    }
    if let Some(h) = o.status_addresses.iter().find(|a| a.kind == "Hostname") {
        return Some(hostname(h.value.clone()));
    }
    o.status_addresses
        .iter()
        .filter(|a| a.kind == "IPAddress")
        .find_map(|a| a.value.parse::<IpAddr>().ok())
        .map(|ip| wl::GatewayAddress {
            destination: Some(wl::gateway_address::Destination::Address(
                wl::NetworkAddress {
                    network: (inputs.network_of)(ip),
                    address: ip_bytes(ip),
                },
            )),
            hbone_mtls_port: HBONE_PORT,
        })
}

/// `PROTOCOL` or `PROTOCOL/port`, protocol `NONE` or `PROXY`; anything else is none.
fn parse_binding(value: &str) -> Option<wl::ApplicationTunnel> {
    let mut parts = value.split('/');
    let protocol = match parts.next()? {
        "NONE" => wl::application_tunnel::Protocol::None,
        "PROXY" => wl::application_tunnel::Protocol::Proxy,
        _ => return None,
    };
    let port = match parts.next() {
        // A port that does not parse counts as none given, as in istiod.
        Some(p) => p.parse::<u32>().unwrap_or(0),
        None => 0,
    };
    if parts.next().is_some() {
        return None;
    }
    Some(wl::ApplicationTunnel {
        protocol: protocol as i32,
        port,
    })
}

fn allowed_routes(spec: &GatewaySpec, binding: Option<&wl::ApplicationTunnel>) -> Allowed {
    let bound = binding.and_then(|b| {
        spec.listeners.iter().find(|l| {
            if b.port != 0 {
                l.port == b.port
            } else {
                b.protocol == wl::application_tunnel::Protocol::Proxy as i32
                    && l.protocol == PROXY_LISTENER_PROTOCOL
            }
        })
    });
    let listener = bound.or_else(|| {
        spec.listeners
            .iter()
            .find(|l| l.protocol == "HBONE" && l.port == HBONE_PORT)
    });
    listener.map(selector_of).unwrap_or(Allowed::Same)
}

fn selector_of(l: &Listener) -> Allowed {
    let Some(ns) = l
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
    else {
        return Allowed::Same;
    };
    match ns.from.as_deref() {
        Some("All") => Allowed::All,
        Some("Selector") => Allowed::Selector(ns.selector.clone()),
        _ => Allowed::Same,
    }
}

#[cfg(test)]
mod tests {
    use meshfed_registry::config::StatusAddress;

    use super::*;

    fn gateway(name: &str, listeners: serde_json::Value) -> ConfigObject {
        let spec: GatewaySpec = serde_json::from_value(serde_json::json!({
            "gatewayClassName": "istio-waypoint",
            "listeners": listeners,
        }))
        .unwrap();
        ConfigObject::new("ns", name, spec)
    }

    fn hbone(from: serde_json::Value) -> serde_json::Value {
        serde_json::json!([{"name": "mesh", "port": 15008, "protocol": "HBONE",
            "allowedRoutes": {"namespaces": from}}])
    }

    fn read(objects: Vec<ConfigObject>, services: &[&str]) -> Waypoints {
        let objects: Vec<Arc<ConfigObject>> = objects.into_iter().map(Arc::new).collect();
        let namespaces: NamespaceLabels = [
            ("ns".to_string(), BTreeMap::new()),
            (
                "other".to_string(),
                [("team".to_string(), "a".to_string())].into(),
            ),
        ]
        .into();
        Waypoints::read(
            &objects,
            WaypointInputs {
                domain: "cluster.local",
                service_exists: &|h| services.contains(&h),
                network_of: &|_| "nw".to_string(),
                namespaces: Arc::new(namespaces),
            },
        )
    }

    fn status(o: &mut ConfigObject, addresses: &[(&str, &str)]) {
        o.status_addresses = addresses
            .iter()
            .map(|(k, v)| StatusAddress {
                kind: k.to_string(),
                value: v.to_string(),
            })
            .collect();
    }

    fn host_of(w: &Waypoint) -> String {
        match &w.address.destination {
            Some(wl::gateway_address::Destination::Hostname(h)) => h.hostname.clone(),
            Some(wl::gateway_address::Destination::Address(a)) => {
                format!("{}/{:?}", a.network, super::super::ip_of(&a.address))
            }
            None => String::new(),
        }
    }

    #[test]
    fn a_gateway_is_a_waypoint_once_it_reports_an_address_host_names_first() {
        let mut both = gateway("both", hbone(serde_json::json!({})));
        status(
            &mut both,
            &[("IPAddress", "10.0.0.1"), ("Hostname", "both.example")],
        );
        let mut ip = gateway("ip", hbone(serde_json::json!({})));
        status(&mut ip, &[("IPAddress", "10.0.0.2")]);
        let pending = gateway("pending", hbone(serde_json::json!({})));
        let served = gateway("served", hbone(serde_json::json!({})));
        let w = read(
            vec![both, ip, pending, served],
            &["served.ns.svc.cluster.local"],
        );
        let found = |name: &str| w.named(Some(name), None, "ns").ok().flatten().map(host_of);
        assert_eq!(found("both").as_deref(), Some("both.example"));
        assert_eq!(found("ip").as_deref(), Some("nw/Some(10.0.0.2)"));
        // No status address and no Service: not ready.
        assert_eq!(found("pending"), None);
        // No status address, its Service exists: the Service's host name.
        assert_eq!(
            found("served").as_deref(),
            Some("served.ns.svc.cluster.local")
        );
        assert_eq!(found("none"), None);
    }

    #[test]
    fn traffic_type_comes_from_the_gateway_then_its_class_then_service() {
        let class_spec: GatewayClassSpec = serde_json::from_value(
            serde_json::json!({"controllerName": "istio.io/mesh-controller"}),
        )
        .unwrap();
        let mut class = ConfigObject::new("", "istio-waypoint", class_spec);
        class
            .labels
            .insert(LABEL_WAYPOINT_FOR.into(), "workload".into());
        let mut from_class = gateway("from-class", hbone(serde_json::json!({})));
        status(&mut from_class, &[("Hostname", "a")]);
        let mut own = gateway("own", hbone(serde_json::json!({})));
        own.labels.insert(LABEL_WAYPOINT_FOR.into(), "all".into());
        status(&mut own, &[("Hostname", "b")]);
        let mut unknown = gateway("unknown", hbone(serde_json::json!({})));
        unknown
            .labels
            .insert(LABEL_WAYPOINT_FOR.into(), "bogus".into());
        status(&mut unknown, &[("Hostname", "c")]);
        let w = read(vec![class, from_class, own, unknown], &[]);
        let wl = |name: &str| matches!(w.for_workload(name, "", "ns"), Ok(Some(_)));
        let svc = |name: &str| {
            let labels: BTreeMap<String, String> =
                [(LABEL_USE_WAYPOINT.to_string(), name.to_string())].into();
            w.for_service(&labels, "ns")
        };
        assert!(wl("from-class"));
        assert_eq!(
            svc("from-class").unwrap_err(),
            Unbound::UnsupportedTraffic("ns/from-class".into(), "service")
        );
        assert!(matches!(svc("own"), Ok(Some(_))));
        assert!(wl("own"));
        assert!(svc("unknown").is_err());
        assert!(!wl("unknown"));
        assert_eq!(
            svc("missing").unwrap_err().message(),
            "waypoint \"ns/missing\" is not ready"
        );
        assert!(matches!(svc("none"), Ok(None)));
    }

    #[test]
    fn other_namespaces_use_a_waypoint_as_its_listener_allows() {
        let mut same = gateway("same", hbone(serde_json::json!({"from": "Same"})));
        status(&mut same, &[("Hostname", "a")]);
        let mut all = gateway("all", hbone(serde_json::json!({"from": "All"})));
        status(&mut all, &[("Hostname", "b")]);
        let mut sel = gateway(
            "sel",
            hbone(serde_json::json!({"from": "Selector",
                "selector": {"matchLabels": {"team": "a"}}})),
        );
        status(&mut sel, &[("Hostname", "c")]);
        // No HBONE listener: Same.
        let mut bare = gateway("bare", serde_json::json!([]));
        status(&mut bare, &[("Hostname", "d")]);
        let w = read(vec![same, all, sel, bare], &[]);
        let from_other =
            |name: &str| matches!(w.named(Some(name), Some("ns"), "other"), Ok(Some(_)));
        assert!(!from_other("same"));
        assert!(from_other("all"));
        assert!(from_other("sel"));
        assert!(!from_other("bare"));
        assert_eq!(
            w.named(Some("sel"), Some("ns"), "ns").unwrap_err(),
            Unbound::Denied("ns/sel".into())
        );
        assert!(matches!(w.named(Some("bare"), None, "ns"), Ok(Some(_))));
    }

    #[test]
    fn the_inbound_binding_is_parsed_and_picks_the_bound_listener() {
        assert_eq!(
            parse_binding("PROXY/15088"),
            Some(wl::ApplicationTunnel {
                protocol: wl::application_tunnel::Protocol::Proxy as i32,
                port: 15088
            })
        );
        assert_eq!(
            parse_binding("NONE"),
            Some(wl::ApplicationTunnel {
                protocol: wl::application_tunnel::Protocol::None as i32,
                port: 0
            })
        );
        assert_eq!(parse_binding("HTTP/80"), None);
        assert_eq!(parse_binding("PROXY/1/2"), None);
        let mut g = gateway(
            "sandwich",
            serde_json::json!([
                {"name": "mesh", "port": 15008, "protocol": "HBONE"},
                {"name": "proxy", "port": 15088, "protocol": "istio.io/PROXY",
                    "allowedRoutes": {"namespaces": {"from": "All"}}},
            ]),
        );
        g.annotations
            .insert(ANNOTATION_INBOUND_BINDING.into(), "PROXY".into());
        status(&mut g, &[("Hostname", "a")]);
        let w = read(vec![g], &[]);
        let found = w
            .named(Some("sandwich"), Some("ns"), "other")
            .unwrap()
            .unwrap();
        assert_eq!(found.allowed, Allowed::All);
        let pod: BTreeMap<String, String> =
            [(LABEL_GATEWAY_NAME.to_string(), "sandwich".to_string())].into();
        assert_eq!(
            w.instance_of("ns", &pod).and_then(|w| w.binding),
            parse_binding("PROXY")
        );
    }
}

//! Gateways, their listeners, and which listeners a route's `parentRefs` attach it
//! to (istiod's `referenceAllowed`): `allowedRoutes` kinds and namespaces, section
//! name and port, hostname intersection; a parentRef to a Service is mesh (GAMMA).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::super::GROUP;
use super::super::status::{Condition, NO_GATEWAY, ObjectStatus};
use super::super::types::*;
use super::{GENERATED, Inputs, Obj, PARENTS_ANNOTATION, generated, reference_allowed};
use crate::config::{ConfigObject, Kind};

/// One parentRef of a route as resolved: the parentRef as echoed in the status, the
/// parents (gateway listeners or services) it attaches to, and the `Accepted`
/// failure (reason, message) if it attaches to none.
pub type Attached = (Value, Vec<RouteParent>, Option<(String, String)>);

/// One listener of a Gateway this controller serves.
pub struct Listener {
    /// The listener as written.
    pub spec: crate::config::gateway_api::types::Listener,
    /// `<namespace>/<istio gateway name>`: what VirtualServices bind to.
    pub internal_name: String,
    /// The route kinds it allows.
    pub kinds: Vec<String>,
    /// Routes attached.
    pub attached: usize,
    /// A `ResolvedRefs` failure (certificate refs): reason and message.
    pub unresolved: Option<(String, String)>,
    /// An `Accepted` failure (protocol): reason and message.
    pub not_accepted: Option<(String, String)>,
    /// `allowedRoutes.kinds` names a kind the protocol cannot carry (reported in
    /// `ResolvedRefs`; the listener still serves the kinds it can).
    pub invalid_kinds: bool,
    /// The Istio server (proto3 JSON); `None` when the listener cannot be served.
    server: Option<Value>,
}

/// A Gateway with its listeners.
pub struct Gateway<'a> {
    pub object: &'a ConfigObject,
    pub spec: &'a GatewaySpec,
    pub listeners: Vec<Listener>,
    /// The hostnames of the services implementing it.
    pub services: Vec<String>,
    /// `spec.tls.backend.clientCertificateRef` checked ([`client_certificate`]).
    client_cert: Option<Result<String, (String, String)>>,
}

/// Where a route attached: a Gateway listener or a Service (mesh).
#[derive(Clone, Debug)]
pub struct RouteParent {
    /// `<namespace>/<istio gateway name>`, or `mesh`.
    pub internal_name: String,
    /// The VirtualService hosts: the route's hostnames the listener accepts, or the
    /// Service's hostname for mesh.
    pub hosts: Vec<String>,
    /// The port a mesh parentRef names.
    pub port: Option<u32>,
    /// Whether this is mesh (a Service parent).
    pub mesh: bool,
    /// The HTTP VirtualService hosts on a Gateway listener, as istiod picks them: the
    /// route's hostnames as written (`*` for none), less those a more specific
    /// listener of the same port and protocol takes (hostname isolation); `None`:
    /// [`RouteParent::hosts`].
    pub http_hosts: Option<Vec<String>>,
}

/// Every Gateway this controller serves.
pub struct Parents<'a> {
    gateways: Vec<Gateway<'a>>,
}

fn default_kinds(protocol: &str) -> Vec<String> {
    match protocol {
        "HTTP" | "HTTPS" => vec!["HTTPRoute".into(), "GRPCRoute".into()],
        "TLS" => vec!["TLSRoute".into()],
        "TCP" => vec!["TCPRoute".into()],
        _ => Vec::new(),
    }
}

/// Whether `host` (a route hostname) and `listener` (a listener hostname) intersect:
/// the more specific of the two, if so.
fn intersect(host: &str, listener: Option<&str>) -> Option<String> {
    let Some(listener) = listener else {
        return Some(host.to_string());
    };
    let covers = |wild: &str, name: &str| {
        wild.strip_prefix('*')
            .is_some_and(|suffix| name.ends_with(suffix) && name.len() > suffix.len())
    };
    if host == listener || covers(listener, host) {
        Some(host.to_string())
    } else if covers(host, listener) || host == "*" {
        Some(listener.to_string())
    } else {
        None
    }
}

/// Istio's `host.Name.Matches`: the two hostnames overlap (either may be a wildcard).
fn overlaps(a: &str, b: &str) -> bool {
    subset_of(a, b) || subset_of(b, a)
}

/// Istio's `host.Name.SubsetOf`: every name `a` matches, `b` matches too.
fn subset_of(a: &str, b: &str) -> bool {
    if a == b || b == "*" {
        return true;
    }
    match (a.strip_prefix('*'), b.strip_prefix('*')) {
        (Some(a_suffix), Some(b_suffix)) => a_suffix.ends_with(b_suffix),
        (None, Some(b_suffix)) => a.ends_with(b_suffix),
        _ => false,
    }
}

/// Istio's hostname isolation (`hostnameAllowedByIsolation`): whether a route
/// hostname as written stays on a listener of hostname `ours` given the hostnames of
/// the gateway's other listeners of the same port and protocol (`banned`): a hostname
/// a more specific listener matches belongs to that listener only. A listener with an
/// exact hostname keeps every hostname (its Istio server filters them).
fn allowed_by_isolation(route_host: &str, ours: &str, banned: &[&str]) -> bool {
    if !ours.is_empty() && !ours.starts_with('*') {
        return true;
    }
    if !ours.is_empty() && !overlaps(route_host, ours) {
        return false;
    }
    banned
        .iter()
        .filter(|other| ours.len() <= other.len())
        .all(|other| !subset_of(route_host, other))
}

impl<'a> Parents<'a> {
    pub fn new(
        gateways: &[Obj<'a, GatewaySpec>],
        grants: &[Obj<ReferenceGrantSpec>],
        inputs: &Inputs,
    ) -> Parents<'a> {
        let gateways = gateways
            .iter()
            .map(|gw| {
                let services: Vec<String> = {
                    let named: Vec<String> = gw
                        .spec
                        .addresses
                        .iter()
                        .filter(|a| a.kind.as_deref() == Some("Hostname"))
                        .map(|a| {
                            if a.value.contains('.') {
                                a.value.clone()
                            } else {
                                format!("{}.{}.svc.{}", a.value, gw.ns(), inputs.domain)
                            }
                        })
                        .collect();
                    if named.is_empty() {
                        vec![format!(
                            "{}-istio.{}.svc.{}",
                            gw.name(),
                            gw.ns(),
                            inputs.domain
                        )]
                    } else {
                        named
                    }
                };
                let listeners = gw
                    .spec
                    .listeners
                    .iter()
                    .map(|l| listener(gw, l, grants, inputs))
                    .collect();
                Gateway {
                    object: gw.object,
                    spec: gw.spec,
                    listeners,
                    services,
                    client_cert: client_certificate(gw, grants),
                }
            })
            .collect();
        Parents { gateways }
    }

    /// Every Gateway and its listeners.
    pub fn gateways(&self) -> impl Iterator<Item = (&Gateway<'a>, &[Listener])> {
        self.gateways.iter().map(|g| (g, g.listeners.as_slice()))
    }

    /// Resolves a route's parentRefs: where it attaches, and per parentRef the
    /// `Accepted` failure (reason, message) if any, with the parentRef as echoed.
    pub fn attach(
        &mut self,
        kind: Kind,
        route: &ConfigObject,
        refs: &[ParentReference],
        hostnames: &[String],
        inputs: &Inputs,
    ) -> Vec<Attached> {
        let mut out = Vec::new();
        for r in refs {
            let group = r.group.clone().unwrap_or_else(|| GROUP.to_string());
            let ref_kind = r.kind.clone().unwrap_or_else(|| "Gateway".to_string());
            let ns = r
                .namespace
                .clone()
                .unwrap_or_else(|| route.namespace.clone());
            // Echoed as written (Istio's status names the fields the route set).
            let mut echo = json!({"name": r.name});
            if let Some(g) = &r.group {
                echo["group"] = json!(g);
            }
            if let Some(k) = &r.kind {
                echo["kind"] = json!(k);
            }
            if let Some(n) = &r.namespace {
                echo["namespace"] = json!(n);
            }
            if let Some(s) = &r.section_name {
                echo["sectionName"] = json!(s);
            }
            if let Some(p) = r.port {
                echo["port"] = json!(p);
            }
            if (group.is_empty() || group == "core") && ref_kind == "Service" {
                let host = format!("{}.{ns}.svc.{}", r.name, inputs.domain);
                if !(inputs.service_exists)(&host) {
                    out.push((
                        echo,
                        Vec::new(),
                        Some((
                            "NoMatchingParent".into(),
                            format!("parent service: {:?} not found", r.name),
                        )),
                    ));
                    continue;
                }
                let parent = RouteParent {
                    internal_name: "mesh".into(),
                    hosts: vec![host],
                    port: r.port,
                    mesh: true,
                    http_hosts: None,
                };
                out.push((echo, vec![parent], None));
                continue;
            }
            if group == "networking.istio.io" && ref_kind == "ServiceEntry" {
                // Mesh routing for the hosts of a ServiceEntry.
                let entry = inputs.objects.iter().find(|o| {
                    o.kind == Kind::ServiceEntry && o.namespace == ns && o.name == r.name
                });
                let hosts: Vec<String> = entry
                    .and_then(|o| {
                        o.spec
                            .get::<meshfed_api::networking::v1alpha3::ServiceEntry>()
                    })
                    .map(|se| se.hosts.clone())
                    .unwrap_or_default();
                if hosts.is_empty() {
                    out.push((
                        echo,
                        Vec::new(),
                        Some(("NoMatchingParent".into(), "parent not found".into())),
                    ));
                } else {
                    let parent = RouteParent {
                        internal_name: "mesh".into(),
                        hosts,
                        port: r.port,
                        mesh: true,
                        http_hosts: None,
                    };
                    out.push((echo, vec![parent], None));
                }
                continue;
            }
            if group != GROUP || ref_kind != "Gateway" {
                out.push((
                    echo,
                    Vec::new(),
                    Some((
                        "InvalidKind".into(),
                        format!("unsupported parentRef kind {group}/{ref_kind}"),
                    )),
                ));
                continue;
            }
            let Some(gw) = self
                .gateways
                .iter_mut()
                .find(|g| g.object.namespace == ns && g.object.name == r.name)
            else {
                // Maybe another controller's: istiod writes no status for it.
                out.push((
                    echo,
                    Vec::new(),
                    Some(("NoMatchingParent".into(), NO_GATEWAY.into())),
                ));
                continue;
            };
            let mut attached = Vec::new();
            let mut failure = None;
            let mut any_section = false;
            // Every listener's (name, port, protocol, hostname), for hostname isolation.
            let others: Vec<(String, u32, String, String)> = gw
                .listeners
                .iter()
                .map(|l| {
                    (
                        l.spec.name.clone(),
                        l.spec.port,
                        l.spec.protocol.clone(),
                        l.spec.hostname.clone().unwrap_or_default(),
                    )
                })
                .collect();
            for l in gw.listeners.iter_mut() {
                if r.section_name.as_ref().is_some_and(|s| *s != l.spec.name)
                    || r.port.is_some_and(|p| p != l.spec.port)
                {
                    continue;
                }
                any_section = true;
                if !l.kinds.iter().any(|k| k == kind.as_str()) {
                    failure.get_or_insert((
                        "NotAllowedByListeners".to_string(),
                        format!(
                            "kind {}/{} is not allowed",
                            kind.api_version(),
                            kind.as_str()
                        ),
                    ));
                    continue;
                }
                // As istiod checks a listener: the hostnames first, then the namespace.
                let listener_host = l.spec.hostname.as_deref();
                let hosts: Vec<String> = if hostnames.is_empty() {
                    vec!["*".to_string()]
                } else {
                    hostnames
                        .iter()
                        .filter_map(|h| intersect(h, listener_host))
                        .collect()
                };
                if hosts.is_empty() {
                    failure.get_or_insert((
                        "NoMatchingListenerHostname".to_string(),
                        format!(
                            "no hostnames matched parent hostname {:?}",
                            listener_host.unwrap_or_default()
                        ),
                    ));
                    continue;
                }
                let routes = l
                    .spec
                    .allowed_routes
                    .as_ref()
                    .and_then(|a| a.namespaces.as_ref());
                let from = routes.and_then(|n| n.from.as_deref()).unwrap_or("Same");
                let allowed = match from {
                    "All" => true,
                    "Same" => route.namespace == gw.object.namespace,
                    "Selector" => match inputs.namespaces {
                        // A namespace not listed has no labels.
                        Some(all) => routes.and_then(|n| n.selector.as_ref()).is_some_and(|s| {
                            s.matches(&all.get(&route.namespace).cloned().unwrap_or_default())
                        }),
                        None => {
                            failure.get_or_insert((
                                "NotAllowedByListeners".to_string(),
                                format!(
                                    "the labels of namespace {:?} are not known to meshfed (allowedRoutes.namespaces.from: Selector)",
                                    route.namespace
                                ),
                            ));
                            continue;
                        }
                    },
                    _ => false,
                };
                if !allowed {
                    failure.get_or_insert((
                        "NotAllowedByListeners".to_string(),
                        format!(
                            "hostnames matched parent hostname {:?}, but namespace {:?} is not allowed by the parent",
                            listener_host.unwrap_or_default(),
                            route.namespace
                        ),
                    ));
                    continue;
                }
                l.attached += 1;
                let ours = listener_host.unwrap_or_default();
                let banned: Vec<&str> = others
                    .iter()
                    .filter(|(name, port, protocol, host)| {
                        *name != l.spec.name
                            && *port == l.spec.port
                            && *protocol == l.spec.protocol
                            && host != ours
                    })
                    .map(|(_, _, _, host)| host.as_str())
                    .collect();
                let written: Vec<String> = if hostnames.is_empty() {
                    vec!["*".to_string()]
                } else {
                    hostnames.to_vec()
                };
                let http_hosts = written
                    .into_iter()
                    .filter(|h| allowed_by_isolation(h, ours, &banned))
                    .collect();
                attached.push(RouteParent {
                    internal_name: l.internal_name.clone(),
                    hosts,
                    port: None,
                    mesh: false,
                    http_hosts: Some(http_hosts),
                });
            }
            if !any_section {
                failure = Some((
                    "NoMatchingParent".into(),
                    match (&r.section_name, r.port) {
                        (Some(s), _) => format!("sectionName {s:?} not found"),
                        (None, Some(p)) => format!("port {p} not found"),
                        _ => "parent has no listeners".into(),
                    },
                ));
            }
            let failure = if attached.is_empty() { failure } else { None };
            out.push((echo, attached, failure));
        }
        out
    }

    /// The status of every Gateway.
    pub fn status(&self, inputs: &Inputs) -> Vec<ObjectStatus> {
        self.gateways
            .iter()
            .map(|g| {
                let listeners: Vec<Value> = g
                    .listeners
                    .iter()
                    .map(|l| {
                        let accepted = match &l.not_accepted {
                            None => Condition::ok("Accepted", "Accepted", "No errors found"),
                            Some((r, m)) => Condition::failed("Accepted", r, m.clone()),
                        };
                        let conflicted = Condition::failed("Conflicted", "NoConflicts", "No errors found");
                        let programmed = match (&l.not_accepted, &l.unresolved) {
                            (None, None) => Condition::ok("Programmed", "Programmed", "No errors found"),
                            _ => Condition::failed("Programmed", "Invalid", "Bad TLS configuration"),
                        };
                        let resolved = match &l.unresolved {
                            None if l.invalid_kinds => Condition::failed("ResolvedRefs", "InvalidRouteKinds", "Invalid route kinds"),
                            None => Condition::ok("ResolvedRefs", "ResolvedRefs", "No errors found"),
                            Some((r, m)) => Condition::failed("ResolvedRefs", r, m.clone()),
                        };
                        json!({
                            "attachedRoutes": l.attached,
                            "conditions": [accepted.to_json(), conflicted.to_json(), programmed.to_json(), resolved.to_json()],
                            "name": l.spec.name,
                            "supportedKinds": l.kinds.iter().map(|k| json!({"group": GROUP, "kind": k})).collect::<Vec<_>>(),
                        })
                    })
                    .collect();
                let mut ports: Vec<String> = g
                    .services
                    .iter()
                    .flat_map(|s| g.listeners.iter().map(move |l| format!("{s}:{}", l.spec.port)))
                    .collect();
                ports.sort();
                ports.dedup();
                let addresses: Vec<Value> = g
                    .services
                    .iter()
                    .flat_map(|s| {
                        let ips = (inputs.service_addresses)(s);
                        if ips.is_empty() {
                            vec![json!({"type": "Hostname", "value": s})]
                        } else {
                            ips.into_iter()
                                .map(|a| {
                                    let kind = if a.parse::<std::net::IpAddr>().is_ok() { "IPAddress" } else { "Hostname" };
                                    json!({"type": kind, "value": a})
                                })
                                .collect()
                        }
                    })
                    .collect();
                // A Gateway is not programmed when none of its services exists.
                let missing: Vec<String> = g
                    .services
                    .iter()
                    .filter(|s| !(inputs.service_exists)(s))
                    .map(|s| format!("hostname {s:?} not found"))
                    .collect();
                let unusable = !missing.is_empty() && missing.len() == g.services.len();
                let programmed = if unusable {
                    Condition::failed("Programmed", "AddressNotUsable", format!("Failed to assign to any requested addresses: {}", missing.join("; ")))
                } else {
                    Condition::ok("Programmed", "Programmed", &format!("Resource programmed, assigned to service(s) {}", human_join(&ports)))
                };
                // `spec.infrastructure.parametersRef`: istiod takes ConfigMaps of the
                // Gateway's namespace only (taken as found when ConfigMaps are not known).
                let gw_ns = g.object.namespace.as_str();
                let accepted = match g.spec.infrastructure.as_ref().and_then(|i| i.parameters_ref.as_ref()) {
                    Some(p) if !(p.group.is_empty() && p.kind == "ConfigMap") => Condition::failed(
                        "Accepted",
                        "InvalidParameters",
                        format!("Unsupported parametersRef group/kind {}/{}, only ConfigMap is supported", p.group, p.kind),
                    ),
                    Some(p) if inputs.config_maps.is_some_and(|maps| !maps.contains_key(&format!("{gw_ns}/{}", p.name))) => Condition::failed(
                        "Accepted",
                        "InvalidParameters",
                        format!("parametersRef ConfigMap {gw_ns}/{} does not exist", p.name),
                    ),
                    _ => Condition::ok("Accepted", "Accepted", "Resource accepted"),
                };
                let resolved = match &g.client_cert {
                    Some(Err((reason, message))) => Condition::failed("ResolvedRefs", reason, message.clone()),
                    _ => Condition::ok("ResolvedRefs", "ResolvedRefs", "All references resolved"),
                };
                let mut conditions = vec![accepted.to_json()];
                // `spec.allowedListeners`: istiod reports ListenerSets not enabled unless
                // its alpha API is on; meshfed does not read ListenerSets at all.
                if g.spec.allowed_listeners.is_some() {
                    conditions.push(
                        Condition::failed(
                            "AttachedListenerSets",
                            "Unsupported",
                            "AllowedListeners is configured, but ListenerSets are not supported",
                        )
                        .to_json(),
                    );
                }
                conditions.extend([programmed.to_json(), resolved.to_json()]);
                let mut status = json!({
                    "addresses": addresses,
                    "conditions": conditions,
                    "listeners": listeners,
                });
                if unusable {
                    status.as_object_mut().map(|m| m.remove("addresses"));
                }
                status
            })
            .zip(&self.gateways)
            .map(|(status, g)| {
                let mut status = ObjectStatus::new(Kind::KubernetesGateway, g.object, status);
                if g.spec.backend_tls.is_some() {
                    status.notes.push((
                        "spec.backendTLS".into(),
                        "not read (Gateway API v1.3's field; istiod and meshfed read spec.tls.backend)".into(),
                    ));
                }
                if let Some(Ok(name)) = &g.client_cert {
                    status.notes.push((
                        "spec.tls.backend.clientCertificateRef".into(),
                        format!("Secret {name}: the client certificate is not presented to backends (not served)"),
                    ));
                }
                status
            })
            .collect()
    }
}

/// `spec.tls.backend.clientCertificateRef` of a Gateway, checked as istiod checks it
/// (a ReferenceGrant first, then the kind): the Secret (`<namespace>/<name>`), or the
/// `ResolvedRefs` failure (reason, message). The Secret's contents are not looked at.
fn client_certificate(
    g: &Obj<GatewaySpec>,
    grants: &[Obj<ReferenceGrantSpec>],
) -> Option<Result<String, (String, String)>> {
    let r = g
        .spec
        .tls
        .as_ref()?
        .get("backend")?
        .get("clientCertificateRef")?;
    let field = |k: &str| r.get(k).and_then(Value::as_str);
    let (group, kind, name) = (
        field("group").unwrap_or(""),
        field("kind").unwrap_or("Secret"),
        field("name")?,
    );
    let gw_ns = g.ns();
    let ns = field("namespace").unwrap_or(gw_ns);
    if !reference_allowed(grants, "Gateway", gw_ns, group, kind, ns, name) {
        return Some(Err((
            "RefNotPermitted".into(),
            format!(
                "clientCertificateRef {name}/{ns} not accessible to a Gateway in namespace {gw_ns:?} (missing a ReferenceGrant?)"
            ),
        )));
    }
    if !matches!(group, "" | "core") || kind != "Secret" {
        return Some(Err((
            "InvalidClientCertificateRef".into(),
            format!(
                "invalid clientCertificateRef {group}/{kind}/{name}.{}, only secret is allowed",
                field("namespace").unwrap_or("")
            ),
        )));
    }
    Some(Ok(format!("{ns}/{name}")))
}

/// `a`, `a and b`, `a, b, and c`: how istiod lists services in a message.
fn human_join(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [a, b] => format!("{a} and {b}"),
        [rest @ .., last] => format!("{}, and {last}", rest.join(", ")),
    }
}

/// A listener: its allowed kinds, its TLS references checked, its Istio server.
fn listener(
    gw: &Obj<GatewaySpec>,
    l: &crate::config::gateway_api::types::Listener,
    grants: &[Obj<ReferenceGrantSpec>],
    inputs: &Inputs,
) -> Listener {
    let internal = format!("{}~{GENERATED}~{}", gw.name(), l.name);
    let invalid_kinds = l.allowed_routes.as_ref().is_some_and(|a| {
        a.kinds.iter().any(|k| {
            k.group.as_deref().is_some_and(|g| g != GROUP)
                || !default_kinds(&l.protocol).contains(&k.kind)
        })
    });
    let mut kinds: Vec<String> = match l.allowed_routes.as_ref().map(|a| &a.kinds) {
        Some(k) if !k.is_empty() => k
            .iter()
            .filter(|k| k.group.as_deref().is_none_or(|g| g == GROUP))
            .map(|k| k.kind.clone())
            .filter(|k| default_kinds(&l.protocol).contains(k))
            .collect(),
        _ => default_kinds(&l.protocol),
    };
    kinds.dedup();
    let mut not_accepted = None;
    let mut unresolved = None;
    // The namespaces whose VirtualServices may bind, as istiod scopes them: any for
    // `All`, the Gateway's for `Same`, for `Selector` every known namespace the
    // selector matches (in name order); none (`~`, Istio's "no namespace") when no
    // namespace matches or the namespaces are not known.
    let routes = l
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    let from = routes.and_then(|n| n.from.as_deref()).unwrap_or("Same");
    let scopes: Vec<String> = match from {
        "All" => vec!["*".to_string()],
        "Same" => vec![gw.ns().to_string()],
        "Selector" => {
            let selector = routes.and_then(|n| n.selector.clone()).unwrap_or_default();
            let matching: Vec<String> = inputs
                .namespaces
                .into_iter()
                .flatten()
                .filter(|(_, labels)| selector.matches(labels))
                .map(|(name, _)| name.clone())
                .collect();
            if matching.is_empty() {
                vec!["~".to_string()]
            } else {
                matching
            }
        }
        _ => vec!["~".to_string()],
    };
    let hostname = l.hostname.as_deref().unwrap_or("*");
    let hosts: Vec<String> = scopes.iter().map(|s| format!("{s}/{hostname}")).collect();
    // Istio names every server's port `default` (one server per Istio Gateway).
    let mut server = json!({
        "hosts": hosts,
        "port": {"number": l.port, "name": "default", "protocol": l.protocol},
    });
    match l.protocol.as_str() {
        "HTTP" | "TCP" => {}
        "HTTPS" | "TLS" => {
            let tls = l.tls.clone().unwrap_or_default();
            // Istio's `gateway.istio.io/tls-terminate-mode` option: the mesh's own
            // certificate (`ISTIO_SIMPLE`, `ISTIO_MUTUAL`) or client certificates
            // checked against the Secret's `ca.crt` (`MUTUAL`).
            let terminate_mode = tls
                .options
                .get("gateway.istio.io/tls-terminate-mode")
                .map(String::as_str);
            if tls.mode.as_deref() == Some("Passthrough") {
                server["tls"] = json!({"mode": "PASSTHROUGH"});
            } else if terminate_mode == Some("ISTIO_MUTUAL") {
                server["tls"] = json!({"mode": "ISTIO_MUTUAL"});
            } else if terminate_mode == Some("ISTIO_SIMPLE") {
                server["tls"] = json!({"mode": "SIMPLE", "credentialName": "builtin://"});
            } else {
                let mut names = Vec::new();
                for c in &tls.certificate_refs {
                    let group = c.group.as_deref().unwrap_or("");
                    let kind = c.kind.as_deref().unwrap_or("Secret");
                    let ns = c.namespace.as_deref().unwrap_or(gw.ns());
                    if !group.is_empty() || kind != "Secret" {
                        unresolved = Some((
                            "InvalidCertificateRef".to_string(),
                            format!(
                                "invalid certificate reference {group}/{kind}/{}, only secret is allowed",
                                c.name
                            ),
                        ));
                        continue;
                    }
                    if !reference_allowed(grants, "Gateway", gw.ns(), "", "Secret", ns, &c.name) {
                        unresolved = Some((
                            "RefNotPermitted".to_string(),
                            format!(
                                "certificateRef {}/{ns} not accessible to a Gateway in namespace {:?} (missing a ReferenceGrant?)",
                                c.name,
                                gw.ns()
                            ),
                        ));
                        continue;
                    }
                    names.push(format!("kubernetes-gateway://{ns}/{}", c.name));
                }
                if unresolved.is_none()
                    && let Some(problem) = frontend_validation(gw, l, grants, inputs)
                {
                    match problem {
                        Frontend::NotPermitted(m) => {
                            unresolved = Some(("RefNotPermitted".to_string(), m));
                        }
                        Frontend::Invalid(reason, m) => {
                            not_accepted = Some(("NoValidCACertificate".to_string(), m.clone()));
                            unresolved = Some((reason.to_string(), m));
                        }
                        Frontend::NotServed(m) => {
                            not_accepted = Some(("UnsupportedValue".to_string(), m));
                        }
                    }
                }
                let mode = if terminate_mode == Some("MUTUAL") {
                    "MUTUAL"
                } else {
                    "SIMPLE"
                };
                let mut t = json!({"mode": mode});
                match names.len() {
                    0 => {}
                    1 => t["credentialName"] = json!(names[0]),
                    _ => t["credentialNames"] = json!(names),
                }
                server["tls"] = t;
            }
        }
        other => {
            not_accepted = Some((
                "UnsupportedProtocol".to_string(),
                format!("protocol {other:?} is unsupported"),
            ));
        }
    }
    let serve = not_accepted.is_none() && unresolved.is_none();
    Listener {
        spec: l.clone(),
        internal_name: format!("{}/{internal}", gw.ns()),
        kinds,
        attached: 0,
        unresolved,
        not_accepted,
        invalid_kinds,
        server: serve.then_some(server),
    }
}

/// Why a terminating listener's client certificate validation (`spec.tls.frontend`,
/// or the listener's own `tls.frontendValidation`) keeps it from being served.
enum Frontend {
    /// A CA reference to another namespace without a ReferenceGrant (`ResolvedRefs`
    /// `RefNotPermitted`; istiod checks the grant before looking the object up).
    NotPermitted(String),
    /// A CA reference of another kind or to a missing or malformed ConfigMap
    /// (`ResolvedRefs` with this reason, `Accepted` `NoValidCACertificate`).
    Invalid(&'static str, String),
    /// Valid, but meshfed does not validate client certificates for Gateway API
    /// listeners: the listener is not served rather than served without validation.
    NotServed(String),
}

/// The `perPort` entries of a Gateway's `spec.tls.frontend`.
fn frontend_per_port(frontend: &Value) -> impl Iterator<Item = &Value> {
    frontend
        .get("perPort")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// Every client certificate validation of a Gateway's `spec.tls.frontend`: the
/// `default` one and each `perPort` one.
pub(crate) fn frontend_validations(gw: &GatewaySpec) -> impl Iterator<Item = &Value> {
    let frontend = gw.tls.as_ref().and_then(|t| t.get("frontend"));
    frontend
        .and_then(|f| f.get("default"))
        .into_iter()
        .chain(
            frontend
                .into_iter()
                .flat_map(frontend_per_port)
                .filter_map(|p| p.get("tls")),
        )
        .filter_map(|t| t.get("validation"))
        .filter(|v| !v.is_null())
}

/// The validation `spec.tls.frontend` gives a listener's port (istiod's
/// `resolveGatewayTLS`: a `perPort` entry of the port, else `default`).
fn frontend_for_port(gw: &GatewaySpec, port: u32) -> Option<&Value> {
    let frontend = gw.tls.as_ref()?.get("frontend")?;
    let per_port = frontend_per_port(frontend)
        .find(|p| p.get("port").and_then(Value::as_u64) == Some(u64::from(port)));
    let tls = match per_port {
        Some(p) => p.get("tls")?,
        None => frontend.get("default")?,
    };
    tls.get("validation").filter(|v| !v.is_null())
}

/// Checks the client certificate validation of a terminating listener as istiod
/// checks its `caCertificateRefs` (grant, kind, then the ConfigMap); `None` when it
/// has none.
fn frontend_validation(
    gw: &Obj<GatewaySpec>,
    l: &crate::config::gateway_api::types::Listener,
    grants: &[Obj<ReferenceGrantSpec>],
    inputs: &Inputs,
) -> Option<Frontend> {
    if l.tls
        .as_ref()
        .is_some_and(|t| t.frontend_validation.is_some())
    {
        return Some(Frontend::NotServed(format!(
            "tls.frontendValidation of listener {:?}: client certificate validation is not supported by meshfed; the listener is not served",
            l.name
        )));
    }
    let validation = frontend_for_port(gw.spec, l.port)?;
    let gw_ns = gw.ns();
    let refs = validation
        .get("caCertificateRefs")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for r in &refs {
        let field = |k: &str| r.get(k).and_then(Value::as_str);
        let (group, kind, name) = (
            field("group").unwrap_or(""),
            field("kind").unwrap_or(""),
            field("name").unwrap_or(""),
        );
        let written_ns = field("namespace").unwrap_or("");
        let ns = field("namespace").unwrap_or(gw_ns);
        let reference = format!("{group}/{kind}/{name}.{written_ns}");
        if ns != gw_ns && !reference_allowed(grants, "Gateway", gw_ns, group, kind, ns, name) {
            return Some(Frontend::NotPermitted(format!(
                "caCertificateRef {ns}/{name} not accessible to a Gateway in namespace {gw_ns:?} (missing a ReferenceGrant?)"
            )));
        }
        let core = matches!(group, "" | "core");
        match kind {
            "ConfigMap" if core => match inputs.config_maps.map(|m| m.get(&format!("{ns}/{name}")))
            {
                Some(None) => {
                    return Some(Frontend::Invalid(
                        "InvalidCACertificateRef",
                        format!(
                            "invalid CA certificate reference {reference}, configmap {ns}/{name} not found"
                        ),
                    ));
                }
                Some(Some(data)) if !data.contains_key("ca.crt") => {
                    return Some(Frontend::Invalid(
                        "InvalidCACertificateRef",
                        format!("invalid CA certificate reference {reference}, found no ca.crt"),
                    ));
                }
                _ => {}
            },
            "Secret" if core => {}
            _ => {
                return Some(Frontend::Invalid(
                    "InvalidCACertificateKind",
                    format!(
                        "invalid CA certificate reference {reference}, only secret and configmap are allowed"
                    ),
                ));
            }
        }
    }
    if refs.is_empty() {
        return None;
    }
    Some(Frontend::NotServed(format!(
        "spec.tls.frontend: client certificate validation of port {} is not supported by meshfed; the listener is not served",
        l.port
    )))
}

impl Listener {
    /// The Istio Gateway serving this listener, if it can be served.
    pub fn istio_gateway(&self, gw: &Gateway, inputs: &Inputs) -> Option<ConfigObject> {
        let server = self.server.as_ref()?;
        let (_, name) = self.internal_name.split_once('/')?;
        let mut annotations = BTreeMap::new();
        annotations.insert(
            "internal.istio.io/gateway-semantics".into(),
            "gateway".into(),
        );
        annotations.insert(
            "internal.istio.io/gateway-service".into(),
            gw.services.join(","),
        );
        annotations.insert(
            PARENTS_ANNOTATION.into(),
            format!(
                "Gateway/{}/{}.{}",
                gw.object.name, self.spec.name, gw.object.namespace
            ),
        );
        let manual = gw
            .spec
            .addresses
            .iter()
            .any(|a| a.kind.as_deref() == Some("Hostname"));
        annotations.insert(
            "internal.istio.io/service-account-name".into(),
            if manual {
                String::new()
            } else {
                format!("{}-istio", gw.object.name)
            },
        );
        let _ = inputs;
        generated(
            Kind::Gateway,
            &gw.object.namespace,
            name,
            annotations,
            gw.object.creation_time,
            &json!({"servers": [server]}),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::intersect;

    #[test]
    fn hostnames_intersect_to_the_more_specific() {
        assert_eq!(
            intersect("a.example", Some("*.example")).as_deref(),
            Some("a.example")
        );
        assert_eq!(
            intersect("*.example", Some("a.example")).as_deref(),
            Some("a.example")
        );
        assert_eq!(intersect("a.other", Some("*.example")), None);
        assert_eq!(intersect("a.other", None).as_deref(), Some("a.other"));
        assert_eq!(
            intersect("*.example", Some("*.example")).as_deref(),
            Some("*.example")
        );
    }
}

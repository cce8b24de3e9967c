//! The Istio config of one snapshot, indexed for the questions generators ask:
//! which VirtualServices apply to a proxy (and gateway), which DestinationRule applies to
//! a service for a proxy, which Gateways select a router, which Sidecar scopes a proxy.
//!
//! Hosts are normalised to FQDNs when the index is built (`reviews` in namespace
//! `bookinfo` becomes `reviews.bookinfo.svc.<domain>`), so generators compare FQDNs only.

use std::collections::BTreeMap;
use std::sync::Arc;

use meshfed_api::networking::v1alpha3::{DestinationRule, Gateway, Sidecar, VirtualService};
use meshfed_api::security::v1beta1 as sec;

use meshfed_registry::config::{ConfigObject, Kind};

use crate::mesh::MeshSettings;

pub use super::config_object::Config;

/// The `gateways` value that means "sidecars".
pub const MESH_GATEWAY: &str = "mesh";

/// Config indexes of a snapshot.
#[derive(Debug, Default)]
pub struct ConfigIndex {
    /// Cluster domain suffix (`cluster.local`).
    pub domain: String,
    /// Root namespace (mesh-wide defaults).
    pub root_namespace: String,
    virtual_services: Vec<Arc<Config<VirtualService>>>,
    destination_rules: Vec<Arc<Config<DestinationRule>>>,
    gateways: Vec<Arc<Config<Gateway>>>,
    sidecars: Vec<Arc<Config<Sidecar>>>,
    peer_authentications: Vec<Arc<Config<sec::PeerAuthentication>>>,
    request_authentications: Vec<Arc<Config<sec::RequestAuthentication>>>,
    authorization_policies: Vec<Arc<Config<sec::AuthorizationPolicy>>>,
    telemetries: Vec<Arc<Config<meshfed_api::telemetry::v1alpha1::Telemetry>>>,
    envoy_filters: Vec<Arc<Config<meshfed_api::networking::v1alpha3::EnvoyFilter>>>,
    wasm_plugins: Vec<Arc<Config<meshfed_api::extensions::v1alpha1::WasmPlugin>>>,
    default_vs_export: Vec<String>,
    default_dr_export: Vec<String>,
    /// JWKS documents fetched for the RequestAuthentications (see [`crate::jwks`]).
    jwks: Arc<crate::push::jwks_table::JwksTable>,
    /// Every object of every declared kind as the stores hold it (by kind, namespace
    /// and name; the first store holding a name wins): what MCP serves.
    objects: Vec<Arc<ConfigObject>>,
    /// What the Gateway API objects were translated to, and their status.
    gateway_api: Arc<meshfed_registry::config::gateway_api::convert::Output>,
    /// Namespace labels the stores know (`None`: no store reads Namespaces).
    namespaces: Option<Arc<meshfed_registry::config::NamespaceLabels>>,
}

/// Inputs to [`ConfigIndex::new`].
#[derive(Clone, Debug, Default)]
pub struct ConfigSet {
    pub virtual_services: Vec<Config<VirtualService>>,
    pub destination_rules: Vec<Config<DestinationRule>>,
    pub gateways: Vec<Config<Gateway>>,
    pub sidecars: Vec<Config<Sidecar>>,
    pub peer_authentications: Vec<Config<sec::PeerAuthentication>>,
    pub request_authentications: Vec<Config<sec::RequestAuthentication>>,
    pub authorization_policies: Vec<Config<sec::AuthorizationPolicy>>,
    pub telemetries: Vec<Config<meshfed_api::telemetry::v1alpha1::Telemetry>>,
    pub envoy_filters: Vec<Config<meshfed_api::networking::v1alpha3::EnvoyFilter>>,
    pub wasm_plugins: Vec<Config<meshfed_api::extensions::v1alpha1::WasmPlugin>>,
    /// Every object of every kind, as the stores hold it.
    pub objects: Vec<Arc<ConfigObject>>,
    /// The Gateway API objects' translation (its Istio objects are also in the
    /// lists above) and status.
    pub gateway_api: Arc<meshfed_registry::config::gateway_api::convert::Output>,
    /// The namespace labels of the stores (the first store naming a namespace wins).
    pub namespaces: Option<Arc<meshfed_registry::config::NamespaceLabels>>,
}

impl ConfigIndex {
    /// Indexes `set`: hosts become FQDNs, delegate VirtualServices are merged into
    /// their roots ([`super::delegate`]), objects are ordered oldest first (then by
    /// namespace and name), which is the order Istio applies them in.
    pub fn new(mut set: ConfigSet, domain: &str, mesh: &MeshSettings) -> ConfigIndex {
        for vs in &mut set.virtual_services {
            let ns = vs.namespace.clone();
            for h in &mut vs.spec.hosts {
                *h = fqdn(h, &ns, domain);
            }
            for route in &mut vs.spec.http {
                for d in route
                    .route
                    .iter_mut()
                    .filter_map(|r| r.destination.as_mut())
                {
                    d.host = fqdn(&d.host, &ns, domain);
                }
                if let Some(m) = route.mirror.as_mut() {
                    m.host = fqdn(&m.host, &ns, domain);
                }
            }
            for route in &mut vs.spec.tcp {
                for d in route
                    .route
                    .iter_mut()
                    .filter_map(|r| r.destination.as_mut())
                {
                    d.host = fqdn(&d.host, &ns, domain);
                }
            }
            for route in &mut vs.spec.tls {
                for d in route
                    .route
                    .iter_mut()
                    .filter_map(|r| r.destination.as_mut())
                {
                    d.host = fqdn(&d.host, &ns, domain);
                }
            }
            for g in &mut vs.spec.gateways {
                if g != MESH_GATEWAY && !g.contains('/') {
                    *g = format!("{ns}/{g}");
                }
            }
        }
        set.virtual_services = super::delegate::merge_virtual_services(
            std::mem::take(&mut set.virtual_services),
            &mesh.config.default_virtual_service_export_to,
        );
        for dr in &mut set.destination_rules {
            dr.spec.host = fqdn(&dr.spec.host, &dr.namespace.clone(), domain);
        }
        fn order<T>(v: Vec<Config<T>>) -> Vec<Arc<Config<T>>> {
            let mut v: Vec<Arc<Config<T>>> = v.into_iter().map(Arc::new).collect();
            v.sort_by(|a, b| {
                (a.creation_time, &a.namespace, &a.name).cmp(&(
                    b.creation_time,
                    &b.namespace,
                    &b.name,
                ))
            });
            v
        }
        ConfigIndex {
            domain: domain.to_string(),
            root_namespace: mesh.config.root_namespace.clone(),
            virtual_services: order(set.virtual_services),
            destination_rules: order(set.destination_rules),
            gateways: order(set.gateways),
            sidecars: order(set.sidecars),
            peer_authentications: order(set.peer_authentications),
            request_authentications: order(set.request_authentications),
            authorization_policies: order(set.authorization_policies),
            telemetries: order(set.telemetries),
            envoy_filters: order(set.envoy_filters),
            wasm_plugins: order(set.wasm_plugins),
            default_vs_export: mesh.config.default_virtual_service_export_to.clone(),
            default_dr_export: mesh.config.default_destination_rule_export_to.clone(),
            jwks: Arc::default(),
            gateway_api: set.gateway_api,
            namespaces: set.namespaces,
            objects: {
                let mut objects = set.objects;
                // Stable: among objects of one name, the first store's stays first.
                objects.sort_by(|a, b| {
                    (a.kind, &a.namespace, &a.name).cmp(&(b.kind, &b.namespace, &b.name))
                });
                objects.dedup_by(|b, a| {
                    (a.kind, &a.namespace, &a.name) == (b.kind, &b.namespace, &b.name)
                });
                objects
            },
        }
    }

    /// The Istio Gateways and VirtualServices translated from the Gateway API
    /// objects, and the status computed for those (`/debug/configz`, the status
    /// writer).
    pub fn gateway_api(&self) -> &meshfed_registry::config::gateway_api::convert::Output {
        &self.gateway_api
    }

    /// The labels of `namespace`, as the stores know them (none known: empty).
    pub fn namespace_labels(&self, namespace: &str) -> Option<&BTreeMap<String, String>> {
        self.namespaces.as_ref()?.get(namespace)
    }

    /// Every namespace's labels, as the stores know them.
    pub fn namespace_labels_all(&self) -> Arc<meshfed_registry::config::NamespaceLabels> {
        self.namespaces.clone().unwrap_or_default()
    }

    /// The objects of `kind` as the stores hold them (specs as written, hosts not
    /// made FQDNs), by namespace and name.
    pub fn objects_of(&self, kind: Kind) -> &[Arc<ConfigObject>] {
        let start = self.objects.partition_point(|o| o.kind < kind);
        let end = self.objects.partition_point(|o| o.kind <= kind);
        &self.objects[start..end]
    }

    /// The index with the JWKS documents fetched for its RequestAuthentications.
    pub fn with_jwks(mut self, jwks: Arc<crate::push::jwks_table::JwksTable>) -> ConfigIndex {
        self.jwks = jwks;
        self
    }

    /// The JWKS documents fetched for the RequestAuthentications, by issuer and URI.
    pub fn jwks(&self) -> &crate::push::jwks_table::JwksTable {
        &self.jwks
    }

    /// VirtualServices bound to `gateway` (`mesh` for sidecars, `ns/name` for a
    /// Gateway) and visible from `proxy_ns`, oldest first; for sidecars, those
    /// translated from Gateway API routes of `proxy_ns` come first (Istio's "consumer
    /// override").
    pub fn virtual_services<'a, 'b>(
        &'a self,
        proxy_ns: &'b str,
        gateway: &'b str,
    ) -> impl Iterator<Item = &'a Arc<Config<VirtualService>>> + 'b
    where
        'a: 'b,
    {
        let visible = move |vs: &&'a Arc<Config<VirtualService>>| {
            let bound = if vs.spec.gateways.is_empty() {
                gateway == MESH_GATEWAY
            } else {
                vs.spec.gateways.iter().any(|g| g == gateway)
            };
            // Gateways see every VirtualService bound to them; exportTo scopes sidecars.
            bound
                && (gateway != MESH_GATEWAY
                    || (exported(
                        &vs.spec.export_to,
                        &self.default_vs_export,
                        &vs.namespace,
                        proxy_ns,
                    ) && gamma_visible(vs, proxy_ns)))
        };
        let consumer = move |vs: &&'a Arc<Config<VirtualService>>| {
            gateway == MESH_GATEWAY && gateway_semantics(vs) && vs.namespace == proxy_ns
        };
        let first = self
            .virtual_services
            .iter()
            .filter(visible)
            .filter(consumer);
        let rest = self
            .virtual_services
            .iter()
            .filter(visible)
            .filter(move |vs| !consumer(vs));
        first.chain(rest)
    }

    /// The VirtualServices for `host` as seen by a sidecar in `proxy_ns`: the first
    /// (oldest) one whose hosts match `host` most specifically wins, as in Istio.
    pub fn virtual_service_for_host<'a>(
        &'a self,
        proxy_ns: &'a str,
        host: &str,
    ) -> Option<&'a Arc<Config<VirtualService>>> {
        most_specific_virtual_service(self.virtual_services(proxy_ns, MESH_GATEWAY), host)
    }

    /// The DestinationRule `namespace/name`.
    pub fn destination_rule_by_name(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<&Arc<Config<DestinationRule>>> {
        self.destination_rules
            .iter()
            .find(|dr| dr.namespace == namespace && dr.name == name)
    }

    /// The DestinationRule for `host` (declared in `service_ns`) as seen from
    /// `proxy_ns`: the proxy's namespace first, then the service's, then the root
    /// namespace; within one namespace the most specific host match wins, then the
    /// oldest rule.
    pub fn destination_rule(
        &self,
        proxy_ns: &str,
        service_ns: &str,
        host: &str,
    ) -> Option<&Arc<Config<DestinationRule>>> {
        let in_ns = |ns: &str, require_export: bool| {
            let mut best: Option<(&Arc<Config<DestinationRule>>, usize)> = None;
            for dr in self
                .destination_rules
                .iter()
                .filter(|dr| dr.namespace == ns)
            {
                if require_export
                    && !exported(
                        &dr.spec.export_to,
                        &self.default_dr_export,
                        &dr.namespace,
                        proxy_ns,
                    )
                {
                    continue;
                }
                if host_matches(&dr.spec.host, host) {
                    let specificity = if dr.spec.host.starts_with('*') {
                        dr.spec.host.len()
                    } else {
                        usize::MAX
                    };
                    if best.is_none_or(|(_, s)| specificity > s) {
                        best = Some((dr, specificity));
                    }
                }
            }
            best.map(|(dr, _)| dr)
        };
        in_ns(proxy_ns, false)
            .or_else(|| in_ns(service_ns, true))
            .or_else(|| in_ns(&self.root_namespace, true))
    }

    /// Every PeerAuthentication, oldest first (then namespace and name).
    pub fn peer_authentications(&self) -> &[Arc<Config<sec::PeerAuthentication>>] {
        &self.peer_authentications
    }

    /// Every RequestAuthentication, oldest first (then namespace and name).
    pub fn request_authentications(&self) -> &[Arc<Config<sec::RequestAuthentication>>] {
        &self.request_authentications
    }

    /// Every AuthorizationPolicy, oldest first (then namespace and name).
    pub fn authorization_policies(&self) -> &[Arc<Config<sec::AuthorizationPolicy>>] {
        &self.authorization_policies
    }

    /// Every Telemetry, oldest first (then namespace and name): the order Istio
    /// picks the first one of a scope in.
    pub fn telemetries(&self) -> &[Arc<Config<meshfed_api::telemetry::v1alpha1::Telemetry>>] {
        &self.telemetries
    }

    /// Every WasmPlugin, oldest first (then namespace and name); `generate::wasm`
    /// orders them by namespace and priority for a proxy.
    pub fn wasm_plugins(&self) -> &[Arc<Config<meshfed_api::extensions::v1alpha1::WasmPlugin>>] {
        &self.wasm_plugins
    }

    /// EnvoyFilters, oldest first (then namespace, name); `generate::envoyfilter`
    /// orders them by priority for a proxy.
    pub fn envoy_filters(&self) -> &[Arc<Config<meshfed_api::networking::v1alpha3::EnvoyFilter>>] {
        &self.envoy_filters
    }

    /// Every Gateway, oldest first (then namespace and name).
    pub fn gateways(&self) -> impl Iterator<Item = &Arc<Config<Gateway>>> {
        self.gateways.iter()
    }

    /// The Sidecar `namespace/name`.
    pub fn sidecar_by_name(&self, namespace: &str, name: &str) -> Option<&Arc<Config<Sidecar>>> {
        self.sidecars
            .iter()
            .find(|s| s.namespace == namespace && s.name == name)
    }

    /// The Sidecar scoping a proxy: one in its namespace selecting it, else its
    /// namespace's selector-less one, else the root namespace's selector-less one.
    pub fn sidecar_for(
        &self,
        proxy_ns: &str,
        labels: &BTreeMap<String, String>,
    ) -> Option<&Arc<Config<Sidecar>>> {
        let selects = |s: &Config<Sidecar>| {
            s.spec.workload_selector.as_ref().is_some_and(|ws| {
                !ws.labels.is_empty() && ws.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            })
        };
        let default_of = |ns: &str| {
            self.sidecars.iter().find(|s| {
                s.namespace == ns
                    && s.spec
                        .workload_selector
                        .as_ref()
                        .is_none_or(|ws| ws.labels.is_empty())
            })
        };
        self.sidecars
            .iter()
            .find(|s| s.namespace == proxy_ns && selects(s))
            .or_else(|| default_of(proxy_ns))
            .or_else(|| default_of(&self.root_namespace))
    }

    /// Every VirtualService (for debug output).
    pub fn all_virtual_services(&self) -> &[Arc<Config<VirtualService>>] {
        &self.virtual_services
    }

    /// Every DestinationRule (for debug output).
    pub fn all_destination_rules(&self) -> &[Arc<Config<DestinationRule>>] {
        &self.destination_rules
    }
}

/// Whether an object with `export_to` (or the mesh default when empty) declared in
/// `ns` is visible from `proxy_ns`.
pub fn exported(export_to: &[String], default: &[String], ns: &str, proxy_ns: &str) -> bool {
    let list = if export_to.is_empty() {
        default
    } else {
        export_to
    };
    if list.is_empty() {
        return true;
    }
    list.iter()
        .any(|e| e == "*" || (e == "." && ns == proxy_ns) || e == proxy_ns)
}

/// Expands a short host name the way Istio does for config in namespace `ns`:
/// `reviews` -> `reviews.ns.svc.<domain>`; names with a dot, wildcards and `*` stay.
pub fn fqdn(host: &str, ns: &str, domain: &str) -> String {
    if host.contains('.') || host.starts_with('*') || host.is_empty() {
        host.to_string()
    } else {
        format!("{host}.{ns}.svc.{domain}")
    }
}

/// Of `virtual_services`, the first (oldest) one whose hosts match `host` most
/// specifically: an exact host over the longest wildcard, as in Istio.
pub fn most_specific_virtual_service<'a>(
    virtual_services: impl IntoIterator<Item = &'a Arc<Config<VirtualService>>>,
    host: &str,
) -> Option<&'a Arc<Config<VirtualService>>> {
    let mut best: Option<(&Arc<Config<VirtualService>>, usize)> = None;
    for vs in virtual_services {
        for pattern in &vs.spec.hosts {
            if host_matches(pattern, host) {
                let specificity = if pattern.starts_with('*') {
                    pattern.len()
                } else {
                    usize::MAX
                };
                if best.is_none_or(|(_, s)| specificity > s) {
                    best = Some((vs, specificity));
                }
            }
        }
    }
    best.map(|(vs, _)| vs)
}

/// Istio host matching: exact, or a wildcard pattern `*.example.com` matching any host
/// ending in `.example.com` (and `*` matching everything).
pub fn host_matches(pattern: &str, host: &str) -> bool {
    if pattern == "*" || pattern == host {
        return true;
    }
    match pattern.strip_prefix('*') {
        Some(suffix) => host.ends_with(suffix) && host.len() > suffix.len(),
        None => false,
    }
}

/// Whether `vs` was translated from a Gateway API route (Istio's gateway semantics).
fn gateway_semantics(vs: &Config<VirtualService>) -> bool {
    vs.annotations
        .get("internal.istio.io/route-semantics")
        .is_some_and(|s| s == "gateway")
}

/// Whether a sidecar in `proxy_ns` applies `vs` as Istio applies a route attached to
/// a Service (GAMMA): a route in the Service's namespace (producer) applies to every
/// client, a route in another namespace (consumer) only to clients of its own.
fn gamma_visible(vs: &Config<VirtualService>, proxy_ns: &str) -> bool {
    if !gateway_semantics(vs) || vs.namespace == proxy_ns {
        return true;
    }
    // `<name>.<namespace>.svc.<domain>`: a Service's host and its namespace.
    vs.spec.hosts.iter().all(|h| {
        let mut labels = h.split('.');
        match (labels.next(), labels.next(), labels.next()) {
            (Some(_), Some(ns), Some("svc")) => ns == vs.namespace,
            _ => true,
        }
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use meshfed_api::networking::v1alpha3::WorkloadSelector;

    use super::*;
    use crate::mesh::default_mesh_config;

    fn cfg<T>(ns: &str, name: &str, age: u64, spec: T) -> Config<T> {
        Config {
            name: name.into(),
            namespace: ns.into(),
            labels: BTreeMap::new(),
            annotations: Default::default(),
            creation_time: SystemTime::UNIX_EPOCH + Duration::from_secs(1000 - age),
            spec,
        }
    }

    fn mesh() -> MeshSettings {
        MeshSettings {
            config: default_mesh_config(),
            ..Default::default()
        }
    }

    fn dr(host: &str) -> DestinationRule {
        DestinationRule {
            host: host.into(),
            ..Default::default()
        }
    }

    #[test]
    fn host_matching_and_fqdn() {
        assert!(host_matches("*.example.com", "a.example.com"));
        assert!(!host_matches("*.example.com", "example.com"));
        assert!(host_matches("*", "x"));
        assert_eq!(
            fqdn("reviews", "bookinfo", "cluster.local"),
            "reviews.bookinfo.svc.cluster.local"
        );
        assert_eq!(
            fqdn("api.example.com", "x", "cluster.local"),
            "api.example.com"
        );
    }

    #[test]
    fn destination_rule_lookup_order() {
        let host = "reviews.bookinfo.svc.cluster.local";
        let mut private = dr("reviews.bookinfo.svc.cluster.local");
        private.export_to = vec![".".into()];
        let set = ConfigSet {
            destination_rules: vec![
                cfg("istio-system", "root", 1, dr("*.svc.cluster.local")),
                cfg("bookinfo", "svc-ns", 1, private),
                cfg("client", "client-ns", 1, dr("reviews")),
            ],
            ..Default::default()
        };
        let index = ConfigIndex::new(set, "cluster.local", &mesh());
        // The client namespace's rule (short host resolved in *its* namespace) does not
        // match bookinfo's reviews...
        assert_eq!(
            index
                .destination_rule("client", "bookinfo", host)
                .unwrap()
                .name,
            "root"
        );
        // ...the service namespace's private rule applies inside bookinfo only...
        assert_eq!(
            index
                .destination_rule("bookinfo", "bookinfo", host)
                .unwrap()
                .name,
            "svc-ns"
        );
        // ...and the root rule covers the rest.
        assert_eq!(
            index
                .destination_rule("other", "bookinfo", host)
                .unwrap()
                .name,
            "root"
        );
    }

    #[test]
    fn virtual_services_by_gateway_export_and_specificity() {
        let vs = |hosts: &[&str], gateways: &[&str], export: &[&str]| VirtualService {
            hosts: hosts.iter().map(|s| s.to_string()).collect(),
            gateways: gateways.iter().map(|s| s.to_string()).collect(),
            export_to: export.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let set = ConfigSet {
            virtual_services: vec![
                cfg("a", "wild", 10, vs(&["*.example.com"], &[], &[])),
                cfg("a", "exact", 1, vs(&["api.example.com"], &[], &[])),
                cfg("a", "private", 5, vs(&["x.example.com"], &[], &["."])),
                cfg("a", "gw", 5, vs(&["api.example.com"], &["ingress"], &[])),
            ],
            ..Default::default()
        };
        let index = ConfigIndex::new(set, "cluster.local", &mesh());
        assert_eq!(
            index
                .virtual_service_for_host("b", "api.example.com")
                .unwrap()
                .name,
            "exact"
        );
        assert_eq!(
            index
                .virtual_service_for_host("b", "y.example.com")
                .unwrap()
                .name,
            "wild"
        );
        assert_eq!(
            index
                .virtual_service_for_host("b", "x.example.com")
                .unwrap()
                .name,
            "wild"
        );
        assert_eq!(
            index
                .virtual_service_for_host("a", "x.example.com")
                .unwrap()
                .name,
            "private"
        );
        let gw: Vec<_> = index
            .virtual_services("a", "a/ingress")
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(gw, vec!["gw"]);
    }

    /// A root's delegating rule becomes the delegate's rules, whose short destination
    /// hosts were resolved in the delegate's own namespace; the delegate is no
    /// VirtualService of its own.
    #[test]
    fn delegates_are_merged_into_their_roots() {
        let root: VirtualService = serde_json::from_value(serde_json::json!({
            "hosts": ["reviews"],
            "http": [{"match": [{"uri": {"prefix": "/api"}}],
                      "delegate": {"name": "reviews-api", "namespace": "team"}}]
        }))
        .unwrap();
        let delegate: VirtualService = serde_json::from_value(serde_json::json!({
            "http": [{"match": [{"uri": {"prefix": "/api/v2"}}],
                      "route": [{"destination": {"host": "reviews-v2"}}]}]
        }))
        .unwrap();
        let set = ConfigSet {
            virtual_services: vec![
                cfg("bookinfo", "reviews", 1, root),
                cfg("team", "reviews-api", 1, delegate),
            ],
            ..Default::default()
        };
        let index = ConfigIndex::new(set, "cluster.local", &mesh());
        assert_eq!(index.all_virtual_services().len(), 1);
        let vs = index
            .virtual_service_for_host("bookinfo", "reviews.bookinfo.svc.cluster.local")
            .unwrap();
        assert_eq!(vs.name, "reviews");
        assert_eq!(vs.spec.http.len(), 1);
        let rule = &vs.spec.http[0];
        assert!(rule.delegate.is_none());
        assert_eq!(
            rule.route[0].destination.as_ref().unwrap().host,
            "reviews-v2.team.svc.cluster.local"
        );
    }

    #[test]
    fn sidecar_scope_selection() {
        let sc = |labels: &[(&str, &str)]| Sidecar {
            workload_selector: (!labels.is_empty()).then(|| WorkloadSelector {
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }),
            ..Default::default()
        };
        let set = ConfigSet {
            sidecars: vec![
                cfg("istio-system", "mesh-default", 1, sc(&[])),
                cfg("a", "ns-default", 1, sc(&[])),
                cfg("a", "for-app", 1, sc(&[("app", "x")])),
            ],
            ..Default::default()
        };
        let index = ConfigIndex::new(set, "cluster.local", &mesh());
        let labels = |app: &str| BTreeMap::from([("app".to_string(), app.to_string())]);
        assert_eq!(
            index.sidecar_for("a", &labels("x")).unwrap().name,
            "for-app"
        );
        assert_eq!(
            index.sidecar_for("a", &labels("y")).unwrap().name,
            "ns-default"
        );
        assert_eq!(
            index.sidecar_for("b", &labels("x")).unwrap().name,
            "mesh-default"
        );
    }
}

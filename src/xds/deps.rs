//! What each resource type is generated from, declared once, and the one answer to
//! "does this push touch this proxy's type" that the pipeline (which connections to
//! wake), the snapshot's resource cache (which entries survive) and the connection
//! (which types to regenerate, and whether EDS goes out partially) all use.
//!
//! The declarations are conservative: a pair is independent only where no generator
//! of the type reads the kind for that class of proxy.
//!
//! | type     | reads config kinds                           | derived from one service |
//! |----------|----------------------------------------------|--------------------------|
//! | Cluster  | all but AuthorizationPolicy, RequestAuthentication; sidecars: nor VirtualService | yes (outbound clusters) |
//! | Endpoint | all but AuthorizationPolicy, RequestAuthentication; sidecars: nor VirtualService | yes |
//! | Listener | all                                           | no (every service)       |
//! | Route    | all                                           | no (every service)       |
//! | Secret   | Secret, Gateway only (Secrets are read by SDS and, for WasmPlugin pull Secrets, ECDS alone) | no |
//! | NameTable| services, Sidecars, mesh config, networks, workloads | no (every service) |
//!
//! Endpoint-only changes reach EDS alone, for the changed services only. Clusters
//! whose content reads endpoints (inline DNS load assignments, the identities behind
//! auto mTLS) carry the endpoint shards they read in their cache key, so a changed
//! shard is a different key and never a stale hit.

use std::collections::HashSet;

use meshfed_registry::config::kinds::Reader;
use meshfed_registry::{ConfigKind, PushRequest, TriggerReason};

use super::TypeUrl;
use super::mcp::{McpKind, McpType};
use crate::model::ProxyClass;

/// Whether `type_url` resources of a `class` proxy may read config objects of `kind`.
///
/// Sidecars' clusters and endpoints never look at VirtualServices: a VirtualService
/// change costs a sidecar its route tables and listeners (whose TCP and TLS chains
/// follow `tcp`/`tls` routes, as in Istio). Gateways read them in LDS (TLS and TCP
/// routes) and proxyless clients throughout.
///
/// Secrets (SDS) read Secrets and Gateways (which authorize `kubernetes-gateway://`
/// names) only, and nothing else reads Secrets.
///
/// The name table (NDS) reads services and what decides which of them a proxy sees;
/// as Istio (`ndsNeedsPush`), Gateways, VirtualServices, DestinationRules and
/// WorkloadEntries (whose addresses reach it as service endpoint changes) do not push it.
///
/// For config kinds the answer is their declaration's
/// [`Readers`](meshfed_registry::config::kinds::Readers), which says the above kind by kind.
pub const fn reads(class: ProxyClass, type_url: TypeUrl, kind: ConfigKind) -> bool {
    let reader = match type_url {
        TypeUrl::Cluster => Reader::Clusters,
        TypeUrl::Endpoint => Reader::Endpoints,
        TypeUrl::Listener => Reader::Listeners,
        TypeUrl::Route => Reader::Routes,
        TypeUrl::Secret => Reader::Secrets,
        TypeUrl::NameTable => Reader::NameTable,
        TypeUrl::ExtensionConfig => Reader::ExtensionConfigs,
        // MCP types are answered by `mcp_reads`, for every class alike.
        TypeUrl::Mcp(_) => return false,
        // Ambient workloads and services: every service, endpoint and workload, the
        // networks, and the names of the policies that select a workload.
        TypeUrl::Address => {
            return !matches!(
                kind,
                ConfigKind::Secret
                    | ConfigKind::VirtualService
                    | ConfigKind::DestinationRule
                    | ConfigKind::Gateway
                    | ConfigKind::Sidecar
                    | ConfigKind::RequestAuthentication
                    | ConfigKind::Telemetry
            );
        }
        // Ambient policies: AuthorizationPolicies, PeerAuthentications and the mesh
        // config's root namespace.
        TypeUrl::Authorization => {
            return matches!(
                kind,
                ConfigKind::AuthorizationPolicy
                    | ConfigKind::PeerAuthentication
                    | ConfigKind::MeshConfig
            );
        }
    };
    match kind.object_kind() {
        Some(kind) => kind
            .info()
            .readers
            .reads(matches!(class, ProxyClass::Sidecar), reader),
        // Extension configs (WasmPlugins) read the mesh config (its root namespace)
        // and the plugins' image pull Secrets of the keys naming no object.
        None if matches!(type_url, TypeUrl::ExtensionConfig) => {
            matches!(kind, ConfigKind::MeshConfig | ConfigKind::Secret)
        }
        // Secrets are read by SDS alone; services, endpoints, the mesh, networks and
        // workloads by every other type.
        None => matches!(kind, ConfigKind::Secret) == matches!(type_url, TypeUrl::Secret),
    }
}

/// The workload selectors of a changed security policy, before and after the change
/// (each `None` when that version selects its whole namespace, absent when that
/// version does not exist).
pub type PolicySelectors = Vec<Option<std::collections::BTreeMap<String, String>>>;

/// Whether a `class` proxy of `namespace` with `labels` depends on the changed object
/// `key`. For the kinds Istio's `SidecarScope.DependsOnConfig` scopes to namespaces
/// (`clusterScopedKnownConfigTypes`), a PeerAuthentication, RequestAuthentication or
/// AuthorizationPolicy concerns the sidecars (and proxyless gRPC nodes, sidecars to
/// Istio) of its own namespace, or all of them from the root namespace. Knowing the
/// policy's selectors (`selectors`, old and new), meshfed narrows further, to the
/// proxies either version selects. A PeerAuthentication without selector (the mesh's
/// or a namespace's) concerns every proxy: clients in any namespace infer the
/// destination's mTLS mode from it (auto mTLS), where Istio would leave them to the
/// next push. Gateways depend on everything, as in Istio; so does every proxy when
/// the root namespace is not known, and on every other kind. An EnvoyFilter is
/// scoped the same way for every proxy class, gateways included: it concerns the
/// proxies either version selects.
pub fn depends_on(
    class: ProxyClass,
    namespace: &str,
    labels: &std::collections::BTreeMap<String, String>,
    root_namespace: Option<&str>,
    key: &meshfed_registry::ConfigKey,
    selectors: Option<&PolicySelectors>,
) -> bool {
    let scoped_class = matches!(class, ProxyClass::Sidecar | ProxyClass::Grpc);
    // Telemetry is scoped the same way: the root namespace's reaches every proxy,
    // a namespace's its own proxies, a selector's the workloads it selects.
    let security = matches!(
        key.kind,
        ConfigKind::PeerAuthentication
            | ConfigKind::RequestAuthentication
            | ConfigKind::AuthorizationPolicy
            | ConfigKind::Telemetry
    );
    // An EnvoyFilter is scoped for every proxy class: its patches reach only the
    // proxies it selects (root namespace: all; else its namespace, by selector). So is
    // a WasmPlugin: gateways too carry only the plugins selecting them.
    let every_class = matches!(key.kind, ConfigKind::EnvoyFilter | ConfigKind::WasmPlugin);
    let Some(root) = root_namespace.filter(|_| (scoped_class && security) || every_class) else {
        return true;
    };
    let namespace_wide = selectors.is_none_or(|v| v.iter().any(Option::is_none));
    if key.kind == ConfigKind::PeerAuthentication && namespace_wide {
        return true;
    }
    if &*key.namespace != root && &*key.namespace != namespace {
        return false;
    }
    match selectors {
        Some(versions) if !namespace_wide => versions
            .iter()
            .flatten()
            .any(|selector| selector.iter().all(|(k, v)| labels.get(k) == Some(v))),
        _ => true,
    }
}

/// The label Gateway API gateway deployments carry: the name of their Gateway.
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";

/// A `targetRefs` entry naming a Gateway API `Gateway`.
pub fn is_gateway_ref(r: &meshfed_api::r#type::v1beta1::PolicyTargetReference) -> bool {
    r.group == "gateway.networking.k8s.io" && r.kind == "Gateway"
}

/// The selector of the proxies of Gateway `name`.
fn gateway_selector(name: &str) -> Option<std::collections::BTreeMap<String, String>> {
    Some(std::collections::BTreeMap::from([(
        GATEWAY_NAME_LABEL.to_string(),
        name.to_string(),
    )]))
}

/// The workload selectors a change to a WasmPlugin narrows its push to (see
/// [`depends_on`]): its `selector` (`None`: the whole namespace), or for `targetRefs`
/// the [`GATEWAY_NAME_LABEL`] of each Gateway it names (other targets select no proxy
/// meshfed serves).
pub fn wasm_plugin_selectors(
    spec: &meshfed_api::extensions::v1alpha1::WasmPlugin,
) -> PolicySelectors {
    let refs: Vec<_> = spec.target_ref.iter().chain(&spec.target_refs).collect();
    if refs.is_empty() {
        return vec![
            spec.selector
                .as_ref()
                .map(|s| s.match_labels.clone())
                .filter(|l| !l.is_empty()),
        ];
    }
    refs.iter()
        .filter(|r| is_gateway_ref(r))
        .map(|r| gateway_selector(&r.name))
        .collect()
}

/// The workload selectors a change to an EnvoyFilter of `namespace` narrows its push
/// to (see [`depends_on`], which also keeps it to that namespace, or every namespace
/// for one of the root namespace): its `workloadSelector` (`None`: the whole
/// namespace), or for `targetRefs` the [`GATEWAY_NAME_LABEL`] of each Gateway of its own
/// namespace it names, as `generate::envoyfilter` selects. Other targets select no
/// proxy meshfed serves, so they add none. A root-namespace EnvoyFilter's targets also
/// reach same-named gateways of other namespaces this way: more proxies than it
/// patches, never fewer.
pub fn envoy_filter_selectors(
    spec: &meshfed_api::networking::v1alpha3::EnvoyFilter,
    namespace: &str,
) -> PolicySelectors {
    if spec.target_refs.is_empty() {
        return vec![
            spec.workload_selector
                .as_ref()
                .map(|s| s.labels.clone())
                .filter(|l| !l.is_empty()),
        ];
    }
    spec.target_refs
        .iter()
        .filter(|r| is_gateway_ref(r) && (r.namespace.is_empty() || r.namespace == namespace))
        .map(|r| gateway_selector(&r.name))
        .collect()
}

/// Whether the MCP type serving `kind` reads changes of `changed`: a config kind its
/// own objects; ServiceEntries also the services of every registry (synthesized
/// ServiceEntries follow them), WorkloadEntries also services and endpoints
/// (synthesized WorkloadEntries are the exported endpoints); the mesh config its own
/// changes.
pub fn mcp_reads(kind: McpKind, changed: ConfigKind) -> bool {
    match kind {
        McpKind::MeshConfig => changed == ConfigKind::MeshConfig,
        McpKind::Config(k) => {
            k.config_kind() == changed
                || (k == meshfed_registry::config::Kind::WorkloadEntry
                    && matches!(changed, ConfigKind::Endpoints | ConfigKind::ServiceEntry))
        }
    }
}

/// Whether each resource of the type is derived from a single service (so a change of
/// other services leaves it as it is), rather than from every service.
pub const fn per_service(type_url: TypeUrl) -> bool {
    matches!(type_url, TypeUrl::Cluster | TypeUrl::Endpoint)
}

/// How much of one type of one class of proxy a push changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Touch<'a> {
    /// Nothing: what the proxy holds stands.
    Nothing,
    /// Only resources derived from these services (hostnames).
    Services(&'a HashSet<&'a str>),
    /// Anything may have changed.
    Everything,
}

/// One push request, read once for every connection and type it is asked about.
#[derive(Debug)]
pub struct PushScope<'a> {
    request: &'a PushRequest,
    hosts: HashSet<&'a str>,
    only_services: bool,
    root_namespace: Option<String>,
    selectors: std::collections::HashMap<meshfed_registry::ConfigKey, PolicySelectors>,
}

impl<'a> PushScope<'a> {
    /// Reads `request`.
    pub fn new(request: &'a PushRequest) -> Self {
        let only_services = request
            .configs_updated
            .iter()
            .all(|k| matches!(k.kind, ConfigKind::Endpoints | ConfigKind::ServiceEntry));
        PushScope {
            request,
            hosts: request.updated_hostnames().collect(),
            only_services,
            root_namespace: None,
            selectors: Default::default(),
        }
    }

    /// The same scope, knowing the mesh's root namespace: without it, security
    /// policy changes reach every proxy (see [`PushScope::affects_proxy`]).
    pub fn with_root_namespace(mut self, root_namespace: &str) -> Self {
        self.root_namespace = Some(root_namespace.to_string());
        self
    }

    /// The same scope, knowing the selectors of the changed security policies (see
    /// [`depends_on`]).
    pub fn with_policy_selectors(
        mut self,
        selectors: std::collections::HashMap<meshfed_registry::ConfigKey, PolicySelectors>,
    ) -> Self {
        self.selectors = selectors;
        self
    }

    /// Whether the push concerns a `class` proxy of `namespace` with `labels` at all
    /// (Istio's `ConfigAffectsProxy`): some changed object is one it depends on, by
    /// [`depends_on`]. Forced pushes and pushes naming no object concern every proxy.
    pub fn affects_proxy(
        &self,
        class: ProxyClass,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> bool {
        let request = self.request;
        request.forced
            || request.configs_updated.is_empty()
            || request.configs_updated.iter().any(|k| {
                depends_on(
                    class,
                    namespace,
                    labels,
                    self.root_namespace.as_deref(),
                    k,
                    self.selectors.get(k),
                )
            })
    }

    /// The request read.
    pub fn request(&self) -> &'a PushRequest {
        self.request
    }

    /// The services whose endpoints or definition changed.
    pub fn hosts(&self) -> &HashSet<&'a str> {
        &self.hosts
    }

    /// What this push changes of `type_url` for a `class` proxy.
    pub fn touch(&self, class: ProxyClass, type_url: TypeUrl) -> Touch<'_> {
        let request = self.request;
        if request.forced {
            return Touch::Everything;
        }
        if let TypeUrl::Mcp(t) = type_url {
            return self.touch_mcp(t);
        }
        if request.is_endpoints_only() {
            return match type_url {
                TypeUrl::Endpoint => Touch::Services(&self.hosts),
                // Workloads are endpoints: the type is rebuilt, and Delta sends what
                // changed.
                TypeUrl::Address => Touch::Everything,
                _ => Touch::Nothing,
            };
        }
        if !request.configs_updated.is_empty()
            && request
                .configs_updated
                .iter()
                .all(|k| !reads(class, type_url, k.kind))
        {
            return Touch::Nothing;
        }
        if self.only_services && !self.hosts.is_empty() && per_service(type_url) {
            return Touch::Services(&self.hosts);
        }
        Touch::Everything
    }

    /// What this push changes of MCP type `t` (the same for every client): a request
    /// naming nothing may change anything; otherwise the type is touched when it reads
    /// one of the changed kinds ([`mcp_reads`]), and then whole.
    fn touch_mcp(&self, t: McpType) -> Touch<'_> {
        let request = self.request;
        let touched = if request.configs_updated.is_empty() {
            request.full
        } else {
            request
                .configs_updated
                .iter()
                .any(|k| mcp_reads(t.kind, k.kind))
        };
        let synthesized = matches!(
            t.kind,
            McpKind::Config(
                meshfed_registry::config::Kind::ServiceEntry
                    | meshfed_registry::config::Kind::WorkloadEntry
            )
        );
        if !touched {
            Touch::Nothing
        } else if synthesized && self.only_services && !self.hosts.is_empty() {
            // The objects of other services stand (their cache entries survive); the
            // type is still sent whole.
            Touch::Services(&self.hosts)
        } else {
            Touch::Everything
        }
    }

    /// Whether the push touches any MCP type: the MCP connections to wake.
    pub fn touches_mcp(&self, types: &[McpType]) -> bool {
        types
            .iter()
            .any(|t| self.touch(ProxyClass::Sidecar, TypeUrl::Mcp(*t)) != Touch::Nothing)
    }

    /// Whether the push touches any of `types` for a `class` proxy.
    pub fn touches_any(&self, class: ProxyClass, types: impl IntoIterator<Item = TypeUrl>) -> bool {
        types
            .into_iter()
            .any(|t| self.touch(class, t) != Touch::Nothing)
    }

    /// Whether only endpoints changed: the push touches EDS of the changed services and
    /// nothing else, for every class of proxy (so its connections are the watchers of
    /// the changed names, and proxies' workloads are as they were).
    pub fn is_incremental(&self) -> bool {
        self.request.is_endpoints_only()
    }

    /// Whether the snapshot re-reads the Istio config stores: any change other than
    /// services, endpoints and proxies' own workloads.
    pub fn rebuilds_config(&self) -> bool {
        // A ServiceEntry object changed in a config store (not a registry's service):
        // the index holds every object, which MCP serves.
        let config_service_entry = self.request.reasons.contains_key(&TriggerReason::Config)
            && self
                .request
                .configs_updated
                .iter()
                .any(|k| k.kind == ConfigKind::ServiceEntry);
        self.request.forced
            || config_service_entry
            || self.request.configs_updated.iter().any(|k| {
                !matches!(
                    k.kind,
                    ConfigKind::Endpoints
                        | ConfigKind::ServiceEntry
                        | ConfigKind::Workload
                        | ConfigKind::Secret
                )
            })
    }

    /// Whether the snapshot re-merges the registries' services: a full push, unless
    /// it only names proxies' own workloads or Secrets.
    pub fn remerges_services(&self) -> bool {
        let only_workloads = !self.request.configs_updated.is_empty()
            && self
                .request
                .configs_updated
                .iter()
                .all(|k| matches!(k.kind, ConfigKind::Workload | ConfigKind::Secret));
        self.request.forced || (self.request.full && !only_workloads)
    }
}

#[cfg(test)]
mod tests {
    use meshfed_registry::{ConfigKey, ServiceKey, TriggerReason};

    use super::*;

    const CLASSES: [ProxyClass; 3] = [ProxyClass::Sidecar, ProxyClass::Router, ProxyClass::Grpc];

    /// The table as it was written before the kinds declared their readers.
    const fn reads_as_written(class: ProxyClass, type_url: TypeUrl, kind: ConfigKind) -> bool {
        match (class, type_url, kind) {
            (_, TypeUrl::Address, kind) => !matches!(
                kind,
                ConfigKind::Secret
                    | ConfigKind::VirtualService
                    | ConfigKind::DestinationRule
                    | ConfigKind::Gateway
                    | ConfigKind::Sidecar
                    | ConfigKind::RequestAuthentication
                    | ConfigKind::Telemetry
            ),
            (_, TypeUrl::Authorization, kind) => matches!(
                kind,
                ConfigKind::AuthorizationPolicy
                    | ConfigKind::PeerAuthentication
                    | ConfigKind::MeshConfig
            ),
            (_, TypeUrl::ExtensionConfig, kind) => {
                matches!(kind, ConfigKind::MeshConfig | ConfigKind::Secret)
            }
            (_, TypeUrl::Secret, kind) => {
                matches!(kind, ConfigKind::Secret | ConfigKind::Gateway)
            }
            (_, _, ConfigKind::Secret) => false,
            (_, TypeUrl::NameTable, kind) => !matches!(
                kind,
                ConfigKind::Gateway
                    | ConfigKind::VirtualService
                    | ConfigKind::DestinationRule
                    | ConfigKind::WorkloadEntry
            ),
            (
                _,
                TypeUrl::Cluster | TypeUrl::Endpoint,
                ConfigKind::AuthorizationPolicy | ConfigKind::RequestAuthentication,
            ) => false,
            (ProxyClass::Sidecar, _, ConfigKind::VirtualService) => {
                matches!(type_url, TypeUrl::Route | TypeUrl::Listener)
            }
            _ => true,
        }
    }

    #[test]
    fn declared_readers_answer_as_the_written_table() {
        for kind in [
            ConfigKind::ServiceEntry,
            ConfigKind::Endpoints,
            ConfigKind::VirtualService,
            ConfigKind::DestinationRule,
            ConfigKind::Gateway,
            ConfigKind::Sidecar,
            ConfigKind::WorkloadEntry,
            ConfigKind::PeerAuthentication,
            ConfigKind::RequestAuthentication,
            ConfigKind::AuthorizationPolicy,
            ConfigKind::MeshConfig,
            ConfigKind::MeshNetworks,
            ConfigKind::Workload,
            ConfigKind::Secret,
        ] {
            for class in CLASSES {
                for type_url in TypeUrl::ALL {
                    assert_eq!(
                        reads(class, type_url, kind),
                        reads_as_written(class, type_url, kind),
                        "{class:?} {type_url:?} {kind:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn telemetry_is_read_by_listeners_only() {
        for class in [ProxyClass::Sidecar, ProxyClass::Router] {
            for type_url in [
                TypeUrl::Cluster,
                TypeUrl::Endpoint,
                TypeUrl::Route,
                TypeUrl::Secret,
                TypeUrl::NameTable,
            ] {
                assert!(
                    !reads(class, type_url, ConfigKind::Telemetry),
                    "{type_url:?}"
                );
            }
            assert!(reads(class, TypeUrl::Listener, ConfigKind::Telemetry));
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn an_envoy_filter_change_concerns_the_proxies_it_selects_gateways_included() {
        let key = ConfigKey::new(ConfigKind::EnvoyFilter, "lua", "foo");
        let request = PushRequest::full(TriggerReason::Config, [key.clone()]);
        let scope = PushScope::new(&request)
            .with_root_namespace("istio-system")
            .with_policy_selectors([(key.clone(), vec![Some(labels(&[("app", "a")]))])].into());
        let app = labels(&[("app", "a")]);
        assert!(scope.affects_proxy(ProxyClass::Sidecar, "foo", &app));
        assert!(!scope.affects_proxy(ProxyClass::Sidecar, "foo", &labels(&[("app", "b")])));
        assert!(!scope.affects_proxy(ProxyClass::Sidecar, "bar", &app));
        assert!(!scope.affects_proxy(ProxyClass::Router, "bar", &app));
        assert!(scope.affects_proxy(ProxyClass::Router, "foo", &app));
        // From the root namespace without selector: every proxy.
        let root = ConfigKey::new(ConfigKind::EnvoyFilter, "mesh", "istio-system");
        let request = PushRequest::full(TriggerReason::Config, [root.clone()]);
        let scope = PushScope::new(&request)
            .with_root_namespace("istio-system")
            .with_policy_selectors([(root, vec![None])].into());
        assert!(scope.affects_proxy(ProxyClass::Router, "bar", &app));
    }

    #[test]
    fn a_security_policy_change_concerns_the_sidecars_of_its_namespace_or_all_from_the_root() {
        let none = labels(&[]);
        for kind in [
            ConfigKind::PeerAuthentication,
            ConfigKind::RequestAuthentication,
            ConfigKind::AuthorizationPolicy,
            ConfigKind::Telemetry,
        ] {
            let key = ConfigKey::new(kind, "p", "foo");
            let request = PushRequest::full(TriggerReason::Config, [key.clone()]);
            // A policy with a selector (unknown selectors: namespace-wide, as Istio).
            let selecting = |selector: PolicySelectors| {
                PushScope::new(&request)
                    .with_root_namespace("istio-system")
                    .with_policy_selectors([(key.clone(), selector)].into())
            };
            let scope = selecting(vec![Some(labels(&[("app", "a")]))]);
            assert!(
                scope.affects_proxy(ProxyClass::Sidecar, "foo", &labels(&[("app", "a")])),
                "{kind:?}"
            );
            assert!(
                scope.affects_proxy(
                    ProxyClass::Grpc,
                    "foo",
                    &labels(&[("app", "a"), ("v", "1")])
                ),
                "{kind:?}"
            );
            assert!(
                !scope.affects_proxy(ProxyClass::Sidecar, "foo", &labels(&[("app", "b")])),
                "{kind:?}"
            );
            assert!(
                !scope.affects_proxy(ProxyClass::Sidecar, "bar", &labels(&[("app", "a")])),
                "{kind:?}"
            );
            // Gateways depend on every policy, as in Istio.
            assert!(
                scope.affects_proxy(ProxyClass::Router, "bar", &none),
                "{kind:?}"
            );
            // A selector change concerns the proxies of both versions.
            let scope = selecting(vec![
                Some(labels(&[("app", "a")])),
                Some(labels(&[("app", "b")])),
            ]);
            assert!(
                scope.affects_proxy(ProxyClass::Sidecar, "foo", &labels(&[("app", "b")])),
                "{kind:?}"
            );
            assert!(
                !scope.affects_proxy(ProxyClass::Sidecar, "foo", &labels(&[("app", "c")])),
                "{kind:?}"
            );
            // Without the root namespace nothing is skipped.
            assert!(PushScope::new(&request).affects_proxy(ProxyClass::Sidecar, "bar", &none));
            let root = PushRequest::full(
                TriggerReason::Config,
                [ConfigKey::new(kind, "p", "istio-system")],
            );
            let scope = PushScope::new(&root).with_root_namespace("istio-system");
            assert!(
                scope.affects_proxy(ProxyClass::Sidecar, "bar", &none),
                "{kind:?}"
            );
        }
        // A namespace-wide AuthorizationPolicy or RequestAuthentication concerns its
        // namespace; a namespace-wide PeerAuthentication every proxy (clients' auto mTLS).
        for (kind, elsewhere) in [
            (ConfigKind::AuthorizationPolicy, false),
            (ConfigKind::RequestAuthentication, false),
            (ConfigKind::PeerAuthentication, true),
        ] {
            let key = ConfigKey::new(kind, "p", "foo");
            let request = PushRequest::full(TriggerReason::Config, [key.clone()]);
            let scope = PushScope::new(&request)
                .with_root_namespace("istio-system")
                .with_policy_selectors([(key.clone(), vec![None])].into());
            assert!(
                scope.affects_proxy(ProxyClass::Sidecar, "foo", &none),
                "{kind:?}"
            );
            assert_eq!(
                scope.affects_proxy(ProxyClass::Sidecar, "bar", &none),
                elsewhere,
                "{kind:?}"
            );
        }
        // Neither reaches clusters or endpoints; PeerAuthentication does (auto mTLS).
        for kind in [
            ConfigKind::AuthorizationPolicy,
            ConfigKind::RequestAuthentication,
        ] {
            let request =
                PushRequest::full(TriggerReason::Config, [ConfigKey::new(kind, "p", "foo")]);
            let scope = PushScope::new(&request);
            for class in CLASSES {
                for t in [TypeUrl::Cluster, TypeUrl::Endpoint] {
                    assert_eq!(
                        scope.touch(class, t),
                        Touch::Nothing,
                        "{kind:?} {class:?} {t:?}"
                    );
                }
                assert_eq!(scope.touch(class, TypeUrl::Listener), Touch::Everything);
            }
        }
        let pa = PushRequest::full(
            TriggerReason::Config,
            [ConfigKey::new(ConfigKind::PeerAuthentication, "p", "foo")],
        );
        assert_eq!(
            PushScope::new(&pa).touch(ProxyClass::Sidecar, TypeUrl::Cluster),
            Touch::Everything
        );
        // Any other changed object in the same push concerns everyone again.
        let mixed = PushRequest::full(
            TriggerReason::Config,
            [
                ConfigKey::new(ConfigKind::AuthorizationPolicy, "p", "foo"),
                ConfigKey::new(ConfigKind::VirtualService, "r", "baz"),
            ],
        );
        let scope = PushScope::new(&mixed).with_root_namespace("istio-system");
        assert!(scope.affects_proxy(ProxyClass::Sidecar, "bar", &none));
        let forced = PushRequest::forced(TriggerReason::Global);
        let scope = PushScope::new(&forced).with_root_namespace("istio-system");
        assert!(scope.affects_proxy(ProxyClass::Sidecar, "bar", &none));
    }

    #[test]
    fn mcp_types_are_touched_by_their_kind_and_synthesized_ones_by_the_registries() {
        use meshfed_registry::config::Kind;
        let t = |kind| TypeUrl::Mcp(McpType::preferred(McpKind::Config(kind)));
        let mesh = TypeUrl::Mcp(McpType::preferred(McpKind::MeshConfig));
        let touched = |request: &PushRequest, type_url| {
            PushScope::new(request).touch(ProxyClass::Sidecar, type_url) != Touch::Nothing
        };
        let vs = PushRequest::full(
            TriggerReason::Config,
            [ConfigKey::new(ConfigKind::VirtualService, "r", "ns")],
        );
        assert!(touched(&vs, t(Kind::VirtualService)));
        for other in [
            Kind::ServiceEntry,
            Kind::WorkloadEntry,
            Kind::DestinationRule,
        ] {
            assert!(!touched(&vs, t(other)), "{other}");
        }
        assert!(!touched(&vs, mesh));
        let key = ServiceKey::new("web.service.consul", "shop");
        let endpoints = PushRequest::endpoints(&key);
        assert!(touched(&endpoints, t(Kind::WorkloadEntry)));
        assert!(!touched(&endpoints, t(Kind::ServiceEntry)));
        let service = PushRequest::full(TriggerReason::Service, [ConfigKey::service(&key)]);
        assert!(touched(&service, t(Kind::ServiceEntry)));
        assert!(touched(&service, t(Kind::WorkloadEntry)));
        // Only the changed service's synthesized objects are regenerated.
        let scope = PushScope::new(&service);
        assert!(matches!(
            scope.touch(ProxyClass::Sidecar, t(Kind::WorkloadEntry)),
            Touch::Services(hosts) if hosts.contains("web.service.consul")
        ));
        assert_eq!(
            PushScope::new(&vs).touch(ProxyClass::Sidecar, t(Kind::VirtualService)),
            Touch::Everything
        );
        assert!(!touched(&service, t(Kind::VirtualService)));
        let mesh_change = PushRequest::full(
            TriggerReason::Global,
            [ConfigKey::new(ConfigKind::MeshConfig, "", "")],
        );
        assert!(touched(&mesh_change, mesh));
        assert!(touched(
            &PushRequest::full(TriggerReason::Global, []),
            t(Kind::Sidecar)
        ));
        // A ServiceEntry object edited in a store re-reads the config the index holds.
        let object = PushRequest::full(
            TriggerReason::Config,
            [ConfigKey::new(ConfigKind::ServiceEntry, "se", "ns")],
        );
        assert!(PushScope::new(&object).rebuilds_config());
        assert!(!PushScope::new(&service).rebuilds_config());
        let scope = PushScope::new(&endpoints);
        assert!(scope.touches_mcp(&[McpType::preferred(McpKind::Config(Kind::WorkloadEntry))]));
        assert!(!scope.touches_mcp(&[McpType::preferred(McpKind::Config(Kind::Gateway))]));
    }

    #[test]
    fn endpoint_changes_touch_eds_of_the_changed_services_only() {
        let request = PushRequest::endpoints(&ServiceKey::new("a.ns.svc.cluster.local", "ns"));
        let scope = PushScope::new(&request);
        for class in CLASSES {
            for t in TypeUrl::ALL {
                match scope.touch(class, t) {
                    Touch::Services(hosts) => {
                        assert_eq!(t, TypeUrl::Endpoint);
                        assert!(hosts.contains("a.ns.svc.cluster.local") && hosts.len() == 1);
                    }
                    // Workloads are endpoints: the Address type is rebuilt whole (Delta
                    // sends what changed).
                    Touch::Everything if t == TypeUrl::Address => {}
                    other => assert_eq!(other, Touch::Nothing, "{class:?} {t:?}"),
                }
            }
        }
        assert!(!scope.rebuilds_config() && !scope.remerges_services());
    }

    #[test]
    fn a_virtual_service_change_skips_a_sidecars_clusters_and_endpoints() {
        let request = PushRequest::full(
            TriggerReason::Config,
            [ConfigKey::new(ConfigKind::VirtualService, "r", "ns")],
        );
        let scope = PushScope::new(&request);
        let touched: Vec<TypeUrl> = TypeUrl::ALL
            .into_iter()
            .filter(|t| scope.touch(ProxyClass::Sidecar, *t) != Touch::Nothing)
            .collect();
        assert_eq!(touched, vec![TypeUrl::Listener, TypeUrl::Route]);
        for class in [ProxyClass::Router, ProxyClass::Grpc] {
            for t in TypeUrl::ALL {
                // Neither ambient type reads VirtualServices; extension configs read
                // WasmPlugins, EnvoyFilters and the mesh config only.
                let want = if matches!(
                    t,
                    TypeUrl::Secret
                        | TypeUrl::NameTable
                        | TypeUrl::Address
                        | TypeUrl::Authorization
                        | TypeUrl::ExtensionConfig
                ) {
                    Touch::Nothing
                } else {
                    Touch::Everything
                };
                assert_eq!(scope.touch(class, t), want, "{class:?} {t:?}");
            }
        }
        assert!(scope.rebuilds_config());
    }

    #[test]
    fn the_name_table_follows_services_and_sidecars_not_routing_config() {
        let touches = |key: ConfigKey, full: bool| {
            let request = if full {
                PushRequest::full(TriggerReason::Config, [key])
            } else {
                PushRequest::endpoints(&ServiceKey::new(&*key.name, &*key.namespace))
            };
            let scope = PushScope::new(&request);
            CLASSES
                .iter()
                .map(|c| scope.touch(*c, TypeUrl::NameTable) != Touch::Nothing)
                .collect::<Vec<bool>>()
        };
        for kind in [
            ConfigKind::VirtualService,
            ConfigKind::DestinationRule,
            ConfigKind::Gateway,
            ConfigKind::WorkloadEntry,
        ] {
            assert_eq!(
                touches(ConfigKey::new(kind, "x", "ns"), true),
                [false; 3],
                "{kind:?}"
            );
        }
        for kind in [
            ConfigKind::ServiceEntry,
            ConfigKind::Sidecar,
            ConfigKind::MeshConfig,
            ConfigKind::Workload,
        ] {
            assert_eq!(
                touches(ConfigKey::new(kind, "x", "ns"), true),
                [true; 3],
                "{kind:?}"
            );
        }
        let svc = ConfigKey::service(&ServiceKey::new("a.ns.svc.cluster.local", "ns"));
        assert_eq!(
            touches(svc, false),
            [false; 3],
            "endpoint-only pushes leave the table alone"
        );
    }

    #[test]
    fn a_service_change_keeps_other_services_clusters_and_rebuilds_the_rest() {
        let request = PushRequest::full(
            TriggerReason::Service,
            [ConfigKey::service(&ServiceKey::new("b.ns", "ns"))],
        );
        let scope = PushScope::new(&request);
        for class in CLASSES {
            for t in [TypeUrl::Cluster, TypeUrl::Endpoint] {
                assert!(matches!(scope.touch(class, t), Touch::Services(h) if h.contains("b.ns")));
            }
            for t in [TypeUrl::Listener, TypeUrl::Route] {
                assert_eq!(scope.touch(class, t), Touch::Everything);
            }
        }
        assert!(!scope.rebuilds_config() && scope.remerges_services());
    }

    #[test]
    fn a_secret_change_touches_sds_and_ecds_alone_and_rebuilds_nothing() {
        let request = PushRequest::full(
            TriggerReason::Secret,
            [ConfigKey::new(ConfigKind::Secret, "cert", "ns")],
        );
        let scope = PushScope::new(&request);
        for class in CLASSES {
            for t in TypeUrl::ALL {
                // ECDS carries WasmPlugins' image pull Secrets.
                let expected = if matches!(t, TypeUrl::Secret | TypeUrl::ExtensionConfig) {
                    Touch::Everything
                } else {
                    Touch::Nothing
                };
                assert_eq!(scope.touch(class, t), expected, "{class:?} {t:?}");
            }
        }
        assert!(!scope.rebuilds_config() && !scope.remerges_services());
        let gateway = PushRequest::full(
            TriggerReason::Config,
            [ConfigKey::new(ConfigKind::Gateway, "gw", "ns")],
        );
        let scope = PushScope::new(&gateway);
        assert_eq!(
            scope.touch(ProxyClass::Router, TypeUrl::Secret),
            Touch::Everything
        );
        let endpoints = PushRequest::endpoints(&ServiceKey::new("a", "ns"));
        let scope = PushScope::new(&endpoints);
        assert_eq!(
            scope.touch(ProxyClass::Router, TypeUrl::Secret),
            Touch::Nothing
        );
    }

    #[test]
    fn forced_and_unspecified_full_pushes_touch_everything() {
        for request in [
            PushRequest::forced(TriggerReason::Debug),
            PushRequest::full(TriggerReason::Service, []),
        ] {
            let scope = PushScope::new(&request);
            for class in CLASSES {
                for t in TypeUrl::ALL {
                    assert_eq!(scope.touch(class, t), Touch::Everything);
                }
            }
        }
    }
}

//! Server-side listeners of xDS-enabled gRPC servers, as Istio's grpc generator builds
//! them (`buildInboundListeners`).
//!
//! An xDS-enabled gRPC server asks LDS for the name its bootstrap's
//! `server_listener_resource_name_template` gives its serving address; Istio's agent
//! writes `xds.istio.io/grpc/lds/inbound/%s`, so the name is
//! `xds.istio.io/grpc/lds/inbound/<ip>:<port>`. The answer is a listener of that name
//! at that address when the server's workload is an instance of some service on that
//! port (no listener otherwise: the server does not serve). It has one filter chain:
//!
//! - **mTLS** (`inbound-mtls`) when the port's PeerAuthentication mode is STRICT: a
//!   `DownstreamTlsContext` requiring a client certificate, certificates from gRPC's
//!   certificate providers ([`super::tls`]). gRPC cannot tell TLS from plaintext on one
//!   port (its chain matches know only `raw_buffer`), so PERMISSIVE cannot be served as
//!   both: it is served as plaintext, or as mTLS when the workload is labelled
//!   `security.istio.io/tlsMode: istio` (sidecar clients then use auto mTLS to it).
//! - **plaintext** (`inbound-plaintext`) otherwise.
//!
//! The chain's HTTP connection manager has an inline route table `inbound` answering
//! every path with a non-forwarding action (the server handles the call itself) and
//! the filters: DENY RBAC (`envoy.filters.http.rbac.DENY`), ALLOW RBAC
//! (`envoy.filters.http.rbac`), router. gRPC's RBAC knows ALLOW and DENY, so AUDIT and
//! CUSTOM policies are not applied here, nor dry-run ones (gRPC ignores shadow rules);
//! each rule is a policy `<namespace>-<name>-<index>`.
//!
//! gRPC implements a subset of Envoy's RBAC (gRFC A41) and rejects the *whole listener*
//! over one matcher it does not know (a path template, a port range, a header named
//! `grpc-*` or `:scheme`, ...). Such a matcher is replaced so that the rule errs on the
//! safe side: a DENY rule matches more, an ALLOW rule matches less
//! ([`fit_permission`]). Where Istio's generator differs on purpose: an ALLOW policy
//! whose rules all fail to translate (or that has none) still installs the ALLOW
//! filter, which then denies what nothing allows, as on sidecars; Istio's leaves the
//! filter out.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{Address, SocketAddress, address, socket_address};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::config::rbac::v3::{
    Permission, Policy, Principal, Rbac, permission, principal, rbac,
};
use envoy_types::pb::envoy::config::route::v3::{
    HeaderMatcher, NonForwardingAction, Route, RouteConfiguration, RouteMatch, VirtualHost, route,
    route_match,
};
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_connection_manager, http_filter,
};
use meshfed_api::security::v1beta1::AuthorizationPolicy;
use meshfed_api::security::v1beta1::authorization_policy::Action;

use super::{RequestedPort, split_listener_name};
use crate::generate::authn::{self, MtlsMode};
use crate::generate::authz::{self, AuthzOptions, model};
use crate::generate::proto::pack;
use crate::model::{Proxy, ProxyClass};
use crate::push::cache::CacheInput;
use crate::push::config_index::Config;
use crate::push::snapshot::Snapshot;
use crate::xds::{EncodedResource, Resource, TypeUrl};

#[cfg(test)]
mod tests;

/// The prefix of the listener names xDS-enabled gRPC servers ask for (Istio's
/// `grpcxds.ServerListenerNamePrefix`).
pub const SERVER_LISTENER_PREFIX: &str = "xds.istio.io/grpc/lds/inbound/";
/// The ALLOW RBAC filter's name.
pub const RBAC_ALLOW_FILTER: &str = "envoy.filters.http.rbac";
/// The DENY RBAC filter's name (names in one HTTP connection manager are unique).
pub const RBAC_DENY_FILTER: &str = "envoy.filters.http.rbac.DENY";
/// The label that says a workload takes Istio mTLS (sidecar clients use auto mTLS).
const TLS_MODE_LABEL: &str = "security.istio.io/tlsMode";

/// Whether a requested listener name is a gRPC server's.
pub fn is_server_listener(name: &str) -> bool {
    name.starts_with(SERVER_LISTENER_PREFIX)
}

/// The listener a gRPC server asked for as `name`, or `None` when the name is not an
/// address or the proxy serves no service on that port.
pub fn server_listener(snapshot: &Snapshot, proxy: &Proxy, name: &str) -> Option<Resource> {
    let address = name.strip_prefix(SERVER_LISTENER_PREFIX)?;
    let (host, RequestedPort::Port(port)) = split_listener_name(address) else {
        tracing::debug!(listener = name, "gRPC server listener name without a port");
        return None;
    };
    let serves = crate::generate::instances::proxy_instances(snapshot, proxy)
        .iter()
        .any(|i| i.target_port == port);
    if !serves {
        tracing::debug!(
            node = %proxy.node_id, listener = name,
            "no service instance of this gRPC server on the port: no listener"
        );
        return None;
    }
    let input = GrpcServerInput {
        name: Arc::from(name),
        host: Arc::from(host),
        port,
        mode: server_mode(snapshot, proxy, port),
        namespace: Arc::from(proxy.namespace.as_str()),
        labels: Arc::new(proxy.labels.clone()),
    };
    snapshot.cached(input)
}

/// The chain a gRPC server's port gets: mTLS or plaintext (see the module docs for
/// PERMISSIVE).
fn server_mode(snapshot: &Snapshot, proxy: &Proxy, port: u16) -> ServerMode {
    let mode = authn::workload_mtls(snapshot, &proxy.namespace, &proxy.labels).port_mode(port);
    let istio_labelled = proxy.labels.get(TLS_MODE_LABEL).map(String::as_str) == Some("istio");
    match mode {
        MtlsMode::Strict => ServerMode::Mtls,
        MtlsMode::Permissive if istio_labelled => ServerMode::Mtls,
        MtlsMode::Permissive | MtlsMode::Disable => ServerMode::Plaintext,
    }
}

/// What a gRPC server's only filter chain accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServerMode {
    Mtls,
    Plaintext,
}

impl ServerMode {
    /// Istio's suffix of the chain's names.
    fn suffix(self) -> &'static str {
        match self {
            ServerMode::Mtls => "mtls",
            ServerMode::Plaintext => "plaintext",
        }
    }
}

/// The input of a gRPC server's listener, and its cache key: the name and address, the
/// chain's mode, and the workload that policies select by.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct GrpcServerInput {
    pub name: Arc<str>,
    pub host: Arc<str>,
    pub port: u16,
    pub mode: ServerMode,
    pub namespace: Arc<str>,
    pub labels: Arc<BTreeMap<String, String>>,
}

impl CacheInput<Snapshot> for GrpcServerInput {
    const TYPE: TypeUrl = TypeUrl::Listener;
    type Output = Resource;
    fn class(&self) -> Option<ProxyClass> {
        Some(ProxyClass::Grpc)
    }
    fn generate(&self, snapshot: &Snapshot) -> Option<Resource> {
        let filters = rbac_filters(snapshot, &self.namespace, &self.labels);
        let listener = listener(&self.name, &self.host, self.port, self.mode, filters);
        Some(EncodedResource::encode(
            TypeUrl::Listener,
            self.name.clone(),
            &listener,
        ))
    }
}

/// The listener `name` at `host:port` with one chain of `mode` whose HTTP connection
/// manager runs `rbac` then the router.
pub fn listener(
    name: &str,
    host: &str,
    port: u16,
    mode: ServerMode,
    rbac: Vec<HttpFilter>,
) -> Listener {
    let suffix = mode.suffix();
    let mut http_filters = rbac;
    http_filters.extend(super::http_filters(false));
    let hcm = HttpConnectionManager {
        // gRPC ignores it; Envoy's schema requires one.
        stat_prefix: format!("inbound_{port}"),
        http_filters,
        route_specifier: Some(http_connection_manager::RouteSpecifier::RouteConfig(
            inbound_routes(port),
        )),
        ..Default::default()
    };
    Listener {
        name: name.into(),
        address: Some(Address {
            address: Some(address::Address::SocketAddress(SocketAddress {
                address: host.into(),
                port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
                ..Default::default()
            })),
        }),
        filter_chains: vec![FilterChain {
            name: format!("inbound-{suffix}"),
            filters: vec![Filter {
                name: format!("inbound-hcm{suffix}"),
                config_type: Some(filter::ConfigType::TypedConfig(pack(&hcm))),
            }],
            transport_socket: (mode == ServerMode::Mtls).then(super::tls::downstream_socket),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The inline route table `inbound`: every call is handled by the server itself.
fn inbound_routes(port: u16) -> RouteConfiguration {
    RouteConfiguration {
        name: "inbound".into(),
        virtual_hosts: vec![VirtualHost {
            name: format!("inbound|http|{port}"),
            domains: vec!["*".into()],
            routes: vec![Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                    ..Default::default()
                }),
                action: Some(route::Action::NonForwardingAction(NonForwardingAction {})),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------
// RBAC

/// The RBAC filters of a gRPC server of `namespace` with `labels`: DENY (when some
/// rule denies), then ALLOW (when some ALLOW policy applies).
pub fn rbac_filters(
    snapshot: &Snapshot,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<HttpFilter> {
    let selected = authz::select_in(snapshot.config(), namespace, labels);
    if selected.is_empty() {
        return Vec::new();
    }
    for p in selected.audit.iter().chain(&selected.custom) {
        tracing::debug!(
            namespace = %p.namespace, name = %p.name,
            "AuthorizationPolicy not applied to a proxyless gRPC server (only ALLOW and DENY are)"
        );
    }
    let opts = AuthzOptions::from_mesh(&snapshot.mesh().config);
    let mut out = Vec::new();
    let deny = rules(&selected.deny, Action::Deny, &opts);
    if !deny.policies.is_empty() {
        out.push(rbac_filter(RBAC_DENY_FILTER, deny));
    }
    if selected.allow.iter().any(|p| !authz::is_dry_run(p)) {
        out.push(rbac_filter(
            RBAC_ALLOW_FILTER,
            rules(&selected.allow, Action::Allow, &opts),
        ));
    }
    out
}

fn rbac_filter(name: &str, rules: Rbac) -> HttpFilter {
    HttpFilter {
        name: name.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack(&HttpRbac {
            rules: Some(rules),
            ..Default::default()
        }))),
        ..Default::default()
    }
}

/// The RBAC rules of the enforced (not dry-run) policies of one action, one policy
/// per rule, each made something gRPC accepts.
fn rules(
    policies: &[Arc<Config<AuthorizationPolicy>>],
    action: Action,
    opts: &AuthzOptions,
) -> Rbac {
    let (rbac_action, effect) = match action {
        Action::Allow => (rbac::Action::Allow, model::Effect::Allow),
        _ => (rbac::Action::Deny, model::Effect::DenyOrAudit),
    };
    let mut out = Rbac {
        action: rbac_action as i32,
        policies: HashMap::new(),
        ..Default::default()
    };
    for p in policies {
        if authz::is_dry_run(p) {
            tracing::debug!(namespace = %p.namespace, name = %p.name,
                "dry-run AuthorizationPolicy not applied to a proxyless gRPC server");
            continue;
        }
        let name = |i: usize| format!("{}-{}-{i}", p.namespace, p.name);
        if p.spec.rules.is_empty() {
            // `rules: []` matches nothing (an ALLOW of it allows nothing).
            out.policies.insert(name(0), authz::never_matching());
            continue;
        }
        let target = model::Target {
            tcp: false,
            effect,
            namespace: &p.namespace,
            trust_domains: &opts.trust_domains,
            extended_jwt: opts.extended_jwt,
        };
        for (i, rule) in p.spec.rules.iter().enumerate() {
            match model::rule_policy(rule, &target) {
                Ok(mut policy) => {
                    if fit_policy(&mut policy, action != Action::Allow) {
                        tracing::warn!(
                            namespace = %p.namespace, name = %p.name, rule = i,
                            "AuthorizationPolicy rule uses a condition proxyless gRPC cannot \
                             check (path template, port range, grpc-* or :scheme header): on \
                             gRPC servers the {} rule matches {} requests",
                            action.as_str_name(),
                            if action == Action::Allow { "fewer" } else { "more" },
                        );
                    }
                    out.policies.insert(name(i), policy);
                }
                Err(e) => tracing::warn!(
                    namespace = %p.namespace, name = %p.name, rule = i,
                    "AuthorizationPolicy rule skipped for proxyless gRPC: {e}"
                ),
            }
        }
    }
    out
}

/// Replaces what gRPC's RBAC would reject in `policy`; `wider` when the rule may match
/// more than written (DENY), else less (ALLOW). True when something was replaced.
pub fn fit_policy(policy: &mut Policy, wider: bool) -> bool {
    let mut changed = false;
    for p in &mut policy.permissions {
        changed |= fit_permission(p, wider);
    }
    for p in &mut policy.principals {
        changed |= fit_principal(p, wider);
    }
    changed
}

/// A header gRPC refuses to match on (gRFC A41: its own `grpc-*` headers and
/// `:scheme`). Header names are case-insensitive; gRPC compares them lower-cased.
fn unmatchable_header(h: &HeaderMatcher) -> bool {
    let name = h.name.to_ascii_lowercase();
    name == ":scheme" || name.starts_with("grpc-")
}

/// `any` when the rule should match more, `not any` when less: a matcher gRPC cannot
/// evaluate stands for "always" or "never" depending on which side is safe.
fn permission_standing_in(matches: bool) -> Permission {
    let any = Permission {
        rule: Some(permission::Rule::Any(true)),
    };
    if matches {
        any
    } else {
        Permission {
            rule: Some(permission::Rule::NotRule(Box::new(any))),
        }
    }
}

fn principal_standing_in(matches: bool) -> Principal {
    let any = Principal {
        identifier: Some(principal::Identifier::Any(true)),
    };
    if matches {
        any
    } else {
        Principal {
            identifier: Some(principal::Identifier::NotId(Box::new(any))),
        }
    }
}

/// [`fit_policy`] for one permission. `wider`: whether this node matching more makes
/// the rule match more (flips under `not_rule`).
#[allow(deprecated)] // `metadata` is deprecated in Envoy, and gRPC accepts it.
pub fn fit_permission(p: &mut Permission, wider: bool) -> bool {
    use permission::Rule;
    let unsupported = match &mut p.rule {
        Some(Rule::AndRules(set) | Rule::OrRules(set)) => {
            return set
                .rules
                .iter_mut()
                .fold(false, |c, r| fit_permission(r, wider) | c);
        }
        Some(Rule::NotRule(inner)) => return fit_permission(inner, !wider),
        Some(Rule::Header(h)) => unmatchable_header(h),
        Some(
            Rule::DestinationPortRange(_)
            | Rule::Matcher(_)
            | Rule::UriTemplate(_)
            | Rule::SourcedMetadata(_),
        )
        | None => true,
        Some(
            Rule::Any(_)
            | Rule::UrlPath(_)
            | Rule::DestinationIp(_)
            | Rule::DestinationPort(_)
            | Rule::Metadata(_)
            | Rule::RequestedServerName(_),
        ) => false,
    };
    if unsupported {
        *p = permission_standing_in(wider);
    }
    unsupported
}

/// [`fit_permission`] for principals.
#[allow(deprecated)] // `source_ip` and `metadata` are deprecated in Envoy, and gRPC accepts them.
pub fn fit_principal(p: &mut Principal, wider: bool) -> bool {
    use principal::Identifier;
    let unsupported = match &mut p.identifier {
        Some(Identifier::AndIds(set) | Identifier::OrIds(set)) => {
            return set
                .ids
                .iter_mut()
                .fold(false, |c, r| fit_principal(r, wider) | c);
        }
        Some(Identifier::NotId(inner)) => return fit_principal(inner, !wider),
        Some(Identifier::Header(h)) => unmatchable_header(h),
        Some(
            Identifier::FilterState(_) | Identifier::SourcedMetadata(_) | Identifier::Custom(_),
        )
        | None => true,
        Some(
            Identifier::Any(_)
            | Identifier::Authenticated(_)
            | Identifier::SourceIp(_)
            | Identifier::DirectRemoteIp(_)
            | Identifier::RemoteIp(_)
            | Identifier::UrlPath(_)
            | Identifier::Metadata(_),
        ) => false,
    };
    if unsupported {
        *p = principal_standing_in(wider);
    }
    unsupported
}

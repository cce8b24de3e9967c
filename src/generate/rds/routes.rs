//! VirtualService translation: a VirtualService's HTTP routes as Envoy routes (matches
//! and destinations, weights, timeouts, retries, the default route of a service).

use std::net::IpAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::route::v3::{
    Decorator, RetryPolicy, Route, RouteAction, WeightedCluster, retry_policy, route, route_action,
    route_match, weighted_cluster,
};
use envoy_types::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use envoy_types::pb::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
use envoy_types::pb::envoy::r#type::matcher::v3::RegexMatchAndSubstitute;
use envoy_types::pb::google::protobuf::UInt32Value;
use meshfed_api::networking::v1alpha3::{
    self as istio, Destination, HttpMatchRequest, HttpRoute, VirtualService,
    load_balancer_settings::{ConsistentHashLb, LbPolicy, consistent_hash_lb::HashKey},
};
use meshfed_registry::{Port, Service};

use super::actions::*;
use super::matching::*;
use crate::model::{ClientView, Generator};
use crate::push::config_index::{Config, MESH_GATEWAY, fqdn};
use crate::push::snapshot::Snapshot;

/// Name of the route Istio generates for a service without a VirtualService.
pub const DEFAULT_ROUTE: &str = "default";
/// Name of the catch-all virtual host (and route) under ALLOW_ANY.
pub const ALLOW_ANY: &str = "allow_any";
/// Name of the catch-all virtual host (and route) under REGISTRY_ONLY.
pub const BLOCK_ALL: &str = "block_all";
/// The fault-injection HTTP filter (per-route config key).
pub const FAULT_FILTER: &str = "envoy.filters.http.fault";
/// The CORS HTTP filter (per-route config key).
pub const CORS_FILTER: &str = "envoy.filters.http.cors";
/// Istio's default `retry_on` (`retry.DefaultPolicy`).
pub const DEFAULT_RETRY_ON: &str =
    "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes";
/// Retry host predicate that prefers hosts not tried yet.
pub const PREVIOUS_HOSTS_PREDICATE: &str = "envoy.retry_host_predicates.previous_hosts";
/// Retry priority used by `retryRemoteLocalities`.
pub const PREVIOUS_PRIORITIES: &str = "envoy.retry_priorities.previous_priorities";
/// Istio's limit for direct response bodies (1 MiB).
pub const MAX_DIRECT_RESPONSE_BODY_BYTES: u32 = 1024 * 1024;

// ---------------------------------------------------------------------------------
// VirtualService translation

/// What route translation depends on besides the VirtualService.
pub(super) struct RouteCtx<'a> {
    pub(super) snapshot: &'a Snapshot,
    pub(super) proxy: &'a ClientView,
    /// The port of the listener (sidecar) or server (gateway) the routes are for.
    pub(super) listen_port: u16,
    /// `mesh`, or the `<ns>/<name>` of the gateway.
    pub(super) gateway: &'a str,
    /// The server terminates TLS (redirect scheme default).
    pub(super) tls: bool,
}

impl<'a> RouteCtx<'a> {
    pub(super) fn sidecar(snapshot: &'a Snapshot, proxy: &'a ClientView, port: u16) -> Self {
        RouteCtx {
            snapshot,
            proxy,
            listen_port: port,
            gateway: MESH_GATEWAY,
            tls: false,
        }
    }

    pub(super) fn is_gateway(&self) -> bool {
        self.gateway != MESH_GATEWAY
    }

    /// The service a destination host names: for gateways the one in the
    /// VirtualService's namespace if the proxy may see it, otherwise (and for
    /// sidecars) the one the proxy resolves.
    pub(super) fn lookup(&self, host: &str, vs_ns: &str) -> Option<&'a Arc<Service>> {
        let services = &self.snapshot.services();
        let proxy_ns = self.proxy.namespace.as_str();
        if self.is_gateway()
            && let Some(s) = services.resolve(host, vs_ns)
            && s.export_to.visible_to(s.namespace.as_str(), proxy_ns)
        {
            return Some(s);
        }
        services.resolve(host, proxy_ns)
    }

    pub(super) fn full_host(&self, host: &str, vs_ns: &str) -> String {
        fqdn(host, vs_ns, &self.snapshot.config().domain)
    }

    /// The cluster of a destination: `outbound|<port>|<subset>|<host>` where the port is
    /// the destination's, else this listener's port if the service has it, else the
    /// service's only port, else this listener's port.
    pub(super) fn destination_cluster(&self, dst: &Destination, vs_ns: &str) -> String {
        let mut host = self.full_host(&dst.host, vs_ns);
        let service = self.lookup(&host, vs_ns);
        let port = match dst.port.map(|p| p.number).filter(|n| *n != 0) {
            Some(n) => n,
            None => match service {
                Some(s) if s.port(self.listen_port).is_none() && s.ports.len() == 1 => {
                    u32::from(s.ports[0].port.get())
                }
                _ => u32::from(self.listen_port),
            },
        };
        // An alias (ExternalName) has no cluster: Istio routes to its target's.
        if let Some(target) = service.and_then(|s| s.alias_for.as_ref()) {
            host = target.to_string();
        }
        outbound_cluster_name(port, &dst.subset, &host)
    }

    /// The consistent-hash policy a DestinationRule asks for on a destination (most
    /// specific first: subset port-level, subset, port-level, rule-wide).
    pub(super) fn destination_hash(
        &self,
        dst: &Destination,
        vs_ns: &str,
    ) -> Option<ConsistentHashLb> {
        let host = self.full_host(&dst.host, vs_ns);
        let service_ns = self
            .lookup(&host, vs_ns)
            .map_or(self.proxy.namespace.as_str(), |s| s.namespace.as_str());
        let dr =
            self.snapshot
                .config()
                .destination_rule(&self.proxy.namespace, service_ns, &host)?;
        let explicit_port = dst.port.map(|p| p.number).filter(|n| *n != 0);
        let policy = dr.spec.traffic_policy.as_ref();
        let subset_policy = dr
            .spec
            .subsets
            .iter()
            .find(|s| s.name == dst.subset)
            .and_then(|s| s.traffic_policy.as_ref());
        let port_level = |tp: Option<&istio::TrafficPolicy>| {
            let port = explicit_port?;
            tp?.port_level_settings
                .iter()
                .find(|pls| pls.port.is_some_and(|p| p.number == port))
                .and_then(|pls| lb_hash(pls.load_balancer.as_ref()))
        };
        port_level(subset_policy)
            .or_else(|| subset_policy.and_then(|tp| lb_hash(tp.load_balancer.as_ref())))
            .or_else(|| port_level(policy))
            .or_else(|| policy.and_then(|tp| lb_hash(tp.load_balancer.as_ref())))
    }

    /// The consistent-hash policy for a service's default route (rule-wide, overridden
    /// by the port's settings).
    pub(super) fn service_hash(&self, service: &Service, port: u16) -> Option<ConsistentHashLb> {
        let dr = self.snapshot.config().destination_rule(
            &self.proxy.namespace,
            service.namespace.as_str(),
            service.hostname.as_str(),
        )?;
        let policy = dr.spec.traffic_policy.as_ref()?;
        policy
            .port_level_settings
            .iter()
            .find(|pls| pls.port.is_some_and(|p| p.number == u32::from(port)))
            .and_then(|pls| lb_hash(pls.load_balancer.as_ref()))
            .or_else(|| lb_hash(policy.load_balancer.as_ref()))
    }

    pub(super) fn default_retry(&self) -> Option<&'a istio::HttpRetry> {
        self.snapshot
            .mesh()
            .config
            .default_http_retry_policy
            .as_ref()
    }
}

pub(super) fn lb_hash(lb: Option<&istio::LoadBalancerSettings>) -> Option<ConsistentHashLb> {
    match lb?.lb_policy.as_ref()? {
        LbPolicy::ConsistentHash(h) => Some(h.clone()),
        LbPolicy::Simple(_) => None,
    }
}

/// `outbound|<port>|<subset>|<host>`.
pub(super) fn outbound_cluster_name(port: u32, subset: &str, host: &str) -> String {
    format!("outbound|{port}|{subset}|{host}")
}

/// The Envoy routes of a VirtualService for this context, in order; translation stops
/// after the first catch-all route (nothing after it can match).
pub(super) fn vs_routes(ctx: &RouteCtx<'_>, vs: &Config<VirtualService>) -> Vec<Route> {
    let mut out = Vec::new();
    for http in &vs.spec.http {
        let mut catch_all = false;
        if http.r#match.is_empty() {
            out.extend(translate_route(ctx, vs, http, None));
            catch_all = true;
        } else {
            for m in &http.r#match {
                if let Some(r) = translate_route(ctx, vs, http, Some(m)) {
                    let is_catch_all = is_catch_all(&r);
                    out.push(r);
                    if is_catch_all {
                        catch_all = true;
                        break;
                    }
                }
            }
        }
        if catch_all {
            break;
        }
    }
    out
}

/// Whether a match condition applies to this proxy: the gateways it names include
/// this one, or (when it names none) the proxy has its source labels and namespace.
pub(super) fn source_matches(ctx: &RouteCtx<'_>, vs_ns: &str, m: &HttpMatchRequest) -> bool {
    if !m.gateways.is_empty() {
        return m.gateways.iter().any(|g| {
            if g == MESH_GATEWAY || g.contains('/') {
                g == ctx.gateway
            } else {
                format!("{vs_ns}/{g}") == ctx.gateway
            }
        });
    }
    m.source_labels
        .iter()
        .all(|(k, v)| ctx.proxy.labels.get(k) == Some(v))
        && (m.source_namespace.is_empty() || m.source_namespace == ctx.proxy.namespace)
}

pub(super) fn translate_route(
    ctx: &RouteCtx<'_>,
    vs: &Config<VirtualService>,
    http: &HttpRoute,
    m: Option<&HttpMatchRequest>,
) -> Option<Route> {
    if let Some(m) = m {
        if m.port != 0 && m.port != u32::from(ctx.listen_port) {
            return None;
        }
        if !source_matches(ctx, &vs.namespace, m) {
            return None;
        }
    }
    let name = match m {
        Some(m) if !m.name.is_empty() => format!("{}.{}", http.name, m.name),
        _ => http.name.clone(),
    };
    let mut out = Route {
        name,
        r#match: Some(translate_match(m)),
        metadata: Some(config_metadata(vs)),
        ..Default::default()
    };
    if let Some(m) = m
        && !m.stat_prefix.is_empty()
    {
        out.stat_prefix = m.stat_prefix.clone();
    }
    let mut authority = String::new();
    if let Some(headers) = &http.headers {
        let ops = header_operations(headers);
        out.request_headers_to_add = ops.request_add;
        out.response_headers_to_add = ops.response_add;
        out.request_headers_to_remove = ops.request_remove;
        out.response_headers_to_remove = ops.response_remove;
        authority = ops.authority;
    }
    if let Some(redirect) = &http.redirect {
        out.action = Some(redirect_action(redirect, ctx.listen_port, ctx.tls)?);
    } else if let Some(direct) = &http.direct_response {
        out.action = Some(direct_response_action(direct));
    } else {
        let action = route_destination(ctx, vs, http, &mut out, authority)?;
        out.action = Some(route::Action::Route(action));
    }
    out.decorator = Some(Decorator {
        operation: route_operation(&out, &vs.name, ctx.listen_port),
        ..Default::default()
    });
    if let Some(fault) = http.fault.as_ref().and_then(translate_fault) {
        out.typed_per_filter_config
            .insert(FAULT_FILTER.to_string(), any(&fault));
    }
    if let Some(cors) = &http.cors_policy {
        out.typed_per_filter_config
            .insert(CORS_FILTER.to_string(), any(&translate_cors(cors)));
    }
    Some(out)
}

/// The route action for forwarding: clusters, timeout, rewrites, mirrors, retries and
/// hash policies; per-destination header operations go on the route (one destination)
/// or on each weighted cluster. `None` when there is nowhere to forward to.
pub(super) fn route_destination(
    ctx: &RouteCtx<'_>,
    vs: &Config<VirtualService>,
    http: &HttpRoute,
    out: &mut Route,
    mut authority: String,
) -> Option<RouteAction> {
    let vs_ns = vs.namespace.as_str();
    let mut action = RouteAction::default();
    // Istio's gateway semantics (a VirtualService translated from the Gateway API): a
    // backend with no cluster (not found, not permitted) answers 500.
    if vs
        .annotations
        .get("internal.istio.io/route-semantics")
        .is_some_and(|s| s == "gateway")
    {
        action.cluster_not_found_response_code =
            route_action::ClusterNotFoundResponseCode::InternalServerError as i32;
    }
    set_timeout(
        &mut action,
        http.timeout.as_ref(),
        ctx.proxy.generator == Generator::Grpc,
    );
    if let Some(rewrite) = &http.rewrite {
        if let Some(rr) = &rewrite.uri_regex_rewrite {
            action.regex_rewrite = Some(RegexMatchAndSubstitute {
                pattern: Some(regex_matcher(&rr.r#match)),
                substitution: rr.rewrite.clone(),
            });
        } else if !rewrite.uri.is_empty() {
            action.prefix_rewrite = rewrite.uri.clone();
        }
        if !rewrite.authority.is_empty() {
            authority = rewrite.authority.clone();
        }
    }
    if !authority.is_empty() {
        action.host_rewrite_specifier = Some(
            route_action::HostRewriteSpecifier::HostRewriteLiteral(authority),
        );
    }
    if let Some(mirror) = &http.mirror
        && let Some(fraction) = mirror_percent(http)
    {
        action.request_mirror_policies.push(mirror_policy(
            ctx.destination_cluster(mirror, vs_ns),
            fraction,
        ));
    }
    for mirror in &http.mirrors {
        if let (Some(dst), Some(fraction)) = (&mirror.destination, mirror_policy_percent(mirror)) {
            action
                .request_mirror_policies
                .push(mirror_policy(ctx.destination_cluster(dst, vs_ns), fraction));
        }
    }

    let mut consistent_hash = false;
    match http.route.as_slice() {
        [] => return None,
        [single] => {
            let dst = single.destination.as_ref()?;
            action.cluster_specifier = Some(route_action::ClusterSpecifier::Cluster(
                ctx.destination_cluster(dst, vs_ns),
            ));
            if let Some(headers) = &single.headers {
                let ops = header_operations(headers);
                out.request_headers_to_add.extend(ops.request_add);
                out.request_headers_to_remove.extend(ops.request_remove);
                out.response_headers_to_add.extend(ops.response_add);
                out.response_headers_to_remove.extend(ops.response_remove);
                if !ops.authority.is_empty() && action.host_rewrite_specifier.is_none() {
                    action.host_rewrite_specifier = Some(
                        route_action::HostRewriteSpecifier::HostRewriteLiteral(ops.authority),
                    );
                }
            }
            if let Some(hash) = ctx.destination_hash(dst, vs_ns) {
                action.hash_policy.extend(hash_policy(&hash));
                consistent_hash = true;
            }
        }
        many => {
            let mut clusters = Vec::new();
            // Zero-weight destinations are left out when there are others.
            for rd in many.iter().filter(|rd| rd.weight != 0) {
                let dst = rd.destination.as_ref()?;
                let mut cw = weighted_cluster::ClusterWeight {
                    name: ctx.destination_cluster(dst, vs_ns),
                    weight: Some(UInt32Value {
                        value: rd.weight.max(0) as u32,
                    }),
                    ..Default::default()
                };
                if let Some(headers) = &rd.headers {
                    let ops = header_operations(headers);
                    cw.request_headers_to_add = ops.request_add;
                    cw.request_headers_to_remove = ops.request_remove;
                    cw.response_headers_to_add = ops.response_add;
                    cw.response_headers_to_remove = ops.response_remove;
                    if !ops.authority.is_empty() {
                        cw.host_rewrite_specifier = Some(
                            weighted_cluster::cluster_weight::HostRewriteSpecifier::HostRewriteLiteral(
                                ops.authority,
                            ),
                        );
                    }
                }
                if let Some(hash) = ctx.destination_hash(dst, vs_ns) {
                    action.hash_policy.extend(hash_policy(&hash));
                }
                clusters.push(cw);
            }
            if clusters.is_empty() {
                return None;
            }
            action.cluster_specifier = Some(route_action::ClusterSpecifier::WeightedClusters(
                WeightedCluster {
                    clusters,
                    ..Default::default()
                },
            ));
        }
    }
    let policy = http.retries.as_ref().or(ctx.default_retry());
    action.retry_policy = retry_policy(policy, consistent_hash);
    Some(action)
}

/// The route for a service without a VirtualService: everything to its cluster, with
/// the mesh's default retry policy and no timeout.
pub(super) fn default_route(ctx: &RouteCtx<'_>, service: &Service, port: &Port) -> Route {
    let number = port.port.get();
    let hostname = service.hostname.as_str();
    let mut action = RouteAction {
        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
            crate::xds::names::outbound_name(number, "", hostname),
        )),
        retry_policy: retry_policy(ctx.default_retry(), false),
        ..Default::default()
    };
    if let Some(hash) = ctx.service_hash(service, number) {
        action.hash_policy = hash_policy(&hash).into_iter().collect();
    }
    set_timeout(&mut action, None, false);
    Route {
        name: DEFAULT_ROUTE.to_string(),
        r#match: Some(translate_match(None)),
        decorator: Some(Decorator {
            operation: format!("{}/*", join_host_port(hostname, number)),
            ..Default::default()
        }),
        action: Some(route::Action::Route(action)),
        ..Default::default()
    }
}

/// Istio's `setTimeout`: the VirtualService's timeout or 0 (disabled); gRPC's
/// per-stream limit follows it (`max_stream_duration` for proxyless clients, the
/// deprecated `max_grpc_timeout` for Envoy, which Istio still uses).
#[allow(deprecated)]
pub(super) fn set_timeout(
    action: &mut RouteAction,
    timeout: Option<&meshfed_api::Duration>,
    grpc: bool,
) {
    let t = timeout.map(pb_duration).unwrap_or_default();
    action.timeout = Some(t);
    if grpc {
        action.max_stream_duration = Some(route_action::MaxStreamDuration {
            max_stream_duration: Some(t),
            ..Default::default()
        });
    } else {
        action.max_grpc_timeout = Some(t);
    }
}

/// Istio's `retry.ConvertPolicy`: `None` input gives the default policy (2 retries on
/// connect failures, refused streams, `unavailable`, `cancelled` and 503, preferring
/// hosts not tried yet unless consistent hashing pins the host); `attempts <= 0`
/// disables retries; otherwise the default with the given attempts, `retryOn` (status
/// codes in it become retriable status codes) and per-try timeout.
pub fn retry_policy(
    input: Option<&istio::HttpRetry>,
    consistent_hash: bool,
) -> Option<RetryPolicy> {
    let mut out = RetryPolicy {
        num_retries: Some(UInt32Value { value: 2 }),
        retry_on: DEFAULT_RETRY_ON.to_string(),
        host_selection_retry_max_attempts: 5,
        retriable_status_codes: vec![503],
        ..Default::default()
    };
    if !consistent_hash {
        out.retry_host_predicate = vec![retry_policy::RetryHostPredicate {
            name: PREVIOUS_HOSTS_PREDICATE.to_string(),
            config_type: Some(retry_policy::retry_host_predicate::ConfigType::TypedConfig(
                any(&PreviousHostsPredicate {}),
            )),
        }];
    }
    let Some(input) = input else {
        return Some(out);
    };
    if input.attempts <= 0 {
        return None;
    }
    out.num_retries = Some(UInt32Value {
        value: input.attempts as u32,
    });
    if !input.retry_on.is_empty() {
        let (retry_on, codes) = parse_retry_on(&input.retry_on);
        out.retry_on = retry_on;
        if !codes.is_empty() && !out.retry_on.contains("retriable-status-codes") {
            if !out.retry_on.is_empty() {
                out.retry_on.push(',');
            }
            out.retry_on.push_str("retriable-status-codes");
        }
        out.retriable_status_codes = codes;
    }
    if let Some(t) = &input.per_try_timeout {
        out.per_try_timeout = Some(pb_duration(t));
    }
    if input.retry_remote_localities.is_some_and(|b| b.value) {
        out.retry_priority = Some(retry_policy::RetryPriority {
            name: PREVIOUS_PRIORITIES.to_string(),
            config_type: Some(retry_policy::retry_priority::ConfigType::TypedConfig(any(
                &PreviousPrioritiesConfig {
                    update_frequency: 2,
                },
            ))),
        });
    }
    Some(out)
}

/// Splits `retryOn` into Envoy conditions and HTTP status codes.
pub(super) fn parse_retry_on(retry_on: &str) -> (String, Vec<u32>) {
    let mut conditions = Vec::new();
    let mut codes = Vec::new();
    for part in retry_on.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse::<u32>() {
            Ok(code) if (100..600).contains(&code) => codes.push(code),
            _ => conditions.push(part),
        }
    }
    (conditions.join(","), codes)
}

pub(super) fn hash_policy(hash: &ConsistentHashLb) -> Option<route_action::HashPolicy> {
    use route_action::hash_policy::{self, PolicySpecifier};
    let specifier = match hash.hash_key.as_ref()? {
        HashKey::HttpHeaderName(name) => PolicySpecifier::Header(hash_policy::Header {
            header_name: name.clone(),
            ..Default::default()
        }),
        HashKey::HttpCookie(cookie) => PolicySpecifier::Cookie(hash_policy::Cookie {
            name: cookie.name.clone(),
            ttl: cookie.ttl.as_ref().map(pb_duration),
            path: cookie.path.clone(),
            ..Default::default()
        }),
        HashKey::UseSourceIp(source_ip) => {
            PolicySpecifier::ConnectionProperties(hash_policy::ConnectionProperties {
                source_ip: *source_ip,
            })
        }
        HashKey::HttpQueryParameterName(name) => {
            PolicySpecifier::QueryParameter(hash_policy::QueryParameter { name: name.clone() })
        }
    };
    Some(route_action::HashPolicy {
        policy_specifier: Some(specifier),
        ..Default::default()
    })
}

/// Whether a route matches every request (prefix `/` or regex `.*`, no other
/// condition).
pub(super) fn is_catch_all(r: &Route) -> bool {
    let Some(m) = &r.r#match else {
        return false;
    };
    let path_all = match &m.path_specifier {
        Some(route_match::PathSpecifier::Prefix(p)) => p == "/",
        Some(route_match::PathSpecifier::PathSeparatedPrefix(p)) => p == "/",
        Some(route_match::PathSpecifier::SafeRegex(r)) => r.regex == ".*",
        _ => false,
    };
    path_all
        && m.headers.is_empty()
        && m.query_parameters.is_empty()
        && m.dynamic_metadata.is_empty()
}

/// Istio's `GetRouteOperation`: `host:port<path>` for one cluster, else
/// `<virtual service>:<port><path>`.
pub(super) fn route_operation(r: &Route, vs_name: &str, port: u16) -> String {
    let path = match r.r#match.as_ref().and_then(|m| m.path_specifier.as_ref()) {
        Some(route_match::PathSpecifier::Prefix(p)) => format!("{p}*"),
        Some(route_match::PathSpecifier::Path(p)) => p.clone(),
        Some(route_match::PathSpecifier::SafeRegex(r)) => r.regex.clone(),
        _ => "/*".to_string(),
    };
    if let Some(route::Action::Route(RouteAction {
        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(c)),
        ..
    })) = &r.action
        && let Some(parsed) = crate::xds::names::ClusterName::parse(c)
    {
        return format!("{}:{}{path}", parsed.hostname, parsed.port);
    }
    format!("{vs_name}:{port}{path}")
}

/// `host:port`, bracketing an IPv6 address.
pub(super) fn join_host_port(host: &str, port: u16) -> String {
    format!("{}:{port}", ipv6_compliant(host))
}

pub(super) fn ipv6_compliant(host: &str) -> String {
    if host.contains(':') && host.parse::<IpAddr>().is_ok() {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

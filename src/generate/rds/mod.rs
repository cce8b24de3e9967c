//! RDS: the HTTP route tables of sidecars and gateways, built the way Istio builds
//! them (`pilot/pkg/networking/core/httproute.go`, `route/route.go`, `gateway.go`).
//!
//! **Sidecars** (route name `"<port>"`): one virtual host per visible HTTP (or
//! protocol-sniffed) service that has the port, named `<fqdn>:<port>`, whose domains
//! are every name a client in the proxy's namespace may use for it (see
//! [`virtual_host_domains`]). A service whose VirtualService (bound to `mesh`, chosen by
//! [`ConfigIndex::virtual_service_for_host`]) yields routes for this proxy and port gets
//! those routes, in order, and nothing else: as in Istio, a request no VirtualService
//! route matches gets a 404 (there is no fallback route). A service without one, or
//! whose VirtualService yields no route for this proxy (every match is for another
//! port, other source labels or another gateway), gets the single `default` route to
//! `outbound|<port>||<fqdn>`. VirtualService hosts that are not services on this port
//! (`bookinfo.com`) get a virtual host of their own, on the ports of the services the
//! VirtualService routes, or on port 80 when it routes none. Domains are
//! de-duplicated across virtual hosts (Envoy rejects duplicates), virtual hosts are
//! sorted by name, and a last catch-all virtual host (`*`) sends everything else to
//! `PassthroughCluster` (`allow_any`, outbound traffic policy ALLOW_ANY) or answers
//! 502 (`block_all`, REGISTRY_ONLY).
//!
//! **Gateways** (route name `http.<port>[.<bind>]`, or
//! `https.<port>.<portName>.<gateway>.<namespace>[.<bind>]` for a terminated HTTPS
//! server): for every server of the Gateways selecting the router whose route name this
//! is, the VirtualServices bound to that gateway (`<ns>/<name>`) whose hosts intersect
//! the server's hosts add their routes to a virtual host per intersecting host
//! (`<host>:<port>`); a server with `tls.httpsRedirect` makes its virtual hosts require
//! TLS (Envoy answers plain HTTP with a 301 to https).
//!
//! Route translation covers matches (uri, headers, `withoutHeaders`, method,
//! authority, scheme, query parameters, port, source labels/namespace, gateways,
//! `ignoreUriCase`), single and weighted destinations, retries (mesh default when
//! unset), timeouts, fault injection, mirrors, rewrites, redirects, direct responses,
//! header operations, CORS and DestinationRule consistent-hash policies.

mod actions;
mod gateway;
mod matching;
mod routes;
mod sidecar;

pub use gateway::*;
#[cfg(test)]
use matching::*;
pub use routes::*;
pub use sidecar::*;

#[cfg(test)]
use std::collections::BTreeMap;
#[cfg(test)]
use std::sync::Arc;

#[cfg(test)]
use envoy_types::pb::envoy::config::core::v3::{
    data_source, header_value_option::HeaderAppendAction,
};
#[cfg(test)]
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, VirtualHost, route, route_action, route_match,
    virtual_host,
};
#[cfg(test)]
use envoy_types::pb::envoy::extensions::filters::common::fault::v3::fault_delay;
#[cfg(test)]
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy as CorsFilterPolicy;
#[cfg(test)]
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{HttpFault, fault_abort};
#[cfg(test)]
use envoy_types::pb::envoy::r#type::matcher::v3::{
    MetadataMatcher, RegexMatcher, StringMatcher, string_matcher,
};
#[cfg(test)]
use envoy_types::pb::envoy::r#type::v3::fractional_percent::DenominatorType;
#[cfg(test)]
use envoy_types::pb::google::protobuf::{
    Any, BoolValue, Duration as PbDuration, UInt32Value, value::Kind,
};
#[cfg(test)]
use meshfed_api::mesh::v1alpha1::mesh_config::outbound_traffic_policy::Mode as MeshOutboundMode;
#[cfg(test)]
use meshfed_api::networking::v1alpha3::{
    self as istio, Destination, HttpMatchRequest, HttpRoute, StringMatch, VirtualService,
    http_body, http_fault_injection, http_redirect,
    load_balancer_settings::{ConsistentHashLb, LbPolicy, consistent_hash_lb::HashKey},
    outbound_traffic_policy::Mode as SidecarOutboundMode,
    string_match::MatchType,
};
#[cfg(test)]
use meshfed_registry::{Port, Protocol, ProviderId, Resolution, Service};
#[cfg(test)]
use prost::{Message, Name};

#[cfg(test)]
use crate::generate::merged_gateway::MergedGateway;
#[cfg(test)]
use crate::push::config_index::Config;
#[cfg(test)]
use crate::push::snapshot::Snapshot;

#[cfg(any(test, feature = "testing"))]
/// Every cluster a route table refers to (a test oracle).
pub fn referenced_clusters(
    config: &envoy_types::pb::envoy::config::route::v3::RouteConfiguration,
) -> Vec<String> {
    use envoy_types::pb::envoy::config::route::v3::{route, route_action};
    let mut out = Vec::new();
    for vh in &config.virtual_hosts {
        for p in &vh.request_mirror_policies {
            out.push(p.cluster.clone());
        }
        for r in &vh.routes {
            if let Some(route::Action::Route(a)) = &r.action {
                match &a.cluster_specifier {
                    Some(route_action::ClusterSpecifier::Cluster(c)) => out.push(c.clone()),
                    Some(route_action::ClusterSpecifier::WeightedClusters(w)) => {
                        out.extend(w.clusters.iter().map(|c| c.name.clone()))
                    }
                    _ => {}
                }
                out.extend(
                    a.request_mirror_policies
                        .iter()
                        .filter(|p| !p.cluster.is_empty())
                        .map(|p| p.cluster.clone()),
                );
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use crate::model::Proxy;
    use meshfed_api::networking::v1alpha3::server_tls_settings::TlSmode;
    use meshfed_api::networking::v1alpha3::{Gateway, Server};
    use std::time::{Duration, SystemTime};

    use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
    use envoy_types::pb::envoy::config::core::v3::Node;
    use meshfed_api::mesh::v1alpha1::mesh_config;
    use meshfed_api::networking::v1alpha3::{
        CorsPolicy, DestinationRule, Headers, HttpDirectResponse, HttpFaultInjection,
        HttpMirrorPolicy, HttpRedirect, HttpRetry, HttpRewrite, HttpRouteDestination,
        LoadBalancerSettings, OutboundTrafficPolicy, Percent, PortSelector, ServerTlsSettings,
        Sidecar, TrafficPolicy, headers::HeaderOperations,
    };
    use meshfed_registry::{
        Aggregate, EndpointIndex, MemoryRegistry, PushRequest, TriggerReason, UpdateSink,
    };

    use super::*;
    use crate::generate::simulate::{self, Request, RouteOutcome, SimError};
    use crate::mesh::{MeshSettings, default_mesh_config};
    use crate::model::proxy::json_to_struct;
    use crate::push::config_index::{ConfigIndex, ConfigSet};

    const REVIEWS: &str = "reviews.default.svc.cluster.local";
    const RATINGS: &str = "ratings.default.svc.cluster.local";
    const PRODUCTPAGE: &str = "productpage.default.svc.cluster.local";

    fn service(host: &str, ns: &str, ports: &[(u16, Protocol)], vip: Option<&str>) -> Service {
        let mut s = Service::new(host, ns, ProviderId::Mock, "c1");
        for (i, (p, proto)) in ports.iter().enumerate() {
            s.ports
                .push(Port::new(&format!("port-{i}"), *p, *proto).unwrap());
        }
        if let Some(ip) = vip {
            s.cluster_vips
                .insert("c1".into(), vec![ip.parse().unwrap()]);
        }
        s
    }

    fn bookinfo() -> Vec<Service> {
        vec![
            service(
                PRODUCTPAGE,
                "default",
                &[(9080, Protocol::Http)],
                Some("10.0.0.1"),
            ),
            service(
                REVIEWS,
                "default",
                &[(9080, Protocol::Http)],
                Some("10.0.0.2"),
            ),
            service(
                RATINGS,
                "default",
                &[(9080, Protocol::Http)],
                Some("10.0.0.3"),
            ),
        ]
    }

    fn mesh() -> MeshSettings {
        MeshSettings {
            config: default_mesh_config(),
            ..Default::default()
        }
    }

    fn registry_only_mesh() -> MeshSettings {
        let mut m = mesh();
        m.config.outbound_traffic_policy = Some(mesh_config::OutboundTrafficPolicy {
            mode: MeshOutboundMode::RegistryOnly as i32,
        });
        m
    }

    fn snapshot_with(
        services: Vec<Service>,
        kube_services: Vec<Service>,
        set: ConfigSet,
        mesh: MeshSettings,
    ) -> Snapshot {
        let index = Arc::new(EndpointIndex::new());
        let (sink, _events) = UpdateSink::new(index.clone());
        let aggregate = Aggregate::new("c1");
        let registry = MemoryRegistry::new("c1", sink.clone());
        for s in services {
            registry.add_service(s);
        }
        aggregate.add_registry(Arc::new(registry));
        if !kube_services.is_empty() {
            let kube = MemoryRegistry::with_provider(ProviderId::Kubernetes, "c1", sink);
            for s in kube_services {
                kube.add_service(s);
            }
            kube.mark_synced();
            aggregate.add_registry(Arc::new(kube));
        }
        Snapshot::build(
            &Snapshot::empty(),
            &crate::xds::deps::PushScope::new(&PushRequest::forced(TriggerReason::Global)),
            &aggregate,
            &index,
            Arc::new(mesh),
            &|m| ConfigIndex::new(set.clone(), "cluster.local", m),
            1,
        )
    }

    fn snapshot(services: Vec<Service>, set: ConfigSet) -> Snapshot {
        snapshot_with(services, Vec::new(), set, mesh())
    }

    fn node(kind: &str, ns: &str, labels: &[(&str, &str)], generator: Option<&str>) -> Proxy {
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
            .collect();
        let mut meta = serde_json::json!({"NAMESPACE": ns, "CLUSTER_ID": "c1", "LABELS": labels});
        if let Some(g) = generator {
            meta["GENERATOR"] = g.into();
        }
        let node = Node {
            id: format!("{kind}~10.1.1.1~pod.{ns}~{ns}.svc.cluster.local"),
            metadata: Some(json_to_struct(&meta)),
            ..Default::default()
        };
        Proxy::from_node(Some(&node)).unwrap()
    }

    /// Two sidecars alike but for their DNS domain get the short names each domain
    /// gives (Istio builds a proxy's virtual host domains from its own DNS domain): the
    /// route table input carries the domain, so the second is not served the first's
    /// cached table.
    #[test]
    fn route_tables_follow_the_proxy_dns_domain() {
        use crate::generate::{GeneratorOptions, Scope, Subscription, generate};
        use crate::xds::TypeUrl;
        use prost::Message;
        let snap = snapshot(
            vec![service(
                "reviews.default.svc.cluster.local",
                "default",
                &[(9080, Protocol::Http)],
                None,
            )],
            ConfigSet::default(),
        );
        let in_domain = |domain: &str| {
            let node = Node {
                id: format!("sidecar~10.1.1.1~pod.default~{domain}"),
                metadata: Some(json_to_struct(
                    &serde_json::json!({"NAMESPACE": "default", "CLUSTER_ID": "c1"}),
                )),
                ..Default::default()
            };
            Proxy::from_node(Some(&node)).unwrap()
        };
        let names = BTreeSet::from(["9080".to_string()]);
        let domains = |proxy: &Proxy| -> Vec<String> {
            let routes = generate(
                TypeUrl::Route,
                &snap,
                proxy,
                Subscription {
                    wildcard: false,
                    names: &names,
                    interned: None,
                },
                Scope::All,
                &GeneratorOptions::default(),
            );
            let rc = RouteConfiguration::decode(routes[0].body.value.clone()).unwrap();
            rc.virtual_hosts
                .iter()
                .find(|vh| {
                    vh.domains
                        .iter()
                        .any(|d| d.starts_with("reviews.default.svc"))
                })
                .unwrap()
                .domains
                .clone()
        };
        let own = domains(&in_domain("default.svc.cluster.local"));
        assert!(own.contains(&"reviews".to_string()), "{own:?}");
        let other = domains(&in_domain("other.svc.cluster.local"));
        assert!(!other.contains(&"reviews".to_string()), "{other:?}");
        assert!(other.contains(&"reviews.default".to_string()), "{other:?}");
    }

    fn sidecar(ns: &str, labels: &[(&str, &str)]) -> Proxy {
        node("sidecar", ns, labels, None)
    }

    fn router() -> Proxy {
        node(
            "router",
            "istio-system",
            &[("istio", "ingressgateway")],
            None,
        )
    }

    fn cfg<T>(ns: &str, name: &str, age: u64, spec: T) -> Config<T> {
        Config {
            name: name.into(),
            namespace: ns.into(),
            labels: BTreeMap::new(),
            annotations: Default::default(),
            creation_time: SystemTime::UNIX_EPOCH + Duration::from_secs(10_000 - age),
            spec,
        }
    }

    fn vs(hosts: &[&str], http: Vec<HttpRoute>) -> VirtualService {
        VirtualService {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            http,
            ..Default::default()
        }
    }

    fn vs_set(list: Vec<Config<VirtualService>>) -> ConfigSet {
        ConfigSet {
            virtual_services: list,
            ..Default::default()
        }
    }

    fn dest(host: &str, subset: &str) -> HttpRouteDestination {
        HttpRouteDestination {
            destination: Some(Destination {
                host: host.into(),
                subset: subset.into(),
                port: None,
            }),
            ..Default::default()
        }
    }

    fn weighted(host: &str, subset: &str, weight: i32) -> HttpRouteDestination {
        HttpRouteDestination {
            weight,
            ..dest(host, subset)
        }
    }

    fn to(route: Vec<HttpRouteDestination>) -> HttpRoute {
        HttpRoute {
            route,
            ..Default::default()
        }
    }

    fn when(m: HttpMatchRequest, route: Vec<HttpRouteDestination>) -> HttpRoute {
        HttpRoute {
            r#match: vec![m],
            route,
            ..Default::default()
        }
    }

    fn sm(t: MatchType) -> StringMatch {
        StringMatch {
            match_type: Some(t),
        }
    }

    fn exact(s: &str) -> StringMatch {
        sm(MatchType::Exact(s.into()))
    }

    fn uri(t: MatchType) -> HttpMatchRequest {
        HttpMatchRequest {
            uri: Some(sm(t)),
            ..Default::default()
        }
    }

    fn header(name: &str, value: StringMatch) -> HttpMatchRequest {
        HttpMatchRequest {
            headers: BTreeMap::from([(name.to_string(), value)]),
            ..Default::default()
        }
    }

    fn outbound(port: u16, subset: &str, host: &str) -> String {
        format!("outbound|{port}|{subset}|{host}")
    }

    fn lands(rc: &RouteConfiguration, req: Request) -> RouteOutcome {
        simulate::route(rc, &req).unwrap_or_else(|e| panic!("{req:?}: {e}"))
    }

    fn cluster(rc: &RouteConfiguration, req: Request) -> String {
        match lands(rc, req) {
            RouteOutcome::Cluster(c) => c,
            other => panic!("expected one cluster, got {other:?}"),
        }
    }

    fn matched(rc: &RouteConfiguration, req: Request) -> &Route {
        simulate::resolve(rc, &req).unwrap().route.unwrap()
    }

    fn action(r: &Route) -> &RouteAction {
        match &r.action {
            Some(route::Action::Route(a)) => a,
            other => panic!("not a forwarding route: {other:?}"),
        }
    }

    fn vhost<'a>(rc: &'a RouteConfiguration, name: &str) -> &'a VirtualHost {
        rc.virtual_hosts
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("no virtual host {name} in {:?}", names(rc)))
    }

    fn names(rc: &RouteConfiguration) -> Vec<&str> {
        rc.virtual_hosts.iter().map(|v| v.name.as_str()).collect()
    }

    fn decode<M: Message + Default>(any: &Any) -> M {
        M::decode(any.value.as_slice()).unwrap()
    }

    fn reviews_vs(http: Vec<HttpRoute>) -> ConfigSet {
        vs_set(vec![cfg("default", "reviews", 1, vs(&["reviews"], http))])
    }

    #[test]
    fn jason_gets_reviews_v2_everyone_else_v1() {
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![
                when(
                    header("end-user", exact("jason")),
                    vec![dest("reviews", "v2")],
                ),
                to(vec![dest("reviews", "v1")]),
            ]),
        );
        let proxy = sidecar("default", &[("app", "productpage")]);
        let rc = sidecar_route_config(&snap, &proxy.client_view(), 9080);
        assert_eq!(rc.name, "9080");
        assert_eq!(rc.validate_clusters, Some(BoolValue { value: false }));
        let jason = Request::new("reviews", 9080, "/a").header("end-user", "jason");
        assert_eq!(cluster(&rc, jason), outbound(9080, "v2", REVIEWS));
        for host in ["reviews", REVIEWS, "reviews.default", "10.0.0.2"] {
            assert_eq!(
                cluster(&rc, Request::new(host, 9080, "/a")),
                outbound(9080, "v1", REVIEWS),
                "{host}"
            );
        }
        // Services without a VirtualService get their default route.
        assert_eq!(
            cluster(&rc, Request::new("ratings", 9080, "/")),
            outbound(9080, "", RATINGS)
        );
        assert_eq!(
            names(&rc),
            vec![
                "productpage.default.svc.cluster.local:9080",
                "ratings.default.svc.cluster.local:9080",
                "reviews.default.svc.cluster.local:9080",
                ALLOW_ANY,
            ],
            "sorted by name, catch-all last"
        );
        assert_eq!(
            simulate::check_consistency(&[], &[], std::slice::from_ref(&rc), &BTreeSet::new())
                .iter()
                .filter(|p| p.contains("twice"))
                .count(),
            0
        );
    }

    #[test]
    fn weights_become_weighted_clusters_and_zero_weights_are_dropped() {
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![to(vec![
                weighted("reviews", "v1", 80),
                weighted("reviews", "v2", 20),
                weighted("reviews", "v3", 0),
            ])]),
        );
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        assert_eq!(
            lands(&rc, Request::new("reviews", 9080, "/")),
            RouteOutcome::WeightedClusters(vec![
                (outbound(9080, "v1", REVIEWS), 80),
                (outbound(9080, "v2", REVIEWS), 20),
            ])
        );
    }

    #[test]
    fn uri_matches_exact_prefix_regex_and_case() {
        let mut ignore_case = uri(MatchType::Exact("/CASE".into()));
        ignore_case.ignore_uri_case = true;
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![
                when(
                    uri(MatchType::Exact("/exact".into())),
                    vec![dest("reviews", "exact")],
                ),
                when(
                    uri(MatchType::Prefix("/pre".into())),
                    vec![dest("reviews", "prefix")],
                ),
                when(
                    uri(MatchType::Regex("/re+gex/[0-9]+".into())),
                    vec![dest("reviews", "regex")],
                ),
                when(ignore_case, vec![dest("reviews", "case")]),
            ]),
        );
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        let subset = |path: &str| {
            simulate::route(&rc, &Request::new("reviews", 9080, path)).map(|o| match o {
                RouteOutcome::Cluster(c) => c.split('|').nth(2).unwrap().to_string(),
                other => panic!("{other:?}"),
            })
        };
        assert_eq!(subset("/exact").unwrap(), "exact");
        assert_eq!(
            subset("/exact/no"),
            Err(SimError::NoRoute(format!("{REVIEWS}:9080")))
        );
        assert_eq!(subset("/prefix/x?y=1").unwrap(), "prefix");
        assert_eq!(subset("/reeegex/7").unwrap(), "regex");
        assert_eq!(subset("/case").unwrap(), "case");
        assert_eq!(
            subset("/other"),
            Err(SimError::NoRoute(format!("{REVIEWS}:9080"))),
            "as in Istio, a VirtualService without a catch-all route leaves the rest unrouted"
        );
        let r = matched(&rc, Request::new("reviews", 9080, "/exact"));
        let m = r.r#match.as_ref().unwrap();
        assert_eq!(
            m.path_specifier,
            Some(route_match::PathSpecifier::Path("/exact".into()))
        );
        assert_eq!(m.case_sensitive, Some(BoolValue { value: true }));
    }

    #[test]
    fn header_method_query_authority_and_without_headers() {
        let post = HttpMatchRequest {
            method: Some(exact("POST")),
            ..Default::default()
        };
        let debug = HttpMatchRequest {
            query_params: BTreeMap::from([("debug".to_string(), exact("1"))]),
            ..Default::default()
        };
        let prefixed = header("x-group", sm(MatchType::Prefix("beta-".into())));
        let regex = header("x-id", sm(MatchType::Regex("[0-9]{3}".into())));
        let present = header("x-present", StringMatch::default());
        let without = HttpMatchRequest {
            uri: Some(sm(MatchType::Prefix("/wo".into()))),
            without_headers: BTreeMap::from([("x-test".to_string(), exact("yes"))]),
            ..Default::default()
        };
        let authority = HttpMatchRequest {
            authority: Some(sm(MatchType::Prefix("reviews.default".into()))),
            ..Default::default()
        };
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![
                when(post, vec![dest("reviews", "post")]),
                when(debug, vec![dest("reviews", "debug")]),
                when(prefixed, vec![dest("reviews", "beta")]),
                when(regex, vec![dest("reviews", "id")]),
                when(present, vec![dest("reviews", "present")]),
                when(without, vec![dest("reviews", "without")]),
                when(authority, vec![dest("reviews", "authority")]),
                to(vec![dest("reviews", "rest")]),
            ]),
        );
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        let subset = |req: Request| cluster(&rc, req).split('|').nth(2).unwrap().to_string();
        let get = |path: &str| Request::new("reviews", 9080, path);
        assert_eq!(subset(get("/").method("POST")), "post");
        assert_eq!(subset(get("/?debug=1")), "debug");
        assert_eq!(subset(get("/?debug=2")), "rest");
        assert_eq!(subset(get("/").header("x-group", "beta-users")), "beta");
        assert_eq!(subset(get("/").header("x-id", "123")), "id");
        assert_eq!(subset(get("/").header("x-id", "1234")), "rest");
        assert_eq!(subset(get("/").header("x-present", "")), "present");
        assert_eq!(
            subset(get("/wo")),
            "without",
            "a missing header is not 'yes'"
        );
        assert_eq!(subset(get("/wo").header("x-test", "no")), "without");
        assert_eq!(subset(get("/wo").header("x-test", "yes")), "rest");
        assert_eq!(
            subset(Request::new("reviews.default", 9080, "/")),
            "authority"
        );
        // The method matcher is the :method header; without_headers are inverted and
        // treat a missing header as empty.
        let r = matched(&rc, get("/").method("POST"));
        let h = &r.r#match.as_ref().unwrap().headers[0];
        assert_eq!(h.name, ":method");
        let r = matched(&rc, get("/wo"));
        let h = &r.r#match.as_ref().unwrap().headers[0];
        assert!(h.invert_match && h.treat_missing_header_as_empty);
    }

    #[test]
    fn source_labels_port_and_gateway_conditions_are_resolved_per_proxy() {
        let from_productpage = HttpMatchRequest {
            source_labels: BTreeMap::from([("app".to_string(), "productpage".to_string())]),
            ..Default::default()
        };
        let on_other_port = HttpMatchRequest {
            port: 9999,
            ..Default::default()
        };
        let on_gateway = HttpMatchRequest {
            gateways: vec!["ingress".into()],
            ..Default::default()
        };
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![
                when(on_other_port, vec![dest("reviews", "port")]),
                when(on_gateway, vec![dest("reviews", "gateway")]),
                when(from_productpage, vec![dest("reviews", "v2")]),
                to(vec![dest("reviews", "v1")]),
            ]),
        );
        let pp = sidecar_route_config(
            &snap,
            &sidecar("default", &[("app", "productpage")]).client_view(),
            9080,
        );
        let other = sidecar_route_config(
            &snap,
            &sidecar("default", &[("app", "ratings")]).client_view(),
            9080,
        );
        let req = || Request::new("reviews", 9080, "/");
        assert_eq!(cluster(&pp, req()), outbound(9080, "v2", REVIEWS));
        assert_eq!(cluster(&other, req()), outbound(9080, "v1", REVIEWS));
        // Routes for other sources, ports and gateways are left out; the source-label
        // route matches everything else, so translation stops after it (as Istio's).
        let subsets = |rc: &RouteConfiguration| -> Vec<String> {
            vhost(rc, &format!("{REVIEWS}:9080"))
                .routes
                .iter()
                .map(|r| match &action(r).cluster_specifier {
                    Some(route_action::ClusterSpecifier::Cluster(c)) => {
                        c.split('|').nth(2).unwrap().to_string()
                    }
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        assert_eq!(subsets(&pp), vec!["v2"]);
        assert_eq!(subsets(&other), vec!["v1"]);

        // When nothing of the VirtualService applies, the service keeps its default.
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![when(
                HttpMatchRequest {
                    source_labels: BTreeMap::from([("app".to_string(), "x".to_string())]),
                    ..Default::default()
                },
                vec![dest("reviews", "v2")],
            )]),
        );
        let rc = sidecar_route_config(
            &snap,
            &sidecar("default", &[("app", "y")]).client_view(),
            9080,
        );
        assert_eq!(matched(&rc, req()).name, DEFAULT_ROUTE);
    }

    #[test]
    fn first_match_wins_and_nothing_follows_a_catch_all() {
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![
                when(
                    uri(MatchType::Prefix("/a".into())),
                    vec![dest("reviews", "first")],
                ),
                when(
                    uri(MatchType::Prefix("/a/b".into())),
                    vec![dest("reviews", "second")],
                ),
                HttpRoute {
                    name: "all".into(),
                    ..to(vec![dest("reviews", "all")])
                },
                to(vec![dest("reviews", "never")]),
            ]),
        );
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        assert_eq!(
            cluster(&rc, Request::new("reviews", 9080, "/a/b")),
            outbound(9080, "first", REVIEWS)
        );
        let routes = &vhost(&rc, &format!("{REVIEWS}:9080")).routes;
        assert_eq!(routes.len(), 3);
        assert_eq!(routes[2].name, "all", "named routes keep their name");
    }

    #[test]
    fn default_route_has_istio_defaults() {
        let snap = snapshot(bookinfo(), ConfigSet::default());
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        let vh = vhost(&rc, &format!("{RATINGS}:9080"));
        assert_eq!(vh.routes.len(), 1);
        let r = &vh.routes[0];
        assert_eq!(r.name, DEFAULT_ROUTE);
        assert_eq!(
            r.r#match.as_ref().unwrap().path_specifier,
            Some(route_match::PathSpecifier::Prefix("/".into()))
        );
        let a = action(r);
        assert_eq!(
            a.cluster_specifier,
            Some(route_action::ClusterSpecifier::Cluster(outbound(
                9080, "", RATINGS
            )))
        );
        assert_eq!(a.timeout, Some(PbDuration::default()));
        let retry = a.retry_policy.as_ref().unwrap();
        assert_eq!(retry.num_retries, Some(UInt32Value { value: 2 }));
        assert_eq!(retry.retry_on, DEFAULT_RETRY_ON);
        assert_eq!(retry.retriable_status_codes, vec![503]);
        assert_eq!(retry.retry_host_predicate[0].name, PREVIOUS_HOSTS_PREDICATE);
        assert_eq!(
            r.decorator.as_ref().unwrap().operation,
            format!("{RATINGS}:9080/*")
        );
        assert_eq!(rc.virtual_hosts.last().unwrap().name, ALLOW_ANY);
    }

    #[test]
    fn short_names_only_from_the_same_namespace_and_vip_domains() {
        let snap = snapshot(bookinfo(), ConfigSet::default());
        let same = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        assert_eq!(
            vhost(&same, &format!("{REVIEWS}:9080")).domains,
            vec![
                REVIEWS.to_string(),
                format!("{REVIEWS}:9080"),
                format!("{REVIEWS}."),
                format!("{REVIEWS}.:9080"),
                "reviews".into(),
                "reviews:9080".into(),
                "reviews.default".into(),
                "reviews.default:9080".into(),
                "reviews.default.svc".into(),
                "reviews.default.svc:9080".into(),
                "10.0.0.2".into(),
                "10.0.0.2:9080".into(),
            ]
        );
        let other = sidecar_route_config(&snap, &sidecar("other", &[]).client_view(), 9080);
        let domains = &vhost(&other, &format!("{REVIEWS}:9080")).domains;
        assert!(!domains.contains(&"reviews".to_string()));
        assert!(domains.contains(&"reviews.default:9080".to_string()));
        assert_eq!(
            cluster(&other, Request::new("reviews", 9080, "/")),
            crate::xds::names::PASSTHROUGH,
            "`reviews` from another namespace is someone else's name"
        );
        assert_eq!(
            cluster(&other, Request::new("10.0.0.2", 9080, "/")),
            outbound(9080, "", REVIEWS)
        );
    }

    #[test]
    fn short_names_never_shadow_a_real_host() {
        // A ServiceEntry host `details` next to Kubernetes' details.default: the short
        // name expanded from the latter must not steal the former's domain.
        let services = vec![
            service(
                "details.default.svc.cluster.local",
                "default",
                &[(9080, Protocol::Http)],
                None,
            ),
            service("details", "default", &[(9080, Protocol::Http)], None),
        ];
        let snap = snapshot(services, ConfigSet::default());
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        assert_eq!(
            cluster(&rc, Request::new("details", 9080, "/")),
            outbound(9080, "", "details")
        );
        let problems =
            simulate::check_consistency(&[], &[], std::slice::from_ref(&rc), &BTreeSet::new());
        assert!(
            problems.iter().all(|p| !p.contains("twice")),
            "{problems:?}"
        );
    }

    #[test]
    fn headless_kubernetes_services_get_wildcard_domains() {
        let mut headless = service(
            "db.default.svc.cluster.local",
            "default",
            &[(8080, Protocol::Http)],
            None,
        );
        headless.resolution = Resolution::Passthrough;
        let snap = snapshot_with(Vec::new(), vec![headless], ConfigSet::default(), mesh());
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 8080);
        assert_eq!(
            cluster(
                &rc,
                Request::new("db-0.db.default.svc.cluster.local", 8080, "/")
            ),
            outbound(8080, "", "db.default.svc.cluster.local")
        );
    }

    #[test]
    fn an_egress_listener_with_a_port_has_a_route_table_of_its_own_hosts() {
        use meshfed_api::networking::v1alpha3::{IstioEgressListener, SidecarPort};
        let other = service(
            "other.default.svc.cluster.local",
            "default",
            &[(9080, Protocol::Http), (8080, Protocol::Http)],
            Some("10.0.0.4"),
        );
        let mut services = bookinfo();
        services.push(other);
        let egress = |port: Option<u32>, hosts: &[&str]| IstioEgressListener {
            port: port.map(|number| SidecarPort {
                number,
                protocol: "HTTP".into(),
                name: format!("http-{number}"),
                ..Default::default()
            }),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            ..Default::default()
        };
        let sidecar_cfg = Sidecar {
            egress: vec![
                egress(Some(9080), &["./reviews.default.svc.cluster.local"]),
                egress(None, &["./*"]),
            ],
            ..Default::default()
        };
        let reviews_vs = cfg(
            "default",
            "reviews",
            1,
            vs(&[REVIEWS], vec![to(vec![dest(RATINGS, "")])]),
        );
        let other_vs = cfg(
            "default",
            "other",
            1,
            vs(
                &["other.default.svc.cluster.local"],
                vec![to(vec![dest(PRODUCTPAGE, "")])],
            ),
        );
        let set = ConfigSet {
            sidecars: vec![cfg("default", "default", 1, sidecar_cfg)],
            virtual_services: vec![reviews_vs, other_vs],
            ..Default::default()
        };
        let snap = snapshot(services, set);
        let proxy = sidecar("default", &[]).client_view();
        let rc = sidecar_route_config(&snap, &proxy, 9080);
        assert_eq!(
            names(&rc),
            ["reviews.default.svc.cluster.local:9080", ALLOW_ANY],
            "only the hosts of the egress listener on 9080"
        );
        assert_eq!(
            cluster(&rc, Request::new(REVIEWS, 9080, "/")),
            outbound(9080, "", RATINGS),
            "with the VirtualService that listener imports"
        );
        // Another port: the catch-all's hosts and VirtualServices.
        let rc = sidecar_route_config(&snap, &proxy, 8080);
        assert_eq!(
            names(&rc),
            ["other.default.svc.cluster.local:8080", ALLOW_ANY]
        );
        assert_eq!(
            cluster(
                &rc,
                Request::new("other.default.svc.cluster.local", 8080, "/")
            ),
            outbound(9080, "", PRODUCTPAGE),
            "(productpage's only port)"
        );
    }

    #[test]
    fn outbound_traffic_policy_decides_the_catch_all() {
        let unknown = || Request::new("example.org", 80, "/");
        let snap = snapshot(bookinfo(), ConfigSet::default());
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 80);
        assert_eq!(cluster(&rc, unknown()), crate::xds::names::PASSTHROUGH);
        assert_eq!(matched(&rc, unknown()).name, ALLOW_ANY);

        let snap = snapshot_with(
            bookinfo(),
            Vec::new(),
            ConfigSet::default(),
            registry_only_mesh(),
        );
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 80);
        assert_eq!(lands(&rc, unknown()), RouteOutcome::DirectResponse(502));
        assert_eq!(rc.virtual_hosts.last().unwrap().name, BLOCK_ALL);

        // A Sidecar overrides the mesh: here back to ALLOW_ANY via an egress proxy.
        let sidecar_cfg = Sidecar {
            outbound_traffic_policy: Some(OutboundTrafficPolicy {
                mode: SidecarOutboundMode::AllowAny as i32,
                egress_proxy: Some(Destination {
                    host: "egress.istio-system.svc.cluster.local".into(),
                    subset: String::new(),
                    port: Some(PortSelector { number: 443 }),
                }),
            }),
            ..Default::default()
        };
        let set = ConfigSet {
            sidecars: vec![cfg("default", "default", 1, sidecar_cfg)],
            ..Default::default()
        };
        let snap = snapshot_with(bookinfo(), Vec::new(), set, registry_only_mesh());
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 80);
        assert_eq!(
            cluster(&rc, unknown()),
            "outbound|443||egress.istio-system.svc.cluster.local"
        );
        let elsewhere = sidecar_route_config(&snap, &sidecar("other", &[]).client_view(), 80);
        assert_eq!(
            lands(&elsewhere, unknown()),
            RouteOutcome::DirectResponse(502)
        );
    }

    #[test]
    fn virtual_service_hosts_that_are_not_services() {
        let set = vs_set(vec![
            cfg(
                "default",
                "site",
                2,
                vs(
                    &["bookinfo.example.com"],
                    vec![to(vec![dest("productpage", "")])],
                ),
            ),
            cfg(
                "default",
                "reviews",
                1,
                vs(
                    &["reviews", "reviews.example.com"],
                    vec![to(vec![dest("reviews", "v1")])],
                ),
            ),
        ]);
        let snap = snapshot(bookinfo(), set);
        let proxy = sidecar("default", &[]);
        let rc80 = sidecar_route_config(&snap, &proxy.client_view(), 80);
        assert_eq!(
            cluster(&rc80, Request::new("bookinfo.example.com", 80, "/")),
            outbound(9080, "", PRODUCTPAGE),
            "a destination without port takes the service's only port"
        );
        let rc = sidecar_route_config(&snap, &proxy.client_view(), 9080);
        assert!(!names(&rc).contains(&"bookinfo.example.com:9080"));
        assert_eq!(
            cluster(&rc, Request::new("reviews.example.com", 9080, "/")),
            outbound(9080, "v1", REVIEWS)
        );
    }

    #[test]
    fn route_features_are_encoded_as_istio_does() {
        let secs = meshfed_api::Duration::from_secs;
        let http = HttpRoute {
            name: "features".into(),
            route: vec![HttpRouteDestination {
                headers: Some(Headers {
                    request: Some(HeaderOperations {
                        set: BTreeMap::from([("x-dest".to_string(), "1".to_string())]),
                        ..Default::default()
                    }),
                    response: None,
                }),
                ..dest("reviews", "v1")
            }],
            retries: Some(HttpRetry {
                attempts: 3,
                per_try_timeout: Some(secs(2)),
                retry_on: "5xx,503,gateway-error".into(),
                retry_remote_localities: None,
                ..Default::default()
            }),
            timeout: Some(secs(5)),
            fault: Some(HttpFaultInjection {
                delay: Some(http_fault_injection::Delay {
                    percentage: Some(Percent { value: 10.0 }),
                    http_delay_type: Some(http_fault_injection::delay::HttpDelayType::FixedDelay(
                        secs(1),
                    )),
                    ..Default::default()
                }),
                abort: Some(http_fault_injection::Abort {
                    percentage: Some(Percent { value: 5.5 }),
                    error_type: Some(http_fault_injection::abort::ErrorType::HttpStatus(500)),
                }),
            }),
            mirror: Some(Destination {
                host: "ratings".into(),
                subset: String::new(),
                port: None,
            }),
            mirror_percentage: Some(Percent { value: 50.0 }),
            mirrors: vec![HttpMirrorPolicy {
                destination: Some(Destination {
                    host: "ratings".into(),
                    subset: "v2".into(),
                    port: None,
                }),
                percentage: Some(Percent { value: 25.0 }),
            }],
            rewrite: Some(HttpRewrite {
                uri: "/new".into(),
                authority: "rewritten.example.com".into(),
                uri_regex_rewrite: None,
            }),
            headers: Some(Headers {
                request: Some(HeaderOperations {
                    set: BTreeMap::from([("x-set".to_string(), "a".to_string())]),
                    add: BTreeMap::from([("x-add".to_string(), "b".to_string())]),
                    remove: vec!["x-remove".into(), ":path".into()],
                }),
                response: Some(HeaderOperations {
                    set: BTreeMap::from([("x-resp".to_string(), "c".to_string())]),
                    ..Default::default()
                }),
            }),
            cors_policy: Some(CorsPolicy {
                allow_origins: vec![exact("https://a.example.com")],
                allow_methods: vec!["GET".into(), "POST".into()],
                max_age: Some(secs(60)),
                allow_credentials: Some(true.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let snap = snapshot(bookinfo(), reviews_vs(vec![http]));
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        let r = matched(&rc, Request::new("reviews", 9080, "/"));
        assert_eq!(r.name, "features");
        let a = action(r);
        assert_eq!(
            a.timeout,
            Some(PbDuration {
                seconds: 5,
                nanos: 0
            })
        );
        let retry = a.retry_policy.as_ref().unwrap();
        assert_eq!(retry.num_retries, Some(UInt32Value { value: 3 }));
        assert_eq!(retry.retry_on, "5xx,gateway-error,retriable-status-codes");
        assert_eq!(retry.retriable_status_codes, vec![503]);
        assert_eq!(
            retry.per_try_timeout,
            Some(PbDuration {
                seconds: 2,
                nanos: 0
            })
        );
        assert_eq!(a.prefix_rewrite, "/new");
        assert_eq!(
            a.host_rewrite_specifier,
            Some(route_action::HostRewriteSpecifier::HostRewriteLiteral(
                "rewritten.example.com".into()
            ))
        );
        let mirrors: Vec<(&str, u32, i32)> = a
            .request_mirror_policies
            .iter()
            .map(|m| {
                let f = m.runtime_fraction.as_ref().unwrap().default_value.unwrap();
                (m.cluster.as_str(), f.numerator, f.denominator)
            })
            .collect();
        assert_eq!(
            mirrors,
            vec![
                (
                    "outbound|9080||ratings.default.svc.cluster.local",
                    500_000,
                    DenominatorType::Million as i32
                ),
                (
                    "outbound|9080|v2|ratings.default.svc.cluster.local",
                    250_000,
                    DenominatorType::Million as i32
                ),
            ]
        );
        let fault: HttpFault = decode(&r.typed_per_filter_config[FAULT_FILTER]);
        let delay = fault.delay.unwrap();
        assert_eq!(delay.percentage.unwrap().numerator, 100_000);
        assert_eq!(
            delay.fault_delay_secifier,
            Some(fault_delay::FaultDelaySecifier::FixedDelay(PbDuration {
                seconds: 1,
                nanos: 0
            }))
        );
        let abort = fault.abort.unwrap();
        assert_eq!(
            abort.error_type,
            Some(fault_abort::ErrorType::HttpStatus(500))
        );
        assert_eq!(abort.percentage.unwrap().numerator, 55_000);
        assert_eq!(
            r.typed_per_filter_config[FAULT_FILTER].type_url,
            HttpFault::type_url()
        );
        let cors: CorsFilterPolicy = decode(&r.typed_per_filter_config[CORS_FILTER]);
        assert_eq!(cors.allow_methods, "GET,POST");
        assert_eq!(cors.max_age, "60");
        assert_eq!(cors.allow_credentials, Some(BoolValue { value: true }));
        assert_eq!(
            cors.allow_origin_string_match[0].match_pattern,
            Some(string_matcher::MatchPattern::Exact(
                "https://a.example.com".into()
            ))
        );
        assert_eq!(
            cors.forward_not_matching_preflights,
            Some(BoolValue { value: true })
        );
        let added: Vec<(&str, &str, i32)> = r
            .request_headers_to_add
            .iter()
            .map(|h| {
                let hv = h.header.as_ref().unwrap();
                (hv.key.as_str(), hv.value.as_str(), h.append_action)
            })
            .collect();
        assert_eq!(
            added,
            vec![
                (
                    "x-set",
                    "a",
                    HeaderAppendAction::OverwriteIfExistsOrAdd as i32
                ),
                ("x-add", "b", HeaderAppendAction::AppendIfExistsOrAdd as i32),
                (
                    "x-dest",
                    "1",
                    HeaderAppendAction::OverwriteIfExistsOrAdd as i32
                ),
            ]
        );
        assert_eq!(
            r.request_headers_to_remove,
            vec!["x-remove"],
            "pseudo-headers stay"
        );
        assert_eq!(
            r.response_headers_to_add[0].header.as_ref().unwrap().key,
            "x-resp"
        );
        let meta = &r.metadata.as_ref().unwrap().filter_metadata["istio"].fields["config"];
        assert_eq!(
            meta.kind,
            Some(Kind::StringValue(
                "/apis/networking.istio.io/v1alpha3/namespaces/default/virtual-service/reviews"
                    .into()
            ))
        );
    }

    #[test]
    fn retries_can_be_disabled_and_follow_the_mesh_default() {
        assert_eq!(
            retry_policy(
                Some(&HttpRetry {
                    attempts: 0,
                    ..Default::default()
                }),
                false
            ),
            None
        );
        let mut m = mesh();
        m.config.default_http_retry_policy = Some(HttpRetry {
            attempts: 5,
            ..Default::default()
        });
        let snap = snapshot_with(
            bookinfo(),
            Vec::new(),
            reviews_vs(vec![to(vec![dest("reviews", "v1")])]),
            m,
        );
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        for host in ["reviews", "ratings"] {
            let r = matched(&rc, Request::new(host, 9080, "/"));
            let retry = action(r).retry_policy.as_ref().unwrap();
            assert_eq!(retry.num_retries, Some(UInt32Value { value: 5 }), "{host}");
            assert_eq!(retry.retry_on, DEFAULT_RETRY_ON);
        }
    }

    #[test]
    fn redirects_and_direct_responses() {
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![
                HttpRoute {
                    r#match: vec![uri(MatchType::Prefix("/old".into()))],
                    redirect: Some(HttpRedirect {
                        uri: "/new".into(),
                        authority: "moved.example.com".into(),
                        scheme: "https".into(),
                        redirect_code: 302,
                        redirect_port: Some(http_redirect::RedirectPort::Port(8443)),
                    }),
                    ..Default::default()
                },
                HttpRoute {
                    r#match: vec![uri(MatchType::Prefix("/teapot".into()))],
                    direct_response: Some(HttpDirectResponse {
                        status: 418,
                        body: Some(istio::HttpBody {
                            specifier: Some(http_body::Specifier::String("short and stout".into())),
                        }),
                    }),
                    ..Default::default()
                },
            ]),
        );
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        assert_eq!(
            lands(&rc, Request::new("reviews", 9080, "/old?x=1")),
            RouteOutcome::Redirect {
                scheme: "https".into(),
                host: "moved.example.com".into(),
                port: Some(8443),
                path: "/new?x=1".into(),
                code: 302,
            }
        );
        assert_eq!(
            lands(&rc, Request::new("reviews", 9080, "/teapot")),
            RouteOutcome::DirectResponse(418)
        );
        let r = matched(&rc, Request::new("reviews", 9080, "/teapot"));
        match &r.action {
            Some(route::Action::DirectResponse(d)) => assert_eq!(
                d.body.as_ref().unwrap().specifier,
                Some(data_source::Specifier::InlineString(
                    "short and stout".into()
                ))
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            rc.max_direct_response_body_size_bytes,
            Some(UInt32Value {
                value: MAX_DIRECT_RESPONSE_BODY_BYTES
            })
        );
    }

    #[test]
    fn destination_ports_and_consistent_hashing() {
        let multi = service(
            "multi.default.svc.cluster.local",
            "default",
            &[(8080, Protocol::Http), (9080, Protocol::Http)],
            None,
        );
        let mut services = bookinfo();
        services.push(multi);
        let hash_dr = DestinationRule {
            host: "ratings".into(),
            traffic_policy: Some(TrafficPolicy {
                load_balancer: Some(LoadBalancerSettings {
                    lb_policy: Some(LbPolicy::ConsistentHash(ConsistentHashLb {
                        hash_key: Some(HashKey::HttpHeaderName("x-user".into())),
                        ..Default::default()
                    })),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let set = ConfigSet {
            virtual_services: vec![cfg(
                "default",
                "reviews",
                1,
                vs(
                    &["reviews"],
                    vec![
                        when(
                            uri(MatchType::Prefix("/explicit".into())),
                            vec![HttpRouteDestination {
                                destination: Some(Destination {
                                    host: "multi".into(),
                                    subset: String::new(),
                                    port: Some(PortSelector { number: 8080 }),
                                }),
                                ..Default::default()
                            }],
                        ),
                        when(
                            uri(MatchType::Prefix("/same".into())),
                            vec![dest("multi", "")],
                        ),
                        to(vec![dest("ratings", "")]),
                    ],
                ),
            )],
            destination_rules: vec![cfg("default", "ratings", 1, hash_dr)],
            ..Default::default()
        };
        let snap = snapshot(services, set);
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        let req = |p: &str| Request::new("reviews", 9080, p);
        assert_eq!(
            cluster(&rc, req("/explicit")),
            "outbound|8080||multi.default.svc.cluster.local"
        );
        assert_eq!(
            cluster(&rc, req("/same")),
            "outbound|9080||multi.default.svc.cluster.local",
            "the listener port when the destination has it"
        );
        let to_ratings = action(matched(&rc, req("/x")));
        assert_eq!(to_ratings.hash_policy.len(), 1);
        assert!(
            to_ratings
                .retry_policy
                .as_ref()
                .unwrap()
                .retry_host_predicate
                .is_empty(),
            "consistent hashing keeps retries on the same host"
        );
        let default = action(matched(&rc, Request::new("ratings", 9080, "/")));
        assert_eq!(
            default.hash_policy[0].policy_specifier,
            Some(route_action::hash_policy::PolicySpecifier::Header(
                route_action::hash_policy::Header {
                    header_name: "x-user".into(),
                    ..Default::default()
                }
            ))
        );
    }

    /// Istio's route_test.go `TestBuildHTTPRoutes` timeout vectors: for Envoy a
    /// VirtualService route's timeout (none: 0s, disabled) also caps gRPC through the
    /// deprecated `max_grpc_timeout`, which Istio's `setTimeout` still uses for Envoy
    /// (`max_stream_duration` only for proxyless gRPC); the default route likewise.
    #[test]
    #[allow(deprecated)]
    fn istio_route_timeout_vectors() {
        let echo = service(
            "echo.default.svc.cluster.local",
            "default",
            &[(8080, Protocol::Http)],
            Some("10.96.0.10"),
        );
        let envoy = node("sidecar", "default", &[], None);
        let secs = |s: i64| {
            Some(PbDuration {
                seconds: s,
                nanos: 0,
            })
        };
        for (timeout, expected) in [
            (None, secs(0)),
            (Some(meshfed_api::Duration::from_secs(10)), secs(10)),
            (Some(meshfed_api::Duration::from_secs(0)), secs(0)),
        ] {
            let set = vs_set(vec![cfg(
                "default",
                "echo",
                1,
                vs(
                    &["echo"],
                    vec![HttpRoute {
                        timeout,
                        ..to(vec![dest("echo", "")])
                    }],
                ),
            )]);
            let snap = snapshot(vec![echo.clone()], set);
            let service = snap
                .services()
                .resolve("echo.default.svc.cluster.local", "default")
                .unwrap();
            let vh = service_virtual_host(&snap, &envoy.client_view(), service, &service.ports[0]);
            let a = action(&vh.routes[0]);
            assert_eq!(a.timeout, expected, "{timeout:?}");
            assert_eq!(a.max_grpc_timeout, expected, "{timeout:?}");
            assert_eq!(a.max_stream_duration, None, "{timeout:?}");
        }
        let snap = snapshot(vec![echo], ConfigSet::default());
        let service = snap
            .services()
            .resolve("echo.default.svc.cluster.local", "default")
            .unwrap();
        let vh = service_virtual_host(&snap, &envoy.client_view(), service, &service.ports[0]);
        let a = action(&vh.routes[0]);
        assert_eq!((a.timeout, a.max_grpc_timeout), (secs(0), secs(0)));
    }

    #[test]
    fn service_virtual_host_for_proxyless_grpc() {
        let mut echo = service(
            "echo.default.svc.cluster.local",
            "default",
            &[(7070, Protocol::Grpc)],
            Some("10.96.0.10"),
        );
        echo.cluster_vips
            .insert("c2".into(), vec!["10.200.0.1".parse().unwrap()]);
        let set = vs_set(vec![cfg(
            "default",
            "echo",
            1,
            vs(
                &["echo"],
                vec![HttpRoute {
                    timeout: Some(meshfed_api::Duration::from_secs(3)),
                    ..to(vec![dest("echo", "v1")])
                }],
            ),
        )]);
        let snap = snapshot(vec![echo.clone()], set);
        let grpc = node("sidecar", "default", &[], Some("grpc"));
        let service = snap
            .services()
            .resolve("echo.default.svc.cluster.local", "default")
            .unwrap();
        let vh = service_virtual_host(&snap, &grpc.client_view(), service, &service.ports[0]);
        assert_eq!(vh.name, "echo.default.svc.cluster.local:7070");
        assert_eq!(vh.domains.len(), 12);
        assert!(vh.domains.contains(&"10.96.0.10:7070".to_string()));
        let a = action(&vh.routes[0]);
        assert_eq!(
            a.cluster_specifier,
            Some(route_action::ClusterSpecifier::Cluster(
                "outbound|7070|v1|echo.default.svc.cluster.local".into()
            ))
        );
        assert_eq!(
            a.max_stream_duration.as_ref().unwrap().max_stream_duration,
            Some(PbDuration {
                seconds: 3,
                nanos: 0
            })
        );
        // Without a VirtualService: the default route.
        let snap = snapshot(vec![echo], ConfigSet::default());
        let service = snap
            .services()
            .resolve("echo.default.svc.cluster.local", "default")
            .unwrap();
        let vh = service_virtual_host(&snap, &grpc.client_view(), service, &service.ports[0]);
        assert_eq!(vh.routes.len(), 1);
        assert_eq!(vh.routes[0].name, DEFAULT_ROUTE);
    }

    #[test]
    fn a_mesh_wide_wildcard_virtual_service_never_takes_the_catch_all_domain() {
        let snap = snapshot(
            bookinfo(),
            vs_set(vec![cfg(
                "default",
                "everything",
                1,
                vs(&["*"], vec![to(vec![dest("ratings", "")])]),
            )]),
        );
        let proxy = sidecar("default", &[]);
        let rc = sidecar_route_config(&snap, &proxy.client_view(), 9080);
        assert_eq!(
            cluster(&rc, Request::new("reviews", 9080, "/")),
            outbound(9080, "", RATINGS),
            "the wildcard VirtualService owns every service"
        );
        let rc80 = sidecar_route_config(&snap, &proxy.client_view(), 80);
        assert_eq!(vhost(&rc80, "*:80").domains, vec!["*:80"]);
        assert_eq!(rc80.virtual_hosts.last().unwrap().domains, vec!["*"]);
        let problems =
            simulate::check_consistency(&[], &[], std::slice::from_ref(&rc80), &BTreeSet::new());
        assert!(
            problems.iter().all(|p| !p.contains("twice")),
            "{problems:?}"
        );
    }

    // ---- gateways ----

    fn gateway(selector: &str, servers: Vec<Server>) -> Gateway {
        Gateway {
            servers,
            selector: BTreeMap::from([("istio".to_string(), selector.to_string())]),
        }
    }

    fn server(
        number: u32,
        protocol: &str,
        name: &str,
        hosts: &[&str],
        tls: Option<ServerTlsSettings>,
    ) -> Server {
        Server {
            port: Some(istio::Port {
                number,
                protocol: protocol.into(),
                name: name.into(),
                target_port: 0,
            }),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            tls,
            ..Default::default()
        }
    }

    fn gw_vs(
        ns: &str,
        name: &str,
        hosts: &[&str],
        gateways: &[&str],
        dest_host: &str,
    ) -> Config<VirtualService> {
        cfg(
            ns,
            name,
            1,
            VirtualService {
                gateways: gateways.iter().map(|g| g.to_string()).collect(),
                ..vs(hosts, vec![to(vec![dest(dest_host, "")])])
            },
        )
    }

    fn gateway_snapshot() -> Snapshot {
        let simple = ServerTlsSettings {
            mode: TlSmode::Simple as i32,
            credential_name: "cert".into(),
            ..Default::default()
        };
        let redirect = ServerTlsSettings {
            https_redirect: true,
            ..Default::default()
        };
        let set = ConfigSet {
            gateways: vec![
                cfg(
                    "istio-system",
                    "ingress",
                    1,
                    gateway(
                        "ingressgateway",
                        vec![
                            server(
                                80,
                                "HTTP",
                                "http",
                                &["*/bookinfo.example.com", "prod/*.prod.example.com"],
                                None,
                            ),
                            server(
                                80,
                                "HTTP",
                                "http-redirect",
                                &["secure.example.com"],
                                Some(redirect),
                            ),
                            server(443, "HTTPS", "https", &["secure.example.com"], Some(simple)),
                            server(
                                8443,
                                "HTTPS",
                                "passthrough",
                                &["pass.example.com"],
                                Some(ServerTlsSettings::default()),
                            ),
                        ],
                    ),
                ),
                cfg(
                    "istio-system",
                    "other",
                    1,
                    gateway("other", vec![server(80, "HTTP", "http", &["*"], None)]),
                ),
            ],
            virtual_services: vec![
                gw_vs(
                    "default",
                    "bookinfo",
                    &["bookinfo.example.com"],
                    &["istio-system/ingress"],
                    "productpage",
                ),
                gw_vs(
                    "default",
                    "mesh-only",
                    &["bookinfo.example.com"],
                    &[],
                    "reviews",
                ),
                gw_vs(
                    "default",
                    "elsewhere",
                    &["bookinfo.example.com"],
                    &["istio-system/other"],
                    "ratings",
                ),
                gw_vs(
                    "prod",
                    "prod",
                    &["api.prod.example.com"],
                    &["istio-system/ingress"],
                    "reviews.default.svc.cluster.local",
                ),
                gw_vs(
                    "dev",
                    "dev",
                    &["dev.prod.example.com"],
                    &["istio-system/ingress"],
                    "ratings.default.svc.cluster.local",
                ),
                gw_vs(
                    "default",
                    "secure",
                    &["secure.example.com"],
                    &["istio-system/ingress"],
                    "reviews",
                ),
            ],
            ..Default::default()
        };
        snapshot(bookinfo(), set)
    }

    #[test]
    fn gateway_routes_are_bound_only_to_their_gateway() {
        let snap = gateway_snapshot();
        let rc = gateway_route_config(
            &snap,
            &router().client_view(),
            &MergedGateway::build(&snap, &router().labels, &[]),
            "http.80",
        )
        .unwrap();
        assert_eq!(rc.name, "http.80");
        assert_eq!(
            cluster(
                &rc,
                Request::new("bookinfo.example.com", 80, "/productpage")
            ),
            outbound(9080, "", PRODUCTPAGE)
        );
        assert_eq!(
            vhost(&rc, "bookinfo.example.com:80").routes.len(),
            1,
            "mesh and other gateways' routes stay out"
        );
        // Istio's gateway tables: the host alone, matched without the port.
        assert_eq!(
            vhost(&rc, "bookinfo.example.com:80").domains,
            vec!["bookinfo.example.com"]
        );
        assert!(rc.ignore_port_in_host_matching);
        // Server hosts scoped to a namespace only take that namespace's VirtualServices.
        assert_eq!(
            cluster(&rc, Request::new("api.prod.example.com", 80, "/")),
            outbound(9080, "", REVIEWS)
        );
        assert_eq!(
            simulate::route(&rc, &Request::new("dev.prod.example.com", 80, "/")),
            Err(SimError::NoVirtualHost("dev.prod.example.com".into()))
        );
        // The other gateway's router sees its own VirtualService only.
        let other = node("router", "istio-system", &[("istio", "other")], None);
        let rc = gateway_route_config(
            &snap,
            &other.client_view(),
            &MergedGateway::build(&snap, &other.labels, &[]),
            "http.80",
        )
        .unwrap();
        assert_eq!(
            cluster(&rc, Request::new("bookinfo.example.com", 80, "/")),
            outbound(9080, "", RATINGS)
        );
        // No server on the port: an empty table; not a gateway route name: nothing.
        let empty = gateway_route_config(
            &snap,
            &router().client_view(),
            &MergedGateway::build(&snap, &router().labels, &[]),
            "http.81",
        )
        .unwrap();
        assert!(empty.virtual_hosts.is_empty());
        assert_eq!(
            gateway_route_config(
                &snap,
                &router().client_view(),
                &MergedGateway::build(&snap, &router().labels, &[]),
                "9080"
            ),
            None
        );
    }

    #[test]
    fn https_redirect_and_terminated_https() {
        let snap = gateway_snapshot();
        let rc = gateway_route_config(
            &snap,
            &router().client_view(),
            &MergedGateway::build(&snap, &router().labels, &[]),
            "http.80",
        )
        .unwrap();
        assert_eq!(
            lands(&rc, Request::new("secure.example.com", 80, "/login")),
            RouteOutcome::Redirect {
                scheme: "https".into(),
                host: "secure.example.com".into(),
                port: None,
                path: "/login".into(),
                code: 301,
            }
        );
        assert_eq!(
            vhost(&rc, "secure.example.com:80").require_tls,
            virtual_host::TlsRequirementType::All as i32
        );
        let https_name = "https.443.https.ingress.istio-system";
        let gw = &snap.config().gateways().next().unwrap().clone();
        assert_eq!(
            crate::generate::merged_gateway::route_name(&gw.spec.servers[2], 443, gw),
            https_name
        );
        assert_eq!(
            crate::generate::merged_gateway::route_name(&gw.spec.servers[3], 443, gw),
            "",
            "passthrough"
        );
        let rc = gateway_route_config(
            &snap,
            &router().client_view(),
            &MergedGateway::build(&snap, &router().labels, &[]),
            https_name,
        )
        .unwrap();
        assert_eq!(
            cluster(&rc, Request::new("secure.example.com", 443, "/").tls()),
            outbound(9080, "", REVIEWS)
        );
        assert_eq!(
            GatewayRouteName::parse(https_name),
            Some(GatewayRouteName::Https {
                port: 443,
                port_name: "https",
                gateway: "ingress",
                namespace: "istio-system",
                bind: "",
            })
        );
        assert_eq!(
            GatewayRouteName::parse("http.8080.10.0.0.1"),
            Some(GatewayRouteName::Http {
                port: 8080,
                bind: "10.0.0.1"
            })
        );
    }

    #[test]
    fn gateway_without_routes_answers_404() {
        let set = ConfigSet {
            gateways: vec![cfg(
                "istio-system",
                "ingress",
                1,
                gateway(
                    "ingressgateway",
                    vec![server(8080, "HTTP", "http", &["*"], None)],
                ),
            )],
            ..Default::default()
        };
        let snap = snapshot(bookinfo(), set);
        let rc = gateway_route_config(
            &snap,
            &router().client_view(),
            &MergedGateway::build(&snap, &router().labels, &[]),
            "http.8080",
        )
        .unwrap();
        assert_eq!(names(&rc), vec!["blackhole:8080"]);
        assert_eq!(
            simulate::route(&rc, &Request::new("x", 8080, "/")),
            Err(SimError::NoRoute("blackhole:8080".into()))
        );
    }

    #[test]
    fn generated_tables_are_consistent() {
        let snap = gateway_snapshot();
        let mut tables = vec![
            sidecar_route_config(
                &snap,
                &sidecar("default", &[("app", "productpage")]).client_view(),
                9080,
            ),
            sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 80),
            gateway_route_config(
                &snap,
                &router().client_view(),
                &MergedGateway::build(&snap, &router().labels, &[]),
                "http.80",
            )
            .unwrap(),
        ];
        tables[2].name = "gw".into();
        let clusters: Vec<Cluster> = tables
            .iter()
            .flat_map(referenced_clusters)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .map(|name| Cluster {
                name,
                cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
                    cluster::DiscoveryType::Static as i32,
                )),
                ..Default::default()
            })
            .collect();
        let problems = simulate::check_consistency(&clusters, &[], &tables, &BTreeSet::new());
        assert!(problems.is_empty(), "{problems:?}");
    }
}

#[cfg(test)]
mod jwt_claim_tests {
    use envoy_types::pb::envoy::r#type::matcher::v3::{
        ListMatcher, OrMatcher, ValueMatcher, list_matcher, metadata_matcher, value_matcher,
    };
    use meshfed_api::networking::v1alpha3::{HttpMatchRequest, StringMatch};

    use super::*;

    fn sm(t: MatchType) -> StringMatch {
        StringMatch {
            match_type: Some(t),
        }
    }

    fn string(p: string_matcher::MatchPattern) -> StringMatcher {
        StringMatcher {
            match_pattern: Some(p),
            ..Default::default()
        }
    }

    /// Istio's `MetadataMatcherForJWTClaims`, written out: filter jwt_authn, path
    /// `payload` then the claims, the claim a string or a list holding one.
    fn for_claims(claims: &[&str], m: StringMatcher) -> MetadataMatcher {
        let value = ValueMatcher {
            match_pattern: Some(value_matcher::MatchPattern::StringMatch(m)),
        };
        MetadataMatcher {
            filter: "envoy.filters.http.jwt_authn".into(),
            path: std::iter::once("payload")
                .chain(claims.iter().copied())
                .map(|k| metadata_matcher::PathSegment {
                    segment: Some(metadata_matcher::path_segment::Segment::Key(k.into())),
                })
                .collect(),
            value: Some(ValueMatcher {
                match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
                    value_matchers: vec![
                        ValueMatcher {
                            match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
                                ListMatcher {
                                    match_pattern: Some(list_matcher::MatchPattern::OneOf(
                                        Box::new(value.clone()),
                                    )),
                                },
                            ))),
                        },
                        value,
                    ],
                })),
            }),
            invert: false,
        }
    }

    /// Istio's `TestTranslateMetadataMatch` (`networking/core/route/route_test.go`).
    #[test]
    fn translate_metadata_match_vectors_of_istio_pass() {
        use string_matcher::MatchPattern as P;
        let exact = || sm(MatchType::Exact("exact".into()));
        let exact_m = || string(P::Exact("exact".into()));
        let none: [&str; 9] = [
            "@request.auth.claims",
            "@request.auth.claims-",
            "request.auth.claims.",
            "@request.auth.claims.",
            "@request.auth.claims-abc",
            "x-some-other-header",
            "@request.auth.claims[key1",
            "@request.auth.claims]key1",
            "@request.auth.claimskey1",
        ];
        for name in none {
            assert_eq!(translate_metadata_match(name, &exact()), None, "{name}");
        }
        let cases: Vec<(&str, StringMatch, MetadataMatcher)> = vec![
            (
                "@request.auth.claims.key1",
                exact(),
                for_claims(&["key1"], exact_m()),
            ),
            (
                "@request.auth.claims.key1.KEY2",
                exact(),
                for_claims(&["key1", "KEY2"], exact_m()),
            ),
            (
                "@request.auth.claims.key1-key2",
                exact(),
                for_claims(&["key1-key2"], exact_m()),
            ),
            (
                "@request.auth.claims.prefix",
                sm(MatchType::Prefix("prefix".into())),
                for_claims(&["prefix"], string(P::Prefix("prefix".into()))),
            ),
            (
                "@request.auth.claims.regex",
                sm(MatchType::Regex(".+?\\..+?\\..+?".into())),
                for_claims(
                    &["regex"],
                    string(P::SafeRegex(RegexMatcher {
                        regex: ".+?\\..+?\\..+?".into(),
                        ..Default::default()
                    })),
                ),
            ),
            (
                "@request.auth.claims.[key1]",
                exact(),
                for_claims(&["[key1]"], exact_m()),
            ),
            (
                "@request.auth.claims[key1]",
                exact(),
                for_claims(&["key1"], exact_m()),
            ),
            (
                "@request.auth.claims[key1][key2]",
                exact(),
                for_claims(&["key1", "key2"], exact_m()),
            ),
            (
                "@request.auth.claims[test-issuer-2@istio.io]",
                exact(),
                for_claims(&["test-issuer-2@istio.io"], exact_m()),
            ),
            (
                "@request.auth.claims[test-issuer-2@istio.io][key1]",
                exact(),
                for_claims(&["test-issuer-2@istio.io", "key1"], exact_m()),
            ),
        ];
        for (name, m, want) in cases {
            assert_eq!(translate_metadata_match(name, &m), Some(want), "{name}");
        }
    }

    #[test]
    fn claim_keys_become_dynamic_metadata_and_without_headers_inverts_them() {
        let m = HttpMatchRequest {
            headers: [
                (
                    "@request.auth.claims.group".to_string(),
                    sm(MatchType::Exact("admin".into())),
                ),
                ("x-user".to_string(), sm(MatchType::Exact("u".into()))),
            ]
            .into(),
            without_headers: [(
                "@request.auth.claims[tier][level]".to_string(),
                sm(MatchType::Exact("free".into())),
            )]
            .into(),
            ..Default::default()
        };
        let out = translate_match(Some(&m));
        let headers: Vec<&str> = out.headers.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(headers, ["x-user"], "claims are not headers");
        assert_eq!(
            out.dynamic_metadata,
            [
                for_claims(
                    &["group"],
                    string(string_matcher::MatchPattern::Exact("admin".into()))
                ),
                MetadataMatcher {
                    invert: true,
                    ..for_claims(
                        &["tier", "level"],
                        string(string_matcher::MatchPattern::Exact("free".into()))
                    )
                },
            ]
        );
    }
}

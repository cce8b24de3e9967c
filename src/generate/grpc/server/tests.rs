//! Server-side listeners and client TLS of proxyless gRPC, as structures.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{Node, TransportSocket, address, transport_socket};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, UpstreamTlsContext, common_tls_context,
};
use envoy_types::pb::google::protobuf::BoolValue;
use meshfed_registry::{
    Aggregate, Endpoint, EndpointIndex, MemoryRegistry, Port, Protocol, ProviderId, PushRequest,
    Service, ServiceKey, TriggerReason, UpdateSink,
};
use serde::de::DeserializeOwned;

use super::*;
use crate::generate::{GeneratorOptions, Scope, Subscription, generate};
use crate::model::proxy::json_to_struct;
use crate::push::config_index::{ConfigIndex, ConfigSet};
use prost::Message;

const ECHO: &str = "echo.default.svc.cluster.local";
const IP: &str = "10.0.0.1";

fn spec<T: DeserializeOwned>(yaml: &str) -> T {
    let v: serde_json::Value = serde_norway::from_str(yaml).expect("yaml");
    serde_json::from_value(v).expect("a spec")
}

/// A config object `name` in `default`, `age` seconds old.
fn config<T>(name: &str, age: u64, spec: T) -> Config<T> {
    Config {
        name: name.into(),
        namespace: "default".into(),
        labels: Default::default(),
        annotations: Default::default(),
        creation_time: UNIX_EPOCH + Duration::from_secs(1000 - age),
        spec,
    }
}

/// The service `echo` (ports 7070, 8080, 9090) whose one endpoint is the gRPC server
/// at [`IP`] labelled `app: echo` (plus `labels`), running as `sa/echo`.
fn snapshot(set: ConfigSet, labels: &[(&str, &str)]) -> Snapshot {
    let index = Arc::new(EndpointIndex::new());
    let (sink, _events) = UpdateSink::new(index.clone());
    let aggregate = Aggregate::new("c1");
    let registry = MemoryRegistry::new("c1", sink);
    let mut echo = Service::new(ECHO, "default", ProviderId::Mock, "c1");
    for p in [7070, 8080, 9090] {
        echo.ports
            .push(Port::new(&format!("grpc-{p}"), p, Protocol::Grpc).unwrap());
    }
    registry.add_service(echo);
    let mut e = Endpoint::new(IP.parse().unwrap())
        .with_port("grpc-7070", 7070)
        .with_port("grpc-8080", 8080)
        .with_port("grpc-9090", 9090);
    e.labels = workload_labels(labels);
    e.service_account = Some("spiffe://cluster.local/ns/default/sa/echo".into());
    registry.set_endpoints(&ServiceKey::new(ECHO, "default"), vec![e]);
    aggregate.add_registry(Arc::new(registry));
    Snapshot::build(
        &Snapshot::empty(),
        &crate::xds::deps::PushScope::new(&PushRequest::forced(TriggerReason::Global)),
        &aggregate,
        &index,
        Arc::new(crate::generate::lds::tests::default_mesh()),
        &|m| ConfigIndex::new(set.clone(), "cluster.local", m),
        1,
    )
}

fn workload_labels(extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    std::iter::once(("app", "echo"))
        .chain(extra.iter().copied())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The gRPC server's node (or a client's: same node, it asks for other names).
fn proxy(labels: &[(&str, &str)]) -> Proxy {
    let node = Node {
        id: format!("sidecar~{IP}~echo-1.default~default.svc.cluster.local"),
        metadata: Some(json_to_struct(&serde_json::json!({
            "GENERATOR": "grpc", "NAMESPACE": "default", "CLUSTER_ID": "c1",
            "LABELS": workload_labels(labels),
        }))),
        ..Default::default()
    };
    Proxy::from_node(Some(&node)).unwrap()
}

fn fetch(snap: &Snapshot, p: &Proxy, type_url: TypeUrl, names: &[String]) -> Vec<Resource> {
    let names: BTreeSet<String> = names.iter().cloned().collect();
    generate(
        type_url,
        snap,
        p,
        Subscription {
            wildcard: false,
            names: &names,
            interned: None,
        },
        Scope::All,
        &GeneratorOptions::default(),
    )
    .into_vec()
}

fn server_name(port: u16) -> String {
    format!("{SERVER_LISTENER_PREFIX}{IP}:{port}")
}

fn listener_of(snap: &Snapshot, p: &Proxy, port: u16) -> Option<Listener> {
    let out = fetch(snap, p, TypeUrl::Listener, &[server_name(port)]);
    assert!(out.len() <= 1);
    out.first()
        .map(|r| Listener::decode(r.body.value.clone()).unwrap())
}

fn hcm(l: &Listener) -> HttpConnectionManager {
    assert_eq!(l.filter_chains.len(), 1, "one chain");
    let f = &l.filter_chains[0].filters[0];
    match &f.config_type {
        Some(filter::ConfigType::TypedConfig(any)) => {
            HttpConnectionManager::decode(any.value.as_slice()).unwrap()
        }
        other => panic!("no HCM: {other:?}"),
    }
}

fn tls_of<M: Message + Default>(socket: &TransportSocket) -> M {
    assert_eq!(socket.name, "envoy.transport_sockets.tls");
    match &socket.config_type {
        Some(transport_socket::ConfigType::TypedConfig(any)) => {
            M::decode(any.value.as_slice()).unwrap()
        }
        other => panic!("no TLS context: {other:?}"),
    }
}

/// The certificate provider instances and SANs of a TLS context.
fn providers(c: &CommonTlsContext) -> (String, String, Vec<String>) {
    use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
    let cert = c.tls_certificate_provider_instance.as_ref().unwrap();
    let Some(common_tls_context::ValidationContextType::ValidationContext(v)) =
        &c.validation_context_type
    else {
        panic!("no validation context: {c:?}")
    };
    let root = v.ca_certificate_provider_instance.as_ref().unwrap();
    #[allow(deprecated)]
    let sans = v
        .match_subject_alt_names
        .iter()
        .map(|m| match &m.match_pattern {
            Some(MatchPattern::Exact(s)) => s.clone(),
            other => panic!("not exact: {other:?}"),
        })
        .collect();
    (
        format!("{}/{}", cert.instance_name, cert.certificate_name),
        format!("{}/{}", root.instance_name, root.certificate_name),
        sans,
    )
}

fn peer_authentications(yaml: &[&str]) -> ConfigSet {
    ConfigSet {
        peer_authentications: yaml
            .iter()
            .enumerate()
            .map(|(i, y)| config(&format!("pa{i}"), 10, spec(y)))
            .collect(),
        ..Default::default()
    }
}

#[test]
fn a_strict_server_listener_is_named_and_addressed_as_asked_and_requires_client_certificates() {
    let snap = snapshot(peer_authentications(&["mtls: {mode: STRICT}"]), &[]);
    let l = listener_of(&snap, &proxy(&[]), 8080).expect("a listener");
    assert_eq!(l.name, server_name(8080));
    match l.address.clone().and_then(|a| a.address) {
        Some(address::Address::SocketAddress(s)) => {
            assert_eq!(s.address, IP);
            assert_eq!(
                s.port_specifier,
                Some(socket_address::PortSpecifier::PortValue(8080))
            );
        }
        other => panic!("no socket address: {other:?}"),
    }
    assert!(l.listener_filters.is_empty() && l.use_original_dst.is_none());
    // A server on every address asks for `[::]:<port>`.
    let any = format!("{SERVER_LISTENER_PREFIX}[::]:8080");
    let out = fetch(
        &snap,
        &proxy(&[]),
        TypeUrl::Listener,
        std::slice::from_ref(&any),
    );
    let wildcard = Listener::decode(out[0].body.value.clone()).unwrap();
    assert_eq!(wildcard.name, any);
    match wildcard.address.and_then(|a| a.address) {
        Some(address::Address::SocketAddress(s)) => assert_eq!(s.address, "::"),
        other => panic!("no socket address: {other:?}"),
    }
    let chain = &l.filter_chains[0];
    assert_eq!(chain.name, "inbound-mtls");
    assert!(chain.filter_chain_match.is_none());
    assert_eq!(chain.filters[0].name, "inbound-hcmmtls");
    let tls: DownstreamTlsContext = tls_of(chain.transport_socket.as_ref().unwrap());
    assert_eq!(
        tls.require_client_certificate,
        Some(BoolValue { value: true })
    );
    assert_eq!(
        providers(tls.common_tls_context.as_ref().unwrap()),
        ("default/default".into(), "default/ROOTCA".into(), vec![])
    );

    // The connection manager: no policy, so the router alone; every call handled by
    // the server (non-forwarding), whatever its authority.
    let h = hcm(&l);
    let filters: Vec<&str> = h.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(filters, vec![super::super::ROUTER_FILTER]);
    let Some(http_connection_manager::RouteSpecifier::RouteConfig(rc)) = h.route_specifier else {
        panic!("no inline routes")
    };
    assert_eq!(rc.name, "inbound");
    assert_eq!(rc.virtual_hosts[0].domains, vec!["*"]);
    let r = &rc.virtual_hosts[0].routes[0];
    assert_eq!(
        r.r#match.as_ref().unwrap().path_specifier,
        Some(route_match::PathSpecifier::Prefix("/".into()))
    );
    assert!(matches!(
        r.action,
        Some(route::Action::NonForwardingAction(_))
    ));
}

#[test]
fn permissive_is_served_as_plaintext_unless_the_workload_takes_istio_mtls_and_ports_override() {
    let set = peer_authentications(&["
selector: {matchLabels: {app: echo}}
mtls: {mode: PERMISSIVE}
portLevelMtls:
  8080: {mode: STRICT}
  9090: {mode: DISABLE}
"]);
    let chain = |labels: &[(&str, &str)], port: u16| {
        let snap = snapshot(set.clone(), labels);
        let l = listener_of(&snap, &proxy(labels), port).expect("a listener");
        let c = &l.filter_chains[0];
        assert_eq!(
            c.transport_socket.is_some(),
            c.name == "inbound-mtls",
            "{c:?}"
        );
        c.name.clone()
    };
    assert_eq!(chain(&[], 7070), "inbound-plaintext");
    assert_eq!(chain(&[], 8080), "inbound-mtls");
    assert_eq!(chain(&[], 9090), "inbound-plaintext");
    let istio = [("security.istio.io/tlsMode", "istio")];
    assert_eq!(chain(&istio, 7070), "inbound-mtls");
    assert_eq!(chain(&istio, 9090), "inbound-plaintext");
    // Nothing at all: PERMISSIVE, so plaintext.
    let snap = snapshot(ConfigSet::default(), &[]);
    let l = listener_of(&snap, &proxy(&[]), 7070).unwrap();
    assert_eq!(l.filter_chains[0].name, "inbound-plaintext");
    assert_eq!(l.filter_chains[0].filters[0].name, "inbound-hcmplaintext");
}

#[test]
fn no_listener_for_a_port_the_server_does_not_serve_or_a_name_without_a_port() {
    let snap = snapshot(ConfigSet::default(), &[]);
    let p = proxy(&[]);
    assert!(listener_of(&snap, &p, 1234).is_none());
    let names = [
        format!("{SERVER_LISTENER_PREFIX}{IP}"),
        format!("{SERVER_LISTENER_PREFIX}{IP}:http"),
    ];
    assert!(fetch(&snap, &p, TypeUrl::Listener, &names).is_empty());
    // Another proxy (another IP) is no instance of echo.
    let mut other = p.clone();
    other.ip_addresses = vec!["10.9.9.9".parse().unwrap()];
    assert!(fetch(&snap, &other, TypeUrl::Listener, &[server_name(8080)]).is_empty());
}

fn authorization_policies(policies: &[(&str, &str)]) -> ConfigSet {
    ConfigSet {
        authorization_policies: policies
            .iter()
            .enumerate()
            .map(|(i, (name, y))| {
                let mut c = config(name, 100 - i as u64, spec(y));
                if name.starts_with("dry") {
                    c.annotations
                        .insert("istio.io/dry-run".into(), "true".into());
                }
                c
            })
            .collect(),
        ..Default::default()
    }
}

fn rbac_of(f: &HttpFilter) -> Rbac {
    match &f.config_type {
        Some(http_filter::ConfigType::TypedConfig(any)) => HttpRbac::decode(any.value.as_slice())
            .unwrap()
            .rules
            .expect("rules"),
        other => panic!("no RBAC: {other:?}"),
    }
}

fn policy_names(r: &Rbac) -> BTreeSet<&str> {
    r.policies.keys().map(String::as_str).collect()
}

#[test]
fn rbac_is_deny_then_allow_then_the_router_with_one_policy_per_rule() {
    let set = authorization_policies(&[
        (
            "deny",
            "action: DENY\nrules:\n- to: [{operation: {methods: [GET]}}]\n- from: [{source: {namespaces: [bad]}}]",
        ),
        (
            "allow",
            "rules:\n- from: [{source: {principals: [cluster.local/ns/default/sa/a]}}]",
        ),
        ("audit", "action: AUDIT\nrules: [{}]"),
        (
            "custom",
            "action: CUSTOM\nprovider: {name: ext}\nrules: [{}]",
        ),
        ("dry-allow", "rules: [{}]"),
        // Selects another workload.
        (
            "other",
            "selector: {matchLabels: {app: other}}\naction: DENY\nrules: [{}]",
        ),
    ]);
    let snap = snapshot(set, &[]);
    let l = listener_of(&snap, &proxy(&[]), 7070).unwrap();
    let h = hcm(&l);
    let names: Vec<&str> = h.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            RBAC_DENY_FILTER,
            RBAC_ALLOW_FILTER,
            super::super::ROUTER_FILTER
        ]
    );
    let deny = rbac_of(&h.http_filters[0]);
    assert_eq!(deny.action, rbac::Action::Deny as i32);
    assert_eq!(
        policy_names(&deny),
        BTreeSet::from(["default-deny-0", "default-deny-1"])
    );
    let allow = rbac_of(&h.http_filters[1]);
    assert_eq!(allow.action, rbac::Action::Allow as i32);
    // The dry-run policy, AUDIT and CUSTOM are not applied.
    assert_eq!(policy_names(&allow), BTreeSet::from(["default-allow-0"]));
    // The principal as on sidecars: the SPIFFE id.
    let text = format!("{:?}", allow.policies["default-allow-0"]);
    assert!(
        text.contains("spiffe://cluster.local/ns/default/sa/a"),
        "{text}"
    );
}

#[test]
fn an_allow_policy_with_nothing_to_allow_still_denies_everything() {
    // `rules: []` allows nothing; only a dry-run ALLOW installs no filter.
    let snap = snapshot(authorization_policies(&[("none", "action: ALLOW")]), &[]);
    let h = hcm(&listener_of(&snap, &proxy(&[]), 7070).unwrap());
    assert_eq!(h.http_filters[0].name, RBAC_ALLOW_FILTER);
    let allow = rbac_of(&h.http_filters[0]);
    assert_eq!(
        allow.policies.get("default-none-0"),
        Some(&authz::never_matching())
    );
    let snap = snapshot(authorization_policies(&[("dry-run", "rules: [{}]")]), &[]);
    let h = hcm(&listener_of(&snap, &proxy(&[]), 7070).unwrap());
    assert_eq!(h.http_filters.len(), 1, "the router alone");
}

fn any_perm() -> Permission {
    Permission {
        rule: Some(permission::Rule::Any(true)),
    }
}

fn not_perm(p: Permission) -> Permission {
    Permission {
        rule: Some(permission::Rule::NotRule(Box::new(p))),
    }
}

fn header_perm(name: &str) -> Permission {
    Permission {
        rule: Some(permission::Rule::Header(HeaderMatcher {
            name: name.into(),
            ..Default::default()
        })),
    }
}

fn template_perm() -> Permission {
    Permission {
        rule: Some(permission::Rule::UriTemplate(Default::default())),
    }
}

#[test]
fn matchers_grpc_rejects_stand_for_always_or_never_on_the_safe_side() {
    let and = |rules: Vec<Permission>| Permission {
        rule: Some(permission::Rule::AndRules(permission::Set { rules })),
    };
    // ALLOW (narrower): a template never matches; under `not` it always does.
    let mut p = and(vec![template_perm(), not_perm(template_perm())]);
    assert!(fit_permission(&mut p, false));
    assert_eq!(p, and(vec![not_perm(any_perm()), not_perm(any_perm())]));
    // DENY (wider): the reverse.
    let mut p = and(vec![
        header_perm("Grpc-Tag"),
        not_perm(header_perm(":scheme")),
    ]);
    assert!(fit_permission(&mut p, true));
    assert_eq!(p, and(vec![any_perm(), not_perm(not_perm(any_perm()))]));
    // What gRPC accepts stays as it is.
    let mut p = and(vec![
        header_perm(":authority"),
        not_perm(header_perm("x-tag")),
    ]);
    let before = p.clone();
    assert!(!fit_permission(&mut p, true));
    assert_eq!(p, before);
    // Principals likewise.
    let mut id = Principal {
        identifier: Some(principal::Identifier::NotId(Box::new(Principal {
            identifier: Some(principal::Identifier::FilterState(Default::default())),
        }))),
    };
    assert!(fit_principal(&mut id, false));
    assert_eq!(
        id,
        Principal {
            identifier: Some(principal::Identifier::NotId(Box::new(Principal {
                identifier: Some(principal::Identifier::Any(true)),
            }))),
        }
    );
}

#[test]
fn policies_with_path_templates_and_grpc_headers_are_sent_in_a_form_grpc_accepts() {
    let set = authorization_policies(&[
        (
            "allow",
            "rules:\n- to: [{operation: {paths: ['/pkg.Svc/{*}']}}]\n- to: [{operation: {paths: [/pkg.Svc/Get]}}]",
        ),
        (
            "deny",
            "action: DENY\nrules:\n- when: [{key: 'request.headers[grpc-tag]', values: [x]}]",
        ),
    ]);
    let snap = snapshot(set, &[]);
    let h = hcm(&listener_of(&snap, &proxy(&[]), 7070).unwrap());
    let text = format!("{:?}", h.http_filters);
    assert!(
        !text.contains("UriTemplate") && !text.contains("grpc-tag"),
        "{text}"
    );
    // Both rules are still there; the one with the template allows nothing.
    let allow = rbac_of(&h.http_filters[1]);
    assert_eq!(policy_names(&allow).len(), 2);
    assert!(format!("{:?}", allow.policies["default-allow-1"]).contains("/pkg.Svc/Get"));
}

fn destination_rule(yaml: &str) -> ConfigSet {
    ConfigSet {
        destination_rules: vec![config("echo", 10, spec(yaml))],
        ..Default::default()
    }
}

fn cluster_tls(set: ConfigSet, name: &str) -> Option<Vec<String>> {
    let snap = snapshot(set, &[]);
    let out = fetch(&snap, &proxy(&[]), TypeUrl::Cluster, &[name.to_string()]);
    let c = Cluster::decode(out[0].body.value.clone()).unwrap();
    c.transport_socket.as_ref().map(|s| {
        let tls: UpstreamTlsContext = tls_of(s);
        let (cert, root, sans) = providers(tls.common_tls_context.as_ref().unwrap());
        assert_eq!(
            (cert.as_str(), root.as_str()),
            ("default/default", "default/ROOTCA")
        );
        sans
    })
}

#[test]
fn clients_use_istio_mtls_only_where_the_destination_rule_says_istio_mutual() {
    let default = format!("outbound|7070||{ECHO}");
    let v1 = format!("outbound|7070|v1|{ECHO}");
    let echo = vec!["spiffe://cluster.local/ns/default/sa/echo".to_string()];
    // No rule, even toward a STRICT namespace: plaintext, as Istio (no auto mTLS).
    assert_eq!(
        cluster_tls(peer_authentications(&["mtls: {mode: STRICT}"]), &default),
        None
    );
    let rule = "
host: echo
trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
subsets:
- {name: v1, labels: {version: v1}, trafficPolicy: {tls: {mode: DISABLE}}}
- {name: v2, labels: {version: v2}, trafficPolicy: {tls: {mode: ISTIO_MUTUAL, subjectAltNames: [spiffe://x/y]}}}
- {name: v3, labels: {version: v3}, trafficPolicy: {tls: {mode: SIMPLE}}}
";
    // The service's identities (its endpoints' service accounts).
    assert_eq!(cluster_tls(destination_rule(rule), &default), Some(echo));
    assert_eq!(cluster_tls(destination_rule(rule), &v1), None);
    assert_eq!(
        cluster_tls(destination_rule(rule), &format!("outbound|7070|v2|{ECHO}")),
        Some(vec!["spiffe://x/y".to_string()])
    );
    assert_eq!(
        cluster_tls(destination_rule(rule), &format!("outbound|7070|v3|{ECHO}")),
        None
    );
}

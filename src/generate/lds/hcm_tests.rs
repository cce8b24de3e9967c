//! The connection managers of each class, field by field against Istio's builders, on
//! the listeners a sidecar (inbound and outbound) and a gateway really get.

use envoy_types::pb::envoy::config::listener::v3::{FilterChain, Listener};
use envoy_types::pb::envoy::config::route::v3::{route, route_action};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_api::mesh::v1alpha1::mesh_config::ProxyPathNormalization;
use meshfed_api::networking::v1alpha3::{Gateway, Port as GwPort, Server};
use meshfed_api::security::v1beta1 as sec;
use prost::{Message, Name};

use super::super::tests::{default_mesh, proxy, proxy_with, service, snapshot};
use super::super::{InboundPort, VIRTUAL_INBOUND, gateway_listeners, sidecar_listeners};
use super::*;
use crate::generate::simulate::{Call, CallMode, RouteOutcome, simulate_call_without_cds};
use crate::mesh::MeshSettings;
use crate::push::config_index::{Config, ConfigSet};

const SIDECAR: &str = "sidecar~10.0.0.1~a-1.default~default.svc.cluster.local";
const ROUTER: &str = "router~10.0.0.9~gw.istio-system~istio-system.svc.cluster.local";

fn config<T>(name: &str, namespace: &str, spec: T) -> Config<T> {
    Config {
        name: name.into(),
        namespace: namespace.into(),
        labels: Default::default(),
        annotations: Default::default(),
        creation_time: std::time::UNIX_EPOCH,
        spec,
    }
}

fn mesh(edit: impl FnOnce(&mut MeshConfig)) -> MeshSettings {
    let mut m = default_mesh();
    edit(&mut m.config);
    m
}

/// A DENY policy on paths `/admin*` for `labels`.
fn deny_admin(namespace: &str, labels: (&str, &str)) -> Config<sec::AuthorizationPolicy> {
    config(
        "deny-admin",
        namespace,
        sec::AuthorizationPolicy {
            selector: Some(meshfed_api::r#type::v1beta1::WorkloadSelector {
                match_labels: [(labels.0.to_string(), labels.1.to_string())].into(),
            }),
            action: sec::authorization_policy::Action::Deny as i32,
            rules: vec![sec::Rule {
                to: vec![sec::rule::To {
                    operation: Some(sec::Operation {
                        paths: vec!["/admin*".into()],
                        ..Default::default()
                    }),
                }],
                ..Default::default()
            }],
            ..Default::default()
        },
    )
}

/// Service `a` (HTTP 8080, gRPC 9090), a Gateway with an HTTP server on 80, and
/// `policies`.
fn world(mesh: MeshSettings, policies: Vec<Config<sec::AuthorizationPolicy>>) -> Snapshot {
    let gateway = Gateway {
        selector: [("istio".to_string(), "ingressgateway".to_string())].into(),
        servers: vec![Server {
            port: Some(GwPort {
                number: 80,
                protocol: "HTTP".into(),
                name: "http".into(),
                ..Default::default()
            }),
            hosts: vec!["*".into()],
            ..Default::default()
        }],
    };
    let set = ConfigSet {
        gateways: vec![config("gw", "istio-system", gateway)],
        authorization_policies: policies,
        ..Default::default()
    };
    snapshot(
        vec![service(
            "a.default.svc.cluster.local",
            "default",
            "10.96.0.1",
            &[
                ("http", 8080, Protocol::Http),
                ("grpc", 9090, Protocol::Grpc),
            ],
        )],
        set,
        mesh,
    )
}

fn inbound_ports() -> [InboundPort; 2] {
    [
        InboundPort::for_protocol(8080, Protocol::Http),
        InboundPort::for_protocol(9090, Protocol::Grpc),
    ]
}

fn sidecar(snap: &Snapshot) -> Vec<Listener> {
    let p = proxy(SIDECAR, serde_json::json!({"app": "a"}));
    sidecar_listeners(snap, &p.client_view(), &inbound_ports())
}

fn gateway(snap: &Snapshot, metadata: serde_json::Value) -> Vec<Listener> {
    let mut meta = serde_json::json!({"LABELS": {"istio": "ingressgateway"}});
    for (k, v) in metadata.as_object().unwrap() {
        meta[k] = v.clone();
    }
    let p = proxy_with(ROUTER, meta);
    gateway_listeners(snap, &p.client_view(), &[])
}

fn hcm_of(chain: &FilterChain) -> Option<HttpConnectionManager> {
    chain.filters.iter().find_map(|f| match &f.config_type {
        Some(filter::ConfigType::TypedConfig(any))
            if any.type_url == HttpConnectionManager::type_url() =>
        {
            Some(HttpConnectionManager::decode(any.value.as_slice()).unwrap())
        }
        _ => None,
    })
}

fn listener<'a>(listeners: &'a [Listener], name: &str) -> &'a Listener {
    listeners.iter().find(|l| l.name == name).expect(name)
}

/// The first connection manager of the chain of `virtualInbound` named `name`.
fn inbound_hcm(listeners: &[Listener], name: &str) -> HttpConnectionManager {
    listener(listeners, VIRTUAL_INBOUND)
        .filter_chains
        .iter()
        .filter(|c| c.name == name)
        .find_map(hcm_of)
        .expect(name)
}

fn only_hcm(l: &Listener) -> HttpConnectionManager {
    l.filter_chains
        .iter()
        .chain(l.default_filter_chain.iter())
        .find_map(hcm_of)
        .expect(&l.name)
}

/// The sidecar's inbound (port 8080) and outbound (0.0.0.0_8080) connection managers
/// and the gateway's (0.0.0.0_80).
fn three(
    snap: &Snapshot,
    router_metadata: serde_json::Value,
) -> [(&'static str, HttpConnectionManager); 3] {
    let side = sidecar(snap);
    let gw = gateway(snap, router_metadata);
    [
        ("inbound", inbound_hcm(&side, "0.0.0.0_8080")),
        ("outbound", only_hcm(listener(&side, "0.0.0.0_8080"))),
        ("gateway", only_hcm(listener(&gw, "0.0.0.0_80"))),
    ]
}

fn names(hcm: &HttpConnectionManager) -> Vec<&str> {
    hcm.http_filters.iter().map(|f| f.name.as_str()).collect()
}

fn zero() -> Option<PbDuration> {
    Some(PbDuration::default())
}

// Finding 1: fault and CORS filters before the router, after the authorization
// filters, everywhere.
#[test]
fn fault_and_cors_run_before_the_router_on_every_connection_manager() {
    let snap = world(
        default_mesh(),
        vec![
            deny_admin("default", ("app", "a")),
            deny_admin("istio-system", ("istio", "ingressgateway")),
        ],
    );
    let [(_, inbound), (_, outbound), (_, gw)] = three(&snap, serde_json::json!({}));
    assert_eq!(
        names(&inbound),
        [
            "envoy.filters.http.rbac",
            GRPC_STATS_FILTER,
            FAULT_FILTER,
            CORS_FILTER,
            ROUTER_FILTER
        ]
    );
    assert_eq!(
        names(&outbound),
        [
            GRPC_STATS_FILTER,
            ALPN_FILTER,
            FAULT_FILTER,
            CORS_FILTER,
            ROUTER_FILTER
        ]
    );
    assert_eq!(
        names(&gw),
        [
            "envoy.filters.http.rbac",
            GRPC_STATS_FILTER,
            ALPN_FILTER,
            FAULT_FILTER,
            CORS_FILTER,
            ROUTER_FILTER
        ]
    );
    // The names are the keys the routes' per-filter configs use.
    assert_eq!(FAULT_FILTER, crate::generate::rds::FAULT_FILTER);
    assert_eq!(CORS_FILTER, crate::generate::rds::CORS_FILTER);
    // Empty configs: everything comes from the routes.
    let fault = &inbound.http_filters[2];
    let Some(http_filter::ConfigType::TypedConfig(any)) = &fault.config_type else {
        panic!("typed")
    };
    assert_eq!(any.type_url, HttpFault::type_url());
    assert!(any.value.is_empty());
}

// Finding 2: the inbound route has no timeout and no stream limit.
#[test]
fn the_inbound_route_never_times_out() {
    let snap = world(default_mesh(), Vec::new());
    let side = sidecar(&snap);
    for chain in [
        "0.0.0.0_8080",
        "0.0.0.0_9090",
        "virtualInbound-catchall-http",
    ] {
        let hcm = inbound_hcm(&side, chain);
        let Some(http_connection_manager::RouteSpecifier::RouteConfig(rc)) = hcm.route_specifier
        else {
            panic!("{chain}: inline routes")
        };
        let r = &rc.virtual_hosts[0].routes[0];
        let Some(route::Action::Route(action)) = &r.action else {
            panic!("{chain}: forwards")
        };
        assert_eq!(action.timeout, zero(), "{chain}");
        assert_eq!(
            action.max_stream_duration,
            Some(route_action::MaxStreamDuration {
                max_stream_duration: zero(),
                grpc_timeout_header_max: zero(),
                ..Default::default()
            }),
            "{chain}"
        );
        #[allow(deprecated)]
        let grpc = action.max_grpc_timeout;
        assert_eq!(grpc, None, "{chain}");
        let retry = action.retry_policy.as_ref().expect("retry");
        assert_eq!(retry.retry_on, "reset-before-request");
        assert_eq!(retry.num_retries.map(|n| n.value), Some(2));
    }
}

// Findings 3 and 8, and the fields every class shares.
#[test]
fn websocket_upgrades_and_no_stream_idle_timeout_everywhere() {
    let snap = world(default_mesh(), Vec::new());
    for (class, hcm) in three(&snap, serde_json::json!({})) {
        assert_eq!(hcm.upgrade_configs.len(), 1, "{class}");
        assert_eq!(hcm.upgrade_configs[0].upgrade_type, "websocket", "{class}");
        assert_eq!(hcm.stream_idle_timeout, zero(), "{class}");
        assert_eq!(hcm.codec_type, CodecType::Auto as i32, "{class}");
        assert!(hcm.proxy_100_continue, "{class}");
        assert!(hcm.access_log.is_empty(), "{class}");
    }
}

// Finding 5: MeshConfig pathNormalization on every connection manager.
#[test]
fn path_normalization_follows_the_mesh_config_everywhere() {
    use NormalizationType::*;
    use PathWithEscapedSlashesAction::{KeepUnchanged, UnescapeAndForward};
    let cases = [
        (None, (false, false, KeepUnchanged)),
        (Default, (true, false, KeepUnchanged)),
        (Base, (true, false, KeepUnchanged)),
        (MergeSlashes, (true, true, KeepUnchanged)),
        (DecodeAndMergeSlashes, (true, true, UnescapeAndForward)),
    ];
    for (normalization, (normalize, merge, action)) in cases {
        let snap = world(
            mesh(|m| {
                m.path_normalization = Some(ProxyPathNormalization {
                    normalization: normalization as i32,
                })
            }),
            Vec::new(),
        );
        for (class, hcm) in three(&snap, serde_json::json!({})) {
            let what = format!("{normalization:?} {class}");
            assert_eq!(
                hcm.normalize_path.map(|b| b.value),
                Some(normalize),
                "{what}"
            );
            assert_eq!(hcm.merge_slashes, merge, "{what}");
            assert_eq!(
                hcm.path_with_escaped_slashes_action, action as i32,
                "{what}"
            );
        }
    }
    // The shipped default mesh config normalizes (BASE).
    let snap = world(default_mesh(), Vec::new());
    for (class, hcm) in three(&snap, serde_json::json!({})) {
        assert_eq!(hcm.normalize_path.map(|b| b.value), Some(true), "{class}");
    }
}

// Finding 5: a DENY on `/admin*` is not bypassed with dot segments, on the sidecar's
// inbound side and on the gateway, as long as normalization is on.
#[test]
fn deny_on_admin_paths_holds_for_dot_segments() {
    let policies = vec![
        deny_admin("default", ("app", "a")),
        deny_admin("istio-system", ("istio", "ingressgateway")),
    ];
    let inbound = |path: &str| {
        Call::http(8080)
            .to("10.0.0.1")
            .path(path)
            .mode(CallMode::Inbound)
    };
    let at_gateway = |path: &str| {
        Call::http(80)
            .to("10.0.0.9")
            .host("example.com")
            .path(path)
            .mode(CallMode::Gateway)
    };
    let forbidden = RouteOutcome::DirectResponse(403);

    let snap = world(default_mesh(), policies.clone());
    let side = sidecar(&snap);
    let gw = gateway(&snap, serde_json::json!({}));
    for path in [
        "/admin",
        "/admin/users",
        "/./admin",
        "/a/../admin",
        "/x/./../admin/",
    ] {
        let r = simulate_call_without_cds(&side, &[], &inbound(path)).unwrap();
        assert_eq!(r.outcome, forbidden, "sidecar {path}");
        let r = simulate_call_without_cds(&gw, &[], &at_gateway(path)).unwrap();
        assert_eq!(r.outcome, forbidden, "gateway {path}");
    }
    let r = simulate_call_without_cds(&side, &[], &inbound("/a/../public")).unwrap();
    assert_eq!(r.request_path.as_deref(), Some("/public"));
    assert_eq!(r.cluster(), Some("inbound|8080||"));

    // Without normalization the same DENY is bypassed: the setting is what holds it.
    let snap = world(
        mesh(|m| {
            m.path_normalization = Some(ProxyPathNormalization {
                normalization: NormalizationType::None as i32,
            })
        }),
        policies,
    );
    let side = sidecar(&snap);
    let r = simulate_call_without_cds(&side, &[], &inbound("/./admin")).unwrap();
    assert_eq!(r.cluster(), Some("inbound|8080||"));
    assert_eq!(
        simulate_call_without_cds(&side, &[], &inbound("/admin"))
            .unwrap()
            .outcome,
        forbidden
    );
}

// Finding 6: `istio.alpn` on outbound and gateway connection managers, with Istio's
// overrides.
#[test]
fn alpn_override_on_outbound_and_gateway_connection_managers() {
    let snap = world(default_mesh(), Vec::new());
    for (class, hcm) in three(&snap, serde_json::json!({})) {
        let alpn = hcm.http_filters.iter().find(|f| f.name == ALPN_FILTER);
        if class == "inbound" {
            assert!(alpn.is_none());
            continue;
        }
        let Some(http_filter::ConfigType::TypedConfig(any)) =
            alpn.and_then(|f| f.config_type.clone())
        else {
            panic!("{class}: istio.alpn")
        };
        assert_eq!(
            any.type_url,
            "type.googleapis.com/istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig"
        );
        let config = alpn::FilterConfig::decode(any.value.as_slice()).unwrap();
        let overrides: Vec<(i32, Vec<&str>)> = config
            .alpn_override
            .iter()
            .map(|o| {
                (
                    o.upstream_protocol,
                    o.alpn_override.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            overrides,
            vec![
                (0, vec!["istio-http/1.0", "istio", "http/1.0"]),
                (1, vec!["istio-http/1.1", "istio", "http/1.1"]),
                (2, vec!["istio-h2", "istio", "h2"]),
            ]
        );
    }
}

// Findings 7 and 12: client certificate details, server name, remote address and
// protocol options per class.
#[test]
fn per_class_fields_follow_istio() {
    let snap = world(default_mesh(), Vec::new());
    let [(_, inbound), (_, outbound), (_, gw)] = three(&snap, serde_json::json!({}));

    assert_eq!(inbound.server_name, ISTIO_SERVER_NAME);
    assert_eq!(inbound.use_remote_address.map(|b| b.value), Some(false));
    assert_eq!(
        inbound.forward_client_cert_details,
        ForwardClientCertDetails::AppendForward as i32
    );
    assert_eq!(
        inbound.set_current_client_cert_details,
        Some(SetCurrentClientCertDetails {
            subject: Some(BoolValue { value: true }),
            uri: true,
            dns: true,
            ..Default::default()
        })
    );
    assert_eq!(inbound.http2_protocol_options, None, "HTTP/1 port");
    assert_eq!(inbound.stat_prefix, "inbound_0.0.0.0_8080");

    // Envoy's own server name outbound (Istio keeps it for compatibility).
    assert_eq!(outbound.server_name, "");
    assert_eq!(outbound.use_remote_address.map(|b| b.value), Some(false));
    assert_eq!(outbound.forward_client_cert_details, 0);
    assert_eq!(outbound.set_current_client_cert_details, None);
    assert_eq!(outbound.stat_prefix, "outbound_0.0.0.0_8080;");

    assert_eq!(gw.server_name, ISTIO_SERVER_NAME);
    assert_eq!(gw.use_remote_address.map(|b| b.value), Some(true));
    assert_eq!(gw.xff_num_trusted_hops, 0);
    assert_eq!(
        gw.forward_client_cert_details,
        ForwardClientCertDetails::SanitizeSet as i32
    );
    assert_eq!(
        gw.set_current_client_cert_details,
        Some(SetCurrentClientCertDetails {
            subject: Some(BoolValue { value: true }),
            cert: true,
            uri: true,
            dns: true,
            ..Default::default()
        })
    );
    assert_eq!(
        gw.http_protocol_options,
        Some(Http1ProtocolOptions::default())
    );

    // An HTTP/2 (gRPC) port gets HTTP/2 options inbound.
    let side = sidecar(&snap);
    let grpc = inbound_hcm(&side, "0.0.0.0_9090");
    assert_eq!(
        grpc.http2_protocol_options,
        Some(Http2ProtocolOptions::default())
    );
}

// Finding 7: a gateway's topology from its ProxyConfig.
#[test]
fn gateway_topology_sets_forwarded_client_cert_and_trusted_hops() {
    let snap = world(default_mesh(), Vec::new());
    let cases = [
        ("FORWARD_ONLY", ForwardClientCertDetails::ForwardOnly),
        ("SANITIZE", ForwardClientCertDetails::Sanitize),
        ("APPEND_FORWARD", ForwardClientCertDetails::AppendForward),
        ("SANITIZE_SET", ForwardClientCertDetails::SanitizeSet),
        (
            "ALWAYS_FORWARD_ONLY",
            ForwardClientCertDetails::AlwaysForwardOnly,
        ),
        ("UNDEFINED", ForwardClientCertDetails::SanitizeSet),
    ];
    for (name, expected) in cases {
        let meta = serde_json::json!({"PROXY_CONFIG": {"gatewayTopology": {
            "numTrustedProxies": 2, "forwardClientCertDetails": name
        }}});
        let gw = only_hcm(listener(&gateway(&snap, meta), "0.0.0.0_80"));
        assert_eq!(gw.forward_client_cert_details, expected as i32, "{name}");
        assert_eq!(gw.xff_num_trusted_hops, 2, "{name}");
    }
    // Sidecars do not read it: their listeners stay shared.
    let p = proxy_with(
        SIDECAR,
        serde_json::json!({"PROXY_CONFIG": {"gatewayTopology": {"numTrustedProxies": 2}}}),
    );
    assert_eq!(
        p.client_view().gateway_topology,
        crate::model::GatewayTopology::default()
    );
}

// Finding 9: listener filter timeouts.
#[test]
fn listener_filter_timeouts_follow_istio() {
    let five = Some(PbDuration {
        seconds: 5,
        nanos: 0,
    });
    for (mesh, expected) in [
        (
            mesh(|m| m.protocol_detection_timeout = Some(meshfed_api::Duration::from_secs(5))),
            five,
        ),
        (default_mesh(), zero()),
    ] {
        let snap = world(mesh, Vec::new());
        let side = sidecar(&snap);
        let vi = listener(&side, VIRTUAL_INBOUND);
        assert!(vi.continue_on_listener_filters_timeout);
        assert_eq!(vi.listener_filters_timeout, expected);
        // Outbound: the detection timeout where the HTTP inspector runs.
        let out = listener(&side, "0.0.0.0_8080");
        assert!(out.continue_on_listener_filters_timeout);
        assert_eq!(out.listener_filters_timeout, expected);
        // A gateway waits for the TLS handshake without limit.
        let gw = gateway(&snap, serde_json::json!({}));
        let gw = listener(&gw, "0.0.0.0_80");
        assert!(!gw.continue_on_listener_filters_timeout);
        assert_eq!(gw.listener_filters_timeout, zero());
    }
    // A bound inbound listener (Sidecar ingress, captureMode NONE) too.
    let snap = world(
        mesh(|m| m.protocol_detection_timeout = Some(meshfed_api::Duration::from_secs(5))),
        Vec::new(),
    );
    let p = proxy(SIDECAR, serde_json::json!({"app": "a"}));
    let bound = [InboundPort {
        bind: Some("127.0.0.1".into()),
        ..InboundPort::for_protocol(7000, Protocol::Http)
    }];
    let listeners = sidecar_listeners(&snap, &p.client_view(), &bound);
    let l = listener(&listeners, "127.0.0.1_7000");
    assert!(l.continue_on_listener_filters_timeout);
    assert_eq!(l.listener_filters_timeout, five);
    assert_eq!(
        l.max_connections_to_accept_per_socket_event
            .map(|v| v.value),
        Some(1)
    );
    let vi = listener(&sidecar(&snap), VIRTUAL_INBOUND).clone();
    assert_eq!(vi.max_connections_to_accept_per_socket_event, None);
}

// Istio's TestUseRemoteAddressInternalAddressConfig (listener_builder_test.go): a
// connection manager that uses the remote address (a gateway's) treats meshNetworks'
// `fromCidr` ranges as internal, sorted; none without ranges. Sidecars' do not.
#[test]
fn gateways_treat_mesh_network_ranges_as_internal() {
    use meshfed_api::mesh::v1alpha1::network::{NetworkEndpoints, network_endpoints::Ne};
    use meshfed_api::mesh::v1alpha1::{MeshNetworks, Network};
    let with_networks = |networks: MeshNetworks| {
        let mut m = default_mesh();
        m.networks = networks;
        world(m, Vec::new())
    };
    let cidrs = |snap: &Snapshot| {
        let [(_, inbound), (_, outbound), (_, gw)] = three(snap, serde_json::json!({}));
        assert_eq!(inbound.internal_address_config, None);
        assert_eq!(outbound.internal_address_config, None);
        gw.internal_address_config.map(|c| {
            c.cidr_ranges
                .into_iter()
                .map(|r| format!("{}/{}", r.address_prefix, r.prefix_len.unwrap().value))
                .collect::<Vec<_>>()
        })
    };
    // No networks, and networks without CIDRs.
    assert_eq!(cidrs(&with_networks(MeshNetworks::default())), None);
    let registry_only = MeshNetworks {
        networks: [(
            "n1".to_string(),
            Network {
                endpoints: vec![NetworkEndpoints {
                    ne: Some(Ne::FromRegistry("c1".into())),
                }],
                ..Default::default()
            },
        )]
        .into(),
    };
    assert_eq!(cidrs(&with_networks(registry_only)), None);
    let populated = MeshNetworks {
        networks: [(
            "default".to_string(),
            Network {
                endpoints: vec![
                    NetworkEndpoints {
                        ne: Some(Ne::FromCidr("192.168.0.0/16".into())),
                    },
                    NetworkEndpoints {
                        ne: Some(Ne::FromCidr("172.16.0.0/12".into())),
                    },
                ],
                ..Default::default()
            },
        )]
        .into(),
    };
    assert_eq!(
        cidrs(&with_networks(populated)),
        Some(vec![
            "172.16.0.0/12".to_string(),
            "192.168.0.0/16".to_string()
        ])
    );
}

// Istio's listener_test.go vectors on connection managers, without the telemetry
// filters (`istio.metadata_exchange`, `istio.stats`, Wasm) another part adds:
// - verifyFilterChainMatch (TestInboundListenerConfig): every inbound HTTP chain,
//   passthrough ones included, runs grpc_stats, fault, cors, router;
// - testInboundListenerConfigWithGrpc: a gRPC port's chain has grpc_stats;
// - "wasm, stats, authz": CUSTOM ext_authz, then the other RBAC, before grpc_stats;
// - TestOutboundListenerConfig_TCPFailThrough / verifyHTTPFilterChainMatch /
//   verifyListenerFilters: the outbound HTTP chain matches raw_buffer with the
//   plaintext HTTP ALPNs and carries istio.alpn, the default chain passes through, the
//   listener runs the TLS then the HTTP inspector;
// - testOutboundListenerConflict: the sniffed listener's filter timeout is the mesh's
//   protocolDetectionTimeout (5s).
#[test]
fn istio_listener_test_vectors() {
    let snap = world(
        mesh(|m| m.protocol_detection_timeout = Some(meshfed_api::Duration::from_secs(5))),
        Vec::new(),
    );
    let side = sidecar(&snap);
    let vi = listener(&side, VIRTUAL_INBOUND);
    let http_chains: Vec<&FilterChain> = vi
        .filter_chains
        .iter()
        .filter(|c| hcm_of(c).is_some())
        .collect();
    // Passthrough (mTLS and plain), 8080 and 9090 (mTLS and plain each).
    assert_eq!(http_chains.len(), 6);
    for c in http_chains {
        assert_eq!(
            names(&hcm_of(c).unwrap()),
            [GRPC_STATS_FILTER, FAULT_FILTER, CORS_FILTER, ROUTER_FILTER],
            "{}",
            c.name
        );
    }

    let out = listener(&side, "0.0.0.0_8080");
    assert_eq!(out.filter_chains.len(), 1);
    let m = out.filter_chains[0].filter_chain_match.clone().unwrap();
    assert_eq!(m.transport_protocol, "raw_buffer");
    assert_eq!(m.application_protocols, ["http/1.1", "h2c"]);
    assert!(names(&hcm_of(&out.filter_chains[0]).unwrap()).contains(&ALPN_FILTER));
    let default = out.default_filter_chain.as_ref().expect("passthrough");
    assert_eq!(
        crate::generate::lds::references(&Listener {
            filter_chains: vec![default.clone()],
            ..Default::default()
        })
        .0,
        vec![crate::xds::names::PASSTHROUGH]
    );
    let inspectors: Vec<&str> = out
        .listener_filters
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(
        inspectors,
        [
            "envoy.filters.listener.tls_inspector",
            "envoy.filters.listener.http_inspector"
        ]
    );
    assert_eq!(out.listener_filters_timeout.map(|d| d.seconds), Some(5));

    // CUSTOM (ext_authz behind its RBAC), then DENY.
    let mut m = default_mesh();
    m.config.extension_providers = serde_json::from_value(serde_json::json!([
        {"name": "extauthz", "envoyExtAuthzGrpc": {"service": "a.default.svc.cluster.local", "port": 9090}}
    ]))
    .unwrap();
    let mut custom = deny_admin("default", ("app", "a"));
    custom.name = "custom".into();
    custom.spec.action = sec::authorization_policy::Action::Custom as i32;
    custom.spec.action_detail = Some(sec::authorization_policy::ActionDetail::Provider(
        sec::authorization_policy::ExtensionProvider {
            name: "extauthz".into(),
        },
    ));
    let snap = world(m, vec![custom, deny_admin("default", ("app", "a"))]);
    let side = sidecar(&snap);
    assert_eq!(
        names(&inbound_hcm(&side, "0.0.0.0_8080")),
        [
            "envoy.filters.http.rbac",
            "envoy.filters.http.ext_authz",
            "envoy.filters.http.rbac",
            GRPC_STATS_FILTER,
            FAULT_FILTER,
            CORS_FILTER,
            ROUTER_FILTER
        ]
    );
}

// The proxy's metadata `HTTP10` and `IDLE_TIMEOUT` reach every connection manager
// (Istio's enableHTTP10 and the node's IdleTimeout).
#[test]
fn http10_and_idle_timeout_from_the_proxy_metadata() {
    let snap = world(default_mesh(), Vec::new());
    let meta = serde_json::json!({"HTTP10": "1", "IDLE_TIMEOUT": "90s", "LABELS": {"app": "a"}});
    let side = sidecar_listeners(
        &snap,
        &proxy_with(SIDECAR, meta).client_view(),
        &inbound_ports(),
    );
    let gw = gateway(
        &snap,
        serde_json::json!({"HTTP10": "1", "IDLE_TIMEOUT": "90s"}),
    );
    let expected_idle = Some(PbDuration {
        seconds: 90,
        nanos: 0,
    });
    for (class, hcm) in [
        ("inbound", inbound_hcm(&side, "0.0.0.0_8080")),
        ("outbound", only_hcm(listener(&side, "0.0.0.0_8080"))),
        ("gateway", only_hcm(listener(&gw, "0.0.0.0_80"))),
    ] {
        assert_eq!(
            hcm.http_protocol_options.map(|o| o.accept_http_10),
            Some(true),
            "{class}"
        );
        assert_eq!(
            hcm.common_http_protocol_options
                .and_then(|o| o.idle_timeout),
            expected_idle,
            "{class}"
        );
    }
    // Inbound TCP proxies close idle connections after it too (Istio's
    // buildInboundNetworkFilters); the passthrough TCP chains included.
    let tcp_chains: Vec<&FilterChain> = listener(&side, VIRTUAL_INBOUND)
        .filter_chains
        .iter()
        .filter(|c| c.name == VIRTUAL_INBOUND)
        .collect();
    assert!(!tcp_chains.is_empty());
    for c in tcp_chains {
        let tcp = c
            .filters
            .iter()
            .find_map(|f| match &f.config_type {
                Some(filter::ConfigType::TypedConfig(any))
                    if any.type_url
                        == envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy::type_url() =>
                {
                    Some(
                        envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy::decode(
                            any.value.as_slice(),
                        )
                        .unwrap(),
                    )
                }
                _ => None,
            })
            .expect("tcp proxy");
        assert_eq!(tcp.idle_timeout, expected_idle);
    }
    // Without them: Envoy's defaults (a gateway still sends empty HTTP/1 options).
    let [(_, inbound), (_, outbound), (_, gw)] = three(&snap, serde_json::json!({}));
    assert_eq!(inbound.http_protocol_options, None);
    assert_eq!(outbound.http_protocol_options, None);
    assert_eq!(
        gw.http_protocol_options,
        Some(Http1ProtocolOptions::default())
    );
    assert_eq!(inbound.common_http_protocol_options, None);
}

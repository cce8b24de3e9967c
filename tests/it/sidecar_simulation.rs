//! Istio's sidecar simulation vectors (`pilot/pkg/networking/core/sidecar_simulation_test.go`)
//! run against meshfed: each scenario is Istio config (ServiceEntries, VirtualServices,
//! Sidecars through the config directory; Kubernetes Services through the mock
//! registry), one in-process control plane, one sidecar's LDS/RDS/CDS, and the calls
//! Istio makes with its expected outcome, checked with `simulate_call`.
//!
//! Vectors meshfed does not pass yet are listed in [`KNOWN_GAPS`] with the reason; the
//! test fails when a vector outside the list fails and when a listed one passes (the
//! list must shrink as gaps close).

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, route, route_action};
use meshfed::generate::simulate::{Call, CallMode, CallResult, SimError, simulate_call};
use meshfed::testing::{AdsClient, FakeServer, ProxyConfig, node_with};
use meshfed_registry::{Endpoint, Protocol, Resolution, Service, ServiceKey};

use crate::support::*;

/// Vectors expected to fail today: (vector name, reason). Empty: every ported vector
/// passes.
const KNOWN_GAPS: &[(&str, &str)] = &[];

/// What Istio expects of a call; `None` fields are not checked, `error: None` means
/// the call must succeed.
#[derive(Clone, Debug, Default)]
struct Expect {
    /// Start of the error's message (`no filter chain`, `protocol error`, ...).
    error: Option<&'static str>,
    listener: Option<String>,
    filter_chain: Option<String>,
    virtual_host: Option<String>,
    route: Option<String>,
    cluster: Option<String>,
}

impl Expect {
    fn cluster(c: &str) -> Expect {
        Expect {
            cluster: Some(c.to_string()),
            ..Default::default()
        }
    }

    fn ok() -> Expect {
        Expect::default()
    }

    fn virtual_host(vh: &str) -> Expect {
        Expect {
            virtual_host: Some(vh.to_string()),
            ..Default::default()
        }
    }
}

enum Check {
    /// A simulated call and what it must reach.
    Call(Box<(Call, Expect)>),
    /// In route table `route`, the virtual host serving `domain` routes to exactly
    /// these clusters (`None`: no virtual host has the domain) — Istio's
    /// `xdstest.ExtractVirtualHosts`.
    Domain {
        route: &'static str,
        domain: String,
        clusters: Option<Vec<String>>,
    },
    /// The proxy's `inbound|…` clusters are exactly these, with these static
    /// endpoints (`ip:port` or a socket path; empty: none).
    InboundClusters(BTreeMap<String, Vec<String>>),
    /// The hosts of each `inbound|…` cluster's `istio.services` metadata (the
    /// telemetry of Istio's TestInboundClusters; clusters not listed have none).
    InboundTelemetry(BTreeMap<String, Vec<String>>),
    /// No cluster names this host.
    NoClusterFor(&'static str),
    /// The inline (DNS) load assignment of `cluster` puts each endpoint address at this
    /// priority (Istio's loadbalancer simulation vectors).
    Priorities {
        cluster: &'static str,
        want: BTreeMap<String, u32>,
    },
}

struct Vector {
    name: String,
    check: Check,
}

/// One control plane, one sidecar, several vectors.
struct Scenario {
    istio: String,
    mesh: Option<&'static str>,
    services: Vec<(Service, Vec<Endpoint>)>,
    /// The sidecar's namespace.
    namespace: &'static str,
    /// The sidecar's IP (node id).
    node_ip: &'static str,
    /// Extra node metadata.
    metadata: serde_json::Value,
    vectors: Vec<Vector>,
}

impl Scenario {
    fn new(istio: impl Into<String>) -> Scenario {
        Scenario {
            istio: istio.into(),
            mesh: None,
            services: Vec::new(),
            namespace: "default",
            node_ip: "1.1.1.1",
            metadata: serde_json::json!({}),
            vectors: Vec::new(),
        }
    }

    fn call(&mut self, name: String, call: Call, expect: Expect) {
        self.vectors.push(Vector {
            name,
            check: Check::Call(Box::new((call, expect))),
        });
    }
}

struct Proxy {
    listeners: Vec<Listener>,
    routes: Vec<RouteConfiguration>,
    clusters: Vec<Cluster>,
}

async fn fetch(scenario: &Scenario) -> (FakeServer, Proxy) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("istio.yaml"), &scenario.istio).unwrap();
    let mesh_file = dir.path().join("mesh.yaml.conf");
    let mut builder = FakeServer::builder().config_dir(dir.path());
    if let Some(mesh) = scenario.mesh {
        std::fs::write(&mesh_file, mesh).unwrap();
        let path = mesh_file.clone();
        builder = builder.configure(move |c| c.mesh_config = Some(path));
    }
    let server = builder.start().await.unwrap();
    let reg = server.mock_registry("c1");
    for (svc, eps) in &scenario.services {
        reg.add_service(svc.clone());
        if !eps.is_empty() {
            reg.set_endpoints(
                &ServiceKey::new(svc.hostname.clone(), svc.namespace.clone()),
                eps.clone(),
            );
        }
    }
    ready_and_synced(&server).await;
    let ns = scenario.namespace;
    let ip = scenario.node_ip;
    let mut metadata = scenario.metadata.clone();
    metadata["NAMESPACE"] = ns.into();
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            &format!("sidecar~{ip}~app.{ns}~{ns}.svc.cluster.local"),
            metadata,
        ),
    )
    .await
    .unwrap();
    let ProxyConfig {
        clusters,
        listeners,
        routes,
    } = client.fetch_config().await.unwrap();
    (
        server,
        Proxy {
            listeners,
            routes,
            clusters,
        },
    )
}

fn compare(got: &Result<CallResult, SimError>, want: &Expect) -> Result<(), String> {
    let r = match (got, want.error) {
        (Err(e), Some(w)) if e.to_string().starts_with(w) => return Ok(()),
        (Err(e), _) => return Err(format!("error {e}")),
        (Ok(r), Some(w)) => return Err(format!("wanted error {w:?}, got {r:?}")),
        (Ok(r), None) => r,
    };
    let field = |what: &str, want: &Option<String>, got: Option<&str>| match want {
        Some(w) if got != Some(w.as_str()) => Err(format!("{what}: wanted {w:?}, got {got:?}")),
        _ => Ok(()),
    };
    field("listener", &want.listener, Some(&r.listener))?;
    field("filter chain", &want.filter_chain, Some(&r.filter_chain))?;
    field(
        "virtual host",
        &want.virtual_host,
        r.virtual_host.as_deref(),
    )?;
    field("route", &want.route, r.route.as_deref())?;
    field("cluster", &want.cluster, r.cluster())
        .map_err(|e| format!("{e} (outcome {:?}, chain {:?})", r.outcome, r.filter_chain))
}

/// Domain → clusters of the virtual host's single-cluster routes.
fn domains(rc: &RouteConfiguration) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for vh in &rc.virtual_hosts {
        let dests: Vec<String> = vh
            .routes
            .iter()
            .filter_map(|r| match &r.action {
                Some(route::Action::Route(a)) => match &a.cluster_specifier {
                    Some(route_action::ClusterSpecifier::Cluster(c)) => Some(c.clone()),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        for d in &vh.domains {
            out.insert(d.clone(), dests.clone());
        }
    }
    out
}

/// A cluster's static endpoints, as `ip:port` or socket path.
fn static_endpoints(c: &Cluster) -> Vec<String> {
    use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
    use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint;
    let mut out = Vec::new();
    for group in c.load_assignment.iter().flat_map(|la| &la.endpoints) {
        for lb in &group.lb_endpoints {
            let Some(lb_endpoint::HostIdentifier::Endpoint(e)) = &lb.host_identifier else {
                continue;
            };
            match e.address.as_ref().and_then(|a| a.address.as_ref()) {
                Some(address::Address::SocketAddress(sa)) => {
                    let port = match sa.port_specifier {
                        Some(socket_address::PortSpecifier::PortValue(p)) => p,
                        _ => 0,
                    };
                    out.push(format!("{}:{port}", sa.address));
                }
                Some(address::Address::Pipe(p)) => out.push(p.path.clone()),
                _ => {}
            }
        }
    }
    out
}

/// The hosts of a cluster's `filter_metadata.istio.services`.
fn metadata_services(c: &Cluster) -> Vec<String> {
    use envoy_types::pb::google::protobuf::value::Kind;
    let Some(list) = c
        .metadata
        .as_ref()
        .and_then(|m| m.filter_metadata.get("istio"))
        .and_then(|s| s.fields.get("services"))
        .and_then(|v| match &v.kind {
            Some(Kind::ListValue(l)) => Some(l),
            _ => None,
        })
    else {
        return Vec::new();
    };
    list.values
        .iter()
        .filter_map(|v| match &v.kind {
            Some(Kind::StructValue(s)) => s.fields.get("host"),
            _ => None,
        })
        .filter_map(|h| match &h.kind {
            Some(Kind::StringValue(h)) => Some(h.clone()),
            _ => None,
        })
        .collect()
}

fn run_check(proxy: &Proxy, check: &Check) -> Result<(), String> {
    match check {
        Check::NoClusterFor(host) => {
            let named: Vec<&str> = proxy
                .clusters
                .iter()
                .map(|c| c.name.as_str())
                .filter(|n| n.ends_with(&format!("|{host}")))
                .collect();
            if named.is_empty() {
                Ok(())
            } else {
                Err(format!("clusters of {host}: {named:?}"))
            }
        }
        Check::Priorities { cluster, want } => {
            use envoy_types::pb::envoy::config::core::v3::address;
            use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint;
            let Some(c) = proxy.clusters.iter().find(|c| c.name == *cluster) else {
                return Err(format!("cluster {cluster} not served"));
            };
            let mut got = BTreeMap::new();
            for group in c.load_assignment.iter().flat_map(|la| &la.endpoints) {
                for lb in &group.lb_endpoints {
                    if let Some(lb_endpoint::HostIdentifier::Endpoint(e)) = &lb.host_identifier
                        && let Some(address::Address::SocketAddress(sa)) =
                            e.address.as_ref().and_then(|a| a.address.as_ref())
                    {
                        got.insert(sa.address.clone(), group.priority);
                    }
                }
            }
            if &got == want {
                Ok(())
            } else {
                Err(format!(
                    "{cluster} priorities: wanted {want:?}, got {got:?}"
                ))
            }
        }
        Check::InboundTelemetry(want) => {
            let got: BTreeMap<String, Vec<String>> = proxy
                .clusters
                .iter()
                .filter(|c| c.name.starts_with("inbound"))
                .map(|c| (c.name.clone(), metadata_services(c)))
                .filter(|(_, s)| !s.is_empty())
                .collect();
            if &got == want {
                Ok(())
            } else {
                Err(format!("inbound telemetry: wanted {want:?}, got {got:?}"))
            }
        }
        Check::InboundClusters(want) => {
            let got: BTreeMap<String, Vec<String>> = proxy
                .clusters
                .iter()
                .filter(|c| c.name.starts_with("inbound"))
                .map(|c| (c.name.clone(), static_endpoints(c)))
                .collect();
            if &got == want {
                Ok(())
            } else {
                Err(format!("inbound clusters: wanted {want:?}, got {got:?}"))
            }
        }
        Check::Call(c) => compare(
            &simulate_call(&proxy.listeners, &proxy.routes, &proxy.clusters, &c.0),
            &c.1,
        ),
        Check::Domain {
            route,
            domain,
            clusters,
        } => {
            let Some(rc) = proxy.routes.iter().find(|r| r.name == *route) else {
                return Err(format!("route table {route} not served"));
            };
            let got = domains(rc).get(domain).cloned().filter(|c| !c.is_empty());
            let want = clusters.clone().filter(|c| !c.is_empty());
            if got == want {
                Ok(())
            } else {
                Err(format!("{domain}: wanted {want:?}, got {got:?}"))
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Vectors

const PASSTHROUGH_PORTS: &str = "
  ports:
  - {name: http, number: 80, protocol: HTTP}
  - {name: auto, number: 81}
  - {name: tcp, number: 82, protocol: TCP}
  - {name: tls, number: 83, protocol: TLS}
  - {name: https, number: 84, protocol: HTTPS}
  - {name: grpc, number: 85, protocol: GRPC}
  - {name: h2, number: 86, protocol: HTTP2}
";

/// TestPassthroughTraffic: calls to an unknown address on ports that a ServiceEntry
/// (with and without VIP) declares go to PassthroughCluster (ALLOW_ANY) or are blocked
/// (REGISTRY_ONLY: BlackHoleCluster, or the `block_all` 502 for HTTP on HTTP ports).
fn passthrough_traffic() -> Vec<Scenario> {
    let mut out = Vec::new();
    for mode in ["REGISTRY_ONLY", "ALLOW_ANY"] {
        let cluster = if mode == "REGISTRY_ONLY" {
            "BlackHoleCluster"
        } else {
            "PassthroughCluster"
        };
        for vip in [true, false] {
            let addresses = if vip { "  addresses: [1.2.3.4]\n" } else { "" };
            let mut s = Scenario::new(format!(
                "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: se, namespace: default}}
spec:
  hosts: [istio.io]
{addresses}  location: MESH_EXTERNAL
  resolution: DNS{PASSTHROUGH_PORTS}"
            ));
            s.mesh = Some(if mode == "REGISTRY_ONLY" {
                "outboundTrafficPolicy: {mode: REGISTRY_ONLY}\n"
            } else {
                "outboundTrafficPolicy: {mode: ALLOW_ANY}\n"
            });
            let variant = if vip { "with VIP" } else { "without VIP" };
            for port in 80..87u16 {
                let calls = [
                    ("http-plaintext", Call::http(port).host("foo"), true),
                    ("http-tls", Call::http(port).tls().host("foo"), false),
                    (
                        "http-tls-http/1.1",
                        Call::http(port).tls().host("foo").alpn("http/1.1"),
                        false,
                    ),
                    ("tcp-plaintext", Call::tcp(port).host("foo"), false),
                    ("http2-tls", Call::http2(port).tls().host("foo"), false),
                ];
                for (kind, call, is_http) in calls {
                    let http_port = matches!(port, 80 | 85 | 86);
                    let mut want = Expect::cluster(cluster);
                    if cluster == "BlackHoleCluster"
                        && is_http
                        && (http_port || (!vip && port == 81))
                    {
                        want = Expect::virtual_host("block_all");
                    }
                    // Without a VIP the TCP port (and the auto port for non-HTTP) is the
                    // service's own wildcard listener: it captures everything.
                    if !vip && (port == 82 || (port == 81 && !is_http)) {
                        want = Expect::ok();
                    }
                    let (proto, rest) = kind.split_once('-').unwrap();
                    let (tls, alpn) = rest.split_once('-').unwrap_or((rest, ""));
                    let suffix = if alpn.is_empty() {
                        String::new()
                    } else {
                        format!("-{alpn}")
                    };
                    s.call(
                        format!(
                            "TestPassthroughTraffic/{mode}/{variant}/{proto}-{tls}-{port}{suffix}"
                        ),
                        call,
                        want,
                    );
                }
            }
            out.push(s);
        }
    }
    out
}

/// TestLoop: traffic addressed to the proxy's own capture ports is dropped.
fn loop_prevention() -> Scenario {
    let mut s = Scenario::new("");
    s.call(
        "TestLoop/direct request to outbound port".into(),
        Call::tcp(15001),
        Expect::cluster("BlackHoleCluster"),
    );
    s.call(
        "TestLoop/direct request to inbound port".into(),
        Call::tcp(15006),
        Expect::cluster("BlackHoleCluster"),
    );
    s
}

/// TestHeadlessServices: every protocol class of a headless service reaches its
/// cluster through the per-endpoint listeners.
fn headless_services() -> Scenario {
    let mut s = Scenario::new("");
    let ports = [
        ("http", 80, Protocol::Http),
        ("auto", 81, Protocol::Unsupported),
        ("tcp", 82, Protocol::Tcp),
        ("tls", 83, Protocol::Tls),
        ("https", 84, Protocol::Https),
    ];
    let mut svc = service("headless.default.svc.cluster.local", "default", &ports);
    svc.resolution = Resolution::Passthrough;
    let mut ep = Endpoint::new("1.2.3.4".parse().unwrap());
    for (name, port, _) in ports {
        ep = ep.with_port(name, port);
    }
    s.services.push((svc, vec![ep]));
    let fqdn = "headless.default.svc.cluster.local";
    let calls = [
        ("http-80", Call::http(80).host(fqdn)),
        ("http-81", Call::http(81).host(fqdn)),
        ("http-tls-81", Call::http(81).tls().host(fqdn)),
        ("tcp-81", Call::tcp(81).host(fqdn)),
        ("tcp-82", Call::tcp(82).host(fqdn)),
        ("tcp-tls-83", Call::tcp(83).tls().host("headless.default")),
        ("http-tls-84", Call::http(84).tls().host("headless.default")),
    ];
    for (name, call) in calls {
        let port = call.port;
        s.call(
            format!("TestHeadlessServices/{name}"),
            call.to("1.2.3.4"),
            Expect::cluster(&format!("outbound|{port}||{fqdn}")),
        );
    }
    s
}

/// A mesh-wide PeerAuthentication in the root namespace (Istio's `mtlsMode`).
fn mesh_mtls(mode: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: default, namespace: istio-system}}
spec:
  mtls: {{mode: {mode}}}
---
"
    )
}

/// What one TestInbound call reaches under a mode.
#[derive(Clone, Copy)]
enum In {
    /// The cluster.
    Cluster(&'static str),
    /// The inbound HTTP route of a port (`inbound|http|<port>` to `inbound|<port>||`).
    Http(u16),
    /// The chain and the cluster (`virtualInbound`).
    Chain(&'static str, &'static str),
    /// An error.
    Err(&'static str),
}

impl In {
    fn expect(self) -> Expect {
        match self {
            In::Cluster(c) => Expect::cluster(c),
            In::Http(port) => Expect {
                virtual_host: Some(format!("inbound|http|{port}")),
                cluster: Some(format!("inbound|{port}||")),
                ..Default::default()
            },
            In::Chain(chain, cluster) => Expect {
                listener: Some("virtualInbound".into()),
                filter_chain: Some(chain.into()),
                cluster: Some(cluster.into()),
                ..Default::default()
            },
            In::Err(e) => Expect {
                error: Some(e),
                ..Default::default()
            },
        }
    }
}

const NO_CHAIN: In = In::Err("no filter chain");
const PROTOCOL: In = In::Err("protocol error");
const MTLS: In = In::Err("invalid mTLS");

/// TestInbound: a workload of a STATIC ServiceEntry receiving TCP, HTTP and
/// unnamed-protocol ports over plaintext, TLS (not terminated) and mesh mTLS, and
/// traffic to other addresses passing through, with the mesh-wide PeerAuthentication
/// DISABLE, PERMISSIVE and STRICT: 23 calls in each of the three modes.
fn inbound() -> Vec<Scenario> {
    let se = "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: se}
spec:
  hosts: [foo.bar]
  endpoints:
  - address: 1.1.1.1
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {name: tcp, number: 70, protocol: TCP}
  - {name: http, number: 80, protocol: HTTP}
  - {name: auto, number: 81}
---
";
    let tcp70 = In::Cluster("inbound|70||");
    let auto_tcp = In::Chain("0.0.0.0_81", "inbound|81||");
    let pass = In::Cluster("InboundPassthroughCluster");
    let pass_http = In::Chain("virtualInbound-catchall-http", "InboundPassthroughCluster");
    let pass_tcp = In::Chain("virtualInbound", "InboundPassthroughCluster");
    let elsewhere = |c: Call| c.to("1.2.3.4");
    // (name, call, DISABLE, PERMISSIVE, STRICT)
    let cases: Vec<(&str, Call, [In; 3])> = vec![
        ("tcp", Call::tcp(70), [tcp70, tcp70, NO_CHAIN]),
        ("http to tcp", Call::http(70), [tcp70, tcp70, NO_CHAIN]),
        ("tls to tcp", Call::tcp(70).tls(), [tcp70, tcp70, MTLS]),
        ("https to tcp", Call::http(70).tls(), [tcp70, tcp70, MTLS]),
        (
            "mtls tcp to tcp",
            Call::tcp(70).mtls(),
            [tcp70, tcp70, tcp70],
        ),
        (
            "mtls http to tcp",
            Call::http(70).mtls(),
            [tcp70, tcp70, tcp70],
        ),
        (
            "http",
            Call::http(80),
            [In::Http(80), In::Http(80), NO_CHAIN],
        ),
        (
            "tls to http",
            Call::tcp(80).tls(),
            [PROTOCOL, NO_CHAIN, MTLS],
        ),
        (
            "https to http",
            Call::http(80).tls(),
            [PROTOCOL, NO_CHAIN, MTLS],
        ),
        (
            "mtls to http",
            Call::http(80).mtls(),
            [PROTOCOL, In::Http(80), In::Http(80)],
        ),
        ("tcp to http", Call::tcp(80), [PROTOCOL, PROTOCOL, NO_CHAIN]),
        (
            "auto port http",
            Call::http(81),
            [In::Http(81), In::Http(81), NO_CHAIN],
        ),
        (
            "auto port http2",
            Call::http2(81),
            [In::Http(81), In::Http(81), NO_CHAIN],
        ),
        (
            "auto port tcp",
            Call::tcp(81),
            [auto_tcp, auto_tcp, NO_CHAIN],
        ),
        (
            "tls to auto port",
            Call::tcp(81).tls(),
            [auto_tcp, auto_tcp, MTLS],
        ),
        (
            "https to auto port",
            Call::http(81).tls(),
            [auto_tcp, auto_tcp, MTLS],
        ),
        (
            "mtls tcp to auto port",
            Call::tcp(81).mtls(),
            [In::Cluster("inbound|81||"), auto_tcp, auto_tcp],
        ),
        (
            "mtls http to auto port",
            Call::http(81).mtls(),
            [In::Cluster("inbound|81||"), In::Http(81), In::Http(81)],
        ),
        (
            "passthrough http",
            elsewhere(Call::http(82)),
            [pass_http, pass_http, NO_CHAIN],
        ),
        (
            "passthrough tcp",
            elsewhere(Call::tcp(82)),
            [pass_tcp, pass_tcp, NO_CHAIN],
        ),
        (
            "passthrough tls",
            elsewhere(Call::tcp(82).tls()),
            [pass_tcp, pass, MTLS],
        ),
        (
            "passthrough https",
            elsewhere(Call::http(82).tls()),
            [pass, pass, MTLS],
        ),
        (
            "passthrough mtls",
            elsewhere(Call::http(82).mtls()),
            [pass, pass, pass],
        ),
    ];
    ["Disable", "Permissive", "Strict"]
        .into_iter()
        .enumerate()
        .map(|(i, variant)| {
            let mut s = Scenario::new(format!("{se}{}", mesh_mtls(&variant.to_ascii_uppercase())));
            for (name, call, want) in &cases {
                s.call(
                    format!("TestInbound/{variant}/{name}"),
                    call.clone().mode(CallMode::Inbound),
                    want[i].expect(),
                );
            }
            s
        })
        .collect()
}

/// TestInboundSidecarTLSModes: a Sidecar `ingress[].tls` (SIMPLE or MUTUAL, HTTPS or
/// TLS) on port 9080 of a workload whose PeerAuthentication is STRICT with the port
/// DISABLE (the Sidecar's TLS terminates) or STRICT (mesh mTLS wins), called over TLS,
/// plaintext and mTLS. A call names the SDS secret its chain must present to count as
/// an mTLS chain (Istio's `MtlsSecretConfigName`).
fn inbound_sidecar_tls_modes() -> Vec<Scenario> {
    let peer_auth = |mode: &str| {
        format!(
            "apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: peer-auth, namespace: default}}
spec:
  selector: {{matchLabels: {{app: foo}}}}
  mtls: {{mode: STRICT}}
  portLevelMtls:
    9080: {{mode: {mode}}}
---
"
        )
    };
    let sidecar = |protocol: &str, mode: &str, ca: &str| {
        format!(
            "apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: sidecar, namespace: default, labels: {{app: foo}}}}
spec:
  workloadSelector: {{labels: {{app: foo}}}}
  ingress:
  - defaultEndpoint: 0.0.0.0:9080
    port: {{name: tls, number: 9080, protocol: {protocol}}}
    tls:
      mode: {mode}
      privateKey: httpbinkey.pem
      serverCertificate: httpbin.pem{ca}
"
        )
    };
    let ca = "\n      caCertificates: rootCA.pem";
    let file = "file-cert:httpbin.pem~httpbinkey.pem";
    let inbound = |call: Call| call.mode(CallMode::Inbound);
    let ok = |vh: bool| Expect {
        listener: Some("virtualInbound".into()),
        filter_chain: Some("1.1.1.1_9080".into()),
        cluster: Some("inbound|9080||".into()),
        virtual_host: vh.then(|| "inbound|http|9080".into()),
        route: vh.then(|| "default".into()),
        ..Default::default()
    };
    let err = |e: &'static str| Expect {
        error: Some(e),
        ..Default::default()
    };
    type Case = (&'static str, String, Vec<(&'static str, Call, Expect)>);
    let cases: Vec<Case> = vec![
        (
            "sidecar http over TLS simple mode with peer auth on port disabled",
            peer_auth("DISABLE") + &sidecar("HTTPS", "SIMPLE", ""),
            vec![
                ("http over tls", Call::http(9080).tls(), ok(true)),
                ("plaintext", Call::http(9080), err("no filter chain")),
                (
                    "http over mTLS",
                    Call::http(9080).mtls().mtls_secret(file),
                    err("invalid mTLS"),
                ),
            ],
        ),
        (
            "sidecar TCP over TLS simple mode with peer auth on port disabled",
            peer_auth("DISABLE") + &sidecar("TLS", "SIMPLE", ""),
            vec![
                ("tcp over tls", Call::tcp(9080).tls(), ok(false)),
                ("plaintext", Call::tcp(9080), err("no filter chain")),
                (
                    "tcp over mTLS",
                    Call::tcp(9080).mtls().mtls_secret(file),
                    err("invalid mTLS"),
                ),
            ],
        ),
        (
            "sidecar http over mTLS mutual mode with peer auth on port disabled",
            peer_auth("DISABLE") + &sidecar("HTTPS", "MUTUAL", ca),
            vec![
                (
                    "http over mtls",
                    Call::http(9080).mtls().mtls_secret(file),
                    ok(false),
                ),
                ("plaintext", Call::http(9080), err("no filter chain")),
                (
                    "http over tls",
                    Call::http(9080).tls().mtls_secret(file),
                    err("invalid mTLS"),
                ),
            ],
        ),
        (
            "sidecar tcp over mTLS mutual mode with peer auth on port disabled",
            peer_auth("DISABLE") + &sidecar("TLS", "MUTUAL", ca),
            vec![
                (
                    "tcp over mtls",
                    Call::tcp(9080).mtls().mtls_secret(file),
                    ok(false),
                ),
                ("plaintext", Call::tcp(9080), err("no filter chain")),
                (
                    "http over tls",
                    Call::tcp(9080).tls().mtls_secret(file),
                    err("invalid mTLS"),
                ),
            ],
        ),
        (
            "sidecar http over TLS SIMPLE mode with peer auth on port STRICT",
            peer_auth("STRICT") + &sidecar("TLS", "MUTUAL", ca),
            vec![
                ("http over tls", Call::http(9080).tls(), err("invalid mTLS")),
                ("plaintext", Call::http(9080), err("no filter chain")),
                ("http over mtls", Call::http(9080).mtls(), ok(false)),
            ],
        ),
    ];
    cases
        .into_iter()
        .map(|(case, config, calls)| {
            let mut s = Scenario::new(config);
            s.metadata = serde_json::json!({"LABELS": {"app": "foo"}});
            for (name, call, expect) in calls {
                s.call(
                    format!("TestInboundSidecarTLSModes/{case}/{name}"),
                    inbound(call),
                    expect,
                );
            }
            s
        })
        .collect()
}

/// A PeerAuthentication of the `default` namespace selecting `app: foo`, with
/// `portLevelMtls` for port 9000 when given.
fn foo_peer_auth(mode: &str, port_9000: Option<&str>) -> String {
    let ports = port_9000
        .map(|m| format!("  portLevelMtls:\n    9000: {{mode: {m}}}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: default}}
spec:
  selector: {{matchLabels: {{app: foo}}}}
  mtls: {{mode: {mode}}}
{ports}---
"
    )
}

/// `peer_authentication_simulation_test.go`: TestPeerAuthenticationPassthrough (the
/// workload and port-level modes on the passthrough chains, with and without a
/// service on port 8000; mTLS calls offer ALPN `istio`) and
/// TestPeerAuthenticationWithSidecar (STRICT with port 9090 DISABLE, on chains from
/// services, a Sidecar's ingress ports or both).
fn peer_authentication() -> Vec<Scenario> {
    let se_8000 = "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: se}
spec:
  hosts: [foo.bar]
  endpoints:
  - address: 1.1.1.1
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {name: http, number: 8000, protocol: HTTP}
---
";
    let pass = In::Cluster("InboundPassthroughCluster");
    let http = |port: u16, mtls: bool| {
        let c = Call::http(port).mode(CallMode::Inbound);
        if mtls { c.mtls().alpn("istio") } else { c }
    };
    let mut out = Vec::new();
    let mut scenario = |name: &str, config: String, calls: Vec<(&str, Call, In)>| {
        let mut s = Scenario::new(config);
        s.metadata = serde_json::json!({"LABELS": {"app": "foo"}});
        for (call, c, want) in calls {
            s.call(format!("{name}/{call}"), c, want.expect());
        }
        out.push(s);
    };
    let p = "TestPeerAuthenticationPassthrough";
    scenario(
        &format!("{p}/global disable"),
        foo_peer_auth("DISABLE", None),
        vec![
            ("mtls", http(8000, true), pass),
            ("plaintext", http(8000, false), pass),
        ],
    );
    scenario(
        &format!("{p}/global strict"),
        foo_peer_auth("STRICT", None),
        vec![
            ("plaintext", http(8000, false), NO_CHAIN),
            ("mtls", http(8000, true), pass),
        ],
    );
    scenario(
        &format!("{p}/global permissive"),
        foo_peer_auth("PERMISSIVE", None),
        vec![
            ("plaintext", http(8000, false), pass),
            ("mtls", http(8000, true), pass),
        ],
    );
    let four = |p8000: In, m8000: In, p9000: In, m9000: In| {
        vec![
            ("plaintext on port 8000", http(8000, false), p8000),
            ("mtls on port 8000", http(8000, true), m8000),
            ("plaintext port 9000", http(9000, false), p9000),
            ("mtls port 9000", http(9000, true), m9000),
        ]
    };
    let inbound_8000 = In::Cluster("inbound|8000||");
    scenario(
        &format!("{p}/global disable and port 9000 strict"),
        foo_peer_auth("DISABLE", Some("STRICT")),
        four(pass, pass, NO_CHAIN, pass),
    );
    scenario(
        &format!("{p}/global disable and port 9000 strict not in service"),
        foo_peer_auth("DISABLE", Some("STRICT")) + se_8000,
        four(inbound_8000, PROTOCOL, NO_CHAIN, pass),
    );
    scenario(
        &format!("{p}/global strict and port 9000 plaintext"),
        foo_peer_auth("STRICT", Some("DISABLE")),
        four(NO_CHAIN, pass, pass, pass),
    );
    scenario(
        &format!("{p}/global strict and port 9000 plaintext not in service"),
        foo_peer_auth("STRICT", Some("DISABLE")) + se_8000,
        four(NO_CHAIN, inbound_8000, pass, pass),
    );
    scenario(
        &format!("{p}/global plaintext and port 9000 permissive"),
        foo_peer_auth("DISABLE", Some("PERMISSIVE")),
        four(pass, pass, pass, pass),
    );
    scenario(
        &format!("{p}/global plaintext and port 9000 permissive not in service"),
        foo_peer_auth("DISABLE", Some("PERMISSIVE")) + se_8000,
        four(inbound_8000, PROTOCOL, pass, pass),
    );

    let pa = "apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default}
spec:
  selector: {matchLabels: {app: foo}}
  mtls: {mode: STRICT}
  portLevelMtls:
    9090: {mode: DISABLE}
---
";
    let sidecar = |ports: &[(u16, &str)]| {
        let ingress: String = ports
            .iter()
            .map(|(port, name)| {
                format!(
                    "  - defaultEndpoint: 127.0.0.1:{port}\n    port: {{name: {name}, number: {port}, protocol: TCP}}\n"
                )
            })
            .collect();
        format!(
            "apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: sidecar, labels: {{app: foo}}}}
spec:
  workloadSelector: {{labels: {{app: foo}}}}
  ingress:
{ingress}  egress:
  - hosts: [\"*/*\"]
---
"
        )
    };
    let full = sidecar(&[(8080, "tls"), (9090, "plaintext")]);
    let partial = sidecar(&[(8080, "tls")]);
    let entry = |ports: &str| {
        format!(
            "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: se}}
spec:
  hosts: [foo.bar]
  endpoints:
  - address: 1.1.1.1
    labels: {{app: foo}}
  location: MESH_INTERNAL
  resolution: STATIC
  ports: {ports}
---
"
        )
    };
    let with_ports = entry(
        "[{name: tls, number: 8080, protocol: TCP}, {name: plaintext, number: 9090, protocol: TCP}]",
    );
    let no_ports = entry("[{name: random, number: 5050, protocol: TCP}]");
    let tcp = |port: u16, mtls: bool| {
        let c = Call::tcp(port).mode(CallMode::Inbound);
        if mtls { c.mtls() } else { c }
    };
    let four = |t8080: In, p9090: In, t9090: In| {
        vec![
            ("plaintext on tls port", tcp(8080, false), NO_CHAIN),
            ("tls on tls port", tcp(8080, true), t8080),
            ("plaintext on plaintext port", tcp(9090, false), p9090),
            ("tls on plaintext port", tcp(9090, true), t9090),
        ]
    };
    let (c8080, c9090) = (In::Cluster("inbound|8080||"), In::Cluster("inbound|9090||"));
    let w = "TestPeerAuthenticationWithSidecar";
    scenario(
        &format!("{w}/service, no sidecar"),
        format!("{pa}{with_ports}"),
        four(c8080, c9090, c9090),
    );
    scenario(
        &format!("{w}/service, full sidecar"),
        format!("{pa}{full}{with_ports}"),
        four(c8080, c9090, c9090),
    );
    scenario(
        &format!("{w}/no service, no sidecar"),
        format!("{pa}{no_ports}"),
        four(pass, pass, pass),
    );
    scenario(
        &format!("{w}/no service, full sidecar"),
        format!("{pa}{full}{no_ports}"),
        four(c8080, c9090, c9090),
    );
    scenario(
        &format!("{w}/service, partial sidecar"),
        format!("{pa}{partial}{with_ports}"),
        four(c8080, pass, pass),
    );
    out
}

/// Istio's two-ServiceEntry template of `serviceentry_simulation_test.go`.
fn two_entries(addresses: [&str; 2], protocol: &str, tls_route: bool) -> String {
    let mut out = String::new();
    for (i, addr) in addresses.iter().enumerate() {
        let n = i + 1;
        out.push_str(&format!(
            "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: se{n}, namespace: default}}
spec:
  hosts: [blah{n}.somedomain]
  addresses: [\"{addr}\"]
  ports:
  - {{number: 9999, name: port-9999, protocol: {protocol}}}
---
"
        ));
    }
    if tls_route {
        out.push_str(
            "apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: vs1, namespace: default}
spec:
  hosts: [blah1.somedomain]
  tls:
  - match:
    - port: 9999
      sniHosts: [blah1.somedomain]
    route:
    - destination:
        host: blah1.somedomain
        port: {number: 9999}
",
        );
    }
    out
}

fn at(listener: &str, cluster: &str) -> Expect {
    Expect {
        listener: Some(listener.to_string()),
        cluster: Some(cluster.to_string()),
        ..Default::default()
    }
}

/// TestServiceEntry: ServiceEntries whose CIDR addresses share a port — identical
/// after masking, overlapping (longest prefix wins), overlapping with SNI routes, and
/// sharing one of several IPs — and TestServiceEntryDuplicatedHostname (one host in
/// two entries gets one auto-allocated address).
fn service_entries() -> Vec<Scenario> {
    const V6_A: &str = "1234:1f1:123:123:f816:3eff:feb8:2287";
    const V6_B: &str = "1234:1f1:123:123:f816:3eff:febf:57ce";
    let b1 = "outbound|9999||blah1.somedomain";
    let b2 = "outbound|9999||blah2.somedomain";
    let w = "0.0.0.0_9999";
    let dual = |mut s: Scenario| {
        s.node_ip = "127.0.0.1";
        s.metadata = serde_json::json!({
            "LABELS": {"app": "foo"},
            "INSTANCE_IPS": "127.0.0.1,1234::1234",
            "CLUSTER_ID": "Kubernetes",
        });
        s
    };
    let name = |case: &str, call: &str| format!("TestServiceEntry/{case}/{call}");
    let mut out = Vec::new();

    let case = "identical CIDR (ignoring insignificant bits) is dropped";
    let mut s = dual(Scenario::new(two_entries(
        [&format!("{V6_A}/32"), &format!("{V6_B}/32")],
        "TCP",
        false,
    )));
    s.call(
        name(case, "defined port"),
        Call::tcp(9999).to("1234:1f1:1:1:1:1:1:1"),
        at(w, b1),
    );
    out.push(s);

    let case = "overlapping CIDR";
    let mut s = dual(Scenario::new(two_entries(
        [&format!("{V6_A}/16"), &format!("{V6_B}/32")],
        "TCP",
        false,
    )));
    s.call(
        name(case, "match the more precise one"),
        Call::tcp(9999).to(V6_B),
        at(w, b2),
    );
    s.call(
        name(case, "match the more less one"),
        Call::tcp(9999).to("1234::1"),
        at(w, b1),
    );
    out.push(s);

    let case = "overlapping CIDR with SNI";
    let mut s = dual(Scenario::new(two_entries(
        [&format!("{V6_A}/16"), &format!("{V6_B}/32")],
        "TLS",
        true,
    )));
    s.call(
        name(case, "IP and SNI match: longer IP"),
        Call::tcp(9999).tls().sni("blah2.somedomain").to(V6_B),
        at(w, b2),
    );
    s.call(
        name(case, "IP and SNI match: shorter IP"),
        Call::tcp(9999).sni("blah1.somedomain").to("1234::1"),
        at(w, b1),
    );
    s.call(
        name(case, "Mismatch IP and SNI match: longer IP"),
        Call::tcp(9999).tls().sni("blah1.somedomain").to(V6_B),
        at(w, "PassthroughCluster"),
    );
    s.call(
        name(case, "Mismatch IP and SNI match: shorter IP"),
        Call::tcp(9999).sni("blah2.somedomain").to("1234::1"),
        at(w, "PassthroughCluster"),
    );
    out.push(s);

    let case = "partial overlap of IP";
    let mut s = dual(Scenario::new(
        "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: se1, namespace: default}
spec:
  hosts: [blah1.somedomain]
  addresses: [1.1.1.1]
  ports:
  - {number: 9999, name: port-9999, protocol: TCP}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: se2, namespace: default}
spec:
  hosts: [blah2.somedomain]
  addresses: [2.2.2.2, 1.1.1.1]
  ports:
  - {number: 9999, name: port-9999, protocol: TCP}
",
    ));
    s.call(
        name(case, "unique IP"),
        Call::tcp(9999).to("2.2.2.2"),
        at("2.2.2.2_9999", b2),
    );
    s.call(
        name(case, "shared IP"),
        Call::tcp(9999).to("1.1.1.1"),
        at("1.1.1.1_9999", b1),
    );
    out.push(s);

    let mut s = Scenario::new(
        "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: istio-http}
spec:
  hosts: [istio.io]
  location: MESH_EXTERNAL
  ports:
  - {number: 80, name: http, protocol: HTTP}
  resolution: DNS
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: istio-https}
spec:
  hosts: [istio.io]
  location: MESH_EXTERNAL
  ports:
  - {number: 443, name: https, protocol: HTTPS}
  resolution: DNS
",
    );
    s.metadata = serde_json::json!({"DNS_CAPTURE": "true", "DNS_AUTO_ALLOCATE": "true"});
    let case = "TestServiceEntryDuplicatedHostname/service entries with reused hosts should have auto allocated the same IP address";
    s.call(
        format!("{case}/HTTP call"),
        Call::http(80).to("240.240.91.120").host("istio.io"),
        at("0.0.0.0_80", "outbound|80||istio.io"),
    );
    s.call(
        format!("{case}/HTTPS call"),
        Call::http(443).tls().to("240.240.91.120").host("istio.io"),
        at("240.240.91.120_443", "outbound|443||istio.io"),
    );
    out.push(s);
    out
}

/// TestInboundClusters: one `inbound|<targetPort>||` cluster per target port of the
/// services the proxy is an instance of (shared target ports give one cluster), or
/// per Sidecar `ingress` port; with inboundTrafficPolicy LOCALHOST they point at
/// 127.0.0.1. Each cluster is also reached by an inbound HTTP call to its port, and
/// names the services on its port in its `istio.services` telemetry metadata.
fn inbound_clusters() -> Vec<Scenario> {
    const BACKEND: &str = "backend.default.svc.cluster.local";
    const ALT: &str = "backend-alt.default.svc.cluster.local";
    let backend = |host: &str, vip: &str| {
        let mut svc = service(
            host,
            "default",
            &[
                ("default", 80, Protocol::Http),
                ("other", 81, Protocol::Http),
            ],
        );
        svc.cluster_vips
            .insert("c1".into(), vec![vip.parse().unwrap()]);
        svc
    };
    // (service, [(port name, target)]) instances on the proxy's IP.
    type Instances = Vec<(&'static str, &'static str, Vec<(&'static str, u16)>)>;
    let instance_cases: Vec<(&str, Instances, Vec<u16>)> = vec![
        ("empty", vec![], vec![]),
        ("empty service", vec![(BACKEND, "1.1.1.1", vec![])], vec![]),
        (
            "single service, partial instance",
            vec![(BACKEND, "1.1.1.1", vec![("default", 8080)])],
            vec![8080],
        ),
        (
            "single service, multiple instance",
            vec![(BACKEND, "1.1.1.1", vec![("default", 8080), ("other", 8081)])],
            vec![8080, 8081],
        ),
        (
            "multiple services with same service port, different target",
            vec![
                (BACKEND, "1.1.1.1", vec![("default", 8080), ("other", 8081)]),
                (ALT, "1.1.1.2", vec![("default", 8082), ("other", 8083)]),
            ],
            vec![8080, 8081, 8082, 8083],
        ),
        (
            "multiple services with same service port and target",
            vec![
                (BACKEND, "1.1.1.1", vec![("default", 8080), ("other", 8081)]),
                (ALT, "1.1.1.2", vec![("default", 8080), ("other", 8081)]),
            ],
            vec![8080, 8081],
        ),
    ];
    let mut out = Vec::new();
    for localhost in [false, true] {
        for (case, instances, ports) in &instance_cases {
            if localhost && ports.is_empty() {
                // Istio runs the LOCALHOST variant only for the cases with instances.
                continue;
            }
            let mut s = Scenario::new("");
            s.node_ip = "1.2.3.4";
            if localhost {
                s.mesh = Some("inboundTrafficPolicy: {mode: LOCALHOST}\n");
            }
            for (host, vip, targets) in instances {
                let mut ep = Endpoint::new("1.2.3.4".parse().unwrap());
                for (name, target) in targets {
                    ep = ep.with_port(name, *target);
                }
                let eps = if targets.is_empty() { vec![] } else { vec![ep] };
                s.services.push((backend(host, vip), eps));
            }
            let want: BTreeMap<String, Vec<String>> = ports
                .iter()
                .map(|p| {
                    let eps = if localhost {
                        vec![format!("127.0.0.1:{p}")]
                    } else {
                        vec![]
                    };
                    (format!("inbound|{p}||"), eps)
                })
                .collect();
            let variant = if localhost { "LOCALHOST/" } else { "" };
            // Istio's telemetry: the services on each cluster's port, by hostname.
            let mut telemetry: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (host, _, targets) in instances {
                for (_, target) in targets {
                    let hosts = telemetry.entry(format!("inbound|{target}||")).or_default();
                    hosts.push(host.to_string());
                    hosts.sort();
                    hosts.dedup();
                }
            }
            s.vectors.push(Vector {
                name: format!("TestInboundClusters/{variant}{case}/telemetry"),
                check: Check::InboundTelemetry(telemetry),
            });
            push_inbound(
                &mut s,
                &format!("TestInboundClusters/{variant}{case}"),
                want,
            );
            out.push(s);
        }
    }
    let ingress = |port: u16, endpoint: Option<&str>| {
        let default_endpoint = endpoint
            .map(|e| format!("\n    defaultEndpoint: \"{e}\""))
            .unwrap_or_default();
        format!("  - port: {{number: {port}, protocol: HTTP, name: http}}{default_endpoint}\n")
    };
    // (case, Sidecar ingress listeners, [(cluster, endpoint)]).
    type IngressCase = (&'static str, String, Vec<(&'static str, &'static str)>);
    let sidecar_cases: Vec<IngressCase> = vec![
        (
            "ingress to same port",
            ingress(80, Some("127.0.0.1:80")),
            vec![("inbound|80||", "127.0.0.1:80")],
        ),
        (
            "ingress to different port",
            ingress(80, Some("127.0.0.1:8080")),
            vec![("inbound|80||", "127.0.0.1:8080")],
        ),
        (
            "ingress to instance IP",
            ingress(80, Some("0.0.0.0:8080")),
            vec![("inbound|80||", "1.2.3.4:8080")],
        ),
        (
            "ingress without default endpoint",
            ingress(80, None),
            vec![("inbound|80||", "")],
        ),
        (
            "ingress to socket",
            ingress(80, Some("unix:///socket")),
            vec![("inbound|80||", "/socket")],
        ),
        (
            "multiple ingress",
            ingress(80, Some("127.0.0.1:8080")) + &ingress(81, Some("127.0.0.1:8080")),
            vec![
                ("inbound|80||", "127.0.0.1:8080"),
                ("inbound|81||", "127.0.0.1:8080"),
            ],
        ),
    ];
    for (case, listeners, want) in sidecar_cases {
        let mut s = Scenario::new(format!(
            "apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: sidecar, namespace: default}}
spec:
  ingress:
{listeners}"
        ));
        s.node_ip = "1.2.3.4";
        let want = want
            .into_iter()
            .map(|(c, e)| {
                let eps = if e.is_empty() {
                    vec![]
                } else {
                    vec![e.to_string()]
                };
                (c.to_string(), eps)
            })
            .collect();
        push_inbound(&mut s, &format!("TestInboundClusters/{case}"), want);
        s.vectors.push(Vector {
            name: format!("TestInboundClusters/{case}/telemetry"),
            check: Check::InboundTelemetry(BTreeMap::new()),
        });
        out.push(s);
    }
    out
}

/// The inbound cluster check plus an inbound HTTP call per cluster.
fn push_inbound(s: &mut Scenario, name: &str, want: BTreeMap<String, Vec<String>>) {
    for cluster in want.keys() {
        let port: u16 = cluster.split('|').nth(1).unwrap().parse().unwrap();
        s.call(
            format!("{name}/call {port}"),
            Call::http(port).to("1.2.3.4").mode(CallMode::Inbound),
            Expect::cluster(cluster),
        );
    }
    s.vectors.push(Vector {
        name: format!("{name}/clusters"),
        check: Check::InboundClusters(want),
    });
}

const TIME_OLDER: &str = "2019-01-01T00:00:00Z";
const TIME_BASE: &str = "2020-01-01T00:00:00Z";
const TIME_NEWER: &str = "2021-01-01T00:00:00Z";

/// Istio's `vsArgs` (virtualservice variant).
#[derive(Clone, Default)]
struct Vs {
    namespace: &'static str,
    matches: Vec<&'static str>,
    dest: &'static str,
    port: u16,
    port_match: u16,
    time: &'static str,
}

fn vs(namespace: &'static str, host: &'static str, dest: &'static str) -> Vs {
    Vs {
        namespace,
        matches: vec![host],
        dest,
        time: TIME_BASE,
        ..Default::default()
    }
}

impl Vs {
    fn at(mut self, time: &'static str) -> Vs {
        self.time = time;
        self
    }

    fn yaml(&self, index: usize) -> String {
        let hosts: Vec<String> = self.matches.iter().map(|m| format!("\"{m}\"")).collect();
        let port = if self.port > 0 {
            format!("\n        port: {{number: {}}}", self.port)
        } else {
            String::new()
        };
        let port_match = if self.port_match > 0 {
            format!("\n    match: [{{port: {}}}]", self.port_match)
        } else {
            String::new()
        };
        format!(
            "apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: vs{index}
  namespace: {}
  creationTimestamp: \"{}\"
spec:
  hosts: [{}]
  http:
  - route:
    - destination:
        host: {}{port}{port_match}
",
            self.namespace,
            self.time,
            hosts.join(", "),
            self.dest
        )
    }
}

fn sidecar(namespace: &str, egress: &[&str]) -> String {
    let hosts: Vec<String> = egress.iter().map(|h| format!("\"{h}\"")).collect();
    format!(
        "apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: {namespace}, namespace: {namespace}}}
spec:
  egress:
  - hosts: [{}]
",
        hosts.join(", ")
    )
}

fn known_services() -> Vec<(Service, Vec<Endpoint>)> {
    let mut out = Vec::new();
    for (name, ns, vip) in [
        ("known", "default", "2.0.0.0"),
        ("alt-known", "default", "2.0.0.1"),
        ("not-default", "not-default", "2.0.0.2"),
    ] {
        let mut svc = service(
            &format!("{name}.{ns}.svc.cluster.local"),
            ns,
            &[("http", 80, Protocol::Http), ("http", 8080, Protocol::Http)],
        );
        svc.cluster_vips
            .insert("c1".into(), vec![vip.parse().unwrap()]);
        out.push((svc, Vec::new()));
    }
    out
}

type Want = &'static [(&'static str, Option<&'static [&'static str]>)];

/// (case name, VirtualServices, Sidecars, proxy namespace, route table, expected
/// domains).
type RouteCase = (
    &'static str,
    Vec<Vs>,
    Vec<String>,
    &'static str,
    &'static str,
    Want,
);

/// TestSidecarRoutes (virtualservice variant): which VirtualService a sidecar applies
/// to which domain of its outbound route tables, with namespaces, Sidecar imports,
/// wildcards and creation-time precedence.
fn sidecar_routes() -> Vec<Scenario> {
    const K: &str = "known.default.svc.cluster.local";
    const ALT: &str = "alt-known.default.svc.cluster.local";
    const FOO: &str = "foo.default.svc.cluster.local";
    let cases: Vec<RouteCase> = vec![
        (
            "simple port 80",
            vec![vs("default", K, ALT)],
            vec![],
            "default",
            "80",
            &[(
                K,
                Some(&["outbound|80||alt-known.default.svc.cluster.local"]),
            )],
        ),
        (
            "simple port 8080",
            vec![vs("default", K, ALT)],
            vec![],
            "default",
            "8080",
            &[(
                K,
                Some(&["outbound|8080||alt-known.default.svc.cluster.local"]),
            )],
        ),
        (
            "unknown port 80",
            vec![vs("default", FOO, FOO)],
            vec![],
            "default",
            "80",
            &[(FOO, Some(&["outbound|80||foo.default.svc.cluster.local"]))],
        ),
        (
            "unknown port 8080",
            vec![vs("default", FOO, FOO)],
            vec![],
            "default",
            "8080",
            &[(FOO, None)],
        ),
        (
            "unknown port 8080 match 8080",
            vec![Vs {
                port_match: 8080,
                ..vs("default", FOO, FOO)
            }],
            vec![],
            "default",
            "8080",
            &[(FOO, None)],
        ),
        (
            "unknown port 8080 dest 8080",
            vec![Vs {
                port: 8080,
                ..vs("default", FOO, FOO)
            }],
            vec![],
            "default",
            "8080",
            &[(FOO, None)],
        ),
        (
            "producer rule port 80",
            vec![vs("default", K, ALT)],
            vec![],
            "not-default",
            "80",
            &[(
                K,
                Some(&["outbound|80||alt-known.default.svc.cluster.local"]),
            )],
        ),
        (
            "producer rule port 8080",
            vec![vs("default", K, ALT)],
            vec![],
            "not-default",
            "8080",
            &[(
                K,
                Some(&["outbound|8080||alt-known.default.svc.cluster.local"]),
            )],
        ),
        (
            "consumer rule port 80",
            vec![vs("not-default", K, ALT)],
            vec![],
            "not-default",
            "80",
            &[(
                K,
                Some(&["outbound|80||alt-known.default.svc.cluster.local"]),
            )],
        ),
        (
            "consumer rule port 8080",
            vec![vs("not-default", K, ALT)],
            vec![],
            "not-default",
            "8080",
            &[(
                K,
                Some(&["outbound|8080||alt-known.default.svc.cluster.local"]),
            )],
        ),
        (
            "arbitrary rule port 80",
            vec![vs("arbitrary", K, ALT)],
            vec![],
            "not-default",
            "80",
            &[(
                K,
                Some(&["outbound|80||alt-known.default.svc.cluster.local"]),
            )],
        ),
        (
            "arbitrary rule port 8080",
            vec![vs("arbitrary", K, ALT)],
            vec![],
            "not-default",
            "8080",
            &[(
                K,
                Some(&["outbound|8080||alt-known.default.svc.cluster.local"]),
            )],
        ),
        (
            "multiple rules 80",
            vec![
                vs("arbitrary", K, "arbitrary.example.com").at(TIME_OLDER),
                vs("default", K, "default.example.com").at(TIME_BASE),
                vs("not-default", K, "not-default.example.com").at(TIME_NEWER),
            ],
            vec![],
            "not-default",
            "80",
            &[(K, Some(&["outbound|80||arbitrary.example.com"]))],
        ),
        (
            "multiple rules 8080",
            vec![
                vs("arbitrary", K, "arbitrary.example.com").at(TIME_OLDER),
                vs("default", K, "default.example.com").at(TIME_BASE),
                vs("not-default", K, "not-default.example.com").at(TIME_NEWER),
            ],
            vec![],
            "not-default",
            "8080",
            &[(K, Some(&["outbound|8080||arbitrary.example.com"]))],
        ),
        (
            "wildcard random",
            vec![vs(
                "default",
                "*.unknown.example.com",
                "arbitrary.example.com",
            )],
            vec![],
            "default",
            "80",
            &[
                (
                    ALT,
                    Some(&["outbound|80||alt-known.default.svc.cluster.local"]),
                ),
                (K, Some(&["outbound|80||known.default.svc.cluster.local"])),
                (
                    "*.unknown.example.com",
                    Some(&["outbound|80||arbitrary.example.com"]),
                ),
            ],
        ),
        (
            "wildcard match with sidecar",
            vec![vs("default", "*.cluster.local", "arbitrary.example.com")],
            vec![sidecar("default", &["*/*.cluster.local"])],
            "default",
            "80",
            &[
                (ALT, Some(&["outbound|80||arbitrary.example.com"])),
                (K, Some(&["outbound|80||arbitrary.example.com"])),
                ("*.cluster.local", None),
            ],
        ),
        (
            "wildcard first then explicit",
            vec![
                vs("default", "*.cluster.local", "wild.example.com").at(TIME_OLDER),
                vs("default", K, "explicit.example.com").at(TIME_NEWER),
            ],
            vec![],
            "default",
            "80",
            &[
                (ALT, Some(&["outbound|80||wild.example.com"])),
                (K, Some(&["outbound|80||explicit.example.com"])),
                ("*.cluster.local", None),
            ],
        ),
        (
            "explicit first then wildcard",
            vec![
                vs("default", "*.cluster.local", "wild.example.com").at(TIME_NEWER),
                vs("default", K, "explicit.example.com").at(TIME_OLDER),
            ],
            vec![],
            "default",
            "80",
            &[
                (ALT, Some(&["outbound|80||wild.example.com"])),
                (K, Some(&["outbound|80||explicit.example.com"])),
                ("*.cluster.local", None),
            ],
        ),
        (
            "wildcard and explicit with sidecar",
            vec![
                vs("default", "*.cluster.local", "wild.example.com").at(TIME_OLDER),
                vs("default", K, "explicit.example.com").at(TIME_NEWER),
            ],
            vec![sidecar(
                "default",
                &[
                    "default/known.default.svc.cluster.local",
                    "default/alt-known.default.svc.cluster.local",
                ],
            )],
            "default",
            "80",
            &[
                (ALT, Some(&["outbound|80||wild.example.com"])),
                (K, Some(&["outbound|80||explicit.example.com"])),
                ("*.cluster.local", None),
            ],
        ),
        (
            "explicit first then wildcard with sidecar cross namespace",
            vec![
                vs("not-default", "*.cluster.local", "wild.example.com").at(TIME_OLDER),
                vs("default", K, "explicit.example.com").at(TIME_NEWER),
            ],
            vec![sidecar(
                "default",
                &[
                    "default/known.default.svc.cluster.local",
                    "default/alt-known.default.svc.cluster.local",
                ],
            )],
            "default",
            "80",
            &[
                (
                    ALT,
                    Some(&["outbound|80||alt-known.default.svc.cluster.local"]),
                ),
                (K, Some(&["outbound|80||explicit.example.com"])),
                ("*.cluster.local", None),
            ],
        ),
        (
            "wildcard and explicit cross namespace",
            vec![
                vs("not-default", "*.cluster.local", "wild.example.com").at(TIME_OLDER),
                vs("default", K, "explicit.example.com").at(TIME_NEWER),
            ],
            vec![],
            "default",
            "80",
            &[
                (ALT, Some(&["outbound|80||wild.example.com"])),
                (K, Some(&["outbound|80||explicit.example.com"])),
                ("*.cluster.local", None),
            ],
        ),
        (
            "wildcard and explicit unknown",
            vec![
                vs("default", "*.tld", "wild.example.com").at(TIME_OLDER),
                vs("default", "example.tld", "explicit.example.com").at(TIME_NEWER),
            ],
            vec![],
            "default",
            "80",
            &[
                (K, Some(&["outbound|80||known.default.svc.cluster.local"])),
                ("*.tld", Some(&["outbound|80||wild.example.com"])),
                ("*.example.tld", None),
            ],
        ),
        (
            "explicit match with wildcard sidecar",
            vec![vs(
                "default",
                "arbitrary.svc.cluster.local",
                "arbitrary.svc.cluster.local",
            )],
            vec![sidecar("default", &["*/*.cluster.local"])],
            "default",
            "80",
            &[(
                "arbitrary.svc.cluster.local",
                Some(&["outbound|80||arbitrary.svc.cluster.local"]),
            )],
        ),
        (
            "wildcard match with explicit sidecar",
            vec![vs("default", "*.cluster.local", "arbitrary.example.com")],
            vec![sidecar("default", &["*/known.default.svc.cluster.local"])],
            "default",
            "80",
            &[
                (K, Some(&["outbound|80||arbitrary.example.com"])),
                ("*.cluster.local", None),
            ],
        ),
        (
            "non-service wildcard match with explicit sidecar",
            vec![vs("default", "*.example.org", "arbitrary.example.com")],
            vec![sidecar(
                "default",
                &[
                    "*/explicit.example.org",
                    "*/alt-known.default.svc.cluster.local",
                ],
            )],
            "default",
            "80",
            &[
                (K, None),
                (
                    ALT,
                    Some(&["outbound|80||alt-known.default.svc.cluster.local"]),
                ),
                (
                    "*.example.org",
                    Some(&["outbound|80||arbitrary.example.com"]),
                ),
            ],
        ),
        (
            "sidecar filter",
            vec![
                vs(
                    "not-default",
                    "*.default.svc.cluster.local",
                    "arbitrary.example.com",
                ),
                vs(
                    "default",
                    "explicit.default.svc.cluster.local",
                    "explicit.default.svc.cluster.local",
                ),
            ],
            vec![sidecar(
                "not-default",
                &[
                    "not-default/*.default.svc.cluster.local",
                    "not-default/not-default.not-default.svc.cluster.local",
                ],
            )],
            "not-default",
            "80",
            &[
                (
                    "*.default.svc.cluster.local",
                    Some(&["outbound|80||arbitrary.example.com"]),
                ),
                ("explicit.default.svc.cluster.local", None),
                (
                    "not-default.not-default.svc.cluster.local",
                    Some(&["outbound|80||not-default.not-default.svc.cluster.local"]),
                ),
            ],
        ),
        (
            "same namespace conflict",
            vec![
                vs("default", K, "old.example.com").at(TIME_OLDER),
                vs("default", K, "new.example.com").at(TIME_NEWER),
            ],
            vec![],
            "default",
            "80",
            &[(K, Some(&["outbound|80||old.example.com"]))],
        ),
        (
            "cross namespace conflict",
            vec![
                vs("not-default", K, "producer.example.com").at(TIME_OLDER),
                vs("default", K, "consumer.example.com").at(TIME_NEWER),
            ],
            vec![],
            "default",
            "80",
            &[(K, Some(&["outbound|80||producer.example.com"]))],
        ),
        (
            "multi-host import single",
            vec![Vs {
                matches: vec![K, ALT],
                ..vs("default", K, "example.com")
            }],
            vec![sidecar("default", &["*/known.default.svc.cluster.local"])],
            "default",
            "80",
            &[
                (K, Some(&["outbound|80||example.com"])),
                (ALT, Some(&["outbound|80||example.com"])),
            ],
        ),
    ];
    let mut out = Vec::new();
    for (name, vss, sidecars, ns, route, want) in cases {
        let mut docs: Vec<String> = vss.iter().enumerate().map(|(i, v)| v.yaml(i)).collect();
        docs.extend(sidecars);
        let mut s = Scenario::new(docs.join("---\n"));
        s.services = known_services();
        s.namespace = ns;
        for (domain, clusters) in want {
            s.vectors.push(Vector {
                name: format!("TestSidecarRoutes/{name}/{domain}"),
                check: Check::Domain {
                    route,
                    domain: domain.to_string(),
                    clusters: clusters.map(|c| c.iter().map(|s| s.to_string()).collect()),
                },
            });
        }
        out.push(s);
    }
    out
}

/// loadbalancer_simulation_test.go: failoverPriority splits the inline endpoints of a
/// DNS ServiceEntry's STRICT_DNS cluster into priorities by the client's labels
/// (TestFailoverPriorityWithDNSServiceEntry, with the rule's outlier detection that
/// failover needs; TestFailoverPriorityWithMultiLocalityDNSServiceEntry, where the
/// region label comes from each endpoint's locality).
fn failover_priority_dns() -> Vec<Scenario> {
    let mut out = Vec::new();
    let mut s = Scenario::new(
        "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: dns-service, namespace: default}
spec:
  hosts: [dns-service.example.org]
  ports:
  - {number: 443, name: https, protocol: HTTPS}
  location: MESH_EXTERNAL
  resolution: DNS
  endpoints:
  - address: www.foo.com
    labels: {priority: \"1\"}
  - address: www.bar.com
    labels: {priority: \"2\"}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: dns-service, namespace: default}
spec:
  host: dns-service.example.org
  trafficPolicy:
    outlierDetection: {consecutive5xxErrors: 4}
    loadBalancer:
      localityLbSetting:
        failoverPriority: [priority]
",
    );
    s.metadata = serde_json::json!({"LABELS": {"priority": "1"}});
    s.vectors.push(Vector {
        name: "TestFailoverPriorityWithDNSServiceEntry".into(),
        check: Check::Priorities {
            cluster: "outbound|443||dns-service.example.org",
            want: [
                ("www.foo.com".to_string(), 0),
                ("www.bar.com".to_string(), 1),
            ]
            .into(),
        },
    });
    out.push(s);
    let mut s = Scenario::new(
        "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: search-external, namespace: default}
spec:
  hosts: [search.example.internal]
  location: MESH_EXTERNAL
  resolution: DNS
  ports:
  - {number: 8080, name: http, protocol: HTTP}
  endpoints:
  - {address: node-a.example.internal, locality: region-a}
  - {address: node-b.example.internal, locality: region-b}
  - {address: node-c.example.internal, locality: region-c}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: search-external, namespace: default}
spec:
  host: search.example.internal
  trafficPolicy:
    outlierDetection: {consecutive5xxErrors: 4, interval: 30s, baseEjectionTime: 30s}
    loadBalancer:
      localityLbSetting:
        enabled: true
        failoverPriority: [topology.kubernetes.io/region]
",
    );
    s.metadata = serde_json::json!({"LABELS": {"topology.kubernetes.io/region": "region-a"}});
    s.vectors.push(Vector {
        name: "TestFailoverPriorityWithMultiLocalityDNSServiceEntry".into(),
        check: Check::Priorities {
            cluster: "outbound|8080||search.example.internal",
            want: [
                ("node-a.example.internal".to_string(), 0),
                ("node-b.example.internal".to_string(), 1),
                ("node-c.example.internal".to_string(), 1),
            ]
            .into(),
        },
    });
    out.push(s);
    out
}

/// Kubernetes ExternalName Services as Istio HEAD treats them (aliases; no
/// `ENABLE_EXTERNAL_NAME_ALIAS` switch any more): an alias of an in-mesh service is
/// routed by its name to that service's cluster, with the service's routes; an alias
/// of a name the mesh does not know has no cluster or listener of its own, so its
/// traffic (resolved by Kubernetes DNS to the target) leaves through the passthrough
/// cluster instead of a DNS cluster without endpoints (503). Not an Istio test file:
/// meshfed's vectors of pilot's alias behaviour (`resolveServiceAliases`,
/// `generateVirtualHostDomains`, `buildOutboundClusters`).
fn external_name_aliases() -> Scenario {
    const REVIEWS: &str = "reviews.default.svc.cluster.local";
    // A VirtualService routing to the alias: Istio's GetDestinationCluster names the
    // alias's target.
    let mut s = Scenario::new(
        "apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: to-alias, namespace: default}
spec:
  hosts: [vs.example.com]
  http:
  - route:
    - destination: {host: reviews-alias.default.svc.cluster.local, port: {number: 80}}
",
    );
    let mut reviews = service(REVIEWS, "default", &[("http", 80, Protocol::Http)]);
    reviews
        .cluster_vips
        .insert("c1".into(), vec!["10.0.0.5".parse().unwrap()]);
    s.services.push((
        reviews,
        vec![Endpoint::new("10.1.0.1".parse().unwrap()).with_port("http", 8080)],
    ));
    let alias = |name: &str, target: &str, ports: &[(&str, u16, Protocol)]| {
        let mut a = service(
            &format!("{name}.default.svc.cluster.local"),
            "default",
            ports,
        );
        a.resolution = Resolution::Alias;
        a.alias_for = Some(target.into());
        a
    };
    // ExternalName -> ExternalName -> reviews: resolved through the chain.
    s.services.push((
        alias("reviews-alias", REVIEWS, &[("http", 80, Protocol::Http)]),
        vec![],
    ));
    s.services.push((
        alias("chained", "reviews-alias.default.svc.cluster.local", &[]),
        vec![],
    ));
    s.services.push((
        alias(
            "api",
            "api.example.com",
            &[("http", 80, Protocol::Http), ("tcp", 9000, Protocol::Tcp)],
        ),
        vec![],
    ));
    for host in [
        "reviews-alias.default.svc.cluster.local",
        "reviews-alias",
        "chained.default.svc.cluster.local",
    ] {
        s.call(
            format!("ExternalName/alias of a mesh service/{host}"),
            Call::http(80).to("10.0.0.5").host(host),
            Expect::cluster(&format!("outbound|80||{REVIEWS}")),
        );
        s.vectors.push(Vector {
            name: format!("ExternalName/route domain/{host}"),
            check: Check::Domain {
                route: "80",
                domain: host.to_string(),
                clusters: Some(vec![format!("outbound|80||{REVIEWS}")]),
            },
        });
    }
    s.call(
        "ExternalName/VirtualService destination naming the alias".into(),
        Call::http(80).to("10.0.0.5").host("vs.example.com"),
        Expect::cluster(&format!("outbound|80||{REVIEWS}")),
    );
    s.call(
        "ExternalName/alias of an unknown name, HTTP".into(),
        Call::http(80)
            .to("93.184.216.34")
            .host("api.default.svc.cluster.local"),
        Expect::cluster("PassthroughCluster"),
    );
    s.call(
        "ExternalName/alias of an unknown name, TCP".into(),
        Call::tcp(9000).to("93.184.216.34"),
        Expect::cluster("PassthroughCluster"),
    );
    s.vectors.push(Vector {
        name: "ExternalName/no cluster of its own".into(),
        check: Check::NoClusterFor("api.default.svc.cluster.local"),
    });
    s
}

/// A sniffed (unnamed-protocol) port on a service VIP reads a route table of that
/// service alone (Istio's `<host>:<port>` RDS name for ListenerProtocolAuto on a
/// non-wildcard bind): HTTP to the VIP reaches the service whatever the Host header,
/// where the shared per-port table would send a foreign Host to `allow_any`.
fn sniffed_vip_route_tables() -> Scenario {
    const KNOWN: &str = "known.default.svc.cluster.local";
    const OTHER: &str = "other.default.svc.cluster.local";
    let mut s = Scenario::new("");
    for (host, vip, ep) in [
        (KNOWN, "10.0.0.7", "10.1.0.7"),
        (OTHER, "10.0.0.8", "10.1.0.8"),
    ] {
        let mut svc = service(host, "default", &[("auto", 7000, Protocol::Unsupported)]);
        svc.cluster_vips
            .insert("c1".into(), vec![vip.parse().unwrap()]);
        s.services.push((
            svc,
            vec![Endpoint::new(ep.parse().unwrap()).with_port("auto", 7000)],
        ));
    }
    for host in ["foo.example.com", OTHER, KNOWN] {
        s.call(
            format!("sniffed VIP/Host {host}"),
            Call::http(7000).to("10.0.0.7").host(host),
            Expect {
                virtual_host: Some(format!("{KNOWN}:7000")),
                cluster: Some(format!("outbound|7000||{KNOWN}")),
                ..Default::default()
            },
        );
    }
    s.vectors.push(Vector {
        name: "sniffed VIP/route table of the service".into(),
        check: Check::Domain {
            route: "known.default.svc.cluster.local:7000",
            domain: "*".into(),
            clusters: Some(vec![format!("outbound|7000||{KNOWN}")]),
        },
    });
    s
}

fn known_gap(name: &str) -> Option<&'static str> {
    KNOWN_GAPS
        .iter()
        .find(|(gap, _)| *gap == name)
        .map(|(_, why)| *why)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_sidecar_simulation_vectors() {
    let mut scenarios = passthrough_traffic();
    scenarios.push(loop_prevention());
    scenarios.push(headless_services());
    scenarios.extend(sidecar_routes());
    scenarios.extend(service_entries());
    scenarios.extend(inbound_clusters());
    scenarios.extend(inbound_sidecar_tls_modes());
    scenarios.extend(inbound());
    scenarios.extend(peer_authentication());
    scenarios.extend(failover_priority_dns());
    scenarios.push(external_name_aliases());
    scenarios.push(sniffed_vip_route_tables());

    let mut passed = 0;
    let mut gaps = 0;
    let mut unexpected = Vec::new();
    let all: BTreeSet<&str> = scenarios
        .iter()
        .flat_map(|s| s.vectors.iter().map(|v| v.name.as_str()))
        .collect();
    for (gap, _) in KNOWN_GAPS {
        if !all.contains(gap) {
            unexpected.push(format!("{gap}: listed in KNOWN_GAPS but no such vector"));
        }
    }
    for scenario in &scenarios {
        let (server, proxy) = fetch(scenario).await;
        for v in &scenario.vectors {
            let outcome = run_check(&proxy, &v.check);
            match (&outcome, known_gap(&v.name)) {
                (Ok(()), None) => {
                    passed += 1;
                    println!("PASS {}", v.name);
                }
                (Err(e), Some(why)) => {
                    gaps += 1;
                    println!("GAP  {}: {e} [known: {why}]", v.name);
                }
                (Err(e), None) => {
                    println!("FAIL {}: {e}", v.name);
                    unexpected.push(format!("{}: {e}", v.name));
                }
                (Ok(()), Some(why)) => {
                    println!("FIXED {} (listed as a known gap: {why})", v.name);
                    unexpected.push(format!("{}: passes now, remove it from KNOWN_GAPS", v.name));
                }
            }
        }
        server.shutdown().await;
    }
    println!("sidecar simulation vectors: {passed} passed, {gaps} known gaps");
    assert!(
        unexpected.is_empty(),
        "{} vectors differ from KNOWN_GAPS:\n{}",
        unexpected.len(),
        unexpected.join("\n")
    );
}

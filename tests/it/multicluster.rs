//! Multicluster end to end: two fake Kubernetes API servers (clusters c1 and c2 on
//! networks n1 and n2), meshfed reading c1 and finding c2 through a remote secret, and
//! ADS clients in each network seeing split-horizon EDS.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use meshfed::ads::TypeUrl;
use meshfed::app::{KubeSettings, KubeSource, RemoteSecretSettings};
use meshfed::testing::{AdsClient, FakeServer, decode_all, node_with};
use meshfed_kube::fake_api::{FakeApiServer, objects};
use serde_json::Value;

use crate::support::*;

const CLUSTER: &str = "outbound|80||reviews.default.svc.cluster.local";
const SECRET: &str = "istio-remote-secret-c2";
const NS: &str = "istio-system";
const GATEWAY_C1: &str = "192.0.2.10:15443";
const GATEWAY_C2: &str = "192.0.2.20:15443";

/// How the clusters say which network they are on and where their gateways are.
#[derive(Clone, Copy, PartialEq)]
enum Topology {
    /// Istio's labels: `topology.istio.io/network` on the system namespace and on the
    /// east-west gateway service.
    Labels,
    /// No labels: a meshNetworks file with `fromRegistry` and `registryServiceName`.
    MeshNetworks,
}

/// One cluster: `reviews` with one pod per IP, and an east-west gateway service with a
/// load balancer IP.
fn populate(
    api: &FakeApiServer,
    network: &str,
    vip: &str,
    ips: &[&str],
    gateway_ip: &str,
    topology: Topology,
) {
    let labels: &[(&str, &str)] = if topology == Topology::Labels {
        &[("topology.istio.io/network", network)]
    } else {
        &[]
    };
    api.apply(&objects::namespace(NS, labels));
    api.apply(&objects::node("node-1", "r1", "z1"));
    api.apply(&objects::service(
        "default",
        "reviews",
        vip,
        &[("http", 80)],
    ));
    let mut endpoints = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        let pod = format!("reviews-{network}-{i}");
        api.apply(&objects::pod("default", &pod, "reviews", ip, "node-1"));
        endpoints.push((ip.to_string(), pod));
    }
    let endpoints: Vec<(&str, &str)> = endpoints
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    api.apply(&objects::slice(
        "default",
        "reviews-1",
        "reviews",
        &[("http", 9080)],
        &endpoints,
    ));
    let mut gateway = objects::load_balancer(
        NS,
        "istio-eastwestgateway",
        "10.96.9.9",
        &[("tls", 15443)],
        gateway_ip,
    );
    if topology == Topology::Labels {
        gateway
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("topology.istio.io/network".into(), network.into());
    }
    api.apply(&gateway);
}

const MESH_NETWORKS: &str = "networks:\n  \
    n1:\n    endpoints: [{fromRegistry: c1}]\n    \
    gateways: [{registryServiceName: istio-eastwestgateway.istio-system.svc.cluster.local, port: 15443}]\n  \
    n2:\n    endpoints: [{fromRegistry: c2}]\n    \
    gateways: [{registryServiceName: istio-eastwestgateway.istio-system.svc.cluster.local, port: 15443}]\n";

struct Mesh {
    c1: EnforcedApi,
    c2: EnforcedApi,
    server: FakeServer,
    _dir: tempfile::TempDir,
}

impl Mesh {
    async fn start(topology: Topology) -> Mesh {
        Mesh::start_with(topology, |_| {}, Duration::from_secs(30)).await
    }

    /// [`Mesh::start`], with `before` applied to c1 before meshfed starts and the
    /// given `--remoteClusterTimeout`.
    async fn start_with(
        topology: Topology,
        before: impl FnOnce(&FakeApiServer),
        remote_timeout: Duration,
    ) -> Mesh {
        // Both clusters enforce deploy/'s role: the README gives a remote cluster's
        // reader the same reads.
        let c1 = EnforcedApi::start().await;
        let c2 = EnforcedApi::start().await;
        populate(
            &c1,
            "n1",
            "10.96.0.7",
            &["10.1.0.1", "10.1.0.2"],
            "192.0.2.10",
            topology,
        );
        populate(
            &c2,
            "n2",
            "10.97.0.7",
            &["10.2.0.1", "10.2.0.2", "10.2.0.3"],
            "192.0.2.20",
            topology,
        );
        let dir = tempfile::tempdir().unwrap();
        before(&c1);
        let networks = dir.path().join("meshNetworks.yaml");
        std::fs::write(&networks, MESH_NETWORKS).unwrap();
        let client = c1.client();
        let server = FakeServer::builder()
            .cluster_id("c1")
            .configure(move |c| {
                c.remote_cluster_timeout = remote_timeout;
                if topology == Topology::MeshNetworks {
                    c.networks_config = Some(networks);
                }
                c.kubernetes = Some(KubeSettings {
                    source: KubeSource::Client(client),
                    namespaces: meshfed_kube::NamespaceFilter::All,
                    system_namespace: NS.into(),
                    remote_secrets: RemoteSecretSettings::default(),
                });
            })
            .start()
            .await
            .unwrap();
        Mesh {
            c1,
            c2,
            server,
            _dir: dir,
        }
    }

    fn http(&self) -> SocketAddr {
        self.server.bound().http
    }

    fn add_secret(&self, kubeconfig: &str) {
        self.c1
            .apply(&objects::remote_secret(NS, SECRET, &[("c2", kubeconfig)]));
    }

    /// Waits until `/debug/registryz` lists `Kubernetes/c2` as synced and the merged
    /// `reviews` has both clusters' VIPs, then until the pipeline applied it all.
    async fn wait_c2(&self) {
        let http = self.http();
        eventually("Kubernetes/c2 synced with merged VIPs", || async move {
            let r = get_json(http, "/debug/registryz").await;
            let synced = r["registries"]
                .as_array()?
                .iter()
                .any(|r| r["registry"] == "Kubernetes/c2" && r["synced"] == true);
            let vips = r["services"]
                .as_array()?
                .iter()
                .find(|s| s["hostname"] == "reviews.default.svc.cluster.local")?
                .get("cluster_vips")?
                .clone();
            (synced && vips["c1"][0] == "10.96.0.7" && vips["c2"][0] == "10.97.0.7").then_some(())
        })
        .await;
        eventually("both gateways known", || async move {
            let z = get_json(http, "/debug/networkz").await;
            let count = z["networks"]
                .as_array()?
                .iter()
                .map(|n| n["gateways"].as_array().map_or(0, Vec::len))
                .sum::<usize>();
            (count == 2).then_some(())
        })
        .await;
        self.server.sync().await;
    }

    async fn client(&self, network: &str, ip: &str) -> AdsClient {
        let mut metadata = serde_json::json!({"CLUSTER_ID": "c1"});
        if !network.is_empty() {
            metadata["NETWORK"] = network.into();
        }
        let mut client = AdsClient::connect(
            self.server.grpc_addr(),
            node_with(
                &format!("sidecar~{ip}~app.default~default.svc.cluster.local"),
                metadata,
            ),
        )
        .await
        .unwrap();
        client
            .subscribe(TypeUrl::Endpoint, &[CLUSTER])
            .await
            .unwrap();
        client
    }
}

/// `(address:port, weight)` of every endpoint, and the locality weights.
fn endpoints(cla: &ClusterLoadAssignment) -> Vec<(String, u32)> {
    cla.endpoints
        .iter()
        .flat_map(|g| &g.lb_endpoints)
        .map(|e| {
            let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                panic!("not an endpoint: {e:?}")
            };
            let Some(address::Address::SocketAddress(a)) = &ep.address.as_ref().unwrap().address
            else {
                panic!("not a socket address")
            };
            let Some(socket_address::PortSpecifier::PortValue(port)) = a.port_specifier else {
                panic!("no port")
            };
            (
                format!("{}:{port}", a.address),
                e.load_balancing_weight.map_or(0, |w| w.value),
            )
        })
        .collect()
}

fn rows(expected: &[(&str, u32)]) -> Vec<(String, u32)> {
    expected.iter().map(|(a, w)| (a.to_string(), *w)).collect()
}

/// The view from n1: its own endpoints directly, c2's three behind c2's gateway.
fn n1_view() -> Vec<(String, u32)> {
    rows(&[("10.1.0.1:9080", 1), ("10.1.0.2:9080", 1), (GATEWAY_C2, 3)])
}

/// The mirror view from n2.
fn n2_view() -> Vec<(String, u32)> {
    rows(&[
        ("10.2.0.1:9080", 1),
        ("10.2.0.2:9080", 1),
        ("10.2.0.3:9080", 1),
        (GATEWAY_C1, 2),
    ])
}

async fn recv_endpoints(client: &mut AdsClient) -> (u64, Vec<(String, u32)>) {
    let response = client.recv_type(TypeUrl::Endpoint).await.unwrap();
    let cla: Vec<ClusterLoadAssignment> = decode_all(&response).unwrap();
    assert_eq!(cla.len(), 1);
    (version_counter(&response.version_info), endpoints(&cla[0]))
}

/// The counter of a push version `"<time>/<counter>"`.
fn version_counter(version: &str) -> u64 {
    version
        .rsplit('/')
        .next()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// The version counter of the first forced push with reason `Cluster` after `after`.
async fn cluster_push_after(http: SocketAddr, after: u64) -> u64 {
    eventually("a forced push with reason cluster", || async move {
        let status = get_json(http, "/debug/push_status").await;
        status["pushes"].as_array()?.iter().find_map(|p| {
            let counter = version_counter(p["version"].as_str()?);
            let cluster = p["reasons"].as_array()?.iter().any(|r| r[0] == "Cluster");
            (counter > after && p["forced"] == true && cluster).then_some(counter)
        })
    })
    .await
}

async fn current_version(http: SocketAddr) -> u64 {
    version_counter(
        get_json(http, "/debug/registryz").await["version"]
            .as_str()
            .unwrap(),
    )
}

fn shard_of(shardz: &Value, shard: &str) -> Vec<String> {
    shardz["default/reviews.default.svc.cluster.local"]["shards"][shard]
        .as_array()
        .map(|eps| {
            eps.iter()
                .map(|e| e["address"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_remote_secret_adds_the_cluster_and_each_network_sees_the_other_through_its_gateway() {
    let mesh = Mesh::start(Topology::Labels).await;
    mesh.add_secret(&mesh.c2.kubeconfig());
    mesh.wait_c2().await;
    let http = mesh.http();

    let clusterz = get_json(http, "/debug/clusterz").await;
    assert_eq!(clusterz["clusters"][0]["cluster"], "c2", "{clusterz:#}");
    assert_eq!(clusterz["clusters"][0]["synced"], true);
    let (_, metrics) = http_get(mesh.server.bound().monitoring, "/metrics").await;
    assert_eq!(
        metric(&metrics, "istiod_managed_clusters{cluster_type=\"remote\"}"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "istiod_remote_cluster_sync_status{cluster=\"c2\"}"
        ),
        Some(1.0)
    );

    let shardz = get_json(http, "/debug/endpointShardz").await;
    assert_eq!(shard_of(&shardz, "Kubernetes/c1"), ["10.1.0.1", "10.1.0.2"]);
    assert_eq!(
        shard_of(&shardz, "Kubernetes/c2"),
        ["10.2.0.1", "10.2.0.2", "10.2.0.3"]
    );

    let z = get_json(http, "/debug/networkz").await;
    let networks = z["networks"].as_array().unwrap();
    assert_eq!(networks.len(), 2);
    assert_eq!(networks[0]["network"], "n1");
    assert_eq!(networks[0]["gateways"][0]["address"], "192.0.2.10");
    assert_eq!(networks[0]["gateways"][0]["cluster"], "c1");
    assert_eq!(
        networks[0]["gateways"][0]["sources"][0],
        "label topology.istio.io/network on service istio-system/istio-eastwestgateway@c1"
    );
    assert_eq!(networks[1]["network"], "n2");
    assert_eq!(networks[1]["gateways"][0]["address"], "192.0.2.20");

    let mut n1 = mesh.client("n1", "10.1.0.9").await;
    assert_eq!(recv_endpoints(&mut n1).await.1, n1_view());
    let mut n2 = mesh.client("n2", "10.2.0.9").await;
    assert_eq!(recv_endpoints(&mut n2).await.1, n2_view());
    // A proxy that does not say its network goes through both gateways.
    let mut unknown = mesh.client("", "10.9.0.9").await;
    assert_eq!(
        recv_endpoints(&mut unknown).await.1,
        rows(&[(GATEWAY_C1, 2), (GATEWAY_C2, 3)])
    );
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn mesh_networks_place_endpoints_and_resolve_registry_service_names() {
    let mesh = Mesh::start(Topology::MeshNetworks).await;
    mesh.add_secret(&mesh.c2.kubeconfig());
    mesh.wait_c2().await;
    let z = get_json(mesh.http(), "/debug/networkz").await;
    assert_eq!(
        z["networks"][1]["gateways"][0]["sources"][0],
        "registryServiceName istio-eastwestgateway.istio-system.svc.cluster.local@c2"
    );
    assert_eq!(z["networks"][1]["endpoints"][0]["fromRegistry"], "c2");

    let mut n1 = mesh.client("n1", "10.1.0.9").await;
    assert_eq!(recv_endpoints(&mut n1).await.1, n1_view());
    let mut n2 = mesh.client("n2", "10.2.0.9").await;
    assert_eq!(recv_endpoints(&mut n2).await.1, n2_view());
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn deleting_the_secret_drops_the_shard_with_a_forced_push() {
    let mesh = Mesh::start(Topology::Labels).await;
    mesh.add_secret(&mesh.c2.kubeconfig());
    mesh.wait_c2().await;
    let http = mesh.http();
    let mut n1 = mesh.client("n1", "10.1.0.9").await;
    assert_eq!(recv_endpoints(&mut n1).await.1, n1_view());

    let before = current_version(http).await;
    mesh.c1.delete::<objects::types::Secret>(Some(NS), SECRET);
    let removal = cluster_push_after(http, before).await;
    eventually("Kubernetes/c2 gone from registryz", || async move {
        let r = get_json(http, "/debug/registryz").await;
        let gone = r["registries"]
            .as_array()?
            .iter()
            .all(|r| r["registry"] != "Kubernetes/c2");
        gone.then_some(())
    })
    .await;
    let shardz = get_json(http, "/debug/endpointShardz").await;
    assert!(shard_of(&shardz, "Kubernetes/c2").is_empty(), "{shardz}");
    assert_eq!(shard_of(&shardz, "Kubernetes/c1"), ["10.1.0.1", "10.1.0.2"]);

    // The proxy converges on its own network only (n1's gateway is still known).
    loop {
        let (version, eps) = recv_endpoints(&mut n1).await;
        if version >= removal {
            assert_eq!(eps, rows(&[("10.1.0.1:9080", 1), ("10.1.0.2:9080", 1)]));
            break;
        }
    }
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn rotating_the_kubeconfig_never_drops_the_remote_endpoints() {
    let mesh = Mesh::start(Topology::Labels).await;
    mesh.add_secret(&mesh.c2.kubeconfig());
    mesh.wait_c2().await;
    let http = mesh.http();
    let mut n1 = mesh.client("n1", "10.1.0.9").await;
    assert_eq!(recv_endpoints(&mut n1).await.1, n1_view());
    let lists_before = mesh.c2.request_counts::<objects::types::Service>().0;

    // Same server, new kubeconfig text (a rotated token).
    let before = current_version(http).await;
    mesh.add_secret(&mesh.c2.kubeconfig_with_token("rotated"));
    let swapped = cluster_push_after(http, before).await;
    assert!(
        mesh.c2.request_counts::<objects::types::Service>().0 > lists_before,
        "a new registry listed c2"
    );

    // Every EDS response sent during the swap, up to the one for the swap's push,
    // carries c2's gateway with the weight of c2's three endpoints.
    let mut seen = Vec::new();
    loop {
        let (version, eps) = recv_endpoints(&mut n1).await;
        seen.push(version);
        assert_eq!(
            eps,
            n1_view(),
            "EDS response {} (version {version})",
            seen.len()
        );
        if version >= swapped {
            break;
        }
    }
    // And there is exactly one: the swap's own push. The new registry rewrote the
    // shard with the same endpoints, which sends the proxy nothing by itself.
    assert_eq!(seen, [swapped], "EDS response versions during the swap");
    let shardz = get_json(http, "/debug/endpointShardz").await;
    assert_eq!(
        shard_of(&shardz, "Kubernetes/c2"),
        ["10.2.0.1", "10.2.0.2", "10.2.0.3"]
    );
    mesh.server.shutdown().await;
}

/// Log lines written while a test runs, for assertions on what an operator would read.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).to_string()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_kubeconfig_with_an_exec_plugin_is_refused_with_a_log_line() {
    // The current-thread runtime runs every task on this thread, so a thread-local
    // subscriber sees the controller's log lines.
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let mesh = Mesh::start(Topology::Labels).await;
    let exec = "apiVersion: v1\nkind: Config\n\
        clusters: [{name: c, cluster: {server: 'https://c3.example.com'}}]\n\
        users: [{name: admin, user: {exec: {command: fetch-token, apiVersion: client.authentication.k8s.io/v1}}}]\n\
        contexts: [{name: c, context: {cluster: c, user: admin}}]\ncurrent-context: c\n";
    mesh.c1.apply(&objects::remote_secret(
        NS,
        "istio-remote-secret-c3",
        &[("c3", exec)],
    ));
    // A good secret after the bad one: it is served, so the bad one was seen first.
    mesh.add_secret(&mesh.c2.kubeconfig());
    mesh.wait_c2().await;
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("kubeconfig refused"))
        .unwrap_or_else(|| panic!("no refusal in the log:\n{text}"));
    for part in [
        "istio-system/istio-remote-secret-c3",
        "key c3",
        "exec",
        "fetch-token",
        "--allowInsecureKubeconfig exec",
    ] {
        assert!(line.contains(part), "{part:?} missing from: {line}");
    }
    let r = get_json(mesh.http(), "/debug/registryz").await;
    assert!(
        r["registries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["registry"] != "Kubernetes/c3"),
        "c3 never joins"
    );
    mesh.server.shutdown().await;
}

/// A kubeconfig for an API server that is gone (connections refused).
async fn unreachable_kubeconfig() -> String {
    let gone = FakeApiServer::start().await.unwrap();
    let kubeconfig = gone.kubeconfig();
    drop(gone);
    kubeconfig
}

async fn ready_status(http: SocketAddr) -> (u16, String) {
    http_get(http, "/ready").await
}

/// Waits until `/debug/clusterz` lists a cluster for which `matches` holds.
async fn wait_clusterz(http: SocketAddr, what: &str, matches: fn(&Value) -> bool) {
    eventually(what, || async move {
        let z = get_json(http, "/debug/clusterz").await;
        z["clusters"].as_array()?.iter().any(matches).then_some(())
    })
    .await;
}

/// `/ready` answers 200 and a new proxy is served endpoints.
async fn ready_and_serving(mesh: &Mesh) {
    let (status, body) = ready_status(mesh.http()).await;
    assert_eq!(status, 200, "{body}");
    let mut client = mesh.client("n1", "10.1.0.9").await;
    let (_, rows) = recv_endpoints(&mut client).await;
    assert!(!rows.is_empty());
}

#[tokio::test]
async fn an_unreachable_remote_cluster_added_at_run_time_changes_neither_readiness_nor_streams() {
    let mesh = Mesh::start(Topology::Labels).await;
    let http = mesh.http();
    eventually("ready", || async move {
        (ready_status(http).await.0 == 200).then_some(())
    })
    .await;
    mesh.c1.apply(&objects::remote_secret(
        NS,
        "istio-remote-secret-c3",
        &[("c3", &unreachable_kubeconfig().await)],
    ));
    wait_clusterz(http, "c3 known to the secret controller", |c| {
        c["cluster"] == "c3" && c["synced"] == false
    })
    .await;
    // A new stream is served, while c3 still has not synced.
    ready_and_serving(&mesh).await;
    let z = get_json(http, "/debug/clusterz").await;
    assert!(z.to_string().contains("\"c3\""), "{z:#}");
    let (_, metrics) = http_get(mesh.server.bound().monitoring, "/metrics").await;
    assert_eq!(
        metric(
            &metrics,
            "istiod_remote_cluster_sync_status{cluster=\"c3\"}"
        ),
        Some(0.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_remote_cluster_present_at_start_is_waited_for_at_most_the_timeout() {
    let kubeconfig = unreachable_kubeconfig().await;
    let timeout = Duration::from_secs(2);
    let started = tokio::time::Instant::now();
    let mesh = Mesh::start_with(
        Topology::Labels,
        |c1| {
            c1.apply(&objects::remote_secret(
                NS,
                "istio-remote-secret-c3",
                &[("c3", &kubeconfig)],
            ));
        },
        timeout,
    )
    .await;
    let http = mesh.http();
    // Before the bound: not ready, naming the remote cluster.
    let (status, body) = ready_status(http).await;
    if started.elapsed() < timeout {
        assert_eq!(status, 503, "{body}");
    }
    // After it: ready although c3 never synced, and streams are served.
    let body = eventually("ready", || async move {
        let (status, body) = ready_status(http).await;
        (status == 200).then_some(body)
    })
    .await;
    assert!(
        started.elapsed() >= timeout,
        "ready after {:?}: {body}",
        started.elapsed()
    );
    let mut client = mesh.client("n1", "10.1.0.9").await;
    let (_, rows) = recv_endpoints(&mut client).await;
    assert!(!rows.is_empty());
}

#[tokio::test]
async fn a_remote_cluster_whose_api_server_goes_away_keeps_its_endpoints_and_readiness() {
    let mesh = Mesh::start(Topology::Labels).await;
    mesh.add_secret(&mesh.c2.kubeconfig());
    mesh.wait_c2().await;
    let http = mesh.http();
    let Mesh {
        c1,
        c2,
        server,
        _dir,
        ..
    } = mesh;
    let mesh_http = http;
    drop(c2);
    // The API server is gone: the cluster's last view stays, marked stale.
    wait_clusterz(mesh_http, "c2 stale", |c| {
        c["cluster"] == "c2" && c["stale"] == true
    })
    .await;
    let (status, body) = ready_status(http).await;
    assert_eq!(status, 200, "{body}");
    let shardz = get_json(http, "/debug/endpointShardz").await;
    assert!(
        !shard_of(&shardz, "Kubernetes/c2").is_empty(),
        "c2's endpoints are kept: {shardz:#}"
    );
    drop((c1, server));
}

#[tokio::test]
async fn a_flapping_remote_cluster_never_takes_readiness_away() {
    let mesh = Mesh::start(Topology::Labels).await;
    let http = mesh.http();
    // Ready first: a cluster named before that is one present at start, waited for
    // (bounded) by design.
    eventually("ready", || async move {
        (ready_status(http).await.0 == 200).then_some(())
    })
    .await;
    // Up, then its Secret goes, then it comes back pointing at an API server that is
    // not there (the cluster went down while it was away).
    mesh.add_secret(&mesh.c2.kubeconfig());
    mesh.wait_c2().await;
    mesh.c1.delete::<objects::types::Secret>(Some(NS), SECRET);
    eventually("c2 gone", || async move {
        let z = get_json(http, "/debug/clusterz").await;
        z["clusters"]
            .as_array()?
            .iter()
            .all(|c| c["cluster"] != "c2")
            .then_some(())
    })
    .await;
    mesh.add_secret(&unreachable_kubeconfig().await);
    wait_clusterz(http, "c2 back, not synced", |c| {
        c["cluster"] == "c2" && c["synced"] == false
    })
    .await;
    ready_and_serving(&mesh).await;
}

/// The multicluster example, run as a user runs it, prints the east-west path of a
/// request from n1 to a service only c2 runs: the sidecar's cluster, the n2 gateway
/// endpoint and SNI, the gateway's SNI chain and SNI-DNAT cluster, c2's endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_traces_a_request_through_the_east_west_gateway() {
    let exe = std::env::current_exe().unwrap();
    let examples = exe.parent().unwrap().parent().unwrap().join("examples");
    let binary = examples.join(format!("multicluster{}", std::env::consts::EXE_SUFFIX));
    if !binary.exists() {
        // `cargo test --workspace` builds the examples; a single test target does not.
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "--example", "multicluster"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(status.success(), "building the multicluster example");
    }
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(&binary).output(),
    )
    .await
    .expect("the example finishes")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ratings = "ratings.default.svc.cluster.local";
    let sni = format!("outbound_.9080_._.{ratings}");
    let trace = stdout
        .split_once("East-west:")
        .map(|(_, t)| t)
        .unwrap_or_else(|| panic!("no east-west trace in:\n{stdout}"));
    let want = [
        format!("listener 0.0.0.0_9080 -> route 9080 -> cluster outbound|9080||{ratings}"),
        format!("EDS: {GATEWAY_C2}"),
        format!("with SNI {sni}"),
        format!("listener 0.0.0.0_15443 -> SNI filter chain {sni} -> cluster {sni}"),
        "10.2.0.11:9080".to_string(),
        "10.2.0.12:9080".to_string(),
    ];
    let mut rest = trace;
    for w in &want {
        let at = rest
            .find(w.as_str())
            .unwrap_or_else(|| panic!("{w:?} missing (in order) from the trace:\n{trace}"));
        rest = &rest[at + w.len()..];
    }
    let at_gateway = trace.split_once("4.").map_or("", |(_, t)| t);
    assert!(
        !at_gateway.contains("10.1."),
        "only c2's endpoints stand behind the gateway:\n{trace}"
    );
    // Two address-less VMs in n2 (printed before): n1's sidecar reaches them through
    // n2's gateway, which carries both (weight 2), by the SNI of their service.
    let vms = stdout
        .split_once("To VMs without a route:")
        .and_then(|(_, t)| t.split_once("East-west:"))
        .map(|(v, _)| v)
        .unwrap_or_else(|| panic!("no VM trace in:\n{stdout}"));
    assert!(
        vms.contains(&format!(
            "EDS: {GATEWAY_C2}       weight 2   via the n2 gateway"
        )),
        "{vms}"
    );
    assert!(
        vms.contains("SNI filter chain outbound_.9080_._.ratings.vm.local"),
        "{vms}"
    );
}

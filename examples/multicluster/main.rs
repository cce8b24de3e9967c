//! Two clusters on two networks, one control plane: what a proxy in each network gets.
//!
//! ```text
//! cargo run --example multicluster
//! ```
//!
//! Two simulated Kubernetes clusters (fake API servers speaking the real list/watch
//! wire format): `c1` on network `n1` and `c2` on network `n2`, both running
//! `reviews`. meshfed runs in-process with the Kubernetes registry for `c1`; `c2` is
//! found the way Istio finds remote clusters, through a Secret in `c1`'s
//! `istio-system` labelled `istio/multiCluster=true` whose key `c2` holds a kubeconfig
//! for `c2`. Networks come from the `topology.istio.io/network` label on each cluster's
//! `istio-system` namespace; `n2`'s gateway from the same label on `c2`'s east-west
//! gateway service (a LoadBalancer with an ingress IP), `n1`'s from the meshNetworks
//! file. Then an ADS client in each network asks for the endpoints of
//! `outbound|80||reviews.default.svc.cluster.local` and the answers are printed: local
//! endpoints direct, the other network's behind its gateway with their weight.
//!
//! Each network also runs an east-west gateway configured by meshfed: Istio's
//! `cross-network-gateway` (AUTO_PASSTHROUGH on 15443 for `*.local`). `ratings` runs
//! only in `c2`; the example traces a request from a sidecar in `n1` to it through the
//! simulator: the sidecar's listener, route and cluster, the gateway endpoint its EDS
//! sends and the SNI its mTLS carries, the east-west gateway's SNI filter chain and
//! SNI-DNAT cluster, and the `c2` endpoints that cluster's EDS sends.
//!
//! Two VMs in `n2` run `ratings.vm.local` (a ServiceEntry selecting two WorkloadEntries
//! with network `n2` and no address: nothing outside `n2` has a route to them, as with
//! VMs behind NAT). The example traces a request from `n1` to them the same way: the
//! sidecar's EDS sends `n2`'s gateway in their place, weighted by both. See README.md
//! beside this file for the same against real clusters.

use std::time::Duration;

use anyhow::{Context, bail};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{address, socket_address, transport_socket};
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
use meshfed::ads::TypeUrl;
use meshfed::app::{KubeSettings, KubeSource, RemoteSecretSettings};
use meshfed::generate::simulate::{Call, CallMode, simulate_call};
use meshfed::networks::NetworkView;
use meshfed::testing::{AdsClient, FakeServer, node_with};
use meshfed_kube::fake_api::{FakeApiServer, objects};
use meshfed_registry::{ProviderId, ShardKey};
use prost::Message;

const CLUSTER: &str = "outbound|80||reviews.default.svc.cluster.local";
const SYSTEM: &str = "istio-system";
const RATINGS: &str = "ratings.default.svc.cluster.local";
const VM_RATINGS: &str = "ratings.vm.local";

/// `ratings.vm.local`: two VMs in network `n2` with no address meshfed could route to
/// (Istio's TestEmptyAddressWorkloadEntry): reached from other networks through `n2`'s
/// east-west gateway only.
const VMS: &str = "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: ratings-vm
  namespace: default
spec:
  hosts: [ratings.vm.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 9080, name: http, protocol: HTTP}
  workloadSelector:
    labels: {app: ratings-vm}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: ratings-vm-1, namespace: default}
spec:
  network: n2
  serviceAccount: ratings-vm
  labels: {app: ratings-vm}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: ratings-vm-2, namespace: default}
spec:
  network: n2
  serviceAccount: ratings-vm
  labels: {app: ratings-vm}
";

/// Istio's east-west gateway (`samples/multicluster/expose-services.yaml`): every
/// `*.local` service reachable through 15443 by the SNI of Istio mTLS.
const EAST_WEST_GATEWAY: &str = "apiVersion: networking.istio.io/v1
kind: Gateway
metadata:
  name: cross-network-gateway
  namespace: istio-system
spec:
  selector:
    istio: eastwestgateway
  servers:
  - port: {number: 15443, name: tls, protocol: TLS}
    tls: {mode: AUTO_PASSTHROUGH}
    hosts: [\"*.local\"]
";

/// meshNetworks: which clusters are in which network, and `n1`'s gateway by address
/// (`n2`'s comes from the label on `c2`'s east-west gateway service).
const MESH_NETWORKS: &str = "networks:
  n1:
    endpoints: [{fromRegistry: c1}]
    gateways: [{address: 192.0.2.10, port: 15443}]
  n2:
    endpoints: [{fromRegistry: c2}]
";

/// One cluster: its network label, `reviews` with a pod per IP, and (when given) an
/// east-west gateway labelled with the network.
fn populate(api: &FakeApiServer, network: &str, vip: &str, ips: &[&str], gateway: Option<&str>) {
    api.apply(&objects::namespace(
        SYSTEM,
        &[("topology.istio.io/network", network)],
    ));
    api.apply(&objects::node("node-1", "us-east", "us-east-1a"));
    api.apply(&objects::service(
        "default",
        "reviews",
        vip,
        &[("http", 80)],
    ));
    let pods: Vec<(String, String)> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| (ip.to_string(), format!("reviews-{i}")))
        .collect();
    for (ip, pod) in &pods {
        api.apply(&objects::pod("default", pod, "reviews", ip, "node-1"));
    }
    let endpoints: Vec<(&str, &str)> = pods.iter().map(|(a, p)| (a.as_str(), p.as_str())).collect();
    api.apply(&objects::slice(
        "default",
        "reviews-abc",
        "reviews",
        &[("http", 9080)],
        &endpoints,
    ));
    if let Some(ip) = gateway {
        // `ratings` runs only in the cluster with the LoadBalancer gateway (c2).
        api.apply(&objects::service(
            "default",
            "ratings",
            "10.97.0.8",
            &[("http", 9080)],
        ));
        let ratings = [("10.2.0.11", "ratings-0"), ("10.2.0.12", "ratings-1")];
        for (ip, pod) in ratings {
            api.apply(&objects::pod("default", pod, "ratings", ip, "node-1"));
        }
        api.apply(&objects::slice(
            "default",
            "ratings-abc",
            "ratings",
            &[("http", 9080)],
            &ratings,
        ));
        let mut gw = objects::load_balancer(
            SYSTEM,
            "istio-eastwestgateway",
            "10.97.9.9",
            &[("tls", 15443)],
            ip,
        );
        gw.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("topology.istio.io/network".into(), network.into());
        api.apply(&gw);
    }
}

/// One printed line per endpoint: address, weight, and whether it is a gateway.
fn describe(cla: &ClusterLoadAssignment) -> Vec<String> {
    cla.endpoints
        .iter()
        .flat_map(|g| &g.lb_endpoints)
        .map(|e| {
            let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                return "?".to_string();
            };
            let Some(address::Address::SocketAddress(a)) =
                ep.address.as_ref().and_then(|a| a.address.as_ref())
            else {
                return "?".to_string();
            };
            let port = match a.port_specifier {
                Some(socket_address::PortSpecifier::PortValue(p)) => p,
                _ => 0,
            };
            let weight = e.load_balancing_weight.map_or(1, |w| w.value);
            let gateway_network = e
                .metadata
                .as_ref()
                .and_then(|m| m.filter_metadata.get("istio"))
                .and_then(|s| s.fields.get("network"))
                .and_then(|v| match &v.kind {
                    Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(s)) => {
                        Some(s.clone())
                    }
                    _ => None,
                });
            let how = match gateway_network {
                Some(network) => {
                    format!(
                        "via the {network} gateway (Istio mTLS; weight = its endpoints' weights)"
                    )
                }
                None => "direct".to_string(),
            };
            format!(
                "{:<22} weight {weight:<3} {how}",
                format!("{}:{port}", a.address)
            )
        })
        .collect()
}

async fn show(server: &FakeServer, network: &str, ip: &str) -> anyhow::Result<()> {
    let metadata = serde_json::json!({"NETWORK": network, "CLUSTER_ID": "c1"});
    let id = format!("sidecar~{ip}~productpage.default~default.svc.cluster.local");
    let mut client = AdsClient::connect(server.grpc_addr(), node_with(&id, metadata)).await?;
    client.subscribe(TypeUrl::Endpoint, &[CLUSTER]).await?;
    let cla = client.recv_load_assignments().await?;
    let cla = cla.first().context("no load assignment")?;
    println!("  a proxy in {network} ({ip}) receives:");
    for line in describe(cla) {
        println!("    {line}");
    }
    let total: u32 = cla
        .endpoints
        .iter()
        .map(|g| g.load_balancing_weight.map_or(0, |w| w.value))
        .sum();
    println!("    (locality weight {total})");
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let c1 = FakeApiServer::start().await?;
    let c2 = FakeApiServer::start().await?;
    populate(&c1, "n1", "10.96.0.7", &["10.1.0.1", "10.1.0.2"], None);
    populate(
        &c2,
        "n2",
        "10.97.0.7",
        &["10.2.0.1", "10.2.0.2", "10.2.0.3"],
        Some("192.0.2.20"),
    );
    println!("cluster c1 (network n1): API server {}", c1.url());
    println!("  reviews: 10.1.0.1, 10.1.0.2");
    println!("cluster c2 (network n2): API server {}", c2.url());
    println!("  reviews: 10.2.0.1, 10.2.0.2, 10.2.0.3");
    println!("  istio-eastwestgateway: LoadBalancer 192.0.2.20:15443");

    let dir = tempfile::tempdir()?;
    let networks = dir.path().join("meshNetworks.yaml");
    std::fs::write(&networks, MESH_NETWORKS)?;
    let config = dir.path().join("config");
    std::fs::create_dir(&config)?;
    std::fs::write(config.join("east-west-gateway.yaml"), EAST_WEST_GATEWAY)?;
    std::fs::write(config.join("vms.yaml"), VMS)?;
    let client = c1.client();
    let server = FakeServer::builder()
        .cluster_id("c1")
        .config_dir(&config)
        .configure(move |c| {
            c.networks_config = Some(networks);
            c.kubernetes = Some(KubeSettings {
                source: KubeSource::Client(client),
                namespaces: meshfed_kube::NamespaceFilter::All,
                system_namespace: SYSTEM.into(),
                remote_secrets: RemoteSecretSettings::default(),
            });
        })
        .start()
        .await?;

    // The remote secret, as `istioctl create-remote-secret --name c2` writes it.
    c1.apply(&objects::remote_secret(
        SYSTEM,
        "istio-remote-secret-c2",
        &[("c2", &c2.kubeconfig())],
    ));
    println!(
        "\nsecret {SYSTEM}/istio-remote-secret-c2 (label istio/multiCluster=true, key c2) created in c1"
    );

    // Wait (bounded) until c2's registry has synced and its gateway is in a snapshot.
    let remote = ShardKey::new(ProviderId::Kubernetes, "c2");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let synced = server
            .server()
            .aggregate()
            .registries()
            .iter()
            .any(|r| r.shard_key() == remote && r.has_synced());
        server.sync().await;
        let snapshot = server.server().snapshot().load();
        if synced
            && snapshot
                .gateways()
                .iter()
                .any(|g| g.network.as_str() == "n2")
            && snapshot.services().resolve(RATINGS, "default").is_some()
            && snapshot.services().resolve(VM_RATINGS, "default").is_some()
            && !snapshot.config().gateways().collect::<Vec<_>>().is_empty()
        {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("cluster c2 did not sync within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("registry {remote} synced; endpoints of both clusters merged under one service");

    let snapshot = server.server().snapshot().load();
    let view = NetworkView::new(&snapshot.mesh().networks, snapshot.gateways());
    println!("\nnetwork gateways (/debug/networkz):");
    for entry in view.entries() {
        let g = &entry.gateway;
        println!(
            "  {}: {}:{}  from {}",
            g.network,
            g.address,
            g.port,
            entry.sources.join(", ")
        );
    }

    println!("\nEDS for {CLUSTER}:");
    show(&server, "n1", "10.1.0.9").await?;
    show(&server, "n2", "10.2.0.9").await?;
    println!(
        "\nLocal endpoints are sent directly; the other network's endpoints are replaced by\n\
         its gateway, weighted by how many endpoints stand behind it, so traffic splits\n\
         2:3 between c1 and c2 from either side."
    );
    // The VMs first: the test of this example reads the `ratings` trace from
    // "East-west:" to the end.
    println!(
        "\nTo VMs without a route: GET http://{VM_RATINGS}:9080/ from a sidecar in n1 \
         (two WorkloadEntries in n2, no address):"
    );
    trace_east_west(&server, VM_RATINGS, "240.240.0.1").await?;
    println!(
        "\nEast-west: GET http://{RATINGS}:9080/ from a sidecar in n1 (ratings runs only in c2):"
    );
    trace_east_west(&server, RATINGS, "10.97.0.8").await?;
    server.shutdown().await;
    Ok(())
}

/// What one proxy was sent: listeners, route tables, clusters, and its ADS stream (for
/// the endpoints of one cluster).
struct Fetched {
    listeners: Vec<Listener>,
    routes: Vec<RouteConfiguration>,
    clusters: Vec<Cluster>,
    client: AdsClient,
}

async fn fetch(
    server: &FakeServer,
    id: &str,
    metadata: serde_json::Value,
) -> anyhow::Result<Fetched> {
    let mut client = AdsClient::connect(server.grpc_addr(), node_with(id, metadata)).await?;
    let config = client.fetch_config().await?;
    Ok(Fetched {
        listeners: config.listeners,
        routes: config.routes,
        clusters: config.clusters,
        client,
    })
}

impl Fetched {
    async fn endpoints(&mut self, cluster: &str) -> anyhow::Result<ClusterLoadAssignment> {
        self.client.subscribe(TypeUrl::Endpoint, &[cluster]).await?;
        let cla = self.client.recv_load_assignments().await?;
        cla.into_iter().next().context("no load assignment")
    }
}

/// The SNI a cluster's Istio mTLS carries (its `tlsMode-istio` transport socket).
fn istio_sni(cluster: &Cluster) -> Option<String> {
    let socket = cluster
        .transport_socket_matches
        .iter()
        .find(|m| m.name == "tlsMode-istio")
        .and_then(|m| m.transport_socket.as_ref())
        .or(cluster.transport_socket.as_ref())?;
    let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
        return None;
    };
    Some(UpstreamTlsContext::decode(any.value.as_slice()).ok()?.sni)
}

/// A request from a sidecar in n1 to `host` (at `ip`), which runs only in n2, hop by
/// hop.
async fn trace_east_west(server: &FakeServer, host: &str, ip: &str) -> anyhow::Result<()> {
    let mut sidecar = fetch(
        server,
        "sidecar~10.1.0.9~productpage.default~default.svc.cluster.local",
        serde_json::json!({"NETWORK": "n1", "CLUSTER_ID": "c1"}),
    )
    .await?;
    let call = Call::http(9080).to(ip).host(host);
    let hop = simulate_call(
        &sidecar.listeners,
        &sidecar.routes,
        &sidecar.clusters,
        &call,
    )?;
    let cluster = hop
        .cluster()
        .context("the sidecar routes to one cluster")?
        .to_string();
    println!(
        "  1. sidecar 10.1.0.9 (n1): listener {} -> route {} -> cluster {cluster}",
        hop.listener,
        hop.route_config.as_deref().unwrap_or("(inline)")
    );
    let cla = sidecar.endpoints(&cluster).await?;
    let sni = sidecar
        .clusters
        .iter()
        .find(|c| c.name == cluster)
        .and_then(istio_sni)
        .context("the cluster originates Istio mTLS")?;
    let lines = describe(&cla);
    if lines.is_empty() {
        println!("     EDS: (no endpoints)");
    }
    for line in lines {
        println!("     EDS: {line}");
    }
    println!("  2. the sidecar opens Istio mTLS to that gateway with SNI {sni}");

    let mut gateway = fetch(
        server,
        "router~10.2.0.50~istio-eastwestgateway-0.istio-system~istio-system.svc.cluster.local",
        serde_json::json!({
            "NETWORK": "n2",
            "CLUSTER_ID": "c2",
            "LABELS": {"istio": "eastwestgateway"},
        }),
    )
    .await?;
    let call = Call::tcp(15443)
        .tls()
        .sni(&sni)
        .alpn("istio-http/1.1")
        .mode(CallMode::Gateway);
    let hop = simulate_call(
        &gateway.listeners,
        &gateway.routes,
        &gateway.clusters,
        &call,
    )?;
    let dnat = hop
        .cluster()
        .context("the gateway forwards to one cluster")?
        .to_string();
    println!(
        "  3. east-west gateway of n2 (istio: eastwestgateway): listener {} -> SNI filter chain {sni} -> cluster {dnat}",
        hop.listener
    );
    let cla = gateway.endpoints(&dnat).await?;
    println!("  4. that cluster's EDS at the n2 gateway:");
    let lines = describe(&cla);
    if lines.is_empty() {
        println!(
            "     (none: no address is known for these workloads; the gateway reaches them \
             only where a control plane in n2 knows their addresses)"
        );
    }
    for line in lines {
        println!("     {line}");
    }
    Ok(())
}

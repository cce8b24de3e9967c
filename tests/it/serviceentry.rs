//! ServiceEntries and WorkloadEntries to what a sidecar receives: the cluster type of
//! each resolution, VM endpoints over EDS, host names inline in DNS clusters, EDS-only
//! pushes when a WorkloadEntry moves in or out of a selection, and the merge with a
//! Kubernetes service of the same hostname.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::address::Address;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::google::protobuf::value::Kind as ValueKind;
use meshfed::ads::TypeUrl;
use meshfed::testing::{AdsClient, FakeServer, decode_all, node_with};
use meshfed_api::networking::v1alpha3 as net;
use meshfed_registry::config::{ConfigObject, Kind};
use meshfed_registry::{MemoryRegistry, Protocol, ProviderId, Service, ServiceKey};
use net::service_entry::{Location, Resolution};

use crate::support::*;

const SIDECAR: &str = "sidecar~10.9.0.1~app.default~default.svc.cluster.local";
const BILLING: &str = "billing.vm.internal";
const BILLING_CLUSTER: &str = "outbound|8080||billing.vm.internal";

fn sidecar() -> envoy_types::pb::envoy::config::core::v3::Node {
    node_with(SIDECAR, serde_json::json!({"NETWORK": "vm-net"}))
}

fn port(name: &str, number: u32, protocol: &str) -> net::ServicePort {
    net::ServicePort {
        number,
        protocol: protocol.into(),
        name: name.into(),
        target_port: 0,
    }
}

fn entry(
    hosts: &[&str],
    resolution: Resolution,
    ports: Vec<net::ServicePort>,
) -> net::ServiceEntry {
    net::ServiceEntry {
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        ports,
        resolution: resolution as i32,
        ..Default::default()
    }
}

/// The VM service: STATIC, selecting `app: billing` in namespace `vm`.
fn billing_entry() -> ConfigObject {
    let mut spec = entry(
        &[BILLING],
        Resolution::Static,
        vec![port("http", 8080, "HTTP")],
    );
    spec.addresses = vec!["240.0.0.10".into()];
    spec.location = Location::MeshInternal as i32;
    spec.workload_selector = Some(net::WorkloadSelector {
        labels: [("app".to_string(), "billing".to_string())].into(),
    });
    ConfigObject::new("vm", "billing", spec)
}

/// A VM on network `vm-net` running `app`.
fn vm(name: &str, ip: &str, app: &str) -> ConfigObject {
    ConfigObject::new(
        "vm",
        name,
        net::WorkloadEntry {
            address: ip.into(),
            labels: [("app".to_string(), app.to_string())].into(),
            network: "vm-net".into(),
            locality: "us-east/zone-a".into(),
            service_account: "billing".into(),
            ..Default::default()
        },
    )
}

fn discovery_type(c: &Cluster) -> cluster::DiscoveryType {
    match c.cluster_discovery_type {
        Some(cluster::ClusterDiscoveryType::Type(t)) => {
            cluster::DiscoveryType::try_from(t).unwrap()
        }
        ref other => panic!("{}: no discovery type: {other:?}", c.name),
    }
}

/// `address:port` of every endpoint, sorted.
fn addresses(cla: &ClusterLoadAssignment) -> Vec<String> {
    let mut out: Vec<String> = cla
        .endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .filter_map(|e| match &e.host_identifier {
            Some(HostIdentifier::Endpoint(ep)) => ep.address.as_ref(),
            _ => None,
        })
        .filter_map(|a| match &a.address {
            Some(Address::SocketAddress(s)) => {
                let port = match s.port_specifier {
                    Some(PortSpecifier::PortValue(p)) => p,
                    _ => 0,
                };
                Some(format!("{}:{port}", s.address))
            }
            _ => None,
        })
        .collect();
    out.sort();
    out
}

/// Waits until the served snapshot has `key` with `n` endpoints, then until every
/// event so far is applied. (The ServiceEntry registry converts on its own task.)
async fn wait_for_endpoints(server: &FakeServer, key: &ServiceKey, n: usize) {
    let snapshot = server.server().snapshot().clone();
    let k = key.clone();
    eventually(&format!("{key} with {n} endpoints"), move || {
        let snapshot = snapshot.load();
        let served = snapshot.services().all().iter().any(|s| s.key() == k)
            && snapshot.shards(&k).map_or(0, |s| s.len()) == n;
        async move { served.then_some(()) }
    })
    .await;
    server.sync().await;
}

/// Subscribes to every cluster and returns them.
async fn clusters(client: &mut AdsClient) -> Vec<Cluster> {
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    client.recv_clusters().await.unwrap()
}

fn find<'a>(clusters: &'a [Cluster], name: &str) -> &'a Cluster {
    clusters.iter().find(|c| c.name == name).unwrap_or_else(|| {
        panic!(
            "no cluster {name} in {:?}",
            clusters.iter().map(|c| &c.name).collect::<Vec<_>>()
        )
    })
}

#[tokio::test]
async fn a_static_entry_serves_its_vm_workload_entries_over_eds() {
    let server = FakeServer::builder().start().await.unwrap();
    let store = server.config_store();
    store.apply(billing_entry()).unwrap();
    store.apply(vm("vm-1", "10.20.0.1", "billing")).unwrap();
    let mut second = vm("vm-2", "10.20.0.2", "billing");
    if let meshfed_registry::config::Spec::WorkloadEntry(we) = &mut second.spec {
        we.ports = [("http".to_string(), 18080)].into();
    }
    store.apply(second).unwrap();
    store.apply(vm("db-1", "10.20.0.3", "db")).unwrap();
    let key = ServiceKey::new(BILLING, "vm");
    wait_for_endpoints(&server, &key, 2).await;

    let mut client = AdsClient::connect(server.grpc_addr(), sidecar())
        .await
        .unwrap();
    let all = clusters(&mut client).await;
    let billing = find(&all, BILLING_CLUSTER);
    assert_eq!(discovery_type(billing), cluster::DiscoveryType::Eds);
    assert_eq!(
        billing.eds_cluster_config.as_ref().unwrap().service_name,
        BILLING_CLUSTER
    );

    client
        .subscribe(TypeUrl::Endpoint, &[BILLING_CLUSTER])
        .await
        .unwrap();
    let clas = client.recv_load_assignments().await.unwrap();
    assert_eq!(clas.len(), 1);
    let cla = &clas[0];
    assert_eq!(
        addresses(cla),
        ["10.20.0.1:8080", "10.20.0.2:18080"],
        "the selected VMs only; a WorkloadEntry's own port wins"
    );
    let locality = cla.endpoints[0].locality.as_ref().unwrap();
    assert_eq!(
        (locality.region.as_str(), locality.zone.as_str()),
        ("us-east", "zone-a")
    );
    let tls_mode = cla.endpoints[0].lb_endpoints[0]
        .metadata
        .as_ref()
        .unwrap()
        .filter_metadata["envoy.transport_socket_match"]
        .fields["tlsMode"]
        .kind
        .clone();
    assert_eq!(
        tls_mode,
        Some(ValueKind::StringValue("istio".into())),
        "a service account means the VM runs a sidecar"
    );

    let endpointz = get_json(server.bound().http, "/debug/endpointz").await;
    let shard = &endpointz[key.to_string()]["shards"]["External/Kubernetes"];
    assert_eq!(shard[0]["network"], "vm-net", "{endpointz:#}");
    assert_eq!(
        endpointz[key.to_string()]["serviceAccounts"][0],
        "spiffe://cluster.local/ns/vm/sa/billing"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn dns_entries_are_dns_clusters_with_the_host_inline() {
    let server = FakeServer::builder().start().await.unwrap();
    let store = server.config_store();
    store
        .apply(ConfigObject::new(
            "default",
            "api",
            entry(
                &["api.example.com"],
                Resolution::Dns,
                vec![port("https", 443, "TLS")],
            ),
        ))
        .unwrap();
    let mut logical = entry(
        &["one.example.com"],
        Resolution::DnsRoundRobin,
        vec![port("http", 80, "HTTP")],
    );
    logical.endpoints = vec![net::WorkloadEntry {
        address: "backend.example.net".into(),
        ports: [("http".to_string(), 8080)].into(),
        ..Default::default()
    }];
    store
        .apply(ConfigObject::new("default", "one", logical))
        .unwrap();
    wait_for_endpoints(&server, &ServiceKey::new("api.example.com", "default"), 1).await;
    wait_for_endpoints(&server, &ServiceKey::new("one.example.com", "default"), 1).await;

    let mut client = AdsClient::connect(server.grpc_addr(), sidecar())
        .await
        .unwrap();
    let all = clusters(&mut client).await;
    let api = find(&all, "outbound|443||api.example.com");
    assert_eq!(discovery_type(api), cluster::DiscoveryType::StrictDns);
    assert_eq!(
        addresses(api.load_assignment.as_ref().unwrap()),
        ["api.example.com:443"],
        "Envoy resolves the host itself"
    );
    assert!(api.eds_cluster_config.is_none());
    let one = find(&all, "outbound|80||one.example.com");
    assert_eq!(discovery_type(one), cluster::DiscoveryType::LogicalDns);
    assert_eq!(
        addresses(one.load_assignment.as_ref().unwrap()),
        ["backend.example.net:8080"]
    );

    // An added endpoint of a DNS service changes the cluster: a CDS push.
    let mut two = entry(
        &["api.example.com"],
        Resolution::Dns,
        vec![port("https", 443, "TLS")],
    );
    two.endpoints = vec![net::WorkloadEntry {
        address: "api-backup.example.net".into(),
        ..Default::default()
    }];
    let mut newer = ConfigObject::new("default", "api-backup", two);
    newer.creation_time = UNIX_EPOCH + Duration::from_secs(100);
    store.apply(newer).unwrap();
    let updated = loop {
        let response = client.recv().await.unwrap();
        client.ack(&response).await.unwrap();
        if response.type_url == TypeUrl::Cluster.as_str() {
            break decode_all::<Cluster>(&response).unwrap();
        }
    };
    assert_eq!(
        addresses(
            find(&updated, "outbound|443||api.example.com")
                .load_assignment
                .as_ref()
                .unwrap()
        ),
        ["api-backup.example.net:443", "api.example.com:443"],
        "both entries of the host, in creation order"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_none_entry_is_an_original_destination_cluster() {
    let server = FakeServer::builder().start().await.unwrap();
    let mut spec = entry(
        &["*.internal.example.com"],
        Resolution::None,
        vec![port("tcp", 5432, "TCP")],
    );
    spec.addresses = vec!["10.50.0.0/16".into()];
    server
        .config_store()
        .apply(ConfigObject::new("default", "wildcard", spec))
        .unwrap();
    wait_for_endpoints(
        &server,
        &ServiceKey::new("*.internal.example.com", "default"),
        0,
    )
    .await;
    let mut client = AdsClient::connect(server.grpc_addr(), sidecar())
        .await
        .unwrap();
    let all = clusters(&mut client).await;
    let c = find(&all, "outbound|5432||*.internal.example.com");
    assert_eq!(discovery_type(c), cluster::DiscoveryType::OriginalDst);
    assert_eq!(c.lb_policy, cluster::LbPolicy::ClusterProvided as i32);
    assert!(c.load_assignment.is_none() && c.eds_cluster_config.is_none());
    server.shutdown().await;
}

#[tokio::test]
async fn a_workload_entry_label_change_is_an_eds_only_push() {
    let server = FakeServer::builder().start().await.unwrap();
    let store = server.config_store();
    store.apply(billing_entry()).unwrap();
    store.apply(vm("vm-1", "10.20.0.1", "billing")).unwrap();
    store.apply(vm("vm-2", "10.20.0.2", "billing")).unwrap();
    let key = ServiceKey::new(BILLING, "vm");
    wait_for_endpoints(&server, &key, 2).await;

    let mut client = AdsClient::connect(server.grpc_addr(), sidecar())
        .await
        .unwrap();
    clusters(&mut client).await;
    client
        .subscribe(TypeUrl::Endpoint, &[BILLING_CLUSTER])
        .await
        .unwrap();
    client.recv_load_assignments().await.unwrap();

    for (app, want) in [
        ("db", vec!["10.20.0.1:8080"]),
        ("billing", vec!["10.20.0.1:8080", "10.20.0.2:8080"]),
    ] {
        store.apply(vm("vm-2", "10.20.0.2", app)).unwrap();
        let response = client.recv().await.unwrap();
        assert_eq!(
            response.type_url,
            TypeUrl::Endpoint.as_str(),
            "only EDS is pushed (app={app})"
        );
        client.ack(&response).await.unwrap();
        let clas: Vec<ClusterLoadAssignment> = decode_all(&response).unwrap();
        assert_eq!(addresses(&clas[0]), want, "app={app}");
        let last = &server.server().pipeline().history()[0];
        assert!(!last.full, "an endpoint-only push: {last:?}");
        assert_eq!(
            last.changes,
            [format!("Endpoints/vm/{BILLING}")],
            "{last:?}"
        );
    }

    // Deleting the entry removes the cluster (a full push).
    assert!(store.delete(Kind::ServiceEntry, "vm", "billing"));
    let remaining = loop {
        let response = client.recv().await.unwrap();
        client.ack(&response).await.unwrap();
        if response.type_url == TypeUrl::Cluster.as_str() {
            break decode_all::<Cluster>(&response).unwrap();
        }
    };
    assert!(remaining.iter().all(|c| c.name != BILLING_CLUSTER));
    server.shutdown().await;
}

#[tokio::test]
async fn kubernetes_wins_the_same_hostname_and_the_conflict_shows() {
    const HOST: &str = "payments.shop.svc.cluster.local";
    let server = FakeServer::builder().start().await.unwrap();
    // An old ServiceEntry for the Kubernetes service's name...
    let mut spec = entry(&[HOST], Resolution::Dns, vec![port("grpc", 9000, "GRPC")]);
    spec.endpoints = vec![net::WorkloadEntry {
        address: "10.99.0.1".into(),
        ..Default::default()
    }];
    let mut squatter = ConfigObject::new("shop", "payments", spec);
    squatter.creation_time = UNIX_EPOCH + Duration::from_secs(1);
    server.config_store().apply(squatter).unwrap();
    wait_for_endpoints(&server, &ServiceKey::new(HOST, "shop"), 1).await;

    // ...loses to the (younger) Kubernetes service.
    let kube = MemoryRegistry::with_provider(
        ProviderId::Kubernetes,
        "cluster-1",
        server.server().sink().clone(),
    );
    kube.mark_synced();
    server.server().add_registry(Arc::new(kube.clone()));
    let mut svc = Service::new(HOST, "shop", ProviderId::Kubernetes, "");
    svc.ports
        .push(meshfed_registry::Port::new("http", 8080, Protocol::Http).unwrap());
    svc.creation_time = UNIX_EPOCH + Duration::from_secs(1_000);
    kube.add_service(svc);
    server.sync().await;

    let registryz = get_json(server.bound().http, "/debug/registryz").await;
    let conflicts = registryz["conflicts"].as_array().unwrap();
    assert_eq!(conflicts.len(), 1, "{registryz:#}");
    assert_eq!(conflicts[0]["winner"], "Kubernetes/cluster-1");
    assert_eq!(conflicts[0]["loser"], "External/Kubernetes");
    assert_eq!(conflicts[0]["reason"], "KubernetesPrecedence");
    let served = registryz["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["hostname"] == HOST)
        .unwrap();
    assert_eq!(served["provider"], "Kubernetes");
    assert_eq!(
        served["sources"],
        serde_json::json!(["Kubernetes/cluster-1", "External/Kubernetes"])
    );
    let registries: Vec<&str> = registryz["registries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["registry"].as_str().unwrap())
        .collect();
    assert!(
        registries.contains(&"External/Kubernetes"),
        "{registries:?}"
    );

    let mut client = AdsClient::connect(server.grpc_addr(), sidecar())
        .await
        .unwrap();
    let all = clusters(&mut client).await;
    let names: Vec<&str> = all
        .iter()
        .map(|c| c.name.as_str())
        .filter(|n| n.ends_with(HOST))
        .collect();
    assert_eq!(
        names,
        [format!("outbound|8080||{HOST}")],
        "the Kubernetes service's port, not the entry's"
    );
    assert_eq!(
        discovery_type(find(&all, &format!("outbound|8080||{HOST}"))),
        cluster::DiscoveryType::Eds
    );
    server.shutdown().await;
}

#[tokio::test]
async fn entries_in_the_config_directory_are_served() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("external.yaml"),
        "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: github, namespace: default}
spec:
  hosts: [github.com]
  ports: [{number: 443, name: https, protocol: TLS}]
  resolution: DNS
",
    )
    .unwrap();
    let server = FakeServer::builder()
        .config_dir(dir.path())
        .start()
        .await
        .unwrap();
    wait_for_endpoints(&server, &ServiceKey::new("github.com", "default"), 1).await;
    let http = server.bound().http;
    eventually("ready", || async move {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
    let mut client = AdsClient::connect(server.grpc_addr(), sidecar())
        .await
        .unwrap();
    let all = clusters(&mut client).await;
    let github = find(&all, "outbound|443||github.com");
    assert_eq!(discovery_type(github), cluster::DiscoveryType::StrictDns);
    assert_eq!(
        addresses(github.load_assignment.as_ref().unwrap()),
        ["github.com:443"]
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_file_entry_added_after_a_mock_service_of_its_host_does_not_win() {
    const HOST: &str = "ledger.shop.svc.cluster.local";
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::builder()
        .config_dir(dir.path())
        .start()
        .await
        .unwrap();
    // The mock service is known first...
    let reg = server.mock_registry("c1");
    let mut svc = Service::new(HOST, "shop", ProviderId::Mock, "c1");
    svc.ports
        .push(meshfed_registry::Port::new("http", 8080, Protocol::Http).unwrap());
    svc.creation_time = std::time::SystemTime::now();
    reg.add_service(svc);
    server.sync().await;

    // ...then a ServiceEntry of the same host without a creationTimestamp appears in
    // the config directory. It is stamped when first seen, so it is the younger one.
    std::fs::write(
        dir.path().join("ledger.yaml"),
        format!(
            "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: ledger, namespace: shop}}
spec:
  hosts: [{HOST}]
  ports: [{{number: 9000, name: grpc, protocol: GRPC}}]
  resolution: STATIC
  endpoints: [{{address: 10.99.0.1}}]
"
        ),
    )
    .unwrap();
    let http = server.bound().http;
    let registryz = eventually("the entry to reach the merge", || async move {
        let registryz = get_json(http, "/debug/registryz").await;
        let both = registryz["services"].as_array().is_some_and(|all| {
            all.iter().any(|s| {
                s["hostname"] == HOST && s["sources"].as_array().is_some_and(|v| v.len() == 2)
            })
        });
        both.then_some(registryz)
    })
    .await;
    let served = registryz["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["hostname"] == HOST)
        .unwrap();
    assert_eq!(served["provider"], "Mock", "{registryz:#}");
    assert_eq!(
        served["sources"],
        serde_json::json!(["Mock/c1", "External/Kubernetes"])
    );
    let conflicts = registryz["conflicts"].as_array().unwrap();
    assert_eq!(conflicts.len(), 1, "{registryz:#}");
    assert_eq!(conflicts[0]["winner"], "Mock/c1");
    assert_eq!(conflicts[0]["loser"], "External/Kubernetes");
    assert_eq!(conflicts[0]["reason"], "OldestWins");

    server.sync().await;
    let mut client = AdsClient::connect(server.grpc_addr(), sidecar())
        .await
        .unwrap();
    let all = clusters(&mut client).await;
    let names: Vec<&str> = all
        .iter()
        .map(|c| c.name.as_str())
        .filter(|n| n.ends_with(HOST))
        .collect();
    assert_eq!(
        names,
        [format!("outbound|8080||{HOST}")],
        "the mock service's port, not the entry's"
    );
    server.shutdown().await;
}

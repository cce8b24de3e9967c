//! Split horizon through the whole server: a VM without an address (a WorkloadEntry
//! naming only its network) is reached through its network's gateway, weighted by the
//! entries behind it; it is never sent to its own network; one whose network has no
//! gateway is reported in /debug/configz; and a PeerAuthentication disabling mTLS for
//! the VMs takes them out of other networks' EDS (the gateway needs mTLS).

use envoy_types::pb::envoy::config::core::v3::address;
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use meshfed::ads::TypeUrl;
use meshfed::testing::{AdsClient, FakeServer, node_with};
use meshfed_api::networking::v1alpha3 as net;
use meshfed_api::security::v1beta1 as sec;
use meshfed_registry::config::ConfigObject;

use crate::support::*;

const HOST: &str = "remote-vm.example.internal";
const CLUSTER: &str = "outbound|80||remote-vm.example.internal";

const MESH_NETWORKS: &str = "networks:\n  \
    network-2:\n    gateways: [{address: 192.0.2.20, port: 15443}]\n";

fn workload_entry(name: &str, network: &str) -> ConfigObject {
    ConfigObject::new(
        "vms",
        name,
        net::WorkloadEntry {
            address: String::new(),
            network: network.into(),
            service_account: "vm".into(),
            labels: [("app".to_string(), "remote-vm".to_string())].into(),
            ..Default::default()
        },
    )
}

/// `(address:port, weight)` of every endpoint of `name`.
fn endpoints(clas: &[ClusterLoadAssignment], name: &str) -> Vec<(String, u32)> {
    clas.iter()
        .filter(|c| c.cluster_name == name)
        .flat_map(|c| &c.endpoints)
        .flat_map(|l| &l.lb_endpoints)
        .map(|e| {
            let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                unreachable!()
            };
            let Some(address::Address::SocketAddress(a)) = &ep.address.as_ref().unwrap().address
            else {
                unreachable!()
            };
            let Some(
                envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(
                    port,
                ),
            ) = a.port_specifier
            else {
                unreachable!()
            };
            (
                format!("{}:{port}", a.address),
                e.load_balancing_weight.map_or(0, |w| w.value),
            )
        })
        .collect()
}

async fn client_in(server: &FakeServer, network: &str, ip: &str) -> AdsClient {
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            &format!("sidecar~{ip}~client.apps~apps.svc.cluster.local"),
            serde_json::json!({"NETWORK": network}),
        ),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    assert!(
        clusters.iter().any(|c| c.name == CLUSTER),
        "{CLUSTER} missing"
    );
    client
        .subscribe(TypeUrl::Endpoint, &[CLUSTER])
        .await
        .unwrap();
    client
}

#[tokio::test]
async fn an_address_less_vm_is_reached_through_its_network_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let networks = dir.path().join("meshNetworks.yaml");
    std::fs::write(&networks, MESH_NETWORKS).unwrap();
    let server = FakeServer::builder()
        .configure(move |c| c.networks_config = Some(networks))
        .start()
        .await
        .unwrap();
    let store = server.config_store();
    store
        .apply(ConfigObject::new(
            "vms",
            "remote-vm",
            net::ServiceEntry {
                hosts: vec![HOST.into()],
                ports: vec![net::ServicePort {
                    number: 80,
                    protocol: "HTTP".into(),
                    name: "http".into(),
                    target_port: 0,
                }],
                resolution: net::service_entry::Resolution::Static as i32,
                location: net::service_entry::Location::MeshInternal as i32,
                workload_selector: Some(net::WorkloadSelector {
                    labels: [("app".to_string(), "remote-vm".to_string())].into(),
                }),
                ..Default::default()
            },
        ))
        .unwrap();
    store.apply(workload_entry("vm-1", "network-2")).unwrap();
    store.apply(workload_entry("vm-2", "network-2")).unwrap();
    // network-3 has no gateway: nothing reaches this one.
    store.apply(workload_entry("vm-3", "network-3")).unwrap();
    let http = server.bound().http;
    eventually("the ServiceEntry is served", || async move {
        let r = get_json(http, "/debug/registryz").await;
        r["services"]
            .as_array()?
            .iter()
            .any(|s| s["hostname"] == HOST)
            .then_some(())
    })
    .await;
    server.sync().await;

    // A client of network-1: the gateway of network-2, weight 2 (two VMs behind it).
    let mut remote = client_in(&server, "network-1", "10.1.0.9").await;
    let clas = remote.recv_load_assignments().await.unwrap();
    assert_eq!(
        endpoints(&clas, CLUSTER),
        vec![("192.0.2.20:15443".to_string(), 2)]
    );
    // A client of network-2 gets nothing: the VMs have no address to send.
    let mut local = client_in(&server, "network-2", "10.2.0.9").await;
    let clas = local.recv_load_assignments().await.unwrap();
    assert_eq!(endpoints(&clas, CLUSTER), vec![]);

    let configz = get_json(http, "/debug/configz").await;
    let unplaced = configz["unplacedWorkloads"].as_array().unwrap();
    assert_eq!(unplaced.len(), 1, "{configz:#}");
    assert_eq!(unplaced[0]["kind"], "WorkloadEntry");
    assert_eq!(unplaced[0]["namespace"], "vms");
    assert_eq!(unplaced[0]["name"], "vm-3");
    assert_eq!(unplaced[0]["field"], "spec.address");
    assert_eq!(unplaced[0]["network"], "network-3");
    let (_, metrics) = http_get(server.bound().monitoring, "/metrics").await;
    assert!(
        metrics.contains("meshfed_unplaced_workloads{network=\"network-3\"} 1"),
        "{metrics}"
    );

    // mTLS disabled for the VMs (a workload policy of their namespace, the client in
    // another one): the gateway cannot carry plaintext, so network-1 loses them.
    store
        .apply(ConfigObject::new(
            "vms",
            "plaintext-vms",
            sec::PeerAuthentication {
                selector: Some(meshfed_api::r#type::v1beta1::WorkloadSelector {
                    match_labels: [("app".to_string(), "remote-vm".to_string())].into(),
                }),
                mtls: Some(sec::peer_authentication::MutualTls {
                    mode: sec::peer_authentication::mutual_tls::Mode::Disable as i32,
                }),
                ..Default::default()
            },
        ))
        .unwrap();
    let emptied = async {
        loop {
            let response = remote.recv().await.unwrap();
            remote.ack(&response).await.unwrap();
            if response.type_url != TypeUrl::Endpoint.as_str() {
                continue;
            }
            let clas: Vec<ClusterLoadAssignment> = meshfed::testing::decode_all(&response).unwrap();
            if endpoints(&clas, CLUSTER).is_empty() {
                break;
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), emptied)
        .await
        .expect("network-1's EDS pushed without the VMs");
    server.shutdown().await;
}

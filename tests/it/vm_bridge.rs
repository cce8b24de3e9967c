//! The VM-bridging scenario end to end: VMs as WorkloadEntries on network `vm-net`, a
//! Consul service and a Kubernetes service, all visible to one proxy; the same hostname
//! from a ServiceEntry and Kubernetes resolved by the merge policy, with the conflict
//! shown in /debug/registryz.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use meshfed::ads::TypeUrl;
use meshfed::app::ConsulSettings;
use meshfed::testing::{AdsClient, FakeServer, node_with};
use meshfed_api::networking::v1alpha3 as net;
use meshfed_consul::fake::{FakeConsul, Instance};
use meshfed_registry::config::ConfigObject;
use meshfed_registry::{MemoryRegistry, Protocol, ProviderId, ServiceKey};

use crate::support::*;

const BILLING: &str = "outbound|8080||billing.vm.example.internal";
const WEB: &str = "outbound|8080||web.service.consul";
const PAYMENTS: &str = "outbound|9000||payments.shop.svc.cluster.local";

fn vm(name: &str, ip: &str) -> ConfigObject {
    ConfigObject::new(
        "vm",
        name,
        net::WorkloadEntry {
            address: ip.into(),
            labels: [("app".to_string(), "billing".to_string())].into(),
            network: "vm-net".into(),
            ..Default::default()
        },
    )
}

fn endpoint_count(clas: &[ClusterLoadAssignment], name: &str) -> usize {
    clas.iter()
        .find(|c| c.cluster_name == name)
        .map(|c| c.endpoints.iter().map(|l| l.lb_endpoints.len()).sum())
        .unwrap_or(0)
}

#[tokio::test]
async fn vms_consul_and_kubernetes_services_reach_one_proxy() {
    let consul = FakeConsul::start().await.unwrap();
    consul.register(Instance::new("web", "web-1", "10.30.0.1", 8080).with_meta("protocol", "http"));
    let settings = ConsulSettings {
        retry_interval: Duration::from_millis(20),
        max_retry_interval: Duration::from_millis(200),
        ..ConsulSettings::new(consul.url())
    };
    let server = FakeServer::builder()
        .configure(move |c| c.consul = Some(settings))
        .start()
        .await
        .unwrap();

    // VMs: a STATIC ServiceEntry selecting WorkloadEntries on vm-net.
    let store = server.config_store();
    let billing = net::ServiceEntry {
        hosts: vec!["billing.vm.example.internal".into()],
        ports: vec![net::ServicePort {
            number: 8080,
            protocol: "HTTP".into(),
            name: "http".into(),
            target_port: 0,
        }],
        resolution: net::service_entry::Resolution::Static as i32,
        location: net::service_entry::Location::MeshInternal as i32,
        workload_selector: Some(net::WorkloadSelector {
            labels: [("app".to_string(), "billing".to_string())].into(),
        }),
        ..Default::default()
    };
    store
        .apply(ConfigObject::new("vm", "billing", billing))
        .unwrap();
    store.apply(vm("vm-1", "10.20.0.1")).unwrap();
    store.apply(vm("vm-2", "10.20.0.2")).unwrap();

    // An old ServiceEntry squatting the Kubernetes service's name...
    let mut squatter = net::ServiceEntry {
        hosts: vec!["payments.shop.svc.cluster.local".into()],
        ports: vec![net::ServicePort {
            number: 9000,
            protocol: "GRPC".into(),
            name: "grpc".into(),
            target_port: 0,
        }],
        resolution: net::service_entry::Resolution::Static as i32,
        ..Default::default()
    };
    squatter.endpoints = vec![net::WorkloadEntry {
        address: "10.99.0.1".into(),
        ..Default::default()
    }];
    let mut squatter = ConfigObject::new("shop", "payments", squatter);
    squatter.creation_time = UNIX_EPOCH + Duration::from_secs(1);
    store.apply(squatter).unwrap();

    // ...and the (younger) Kubernetes service, which wins.
    let kube = MemoryRegistry::with_provider(
        ProviderId::Kubernetes,
        "cluster-1",
        server.server().sink().clone(),
    );
    kube.mark_synced();
    server.server().add_registry(Arc::new(kube.clone()));
    let mut payments = service(
        "payments.shop.svc.cluster.local",
        "shop",
        &[("grpc", 9000, Protocol::Grpc)],
    );
    payments.provider = ProviderId::Kubernetes;
    payments.creation_time = UNIX_EPOCH + Duration::from_secs(1_000);
    kube.add_service(payments);
    kube.set_endpoints(
        &ServiceKey::new("payments.shop.svc.cluster.local", "shop"),
        vec![endpoint("10.1.0.7", "grpc", 9000, "r1/z1")],
    );

    let http = server.bound().http;
    eventually(
        "every registry synced with all three services",
        || async move {
            if http_get(http, "/ready").await.0 != 200 {
                return None;
            }
            let r = get_json(http, "/debug/registryz").await;
            let hosts: Vec<String> = r["services"]
                .as_array()?
                .iter()
                .filter_map(|s| s["hostname"].as_str().map(String::from))
                .collect();
            [
                "billing.vm.example.internal",
                "web.service.consul",
                "payments.shop.svc.cluster.local",
            ]
            .iter()
            .all(|h| hosts.iter().any(|x| x == h))
            .then_some(())
        },
    )
    .await;
    server.sync().await;

    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            "sidecar~10.20.0.9~frontend.vm~vm.svc.cluster.local",
            serde_json::json!({"NETWORK": "vm-net"}),
        ),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    for want in [BILLING, WEB, PAYMENTS] {
        assert!(clusters.iter().any(|c| c.name == want), "{want} missing");
    }
    client
        .subscribe(TypeUrl::Endpoint, &[BILLING, WEB, PAYMENTS])
        .await
        .unwrap();
    let clas = client.recv_load_assignments().await.unwrap();
    assert_eq!(endpoint_count(&clas, BILLING), 2, "both VMs");
    assert_eq!(endpoint_count(&clas, WEB), 1, "the Consul instance");
    // EDS merges every shard of the key: the Kubernetes endpoint and the squatting
    // entry's endpoint both belong to payments.shop; the Kubernetes service's ports win.
    assert_eq!(
        endpoint_count(&clas, PAYMENTS),
        2,
        "one endpoint from each shard (Kubernetes/cluster-1 and the ServiceEntry's)"
    );

    let registryz = get_json(http, "/debug/registryz").await;
    let conflict = registryz["conflicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["service"]["hostname"] == "payments.shop.svc.cluster.local")
        .cloned()
        .unwrap_or_else(|| panic!("no conflict shown: {registryz:#}"));
    assert_eq!(conflict["winner"], "Kubernetes/cluster-1");
    assert_eq!(conflict["reason"], "KubernetesPrecedence");
    server.shutdown().await;
}

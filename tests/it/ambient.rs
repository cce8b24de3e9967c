//! Ambient mode: a ztunnel-shaped client on the secure port gets the workloads and
//! services of pods, a WorkloadEntry VM, a Consul service (a fake Consul speaking its
//! HTTP API) and a mock-registry service over Delta ADS;
//! a pod change reaches it as one Workload; a deleted pod is removed; a reconnect
//! with the versions it holds gets nothing it already has.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use meshfed::testing::{ClientTls, FakeServer, node_with, tls_channel};
use meshfed_api::workload::{Address, Workload, address};
use meshfed_consul::fake::{FakeConsul, Instance};
use meshfed_kube::fake_api::objects::types::Pod;
use meshfed_kube::fake_api::{CustomResource, FakeApiServer, objects};
use meshfed_registry::{Endpoint, Protocol, ServiceKey, WorkloadKind, WorkloadMeta};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::secure::{kube_ca, published_root};
use crate::support::{http_get, service};

const ADDRESS: &str = "type.googleapis.com/istio.workload.Address";
const AUTHORIZATION: &str = "type.googleapis.com/istio.security.Authorization";
const ZTUNNEL_ID: &str = "ztunnel~10.0.0.1~ztunnel-x.istio-system~istio-system.svc.cluster.local";

/// A client speaking Delta ADS as ztunnel does: TLS 1.3 with ALPN h2, a Kubernetes
/// token as `authorization: Bearer`, a `clusterid` header, wildcard subscriptions to
/// both ambient types, ACKs carrying only the type and nonce, and resumption with
/// the versions it holds.
struct Ztunnel {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: Streaming<DeltaDiscoveryResponse>,
    /// Address resources held: name -> (version, resource).
    held: BTreeMap<String, (String, Address)>,
}

impl Ztunnel {
    async fn connect(
        channel: tonic::transport::Channel,
        token: &str,
        held: BTreeMap<String, (String, Address)>,
    ) -> Ztunnel {
        let auth: tonic::metadata::MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
        let mut client = AggregatedDiscoveryServiceClient::with_interceptor(
            channel,
            move |mut req: tonic::Request<()>| {
                req.metadata_mut().insert("authorization", auth.clone());
                req.metadata_mut()
                    .insert("clusterid", "Kubernetes".parse().unwrap());
                Ok(req)
            },
        );
        let (tx, rx) = mpsc::channel(16);
        let initial: HashMap<String, String> = held
            .iter()
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect();
        // ztunnel's first requests: both types, wildcard, with what it holds.
        tx.send(DeltaDiscoveryRequest {
            type_url: ADDRESS.into(),
            node: Some(ztunnel_node()),
            resource_names_subscribe: vec!["*".into()],
            initial_resource_versions: initial,
            ..Default::default()
        })
        .await
        .unwrap();
        tx.send(DeltaDiscoveryRequest {
            type_url: AUTHORIZATION.into(),
            resource_names_subscribe: vec!["*".into()],
            ..Default::default()
        })
        .await
        .unwrap();
        let rx = client
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Ztunnel { tx, rx, held }
    }

    /// The next Address response, ACKed (Authorization responses are ACKed and
    /// skipped); applies it to what the client holds and returns it.
    async fn next_address(&mut self) -> DeltaDiscoveryResponse {
        loop {
            let r = tokio::time::timeout(Duration::from_secs(20), self.rx.message())
                .await
                .expect("a response in time")
                .unwrap()
                .expect("stream open");
            self.tx
                .send(DeltaDiscoveryRequest {
                    type_url: r.type_url.clone(),
                    response_nonce: r.nonce.clone(),
                    ..Default::default()
                })
                .await
                .unwrap();
            if r.type_url != ADDRESS {
                assert_eq!(r.type_url, AUTHORIZATION);
                continue;
            }
            for name in &r.removed_resources {
                self.held.remove(name);
            }
            for res in &r.resources {
                let body = res.resource.as_ref().expect("a body");
                assert_eq!(body.type_url, ADDRESS);
                let address = Address::decode(body.value.as_slice()).unwrap();
                self.held
                    .insert(res.name.clone(), (res.version.clone(), address));
            }
            return r;
        }
    }

    /// Reads Address responses until `done` holds for what the client holds.
    async fn until(&mut self, what: &str, done: impl Fn(&Self) -> bool) {
        for _ in 0..20 {
            if done(self) {
                return;
            }
            self.next_address().await;
        }
        panic!("{what}: never held; holds {:?}", self.held.keys());
    }

    fn workload(&self, uid: &str) -> Option<&Workload> {
        match self.held.get(uid)?.1.r#type.as_ref()? {
            address::Type::Workload(w) => Some(w),
            address::Type::Service(_) => None,
        }
    }
}

fn ztunnel_node() -> Node {
    node_with(ZTUNNEL_ID, serde_json::json!({"CLUSTER_ID": "Kubernetes"}))
}

fn ambient_pod(name: &str, ip: &str, node: &str) -> Pod {
    let mut pod = objects::pod("mesh", name, "app", ip, node);
    pod.metadata
        .labels
        .as_mut()
        .unwrap()
        .remove("security.istio.io/tlsMode");
    pod.metadata.annotations = Some(BTreeMap::from([(
        "ambient.istio.io/redirection".to_string(),
        "enabled".to_string(),
    )]));
    pod
}

fn in_an_hour() -> std::time::SystemTime {
    std::time::SystemTime::now() + Duration::from_secs(3600)
}

async fn start(api: &FakeApiServer) -> FakeServer {
    start_with_consul(api, None).await
}

/// [`start`], with meshfed's Consul registry following `consul` when given.
async fn start_with_consul(api: &FakeApiServer, consul: Option<&FakeConsul>) -> FakeServer {
    api.install_crds(CustomResource::istio_networking(&[
        "v1", "v1beta1", "v1alpha3",
    ]));
    for ns in ["default", "istio-system"] {
        api.apply(&objects::namespace(ns, &[]));
    }
    api.apply(&objects::namespace(
        "mesh",
        &[("istio.io/dataplane-mode", "ambient")],
    ));
    api.apply(&objects::service(
        "mesh",
        "app",
        "10.96.0.10",
        &[("http", 80)],
    ));
    api.apply(&ambient_pod("app-1", "10.1.0.1", "node-1"));
    api.apply(&ambient_pod("app-2", "10.1.0.2", "node-2"));
    api.apply(&objects::slice(
        "mesh",
        "app-abc",
        "app",
        &[("http", 8080)],
        &[("10.1.0.1", "app-1"), ("10.1.0.2", "app-2")],
    ));
    api.apply_custom(&objects::istio(
        "v1",
        "WorkloadEntry",
        "mesh",
        "app-vm",
        serde_json::json!({"address": "10.5.0.9", "labels": {"app": "app"}, "serviceAccount": "vm"}),
    ));
    let client = api.client();
    let consul = consul.map(|consul| meshfed::app::ConsulSettings {
        retry_interval: Duration::from_millis(20),
        max_retry_interval: Duration::from_millis(200),
        ..meshfed::app::ConsulSettings::new(consul.url())
    });
    let server = FakeServer::builder()
        .configure(move |c| {
            kube_ca(c, client);
            c.consul = consul;
        })
        .start()
        .await
        .unwrap();
    let http = server.bound().http;
    crate::support::eventually("the Kubernetes registry to sync", || async move {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
    // A service of another registry (as the mock registry file or Consul gives it).
    let mock = server.mock_registry("mock");
    mock.add_service(service("db.mock", "mesh", &[("tcp", 5432, Protocol::Tcp)]));
    let mut ep = Endpoint::new("10.9.0.1".parse().unwrap()).with_port("tcp", 5432);
    ep.workload = Some(Arc::new(WorkloadMeta {
        kind: WorkloadKind::External,
        name: "db-1".into(),
        namespace: "mesh".into(),
        uid: "mock/mock/mesh/db.mock/db-1".into(),
        node_name: "node-1".into(),
        workload_name: "db".into(),
        ..WorkloadMeta::default()
    }));
    mock.set_endpoints(&ServiceKey::new("db.mock", "mesh"), vec![ep]);
    server.sync().await;
    server
}

#[tokio::test]
async fn a_ztunnel_gets_workloads_and_services_and_follows_pod_changes() {
    let api = FakeApiServer::start().await.unwrap();
    let consul = FakeConsul::start().await.unwrap();
    consul.register(
        Instance::new("orders", "orders-1", "10.7.0.1", 9090)
            .with_meta("istio.io/dataplane-mode", "ambient"),
    );
    let server = start_with_consul(&api, Some(&consul)).await;
    let root = published_root(&api, "default").await;
    let tls = ClientTls {
        roots_pem: root,
        identity: None,
        server_name: "istiod.istio-system.svc".into(),
    };
    let token = api.issue_token("istio-system", "ztunnel", &["istio-ca"], in_an_hour(), None);
    let channel = tls_channel(server.secure_grpc_addr(), &tls).await.unwrap();
    let mut zt = Ztunnel::connect(channel, &token, BTreeMap::new()).await;

    let pod1 = "Kubernetes//Pod/mesh/app-1";
    let vm = "Kubernetes/networking.istio.io/WorkloadEntry/mesh/app-vm";
    let db = "mock/mock/mesh/db.mock/db-1";
    // `<datacenter>/consul/<namespace>/<service>/<id>`.
    let is_orders = |k: &String| k.ends_with("/consul/default/orders/orders-1");
    zt.until("pods, VM, Consul and mock workloads and services", |z| {
        [pod1, "Kubernetes//Pod/mesh/app-2", vm, db]
            .iter()
            .all(|u| z.workload(u).is_some())
            && z.held.keys().any(is_orders)
            && z.held.contains_key("mesh/app.mesh.svc.cluster.local")
            && z.held.contains_key("mesh/db.mock")
            && z.held.keys().any(|k| k.ends_with("/orders.service.consul"))
    })
    .await;
    let orders = zt.held.keys().find(|k| is_orders(k)).unwrap().clone();
    let orders_w = zt.workload(&orders).unwrap();
    assert_eq!(orders_w.addresses, vec![vec![10, 7, 0, 1]]);
    assert_eq!(orders_w.services.len(), 1, "{orders_w:?}");
    assert_eq!(
        orders_w.services.values().next().unwrap().ports[0].target_port,
        9090
    );
    let w = zt.workload(pod1).unwrap();
    assert_eq!(w.addresses, vec![vec![10, 1, 0, 1]]);
    assert_eq!(w.node, "node-1");
    assert_eq!(w.service_account, "app");
    assert_eq!(w.tunnel_protocol, 1, "HBONE: redirected by istio-cni");
    assert_eq!(w.cluster_id, "Kubernetes");
    assert_eq!(w.canonical_name, "app");
    let ports = &w.services["mesh/app.mesh.svc.cluster.local"].ports;
    assert_eq!((ports[0].service_port, ports[0].target_port), (80, 8080));
    let vm_w = zt.workload(vm).unwrap();
    assert_eq!(vm_w.addresses, vec![vec![10, 5, 0, 9]]);
    assert_eq!(vm_w.tunnel_protocol, 0);
    assert_eq!(vm_w.service_account, "vm");
    assert!(
        vm_w.services
            .contains_key("mesh/app.mesh.svc.cluster.local")
    );
    let db_w = zt.workload(db).unwrap();
    assert_eq!(db_w.services["mesh/db.mock"].ports[0].target_port, 5432);
    match zt.held["mesh/app.mesh.svc.cluster.local"].1.r#type.as_ref() {
        Some(address::Type::Service(s)) => {
            assert_eq!(s.name, "app");
            assert_eq!(s.addresses[0].address, vec![10, 96, 0, 10]);
            // The Service's own numeric targetPort, as istiod sends it (each
            // workload's `services` map carries where it listens).
            assert_eq!((s.ports[0].service_port, s.ports[0].target_port), (80, 80));
        }
        other => panic!("not a service: {other:?}"),
    }

    // A pod change: one Workload, nothing else.
    let mut changed = ambient_pod("app-1", "10.1.0.1", "node-1");
    changed
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("version".into(), "v2".into());
    api.apply(&changed);
    let r = zt.next_address().await;
    assert_eq!(
        r.resources
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        vec![pod1],
        "one workload"
    );
    assert!(r.removed_resources.is_empty());
    assert_eq!(zt.workload(pod1).unwrap().canonical_revision, "v2");

    // A deleted pod is removed.
    api.delete::<Pod>(Some("mesh"), "app-2");
    zt.until("app-2 removed", |z| {
        z.workload("Kubernetes//Pod/mesh/app-2").is_none()
    })
    .await;

    // Resuming with what it holds: nothing is sent again.
    let held = std::mem::take(&mut zt.held);
    drop(zt);
    let channel = tls_channel(server.secure_grpc_addr(), &tls).await.unwrap();
    let mut again = Ztunnel::connect(channel, &token, held.clone()).await;
    let r = again.next_address().await;
    assert!(
        r.resources.is_empty() && r.removed_resources.is_empty(),
        "resumed with everything current: {:?}",
        r.resources.iter().map(|r| &r.name).collect::<Vec<_>>()
    );
    // The debug page shows what the ztunnel holds.
    let (status, body) = http_get(server.bound().http, "/debug/ambientz").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(pod1), "{body}");

    // The config dump shows what the ztunnel holds after Envoy's (empty) sections: one
    // CSDS `ClientConfig` with each Address and Authorization resource.
    let http = server.bound().http;
    let url = format!("/debug/config_dump?proxyID={ZTUNNEL_ID}");
    let dump = crate::support::eventually("the ztunnel's ACK in its config dump", || {
        let url = url.clone();
        async move {
            let (status, body) = http_get(http, &url).await;
            assert_eq!(status, 200, "{body}");
            let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
            let acked = dump["configs"].as_array()?.last()?["generic_xds_configs"]
                .as_array()?
                .iter()
                .any(|c| c["name"] == pod1 && c["client_status"] == "ACKED");
            acked.then_some(dump)
        }
    })
    .await;
    let configs = dump["configs"].as_array().unwrap();
    assert_eq!(
        configs[0]["@type"],
        "type.googleapis.com/envoy.admin.v3.ClustersConfigDump"
    );
    let entry = configs.last().unwrap();
    assert_eq!(
        entry["@type"],
        "type.googleapis.com/envoy.service.status.v3.ClientConfig"
    );
    let items = entry["generic_xds_configs"].as_array().unwrap();
    let item = items.iter().find(|c| c["name"] == pod1).unwrap();
    assert_eq!(item["type_url"], ADDRESS);
    assert_eq!(item["xds_config"]["@type"], ADDRESS);
    assert_eq!(item["xds_config"]["workload"]["uid"], pod1);
    assert_eq!(item["xds_config"]["workload"]["node"], "node-1");
    assert!(item["version_info"].as_str().is_some_and(|v| !v.is_empty()));
    assert!(
        items
            .iter()
            .any(|c| c["name"] == "mesh/app.mesh.svc.cluster.local"
                && c["xds_config"]["service"]["hostname"] == "app.mesh.svc.cluster.local")
    );
    // No policies: the Authorization type shows its status only.
    assert!(
        items
            .iter()
            .any(|c| c["type_url"] == AUTHORIZATION && c.get("name").is_none()),
        "{entry}"
    );
    // `types=wds` limits the dump to the ambient entry of the Address type.
    let (status, body) = http_get(http, &format!("{url}&types=wds")).await;
    assert_eq!(status, 200, "{body}");
    let only: serde_json::Value = serde_json::from_str(&body).unwrap();
    let configs = only["configs"].as_array().unwrap();
    assert_eq!(configs.len(), 1, "{only}");
    assert!(
        configs[0]["generic_xds_configs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["type_url"] == ADDRESS)
    );
    let _ = held;
}

#[tokio::test]
async fn pods_and_workload_entries_no_service_selects_are_workloads_too() {
    let api = FakeApiServer::start().await.unwrap();
    let server = start(&api).await;
    let root = published_root(&api, "default").await;
    let tls = ClientTls {
        roots_pem: root,
        identity: None,
        server_name: "istiod.istio-system.svc".into(),
    };
    let token = api.issue_token("istio-system", "ztunnel", &["istio-ca"], in_an_hour(), None);
    let channel = tls_channel(server.secure_grpc_addr(), &tls).await.unwrap();
    let mut zt = Ztunnel::connect(channel, &token, BTreeMap::new()).await;
    zt.until("the first workloads", |z| {
        z.workload("Kubernetes//Pod/mesh/app-1").is_some()
    })
    .await;

    // A pod and a VM that no Service or ServiceEntry selects.
    api.apply(&objects::pod(
        "mesh", "lone-1", "lone", "10.1.0.7", "node-2",
    ));
    api.apply_custom(&objects::istio(
        "v1",
        "WorkloadEntry",
        "mesh",
        "lone-vm",
        serde_json::json!({"address": "10.5.0.7", "labels": {"app": "lonevm"}}),
    ));
    let lone = "Kubernetes//Pod/mesh/lone-1";
    let vm = "Kubernetes/networking.istio.io/WorkloadEntry/mesh/lone-vm";
    zt.until("the lone pod and VM", |z| {
        z.workload(lone).is_some() && z.workload(vm).is_some()
    })
    .await;
    let w = zt.workload(lone).unwrap();
    assert_eq!(w.addresses, vec![vec![10, 1, 0, 7]]);
    assert_eq!(
        (w.node.as_str(), w.canonical_name.as_str()),
        ("node-2", "lone")
    );
    assert!(w.services.is_empty(), "backs no service");
    assert_eq!(w.status, 0, "healthy: the pod is ready");
    let v = zt.workload(vm).unwrap();
    assert_eq!(v.addresses, vec![vec![10, 5, 0, 7]]);
    assert!(v.services.is_empty());

    // Its change reaches the ztunnel as that one Workload.
    let mut changed = objects::pod("mesh", "lone-1", "lone", "10.1.0.7", "node-2");
    changed
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("version".into(), "v3".into());
    api.apply(&changed);
    let r = zt.next_address().await;
    assert_eq!(
        r.resources
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        vec![lone],
        "one workload"
    );
    assert_eq!(zt.workload(lone).unwrap().canonical_revision, "v3");

    // Deleted: removed.
    api.delete::<Pod>(Some("mesh"), "lone-1");
    zt.until("lone-1 removed", |z| z.workload(lone).is_none())
        .await;
}

/// A waypoint Gateway of the Kubernetes config store: a pod labelled to use it gets no
/// waypoint until the Gateway reports an address, then that address; the status
/// change alone reaches the ztunnel.
#[tokio::test]
async fn a_waypoint_is_named_once_its_gateway_reports_an_address() {
    let api = FakeApiServer::start().await.unwrap();
    api.install_crds([CustomResource::new(
        "gateway.networking.k8s.io",
        "Gateway",
        "gateways",
        &["v1"],
    )]);
    let server = start(&api).await;
    let root = published_root(&api, "default").await;
    let tls = ClientTls {
        roots_pem: root,
        identity: None,
        server_name: "istiod.istio-system.svc".into(),
    };
    let token = api.issue_token("istio-system", "ztunnel", &["istio-ca"], in_an_hour(), None);
    let channel = tls_channel(server.secure_grpc_addr(), &tls).await.unwrap();
    let mut zt = Ztunnel::connect(channel, &token, BTreeMap::new()).await;
    let app1 = "Kubernetes//Pod/mesh/app-1";
    zt.until("app-1", |z| z.workload(app1).is_some()).await;

    let gateway = |status: serde_json::Value| {
        serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "wp", "namespace": "mesh",
                "labels": {"istio.io/waypoint-for": "workload"}},
            "spec": {"gatewayClassName": "istio-waypoint", "listeners": [
                {"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
            "status": status,
        })
    };
    api.apply_custom(&gateway(serde_json::json!({})));
    let mut labelled = ambient_pod("app-1", "10.1.0.1", "node-1");
    labelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("istio.io/use-waypoint".into(), "wp".into());
    api.apply(&labelled);
    zt.until("app-1 labelled", |z| {
        z.workload(app1)
            .is_some_and(|w| w.canonical_name == "app" && w.waypoint.is_none())
    })
    .await;
    server.sync().await;
    assert!(
        zt.workload(app1).unwrap().waypoint.is_none(),
        "the Gateway reports no address yet"
    );

    api.apply_custom(&gateway(serde_json::json!({"addresses": [
        {"type": "IPAddress", "value": "10.96.0.99"},
        {"type": "Hostname", "value": "wp.mesh.svc.cluster.local"},
    ]})));
    zt.until("app-1's waypoint", |z| {
        z.workload(app1).is_some_and(|w| w.waypoint.is_some())
    })
    .await;
    let wp = zt.workload(app1).unwrap().waypoint.clone().unwrap();
    assert_eq!(wp.hbone_mtls_port, 15008);
    match wp.destination {
        Some(meshfed_api::workload::gateway_address::Destination::Hostname(h)) => {
            assert_eq!(
                (h.namespace.as_str(), h.hostname.as_str()),
                ("mesh", "wp.mesh.svc.cluster.local")
            );
        }
        other => panic!("not a host name: {other:?}"),
    }
}

//! VM auto-registration end to end: a simulated VM's agent connects to the secure port
//! with a Kubernetes token and `AUTO_REGISTER_GROUP`; its WorkloadEntry appears in the
//! API server (written by the replica that holds the connection only), its endpoint
//! reaches another proxy's EDS once it reports healthy and leaves when it reports a
//! failed probe, and the entry goes once the grace period passes after the VM
//! disconnects. Outside Kubernetes, the entry lives in the in-memory config store and
//! shows in `/debug/registryz`.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use meshfed::testing::{AdsClient, ClientTls, FakeServer, node_with, tls_channel};
use meshfed::xds::TypeUrl;
use meshfed_kube::fake_api::{CustomResource, FakeApiServer, objects};
use serde_json::{Value, json};
use tonic::metadata::MetadataMap;

use crate::support::*;

const VM_IP: &str = "10.9.0.5";
const ENTRY: &str = "billing-10.9.0.5";
const CLUSTER: &str = "outbound|8080||billing.vm.internal";

fn workload_group() -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "WorkloadGroup",
        "metadata": {"name": "billing", "namespace": "vm"},
        "spec": {
            "metadata": {"labels": {"app": "billing"}},
            "template": {"serviceAccount": "billing", "ports": {"http": 8080}},
            "probe": {"httpGet": {"port": 8080, "path": "/ready"}}
        }
    })
}

fn service_entry() -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": "billing", "namespace": "vm"},
        "spec": {
            "hosts": ["billing.vm.internal"],
            "ports": [{"number": 8080, "name": "http", "protocol": "HTTP"}],
            "resolution": "STATIC",
            "location": "MESH_INTERNAL",
            "workloadSelector": {"labels": {"app": "billing"}}
        }
    })
}

/// The node of a VM's istio-agent for the `billing` group, as `istioctl x workload
/// entry configure` sets it up (the probe comes from the group into PROXY_CONFIG).
fn vm_node(ip: &str, group: &str) -> envoy_types::pb::envoy::config::core::v3::Node {
    node_with(
        &format!("sidecar~{ip}~billing-vm.vm~vm.svc.cluster.local"),
        json!({
            "SERVICE_ACCOUNT": "billing",
            "AUTO_REGISTER_GROUP": group,
            "INSTANCE_IPS": ip,
            "LABELS": {"app": "billing", "version": "v1"},
            "PROXY_CONFIG": {"readinessProbe": {"httpGet": {"port": 8080, "path": "/ready"}}}
        }),
    )
}

/// An `istio.io/health` request: healthy, or the probe's error.
async fn report_health(vm: &mut AdsClient, error: Option<&str>) {
    vm.send(DiscoveryRequest {
        type_url: "istio.io/health".into(),
        error_detail: error.map(|message| RpcStatus {
            code: 13,
            message: message.into(),
            details: vec![],
        }),
        ..Default::default()
    })
    .await
    .unwrap();
}

fn endpoints(clas: &[ClusterLoadAssignment]) -> Vec<String> {
    clas.iter()
        .filter(|c| c.cluster_name == CLUSTER)
        .flat_map(|c| c.endpoints.iter().flat_map(|l| l.lb_endpoints.iter()))
        .filter_map(|e| {
            use envoy_types::pb::envoy::config::core::v3::address::Address;
            use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
            let Some(HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                return None;
            };
            match ep.address.as_ref()?.address.as_ref()? {
                Address::SocketAddress(s) => Some(s.address.clone()),
                _ => None,
            }
        })
        .collect()
}

/// Reads EDS pushes until `want` are the billing endpoints.
async fn until_endpoints(client: &mut AdsClient, want: &[&str]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let clas = client.recv_load_assignments().await.unwrap();
        let got = endpoints(&clas);
        if clas.iter().any(|c| c.cluster_name == CLUSTER) && got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "EDS of {CLUSTER}: {got:?}, want {want:?}"
        );
    }
}

/// A proxy in `default` watching the billing endpoints.
async fn watcher(addr: SocketAddr) -> AdsClient {
    let mut client = AdsClient::connect(
        addr,
        node_with(
            "sidecar~10.1.0.9~app.default~default.svc.cluster.local",
            json!({}),
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

fn entry(api: &FakeApiServer) -> Option<Value> {
    api.get_custom("networking.istio.io", "WorkloadEntry", "vm", ENTRY)
}

fn healthy_condition(entry: &Value) -> Option<(String, String)> {
    entry["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Healthy")
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["message"].as_str().unwrap_or_default().to_string(),
            )
        })
}

/// Workload entry writes (anything but GET) by one replica's service account.
fn entry_writes(api: &FakeApiServer, replica: &str) -> Vec<String> {
    api.requests_by(&format!("system:serviceaccount:istio-system:{replica}"))
        .iter()
        .filter(|r| r.method != "GET" && r.path.contains("/workloadentries"))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

/// Waits until `server`'s config store holds the VM's entry (its writes start from
/// that view).
async fn seen_by(server: &FakeServer) {
    let http = server.bound().http;
    eventually("the server to see the entry", || async move {
        let configz = get_json(http, "/debug/configz").await.to_string();
        configz.contains(ENTRY).then_some(())
    })
    .await;
}

fn bearer(token: &str) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
    metadata
}

#[tokio::test]
async fn a_vm_registers_follows_its_health_in_eds_and_is_removed_after_the_grace_period() {
    let api = EnforcedApi::start().await;
    for ns in ["default", "istio-system", "vm"] {
        api.apply(&objects::namespace(ns, &[]));
    }
    api.install_crds(CustomResource::istio(&[
        "v1", "v1beta1", "v1alpha3", "v1alpha1",
    ]));
    api.apply_custom(&workload_group());
    api.apply_custom(&service_entry());
    let in_an_hour = SystemTime::now() + Duration::from_secs(3600);
    let replica = |identity: &str| {
        let token = api.issue_token("istio-system", identity, &[], in_an_hour, None);
        let client = api.client_with_token(&token);
        let identity = identity.to_string();
        FakeServer::builder().configure(move |c| {
            crate::secure::kube_ca(c, client);
            c.lease = Some(meshfed::app::LeaseSettings {
                identity: Some(identity),
                ..Default::default()
            });
            c.workload_entries.grace_period = Duration::from_secs(1);
        })
    };
    let a = replica("a").start().await.unwrap();
    let b = replica("b").start().await.unwrap();
    for server in [&a, &b] {
        let http = server.bound().http;
        eventually("ready", || async move {
            (http_get(http, "/ready").await.0 == 200).then_some(())
        })
        .await;
    }
    let root = crate::secure::published_root(&api, "default").await;

    // The VM connects to replica a with its service account's token.
    let token = api.issue_token("vm", "billing", &["istio-ca"], in_an_hour, None);
    let tls = ClientTls {
        roots_pem: root,
        identity: None,
        server_name: "istiod.istio-system.svc".into(),
    };
    let channel = tls_channel(a.secure_grpc_addr(), &tls).await.unwrap();
    let mut vm = AdsClient::over(channel, bearer(&token), vm_node(VM_IP, "billing"))
        .await
        .unwrap();
    vm.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let created = eventually("the VM's WorkloadEntry", || async { entry(&api) }).await;
    let annotations = &created["metadata"]["annotations"];
    assert_eq!(annotations["istio.io/workloadController"], "a");
    assert_eq!(annotations["istio.io/autoRegistrationGroup"], "billing");
    assert_eq!(annotations["proxy.istio.io/health-checks-enabled"], "true");
    assert!(annotations["istio.io/connectedAt"].is_string());
    assert_eq!(created["spec"]["address"], VM_IP);
    assert_eq!(created["spec"]["serviceAccount"], "billing");
    assert_eq!(created["spec"]["labels"]["version"], "v1");

    // Health reports are written from replica a's view of the entry.
    seen_by(&a).await;
    // Another proxy, on replica b: no endpoint until the VM reports healthy.
    let mut client = watcher(b.grpc_addr()).await;
    until_endpoints(&mut client, &[]).await;
    report_health(&mut vm, None).await;
    until_endpoints(&mut client, &[VM_IP]).await;
    report_health(&mut vm, Some("HTTP GET /ready: 503")).await;
    until_endpoints(&mut client, &[]).await;
    let reported = entry(&api).unwrap();
    assert_eq!(
        healthy_condition(&reported),
        Some(("False".into(), "HTTP GET /ready: 503".into()))
    );

    // The VM goes; its entry is marked disconnected, then removed after the grace
    // period.
    drop(vm);
    eventually("the entry removed after the grace period", || async {
        entry(&api).is_none().then_some(())
    })
    .await;

    // Only the replica holding the connection wrote: create, status twice,
    // disconnect, delete.
    let by_a = entry_writes(&api, "a");
    assert_eq!(entry_writes(&api, "b"), Vec::<String>::new());
    assert!(by_a.iter().any(|w| w.starts_with("POST ")), "{by_a:?}");
    assert!(by_a.iter().any(|w| w.ends_with("/status")), "{by_a:?}");
    assert!(by_a.iter().any(|w| w.starts_with("DELETE ")), "{by_a:?}");
    let metrics = http_get(a.bound().monitoring, "/metrics").await.1;
    assert_eq!(
        metric(&metrics, "auto_registration_success_total"),
        Some(1.0)
    );
    assert_eq!(
        metric(&metrics, "auto_registration_unregister_total"),
        Some(1.0)
    );
    assert_eq!(
        metric(&metrics, "auto_registration_deletes_total"),
        Some(1.0)
    );
    drop(client);
    a.shutdown().await;
    b.shutdown().await;
}

/// Registers a VM through `grpc` (a plaintext port of a server that does not check
/// identities), reports it healthy and disconnects it, waiting for each write: the
/// entry is created, its status and annotations updated, then deleted. The RBAC test
/// uses it to exercise the WorkloadEntry rules of deploy/rbac.yaml.
pub(crate) async fn register_report_and_leave(api: &FakeApiServer, server: &FakeServer) {
    api.apply(&objects::namespace("vm", &[]));
    api.apply_custom(&workload_group());
    // A VM naming a group the server does not hold yet is refused (and its agent
    // reconnects); this one connects once, after the server has the group.
    let http = server.bound().http;
    eventually("the server to see the WorkloadGroup", || async move {
        let configz = get_json(http, "/debug/configz").await.to_string();
        configz.contains("\"kind\":\"WorkloadGroup\"").then_some(())
    })
    .await;
    let mut vm = AdsClient::connect(server.grpc_addr(), vm_node(VM_IP, "billing"))
        .await
        .unwrap();
    vm.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    eventually("the VM's WorkloadEntry", || async { entry(api) }).await;
    seen_by(server).await;
    report_health(&mut vm, None).await;
    eventually("the Healthy condition", || async {
        healthy_condition(&entry(api)?).filter(|(s, _)| s == "True")
    })
    .await;
    drop(vm);
    eventually("the entry removed", || async {
        entry(api).is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn outside_kubernetes_the_entry_lives_in_memory_and_shows_in_the_debug_pages() {
    let server = FakeServer::builder()
        .configure(|c| {
            // The plaintext port carries no identity: accept the node's word.
            c.workload_entries.validate_identity = false;
            c.workload_entries.grace_period = Duration::from_millis(200);
        })
        .start()
        .await
        .unwrap();
    let http = server.bound().http;
    let store = server.config_store();
    let decode = |v: Value| match meshfed_registry::config::decode(&v, "test") {
        meshfed_registry::config::Decoded::Object(o) => o,
        other => panic!("{other:?}"),
    };
    store.apply(decode(workload_group())).unwrap();
    store.apply(decode(service_entry())).unwrap();

    // A group that does not exist: the stream is refused with FailedPrecondition.
    let mut stray = AdsClient::connect(server.grpc_addr(), vm_node("10.9.0.8", "nope"))
        .await
        .unwrap();
    stray.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let status = stray.recv_error().await.unwrap();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(
        status
            .message()
            .contains("cannot find WorkloadGroup vm/nope")
    );

    let mut vm = AdsClient::connect(server.grpc_addr(), vm_node(VM_IP, "billing"))
        .await
        .unwrap();
    vm.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let mut client = watcher(server.grpc_addr()).await;
    report_health(&mut vm, None).await;
    until_endpoints(&mut client, &[VM_IP]).await;
    // The entry is an object of the in-memory store (configz), listed with its
    // connection and health in registryz; its endpoint is in the ServiceEntry
    // registry's shard of the service (endpointz).
    let configz = get_json(http, "/debug/configz").await.to_string();
    assert!(configz.contains(ENTRY), "{configz}");
    let endpointz = get_json(http, "/debug/endpointz").await.to_string();
    assert!(endpointz.contains(VM_IP), "{endpointz}");
    let registryz = get_json(http, "/debug/registryz").await;
    let listed = &registryz["workload_entries"][0];
    assert_eq!(listed["name"], ENTRY, "{registryz}");
    assert_eq!(listed["address"], VM_IP);
    assert_eq!(listed["group"], "billing");
    assert_eq!(listed["healthy"], "True");
    assert!(listed["connected_at"].is_string());

    drop(vm);
    until_endpoints(&mut client, &[]).await;
    eventually("the entry removed", || async {
        store
            .get(meshfed_registry::config::Kind::WorkloadEntry, "vm", ENTRY)
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_entry_left_by_a_stopped_replica_is_removed_by_the_next_one() {
    let api = EnforcedApi::start().await;
    for ns in ["default", "istio-system", "vm"] {
        api.apply(&objects::namespace(ns, &[]));
    }
    api.install_crds(CustomResource::istio(&[
        "v1", "v1beta1", "v1alpha3", "v1alpha1",
    ]));
    api.apply_custom(&workload_group());
    let in_an_hour = SystemTime::now() + Duration::from_secs(3600);
    let replica = |identity: &str| {
        let token = api.issue_token("istio-system", identity, &[], in_an_hour, None);
        let client = api.client_with_token(&token);
        let identity = identity.to_string();
        FakeServer::builder().configure(move |c| {
            crate::secure::kube_ca(c, client);
            c.lease = Some(meshfed::app::LeaseSettings {
                identity: Some(identity),
                ..Default::default()
            });
            c.workload_entries.grace_period = Duration::from_millis(200);
        })
    };
    let a = replica("a").start().await.unwrap();
    let http = a.bound().http;
    eventually("ready", || async move {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
    let root = crate::secure::published_root(&api, "default").await;
    let token = api.issue_token("vm", "billing", &["istio-ca"], in_an_hour, None);
    let tls = ClientTls {
        roots_pem: root,
        identity: None,
        server_name: "istiod.istio-system.svc".into(),
    };
    let channel = tls_channel(a.secure_grpc_addr(), &tls).await.unwrap();
    let mut vm = AdsClient::over(channel, bearer(&token), vm_node(VM_IP, "billing"))
        .await
        .unwrap();
    vm.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    eventually("the VM's WorkloadEntry", || async { entry(&api) }).await;
    seen_by(&a).await;

    // The replica stops: its stream to the VM ends and the entry is marked
    // disconnected, but its grace-period check goes with it. The VM does not come back.
    a.shutdown().await;
    drop(vm);
    let left = entry(&api).expect("left behind");
    assert!(
        left["metadata"]["annotations"]["istio.io/disconnectedAt"].is_string(),
        "{left}"
    );

    // The next replica's sweep (every ten grace periods) removes it.
    let b = replica("b").start().await.unwrap();
    eventually("the entry swept by the new replica", || async {
        entry(&api).is_none().then_some(())
    })
    .await;
    let by_b = entry_writes(&api, "b");
    assert_eq!(by_b.len(), 1, "{by_b:?}");
    assert!(by_b[0].starts_with("DELETE "), "{by_b:?}");
    b.shutdown().await;
}

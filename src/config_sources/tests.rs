use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::google::protobuf::Any;
use meshfed_api::networking::v1alpha3 as net;
use meshfed_registry::config::{ConfigStore, Kind};
use meshfed_registry::{EndpointIndex, UpdateSink};
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;

use super::fake::{FakeMcpServer, FakeStream, resource};
use super::store::{SourceStore, type_url};
use super::*;

const SE: &str = "networking.istio.io/v1alpha3/ServiceEntry";

fn sink() -> UpdateSink {
    UpdateSink::new(Arc::new(EndpointIndex::new())).0
}

/// Istio's `constructResource` (`pkg/adsc/adsc_test.go`): a ServiceEntry with one
/// host and one address (and one port, which meshfed's validator asks for).
fn service_entry(name: &str, host: &str, address: &str, version: &str) -> Any {
    let spec = net::ServiceEntry {
        hosts: vec![host.into()],
        addresses: vec![address.into()],
        ports: vec![net::ServicePort {
            number: 80,
            protocol: "HTTP".into(),
            name: "http".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    resource(&format!("default/{name}"), version, &spec)
}

fn apply(store: &SourceStore, kind: Kind, resources: &[Any]) -> store::Applied {
    let pairs: Vec<(&str, &[u8])> = resources
        .iter()
        .map(|a| (a.type_url.as_str(), a.value.as_slice()))
        .collect();
    store.apply(kind, &pairs, Kind::ALL.len())
}

/// `(name, host, address)` of the store's ServiceEntries.
fn entries(store: &SourceStore) -> Vec<[String; 3]> {
    store
        .list(Kind::ServiceEntry)
        .iter()
        .map(|o| {
            let se = o.spec.as_service_entry().unwrap();
            [o.name.clone(), se.hosts[0].clone(), se.addresses[0].clone()]
        })
        .collect()
}

fn triples(list: &[[&str; 3]]) -> Vec<[String; 3]> {
    list.iter().map(|t| t.map(String::from)).collect()
}

/// Istio's `TestADSC_handleMCP`: each response replaces the kind; an object whose
/// version is unchanged (and set) keeps its earlier spec; objects left out are deleted.
#[test]
fn responses_replace_the_kind_as_istios_client_does() {
    let store = SourceStore::new("xds://127.0.0.1:1", sink());
    let steps: [(Vec<Any>, Vec<[&str; 3]>); 4] = [
        (
            vec![
                service_entry("foo1", "foo1.bar.com", "192.1.1.1", "1"),
                service_entry("foo2", "foo2.bar.com", "192.1.1.2", "1"),
            ],
            vec![
                ["foo1", "foo1.bar.com", "192.1.1.1"],
                ["foo2", "foo2.bar.com", "192.1.1.2"],
            ],
        ),
        (
            vec![
                service_entry("foo1", "foo1.bar.com", "192.1.1.11", "2"),
                service_entry("foo2", "foo2.bar.com", "192.1.1.22", "1"),
                service_entry("foo3", "foo3.bar.com", "192.1.1.3", ""),
            ],
            vec![
                ["foo1", "foo1.bar.com", "192.1.1.11"],
                ["foo2", "foo2.bar.com", "192.1.1.2"],
                ["foo3", "foo3.bar.com", "192.1.1.3"],
            ],
        ),
        (
            vec![
                service_entry("foo2", "foo2.bar.com", "192.1.1.222", "4"),
                service_entry("foo4", "foo4.bar.com", "192.1.1.4", "1"),
            ],
            vec![
                ["foo2", "foo2.bar.com", "192.1.1.222"],
                ["foo4", "foo4.bar.com", "192.1.1.4"],
            ],
        ),
        (
            vec![
                service_entry("foo2", "foo2.bar.com", "192.2.2.22", "3"),
                service_entry("foo3", "foo3.bar.com", "192.1.1.33", ""),
            ],
            vec![
                ["foo2", "foo2.bar.com", "192.2.2.22"],
                ["foo3", "foo3.bar.com", "192.1.1.33"],
            ],
        ),
    ];
    for (i, (resources, want)) in steps.iter().enumerate() {
        apply(&store, Kind::ServiceEntry, resources);
        assert_eq!(entries(&store), triples(want), "step {i}");
    }
    let obj = &store.list(Kind::ServiceEntry)[0];
    assert_eq!(obj.source, "xds://127.0.0.1:1");
    assert_eq!(obj.namespace, "default");
}

#[test]
fn bad_objects_are_rejected_alone_naming_source_object_and_field() {
    let store = SourceStore::new("xds://mcp:15010", sink());
    apply(
        &store,
        Kind::ServiceEntry,
        &[service_entry("good", "good.example.com", "10.0.0.1", "1")],
    );
    let bad_host = service_entry("good", "", "10.0.0.1", "2");
    // The same object turning invalid keeps its earlier valid version.
    let wrong_body = resource("default/vs", "1", &net::VirtualService::default());
    let bad_name = service_entry("x", "x.example.com", "10.0.0.2", "1");
    let bad_name = {
        // Re-encode with a name that is not <namespace>/<name>.
        use prost::Message;
        let mut r =
            meshfed_api::mcp::v1alpha1::Resource::decode(bad_name.value.as_slice()).unwrap();
        r.metadata.as_mut().unwrap().name = "no-namespace".into();
        Any {
            type_url: bad_name.type_url,
            value: r.encode_to_vec(),
        }
    };
    let not_mcp = Any {
        type_url: "type.googleapis.com/istio.networking.v1alpha3.ServiceEntry".into(),
        value: vec![],
    };
    let applied = apply(
        &store,
        Kind::ServiceEntry,
        &[bad_host, wrong_body, bad_name, not_mcp],
    );
    assert_eq!(applied.rejected, 4);
    assert_eq!(
        entries(&store),
        triples(&[["good", "good.example.com", "10.0.0.1"]])
    );
    let rejected = store.rejected();
    assert_eq!(rejected.len(), 4);
    for r in &rejected {
        assert_eq!(r.source, "xds://mcp:15010");
        assert_eq!(r.kind, "ServiceEntry");
    }
    let text: Vec<String> = rejected.iter().map(ToString::to_string).collect();
    assert!(
        text.iter()
            .any(|t| t.contains("ServiceEntry default/good") && t.contains("hosts")),
        "{text:?}"
    );
    assert!(
        text.iter().any(|t| t.contains("default/vs")
            && t.contains("body: a ServiceEntry is a istio.networking.v1alpha3.ServiceEntry")),
        "{text:?}"
    );
    assert!(
        text.iter()
            .any(|t| t.contains("metadata.name: \"no-namespace\"")),
        "{text:?}"
    );
    assert!(
        text.iter()
            .any(|t| t
                .contains("a config source sends type.googleapis.com/istio.mcp.v1alpha1.Resource")),
        "{text:?}"
    );
    // The next response without the bad objects clears their rejections.
    apply(&store, Kind::ServiceEntry, &[]);
    assert!(store.rejected().is_empty());
    assert!(store.is_empty());
}

/// Istio's `ObjectInRevision`: objects of another `istio.io/rev` are not read.
#[test]
fn objects_of_another_revision_are_not_read() {
    use prost::Message;
    let labelled = |name: &str, rev: &str| {
        let any = service_entry(name, &format!("{name}.example.com"), "10.0.0.1", "1");
        let mut r = meshfed_api::mcp::v1alpha1::Resource::decode(any.value.as_slice()).unwrap();
        if !rev.is_empty() {
            let meta = r.metadata.as_mut().unwrap();
            meta.labels.insert("istio.io/rev".into(), rev.into());
        }
        Any {
            type_url: any.type_url,
            value: r.encode_to_vec(),
        }
    };
    let resources = [
        labelled("a", ""),
        labelled("b", "canary"),
        labelled("c", "stable"),
    ];
    let canary = SourceStore::new("xds://mcp:1", sink()).with_revision("canary");
    apply(&canary, Kind::ServiceEntry, &resources);
    let names: Vec<String> = canary
        .list(Kind::ServiceEntry)
        .iter()
        .map(|o| o.name.clone())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert!(canary.rejected().is_empty());
    let any = SourceStore::new("xds://mcp:1", sink());
    apply(&any, Kind::ServiceEntry, &resources);
    assert_eq!(any.len(), 3);
}

#[test]
fn type_urls_are_group_version_kind_of_the_proto_package() {
    assert_eq!(type_url(Kind::ServiceEntry), SE);
    assert_eq!(
        type_url(Kind::VirtualService),
        "networking.istio.io/v1alpha3/VirtualService"
    );
    assert_eq!(
        type_url(Kind::PeerAuthentication),
        "security.istio.io/v1beta1/PeerAuthentication"
    );
    assert_eq!(
        type_url(Kind::Telemetry),
        "telemetry.istio.io/v1alpha1/Telemetry"
    );
    for kind in Kind::ALL {
        assert_eq!(store::kind_of(&type_url(kind)), Some(kind));
    }
    assert_eq!(store::kind_of("core/v1alpha1/MeshConfig"), None);
}

#[test]
fn a_source_that_never_syncs_stops_holding_readiness() {
    let store = SourceStore::new("xds://mcp:15010", sink());
    assert!(!store.has_synced());
    assert!(store.give_up_initial_sync());
    assert!(store.has_synced());
    let status = store.source_status().unwrap();
    assert_eq!(status["syncTimedOut"], true);
    assert!(!store.give_up_initial_sync());
}

struct Running {
    server: FakeMcpServer,
    stores: Vec<SourceStore>,
    metrics: Arc<SourceMetrics>,
    registry: Registry,
    trigger: crate::drain::ShutdownTrigger,
    tasks: JoinSet<()>,
}

async fn running() -> Running {
    let server = FakeMcpServer::start(([127, 0, 0, 1], 0).into()).await;
    let mut registry = Registry::default();
    let metrics = Arc::new(SourceMetrics::new(&mut registry));
    let (trigger, shutdown) = crate::drain::channel();
    let mut tasks = JoinSet::new();
    let identity = ClientIdentity {
        namespace: "istio-system".into(),
        workload: "meshfed-0".into(),
        ip: "10.1.2.3".into(),
        revision: "canary".into(),
    };
    let stores = start(
        &[server.addr.to_string()],
        &identity,
        &sink(),
        &metrics,
        Duration::from_secs(3600),
        &shutdown,
        &mut tasks,
    );
    Running {
        server,
        stores,
        metrics,
        registry,
        trigger,
        tasks,
    }
}

/// The first requests of a stream: one per kind.
async fn initial(stream: &mut FakeStream) -> Vec<DiscoveryRequest> {
    let mut requests = Vec::new();
    for _ in Kind::ALL {
        requests.push(stream.request().await);
    }
    requests
}

/// Sends every kind (ServiceEntries as given, the rest empty) and reads each ACK.
async fn send_all(stream: &mut FakeStream, version: &str, entries: Vec<Any>) {
    let mut entries = Some(entries);
    for kind in Kind::ALL {
        let url = type_url(kind);
        let resources = if kind == Kind::ServiceEntry {
            entries.take().unwrap()
        } else {
            Vec::new()
        };
        let nonce = stream.send(&url, version, resources);
        let ack = stream.request().await;
        assert_eq!(ack.type_url, url);
        assert_eq!(ack.response_nonce, nonce);
        assert_eq!(ack.version_info, version);
        assert!(ack.error_detail.is_none(), "istiod's client never NACKs");
    }
}

fn metrics_text(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

#[tokio::test]
async fn the_client_asks_as_istiods_config_source_client_and_acks_every_response() {
    let mut r = running().await;
    let mut stream = r.server.stream().await;
    let requests = initial(&mut stream).await;
    let node = requests[0]
        .node
        .as_ref()
        .expect("the first request names the node");
    assert_eq!(
        node.id,
        "sidecar~10.1.2.3~meshfed-0.istio-system~istio-system.svc.cluster.local"
    );
    let meta = &node.metadata.as_ref().unwrap().fields;
    let text = |k: &str| match &meta[k].kind {
        Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(s)) => s.clone(),
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!(text("GENERATOR"), "api");
    assert_eq!(text("ISTIO_REVISION"), "canary");
    let urls: BTreeSet<String> = requests.iter().map(|r| r.type_url.clone()).collect();
    assert_eq!(urls.len(), Kind::ALL.len());
    assert!(urls.contains(SE), "{urls:?}");
    assert!(requests.iter().all(|r| r.resource_names.is_empty()));
    let store = &r.stores[0];
    assert!(!store.has_synced());
    // Istio's `stream-2-unnamed-resources` (TestADSC_Run): responses of types not
    // asked for are acknowledged and change nothing.
    for other in ["foo", "bar"] {
        let nonce = stream.send(other, "", Vec::new());
        let ack = stream.request().await;
        assert_eq!((ack.type_url.as_str(), ack.response_nonce), (other, nonce));
    }
    assert!(store.is_empty() && !store.has_synced());
    send_all(
        &mut stream,
        "v1",
        vec![service_entry("a", "a.example.com", "10.0.0.1", "1")],
    )
    .await;
    assert!(store.has_synced());
    assert_eq!(
        entries(store),
        triples(&[["a", "a.example.com", "10.0.0.1"]])
    );
    let metrics = metrics_text(&r.registry);
    let source = format!("source=\"xds://{}\"", r.server.addr);
    assert!(
        metrics.contains(&format!("meshfed_config_source_connected{{{source}}} 1")),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("meshfed_config_source_objects{{{source}}} 1")),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "meshfed_config_source_responses_total{{{source}}} {}",
            Kind::ALL.len()
        )),
        "{metrics}"
    );
    let _ = &r.metrics;
    r.trigger.trigger();
    while r.tasks.join_next().await.is_some() {}
}

#[tokio::test]
async fn the_last_known_good_stays_stale_until_the_source_is_back() {
    let mut r = running().await;
    let mut stream = r.server.stream().await;
    initial(&mut stream).await;
    send_all(
        &mut stream,
        "v1",
        vec![service_entry("a", "a.example.com", "10.0.0.1", "1")],
    )
    .await;
    let store = r.stores[0].clone();
    // The source goes away: the stream fails.
    stream.fail(tonic::Status::unavailable("going away"));
    drop(stream);
    // The client reconnects (after its backoff) to the same server.
    let mut stream = r.server.stream().await;
    let status = store.status();
    assert!(status.stale, "{status:?}");
    assert!(status.last_error.unwrap().contains("going away"));
    assert_eq!(
        entries(&store),
        triples(&[["a", "a.example.com", "10.0.0.1"]])
    );
    let metrics = metrics_text(&r.registry);
    assert!(
        metrics.contains("meshfed_config_source_errors_total{source=\""),
        "{metrics}"
    );
    initial(&mut stream).await;
    // Back: the new stream's sets replace the old ones, and once every kind has come
    // the objects are current again.
    send_all(
        &mut stream,
        "v2",
        vec![service_entry("b", "b.example.com", "10.0.0.2", "1")],
    )
    .await;
    let status = store.status();
    assert!(!status.stale && status.connected, "{status:?}");
    assert_eq!(status.connects, 2);
    assert_eq!(
        entries(&store),
        triples(&[["b", "b.example.com", "10.0.0.2"]])
    );
    r.trigger.trigger();
    while r.tasks.join_next().await.is_some() {}
}

//! The Istio config store (`networking.istio.io` CRDs) against the fake API server:
//! create/update/delete per kind, per-object rejection, relists, version discovery,
//! CRDs installed late, and the namespace filter.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use meshfed_kube::fake_api::objects::{config_map, istio, namespace};
use meshfed_kube::fake_api::{CustomResource, FakeApiServer};
use meshfed_kube::{EventType, KubeConfigStore, KubeConfigStoreConfig, NamespaceFilter};
use meshfed_registry::config::{ConfigStore, Kind};
use meshfed_registry::{ConfigKey, EndpointIndex, RegistryEvent, UpdateSink};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(15);
const GROUP: &str = "networking.istio.io";

/// A valid spec of `kind`; `variant` changes something in it.
fn spec(kind: Kind, variant: u32) -> Value {
    let host = format!("h{variant}.example.com");
    match kind {
        Kind::VirtualService => json!({
            "hosts": [host],
            "http": [{"route": [{"destination": {"host": host}}]}],
        }),
        Kind::DestinationRule => json!({
            "host": "reviews",
            "subsets": [{"name": format!("v{variant}"), "labels": {"version": format!("v{variant}")}}],
        }),
        Kind::Gateway => json!({
            "servers": [{"port": {"number": 80 + variant, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}],
        }),
        Kind::ServiceEntry => json!({
            "hosts": [host],
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "resolution": "DNS",
        }),
        Kind::WorkloadEntry => json!({"address": format!("10.0.0.{variant}")}),
        Kind::Sidecar => json!({"egress": [{"hosts": [format!("ns{variant}/*")]}]}),
        Kind::PeerAuthentication => {
            json!({"mtls": {"mode": if variant.is_multiple_of(2) { "STRICT" } else { "PERMISSIVE" }}})
        }
        Kind::RequestAuthentication => json!({"jwtRules": [{"issuer": host}]}),
        Kind::AuthorizationPolicy => json!({"rules": [{"to": [{"operation": {"hosts": [host]}}]}]}),
        Kind::WorkloadGroup => json!({"template": {"labels": {"version": format!("v{variant}")}}}),
        Kind::Telemetry => {
            json!({"tracing": [{"randomSamplingPercentage": f64::from(variant % 100)}]})
        }
        Kind::GatewayClass => json!({"controllerName": format!("example.com/c{variant}")}),
        Kind::KubernetesGateway => json!({
            "gatewayClassName": "istio",
            "listeners": [{"name": "http", "port": 80 + variant, "protocol": "HTTP"}],
        }),
        Kind::HTTPRoute | Kind::GRPCRoute => {
            json!({"parentRefs": [{"name": format!("gw{variant}")}]})
        }
        Kind::ReferenceGrant => json!({
            "from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": format!("ns{variant}")}],
            "to": [{"group": "", "kind": "Service"}],
        }),
        Kind::TCPRoute | Kind::TLSRoute => {
            json!({"rules": [{"backendRefs": [{"name": "svc", "port": 80 + variant}]}]})
        }
        Kind::BackendTLSPolicy => json!({
            "targetRefs": [{"group": "", "kind": "Service", "name": format!("svc{variant}")}],
            "validation": {"wellKnownCACertificates": "System", "hostname": host},
        }),
        Kind::EnvoyFilter => json!({"priority": variant, "configPatches": [{
            "applyTo": "CLUSTER",
            "patch": {"operation": "MERGE", "value": {"connect_timeout": format!("{variant}s")}},
        }]}),
        Kind::WasmPlugin => json!({
            "url": format!("oci://ghcr.io/example/plugin:{variant}"),
            "priority": variant,
        }),
    }
}

/// A VirtualService that fails validation at `spec.hosts[0]` (a bare wildcard bound to
/// the mesh gateway).
fn invalid_vs() -> Value {
    json!({"hosts": ["*"], "http": [{"route": [{"destination": {"host": "a.example.com"}}]}]})
}

struct Running {
    api: FakeApiServer,
    store: KubeConfigStore,
    events: mpsc::UnboundedReceiver<RegistryEvent>,
    changes: watch::Receiver<u64>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    /// Counter for marker objects.
    markers: u32,
}

impl Running {
    async fn start(api: FakeApiServer, config: KubeConfigStoreConfig) -> Running {
        let (sink, events) = UpdateSink::new(std::sync::Arc::new(EndpointIndex::new()));
        let (stop, stopped) = oneshot::channel::<()>();
        let (store, task) = KubeConfigStore::start(api.client(), config, sink, async move {
            let _ = stopped.await;
        })
        .expect("the store starts");
        let changes = store.changes().expect("the store notifies");
        let mut running = Running {
            api,
            store,
            events,
            changes,
            stop: Some(stop),
            task,
            markers: 0,
        };
        running
            .until("the initial sync", |s| s.has_synced().then_some(()))
            .await;
        running
    }

    async fn synced(api: FakeApiServer) -> Running {
        Running::start(api, KubeConfigStoreConfig::new("c1")).await
    }

    /// Waits, change by change, until `check` holds. No polling: the store moves its
    /// change counter after every change it applies.
    async fn until<T>(
        &mut self,
        what: &str,
        mut check: impl FnMut(&KubeConfigStore) -> Option<T>,
    ) -> T {
        loop {
            self.changes.borrow_and_update();
            if let Some(v) = check(&self.store) {
                return v;
            }
            tokio::time::timeout(WAIT, self.changes.changed())
                .await
                .unwrap_or_else(|_| panic!("timed out waiting for: {what}"))
                .expect("the store lives");
        }
    }

    /// Applies and deletes a fresh valid object of `kind` in `ns` and waits for both:
    /// a watch delivers events in order, so everything written to `kind` before has
    /// been seen (rejections move no change counter, so they need such a marker).
    async fn marker(&mut self, kind: Kind, ns: &str) {
        self.markers += 1;
        let name = format!("marker-{}", self.markers);
        self.api
            .apply_custom(&istio("v1", kind.as_str(), ns, &name, spec(kind, 1)));
        self.until(&name, |s| s.get(kind, ns, &name).map(|_| ()))
            .await;
        self.api.delete_custom(GROUP, kind.as_str(), ns, &name);
        self.until(&name, |s| s.get(kind, ns, &name).is_none().then_some(()))
            .await;
    }

    /// Waits until every kind's watch connection is open (they open right after their
    /// list, so possibly after the sync). Polls: nothing announces an open watch.
    async fn watching(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.api.active_watches() != n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {n} open watches"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Keys of the config pushes sent so far (`Kind/namespace/name`), sorted.
    fn pushed(&mut self) -> BTreeSet<String> {
        let mut keys = BTreeSet::new();
        while let Ok(event) = self.events.try_recv() {
            if let RegistryEvent::Push(push) = event {
                keys.extend(push.configs_updated.iter().map(ToString::to_string));
            }
        }
        keys
    }

    fn names(&self) -> Vec<String> {
        self.store
            .all()
            .iter()
            .map(|o| format!("{} {}/{}", o.kind, o.namespace, o.name))
            .collect()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().expect("stopped once").send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("the writer stops on shutdown")
            .expect("the writer did not panic");
    }
}

fn key(kind: Kind, ns: &str, name: &str) -> String {
    ConfigKey::new(kind.config_kind(), name, ns).to_string()
}

/// The kinds of the Istio groups (the CRDs `CustomResource::istio` installs).
fn istio_kinds() -> impl Iterator<Item = Kind> {
    Kind::ALL.into_iter().filter(|k| !k.is_gateway_api())
}

async fn with_istio_crds(versions: &[&str]) -> FakeApiServer {
    let api = FakeApiServer::start().await.expect("fake API server");
    api.install_crds(CustomResource::istio(versions));
    api
}

#[tokio::test]
async fn every_kind_is_created_updated_and_deleted_through_the_api() {
    let api = with_istio_crds(&["v1", "v1beta1", "v1alpha3", "v1alpha1"]).await;
    // One object exists before the store starts: it comes with the initial list.
    api.apply_custom(&istio(
        "v1",
        "VirtualService",
        "ns",
        "early",
        spec(Kind::VirtualService, 0),
    ));
    let mut s = Running::synced(api).await;
    assert_eq!(s.names(), ["VirtualService ns/early"]);
    assert_eq!(
        s.pushed(),
        BTreeSet::from([key(Kind::VirtualService, "ns", "early")]),
        "the initial list is announced at sync"
    );
    for kind in istio_kinds() {
        // EnvoyFilter exists in v1alpha3 only.
        assert_eq!(
            s.store.served_version(kind),
            Some(kind.versions()[0]),
            "{kind}"
        );
    }

    for kind in istio_kinds() {
        let name = kind.as_str().to_lowercase();
        // ServiceEntries and WorkloadEntries push through their registry; kinds that
        // feed nothing yet (WorkloadGroup) do not push.
        let entry = kind.info().feeds == meshfed_registry::config::Feeds::ConfigIndex;

        s.api.apply_custom(&istio(
            kind.versions()[0],
            kind.as_str(),
            "ns",
            &name,
            spec(kind, 1),
        ));
        let created = s.until("created", |st| st.get(kind, "ns", &name)).await;
        assert_eq!(
            created.source,
            format!("kubernetes:c1/ns/{name}"),
            "{kind}: the source names cluster, namespace and name"
        );
        assert_eq!(
            s.pushed(),
            if entry {
                BTreeSet::from([key(kind, "ns", &name)])
            } else {
                BTreeSet::new()
            },
            "{kind}: ServiceEntries and WorkloadEntries are left to their registry"
        );

        // An older version of the kind's group (telemetry.istio.io has no v1beta1).
        let older = if kind.versions().contains(&"v1beta1") {
            "v1beta1"
        } else if kind.versions().len() == 1 {
            kind.versions()[0]
        } else {
            "v1alpha1"
        };
        s.api
            .apply_custom(&istio(older, kind.as_str(), "ns", &name, spec(kind, 2)));
        let want = meshfed_registry::config::Spec::from_value(kind, &spec(kind, 2)).unwrap();
        s.until("updated", |st| {
            st.get(kind, "ns", &name)
                .filter(|o| o.spec == want)
                .map(|_| ())
        })
        .await;

        s.api
            .delete_custom(kind.group(), kind.as_str(), "ns", &name);
        s.until("deleted", |st| {
            st.get(kind, "ns", &name).is_none().then_some(())
        })
        .await;
        s.pushed();
        let stats = s.store.stats();
        assert_eq!(
            (
                stats.events(kind, EventType::Add),
                stats.events(kind, EventType::Update),
                stats.events(kind, EventType::Delete)
            ),
            if kind == Kind::VirtualService {
                (2, 1, 1)
            } else {
                (1, 1, 1)
            },
            "{kind}"
        );
    }
    assert_eq!(s.names(), ["VirtualService ns/early"]);
    assert!(s.store.rejected().is_empty());
    for kind in Kind::ALL {
        let want = u64::from(kind == Kind::VirtualService);
        assert_eq!(s.store.stats().objects(kind), want, "{kind}");
    }
    s.stop().await;
}

#[tokio::test]
async fn an_invalid_object_is_rejected_alone_and_an_invalid_update_keeps_the_last_valid_version() {
    let api = with_istio_crds(&["v1"]).await;
    api.apply_custom(&istio(
        "v1",
        "VirtualService",
        "ns",
        "good",
        spec(Kind::VirtualService, 1),
    ));
    api.apply_custom(&istio("v1", "VirtualService", "ns", "bad", invalid_vs()));
    let mut s = Running::synced(api).await;

    assert_eq!(
        s.names(),
        ["VirtualService ns/good"],
        "the valid one is kept"
    );
    let rejected = s.store.rejected();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    let r = &rejected[0];
    assert_eq!(
        (r.kind.as_str(), r.namespace.as_str(), r.name.as_str()),
        ("VirtualService", "ns", "bad")
    );
    assert_eq!(r.source, "kubernetes:c1/ns/bad");
    assert!(
        r.errors[0].starts_with("spec.hosts[0]: "),
        "the field is named: {rejected:?}"
    );
    assert!(
        r.to_string()
            .contains("VirtualService ns/bad: spec.hosts[0]"),
        "{r}"
    );
    assert_eq!(s.store.stats().rejected(), 1);
    assert_eq!(s.store.stats().rejections(), 1);

    // An invalid update of the good one: rejected, its last valid version stays.
    s.pushed();
    s.api
        .apply_custom(&istio("v1", "VirtualService", "ns", "good", invalid_vs()));
    s.marker(Kind::VirtualService, "ns").await;
    let good = s.store.get(Kind::VirtualService, "ns", "good").unwrap();
    assert_eq!(
        good.spec.as_virtual_service().unwrap().hosts,
        ["h1.example.com"],
        "the last valid version stays in force"
    );
    let names: Vec<String> = s.store.rejected().iter().map(|r| r.name.clone()).collect();
    assert_eq!(names, ["bad", "good"]);
    assert!(
        !s.pushed()
            .contains(&key(Kind::VirtualService, "ns", "good")),
        "a rejection pushes nothing"
    );

    // A wrongly typed field is rejected by decoding, also naming the field.
    s.api.apply_custom(&istio(
        "v1",
        "DestinationRule",
        "ns",
        "typo",
        json!({"host": "reviews", "trafficPolicy": {"loadBalancer": {"simple": "FASTEST"}}}),
    ));
    s.marker(Kind::DestinationRule, "ns").await;
    let typo = s
        .store
        .rejected()
        .into_iter()
        .find(|r| r.name == "typo")
        .expect("the DestinationRule is rejected");
    assert!(
        typo.errors[0].starts_with("spec.trafficPolicy.loadBalancer.simple"),
        "{typo:?}"
    );
    // An unknown field (a misspelt one) is rejected the same way, naming it.
    s.api.apply_custom(&istio(
        "v1",
        "DestinationRule",
        "ns",
        "misspelt",
        json!({"host": "reviews", "trafficPolcy": {}}),
    ));
    s.marker(Kind::DestinationRule, "ns").await;
    let misspelt = s
        .store
        .rejected()
        .into_iter()
        .find(|r| r.name == "misspelt")
        .expect("the DestinationRule with an unknown field is rejected");
    assert!(
        misspelt.errors[0].starts_with("spec.trafficPolcy: unknown field \"trafficPolcy\""),
        "{misspelt:?}"
    );

    // Fixing the good one applies it and clears its rejection; deleting the bad one
    // clears its rejection.
    s.api.apply_custom(&istio(
        "v1",
        "VirtualService",
        "ns",
        "good",
        spec(Kind::VirtualService, 3),
    ));
    s.until("fixed", |st| {
        st.get(Kind::VirtualService, "ns", "good")
            .filter(|o| o.spec.as_virtual_service().unwrap().hosts == ["h3.example.com"])
            .map(|_| ())
    })
    .await;
    s.api.delete_custom(GROUP, "VirtualService", "ns", "bad");
    s.api.delete_custom(GROUP, "DestinationRule", "ns", "typo");
    s.api
        .delete_custom(GROUP, "DestinationRule", "ns", "misspelt");
    s.marker(Kind::VirtualService, "ns").await;
    s.marker(Kind::DestinationRule, "ns").await;
    assert!(s.store.rejected().is_empty(), "{:?}", s.store.rejected());
    assert_eq!(s.store.stats().rejected(), 0);
    assert_eq!(s.names(), ["VirtualService ns/good"]);
    s.stop().await;
}

#[tokio::test]
async fn a_410_relists_without_losing_changes() {
    // v1alpha3 for EnvoyFilter, which has no v1.
    let api = with_istio_crds(&["v1", "v1alpha3", "v1alpha1"]).await;
    for name in ["keep", "change", "drop"] {
        api.apply_custom(&istio(
            "v1",
            "VirtualService",
            "ns",
            name,
            spec(Kind::VirtualService, 1),
        ));
    }
    api.apply_custom(&istio(
        "v1",
        "ServiceEntry",
        "ns",
        "se",
        spec(Kind::ServiceEntry, 1),
    ));
    let mut s = Running::synced(api).await;
    let lists_before = list_requests(&s.api, "virtualservices");
    s.pushed();

    // Bookmarks move the watchers' versions without changing anything.
    s.watching(istio_kinds().count()).await;
    assert_eq!(
        s.api.bookmark(),
        istio_kinds().count(),
        "one bookmark-enabled watch per kind"
    );

    // While every watch is down: an update, a delete, a create (and a rejected object);
    // then history is compacted, so resuming from the old version gets 410 Gone.
    s.api.drop_watches();
    s.api.apply_custom(&istio(
        "v1",
        "VirtualService",
        "ns",
        "change",
        spec(Kind::VirtualService, 2),
    ));
    s.api.delete_custom(GROUP, "VirtualService", "ns", "drop");
    s.api.apply_custom(&istio(
        "v1",
        "VirtualService",
        "ns",
        "new",
        spec(Kind::VirtualService, 1),
    ));
    s.api
        .apply_custom(&istio("v1", "VirtualService", "ns", "bad", invalid_vs()));
    s.api.delete_custom(GROUP, "ServiceEntry", "ns", "se");
    s.api.compact();

    let want = [
        "VirtualService ns/change",
        "VirtualService ns/keep",
        "VirtualService ns/new",
    ];
    s.until("the relist's view", |st| {
        let names: Vec<String> = st
            .all()
            .iter()
            .map(|o| format!("{} {}/{}", o.kind, o.namespace, o.name))
            .collect();
        (names == want).then_some(())
    })
    .await;
    let change = s.store.get(Kind::VirtualService, "ns", "change").unwrap();
    assert_eq!(
        change.spec.as_virtual_service().unwrap().hosts,
        ["h2.example.com"]
    );
    let rejected: Vec<String> = s.store.rejected().iter().map(|r| r.name.clone()).collect();
    assert_eq!(rejected, ["bad"], "the relist saw the invalid object too");

    let stats = s.store.stats();
    assert!(stats.relists(Kind::VirtualService) >= 1, "relisted");
    assert!(stats.relists(Kind::ServiceEntry) >= 1, "relisted");
    assert!(
        stats.watch_errors(Kind::VirtualService) >= 1,
        "the 410 was seen"
    );
    assert!(list_requests(&s.api, "virtualservices") > lists_before);
    let pushed = s.pushed();
    for name in ["change", "drop", "new"] {
        assert!(
            pushed.contains(&key(Kind::VirtualService, "ns", name)),
            "{name} pushed: {pushed:?}"
        );
    }
    assert!(
        !pushed.contains(&key(Kind::VirtualService, "ns", "keep")),
        "an unchanged object is not pushed again: {pushed:?}"
    );
    s.stop().await;
}

/// LIST requests for a plural of the group (any version).
fn list_requests(api: &FakeApiServer, plural: &str) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.path.starts_with("/apis/networking.istio.io/") && r.path.ends_with(plural))
        .filter(|r| !r.is_watch())
        .count()
}

#[tokio::test]
async fn discovery_picks_v1beta1_when_only_that_and_older_are_served() {
    let api = with_istio_crds(&["v1alpha3", "v1beta1"]).await;
    api.apply_custom(&istio(
        "v1alpha3",
        "DestinationRule",
        "ns",
        "old",
        spec(Kind::DestinationRule, 1),
    ));
    let mut s = Running::synced(api).await;
    for kind in istio_kinds() {
        // telemetry.istio.io serves neither version: its kind is not served.
        // EnvoyFilter is served in v1alpha3, its only version.
        let want = ["v1beta1", "v1alpha3"]
            .into_iter()
            .find(|v| kind.versions().contains(v));
        assert_eq!(s.store.served_version(kind), want, "{kind}");
    }
    assert_eq!(s.names(), ["DestinationRule ns/old"]);

    s.api.apply_custom(&istio(
        "v1beta1",
        "Gateway",
        "ns",
        "gw",
        spec(Kind::Gateway, 1),
    ));
    s.until("the gateway", |st| st.get(Kind::Gateway, "ns", "gw"))
        .await;

    let paths: BTreeSet<String> = s.api.requests().into_iter().map(|r| r.path).collect();
    assert!(paths.contains("/apis/networking.istio.io"), "{paths:?}");
    assert!(
        paths.contains("/apis/networking.istio.io/v1beta1/destinationrules"),
        "{paths:?}"
    );
    assert!(
        !paths
            .iter()
            .any(|p| p.starts_with("/apis/networking.istio.io/v1/")
                || (p.starts_with("/apis/networking.istio.io/v1alpha3/")
                    && !p.contains("envoyfilters"))),
        "only the preferred served version is read: {paths:?}"
    );
    s.stop().await;
}

/// The Gateway API kinds are watched once their CRDs are installed (rediscovery), in
/// the version each kind is served in, beside the Istio kinds; the Gateway API's
/// `Gateway` and Istio's do not meet.
#[tokio::test]
async fn gateway_api_kinds_are_watched_once_their_crds_are_installed() {
    const GATEWAY_API: &str = "gateway.networking.k8s.io";
    let api = with_istio_crds(&["v1"]).await;
    let config = KubeConfigStoreConfig {
        rediscover_every: Duration::from_millis(20),
        ..KubeConfigStoreConfig::new("c1")
    };
    let mut s = Running::start(api, config).await;
    assert!(
        s.store.has_synced(),
        "not blocked by the absent Gateway API CRDs"
    );
    assert_eq!(s.store.served_version(Kind::HTTPRoute), None);
    s.api.apply_custom(&istio(
        "v1",
        "Gateway",
        "ns",
        "istio-gw",
        spec(Kind::Gateway, 1),
    ));

    for (kind, plural, versions) in [
        ("Gateway", "gateways", &["v1", "v1beta1"][..]),
        ("HTTPRoute", "httproutes", &["v1", "v1beta1"][..]),
        ("TCPRoute", "tcproutes", &["v1alpha2"][..]),
    ] {
        s.api
            .install_crd(CustomResource::new(GATEWAY_API, kind, plural, versions));
    }
    for (kind, version, name) in [
        (Kind::KubernetesGateway, "v1", "gw"),
        (Kind::HTTPRoute, "v1", "web"),
        (Kind::TCPRoute, "v1alpha2", "db"),
    ] {
        s.api.apply_custom(&json!({
            "apiVersion": format!("{GATEWAY_API}/{version}"),
            "kind": kind.as_str(),
            "metadata": {"name": name, "namespace": "ns"},
            "spec": spec(kind, 1),
        }));
        s.until(name, |st| st.get(kind, "ns", name)).await;
        assert_eq!(s.store.served_version(kind), Some(version), "{kind:?}");
    }
    s.until("the Istio gateway", |st| {
        st.get(Kind::Gateway, "ns", "istio-gw")
    })
    .await;
    assert_eq!(
        s.store.get(Kind::Gateway, "ns", "gw").map(|o| o.kind),
        None,
        "the Gateway API's gw is not an Istio Gateway"
    );
    assert_eq!(
        s.store.served_version(Kind::GRPCRoute),
        None,
        "not installed"
    );
    s.stop().await;
}

/// Namespace labels (the Gateway API's `allowedRoutes.namespaces.from: Selector`) are
/// watched once a Gateway API kind is served, and a label change announces the
/// Gateway API objects of that namespace (their translation reads the labels).
#[tokio::test]
async fn namespace_labels_are_watched_once_the_gateway_api_is_served() {
    const GATEWAY_API: &str = "gateway.networking.k8s.io";
    let api = with_istio_crds(&["v1"]).await;
    api.apply(&namespace("team-a", &[("shared", "true")]));
    api.apply(&namespace("team-b", &[]));
    let config = KubeConfigStoreConfig {
        rediscover_every: Duration::from_millis(20),
        ..KubeConfigStoreConfig::new("c1")
    };
    let mut s = Running::start(api, config).await;
    assert_eq!(
        s.store.namespace_labels(),
        None,
        "not watched without the Gateway API"
    );
    s.api.install_crd(CustomResource::new(
        GATEWAY_API,
        "HTTPRoute",
        "httproutes",
        &["v1"],
    ));
    s.api.apply_custom(&json!({
        "apiVersion": format!("{GATEWAY_API}/v1"),
        "kind": "HTTPRoute",
        "metadata": {"name": "web", "namespace": "team-a"},
        "spec": spec(Kind::HTTPRoute, 1),
    }));
    s.until("the route", |st| st.get(Kind::HTTPRoute, "team-a", "web"))
        .await;
    let labels = s
        .until("the namespace labels", |st| st.namespace_labels())
        .await;
    assert_eq!(
        labels.get("team-a").map(|l| l.get("shared").cloned()),
        Some(Some("true".to_string()))
    );
    assert_eq!(labels.get("team-b"), Some(&Default::default()));
    s.pushed();

    s.api.apply(&namespace("team-a", &[]));
    s.until("team-a unlabelled", |st| {
        st.namespace_labels()
            .filter(|n| n.get("team-a").is_some_and(|l| l.is_empty()))
    })
    .await;
    assert_eq!(
        s.pushed(),
        BTreeSet::from([key(Kind::HTTPRoute, "team-a", "web")]),
        "the route is translated again"
    );
    s.stop().await;
}

/// The ConfigMaps a BackendTLSPolicy or a Gateway references are followed by name:
/// known before the store is synced, absent ones left out (the translation reports
/// them missing, as istiod), one created later picked up and its readers announced,
/// one no longer referenced forgotten.
#[tokio::test]
async fn referenced_config_maps_are_followed_by_name() {
    const GATEWAY_API: &str = "gateway.networking.k8s.io";
    let api = with_istio_crds(&["v1"]).await;
    api.install_crd(CustomResource::new(
        GATEWAY_API,
        "BackendTLSPolicy",
        "backendtlspolicies",
        &["v1"],
    ));
    api.apply(&config_map("apps", "web-ca", &[("ca.crt", "PEM")]));
    api.apply(&config_map("apps", "unrelated", &[("x", "y")]));
    let policy = |name: &str, ca: &str| {
        json!({
            "apiVersion": format!("{GATEWAY_API}/v1"),
            "kind": "BackendTLSPolicy",
            "metadata": {"name": name, "namespace": "apps"},
            "spec": {
                "targetRefs": [{"group": "", "kind": "Service", "name": "web"}],
                "validation": {"caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": ca}], "hostname": "web"},
            },
        })
    };
    api.apply_custom(&policy("web-tls", "web-ca"));
    api.apply_custom(&policy("pay-tls", "pay-ca"));
    let mut s = Running::synced(api).await;
    // Both references are listed before the store reports synced.
    let known = |st: &KubeConfigStore| {
        st.config_maps()
            .map(|m| m.keys().cloned().collect::<Vec<_>>())
    };
    assert_eq!(known(&s.store), Some(vec!["apps/web-ca".to_string()]));
    s.pushed();
    // Created later: picked up, and the policy reading it is translated again.
    s.api
        .apply(&config_map("apps", "pay-ca", &[("ca.crt", "PEM")]));
    s.until("pay-ca", |st| {
        known(st).filter(|k| k.contains(&"apps/pay-ca".to_string()))
    })
    .await;
    assert_eq!(
        s.pushed(),
        BTreeSet::from([
            key(Kind::BackendTLSPolicy, "apps", "pay-tls"),
            key(Kind::BackendTLSPolicy, "apps", "web-tls"),
        ])
    );
    // A ConfigMap nothing references is never read.
    assert!(!s.api.requests().iter().any(
        |r| r.path.contains("/configmaps") && r.query.values().any(|v| v.contains("unrelated"))
    ),);
    // No longer referenced: forgotten.
    s.api
        .delete_custom(GATEWAY_API, "BackendTLSPolicy", "apps", "pay-tls");
    s.until("pay-tls gone", |st| {
        st.get(Kind::BackendTLSPolicy, "apps", "pay-tls")
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(known(&s.store), Some(vec!["apps/web-ca".to_string()]));
    s.stop().await;
}

#[tokio::test]
async fn kinds_not_installed_count_as_synced_and_are_watched_once_installed() {
    // No Istio CRDs at all: the group is unknown to the API server.
    let api = FakeApiServer::start().await.unwrap();
    let config = KubeConfigStoreConfig {
        rediscover_every: Duration::from_millis(20),
        ..KubeConfigStoreConfig::new("c1")
    };
    let mut s = Running::start(api, config).await;
    assert!(s.store.has_synced(), "not blocked by missing CRDs");
    assert!(s.store.all().is_empty());
    assert_eq!(s.store.served_version(Kind::VirtualService), None);

    // Some CRDs installed later, one kind at a time.
    s.api
        .install_crd(CustomResource::new(GROUP, "Sidecar", "sidecars", &["v1"]));
    s.api.apply_custom(&istio(
        "v1",
        "Sidecar",
        "ns",
        "default",
        spec(Kind::Sidecar, 1),
    ));
    s.until("the sidecar", |st| st.get(Kind::Sidecar, "ns", "default"))
        .await;
    assert_eq!(s.store.served_version(Kind::Sidecar), Some("v1"));
    assert_eq!(s.store.served_version(Kind::Gateway), None);
    let stats = s.store.stats();
    assert_eq!(stats.objects(Kind::Sidecar), 1);
    assert_eq!(stats.relists(Kind::Sidecar), 0, "a first list is no relist");
    assert_eq!(
        s.pushed(),
        BTreeSet::from([key(Kind::Sidecar, "ns", "default")])
    );
    s.stop().await;
}

#[tokio::test]
async fn the_namespace_filter_applies_to_config_and_follows_namespace_labels() {
    let api = with_istio_crds(&["v1"]).await;
    api.apply(&namespace("mesh", &[("istio-discovery", "enabled")]));
    api.apply(&namespace("other", &[]));
    for ns in ["mesh", "other"] {
        api.apply_custom(&istio(
            "v1",
            "VirtualService",
            ns,
            "vs",
            spec(Kind::VirtualService, 1),
        ));
        api.apply_custom(&istio("v1", "VirtualService", ns, "bad", invalid_vs()));
    }
    let config = KubeConfigStoreConfig {
        namespaces: NamespaceFilter::Selectors(vec![LabelSelector {
            match_labels: Some([("istio-discovery".to_string(), "enabled".to_string())].into()),
            match_expressions: None,
        }]),
        ..KubeConfigStoreConfig::new("c1")
    };
    let mut s = Running::start(api, config).await;
    assert_eq!(s.names(), ["VirtualService mesh/vs"]);
    let rejected: Vec<String> = s
        .store
        .rejected()
        .iter()
        .map(|r| format!("{}/{}", r.namespace, r.name))
        .collect();
    assert_eq!(rejected, ["mesh/bad"], "rejections are filtered too");
    s.pushed();

    // Labelling the other namespace publishes its config (and its rejection).
    s.api
        .apply(&namespace("other", &[("istio-discovery", "enabled")]));
    s.until("other's config", |st| {
        st.get(Kind::VirtualService, "other", "vs")
    })
    .await;
    assert_eq!(s.store.rejected().len(), 2);
    assert_eq!(
        s.pushed(),
        BTreeSet::from([key(Kind::VirtualService, "other", "vs")])
    );

    // Unlabelling the first withdraws it.
    s.api.apply(&namespace("mesh", &[]));
    s.until("mesh withdrawn", |st| {
        st.get(Kind::VirtualService, "mesh", "vs")
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(s.names(), ["VirtualService other/vs"]);
    s.stop().await;
}

#[tokio::test]
async fn a_name_filter_hides_other_namespaces() {
    let api = with_istio_crds(&["v1"]).await;
    for ns in ["a", "b"] {
        api.apply_custom(&istio("v1", "Gateway", ns, "gw", spec(Kind::Gateway, 1)));
    }
    let config = KubeConfigStoreConfig {
        namespaces: NamespaceFilter::Names(BTreeSet::from(["b".to_string()])),
        ..KubeConfigStoreConfig::new("c1")
    };
    let s = Running::start(api, config).await;
    assert_eq!(s.names(), ["Gateway b/gw"]);
    assert!(
        !s.api
            .requests()
            .iter()
            .any(|r| r.path == "/api/v1/namespaces"),
        "namespace labels are only watched for label selectors"
    );
    s.stop().await;
}

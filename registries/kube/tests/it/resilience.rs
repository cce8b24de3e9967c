//! Watch failures: resumed watches, 410 Gone relists, shutdown.

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use meshfed_kube::fake_api::FakeApiServer;
use meshfed_kube::fake_api::objects::{pod, service, slice, slice_endpoint};
use meshfed_kube::{EventType, ResourceKind};
use meshfed_registry::ServiceRegistry;

use crate::support::{Harness, key};

async fn populated() -> FakeApiServer {
    let api = FakeApiServer::start().await.expect("fake API server");
    api.apply(&service("default", "web", "10.0.0.1", &[("http", 80)]));
    api.apply(&service("default", "old", "10.0.0.2", &[("http", 80)]));
    api.apply(&pod("default", "web-1", "web", "10.1.0.1", "n1"));
    api.apply(&slice(
        "default",
        "web-1",
        "web",
        &[("http", 80)],
        &[("10.1.0.1", "web-1")],
    ));
    api
}

/// Changes made while the watches are down: a new pod and slice endpoint for `web`,
/// and the deletion of `old`. Returns nothing; the caller checks the outcome.
fn change_while_disconnected(api: &FakeApiServer) {
    api.apply(&pod("default", "web-2", "web", "10.1.0.2", "n1"));
    let mut s: EndpointSlice = api.get(Some("default"), "web-1").unwrap();
    s.endpoints
        .push(slice_endpoint("default", "10.1.0.2", Some("web-2")));
    api.apply(&s);
    api.delete::<Service>(Some("default"), "old").unwrap();
}

async fn wait_for_changes(h: &Harness) {
    let web = key("default", "web");
    h.until("both web endpoints", |h| {
        (h.endpoints(&web).len() == 2).then_some(())
    })
    .await;
    h.until("old deleted", |h| {
        h.registry
            .service(&key("default", "old"))
            .is_none()
            .then_some(())
    })
    .await;
}

// The test runtime is single-threaded, so nothing else runs between dropping the
// watches and making the changes: the client must catch up after reconnecting.

#[tokio::test]
async fn a_dropped_watch_resumes_without_losing_or_duplicating_changes() {
    let h = Harness::synced(populated().await).await;
    let stats = h.registry.stats().clone();
    let lists_before = h.api.request_counts::<Pod>().0;
    let pod_adds = stats.events(ResourceKind::Pod, EventType::Add);
    let slice_updates = stats.events(ResourceKind::EndpointSlice, EventType::Update);
    let service_deletes = stats.events(ResourceKind::Service, EventType::Delete);
    let last_seen = h.api.resource_version();

    assert_eq!(h.api.drop_watches(), 5, "one watch per kind");
    change_while_disconnected(&h.api);
    wait_for_changes(&h).await;

    // Each change applied exactly once, through resumed watches, not a relist.
    assert_eq!(
        stats.events(ResourceKind::Pod, EventType::Add),
        pod_adds + 1
    );
    assert_eq!(
        stats.events(ResourceKind::EndpointSlice, EventType::Update),
        slice_updates + 1
    );
    assert_eq!(
        stats.events(ResourceKind::Service, EventType::Delete),
        service_deletes + 1
    );
    for kind in ResourceKind::ALL {
        assert_eq!(stats.relists(kind), 0, "{kind} relisted");
    }
    let (lists, _) = h.api.request_counts::<Pod>();
    assert_eq!(lists, lists_before, "no new LIST");
    let resumed = h
        .api
        .requests()
        .into_iter()
        .rfind(|r| r.is_watch() && r.path == "/api/v1/pods")
        .unwrap();
    let from: u64 = resumed.resource_version().unwrap().parse().unwrap();
    assert!(
        from > 1 && from <= last_seen,
        "resumed from the last version seen, not from scratch: {from}"
    );

    // A clean end (timeoutSeconds) resumes too, and later changes still arrive.
    h.api.end_watches();
    h.api
        .apply(&pod("default", "web-3", "web", "10.1.0.3", "n1"));
    h.until("the third pod", |h| {
        (h.registry.stats().events(ResourceKind::Pod, EventType::Add) == pod_adds + 2).then_some(())
    })
    .await;
    assert_eq!(h.registry.stats().relists(ResourceKind::Pod), 0);
    h.stop().await;
}

#[tokio::test]
async fn gone_relists_and_catches_up_including_deletions() {
    let h = Harness::synced(populated().await).await;
    let lists_before = h.api.request_counts::<Service>().0;

    h.api.drop_watches();
    change_while_disconnected(&h.api);
    h.api.compact(); // the versions the watchers hold are now too old
    wait_for_changes(&h).await;

    let stats = h.registry.stats();
    assert!(
        stats.relists(ResourceKind::Service) >= 1,
        "Services relisted"
    );
    assert!(stats.relists(ResourceKind::Pod) >= 1, "Pods relisted");
    assert!(h.api.request_counts::<Service>().0 > lists_before);
    assert!(
        stats.watch_errors(ResourceKind::Service) >= 1,
        "the 410 was seen"
    );
    assert!(h.registry.has_synced());
    h.until("fresh again", |h| (!h.registry.is_stale()).then_some(()))
        .await;
    assert_eq!(h.registry.services().len(), 1);
    h.stop().await;
}

#[tokio::test]
async fn bookmarks_keep_watches_resumable_across_compaction() {
    let h = Harness::synced(populated().await).await;
    // Something changes in another kind, the watchers get a bookmark at the current
    // version, history is compacted: a resume needs no relist.
    h.api
        .apply(&pod("default", "web-9", "web", "10.1.0.9", "n1"));
    h.until("the pod", |h| {
        (h.registry.stats().objects(ResourceKind::Pod) == 2).then_some(())
    })
    .await;
    assert_eq!(h.api.bookmark(), 5);
    // Let every watcher read its bookmark: the pod watch saw the pod already, so
    // wait for a change delivered after the bookmark on the same connection.
    h.api
        .apply(&pod("default", "web-10", "web", "10.1.0.10", "n1"));
    h.until("the second pod", |h| {
        (h.registry.stats().objects(ResourceKind::Pod) == 3).then_some(())
    })
    .await;
    h.api.compact();
    h.api.end_watches();
    h.api
        .apply(&pod("default", "web-11", "web", "10.1.0.11", "n1"));
    h.until("the third pod", |h| {
        (h.registry.stats().objects(ResourceKind::Pod) == 4).then_some(())
    })
    .await;
    assert_eq!(h.registry.stats().relists(ResourceKind::Pod), 0);
    h.stop().await;
}

#[tokio::test]
async fn an_unreachable_api_server_never_syncs_and_shutdown_still_stops() {
    let api = FakeApiServer::start().await.expect("fake API server");
    let client = api.client();
    drop(api); // connection refused from now on
    let index = std::sync::Arc::new(meshfed_registry::EndpointIndex::new());
    let (sink, _events) = meshfed_registry::UpdateSink::new(index);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (registry, task) = meshfed_kube::KubeRegistry::start(
        client,
        meshfed_kube::KubeRegistryConfig::new("c1"),
        sink,
        async move {
            let _ = stopped.await;
        },
    )
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while registry.stats().watch_errors(ResourceKind::Service) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no error seen");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(!registry.has_synced());
    assert!(registry.is_stale());
    stop.send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), task)
        .await
        .expect("stops")
        .expect("no panic");
}

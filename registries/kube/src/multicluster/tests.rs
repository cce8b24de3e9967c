use std::time::Duration;

use meshfed_registry::{EndpointIndex, RegistryEvent, ServiceKey};
use tokio::sync::mpsc::UnboundedReceiver;

use super::*;
use crate::fake_api::FakeApiServer;
use crate::fake_api::objects::{self, types};

const NS: &str = "istio-system";

fn remote_cluster(api: &FakeApiServer) {
    api.apply(&objects::service(
        "default",
        "reviews",
        "10.20.0.7",
        &[("http", 80)],
    ));
    api.apply(&objects::pod(
        "default",
        "reviews-c2",
        "reviews",
        "10.2.0.1",
        "n",
    ));
    api.apply(&objects::slice(
        "default",
        "reviews-c2",
        "reviews",
        &[("http", 9080)],
        &[("10.2.0.1", "reviews-c2")],
    ));
}

struct Harness {
    local: FakeApiServer,
    aggregate: Arc<Aggregate>,
    index: Arc<EndpointIndex>,
    events: UnboundedReceiver<RegistryEvent>,
    controller: Arc<SecretController>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

async fn start() -> Harness {
    start_with(KubeRegistryConfig::default()).await
}

async fn start_with(registry: KubeRegistryConfig) -> Harness {
    let local = FakeApiServer::start().await.unwrap();
    let aggregate = Arc::new(Aggregate::new("c1"));
    let index = Arc::new(EndpointIndex::new());
    let (sink, events) = UpdateSink::new(index.clone());
    let (stop, stopped) = oneshot::channel::<()>();
    let (controller, task) = SecretController::start(
        local.client(),
        MulticlusterConfig::new("c1", registry),
        aggregate.clone(),
        sink,
        async move {
            let _ = stopped.await;
        },
    );
    Harness {
        local,
        aggregate,
        index,
        events,
        controller,
        stop: Some(stop),
        task,
    }
}

impl Harness {
    async fn until(&self, what: &str, check: impl Fn(&Harness) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !check(self) {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn shard_endpoints(&self, cluster: &str) -> Vec<String> {
        let key = ServiceKey::new("reviews.default.svc.cluster.local", "default");
        let shard = ShardKey::new(ProviderId::Kubernetes, cluster);
        self.index
            .get(&key)
            .and_then(|s| s.shards.get(&shard).cloned())
            .map(|eps| eps.iter().map(|e| e.address.to_string()).collect())
            .unwrap_or_default()
    }

    fn registered(&self, cluster: &str) -> bool {
        let shard = ShardKey::new(ProviderId::Kubernetes, cluster);
        self.aggregate
            .registries()
            .iter()
            .any(|r| r.shard_key() == shard && r.has_synced())
    }

    fn forced_cluster_pushes(&mut self) -> usize {
        let mut n = 0;
        while let Ok(event) = self.events.try_recv() {
            if let RegistryEvent::Push(r) = event
                && r.forced
                && r.reasons.contains_key(&TriggerReason::Cluster)
            {
                n += 1;
            }
        }
        n
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap();
    }
}

#[tokio::test]
async fn secrets_add_replace_and_remove_remote_registries() {
    let mut h = start().await;
    let remote = FakeApiServer::start().await.unwrap();
    remote_cluster(&remote);
    h.local.apply(&objects::remote_secret(
        NS,
        "istio-remote-secret-c2",
        &[
            ("c2", &remote.kubeconfig()),
            ("c1", "ignored: the local cluster"),
        ],
    ));
    h.until("c2 registered and synced", |h| h.registered("c2"))
        .await;
    h.until("c2's endpoints in shard Kubernetes/c2", |h| {
        h.shard_endpoints("c2") == ["10.2.0.1"]
    })
    .await;
    assert!(
        !h.registered("c1"),
        "a key equal to the local cluster is ignored"
    );
    assert_eq!(h.controller.stats().clusters(), 1);
    assert_eq!(h.controller.stats().secret_events(EventType::Add), 1);
    assert!(h.forced_cluster_pushes() >= 1);
    let status = h.controller.clusters();
    assert_eq!(status.len(), 1);
    assert_eq!(status[0].secret, "istio-system/istio-remote-secret-c2");
    assert_eq!(status[0].state, "running");

    // Rotated credentials, same server: the new registry replaces the old one.
    h.local.apply(&objects::remote_secret(
        NS,
        "istio-remote-secret-c2",
        &[("c2", &remote.kubeconfig_with_token("rotated"))],
    ));
    h.until("the registry swapped", |h| {
        h.controller.stats().swaps() == 1
    })
    .await;
    assert_eq!(h.shard_endpoints("c2"), ["10.2.0.1"]);
    assert!(h.registered("c2"));
    assert_eq!(h.aggregate.registries().len(), 1);

    // The cluster moves to another server that lacks a service: after the swap the
    // shard no longer holds it (nobody else would delete it).
    let moved = FakeApiServer::start().await.unwrap();
    moved.apply(&objects::service(
        "default",
        "ratings",
        "10.20.0.9",
        &[("http", 80)],
    ));
    h.local.apply(&objects::remote_secret(
        NS,
        "istio-remote-secret-c2",
        &[("c2", &moved.kubeconfig())],
    ));
    h.until("the second swap", |h| h.controller.stats().swaps() == 2)
        .await;
    assert!(
        h.shard_endpoints("c2").is_empty(),
        "reviews pruned from Kubernetes/c2"
    );
    assert!(
        h.index
            .get(&ServiceKey::new(
                "reviews.default.svc.cluster.local",
                "default"
            ))
            .is_none()
    );
    let services: Vec<String> = h.aggregate.registries()[0]
        .services()
        .iter()
        .map(|s| s.hostname.to_string())
        .collect();
    assert_eq!(services, ["ratings.default.svc.cluster.local"]);

    h.forced_cluster_pushes();
    h.local
        .delete::<types::Secret>(Some(NS), "istio-remote-secret-c2");
    h.until("c2 removed", |h| h.aggregate.registries().is_empty())
        .await;
    h.until("a forced push for the removal", |h| {
        h.controller.stats().clusters() == 0
    })
    .await;
    let mut pushes = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while pushes == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no forced push");
        pushes += h.forced_cluster_pushes();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(h.controller.clusters().is_empty());
    h.stop().await;
}

/// The names of the Services `client` lists in `default`.
async fn services_through(client: kube::Client) -> Vec<String> {
    let api: Api<types::Service> = Api::namespaced(client, "default");
    let list = api.list(&Default::default()).await.expect("list services");
    list.items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect()
}

#[tokio::test]
async fn client_for_is_the_running_remote_registrys_client() {
    let h = start().await;
    let c2 = ClusterId::from("c2");
    assert!(h.controller.client_for(&c2).is_none(), "no Secret yet");
    let remote = FakeApiServer::start().await.unwrap();
    remote_cluster(&remote);
    h.local.apply(&objects::remote_secret(
        NS,
        "istio-remote-secret-c2",
        &[("c2", &remote.kubeconfig()), ("c3", "not a kubeconfig")],
    ));
    h.until("c2 registered", |h| h.registered("c2")).await;
    let client = h.controller.client_for(&c2).expect("c2 runs");
    assert_eq!(services_through(client).await, ["reviews"]);
    assert!(
        h.controller.client_for(&ClusterId::from("c3")).is_none(),
        "a refused kubeconfig has no client"
    );
    assert!(
        h.controller.client_for(&ClusterId::from("c1")).is_none(),
        "the local cluster is not a remote one"
    );

    // A new kubeconfig (another server): the client follows the swap.
    let moved = FakeApiServer::start().await.unwrap();
    moved.apply(&objects::service(
        "default",
        "ratings",
        "10.20.0.9",
        &[("http", 80)],
    ));
    h.local.apply(&objects::remote_secret(
        NS,
        "istio-remote-secret-c2",
        &[("c2", &moved.kubeconfig())],
    ));
    h.until("the swap", |h| h.controller.stats().swaps() == 1)
        .await;
    let client = h.controller.client_for(&c2).expect("c2 runs");
    assert_eq!(services_through(client).await, ["ratings"]);

    h.local
        .delete::<types::Secret>(Some(NS), "istio-remote-secret-c2");
    h.until("c2 removed", |h| h.controller.client_for(&c2).is_none())
        .await;
    h.stop().await;
}

#[tokio::test]
async fn a_secret_deleted_and_recreated_at_once_ends_with_the_cluster_registered() {
    let h = start().await;
    let remote = FakeApiServer::start().await.unwrap();
    remote_cluster(&remote);
    let secret = objects::remote_secret(NS, "s", &[("c2", &remote.kubeconfig())]);
    h.local.apply(&secret);
    h.until("c2 synced", |h| h.shard_endpoints("c2") == ["10.2.0.1"])
        .await;
    h.local.delete::<types::Secret>(Some(NS), "s");
    h.local.apply(&secret);
    h.until("c2 registered again", |h| {
        h.controller.stats().secret_events(EventType::Add) == 2 && h.registered("c2")
    })
    .await;
    // The removal finished before the new registry joined, so it removed nothing
    // of the new one's.
    h.until("c2's endpoints back", |h| {
        h.shard_endpoints("c2") == ["10.2.0.1"]
    })
    .await;
    assert_eq!(h.aggregate.registries().len(), 1);
    assert_eq!(h.controller.stats().clusters(), 1);
    h.stop().await;
}

fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

/// The controller's families as `/metrics` shows them.
fn families(remote: u64, events: [u64; 3], sync: &[(&str, u8)], rejected: u64) -> String {
    let mut text = format!(
        "# HELP istiod_managed_clusters Clusters managed by this control plane, by type\n\
         # TYPE istiod_managed_clusters gauge\n\
         istiod_managed_clusters{{cluster_type=\"local\"}} 1\n\
         istiod_managed_clusters{{cluster_type=\"remote\"}} {remote}\n\
         # HELP remote_cluster_secret_events_total Remote cluster secret events, by type\n\
         # TYPE remote_cluster_secret_events_total gauge\n\
         remote_cluster_secret_events_total{{event=\"add\"}} {}\n\
         remote_cluster_secret_events_total{{event=\"update\"}} {}\n\
         remote_cluster_secret_events_total{{event=\"delete\"}} {}\n\
         # HELP istiod_remote_cluster_sync_status 1 once a remote cluster's registry has synced\n\
         # TYPE istiod_remote_cluster_sync_status gauge\n",
        events[0], events[1], events[2]
    );
    for (cluster, synced) in sync {
        text += &format!("istiod_remote_cluster_sync_status{{cluster=\"{cluster}\"}} {synced}\n");
    }
    text += &format!(
        "# HELP meshfed_kubeconfig_rejected Remote cluster kubeconfigs refused (untrusted options, parse or client errors)\n\
         # TYPE meshfed_kubeconfig_rejected gauge\n\
         meshfed_kubeconfig_rejected{{reason=\"any\"}} {rejected}\n\
         # EOF\n"
    );
    text
}

#[tokio::test]
async fn metrics_report_the_managed_clusters_under_istios_names() {
    let h = start().await;
    let mut registry = Registry::default();
    h.controller.register_metrics(&mut registry);
    // Every family is listed before any Secret; the sync status has no rows yet.
    assert_eq!(encode(&registry), families(0, [0; 3], &[], 0));

    let remote = FakeApiServer::start().await.unwrap();
    remote_cluster(&remote);
    h.local.apply(&objects::remote_secret(
        NS,
        "istio-remote-secret-c3",
        &[("c3", "clusters: 7")],
    ));
    h.local.apply(&objects::remote_secret(
        NS,
        "istio-remote-secret-c2",
        &[("c2", &remote.kubeconfig())],
    ));
    h.until("c2 registered", |h| h.registered("c2")).await;
    // c3's kubeconfig does not parse: named by its Secret, never synced, counted.
    assert_eq!(
        encode(&registry),
        families(1, [2, 0, 0], &[("c2", 1), ("c3", 0)], 1)
    );
    h.stop().await;
}

#[tokio::test]
async fn an_exec_kubeconfig_is_refused_and_others_still_work() {
    let h = start().await;
    let remote = FakeApiServer::start().await.unwrap();
    remote_cluster(&remote);
    let exec = "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://x'}}]\n\
        users: [{name: u, user: {exec: {command: steal-credentials, apiVersion: client.authentication.k8s.io/v1}}}]\n\
        contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n";
    h.local.apply(&objects::remote_secret(
        NS,
        "istio-remote-secret-c3",
        &[("c3", exec)],
    ));
    h.local.apply(&objects::remote_secret(
        NS,
        "istio-remote-secret-c2",
        &[("c2", &remote.kubeconfig())],
    ));
    h.until("c2 registered", |h| h.registered("c2")).await;
    assert_eq!(h.controller.stats().kubeconfig_rejected(), 1);
    assert_eq!(h.aggregate.registries().len(), 1, "c3 never joined");
    let c3 = h
        .controller
        .clusters()
        .into_iter()
        .find(|c| c.cluster.as_str() == "c3")
        .unwrap();
    assert!(c3.state.contains("steal-credentials"), "{}", c3.state);
    h.stop().await;
}

#[tokio::test]
async fn a_remote_that_is_down_keeps_its_endpoints_and_blocks_nobody() {
    let h = start().await;
    let remote = FakeApiServer::start().await.unwrap();
    remote_cluster(&remote);
    h.local.apply(&objects::remote_secret(
        NS,
        "c2",
        &[("c2", &remote.kubeconfig())],
    ));
    h.until("c2 synced", |h| h.shard_endpoints("c2") == ["10.2.0.1"])
        .await;
    let url = remote.url();
    drop(remote);
    // A second remote is added while c2 is down.
    let other = FakeApiServer::start().await.unwrap();
    remote_cluster(&other);
    h.local.apply(&objects::remote_secret(
        NS,
        "c3",
        &[("c3", &other.kubeconfig())],
    ));
    h.until("c3 synced", |h| h.shard_endpoints("c3") == ["10.2.0.1"])
        .await;
    assert_eq!(
        h.shard_endpoints("c2"),
        ["10.2.0.1"],
        "{url} is down; c2 keeps its endpoints"
    );
    assert!(h.registered("c2"));
    h.stop().await;
}

#[tokio::test]
async fn remote_clusters_services_select_no_config_cluster_workload_entries() {
    // The config cluster's WorkloadEntries, one of them selected by `app: reviews`.
    let feed = WorkloadEntryFeed::new();
    let value = serde_json::json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "WorkloadEntry",
        "metadata": {"name": "reviews-vm", "namespace": "default"},
        "spec": {"address": "10.9.0.9", "labels": {"app": "reviews"}},
    });
    let meshfed_registry::config::Decoded::Object(entry) =
        meshfed_registry::config::decode(&value, "test")
    else {
        panic!("not a WorkloadEntry");
    };
    assert!(feed.publish(&[Arc::new(entry)]));
    let h = start_with(KubeRegistryConfig {
        workload_entries: feed,
        ..KubeRegistryConfig::default()
    })
    .await;
    let remote = FakeApiServer::start().await.unwrap();
    remote_cluster(&remote);
    h.local.apply(&objects::remote_secret(
        NS,
        "istio-remote-secret-c2",
        &[("c2", &remote.kubeconfig())],
    ));
    h.until("c2's endpoints", |h| !h.shard_endpoints("c2").is_empty())
        .await;
    assert_eq!(h.shard_endpoints("c2"), ["10.2.0.1"]);
    h.stop().await;
}

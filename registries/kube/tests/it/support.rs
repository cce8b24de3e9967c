//! A registry started against the fake API server, with the update sink's receiver and
//! endpoint index at hand.

use std::sync::Arc;
use std::time::Duration;

use meshfed_kube::fake_api::FakeApiServer;
use meshfed_kube::{KubeRegistry, KubeRegistryConfig};
use meshfed_registry::{
    Endpoint, EndpointIndex, PushRequest, RegistryEvent, ServiceKey, ServiceRegistry, ShardKey,
    UpdateSink,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(15);

/// `name.ns.svc.cluster.local` in `ns`.
pub fn key(ns: &str, name: &str) -> ServiceKey {
    ServiceKey::new(format!("{name}.{ns}.svc.cluster.local"), ns)
}

pub struct Harness {
    pub api: FakeApiServer,
    pub registry: Arc<KubeRegistry>,
    pub index: Arc<EndpointIndex>,
    events: mpsc::UnboundedReceiver<RegistryEvent>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Harness {
    /// Starts a registry with `config` against `api`.
    pub async fn start(api: FakeApiServer, config: KubeRegistryConfig) -> Harness {
        let index = Arc::new(EndpointIndex::new());
        let (sink, events) = UpdateSink::new(index.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let (registry, task) = KubeRegistry::start(api.client(), config, sink, async move {
            let _ = stopped.await;
        })
        .await
        .expect("the registry starts");
        Harness {
            api,
            registry,
            index,
            events,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Starts with the default config for cluster `c1` and waits for the initial sync.
    pub async fn synced(api: FakeApiServer) -> Harness {
        let mut h = Harness::start(api, KubeRegistryConfig::new("c1")).await;
        h.wait_synced().await;
        h.watching().await;
        h
    }

    /// Waits until every watcher has its watch connection open (they open it right
    /// after their list, so possibly after the sync).
    pub async fn watching(&self) {
        self.until("five open watches", |h| {
            (h.api.active_watches() == 5).then_some(())
        })
        .await;
    }

    /// Waits for the `Synced` event; returns the pushes sent before it.
    pub async fn wait_synced(&mut self) -> Vec<PushRequest> {
        let mut pushes = Vec::new();
        loop {
            match self.next_event().await {
                RegistryEvent::Synced(shard) => {
                    assert_eq!(shard, self.registry.shard_key());
                    return pushes;
                }
                RegistryEvent::Push(p) => pushes.push(p),
            }
        }
    }

    async fn next_event(&mut self) -> RegistryEvent {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("timed out waiting for a registry event")
            .expect("the sink's channel is open")
    }

    /// The next push request.
    pub async fn next_push(&mut self) -> PushRequest {
        loop {
            if let RegistryEvent::Push(p) = self.next_event().await {
                return p;
            }
        }
    }

    /// Drops every event already sent. Sound once the state they announce has been
    /// observed: the writer sends an event in the same step that makes its change
    /// visible, and the test runtime is single-threaded.
    pub fn drain(&mut self) {
        while self.events.try_recv().is_ok() {}
    }

    /// This registry's endpoints for `key`, from the endpoint index.
    pub fn endpoints(&self, key: &ServiceKey) -> Vec<Endpoint> {
        let shard: ShardKey = self.registry.shard_key();
        self.index
            .get(key)
            .and_then(|s| s.shards.get(&shard).map(|e| e.to_vec()))
            .unwrap_or_default()
    }

    /// Polls `check` until it gives `Some` (for states with no single event to await).
    pub async fn until<T>(&self, what: &str, mut check: impl FnMut(&Harness) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(v) = check(self) {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for: {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops the writer task and waits for it to end.
    pub async fn stop(mut self) {
        let _ = self.stop.take().expect("stopped once").send(());
        tokio::time::timeout(WAIT, self.task.take().expect("task"))
            .await
            .expect("the writer stops on shutdown")
            .expect("the writer did not panic");
    }
}

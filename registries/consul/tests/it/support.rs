//! A registry started against the fake Consul, with the update sink's receiver and the
//! endpoint index at hand.

use std::sync::Arc;
use std::time::Duration;

use meshfed_consul::fake::FakeConsul;
use meshfed_consul::{ConsulConfig, ConsulRegistry};
use meshfed_registry::{
    Endpoint, EndpointIndex, PushRequest, RegistryEvent, ServiceKey, ServiceRegistry, UpdateSink,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(15);

/// `name.service.consul` in `default`.
pub fn key(name: &str) -> ServiceKey {
    ServiceKey::new(format!("{name}.service.consul"), "default")
}

/// Test timings: short retries, a blocking wait long enough that an idle loop is
/// visibly held by the server.
pub fn config(consul: &FakeConsul) -> ConsulConfig {
    ConsulConfig {
        wait: Duration::from_secs(60),
        min_query_interval: Duration::from_millis(5),
        retry_interval: Duration::from_millis(20),
        max_retry_interval: Duration::from_millis(200),
        ..ConsulConfig::new(consul.url())
    }
}

pub struct Harness {
    pub consul: FakeConsul,
    pub registry: Arc<ConsulRegistry>,
    pub index: Arc<EndpointIndex>,
    events: mpsc::UnboundedReceiver<RegistryEvent>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Harness {
    /// Starts a registry with `config` against `consul`.
    pub async fn start(consul: FakeConsul, config: ConsulConfig) -> Harness {
        let index = Arc::new(EndpointIndex::new());
        let (sink, events) = UpdateSink::new(index.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let (registry, task) = ConsulRegistry::start(config, sink, async move {
            let _ = stopped.await;
        })
        .await
        .expect("the registry starts");
        Harness {
            consul,
            registry,
            index,
            events,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Starts with the test config and waits for the initial sync; returns the pushes
    /// sent with it.
    pub async fn synced(consul: FakeConsul) -> (Harness, Vec<PushRequest>) {
        let config = config(&consul);
        let mut h = Harness::start(consul, config).await;
        let pushes = h.wait_synced().await;
        (h, pushes)
    }

    /// Waits for the `Synced` event; returns the pushes sent before it.
    pub async fn wait_synced(&mut self) -> Vec<PushRequest> {
        let mut pushes = Vec::new();
        loop {
            match self.next_event().await {
                RegistryEvent::Synced(shard) => {
                    assert_eq!(shard, self.registry.shard_key());
                    assert!(self.registry.has_synced());
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

    /// Events already sent and not read.
    pub fn pending(&mut self) -> Vec<RegistryEvent> {
        std::iter::from_fn(|| self.events.try_recv().ok()).collect()
    }

    /// Waits until the server holds `n` blocking queries: every loop is idle, waiting
    /// for a change (the catalog's plus one per service).
    pub async fn idle(&self, n: usize) {
        self.until(&format!("{n} held queries"), |h| {
            (h.consul.held_queries() == n).then_some(())
        })
        .await;
    }

    /// This registry's endpoints for `key`, from the endpoint index.
    pub fn endpoints(&self, key: &ServiceKey) -> Vec<Endpoint> {
        let shard = self.registry.shard_key();
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
            tokio::time::sleep(Duration::from_millis(5)).await;
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

//! A registry started against the fake Eureka, with the update sink's receiver, the
//! endpoint index and the log lines it wrote at hand.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshfed_eureka::fake::FakeEureka;
use meshfed_eureka::{EurekaConfig, EurekaRegistry};
use meshfed_registry::{
    Endpoint, EndpointIndex, PushRequest, RegistryEvent, ServiceKey, ServiceRegistry, UpdateSink,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(20);

/// `<app>.eureka` in `default`.
pub fn key(app: &str) -> ServiceKey {
    ServiceKey::new(format!("{app}.eureka"), "default")
}

/// Test timings: rounds come when the test asks (`Harness::round`), retries after
/// 10ms doubling.
pub fn config(url: &str) -> EurekaConfig {
    EurekaConfig {
        fetch_interval: Duration::from_secs(3600),
        retry_interval: Duration::from_millis(10),
        ..EurekaConfig::new(url).expect("a valid URL")
    }
}

/// Log lines written while a test runs (every level).
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures this thread's log lines (the tests run on one thread, the writer task
/// included) until the guard drops.
pub fn capture_logs() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

pub struct Harness {
    pub eureka: FakeEureka,
    pub registry: Arc<EurekaRegistry>,
    pub index: Arc<EndpointIndex>,
    events: mpsc::UnboundedReceiver<RegistryEvent>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Harness {
    /// Starts a registry with `config` against `eureka`.
    pub fn start(eureka: FakeEureka, config: EurekaConfig) -> Harness {
        let index = Arc::new(EndpointIndex::new());
        let (sink, events) = UpdateSink::new(index.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let (registry, task) = EurekaRegistry::start(config, sink, async move {
            let _ = stopped.await;
        })
        .expect("the registry starts");
        Harness {
            eureka,
            registry,
            index,
            events,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Starts with the test config and waits for the initial sync; returns the pushes
    /// sent with it.
    pub async fn synced(eureka: FakeEureka) -> (Harness, Vec<PushRequest>) {
        let config = config(&eureka.url());
        let mut h = Harness::start(eureka, config);
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
                    // The sync is sent from inside the first round: wait for its end,
                    // so that `round` counts from there.
                    self.until("the end of the first successful round", |h| {
                        (h.registry.stats().rounds() > h.registry.stats().errors()).then_some(())
                    })
                    .await;
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

    /// Asks for a fetch round and waits until it has ended.
    pub async fn round(&self) {
        let before = self.registry.stats().rounds();
        self.registry.fetch_now();
        self.until("a fetch round", |h| {
            (h.registry.stats().rounds() > before).then_some(())
        })
        .await;
    }

    /// Events already sent and not read.
    pub fn pending(&mut self) -> Vec<RegistryEvent> {
        std::iter::from_fn(|| self.events.try_recv().ok()).collect()
    }

    /// The push requests already sent and not read.
    pub fn pushes(&mut self) -> Vec<PushRequest> {
        self.pending()
            .into_iter()
            .filter_map(|e| match e {
                RegistryEvent::Push(p) => Some(p),
                RegistryEvent::Synced(_) => None,
            })
            .collect()
    }

    /// This registry's endpoints for `key`, from the endpoint index.
    pub fn endpoints(&self, key: &ServiceKey) -> Vec<Endpoint> {
        let shard = self.registry.shard_key();
        self.index
            .get(key)
            .and_then(|s| s.shards.get(&shard).map(|e| e.to_vec()))
            .unwrap_or_default()
    }

    /// The addresses of `key`'s endpoints, sorted.
    pub fn addresses(&self, key: &ServiceKey) -> Vec<String> {
        let mut out: Vec<String> = self
            .endpoints(key)
            .iter()
            .map(|e| e.address.to_string())
            .collect();
        out.sort();
        out
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

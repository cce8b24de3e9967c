//! Shared helpers: a registry on a fake Nacos, waiting for conditions, captured logs.

use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshfed_nacos::fake::FakeNacos;
use meshfed_nacos::{NacosConfig, NacosRegistry};
use meshfed_registry::{EndpointIndex, RegistryEvent, ServiceKey, UpdateSink};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Settings for `nacos` with short timings.
pub fn config(nacos: &FakeNacos) -> NacosConfig {
    NacosConfig {
        refresh_interval: Duration::from_millis(200),
        retry_interval: Duration::from_millis(20),
        max_retry_interval: Duration::from_millis(200),
        request_timeout: Duration::from_secs(5),
        keepalive_interval: Duration::from_millis(500),
        ..NacosConfig::new([nacos.server_addr()]).unwrap()
    }
}

/// A started registry with its event stream.
pub struct Running {
    pub registry: Arc<NacosRegistry>,
    pub events: mpsc::UnboundedReceiver<RegistryEvent>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Running {
    pub fn start(config: NacosConfig) -> Running {
        let (sink, events) = UpdateSink::new(Arc::new(EndpointIndex::new()));
        let (stop, stopped) = oneshot::channel::<()>();
        let (registry, task) = NacosRegistry::start(config, sink, async move {
            let _ = stopped.await;
        })
        .unwrap();
        Running {
            registry,
            events,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Waits for the registry's `Synced` event.
    pub async fn synced(&mut self) {
        loop {
            let event = tokio::time::timeout(Duration::from_secs(30), self.events.recv())
                .await
                .expect("timed out waiting for the sync")
                .expect("the sink is open");
            if matches!(event, RegistryEvent::Synced(_)) {
                return;
            }
        }
    }

    /// Addresses of the endpoints of `name` (public, DEFAULT_GROUP), sorted.
    pub fn addresses(&self, name: &str) -> Vec<String> {
        let mut out: Vec<String> = self
            .registry
            .endpoints(&self.key(name))
            .iter()
            .map(|e| e.address.to_string())
            .collect();
        out.sort();
        out
    }

    pub fn key(&self, name: &str) -> ServiceKey {
        self.registry.key_of("public", "DEFAULT_GROUP", name)
    }

    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap();
    }
}

/// Waits (bounded) until `check` gives a value.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Log lines written while the guard lives (current-thread runtimes only: the
/// subscriber is this thread's default).
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    pub fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

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

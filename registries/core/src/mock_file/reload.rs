//! Following the mock registry file: [`run_mock_file`] over the watched-file driver
//! ([`crate::follow`]), and the counters it keeps.

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use super::format::parse_mock_registry_bytes;
use crate::follow::{FileOptions, FollowOptions, Read, Reload, Settle, WatchedFile};
use crate::memory::MemoryRegistry;
use crate::metrics::encode_gauges;
use crate::read::DEFAULT_MAX_FILE_SIZE;
use crate::registry::ServiceRegistry;
use crate::watch::{PathWatcher, WatchError};

/// How long an empty (or comment-only) mock registry file must stay so before it
/// withdraws the services the registry holds: a writer that truncates the file and
/// writes it later (`{ sleep 1; cat good.yaml; } > mock.yaml`) is not a withdrawal.
pub const DEFAULT_EMPTY_SETTLE: Duration = crate::read::EMPTY_SETTLE;

/// How [`run_mock_file`] reads the file.
#[derive(Clone, Copy, Debug)]
pub struct MockFileOptions {
    /// The size limit of the file in bytes (`--maxConfigFileSize`).
    pub max_file_size: u64,
    /// How long an emptied file must stay empty before it withdraws the services.
    pub empty_settle: Duration,
}

impl Default for MockFileOptions {
    fn default() -> Self {
        MockFileOptions {
            max_file_size: DEFAULT_MAX_FILE_SIZE,
            empty_settle: DEFAULT_EMPTY_SETTLE,
        }
    }
}

/// Load counters of a [`run_mock_file`] task, for metrics and debug pages. Cheap to
/// clone; clones share the counters.
#[derive(Clone, Debug, Default)]
pub struct MockFileStatus {
    /// Loads that applied the file's content, the first one included.
    pub reloads_ok: Arc<AtomicU64>,
    /// Loads that failed (the file was invalid, unreadable, missing or deleted); the
    /// last good content stayed in force.
    pub reloads_failed: Arc<AtomicU64>,
    /// Reads retried after a failure (an I/O error, not a regular file, over the size
    /// limit, or a writer still at work).
    pub read_retries: Arc<AtomicU64>,
    /// Times an emptied file, having stayed empty for the settle period, withdrew the
    /// services the registry held.
    pub empty_withdrawals: Arc<AtomicU64>,
    /// The message of the last failed load (with file:line), cleared by the next
    /// successful one.
    pub last_error: Arc<Mutex<Option<String>>>,
}

impl MockFileStatus {
    /// Fresh counters.
    pub fn new() -> MockFileStatus {
        MockFileStatus::default()
    }

    /// The message of the last failed load, if the last load failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn succeeded(&self) {
        self.reloads_ok.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn failed(&self, message: String) {
        self.reloads_failed.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(message);
    }

    /// Registers `meshfed_mock_file_reloads{result="ok"|"failed"}`,
    /// `meshfed_mock_file_read_retries{reason="read_error"}` and
    /// `meshfed_mock_file_empty_withdrawals{result="withdrawn"}` into `registry`, read
    /// from these counters on every scrape.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(MockFileMetrics(self.clone())));
    }
}

#[derive(Debug)]
struct MockFileMetrics(MockFileStatus);

impl Collector for MockFileMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let status = &self.0;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed) as i64;
        encode_gauges(
            &mut encoder,
            "meshfed_mock_file_reloads",
            "Mock registry file loads by result (failed loads keep the last good content)",
            "result",
            [
                ("ok", load(&status.reloads_ok)),
                ("failed", load(&status.reloads_failed)),
            ],
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_mock_file_read_retries",
            "Mock registry file reads retried after a failure or a read that raced a writer",
            "reason",
            [("read_error", load(&status.read_retries))],
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_mock_file_empty_withdrawals",
            "Times an emptied mock registry file withdrew its services after the settle period",
            "result",
            [("withdrawn", load(&status.empty_withdrawals))],
        )
    }
}

/// Feeds `registry` from the mock registry file at `path` until `shutdown` completes.
///
/// - The watch starts first, then the file is loaded and the registry is marked synced
///   **whatever the outcome**: a missing or invalid file at startup is logged (with
///   file:line) and the registry serves nothing until the file is fixed. For a laptop
///   demo that beats a control plane that never becomes ready.
/// - Every change to the file (in place, atomic replace, ConfigMap symlink swap,
///   creation) re-reads it, under the rules of [`crate::read`]: a regular file of at
///   most `options.max_file_size` bytes, whose content did not change during the read.
///   Identical bytes do nothing. Valid content replaces the registry's (only
///   differences are pushed) and logs `mock registry reloaded: N services, M
///   endpoints`. Invalid content is logged as an error and the last good content
///   stays. A deleted file logs a warning and the last good content stays.
/// - A read that fails for any other reason than a missing file (too many open files,
///   not a regular file, over the size limit, a writer at work) is retried with
///   backoff (100 ms doubling to 30 s) until it succeeds; the last good content stays
///   meanwhile.
/// - Content with no services, while the registry holds some, applies only once the
///   file has stayed so for `options.empty_settle`, with a warning naming how many
///   services go; content with services arriving before then applies as usual.
/// - Loads, retries and withdrawals are counted in `status`.
/// - Shutdown ends the task at once, even in the middle of a read.
///
/// Returns an error, without touching the registry, if the watch cannot start (e.g. the
/// file's directory does not exist), and if the watcher stops later.
pub async fn run_mock_file(
    path: PathBuf,
    registry: MemoryRegistry,
    status: MockFileStatus,
    options: MockFileOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WatchError> {
    // Watch before the first read, so that a change in between is not lost.
    let watcher = PathWatcher::watch(&path, false)?;
    follow(
        watcher,
        Reloader::new(path, registry, status, options),
        shutdown,
    )
    .await
}

/// The loop of [`run_mock_file`] over a started watch.
async fn follow(
    watcher: PathWatcher,
    mut reloader: Reloader,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WatchError> {
    let options = FollowOptions {
        read_at_start: true,
    };
    let result = crate::follow::follow(&mut [watcher], &mut reloader, options, shutdown).await;
    if let Err(err) = &result {
        tracing::error!("{err}; the mock registry keeps its current content");
    }
    result
}

/// The reload step of [`run_mock_file`], apart from the watching.
struct Reloader {
    file: WatchedFile,
    registry: MemoryRegistry,
    status: MockFileStatus,
}

impl Reload for Reloader {
    async fn reload(&mut self) -> Option<Duration> {
        Reloader::reload(self).await
    }

    fn started(&mut self) {
        self.registry.mark_synced();
    }
}

impl Reloader {
    fn new(
        path: PathBuf,
        registry: MemoryRegistry,
        status: MockFileStatus,
        options: MockFileOptions,
    ) -> Reloader {
        let options = FileOptions {
            max_file_size: options.max_file_size,
            empty_settle: options.empty_settle,
            // A failed load is counted once; the next good read applies (and counts)
            // again even when its bytes are those of the last good one.
            forget_on_error: true,
        };
        Reloader {
            file: WatchedFile::new(path, options),
            registry,
            status,
        }
    }

    /// Reads the file once and applies what it says. Returns when to read again
    /// without waiting for a change: `None` to wait for the next change.
    async fn reload(&mut self) -> Option<Duration> {
        let path = self.file.path().to_path_buf();
        let path = path.display();
        match self.file.read().await {
            Read::Unchanged => None,
            Read::Content => self.apply(),
            Read::Changing { error, delay } => {
                // A writer is at work: read again soon (its next write also ticks).
                self.status.read_retries.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(path = %path, "{error}; reading again in {delay:?}");
                Some(delay)
            }
            Read::Missing {
                error,
                repeated,
                had_content,
            } => {
                let message = error.to_string();
                if !repeated {
                    self.status.failed(message.clone());
                    if had_content {
                        tracing::warn!(
                            path = %path,
                            "{message}: the mock registry file was deleted; keeping the last good content"
                        );
                    } else {
                        tracing::warn!(
                            path = %path,
                            "{message}; the mock registry stays empty until the file is created"
                        );
                    }
                }
                None
            }
            Read::Failed {
                error,
                repeated,
                delay,
            } => {
                let message = error.to_string();
                self.status.read_retries.fetch_add(1, Ordering::Relaxed);
                if repeated {
                    tracing::debug!(path = %path, "{message}; retrying in {delay:?}");
                } else {
                    self.status.failed(message.clone());
                    tracing::error!(
                        path = %path,
                        "{message} (keeping the last good mock registry content; retrying in {delay:?})"
                    );
                }
                Some(delay)
            }
        }
    }

    /// Parses and applies the content just read.
    fn apply(&mut self) -> Option<Duration> {
        let path = self.file.path().to_path_buf();
        let services = match parse_mock_registry_bytes(&path, self.file.content()) {
            Ok(services) => services,
            Err(e) => {
                self.file.clear_emptied();
                tracing::error!(path = %path.display(), "{e} (keeping the last good mock registry content)");
                self.status.failed(e.to_string());
                return None;
            }
        };
        let held = self.registry.services().len();
        // Emptied: a writer may have truncated the file and not written yet. Only an
        // emptiness that lasts withdraws.
        match self
            .file
            .settle(services.is_empty() && held > 0, Instant::now())
        {
            Settle::Apply => {}
            Settle::Wait { waited, remaining } => {
                if waited.is_zero() {
                    tracing::info!(
                        path = %path.display(),
                        "mock registry file has no services; its {held} services stay unless it stays so for {:?}",
                        self.file.options().empty_settle
                    );
                }
                return Some(remaining);
            }
            Settle::Settled => {
                tracing::warn!(
                    path = %path.display(),
                    "mock registry file {} is empty: withdrawing {held} services",
                    path.display()
                );
                self.status
                    .empty_withdrawals
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        let n = services.len();
        let m: usize = services.iter().map(|s| s.endpoints.len()).sum();
        self.registry.replace_all(services);
        self.status.succeeded();
        tracing::info!(path = %path.display(), "mock registry reloaded: {n} services, {m} endpoints");
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoints::EndpointIndex;
    use crate::events::UpdateSink;
    use crate::model::ServiceKey;
    use std::path::Path;

    // ------------------------------------------------------------------------------
    // Reloading.

    const ONE: &str = "services:\n- hostname: a.x\n  ports: [{name: http, port: 80}]\n  addresses: [10.96.0.1]\n  \
                       endpoints: [{address: 10.0.0.1}]\n";
    const TWO: &str = "services:\n- hostname: a.x\n  ports: [{name: http, port: 80}]\n  endpoints: [{address: \
                       10.0.0.2}, {address: 10.0.0.3}]\n- hostname: b.x\n  ports: [{name: tcp, port: 9000}]\n";
    const BAD: &str = "services:\n- hostname: a.x\n  ports: [{name: http, port: 0}]\n";

    fn registry() -> MemoryRegistry {
        let (sink, _rx) = UpdateSink::new(Arc::new(EndpointIndex::new()));
        MemoryRegistry::new_unsynced("c1", sink)
    }

    fn hosts(reg: &MemoryRegistry) -> Vec<String> {
        let mut hosts: Vec<String> = reg
            .services()
            .iter()
            .map(|s| s.hostname.to_string())
            .collect();
        hosts.sort();
        hosts
    }

    fn ips(reg: &MemoryRegistry, host: &str) -> Vec<String> {
        reg.endpoints(&ServiceKey::new(host, "default"))
            .iter()
            .map(|e| e.address.to_string())
            .collect()
    }

    fn counts(status: &MockFileStatus) -> (u64, u64) {
        (
            status.reloads_ok.load(Ordering::Relaxed),
            status.reloads_failed.load(Ordering::Relaxed),
        )
    }

    #[tokio::test]
    async fn metrics_report_the_load_counters_under_their_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mock.yaml");
        let status = MockFileStatus::new();
        let mut metrics = Registry::default();
        status.register_metrics(&mut metrics);
        let mut r = Reloader::new(
            path.clone(),
            registry(),
            status.clone(),
            MockFileOptions::default(),
        );
        for text in [ONE, BAD, TWO] {
            std::fs::write(&path, text).unwrap();
            r.reload().await;
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &metrics).unwrap();
        assert_eq!(
            text,
            "# HELP meshfed_mock_file_reloads Mock registry file loads by result (failed loads keep the last good content)\n\
             # TYPE meshfed_mock_file_reloads gauge\n\
             meshfed_mock_file_reloads{result=\"ok\"} 2\n\
             meshfed_mock_file_reloads{result=\"failed\"} 1\n\
             # HELP meshfed_mock_file_read_retries Mock registry file reads retried after a failure or a read that raced a writer\n\
             # TYPE meshfed_mock_file_read_retries gauge\n\
             meshfed_mock_file_read_retries{reason=\"read_error\"} 0\n\
             # HELP meshfed_mock_file_empty_withdrawals Times an emptied mock registry file withdrew its services after the settle period\n\
             # TYPE meshfed_mock_file_empty_withdrawals gauge\n\
             meshfed_mock_file_empty_withdrawals{result=\"withdrawn\"} 0\n\
             # EOF\n"
        );
    }

    #[tokio::test]
    async fn reload_skips_identical_bytes_and_keeps_the_last_good_content() {
        let (_dir, path, reg, status, mut r) = fixture(MockFileOptions::default());

        r.reload().await;
        assert_eq!(counts(&status), (0, 1), "a missing file is a failed load");
        assert!(status.last_error().unwrap().contains("does not exist"));
        r.reload().await;
        assert_eq!(
            counts(&status),
            (0, 1),
            "the same missing file is not counted twice"
        );

        std::fs::write(&path, ONE).unwrap();
        r.reload().await;
        assert_eq!(counts(&status), (1, 1));
        assert_eq!(status.last_error(), None);
        assert_eq!(hosts(&reg), vec!["a.x"]);
        let vips = &reg.services()[0].cluster_vips;
        assert_eq!(
            vips.keys().map(|c| c.as_str()).collect::<Vec<_>>(),
            vec!["c1"],
            "VIPs under the registry's cluster"
        );
        r.reload().await;
        assert_eq!(counts(&status), (1, 1), "identical bytes do nothing");

        std::fs::write(&path, BAD).unwrap();
        r.reload().await;
        assert_eq!(counts(&status), (1, 2));
        let err = status.last_error().unwrap();
        assert!(
            err.contains("mock.yaml:3: services[0] (a.x): ports[0].port: port 0"),
            "{err}"
        );
        assert_eq!(hosts(&reg), vec!["a.x"], "the last good content stays");
        r.reload().await;
        assert_eq!(
            counts(&status),
            (1, 2),
            "the same bad bytes are not counted twice"
        );

        std::fs::remove_file(&path).unwrap();
        r.reload().await;
        assert_eq!(counts(&status), (1, 3));
        assert_eq!(
            ips(&reg, "a.x"),
            vec!["10.0.0.1"],
            "a deleted file keeps the last good content"
        );

        std::fs::write(&path, ONE).unwrap();
        r.reload().await;
        assert_eq!(
            counts(&status),
            (2, 3),
            "re-created after a deletion: applied again"
        );
    }

    /// Polls `cond` until it holds, for at most 10 s.
    async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
        let wait = async {
            while !cond() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .is_err()
        {
            panic!("timed out waiting for: {what}");
        }
    }

    /// Replaces the file atomically, the way editors and config tools do.
    fn replace(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[tokio::test]
    async fn run_mock_file_follows_edits_and_survives_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mock.yaml");
        std::fs::write(&path, ONE).unwrap();
        let reg = registry();
        let status = MockFileStatus::new();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run_mock_file(
            path.clone(),
            reg.clone(),
            status.clone(),
            MockFileOptions::default(),
            async {
                let _ = stopped.await;
            },
        ));

        eventually("initial load", || {
            reg.has_synced() && counts(&status) == (1, 0)
        })
        .await;
        assert_eq!(hosts(&reg), vec!["a.x"]);
        assert_eq!(ips(&reg, "a.x"), vec!["10.0.0.1"]);

        // Atomic replace.
        replace(&path, TWO);
        eventually("second content", || hosts(&reg) == ["a.x", "b.x"]).await;
        assert_eq!(ips(&reg, "a.x"), vec!["10.0.0.2", "10.0.0.3"]);

        // A bad edit in place: logged and counted, the content stays.
        std::fs::write(&path, BAD).unwrap();
        eventually("failed reload", || counts(&status).1 == 1).await;
        assert!(
            status
                .last_error()
                .unwrap()
                .contains(":3: services[0] (a.x): ports[0].port")
        );
        assert_eq!(hosts(&reg), vec!["a.x", "b.x"]);

        // The next good edit recovers.
        std::fs::write(&path, ONE).unwrap();
        eventually("recovery", || hosts(&reg) == ["a.x"]).await;
        assert_eq!(ips(&reg, "a.x"), vec!["10.0.0.1"]);
        assert_eq!(status.last_error(), None);

        // Deleted: warned, counted, the content stays.
        std::fs::remove_file(&path).unwrap();
        eventually("deletion noticed", || counts(&status).1 == 2).await;
        assert_eq!(hosts(&reg), vec!["a.x"]);

        // Re-created.
        replace(&path, TWO);
        eventually("re-created", || hosts(&reg) == ["a.x", "b.x"]).await;

        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn run_mock_file_serves_empty_and_synced_when_the_first_load_fails() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mock.yaml");
        std::fs::write(&path, BAD).unwrap();
        let reg = registry();
        let status = MockFileStatus::new();
        let task = tokio::spawn(run_mock_file(
            path.clone(),
            reg.clone(),
            status.clone(),
            MockFileOptions::default(),
            std::future::pending(),
        ));
        eventually("synced despite the bad file", || reg.has_synced()).await;
        assert_eq!(counts(&status), (0, 1));
        assert!(reg.services().is_empty());
        replace(&path, ONE);
        eventually("fixed file loaded", || hosts(&reg) == ["a.x"]).await;
        task.abort();
    }

    #[tokio::test]
    async fn run_mock_file_picks_up_a_file_created_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mock.yaml");
        let reg = registry();
        let status = MockFileStatus::new();
        let task = tokio::spawn(run_mock_file(
            path.clone(),
            reg.clone(),
            status.clone(),
            MockFileOptions::default(),
            std::future::pending(),
        ));
        eventually("synced without a file", || reg.has_synced()).await;
        std::fs::write(&path, ONE).unwrap();
        eventually("created file loaded", || hosts(&reg) == ["a.x"]).await;
        task.abort();
    }

    #[tokio::test]
    async fn run_mock_file_fails_fast_without_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry();
        let err = run_mock_file(
            dir.path().join("nope/mock.yaml"),
            reg.clone(),
            MockFileStatus::new(),
            MockFileOptions::default(),
            async {},
        )
        .await
        .unwrap_err();
        assert!(matches!(err, WatchError::DirMissing { .. }), "{err}");
        assert!(!reg.has_synced());
    }

    // ------------------------------------------------------------------------------
    // Hostile writers and files.

    /// Captures what is logged on this thread while the guard lives.
    fn capture_logs() -> (Arc<Mutex<Vec<u8>>>, tracing::subscriber::DefaultGuard) {
        #[derive(Clone)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = Buf(buf.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (buf, tracing::subscriber::set_default(subscriber))
    }

    fn logged(buf: &Arc<Mutex<Vec<u8>>>) -> String {
        String::from_utf8_lossy(&buf.lock().unwrap()).into_owned()
    }

    fn withdrawals(status: &MockFileStatus) -> u64 {
        status.empty_withdrawals.load(Ordering::Relaxed)
    }

    fn retries(status: &MockFileStatus) -> u64 {
        status.read_retries.load(Ordering::Relaxed)
    }

    /// Truncates the file in place, as the shell's `>` does before the writer writes.
    fn truncate(path: &Path) {
        std::fs::File::create(path).unwrap();
    }

    /// A reloader of `mock.yaml` in a scratch directory (the file not yet written).
    fn fixture(
        options: MockFileOptions,
    ) -> (
        tempfile::TempDir,
        PathBuf,
        MemoryRegistry,
        MockFileStatus,
        Reloader,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mock.yaml");
        let reg = registry();
        let status = MockFileStatus::new();
        let r = Reloader::new(path.clone(), reg.clone(), status.clone(), options);
        (dir, path, reg, status, r)
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_writer_does_not_withdraw_services() {
        // `{ sleep 0.3; cat good.yaml; } > mock.yaml`: the shell truncates the file, the
        // content comes 300 ms later, well after the watcher's 50 ms quiet window.
        let (_dir, path, reg, status, mut r) = fixture(MockFileOptions::default());
        std::fs::write(&path, ONE).unwrap();
        assert_eq!(r.reload().await, None);
        assert_eq!(hosts(&reg), vec!["a.x"]);

        truncate(&path);
        assert_eq!(
            r.reload().await,
            Some(DEFAULT_EMPTY_SETTLE),
            "the empty read waits for the file to settle"
        );
        assert_eq!(hosts(&reg), vec!["a.x"], "the services stay meanwhile");

        tokio::time::advance(Duration::from_millis(300)).await;
        std::fs::write(&path, TWO).unwrap();
        assert_eq!(r.reload().await, None);
        assert_eq!(hosts(&reg), vec!["a.x", "b.x"]);
        assert_eq!(withdrawals(&status), 0);

        // The pending withdrawal is gone with the emptiness: a later read does nothing.
        tokio::time::advance(DEFAULT_EMPTY_SETTLE * 2).await;
        assert_eq!(r.reload().await, None);
        assert_eq!(hosts(&reg), vec!["a.x", "b.x"]);
        assert_eq!(withdrawals(&status), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_emptied_file_withdraws_only_after_the_settle_period() {
        let (logs, _guard) = capture_logs();
        let (_dir, path, reg, status, mut r) = fixture(MockFileOptions::default());
        std::fs::write(&path, TWO).unwrap();
        r.reload().await;
        assert_eq!(hosts(&reg), vec!["a.x", "b.x"]);

        // `: > mock.yaml`, then a comment-only edit: still no services.
        truncate(&path);
        assert_eq!(r.reload().await, Some(DEFAULT_EMPTY_SETTLE));
        tokio::time::advance(Duration::from_secs(4)).await;
        std::fs::write(&path, "# nothing here yet\n").unwrap();
        assert_eq!(
            r.reload().await,
            Some(Duration::from_secs(1)),
            "the settle period runs from the first empty read"
        );
        assert_eq!(hosts(&reg), vec!["a.x", "b.x"]);
        assert_eq!(withdrawals(&status), 0);
        assert!(!logged(&logs).contains("withdrawing"));

        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(r.reload().await, None);
        assert!(hosts(&reg).is_empty(), "withdrawn once it stayed empty");
        assert_eq!(withdrawals(&status), 1);
        let text = logged(&logs);
        assert!(
            text.contains("WARN")
                && text.contains(&format!(
                    "mock registry file {} is empty: withdrawing 2 services",
                    path.display()
                )),
            "{text}"
        );

        // Empty and nothing held: nothing to wait for.
        std::fs::write(&path, "").unwrap();
        assert_eq!(r.reload().await, None);
        assert_eq!(withdrawals(&status), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_follow_loop_withdraws_an_emptied_file_on_its_own_timer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mock.yaml");
        std::fs::write(&path, ONE).unwrap();
        let reg = registry();
        let status = MockFileStatus::new();
        let (tick, watcher) = PathWatcher::manual(&path);
        let r = Reloader::new(
            path.clone(),
            reg.clone(),
            status.clone(),
            MockFileOptions::default(),
        );
        let task = tokio::spawn(follow(watcher, r, std::future::pending()));
        eventually("initial load", || hosts(&reg) == ["a.x"]).await;

        truncate(&path);
        tick.send(()).await.unwrap();
        let emptied = Instant::now();
        // One notification only: the loop re-reads by itself once the period is over.
        tokio::time::sleep(DEFAULT_EMPTY_SETTLE - Duration::from_millis(100)).await;
        assert_eq!(hosts(&reg), vec!["a.x"], "not yet");
        eventually("withdrawn", || hosts(&reg).is_empty()).await;
        assert!(emptied.elapsed() >= DEFAULT_EMPTY_SETTLE);
        assert_eq!(withdrawals(&status), 1);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_is_retried_with_backoff_until_it_succeeds() {
        let (_dir, path, reg, status, mut r) = fixture(MockFileOptions::default());
        // A directory where the file should be: every read fails (as EMFILE would).
        std::fs::create_dir(&path).unwrap();
        assert_eq!(r.reload().await, Some(Duration::from_millis(100)));
        assert_eq!(r.reload().await, Some(Duration::from_millis(200)));
        assert_eq!(r.reload().await, Some(Duration::from_millis(400)));
        assert_eq!(counts(&status), (0, 1), "one failure, retried");
        assert_eq!(retries(&status), 3);
        let err = status.last_error().unwrap();
        assert!(
            err.contains("not a regular file (it is a directory)"),
            "{err}"
        );

        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, ONE).unwrap();
        assert_eq!(r.reload().await, None, "success: no more retries");
        assert_eq!(hosts(&reg), vec!["a.x"]);

        // The backoff starts over after a success.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert_eq!(r.reload().await, Some(Duration::from_millis(100)));
        assert_eq!(hosts(&reg), vec!["a.x"], "the last good content stays");
    }

    #[tokio::test(start_paused = true)]
    async fn the_follow_loop_retries_a_failed_read_without_a_notification() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mock.yaml");
        std::fs::create_dir(&path).unwrap();
        let reg = registry();
        let status = MockFileStatus::new();
        // No notification is ever sent: only the retry can pick the fix up.
        let (_tick, watcher) = PathWatcher::manual(&path);
        let r = Reloader::new(
            path.clone(),
            reg.clone(),
            status.clone(),
            MockFileOptions::default(),
        );
        let task = tokio::spawn(follow(watcher, r, std::future::pending()));
        eventually("synced despite the failed read", || reg.has_synced()).await;
        eventually("a few retries", || retries(&status) >= 3).await;
        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, ONE).unwrap();
        eventually("picked up by a retry", || hosts(&reg) == ["a.x"]).await;
        let done = retries(&status);
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(retries(&status), done, "no retries after the success");
        task.abort();
    }

    #[tokio::test]
    async fn a_file_over_the_size_limit_keeps_the_last_good_content() {
        let (_dir, path, reg, status, mut r) = fixture(MockFileOptions {
            max_file_size: ONE.len() as u64,
            ..MockFileOptions::default()
        });
        std::fs::write(&path, ONE).unwrap();
        assert_eq!(r.reload().await, None, "exactly at the limit");
        std::fs::write(&path, TWO).unwrap();
        assert!(TWO.len() > ONE.len());
        assert!(r.reload().await.is_some(), "retried");
        let err = status.last_error().unwrap();
        assert!(
            err.contains(&format!(
                "larger than the size limit of {} bytes",
                ONE.len()
            )) && err.contains("--maxConfigFileSize"),
            "{err}"
        );
        assert_eq!(hosts(&reg), vec!["a.x"]);
    }

    #[tokio::test]
    async fn a_device_is_refused_and_shutdown_is_prompt() {
        // `--mockRegistryFile /dev/zero` used to read forever, growing without bound.
        let reg = registry();
        let status = MockFileStatus::new();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run_mock_file(
            PathBuf::from("/dev/zero"),
            reg.clone(),
            status.clone(),
            MockFileOptions::default(),
            async {
                let _ = stopped.await;
            },
        ));
        eventually("synced, the device refused", || reg.has_synced()).await;
        let err = status.last_error().unwrap();
        assert!(
            err.contains("/dev/zero: not a regular file (it is a character device)"),
            "{err}"
        );
        assert!(reg.services().is_empty());
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the task ends at shutdown")
            .unwrap()
            .unwrap();
    }
}

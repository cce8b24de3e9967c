//! The config directory store (`--configDir`): every `*.yaml`, `*.yml` and `*.json`
//! below a directory, watched and applied live.
//!
//! [`run_config_dir`] reads the directory (recursive, sorted by path, hidden entries
//! skipped — see [`crate::config::source`] for the file format), marks the store synced
//! and then re-reads everything whenever something below the directory changes
//! (created, edited in place, replaced by rename, deleted, ConfigMap symlink swap; see
//! [`crate::watch`]). Each re-read is diffed against what the store holds and pushed as
//! one `config_changed` with exactly the keys that were added, changed (spec, labels
//! or annotations) or deleted (ServiceEntries and WorkloadEntries are left to the
//! ServiceEntry registry, which follows [`ConfigStore::changes`]; see
//! [`crate::config::store`]).
//!
//! Bad config is rejected per object, not per file — unlike Istio's file source,
//! which fails a whole file:
//! - an invalid object is rejected alone, with `file:line`, kind, namespace/name,
//!   field and reason (logged once as a warning, listed by
//!   [`ConfigStore::rejected`]); if an earlier version of it was valid, that version
//!   stays in force;
//! - a document with a YAML syntax error is rejected alone; while a file has such a
//!   document, objects loaded earlier from that file are not deleted (the broken
//!   document may be one of them);
//! - a file that cannot be read or split at all (permissions, not a regular file, over
//!   `--maxConfigFileSize`, changed while it was read, not UTF-8, a JSON syntax error)
//!   keeps every object loaded earlier from it; one that could not be read is read
//!   again with backoff until it can;
//! - an object defined twice (same kind, namespace and name) is taken from the first
//!   file by sorted path; the other definition is rejected, naming the first;
//! - the rest of the file and of the directory applies as usual.
//!
//! [`ConfigDirStatus`] counts reloads and rejections for metrics.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use crate::config::assembly::{Placed, assemble, retain_secrets};
use crate::config::ignored::{IgnoredConfig, IgnoredLog};
use crate::config::model::{ConfigObject, Kind, ObjectId};
use crate::config::secret::SecretObject;
use crate::config::source::{ParsedFile, config_files, parse_bytes};
use crate::config::store::{
    ConfigStore, Objects, Published, RejectedConfig, StoreCore, changed_keys,
};
use crate::events::{ConfigKey, ConfigKind, PushRequest, TriggerReason, UpdateSink};
use crate::follow::{FollowOptions, Reload, Settle, follow, settle_empty};
use crate::metrics::encode_gauges;
use crate::read::{Backoff, EMPTY_SETTLE, is_blank, read_watched_file_blocking};
use crate::watch::{PathWatcher, WatchError};

/// Reload counters of a config directory, for metrics and debug pages. Cheap to clone;
/// clones share the counters.
#[derive(Clone, Debug, Default)]
pub struct ConfigDirStatus {
    /// Reloads after which everything in the directory was in force.
    pub reloads_ok: Arc<AtomicU64>,
    /// Reloads that rejected something (an object, a document, a file) or could not
    /// read the directory; everything else still applied.
    pub reloads_failed: Arc<AtomicU64>,
    /// How many rejections are current (a gauge: objects, documents and files).
    pub rejected: Arc<AtomicU64>,
    /// Re-reads scheduled because a file or the listing could not be read (an I/O
    /// error, not a regular file, over the size limit, a writer at work).
    pub read_retries: Arc<AtomicU64>,
}

impl ConfigDirStatus {
    /// Fresh counters.
    pub fn new() -> ConfigDirStatus {
        ConfigDirStatus::default()
    }

    fn record(&self, rejected: usize) {
        if rejected == 0 {
            self.reloads_ok.fetch_add(1, Ordering::Relaxed);
        } else {
            self.reloads_failed.fetch_add(1, Ordering::Relaxed);
        }
        self.rejected.store(rejected as u64, Ordering::Relaxed);
    }

    /// Registers `meshfed_config_dir_reloads{result="ok"|"failed"}` and
    /// `meshfed_config_dir_read_retries{reason="read_error"}` into `registry`,
    /// read from these counters on every scrape.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(ConfigDirMetrics(self.clone())));
    }
}

#[derive(Debug)]
struct ConfigDirMetrics(ConfigDirStatus);

impl Collector for ConfigDirMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let status = &self.0;
        encode_gauges(
            &mut encoder,
            "meshfed_config_dir_reloads",
            "Config directory reloads by result (failed = something was rejected)",
            "result",
            [
                ("ok", status.reloads_ok.load(Ordering::Relaxed) as i64),
                (
                    "failed",
                    status.reloads_failed.load(Ordering::Relaxed) as i64,
                ),
            ],
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_config_dir_read_retries",
            "Config directory re-reads scheduled because a file or the listing could not be read",
            "reason",
            [(
                "read_error",
                status.read_retries.load(Ordering::Relaxed) as i64,
            )],
        )
    }
}

#[derive(Debug, Default)]
struct FileState {
    /// The objects in force.
    objects: Objects,
    /// The same objects with the file each came from (what the next reload may keep).
    placed: BTreeMap<ObjectId, Placed>,
    rejected: Vec<RejectedConfig>,
    /// The `kind: Secret` objects (SDS credentials), by (namespace, name).
    secrets: BTreeMap<(String, String), Arc<SecretObject>>,
    /// The `kind: Namespace` objects' labels, by name.
    namespaces: crate::config::NamespaceLabels,
    /// The `kind: ConfigMap` objects' data, by `<namespace>/<name>`.
    config_maps: crate::config::ConfigMaps,
}

impl Published for FileState {
    fn objects(&self) -> &Objects {
        &self.objects
    }

    fn rejected(&self) -> Vec<RejectedConfig> {
        self.rejected.clone()
    }
}

#[derive(Debug)]
struct FileInner {
    core: StoreCore<FileState>,
    status: ConfigDirStatus,
    ignored: IgnoredLog,
}

/// The read handle of a config directory store; [`run_config_dir`] is its writer.
/// Cheap to clone; clones share one store.
#[derive(Clone, Debug)]
pub struct FileConfigStore {
    inner: Arc<FileInner>,
}

impl FileConfigStore {
    /// An empty, unsynced store that reports changes through `sink`.
    pub fn new(sink: UpdateSink) -> FileConfigStore {
        FileConfigStore {
            inner: Arc::new(FileInner {
                core: StoreCore::new(sink),
                status: ConfigDirStatus::new(),
                ignored: IgnoredLog::default(),
            }),
        }
    }

    /// The store's reload counters.
    pub fn status(&self) -> &ConfigDirStatus {
        &self.inner.status
    }

    /// The Secret `namespace/name` of the directory, if any.
    pub fn secret(&self, namespace: &str, name: &str) -> Option<Arc<SecretObject>> {
        self.read()
            .secrets
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// The data of ConfigMap `namespace/name` of the directory, if there is one.
    pub fn config_map(&self, namespace: &str, name: &str) -> Option<BTreeMap<String, String>> {
        self.read()
            .config_maps
            .get(&format!("{namespace}/{name}"))
            .cloned()
    }

    /// Every Secret of the directory, by namespace and name.
    pub fn secrets(&self) -> Vec<Arc<SecretObject>> {
        self.read().secrets.values().cloned().collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, FileState> {
        self.inner.core.read()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, FileState> {
        self.inner.core.write()
    }
}

impl ConfigStore for FileConfigStore {
    fn list(&self, kind: Kind) -> Vec<Arc<ConfigObject>> {
        self.inner.core.list(kind)
    }

    fn all(&self) -> Vec<Arc<ConfigObject>> {
        self.inner.core.all()
    }

    fn rejected(&self) -> Vec<RejectedConfig> {
        self.inner.core.rejected()
    }

    fn ignored(&self) -> Vec<IgnoredConfig> {
        self.inner.ignored.list()
    }

    fn has_synced(&self) -> bool {
        self.inner.core.has_synced()
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.inner.core.changes())
    }

    fn namespace_labels(&self) -> Option<crate::config::NamespaceLabels> {
        Some(self.read().namespaces.clone()).filter(|n| !n.is_empty())
    }

    fn config_maps(&self) -> Option<crate::config::ConfigMaps> {
        Some(self.read().config_maps.clone()).filter(|n| !n.is_empty())
    }
}

/// Feeds `store` from the config files below `dir` until `shutdown` completes.
///
/// The watch starts first, then the directory is read and the store marked synced —
/// whatever the outcome, so that a bad file cannot keep the control plane from
/// becoming ready (what was rejected is logged and listed). Every change below the
/// directory re-reads it (see the module docs for what is kept when something is
/// bad).
///
/// Files are read under the rules of [`crate::read`]: regular files of at most
/// `max_file_size` bytes whose content did not change while they were read. A file
/// that cannot be read keeps the objects loaded earlier from it, and the directory is
/// read again with backoff (100 ms doubling to 30 s) until every file reads, so a
/// transient error (too many open files) heals without waiting for another edit.
/// Shutdown ends the task at once, even in the middle of a read.
///
/// Returns an error, without touching the store, if the watch cannot start (the
/// directory does not exist or is not a directory), and if the watcher stops later.
pub async fn run_config_dir(
    dir: PathBuf,
    store: FileConfigStore,
    max_file_size: u64,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WatchError> {
    // Watch before the first read, so that a change in between is not lost.
    let watcher = PathWatcher::watch(&dir, true)?;
    let mut reloader = Reloader::new(dir, store, max_file_size);
    let options = FollowOptions {
        read_at_start: true,
    };
    let result = follow(&mut [watcher], &mut reloader, options, shutdown).await;
    if let Err(err) = &result {
        tracing::error!("{err}; the config store keeps its current content");
    }
    result
}

impl Reload for Reloader {
    async fn reload(&mut self) -> Option<Duration> {
        Reloader::reload(self).await
    }

    fn started(&mut self) {
        self.store.inner.core.mark_synced();
    }
}

/// What one read of the directory saw: each file's bytes (or read error).
type Snapshot = BTreeMap<PathBuf, Result<Vec<u8>, String>>;

/// Parsed files by path, with the bytes they were parsed from.
type Cache = BTreeMap<PathBuf, (Vec<u8>, ParsedFile)>;

/// The reload step of [`run_config_dir`], apart from the watching.
struct Reloader {
    dir: PathBuf,
    store: FileConfigStore,
    /// The last read, to skip re-reads that see nothing new.
    seen: Option<Snapshot>,
    /// Parsed files, reused while their bytes stay the same.
    cache: Cache,
    /// Rejections already logged, so a persisting problem is logged once.
    logged: BTreeSet<String>,
    max_file_size: u64,
    backoff: Backoff,
    /// Files emptied after they had content, and since when (see [`EMPTY_SETTLE`]).
    emptied: Emptied,
}

/// Paths of files emptied after they had content, and since when.
type Emptied = BTreeMap<PathBuf, tokio::time::Instant>;

impl Reloader {
    fn new(dir: PathBuf, store: FileConfigStore, max_file_size: u64) -> Reloader {
        Reloader {
            dir,
            store,
            seen: None,
            cache: BTreeMap::new(),
            logged: BTreeSet::new(),
            max_file_size,
            backoff: Backoff::default(),
            emptied: Emptied::new(),
        }
    }

    /// Reads the directory once and applies what changed. Returns when to read again
    /// without waiting for a change (a file or the listing could not be read): `None`
    /// to wait for the next change.
    async fn reload(&mut self) -> Option<Duration> {
        let dir = self.dir.clone();
        let cache = std::mem::take(&mut self.cache);
        let seen = self.seen.take();
        let limit = self.max_file_size;
        let mut emptied = std::mem::take(&mut self.emptied);
        let now = tokio::time::Instant::now();
        let read = tokio::task::spawn_blocking(move || {
            let outcome = read_dir(&dir, seen, cache, limit, &mut emptied, now);
            (outcome, emptied)
        })
        .await;
        let outcome = match read {
            Ok((outcome, emptied)) => {
                self.emptied = emptied;
                outcome
            }
            Err(e) => {
                tracing::error!(dir = %self.dir.display(), "config directory read failed: {e}");
                self.store.status().record(1);
                return Some(self.retry_delay());
            }
        };
        let (snapshot, cache, parsed) = match outcome {
            ReadOutcome::Unchanged(snapshot, cache) => {
                let retry = has_unread(&snapshot);
                self.seen = Some(snapshot);
                self.cache = cache;
                return self.after_read(retry);
            }
            ReadOutcome::Failed(message, seen, cache) => {
                tracing::error!(
                    dir = %self.dir.display(),
                    "cannot read the config directory: {message}; keeping the current config"
                );
                self.seen = seen;
                self.cache = cache;
                self.store.status().record(1);
                return Some(self.retry_delay());
            }
            ReadOutcome::Read(snapshot, cache, parsed) => (snapshot, cache, parsed),
        };
        let retry = has_unread(&snapshot);
        self.seen = Some(snapshot);
        self.cache = cache;
        self.apply(&parsed);
        self.after_read(retry)
    }

    fn after_read(&mut self, retry: bool) -> Option<Duration> {
        if retry {
            Some(self.retry_delay())
        } else {
            self.backoff.reset();
            None
        }
    }

    fn retry_delay(&mut self) -> Duration {
        let delay = self.backoff.next_delay();
        self.store
            .status()
            .read_retries
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(dir = %self.dir.display(), "some config could not be read; reading again in {delay:?}");
        delay
    }

    fn apply(&mut self, parsed: &[ParsedFile]) {
        let previous = self.store.read().placed.clone();
        let mut assembly = assemble(parsed, &previous);
        retain_secrets(&mut assembly, parsed, &self.store.read().secrets);
        stamp_first_seen(&mut assembly.objects, &previous, SystemTime::now());
        let rejected: Vec<RejectedConfig> = assembly
            .rejected
            .iter()
            .map(|r| r.to_rejected_config())
            .collect();
        let objects: Objects = assembly
            .objects
            .iter()
            .map(|(id, placed)| (id.clone(), placed.obj.clone()))
            .collect();
        let (keys, secrets_changed) = {
            let mut state = self.store.write();
            let mut keys = changed_keys(&state.objects, &objects);
            let mut secrets_changed = changed_secrets(&state.secrets, &assembly.secrets);
            // A ConfigMap can be a CA served over SDS (`configmap://`): its change is
            // announced as a credential's.
            secrets_changed.extend(changed_config_maps(
                &state.config_maps,
                &assembly.config_maps,
            ));
            if state.namespaces != assembly.namespaces || state.config_maps != assembly.config_maps
            {
                // The Gateway API objects read namespace labels and ConfigMaps:
                // translate them again.
                keys.extend(
                    objects
                        .keys()
                        .filter(|id| id.kind.is_gateway_api())
                        .map(ObjectId::key),
                );
                state.namespaces = std::mem::take(&mut assembly.namespaces);
                state.config_maps = std::mem::take(&mut assembly.config_maps);
            }
            state.objects = objects;
            state.placed = assembly.objects;
            state.rejected = rejected.clone();
            state.secrets = assembly.secrets;
            (keys, secrets_changed)
        };
        if !secrets_changed.is_empty() {
            self.store
                .inner
                .core
                .push(PushRequest::full(TriggerReason::Secret, secrets_changed));
        }

        let mut logged = BTreeSet::new();
        for (rejection, record) in assembly.rejected.iter().zip(&rejected) {
            let line = record.to_string();
            if !self.logged.contains(&line) {
                let kept = rejection
                    .id
                    .as_ref()
                    .is_some_and(|id| assembly.retained.contains(id));
                if kept {
                    tracing::warn!(
                        "config rejected: {line} (the last valid version stays in force)"
                    );
                } else {
                    tracing::warn!("config rejected: {line}");
                }
            }
            logged.insert(line);
        }
        self.logged = logged;
        for warning in &assembly.warnings {
            tracing::debug!("config warning: {warning}");
        }
        self.store.inner.ignored.replace(assembly.ignored);
        let total = self.store.read().objects.len();
        tracing::info!(
            dir = %self.dir.display(),
            "config reloaded: {total} objects, {} rejected, {} changed",
            rejected.len(),
            keys.len()
        );
        self.store.status().record(rejected.len());
        if !keys.is_empty() {
            self.store.inner.core.announce(keys);
        }
    }
}

/// The Secrets added, changed or removed between two reads, as push keys.
fn changed_secrets(
    before: &BTreeMap<(String, String), Arc<SecretObject>>,
    after: &BTreeMap<(String, String), Arc<SecretObject>>,
) -> Vec<ConfigKey> {
    let keys: BTreeSet<&(String, String)> = before.keys().chain(after.keys()).collect();
    keys.into_iter()
        .filter(|k| before.get(*k).map(|s| &s.content) != after.get(*k).map(|s| &s.content))
        .map(|(namespace, name)| ConfigKey::new(ConfigKind::Secret, name, namespace))
        .collect()
}

/// The ConfigMaps added, changed or removed between two reads, as credential push
/// keys.
fn changed_config_maps(
    before: &crate::config::ConfigMaps,
    after: &crate::config::ConfigMaps,
) -> Vec<ConfigKey> {
    let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .filter_map(|k| k.split_once('/'))
        .map(|(namespace, name)| ConfigKey::new(ConfigKind::Secret, name, namespace))
        .collect()
}

/// Gives each object without `metadata.creationTimestamp` (decoded as `UNIX_EPOCH`)
/// the time it was first seen, as Istio's in-memory config store does when a file
/// object is created, so that a ServiceEntry added to the directory later counts as
/// younger than the services already known (oldest wins), not as the oldest of all.
/// An object that stays (same kind, namespace and name) keeps its time across reloads
/// and edits, as Kubernetes keeps `creationTimestamp`; one deleted and added again is
/// new.
fn stamp_first_seen(
    objects: &mut BTreeMap<ObjectId, Placed>,
    previous: &BTreeMap<ObjectId, Placed>,
    now: SystemTime,
) {
    for (id, placed) in objects.iter_mut() {
        if placed.obj.creation_time != UNIX_EPOCH {
            continue;
        }
        let first_seen = previous
            .get(id)
            .map(|p| p.obj.creation_time)
            .filter(|t| *t != UNIX_EPOCH)
            .unwrap_or(now);
        Arc::make_mut(&mut placed.obj).creation_time = first_seen;
    }
}

enum ReadOutcome {
    /// Every file has the bytes of the last read.
    Unchanged(Snapshot, Cache),
    /// The directory could not be listed: the last read stays.
    Failed(String, Option<Snapshot>, Cache),
    /// Something changed: the new read, the cache and every file parsed.
    Read(Snapshot, Cache, Vec<ParsedFile>),
}

/// Whether some file of the read could not be read (and must be read again).
fn has_unread(snapshot: &Snapshot) -> bool {
    snapshot.values().any(Result::is_err)
}

/// Lists and reads the directory (blocking), parsing only files whose bytes changed.
///
/// A file emptied after it had content reads as not yet readable (its objects stay)
/// until it has been empty for [`EMPTY_SETTLE`]; `emptied` tracks since when.
fn read_dir(
    dir: &Path,
    seen: Option<Snapshot>,
    mut cache: Cache,
    limit: u64,
    emptied: &mut Emptied,
    now: tokio::time::Instant,
) -> ReadOutcome {
    // A file renamed or deleted between listing and reading would look deleted for one
    // round; list again so the snapshot is consistent.
    let mut attempts = 0;
    let snapshot = loop {
        attempts += 1;
        let files = match config_files(dir) {
            Ok(files) => files,
            Err(e) => return ReadOutcome::Failed(e.to_string(), seen, cache),
        };
        let mut snapshot = Snapshot::new();
        let mut vanished = false;
        for path in files {
            match read_watched_file_blocking(&path, limit) {
                Ok(bytes) if is_blank(&bytes) => {
                    let had_content = emptied.contains_key(&path)
                        || seen
                            .as_ref()
                            .and_then(|s| s.get(&path))
                            .is_some_and(|b| b.as_ref().is_ok_and(|b| !is_blank(b)));
                    if had_content {
                        let mut since = emptied.get(&path).copied();
                        let settle = settle_empty(&mut since, now, EMPTY_SETTLE);
                        emptied.extend(since.map(|since| (path.clone(), since)));
                        if let Settle::Wait { waited, .. } = settle {
                            let message = format!(
                                "emptied {waited:?} ago: its objects stay until it has been empty \
                                 for {EMPTY_SETTLE:?} (a writer may still be filling it)"
                            );
                            snapshot.insert(path, Err(message));
                            continue;
                        }
                    }
                    snapshot.insert(path, Ok(bytes));
                }
                Ok(bytes) => {
                    emptied.remove(&path);
                    snapshot.insert(path, Ok(bytes));
                }
                Err(e) if e.is_missing() => vanished = true,
                Err(e) => {
                    let reason = e.reason();
                    snapshot.insert(path, Err(reason));
                }
            }
        }
        if !vanished || attempts >= 3 {
            break snapshot;
        }
    };
    emptied.retain(|path, _| snapshot.contains_key(path));
    if seen.as_ref() == Some(&snapshot) {
        return ReadOutcome::Unchanged(snapshot, cache);
    }
    let mut parsed = Vec::with_capacity(snapshot.len());
    let mut next_cache = Cache::new();
    for (path, read) in &snapshot {
        match read {
            Ok(bytes) => {
                let file = match cache.remove(path) {
                    Some((cached, file)) if cached == *bytes => file,
                    _ => parse_bytes(path, bytes),
                };
                next_cache.insert(path.clone(), (bytes.clone(), file.clone()));
                parsed.push(file);
            }
            Err(message) => parsed.push(ParsedFile::unusable(path, message.clone())),
        }
    }
    ReadOutcome::Read(snapshot, next_cache, parsed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::store::test_support::{key, pushed, sink};
    use crate::events::{ConfigKind, RegistryEvent};
    use crate::read::DEFAULT_MAX_FILE_SIZE;
    use std::time::Duration;
    use tokio::sync::mpsc::UnboundedReceiver;

    const WAIT: Duration = Duration::from_secs(10);

    #[test]
    fn an_emptied_file_keeps_its_objects_until_it_has_stayed_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vs.yaml");
        std::fs::write(&path, vs("a", "a.example.com")).unwrap();
        let mut emptied = Emptied::new();
        let t0 = tokio::time::Instant::now();
        let read = |seen, emptied: &mut Emptied, at| match read_dir(
            dir.path(),
            seen,
            Cache::new(),
            DEFAULT_MAX_FILE_SIZE,
            emptied,
            at,
        ) {
            ReadOutcome::Read(snapshot, _, _) => snapshot,
            ReadOutcome::Unchanged(snapshot, _) => snapshot,
            ReadOutcome::Failed(message, ..) => panic!("{message}"),
        };
        let full = read(None, &mut emptied, t0);
        assert!(full[&path].is_ok());
        // Truncated by a writer that has not written yet: not a deletion.
        std::fs::write(&path, "# being written\n").unwrap();
        let held = read(Some(full), &mut emptied, t0);
        let message = held[&path].as_ref().unwrap_err();
        assert!(message.contains("its objects stay"), "{message}");
        let still = read(Some(held), &mut emptied, t0 + EMPTY_SETTLE / 2);
        assert!(still[&path].is_err());
        // Empty for the whole settle period: now it counts.
        let settled = read(Some(still), &mut emptied, t0 + EMPTY_SETTLE);
        assert_eq!(settled[&path].as_ref().unwrap(), b"# being written\n");
        // A file that was always empty counts at once.
        let other = dir.path().join("new.yaml");
        std::fs::write(&other, "").unwrap();
        let later = read(Some(settled), &mut emptied, t0 + EMPTY_SETTLE);
        assert!(later[&other].is_ok());
    }

    fn vs(name: &str, host: &str) -> String {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: ns}}\nspec:\n  hosts: [{host}]\n  http:\n  - route:\n    - destination: {{host: {host}}}\n"
        )
    }

    fn dr(name: &str, host: &str) -> String {
        format!(
            "apiVersion: networking.istio.io/v1beta1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: ns}}\nspec:\n  host: {host}\n  subsets: [{{name: v1, labels: {{version: v1}}}}]\n"
        )
    }

    fn docs(parts: &[String]) -> String {
        parts.join("---\n")
    }

    /// Replaces a file atomically, the way editors and config tools do. The temp file
    /// is hidden, so the store never reads it.
    fn replace(path: &Path, text: &str) {
        let tmp = path.with_file_name(format!(
            ".{}.tmp",
            path.file_name().unwrap().to_string_lossy()
        ));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    /// Waits for the next push and returns its keys, sorted.
    async fn next_push(rx: &mut UnboundedReceiver<RegistryEvent>, what: &str) -> Vec<String> {
        loop {
            match tokio::time::timeout(WAIT, rx.recv()).await {
                Ok(Some(RegistryEvent::Push(request))) => {
                    let mut keys: Vec<String> = request
                        .configs_updated
                        .iter()
                        .map(ToString::to_string)
                        .collect();
                    keys.sort();
                    return keys;
                }
                Ok(Some(RegistryEvent::Synced(_))) => {}
                Ok(None) => panic!("{what}: the sink closed"),
                Err(_) => panic!("{what}: no push within {WAIT:?}"),
            }
        }
    }

    fn keys(list: &[(ConfigKind, &str)]) -> Vec<String> {
        let mut out: Vec<String> = list.iter().map(|(k, name)| key(*k, "ns", name)).collect();
        out.sort();
        out
    }

    fn names(store: &FileConfigStore) -> Vec<String> {
        store
            .all()
            .iter()
            .map(|o| format!("{} {}", o.kind, o.name))
            .collect()
    }

    fn counts(store: &FileConfigStore) -> (u64, u64, u64) {
        let s = store.status();
        (
            s.reloads_ok.load(Ordering::Relaxed),
            s.reloads_failed.load(Ordering::Relaxed),
            s.rejected.load(Ordering::Relaxed),
        )
    }

    /// A running `run_config_dir` task and what a test needs to drive it.
    struct Running {
        store: FileConfigStore,
        rx: UnboundedReceiver<RegistryEvent>,
        task: tokio::task::JoinHandle<Result<(), WatchError>>,
        stop: tokio::sync::oneshot::Sender<()>,
    }

    fn start(dir: &Path) -> Running {
        let (sink, rx) = sink();
        let store = FileConfigStore::new(sink);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run_config_dir(
            dir.to_path_buf(),
            store.clone(),
            DEFAULT_MAX_FILE_SIZE,
            async {
                let _ = stopped.await;
            },
        ));
        Running {
            store,
            rx,
            task,
            stop,
        }
    }

    #[tokio::test]
    async fn follows_creates_edits_renames_and_deletes_with_exact_keys() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("a.yaml"), docs(&[vs("a", "a"), dr("a", "a")])).unwrap();
        std::fs::write(root.join("sub/b.yml"), vs("b", "b")).unwrap();
        let Running {
            store,
            mut rx,
            task,
            stop,
        } = start(root);

        let first = next_push(&mut rx, "initial load").await;
        assert_eq!(
            first,
            keys(&[
                (ConfigKind::VirtualService, "a"),
                (ConfigKind::DestinationRule, "a"),
                (ConfigKind::VirtualService, "b")
            ])
        );
        assert!(store.has_synced());
        assert_eq!(
            names(&store),
            ["VirtualService a", "VirtualService b", "DestinationRule a"]
        );
        assert_eq!(
            store.list(Kind::VirtualService)[0].source,
            format!("{}:1", root.join("a.yaml").display())
        );
        assert_eq!(counts(&store), (1, 0, 0));

        // A new file (JSON), created atomically.
        replace(
            &root.join("c.json"),
            r#"{"apiVersion": "networking.istio.io/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": "ns"},
                "spec": {"servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]}}"#,
        );
        assert_eq!(
            next_push(&mut rx, "created").await,
            keys(&[(ConfigKind::Gateway, "gw")])
        );

        // Editing one of two objects of a file pushes that one only.
        replace(&root.join("a.yaml"), &docs(&[vs("a", "a"), dr("a", "a2")]));
        assert_eq!(
            next_push(&mut rx, "edited").await,
            keys(&[(ConfigKind::DestinationRule, "a")])
        );

        // An in-place append of a new document.
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(root.join("sub/b.yml"))
                .unwrap();
            f.write_all(format!("---\n{}", vs("b2", "b2")).as_bytes())
                .unwrap();
        }
        assert_eq!(
            next_push(&mut rx, "appended").await,
            keys(&[(ConfigKind::VirtualService, "b2")])
        );

        // Renaming a file without changing what it says changes nothing; the next push
        // carries only the next change.
        std::fs::rename(root.join("sub/b.yml"), root.join("sub/renamed.yaml")).unwrap();
        std::fs::remove_file(root.join("c.json")).unwrap();
        assert_eq!(
            next_push(&mut rx, "deleted").await,
            keys(&[(ConfigKind::Gateway, "gw")])
        );
        assert_eq!(
            store
                .list(Kind::VirtualService)
                .iter()
                .find(|o| o.name == "b")
                .unwrap()
                .source,
            format!("{}:1", root.join("sub/renamed.yaml").display())
        );

        // Deleting a file deletes its objects.
        std::fs::remove_file(root.join("a.yaml")).unwrap();
        assert_eq!(
            next_push(&mut rx, "file deleted").await,
            keys(&[
                (ConfigKind::VirtualService, "a"),
                (ConfigKind::DestinationRule, "a")
            ])
        );
        assert_eq!(names(&store), ["VirtualService b", "VirtualService b2"]);
        // Nothing stays rejected. (A reload may have read the in-place append half
        // written and rejected it then, so the count of failed reloads is not asserted:
        // on a loaded machine that happens.)
        assert_eq!(store.rejected(), [], "nothing is rejected");

        stop.send(()).unwrap();
        tokio::time::timeout(WAIT, task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn metrics_report_the_reload_counters_under_their_names() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mixed.yaml");
        std::fs::write(&file, docs(&[vs("good", "good"), vs("bad", "\"*\"")])).unwrap();
        let Running {
            store,
            mut rx,
            task,
            stop,
        } = start(dir.path());
        let mut metrics = Registry::default();
        store.status().register_metrics(&mut metrics);
        next_push(&mut rx, "initial").await;
        replace(&file, &docs(&[vs("good", "good"), vs("bad", "fixed")]));
        next_push(&mut rx, "fixed").await;

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &metrics).unwrap();
        assert_eq!(
            text,
            "# HELP meshfed_config_dir_reloads Config directory reloads by result (failed = something was rejected)\n\
             # TYPE meshfed_config_dir_reloads gauge\n\
             meshfed_config_dir_reloads{result=\"ok\"} 1\n\
             meshfed_config_dir_reloads{result=\"failed\"} 1\n\
             # HELP meshfed_config_dir_read_retries Config directory re-reads scheduled because a file or the listing could not be read\n\
             # TYPE meshfed_config_dir_read_retries gauge\n\
             meshfed_config_dir_read_retries{reason=\"read_error\"} 0\n\
             # EOF\n"
        );
        let _ = stop.send(());
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn an_invalid_object_is_rejected_alone_with_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mixed.yaml");
        let bad = vs("bad", "\"*\"");
        std::fs::write(&file, docs(&[vs("good", "good"), bad.clone()])).unwrap();
        let Running {
            store,
            mut rx,
            task,
            stop: _stop,
        } = start(dir.path());

        assert_eq!(
            next_push(&mut rx, "initial").await,
            keys(&[(ConfigKind::VirtualService, "good")])
        );
        let rejected = store.rejected();
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        let r = &rejected[0];
        assert_eq!(r.source, format!("{}:10", file.display()));
        assert_eq!(
            (r.kind.as_str(), r.namespace.as_str(), r.name.as_str()),
            ("VirtualService", "ns", "bad")
        );
        assert_eq!(
            r.errors,
            [
                format!(
                    "{}:14: spec.hosts[0]: wildcard host * is not allowed for virtual services bound to the mesh gateway",
                    file.display()
                ),
                format!(
                    "{}:17: spec.http[0].route[0].destination.host: invalid destination host *",
                    file.display()
                )
            ]
        );
        assert_eq!(counts(&store), (0, 1, 1));

        // Fixing it applies it and clears the rejection.
        replace(&file, &docs(&[vs("good", "good"), vs("bad", "fixed")]));
        assert_eq!(
            next_push(&mut rx, "fixed").await,
            keys(&[(ConfigKind::VirtualService, "bad")])
        );
        assert!(store.rejected().is_empty());
        assert_eq!(counts(&store), (1, 1, 0));

        // Breaking it again keeps the last valid version in force: no push for it.
        replace(&file, &docs(&[vs("good", "good2"), bad]));
        assert_eq!(
            next_push(&mut rx, "broken again").await,
            keys(&[(ConfigKind::VirtualService, "good")])
        );
        let kept = store.list(Kind::VirtualService);
        assert_eq!(
            kept.iter()
                .find(|o| o.name == "bad")
                .unwrap()
                .spec
                .as_virtual_service()
                .unwrap()
                .hosts,
            ["fixed"]
        );
        assert_eq!(store.rejected().len(), 1);
        task.abort();
    }

    #[tokio::test]
    async fn a_yaml_syntax_error_keeps_the_files_objects() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("vs.yaml");
        std::fs::write(&file, docs(&[vs("a", "a"), vs("b", "b")])).unwrap();
        std::fs::write(dir.path().join("other.yaml"), vs("c", "c")).unwrap();
        let Running {
            store,
            mut rx,
            task,
            stop: _stop,
        } = start(dir.path());
        assert_eq!(next_push(&mut rx, "initial").await.len(), 3);

        // b's document breaks while a changes: a applies, b stays as it was.
        replace(
            &file,
            &docs(&[vs("a", "a2"), "kind: [unclosed\n".to_string()]),
        );
        assert_eq!(
            next_push(&mut rx, "a changed").await,
            keys(&[(ConfigKind::VirtualService, "a")])
        );
        assert_eq!(
            names(&store),
            ["VirtualService a", "VirtualService b", "VirtualService c"]
        );
        let rejected = store.rejected();
        assert_eq!(rejected.len(), 1);
        assert!(
            rejected[0].errors[0].contains("YAML syntax error"),
            "{rejected:?}"
        );
        assert!(rejected[0].source.ends_with("vs.yaml:10"), "{rejected:?}");

        // Repaired without b: now b is deleted.
        replace(&file, &vs("a", "a2"));
        assert_eq!(
            next_push(&mut rx, "repaired").await,
            keys(&[(ConfigKind::VirtualService, "b")])
        );
        assert!(store.rejected().is_empty());

        // Not UTF-8: the whole file is unusable and keeps a. (The next push, for
        // other.yaml, comes from a read that saw the broken file too.)
        std::fs::write(dir.path().join(".x.tmp"), b"kind: \xff\n").unwrap();
        std::fs::rename(dir.path().join(".x.tmp"), &file).unwrap();
        replace(&dir.path().join("other.yaml"), &vs("c", "c2"));
        assert_eq!(
            next_push(&mut rx, "other changed").await,
            keys(&[(ConfigKind::VirtualService, "c")])
        );
        assert_eq!(names(&store), ["VirtualService a", "VirtualService c"]);
        let rejected = store.rejected();
        assert!(
            rejected[0].errors[0].ends_with("vs.yaml:1: the file is not valid UTF-8"),
            "{rejected:?}"
        );
        task.abort();
    }

    #[tokio::test]
    async fn duplicates_take_the_first_file_by_path() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("m.yaml"), vs("x", "from-m")).unwrap();
        std::fs::write(root.join("z.yaml"), vs("x", "from-z")).unwrap();
        let Running {
            store,
            mut rx,
            task,
            stop: _stop,
        } = start(root);
        assert_eq!(
            next_push(&mut rx, "initial").await,
            keys(&[(ConfigKind::VirtualService, "x")])
        );
        let host = |store: &FileConfigStore| {
            store.list(Kind::VirtualService)[0]
                .spec
                .as_virtual_service()
                .unwrap()
                .hosts[0]
                .clone()
        };
        assert_eq!(host(&store), "from-m");
        let rejected = store.rejected();
        assert_eq!(rejected.len(), 1);
        assert!(rejected[0].source.ends_with("z.yaml:1"));
        assert!(
            rejected[0].errors[0].contains(&format!(
                "is already defined at {}:1",
                root.join("m.yaml").display()
            )),
            "{rejected:?}"
        );

        // Renaming m.yaml after z.yaml hands the object to z.yaml.
        std::fs::rename(root.join("m.yaml"), root.join("zz.yaml")).unwrap();
        assert_eq!(
            next_push(&mut rx, "renamed").await,
            keys(&[(ConfigKind::VirtualService, "x")])
        );
        assert_eq!(host(&store), "from-z");
        assert!(store.rejected()[0].source.ends_with("zz.yaml:1"));
        task.abort();
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn follows_a_configmap_symlink_swap() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("..2026_01")).unwrap();
        std::fs::write(
            root.join("..2026_01/config.yaml"),
            docs(&[vs("a", "a"), dr("a", "a")]),
        )
        .unwrap();
        symlink("..2026_01", root.join("..data")).unwrap();
        symlink("..data/config.yaml", root.join("config.yaml")).unwrap();
        let Running {
            store,
            mut rx,
            task,
            stop: _stop,
        } = start(root);
        assert_eq!(
            next_push(&mut rx, "initial").await.len(),
            2,
            "read once, through the top-level link"
        );
        assert!(store.rejected().is_empty(), "{:?}", store.rejected());

        std::fs::create_dir(root.join("..2026_02")).unwrap();
        std::fs::write(root.join("..2026_02/config.yaml"), docs(&[vs("a", "a")])).unwrap();
        symlink("..2026_02", root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        std::fs::remove_dir_all(root.join("..2026_01")).unwrap();
        assert_eq!(
            next_push(&mut rx, "swapped").await,
            keys(&[(ConfigKind::DestinationRule, "a")])
        );
        task.abort();
    }

    #[tokio::test]
    async fn an_empty_directory_is_synced_and_a_missing_one_fails_fast() {
        let dir = tempfile::tempdir().unwrap();
        let Running {
            store,
            mut rx,
            task,
            stop,
        } = start(dir.path());
        // Synced with nothing to push: the first file then arrives as a push.
        replace(&dir.path().join("late.yaml"), &vs("late", "late"));
        assert_eq!(
            next_push(&mut rx, "late file").await,
            keys(&[(ConfigKind::VirtualService, "late")])
        );
        assert!(store.has_synced());
        stop.send(()).unwrap();
        tokio::time::timeout(WAIT, task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(pushed(&mut rx).is_none());

        let (sink, _rx) = sink();
        let store = FileConfigStore::new(sink);
        let err = run_config_dir(
            dir.path().join("nope"),
            store.clone(),
            DEFAULT_MAX_FILE_SIZE,
            async {},
        )
        .await
        .unwrap_err();
        assert!(matches!(err, WatchError::DirMissing { .. }), "{err}");
        assert!(!store.has_synced());
    }

    #[tokio::test]
    async fn changes_announce_every_reload_and_entries_are_not_pushed() {
        let dir = tempfile::tempdir().unwrap();
        let se = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: se, namespace: ns}\nspec:\n  hosts: [a.example.com]\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  resolution: DNS\n";
        std::fs::write(dir.path().join("se.yaml"), se).unwrap();
        let (sink, mut rx) = sink();
        let store = FileConfigStore::new(sink);
        let mut changes = store.changes().expect("the file store notifies");
        let task = tokio::spawn(run_config_dir(
            dir.path().to_path_buf(),
            store.clone(),
            DEFAULT_MAX_FILE_SIZE,
            std::future::pending(),
        ));
        tokio::time::timeout(WAIT, changes.wait_for(|&g| g >= 2))
            .await
            .unwrap()
            .unwrap();
        assert!(store.has_synced());
        assert_eq!(names(&store), ["ServiceEntry se"]);
        assert_eq!(
            pushed(&mut rx),
            None,
            "the ServiceEntry is not pushed as config"
        );
        let seen = *changes.borrow_and_update();

        replace(
            &dir.path().join("we.yaml"),
            "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: we, namespace: ns}\nspec: {address: 10.0.0.1}\n",
        );
        tokio::time::timeout(WAIT, changes.wait_for(|&g| g > seen))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(store.list(Kind::WorkloadEntry).len(), 1);
        replace(&dir.path().join("vs.yaml"), &vs("a", "a"));
        assert_eq!(
            next_push(&mut rx, "virtual service").await,
            keys(&[(ConfigKind::VirtualService, "a")]),
            "only the VirtualService is pushed"
        );
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreadable_file_keeps_its_objects_and_is_read_again_with_backoff() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        let small = vs("a", "a");
        std::fs::write(&file, &small).unwrap();
        let (sink, _rx) = sink();
        let store = FileConfigStore::new(sink);
        let limit = small.len() as u64 + 10;
        let mut r = Reloader::new(dir.path().to_path_buf(), store.clone(), limit);
        assert_eq!(r.reload().await, None);
        assert_eq!(names(&store), ["VirtualService a"]);

        // Over the size limit: refused (not read), the object stays, re-read with backoff.
        std::fs::write(&file, docs(&[vs("a", "a"), vs("b", "b")])).unwrap();
        assert_eq!(r.reload().await, Some(Duration::from_millis(100)));
        assert_eq!(r.reload().await, Some(Duration::from_millis(200)));
        assert_eq!(names(&store), ["VirtualService a"]);
        assert_eq!(store.status().read_retries.load(Ordering::Relaxed), 2);
        let rejected = store.rejected();
        assert!(
            rejected.iter().any(|r| {
                let line = r.to_string();
                line.contains("a.yaml")
                    && line.contains(&format!("larger than the size limit of {limit} bytes"))
                    && line.contains("--maxConfigFileSize")
            }),
            "{rejected:?}"
        );

        // Readable again: applied, and no more retries.
        std::fs::write(&file, vs("c", "c")).unwrap();
        assert_eq!(r.reload().await, None);
        assert_eq!(names(&store), ["VirtualService c"]);
        // The backoff started over.
        std::fs::write(&file, "x".repeat(limit as usize + 1)).unwrap();
        assert_eq!(r.reload().await, Some(Duration::from_millis(100)));
        assert_eq!(names(&store), ["VirtualService c"]);
    }
}

/// First-seen creation times of objects without `metadata.creationTimestamp`.
#[cfg(test)]
mod first_seen_tests {
    use super::*;
    use crate::config::store::test_support::sink;
    use std::time::Duration;

    fn vs(name: &str, host: &str, created: Option<&str>) -> String {
        let created = created
            .map(|t| format!(", creationTimestamp: \"{t}\""))
            .unwrap_or_default();
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: ns{created}}}\nspec:\n  hosts: [{host}]\n  http:\n  - route:\n    - destination: {{host: {host}}}\n"
        )
    }

    fn created(store: &FileConfigStore, name: &str) -> Option<SystemTime> {
        store
            .list(Kind::VirtualService)
            .iter()
            .find(|o| o.name == name)
            .map(|o| o.creation_time)
    }

    #[tokio::test]
    async fn objects_without_a_timestamp_keep_the_time_first_seen_across_edits() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("vs.yaml");
        let (sink, _rx) = sink();
        let store = FileConfigStore::new(sink);
        let mut reloader = Reloader::new(
            dir.path().to_path_buf(),
            store.clone(),
            crate::read::DEFAULT_MAX_FILE_SIZE,
        );

        let before = SystemTime::now();
        std::fs::write(
            &file,
            [
                vs("a", "a.example.com", None),
                vs("dated", "d.example.com", Some("2020-01-02T03:04:05Z")),
            ]
            .join("---\n"),
        )
        .unwrap();
        reloader.reload().await;
        let after = SystemTime::now();
        let a = created(&store, "a").unwrap();
        assert!(before <= a && a <= after, "first seen during the reload");
        let dated = UNIX_EPOCH + Duration::from_secs(1_577_934_245);
        assert_eq!(
            created(&store, "dated"),
            Some(dated),
            "a given time is kept"
        );

        // An edit (new spec) and a new object in another file: `a` keeps its time.
        std::fs::write(&file, vs("a", "edited.example.com", None)).unwrap();
        std::fs::write(dir.path().join("b.yaml"), vs("b", "b.example.com", None)).unwrap();
        reloader.reload().await;
        assert_eq!(created(&store, "a"), Some(a));
        let edited = &store.list(Kind::VirtualService)[0];
        assert!(
            matches!(&edited.spec, crate::config::model::Spec::VirtualService(v)
                if v.hosts == ["edited.example.com"]),
            "the edit is in force: {edited:?}"
        );
        let b = created(&store, "b").unwrap();
        assert!(b >= a && b != UNIX_EPOCH);
        assert_eq!(created(&store, "dated"), None, "removed with the edit");
    }

    #[test]
    fn stamping_keeps_known_times_and_gives_new_objects_now() {
        let t = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        let placed = |name: &str, created: SystemTime| {
            let mut obj = ConfigObject::new(
                "ns",
                name,
                crate::config::model::Spec::VirtualService(Default::default()),
            );
            obj.creation_time = created;
            (
                obj.id(),
                Placed {
                    obj: Arc::new(obj),
                    file: PathBuf::from("x.yaml"),
                },
            )
        };
        let previous: BTreeMap<ObjectId, Placed> = [placed("kept", t(100)), placed("given", t(5))]
            .into_iter()
            .collect();
        let mut now: BTreeMap<ObjectId, Placed> = [
            placed("kept", UNIX_EPOCH),
            placed("given", t(7)),
            placed("new", UNIX_EPOCH),
        ]
        .into_iter()
        .collect();
        stamp_first_seen(&mut now, &previous, t(200));
        let times: Vec<(String, SystemTime)> = now
            .values()
            .map(|p| (p.obj.name.clone(), p.obj.creation_time))
            .collect();
        assert_eq!(
            times,
            [
                ("given".to_string(), t(7)),
                ("kept".to_string(), t(100)),
                ("new".to_string(), t(200)),
            ]
        );

        // Deleted, then added again: new.
        let mut again: BTreeMap<ObjectId, Placed> =
            [placed("kept", UNIX_EPOCH)].into_iter().collect();
        stamp_first_seen(&mut again, &BTreeMap::new(), t(300));
        assert_eq!(again.values().next().unwrap().obj.creation_time, t(300));
    }
}

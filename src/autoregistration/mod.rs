//! WorkloadEntry auto-registration and health (Istio's `pilot/pkg/autoregistration`).
//!
//! A proxy that connects with `ISTIO_META_AUTO_REGISTER_GROUP` gets a WorkloadEntry
//! made from that WorkloadGroup's template and its own IP, network, locality and
//! labels ([`entry::entry_from_group`], named `<group>-<ip>[-<network>]`). The entry
//! records which instance holds the connection (`istio.io/workloadController`,
//! `istio.io/connectedAt`); when the last connection of the workload to this
//! instance ends, the entry is marked disconnected (`istio.io/disconnectedAt`, only by
//! the instance that holds it, and only for the connection it last recorded) and
//! deleted once the grace period (`--workloadEntryGracePeriod`, Istio's
//! `PILOT_WORKLOAD_ENTRY_GRACE_PERIOD`) passes without a reconnection. A periodic
//! sweep (every ten grace periods) removes what a stopped instance left behind:
//! disconnected entries past the grace period, and entries still marked connected
//! for longer than 1.5 × the maximum connection age. The annotations live on the
//! entry, so the sweep works after every replica restarted.
//!
//! A proxy that connects with `WORKLOAD_ENTRY` naming an existing entry annotated
//! `proxy.istio.io/health-checks-enabled` gets the same connection bookkeeping
//! without creation or deletion; when it does not come back, its `Healthy`
//! condition is removed instead.
//!
//! Health reports (`istio.io/health` requests, [`health`]) set the entry's `Healthy`
//! condition; the ServiceEntry registry leaves an unhealthy entry out of EDS.
//!
//! The ADS server tells the controller about connections through
//! [`crate::ads::WorkloadHooks`]; entries are read and written through an
//! [`store::EntryStore`] (the API server in Kubernetes, the in-memory config store
//! otherwise). Writes that fail are retried with backoff (5 ms doubling, five
//! attempts, as Istio's queue).

pub mod entry;
pub mod health;
pub mod metrics;
pub mod store;
mod task;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use meshfed_registry::config::ConfigObject;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, error, info};

use crate::ads::WorkloadHooks;
use crate::model::Proxy;
use entry::{
    ANNOTATION_CONNECTED_AT, ANNOTATION_CONTROLLER, ANNOTATION_DISCONNECTED_AT, Workload,
    WorkloadKey, annotation_time, entry_from_group, entry_name, format_time, set_connected,
    takes_health_reports,
};
use health::HealthEvent;
pub use metrics::AutoRegistrationMetrics;
use store::{EntryStore, Groups};

/// Istio's `PILOT_WORKLOAD_ENTRY_GRACE_PERIOD` default.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(10);
/// Attempts of a failed write (Istio's `maxRetries`).
const MAX_ATTEMPTS: u32 = 5;
/// The first retry delay; doubled on each attempt.
const RETRY_BASE: Duration = Duration::from_millis(5);
/// Deletions by the cleanup are paced to this many a second (Istio's limiter).
const CLEANUPS_PER_SECOND: u32 = 20;

/// What the controller does (Istio's feature flags and timings).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Create entries for proxies that name a WorkloadGroup
    /// (`PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION`).
    pub auto_registration: bool,
    /// Take health reports (`PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS`).
    pub health_checks: bool,
    /// How long a disconnected workload's entry is kept.
    pub grace_period: Duration,
    /// The server's maximum connection age (`None`: unbounded); an entry marked
    /// connected for longer than 1.5 times it is swept.
    pub max_connection_age: Option<Duration>,
    /// Require the proxy's verified identity to match the entry's namespace and
    /// service account (Istio's `ValidateWorkloadEntryIdentity`, on by default; a
    /// stream on the plaintext port carries no identity, so its proxy cannot register
    /// unless this is off).
    pub validate_identity: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            auto_registration: true,
            health_checks: true,
            grace_period: DEFAULT_GRACE_PERIOD,
            max_connection_age: None,
            validate_identity: true,
        }
    }
}

/// Why a connecting proxy was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The WorkloadGroup it names does not exist (gRPC `FailedPrecondition`).
    #[error(
        "auto-registration WorkloadEntry of {proxy} failed: cannot find WorkloadGroup {namespace}/{group}"
    )]
    NoGroup {
        /// The proxy.
        proxy: String,
        /// The namespace.
        namespace: String,
        /// The group.
        group: String,
    },
    /// `WORKLOAD_ENTRY` names an entry that does not exist.
    #[error(
        "proxy metadata indicates that it must correspond to an existing WorkloadEntry, however WorkloadEntry {0} is not found"
    )]
    NoEntry(String),
    /// The proxy's identity may not control the entry.
    #[error("{0}")]
    Identity(String),
    /// A write failed.
    #[error("{0}")]
    Write(String),
}

impl RegisterError {
    /// The status the stream ends with (Istio's: `FailedPrecondition` for a missing
    /// group, `Unknown` for the plain errors).
    pub fn status(&self) -> tonic::Status {
        match self {
            RegisterError::NoGroup { .. } => tonic::Status::failed_precondition(self.to_string()),
            _ => tonic::Status::unknown(self.to_string()),
        }
    }
}

/// A connection whose workload has an entry.
#[derive(Clone, Debug)]
struct Registered {
    workload: Workload,
    entry: String,
    auto_created: bool,
    connected_at: SystemTime,
}

/// Work for the controller's task, due at a time.
#[derive(Debug)]
enum Work {
    /// Mark the entry disconnected (a retry).
    Unregister(Unregister, u32),
    /// Write a health condition.
    Health(HealthWork, u32),
    /// The grace period of a disconnected entry is over: delete it unless it came
    /// back.
    Cleanup { namespace: String, name: String },
}

#[derive(Clone, Debug)]
struct Unregister {
    registered: Registered,
    disconnected_at: SystemTime,
}

#[derive(Clone, Debug)]
struct HealthWork {
    proxy: String,
    namespace: String,
    entry: String,
    condition: meshfed_registry::config::Condition,
}

/// The WorkloadEntry controller of one instance.
#[derive(Debug)]
pub struct Controller {
    instance: String,
    store: Arc<dyn EntryStore>,
    groups: Groups,
    settings: Settings,
    /// Live registered connections: by workload, then connection id.
    by_workload: Mutex<HashMap<WorkloadKey, BTreeMap<String, Registered>>>,
    /// Connection id -> workload, for the hooks that name only the connection.
    by_connection: Mutex<HashMap<String, WorkloadKey>>,
    work: mpsc::UnboundedSender<(Instant, Work)>,
    work_rx: Mutex<Option<mpsc::UnboundedReceiver<(Instant, Work)>>>,
    metrics: Arc<AutoRegistrationMetrics>,
    /// Wall-clock and tokio time when the controller was made: its clock follows
    /// tokio's from there, so tests with a paused clock see time pass as it does.
    epoch: (SystemTime, Instant),
}

impl Controller {
    /// A controller writing as `instance` (the pod name), reading groups from `groups`.
    pub fn new(
        instance: impl Into<String>,
        store: Arc<dyn EntryStore>,
        groups: Groups,
        settings: Settings,
        metrics: Arc<AutoRegistrationMetrics>,
    ) -> Arc<Controller> {
        let (work, work_rx) = mpsc::unbounded_channel();
        Arc::new(Controller {
            instance: instance.into(),
            store,
            groups,
            settings,
            by_workload: Mutex::default(),
            by_connection: Mutex::default(),
            work,
            work_rx: Mutex::new(Some(work_rx)),
            metrics,
            epoch: (SystemTime::now(), Instant::now()),
        })
    }

    /// This instance's name in `istio.io/workloadController`.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The controller's clock.
    pub fn now(&self) -> SystemTime {
        self.epoch.0 + (Instant::now() - self.epoch.1)
    }

    /// Whether this instance holds the entry's connection.
    pub fn is_controller_of(&self, entry: &ConfigObject) -> bool {
        entry
            .annotations
            .get(ANNOTATION_CONTROLLER)
            .map(String::as_str)
            == Some(self.instance.as_str())
    }

    // === connect ===

    /// A proxy connected at `connected_at` on connection `connection` (Istio's
    /// `OnConnect`). A proxy that names a group gets its entry created or marked
    /// connected to this instance; one that names an entry to report health for gets
    /// it marked connected. Anything else is left alone.
    pub async fn on_connect(
        &self,
        connection: &str,
        workload: Workload,
        connected_at: SystemTime,
    ) -> Result<(), RegisterError> {
        let (entry, auto_created) = if self.settings.auto_registration && !workload.group.is_empty()
        {
            match entry_name(&workload) {
                Ok(Some(name)) => (name, true),
                Ok(None) => return Ok(()),
                Err(e) => {
                    error!("{e}");
                    return Ok(());
                }
            }
        } else if self.settings.health_checks && !workload.workload_entry.is_empty() {
            let Some(existing) = self
                .store
                .entry(&workload.namespace, &workload.workload_entry)
            else {
                return Err(RegisterError::NoEntry(format!(
                    "{}/{}",
                    workload.namespace, workload.workload_entry
                )));
            };
            if !takes_health_reports(&existing) {
                return Ok(());
            }
            self.ensure_can_control(&workload, &existing)?;
            (existing.name.clone(), false)
        } else {
            return Ok(());
        };
        let registered = Registered {
            workload: workload.clone(),
            entry: entry.clone(),
            auto_created,
            connected_at,
        };
        let key = workload.key();
        self.by_workload
            .lock()
            .expect("connections poisoned")
            .entry(key.clone())
            .or_default()
            .insert(connection.to_string(), registered);
        self.by_connection
            .lock()
            .expect("connections poisoned")
            .insert(connection.to_string(), key);
        let result = if auto_created {
            self.register(&entry, &workload, connected_at).await
        } else {
            match self.mark_connected(&entry, &workload, connected_at).await {
                Ok(true) => {
                    info!(
                        "updated health-checked WorkloadEntry {}/{entry}",
                        workload.namespace
                    );
                    Ok(())
                }
                Ok(false) => Ok(()),
                Err(e) => Err(e),
            }
        };
        if let Err(e) = &result {
            error!("{e}");
            // The stream is refused: it never disconnects, so it is forgotten now.
            self.forget(connection);
        }
        result
    }

    /// Drops a connection from the bookkeeping; the workload it left, if it was its
    /// last connection here.
    fn forget(&self, connection: &str) -> Option<Registered> {
        let key = self
            .by_connection
            .lock()
            .expect("connections poisoned")
            .remove(connection)?;
        let mut by_workload = self.by_workload.lock().expect("connections poisoned");
        let conns = by_workload.get_mut(&key)?;
        let registered = conns.remove(connection)?;
        if !conns.is_empty() {
            // Another connection of the workload is still here.
            return None;
        }
        by_workload.remove(&key);
        Some(registered)
    }

    /// Istio's `ensureProxyCanControlEntry`.
    fn ensure_can_control(
        &self,
        workload: &Workload,
        entry: &ConfigObject,
    ) -> Result<(), RegisterError> {
        if !self.settings.validate_identity {
            return Ok(());
        }
        let Some((namespace, account)) = &workload.identity else {
            return Err(RegisterError::Identity(
                "registration of WorkloadEntry requires a verified identity".into(),
            ));
        };
        if *namespace != entry.namespace {
            return Err(RegisterError::Identity(format!(
                "registration of WorkloadEntry namespace mismatch: {namespace:?} vs {:?}",
                entry.namespace
            )));
        }
        let wanted = entry
            .spec
            .as_workload_entry()
            .map(|we| we.service_account.as_str())
            .unwrap_or_default();
        if !wanted.is_empty() && account != wanted {
            return Err(RegisterError::Identity(format!(
                "registration of WorkloadEntry service account mismatch: {account:?} vs {wanted:?}"
            )));
        }
        Ok(())
    }

    /// Creates the entry of an auto-registering workload, or marks it connected.
    async fn register(
        &self,
        name: &str,
        workload: &Workload,
        connected_at: SystemTime,
    ) -> Result<(), RegisterError> {
        if let Some(existing) = self.store.entry(&workload.namespace, name) {
            self.ensure_can_control(workload, &existing)?;
            match self.mark_connected(name, workload, connected_at).await {
                Ok(true) => {
                    self.metrics.updates.inc();
                    info!(
                        "updated auto-registered WorkloadEntry {}/{name} as connected",
                        workload.namespace
                    );
                    return Ok(());
                }
                Ok(false) => return Ok(()),
                Err(e) => {
                    self.metrics.errors.inc();
                    return Err(e);
                }
            }
        }
        let Some(group) = self.groups.get(&workload.namespace, &workload.group) else {
            self.metrics.errors.inc();
            return Err(RegisterError::NoGroup {
                proxy: workload.node_id.clone(),
                namespace: workload.namespace.clone(),
                group: workload.group.clone(),
            });
        };
        let mut entry = entry_from_group(name, workload, &group);
        self.ensure_can_control(workload, &entry)?;
        set_connected(&mut entry, &self.instance, connected_at);
        let health_checked = takes_health_reports(&entry);
        if let Err(e) = self.store.create(entry).await {
            self.metrics.errors.inc();
            return Err(RegisterError::Write(format!(
                "auto-registration WorkloadEntry of {} failed: error creating WorkloadEntry: {e}",
                workload.node_id
            )));
        }
        self.metrics.success.inc();
        info!(
            "auto-registered WorkloadEntry {}/{name}{}",
            workload.namespace,
            if health_checked {
                " with health checking enabled"
            } else {
                ""
            }
        );
        Ok(())
    }

    /// Istio's `changeWorkloadEntryStateToConnected`: `Ok(false)` when a newer
    /// connect or disconnect is already recorded.
    async fn mark_connected(
        &self,
        name: &str,
        workload: &Workload,
        connected_at: SystemTime,
    ) -> Result<bool, RegisterError> {
        let Some(current) = self.store.entry(&workload.namespace, name) else {
            return Err(RegisterError::Write(format!(
                "failed updating WorkloadEntry {}/{name}: WorkloadEntry not found",
                workload.namespace
            )));
        };
        if current.annotations.contains_key(ANNOTATION_DISCONNECTED_AT)
            && annotation_time(&current, ANNOTATION_DISCONNECTED_AT)
                .is_some_and(|d| connected_at < d)
        {
            return Ok(false);
        }
        if annotation_time(&current, ANNOTATION_CONNECTED_AT).is_some_and(|c| connected_at < c) {
            return Ok(false);
        }
        let mut next = (*current).clone();
        set_connected(&mut next, &self.instance, connected_at);
        self.store.update(next).await.map_err(|e| {
            RegisterError::Write(format!(
                "failed updating WorkloadEntry {}/{name} err: {e}",
                workload.namespace
            ))
        })?;
        Ok(true)
    }

    // === disconnect ===

    /// Connection `connection` ended (Istio's `OnDisconnect`): when it was the
    /// workload's last one here, its entry is marked disconnected now (retried in
    /// the background on failure) and checked again after the grace period.
    pub async fn on_disconnect(&self, connection: &str) {
        let Some(registered) = self.forget(connection) else {
            return;
        };
        let item = Unregister {
            registered,
            disconnected_at: self.now(),
        };
        self.unregister(item, 1).await;
    }

    /// One attempt at marking an entry disconnected.
    async fn unregister(&self, item: Unregister, attempt: u32) {
        match self.mark_disconnected(&item).await {
            Ok(false) => {}
            Ok(true) => {
                let r = &item.registered;
                info!(
                    "updated auto-registered WorkloadEntry {}/{} as disconnected",
                    r.workload.namespace, r.entry
                );
                if r.auto_created {
                    self.metrics.unregister.inc();
                }
                self.schedule(
                    self.settings.grace_period,
                    Work::Cleanup {
                        namespace: r.workload.namespace.clone(),
                        name: r.entry.clone(),
                    },
                );
            }
            Err(e) => {
                self.metrics.errors.inc();
                if attempt < MAX_ATTEMPTS {
                    debug!("{e}; retrying");
                    self.schedule(retry_delay(attempt), Work::Unregister(item, attempt + 1));
                } else {
                    error!("{e}; giving up after {MAX_ATTEMPTS} attempts");
                }
            }
        }
    }

    /// Istio's `changeWorkloadEntryStateToDisconnected`: `Ok(false)` when the entry
    /// has moved on (a newer connection, another instance).
    async fn mark_disconnected(&self, item: &Unregister) -> Result<bool, String> {
        let r = &item.registered;
        let namespace = &r.workload.namespace;
        let Some(current) = self.store.entry(namespace, &r.entry) else {
            return Err(format!(
                "workloadentry {namespace}/{} is not found",
                r.entry
            ));
        };
        let connected = annotation_time(&current, ANNOTATION_CONNECTED_AT);
        if connected.is_some_and(|c| c > r.connected_at) {
            return Ok(false);
        }
        if !self.is_controller_of(&current) {
            return Ok(false);
        }
        if connected.is_some_and(|c| item.disconnected_at < c) {
            return Ok(false);
        }
        let mut next = (*current).clone();
        next.annotations.remove(ANNOTATION_CONNECTED_AT);
        next.annotations.insert(
            ANNOTATION_DISCONNECTED_AT.to_string(),
            format_time(item.disconnected_at),
        );
        self.store.update(next).await.map_err(|e| {
            format!(
                "disconnect: failed updating WorkloadEntry {namespace}/{}: {e}",
                r.entry
            )
        })?;
        Ok(true)
    }

    // === health ===

    /// A health report on connection `connection` (Istio's
    /// `QueueWorkloadEntryHealth`): written by the controller's task.
    pub fn on_health(&self, connection: &str, event: HealthEvent) {
        if !self.settings.health_checks {
            return;
        }
        let registered = {
            let key = self
                .by_connection
                .lock()
                .expect("connections poisoned")
                .get(connection)
                .cloned();
            key.and_then(|key| {
                self.by_workload
                    .lock()
                    .expect("connections poisoned")
                    .get(&key)
                    .and_then(|c| c.get(connection).cloned())
            })
        };
        let Some(r) = registered else {
            error!("unable to derive WorkloadEntry for health update for {connection}");
            return;
        };
        let work = HealthWork {
            proxy: r.workload.node_id.clone(),
            namespace: r.workload.namespace.clone(),
            entry: r.entry.clone(),
            condition: health::condition(&event, self.now()),
        };
        self.schedule(Duration::ZERO, Work::Health(work, 1));
    }

    async fn write_health(&self, work: HealthWork, attempt: u32) {
        let result = health::update_health(
            &*self.store,
            |e| self.is_controller_of(e),
            &work.proxy,
            &work.namespace,
            &work.entry,
            work.condition.clone(),
        )
        .await;
        if let Err(e) = result {
            if attempt < MAX_ATTEMPTS {
                debug!("{e}; retrying");
                self.schedule(retry_delay(attempt), Work::Health(work, attempt + 1));
            } else {
                error!("{e}; giving up after {MAX_ATTEMPTS} attempts");
            }
        }
    }

    fn schedule(&self, after: Duration, work: Work) {
        // The receiver is gone only after shutdown.
        let _ = self.work.send((Instant::now() + after, work));
    }
}

fn retry_delay(attempt: u32) -> Duration {
    RETRY_BASE * 2u32.saturating_pow(attempt.saturating_sub(1))
}

// === impl WorkloadHooks ===

impl WorkloadHooks for Controller {
    fn connected<'a>(
        &'a self,
        connection: &'a str,
        proxy: &'a Proxy,
    ) -> BoxFuture<'a, Result<(), tonic::Status>> {
        let named = |key: &str| {
            proxy
                .metadata
                .get(key)
                .and_then(|v| v.as_str())
                .is_some_and(|v| !v.is_empty())
        };
        if !named("AUTO_REGISTER_GROUP") && !named("WORKLOAD_ENTRY") {
            // Neither a VM that registers nor one that reports health: nothing to do
            // (most proxies; no bookkeeping either).
            return Box::pin(std::future::ready(Ok(())));
        }
        Box::pin(async move {
            let connected_at = self.now();
            self.on_connect(connection, Workload::of(proxy), connected_at)
                .await
                .map_err(|e| e.status())
        })
    }

    fn disconnected<'a>(&'a self, connection: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(self.on_disconnect(connection))
    }

    fn health(&self, connection: &str, error: Option<&str>) {
        self.on_health(connection, HealthEvent::from_error_detail(error));
    }
}

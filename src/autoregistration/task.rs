//! The controller's task: retries of failed writes, the grace-period check of each
//! disconnected entry, health writes, late registrations when a WorkloadGroup
//! appears, and the periodic sweep of entries nobody will come back for (Istio's
//! `periodicWorkloadEntryCleanup`, `shouldCleanupEntry`, `cleanupEntry`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use meshfed_registry::config::ConfigObject;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::entry::{
    self, ANNOTATION_CONNECTED_AT, ANNOTATION_DISCONNECTED_AT, annotation_time, is_auto_registered,
    is_health_checked,
};
use super::health;
use super::store::WriteError;
use super::{CLEANUPS_PER_SECOND, Controller, Registered, Work};
use crate::drain::Shutdown;

impl Controller {
    // === cleanup ===

    /// Istio's `shouldCleanupEntry`.
    fn should_clean_up(&self, entry: &ConfigObject) -> bool {
        let health_checked = is_health_checked(entry) && entry::has_health_condition(entry);
        if !is_auto_registered(entry) && !health_checked {
            return false;
        }
        let now = self.now();
        if entry.annotations.contains_key(ANNOTATION_CONNECTED_AT) {
            // A workload and its instance that stopped together leave an entry marked
            // connected: swept once older than the longest a connection lives.
            let Some(limit) = self.settings.max_connection_age.map(|a| a + a / 2) else {
                return false;
            };
            return annotation_time(entry, ANNOTATION_CONNECTED_AT)
                .and_then(|c| now.duration_since(c).ok())
                .is_some_and(|age| age > limit);
        }
        if !entry.annotations.contains_key(ANNOTATION_DISCONNECTED_AT) {
            return false;
        }
        match annotation_time(entry, ANNOTATION_DISCONNECTED_AT) {
            Some(at) => now
                .duration_since(at)
                .is_ok_and(|gone| gone >= self.settings.grace_period),
            None => true,
        }
    }

    /// Deletes an auto-registered entry, or drops the health condition of another.
    async fn clean_up(&self, entry: &ConfigObject, periodic: bool) {
        let (namespace, name) = (&entry.namespace, &entry.name);
        if is_auto_registered(entry) {
            match self
                .store
                .delete(namespace, name, &entry.resource_version)
                .await
            {
                Ok(()) | Err(WriteError::NotFound) => {
                    self.metrics.deletes.inc();
                    info!(
                        "cleaned up auto-registered WorkloadEntry {namespace}/{name} periodic:{periodic}"
                    );
                }
                Err(e) => {
                    warn!(
                        "failed cleaning up auto-registered WorkloadEntry {namespace}/{name}: {e}"
                    );
                    self.metrics.errors.inc();
                }
            }
        } else if is_health_checked(entry) && entry::has_health_condition(entry) {
            match health::delete_health_condition(&*self.store, entry).await {
                Ok(()) => info!(
                    "cleaned up health-checked WorkloadEntry {namespace}/{name} periodic:{periodic}"
                ),
                Err(e) => {
                    warn!("failed cleaning up health-checked WorkloadEntry {namespace}/{name}: {e}")
                }
            }
        }
    }

    /// Every entry past its time (Istio's `periodicWorkloadEntryCleanup`), paced.
    async fn sweep(&self) {
        let pace = Duration::from_secs(1) / CLEANUPS_PER_SECOND;
        let mut first = true;
        for entry in self.store.entries() {
            if self.should_clean_up(&entry) {
                if !first {
                    tokio::time::sleep(pace).await;
                }
                first = false;
                self.clean_up(&entry, true).await;
            }
        }
    }

    /// Workloads connected to this instance under a group that just appeared (or
    /// changed) get their entries back if they have none (Istio's late registration:
    /// the group was created after they connected, or deleted and created again).
    async fn register_late(&self, namespace: &str, group: &str) {
        let waiting: Vec<Registered> = self
            .by_workload
            .lock()
            .expect("connections poisoned")
            .iter()
            .filter(|(k, _)| k.namespace == namespace && k.group == group)
            .flat_map(|(_, conns)| conns.values().cloned())
            .collect();
        for r in waiting {
            if self.store.entry(namespace, &r.entry).is_some() {
                continue;
            }
            debug!(instance = %self.instance, "processing WorkloadGroup add for {namespace}/{group}");
            if let Err(e) = self.register(&r.entry, &r.workload, r.connected_at).await {
                error!("{e}");
            }
        }
    }

    // === the task ===

    /// Runs retries, grace-period checks, health writes, late registrations and the
    /// periodic sweep until `shutdown`. Only one run per controller.
    pub async fn run(self: Arc<Self>, mut shutdown: Shutdown) {
        let Some(mut rx) = self.work_rx.lock().expect("work poisoned").take() else {
            return;
        };
        let mut due: BinaryHeap<Reverse<(Instant, u64, usize)>> = BinaryHeap::new();
        let mut pending: HashMap<usize, Work> = HashMap::new();
        let mut seq = 0u64;
        let sweep_every = (self.settings.grace_period * 10).max(Duration::from_millis(1));
        let mut sweep = tokio::time::interval_at(Instant::now() + sweep_every, sweep_every);
        let mut group_changes = self.groups.changes();
        let mut known_groups = self.groups.versions();
        loop {
            let next_due = due.peek().map(|Reverse((at, _, _))| *at);
            let groups_changed = async {
                if group_changes.is_empty() {
                    return std::future::pending().await;
                }
                let changed = group_changes.iter_mut().map(|rx| Box::pin(rx.changed()));
                let _ = futures::future::select_all(changed).await;
            };
            tokio::select! {
                () = shutdown.wait() => return,
                received = rx.recv() => match received {
                    Some((at, work)) => {
                        seq += 1;
                        let id = seq as usize;
                        pending.insert(id, work);
                        due.push(Reverse((at, seq, id)));
                    }
                    None => return,
                },
                () = sleep_until(next_due) => {
                    let Some(Reverse((_, _, id))) = due.pop() else { continue };
                    if let Some(work) = pending.remove(&id) {
                        self.perform(work).await;
                    }
                }
                _ = sweep.tick() => self.sweep().await,
                () = groups_changed => {
                    let now = self.groups.versions();
                    for (key, version) in &now {
                        if !known_groups.get(key).is_some_and(|k| Arc::ptr_eq(k, version)) {
                            self.register_late(&key.0, &key.1).await;
                        }
                    }
                    known_groups = now;
                }
            }
        }
    }

    async fn perform(&self, work: Work) {
        match work {
            Work::Unregister(item, attempt) => self.unregister(item, attempt).await,
            Work::Health(work, attempt) => self.write_health(work, attempt).await,
            Work::Cleanup { namespace, name } => {
                if let Some(entry) = self.store.entry(&namespace, &name)
                    && self.should_clean_up(&entry)
                {
                    self.clean_up(&entry, false).await;
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

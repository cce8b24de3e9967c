//! When the server is ready, by Istio's rule: the local registries and the config
//! sources must have synced; remote clusters present at start are waited for, each at
//! most `--remoteClusterTimeout` after the server started; and once ready, the server
//! stays ready. A remote cluster added, replaced, failing or removed later never makes
//! `/ready` fail nor refuses an ADS stream: its state shows in `/debug/clusterz` and in
//! `istiod_remote_cluster_sync_status`.
//!
//! Like istiod, which is ready only once its initial push context is built, the server
//! turns ready only after a snapshot built from the synced sources is in place
//! ([`Readiness::with_first_snapshot`]): a proxy that connects at the first moment
//! `/ready` answers 200 gets every service the registries held when they synced.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use meshfed_registry::config::ConfigStore;
use meshfed_registry::source::SourceReadiness;
use meshfed_registry::{Aggregate, ClusterId, ProviderId};
use tokio::time::Instant;
use tracing::info;

/// The readiness of one server.
#[derive(Debug)]
pub struct Readiness {
    aggregate: Arc<Aggregate>,
    stores: Vec<Arc<dyn ConfigStore>>,
    /// What the registry sources wait for beyond their registries (the remote-cluster
    /// Secrets and the clusters they name).
    gates: Vec<Arc<dyn SourceReadiness>>,
    local_cluster: ClusterId,
    started: Instant,
    remote_timeout: Duration,
    ready: AtomicBool,
    /// Sources beyond registries and config stores, with their synced flags (the mesh
    /// ConfigMap).
    others: Vec<(String, Arc<AtomicBool>)>,
    /// Fires when the server starts draining: not ready from then on.
    draining: Option<crate::drain::Shutdown>,
    /// Set once a snapshot built after everything else synced is in place.
    first_snapshot: Option<Arc<AtomicBool>>,
}

/// What readiness says while the sources have synced but the snapshot built from them
/// is not in place yet.
pub const FIRST_SNAPSHOT: &str = "the first snapshot of the synced registries and config";

impl Readiness {
    /// Readiness of a server that starts now, waiting for `aggregate`'s registries,
    /// `stores` and the sources' own `gates`.
    pub fn new(
        aggregate: Arc<Aggregate>,
        stores: Vec<Arc<dyn ConfigStore>>,
        gates: impl IntoIterator<Item = Arc<dyn SourceReadiness>>,
        local_cluster: ClusterId,
        remote_timeout: Duration,
    ) -> Self {
        Readiness {
            aggregate,
            stores,
            gates: gates.into_iter().collect(),
            local_cluster,
            started: Instant::now(),
            remote_timeout,
            ready: AtomicBool::new(false),
            others: Vec::new(),
            draining: None,
            first_snapshot: None,
        }
    }

    /// Not ready once `draining` fires (the server is shutting down).
    pub fn draining_on(mut self, draining: crate::drain::Shutdown) -> Self {
        self.draining = Some(draining);
        self
    }

    /// Also waits for `what` until `synced` is set.
    pub fn also_wait_for(mut self, what: impl Into<String>, synced: Arc<AtomicBool>) -> Self {
        self.others.push((what.into(), synced));
        self
    }

    /// Also waits, once everything else has synced, until `built` is set: by whoever
    /// builds a snapshot after [`Readiness::sources_synced`] turned true.
    pub fn with_first_snapshot(mut self, built: Arc<AtomicBool>) -> Self {
        self.first_snapshot = Some(built);
        self
    }

    /// Whether every source has synced (the first snapshot aside): the moment to build
    /// the snapshot that makes the server ready.
    pub fn sources_synced(&self) -> bool {
        self.ready.load(Ordering::Acquire) || self.pending_sources().is_empty()
    }

    /// True once the server is ready; never false again after that.
    pub fn is_ready(&self) -> bool {
        self.pending().is_empty()
    }

    /// What readiness still waits for (empty once ready).
    pub fn pending(&self) -> Vec<String> {
        if self.draining.as_ref().is_some_and(|d| d.is_triggered()) {
            return vec!["draining: the server is shutting down".to_string()];
        }
        if self.ready.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut pending = self.pending_sources();
        if pending.is_empty()
            && let Some(built) = &self.first_snapshot
            && !built.load(Ordering::Acquire)
        {
            pending.push(FIRST_SNAPSHOT.to_string());
        }
        if pending.is_empty() && !self.ready.swap(true, Ordering::AcqRel) {
            info!(
                after = ?self.started.elapsed(),
                "ready: local registries and config synced; from now on /ready stays 200 and remote clusters sync in the background"
            );
        }
        pending
    }

    /// What the sources still wait for.
    fn pending_sources(&self) -> Vec<String> {
        let waiting_for_remotes = self.started.elapsed() < self.remote_timeout;
        let mut pending = Vec::new();
        // Clusters named by remote-cluster Secrets; their registries are judged by the
        // start-up rule, not as local ones.
        let mut remote: BTreeSet<ClusterId> = BTreeSet::new();
        for gate in &self.gates {
            pending.extend(gate.pending(waiting_for_remotes));
            remote.extend(gate.remote_clusters());
        }
        for registry in self.aggregate.registries() {
            if registry.has_synced() {
                continue;
            }
            let is_remote = registry.provider() == ProviderId::Kubernetes
                && registry.cluster_id() != &self.local_cluster;
            if is_remote || remote.contains(registry.cluster_id()) {
                continue;
            }
            pending.push(registry.shard_key().to_string());
        }
        if self.stores.iter().any(|s| !s.has_synced()) {
            pending.push("config".to_string());
        }
        for (what, synced) in &self.others {
            if !synced.load(Ordering::Acquire) {
                pending.push(what.clone());
            }
        }
        pending
    }
}

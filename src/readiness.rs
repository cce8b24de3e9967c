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
    /// Builds the snapshot of the synced sources, once: by the first check that finds
    /// everything else synced (checks made meanwhile wait for it).
    first_snapshot: Option<FirstSnapshot>,
}

/// The build of the snapshot readiness waits for, and whether it is done.
struct FirstSnapshot {
    build: Box<dyn Fn() + Send + Sync>,
    built: std::sync::OnceLock<()>,
}

impl std::fmt::Debug for FirstSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FirstSnapshot")
            .field("built", &self.built.get().is_some())
            .finish_non_exhaustive()
    }
}

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

    /// Once everything else has synced, runs `build` (which builds a snapshot from the
    /// sources and swaps it in) before turning ready. The first check that finds the
    /// sources synced runs it; checks made meanwhile wait for it.
    pub fn with_first_snapshot(mut self, build: impl Fn() + Send + Sync + 'static) -> Self {
        self.first_snapshot = Some(FirstSnapshot {
            build: Box::new(build),
            built: std::sync::OnceLock::new(),
        });
        self
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
        let pending = self.pending_sources();
        if pending.is_empty()
            && let Some(first) = &self.first_snapshot
        {
            first.built.get_or_init(|| (first.build)());
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
        let unsynced: Vec<_> = self.stores.iter().filter(|s| !s.has_synced()).collect();
        // Config sources with an address of their own are named.
        pending.extend(unsynced.iter().filter_map(|s| {
            let status = s.source_status()?;
            Some(format!("config source {}", status["address"].as_str()?))
        }));
        if unsynced.iter().any(|s| s.source_status().is_none()) {
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

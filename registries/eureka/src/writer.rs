//! The writer task: the fetch loop and the only owner of the local copy of the Eureka
//! registry. Each round fetches (in full, or the delta then the hash-code check),
//! converts the applications that changed, publishes the reader view and tells the
//! push pipeline what changed.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use meshfed_registry::{
    ClusterId, Endpoint, Service, ServiceKey, ServiceRegistry, ShardKey, UpdateSink,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::api::{ApiError, EurekaClient};
use crate::apps::{Applied, LocalApps};
use crate::config::{EurekaConfig, Result};
use crate::convert::{self, Converted};
use crate::registry::{EurekaRegistry, FullReason, View};

/// Starting a registry is starting its writer task.
impl EurekaRegistry {
    /// Starts following the Eureka servers of `config` and returns the registry handle
    /// and the writer task, which runs until `shutdown` resolves.
    ///
    /// The first round fetches `apps` in full; nothing reaches `sink` until one
    /// succeeds, then every application is announced, every endpoint shard written and
    /// `sink.synced(Eureka/<cluster>)` sent. Every `fetch_interval` after that, the
    /// delta is applied and the local copy's reconcile hash code compared with the
    /// server's; a mismatch (or a refused delta) fetches everything again. Only
    /// changes are pushed: a new, changed or removed application is a full push, an
    /// instance change an incremental one for that hostname.
    ///
    /// Fails only for invalid settings. A failed round is retried after
    /// `retry_interval`, doubled per further failure up to `fetch_interval`; the
    /// registry keeps its last view and reports itself stale until a round succeeds,
    /// and the first round after a failure is a full fetch.
    pub fn start(
        config: EurekaConfig,
        sink: UpdateSink,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(Arc<EurekaRegistry>, JoinHandle<()>)> {
        config.validate()?;
        let client = EurekaClient::new(&config)?;
        let registry = Arc::new(EurekaRegistry::new(config));
        let writer = Writer {
            shard: registry.shard_key(),
            cluster: registry.cluster_id().clone(),
            registry: registry.clone(),
            client,
            sink,
            local: LocalApps::default(),
            published: BTreeMap::new(),
            rejected: BTreeSet::new(),
            synced: false,
            failures: 0,
            denied: false,
        };
        let task = tokio::spawn(writer.run(shutdown));
        Ok((registry, task))
    }
}

/// What is published for one application.
#[derive(Debug)]
struct AppState {
    key: ServiceKey,
    service: Arc<Service>,
    endpoints: Arc<[Endpoint]>,
    /// The last reports (skipped instances, invalid labels), to warn only on change.
    reports: Vec<String>,
}

struct Writer {
    registry: Arc<EurekaRegistry>,
    client: EurekaClient,
    sink: UpdateSink,
    shard: ShardKey,
    cluster: ClusterId,
    local: LocalApps,
    /// Application name (upper-cased) -> what is published for it.
    published: BTreeMap<String, AppState>,
    /// Application names that cannot be hostnames (warned about once).
    rejected: BTreeSet<String>,
    synced: bool,
    /// Failed rounds in a row.
    failures: u32,
    /// The last failure was a refusal (logged once per episode).
    denied: bool,
}

/// The delay before retry number `failures` (1-based): `base * 2^(failures-1)`,
/// capped at `max`.
pub fn backoff(base: Duration, max: Duration, failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    base.saturating_mul(factor).min(max.max(base))
}

impl Writer {
    async fn run(mut self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let config = self.registry.config.clone();
        info!(servers = ?config.server_urls(), shard = %self.shard, "eureka registry: fetching the registry");
        tokio::pin!(shutdown);
        loop {
            let result = self.round().await;
            self.registry
                .stats
                .failovers
                .store(self.client.failovers(), Ordering::Relaxed);
            let delay = match result {
                Ok(()) => {
                    self.recovered();
                    config.fetch_interval
                }
                Err(err) => {
                    self.failed(&err);
                    backoff(config.retry_interval, config.fetch_interval, self.failures)
                }
            };
            self.registry.stats.count_round();
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tokio::time::sleep_until(Instant::now() + delay) => {}
                _ = self.registry.fetch_now.notified() => {}
            }
        }
        debug!(shard = %self.shard, "eureka registry: stopped");
    }

    /// One fetch round; `Err` leaves the local copy as it was.
    async fn round(&mut self) -> Result<(), ApiError> {
        let stats = self.registry.stats.clone();
        // Eureka clients fetch an empty copy in full; after a failure the delta window
        // may have passed, so the copy is refreshed whole too.
        if self.local.is_empty() || self.failures > 0 {
            return self.full(FullReason::Initial).await;
        }
        let delta = match self.client.delta().await {
            Ok(delta) => delta,
            Err(err @ (ApiError::Status { .. } | ApiError::Denied { .. })) => {
                debug!(shard = %self.shard, "eureka: the delta was refused ({err}); fetching everything");
                return self.full(FullReason::DeltaRefused).await;
            }
            Err(err) => return Err(err),
        };
        let mut next = self.local.clone();
        let applied = next.apply_delta(&delta);
        let local_hash = next.hash_code();
        if delta.apps_hashcode.as_deref() != Some(local_hash.as_str()) {
            warn!(
                shard = %self.shard,
                client = %local_hash,
                server = delta.apps_hashcode.as_deref().unwrap_or("<none>"),
                "eureka: the reconcile hash codes differ after the delta; fetching the full registry"
            );
            return self.full(FullReason::HashMismatch).await;
        }
        stats.count_delta();
        self.local = next;
        self.apply(applied);
        Ok(())
    }

    async fn full(&mut self, reason: FullReason) -> Result<(), ApiError> {
        let full = self.client.applications().await?;
        self.registry.stats.count_full(reason);
        let (next, applied) = self.local.from_full(&full);
        if let Some(server_hash) = &full.apps_hashcode
            && *server_hash != next.hash_code()
        {
            debug!(shard = %self.shard, server = %server_hash, client = %next.hash_code(),
                "eureka: a full fetch with instances that could not be read");
        }
        self.local = next;
        self.apply(applied);
        Ok(())
    }

    fn failed(&mut self, err: &ApiError) {
        self.failures = self.failures.saturating_add(1);
        self.registry.stats.count_error(err);
        let denied = matches!(err, ApiError::Denied { .. });
        // A refusal is not an outage that passes by itself: an error of its own, once
        // per episode. Outages warn once, when the registry turns stale.
        if denied && !self.denied {
            error!(shard = %self.shard, "{err}; keeping the last known view");
        } else if !denied && self.failures == 1 {
            warn!(shard = %self.shard, "eureka fetch failed, keeping the last known view: {err}");
        } else {
            debug!(shard = %self.shard, failures = self.failures, "eureka fetch failed: {err}");
        }
        self.denied = denied;
        if !self.registry.view.set_stale(true) {
            warn!(shard = %self.shard, "eureka registry stale: serving the last known services and endpoints");
        }
    }

    fn recovered(&mut self) {
        self.failures = 0;
        if std::mem::take(&mut self.denied) {
            info!(shard = %self.shard, "eureka: the requests are accepted again");
        }
        if self.registry.view.set_stale(false) {
            info!(shard = %self.shard, "eureka registry fresh again");
        }
    }

    /// Converts the changed applications, publishes, and pushes what changed (or, at
    /// the first success, everything, then the sync).
    fn apply(&mut self, applied: Applied) {
        let stats = &self.registry.stats;
        stats.set_catalog(self.local.app_count(), self.local.instance_count());
        stats.count_skipped(applied.skipped.len(), 0);
        for reason in &applied.skipped {
            warn!(shard = %self.shard, "eureka: {reason}");
        }
        let config = self.registry.config.clone();
        let mut changed_services = Vec::new();
        let mut changed_endpoints = Vec::new();
        let mut deleted = Vec::new();
        for app in &applied.changed {
            let converted = self.local.instances(app).and_then(|instances| {
                let name = app.to_ascii_lowercase();
                match convert::check_app_name(&name) {
                    Ok(()) => {
                        self.rejected.remove(app);
                        Some(convert::convert_app(app, instances, &config, &self.cluster))
                    }
                    Err(why) => {
                        if self.rejected.insert(app.clone()) {
                            stats.count_skipped_app();
                            warn!(shard = %self.shard, "eureka: skipping an application: {why}");
                        }
                        None
                    }
                }
            });
            let Some(Converted {
                service: Some(service),
                endpoints,
                skipped,
                invalid_labels,
                warnings,
            }) = converted
            else {
                if let Some(converted) = &converted {
                    self.report(app, converted);
                }
                if let Some(old) = self.published.remove(app) {
                    info!(shard = %self.shard, service = %old.key.hostname, "eureka: service removed");
                    deleted.push(old.key);
                }
                continue;
            };
            stats.count_skipped(skipped.len(), invalid_labels.len());
            let mut reports: Vec<String> = skipped;
            reports.extend(invalid_labels);
            reports.extend(warnings);
            let key = ServiceKey::new(service.hostname.clone(), service.namespace.clone());
            let is_new = !self.published.contains_key(app);
            let state = self
                .published
                .entry(app.clone())
                .or_insert_with(|| AppState {
                    key: key.clone(),
                    service: Arc::new(service.clone()),
                    endpoints: Arc::from([]),
                    reports: Vec::new(),
                });
            if state.reports != reports {
                for r in &reports {
                    warn!(shard = %self.shard, application = %app, "eureka: {r}");
                }
                state.reports = reports;
            }
            let service_changed = is_new || *state.service != service;
            if service_changed {
                state.service = Arc::new(service);
                changed_services.push(key.clone());
            }
            if *state.endpoints != *endpoints {
                state.endpoints = Arc::from(endpoints);
                changed_endpoints.push((key, state.endpoints.to_vec()));
            }
        }
        if !self.synced {
            self.synced = true;
            self.publish_view();
            self.sink.services_changed(changed_services);
            for (key, endpoints) in changed_endpoints {
                self.sink.update_endpoints(&self.shard, &key, endpoints);
            }
            self.registry.view.set_synced();
            self.sink.synced(&self.shard);
            info!(
                shard = %self.shard,
                services = self.published.len(),
                instances = self.local.instance_count(),
                "eureka registry synced"
            );
            return;
        }
        if changed_services.is_empty() && changed_endpoints.is_empty() && deleted.is_empty() {
            return;
        }
        if self.published.is_empty() && !deleted.is_empty() {
            // A server restarted with an empty registry looks exactly like this.
            warn!(
                shard = %self.shard,
                "eureka: the registry lists no applications any more; withdrawing all {}",
                deleted.len()
            );
        }
        // Readers first, so whoever reacts to the push sees the new state.
        self.publish_view();
        for key in &deleted {
            self.sink.service_deleted(&self.shard, key);
        }
        if !changed_services.is_empty() {
            self.sink.services_changed(changed_services);
        }
        for (key, endpoints) in changed_endpoints {
            self.sink.update_endpoints(&self.shard, &key, endpoints);
        }
    }

    fn report(&self, app: &str, converted: &Converted) {
        self.registry
            .stats
            .count_skipped(converted.skipped.len(), converted.invalid_labels.len());
        for r in converted.skipped.iter().chain(&converted.invalid_labels) {
            warn!(shard = %self.shard, application = %app, "eureka: {r}");
        }
    }

    fn publish_view(&self) {
        let mut view = View::default();
        for state in self.published.values() {
            view.services
                .insert(state.key.clone(), state.service.clone());
            view.endpoints
                .insert(state.key.clone(), state.endpoints.clone());
        }
        self.registry.view.store(Arc::new(view));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_interval() {
        let s = Duration::from_secs;
        assert_eq!(backoff(s(1), s(30), 1), s(1));
        assert_eq!(backoff(s(1), s(30), 3), s(4));
        assert_eq!(backoff(s(1), s(30), 6), s(30));
        assert_eq!(backoff(s(1), s(30), 600), s(30));
    }
}

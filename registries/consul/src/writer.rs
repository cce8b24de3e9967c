//! The writer task: the only owner of the blocking-query loops and of the registry's
//! state. It applies what the loops report, publishes the reader view and tells the
//! push pipeline what changed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;

use meshfed_registry::{Endpoint, Service, ServiceKey, ServiceRegistry, ShardKey, UpdateSink};
use serde_json::Value;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::{AbortHandle, JoinHandle, JoinSet};
use tracing::{debug, error, info, warn};

use crate::api::{ApiError, ConsulClient};
use crate::blocking::{self, Answer, Report, Shared, WatchId};
use crate::config::{ConsulConfig, Error, Result};
use crate::convert::{self, Context, Converted};
use crate::registry::{ConsulRegistry, View};

/// Starting a registry is starting its writer task.
impl ConsulRegistry {
    /// Starts following the Consul catalog at `config.url` and returns the registry
    /// handle and the writer task, which runs until `shutdown` resolves.
    ///
    /// The cluster id is the datacenter: `config.datacenter`, else the agent's own,
    /// asked once here. Then `/v1/catalog/services` and, per catalog service,
    /// `/v1/health/service/<name>` are followed with blocking queries, each with its
    /// own `X-Consul-Index`. Nothing reaches `sink` until the catalog and every
    /// service in it have answered once; then every service is announced, every
    /// endpoint shard written and `sink.synced(Consul/<dc>)` sent, and from then on
    /// only changes are: a new, changed or removed service is a full push, an
    /// instance or health change an incremental one for that hostname.
    ///
    /// Fails for invalid settings, and when no datacenter is configured and Consul
    /// cannot be asked for it. Once started, failures are retried with backoff: the
    /// registry keeps its last view and reports itself stale until every watch
    /// answers again.
    pub async fn start(
        config: ConsulConfig,
        sink: UpdateSink,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(Arc<ConsulRegistry>, JoinHandle<()>)> {
        config.validate()?;
        let client = ConsulClient::new(&config)?;
        let datacenter = match &config.datacenter {
            Some(dc) => dc.clone(),
            None => {
                let dc = client
                    .local_datacenter()
                    .await
                    .map_err(|e| Error::Datacenter(e.to_string()))?;
                info!(url = %config.url, datacenter = %dc, "consul: the agent's datacenter");
                dc
            }
        };
        let registry = Arc::new(ConsulRegistry::new(config, datacenter));
        let task = tokio::spawn(run(client, registry.clone(), sink, shutdown));
        Ok((registry, task))
    }
}

/// Runs until `shutdown` resolves; every loop is stopped with it. The registry keeps
/// its last view afterwards.
pub(crate) async fn run(
    client: ConsulClient,
    registry: Arc<ConsulRegistry>,
    sink: UpdateSink,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (recovered, recovered_rx) = watch::channel(0u64);
    let shared = Arc::new(Shared {
        client,
        config: registry.config.clone(),
        stats: registry.stats.clone(),
        permits: Semaphore::new(
            registry
                .config
                .max_concurrent_queries
                .saturating_sub(1)
                .max(1),
        ),
        recovered: recovered_rx,
    });
    let mut loops = JoinSet::new();
    loops.spawn(blocking::run(shared.clone(), WatchId::Catalog, tx.clone()));
    let mut writer = Writer::new(registry, sink, shared, tx, recovered);
    info!(url = %writer.registry.config.url, shard = %writer.shard, "consul registry: listing the catalog");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(report) = rx.recv() => writer.on_report(report, &mut loops),
            // Reap loops that were aborted (removed services).
            Some(_) = loops.join_next(), if !loops.is_empty() => {}
        }
    }
    loops.shutdown().await;
    debug!(shard = %writer.shard, "consul registry: stopped");
}

/// One catalog service and its blocking health loop.
struct Watched {
    key: ServiceKey,
    generation: u64,
    abort: AbortHandle,
    /// The loop answered at least once (successfully or not).
    answered: bool,
    /// Its last answer was an error.
    failing: bool,
    /// Published once an instance converted; kept (with its ports) when the
    /// instances drop to zero, until the catalog drops the name.
    service: Option<Arc<Service>>,
    endpoints: Arc<[Endpoint]>,
    /// Reasons of the entries skipped in the last answer (to warn only on change).
    skipped: Vec<String>,
}

struct Writer {
    registry: Arc<ConsulRegistry>,
    sink: UpdateSink,
    shard: ShardKey,
    ctx: Context,
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<Report>,
    recovered: watch::Sender<u64>,
    services: BTreeMap<String, Watched>,
    /// Catalog names that cannot be hostnames (warned about once).
    rejected: BTreeSet<String>,
    next_generation: u64,
    catalog_listed: bool,
    catalog_failing: bool,
    synced: bool,
    stale: bool,
    /// Consul refused the token since the last good answer (logged once per episode).
    denied: bool,
}

impl Writer {
    fn new(
        registry: Arc<ConsulRegistry>,
        sink: UpdateSink,
        shared: Arc<Shared>,
        tx: mpsc::UnboundedSender<Report>,
        recovered: watch::Sender<u64>,
    ) -> Writer {
        Writer {
            ctx: Context {
                config: registry.config.clone(),
                datacenter: registry.datacenter.clone(),
                cluster: registry.cluster_id().clone(),
            },
            shard: registry.shard_key(),
            registry,
            sink,
            shared,
            tx,
            recovered,
            services: BTreeMap::new(),
            rejected: BTreeSet::new(),
            next_generation: 0,
            catalog_listed: false,
            catalog_failing: false,
            synced: false,
            stale: false,
            denied: false,
        }
    }

    fn on_report(&mut self, report: Report, loops: &mut JoinSet<()>) {
        if report.result.is_ok() && std::mem::take(&mut self.denied) {
            info!(shard = %self.shard, "consul: the ACL token is accepted again");
        }
        match (report.id, report.result) {
            (WatchId::Catalog, Ok(Answer::Catalog(names))) => {
                if std::mem::take(&mut self.catalog_failing) {
                    info!(shard = %self.shard, "consul: the catalog answers again");
                    self.recovered.send_modify(|n| *n += 1);
                }
                self.apply_catalog(names, loops);
            }
            (WatchId::Catalog, Err(err)) => {
                self.catalog_failing = true;
                self.failed("catalog", &err);
            }
            (WatchId::Service { name, generation }, result) => {
                let Some(w) = self.services.get_mut(&name) else {
                    return;
                };
                if w.generation != generation {
                    return; // a report from the loop of an earlier incarnation
                }
                w.answered = true;
                match result {
                    Ok(Answer::Health(entries)) => {
                        w.failing = false;
                        self.apply_health(&name, &entries);
                    }
                    Ok(Answer::Catalog(_)) => unreachable!("service loops answer health"),
                    Err(err) => {
                        w.failing = true;
                        self.failed(&name, &err);
                    }
                }
            }
            (WatchId::Catalog, Ok(Answer::Health(_))) => {
                unreachable!("the catalog loop answers the catalog")
            }
        }
        self.maybe_sync();
        self.update_stale();
    }

    fn failed(&mut self, watch: &str, err: &ApiError) {
        // A refused token is not an outage that passes by itself: an error of its own,
        // once until Consul accepts the token again (a token revoked during an outage
        // shows up here, not as one more failure of a registry already stale). The
        // error names the path, never the token.
        if matches!(err, ApiError::Denied { .. }) {
            if std::mem::replace(&mut self.denied, true) {
                debug!(shard = %self.shard, watch, "consul query refused: {err}");
            } else {
                error!(shard = %self.shard, watch, "{err}; keeping the last known view");
            }
            return;
        }
        // Every retry fails the same way during an outage: warn once, when the
        // registry turns stale, and keep the rest at debug.
        if self.stale {
            debug!(shard = %self.shard, watch, "consul query failed: {err}");
        } else {
            warn!(shard = %self.shard, watch, "consul query failed, keeping the last known view: {err}");
        }
    }

    fn update_stale(&mut self) {
        let stale = self.catalog_failing || self.services.values().any(|w| w.failing);
        if stale != self.stale {
            self.stale = stale;
            self.registry.view.set_stale(stale);
            if stale {
                warn!(shard = %self.shard, "consul registry stale: serving the last known services and endpoints");
            } else {
                info!(shard = %self.shard, "consul registry fresh again");
            }
        }
    }

    fn apply_catalog(&mut self, names: BTreeMap<String, Value>, loops: &mut JoinSet<()>) {
        // Valid names, one per hostname (names differing only in case collide).
        let mut wanted: BTreeMap<String, ServiceKey> = BTreeMap::new();
        let mut by_key: HashMap<ServiceKey, String> = HashMap::new();
        for name in names.keys() {
            let checked = convert::check_service_name(name).and_then(|()| {
                let key = self.registry.key_of(name);
                match by_key.get(&key) {
                    Some(first) => Err(format!(
                        "service name {name:?} gives the same hostname as {first:?}"
                    )),
                    None => Ok(key),
                }
            });
            match checked {
                Ok(key) => {
                    by_key.insert(key.clone(), name.clone());
                    wanted.insert(name.clone(), key);
                }
                Err(reason) => {
                    if self.rejected.insert(name.clone()) {
                        self.registry.stats.count_skipped_service();
                        warn!(shard = %self.shard, "consul: skipping a catalog service: {reason}");
                    }
                }
            }
        }
        self.rejected.retain(|n| names.contains_key(n));

        let gone: Vec<String> = self
            .services
            .keys()
            .filter(|n| !wanted.contains_key(*n))
            .cloned()
            .collect();
        let published = self
            .services
            .values()
            .filter(|w| w.service.is_some())
            .count();
        let mut deleted = Vec::new();
        for name in gone {
            let w = self.services.remove(&name).expect("listed above");
            w.abort.abort();
            if w.service.is_some() {
                info!(shard = %self.shard, service = %w.key.hostname, "consul: service removed");
                deleted.push(w.key);
            }
        }
        if published > 0 && deleted.len() == published && wanted.is_empty() {
            // An agent restarted with an empty catalog looks exactly like this.
            warn!(
                shard = %self.shard,
                "consul: the catalog lists no services any more; withdrawing all {published}"
            );
        }
        if self.synced && !deleted.is_empty() {
            // Readers first, so whoever reacts to the push sees the new state.
            self.publish_view();
            for key in &deleted {
                self.sink.service_deleted(&self.shard, key);
            }
        }
        for (name, key) in wanted {
            if self.services.contains_key(&name) {
                continue;
            }
            self.next_generation += 1;
            let generation = self.next_generation;
            let id = WatchId::Service {
                name: name.clone(),
                generation,
            };
            let abort = loops.spawn(blocking::run(self.shared.clone(), id, self.tx.clone()));
            debug!(shard = %self.shard, service = %name, "consul: watching service health");
            self.services.insert(
                name,
                Watched {
                    key,
                    generation,
                    abort,
                    answered: false,
                    failing: false,
                    service: None,
                    endpoints: Arc::from([]),
                    skipped: Vec::new(),
                },
            );
        }
        self.catalog_listed = true;
        self.registry.stats.set_watched(self.services.len());
    }

    fn apply_health(&mut self, name: &str, entries: &[Value]) {
        let converted = convert::convert_service(name, entries, &self.ctx);
        let w = self.services.get_mut(name).expect("checked by the caller");
        let Converted {
            service,
            endpoints,
            skipped,
            warnings,
        } = converted;
        self.registry.stats.count_skipped_entries(skipped.len());
        if skipped != w.skipped {
            for reason in &skipped {
                warn!(shard = %self.shard, service = name, "consul: skipping an entry: {reason}");
            }
            w.skipped = skipped;
        }
        let service_changed = match (&w.service, service) {
            // No instance left: keep the service (and its ports) with no endpoints.
            (_, None) => false,
            (Some(old), Some(new)) if **old == new => false,
            (_, Some(new)) => {
                for warning in &warnings {
                    warn!(shard = %self.shard, service = name, "consul: {warning}");
                }
                w.service = Some(Arc::new(new));
                true
            }
        };
        let endpoints_changed = *w.endpoints != *endpoints;
        if endpoints_changed {
            w.endpoints = Arc::from(endpoints);
        }
        if !self.synced || !(service_changed || endpoints_changed) || w.service.is_none() {
            return;
        }
        let key = w.key.clone();
        let endpoints = w.endpoints.to_vec();
        // Readers first, so whoever reacts to the push sees the new state.
        self.publish_view();
        if service_changed {
            debug!(shard = %self.shard, service = %key.hostname, "consul: service changed");
            self.sink.services_changed([key.clone()]);
        }
        self.sink.update_endpoints(&self.shard, &key, endpoints);
    }

    /// At the first moment the catalog and every service in it have answered:
    /// publish everything and report the sync.
    fn maybe_sync(&mut self) {
        if self.synced || !self.catalog_listed || !self.services.values().all(|w| w.answered) {
            return;
        }
        self.synced = true;
        self.publish_view();
        let published: Vec<&Watched> = self
            .services
            .values()
            .filter(|w| w.service.is_some())
            .collect();
        self.sink
            .services_changed(published.iter().map(|w| w.key.clone()));
        for w in &published {
            self.sink
                .update_endpoints(&self.shard, &w.key, w.endpoints.to_vec());
        }
        self.registry.view.set_synced();
        self.sink.synced(&self.shard);
        info!(
            shard = %self.shard,
            services = published.len(),
            catalog = self.services.len(),
            "consul registry synced"
        );
    }

    fn publish_view(&self) {
        let mut view = View::default();
        for w in self.services.values() {
            if let Some(service) = &w.service {
                view.services.insert(w.key.clone(), service.clone());
                view.endpoints.insert(w.key.clone(), w.endpoints.clone());
            }
        }
        self.registry.view.store(Arc::new(view));
    }
}

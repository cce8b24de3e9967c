//! The writer task: the only owner of the registry's state. It applies what the
//! namespace loops report, publishes the reader view and tells the push pipeline what
//! changed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;

use meshfed_registry::{Endpoint, Service, ServiceKey, ServiceRegistry, ShardKey, UpdateSink};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, error, info, warn};

use crate::api::{ApiError, NacosHttp};
use crate::auth::Auth;
use crate::config::{NacosConfig, Result};
use crate::convert::{self, Context, Converted, ServiceName};
use crate::driver::{self, Driven, Report, Shared};
use crate::registry::{ActiveTransport, NacosRegistry, View};
use crate::wire::ServiceInfo;

impl NacosRegistry {
    /// Starts following the configured Nacos namespaces and groups and returns the
    /// registry handle and its task, which runs until `shutdown` resolves.
    ///
    /// Nothing reaches `sink` until every namespace has been listed and every listed
    /// service has answered once; then every service is announced, every endpoint
    /// shard written and `sink.synced(Nacos/<cluster id>)` sent, and from then on only
    /// changes are: a new, changed or removed service is a full push, an instance
    /// change an incremental one for that hostname. Failures are retried with
    /// backoff while the last view is served and the registry reports itself stale.
    pub fn start(
        config: NacosConfig,
        sink: UpdateSink,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(Arc<NacosRegistry>, JoinHandle<()>)> {
        config.validate()?;
        let http = NacosHttp::new(&config)?;
        let registry = Arc::new(NacosRegistry::new(config));
        let shared = Arc::new(Shared {
            config: registry.config.clone(),
            http,
            auth: Auth::new(registry.config.credentials.clone()),
            stats: registry.stats.clone(),
        });
        let task = tokio::spawn(run(shared, registry.clone(), sink, shutdown));
        Ok((registry, task))
    }
}

async fn run(
    shared: Arc<Shared>,
    registry: Arc<NacosRegistry>,
    sink: UpdateSink,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut loops = JoinSet::new();
    for namespace in &shared.config.namespaces {
        let driven = Driven {
            namespace: namespace.clone(),
            tx: tx.clone(),
            stats: shared.stats.clone(),
        };
        loops.spawn(driver::run(shared.clone(), driven));
    }
    drop(tx);
    let mut writer = Writer::new(registry, sink);
    info!(
        shard = %writer.shard, servers = ?shared.config.servers,
        namespaces = ?shared.config.namespaces, groups = ?shared.config.groups,
        transport = ?shared.config.transport,
        authenticated = shared.auth.configured(),
        "nacos registry: listing services"
    );
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(report) = rx.recv() => writer.on_report(report),
        }
    }
    loops.shutdown().await;
    debug!(shard = %writer.shard, "nacos registry: stopped");
}

/// One followed Nacos service.
struct Watched {
    key: ServiceKey,
    answered: bool,
    last_ref_time: i64,
    /// Published once an instance converted; kept (with its ports) when the
    /// instances drop to zero, until the service leaves the list.
    service: Option<Arc<Service>>,
    endpoints: Arc<[Endpoint]>,
    excluded: usize,
    /// Reasons last warned about (to warn only on change).
    reported: Vec<String>,
}

/// Per namespace loop: listed at least once, failing now, transport.
#[derive(Default)]
struct Loop {
    listed: bool,
    failing: bool,
    transport: Option<ActiveTransport>,
}

struct Writer {
    registry: Arc<NacosRegistry>,
    sink: UpdateSink,
    shard: ShardKey,
    ctx: Context,
    services: BTreeMap<ServiceName, Watched>,
    loops: BTreeMap<String, Loop>,
    /// Names that cannot be hostnames (warned about once).
    rejected: BTreeSet<ServiceName>,
    synced: bool,
    stale: bool,
    /// Nacos refused the credentials since the last good answer (logged once).
    denied: bool,
}

impl Writer {
    fn new(registry: Arc<NacosRegistry>, sink: UpdateSink) -> Writer {
        let loops = registry
            .config
            .namespaces
            .iter()
            .map(|n| (n.clone(), Loop::default()))
            .collect();
        Writer {
            ctx: Context {
                config: registry.config.clone(),
                cluster: registry.cluster_id().clone(),
            },
            shard: registry.shard_key(),
            registry,
            sink,
            services: BTreeMap::new(),
            loops,
            rejected: BTreeSet::new(),
            synced: false,
            stale: false,
            denied: false,
        }
    }

    fn on_report(&mut self, report: Report) {
        match report {
            Report::Catalog(namespace, names) => self.apply_catalog(&namespace, names),
            Report::Instances(name, info) => self.apply_instances(&name, info),
            Report::Failed(namespace, err) => self.failed(&namespace, &err),
            Report::Fresh(namespace) => {
                if std::mem::take(&mut self.denied) {
                    info!(shard = %self.shard, "nacos: the credentials are accepted again");
                }
                if let Some(l) = self.loops.get_mut(&namespace)
                    && std::mem::take(&mut l.failing)
                {
                    info!(shard = %self.shard, namespace, "nacos: answering again");
                }
            }
            Report::Transport(namespace, transport) => {
                let Some(l) = self.loops.get_mut(&namespace) else {
                    return;
                };
                if l.transport.replace(transport) != Some(transport) {
                    let servers = &self.registry.config.servers;
                    let configured = self.registry.config.transport;
                    match transport {
                        ActiveTransport::Http if configured == crate::Transport::Http => info!(
                            shard = %self.shard, namespace, ?servers,
                            "nacos: polling the HTTP API every {:?}", self.registry.config.refresh_interval
                        ),
                        ActiveTransport::Http => warn!(
                            shard = %self.shard, namespace, ?servers,
                            "nacos: no gRPC session could be set up (Nacos 1.x, or the gRPC port (HTTP port + {}) not reachable); polling the HTTP API every {:?}",
                            self.registry.config.grpc_port_offset, self.registry.config.refresh_interval
                        ),
                        _ => {
                            info!(shard = %self.shard, namespace, ?servers, "nacos: following over gRPC with server push")
                        }
                    }
                }
            }
        }
        self.maybe_sync();
        self.update_stale();
    }

    fn failed(&mut self, namespace: &str, err: &ApiError) {
        if let Some(l) = self.loops.get_mut(namespace) {
            l.failing = true;
        }
        // A refused credential is not an outage that passes by itself: an error of its
        // own, once until Nacos accepts again. Messages never hold a credential.
        if err.is_denied() {
            if std::mem::replace(&mut self.denied, true) {
                debug!(shard = %self.shard, namespace, "nacos request refused: {err}");
            } else {
                error!(shard = %self.shard, namespace, "{err}; keeping the last known view");
            }
            return;
        }
        if self.stale {
            debug!(shard = %self.shard, namespace, "nacos request failed: {err}");
        } else {
            warn!(shard = %self.shard, namespace, "nacos request failed, keeping the last known view: {err}");
        }
    }

    fn update_stale(&mut self) {
        let stale = self.loops.values().any(|l| l.failing);
        if stale != self.stale {
            self.stale = stale;
            self.registry.view.set_stale(stale);
            if stale {
                warn!(shard = %self.shard, "nacos registry stale: serving the last known services and endpoints");
            } else {
                info!(shard = %self.shard, "nacos registry fresh again");
            }
        }
    }

    fn apply_catalog(&mut self, namespace: &str, names: BTreeSet<ServiceName>) {
        let mut wanted: BTreeMap<ServiceName, ServiceKey> = BTreeMap::new();
        let mut by_key: HashMap<ServiceKey, &ServiceName> = HashMap::new();
        // Names of other namespaces keep their places (and hostnames).
        for (name, w) in &self.services {
            if name.namespace != namespace {
                by_key.insert(w.key.clone(), name);
            }
        }
        for name in &names {
            let checked = convert::check_service_name(&name.name).and_then(|()| {
                let key = self
                    .registry
                    .key_of(&name.namespace, &name.group, &name.name);
                match by_key.get(&key) {
                    Some(first) => {
                        Err(format!("service {name} gives the same hostname as {first}"))
                    }
                    None => Ok(key),
                }
            });
            match checked {
                Ok(key) => {
                    by_key.insert(key.clone(), name);
                    wanted.insert(name.clone(), key);
                }
                Err(reason) => {
                    if self.rejected.insert(name.clone()) {
                        self.registry.stats.count_skipped_service();
                        warn!(shard = %self.shard, "nacos: skipping a service: {reason}");
                    }
                }
            }
        }
        self.rejected
            .retain(|n| n.namespace != namespace || names.contains(n));
        let gone: Vec<ServiceName> = self
            .services
            .keys()
            .filter(|n| n.namespace == namespace && !wanted.contains_key(*n))
            .cloned()
            .collect();
        let published = self
            .services
            .iter()
            .filter(|(n, w)| n.namespace == namespace && w.service.is_some())
            .count();
        let mut deleted = Vec::new();
        for name in gone {
            let w = self.services.remove(&name).expect("listed above");
            if w.service.is_some() {
                info!(shard = %self.shard, service = %w.key.hostname, "nacos: service removed");
                deleted.push(w.key);
            }
        }
        if published > 0 && deleted.len() == published && wanted.is_empty() {
            // A restarted Nacos with an empty store looks exactly like this.
            warn!(
                shard = %self.shard, namespace,
                "nacos: the namespace lists no services any more; withdrawing all {published}"
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
            self.services.entry(name).or_insert_with(|| Watched {
                key,
                answered: false,
                last_ref_time: i64::MIN,
                service: None,
                endpoints: Arc::from([]),
                excluded: 0,
                reported: Vec::new(),
            });
        }
        if let Some(l) = self.loops.get_mut(namespace) {
            l.listed = true;
        }
        self.registry.stats.set_services(self.services.len());
    }

    fn apply_instances(&mut self, name: &ServiceName, info: ServiceInfo) {
        let Some(w) = self.services.get_mut(name) else {
            return; // not listed (yet, or any more)
        };
        if info.last_ref_time < w.last_ref_time {
            return; // an older answer overtaken by a newer push
        }
        w.last_ref_time = info.last_ref_time;
        w.answered = true;
        let Converted {
            service,
            endpoints,
            skipped,
            excluded,
            invalid_labels,
            warnings,
        } = convert::convert_service(name, &info.hosts, &self.ctx);
        let stats = &self.registry.stats;
        stats.count_converted(skipped.len(), invalid_labels.len());
        let was_excluded = std::mem::replace(&mut w.excluded, excluded);
        if was_excluded != excluded {
            let total: usize = self.services.values().map(|w| w.excluded).sum();
            self.registry.stats.set_excluded(total);
        }
        let w = self.services.get_mut(name).expect("looked up above");
        let mut reported = skipped.clone();
        reported.extend(invalid_labels.iter().cloned());
        if reported != w.reported {
            for reason in &skipped {
                warn!(shard = %self.shard, service = %name, "nacos: skipping an instance: {reason}");
            }
            for reason in &invalid_labels {
                warn!(shard = %self.shard, service = %name, "nacos: metadata left out of the labels: {reason}");
            }
            w.reported = reported;
        }
        let service_changed = match (&w.service, service) {
            (_, None) => false,
            (Some(old), Some(new)) if **old == new => false,
            (_, Some(new)) => {
                for warning in &warnings {
                    warn!(shard = %self.shard, service = %name, "nacos: {warning}");
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
        self.publish_view();
        if service_changed {
            debug!(shard = %self.shard, service = %key.hostname, "nacos: service changed");
            self.sink.services_changed([key.clone()]);
        }
        self.sink.update_endpoints(&self.shard, &key, endpoints);
    }

    /// At the first moment every namespace has been listed and every listed service
    /// has answered: publish everything and report the sync.
    fn maybe_sync(&mut self) {
        if self.synced
            || !self.loops.values().all(|l| l.listed)
            || !self.services.values().all(|w| w.answered)
        {
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
            listed = self.services.len(),
            "nacos registry synced"
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

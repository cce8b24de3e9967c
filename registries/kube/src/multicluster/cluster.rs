//! One remote cluster's lifecycle (start, replace, remove its registry) and the
//! registry the aggregate holds for it.

use super::*;

/// A remote registry as the aggregate holds it: the Kubernetes registry, reported as
/// synced (and stale) once the sync timeout has passed without a sync, so that a
/// cluster that is down does not hold readiness forever.
#[derive(Debug)]
pub(super) struct RemoteRegistry {
    pub(super) inner: Arc<KubeRegistry>,
    pub(super) added: Instant,
    pub(super) sync_timeout: Duration,
}

impl RemoteRegistry {
    pub(super) fn timed_out(&self) -> bool {
        !self.inner.has_synced() && self.added.elapsed() >= self.sync_timeout
    }
}

impl ServiceRegistry for RemoteRegistry {
    fn provider(&self) -> ProviderId {
        self.inner.provider()
    }

    fn cluster_id(&self) -> &ClusterId {
        self.inner.cluster_id()
    }

    fn shard_key(&self) -> ShardKey {
        self.inner.shard_key()
    }

    fn services(&self) -> Vec<Arc<Service>> {
        self.inner.services()
    }

    fn has_synced(&self) -> bool {
        self.inner.has_synced() || self.timed_out()
    }

    fn is_stale(&self) -> bool {
        self.inner.is_stale() || self.timed_out()
    }

    fn network_gateways(&self) -> Vec<NetworkGateway> {
        self.inner.network_gateways()
    }

    fn external_addresses(&self, hostname: &str) -> Vec<String> {
        ServiceRegistry::external_addresses(&*self.inner, hostname)
    }

    fn workloads(&self) -> Option<Arc<dyn WorkloadLookup>> {
        self.inner.workloads()
    }
}

/// A registry this controller started: the handle, its stop switch and its writer.
pub(super) struct Started {
    pub(super) registry: Arc<KubeRegistry>,
    /// The client the registry reads through.
    pub(super) client: kube::Client,
    pub(super) stop: oneshot::Sender<()>,
    pub(super) writer: JoinHandle<()>,
}

impl Started {
    /// Stops the writer and waits until it has ended: from then on it writes nothing.
    pub(super) async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.writer.await;
    }
}

/// One remote cluster's lifecycle, driven by commands from the controller loop.
pub(super) struct ClusterTask {
    pub(super) cluster: ClusterId,
    pub(super) config: MulticlusterConfig,
    pub(super) aggregate: Arc<Aggregate>,
    pub(super) sink: UpdateSink,
    pub(super) controller: Arc<SecretController>,
    pub(super) current: Option<Started>,
}

impl ClusterTask {
    pub(super) fn shard(&self) -> ShardKey {
        ShardKey::new(ProviderId::Kubernetes, self.cluster.clone())
    }

    pub(super) async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut pending: Option<Command> = None;
        loop {
            let command = match pending.take() {
                Some(command) => command,
                None => tokio::select! {
                    command = commands.recv() => match command {
                        Some(command) => command,
                        None => break, // the controller stopped
                    },
                    _ = shutdown.wait_for(|s| *s) => break,
                },
            };
            match command {
                Command::Remove => {
                    self.remove().await;
                    return;
                }
                Command::Use(source) => {
                    match self.apply(*source, &mut commands, &mut shutdown).await {
                        Next::Wait => {}
                        Next::Handle(command) => pending = Some(command),
                        Next::Stop => break,
                    }
                }
            }
        }
        if let Some(started) = self.current.take() {
            started.stop().await;
        }
    }

    /// Starts a registry from `source` (paused when one is running, to swap it in
    /// once listed). A command that arrives while the new registry lists abandons the
    /// replacement and is returned to be handled next.
    pub(super) async fn apply(
        &mut self,
        source: Source,
        commands: &mut mpsc::UnboundedReceiver<Command>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Next {
        let client = match client_from_kubeconfig(source.kubeconfig.clone()).await {
            Ok(client) => client,
            Err(err) => {
                self.controller.stats.count_rejected();
                error!(secret = %source.secret, key = %self.cluster,
                    "remote cluster secret {}, key {}: kubeconfig refused: {err}",
                    source.secret, self.cluster);
                let state = if self.current.is_some() {
                    "running (new kubeconfig refused)".to_string()
                } else {
                    format!("failed: {err}")
                };
                self.controller.set_state(&self.cluster, &state, None);
                return Next::Wait;
            }
        };
        let registry_config = KubeRegistryConfig {
            cluster_id: self.cluster.clone(),
            // Istio hands the config cluster's WorkloadEntries to the config cluster's
            // registry only; a remote cluster's Services select none of them.
            workload_entries: WorkloadEntryFeed::none(),
            ..self.config.registry.clone()
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let stopped = async move {
            let _ = stopped.await;
        };
        let replacing = self.current.is_some();
        let remote_client = client.clone();
        let started = if replacing {
            KubeRegistry::start_paused(client, registry_config, self.sink.clone(), stopped).await
        } else {
            KubeRegistry::start(client, registry_config, self.sink.clone(), stopped).await
        };
        let (registry, writer) = match started {
            Ok(started) => started,
            Err(err) => {
                self.controller.stats.count_rejected();
                error!(cluster = %self.cluster, "remote cluster registry: {err}");
                self.controller
                    .set_state(&self.cluster, &format!("failed: {err}"), None);
                return Next::Wait;
            }
        };
        let started = Started {
            registry: registry.clone(),
            client: remote_client,
            stop,
            writer,
        };
        let Some(old) = self.current.take() else {
            self.add(started, &source);
            return Next::Wait;
        };

        // Replace: the old registry serves until the new one has listed everything.
        self.current = Some(old);
        self.controller.set_state(&self.cluster, "replacing", None);
        let interrupted = tokio::select! {
            () = registry.wait_for(SyncPhase::Listed) => None,
            command = commands.recv() => Some(command.map_or(Next::Stop, Next::Handle)),
            _ = shutdown.wait_for(|s| *s) => Some(Next::Stop),
        };
        if let Some(next) = interrupted {
            // A newer kubeconfig, a removal or shutdown: this replacement is abandoned.
            started.stop().await;
            self.controller.set_state(&self.cluster, "running", None);
            return next;
        }
        if let Some(old) = self.current.take() {
            // From here on the old registry writes nothing to the shard; the shard keeps
            // the old endpoints until the new registry rewrites them.
            old.stop().await;
        }
        registry.resume();
        registry.wait_for(SyncPhase::Synced).await;
        self.aggregate.add_registry(Arc::new(RemoteRegistry {
            inner: registry.clone(),
            added: Instant::now(),
            sync_timeout: self.config.sync_timeout,
        }));
        self.prune(&registry);
        self.controller.stats.swaps.fetch_add(1, Ordering::Relaxed);
        self.controller
            .set_hash(&self.cluster, &source.secret, source.hash);
        self.controller.set_state(
            &self.cluster,
            "running",
            Some((registry, started.client.clone())),
        );
        self.current = Some(started);
        info!(cluster = %self.cluster, secret = %source.secret,
            "remote cluster registry replaced with the new kubeconfig");
        self.sink.push(PushRequest::forced(TriggerReason::Cluster));
        Next::Wait
    }

    pub(super) fn add(&mut self, started: Started, source: &Source) {
        self.aggregate.add_registry(Arc::new(RemoteRegistry {
            inner: started.registry.clone(),
            added: Instant::now(),
            sync_timeout: self.config.sync_timeout,
        }));
        self.controller
            .stats
            .clusters
            .fetch_add(1, Ordering::Relaxed);
        self.controller
            .set_hash(&self.cluster, &source.secret, source.hash);
        self.controller.set_state(
            &self.cluster,
            "running",
            Some((started.registry.clone(), started.client.clone())),
        );
        self.current = Some(started);
        info!(cluster = %self.cluster, secret = %source.secret, shard = %self.shard(),
            "remote cluster registry started");
        self.sink.push(PushRequest::forced(TriggerReason::Cluster));
    }

    /// Drops the shard's services that the new registry does not have (the old one
    /// wrote them; nobody else will delete them).
    pub(super) fn prune(&self, registry: &KubeRegistry) {
        let shard = self.shard();
        let mut stale: Vec<_> = self
            .sink
            .endpoint_index()
            .snapshot()
            .iter()
            .filter(|(key, shards)| {
                shards.shards.contains_key(&shard) && registry.service(key).is_none()
            })
            .map(|(key, _)| key.clone())
            .collect();
        stale.sort();
        for key in stale {
            debug!(shard = %shard, service = %key, "pruning a service the new registry does not have");
            self.sink.service_deleted(&shard, &key);
        }
    }

    pub(super) async fn remove(&mut self) {
        let shard = self.shard();
        let had_registry = self.current.is_some();
        if let Some(started) = self.current.take() {
            started.stop().await;
        }
        if had_registry {
            self.aggregate.remove_registry(&shard);
            self.controller
                .stats
                .clusters
                .fetch_sub(1, Ordering::Relaxed);
            self.sink.registry_removed(&shard);
            info!(cluster = %self.cluster, shard = %shard, "remote cluster registry stopped and its shard dropped");
        }
    }
}

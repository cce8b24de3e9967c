//! The controller loop: the watched remote-cluster Secrets, and the reconciliation
//! of their keys into one task per cluster.

use super::*;

/// FNV-1a, 64 bit: a stable fingerprint of a kubeconfig for logs and debug output.
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The data of a remote-cluster Secret: cluster id -> kubeconfig bytes.
pub(super) type SecretData = BTreeMap<String, Arc<[u8]>>;

pub(super) fn secret_data(secret: &Secret) -> SecretData {
    let mut data: SecretData = secret
        .string_data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), Arc::from(v.as_bytes())))
        .collect();
    for (k, v) in secret.data.iter().flatten() {
        data.insert(k.clone(), Arc::from(v.0.as_slice()));
    }
    data
}

/// What the controller loop keeps.
pub(super) struct State {
    pub(super) config: MulticlusterConfig,
    pub(super) aggregate: Arc<Aggregate>,
    pub(super) sink: UpdateSink,
    pub(super) controller: Arc<SecretController>,
    pub(super) shutdown: watch::Receiver<bool>,
    /// Secret name -> its data.
    pub(super) secrets: BTreeMap<String, SecretData>,
    /// Secrets buffered during a (re)list.
    pub(super) listing: Option<BTreeMap<String, SecretData>>,
    /// Running clusters: owning Secret, the kubeconfig in force, the cluster's task.
    pub(super) running: BTreeMap<ClusterId, Running>,
    /// Tasks still removing a cluster.
    pub(super) removing: BTreeMap<ClusterId, JoinHandle<()>>,
    /// Kubeconfigs refused, so that the same bytes are not refused (and logged) again.
    pub(super) refused: BTreeMap<ClusterId, u64>,
}

pub(super) struct Running {
    pub(super) secret: String,
    pub(super) bytes: Arc<[u8]>,
    pub(super) commands: mpsc::UnboundedSender<Command>,
    pub(super) task: JoinHandle<()>,
}

pub(super) async fn run(
    client: kube::Client,
    config: MulticlusterConfig,
    aggregate: Arc<Aggregate>,
    sink: UpdateSink,
    controller: Arc<SecretController>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let api: Api<Secret> = Api::namespaced(client, &config.namespace);
    let selector = format!("{LABEL_MULTICLUSTER}=true");
    let mut secrets = watcher::watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .boxed();
    let (stop_tx, stop_rx) = watch::channel(false);
    info!(namespace = %config.namespace, "remote cluster secrets: watching");
    let mut state = State {
        config,
        aggregate,
        sink,
        controller,
        shutdown: stop_rx,
        secrets: BTreeMap::new(),
        listing: None,
        running: BTreeMap::new(),
        removing: BTreeMap::new(),
        refused: BTreeMap::new(),
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            event = secrets.next() => match event {
                Some(Ok(event)) => state.on_event(event),
                Some(Err(err)) => {
                    warn!(namespace = %state.config.namespace, "remote cluster secrets: watch: {err}");
                }
                None => break,
            },
        }
    }
    // Stop every remote registry; leave the aggregate alone (the server is stopping).
    stop_tx.send_replace(true);
    for (_, running) in std::mem::take(&mut state.running) {
        let _ = running.task.await;
    }
    for (_, task) in std::mem::take(&mut state.removing) {
        let _ = task.await;
    }
    debug!("remote cluster secrets: stopped");
}

impl State {
    pub(super) fn on_event(&mut self, event: Event<Secret>) {
        match event {
            Event::Init => self.listing = Some(BTreeMap::new()),
            Event::InitApply(secret) => {
                if let Some(name) = secret.metadata.name.clone() {
                    let data = secret_data(&secret);
                    self.listing
                        .get_or_insert_with(BTreeMap::new)
                        .insert(name, data);
                }
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                for name in self.secrets.keys() {
                    if !listed.contains_key(name) {
                        self.controller.stats.count_event(EventType::Delete);
                    }
                }
                for (name, data) in &listed {
                    let event = match self.secrets.get(name) {
                        None => EventType::Add,
                        Some(old) if old == data => continue,
                        Some(_) => EventType::Update,
                    };
                    self.controller.stats.count_event(event);
                    info!(secret = %self.secret_name(name), ?event, "remote cluster secret");
                }
                self.secrets = listed;
                self.controller.listed.store(true, Ordering::SeqCst);
                self.reconcile();
            }
            Event::Apply(secret) => {
                let Some(name) = secret.metadata.name.clone() else {
                    return;
                };
                let data = secret_data(&secret);
                let event = match self.secrets.get(&name) {
                    None => EventType::Add,
                    Some(old) if *old == data => return,
                    Some(_) => EventType::Update,
                };
                self.controller.stats.count_event(event);
                info!(secret = %self.secret_name(&name), ?event, "remote cluster secret");
                self.secrets.insert(name, data);
                self.reconcile();
            }
            Event::Delete(secret) => {
                let Some(name) = secret.metadata.name.clone() else {
                    return;
                };
                if self.secrets.remove(&name).is_some() {
                    self.controller.stats.count_event(EventType::Delete);
                    info!(secret = %self.secret_name(&name), "remote cluster secret deleted");
                    self.reconcile();
                }
            }
        }
    }

    pub(super) fn secret_name(&self, name: &str) -> String {
        format!("{}/{name}", self.config.namespace)
    }

    /// Brings the running clusters in line with the Secrets.
    pub(super) fn reconcile(&mut self) {
        // Which Secret provides each cluster: the one already providing it while it
        // still lists it, else the first by name (later ones are ignored, as in Istio).
        let mut desired: BTreeMap<ClusterId, (String, Arc<[u8]>)> = BTreeMap::new();
        for (cluster, running) in &self.running {
            if let Some(bytes) = self
                .secrets
                .get(&running.secret)
                .and_then(|d| d.get(cluster.as_str()))
            {
                desired.insert(cluster.clone(), (running.secret.clone(), bytes.clone()));
            }
        }
        for (secret, data) in &self.secrets {
            for (key, bytes) in data {
                let cluster = ClusterId::new(key);
                if key.is_empty() {
                    continue;
                }
                if cluster == self.config.local_cluster {
                    debug!(secret = %self.secret_name(secret), key = %key,
                        "remote cluster secret: key is the local cluster id; ignored");
                    continue;
                }
                match desired.get(&cluster) {
                    Some((owner, _)) if owner != secret => {
                        debug!(secret = %self.secret_name(secret), key = %key,
                            "remote cluster secret: cluster already registered by secret {}; ignored",
                            self.secret_name(owner));
                    }
                    Some(_) => {}
                    None => {
                        desired.insert(cluster, (secret.clone(), bytes.clone()));
                    }
                }
            }
        }

        let gone: Vec<ClusterId> = self
            .running
            .keys()
            .filter(|c| !desired.contains_key(*c))
            .cloned()
            .collect();
        self.removing.retain(|_, task| !task.is_finished());
        for cluster in gone {
            if let Some(running) = self.running.remove(&cluster) {
                info!(cluster = %cluster, secret = %self.secret_name(&running.secret),
                    "remote cluster removed");
                let _ = running.commands.send(Command::Remove);
                // The cluster's task finishes the removal; a later task for the same
                // cluster waits for it (it must not remove the new registry).
                self.removing.insert(cluster, running.task);
            }
        }
        self.refused.retain(|c, _| desired.contains_key(c));
        self.controller
            .lock()
            .retain(|c, _| desired.contains_key(c));

        for (cluster, (secret, bytes)) in desired {
            let name = self.secret_name(&secret);
            if let Some(running) = self.running.get_mut(&cluster)
                && running.bytes == bytes
            {
                if running.secret != secret {
                    // Another Secret now provides the same kubeconfig: nothing to restart.
                    if let Some(entry) = self.controller.lock().get_mut(&cluster) {
                        entry.status.secret = name;
                    }
                    running.secret = secret;
                }
                continue;
            }
            let hash = fnv1a(&bytes);
            if self.refused.get(&cluster) == Some(&hash) {
                continue;
            }
            let source = match parse_kubeconfig(&bytes, &self.config.policy) {
                Ok(kubeconfig) => Source {
                    secret: self.secret_name(&secret),
                    hash,
                    kubeconfig,
                },
                Err(err) => {
                    self.controller.stats.count_rejected();
                    self.refused.insert(cluster.clone(), hash);
                    let keeps = if self.running.contains_key(&cluster) {
                        "; the cluster keeps its previous kubeconfig"
                    } else {
                        ""
                    };
                    error!(secret = %self.secret_name(&secret), key = %cluster,
                        "remote cluster secret {}, key {cluster}: kubeconfig refused: {err}{keeps}",
                        self.secret_name(&secret));
                    if !self.running.contains_key(&cluster) {
                        self.controller
                            .lock()
                            .entry(cluster.clone())
                            .or_insert_with(|| ClusterEntry {
                                status: RemoteClusterStatus {
                                    cluster: cluster.clone(),
                                    secret: self.secret_name(&secret),
                                    kubeconfig_hash: format!("{hash:016x}"),
                                    state: String::new(),
                                    synced: false,
                                    stale: false,
                                },
                                registry: None,
                                client: None,
                            })
                            .status
                            .state = format!("failed: {err}");
                    }
                    continue;
                }
            };
            self.refused.remove(&cluster);
            match self.running.get_mut(&cluster) {
                Some(running) => {
                    info!(cluster = %cluster, secret = %source.secret,
                        hash = %format!("{hash:016x}"), "remote cluster kubeconfig changed");
                    running.secret = secret;
                    running.bytes = bytes;
                    let _ = running.commands.send(Command::Use(Box::new(source)));
                }
                None => {
                    info!(cluster = %cluster, secret = %source.secret,
                        hash = %format!("{hash:016x}"), "remote cluster added");
                    self.controller.lock().insert(
                        cluster.clone(),
                        ClusterEntry {
                            status: RemoteClusterStatus {
                                cluster: cluster.clone(),
                                secret: source.secret.clone(),
                                kubeconfig_hash: format!("{hash:016x}"),
                                state: "starting".into(),
                                synced: false,
                                stale: false,
                            },
                            registry: None,
                            client: None,
                        },
                    );
                    let (tx, rx) = mpsc::unbounded_channel();
                    let _ = tx.send(Command::Use(Box::new(source)));
                    let previous = self.removing.remove(&cluster);
                    let task = ClusterTask {
                        cluster: cluster.clone(),
                        config: self.config.clone(),
                        aggregate: self.aggregate.clone(),
                        sink: self.sink.clone(),
                        controller: self.controller.clone(),
                        current: None,
                    };
                    let shutdown = self.shutdown.clone();
                    let task = tokio::spawn(async move {
                        if let Some(previous) = previous {
                            let _ = previous.await;
                        }
                        task.run(rx, shutdown).await;
                    });
                    self.running.insert(
                        cluster,
                        Running {
                            secret,
                            bytes,
                            commands: tx,
                            task,
                        },
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}

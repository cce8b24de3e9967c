//! Wiring: build every part from a [`DiscoveryConfig`], bind the listeners, run, and
//! drain on shutdown.
//!
//! [`Server::start`] binds first and returns the real addresses ([`Bound`]), so tests
//! start the whole control plane on port 0 and connect at once.
//!
//! - `settings`: [`DiscoveryConfig`] and the settings of its parts.
//! - `config`: the Istio config stores and the snapshot's config source.
//! - `sources`: the registries, each started through
//!   [`meshfed_registry::source::RegistrySource`]; `kube`: what the local Kubernetes
//!   cluster offers besides its registry (Lease, mesh ConfigMap, CRD store writer).
//! - `secure`: the mesh CA, its root bundle, the secure port's TLS and authenticators.
//! - `serve`: the gRPC and HTTP servers; `shutdown`: signals and the drain.

mod config;
mod kube;
mod secure;
mod serve;
mod settings;
mod shutdown;
mod sources;
mod webhook;
mod workloads;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use arc_swap::ArcSwap;
use meshfed_kube::KubeConfigStore;
use meshfed_registry::config::{FileConfigStore, MemoryConfigStore};
use meshfed_registry::{
    Aggregate, ClusterId, EndpointIndex, MemoryRegistry, MockFileStatus, RegistryEvent,
    ServiceRegistry, UpdateSink,
};
use prometheus_client::registry::Registry;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::admin::{self, AdminState};
use crate::ads::Connections;
use crate::ads::limit::LogLimiter;
use crate::ads::metrics::XdsMetrics;
use crate::ads::server::XdsContext;
use crate::ads::transport::TransportMetrics;
use crate::drain::{self, Shutdown, ShutdownTrigger};
use crate::mesh::{self, MeshFile, MeshSettings};
use crate::push::config_source::{IgnoredMetrics, config_source};
use crate::push::snapshot::Snapshot;
use crate::push::{Pipeline, PushMetrics};
use crate::readiness::Readiness;
use config::ConfigStores;
use sources::Registries;

pub use meshfed_registry::source::{EMBEDDED_MOCK_REGISTRY, MockSource};
pub use settings::{
    CaSource, ConsulSettings, DiscoveryConfig, KubeSettings, KubeSource, LeaseSettings,
    McpSettings, RemoteSecretSettings, SecureSettings,
};
pub use shutdown::ShutdownSignals;

/// The addresses the server actually listens on.
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    /// The plaintext xDS port, unless turned off.
    pub grpc: Option<SocketAddr>,
    /// The secure xDS port, when served.
    pub secure_grpc: Option<SocketAddr>,
    pub http: SocketAddr,
    pub monitoring: SocketAddr,
    /// The validating webhook (`--httpsAddr`), when served.
    pub https: Option<SocketAddr>,
}

/// A running control plane.
#[derive(Debug)]
pub struct Server {
    bound: Bound,
    trigger: ShutdownTrigger,
    drain_trigger: ShutdownTrigger,
    drain_duration: Duration,
    tasks: JoinSet<()>,
    drain_deadline: Duration,
    aggregate: Arc<Aggregate>,
    sink: UpdateSink,
    pipeline: Arc<Pipeline>,
    connections: Arc<Connections>,
    mock_status: Option<MockFileStatus>,
    config_stores: ConfigStores,
}

/// The parts every later step of the start reads.
struct Core {
    mesh: Arc<ArcSwap<MeshSettings>>,
    sink: UpdateSink,
    aggregate: Arc<Aggregate>,
    connections: Arc<Connections>,
    config_stores: ConfigStores,
    pipeline: Arc<Pipeline>,
}

impl Core {
    /// Loads the mesh settings, starts the config stores and the JWKS fetcher, and
    /// builds the push pipeline over an empty aggregate; returns the registries' event
    /// stream for the pipeline to run on.
    fn start(
        config: &DiscoveryConfig,
        push_metrics: Arc<PushMetrics>,
        metrics_registry: &mut Registry,
        shutdown: &Shutdown,
        tasks: &mut JoinSet<()>,
    ) -> anyhow::Result<(Core, mpsc::UnboundedReceiver<RegistryEvent>)> {
        let mesh_settings = mesh::load_initial(
            config.mesh_config.as_deref(),
            config.networks_config.as_deref(),
            config.max_config_file_size,
        )
        .context("loading the mesh configuration")?;
        let mesh_settings = Arc::new(ArcSwap::from_pointee(mesh_settings));
        let index = Arc::new(EndpointIndex::new());
        let (sink, events) = UpdateSink::new(index.clone());
        let aggregate = Arc::new(Aggregate::new(config.cluster_id.clone()));
        let connections = Arc::new(Connections::default());
        let config_stores = ConfigStores::start(
            config,
            &mesh_settings.load().config,
            &sink,
            metrics_registry,
            shutdown,
            tasks,
        )?;
        // RequestAuthentication keys, fetched by the control plane and inlined.
        let (fetch_mode, unknown) = crate::generate::jwt::JwksFetchMode::parse(
            std::env::var(crate::jwks::REMOTE_JWKS_ENV).ok().as_deref(),
        );
        if let Some(e) = unknown {
            warn!("{e}");
        }
        let jwks = crate::jwks::JwksResolver::with_mode(
            sink.clone(),
            Arc::new(crate::jwks::JwksMetrics::new(metrics_registry)),
            fetch_mode,
        );
        tasks.spawn(jwks.clone().run(shutdown.clone()));
        let pipeline = Arc::new(Pipeline::new(
            aggregate.clone(),
            index,
            connections.clone(),
            push_metrics.clone(),
            mesh_settings.clone(),
            {
                IgnoredMetrics::register(config_stores.all(), metrics_registry);
                crate::generate::envoyfilter::install();
                crate::generate::envoyfilter::status::EnvoyFilterMetrics::register(
                    metrics_registry,
                );
                config_source(
                    config_stores.all(),
                    &config.domain,
                    &config.gateway_controller_name,
                    push_metrics,
                    move |ra| jwks.table_for(ra),
                    {
                        let aggregate = aggregate.clone();
                        move || {
                            let registries = aggregate.registries();
                            registries
                                .iter()
                                .flat_map(|r| r.services())
                                .map(|s| {
                                    let ports = s
                                        .ports
                                        .iter()
                                        .map(|p| (p.name.to_string(), u32::from(p.port.get())))
                                        .collect();
                                    (s.hostname.to_string(), ports)
                                })
                                .collect()
                        }
                    },
                    {
                        let aggregate = aggregate.clone();
                        move |host: &str| aggregate.external_addresses(host)
                    },
                )
            },
        ));
        let snapshot = pipeline.snapshot().clone();
        crate::networks::UnplacedMetrics::register(
            config_stores.all(),
            move || snapshot.load().network_view().clone(),
            metrics_registry,
        );
        let core = Core {
            mesh: mesh_settings,
            sink,
            aggregate,
            connections,
            config_stores,
            pipeline,
        };
        Ok((core, events))
    }

    /// Follows `--meshConfig` and `--networksConfig`.
    fn follow_mesh_files(
        &self,
        config: &DiscoveryConfig,
        shutdown: &Shutdown,
        tasks: &mut JoinSet<()>,
    ) -> anyhow::Result<()> {
        for (path, which) in [
            (&config.mesh_config, MeshFile::Config),
            (&config.networks_config, MeshFile::Networks),
        ] {
            if let Some(path) = path {
                let mut stop = shutdown.clone();
                let follower = mesh::follow(
                    path.clone(),
                    which,
                    self.mesh.clone(),
                    self.sink.clone(),
                    config.max_config_file_size,
                    async move { stop.wait().await },
                )?;
                info!(file = %path.display(), kind = ?which, "following mesh file");
                tasks.spawn(follower);
            }
        }
        Ok(())
    }

    fn trust_domain(&self) -> String {
        self.mesh.load().config.trust_domain.clone()
    }
}

impl Server {
    /// Binds every listener, starts every task and returns.
    pub async fn start(config: DiscoveryConfig) -> anyhow::Result<Server> {
        let (trigger, shutdown) = drain::channel();
        // Draining comes first: readiness turns 503, the xDS port stops accepting and
        // says GOAWAY, and streams close one by one over the drain duration.
        let (drain_trigger, draining) = drain::channel();
        let mut metrics_registry = Registry::default();
        crate::metrics::ProcessMetrics::register(&mut metrics_registry);
        let xds_metrics = Arc::new(XdsMetrics::new(&mut metrics_registry));
        let push_metrics = Arc::new(PushMetrics::new(&mut metrics_registry));
        let mcp = Arc::new(
            config
                .mcp
                .serving(&config.cluster_id, &config.secure.namespace)?,
        );
        mcp.metrics.register(&mut metrics_registry);
        let mut tasks = JoinSet::new();
        let (core, events) = Core::start(
            &config,
            push_metrics,
            &mut metrics_registry,
            &shutdown,
            &mut tasks,
        )?;
        core.follow_mesh_files(&config, &shutdown, &mut tasks)?;
        let registries = sources::start(&config, &core, &shutdown, &mut tasks).await?;
        // Gateway credentials (SDS): Kubernetes Secrets when there is a cluster, and
        // the config directory's `kind: Secret` objects.
        let sds = Arc::new(crate::sds::Sds::new(
            config.cluster_id.clone(),
            registries
                .kube_client()
                .map(|client| crate::sds::KubeSecrets {
                    config_cluster: config.cluster_id.clone(),
                    local: client.clone(),
                    remote: registries.remotes(),
                }),
            core.config_stores.files.clone(),
            core.sink.clone(),
            shutdown.clone(),
            crate::sds::SdsMetrics::new(&mut metrics_registry),
        ));
        // The first snapshot reflects whatever the registries already hold.
        core.pipeline.apply(
            meshfed_registry::PushRequest::forced(meshfed_registry::TriggerReason::Global),
            0,
        );
        tasks.spawn(
            core.pipeline
                .clone()
                .run(events, config.debounce, shutdown.clone()),
        );
        let wiring = Wiring {
            config,
            mcp,
            core,
            registries,
            metrics_registry,
            shutdown,
            draining,
            tasks,
        };
        wiring.serve(xds_metrics, sds, trigger, drain_trigger).await
    }
    /// The bound addresses.
    pub fn bound(&self) -> Bound {
        self.bound
    }

    /// The aggregate of registries.
    pub fn aggregate(&self) -> &Arc<Aggregate> {
        &self.aggregate
    }

    /// The sink new registries report through.
    pub fn sink(&self) -> &UpdateSink {
        &self.sink
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> &Arc<ArcSwap<Snapshot>> {
        self.pipeline.snapshot()
    }

    /// The push pipeline.
    pub fn pipeline(&self) -> &Arc<Pipeline> {
        &self.pipeline
    }

    /// The live connections.
    pub fn connections(&self) -> &Arc<Connections> {
        &self.connections
    }

    /// Load counters of the mock-registry file, when one is followed.
    pub fn mock_status(&self) -> Option<&MockFileStatus> {
        self.mock_status.as_ref()
    }

    /// The in-memory Istio config store (apply/delete objects from Rust).
    pub fn config_store(&self) -> &MemoryConfigStore {
        &self.config_stores.memory
    }

    /// The config-directory store, with `--configDir`.
    pub fn config_dir_store(&self) -> Option<&FileConfigStore> {
        self.config_stores.files.as_ref()
    }

    /// The Kubernetes CRD config store, with the Kubernetes registry (unless turned
    /// off with `--kubeConfigStore=false`).
    pub fn kube_config_store(&self) -> Option<&KubeConfigStore> {
        self.config_stores.kube.as_ref()
    }

    /// Adds an in-memory registry for `cluster` (synced at once) and returns its
    /// handle.
    pub fn add_memory_registry(&self, cluster: impl Into<ClusterId>) -> MemoryRegistry {
        let registry = MemoryRegistry::new(cluster, self.sink.clone());
        self.aggregate.add_registry(Arc::new(registry.clone()));
        self.sink.push(meshfed_registry::PushRequest::forced(
            meshfed_registry::TriggerReason::Cluster,
        ));
        registry
    }

    /// Adds any registry.
    pub fn add_registry(&self, registry: Arc<dyn ServiceRegistry>) {
        self.aggregate.add_registry(registry);
        self.sink.push(meshfed_registry::PushRequest::forced(
            meshfed_registry::TriggerReason::Cluster,
        ));
    }
}

/// Everything started so far, for the steps that bind and serve.
struct Wiring {
    config: DiscoveryConfig,
    /// MCP-over-xDS serving (both ADS ports).
    mcp: Arc<crate::ads::mcp::McpServing>,
    core: Core,
    registries: Registries,
    metrics_registry: Registry,
    shutdown: Shutdown,
    draining: Shutdown,
    tasks: JoinSet<()>,
}

impl Wiring {
    /// Binds the listeners, loads the CA, serves the xDS ports and the HTTP surface,
    /// and returns the running server.
    async fn serve(
        mut self,
        xds_metrics: Arc<XdsMetrics>,
        sds: Arc<crate::sds::Sds>,
        trigger: ShutdownTrigger,
        drain_trigger: ShutdownTrigger,
    ) -> anyhow::Result<Server> {
        let config = &self.config;
        let listeners = serve::Listeners::bind(config).await?;
        let trust_domain = self.core.trust_domain();
        let duties = self.registries.duties.clone();
        let ca = secure::load_ca(
            config,
            &trust_domain,
            self.registries.kube_client(),
            &duties,
        )
        .await?;
        let secure = secure::bind_secure(config, !matches!(ca, secure::CaAtStart::Off)).await?;
        let mut bound = Bound {
            grpc: listeners
                .grpc
                .as_ref()
                .map(tokio::net::TcpListener::local_addr)
                .transpose()?,
            secure_grpc: secure
                .as_ref()
                .map(tokio::net::TcpListener::local_addr)
                .transpose()?,
            http: listeners.http.local_addr()?,
            monitoring: listeners.monitoring.local_addr()?,
            https: None,
        };
        let readiness = self.readiness();
        let workloads = workloads::start(
            &self.config,
            &self.core.config_stores,
            self.registries.kube_client(),
            self.config.lease.clone().unwrap_or_default().identity(),
            &mut self.metrics_registry,
            &self.shutdown,
            &mut self.tasks,
        );
        let ctx = self.xds_context(xds_metrics, &readiness, &sds, workloads);
        let loaded = match &ca {
            secure::CaAtStart::Ready(loaded) => Some(loaded.clone()),
            _ => None,
        };
        bound.https = webhook::serve_webhook(
            &self.config,
            webhook::WebhookParts {
                ca: loaded.as_ref().map(|(ca, _)| ca),
                ca_awaited: matches!(ca, secure::CaAtStart::Waiting(_)),
                trust_domain: trust_domain.clone(),
                kube_client: self.registries.kube_client(),
                lease_state: &self.registries.lease_state,
            },
            &mut self.metrics_registry,
            &self.shutdown,
            &mut self.tasks,
        )?;
        self.serve_xds(listeners.grpc, secure, ctx.clone(), ca, trust_domain)
            .await?;
        kube::start_status(
            &self.config,
            self.core.config_stores.kube.as_ref(),
            self.registries.kube_client(),
            kube::StatusParts {
                connections: self.core.connections.clone(),
                snapshot: self.core.pipeline.snapshot().clone(),
                root_namespace: self.core.mesh.load().config.root_namespace.clone(),
                lease_state: self.registries.lease_state.clone(),
                duties: self.registries.duties.clone(),
                shutdown: self.shutdown.clone(),
            },
            &mut self.metrics_registry,
            &mut self.tasks,
        );
        self.register_metrics();
        self.serve_admin(
            listeners.http,
            listeners.monitoring,
            readiness,
            loaded,
            sds,
            &ctx,
        );
        info!(
            grpc = ?bound.grpc, secure_grpc = ?bound.secure_grpc, http = %bound.http, monitoring = %bound.monitoring,
            registries = ?self.core.aggregate.registries().iter().map(|r| r.shard_key().to_string()).collect::<Vec<_>>(),
            "meshfed discovery serving"
        );
        Ok(Server {
            bound,
            trigger,
            drain_trigger,
            drain_duration: self.config.drain_duration,
            tasks: self.tasks,
            drain_deadline: self.config.drain_deadline,
            mock_status: self.registries.mock_status(),
            aggregate: self.core.aggregate,
            sink: self.core.sink,
            pipeline: self.core.pipeline,
            connections: self.core.connections,
            config_stores: self.core.config_stores,
        })
    }

    /// Serves ADS (and CreateCertificate, with a CA) on the plaintext and secure ports.
    /// A CA still awaited (its Secrets not reachable yet) leaves the secure port to a
    /// task that serves it once the CA loads; plaintext serves at once.
    async fn serve_xds(
        &mut self,
        grpc: Option<tokio::net::TcpListener>,
        secure: Option<tokio::net::TcpListener>,
        ctx: Arc<XdsContext>,
        ca: secure::CaAtStart,
        trust_domain: String,
    ) -> anyhow::Result<()> {
        let serving = (!matches!(ca, secure::CaAtStart::Off)).then(|| {
            secure::CaServing::register(
                &mut self.metrics_registry,
                self.registries.kube_client().is_some(),
                &self.registries.duties,
            )
        });
        let (ready, late) = match ca {
            secure::CaAtStart::Ready((ca, _)) => (Some(ca), None),
            secure::CaAtStart::Waiting(late) => (None, Some(late)),
            secure::CaAtStart::Off => (None, None),
        };
        if let (Some(ca), Some(serving)) = (&ready, &serving) {
            serving.publish_root(
                &self.config,
                ca,
                self.registries.kube_client(),
                &self.registries.lease_state,
                &self.shutdown,
                &mut self.tasks,
            )?;
        }
        let ca_metrics = serving.as_ref().map(|s| s.metrics.clone());
        let transport_metrics = TransportMetrics::new(&mut self.metrics_registry);
        if let Some(grpc) = grpc {
            serve::serve_plaintext(
                grpc,
                &self.config.xds_limits,
                ctx.clone(),
                ready.as_ref().zip(ca_metrics.clone()),
                transport_metrics.clone(),
                self.draining.clone(),
                &mut self.tasks,
            );
        }
        if let Some(listener) = secure {
            let port = secure::SecurePort {
                ctx,
                ca: ready.zip(ca_metrics),
                trust_domain,
                kube_client: self.registries.kube_client().cloned(),
                remotes: self.registries.remotes(),
                transport_metrics,
                draining: self.draining.clone(),
            };
            match (late, serving) {
                (Some(late), Some(serving)) => {
                    self.tasks.spawn(secure::serve_late(
                        late,
                        self.config.clone(),
                        listener,
                        serving,
                        self.registries.lease_state.clone(),
                        port,
                        self.shutdown.clone(),
                    ));
                }
                _ => {
                    secure::serve_secure(
                        &self.config,
                        listener,
                        port,
                        &mut self.metrics_registry,
                        &self.shutdown,
                        &mut self.tasks,
                    )
                    .await?;
                }
            }
        }
        Ok(())
    }

    /// Serves `/ready`, `/metrics` and the debug endpoints.
    fn serve_admin(
        &mut self,
        http: tokio::net::TcpListener,
        monitoring: tokio::net::TcpListener,
        readiness: Arc<Readiness>,
        ca: Option<secure::LoadedCa>,
        sds: Arc<crate::sds::Sds>,
        xds: &XdsContext,
    ) {
        let admin_metrics = admin::AdminMetrics::new(&mut self.metrics_registry);
        let admin_state = AdminState {
            aggregate: self.core.aggregate.clone(),
            pipeline: self.core.pipeline.clone(),
            connections: self.core.connections.clone(),
            metrics: Arc::new(std::mem::take(&mut self.metrics_registry)),
            debug_open: self.config.debug_open,
            log_control: self.config.log_control.clone(),
            config_stores: self.core.config_stores.all(),
            multicluster: self.registries.remotes(),
            generator: self.config.generator,
            readiness,
            ca,
            sds: Some(sds),
            duties: self.registries.duties.clone(),
        };
        // Debug over xDS and CSDS answer from the admin state.
        let _ = xds.debug.set(Arc::new(crate::debug_xds::XdsDebug::new(
            admin_state.clone(),
            &self.config.secure.namespace,
        )));
        serve::log_descriptor_budget(&self.config);
        self.tasks.spawn(serve::serve_http(
            http,
            admin::http_router(admin_state.clone()),
            admin::AdminPort::Http,
            &self.config,
            admin_metrics.clone(),
            self.shutdown.clone(),
        ));
        self.tasks.spawn(serve::serve_http(
            monitoring,
            admin::monitoring_router(admin_state),
            admin::AdminPort::Monitoring,
            &self.config,
            admin_metrics,
            self.shutdown.clone(),
        ));
    }

    /// Readiness, checked until ready by a task of its own so that the latch is set as
    /// soon as everything has synced, whether or not anyone asks.
    fn readiness(&mut self) -> Arc<Readiness> {
        let gates = self
            .registries
            .started
            .iter()
            .filter_map(|s| s.readiness.clone());
        let mut readiness = Readiness::new(
            self.core.aggregate.clone(),
            self.core.config_stores.all(),
            gates,
            self.config.cluster_id.clone(),
            self.config.remote_cluster_timeout,
        )
        .draining_on(self.draining.clone());
        if let Some((name, synced)) = self.registries.mesh_map_synced.take() {
            readiness = readiness.also_wait_for(format!("mesh ConfigMap {name}"), synced);
        }
        // Istio's initial push context: what the synced sources hold is built into a
        // snapshot before the first proxy may connect.
        let pipeline = self.core.pipeline.clone();
        let readiness = Arc::new(readiness.with_first_snapshot(move || {
            pipeline.apply(
                meshfed_registry::PushRequest::forced(meshfed_registry::TriggerReason::Global),
                0,
            )
        }));
        let until_ready = readiness.clone();
        let mut stop = self.shutdown.clone();
        self.tasks.spawn(async move {
            let poll = async {
                while !until_ready.is_ready() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            };
            tokio::select! {
                () = poll => {}
                () = stop.wait() => {}
            }
        });
        readiness
    }

    /// What every ADS stream shares.
    fn xds_context(
        &self,
        metrics: Arc<XdsMetrics>,
        readiness: &Arc<Readiness>,
        sds: &Arc<crate::sds::Sds>,
        workloads: Option<Arc<crate::autoregistration::Controller>>,
    ) -> Arc<XdsContext> {
        let config = &self.config;
        let ready_check = readiness.clone();
        Arc::new(XdsContext {
            snapshot: self.core.pipeline.snapshot().clone(),
            connections: self.core.connections.clone(),
            push_slots: Arc::new(Semaphore::new(config.push_throttle.max(1))),
            metrics,
            options: config.generator,
            ready: Arc::new(move || ready_check.is_ready()),
            shutdown: self.shutdown.clone(),
            draining: self.draining.clone(),
            drain_duration: config.drain_duration,
            send_timeout: config.xds_limits.send_timeout,
            refusal_log: LogLimiter::new(10, Duration::from_secs(10)),
            stream_rate: config
                .max_requests_per_second
                .map(crate::ads::rate::StreamRateLimiter::new),
            sds: Some(sds.clone()),
            workloads: workloads.map(|c| c as Arc<dyn crate::ads::WorkloadHooks>),
            control_plane: crate::ads::debug::ControlPlaneId::from_environment().encoded(),
            debug: std::sync::OnceLock::new(),
            mcp: self.mcp.clone(),
        })
    }

    /// Each component defines the metrics of the state it owns; they are read on every
    /// scrape.
    fn register_metrics(&mut self) {
        let registry = &mut self.metrics_registry;
        if self.config.kubernetes.is_some()
            && let Some(lease) = &self.config.lease
        {
            self.registries
                .lease_state
                .register_metrics(registry, &lease.name);
        }
        self.registries.duties.register_metrics(registry);
        self.core.aggregate.register_metrics(registry);
        self.core.pipeline.register_metrics(registry);
        for started in &mut self.registries.started {
            if let Some(register) = started.metrics.take() {
                register(registry);
            }
        }
        if let Some(files) = &self.core.config_stores.files {
            files.status().register_metrics(registry);
        }
        if let Some(store) = &self.core.config_stores.kube {
            store.register_metrics(registry);
        }
    }
}

//! Wiring: build every part from a [`DiscoveryConfig`], bind the listeners, run, and
//! drain on shutdown.
//!
//! [`Server::start`] binds first and returns the real addresses ([`Bound`]), so tests
//! start the whole control plane on port 0 and connect at once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use arc_swap::ArcSwap;
use meshfed_kube::{KubeConfigStore, KubeConfigStoreConfig};
use meshfed_registry::config::{
    ConfigObject, ConfigStore, FileConfigStore, MemoryConfigStore, Spec, run_config_dir,
};
use meshfed_registry::mock_file::{self, MockFileStatus};
use meshfed_registry::serviceentry::{ServiceEntryConfig, ServiceEntryRegistry};
use meshfed_registry::{
    Aggregate, ClusterId, EndpointIndex, MemoryRegistry, ServiceRegistry, UpdateSink,
};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{error, info, warn};

use crate::admin::{self, AdminState};
use crate::ads::Connections;
use crate::ads::limit::LogLimiter;
use crate::ads::metrics::XdsMetrics;
use crate::ads::server::{AdsService, XdsContext};
use crate::ads::transport::{Acceptor, TransportMetrics, XdsConnectInfo, XdsLimits};
use crate::authn::Authenticators;
use crate::cert_service::{CaMetrics, CertificateService};
use crate::drain::{self, Shutdown, ShutdownTrigger};
use crate::generate::GeneratorOptions;
use crate::mesh::{self, MeshFile, MeshSettings};
use crate::push::config_index::{Config, ConfigIndex, ConfigSet};
use crate::push::debounce::DebounceConfig;
use crate::push::snapshot::Snapshot;
use crate::push::{ConfigSourceFn, Pipeline, PushMetrics};
use crate::readiness::Readiness;

/// The mock registry served when no file is given: a small echo service, so a
/// newcomer sees `meshfed discovery` serve at once.
pub const EMBEDDED_MOCK_REGISTRY: &str = include_str!("../examples/mock-registry.yaml");

/// Where the mock registry comes from.
#[derive(Clone, Debug)]
pub enum MockSource {
    /// No mock registry.
    None,
    /// The bundled example ([`EMBEDDED_MOCK_REGISTRY`]).
    Embedded,
    /// A watched YAML file.
    File(PathBuf),
}

/// How to reach a Kubernetes API server for the Kubernetes registry.
#[derive(Clone)]
pub enum KubeSource {
    /// `--kubeconfig FILE`, else `KUBECONFIG`, else in-cluster config.
    Kubeconfig(Option<PathBuf>),
    /// A ready client (tests and embedding applications).
    Client(meshfed_kube::Client),
}

impl std::fmt::Debug for KubeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KubeSource::Kubeconfig(p) => f.debug_tuple("Kubeconfig").field(p).finish(),
            KubeSource::Client(_) => f.write_str("Client(..)"),
        }
    }
}

/// The Kubernetes registry's settings.
#[derive(Clone, Debug)]
pub struct KubeSettings {
    /// Where the API server is.
    pub source: KubeSource,
    /// Which namespaces to publish (`--appNamespace`; all by default).
    pub namespaces: meshfed_kube::NamespaceFilter,
    /// Istio's system namespace (network label, remote secrets).
    pub system_namespace: String,
    /// Remote clusters from kubeconfig Secrets in the local cluster.
    pub remote_secrets: RemoteSecretSettings,
}

/// The remote-cluster secret controller (reference §3): Secrets labelled
/// `istio/multiCluster=true`, each data key a cluster id and its kubeconfig.
#[derive(Clone, Debug)]
pub struct RemoteSecretSettings {
    /// `--clusterRegistriesNamespace`: the namespace whose Secrets are read (default
    /// `istio-system`); `None` turns the controller off.
    pub namespace: Option<String>,
    /// `--allowInsecureKubeconfig`: kubeconfig options allowed although they run a
    /// command or read local files (`exec`, `tokenFile`, `clientCertificate`,
    /// `clientKey`, `certificateAuthority`, an auth provider name, or `all`).
    pub allow_insecure: Vec<String>,
}

impl Default for RemoteSecretSettings {
    fn default() -> Self {
        RemoteSecretSettings {
            namespace: Some("istio-system".into()),
            allow_insecure: Vec::new(),
        }
    }
}

/// The Consul registry's settings (`--registries Consul`, `--consulserverURL`, ...).
pub use meshfed_consul::ConsulConfig as ConsulSettings;

/// Everything `meshfed discovery` is configured with.
#[derive(Clone, Debug)]
pub struct DiscoveryConfig {
    /// Plaintext ADS address (`--grpcAddr`); `None` turns the plaintext port off.
    pub grpc_addr: Option<SocketAddr>,
    /// Secure ADS + CreateCertificate address (`--secureGrpcAddr`, Istio's 15012),
    /// served when there is a CA or serving files; `None` turns it off.
    pub secure_grpc_addr: Option<SocketAddr>,
    /// TLS and authentication of the secure port.
    pub secure: SecureSettings,
    /// New xDS streams a second on both ports, burst one
    /// (`--maxRequestsPerSecond`, Istio's `PILOT_MAX_REQUESTS_PER_SECOND`); `None`:
    /// no limit.
    pub max_requests_per_second: Option<f64>,
    /// `/ready` and debug address.
    pub http_addr: SocketAddr,
    /// `/metrics`, `/version` and debug address.
    pub monitoring_addr: SocketAddr,
    /// meshfed's own cluster id.
    pub cluster_id: ClusterId,
    /// DNS domain suffix (`--domain`, default `cluster.local`).
    pub domain: String,
    /// Mock registry source.
    pub mock: MockSource,
    /// The Kubernetes registry, when enabled.
    pub kubernetes: Option<KubeSettings>,
    /// With the Kubernetes registry: also read Istio config (the `networking.istio.io`
    /// CRDs) from its API server (`--kubeConfigStore`, default on).
    pub kube_config_store: bool,
    /// The Consul registry, when enabled.
    pub consul: Option<ConsulSettings>,
    /// `--configDir`: Istio config files, watched.
    pub config_dir: Option<PathBuf>,
    /// `--meshConfig`: MeshConfig YAML (Istio defaults when absent).
    pub mesh_config: Option<PathBuf>,
    /// `--networksConfig`: meshNetworks YAML.
    pub networks_config: Option<PathBuf>,
    /// Debounce timings.
    pub debounce: DebounceConfig,
    /// Concurrent pushes.
    pub push_throttle: usize,
    /// Limits of the xDS port.
    pub xds_limits: XdsLimits,
    /// The mesh CA (`--caDir`, `--cacertsDir`); `None`: no CA.
    pub ca: Option<CaSource>,
    /// With the Kubernetes registry: leader election over a Lease in the system
    /// namespace, for singleton duties (`--leaderElection`); `None` turns it off.
    pub lease: Option<LeaseSettings>,
    /// With the Kubernetes registry: the ConfigMap in the system namespace whose `mesh`
    /// and `meshNetworks` keys supply the mesh settings not given as files
    /// (`--meshConfigMap`, istiod's `istio`); `None` turns it off.
    pub mesh_config_map: Option<String>,
    /// How long after start readiness waits for the remote clusters present then
    /// (`--remoteClusterTimeout`, Istio's `PILOT_REMOTE_CLUSTER_TIMEOUT`); later ones
    /// never affect readiness.
    pub remote_cluster_timeout: Duration,
    /// Generator settings.
    pub generator: GeneratorOptions,
    /// Let non-loopback callers use the debug endpoints.
    pub debug_open: bool,
    /// How long shutdown waits for tasks before aborting them, after the drain.
    pub drain_deadline: Duration,
    /// Over how long the ADS streams are closed at shutdown (`--drainDuration`), so
    /// their proxies move to other replicas gradually; zero closes them all at once.
    pub drain_duration: Duration,
    /// `--maxConfigFileSize`: the size limit of every watched file (mock registry,
    /// `--configDir` files, mesh files), in bytes.
    pub max_config_file_size: u64,
    /// Run-time log level control for `/logging` (set by the binary).
    pub log_control: Option<crate::logging::LogControl>,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        let local = |port| SocketAddr::from(([127, 0, 0, 1], port));
        DiscoveryConfig {
            grpc_addr: Some(local(15010)),
            secure_grpc_addr: Some(local(15012)),
            secure: SecureSettings::default(),
            max_requests_per_second: Some(crate::ads::rate::istio_default_rate(
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            )),
            http_addr: local(8080),
            monitoring_addr: local(15014),
            cluster_id: ClusterId::new("Kubernetes"),
            domain: "cluster.local".into(),
            mock: MockSource::Embedded,
            kubernetes: None,
            kube_config_store: true,
            consul: None,
            config_dir: None,
            mesh_config: None,
            networks_config: None,
            debounce: DebounceConfig::default(),
            push_throttle: 100,
            xds_limits: XdsLimits::default(),
            ca: None,
            lease: Some(LeaseSettings::default()),
            mesh_config_map: Some("istio".into()),
            remote_cluster_timeout: Duration::from_secs(30),
            generator: GeneratorOptions::default(),
            debug_open: false,
            drain_deadline: Duration::from_secs(5),
            drain_duration: Duration::from_secs(5),
            max_config_file_size: meshfed_registry::read::DEFAULT_MAX_FILE_SIZE,
            log_control: None,
        }
    }
}

/// TLS and authentication of the secure port.
#[derive(Clone, Debug)]
pub struct SecureSettings {
    /// The operator's serving files (`--tlsCertFile`, `--tlsKeyFile`,
    /// `--caCertFile`); `None`: a certificate issued by the mesh CA.
    pub tls_files: Option<crate::tls::TlsFiles>,
    /// Extra DNS names of the CA-issued serving certificate (Istio's
    /// `ISTIOD_CUSTOM_HOST`).
    pub custom_hosts: Vec<String>,
    /// The control plane revision (`istiod-<revision>.<ns>.svc` in the DNS names).
    pub revision: String,
    /// The namespace of the control plane's DNS names (`--systemNamespace`).
    pub namespace: String,
    /// `--tlsMinVersion`.
    pub min_version: crate::tls::TlsMinVersion,
    /// Third-party JWT issuer (Istio's `JWT_RULE`), JSON.
    pub jwt_rule: Option<String>,
    /// Audiences a Kubernetes token must have (Istio's `TOKEN_AUDIENCES`).
    pub token_audiences: Vec<String>,
    /// Where to write the root bundle for workloads outside Kubernetes
    /// (`--rootCertFile`).
    pub root_cert_file: Option<PathBuf>,
}

impl Default for SecureSettings {
    fn default() -> Self {
        SecureSettings {
            tls_files: None,
            custom_hosts: Vec::new(),
            revision: String::new(),
            namespace: "istio-system".into(),
            min_version: crate::tls::TlsMinVersion::V12,
            jwt_rule: None,
            token_audiences: vec!["istio-ca".into()],
            root_cert_file: None,
        }
    }
}

/// Where the mesh CA comes from.
#[derive(Clone, Debug)]
pub enum CaSource {
    /// Outside Kubernetes: a plugged-in CA from the `cacerts` directory when its
    /// files are there (`--cacertsDir`), else the self-signed root kept in
    /// `self_signed_dir` (created on first start, `--caDir`).
    Dir {
        /// Istio's `cacerts` files: ca-cert.pem, ca-key.pem, root-cert.pem,
        /// cert-chain.pem.
        cacerts: Option<PathBuf>,
        /// Where the self-signed root is kept.
        self_signed_dir: PathBuf,
    },
    /// With the Kubernetes registry (Istio's layout): the `cacerts` directory when
    /// mounted and complete, else the `cacerts` Secret of the system namespace, else
    /// the self-signed root of Secret `istio-ca-secret` (created once; every replica
    /// shares it).
    Kubernetes {
        /// A mounted `cacerts` Secret.
        cacerts: Option<PathBuf>,
    },
}

impl CaSource {
    /// Loads the CA; the Kubernetes source reads and writes its Secrets in
    /// `namespace` through `client`. Returns the CA and where it came from.
    async fn load(
        &self,
        trust_domain: &str,
        kube: Option<(&meshfed_kube::Client, &str)>,
    ) -> anyhow::Result<(crate::ca::Ca, String)> {
        let cacerts = match self {
            CaSource::Dir { cacerts, .. } | CaSource::Kubernetes { cacerts } => cacerts,
        };
        if let Some(dir) = cacerts
            && let Some(ca) = crate::ca::Ca::plugged(dir).with_context(|| {
                format!("loading the plugged-in CA (--cacertsDir {})", dir.display())
            })?
        {
            return Ok((ca, format!("plugged in from {}", dir.display())));
        }
        match self {
            CaSource::Dir {
                self_signed_dir, ..
            } => {
                let ca = crate::ca::Ca::self_signed(self_signed_dir, trust_domain).with_context(
                    || {
                        format!(
                            "loading or creating the self-signed CA (--caDir {})",
                            self_signed_dir.display()
                        )
                    },
                )?;
                Ok((
                    ca,
                    format!("self-signed, kept in {}", self_signed_dir.display()),
                ))
            }
            CaSource::Kubernetes { .. } => {
                let (client, namespace) = kube
                    .context("the Kubernetes CA needs the Kubernetes registry (or give --caDir)")?;
                if let Some(pems) = meshfed_kube::read_cacerts(client, namespace).await? {
                    let ca = crate::ca::Ca::from_pems(
                        pems.ca_cert,
                        &pems.ca_key,
                        &pems.cert_chain,
                        pems.root_cert,
                    )
                    .with_context(|| format!("the plugged-in CA of Secret {namespace}/cacerts"))?;
                    return Ok((ca, format!("plugged in from Secret {namespace}/cacerts")));
                }
                let (cert, key) =
                    meshfed_kube::load_or_create_self_signed(client, namespace, || {
                        crate::ca::Ca::generate_root(trust_domain)
                    })
                    .await?;
                let ca =
                    crate::ca::Ca::from_pems(cert.clone(), &key, "", cert).with_context(|| {
                        format!("the self-signed CA of Secret {namespace}/istio-ca-secret")
                    })?;
                Ok((
                    ca,
                    format!("self-signed, kept in Secret {namespace}/istio-ca-secret"),
                ))
            }
        }
    }
}

/// Leader election settings (client-go's defaults).
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// The Lease's name in the system namespace.
    pub name: String,
    /// This replica's identity (`--leaseIdentity`; else `$POD_NAME`; else the host
    /// name and process id).
    pub identity: Option<String>,
    /// How long an unrenewed Lease stays with its holder.
    pub duration: Duration,
    /// How often it is renewed (and retried by the others).
    pub renew_every: Duration,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        LeaseSettings {
            name: "meshfed-leader".into(),
            identity: None,
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(2),
        }
    }
}

impl LeaseSettings {
    fn identity(&self) -> String {
        if let Some(id) = &self.identity {
            return id.clone();
        }
        if let Ok(pod) = std::env::var("POD_NAME")
            && !pod.is_empty()
        {
            return pod;
        }
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    }
}

/// The addresses the server actually listens on.
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    /// The plaintext xDS port, unless turned off.
    pub grpc: Option<SocketAddr>,
    /// The secure xDS port, when served.
    pub secure_grpc: Option<SocketAddr>,
    pub http: SocketAddr,
    pub monitoring: SocketAddr,
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

/// The Istio config stores: one in memory (for the Rust API), with `--configDir` one
/// fed from files, and with the Kubernetes registry one fed from its API server's CRDs
/// (its writer starts with the registry, once there is a client).
#[derive(Clone, Debug)]
struct ConfigStores {
    memory: MemoryConfigStore,
    files: Option<FileConfigStore>,
    kube: Option<KubeConfigStore>,
}

impl ConfigStores {
    fn start(
        config: &DiscoveryConfig,
        sink: &UpdateSink,
        shutdown: &Shutdown,
        tasks: &mut JoinSet<()>,
    ) -> anyhow::Result<ConfigStores> {
        let memory = MemoryConfigStore::new(sink.clone());
        let files = match &config.config_dir {
            None => None,
            Some(dir) => {
                if !dir.is_dir() {
                    anyhow::bail!("--configDir {}: not a directory", dir.display());
                }
                let store = FileConfigStore::new(sink.clone());
                let task_store = store.clone();
                let dir = dir.clone();
                let mut stop = shutdown.clone();
                let limit = config.max_config_file_size;
                info!(dir = %dir.display(), "config: following directory");
                tasks.spawn(async move {
                    if let Err(err) =
                        run_config_dir(dir, task_store, limit, async move { stop.wait().await })
                            .await
                    {
                        error!("config directory: {err}");
                    }
                });
                Some(store)
            }
        };
        let kube = match &config.kubernetes {
            Some(kube) if config.kube_config_store => {
                let store_config = KubeConfigStoreConfig {
                    namespaces: kube.namespaces.clone(),
                    ..KubeConfigStoreConfig::new(config.cluster_id.clone())
                };
                Some(
                    KubeConfigStore::new(store_config, sink.clone())
                        .context("the Kubernetes config store")?,
                )
            }
            _ => None,
        };
        Ok(ConfigStores {
            memory,
            files,
            kube,
        })
    }

    fn all(&self) -> Vec<Arc<dyn ConfigStore>> {
        let mut all: Vec<Arc<dyn ConfigStore>> = vec![Arc::new(self.memory.clone())];
        if let Some(files) = &self.files {
            all.push(Arc::new(files.clone()));
        }
        if let Some(kube) = &self.kube {
            all.push(Arc::new(kube.clone()));
        }
        all
    }

    /// Starts the ServiceEntry / WorkloadEntry registry over every store (provider
    /// `External`, meshfed's own cluster id) and returns it for the aggregate.
    fn start_service_entries(
        &self,
        cluster_id: &ClusterId,
        trust_domain: &str,
        sink: &UpdateSink,
        shutdown: &Shutdown,
        tasks: &mut JoinSet<()>,
    ) -> ServiceEntryRegistry {
        let config = ServiceEntryConfig {
            cluster_id: cluster_id.clone(),
            trust_domain: trust_domain.to_string(),
        };
        let registry = ServiceEntryRegistry::new(config, self.all(), sink.clone());
        let mut stop = shutdown.clone();
        tasks.spawn(registry.clone().run(async move { stop.wait().await }));
        registry
    }

    /// Builds the snapshot's config index from every store.
    fn source(
        &self,
        domain: &str,
        metrics: Arc<PushMetrics>,
        jwks: crate::jwks::JwksResolver,
    ) -> ConfigSourceFn {
        let stores = self.all();
        let domain = domain.to_string();
        // The security objects last warned about, so a WARN goes out when they change.
        let warned: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        Arc::new(move |mesh| {
            let mut set = ConfigSet::default();
            let rejected: usize = stores.iter().map(|s| s.rejected().len()).sum();
            metrics.config_rejected.set(rejected as i64);
            let mut not_enforced = Vec::new();
            for store in &stores {
                for object in store.all() {
                    if let Some(gap) = meshfed_registry::config::validate::not_enforced_in(
                        &object,
                        Some(&mesh.config),
                    ) {
                        not_enforced.push(format!(
                            "{} {}/{} ({}): {gap}",
                            object.kind, object.namespace, object.name, object.source
                        ));
                    }
                    add_to_set(&mut set, &object);
                }
            }
            metrics.config_not_enforced.set(not_enforced.len() as i64);
            not_enforced.sort();
            let mut last = warned.lock().unwrap_or_else(|e| e.into_inner());
            if *last != not_enforced {
                if !not_enforced.is_empty() {
                    tracing::warn!(
                        objects = %not_enforced.join("; "),
                        "security.istio.io objects meshfed does not fully apply yet"
                    );
                }
                *last = not_enforced;
            }
            // The keys of the RequestAuthentications as fetched so far; new ones are
            // fetched now and push when they arrive.
            let keys = jwks.table_for(&set.request_authentications);
            ConfigIndex::new(set, &domain, mesh).with_jwks(keys)
        })
    }
}

fn add_to_set(set: &mut ConfigSet, object: &ConfigObject) {
    fn wrap<T: Clone>(o: &ConfigObject, spec: &T) -> Config<T> {
        Config {
            name: o.name.clone(),
            namespace: o.namespace.clone(),
            labels: o.labels.clone(),
            annotations: o.annotations.clone(),
            creation_time: o.creation_time,
            spec: spec.clone(),
        }
    }
    match &object.spec {
        Spec::VirtualService(vs) => set.virtual_services.push(wrap(object, vs)),
        Spec::DestinationRule(dr) => set.destination_rules.push(wrap(object, dr)),
        Spec::Gateway(g) => set.gateways.push(wrap(object, g)),
        Spec::Sidecar(sc) => set.sidecars.push(wrap(object, sc)),
        Spec::PeerAuthentication(pa) => set.peer_authentications.push(wrap(object, pa)),
        Spec::RequestAuthentication(ra) => set.request_authentications.push(wrap(object, ra)),
        Spec::AuthorizationPolicy(ap) => set.authorization_policies.push(wrap(object, ap)),
        // ServiceEntry and WorkloadEntry feed the service registry, not the indexes.
        Spec::ServiceEntry(_) | Spec::WorkloadEntry(_) => {}
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
        let xds_metrics = Arc::new(XdsMetrics::new(&mut metrics_registry));
        let push_metrics = Arc::new(PushMetrics::new(&mut metrics_registry));

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
        let mut tasks = JoinSet::new();
        let config_stores = ConfigStores::start(&config, &sink, &shutdown, &mut tasks)?;
        aggregate.add_registry(Arc::new(config_stores.start_service_entries(
            &config.cluster_id,
            &mesh_settings.load().config.trust_domain,
            &sink,
            &shutdown,
            &mut tasks,
        )));
        // RequestAuthentication keys, fetched by the control plane and inlined.
        let (fetch_mode, unknown) = crate::generate::jwt::JwksFetchMode::parse(
            std::env::var(crate::jwks::REMOTE_JWKS_ENV).ok().as_deref(),
        );
        if let Some(e) = unknown {
            warn!("{e}");
        }
        let jwks = crate::jwks::JwksResolver::with_mode(
            sink.clone(),
            Arc::new(crate::jwks::JwksMetrics::new(&mut metrics_registry)),
            fetch_mode,
        );
        tasks.spawn(jwks.clone().run(shutdown.clone()));
        let pipeline = Arc::new(Pipeline::new(
            aggregate.clone(),
            index,
            connections.clone(),
            push_metrics.clone(),
            mesh_settings.clone(),
            config_stores.source(&config.domain, push_metrics, jwks),
        ));

        for (path, which) in [
            (&config.mesh_config, MeshFile::Config),
            (&config.networks_config, MeshFile::Networks),
        ] {
            if let Some(path) = path {
                let mut stop = shutdown.clone();
                let follower = mesh::follow(
                    path.clone(),
                    which,
                    mesh_settings.clone(),
                    sink.clone(),
                    config.max_config_file_size,
                    async move { stop.wait().await },
                )?;
                info!(file = %path.display(), kind = ?which, "following mesh file");
                tasks.spawn(follower);
            }
        }
        let mock_status = start_mock_registry(&config, &aggregate, &sink, &shutdown, &mut tasks)?;
        let mut secret_controller = None;
        let mut mesh_map_synced = None;
        let mut kube_client = None;
        // Without leader election this replica does the singleton duties itself.
        let lease_state = Arc::new(if config.lease.is_some() {
            meshfed_kube::LeaseState::default()
        } else {
            meshfed_kube::LeaseState::sole()
        });
        if let Some(kube) = &config.kubernetes {
            let client;
            (client, secret_controller, mesh_map_synced) = start_kube_registry(
                &config,
                kube,
                &lease_state,
                config_stores.kube.as_ref(),
                &mesh_settings,
                &aggregate,
                &sink,
                &shutdown,
                &mut tasks,
            )
            .await?;
            kube_client = Some(client);
        }
        // Gateway credentials (SDS): Kubernetes Secrets when there is a cluster, and
        // the config directory's `kind: Secret` objects.
        let sds = Arc::new(crate::sds::Sds::new(
            config.cluster_id.clone(),
            kube_client.as_ref().map(|client| crate::sds::KubeSecrets {
                config_cluster: config.cluster_id.clone(),
                local: client.clone(),
                remote: secret_controller.clone(),
            }),
            config_stores.files.clone(),
            sink.clone(),
            shutdown.clone(),
            crate::sds::SdsMetrics::new(&mut metrics_registry),
        ));
        let mut consul_registry = None;
        if let Some(consul) = &config.consul {
            consul_registry = Some(
                start_consul_registry(consul, &aggregate, &sink, &shutdown, &mut tasks).await?,
            );
        }

        // The first snapshot reflects whatever the registries already hold.
        pipeline.apply(
            meshfed_registry::PushRequest::forced(meshfed_registry::TriggerReason::Global),
            0,
        );
        tasks.spawn(
            pipeline
                .clone()
                .run(events, config.debounce, shutdown.clone()),
        );

        let grpc = match config.grpc_addr {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding the xDS address {addr} (--grpcAddr)"))?,
            ),
            None => None,
        };
        let http = TcpListener::bind(config.http_addr).await.with_context(|| {
            format!("binding the HTTP address {} (--httpAddr)", config.http_addr)
        })?;
        let monitoring = TcpListener::bind(config.monitoring_addr)
            .await
            .with_context(|| {
                format!(
                    "binding the monitoring address {} (--monitoringAddr)",
                    config.monitoring_addr
                )
            })?;
        let system_namespace = config
            .kubernetes
            .as_ref()
            .map(|k| k.system_namespace.clone())
            .unwrap_or_else(|| config.secure.namespace.clone());
        let ca = match &config.ca {
            Some(source) => {
                let trust_domain = mesh_settings.load().config.trust_domain.clone();
                let kube = kube_client.as_ref().map(|c| (c, system_namespace.as_str()));
                let (ca, from) = source.load(&trust_domain, kube).await?;
                info!(root = %from, "mesh CA ready");
                Some((Arc::new(ca), from))
            }
            None => None,
        };
        let secure = match config.secure_grpc_addr {
            Some(_) if ca.is_none() && config.secure.tls_files.is_none() => {
                info!(
                    "secure xDS port off: no mesh CA (--caDir) and no serving files (--tlsCertFile)"
                );
                None
            }
            Some(addr) => {
                let listener = TcpListener::bind(addr).await.with_context(|| {
                    format!("binding the secure xDS address {addr} (--secureGrpcAddr)")
                })?;
                Some(listener)
            }
            None => None,
        };
        let bound = Bound {
            grpc: grpc.as_ref().map(TcpListener::local_addr).transpose()?,
            secure_grpc: secure.as_ref().map(TcpListener::local_addr).transpose()?,
            http: http.local_addr()?,
            monitoring: monitoring.local_addr()?,
        };

        let mut readiness = Readiness::new(
            aggregate.clone(),
            config_stores.all(),
            secret_controller.clone(),
            config.cluster_id.clone(),
            config.remote_cluster_timeout,
        )
        .draining_on(draining.clone());
        if let Some((name, synced)) = mesh_map_synced {
            readiness = readiness.also_wait_for(format!("mesh ConfigMap {name}"), synced);
        }
        let readiness = Arc::new(readiness);
        // Checked until ready, so the latch is set as soon as everything has synced,
        // whether or not anyone asks.
        let until_ready = readiness.clone();
        let mut stop = shutdown.clone();
        tasks.spawn(async move {
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
        let ready_check = readiness.clone();
        let ctx = XdsContext {
            snapshot: pipeline.snapshot().clone(),
            connections: connections.clone(),
            push_slots: Arc::new(Semaphore::new(config.push_throttle.max(1))),
            metrics: xds_metrics,
            options: config.generator,
            ready: Arc::new(move || ready_check.is_ready()),
            shutdown: shutdown.clone(),
            draining: draining.clone(),
            drain_duration: config.drain_duration,
            send_timeout: config.xds_limits.send_timeout,
            refusal_log: LogLimiter::new(10, Duration::from_secs(10)),
            stream_rate: None,
            sds: Some(sds.clone()),
        };
        let ca_debug = ca.clone();
        let ca = ca.map(|(ca, _)| ca);
        let stream_rate = config
            .max_requests_per_second
            .map(crate::ads::rate::StreamRateLimiter::new);
        let ctx = Arc::new(XdsContext { stream_rate, ..ctx });
        let ca_metrics = ca.as_ref().map(|ca| {
            let metrics = CaMetrics::new(&mut metrics_registry);
            metrics.register_expiry(&mut metrics_registry, ca);
            metrics
        });
        if let (Some(ca), Some(client)) = (&ca, &kube_client) {
            let stats = Arc::new(meshfed_kube::RootCertStats::default());
            stats.register_metrics(&mut metrics_registry);
            let (root_tx, root_rx) = tokio::sync::watch::channel(ca.root_pem().to_string());
            let mut stop = shutdown.clone();
            let publisher = meshfed_kube::run_root_cert_publisher(
                client.clone(),
                lease_state.clone(),
                root_rx,
                stats,
                async move { stop.wait().await },
            );
            tasks.spawn(async move {
                publisher.await;
                drop(root_tx);
            });
        }
        if let (Some(ca), Some(path)) = (&ca, &config.secure.root_cert_file) {
            crate::ca::write_public(path, ca.root_pem()).with_context(|| {
                format!(
                    "writing the root bundle (--rootCertFile {})",
                    path.display()
                )
            })?;
        }
        let transport_metrics = TransportMetrics::new(&mut metrics_registry);
        if let Some(grpc) = grpc {
            // On the plaintext port CreateCertificate has no authenticator and refuses
            // every caller, as istiod does on 15010.
            let certificates = ca
                .as_ref()
                .zip(ca_metrics.clone())
                .map(|(ca, metrics)| CertificateService::new(ca.clone(), None, metrics));
            let acceptor =
                Acceptor::new(grpc, config.xds_limits.clone(), transport_metrics.clone());
            tasks.spawn(serve_grpc(
                acceptor.into_stream(),
                config.xds_limits.clone(),
                AdsService::new(ctx.clone()),
                certificates,
                draining.clone(),
            ));
        }
        if let Some(listener) = secure {
            let source = match &config.secure.tls_files {
                Some(files) => crate::tls::ServingSource::Files(files.clone()),
                None => crate::tls::ServingSource::Ca(crate::tls::istiod_dns_names(
                    &config.secure.custom_hosts,
                    &config.secure.namespace,
                    &config.secure.revision,
                )),
            };
            let trust_domain = mesh_settings.load().config.trust_domain.clone();
            let tls = Arc::new(
                crate::tls::SecureTls::new(
                    &source,
                    ca.clone(),
                    &trust_domain,
                    config.secure.min_version,
                )
                .context("setting up TLS of the secure xDS port (--secureGrpcAddr)")?,
            );
            tls.register_metrics(&mut metrics_registry);
            let mut stop = shutdown.clone();
            tasks.spawn(
                tls.clone()
                    .follow(source.clone(), async move { stop.wait().await }),
            );
            let authenticators = Arc::new(
                build_authenticators(
                    &config,
                    &trust_domain,
                    kube_client.clone(),
                    secret_controller.clone(),
                )
                .await?,
            );
            info!(authenticators = ?authenticators.names(), serving = ?source, "secure xDS port ready");
            let certificates = ca.as_ref().zip(ca_metrics).map(|(ca, metrics)| {
                CertificateService::new(ca.clone(), Some((*authenticators).clone()), metrics)
            });
            let acceptor = Acceptor::new(listener, config.xds_limits.clone(), transport_metrics);
            let handshake = config
                .xds_limits
                .handshake_timeout
                .unwrap_or(Duration::from_secs(10));
            tasks.spawn(serve_grpc(
                crate::tls::incoming(acceptor, tls, handshake),
                config.xds_limits.clone(),
                AdsService::secure(ctx, authenticators),
                certificates,
                draining,
            ));
        }

        if config.kubernetes.is_some()
            && let Some(lease) = &config.lease
        {
            lease_state.register_metrics(&mut metrics_registry, &lease.name);
        }
        // Each component defines the metrics of the state it owns; they are read on
        // every scrape.
        aggregate.register_metrics(&mut metrics_registry);
        pipeline.register_metrics(&mut metrics_registry);
        metrics_registry.register_collector(Box::new(
            crate::push::snapshot::RejectedConfigsMetric(pipeline.snapshot().clone()),
        ));
        if let Some(status) = &mock_status {
            status.register_metrics(&mut metrics_registry);
        }
        if let Some(files) = &config_stores.files {
            files.status().register_metrics(&mut metrics_registry);
        }
        if let Some(consul) = &consul_registry {
            consul.register_metrics(&mut metrics_registry);
        }
        if let Some(store) = &config_stores.kube {
            store.register_metrics(&mut metrics_registry);
        }
        if let Some(controller) = &secret_controller {
            controller.register_metrics(&mut metrics_registry);
        }
        let admin_state = AdminState {
            aggregate: aggregate.clone(),
            pipeline: pipeline.clone(),
            connections: connections.clone(),
            metrics: Arc::new(metrics_registry),
            debug_open: config.debug_open,
            log_control: config.log_control.clone(),
            config_stores: config_stores.all(),
            multicluster: secret_controller,
            generator: config.generator,
            readiness,
            ca: ca_debug,
            sds: Some(sds),
        };
        tasks.spawn(serve_http(
            http,
            admin::http_router(admin_state.clone()),
            shutdown.clone(),
        ));
        tasks.spawn(serve_http(
            monitoring,
            admin::monitoring_router(admin_state),
            shutdown.clone(),
        ));

        info!(
            grpc = ?bound.grpc, secure_grpc = ?bound.secure_grpc, http = %bound.http, monitoring = %bound.monitoring,
            registries = ?aggregate.registries().iter().map(|r| r.shard_key().to_string()).collect::<Vec<_>>(),
            "meshfed discovery serving"
        );
        Ok(Server {
            bound,
            trigger,
            drain_trigger,
            drain_duration: config.drain_duration,
            tasks,
            drain_deadline: config.drain_deadline,
            aggregate,
            sink,
            pipeline,
            connections,
            mock_status,
            config_stores,
        })
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

    /// Waits for Ctrl-C or SIGTERM, then shuts down. A signal that arrives before
    /// this is called takes the default action (the process dies): the binary uses
    /// [`ShutdownSignals`] taken before the server starts instead.
    pub async fn run_until_signal(self) {
        wait_for_signal().await;
        info!("shutdown signal received, draining");
        self.shutdown().await;
    }

    /// Waits for `signals`, then shuts down.
    pub async fn run_until(self, signals: ShutdownSignals) {
        signals.wait().await;
        info!("shutdown signal received, draining");
        self.shutdown().await;
    }

    /// Drains, then stops every task: first `/ready` turns 503, the xDS port stops
    /// accepting and sends HTTP/2 GOAWAY, and the ADS streams are closed one by one over
    /// the drain duration (each proxy reconnects to another replica); then every task
    /// is stopped, gracefully first, aborted after the drain deadline.
    pub async fn shutdown(mut self) {
        self.drain_trigger.trigger();
        if !self.drain_duration.is_zero() {
            info!(connections = self.connections.len(), over = ?self.drain_duration, "draining the ADS streams");
            let until = tokio::time::Instant::now() + self.drain_duration + Duration::from_secs(1);
            while !self.connections.is_empty() && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.trigger.trigger();
        let drained = tokio::time::timeout(self.drain_deadline, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(deadline = ?self.drain_deadline, "tasks still running after the drain deadline; aborting them");
            self.tasks.abort_all();
            while self.tasks.join_next().await.is_some() {}
        }
        info!("meshfed stopped");
    }
}

/// Starts the local cluster's registry, the writer of its CRD config store (when there
/// is one) and, unless turned off, the remote-cluster secret controller, whose handle
/// (counters, managed clusters) is returned.
#[allow(clippy::too_many_arguments)]
async fn start_kube_registry(
    config: &DiscoveryConfig,
    kube: &KubeSettings,
    lease_state: &Arc<meshfed_kube::LeaseState>,
    config_store: Option<&KubeConfigStore>,
    mesh: &Arc<ArcSwap<MeshSettings>>,
    aggregate: &Arc<Aggregate>,
    sink: &UpdateSink,
    shutdown: &Shutdown,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<(
    meshfed_kube::Client,
    Option<Arc<meshfed_kube::SecretController>>,
    Option<(String, Arc<std::sync::atomic::AtomicBool>)>,
)> {
    let client = match &kube.source {
        KubeSource::Client(client) => client.clone(),
        KubeSource::Kubeconfig(path) => meshfed_kube::client_from(path.as_deref())
            .await
            .context("connecting to Kubernetes (--kubeconfig, KUBECONFIG or in-cluster config)")?,
    };
    // meshNetworks `registryServiceName` gateways, read live so reloads apply.
    let live = mesh.clone();
    let mesh_gateways = meshfed_kube::MeshGateways::new(move |cluster| {
        crate::networks::registry_service_gateways(&live.load().networks, cluster)
    });
    let registry_config = meshfed_kube::KubeRegistryConfig {
        cluster_id: config.cluster_id.clone(),
        domain: config.domain.clone(),
        trust_domain: mesh.load().config.trust_domain.clone(),
        system_namespace: kube.system_namespace.clone(),
        namespaces: kube.namespaces.clone(),
        mesh_gateways,
    };
    let mut stop = shutdown.clone();
    let (registry, writer) = meshfed_kube::KubeRegistry::start(
        client.clone(),
        registry_config.clone(),
        sink.clone(),
        async move { stop.wait().await },
    )
    .await
    .context("starting the Kubernetes registry")?;
    aggregate.add_registry(registry);
    tasks.spawn(async move {
        let _ = writer.await;
    });
    info!(cluster = %config.cluster_id, "Kubernetes registry started; /ready waits for its initial sync");
    if let Some(store) = config_store {
        let mut stop = shutdown.clone();
        tasks.spawn(meshfed_kube::run_kube_config(
            client.clone(),
            store.clone(),
            async move { stop.wait().await },
        ));
        info!(cluster = %config.cluster_id, "Kubernetes config store started (networking.istio.io CRDs); /ready waits for its initial lists");
    }

    if let Some(lease) = &config.lease {
        let lease_config = meshfed_kube::LeaseConfig {
            duration: lease.duration,
            renew_every: lease.renew_every,
            ..meshfed_kube::LeaseConfig::new(&kube.system_namespace, &lease.name, &lease.identity())
        };
        info!(lease = %format!("{}/{}", kube.system_namespace, lease.name), identity = %lease_config.identity, "leader election started");
        let mut stop = shutdown.clone();
        tasks.spawn(meshfed_kube::run_lease(
            client.clone(),
            lease_config,
            lease_state.clone(),
            async move { stop.wait().await },
        ));
    }

    // Mesh settings not given as files come from istiod's ConfigMap.
    let keys = mesh::MapKeys {
        mesh: config.mesh_config.is_none(),
        networks: config.networks_config.is_none(),
    };
    let mut mesh_map = None;
    if let Some(name) = &config.mesh_config_map
        && (keys.mesh || keys.networks)
    {
        let synced = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let full_name = format!("{}/{name}", kube.system_namespace);
        let updates = meshfed_kube::follow_config_map(client.clone(), &kube.system_namespace, name);
        let mut stop = shutdown.clone();
        tasks.spawn(mesh::follow_config_map(
            updates,
            full_name.clone(),
            keys,
            mesh.clone(),
            sink.clone(),
            synced.clone(),
            async move { stop.wait().await },
        ));
        info!(configmap = %full_name, mesh = keys.mesh, mesh_networks = keys.networks, "following the mesh ConfigMap; /ready waits for its initial list");
        mesh_map = Some((full_name, synced));
    }

    let Some(namespace) = &kube.remote_secrets.namespace else {
        return Ok((client, None, mesh_map));
    };
    let multicluster = meshfed_kube::MulticlusterConfig {
        namespace: namespace.clone(),
        policy: meshfed_kube::KubeconfigPolicy::allowing(&kube.remote_secrets.allow_insecure),
        sync_timeout: config.remote_cluster_timeout,
        ..meshfed_kube::MulticlusterConfig::new(config.cluster_id.clone(), registry_config)
    };
    let mut stop = shutdown.clone();
    let (controller, task) = meshfed_kube::SecretController::start(
        client.clone(),
        multicluster,
        aggregate.clone(),
        sink.clone(),
        async move { stop.wait().await },
    );
    tasks.spawn(async move {
        let _ = task.await;
    });
    info!(%namespace, "remote cluster secret controller started (Secrets labelled istio/multiCluster=true)");
    Ok((client, Some(controller), mesh_map))
}

async fn start_consul_registry(
    consul: &ConsulSettings,
    aggregate: &Arc<Aggregate>,
    sink: &UpdateSink,
    shutdown: &Shutdown,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<Arc<meshfed_consul::ConsulRegistry>> {
    let mut stop = shutdown.clone();
    let (registry, writer) =
        meshfed_consul::ConsulRegistry::start(consul.clone(), sink.clone(), async move {
            stop.wait().await
        })
        .await
        .with_context(|| format!("starting the Consul registry ({})", consul.url))?;
    info!(
        url = %consul.url, datacenter = registry.datacenter(),
        "Consul registry started; /ready waits for its initial sync"
    );
    aggregate.add_registry(registry.clone());
    tasks.spawn(async move {
        let _ = writer.await;
    });
    Ok(registry)
}

fn start_mock_registry(
    config: &DiscoveryConfig,
    aggregate: &Arc<Aggregate>,
    sink: &UpdateSink,
    shutdown: &Shutdown,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<Option<MockFileStatus>> {
    match &config.mock {
        MockSource::None => Ok(None),
        MockSource::Embedded => {
            let registry = MemoryRegistry::new(config.cluster_id.clone(), sink.clone());
            let services = mock_file::parse_mock_registry(
                std::path::Path::new("<embedded mock-registry.yaml>"),
                EMBEDDED_MOCK_REGISTRY,
            )
            .context("the embedded mock registry is invalid")?;
            registry.replace_all(services);
            aggregate.add_registry(Arc::new(registry));
            info!("mock registry: embedded example (use --mockRegistryFile to serve your own)");
            Ok(None)
        }
        MockSource::File(path) => {
            let registry = MemoryRegistry::new_unsynced(config.cluster_id.clone(), sink.clone());
            aggregate.add_registry(Arc::new(registry.clone()));
            let status = MockFileStatus::new();
            let mut stop = shutdown.clone();
            let task_status = status.clone();
            let path = path.clone();
            let options = mock_file::MockFileOptions {
                max_file_size: config.max_config_file_size,
                ..mock_file::MockFileOptions::default()
            };
            info!(file = %path.display(), "mock registry: following file");
            tasks.spawn(async move {
                if let Err(err) =
                    mock_file::run_mock_file(path, registry, task_status, options, async move {
                        stop.wait().await
                    })
                    .await
                {
                    error!("mock registry file: {err}");
                }
            });
            Ok(Some(status))
        }
    }
}

/// The authenticators of the secure port, in Istio's order: client certificates,
/// third-party JWTs (`--jwtRule`), Kubernetes tokens through a TokenReview (with the
/// Kubernetes registry).
async fn build_authenticators(
    config: &DiscoveryConfig,
    trust_domain: &str,
    kube_client: Option<meshfed_kube::Client>,
    remotes: Option<Arc<meshfed_kube::SecretController>>,
) -> anyhow::Result<Authenticators> {
    let mut chain: Vec<Arc<dyn crate::authn::Authenticator>> =
        vec![Arc::new(crate::authn::ClientCertAuthenticator)];
    if let Some(rule) = &config.secure.jwt_rule {
        let rule = crate::authn::jwt::JwtRule::parse(rule)
            .map_err(|e| anyhow::anyhow!("--jwtRule (JWT_RULE): {e}"))?;
        let issuer = rule.issuer.clone();
        let jwt = crate::authn::jwt::JwtAuthenticator::new(rule, trust_domain.to_string())
            .await
            .map_err(|e| anyhow::anyhow!("--jwtRule (JWT_RULE) issuer {issuer}: {e}"))?;
        chain.push(Arc::new(jwt));
    }
    if let Some(client) = kube_client {
        chain.push(Arc::new(crate::authn::kube::KubeJwtAuthenticator::new(
            client,
            config.cluster_id.clone(),
            remotes,
            config.secure.token_audiences.clone(),
            trust_domain.to_string(),
        )));
    }
    Ok(Authenticators::new(chain))
}

async fn serve_grpc<IO, IE>(
    incoming: impl futures::Stream<Item = Result<IO, IE>> + Send + 'static,
    limits: XdsLimits,
    ads: AdsService,
    certificates: Option<CertificateService>,
    mut shutdown: Shutdown,
) where
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected<ConnectInfo = XdsConnectInfo>
        + Unpin
        + Send
        + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut server = tonic::transport::Server::builder()
        // Istio's GRPC_KEEPALIVE_INTERVAL and GRPC_KEEPALIVE_TIMEOUT.
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .max_concurrent_streams(limits.max_concurrent_streams);
    if let Some(age) = limits.max_connection_age {
        // Istio's grace after the GOAWAY of an aged connection.
        server = server
            .max_connection_age(age)
            .max_connection_age_grace(Duration::from_secs(10));
    }
    let result = server
        // Any call on the port (every service mounted here) ends the handshake
        // deadline of its connection.
        .layer(tonic::service::InterceptorLayer::new(
            |request: tonic::Request<()>| {
                if let Some(info) = request.extensions().get::<XdsConnectInfo>() {
                    info.control.stream_started();
                }
                Ok(request)
            },
        ))
        .add_service(ads)
        .add_optional_service(certificates)
        .serve_with_incoming_shutdown(incoming, async move { shutdown.wait().await })
        .await;
    if let Err(err) = result {
        error!("xDS server failed: {err}");
    }
}

async fn serve_http(listener: TcpListener, router: axum::Router, mut shutdown: Shutdown) {
    let service = router.into_make_service_with_connect_info::<SocketAddr>();
    if let Err(err) = axum::serve(listener, service)
        .with_graceful_shutdown(async move { shutdown.wait().await })
        .await
    {
        error!("admin HTTP server failed: {err}");
    }
}

/// SIGTERM and SIGINT, listened for from the moment this is made: a signal that comes
/// while the server is still starting is kept, and shuts it down once it runs (rather
/// than killing the process with the default action).
#[derive(Debug)]
pub struct ShutdownSignals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    /// Starts listening (in a tokio runtime).
    pub fn listen() -> std::io::Result<ShutdownSignals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(ShutdownSignals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(ShutdownSignals {})
        }
    }

    /// Resolves at the first signal (at once if one already came).
    pub async fn wait(mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

//! The secure side: the mesh CA, the root bundle it publishes, the authenticators and
//! TLS of the secure xDS port.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use meshfed_kube::{Duties, Duty};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tracing::{info, warn};

use super::serve::serve_grpc;
use super::{CaSource, DiscoveryConfig};
use crate::ads::server::{AdsService, XdsContext};
use crate::ads::transport::{Acceptor, TransportMetrics};
use crate::authn::Authenticators;
use crate::ca::Ca;
use crate::cert_service::{CaExpiry, CaMetrics, CertificateService};
use crate::drain::Shutdown;

/// The mesh CA and where it came from (for `/debug`).
pub(super) type LoadedCa = (Arc<Ca>, String);

/// The mesh CA at start.
pub(super) enum CaAtStart {
    /// No CA (`--enableCAServer=false`, or no `--caDir` outside Kubernetes).
    Off,
    /// Loaded.
    Ready(LoadedCa),
    /// Its Secrets could not be read or written (the system namespace is missing,
    /// RBAC forbids it, the API server is unreachable): retried in the background; the
    /// secure port waits for it while plaintext xDS serves.
    Waiting(LateCa),
}

/// What a CA loaded after start needs.
pub(super) struct LateCa {
    source: CaSource,
    trust_domain: String,
    client: meshfed_kube::Client,
    namespace: String,
    duties: Arc<Duties>,
}

/// Whether a CA load failed on the API server (worth retrying) rather than on its
/// material: the operator's reason, with what to do.
fn api_failure(err: &anyhow::Error, namespace: &str) -> Option<String> {
    use meshfed_kube::CaSecretError;
    match err.downcast_ref::<CaSecretError>()? {
        CaSecretError::Read { secret, source } => Some(meshfed_kube::duty::explain(
            source,
            &format!("reading Secret {secret}"),
            namespace,
        )),
        CaSecretError::Write { secret, source } => Some(meshfed_kube::duty::explain(
            source,
            &format!("creating Secret {secret}"),
            namespace,
        )),
        CaSecretError::Vanished(_) => Some(err.to_string()),
        _ => None,
    }
}

/// Loads the mesh CA, when there is one. With Kubernetes, an API failure does not
/// stop the start: the CA is then [`CaAtStart::Waiting`].
pub(super) async fn load_ca(
    config: &DiscoveryConfig,
    trust_domain: &str,
    kube_client: Option<&meshfed_kube::Client>,
    duties: &Arc<Duties>,
) -> anyhow::Result<CaAtStart> {
    let Some(source) = &config.ca else {
        return Ok(CaAtStart::Off);
    };
    let system_namespace = config
        .kubernetes
        .as_ref()
        .map(|k| k.system_namespace.clone())
        .unwrap_or_else(|| config.secure.namespace.clone());
    let kube = kube_client.map(|c| (c, system_namespace.as_str()));
    if kube.is_some() {
        duties.start(Duty::CaSecret);
    }
    match source.load(trust_domain, kube).await {
        Ok((ca, from)) => {
            if kube.is_some() {
                duties.done(Duty::CaSecret);
            }
            info!(root = %from, "mesh CA ready");
            Ok(CaAtStart::Ready((Arc::new(ca), from)))
        }
        Err(err) => match (kube_client, api_failure(&err, &system_namespace)) {
            (Some(client), Some(reason)) => {
                duties.failed(
                    Duty::CaSecret,
                    &format!("mesh CA: {reason}; the secure xDS port waits for the CA, plaintext xDS serves meanwhile"),
                    Duration::from_secs(1),
                );
                Ok(CaAtStart::Waiting(LateCa {
                    source: source.clone(),
                    trust_domain: trust_domain.to_string(),
                    client: client.clone(),
                    namespace: system_namespace,
                    duties: duties.clone(),
                }))
            }
            _ => Err(err),
        },
    }
}

impl LateCa {
    /// Retries loading the CA with backoff until it loads (`None` at shutdown). A
    /// failure of any kind is reported to the `ca-secret` duty and retried.
    async fn wait(self, shutdown: &Shutdown) -> Option<LoadedCa> {
        let mut backoff = meshfed_kube::duty::retry_backoff();
        loop {
            let delay = backoff.next_delay();
            let mut stop = shutdown.clone();
            tokio::select! {
                () = stop.wait() => return None,
                () = tokio::time::sleep(delay) => {}
            }
            let kube = Some((&self.client, self.namespace.as_str()));
            match self.source.load(&self.trust_domain, kube).await {
                Ok((ca, from)) => {
                    self.duties.done(Duty::CaSecret);
                    info!(root = %from, "mesh CA ready; serving the secure xDS port");
                    return Some((Arc::new(ca), from));
                }
                Err(err) => {
                    let reason =
                        api_failure(&err, &self.namespace).unwrap_or_else(|| format!("{err:#}"));
                    self.duties.failed(
                        Duty::CaSecret,
                        &format!("mesh CA: {reason}; the secure xDS port waits for the CA, plaintext xDS serves meanwhile"),
                        backoff.clone().next_delay(),
                    );
                }
            }
        }
    }
}

/// Binds the secure xDS port, when it is served: it needs the mesh CA (loaded or
/// awaited) or serving files.
pub(super) async fn bind_secure(
    config: &DiscoveryConfig,
    has_ca: bool,
) -> anyhow::Result<Option<TcpListener>> {
    match config.secure_grpc_addr {
        Some(_) if !has_ca && config.secure.tls_files.is_none() => {
            info!("secure xDS port off: no mesh CA (--caDir) and no serving files (--tlsCertFile)");
            Ok(None)
        }
        Some(addr) => {
            let listener = super::serve::listen(addr, "secure xDS", "--secureGrpcAddr")?;
            Ok(Some(listener))
        }
        None => Ok(None),
    }
}

/// The CA's metrics, registered before the CA is there (it may load later).
#[derive(Clone)]
pub(super) struct CaServing {
    pub(super) metrics: CaMetrics,
    expiry: CaExpiry,
    root_stats: Option<Arc<meshfed_kube::RootCertStats>>,
}

impl CaServing {
    /// Registers the CA's metrics and, with Kubernetes, the root publisher's (which
    /// reports to `duties`).
    pub(super) fn register(registry: &mut Registry, kube: bool, duties: &Arc<Duties>) -> CaServing {
        let root_stats = kube.then(|| {
            let stats = Arc::new(meshfed_kube::RootCertStats::default());
            stats.register_metrics(registry);
            stats.report_to(duties.clone());
            stats
        });
        CaServing {
            metrics: CaMetrics::new(registry),
            expiry: CaMetrics::register_expiry(registry),
            root_stats,
        }
    }

    /// Publishes `ca`'s root to every namespace by the leader (with Kubernetes) and
    /// writes it to `--rootCertFile`.
    pub(super) fn publish_root(
        &self,
        config: &DiscoveryConfig,
        ca: &Arc<Ca>,
        kube_client: Option<&meshfed_kube::Client>,
        lease_state: &Arc<meshfed_kube::LeaseState>,
        shutdown: &Shutdown,
        tasks: &mut JoinSet<()>,
    ) -> anyhow::Result<()> {
        self.expiry.set(ca);
        if let (Some(client), Some(stats)) = (kube_client, &self.root_stats) {
            let (root_tx, root_rx) = tokio::sync::watch::channel(ca.root_pem().to_string());
            let mut stop = shutdown.clone();
            let publisher = meshfed_kube::run_root_cert_publisher(
                client.clone(),
                lease_state.clone(),
                root_rx,
                stats.clone(),
                async move { stop.wait().await },
            );
            tasks.spawn(async move {
                publisher.await;
                drop(root_tx);
            });
        }
        if let Some(path) = &config.secure.root_cert_file {
            crate::ca::write_public(path, ca.root_pem()).with_context(|| {
                format!(
                    "writing the root bundle (--rootCertFile {})",
                    path.display()
                )
            })?;
        }
        Ok(())
    }
}

/// Waits for a CA that did not load at start, then publishes its root and serves
/// the secure port on `listener` (bound at start). The TLS serving metrics of a port
/// served this late go unregistered (the metrics registry is sealed once serving).
pub(super) async fn serve_late(
    late: LateCa,
    config: DiscoveryConfig,
    listener: TcpListener,
    serving: CaServing,
    lease_state: Arc<meshfed_kube::LeaseState>,
    mut port: SecurePort,
    shutdown: Shutdown,
) {
    let client = late.client.clone();
    let Some((ca, _)) = late.wait(&shutdown).await else {
        return;
    };
    let mut tasks = JoinSet::new();
    if let Err(err) = serving.publish_root(
        &config,
        &ca,
        Some(&client),
        &lease_state,
        &shutdown,
        &mut tasks,
    ) {
        warn!("{err:#}");
    }
    port.ca = Some((ca, serving.metrics.clone()));
    let mut unexported = Registry::default();
    if let Err(err) = serve_secure(
        &config,
        listener,
        port,
        &mut unexported,
        &shutdown,
        &mut tasks,
    )
    .await
    {
        warn!("the secure xDS port could not start after the CA loaded: {err:#}");
    }
    while tasks.join_next().await.is_some() {}
}

/// What the secure port serves besides the listener.
pub(super) struct SecurePort {
    pub(super) ctx: Arc<XdsContext>,
    pub(super) ca: Option<(Arc<Ca>, CaMetrics)>,
    pub(super) trust_domain: String,
    pub(super) kube_client: Option<meshfed_kube::Client>,
    pub(super) remotes: Option<Arc<meshfed_kube::SecretController>>,
    pub(super) transport_metrics: TransportMetrics,
    pub(super) draining: Shutdown,
}

/// Serves ADS and CreateCertificate on the secure port: TLS from the serving files or
/// a CA-issued certificate (followed and reloaded), callers authenticated.
pub(super) async fn serve_secure(
    config: &DiscoveryConfig,
    listener: TcpListener,
    port: SecurePort,
    metrics_registry: &mut Registry,
    shutdown: &Shutdown,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<()> {
    let source = match &config.secure.tls_files {
        Some(files) => crate::tls::ServingSource::Files(files.clone()),
        None => crate::tls::ServingSource::Ca(crate::tls::istiod_dns_names(
            &config.secure.custom_hosts,
            &config.secure.namespace,
            &config.secure.revision,
        )),
    };
    let tls = Arc::new(
        crate::tls::SecureTls::new(
            &source,
            port.ca.as_ref().map(|(ca, _)| ca.clone()),
            &port.trust_domain,
            config.secure.min_version,
        )
        .context("setting up TLS of the secure xDS port (--secureGrpcAddr)")?,
    );
    tls.register_metrics(metrics_registry);
    let mut stop = shutdown.clone();
    tasks.spawn(
        tls.clone()
            .follow(source.clone(), async move { stop.wait().await }),
    );
    let authenticators = Arc::new(
        build_authenticators(config, &port.trust_domain, port.kube_client, port.remotes).await?,
    );
    info!(authenticators = ?authenticators.names(), serving = ?source, "secure xDS port ready");
    let certificates = port.ca.map(|(ca, metrics)| {
        let service = CertificateService::new(ca.clone(), Some((*authenticators).clone()), metrics);
        if config.secure.trusted_node_accounts.is_empty() {
            return service;
        }
        let workloads = crate::cert_service::SnapshotWorkloads::new(
            port.ctx.snapshot.clone(),
            config.cluster_id.clone(),
        );
        service.with_node_authorizer(Arc::new(crate::cert_service::NodeAuthorizer::new(
            config.secure.trusted_node_accounts.clone(),
            Arc::new(workloads),
        )))
    });
    let acceptor = Acceptor::new(listener, config.xds_limits.clone(), port.transport_metrics);
    let handshake = config
        .xds_limits
        .handshake_timeout
        .unwrap_or(Duration::from_secs(10));
    tasks.spawn(serve_grpc(
        crate::tls::incoming(acceptor, tls, handshake),
        config.xds_limits.clone(),
        AdsService::secure(port.ctx.clone(), authenticators.clone()),
        crate::ads::csds::Csds::server(port.ctx, Some(authenticators)),
        certificates,
        port.draining,
    ));
    Ok(())
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

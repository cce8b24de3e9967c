//! The secure side: the mesh CA, the root bundle it publishes, the authenticators and
//! TLS of the secure xDS port.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tracing::info;

use super::serve::serve_grpc;
use super::{CaSource, DiscoveryConfig};
use crate::ads::server::{AdsService, XdsContext};
use crate::ads::transport::{Acceptor, TransportMetrics};
use crate::authn::Authenticators;
use crate::ca::Ca;
use crate::cert_service::{CaMetrics, CertificateService};
use crate::drain::Shutdown;

/// The mesh CA and where it came from (for `/debug`).
pub(super) type LoadedCa = (Arc<Ca>, String);

/// Loads the mesh CA, when there is one.
pub(super) async fn load_ca(
    config: &DiscoveryConfig,
    trust_domain: &str,
    kube_client: Option<&meshfed_kube::Client>,
) -> anyhow::Result<Option<LoadedCa>> {
    let Some(source) = &config.ca else {
        return Ok(None);
    };
    let system_namespace = config
        .kubernetes
        .as_ref()
        .map(|k| k.system_namespace.clone())
        .unwrap_or_else(|| config.secure.namespace.clone());
    let kube = kube_client.map(|c| (c, system_namespace.as_str()));
    let (ca, from) = source.load(trust_domain, kube).await?;
    info!(root = %from, "mesh CA ready");
    Ok(Some((Arc::new(ca), from)))
}

/// Binds the secure xDS port, when it is served: it needs the mesh CA or serving files.
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

/// The CA's metrics, its root published to every namespace by the leader (with
/// Kubernetes) and written to `--rootCertFile`.
pub(super) fn publish_root(
    config: &DiscoveryConfig,
    ca: &Arc<Ca>,
    kube_client: Option<&meshfed_kube::Client>,
    lease_state: &Arc<meshfed_kube::LeaseState>,
    metrics_registry: &mut Registry,
    shutdown: &Shutdown,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<CaMetrics> {
    let metrics = CaMetrics::new(metrics_registry);
    metrics.register_expiry(metrics_registry, ca);
    if let Some(client) = kube_client {
        let stats = Arc::new(meshfed_kube::RootCertStats::default());
        stats.register_metrics(metrics_registry);
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
    if let Some(path) = &config.secure.root_cert_file {
        crate::ca::write_public(path, ca.root_pem()).with_context(|| {
            format!(
                "writing the root bundle (--rootCertFile {})",
                path.display()
            )
        })?;
    }
    Ok(metrics)
}

/// What the secure port serves besides the listener.
pub(super) struct SecurePort<'a> {
    pub(super) ctx: Arc<XdsContext>,
    pub(super) ca: Option<(&'a Arc<Ca>, CaMetrics)>,
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
    port: SecurePort<'_>,
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
            port.ca.as_ref().map(|(ca, _)| (*ca).clone()),
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
        CertificateService::new(ca.clone(), Some((*authenticators).clone()), metrics)
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

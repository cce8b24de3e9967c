//! The validating webhook's port (`--httpsAddr`) and, with Kubernetes, the leader's
//! upkeep of the `ValidatingWebhookConfiguration`s (`caBundle`, `failurePolicy`).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tracing::{info, warn};

use super::DiscoveryConfig;
use crate::ca::Ca;
use crate::drain::Shutdown;

/// What the webhook needs from the rest of the server.
pub(super) struct WebhookParts<'a> {
    pub(super) ca: Option<&'a Arc<Ca>>,
    /// The CA is still awaited (its Secrets not reachable yet).
    pub(super) ca_awaited: bool,
    pub(super) trust_domain: String,
    pub(super) kube_client: Option<&'a meshfed_kube::Client>,
    pub(super) lease_state: &'a Arc<meshfed_kube::LeaseState>,
}

/// Binds `--httpsAddr` and serves the webhook there with the control plane's serving
/// certificate (issued by the mesh CA for istiod's names, or the `--tlsCertFile`
/// files, followed); returns the bound address, or `None` when the port is off or
/// there is no certificate to serve. With Kubernetes, starts the configuration
/// patcher too.
pub(super) fn serve_webhook(
    config: &DiscoveryConfig,
    parts: WebhookParts<'_>,
    metrics_registry: &mut Registry,
    shutdown: &Shutdown,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<Option<SocketAddr>> {
    let Some(addr) = config.https_addr else {
        return Ok(None);
    };
    let source = match &config.secure.tls_files {
        Some(files) => crate::tls::ServingSource::Files(files.clone()),
        None if parts.ca.is_some() => crate::tls::ServingSource::Ca(crate::tls::istiod_dns_names(
            &config.secure.custom_hosts,
            &config.secure.namespace,
            &config.secure.revision,
        )),
        None if parts.ca_awaited => {
            warn!(
                "validating webhook off: the mesh CA is not loaded yet (see /debug/duties); \
                 it serves once meshfed is restarted with the CA in place, or with --tlsCertFile"
            );
            return Ok(None);
        }
        None => {
            info!(
                "validating webhook off: no mesh CA (--caDir, or Kubernetes) and no serving files (--tlsCertFile) to serve HTTPS with"
            );
            return Ok(None);
        }
    };
    let listener = super::serve::listen(addr, "validating webhook", "--httpsAddr")?;
    let bound = listener.local_addr()?;
    let tls = Arc::new(
        crate::tls::SecureTls::with_alpn(
            &source,
            parts.ca.cloned(),
            &parts.trust_domain,
            config.secure.min_version,
            &[b"h2", b"http/1.1"],
        )
        .context("setting up TLS of the validating webhook (--httpsAddr)")?,
    );
    metrics_registry.register(
        "meshfed_webhook_tls_handshake_errors",
        "TLS handshakes on the validating webhook port (--httpsAddr) that failed or timed out",
        tls.handshake_errors.clone(),
    );
    let mut stop = shutdown.clone();
    tasks.spawn(
        tls.clone()
            .follow(source.clone(), async move { stop.wait().await }),
    );
    let metrics = crate::webhook::WebhookMetrics::new(metrics_registry);
    tasks.spawn(crate::webhook::server::serve(
        listener,
        tls,
        crate::webhook::server::router(metrics),
        shutdown.clone(),
    ));
    if let Some(client) = parts.kube_client {
        start_patcher(config, &parts, client, metrics_registry, shutdown, tasks)?;
    }
    Ok(Some(bound))
}

/// The leader keeps the `caBundle` of the revision's configurations at the root that
/// signs the serving certificate.
fn start_patcher(
    config: &DiscoveryConfig,
    parts: &WebhookParts<'_>,
    client: &meshfed_kube::Client,
    metrics_registry: &mut Registry,
    shutdown: &Shutdown,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<()> {
    let root = match (&config.secure.tls_files, parts.ca) {
        (Some(files), _) => std::fs::read_to_string(&files.ca_cert).with_context(|| {
            format!(
                "reading the webhook's caBundle (--caCertFile {})",
                files.ca_cert.display()
            )
        })?,
        (None, Some(ca)) => ca.root_pem().to_string(),
        (None, None) => return Ok(()),
    };
    let revision = if config.secure.revision.is_empty() {
        "default".to_string()
    } else {
        config.secure.revision.clone()
    };
    let namespace = config
        .kubernetes
        .as_ref()
        .map(|k| k.system_namespace.clone())
        .unwrap_or_else(|| config.secure.namespace.clone());
    let stats = Arc::new(meshfed_kube::WebhookConfigStats::default());
    stats.register_metrics(metrics_registry);
    let probe = Arc::new(meshfed_kube::DryRunProbe::new(
        client.clone(),
        &namespace,
        &revision,
    ));
    let (root_tx, root_rx) = tokio::sync::watch::channel(root);
    let mut stop = shutdown.clone();
    let patcher = meshfed_kube::run_webhook_config_patcher(
        client.clone(),
        meshfed_kube::WebhookConfigSettings { revision },
        parts.lease_state.clone(),
        root_rx,
        probe,
        stats,
        async move { stop.wait().await },
    );
    tasks.spawn(async move {
        patcher.await;
        drop(root_tx);
    });
    Ok(())
}

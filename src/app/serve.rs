//! The gRPC (xDS, CreateCertificate) and HTTP (admin, monitoring) servers, and their
//! listeners (bound with the system's maximum backlog).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tracing::{error, info, warn};

use crate::admin::{AdminLimits, AdminMetrics, AdminPort};
use crate::ads::csds::Csds;
use crate::ads::server::{AdsService, XdsContext};
use crate::ads::transport::{Acceptor, TransportMetrics, XdsConnectInfo, XdsLimits};
use crate::ca::Ca;
use crate::cert_service::{CaMetrics, CertificateService};
use crate::drain::Shutdown;
use envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_server::ClientStatusDiscoveryServiceServer;

pub(super) async fn serve_grpc<IO, IE>(
    incoming: impl futures::Stream<Item = Result<IO, IE>> + Send + 'static,
    limits: XdsLimits,
    ads: AdsService,
    csds: ClientStatusDiscoveryServiceServer<Csds>,
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
        .add_service(csds)
        .add_optional_service(certificates)
        .serve_with_incoming_shutdown(incoming, async move { shutdown.wait().await })
        .await;
    if let Err(err) = result {
        error!("xDS server failed: {err}");
    }
}

/// Serves an admin port under the admin limits, after lowering the cap where the
/// open-files limit is small (so the admin ports cannot starve xDS of descriptors).
pub(super) fn serve_http(
    listener: TcpListener,
    router: axum::Router,
    port: AdminPort,
    config: &super::DiscoveryConfig,
    metrics: AdminMetrics,
    shutdown: Shutdown,
) -> impl Future<Output = ()> + Send + 'static {
    let limits = admin_limits(config);
    crate::admin::serve_port(listener, router, port, limits, metrics, shutdown)
}

/// The admin limits in force: `--adminMaxConnections` per port, at most an eighth of
/// the open-files limit.
pub(super) fn admin_limits(config: &super::DiscoveryConfig) -> AdminLimits {
    match rlimit::Resource::NOFILE.get() {
        Ok((soft, _)) => config.admin_limits.within_descriptors(soft).0,
        Err(_) => config.admin_limits,
    }
}

/// Logs the descriptor budget: the open-files limit, the admin cap and the xDS cap.
pub(super) fn log_descriptor_budget(config: &super::DiscoveryConfig) {
    let Ok((soft, hard)) = rlimit::Resource::NOFILE.get() else {
        warn!("cannot read the open-files limit (RLIMIT_NOFILE)");
        return;
    };
    let (limits, lowered) = config.admin_limits.within_descriptors(soft);
    if lowered {
        warn!(
            rlimit_nofile = soft,
            flag = config.admin_limits.max_connections,
            in_force = limits.max_connections,
            "--adminMaxConnections lowered to an eighth of the open-files limit per admin port, so the admin ports keep clear of the descriptors xDS needs"
        );
    }
    let xds = config.xds_limits.max_connections;
    info!(
        rlimit_nofile = soft,
        rlimit_nofile_hard = hard,
        admin_max_connections_per_port = limits.max_connections,
        xds_max_connections = xds,
        "descriptor budget: RLIMIT_NOFILE {soft}; admin ports at most {} connections each; xDS {}",
        limits.max_connections,
        if xds == 0 {
            "uncapped (--maxConnections 0)".to_string()
        } else {
            format!("at most {xds} connections per port")
        }
    );
}

/// The plaintext listeners, bound.
pub(super) struct Listeners {
    /// The plaintext xDS port, unless turned off.
    pub(super) grpc: Option<TcpListener>,
    pub(super) http: TcpListener,
    pub(super) monitoring: TcpListener,
}

impl Listeners {
    /// Binds the plaintext xDS, HTTP and monitoring addresses, each with the system's
    /// maximum listen backlog.
    pub(super) async fn bind(config: &super::DiscoveryConfig) -> anyhow::Result<Listeners> {
        let grpc = match config.grpc_addr {
            Some(addr) => Some(listen(addr, "xDS", "--grpcAddr")?),
            None => None,
        };
        let http = listen(config.http_addr, "HTTP", "--httpAddr")?;
        let monitoring = listen(config.monitoring_addr, "monitoring", "--monitoringAddr")?;
        Ok(Listeners {
            grpc,
            http,
            monitoring,
        })
    }
}

/// Binds `addr` with the system's maximum backlog ([`crate::ads::transport::listen`])
/// and says so in the log.
pub(super) fn listen(addr: SocketAddr, what: &str, flag: &str) -> anyhow::Result<TcpListener> {
    let (listener, backlog) = crate::ads::transport::listen(addr)
        .with_context(|| format!("binding the {what} address {addr} ({flag})"))?;
    info!(
        addr = %listener.local_addr().unwrap_or(addr),
        backlog,
        "{what} port listening ({flag}) with backlog {backlog}"
    );
    Ok(listener)
}

/// Serves ADS on the plaintext port. CreateCertificate is there too but has no
/// authenticator and refuses every caller, as istiod does on 15010.
pub(super) fn serve_plaintext(
    listener: TcpListener,
    limits: &XdsLimits,
    ctx: Arc<XdsContext>,
    ca: Option<(&Arc<Ca>, CaMetrics)>,
    transport_metrics: TransportMetrics,
    draining: Shutdown,
    tasks: &mut JoinSet<()>,
) {
    let certificates = ca.map(|(ca, metrics)| CertificateService::new(ca.clone(), None, metrics));
    let acceptor = Acceptor::new(listener, limits.clone(), transport_metrics);
    tasks.spawn(serve_grpc(
        acceptor.into_stream(),
        limits.clone(),
        AdsService::new(ctx.clone()),
        Csds::server(ctx, None),
        certificates,
        draining,
    ));
}

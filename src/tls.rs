//! TLS of the secure xDS port (reference §1.2-1.3): the serving certificate (issued
//! by the mesh CA for istiod's DNS names, or the operator's files, reloaded when they
//! change), client certificates verified when given against the mesh roots and held
//! to exactly one SPIFFE URI SAN of the mesh trust domain, and the accept path that
//! turns TCP connections into TLS ones without holding up the accept loop.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::Stream;
use rustls::RootCertStore;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tonic::transport::server::Connected;
use tracing::{debug, error, info, warn};

use crate::ads::coalesce::Gathered;
use crate::ads::h2scan::FrameScan;
use crate::ads::limit::LogLimiter;
use crate::ads::transport::{Acceptor, GuardedStream, XdsConnectInfo};
use crate::authn::{TlsPeer, parse_spiffe, uri_sans};
use crate::ca::Ca;
use crate::metrics::IstioCounter;

/// The lowest TLS version the port accepts (`--tlsMinVersion`, Istio's `1.2`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsMinVersion {
    /// TLS 1.2 and 1.3.
    #[default]
    V12,
    /// TLS 1.3 only.
    V13,
}

impl std::str::FromStr for TlsMinVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "1.2" | "TLSv1_2" => Ok(TlsMinVersion::V12),
            "1.3" | "TLSv1_3" => Ok(TlsMinVersion::V13),
            other => Err(format!("unsupported TLS version {other:?}: use 1.2 or 1.3")),
        }
    }
}

/// The operator's serving files (`--tlsCertFile`, `--tlsKeyFile`, `--caCertFile`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The serving chain, leaf first.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// Roots that client certificates may chain to (besides the mesh CA's).
    pub ca_cert: PathBuf,
}

/// Istio's DNS names of the control plane's serving certificate (`getDNSNames`):
/// the custom hosts (`ISTIOD_CUSTOM_HOST`), then `istiod`, `istiod-remote` and
/// `istio-pilot` in the system namespace (and `istiod-<revision>` for a revision
/// other than `default`), sorted, without duplicates.
pub fn istiod_dns_names(custom: &[String], namespace: &str, revision: &str) -> Vec<String> {
    let mut names: std::collections::BTreeSet<String> = custom
        .iter()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .collect();
    for service in ["istiod", "istiod-remote", "istio-pilot"] {
        names.insert(format!("{service}.{namespace}.svc"));
    }
    if !revision.is_empty() && revision != "default" {
        names.insert(format!("istiod-{revision}.{namespace}.svc"));
    }
    names.into_iter().collect()
}

/// Where the serving certificate comes from.
#[derive(Clone, Debug)]
pub enum ServingSource {
    /// Issued by the mesh CA for these DNS names.
    Ca(Vec<String>),
    /// The operator's files, reloaded when they change.
    Files(TlsFiles),
}

/// The TLS state of the secure port: the server configuration in force, swapped
/// whole when the serving files change.
pub struct SecureTls {
    config: ArcSwap<ServerConfig>,
    ca: Option<Arc<Ca>>,
    trust_domain: String,
    min_version: TlsMinVersion,
    /// The application protocols offered (ALPN).
    alpn: Vec<Vec<u8>>,
    /// Failed TLS handshakes (`meshfed_xds_tls_handshake_errors_total`).
    pub handshake_errors: IstioCounter,
    /// Serving-file reloads that failed and kept the previous certificate.
    pub reload_errors: IstioCounter,
}

impl fmt::Debug for SecureTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecureTls")
            .field("trust_domain", &self.trust_domain)
            .field("min_version", &self.min_version)
            .finish_non_exhaustive()
    }
}

/// Why the TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The material did not parse or does not fit together.
    #[error("{what}: {reason}")]
    Invalid {
        /// Which file or input.
        what: String,
        /// Why.
        reason: String,
    },
}

fn invalid(what: impl Into<String>, reason: impl fmt::Display) -> TlsError {
    TlsError::Invalid {
        what: what.into(),
        reason: reason.to_string(),
    }
}

fn certs(what: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(what, e))?;
    if certs.is_empty() {
        return Err(invalid(what, "no PEM certificate in it"));
    }
    Ok(certs)
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The serving chain, key and extra client roots of a source.
struct Material {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    extra_roots: Vec<CertificateDer<'static>>,
}

fn material(source: &ServingSource, ca: Option<&Ca>) -> Result<Material, TlsError> {
    match source {
        ServingSource::Ca(names) => {
            let ca =
                ca.ok_or_else(|| invalid("the serving certificate", "no mesh CA to issue it"))?;
            let (chain, key) = ca
                .issue_serving(names)
                .map_err(|e| invalid("issuing the serving certificate", e))?;
            Ok(Material {
                chain: certs("the issued serving certificate", chain.as_bytes())?,
                key: PrivateKeyDer::from_pem_slice(key.as_bytes())
                    .map_err(|e| invalid("the issued serving key", e))?,
                extra_roots: Vec::new(),
            })
        }
        ServingSource::Files(files) => {
            let what = |p: &Path| p.display().to_string();
            Ok(Material {
                chain: certs(&what(&files.cert), &read(&files.cert)?)?,
                key: PrivateKeyDer::from_pem_slice(&read(&files.key)?)
                    .map_err(|e| invalid(what(&files.key), e))?,
                extra_roots: certs(&what(&files.ca_cert), &read(&files.ca_cert)?)?,
            })
        }
    }
}

impl SecureTls {
    /// The TLS state for `source`; client certificates are verified against the CA's
    /// roots and the source's extra roots, and must name one identity of
    /// `trust_domain`.
    pub fn new(
        source: &ServingSource,
        ca: Option<Arc<Ca>>,
        trust_domain: &str,
        min_version: TlsMinVersion,
    ) -> Result<SecureTls, TlsError> {
        Self::with_alpn(source, ca, trust_domain, min_version, &[b"h2"])
    }

    /// As [`SecureTls::new`], offering the application protocols `alpn` (gRPC's `h2`
    /// for the secure xDS port; `h2` and `http/1.1` for an HTTPS port).
    pub fn with_alpn(
        source: &ServingSource,
        ca: Option<Arc<Ca>>,
        trust_domain: &str,
        min_version: TlsMinVersion,
        alpn: &[&[u8]],
    ) -> Result<SecureTls, TlsError> {
        let mut tls = SecureTls {
            config: ArcSwap::from_pointee(
                ServerConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()
                    .map_err(|e| invalid("TLS", e))?
                    .with_no_client_auth()
                    .with_cert_resolver(Arc::new(NoCert)),
            ),
            ca,
            trust_domain: trust_domain.to_string(),
            min_version,
            alpn: alpn.iter().map(|p| p.to_vec()).collect(),
            handshake_errors: IstioCounter::default(),
            reload_errors: IstioCounter::default(),
        };
        tls.config = ArcSwap::from_pointee(tls.build(source)?);
        Ok(tls)
    }

    fn build(&self, source: &ServingSource) -> Result<ServerConfig, TlsError> {
        let material = material(source, self.ca.as_deref())?;
        let mut roots = RootCertStore::empty();
        let ca_roots = match &self.ca {
            Some(ca) => certs("the mesh root bundle", ca.root_pem().as_bytes())?,
            None => Vec::new(),
        };
        for root in ca_roots.into_iter().chain(material.extra_roots) {
            roots
                .add(root)
                .map_err(|e| invalid("a client root certificate", e))?;
        }
        if roots.is_empty() {
            return Err(invalid(
                "client roots",
                "no mesh CA and no --caCertFile: client certificates could not be verified",
            ));
        }
        let webpki = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .allow_unauthenticated()
            .build()
            .map_err(|e| invalid("the client verifier", e))?;
        let verifier = Arc::new(MeshClientVerifier {
            inner: webpki,
            trust_domain: self.trust_domain.clone(),
        });
        let versions: &[&rustls::SupportedProtocolVersion] = match self.min_version {
            TlsMinVersion::V12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
            TlsMinVersion::V13 => &[&rustls::version::TLS13],
        };
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .map_err(|e| invalid("TLS versions", e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(material.chain, material.key)
            .map_err(|e| invalid("the serving certificate and key", e))?;
        config.alpn_protocols = self.alpn.clone();
        Ok(config)
    }

    /// Registers `meshfed_xds_tls_handshake_errors_total` and
    /// `meshfed_tls_serving_reload_errors_total`.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "meshfed_xds_tls_handshake_errors",
            "TLS handshakes on the secure xDS port that failed or timed out",
            self.handshake_errors.clone(),
        );
        registry.register(
            "meshfed_tls_serving_reload_errors",
            "Changes of the serving TLS files that did not load (the previous certificate stayed)",
            self.reload_errors.clone(),
        );
    }

    /// The configuration new handshakes use.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.config.load_full()
    }

    /// Rebuilds from `source`; on failure the configuration in force stays.
    pub fn reload(&self, source: &ServingSource) -> Result<(), TlsError> {
        match self.build(source) {
            Ok(config) => {
                self.config.store(Arc::new(config));
                Ok(())
            }
            Err(err) => {
                self.reload_errors.inc();
                Err(err)
            }
        }
    }

    /// Follows the serving files (a no-op for CA-issued certificates) until
    /// `shutdown`: any change of the three files rebuilds the configuration.
    pub async fn follow(
        self: Arc<Self>,
        source: ServingSource,
        shutdown: impl Future<Output = ()>,
    ) {
        let ServingSource::Files(files) = &source else {
            return shutdown.await;
        };
        let mut watchers = Vec::new();
        for path in [&files.cert, &files.key, &files.ca_cert] {
            match meshfed_registry::watch::PathWatcher::watch(path, false) {
                Ok(w) => watchers.push(w),
                Err(err) => {
                    error!(file = %path.display(), "the serving TLS file cannot be watched; changes will not be picked up: {err}");
                }
            }
        }
        if watchers.is_empty() {
            return shutdown.await;
        }
        let mut reloader = ServingReload {
            tls: &self,
            source: &source,
            cert: &files.cert,
        };
        // The files were loaded when the state was built: wait for a change.
        let options = meshfed_registry::follow::FollowOptions::default();
        let followed =
            meshfed_registry::follow::follow(&mut watchers, &mut reloader, options, shutdown).await;
        if followed.is_err() {
            error!("watching the serving TLS files stopped; changes will not be picked up");
        }
    }
}

/// The reload step of the serving files: any change of the three rebuilds the
/// configuration (no retry: the next change reloads again).
struct ServingReload<'a> {
    tls: &'a SecureTls,
    source: &'a ServingSource,
    cert: &'a Path,
}

impl meshfed_registry::follow::Reload for ServingReload<'_> {
    async fn reload(&mut self) -> Option<Duration> {
        match self.tls.reload(self.source) {
            Ok(()) => {
                info!(cert = %self.cert.display(), "serving TLS certificate reloaded")
            }
            Err(err) => warn!(
                "serving TLS files changed but do not load; the previous certificate stays: {err}"
            ),
        }
        None
    }
}

/// Serves nothing: the placeholder of a [`SecureTls`] being built.
#[derive(Debug)]
struct NoCert;

impl rustls::server::ResolvesServerCert for NoCert {
    fn resolve(
        &self,
        _: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        None
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Istio's peer verifier of 15012: a client certificate is optional, and when given
/// it must chain to the mesh roots and carry exactly one URI SAN, a SPIFFE identity
/// of the mesh trust domain.
#[derive(Debug)]
struct MeshClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    trust_domain: String,
}

impl ClientCertVerifier for MeshClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let sans = uri_sans(end_entity.as_ref()).map_err(rustls::Error::General)?;
        let [only] = sans.as_slice() else {
            return Err(rustls::Error::General(format!(
                "the client certificate must have exactly one URI SAN, it has {}",
                sans.len()
            )));
        };
        match parse_spiffe(only) {
            Some(id) if id.trust_domain == self.trust_domain => Ok(ClientCertVerified::assertion()),
            Some(id) => Err(rustls::Error::General(format!(
                "the client certificate's trust domain {} is not the mesh's {}",
                id.trust_domain, self.trust_domain
            ))),
            None => Err(rustls::Error::General(format!(
                "the client certificate's URI SAN {only} is not a SPIFFE workload identity"
            ))),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A TLS connection of the secure port.
pub struct SecureStream {
    /// Its frames gathered before they are encrypted, into fewer records and calls.
    io: Gathered<tokio_rustls::server::TlsStream<GuardedStream>>,
    peer: Arc<TlsPeer>,
    /// The client's decrypted HTTP/2 frames, followed until it opens a stream (its
    /// connection's handshake deadline then ends).
    scan: Option<Box<FrameScan>>,
}

impl fmt::Debug for SecureStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecureStream")
            .field("client_certs", &self.peer.chain.len())
            .finish_non_exhaustive()
    }
}

impl Connected for SecureStream {
    type ConnectInfo = XdsConnectInfo;

    fn connect_info(&self) -> XdsConnectInfo {
        let mut info = self.io.get_ref().get_ref().0.connect_info();
        info.tls = Some(self.peer.clone());
        info
    }
}

impl AsyncRead for SecureStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = self.get_mut();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            let control = this.io.get_ref().get_ref().0.control();
            FrameScan::follow(&mut this.scan, &buf.filled()[before..], || {
                control.stream_started()
            });
        }
        read
    }
}

impl AsyncWrite for SecureStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The TLS connections of `acceptor`. No pool gates `accept`: every accepted
/// connection gets its own handshake task with its own deadline (`timeout`), so a
/// silent or slow client costs one task and one descriptor, never a slot that other
/// clients wait for. The connection cap of the port (`--maxConnections`, in the
/// [`Acceptor`]) counts connections in their handshake too.
pub fn incoming(
    mut acceptor: Acceptor,
    tls: Arc<SecureTls>,
    timeout: Duration,
) -> impl Stream<Item = io::Result<SecureStream>> + Send {
    let (tx, rx) = mpsc::channel::<SecureStream>(64);
    tokio::spawn(async move {
        let log = Arc::new(LogLimiter::new(5, Duration::from_secs(10)));
        loop {
            let conn = tokio::select! {
                conn = acceptor.accept() => conn,
                () = tx.closed() => return,
            };
            tokio::spawn(handshake(
                conn,
                tls.clone(),
                timeout,
                tx.clone(),
                log.clone(),
            ));
        }
    });
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|s| (Ok(s), rx)) },
    )
}

/// One connection's TLS handshake, bounded by `timeout`; the connection goes to `tx`
/// when it succeeds. Ends early when the server stops taking connections.
async fn handshake(
    mut conn: GuardedStream,
    tls: Arc<SecureTls>,
    timeout: Duration,
    tx: mpsc::Sender<SecureStream>,
    log: Arc<LogLimiter>,
) {
    let peer = conn.connect_info().peer;
    conn.frames_read_above();
    conn.writes_gathered_above();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
    let result = tokio::select! {
        result = tokio::time::timeout(timeout, acceptor.accept(conn)) => result,
        () = tx.closed() => return,
    };
    let io = match result {
        Ok(Ok(io)) => io,
        Ok(Err(err)) => {
            tls.handshake_errors.inc();
            if let Some(suppressed) = log.allow() {
                warn!(peer = ?peer, suppressed, "TLS handshake on the secure xDS port failed: {err}");
            }
            return;
        }
        Err(_) => {
            tls.handshake_errors.inc();
            debug!(peer = ?peer, "TLS handshake on the secure xDS port timed out");
            return;
        }
    };
    let chain = io
        .get_ref()
        .1
        .peer_certificates()
        .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
        .unwrap_or_default();
    let stream = SecureStream {
        io: Gathered::server(io),
        peer: Arc::new(TlsPeer { chain }),
        scan: Some(Box::default()),
    };
    let _ = tx.send(stream).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names_follow_istio() {
        // Istio's TestGetDNSNames vector, less the discovery address host, which
        // meshfed takes as one more custom host.
        let names = istiod_dns_names(
            &[
                "a.com".into(),
                "b.com".into(),
                "c.com".into(),
                "istiod.istio-system.svc.cluster.local".into(),
            ],
            "istio-system",
            "canary",
        );
        assert_eq!(
            names,
            [
                "a.com",
                "b.com",
                "c.com",
                "istio-pilot.istio-system.svc",
                "istiod-canary.istio-system.svc",
                "istiod-remote.istio-system.svc",
                "istiod.istio-system.svc",
                "istiod.istio-system.svc.cluster.local",
            ]
        );
        assert_eq!(istiod_dns_names(&[], "ns", "default").len(), 3);
    }
}

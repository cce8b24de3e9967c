//! The secure port (`--tls-ca-dir`): the tool reads the server's CA (the directory the
//! server was given with `--caDir`), issues each distinct workload identity
//! (`spiffe://<trust domain>/ns/<ns>/sa/<sa>`) one client certificate, kept for the
//! run, and connects over TLS (rustls, ALPN h2) checking the server's certificate
//! against the CA's root and the istiod name (`--tls-server-name`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, anyhow};
use meshfed::ca::Ca;
use rustls_pki_types::ServerName;
use tonic::transport::Channel;

/// The name istiod's serving certificate carries (Istio's default discovery address
/// `istiod.istio-system.svc:15012`).
pub const DEFAULT_SERVER_NAME: &str = "istiod.istio-system.svc";

/// The service account every simulated proxy runs as (node metadata
/// `SERVICE_ACCOUNT` and its certificate's SPIFFE identity).
pub const SERVICE_ACCOUNT: &str = "default";

/// What the secure port needs: where the CA is and which name to expect.
#[derive(Clone, Debug)]
pub struct TlsOptions {
    /// The server's `--caDir` (`root-cert.pem`, `ca-cert.pem`, `ca-key.pem`).
    pub ca_dir: PathBuf,
    /// The name the server's certificate must carry.
    pub server_name: String,
    /// The mesh trust domain.
    pub trust_domain: String,
}

/// The identity of a workload in `namespace` running as `service_account`.
pub use meshfed::authn::spiffe_identity as spiffe_id;

/// Client TLS for a run: the CA, the roots and one client configuration per identity.
pub struct ClientTls {
    options: TlsOptions,
    ca: Ca,
    roots: Arc<rustls::RootCertStore>,
    server_name: ServerName<'static>,
    configs: Mutex<HashMap<String, Arc<rustls::ClientConfig>>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Reads the CA of `options.ca_dir` (the server must have created it: the tool
    /// never makes a CA of its own there).
    pub fn load(options: TlsOptions) -> anyhow::Result<ClientTls> {
        let dir = &options.ca_dir;
        for file in ["ca-cert.pem", "ca-key.pem", "root-cert.pem"] {
            if !dir.join(file).is_file() {
                anyhow::bail!(
                    "--tls-ca-dir {}: no {file}; give the directory the server was started with \
                     (--caDir), after it has started",
                    dir.display()
                );
            }
        }
        let ca = Ca::self_signed(dir, &options.trust_domain)
            .with_context(|| format!("reading the CA in {}", dir.display()))?;
        let roots = meshfed::testing::root_store(&read(&dir.join("root-cert.pem"))?)
            .context("root-cert.pem")?;
        let server_name = ServerName::try_from(options.server_name.clone())
            .with_context(|| format!("--tls-server-name {:?}", options.server_name))?;
        Ok(ClientTls {
            options,
            ca,
            roots: Arc::new(roots),
            server_name,
            configs: Mutex::new(HashMap::new()),
        })
    }

    /// The mesh trust domain.
    pub fn trust_domain(&self) -> &str {
        &self.options.trust_domain
    }

    /// A certificate chain (leaf first, without the root) and key for `identity`,
    /// PEM: a fresh ECDSA P-256 key signed by the CA.
    pub fn issue(&self, identity: &str) -> anyhow::Result<(String, String)> {
        self.ca
            .issue_key_pair(&[identity.to_string()], Duration::ZERO)
            .with_context(|| format!("issuing a client certificate for {identity}"))
    }

    /// The client configuration presenting `identity` (made once, then shared).
    pub fn config(&self, identity: &str) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        if let Some(config) = self.configs.lock().expect("poisoned").get(identity) {
            return Ok(config.clone());
        }
        let (chain, key) = self.issue(identity)?;
        let config = meshfed::testing::tls_client_config(self.roots.clone(), Some((&chain, &key)))?;
        Ok(self
            .configs
            .lock()
            .expect("poisoned")
            .entry(identity.to_string())
            .or_insert(config)
            .clone())
    }

    /// A channel to `addr` over TLS presenting `identity`, with `endpoint`'s settings
    /// (windows, timeouts); the TCP socket has no Nagle delay, as the plaintext one.
    pub async fn connect(
        &self,
        endpoint: tonic::transport::Endpoint,
        addr: SocketAddr,
        identity: &str,
    ) -> anyhow::Result<Channel> {
        meshfed::testing::tls_connect(
            endpoint,
            addr,
            self.config(identity)?,
            self.server_name.clone(),
        )
        .await
        .map_err(|e| anyhow!("TLS connection to {addr}: {}", source_chain(&e)))
    }
}

/// An error and its sources on one line (a TLS failure is a few levels down).
pub fn source_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        out += &format!(": {e}");
        source = e.source();
    }
    out
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

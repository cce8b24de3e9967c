//! An in-process control plane and ADS test clients for integration tests.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use meshfed::testing::{AdsClient, FakeServer, node};
//! use meshfed_registry::{Endpoint, Port, Protocol, ProviderId, Service, ServiceKey};
//!
//! let server = FakeServer::builder().start().await?;
//! let registry = server.mock_registry("cluster-1");
//! let mut svc = Service::new("echo.default.svc.cluster.local", "default", ProviderId::Mock, "");
//! svc.ports.push(Port::new("grpc", 7070, Protocol::Grpc).unwrap());
//! registry.add_service(svc);
//! registry.set_endpoints(
//!     &ServiceKey::new("echo.default.svc.cluster.local", "default"),
//!     vec![Endpoint::new("127.0.0.1".parse()?).with_port("grpc", 17070)],
//! );
//!
//! let mut client = AdsClient::connect(server.grpc_addr(), node("sidecar~10.0.0.1~app.default~default.svc.cluster.local")).await?;
//! client.subscribe(meshfed::ads::TypeUrl::Cluster, &[]).await?;
//! let clusters = client.recv_clusters().await?;
//! assert!(clusters.iter().any(|c| c.name == "outbound|7070||echo.default.svc.cluster.local"));
//! server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! The server binds 127.0.0.1 port 0 for every listener and debounces with a short
//! quiet period (10 ms) so tests converge quickly; both can be changed on the builder.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use meshfed_registry::{ClusterId, MemoryRegistry};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::metadata::MetadataMap;

use crate::ads::coalesce::Gathered;
use crate::app::{Bound, DiscoveryConfig, MockSource, Server};
use crate::model::proxy::json_to_struct;
use crate::push::debounce::DebounceConfig;
use crate::xds::TypeUrl;

/// How long a test client waits for a response before failing.
pub const RECV_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds a [`FakeServer`].
#[derive(Debug)]
pub struct FakeServerBuilder {
    config: DiscoveryConfig,
}

impl FakeServerBuilder {
    /// Serves ADS on this address instead of 127.0.0.1 port 0 (to restart a control
    /// plane where its clients expect it).
    pub fn grpc_addr(mut self, addr: SocketAddr) -> Self {
        self.config.grpc_addr = Some(addr);
        self
    }

    /// Debounce timings (default: 10 ms quiet, 1 s max).
    pub fn debounce(mut self, debounce: DebounceConfig) -> Self {
        self.config.debounce = debounce;
        self
    }

    /// Serves a mock registry from this watched YAML file.
    pub fn mock_registry_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.mock = MockSource::File(path.into());
        self
    }

    /// Reads Istio config from this watched directory (`--configDir`).
    pub fn config_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.config_dir = Some(dir.into());
        self
    }

    /// Serves the bundled example mock registry.
    pub fn embedded_mock_registry(mut self) -> Self {
        self.config.mock = MockSource::Embedded;
        self
    }

    /// meshfed's own cluster id (default `Kubernetes`).
    pub fn cluster_id(mut self, id: impl Into<ClusterId>) -> Self {
        self.config.cluster_id = id.into();
        self
    }

    /// Changes any other setting.
    pub fn configure(mut self, f: impl FnOnce(&mut DiscoveryConfig)) -> Self {
        f(&mut self.config);
        self
    }

    /// Starts the server.
    pub async fn start(self) -> anyhow::Result<FakeServer> {
        Ok(FakeServer {
            server: Server::start(self.config).await?,
        })
    }
}

/// A whole control plane running in this process.
#[derive(Debug)]
pub struct FakeServer {
    server: Server,
}

impl FakeServer {
    /// A builder with test defaults.
    pub fn builder() -> FakeServerBuilder {
        let local = SocketAddr::from(([127, 0, 0, 1], 0));
        FakeServerBuilder {
            config: DiscoveryConfig {
                grpc_addr: Some(local),
                secure_grpc_addr: Some(local),
                // In-process tests open many streams at once.
                max_requests_per_second: None,
                http_addr: local,
                monitoring_addr: local,
                mock: MockSource::None,
                debounce: DebounceConfig {
                    quiet: Duration::from_millis(10),
                    max: Duration::from_secs(1),
                    eds_debounce: true,
                },
                drain_deadline: Duration::from_secs(2),
                // Tests stop servers often: streams close at once unless a test
                // drains on purpose.
                drain_duration: Duration::ZERO,
                ..DiscoveryConfig::default()
            },
        }
    }

    /// Every bound address.
    pub fn bound(&self) -> Bound {
        self.server.bound()
    }

    /// The ADS address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.server
            .bound()
            .grpc
            .expect("the plaintext xDS port is on")
    }

    /// The secure xDS address (with a CA or serving files).
    pub fn secure_grpc_addr(&self) -> SocketAddr {
        self.server
            .bound()
            .secure_grpc
            .expect("the secure xDS port is on: configure a CA")
    }

    /// `http://` base URL of the `/ready` + debug listener.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.server.bound().http)
    }

    /// `http://` base URL of the `/metrics` + debug listener.
    pub fn monitoring_url(&self) -> String {
        format!("http://{}", self.server.bound().monitoring)
    }

    /// Waits until every registry change made so far has been applied to the
    /// snapshot and queued on the connections. Call it after setting up registries
    /// and before asserting what a new client receives.
    pub async fn sync(&self) {
        self.server
            .pipeline()
            .wait_applied(self.server.sink().sent_events())
            .await;
    }

    /// Adds an in-memory registry for `cluster`.
    pub fn mock_registry(&self, cluster: impl Into<ClusterId>) -> MemoryRegistry {
        self.server.add_memory_registry(cluster)
    }

    /// The in-memory Istio config store: `apply` VirtualServices, DestinationRules, ...
    /// from Rust (invalid objects are rejected with their errors).
    pub fn config_store(&self) -> &meshfed_registry::config::MemoryConfigStore {
        self.server.config_store()
    }

    /// The server itself.
    pub fn server(&self) -> &Server {
        &self.server
    }

    /// Stops the server and waits for it.
    pub async fn shutdown(self) {
        self.server.shutdown().await;
    }
}

/// A node with Istio metadata: `NAMESPACE` from the id's domain plus `extra`.
pub fn node_with(id: &str, extra: serde_json::Value) -> Node {
    let mut metadata = serde_json::json!({});
    if let Some(ns) = id.split('~').nth(3).and_then(|d| d.split('.').next()) {
        metadata["NAMESPACE"] = ns.into();
    }
    if let serde_json::Value::Object(map) = extra {
        for (k, v) in map {
            metadata[k] = v;
        }
    }
    Node {
        id: id.to_string(),
        metadata: Some(json_to_struct(&metadata)),
        user_agent_name: "meshfed-test-client".into(),
        ..Default::default()
    }
}

/// A node with default metadata.
pub fn node(id: &str) -> Node {
    node_with(id, serde_json::json!({}))
}

/// What one Envoy proxy was sent ([`AdsClient::fetch_config`]).
#[derive(Clone, Debug, Default)]
pub struct ProxyConfig {
    pub clusters: Vec<Cluster>,
    pub listeners: Vec<envoy_types::pb::envoy::config::listener::v3::Listener>,
    pub routes: Vec<envoy_types::pb::envoy::config::route::v3::RouteConfiguration>,
}

/// A state-of-the-world ADS client that keeps track of versions and nonces per type
/// like Envoy does, so tests read as protocol conversations.
#[derive(Debug)]
pub struct AdsClient {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: Streaming<DiscoveryResponse>,
    node: Option<Node>,
    /// Per type: (last accepted version, last received nonce, subscribed names).
    state: HashMap<&'static str, (String, String, Vec<String>)>,
}

/// How a test client speaks TLS to the secure port.
#[derive(Clone, Debug)]
pub struct ClientTls {
    /// Roots (PEM) the server's certificate must chain to.
    pub roots_pem: String,
    /// The client's certificate chain and key (PEM), if it presents one.
    pub identity: Option<(String, String)>,
    /// The name the server's certificate must carry.
    pub server_name: String,
}

/// A TLS client configuration (rustls on ring, ALPN h2) trusting `roots` and, with
/// `identity` (certificate chain and key, PEM), presenting it.
pub fn tls_client_config(
    roots: Arc<rustls::RootCertStore>,
    identity: Option<(&str, &str)>,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((chain, key)) => builder.with_client_auth_cert(
            CertificateDer::pem_slice_iter(chain.as_bytes()).collect::<Result<Vec<_>, _>>()?,
            PrivateKeyDer::from_pem_slice(key.as_bytes())?,
        )?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The roots of a PEM bundle.
pub fn root_store(pem: &str) -> anyhow::Result<rustls::RootCertStore> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        roots.add(cert?)?;
    }
    Ok(roots)
}

/// A gRPC channel with `endpoint`'s settings to `addr` over TLS with `config`,
/// checking the server's certificate for `server_name` (TCP without Nagle delay).
pub async fn tls_connect(
    endpoint: tonic::transport::Endpoint,
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    server_name: rustls_pki_types::ServerName<'static>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let connector = tokio_rustls::TlsConnector::from(config);
    endpoint
        .connect_with_connector(tower::service_fn(move |_: tonic::codegen::http::Uri| {
            let (connector, name) = (connector.clone(), server_name.clone());
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                tcp.set_nodelay(true)?;
                let io = connector.connect(name, tcp).await?;
                // Gathered above TLS, once its handshake is done.
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(Gathered::new(io)))
            }
        }))
        .await
}

/// Connects `endpoint` to `addr` over TCP, the client's writes gathered into fewer
/// system calls as Envoy's are ([`crate::ads::coalesce`]).
pub async fn plain_connect(
    endpoint: tonic::transport::Endpoint,
    addr: SocketAddr,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    endpoint.connect_with_connector(plain_connector(addr)).await
}

/// [`plain_connect`], connecting on first use.
pub fn plain_connect_lazy(
    endpoint: tonic::transport::Endpoint,
    addr: SocketAddr,
) -> tonic::transport::Channel {
    endpoint.connect_with_connector_lazy(plain_connector(addr))
}

fn plain_connector(
    addr: SocketAddr,
) -> impl tower::Service<
    tonic::codegen::http::Uri,
    Response = hyper_util::rt::TokioIo<Gathered<tokio::net::TcpStream>>,
    Error = std::io::Error,
    Future = impl Future<
        Output = std::io::Result<hyper_util::rt::TokioIo<Gathered<tokio::net::TcpStream>>>,
    > + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |_: tonic::codegen::http::Uri| async move {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        Ok(hyper_util::rt::TokioIo::new(Gathered::new(tcp)))
    })
}

/// A gRPC channel to `addr` over TLS as `tls` says.
pub async fn tls_channel(
    addr: SocketAddr,
    tls: &ClientTls,
) -> anyhow::Result<tonic::transport::Channel> {
    let identity = tls.identity.as_ref().map(|(c, k)| (c.as_str(), k.as_str()));
    let config = tls_client_config(Arc::new(root_store(&tls.roots_pem)?), identity)?;
    let name = rustls_pki_types::ServerName::try_from(tls.server_name.clone())?;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?;
    Ok(tls_connect(endpoint, addr, config, name).await?)
}

/// Calls `istio.v1.auth.IstioCertificateService/CreateCertificate` over `channel`
/// with call `metadata`.
pub async fn create_certificate(
    channel: tonic::transport::Channel,
    metadata: MetadataMap,
    request: meshfed_api::auth::v1::IstioCertificateRequest,
) -> Result<meshfed_api::auth::v1::IstioCertificateResponse, tonic::Status> {
    let mut client = tonic::client::Grpc::new(channel);
    client
        .ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<
        meshfed_api::auth::v1::IstioCertificateRequest,
        meshfed_api::auth::v1::IstioCertificateResponse,
    >::default();
    let mut request = tonic::Request::new(request);
    *request.metadata_mut() = metadata;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/istio.v1.auth.IstioCertificateService/CreateCertificate",
    );
    client
        .unary(request, path, codec)
        .await
        .map(tonic::Response::into_inner)
}

impl AdsClient {
    /// Opens a stream to `addr` for `node`.
    pub async fn connect(addr: SocketAddr, node: Node) -> anyhow::Result<AdsClient> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect()
            .await?;
        AdsClient::over(channel, MetadataMap::new(), node).await
    }

    /// Opens a stream over `channel` with call `metadata` (e.g. `authorization`).
    pub async fn over(
        channel: tonic::transport::Channel,
        metadata: MetadataMap,
        node: Node,
    ) -> anyhow::Result<AdsClient> {
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        let (tx, rx) = mpsc::channel(16);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        *request.metadata_mut() = metadata;
        let rx = client
            .stream_aggregated_resources(request)
            .await?
            .into_inner();
        Ok(AdsClient {
            tx,
            rx,
            node: Some(node),
            state: HashMap::new(),
        })
    }

    /// Sends a raw request (the node is attached to the first one).
    pub async fn send(&mut self, mut request: DiscoveryRequest) -> anyhow::Result<()> {
        if let Some(node) = self.node.take() {
            request.node = Some(node);
        }
        self.tx
            .send(request)
            .await
            .map_err(|_| anyhow!("stream closed"))
    }

    /// Subscribes `type_url` to `names` (empty = wildcard for CDS/LDS), carrying the
    /// last accepted version and nonce as Envoy does.
    pub async fn subscribe(&mut self, type_url: TypeUrl, names: &[&str]) -> anyhow::Result<()> {
        let entry = self.state.entry(type_url.as_str()).or_default();
        entry.2 = names.iter().map(|s| s.to_string()).collect();
        let request = DiscoveryRequest {
            type_url: type_url.as_str().into(),
            resource_names: entry.2.clone(),
            version_info: entry.0.clone(),
            response_nonce: entry.1.clone(),
            ..Default::default()
        };
        self.send(request).await
    }

    /// The next response, failing after [`RECV_TIMEOUT`].
    pub async fn recv(&mut self) -> anyhow::Result<DiscoveryResponse> {
        let response = tokio::time::timeout(RECV_TIMEOUT, self.rx.message())
            .await
            .context("no xDS response within the timeout")??
            .ok_or_else(|| anyhow!("stream ended"))?;
        Ok(response)
    }

    /// The stream's closing status (for tests of refused streams).
    pub async fn recv_error(&mut self) -> anyhow::Result<tonic::Status> {
        match tokio::time::timeout(RECV_TIMEOUT, self.rx.message())
            .await
            .context("timeout")?
        {
            Err(status) => Ok(status),
            Ok(other) => bail!("expected an error status, got {other:?}"),
        }
    }

    /// Accepts a response: records its version and nonce and sends the ACK.
    pub async fn ack(&mut self, response: &DiscoveryResponse) -> anyhow::Result<()> {
        let type_url = static_type(&response.type_url)?;
        let entry = self.state.entry(type_url).or_default();
        entry.0 = response.version_info.clone();
        entry.1 = response.nonce.clone();
        let request = DiscoveryRequest {
            type_url: response.type_url.clone(),
            resource_names: entry.2.clone(),
            version_info: entry.0.clone(),
            response_nonce: entry.1.clone(),
            ..Default::default()
        };
        self.send(request).await
    }

    /// Rejects a response with `message`, keeping the last accepted version.
    pub async fn nack(
        &mut self,
        response: &DiscoveryResponse,
        message: &str,
    ) -> anyhow::Result<()> {
        let type_url = static_type(&response.type_url)?;
        let entry = self.state.entry(type_url).or_default();
        entry.1 = response.nonce.clone();
        let request = DiscoveryRequest {
            type_url: response.type_url.clone(),
            resource_names: entry.2.clone(),
            version_info: entry.0.clone(),
            response_nonce: entry.1.clone(),
            error_detail: Some(RpcStatus {
                code: 3,
                message: message.to_string(),
                details: vec![],
            }),
            ..Default::default()
        };
        self.send(request).await
    }

    /// Receives, checks the type, ACKs and decodes a CDS response.
    pub async fn recv_clusters(&mut self) -> anyhow::Result<Vec<Cluster>> {
        let response = self.recv_type(TypeUrl::Cluster).await?;
        decode_all(&response)
    }

    /// Receives, checks the type, ACKs and decodes an EDS response.
    pub async fn recv_load_assignments(&mut self) -> anyhow::Result<Vec<ClusterLoadAssignment>> {
        let response = self.recv_type(TypeUrl::Endpoint).await?;
        decode_all(&response)
    }

    /// What an Envoy proxy asks for at start, in its order: every cluster, every
    /// listener, then the route tables the listeners name. Each response is ACKed.
    #[cfg(any(test, feature = "testing"))]
    pub async fn fetch_config(&mut self) -> anyhow::Result<ProxyConfig> {
        use envoy_types::pb::envoy::config::listener::v3::Listener;
        self.subscribe(TypeUrl::Cluster, &[]).await?;
        let clusters = self.recv_clusters().await?;
        self.subscribe(TypeUrl::Listener, &[]).await?;
        let listeners: Vec<Listener> = decode_all(&self.recv_type(TypeUrl::Listener).await?)?;
        let names: std::collections::BTreeSet<String> = listeners
            .iter()
            .flat_map(|l| crate::generate::lds::references(l).1)
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let routes = if names.is_empty() {
            Vec::new()
        } else {
            self.subscribe(TypeUrl::Route, &names).await?;
            decode_all(&self.recv_type(TypeUrl::Route).await?)?
        };
        Ok(ProxyConfig {
            clusters,
            listeners,
            routes,
        })
    }

    /// Receives a response, fails unless it is of `type_url`, and ACKs it.
    pub async fn recv_type(&mut self, type_url: TypeUrl) -> anyhow::Result<DiscoveryResponse> {
        let response = self.recv().await?;
        if response.type_url != type_url.as_str() {
            bail!(
                "expected a {} response, got {}",
                type_url.short(),
                response.type_url
            );
        }
        self.ack(&response).await?;
        Ok(response)
    }
}

/// A Delta ADS client.
#[derive(Debug)]
pub struct DeltaClient {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: Streaming<DeltaDiscoveryResponse>,
    node: Option<Node>,
}

impl DeltaClient {
    /// Opens a Delta stream to `addr` for `node`.
    pub async fn connect(addr: SocketAddr, node: Node) -> anyhow::Result<DeltaClient> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect()
            .await?;
        DeltaClient::over(channel, node).await
    }

    /// Opens a Delta stream over `channel`.
    pub async fn over(
        channel: tonic::transport::Channel,
        node: Node,
    ) -> anyhow::Result<DeltaClient> {
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        let (tx, rx) = mpsc::channel(16);
        let rx = client
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(DeltaClient {
            tx,
            rx,
            node: Some(node),
        })
    }

    /// Changes the subscription of `type_url`.
    pub async fn subscribe(
        &mut self,
        type_url: TypeUrl,
        subscribe: &[&str],
        unsubscribe: &[&str],
    ) -> anyhow::Result<()> {
        let request = DeltaDiscoveryRequest {
            type_url: type_url.as_str().into(),
            resource_names_subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
            resource_names_unsubscribe: unsubscribe.iter().map(|s| s.to_string()).collect(),
            node: self.node.take(),
            ..Default::default()
        };
        self.tx
            .send(request)
            .await
            .map_err(|_| anyhow!("stream closed"))
    }

    /// The next response, failing after [`RECV_TIMEOUT`].
    pub async fn recv(&mut self) -> anyhow::Result<DeltaDiscoveryResponse> {
        tokio::time::timeout(RECV_TIMEOUT, self.rx.message())
            .await
            .context("no delta xDS response within the timeout")??
            .ok_or_else(|| anyhow!("stream ended"))
    }

    /// ACKs a response.
    pub async fn ack(&mut self, response: &DeltaDiscoveryResponse) -> anyhow::Result<()> {
        let request = DeltaDiscoveryRequest {
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            node: self.node.take(),
            ..Default::default()
        };
        self.tx
            .send(request)
            .await
            .map_err(|_| anyhow!("stream closed"))
    }

    /// Sends a request for `type_url` carrying `nonce` and no subscription change.
    pub async fn ack_nonce(&mut self, type_url: TypeUrl, nonce: &str) -> anyhow::Result<()> {
        let request = DeltaDiscoveryRequest {
            type_url: type_url.as_str().into(),
            response_nonce: nonce.to_string(),
            node: self.node.take(),
            ..Default::default()
        };
        self.tx
            .send(request)
            .await
            .map_err(|_| anyhow!("stream closed"))
    }

    /// Rejects a response with `message`.
    pub async fn nack(
        &mut self,
        response: &DeltaDiscoveryResponse,
        message: &str,
    ) -> anyhow::Result<()> {
        let request = DeltaDiscoveryRequest {
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            error_detail: Some(RpcStatus {
                code: 3,
                message: message.to_string(),
                details: vec![],
            }),
            node: self.node.take(),
            ..Default::default()
        };
        self.tx
            .send(request)
            .await
            .map_err(|_| anyhow!("stream closed"))
    }

    /// Receives a response of `type_url` and ACKs it.
    pub async fn recv_type(&mut self, type_url: TypeUrl) -> anyhow::Result<DeltaDiscoveryResponse> {
        let response = self.recv().await?;
        if response.type_url != type_url.as_str() {
            bail!(
                "expected a {} response, got {}",
                type_url.short(),
                response.type_url
            );
        }
        self.ack(&response).await?;
        Ok(response)
    }
}

/// Decodes every resource of a SotW response as `M`.
pub fn decode_all<M: Message + Default>(response: &DiscoveryResponse) -> anyhow::Result<Vec<M>> {
    response
        .resources
        .iter()
        .map(|any| M::decode(any.value.as_slice()).context("decoding a resource"))
        .collect()
}

/// Decodes every resource of a Delta response as `M`.
pub fn decode_delta<M: Message + Default>(
    response: &DeltaDiscoveryResponse,
) -> anyhow::Result<Vec<M>> {
    response
        .resources
        .iter()
        .map(|r| {
            let any = r
                .resource
                .as_ref()
                .ok_or_else(|| anyhow!("resource {} has no body", r.name))?;
            M::decode(any.value.as_slice()).context("decoding a resource")
        })
        .collect()
}

fn static_type(url: &str) -> anyhow::Result<&'static str> {
    TypeUrl::parse(url)
        .map(TypeUrl::as_str)
        .ok_or_else(|| anyhow!("unknown type {url}"))
}

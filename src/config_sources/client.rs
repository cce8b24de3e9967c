//! The ADS client of one `xds://` config source, shaped like istiod's
//! (`pilot/pkg/bootstrap/configcontroller.go` over `pkg/adsc`): a plaintext gRPC
//! stream, a node with `GENERATOR=api`, one SotW request per config kind
//! (`<group>/<version>/<kind>`), every response applied to the source's store and
//! acknowledged (istiod's client acknowledges every response, rejecting bad objects
//! one by one rather than NACKing), and reconnection with backoff, keeping what the
//! source last sent.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{Struct, Value, value};
use meshfed_registry::config::Kind;
use meshfed_registry::read::Backoff;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, warn};

use super::metrics::{ErrorKind, ErrorLabel, SourceLabel, SourceMetrics};
use super::store::{SourceStore, kind_of, type_url};
use crate::drain::Shutdown;

/// Who the client says it is, as istiod's config-source client does.
#[derive(Clone, Debug)]
pub struct ClientIdentity {
    /// The control plane's namespace (`POD_NAMESPACE`).
    pub namespace: String,
    /// Its pod name (`POD_NAME`).
    pub workload: String,
    /// Its IP address (`INSTANCE_IP`, `POD_IP`).
    pub ip: String,
    /// Its revision (`ISTIO_REVISION` in the metadata when not empty).
    pub revision: String,
}

impl ClientIdentity {
    /// `sidecar~<ip>~<workload>.<namespace>~<namespace>.svc.cluster.local` (istiod's
    /// client keeps the default node type and domain) and the metadata
    /// `GENERATOR=api`, `ISTIO_VERSION`, and `ISTIO_REVISION` when set.
    pub fn node(&self) -> Node {
        let text = |s: &str| Value {
            kind: Some(value::Kind::StringValue(s.to_string())),
        };
        let mut fields = std::collections::HashMap::new();
        fields.insert("GENERATOR".to_string(), text("api"));
        // What istiod's client sends when no version is set: newer than any release.
        fields.insert("ISTIO_VERSION".to_string(), text("65536.65536.65536"));
        if !self.revision.is_empty() {
            fields.insert("ISTIO_REVISION".to_string(), text(&self.revision));
        }
        Node {
            id: format!(
                "sidecar~{}~{}.{}~{}.svc.cluster.local",
                self.ip, self.workload, self.namespace, self.namespace
            ),
            metadata: Some(Struct { fields }),
            ..Default::default()
        }
    }
}

/// One source's client.
#[derive(Debug)]
pub struct SourceClient {
    /// `host:port`.
    pub authority: String,
    pub identity: ClientIdentity,
    pub store: SourceStore,
    pub metrics: std::sync::Arc<SourceMetrics>,
    /// Reconnection delays.
    pub backoff: Backoff,
}

/// How a stream ended.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error("connecting: {0}")]
    Connect(String),
    #[error("stream: {0}")]
    Stream(String),
    #[error("the server ended the stream")]
    Ended,
}

impl SourceClient {
    fn label(&self) -> SourceLabel {
        SourceLabel {
            source: self.store.name().to_string(),
        }
    }

    /// Runs until `stop` fires: connects, follows the stream, and after it ends waits
    /// the backoff's delay (reset by every stream that got a response) and connects
    /// again. The objects stay while no stream is open.
    pub async fn run(mut self, mut stop: Shutdown) {
        loop {
            let ended = tokio::select! {
                ended = self.stream() => ended,
                () = stop.wait() => return,
            };
            let reason = match &ended {
                StreamError::Connect(_) => ErrorKind::Connect,
                _ => ErrorKind::Stream,
            };
            let text = ended.to_string();
            self.store.disconnected(&text);
            self.metrics.connected.get_or_create(&self.label()).set(0);
            self.metrics
                .stale
                .get_or_create(&self.label())
                .set(i64::from(self.store.status().stale));
            self.metrics
                .errors
                .get_or_create(&ErrorLabel {
                    source: self.store.name().to_string(),
                    reason,
                })
                .inc();
            let delay = self.backoff.next_delay();
            warn!(source = %self.store.name(), retry_in = ?delay, "config source: {text}; keeping its last objects");
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = stop.wait() => return,
            }
        }
    }

    /// One stream, until it ends.
    async fn stream(&mut self) -> StreamError {
        let endpoint =
            match tonic::transport::Endpoint::from_shared(format!("http://{}", self.authority)) {
                Ok(e) => e
                    .connect_timeout(Duration::from_secs(10))
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_secs(30))
                    .keep_alive_timeout(Duration::from_secs(10)),
                Err(e) => return StreamError::Connect(e.to_string()),
            };
        let channel = match endpoint.connect().await {
            Ok(c) => c,
            Err(e) => return StreamError::Connect(error_chain(&e)),
        };
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        let kinds = Kind::ALL;
        let (tx, rx) = mpsc::channel::<DiscoveryRequest>(kinds.len() + 4);
        let node = self.identity.node();
        for (i, kind) in kinds.iter().enumerate() {
            let request = DiscoveryRequest {
                node: (i == 0).then(|| node.clone()),
                type_url: type_url(*kind),
                ..Default::default()
            };
            // The channel holds every initial request.
            let _ = tx.try_send(request);
        }
        let mut responses = match client
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
        {
            Ok(r) => r.into_inner(),
            Err(status) => return StreamError::Connect(status.message().to_string()),
        };
        self.store.connected();
        self.metrics.connected.get_or_create(&self.label()).set(1);
        info!(source = %self.store.name(), "config source: stream open");
        loop {
            let response = match responses.message().await {
                Ok(Some(r)) => r,
                Ok(None) => return StreamError::Ended,
                Err(status) => {
                    return StreamError::Stream(format!(
                        "{:?}: {}",
                        status.code(),
                        status.message()
                    ));
                }
            };
            // A response means the source works: the next failure starts over.
            self.backoff.reset();
            self.handle(&response, kinds.len());
            let ack = DiscoveryRequest {
                type_url: response.type_url.clone(),
                version_info: response.version_info.clone(),
                response_nonce: response.nonce.clone(),
                ..Default::default()
            };
            if tx.send(ack).await.is_err() {
                return StreamError::Ended;
            }
        }
    }

    /// Applies one response to the store.
    fn handle(&self, response: &DiscoveryResponse, expected: usize) {
        let Some(kind) = kind_of(&response.type_url) else {
            debug!(source = %self.store.name(), type_url = %response.type_url, "config source: response of a type not asked for, acknowledged and ignored");
            return;
        };
        let resources: Vec<(&str, &[u8])> = response
            .resources
            .iter()
            .map(|any| (any.type_url.as_str(), any.value.as_slice()))
            .collect();
        let applied = self.store.apply(kind, &resources, expected);
        debug!(source = %self.store.name(), %kind, objects = applied.objects, rejected = applied.rejected, version = %response.version_info, "config source: applied");
        let label = self.label();
        let status = self.store.status();
        self.metrics.responses.get_or_create(&label).inc();
        self.metrics
            .objects
            .get_or_create(&label)
            .set(self.store.len() as i64);
        self.metrics
            .rejected
            .get_or_create(&label)
            .set(meshfed_registry::config::ConfigStore::rejected(&self.store).len() as i64);
        self.metrics
            .stale
            .get_or_create(&label)
            .set(i64::from(status.stale));
        if let Some(t) = status.last_update {
            self.metrics.last_update.get_or_create(&label).set(t);
        }
    }
}

/// An error with its causes (`a: b: c`): tonic's transport errors say little alone.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

//! A fake MCP-over-xDS server for tests: a real ADS gRPC server on loopback that
//! hands each stream to the test, which reads the client's requests and sends
//! responses in Istio's shape (`mcp.v1alpha1.Resource` envelopes, type URLs
//! `<group>/<version>/<kind>`), as istiod's `apigen` serves them.

use std::net::SocketAddr;
use std::pin::Pin;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use futures::Stream;
use meshfed_api::mcp::v1alpha1::{Metadata, Resource};
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use super::store::RESOURCE_TYPE_URL;

/// One stream a client opened: its requests and where the test sends responses.
#[derive(Debug)]
pub struct FakeStream {
    requests: Streaming<DiscoveryRequest>,
    responses: mpsc::UnboundedSender<Result<DiscoveryResponse, Status>>,
    nonce: u64,
}

impl FakeStream {
    /// The client's next request (panics when the stream ended).
    pub async fn request(&mut self) -> DiscoveryRequest {
        match self.requests.message().await {
            Ok(Some(r)) => r,
            other => panic!("the client's stream ended: {other:?}"),
        }
    }

    /// Sends the whole set of `type_url` (SotW) at `version`; returns the nonce.
    pub fn send(&mut self, type_url: &str, version: &str, resources: Vec<Any>) -> String {
        self.nonce += 1;
        let nonce = format!("nonce-{}", self.nonce);
        let response = DiscoveryResponse {
            version_info: version.to_string(),
            resources,
            type_url: type_url.to_string(),
            nonce: nonce.clone(),
            ..Default::default()
        };
        let _ = self.responses.send(Ok(response));
        nonce
    }

    /// Ends the stream with `status`.
    pub fn fail(&self, status: Status) {
        let _ = self.responses.send(Err(status));
    }
}

/// A running fake server.
#[derive(Debug)]
pub struct FakeMcpServer {
    /// Where it listens.
    pub addr: SocketAddr,
    streams: mpsc::UnboundedReceiver<FakeStream>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

struct Handler {
    streams: mpsc::UnboundedSender<FakeStream>,
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Handler {
    type StreamAggregatedResourcesStream = ResponseStream;
    type DeltaAggregatedResourcesStream = DeltaStream;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = self.streams.send(FakeStream {
            requests: request.into_inner(),
            responses: tx,
            nonce: 0,
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaStream>, Status> {
        Err(Status::unimplemented("the fake MCP server speaks SotW"))
    }
}

impl FakeMcpServer {
    /// Starts on `addr` (port 0 for any).
    pub async fn start(addr: SocketAddr) -> FakeMcpServer {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("bound address");
        let (tx, streams) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(AggregatedDiscoveryServiceServer::new(Handler {
                    streams: tx,
                }))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
        });
        FakeMcpServer {
            addr,
            streams,
            stop: Some(stop),
            task,
        }
    }

    /// The next stream a client opens.
    pub async fn stream(&mut self) -> FakeStream {
        self.streams.recv().await.expect("the server runs")
    }

    /// Stops listening (streams the test still holds stay until dropped).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.streams.close();
        while self.streams.recv().await.is_some() {}
        self.task.abort();
        let _ = self.task.await;
    }
}

/// An MCP resource as istiod serves it: `metadata.name` `<namespace>/<name>`,
/// `version`, and the spec as the body.
pub fn resource<M: Message + prost::Name>(name: &str, version: &str, spec: &M) -> Any {
    let resource = Resource {
        metadata: Some(Metadata {
            name: name.to_string(),
            version: version.to_string(),
            ..Default::default()
        }),
        body: Some(pbjson_types::Any {
            type_url: format!("type.googleapis.com/{}", M::full_name()),
            value: spec.encode_to_vec().into(),
        }),
    };
    Any {
        type_url: RESOURCE_TYPE_URL.to_string(),
        value: resource.encode_to_vec(),
    }
}

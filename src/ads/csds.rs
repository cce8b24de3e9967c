//! The `envoy.service.status.v3.ClientStatusDiscoveryService` gRPC service (CSDS)
//! on the ADS ports: `FetchClientStatus` and `StreamClientStatus` (one response per
//! request). The secure port authenticates the caller as it does ADS streams; what
//! the answer holds and who may read it is the [`super::debug::DebugSource`]'s.

use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_server::{
    ClientStatusDiscoveryService, ClientStatusDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::status::v3::{ClientStatusRequest, ClientStatusResponse};
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::debug::DebugCaller;
use super::server::XdsContext;
use super::transport::XdsConnectInfo;
use crate::authn::{AuthContext, Authenticators, Caller};

/// CSDS on one port.
#[derive(Clone, Debug)]
pub struct Csds {
    ctx: Arc<XdsContext>,
    authenticators: Option<Arc<Authenticators>>,
}

impl Csds {
    /// CSDS on the plaintext port (`authenticators` `None`) or the secure port.
    pub fn server(
        ctx: Arc<XdsContext>,
        authenticators: Option<Arc<Authenticators>>,
    ) -> ClientStatusDiscoveryServiceServer<Csds> {
        ClientStatusDiscoveryServiceServer::new(Csds {
            ctx,
            authenticators,
        })
    }

    /// Who calls: `None` on the plaintext port; on the secure port the authenticated
    /// caller, or the status refusing it.
    async fn caller<T>(&self, request: &Request<T>) -> Result<Option<Caller>, Status> {
        let Some(chain) = &self.authenticators else {
            return Ok(None);
        };
        let tls = request
            .extensions()
            .get::<XdsConnectInfo>()
            .and_then(|info| info.tls.clone());
        let ctx = AuthContext {
            metadata: request.metadata(),
            tls: tls.as_deref(),
        };
        match chain.authenticate(ctx).await {
            Ok(caller) => Ok(Some(caller)),
            Err(why) => {
                self.ctx.metrics.record_debug("csds", "refused");
                Err(Status::unauthenticated(format!(
                    "authentication failure: {why}"
                )))
            }
        }
    }

    fn answer(
        ctx: &XdsContext,
        caller: Option<&Caller>,
        request: &ClientStatusRequest,
    ) -> Result<ClientStatusResponse, Status> {
        let identity = caller.and_then(|c| c.identities.first().map(String::as_str));
        let debug_caller = DebugCaller {
            identity,
            secure: caller.is_some(),
        };
        let answer = match ctx.debug.get() {
            Some(source) => source.client_status(debug_caller, request),
            None => Ok(ClientStatusResponse::default()),
        };
        let result = if answer.is_ok() {
            "answered"
        } else {
            "refused"
        };
        ctx.metrics.record_debug("csds", result);
        answer
    }
}

/// The response stream of `StreamClientStatus`.
type StatusStream = Pin<Box<dyn Stream<Item = Result<ClientStatusResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ClientStatusDiscoveryService for Csds {
    type StreamClientStatusStream = StatusStream;

    async fn stream_client_status(
        &self,
        request: Request<Streaming<ClientStatusRequest>>,
    ) -> Result<Response<StatusStream>, Status> {
        let caller = self.caller(&request).await?;
        let ctx = self.ctx.clone();
        let requests = request.into_inner();
        let responses = requests.map(move |request| {
            let request = request?;
            Csds::answer(&ctx, caller.as_ref(), &request)
        });
        Ok(Response::new(Box::pin(responses)))
    }

    async fn fetch_client_status(
        &self,
        request: Request<ClientStatusRequest>,
    ) -> Result<Response<ClientStatusResponse>, Status> {
        let caller = self.caller(&request).await?;
        Csds::answer(&self.ctx, caller.as_ref(), request.get_ref()).map(Response::new)
    }
}

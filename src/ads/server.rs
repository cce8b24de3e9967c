//! The tonic shell around the protocol state: accepts ADS streams (SotW and Delta),
//! parses the node, registers the connection, then runs one loop per stream that
//! answers requests and pushes, one at a time.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use meshfed_registry::PushRequest;
use prost::Message;
use tokio::sync::Semaphore;

use super::outbox;
use tonic::Status;
use tonic::codegen::{Body, BoxFuture, Bytes, Context, Poll, Service, StdError, http};
use tonic::server::NamedService;
use tracing::{debug, info, warn};

use super::connection::Action;
use super::debug::{DebugCaller, DebugSource, is_debug_type, other_nonce};
use super::flavour::{Delta, FlavourIo, Reply, Sotw, Why};
use super::frames::{Outbound, RequestError, RequestStream, ResponseBody};
use super::limit::LogLimiter;
use super::metrics::XdsMetrics;
use super::rate::StreamRateLimiter;
use super::transport::{ConnControl, XdsConnectInfo};
use super::{ConnectionHandle, Connections, Pending};
use crate::authn::{AuthContext, Authenticators, TlsPeer, authorize_proxy};
use crate::drain::Shutdown;
use crate::generate::{GeneratorOptions, Scope, Subscription, generate};
use crate::logging::{ERROR_DETAIL_LOG_MAX, NODE_ID_LOG_MAX, clip};
use crate::model::{Generator, Proxy};
use crate::push::snapshot::Snapshot;
use crate::xds::deps::{PushScope, Touch};
use crate::xds::{ResourceList, TypeUrl};

const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Everything a stream needs from the rest of the server.
pub struct XdsContext {
    /// The current snapshot.
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    /// Live connections.
    pub connections: Arc<Connections>,
    /// Bounds concurrent pushes (Istio's `PILOT_PUSH_THROTTLE`).
    pub push_slots: Arc<Semaphore>,
    /// Metrics.
    pub metrics: Arc<XdsMetrics>,
    /// Generator settings.
    pub options: GeneratorOptions,
    /// Whether streams may be accepted (registries synced).
    pub ready: Arc<dyn Fn() -> bool + Send + Sync>,
    /// Stops every stream at once.
    pub shutdown: Shutdown,
    /// Starts the drain: each stream is closed at its own moment within
    /// `drain_duration`, so its proxy reconnects to another replica without every proxy
    /// doing so at once.
    pub draining: Shutdown,
    /// The window over which streams are closed once draining.
    pub drain_duration: Duration,
    /// How long one response may wait for a peer that does not read before its
    /// connection is closed (`--xdsSendTimeout`); `None`: for ever.
    pub send_timeout: Option<Duration>,
    /// Limits the log lines of refused streams (peers can cause them at will).
    pub refusal_log: LogLimiter,
    /// The new-stream rate limit of both ports (`--maxRequestsPerSecond`); `None`:
    /// no limit.
    pub stream_rate: Option<StreamRateLimiter>,
    /// Gateway credentials (SDS); `None`: the Secret type is answered empty.
    pub sds: Option<Arc<crate::sds::Sds>>,
    /// The WorkloadEntry controller (auto-registration and health); `None`: off.
    pub workloads: Option<Arc<dyn super::WorkloadHooks>>,
    /// `control_plane` of every response: the encoded
    /// [`super::debug::ControlPlaneId`], computed once.
    pub control_plane: Bytes,
    /// Answers Istio's debug types; set once the admin state exists (until then
    /// they are answered with no resources).
    pub debug: std::sync::OnceLock<Arc<dyn DebugSource>>,
    /// MCP-over-xDS: what is exported, who may read it on the secure port.
    pub mcp: Arc<super::mcp::McpServing>,
}

impl std::fmt::Debug for XdsContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsContext")
            .field("connections", &self.connections.len())
            .finish_non_exhaustive()
    }
}

/// The ADS gRPC service, mounted on a tonic server.
#[derive(Clone, Debug)]
pub struct AdsService {
    ctx: Arc<XdsContext>,
    authenticators: Option<Arc<Authenticators>>,
}

impl AdsService {
    /// The service of the plaintext port: streams carry no identity.
    pub fn new(ctx: Arc<XdsContext>) -> Self {
        AdsService {
            ctx,
            authenticators: None,
        }
    }

    /// The service of the secure port: each stream is authenticated by
    /// `authenticators`, and its node must claim the namespace and service account
    /// of the identity (Istio's xDS authorization).
    pub fn secure(ctx: Arc<XdsContext>, authenticators: Arc<Authenticators>) -> Self {
        AdsService {
            ctx,
            authenticators: Some(authenticators),
        }
    }
}

impl NamedService for AdsService {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

impl<B> Service<http::Request<B>> for AdsService
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let ctx = self.ctx.clone();
        let auth = self.authenticators.clone();
        let response = match req.uri().path() {
            SOTW_PATH => start_stream::<Sotw, B>(ctx, auth, req),
            DELTA_PATH => start_stream::<Delta, B>(ctx, auth, req),
            _ => Status::unimplemented("unknown method").into_http(),
        };
        Box::pin(async move { Ok(response) })
    }
}

/// Accepts one ADS stream: requests are read by [`RequestStream`] and responses go out
/// through [`ResponseBody`] (see [`super::frames`] for why tonic's codec is not used).
fn start_stream<F: FlavourIo, B>(
    ctx: Arc<XdsContext>,
    authenticators: Option<Arc<Authenticators>>,
    req: http::Request<B>,
) -> http::Response<tonic::body::Body>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    if ctx.draining.is_triggered() {
        return Status::unavailable("meshfed is draining: reconnect to another replica")
            .into_http();
    }
    if !(ctx.ready)() {
        return Status::unavailable("meshfed is starting: service registries have not synced yet")
            .into_http();
    }
    let info = req.extensions().get::<XdsConnectInfo>().cloned();
    let peer = info.as_ref().and_then(|info| info.peer);
    let tls = info.as_ref().and_then(|info| info.tls.clone());
    let control = info.map(|info| info.control);
    // The secure port authenticates the stream from its call metadata and TLS peer.
    let admission = authenticators.map(|chain| {
        Box::new(Admission {
            chain,
            metadata: tonic::metadata::MetadataMap::from_headers(req.headers().clone()),
            tls,
        })
    });
    let inbound =
        RequestStream::<F::Req>::new(tonic::body::Body::new(req.into_body()), control.clone());
    let (tx, rx) = outbox::channel(4);
    let body = ResponseBody::new(rx, control.clone());
    tokio::spawn(run_stream::<F>(ctx, admission, inbound, tx, peer, control));
    let mut response = http::Response::new(tonic::body::Body::new(body));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

type Tx<F> = outbox::Sender<Outbound<<F as FlavourIo>::Resp>>;

/// The stream ended; why, for the log.
struct Closed;

/// Ends a stream whose peer broke the protocol: the peer gets `status` (never a clean
/// close it would retry at once), the operator a metric and a rate-limited line.
async fn refuse<F: FlavourIo>(
    ctx: &XdsContext,
    tx: &Tx<F>,
    peer: Option<SocketAddr>,
    connection: Option<&str>,
    reason: &'static str,
    status: Status,
) {
    ctx.metrics.record_request_error(reason);
    if let Some(suppressed) = ctx.refusal_log.allow() {
        warn!(
            peer = ?peer,
            connection = connection.unwrap_or("-"),
            reason,
            code = ?status.code(),
            error = %clip(status.message(), ERROR_DETAIL_LOG_MAX),
            suppressed,
            "refusing xDS stream"
        );
    }
    // Bounded: the peer may not be reading; the stream ends either way.
    let _ = tokio::time::timeout(
        ctx.send_timeout.unwrap_or(Duration::from_secs(30)),
        tx.send(Outbound::Close(status)),
    )
    .await;
}

/// What the secure port checks of a new stream.
struct Admission {
    chain: Arc<Authenticators>,
    metadata: tonic::metadata::MetadataMap,
    tls: Option<Arc<TlsPeer>>,
}

/// Rate limit, authentication, the node against the identity, then registration.
async fn admit<F: FlavourIo>(
    ctx: &XdsContext,
    admission: Option<Box<Admission>>,
    inbound: &mut RequestStream<F::Req>,
    tx: &Tx<F>,
    peer: Option<SocketAddr>,
    transport: Option<Arc<ConnControl>>,
) -> Admitted<F> {
    // Istio's order: rate limit, authentication, then the node against the identity.
    if let Some(limiter) = &ctx.stream_rate
        && !Box::pin(limiter.acquire(super::rate::MAX_WAIT)).await
    {
        let status = Status::resource_exhausted(format!(
            "request rate limit exceeded: more than {} new xDS streams a second (--maxRequestsPerSecond)",
            limiter.rate()
        ));
        Box::pin(refuse::<F>(ctx, tx, peer, None, "rate_limited", status)).await;
        return Admitted::No;
    }
    let caller = match &admission {
        None => None,
        Some(admission) => {
            let ctx_auth = AuthContext {
                metadata: &admission.metadata,
                tls: admission.tls.as_deref(),
            };
            match Box::pin(admission.chain.authenticate(ctx_auth)).await {
                Ok(caller) => Some(caller),
                Err(why) => {
                    let status = Status::unauthenticated(format!("authentication failure: {why}"));
                    Box::pin(refuse::<F>(ctx, tx, peer, None, "unauthenticated", status)).await;
                    return Admitted::No;
                }
            }
        }
    };
    let first = match inbound.message().await {
        Ok(Some(first)) => first,
        Ok(None) | Err(RequestError::Transport(_)) => return Admitted::No,
        Err(RequestError::Protocol { reason, status }) => {
            Box::pin(refuse::<F>(ctx, tx, peer, None, reason, status)).await;
            return Admitted::No;
        }
    };
    let mut proxy = match Proxy::from_node(F::node(&first)) {
        Ok(proxy) => proxy,
        Err(err) => {
            let status = Status::invalid_argument(err.to_string());
            Box::pin(refuse::<F>(ctx, tx, peer, None, "bad_node", status)).await;
            return Admitted::No;
        }
    };
    if let Some(caller) = &caller {
        match authorize_proxy(
            &caller.identities,
            &proxy.namespace,
            proxy.service_account(),
        ) {
            Ok(identity) => proxy.verified_identity = Some(identity),
            Err(why) => {
                let status = Status::permission_denied(why);
                Box::pin(refuse::<F>(
                    ctx,
                    tx,
                    peer,
                    None,
                    "permission_denied",
                    status,
                ))
                .await;
                return Admitted::No;
            }
        }
    }
    if proxy.generator == Generator::Api
        && caller.is_some()
        && !ctx.mcp.admits(true, proxy.verified_identity.as_deref())
    {
        ctx.mcp.metrics.denied.inc();
        let status = Status::permission_denied(format!(
            "GENERATOR=api (MCP) is served on this port only to the identities of --mcpAllowedIdentities; {} is not one",
            proxy.verified_identity.as_deref().unwrap_or("this caller")
        ));
        Box::pin(refuse::<F>(
            ctx,
            tx,
            peer,
            None,
            "permission_denied",
            status,
        ))
        .await;
        return Admitted::No;
    }
    if proxy.generator == Generator::Event {
        // istioctl: answered, never registered as a proxy, never pushed.
        return Admitted::Debug(Box::new(proxy), caller.is_some(), first);
    }
    let handle = ctx.connections.register(proxy, F::FLAVOUR, peer, transport);
    if let Some(hooks) = &ctx.workloads
        && let Err(status) = Box::pin(hooks.connected(&handle.id, &handle.proxy)).await
    {
        ctx.connections.deregister(&handle);
        Box::pin(refuse::<F>(
            ctx,
            tx,
            peer,
            Some(&handle.id),
            "registration_failed",
            status,
        ))
        .await;
        return Admitted::No;
    }
    Admitted::Proxy(handle, first)
}

/// What admitting a new stream came to.
enum Admitted<F: FlavourIo> {
    /// A proxy, registered; its first request is still to be processed.
    Proxy(Arc<ConnectionHandle>, Box<F::Req>),
    /// istioctl's debug stream.
    Debug(Box<Proxy>, bool, Box<F::Req>),
    /// Refused (the peer was told why) or gone.
    No,
}

/// Serves one ADS stream. Admission (rate limit, authentication, the node, the
/// registration) runs in a boxed future of its own: what an idle stream's task keeps
/// is only what the loop below holds.
async fn run_stream<F: FlavourIo>(
    ctx: Arc<XdsContext>,
    admission: Option<Box<Admission>>,
    mut inbound: RequestStream<F::Req>,
    tx: Tx<F>,
    peer: Option<SocketAddr>,
    transport: Option<Arc<ConnControl>>,
) {
    let admitted = Box::pin(admit::<F>(
        &ctx,
        admission,
        &mut inbound,
        &tx,
        peer,
        transport,
    ))
    .await;
    let (handle, first) = match admitted {
        Admitted::Proxy(handle, first) => (handle, first),
        Admitted::Debug(proxy, secure, first) => {
            Box::pin(serve_debug::<F>(
                &ctx, *proxy, secure, inbound, tx, first, peer,
            ))
            .await;
            return;
        }
        Admitted::No => return,
    };
    ctx.metrics.connected.inc();
    if let Some(generator) = &handle.proxy.generator_fallback {
        ctx.metrics.generator_fallbacks.inc();
        info!(
            connection = %clip(&handle.id, NODE_ID_LOG_MAX),
            generator = %clip(generator, NODE_ID_LOG_MAX),
            "unknown GENERATOR node metadata: serving the default generators, as istiod does"
        );
    }
    info!(connection = %clip(&handle.id, NODE_ID_LOG_MAX), node = %clip(&handle.proxy.node_id, NODE_ID_LOG_MAX), flavour = ?F::FLAVOUR, peer = ?peer, "new ADS connection");
    let mut shutdown = ctx.shutdown.clone();
    let mut draining = ctx.draining.clone();
    let drain_at = drain_offset(handle.n, ctx.drain_duration);
    let drained = async move {
        draining.wait().await;
        tokio::time::sleep(drain_at).await;
    };
    tokio::pin!(drained);
    // Kept across turns of the loop, not made anew each turn: each would register
    // with its notifier when first polled and unregister when dropped, on every
    // request and push of every stream.
    let stop = shutdown.wait();
    tokio::pin!(stop);
    let woken = handle.woken();
    tokio::pin!(woken);
    let mut next = Some(first);
    let mut nack_log = LogLimiter::new(NACK_LOG_BURST, NACK_LOG_WINDOW);
    let reason = loop {
        if let Some(request) = next.take() {
            if Box::pin(process_request::<F>(
                &ctx,
                &handle,
                &tx,
                request,
                &mut nack_log,
            ))
            .await
            .is_err()
            {
                break "client went away";
            }
            continue;
        }
        tokio::select! {
            biased;
            () = &mut stop => {
                let _ = tx.send(Outbound::Close(Status::unavailable("meshfed is shutting down"))).await;
                break "server shutdown";
            }
            () = &mut drained => {
                let _ = tx.send(Outbound::Close(Status::unavailable("meshfed is draining: reconnect to another replica"))).await;
                break "server draining";
            }
            message = inbound.message() => match message {
                Ok(Some(request)) => next = Some(request),
                Ok(None) => break "stream closed by client",
                Err(RequestError::Transport(status)) => {
                    // A client that exits mid-stream shows up as a transport error;
                    // that is an ordinary disconnect.
                    debug!(connection = %handle.id, %status, "stream receive error");
                    break "stream reset by client";
                }
                Err(RequestError::Protocol { reason, status }) => {
                    Box::pin(refuse::<F>(&ctx, &tx, peer, Some(&handle.id), reason, status)).await;
                    break "protocol error";
                }
            },
            () = &mut woken => {
                woken.set(handle.woken());
                if let Some(pending) = handle.take_pending()
                    && Box::pin(push::<F>(&ctx, &handle, &tx, pending)).await.is_err()
                {
                    break "client went away";
                }
            }
        }
    };
    ctx.connections.deregister(&handle);
    if let Some(sds) = &ctx.sds {
        sds.forget(&handle.id);
    }
    if let Some(hooks) = &ctx.workloads {
        Box::pin(hooks.disconnected(&handle.id)).await;
    }
    ctx.metrics.connected.dec();
    info!(connection = %clip(&handle.id, NODE_ID_LOG_MAX), reason, "ADS connection closed");
}

/// Serves a debug stream (istioctl's `GENERATOR=event` node): each request is
/// answered on its own ([`answer_other`]); the stream is no proxy, is not in the
/// connections, counts in no proxy gauge and gets no pushes.
async fn serve_debug<F: FlavourIo>(
    ctx: &XdsContext,
    proxy: Proxy,
    secure: bool,
    mut inbound: RequestStream<F::Req>,
    tx: Tx<F>,
    first: Box<F::Req>,
    peer: Option<SocketAddr>,
) {
    debug!(node = %clip(&proxy.node_id, NODE_ID_LOG_MAX), peer = ?peer, "debug xDS stream (GENERATOR=event)");
    let caller = DebugCaller {
        identity: proxy.verified_identity.as_deref(),
        secure,
    };
    let mut shutdown = ctx.shutdown.clone();
    let mut draining = ctx.draining.clone();
    let mut next = Some(first);
    loop {
        if let Some(request) = next.take() {
            if let Err(status) = Box::pin(answer_other::<F>(
                ctx,
                caller,
                &proxy.node_id,
                &tx,
                &request,
            ))
            .await
            {
                let _ = tx.send(Outbound::Close(status)).await;
                return;
            }
            continue;
        }
        tokio::select! {
            biased;
            () = shutdown.wait() => {
                let _ = tx.send(Outbound::Close(Status::unavailable("meshfed is shutting down"))).await;
                return;
            }
            () = draining.wait() => {
                let _ = tx.send(Outbound::Close(Status::unavailable("meshfed is draining: reconnect to another replica"))).await;
                return;
            }
            message = inbound.message() => match message {
                Ok(Some(request)) => next = Some(request),
                Ok(None) | Err(RequestError::Transport(_)) => return,
                Err(RequestError::Protocol { reason, status }) => {
                    Box::pin(refuse::<F>(ctx, &tx, peer, None, reason, status)).await;
                    return;
                }
            },
        }
    }
}

/// Answers a request for a type outside the per-type conversation: a debug type
/// through the [`DebugSource`], any other unserved type with no resources (istiod's
/// status generator answers so; a client never waits out its timeout). A request
/// carrying a nonce ACKs an earlier answer and gets none. `Err`: the status that ends
/// the stream (a refused debug request, as istiod ends it).
async fn answer_other<F: FlavourIo>(
    ctx: &XdsContext,
    caller: DebugCaller<'_>,
    connection: &str,
    tx: &Tx<F>,
    request: &F::Req,
) -> Result<(), Status> {
    let other = F::other_request(request);
    if !other.nonce.is_empty() {
        return Ok(());
    }
    let resources = if is_debug_type(&other.type_url) {
        let label = super::metrics::debug_type_label(&other.type_url);
        let answer = match ctx.debug.get() {
            Some(source) => source.answer(caller, &other.type_url, &other.names),
            None => Ok(Vec::new()),
        };
        match answer {
            Ok(resources) => {
                ctx.metrics.record_debug(label, "answered");
                resources
            }
            Err(why) => {
                ctx.metrics.record_debug(label, "refused");
                info!(connection = %clip(connection, NODE_ID_LOG_MAX), r#type = %clip(&other.type_url, 64), identity = ?caller.identity, error = %why, "debug request refused");
                return Err(Status::unknown(why));
            }
        }
    } else {
        ctx.metrics.unknown_types.inc();
        debug!(connection = %clip(connection, NODE_ID_LOG_MAX), r#type = %clip(&other.type_url, 256), "answering a request for an unserved type with no resources");
        Vec::new()
    };
    let version = ctx.snapshot.load().version().to_string();
    let nonce = other_nonce(&version);
    let response = F::other_response(
        &other.type_url,
        &version,
        nonce,
        resources,
        ctx.control_plane.clone(),
    );
    let limit = ctx.send_timeout.unwrap_or(Duration::from_secs(30));
    match tokio::time::timeout(limit, tx.send(Outbound::Message(Box::new(response)))).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(Status::unavailable("the client does not read its stream")),
    }
}

/// When, within a drain of `window`, connection `n` is closed: spread evenly over the
/// window by a multiplicative hash of the connection number, so consecutive
/// connections land far apart.
fn drain_offset(n: u64, window: Duration) -> Duration {
    let slot = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54; // 0..1024
    window.mul_f64(slot as f64 / 1024.0)
}

/// NACK lines written per connection and window; the rest are counted in the next.
const NACK_LOG_BURST: u32 = 3;
const NACK_LOG_WINDOW: Duration = Duration::from_secs(60);

async fn process_request<F: FlavourIo>(
    ctx: &XdsContext,
    handle: &ConnectionHandle,
    tx: &Tx<F>,
    request: Box<F::Req>,
    nack_log: &mut LogLimiter,
) -> Result<(), Closed> {
    // The watch index learns a new subscription before the answer is generated: a
    // push that comes after the snapshot this answer reads then finds the connection.
    let action = ctx
        .connections
        .apply_request(handle, |state| F::apply(state, &request));
    match action {
        Action::Respond(type_url) => {
            if matches!(type_url, TypeUrl::Secret | TypeUrl::ExtensionConfig) {
                prepare_secrets(ctx, handle).await;
            }
            let identity = handle.proxy.verified_identity.as_deref();
            if type_url.is_mcp() && !ctx.mcp.admits(identity.is_some(), identity) {
                ctx.mcp.metrics.denied.inc();
                let status = Status::permission_denied(format!(
                    "{} (MCP) is served on this port only to the identities of --mcpAllowedIdentities; {} is not one",
                    type_url.as_str(),
                    identity.unwrap_or("this caller")
                ));
                Box::pin(refuse::<F>(
                    ctx,
                    tx,
                    handle.peer,
                    Some(&handle.id),
                    "permission_denied",
                    status,
                ))
                .await;
                return Err(Closed);
            }
            let room = reserve::<F>(ctx, handle, tx, type_url).await?;
            if let Some(response) = build::<F>(ctx, handle, type_url, Scope::All, Why::Answer) {
                hand_over::<F>(ctx, room, response);
            }
        }
        Action::Nack(type_url, error) => {
            ctx.metrics.record_reject(type_url);
            // A proxy NACKs every push until its config changes, and each detail may be
            // large: the log gets a few clipped lines per connection and window.
            if let Some(suppressed) = nack_log.allow() {
                warn!(
                    connection = %clip(&handle.id, NODE_ID_LOG_MAX),
                    r#type = type_url.short(),
                    error = %clip(&error, ERROR_DETAIL_LOG_MAX),
                    suppressed,
                    "proxy rejected config (NACK)"
                );
            }
        }
        Action::Stale(type_url) => {
            ctx.metrics
                .expired_nonce
                .get_or_create(&crate::metrics::type_label(type_url.short()))
                .inc();
            debug!(connection = %handle.id, r#type = type_url.short(), "ignoring request with stale nonce");
        }
        Action::Ack(type_url) => debug!(connection = %handle.id, r#type = type_url.short(), "ACK"),
        Action::Unsubscribed(type_url) => {
            if let (TypeUrl::Secret, Some(sds)) = (type_url, &ctx.sds) {
                sds.forget(&handle.id);
            }
            debug!(connection = %handle.id, r#type = type_url.short(), "unsubscribed")
        }
        Action::Health(error) => {
            // Answered with nothing, as Istio does.
            if let Some(hooks) = &ctx.workloads {
                hooks.health(&handle.id, error.as_deref());
            }
        }
        Action::UnknownType(_) => {
            let caller = DebugCaller {
                identity: handle.proxy.verified_identity.as_deref(),
                secure: handle.proxy.verified_identity.is_some(),
            };
            if let Err(status) =
                Box::pin(answer_other::<F>(ctx, caller, &handle.id, tx, &request)).await
            {
                let _ = tx.send(Outbound::Close(status)).await;
                return Err(Closed);
            }
        }
    }
    Ok(())
}

/// Sends one push to one connection: every watched type the request touches, in
/// CDS, EDS, LDS, RDS order. Each type first waits for room in the peer's queue, and
/// only then takes a push slot (`--pushThrottle`) to generate it: a slot bounds the
/// pushes generating at once and is never held while waiting for a peer, so a peer that
/// reads slowly delays only itself, and nothing is generated before its peer can take
/// it (the memory of responses waiting for the transport stays bounded by the queue).
async fn push<F: FlavourIo>(
    ctx: &XdsContext,
    handle: &ConnectionHandle,
    tx: &Tx<F>,
    pending: Pending,
) -> Result<(), Closed> {
    let request: &PushRequest = &pending.request;
    let push_scope = PushScope::new(request);
    // SDS may have to ask the API server (a SubjectAccessReview): done before taking a
    // push slot, so a slow API server holds back no other connection.
    if push_scope.touch(handle.class, TypeUrl::Secret) != Touch::Nothing
        || push_scope.touch(handle.class, TypeUrl::ExtensionConfig) != Touch::Nothing
    {
        prepare_secrets(ctx, handle).await;
    }
    let watched = handle.watched();
    let mcp = handle.watched_mcp();
    let watched = TypeUrl::ALL
        .into_iter()
        .zip(watched.iter())
        .filter(|(_, w)| w.names.is_some())
        .map(|(t, _)| t)
        .chain(mcp.iter().map(|t| TypeUrl::Mcp(*t)));
    let why = if request.forced {
        Why::ForcedPush
    } else {
        Why::Push
    };
    // Istio's queue time: from the push being taken to its first slot.
    let mut queued = Some(Instant::now());
    for type_url in watched {
        let scope = match (push_scope.touch(handle.class, type_url), type_url) {
            (Touch::Nothing, _) => continue,
            // Only EDS goes out partially; other types are sent whole (their
            // untouched resources come from the cache).
            (Touch::Services(_), TypeUrl::Endpoint) => match &pending.eds_names {
                Some(names) => Scope::Names(names.as_ref()),
                None => Scope::Hostnames(push_scope.hosts()),
            },
            _ => Scope::All,
        };
        let room = reserve::<F>(ctx, handle, tx, type_url).await?;
        let slot = ctx.push_slots.acquire().await.map_err(|_| Closed)?;
        if let Some(queued) = queued.take() {
            ctx.metrics
                .queue_time
                .observe(queued.elapsed().as_secs_f64());
        }
        let built = build::<F>(ctx, handle, type_url, scope, why);
        drop(slot);
        if let Some(response) = built {
            hand_over::<F>(ctx, room, response);
        }
    }
    ctx.metrics
        .convergence
        .observe(request.start.elapsed().as_secs_f64());
    Ok(())
}

/// Lets SDS ask the API server what it needs to authorize the connection's requested
/// Secrets, before they are generated (generation itself does not wait).
async fn prepare_secrets(ctx: &XdsContext, handle: &ConnectionHandle) {
    let Some(sds) = &ctx.sds else {
        return;
    };
    let snapshot = ctx.snapshot.load_full();
    // WasmPlugins' image pull Secrets (ECDS).
    if let Some(names) = handle.watched()[TypeUrl::ExtensionConfig.index()]
        .names
        .clone()
    {
        let secrets = crate::generate::wasm::pull::referenced(&snapshot, &handle.proxy, &names);
        sds.prepare_pull_secrets(&handle.id, &handle.proxy, &secrets)
            .await;
    }
    let Some(names) = handle.watched()[TypeUrl::Secret.index()].names.clone() else {
        return;
    };
    sds.prepare(&handle.id, &snapshot, &handle.proxy, &names)
        .await;
}

/// One generated response, waiting to be handed to the peer.
struct Built<R> {
    type_url: TypeUrl,
    response: R,
    started: Instant,
}

/// Generates one type; `why` decides whether an unchanged config is sent.
fn build<F: FlavourIo>(
    ctx: &XdsContext,
    handle: &ConnectionHandle,
    type_url: TypeUrl,
    scope: Scope<'_>,
    why: Why,
) -> Option<Built<F::Resp>> {
    let started = Instant::now();
    let snapshot = ctx.snapshot.load_full();
    // What the proxy watches, as the stream task itself last published it: the
    // state's lock is not held while generating, only while the response is formed.
    let watched = handle.watched();
    let resources = if let TypeUrl::Mcp(t) = type_url {
        // The same for every client, whatever names it asks for (istiod's
        // APIGenerator).
        let output = crate::generate::mcp::generate(t, &snapshot, &ctx.mcp.export);
        ctx.mcp.record(t, &output);
        ResourceList::Shared(output.resources.clone())
    } else {
        let watch = &watched[type_url.index()];
        let names = watch.names.as_ref()?;
        let subscription = Subscription {
            wildcard: watch.wildcard,
            names,
            interned: Some(names),
        };
        match (&ctx.sds, type_url) {
            (Some(sds), TypeUrl::Secret) => sds
                .generate(&handle.id, &snapshot, &handle.proxy, names)
                .into(),
            (sds, TypeUrl::ExtensionConfig) => crate::generate::wasm::ecds_for_connection(
                &snapshot,
                &handle.proxy,
                subscription,
                sds.as_deref()
                    .map(|s| s as &dyn crate::generate::wasm::pull::PullSecretReader),
                &handle.id,
            )
            .into(),
            _ => generate(
                type_url,
                &snapshot,
                &handle.proxy,
                subscription,
                scope,
                &ctx.options,
            ),
        }
    };
    if resources.is_empty() && type_url.silent_when_empty() {
        return None;
    }
    let partial = !matches!(scope, Scope::All);
    let mut response = F::respond(
        &mut handle.state.lock().expect("state poisoned"),
        type_url,
        snapshot.version(),
        resources,
        partial,
        why,
    );
    if let Reply::Send(response) = &mut response {
        F::stamp(response, &ctx.control_plane);
    }
    match response {
        Reply::Send(response) => Some(Built {
            type_url,
            response,
            started,
        }),
        Reply::Unchanged => {
            ctx.metrics.record_unchanged(type_url);
            None
        }
        Reply::Nothing => None,
    }
}

/// Room for one response in the peer's queue. A peer that makes none within the send
/// timeout has its connection closed: it cannot be told, and keeping it would pin old
/// config in its queue.
async fn reserve<'a, F: FlavourIo>(
    ctx: &XdsContext,
    handle: &ConnectionHandle,
    tx: &'a Tx<F>,
    type_url: TypeUrl,
) -> Result<outbox::Permit<'a, Outbound<F::Resp>>, Closed> {
    let reserved = match tx.try_reserve() {
        Ok(permit) => Ok(permit),
        Err(outbox::TryReserveError::Closed) => Err(()),
        Err(outbox::TryReserveError::Full) => match ctx.send_timeout {
            None => tx.reserve().await.map_err(|_| ()),
            Some(limit) => match tokio::time::timeout(limit, tx.reserve()).await {
                Ok(reserved) => reserved.map_err(|_| ()),
                Err(_) => {
                    ctx.metrics.send_timeouts.inc();
                    ctx.metrics.record_send_error(type_url);
                    warn!(
                        connection = %clip(&handle.id, NODE_ID_LOG_MAX),
                        r#type = type_url.short(),
                        timeout = ?limit,
                        "proxy is not reading its xDS stream: closing its connection (--xdsSendTimeout)"
                    );
                    if let Some(transport) = &handle.transport {
                        transport.close();
                    }
                    return Err(Closed);
                }
            },
        },
    };
    reserved.map_err(|()| {
        ctx.metrics.record_send_error(type_url);
        Closed
    })
}

/// Hands one response to the peer's stream, in the room reserved for it.
fn hand_over<F: FlavourIo>(
    ctx: &XdsContext,
    room: outbox::Permit<'_, Outbound<F::Resp>>,
    built: Built<F::Resp>,
) {
    let Built {
        type_url,
        response,
        started,
    } = built;
    let size = response.encoded_len();
    room.send(Outbound::Message(Box::new(response)));
    ctx.metrics
        .record_push(type_url, size, started.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future a function returns, without calling it.
    fn future_size<A, B, C, D, E, G, Fut>(_: fn(A, B, C, D, E, G) -> Fut) -> usize {
        std::mem::size_of::<Fut>()
    }

    #[test]
    fn an_idle_stream_costs_little_task_memory() {
        // A stream task lives as long as its proxy is connected. What it does now and
        // then (authenticate, answer, push, refuse) is boxed while it runs and its
        // requests arrive boxed, so an idle stream's task is what the loop itself
        // holds: 8.4 KB per connection before, then 2,032 bytes while admission was
        // part of the same future (its largest state set the size of every state).
        for (flavour, size) in [
            ("sotw", future_size(run_stream::<Sotw>)),
            ("delta", future_size(run_stream::<Delta>)),
        ] {
            assert!(size <= 1400, "{flavour}: {size} bytes");
        }
    }
}

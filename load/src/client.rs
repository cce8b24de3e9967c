//! The IO shell of a simulated proxy: opens its ADS stream (over its own HTTP/2
//! connection or a shared one), feeds every response to its [`ProxyState`], sends what
//! that returns, and reports to the [`Recorder`]. Reconnects with backoff when the
//! stream fails (a server that is not ready yet refuses streams with `UNAVAILABLE`).
//! A stream refused with `RESOURCE_EXHAUSTED` (the server's new-stream rate limit) is
//! retried as Envoy retries its xDS stream: jittered exponential backoff from 500 ms
//! up to 30 s, reset once a stream is accepted; the report counts the refusals. As
//! Envoy's, the retry is a new stream on the same HTTP/2 connection (no new TCP or TLS
//! handshake).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{BufMut as _, Bytes, BytesMut};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use meshfed::ads::frames::{Arrived, PREFIX_LEN};
use prost::Message;
use tokio::sync::{mpsc, watch};
use tonic::transport::{Channel, Endpoint};

use super::lite::{DeltaResponseLite, SotwResponseLite};
use super::plan::Plan;
use super::proxy::{Outgoing, ProxyState, SotwOut, Step};
use super::record::Recorder;
use super::registry::namespace_name;
use super::scenario::{Flavour, Mode};
use super::tls::{ClientTls, SERVICE_ACCOUNT, spiffe_id};
use meshfed::model::proxy::json_to_struct;

/// Everything a simulated proxy needs.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// Its number in the run.
    pub index: usize,
    /// The run's expectations.
    pub plan: Arc<Plan>,
    /// SotW or Delta (or the scenario's `mixed`: the proxy's own by its index).
    pub flavour: Flavour,
    /// Where its stream goes.
    pub connection: Connection,
    /// The receive window of its own connection ([`receive_window`]).
    pub window: u32,
    /// The server's cluster id (node metadata `CLUSTER_ID`).
    pub cluster_id: String,
    /// Where it reports.
    pub recorder: Arc<Recorder>,
    /// Bumped when the driver wants incomplete proxies to say what they miss.
    pub report: watch::Receiver<u64>,
    /// The reconnect storm's phase: odd = every proxy drops its stream and its
    /// connection now, even = every proxy reconnects now.
    pub storm: watch::Receiver<u64>,
    /// Connect over TLS with a client certificate for the proxy's identity (own
    /// connections; shared ones are made by the driver).
    pub tls: Option<Arc<ClientTls>>,
    /// The receiving slot of its connection ([`crate::gate`]).
    pub gate: Arc<crate::gate::ConnectionGate>,
}

/// How a proxy reaches the server.
#[derive(Clone, Debug)]
pub enum Connection {
    /// Its own HTTP/2 connection to one of these addresses (replicas of one control
    /// plane): the proxy starts on `addresses[index % n]` and moves to the next one
    /// each time its stream fails, as a proxy behind a Service lands on another
    /// replica when its own goes away.
    Own(std::sync::Arc<[SocketAddr]>),
    /// A connection shared with other proxies (HTTP/2 multiplexing): proxy `i` uses
    /// connection `i % k` of these.
    Shared(Arc<SharedChannels>),
}

/// The connections shared by the proxies (`connections`), replaced whole by a
/// reconnect storm.
#[derive(Debug)]
pub struct SharedChannels(std::sync::RwLock<Vec<Channel>>);

impl SharedChannels {
    /// These connections.
    pub fn new(channels: Vec<Channel>) -> SharedChannels {
        SharedChannels(std::sync::RwLock::new(channels))
    }

    /// The connection of proxy `index`.
    pub fn get(&self, index: usize) -> Channel {
        let channels = self.0.read().expect("shared channels");
        channels[index % channels.len()].clone()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.read().expect("shared channels").len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replaces them (the old ones close once their last stream is gone).
    pub fn replace(&self, channels: Vec<Channel>) {
        *self.0.write().expect("shared channels") = channels;
    }
}

/// How a stream that did not fail ended.
#[derive(Debug, PartialEq)]
enum Ended {
    /// The server ended it.
    ByServer,
    /// The proxy dropped it for the reconnect storm.
    Storm,
}

/// The endpoint every connection uses, with flow-control windows of `window` bytes
/// (see [`receive_window`]).
pub fn endpoint(addr: SocketAddr, window: u32) -> anyhow::Result<Endpoint> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .initial_stream_window_size(window)
        .initial_connection_window_size(window))
}

/// All connections' receive windows together: what the server may have sent that the
/// proxies have not read yet. 16 MiB windows on 2,000 shared connections let 20,000
/// proxies that read slower than the server writes (two cores for both) queue 9 GiB
/// in the tool two minutes into the ramp.
pub const RECEIVE_BUDGET: u64 = 1 << 30;

/// The HTTP/2 receive window (per stream and per connection) of each of
/// `connections` connections: 16 MiB (a full config arrives without waiting on
/// window updates, as with Envoy's 256 MiB) as long as all fit in
/// [`RECEIVE_BUDGET`], else their share of it, at least 256 KiB.
pub fn receive_window(connections: usize) -> u32 {
    let share = RECEIVE_BUDGET / connections.max(1) as u64;
    share.clamp(256 << 10, 16 << 20) as u32
}

/// The proxy's node: id `sidecar~<ip>~load-<i>.<ns>~<ns>.svc.cluster.local` and
/// Istio's metadata (`GENERATOR=grpc` for proxyless clients; `SERVICE_ACCOUNT` when
/// it has one, over TLS).
pub fn node(
    index: usize,
    mode: Mode,
    namespaces: usize,
    cluster_id: &str,
    service_account: Option<&str>,
) -> Node {
    let ns = namespace_name(index % namespaces);
    let n = index as u32 + 1;
    let ip = format!("10.{}.{}.{}", (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff);
    let mut metadata = serde_json::json!({
        "NAMESPACE": ns,
        "CLUSTER_ID": cluster_id,
        "ISTIO_VERSION": "1.24.0",
    });
    if mode == Mode::Grpc {
        metadata["GENERATOR"] = "grpc".into();
    }
    if let Some(sa) = service_account {
        metadata["SERVICE_ACCOUNT"] = sa.into();
    }
    Node {
        id: format!("sidecar~{ip}~load-{index}.{ns}~{ns}.svc.cluster.local"),
        cluster: format!("load-{index}.{ns}"),
        metadata: Some(json_to_struct(&metadata)),
        user_agent_name: "meshfed-load".into(),
        ..Default::default()
    }
}

/// Whether this stream's proxy counts as a watcher of changes now; undone when the
/// stream ends (also when the task is aborted).
struct Watching<'a> {
    recorder: &'a Recorder,
    namespace: usize,
    services: Vec<usize>,
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.recorder.live_converged.fetch_sub(1, Ordering::SeqCst);
        self.recorder.namespace_watchers[self.namespace].fetch_sub(1, Ordering::SeqCst);
        for s in &self.services {
            self.recorder.service_watchers[*s].fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Counts the stream as connected while it lives.
struct Connected<'a>(&'a Recorder);

impl Drop for Connected<'_> {
    fn drop(&mut self) {
        self.0.connected.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The identity (SPIFFE URI) of the proxy with this index over TLS.
pub fn identity(tls: &ClientTls, index: usize, namespaces: usize) -> String {
    spiffe_id(
        tls.trust_domain(),
        &namespace_name(index % namespaces),
        SERVICE_ACCOUNT,
    )
}

/// Envoy's retry of a refused xDS stream: exponential from 500 ms, at most 30 s, the
/// wait drawn uniformly below the bound (`JitteredExponentialBackOffStrategy`);
/// `attempt` counts the refusals in a row from 1. The draw is a hash of the proxy
/// and the attempt, so runs repeat.
pub fn refused_backoff(index: usize, attempt: u32) -> Duration {
    const BASE_MS: u64 = 500;
    const MAX_MS: u64 = 30_000;
    let bound = BASE_MS
        .saturating_mul(1u64 << (attempt.saturating_sub(1)).min(16))
        .min(MAX_MS);
    // splitmix64 of (index, attempt).
    let mut z = (index as u64) << 32 ^ u64::from(attempt);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    Duration::from_millis(z % bound)
}

/// Whether a stream attempt was refused by the server's new-stream rate limit.
fn refused(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<tonic::Status>()
            .is_some_and(|s| s.code() == tonic::Code::ResourceExhausted)
    })
}

/// Runs a simulated proxy until its task is aborted.
pub async fn run_proxy(mut config: ProxyConfig) {
    let started = Instant::now();
    let service_account = config.tls.is_some().then_some(SERVICE_ACCOUNT);
    let mut node = node(
        config.index,
        config.plan.mode,
        config.plan.namespaces,
        &config.cluster_id,
        service_account,
    );
    if let Some(group) = crate::envoyfilters::group_of(&config.plan.envoy_filters, config.index)
        && let Some(metadata) = &mut node.metadata
    {
        let labels = serde_json::json!({"LABELS": { crate::envoyfilters::GROUP_LABEL: group }});
        metadata.fields.extend(json_to_struct(&labels).fields);
    }
    let mut state = ProxyState::new(config.plan.clone(), config.flavour, config.index);
    let mut converged_once = false;
    let mut attempt = Attempt::default();
    let mut refusals = 0u32;
    loop {
        attempt.accepted = false;
        let result = match state.flavour() {
            Flavour::Sotw | Flavour::Mixed => {
                stream::<Sotw>(
                    &mut config,
                    &node,
                    &mut state,
                    started,
                    &mut converged_once,
                    &mut attempt,
                )
                .await
            }
            Flavour::Delta => {
                stream::<Delta>(
                    &mut config,
                    &node,
                    &mut state,
                    started,
                    &mut converged_once,
                    &mut attempt,
                )
                .await
            }
        };
        if attempt.accepted {
            refusals = 0;
        }
        if matches!(result, Ok(Ended::Storm)) {
            // Dropped with every other proxy: the connection goes too, and the proxy
            // reconnects, without backoff, when the driver says so.
            attempt.own = None;
            attempt.failures = 0;
            refusals = 0;
            let _ = config.storm.wait_for(|phase| phase % 2 == 0).await;
            continue;
        }
        if let Err(err) = &result
            && refused(err)
        {
            // Not a failure of the stream: the server asked the proxy to come back
            // later, and it does as Envoy would.
            refusals += 1;
            config.recorder.refused.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(refused_backoff(config.index, refusals)).await;
            continue;
        }
        attempt.own = None;
        let err = match result {
            Ok(_) => "stream ended by the server".to_string(),
            Err(err) => format!("{err:#}"),
        };
        let lower = err.to_ascii_lowercase();
        if lower.contains("reset") {
            config
                .recorder
                .connection_resets
                .fetch_add(1, Ordering::Relaxed);
        } else if lower.contains("refused") {
            config
                .recorder
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
        }
        config
            .recorder
            .stream_failures
            .fetch_add(1, Ordering::Relaxed);
        config.recorder.error(err);
        attempt.failures += 1;
        let failures = attempt.failures;
        // 100 ms, doubling up to 2 s, spread by proxy so reconnects do not stampede.
        let backoff = Duration::from_millis(100u64 << failures.min(5)).min(Duration::from_secs(2));
        let jitter = Duration::from_millis((config.index as u64 * 7919) % 100);
        tokio::time::sleep(backoff + jitter).await;
    }
}

/// The two ADS flavours, as the client sees them.
trait Flow {
    type Req: Message + Send + 'static;
    type Resp: Message + Default + Send + 'static;
    const PATH: &'static str;
    const RESPONSE: &'static str;
    fn request(outgoing: Outgoing) -> Option<Self::Req>;
    /// The request as the chunks of one gRPC message.
    fn framed(request: &Self::Req) -> (Bytes, Option<Bytes>) {
        (grpc_frame(request), None)
    }
    fn set_node(request: &mut Self::Req, node: Node);
    fn handle(state: &mut ProxyState, response: Self::Resp) -> Step;
}

struct Sotw;

impl Flow for Sotw {
    type Req = SotwOut;
    type Resp = SotwResponseLite;
    const PATH: &'static str =
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
    const RESPONSE: &'static str = "DiscoveryResponse";

    fn request(outgoing: Outgoing) -> Option<SotwOut> {
        match outgoing {
            Outgoing::Sotw(r) => Some(r),
            Outgoing::Delta(_) => None,
        }
    }

    /// The subscription's names follow the rest of the request as they were encoded
    /// once for every request of the subscription: a sidecar's EDS ACK repeats ~50 KB
    /// of them, and copying them into each request was most of what the tool spent on
    /// an endpoint change.
    fn framed(request: &SotwOut) -> (Bytes, Option<Bytes>) {
        let names = request.names.encoded_bytes();
        let head = grpc_head(&request.request, names.len());
        (head, (!names.is_empty()).then_some(names))
    }

    fn set_node(request: &mut SotwOut, node: Node) {
        request.request.node = Some(node);
    }

    fn handle(state: &mut ProxyState, response: SotwResponseLite) -> Step {
        state.on_sotw(response)
    }
}

struct Delta;

impl Flow for Delta {
    type Req = DeltaDiscoveryRequest;
    type Resp = DeltaResponseLite;
    const PATH: &'static str =
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
    const RESPONSE: &'static str = "DeltaDiscoveryResponse";

    fn request(outgoing: Outgoing) -> Option<DeltaDiscoveryRequest> {
        match outgoing {
            Outgoing::Delta(r) => Some(r),
            Outgoing::Sotw(_) => None,
        }
    }

    fn set_node(request: &mut DeltaDiscoveryRequest, node: Node) {
        request.node = Some(node);
    }

    fn handle(state: &mut ProxyState, response: DeltaResponseLite) -> Step {
        state.on_delta(response)
    }
}

/// One attempt of a proxy at a stream.
#[derive(Default)]
struct Attempt {
    /// Failed streams so far (which replica it goes to).
    failures: u32,
    /// The proxy's own connection, kept across refused streams.
    own: Option<Channel>,
    /// The server sent a response on this stream (it was not refused).
    accepted: bool,
}

/// One stream, from connect to failure.
async fn stream<F: Flow>(
    config: &mut ProxyConfig,
    node: &Node,
    state: &mut ProxyState,
    started: Instant,
    converged_once: &mut bool,
    attempt: &mut Attempt,
) -> anyhow::Result<Ended> {
    let recorder = config.recorder.clone();
    let channel = match &config.connection {
        Connection::Own(_) if attempt.own.is_some() => attempt.own.clone().expect("checked"),
        Connection::Own(addresses) => {
            let addr = addresses[(config.index + attempt.failures as usize) % addresses.len()];
            let channel = match &config.tls {
                None => {
                    meshfed::testing::plain_connect(endpoint(addr, config.window)?, addr).await?
                }
                Some(tls) => {
                    let id = identity(tls, config.index, config.plan.namespaces);
                    tls.connect(endpoint(addr, config.window)?, addr, &id)
                        .await?
                }
            };
            attempt.own = Some(channel.clone());
            channel
        }
        Connection::Shared(channels) => channels.get(config.index),
    };
    // Unbounded, as Envoy's send buffer is: a proxy never stops reading responses
    // because the server is slow to read its requests. A server that reads no
    // requests while it pushes, and a client that reads no responses while its
    // request queue is full, would wait on each other forever.
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    let mut first = true;
    let send = |outgoing: Outgoing, first: &mut bool| -> anyhow::Result<()> {
        let Some(mut request) = F::request(outgoing) else {
            return Ok(());
        };
        if std::mem::take(first) {
            F::set_node(&mut request, node.clone());
        }
        let (head, rest) = F::framed(&request);
        for chunk in std::iter::once(head).chain(rest) {
            tx.send(chunk)
                .map_err(|_| anyhow::anyhow!("request stream closed"))?;
        }
        Ok(())
    };
    for outgoing in state.start() {
        send(outgoing, &mut first)?;
    }
    let mut inbound = open_stream(channel, F::PATH, rx, config.gate.clone(), None).await?;
    recorder.connected.fetch_add(1, Ordering::SeqCst);
    let _connected = Connected(&recorder);
    let mut watching: Option<Watching<'_>> = None;
    let mut report_open = true;
    let mut storm_open = true;
    // Made once, not per response: each would register with its channel (one for
    // every proxy) when polled and unregister when dropped.
    let mut storm_phase = config.storm.clone();
    let storm = async move { storm_phase.wait_for(|phase| phase % 2 == 1).await.is_ok() };
    tokio::pin!(storm);
    let mut report = next_change(config.report.clone());
    loop {
        let response = tokio::select! {
            message = inbound.message() => match message? {
                Some(bytes) => bytes,
                None => return Ok(Ended::ByServer),
            },
            dropped = &mut storm, if storm_open => {
                if dropped {
                    return Ok(Ended::Storm);
                }
                // No storm will come (the driver is gone).
                storm_open = false;
                continue;
            }
            (changed, receiver) = &mut report, if report_open => {
                report = next_change(receiver);
                report_open = changed;
                // Seen by this proxy, as the stream after a reconnect must know.
                config.report.mark_unchanged();
                if report_open
                    && watching.is_none()
                    && let Some(gap) = state.gap(!*converged_once)
                {
                    recorder.missing(format!("proxy {}: {gap}", config.index));
                }
                continue;
            }
        };
        // A refusal comes as the stream's status, after its headers: the stream was
        // accepted once the server has sent a response.
        attempt.accepted = true;
        let size = response.len();
        let response = match F::Resp::decode(response) {
            Ok(response) => response,
            Err(err) => anyhow::bail!("a response that is not a {}: {err}", F::RESPONSE),
        };
        let step = F::handle(state, response);
        if let Some((type_url, resources)) = step.received {
            recorder.received(type_url, resources, size);
            recorder.proxy_received(config.index);
        }
        if let Some(reason) = &step.rejected {
            recorder.nacks.fetch_add(1, Ordering::Relaxed);
            recorder.error(format!("proxy {} NACKed: {reason}", config.index));
        }
        for outgoing in step.requests {
            send(outgoing, &mut first)?;
        }
        let acked = Instant::now();
        for change in step.observed {
            recorder.observe(change, acked);
        }
        // Checked until the proxy watches: the first time, the config must also match
        // the registry the run started with (after a reconnect, the churn has moved
        // the registry on).
        if watching.is_none() && state.is_complete(!*converged_once) {
            if !*converged_once {
                *converged_once = true;
                recorder.proxy_converged(acked.duration_since(started), acked);
                for (type_url, name) in state.unserved() {
                    recorder.unserved(type_url, &name);
                }
            }
            recorder.live_converged.fetch_add(1, Ordering::SeqCst);
            recorder.namespace_watchers[state.namespace()].fetch_add(1, Ordering::SeqCst);
            for s in state.watched() {
                recorder.service_watchers[*s].fetch_add(1, Ordering::SeqCst);
            }
            watching = Some(Watching {
                recorder: &recorder,
                namespace: state.namespace(),
                services: state.watched().to_vec(),
            });
        }
    }
}

/// The next change of `receiver` (`false`: its sender is gone), handing it back.
fn next_change(
    mut receiver: watch::Receiver<u64>,
) -> Pin<Box<dyn Future<Output = (bool, watch::Receiver<u64>)> + Send>> {
    Box::pin(async move { (receiver.changed().await.is_ok(), receiver) })
}

/// A gRPC message frame: uncompressed flag, big-endian length, the message.
pub(crate) fn grpc_frame(message: &impl Message) -> Bytes {
    grpc_head(message, 0)
}

/// The start of a gRPC message frame whose message is `message` followed by `rest`
/// more bytes: the prefix counts them, the caller sends them.
fn grpc_head(message: &impl Message, rest: usize) -> Bytes {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len + rest).expect("an ADS request is far below 4 GiB"));
    message.encode_raw(&mut buf);
    buf.freeze()
}

/// The request body of a stream: the frames the proxy sends, as it sends them.
struct RequestBody(mpsc::UnboundedReceiver<Bytes>);

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|frame| frame.map(|b| Ok(http_body::Frame::data(b))))
    }
}

/// Opens an ADS stream on `channel`: `path` with the requests `rx` gives (and a
/// `clusterid` header, as ztunnel sends, when given).
pub(crate) async fn open_stream(
    mut channel: Channel,
    path: &'static str,
    rx: mpsc::UnboundedReceiver<Bytes>,
    gate: Arc<crate::gate::ConnectionGate>,
    cluster_id: Option<&str>,
) -> anyhow::Result<Inbound> {
    use tonic::codegen::{Service as _, http};
    std::future::poll_fn(|cx| channel.poll_ready(cx)).await?;
    let mut request = http::Request::builder()
        .method(http::Method::POST)
        .uri(path)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers");
    if let Some(id) = cluster_id {
        request = request.header("clusterid", id);
    }
    let request = request.body(tonic::body::Body::new(RequestBody(rx)))?;
    let response = channel.call(request).await?;
    if let Some(status) = tonic::Status::from_header_map(response.headers())
        && status.code() != tonic::Code::Ok
    {
        // A trailers-only response: the stream was refused.
        return Err(status.into());
    }
    if response.status() != http::StatusCode::OK {
        anyhow::bail!("the server answered HTTP {}", response.status());
    }
    Ok(Inbound {
        body: response.into_body(),
        buf: Arrived::default(),
        ended: false,
        gate,
        receiving: None,
    })
}

/// The responses of a stream, read frame by frame. Between messages nothing is kept
/// but the start of the next one: a receive buffer that kept the capacity of the
/// largest response (a sidecar's ~1 MB CDS or RDS) per stream was most of the tool's
/// memory per proxy. A message being received holds its connection's receiving slot
/// ([`crate::gate`]).
pub(crate) struct Inbound {
    body: tonic::body::Body,
    buf: Arrived,
    ended: bool,
    gate: Arc<crate::gate::ConnectionGate>,
    /// Held while a message is partly received.
    receiving: Option<crate::gate::Receiving>,
}

impl Inbound {
    /// The next message; `None` once the stream ended with status OK. Cancel-safe.
    pub(crate) async fn message(&mut self) -> anyhow::Result<Option<Bytes>> {
        use http_body::Body as _;
        loop {
            if let Some(message) = self.take()? {
                if self.buf.is_empty() {
                    self.receiving = None;
                }
                return Ok(Some(message));
            }
            if self.ended {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                anyhow::bail!("the stream ended within a message");
            }
            if !self.buf.is_empty() && self.receiving.is_none() {
                // Read no further into a message until the connection may receive.
                self.receiving = Some(self.gate.begin().await);
            }
            let frame = std::future::poll_fn(|cx| Pin::new(&mut self.body).poll_frame(cx)).await;
            match frame {
                None => self.ended = true,
                Some(Err(status)) => return Err(status.into()),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.buf.push(data),
                    Err(frame) => {
                        if let Some(trailers) = frame.trailers_ref()
                            && let Some(status) = tonic::Status::from_header_map(trailers)
                            && status.code() != tonic::Code::Ok
                        {
                            return Err(status.into());
                        }
                    }
                },
            }
        }
    }

    /// A whole message from what arrived, if one is there. What arrived grows with the
    /// frames, not to the announced length: 20,000 streams each 1 KiB into a 1 MiB
    /// response would otherwise hold 20 GiB.
    fn take(&mut self) -> anyhow::Result<Option<Bytes>> {
        let Some(prefix) = self.buf.prefix() else {
            return Ok(None);
        };
        if prefix[0] != 0 {
            anyhow::bail!("a compressed message (the tool asks for none)");
        }
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if self.buf.len() < PREFIX_LEN + len {
            return Ok(None);
        }
        self.buf.take(PREFIX_LEN);
        Ok(Some(self.buf.take(len)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tables::NameSet;

    #[test]
    fn a_sotw_request_in_two_chunks_is_the_request_framed_whole() {
        let names = [
            "outbound|80||a.ns.svc.cluster.local",
            "outbound|80||b.ns.svc.cluster.local",
        ];
        let request = SotwOut {
            request: envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest {
                type_url: "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
                    .into(),
                version_info: "v1".into(),
                response_nonce: "v1/7".into(),
                ..Default::default()
            },
            names: Arc::new(NameSet::new(names.iter().map(|n| Arc::from(*n)).collect())),
        };
        let (head, rest) = Sotw::framed(&request);
        let rest = rest.expect("names follow");
        assert_eq!([&head[..], &rest[..]].concat(), grpc_frame(&request));
        // The names are the subscription's own bytes, not a copy.
        assert_eq!(rest.as_ptr(), request.names.encoded().as_ptr());
        let decoded = envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest::decode(
            &[&head[5..], &rest[..]].concat()[..],
        )
        .unwrap();
        assert_eq!(decoded.resource_names, names);
    }
}

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
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::codegen::http::uri::PathAndQuery;
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
    /// SotW or Delta.
    pub flavour: Flavour,
    /// Where its stream goes.
    pub connection: Connection,
    /// The server's cluster id (node metadata `CLUSTER_ID`).
    pub cluster_id: String,
    /// Where it reports.
    pub recorder: Arc<Recorder>,
    /// Bumped when the driver wants incomplete proxies to say what they miss.
    pub report: watch::Receiver<u64>,
    /// Connect over TLS with a client certificate for the proxy's identity (own
    /// connections; shared ones are made by the driver).
    pub tls: Option<Arc<ClientTls>>,
}

/// How a proxy reaches the server.
#[derive(Clone, Debug)]
pub enum Connection {
    /// Its own HTTP/2 connection to one of these addresses (replicas of one control
    /// plane): the proxy starts on `addresses[index % n]` and moves to the next one
    /// each time its stream fails, as a proxy behind a Service lands on another
    /// replica when its own goes away.
    Own(std::sync::Arc<[SocketAddr]>),
    /// A connection shared with other proxies (HTTP/2 multiplexing).
    Shared(Channel),
}

/// The endpoint every connection uses: flow-control windows large enough that a
/// full config arrives without waiting on window updates, as Envoy's (256 MiB) are.
pub fn endpoint(addr: SocketAddr) -> anyhow::Result<Endpoint> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .initial_stream_window_size(16 << 20)
        .initial_connection_window_size(16 << 20))
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
    let node = node(
        config.index,
        config.plan.mode,
        config.plan.namespaces,
        &config.cluster_id,
        service_account,
    );
    let mut state = ProxyState::new(config.plan.clone(), config.flavour, config.index);
    let mut converged_once = false;
    let mut attempt = Attempt::default();
    let mut refusals = 0u32;
    loop {
        attempt.accepted = false;
        let result = match config.flavour {
            Flavour::Sotw => {
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
            Ok(()) => "stream ended by the server".to_string(),
            Err(err) => format!("{err:#}"),
        };
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
    fn request(outgoing: Outgoing) -> Option<Self::Req>;
    fn set_node(request: &mut Self::Req, node: Node);
    fn handle(state: &mut ProxyState, response: Self::Resp) -> Step;
}

struct Sotw;

impl Flow for Sotw {
    type Req = SotwOut;
    type Resp = SotwResponseLite;
    const PATH: &'static str =
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

    fn request(outgoing: Outgoing) -> Option<SotwOut> {
        match outgoing {
            Outgoing::Sotw(r) => Some(r),
            Outgoing::Delta(_) => None,
        }
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
) -> anyhow::Result<()> {
    let recorder = config.recorder.clone();
    let channel = match &config.connection {
        Connection::Own(_) if attempt.own.is_some() => attempt.own.clone().expect("checked"),
        Connection::Own(addresses) => {
            let addr = addresses[(config.index + attempt.failures as usize) % addresses.len()];
            let channel = match &config.tls {
                None => endpoint(addr)?.connect().await?,
                Some(tls) => {
                    let id = identity(tls, config.index, config.plan.namespaces);
                    tls.connect(endpoint(addr)?, addr, &id).await?
                }
            };
            attempt.own = Some(channel.clone());
            channel
        }
        Connection::Shared(channel) => channel.clone(),
    };
    // Unbounded, as Envoy's send buffer is: a proxy never stops reading responses
    // because the server is slow to read its requests. A server that reads no
    // requests while it pushes, and a client that reads no responses while its
    // request queue is full, would wait on each other forever.
    let (tx, rx) = mpsc::unbounded_channel::<F::Req>();
    let mut first = true;
    let send = |outgoing: Outgoing, first: &mut bool| {
        let mut request = F::request(outgoing)?;
        if std::mem::take(first) {
            F::set_node(&mut request, node.clone());
        }
        Some(request)
    };
    for outgoing in state.start() {
        if let Some(request) = send(outgoing, &mut first) {
            tx.send(request)
                .map_err(|_| anyhow::anyhow!("request stream closed"))?;
        }
    }
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    grpc.ready().await?;
    let codec = tonic_prost::ProstCodec::<F::Req, F::Resp>::default();
    let mut inbound = grpc
        .streaming(
            tonic::Request::new(UnboundedReceiverStream::new(rx)),
            PathAndQuery::from_static(F::PATH),
            codec,
        )
        .await?
        .into_inner();
    recorder.connected.fetch_add(1, Ordering::SeqCst);
    let _connected = Connected(&recorder);
    let mut watching: Option<Watching<'_>> = None;
    let mut report_open = true;
    loop {
        let response = tokio::select! {
            message = inbound.message() => match message? {
                Some(response) => response,
                None => return Ok(()),
            },
            changed = config.report.changed(), if report_open => {
                report_open = changed.is_ok();
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
        let size = response.encoded_len();
        let step = F::handle(state, response);
        if let Some((type_url, resources)) = step.received {
            recorder.received(type_url, resources, size);
        }
        if let Some(reason) = &step.rejected {
            recorder.nacks.fetch_add(1, Ordering::Relaxed);
            recorder.error(format!("proxy {} NACKed: {reason}", config.index));
        }
        for outgoing in step.requests {
            if let Some(request) = send(outgoing, &mut first) {
                tx.send(request)
                    .map_err(|_| anyhow::anyhow!("request stream closed"))?;
            }
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

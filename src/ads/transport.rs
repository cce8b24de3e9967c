//! The xDS port below gRPC: which TCP connections are taken, how long a connection may
//! stay without a request, and how a connection is cut when its peer stops reading.
//!
//! Nothing a peer does here may cost more than its own connection:
//! - accept errors (the process is out of file descriptors, say) back off instead of
//!   spinning on a listener that stays readable;
//! - `--maxConnections` refuses connections beyond a cap (accepted and closed at once,
//!   so the backlog drains);
//! - a connection that opens no gRPC stream within `--handshakeTimeout` is closed;
//! - each connection has a budget of request bytes held in unfinished messages, shared
//!   by its streams ([`ConnControl::hold`]);
//! - a stream task that cannot hand a response to a peer that does not read closes the
//!   whole connection ([`ConnControl::close`]); the HTTP/2 layer does not poll a
//!   stream's body while the peer's window is shut, so this is the only way to end it.
//!
//! Each accepted socket is a [`GuardedStream`]: it carries its [`ConnControl`] into every
//! request's extensions ([`XdsConnectInfo`]) and fails its reads and writes once the
//! connection is closed from above or its handshake deadline passes.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use futures::task::AtomicWaker;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::time::Sleep;
use tonic::transport::server::Connected;
use tracing::{debug, warn};

use super::coalesce::Gathered;
use super::h2scan::FrameScan;
use super::limit::LogLimiter;
use super::segments::SegmentMemo;

/// Limits of the xDS port (flags of `meshfed discovery`).
#[derive(Clone, Debug)]
pub struct XdsLimits {
    /// How long a stream may wait to hand one response to its peer before the
    /// connection is closed (`--xdsSendTimeout`, Istio's `PILOT_XDS_SEND_TIMEOUT`).
    /// `None`: wait for ever.
    pub send_timeout: Option<Duration>,
    /// Most TCP connections held at once (`--maxConnections`); 0: no cap.
    pub max_connections: usize,
    /// How long a connection may stay without opening a gRPC stream
    /// (`--handshakeTimeout`). `None`: for ever.
    pub handshake_timeout: Option<Duration>,
    /// HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS` per connection (`--maxConcurrentStreams`).
    pub max_concurrent_streams: u32,
    /// Bytes of unfinished request messages one connection may hold, over all of its
    /// streams (`--maxConnectionRequestBytes`). At least one whole request message.
    pub connection_request_bytes: usize,
    /// After this long a connection is told GOAWAY and, 10 s later, closed, so clients
    /// reconnect and spread over replicas (`--keepaliveMaxServerConnectionAge`, Istio's
    /// flag; `None`: for ever, Istio's default; its Helm chart sets 30m).
    pub max_connection_age: Option<Duration>,
}

impl Default for XdsLimits {
    fn default() -> Self {
        XdsLimits {
            send_timeout: Some(Duration::from_secs(30)),
            max_connections: 0,
            handshake_timeout: Some(Duration::from_secs(10)),
            max_concurrent_streams: 100,
            connection_request_bytes: 16 * 1024 * 1024,
            max_connection_age: None,
        }
    }
}

/// Metrics of the xDS port's connections.
#[derive(Debug, Default, Clone)]
pub struct TransportMetrics {
    /// `meshfed_xds_tcp_connections`: TCP connections held.
    pub open: Gauge,
    /// `meshfed_xds_connections_refused`: connections closed at accept (cap reached).
    pub refused: Counter,
    /// `meshfed_xds_accept_errors`: failed accepts (out of descriptors and the like).
    pub accept_errors: Counter,
    /// `meshfed_xds_handshake_timeouts`: connections closed for opening no stream.
    pub handshake_timeouts: Counter,
}

impl TransportMetrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &mut Registry) -> Self {
        let m = TransportMetrics::default();
        registry.register(
            "meshfed_xds_tcp_connections",
            "TCP connections held on the xDS port",
            m.open.clone(),
        );
        registry.register(
            "meshfed_xds_connections_refused",
            "Connections to the xDS port closed at accept because --maxConnections was reached",
            m.refused.clone(),
        );
        registry.register(
            "meshfed_xds_accept_errors",
            "Failed accepts on the xDS port (e.g. out of file descriptors)",
            m.accept_errors.clone(),
        );
        registry.register(
            "meshfed_xds_handshake_timeouts",
            "Connections to the xDS port closed for opening no gRPC stream within --handshakeTimeout",
            m.handshake_timeouts.clone(),
        );
        m
    }
}

/// Shared state of one TCP connection, seen by the socket and by its streams.
#[derive(Debug)]
pub struct ConnControl {
    closed: AtomicBool,
    waker: AtomicWaker,
    started: AtomicBool,
    held: AtomicUsize,
    budget: usize,
    /// Bytes of response chunks the connection's streams handed to HTTP/2 that it
    /// still holds: each chunk is counted when handed over ([`ConnControl::track`])
    /// and uncounted when HTTP/2 drops it, once the socket took all of it (or the
    /// stream was reset).
    in_flight: AtomicUsize,
    /// True while some response body waits in [`ConnControl::poll_send_room`]: a
    /// dropped chunk takes the lock only then.
    waiting: AtomicBool,
    /// Response bodies waiting for `in_flight` to fall below [`SEND_BUDGET`].
    send_waiters: Mutex<Vec<Waker>>,
    /// The listener's framed segments, shared by all its connections.
    segments: Option<Arc<SegmentMemo>>,
}

/// How many response bytes a connection's streams may have handed to HTTP/2 that
/// the socket has not taken yet. HTTP/2 takes a body's chunks as long as the peer's
/// flow-control window allows (up to ~400 KB per stream), whether or not the socket
/// is writable, so without this a connection whose peer reads slowly holds that much
/// per stream, and 20,000 of them over a gigabyte. The count is exact: a copied chunk
/// is counted until HTTP/2 frees it. Spliced resource bodies (the snapshot's bytes)
/// are not counted: they cost no memory of their own. A stream none of whose chunks HTTP/2 holds may
/// always go on, so a connection holds at most this plus one framing step per stream.
pub const SEND_BUDGET: usize = 256 * 1024;

/// A response chunk handed to HTTP/2: uncounts itself when HTTP/2 frees it.
struct SentChunk {
    bytes: Bytes,
    control: Arc<ConnControl>,
    stream: Arc<AtomicUsize>,
}

impl AsRef<[u8]> for SentChunk {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for SentChunk {
    fn drop(&mut self) {
        let n = self.bytes.len();
        let stream_left = self.stream.fetch_sub(n, Ordering::AcqRel) - n;
        self.control.sent(n, stream_left == 0);
    }
}

impl ConnControl {
    /// A connection that may hold `budget` bytes of unfinished requests.
    pub fn new(budget: usize) -> Self {
        ConnControl {
            closed: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            started: AtomicBool::new(false),
            held: AtomicUsize::new(0),
            budget,
            in_flight: AtomicUsize::new(0),
            waiting: AtomicBool::new(false),
            send_waiters: Mutex::new(Vec::new()),
            segments: None,
        }
    }

    /// The same, whose responses splice the framed segments of `segments`.
    pub fn with_segments(budget: usize, segments: Arc<SegmentMemo>) -> Self {
        ConnControl {
            segments: Some(segments),
            ..ConnControl::new(budget)
        }
    }

    /// Where this connection's responses find framed segments.
    pub fn segments(&self) -> Option<Arc<SegmentMemo>> {
        self.segments.clone()
    }

    /// Response bytes handed to HTTP/2 that it has not freed yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Ready when a response body of this connection may hand over its next chunk:
    /// HTTP/2 holds fewer than [`SEND_BUDGET`] of the connection's bytes, or none of
    /// this stream's (`stream`, the count its chunks were [tracked](Self::track)
    /// with: a stream whose peer does not read cannot stall the connection's other
    /// streams). Otherwise the task is woken when HTTP/2 freed enough, or the
    /// connection closes.
    pub fn poll_send_room(&self, stream: &AtomicUsize, cx: &mut Context<'_>) -> Poll<()> {
        let room = || {
            self.in_flight() < SEND_BUDGET
                || stream.load(Ordering::Acquire) == 0
                || self.is_closed()
        };
        if room() {
            return Poll::Ready(());
        }
        let mut waiters = self.send_waiters.lock().unwrap_or_else(|e| e.into_inner());
        self.waiting.store(true, Ordering::Release);
        // Checked again under the lock: a chunk freed in between would otherwise
        // be missed.
        if room() {
            return Poll::Ready(());
        }
        if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
            waiters.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// `chunk`, counted against the connection's send budget and in `stream` (its
    /// stream's count) until HTTP/2 frees it.
    pub fn track(self: &Arc<Self>, stream: &Arc<AtomicUsize>, chunk: Bytes) -> Bytes {
        self.in_flight.fetch_add(chunk.len(), Ordering::AcqRel);
        stream.fetch_add(chunk.len(), Ordering::AcqRel);
        Bytes::from_owner(SentChunk {
            bytes: chunk,
            control: Arc::clone(self),
            stream: Arc::clone(stream),
        })
    }

    /// HTTP/2 freed a chunk of `n` bytes; `stream_done` when it was the last its
    /// stream had handed over.
    fn sent(&self, n: usize, stream_done: bool) {
        let left = self.in_flight.fetch_sub(n, Ordering::AcqRel) - n;
        if (left < SEND_BUDGET / 2 || stream_done) && self.waiting.load(Ordering::Acquire) {
            self.wake_senders();
        }
    }

    fn wake_senders(&self) {
        let waiters = {
            let mut waiters = self.send_waiters.lock().unwrap_or_else(|e| e.into_inner());
            self.waiting.store(false, Ordering::Release);
            if waiters.is_empty() {
                return;
            }
            std::mem::take(&mut *waiters)
        };
        for waker in waiters {
            waker.wake();
        }
    }

    /// Closes the connection: its socket fails at the next read or write, which ends
    /// the HTTP/2 connection and every stream on it.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.waker.wake();
        self.wake_senders();
    }

    /// True once [`ConnControl::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Records that the peer opened a gRPC stream: the handshake deadline no longer
    /// applies.
    pub fn stream_started(&self) {
        self.started.store(true, Ordering::Release);
    }

    /// Takes `n` more bytes of the connection's request budget; false (nothing taken)
    /// when that would exceed it.
    pub fn hold(&self, n: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|total| *total <= self.budget)
            })
            .is_ok()
    }

    /// Gives back `n` bytes taken with [`ConnControl::hold`].
    pub fn release(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::AcqRel);
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// The budget.
    pub fn budget(&self) -> usize {
        self.budget
    }
}

/// What a request learns of its connection (a request extension).
#[derive(Clone, Debug)]
pub struct XdsConnectInfo {
    /// The peer's address.
    pub peer: Option<SocketAddr>,
    /// The connection's shared state.
    pub control: Arc<ConnControl>,
    /// The TLS peer on the secure port; `None` on the plaintext port.
    pub tls: Option<Arc<crate::authn::TlsPeer>>,
}

/// An accepted socket of the xDS port.
#[derive(Debug)]
pub struct GuardedStream {
    /// The socket, its writes gathered into fewer system calls (straight through under
    /// TLS, where the secure stream gathers them before they are encrypted).
    io: Gathered<TcpStream>,
    peer: Option<SocketAddr>,
    control: Arc<ConnControl>,
    handshake: Option<Pin<Box<Sleep>>>,
    /// The client's HTTP/2 frames, followed until it opens a stream (`None`: under
    /// TLS, where the secure stream follows the decrypted bytes, or once it did).
    /// Boxed: held only until then, it need not widen every connection's future.
    scan: Option<Box<FrameScan>>,
    shared: Arc<ListenerShared>,
}

/// What a listener's connections share with it: one reference per connection rather
/// than one per metric (every connection's future holds a [`GuardedStream`]).
#[derive(Debug)]
struct ListenerShared {
    metrics: TransportMetrics,
    /// Connections accepted and not yet dropped.
    live: AtomicUsize,
}

impl Drop for GuardedStream {
    fn drop(&mut self) {
        self.shared.live.fetch_sub(1, Ordering::AcqRel);
        self.shared.metrics.open.dec();
    }
}

impl Connected for GuardedStream {
    type ConnectInfo = XdsConnectInfo;

    fn connect_info(&self) -> XdsConnectInfo {
        XdsConnectInfo {
            peer: self.peer,
            control: self.control.clone(),
            tls: None,
        }
    }
}

impl GuardedStream {
    /// The connection's shared controls.
    pub fn control(&self) -> &Arc<ConnControl> {
        &self.control
    }

    /// Leaves following the HTTP/2 frames to the layer above (TLS: the bytes read
    /// here are encrypted).
    pub fn frames_read_above(&mut self) {
        self.scan = None;
    }

    /// Leaves gathering writes to the layer above (TLS: the handshake flushes and
    /// waits for an answer, and records are better gathered before encryption).
    pub fn writes_gathered_above(&mut self) {
        self.io.write_through();
    }

    /// Fails once the connection was closed from above; registers the task to hear of
    /// it.
    fn check_closed(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        self.control.waker.register(cx.waker());
        if self.control.is_closed() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "connection closed by the server",
            ));
        }
        Ok(())
    }

    /// Fails once the handshake deadline passed with no stream opened; registers the
    /// task to hear of the deadline. Asked only when the peer has nothing waiting to
    /// be read: a server too busy to poll a connection before its deadline must not
    /// cut a client whose stream is already in the socket (a reconnect storm on a
    /// saturated server did, 14 of 2,000 connections).
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if let Some(deadline) = &mut self.handshake {
            if self.control.started.load(Ordering::Acquire) {
                self.handshake = None;
            } else if deadline.as_mut().poll(cx).is_ready() {
                self.handshake = None;
                self.shared.metrics.handshake_timeouts.inc();
                debug!(peer = ?self.peer, "closing an xDS connection that opened no stream in time");
                self.control.close();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no gRPC stream opened within the handshake timeout",
                ));
            }
        }
        Ok(())
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_closed(cx)?;
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending => {
                this.check_deadline(cx)?;
                Poll::Pending
            }
            Poll::Ready(Ok(())) => {
                FrameScan::follow(&mut this.scan, &buf.filled()[before..], || {
                    this.control.stream_started()
                });
                Poll::Ready(Ok(()))
            }
            ready => ready,
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check_closed(cx)?;
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check_closed(cx)?;
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_closed(cx)?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Errors of `accept` that concern one connection only (it went away before it was
/// taken); the next accept may succeed at once.
pub(crate) fn is_per_connection(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// The largest request message accepted (tonic's default limit): the request framing
/// (`frames`) refuses larger ones, and a connection's request-byte budget always
/// admits one whole message with its 5-byte gRPC header.
pub const MAX_REQUEST: usize = 4 * 1024 * 1024;

/// The pause after a failed accept (out of descriptors or memory: the pending
/// connection stays in the backlog and the listener stays readable, so retrying at once
/// would spin): 5 ms, doubling up to 1 s, back to 5 ms once an accept succeeds. Shared
/// by the xDS and the admin listeners.
#[derive(Clone, Copy, Debug)]
pub struct AcceptBackoff(Duration);

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(5);
    const LONGEST: Duration = Duration::from_secs(1);

    /// The pause the next failure waits.
    pub fn current(&self) -> Duration {
        self.0
    }

    /// An accept succeeded.
    pub fn reset(&mut self) {
        self.0 = Self::FIRST;
    }

    /// Waits out the current pause and doubles the next.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Self::LONGEST);
    }
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff(Self::FIRST)
    }
}

/// Accepts connections of the xDS port under [`XdsLimits`].
#[derive(Debug)]
pub struct Acceptor {
    listener: TcpListener,
    limits: XdsLimits,
    shared: Arc<ListenerShared>,
    backoff: AcceptBackoff,
    log: LogLimiter,
    segments: Arc<SegmentMemo>,
}

impl Acceptor {
    /// Accepts from `listener`.
    pub fn new(listener: TcpListener, mut limits: XdsLimits, metrics: TransportMetrics) -> Self {
        // One whole request message always fits.
        limits.connection_request_bytes = limits.connection_request_bytes.max(MAX_REQUEST + 5);
        Acceptor {
            listener,
            limits,
            shared: Arc::new(ListenerShared {
                metrics,
                live: AtomicUsize::new(0),
            }),
            backoff: AcceptBackoff::default(),
            log: LogLimiter::new(5, Duration::from_secs(10)),
            segments: Arc::default(),
        }
    }

    /// The next connection to serve. Errors are handled here (logged, counted, waited
    /// out), so this only ever returns a connection.
    pub async fn accept(&mut self) -> GuardedStream {
        loop {
            match self.listener.accept().await {
                Ok((io, peer)) => {
                    // As Go's net package (and so istiod) does for every TCP
                    // connection: small responses (a CreateCertificate answer, an
                    // endpoint change) are not held back by Nagle's algorithm waiting
                    // for the peer's delayed ACK.
                    if let Err(err) = io.set_nodelay(true) {
                        debug!(%peer, "TCP_NODELAY not set: {err}");
                    }
                    self.backoff.reset();
                    let live = self.shared.live.load(Ordering::Acquire);
                    if self.limits.max_connections > 0 && live >= self.limits.max_connections {
                        self.shared.metrics.refused.inc();
                        if let Some(suppressed) = self.log.allow() {
                            warn!(
                                %peer,
                                limit = self.limits.max_connections,
                                suppressed,
                                "refusing an xDS connection: --maxConnections reached"
                            );
                        }
                        drop(io);
                        continue;
                    }
                    self.shared.live.fetch_add(1, Ordering::AcqRel);
                    self.shared.metrics.open.inc();
                    let handshake = self
                        .limits
                        .handshake_timeout
                        .map(|t| Box::pin(tokio::time::sleep(t)));
                    return GuardedStream {
                        io: Gathered::server(io),
                        peer: Some(peer),
                        control: Arc::new(ConnControl::with_segments(
                            self.limits.connection_request_bytes,
                            self.segments.clone(),
                        )),
                        handshake,
                        scan: Some(Box::default()),
                        shared: self.shared.clone(),
                    };
                }
                Err(err) if is_per_connection(&err) => continue,
                Err(err) => {
                    self.shared.metrics.accept_errors.inc();
                    if let Some(suppressed) = self.log.allow() {
                        warn!(error = %err, retry_in = ?self.backoff.current(), suppressed, "accepting an xDS connection failed");
                    }
                    self.backoff.wait().await;
                }
            }
        }
    }

    /// The connections as a stream, for the gRPC server.
    pub fn into_stream(self) -> impl Stream<Item = io::Result<GuardedStream>> + Send {
        futures::stream::unfold(self, |mut acceptor| async move {
            let stream = acceptor.accept().await;
            Some((Ok(stream), acceptor))
        })
    }
}

/// The listen backlog where the system's maximum cannot be read: Go's (and so
/// istiod's) fallback, `syscall.SOMAXCONN`.
pub const FALLBACK_BACKLOG: u32 = 4096;

/// The system's maximum listen backlog (`/proc/sys/net/core/somaxconn` on Linux), the
/// backlog Go's `net.Listen` (and so istiod) listens with; [`FALLBACK_BACKLOG`] where
/// it cannot be read.
pub fn system_backlog() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(FALLBACK_BACKLOG)
}

/// Binds `addr` and listens with the system's maximum backlog ([`system_backlog`]),
/// so that a reconnect storm (every proxy at once after a rollout) waits in the
/// kernel's accept queue instead of being dropped; tokio's `TcpListener::bind`
/// listens with 1,024. Returns the listener and its backlog (for the log). Must be
/// called within a tokio runtime.
pub fn listen(addr: SocketAddr) -> io::Result<(TcpListener, u32)> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As std's (and tokio's) `bind` on Unix: a restarted server binds its port again
    // while connections of the previous one are in TIME_WAIT.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let backlog = system_backlog();
    Ok((socket.listen(backlog)?, backlog))
}

/// Raises the soft open-files limit to the hard one, so that the connection count is
/// limited by the operator's setting rather than by a shell default of 1,024. Returns
/// (before, after) for the log; `None` where the limit cannot be read.
pub fn raise_nofile_limit() -> Option<(u64, u64)> {
    let (soft, hard) = rlimit::Resource::NOFILE.get().ok()?;
    if soft >= hard {
        return Some((soft, soft));
    }
    match rlimit::Resource::NOFILE.set(hard, hard) {
        Ok(()) => Some((soft, hard)),
        Err(_) => Some((soft, soft)),
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::ads::h2scan::HEADERS;

    #[test]
    fn the_request_budget_is_shared_and_never_exceeded() {
        let c = ConnControl::new(100);
        assert!(c.hold(60));
        assert!(!c.hold(41), "over budget");
        assert_eq!(c.held(), 60, "a refused hold takes nothing");
        assert!(c.hold(40));
        c.release(100);
        assert!(c.hold(100));
    }

    async fn pair(limits: XdsLimits) -> (Acceptor, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (
            Acceptor::new(listener, limits, TransportMetrics::default()),
            addr,
        )
    }

    #[tokio::test]
    async fn accepted_connections_do_not_wait_for_nagle() {
        let (mut acceptor, addr) = pair(XdsLimits::default()).await;
        let _client = TcpStream::connect(addr).await.unwrap();
        let conn = acceptor.accept().await;
        assert!(
            conn.io.get_ref().nodelay().unwrap(),
            "TCP_NODELAY on accepted sockets"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_a_stream_is_closed_at_the_handshake_deadline() {
        let limits = XdsLimits {
            handshake_timeout: Some(Duration::from_secs(10)),
            ..XdsLimits::default()
        };
        let (mut acceptor, addr) = pair(limits).await;
        let _client = TcpStream::connect(addr).await.unwrap();
        let mut conn = acceptor.accept().await;
        let mut buf = [0u8; 8];
        let err = conn.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(acceptor.shared.metrics.handshake_timeouts.get(), 1);

        // Bytes that were waiting when a late poll comes after the deadline are read;
        // only a connection with nothing to read is cut.
        let mut client = TcpStream::connect(addr).await.unwrap();
        let mut conn = acceptor.accept().await;
        client.write_all(b"PRI").await.unwrap();
        tokio::time::advance(Duration::from_secs(11)).await;
        let n = conn.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"PRI");
        assert_eq!(acceptor.shared.metrics.handshake_timeouts.get(), 1);
        let err = conn.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(acceptor.shared.metrics.handshake_timeouts.get(), 2);

        // A connection whose stream started is not cut.
        let mut client = TcpStream::connect(addr).await.unwrap();
        let mut conn = acceptor.accept().await;
        conn.control.stream_started();
        client.write_all(b"hi").await.unwrap();
        tokio::time::advance(Duration::from_secs(60)).await;
        let n = conn.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"hi");
    }

    /// A client preface, then frames of `(type, payload)`.
    fn h2_bytes(frames: &[(u8, &[u8])]) -> Vec<u8> {
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        for (kind, payload) in frames {
            let len = payload.len();
            out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, *kind, 0]);
            out.extend_from_slice(&[0, 0, 0, u8::from(*kind == HEADERS)]);
            out.extend_from_slice(payload);
        }
        out
    }

    #[test]
    fn the_frame_scan_sees_the_first_headers_frame_however_the_bytes_are_cut() {
        // SETTINGS whose payload looks like a HEADERS frame header if misread, a
        // WINDOW_UPDATE, then HEADERS.
        let settings = [0, 0, 0, HEADERS, 0, 0, 0, 0, 1, 0, 4, 0, 1, 0, 0, 0, 0, 1];
        let bytes = h2_bytes(&[(0x4, &settings), (0x8, &[0, 0, 1, 0]), (HEADERS, b"hdrs")]);
        let headers_at = bytes.len() - 4 - 9;
        for step in [1, 2, 5, 9, 24, 100] {
            let mut scan = FrameScan::default();
            let mut seen = None;
            for (i, chunk) in bytes.chunks(step).enumerate() {
                if scan.feed(chunk) {
                    seen = Some(i * step);
                    break;
                }
            }
            let seen = seen.unwrap_or_else(|| panic!("step {step}: no HEADERS seen"));
            assert!(
                seen <= headers_at + 8 && seen + step > headers_at + 8,
                "step {step}: seen in the chunk at {seen}"
            );
        }
        let mut scan = FrameScan::default();
        assert!(!scan.feed(&h2_bytes(&[(0x4, &settings), (0x6, &[0; 8])])));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_sent_before_the_deadline_keeps_the_connection_while_its_task_waits() {
        let limits = XdsLimits {
            handshake_timeout: Some(Duration::from_secs(10)),
            ..XdsLimits::default()
        };
        let (mut acceptor, addr) = pair(limits).await;
        // The client opens a stream; nothing above the socket runs it (a saturated
        // server), so no gRPC call marks the stream started.
        let mut client = TcpStream::connect(addr).await.unwrap();
        let mut conn = acceptor.accept().await;
        let sent = h2_bytes(&[(0x4, &[]), (HEADERS, b"hdrs")]);
        client.write_all(&sent).await.unwrap();
        let mut got = vec![0u8; sent.len()];
        conn.read_exact(&mut got).await.unwrap();
        tokio::time::advance(Duration::from_secs(60)).await;
        client.write_all(b"more").await.unwrap();
        let mut buf = [0u8; 4];
        conn.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"more");
        assert_eq!(acceptor.shared.metrics.handshake_timeouts.get(), 0);

        // Settings and pings alone open no stream: cut at the deadline.
        let mut client = TcpStream::connect(addr).await.unwrap();
        let mut conn = acceptor.accept().await;
        let sent = h2_bytes(&[(0x4, &[]), (0x6, &[0; 8])]);
        client.write_all(&sent).await.unwrap();
        let mut got = vec![0u8; sent.len()];
        conn.read_exact(&mut got).await.unwrap();
        tokio::time::advance(Duration::from_secs(11)).await;
        let err = conn.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(acceptor.shared.metrics.handshake_timeouts.get(), 1);
    }

    #[tokio::test]
    async fn close_fails_a_pending_read() {
        let (mut acceptor, addr) = pair(XdsLimits::default()).await;
        let _client = TcpStream::connect(addr).await.unwrap();
        let mut conn = acceptor.accept().await;
        let control = conn.control.clone();
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            conn.read(&mut buf).await
        });
        tokio::task::yield_now().await;
        control.close();
        let err = reader.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
    }

    #[tokio::test]
    async fn connections_over_the_cap_are_closed_at_accept() {
        let limits = XdsLimits {
            max_connections: 1,
            ..XdsLimits::default()
        };
        let (mut acceptor, addr) = pair(limits).await;
        let _first_client = TcpStream::connect(addr).await.unwrap();
        let first = acceptor.accept().await;
        let mut refused = TcpStream::connect(addr).await.unwrap();
        let third = TcpStream::connect(addr).await.unwrap();
        // Accepting closes the refused one; the call only returns once a connection
        // is under the cap, which happens when the first goes away.
        let accept = tokio::spawn(async move {
            let conn = acceptor.accept().await;
            (acceptor, conn)
        });
        let mut buf = [0u8; 1];
        assert_eq!(refused.read(&mut buf).await.unwrap(), 0, "closed at accept");
        drop(first);
        drop(third);
        let mut fourth = TcpStream::connect(addr).await.unwrap();
        let (acceptor, _conn) = accept.await.unwrap();
        assert!(acceptor.shared.metrics.refused.get() >= 1);
        assert_eq!(acceptor.shared.live.load(Ordering::Acquire), 1);
        fourth.write_all(b"x").await.unwrap();
    }

    #[tokio::test]
    async fn listeners_take_the_system_backlog() {
        let backlog = system_backlog();
        assert!(backlog > 0);
        let (listener, got) = listen("127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(got, backlog);
        let addr = listener.local_addr().unwrap();
        // Nothing is accepted: every connect completes into the kernel's accept queue
        // (backlog + 1 entries). With tokio's default of 1,024 the 1,026th connect
        // would never complete; the bound only detects that failure.
        let n = (backlog as usize).min(2_000);
        let connects = futures::future::join_all((0..n).map(|_| TcpStream::connect(addr)));
        let clients = tokio::time::timeout(Duration::from_secs(30), connects)
            .await
            .expect("every connect completes into the accept queue");
        assert!(clients.iter().all(Result::is_ok));
        // The same helper binds IPv6 addresses (where the host has them).
        if let Ok((v6, _)) = listen("[::1]:0".parse().unwrap()) {
            assert!(v6.local_addr().unwrap().is_ipv6());
        }
    }

    #[test]
    fn the_nofile_limit_is_raised_to_the_hard_limit() {
        let (before, after) = raise_nofile_limit().expect("NOFILE readable");
        let (soft, hard) = rlimit::Resource::NOFILE.get().unwrap();
        assert!(after >= before);
        assert_eq!(soft, after);
        assert_eq!(soft, hard);
    }
}

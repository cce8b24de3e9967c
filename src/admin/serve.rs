//! Serving the admin ports (`--httpAddr`, `--monitoringAddr`) so that no client can
//! hold them, or the process's descriptors, for long:
//! - a connection must send its first request within the header-read timeout
//!   (`--adminReadHeaderTimeout`);
//! - a connection with no request in flight is closed after the idle timeout
//!   (`--adminIdleTimeout`);
//! - at most `--adminMaxConnections` connections are held per port. At the cap, a new
//!   connection takes the place of the connection that has been idle longest (no
//!   request in flight: a silent client, or a keep-alive one between requests); when
//!   every held connection has a request in flight, the new one is accepted and closed
//!   at once, so the backlog drains. A flood of silent connections therefore never
//!   keeps `/ready` or a scrape out.
//!
//! The cap is per port and separate from the xDS ports' `--maxConnections`, so the
//! admin ports cannot take the descriptors xDS needs: with the defaults both hold at
//! most 2,048 together, and [`AdminLimits::within_descriptors`] lowers the cap where
//! the open-files limit is small.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use bytes::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt;
use tracing::{debug, warn};

use crate::ads::limit::LogLimiter;
use crate::drain::Shutdown;

/// Limits of the admin ports (flags of `meshfed discovery`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdminLimits {
    /// How long a new connection may take to send its first request's headers
    /// (`--adminReadHeaderTimeout`). `None`: for ever.
    pub read_header_timeout: Option<Duration>,
    /// How long a connection with no request in flight is kept
    /// (`--adminIdleTimeout`). `None`: for ever.
    pub idle_timeout: Option<Duration>,
    /// Connections held per port at most (`--adminMaxConnections`); at least 1.
    pub max_connections: usize,
}

impl Default for AdminLimits {
    /// istiod's HTTP and monitoring servers (Go `http.Server`): `ReadTimeout` 30 s,
    /// which Go also applies to the headers when `ReadHeaderTimeout` is unset, and
    /// `IdleTimeout` 90 s. Go has no connection cap; 1,024 per port keeps both admin
    /// ports well below common descriptor limits.
    fn default() -> Self {
        AdminLimits {
            read_header_timeout: Some(Duration::from_secs(30)),
            idle_timeout: Some(Duration::from_secs(90)),
            max_connections: 1024,
        }
    }
}

impl AdminLimits {
    /// These limits with the cap lowered, where needed, so that the two admin ports
    /// together hold at most a quarter of `nofile` (the open-files limit) and the rest
    /// stays for xDS. Returns the limits and whether the cap was lowered.
    pub fn within_descriptors(self, nofile: u64) -> (AdminLimits, bool) {
        let share = usize::try_from(nofile / 8).unwrap_or(usize::MAX).max(1);
        if self.max_connections > share {
            (
                AdminLimits {
                    max_connections: share,
                    ..self
                },
                true,
            )
        } else {
            (self, false)
        }
    }
}

/// Which admin port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AdminPort {
    /// `--httpAddr` (`/ready`, debug).
    Http,
    /// `--monitoringAddr` (`/metrics`, `/version`, debug).
    Monitoring,
}

impl AdminPort {
    fn label(self) -> &'static str {
        match self {
            AdminPort::Http => "http",
            AdminPort::Monitoring => "monitoring",
        }
    }
}

/// Why the server closed an admin connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// At the cap with every held connection busy: closed at accept.
    Refused,
    /// At the cap: the longest-idle connection made room for a new one.
    Evicted,
    /// No request headers within the header-read timeout.
    HeaderTimeout,
    /// No request in flight for the idle timeout.
    IdleTimeout,
}

impl CloseReason {
    fn label(self) -> &'static str {
        match self {
            CloseReason::Refused => "refused",
            CloseReason::Evicted => "evicted",
            CloseReason::HeaderTimeout => "header_timeout",
            CloseReason::IdleTimeout => "idle_timeout",
        }
    }
}

type PortLabel = [(&'static str, &'static str); 1];
type CloseLabels = [(&'static str, &'static str); 2];

/// Metrics of the admin ports' connections.
#[derive(Clone, Debug, Default)]
pub struct AdminMetrics {
    /// `meshfed_admin_connections{port}`: connections held.
    open: Family<PortLabel, Gauge>,
    /// `meshfed_admin_connections_closed_total{port,reason}`: connections the server
    /// closed for a limit.
    closed: Family<CloseLabels, Counter>,
}

impl AdminMetrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &mut Registry) -> Self {
        let m = AdminMetrics::default();
        registry.register(
            "meshfed_admin_connections",
            "TCP connections held on the admin ports (--httpAddr, --monitoringAddr)",
            m.open.clone(),
        );
        registry.register(
            "meshfed_admin_connections_closed",
            "Admin connections closed by the server for a limit: refused or evicted at \
             --adminMaxConnections, --adminReadHeaderTimeout, --adminIdleTimeout",
            m.closed.clone(),
        );
        m
    }

    /// Connections held on `port` now.
    pub fn open(&self, port: AdminPort) -> i64 {
        self.open.get_or_create(&[("port", port.label())]).get()
    }

    /// Connections of `port` closed for `reason` so far.
    pub fn closed(&self, port: AdminPort, reason: CloseReason) -> u64 {
        self.closed
            .get_or_create(&[("port", port.label()), ("reason", reason.label())])
            .get()
    }

    fn close(&self, port: AdminPort, reason: CloseReason) {
        self.closed
            .get_or_create(&[("port", port.label()), ("reason", reason.label())])
            .inc();
    }
}

/// The connections of one port: how many are held and which are idle, oldest first.
struct Connections {
    max: usize,
    inner: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    live: usize,
    next: u64,
    /// Idle connections by the order in which they became idle.
    idle: BTreeMap<u64, Arc<Conn>>,
}

/// One admin connection's state, shared by its task and its requests.
#[derive(Default)]
struct Conn {
    state: Mutex<ConnState>,
    /// Set when the connection is evicted to make room for a new one.
    evicted: AtomicBool,
    /// Requests answered so far (0: still waiting for the first one).
    requests: AtomicU64,
    /// Wakes the connection's task when its state changes.
    changed: Notify,
}

#[derive(Default)]
struct ConnState {
    /// The connection ended (a response body may outlive it).
    closed: bool,
    in_flight: usize,
    /// The key in [`Held::idle`] while idle.
    idle_key: Option<u64>,
    /// When it last became idle (accepted, or its last response finished).
    idle_since: Option<Instant>,
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a new connection: `None` when it must be refused (at the cap and no idle
    /// connection to evict).
    fn admit(&self, port: AdminPort, metrics: &AdminMetrics) -> Option<Arc<Conn>> {
        let conn = Arc::new(Conn::default());
        let mut held = self.lock();
        if held.live >= self.max {
            let (_, oldest) = held.idle.pop_first()?;
            oldest.evicted.store(true, Ordering::Release);
            oldest.changed.notify_one();
            metrics.close(port, CloseReason::Evicted);
            // The evicted one gives back its place when its task ends.
        }
        held.live += 1;
        let key = held.next;
        held.next += 1;
        held.idle.insert(key, conn.clone());
        drop(held);
        let mut state = conn.lock_state();
        state.idle_key = Some(key);
        state.idle_since = Some(Instant::now());
        drop(state);
        Some(conn)
    }

    /// A connection ended.
    fn release(&self, conn: &Conn) {
        let key = {
            let mut state = conn.lock_state();
            state.closed = true;
            state.idle_key.take()
        };
        let mut held = self.lock();
        if let Some(key) = key {
            held.idle.remove(&key);
        }
        held.live -= 1;
    }
}

impl Conn {
    fn lock_state(&self) -> std::sync::MutexGuard<'_, ConnState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request arrived: the connection is busy until its response is done.
    fn request_started(self: &Arc<Self>, connections: &Arc<Connections>) -> RequestGuard {
        let key = {
            let mut state = self.lock_state();
            state.in_flight += 1;
            state.idle_key.take()
        };
        if let Some(key) = key {
            connections.lock().idle.remove(&key);
        }
        self.changed.notify_one();
        RequestGuard {
            conn: self.clone(),
            connections: connections.clone(),
        }
    }

    /// When the task must close the connection, and why; `None`: not while it
    /// stays as it is. Lock order: a connection's state before [`Held`].
    fn deadline(&self, limits: &AdminLimits) -> Option<(Instant, CloseReason)> {
        let state = self.lock_state();
        if state.in_flight > 0 {
            return None;
        }
        let since = state.idle_since?;
        if self.requests.load(Ordering::Acquire) == 0 {
            limits
                .read_header_timeout
                .map(|t| (since + t, CloseReason::HeaderTimeout))
        } else {
            limits
                .idle_timeout
                .map(|t| (since + t, CloseReason::IdleTimeout))
        }
    }
}

/// Held by a request's response body: the connection is busy until it is dropped.
struct RequestGuard {
    conn: Arc<Conn>,
    connections: Arc<Connections>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.conn.requests.fetch_add(1, Ordering::AcqRel);
        let mut state = self.conn.lock_state();
        state.in_flight -= 1;
        if state.in_flight == 0 && !state.closed {
            // Idle again: the newest candidate for eviction.
            state.idle_since = Some(Instant::now());
            let mut held = self.connections.lock();
            let key = held.next;
            held.next += 1;
            held.idle.insert(key, self.conn.clone());
            state.idle_key = Some(key);
        }
        drop(state);
        self.conn.changed.notify_one();
    }
}

/// A response body that keeps its connection busy until it is sent (or dropped).
struct TrackedBody {
    inner: Body,
    _guard: RequestGuard,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `router` on `listener` under `limits` until `shutdown`; then each
/// connection finishes its request in flight (HTTP/2: GOAWAY) and ends.
pub async fn serve_port(
    listener: TcpListener,
    router: Router,
    port: AdminPort,
    limits: AdminLimits,
    metrics: AdminMetrics,
    mut shutdown: Shutdown,
) {
    let connections = Arc::new(Connections {
        max: limits.max_connections.max(1),
        inner: Mutex::default(),
    });
    let mut tasks = JoinSet::new();
    let log = LogLimiter::new(5, Duration::from_secs(10));
    let mut backoff = crate::ads::transport::AcceptBackoff::default();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.wait() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        let (io, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) if crate::ads::transport::is_per_connection(&err) => continue,
            Err(err) => {
                if let Some(suppressed) = log.allow() {
                    warn!(port = port.label(), error = %err, retry_in = ?backoff.current(), suppressed, "accepting an admin connection failed");
                }
                backoff.wait().await;
                continue;
            }
        };
        backoff.reset();
        let Some(conn) = connections.admit(port, &metrics) else {
            metrics.close(port, CloseReason::Refused);
            if let Some(suppressed) = log.allow() {
                warn!(
                    port = port.label(),
                    %peer,
                    limit = connections.max,
                    suppressed,
                    "refusing an admin connection: --adminMaxConnections reached and every connection is busy"
                );
            }
            drop(io);
            continue;
        };
        tasks.spawn(serve_connection(
            io,
            peer,
            conn,
            ConnContext {
                router: router.clone(),
                connections: connections.clone(),
                port,
                limits,
                metrics: metrics.clone(),
                shutdown: shutdown.clone(),
            },
        ));
    }
    while tasks.join_next().await.is_some() {}
}

/// What a connection's task shares with the server.
struct ConnContext {
    router: Router,
    connections: Arc<Connections>,
    port: AdminPort,
    limits: AdminLimits,
    metrics: AdminMetrics,
    shutdown: Shutdown,
}

async fn serve_connection(
    io: tokio::net::TcpStream,
    peer: SocketAddr,
    conn: Arc<Conn>,
    ctx: ConnContext,
) {
    let open = ctx
        .metrics
        .open
        .get_or_create(&[("port", ctx.port.label())])
        .clone();
    open.inc();
    run_connection(io, peer, &conn, &ctx).await;
    ctx.connections.release(&conn);
    open.dec();
}

/// Serves one connection until it ends, its peer goes away or a limit closes it (the
/// socket is closed when this returns).
async fn run_connection(
    io: tokio::net::TcpStream,
    peer: SocketAddr,
    conn: &Arc<Conn>,
    ctx: &ConnContext,
) {
    let service = AdminService {
        router: ctx.router.clone(),
        conn: conn.clone(),
        connections: ctx.connections.clone(),
        peer,
    };
    let builder = Builder::new(TokioExecutor::new());
    let connection =
        builder.serve_connection_with_upgrades(TokioIo::new(io), TowerToHyperService::new(service));
    tokio::pin!(connection);
    let mut shutdown = ctx.shutdown.clone();
    let mut draining = false;
    let port = ctx.port.label();
    loop {
        if conn.evicted.load(Ordering::Acquire) {
            debug!(port, %peer, "closing an idle admin connection to make room for a new one");
            return;
        }
        let deadline = conn.deadline(&ctx.limits);
        let expiry = async {
            match deadline {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(err) = result {
                    debug!(port, %peer, "admin connection ended: {err}");
                }
                return;
            }
            () = conn.changed.notified() => {}
            () = expiry => {
                if let Some((_, reason)) = deadline {
                    ctx.metrics.close(ctx.port, reason);
                    debug!(port, %peer, reason = reason.label(), "closing an admin connection");
                }
                return;
            }
            () = shutdown.wait(), if !draining => {
                draining = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The router as one connection's service: each request carries the peer address
/// (for the loopback check of the debug endpoints) and keeps the connection busy
/// until its response is sent.
#[derive(Clone)]
struct AdminService {
    router: Router,
    conn: Arc<Conn>,
    connections: Arc<Connections>,
    peer: SocketAddr,
}

impl<B> tower::Service<Request<B>> for AdminService
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        request.extensions_mut().insert(ConnectInfo(self.peer));
        let guard = self.conn.request_started(&self.connections);
        let response = self.router.clone().oneshot(request.map(Body::new));
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|inner| {
                Body::new(TrackedBody {
                    inner,
                    _guard: guard,
                })
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    #[test]
    fn the_cap_leaves_three_quarters_of_the_descriptors_to_xds() {
        let limits = AdminLimits::default();
        assert_eq!(limits.within_descriptors(1_048_576), (limits, false));
        let (lowered, changed) = limits.within_descriptors(1024);
        assert!(changed);
        assert_eq!(lowered.max_connections, 128);
        assert_eq!(limits.within_descriptors(0).0.max_connections, 1);
    }

    /// Serves `router` on a port-0 listener; returns its address, metrics and the
    /// trigger that stops it.
    async fn start(
        router: Router,
        limits: AdminLimits,
    ) -> (SocketAddr, AdminMetrics, crate::drain::ShutdownTrigger) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = AdminMetrics::default();
        let (trigger, shutdown) = crate::drain::channel();
        tokio::spawn(serve_port(
            listener,
            router,
            AdminPort::Http,
            limits,
            metrics.clone(),
            shutdown,
        ));
        (addr, metrics, trigger)
    }

    fn ok_router() -> Router {
        Router::new().route("/", get(|| async { "ok" }))
    }

    /// Sends a keep-alive GET and reads its whole response.
    async fn get_ok(stream: &mut TcpStream) {
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 512];
        while !seen.ends_with(b"\r\n\r\nok") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before the response: {seen:?}");
            seen.extend_from_slice(&buf[..n]);
        }
    }

    /// Reads until the server closes the connection (EOF or reset).
    async fn closed_by_server(stream: &mut TcpStream) {
        let mut buf = [0u8; 64];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_closed_at_the_header_deadline_and_an_idle_one_later() {
        let limits = AdminLimits {
            read_header_timeout: Some(Duration::from_secs(10)),
            idle_timeout: Some(Duration::from_secs(90)),
            max_connections: 16,
        };
        let (addr, metrics, _stop) = start(ok_router(), limits).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let started = Instant::now();
        closed_by_server(&mut silent).await;
        assert!(started.elapsed() >= Duration::from_secs(10));
        assert_eq!(
            metrics.closed(AdminPort::Http, CloseReason::HeaderTimeout),
            1
        );

        // A keep-alive client is served, then closed once idle for the idle timeout,
        // not the header timeout.
        let mut client = TcpStream::connect(addr).await.unwrap();
        get_ok(&mut client).await;
        let idle = Instant::now();
        closed_by_server(&mut client).await;
        assert!(idle.elapsed() >= Duration::from_secs(90));
        assert_eq!(metrics.closed(AdminPort::Http, CloseReason::IdleTimeout), 1);
        assert_eq!(
            metrics.closed(AdminPort::Http, CloseReason::HeaderTimeout),
            1
        );
    }

    #[tokio::test]
    async fn at_the_cap_a_new_connection_replaces_the_longest_idle_one() {
        let limits = AdminLimits {
            max_connections: 2,
            ..AdminLimits::default()
        };
        let (addr, metrics, _stop) = start(ok_router(), limits).await;
        let mut first = TcpStream::connect(addr).await.unwrap();
        let _second = TcpStream::connect(addr).await.unwrap();
        // Accepted in order: the third is admitted after both, in the first's place.
        let mut third = TcpStream::connect(addr).await.unwrap();
        get_ok(&mut third).await;
        closed_by_server(&mut first).await;
        assert_eq!(metrics.closed(AdminPort::Http, CloseReason::Evicted), 1);
        // The third, idle again after its response, is now the newest idle one: the
        // next newcomer takes the second's place, and the third still answers.
        let mut fourth = TcpStream::connect(addr).await.unwrap();
        get_ok(&mut fourth).await;
        get_ok(&mut third).await;
        assert_eq!(metrics.closed(AdminPort::Http, CloseReason::Evicted), 2);
        assert_eq!(metrics.closed(AdminPort::Http, CloseReason::Refused), 0);
    }

    #[tokio::test]
    async fn at_the_cap_with_every_connection_busy_a_new_one_is_closed_at_accept() {
        let release = Arc::new(Notify::new());
        let entered = Arc::new(Notify::new());
        let router = {
            let (release, entered) = (release.clone(), entered.clone());
            Router::new().route(
                "/",
                get(move || {
                    let (release, entered) = (release.clone(), entered.clone());
                    async move {
                        entered.notify_one();
                        release.notified().await;
                        "ok"
                    }
                }),
            )
        };
        let limits = AdminLimits {
            max_connections: 1,
            ..AdminLimits::default()
        };
        let (addr, metrics, _stop) = start(router, limits).await;
        let mut busy = TcpStream::connect(addr).await.unwrap();
        busy.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        entered.notified().await;
        let mut refused = TcpStream::connect(addr).await.unwrap();
        closed_by_server(&mut refused).await;
        assert_eq!(metrics.closed(AdminPort::Http, CloseReason::Refused), 1);
        assert_eq!(metrics.open(AdminPort::Http), 1);
        release.notify_one();
        let mut buf = [0u8; 256];
        let n = busy.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    }
}

//! The ADS server: protocol state ([`connection`]), node parsing ([`node`]), shared-bytes
//! wire messages ([`wire`]) and the tonic shell ([`server`]) that joins them to streams.
//!
//! Every live stream is a [`ConnectionHandle`] in [`Connections`]. The push pipeline
//! hands requests to [`Connections`] ([`PushTargets`]): a full push goes to every
//! connection whose watched types it touches ([`crate::xds::deps`]), an incremental one
//! only to the watchers of a changed name ([`WatchIndex`]), with those names, and as a
//! full push to the proxies at an address whose endpoints it changed (their inbound
//! listeners and clusters follow the service ports they serve). A handle
//! merges requests that arrive while its stream is busy, so each connection has at
//! most one push in flight and never misses a change.

pub mod coalesce;
pub mod connection;
pub mod csds;
pub mod debug;
mod flavour;
pub mod frames;
pub mod h2scan;
pub mod intern;
pub mod limit;
pub mod mcp;
pub mod metrics;
pub mod outbox;
pub mod rate;
pub mod segments;
pub mod server;
pub mod transport;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use meshfed_registry::{ConfigKey, ConfigKind, PushRequest, TriggerReason};
use serde::Serialize;
use tokio::sync::Notify;

use connection::ConnectionState;

use crate::model::{Proxy, ProxyClass};
use crate::push::watch::{ConnId, WatchIndex, Watched};
use crate::push::{PUSHED_IDS, PushTargets, Queued};
pub use crate::xds::TypeUrl;
use crate::xds::deps::PushScope;
use crate::xds::mcp::McpType;

/// What the ADS server tells the WorkloadEntry controller
/// ([`crate::autoregistration`]) about the streams of the secure and plaintext ports.
pub trait WorkloadHooks: Send + Sync + std::fmt::Debug {
    /// A proxy connected on `connection` (after authentication); an error ends the
    /// stream with that status.
    fn connected<'a>(
        &'a self,
        connection: &'a str,
        proxy: &'a Proxy,
    ) -> futures::future::BoxFuture<'a, Result<(), tonic::Status>>;
    /// The stream of `connection` ended (called for every connection `connected`
    /// accepted).
    fn disconnected<'a>(&'a self, connection: &'a str) -> futures::future::BoxFuture<'a, ()>;
    /// A health report (an `istio.io/health` request) on `connection`: the probe's
    /// error, or `None` when healthy.
    fn health(&self, connection: &str, error: Option<&str>);
}

/// Which ADS flavour a stream speaks.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize)]
pub enum Flavour {
    /// `StreamAggregatedResources`.
    Sotw,
    /// `DeltaAggregatedResources`.
    Delta,
}

/// One connected proxy.
#[derive(Debug)]
pub struct ConnectionHandle {
    /// `<proxy id>-<counter>`, unique for the server's lifetime.
    pub id: String,
    /// The counter of `id`: the connection in the watch index.
    pub n: ConnId,
    /// The proxy.
    pub proxy: Proxy,
    /// Its generator family and shape.
    pub class: ProxyClass,
    /// Protocol flavour.
    pub flavour: Flavour,
    /// Peer address, when known.
    pub peer: Option<SocketAddr>,
    /// When the stream started.
    pub connected_at: SystemTime,
    /// The TCP connection under the stream (absent for streams not served through
    /// [`transport::Acceptor`]).
    pub transport: Option<Arc<transport::ConnControl>>,
    /// Protocol state; written only by the connection's own stream task, which never
    /// holds the lock while generating; read briefly by debug pages.
    pub state: Mutex<ConnectionState>,
    /// What the connection watches, published by its stream task after each request
    /// changed it: the push fan-out reads it without taking `state`.
    subscriptions: ArcSwap<Subscriptions>,
    /// The MCP types it watches (not in [`Subscriptions`]: few connections have
    /// any), published as `subscriptions` is.
    mcp: ArcSwap<Vec<McpType>>,
    pending: Mutex<Option<Pending>>,
    wake: Notify,
}

/// What a connection watches of each type, in [`TypeUrl::ALL`] order.
pub type Subscriptions = [Watched; TypeUrl::ALL.len()];

/// A push queued on a connection and not yet taken.
#[derive(Clone, Debug)]
pub struct Pending {
    /// What changed: one request shared by every connection it wakes (copied only
    /// when two pushes merge on a connection that has not taken the first).
    pub request: Arc<PushRequest>,
    /// For an incremental push found through the watch index: the EDS names of the
    /// changed services this connection watches (shared by the connections holding the
    /// same subscription). `None`: whatever the request touches.
    pub eds_names: Option<Arc<BTreeSet<String>>>,
}

impl Pending {
    fn merge(&mut self, other: Pending) {
        Arc::make_mut(&mut self.request).merge(Arc::unwrap_or_clone(other.request));
        self.eds_names = match (self.eds_names.take(), other.eds_names) {
            (Some(a), Some(b)) => {
                let mut union = (*a).clone();
                union.extend(b.iter().cloned());
                Some(Arc::new(union))
            }
            _ => None,
        };
    }
}

impl ConnectionHandle {
    /// Queues a push, merging it into one not yet taken.
    pub fn enqueue(&self, push: Pending) {
        let mut pending = self.pending.lock().expect("pending poisoned");
        match pending.as_mut() {
            Some(p) => p.merge(push),
            None => *pending = Some(push),
        }
        drop(pending);
        self.wake.notify_one();
    }

    /// What this connection watches of each type, as last published.
    pub fn watched(&self) -> Arc<Subscriptions> {
        self.subscriptions.load_full()
    }

    /// Publishes what `state` watches (the stream task, after a request), unless that
    /// is what `before` already says (the common ACK, which repeats its names): then
    /// `None`, and nothing is stored.
    fn publish(
        &self,
        state: &ConnectionState,
        before: &Subscriptions,
    ) -> Option<Arc<Subscriptions>> {
        let now = TypeUrl::ALL.map(|t| match state.watch(t) {
            Some(w) => Watched {
                names: Some(w.names.clone()),
                wildcard: w.wildcard,
            },
            None => Watched::default(),
        });
        if now.iter().zip(before).all(|(a, b)| a.same(b)) {
            return None;
        }
        let now = Arc::new(now);
        self.subscriptions.store(now.clone());
        Some(now)
    }

    /// The MCP types this connection watches, as last published.
    pub fn watched_mcp(&self) -> Arc<Vec<McpType>> {
        self.mcp.load_full()
    }

    /// Publishes the MCP types `state` watches; `Some(watching any)` when they
    /// changed.
    fn publish_mcp(&self, state: &ConnectionState) -> Option<bool> {
        let now: Vec<McpType> = state
            .watches
            .iter()
            .filter_map(|(t, _)| match t {
                TypeUrl::Mcp(m) => Some(*m),
                _ => None,
            })
            .collect();
        if *self.mcp.load_full() == now {
            return None;
        }
        let any = !now.is_empty();
        self.mcp.store(Arc::new(now));
        Some(any)
    }

    /// Takes the merged pending push, if any.
    pub fn take_pending(&self) -> Option<Pending> {
        self.pending.lock().expect("pending poisoned").take()
    }

    /// Resolves when a push was queued since the last call.
    pub async fn woken(&self) {
        self.wake.notified().await;
    }
}

/// All live connections.
#[derive(Debug, Default)]
pub struct Connections {
    by_id: RwLock<BTreeMap<String, Arc<ConnectionHandle>>>,
    /// By number, with a fast hasher: an endpoint push looks up every watcher here.
    by_n: RwLock<
        std::collections::HashMap<ConnId, Arc<ConnectionHandle>, foldhash::fast::RandomState>,
    >,
    /// How many registered connections are ztunnels (a push looks for them only when
    /// there are some).
    ztunnels: AtomicUsize,
    /// The connections watching an MCP type.
    mcp: RwLock<BTreeMap<ConnId, Arc<ConnectionHandle>>>,
    watches: WatchIndex,
    counter: AtomicU64,
}

impl Connections {
    /// Registers a new connection.
    pub fn register(
        &self,
        proxy: Proxy,
        flavour: Flavour,
        peer: Option<SocketAddr>,
        transport: Option<Arc<transport::ConnControl>>,
    ) -> Arc<ConnectionHandle> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        let handle = Arc::new(ConnectionHandle {
            id: format!("{}-{n}", proxy.id),
            n,
            class: proxy.class(),
            proxy,
            flavour,
            peer,
            connected_at: SystemTime::now(),
            transport,
            state: Mutex::default(),
            subscriptions: ArcSwap::from_pointee(Default::default()),
            mcp: ArcSwap::from_pointee(Vec::new()),
            pending: Mutex::default(),
            wake: Notify::new(),
        });
        self.by_id
            .write()
            .expect("connections poisoned")
            .insert(handle.id.clone(), handle.clone());
        self.by_n
            .write()
            .expect("connections poisoned")
            .insert(n, handle.clone());
        if handle.proxy.node_type == crate::model::NodeType::Ztunnel {
            self.ztunnels.fetch_add(1, Ordering::Relaxed);
        }
        handle
    }

    /// Removes a connection (and what it watched from the watch index).
    pub fn deregister(&self, handle: &ConnectionHandle) {
        let watched = handle.watched();
        for (t, before) in TypeUrl::ALL.into_iter().zip(watched.iter()) {
            self.watches
                .update(handle.n, t, before, &Watched::default());
        }
        self.by_id
            .write()
            .expect("connections poisoned")
            .remove(&handle.id);
        let removed = self
            .by_n
            .write()
            .expect("connections poisoned")
            .remove(&handle.n);
        if removed.is_some() && handle.proxy.node_type == crate::model::NodeType::Ztunnel {
            self.ztunnels.fetch_sub(1, Ordering::Relaxed);
        }
        self.mcp
            .write()
            .expect("connections poisoned")
            .remove(&handle.n);
    }

    /// Applies a request to a connection's protocol state (`apply`, under its lock)
    /// and records what it then watches: published on the handle for the fan-out, and
    /// in the watch index before any answer is generated, so a push that comes after
    /// the snapshot the answer reads finds the connection.
    pub fn apply_request<T>(
        &self,
        handle: &ConnectionHandle,
        apply: impl FnOnce(&mut ConnectionState) -> T,
    ) -> T {
        let before = handle.watched();
        let (result, after, mcp) = {
            let mut state = handle.state.lock().expect("state poisoned");
            let result = apply(&mut state);
            (
                result,
                handle.publish(&state, &before),
                handle.publish_mcp(&state),
            )
        };
        if let Some(any) = mcp {
            // The registered handle, looked up before the MCP map is locked (the
            // fan-out takes the two locks the other way round).
            let registered = any
                .then(|| {
                    self.by_n
                        .read()
                        .expect("connections poisoned")
                        .get(&handle.n)
                        .cloned()
                })
                .flatten();
            let mut watchers = self.mcp.write().expect("connections poisoned");
            match registered {
                Some(c) => {
                    watchers.insert(handle.n, c);
                }
                None => {
                    watchers.remove(&handle.n);
                }
            }
        }
        if let Some(after) = after {
            for (i, t) in TypeUrl::ALL.into_iter().enumerate() {
                self.watches.update(handle.n, t, &before[i], &after[i]);
            }
        }
        result
    }

    /// The watch index, for debug output.
    pub fn watch_index(&self) -> &WatchIndex {
        &self.watches
    }

    /// Every live connection, sorted by id.
    pub fn all(&self) -> Vec<Arc<ConnectionHandle>> {
        self.by_id
            .read()
            .expect("connections poisoned")
            .values()
            .cloned()
            .collect()
    }

    /// Number of live connections.
    pub fn len(&self) -> usize {
        self.by_id.read().expect("connections poisoned").len()
    }

    /// True when no proxy is connected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl PushTargets for Connections {
    fn enqueue(&self, scope: &PushScope<'_>, moved: &HashSet<IpAddr>) -> Queued {
        let request = Arc::new(scope.request().clone());
        let mut queued: Vec<&str> = Vec::new();
        let mut count = 0;
        if scope.is_incremental() {
            // Only EDS can change: wake the watchers of the changed services' names.
            let watchers = self
                .watches
                .watchers(TypeUrl::Endpoint, scope.hosts().iter().copied());
            let by_n = self.by_n.read().expect("connections poisoned");
            let mut woken: Vec<&Arc<ConnectionHandle>> = Vec::new();
            for (names, conns) in &watchers.by_set {
                for n in conns {
                    if let Some(c) = by_n.get(n) {
                        c.enqueue(Pending {
                            request: request.clone(),
                            eds_names: (!watchers.wildcard.contains(n)).then(|| names.clone()),
                        });
                        woken.push(c);
                    }
                }
            }
            // Wildcard watchers not already woken for a name: whatever the request
            // touches.
            let named: std::collections::HashSet<ConnId, foldhash::fast::RandomState> =
                if watchers.wildcard.is_empty() {
                    Default::default()
                } else {
                    woken.iter().map(|c| c.n).collect()
                };
            for n in watchers.wildcard.iter().filter(|n| !named.contains(n)) {
                if let Some(c) = by_n.get(n) {
                    c.enqueue(Pending {
                        request: request.clone(),
                        eds_names: None,
                    });
                    woken.push(c);
                }
            }
            // Proxies whose own endpoints changed: a full push of their own, so their
            // inbound listeners and clusters follow the ports they now serve.
            if !moved.is_empty() {
                for c in by_n.values() {
                    let Some(ip) = c.proxy.ip_addresses.iter().find(|ip| moved.contains(ip)) else {
                        continue;
                    };
                    let key = ConfigKey::new(
                        ConfigKind::Workload,
                        &ip.to_string(),
                        c.proxy.namespace.as_str(),
                    );
                    let mut own = PushRequest::full(TriggerReason::Proxy, [key]);
                    own.start = request.start;
                    c.enqueue(Pending {
                        request: Arc::new(own),
                        eds_names: None,
                    });
                    if !woken.iter().any(|w| w.n == c.n) {
                        woken.push(c);
                    }
                }
            }
            // Ambient clients (ztunnel): workloads are endpoints, every change may
            // concern them; Delta sends only what changed. The node type is checked
            // first: a push must not scan the woken list once per sidecar.
            let ztunnels = if self.ztunnels.load(Ordering::Relaxed) == 0 {
                None
            } else {
                Some(by_n.values())
            };
            for c in ztunnels.into_iter().flatten() {
                if c.proxy.node_type == crate::model::NodeType::Ztunnel
                    && c.watched()[TypeUrl::Address.index()].names.is_some()
                    && !woken.iter().any(|w| w.n == c.n)
                {
                    c.enqueue(Pending {
                        request: request.clone(),
                        eds_names: None,
                    });
                    woken.push(c);
                }
            }
            // MCP clients watching a type the endpoints feed (WorkloadEntries).
            let mcp = self.mcp.read().expect("connections poisoned");
            for c in mcp.values() {
                if !woken.iter().any(|w| w.n == c.n) && scope.touches_mcp(&c.watched_mcp()) {
                    c.enqueue(Pending {
                        request: request.clone(),
                        eds_names: None,
                    });
                    woken.push(c);
                }
            }
            count = woken.len();
            // Only the first ids (by id) are reported: selected, then sorted.
            if woken.len() > PUSHED_IDS {
                woken.select_nth_unstable_by(PUSHED_IDS, |a, b| a.id.cmp(&b.id));
                woken.truncate(PUSHED_IDS);
            }
            woken.sort_by(|a, b| a.id.cmp(&b.id));
            let ids = woken
                .iter()
                .take(PUSHED_IDS)
                .map(|c| c.id.clone())
                .collect();
            return Queued { count, ids };
        }
        let all = self.all();
        for c in &all {
            // MCP serves every namespace's config: a client is touched by the kinds it
            // watches, whoever the changed objects concern.
            let mcp_touched = scope.touches_mcp(&c.watched_mcp());
            // The ambient types hold the whole mesh: no namespace scoping.
            let ambient = c.proxy.node_type == crate::model::NodeType::Ztunnel;
            if !mcp_touched
                && !ambient
                && !scope.affects_proxy(c.class, c.proxy.namespace.as_str(), &c.proxy.labels)
            {
                continue;
            }
            let watched = c.watched();
            let touched = mcp_touched
                || TypeUrl::ALL.into_iter().zip(watched.iter()).any(|(t, w)| {
                    w.names.as_ref().is_some_and(|names| {
                        scope.touch(c.class, t) != crate::xds::deps::Touch::Nothing
                            && (t != TypeUrl::Secret
                                || crate::sds::Sds::wants(scope, &c.proxy, names))
                    })
                });
            if touched {
                c.enqueue(Pending {
                    request: request.clone(),
                    eds_names: None,
                });
                count += 1;
                if queued.len() < PUSHED_IDS {
                    queued.push(&c.id);
                }
            }
        }
        Queued {
            count,
            ids: queued.into_iter().map(str::to_string).collect(),
        }
    }
}

//! The ADS server: protocol state ([`connection`]), node parsing ([`node`]), shared-bytes
//! wire messages ([`wire`]) and the tonic shell ([`server`]) that joins them to streams.
//!
//! Every live stream is a [`ConnectionHandle`] in [`Connections`]. The push pipeline
//! hands requests to handles; a handle merges requests that arrive while its stream is
//! busy, so each connection has at most one push in flight and never misses a change.

pub mod connection;
pub mod frames;
pub mod intern;
pub mod metrics;
pub mod node;
pub mod server;
pub mod wire;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use meshfed_registry::PushRequest;
use serde::Serialize;
use tokio::sync::Notify;

pub use crate::resource::TypeUrl;
use connection::ConnectionState;
use node::Proxy;

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
    /// The proxy.
    pub proxy: Proxy,
    /// Protocol flavour.
    pub flavour: Flavour,
    /// Peer address, when known.
    pub peer: Option<SocketAddr>,
    /// When the stream started.
    pub connected_at: SystemTime,
    /// Protocol state; locked briefly by the stream task and by debug readers.
    pub state: Mutex<ConnectionState>,
    pending: Mutex<Option<PushRequest>>,
    wake: Notify,
}

impl ConnectionHandle {
    /// Queues a push, merging it into one not yet taken.
    pub fn enqueue(&self, request: PushRequest) {
        let mut pending = self.pending.lock().expect("pending poisoned");
        match pending.as_mut() {
            Some(p) => p.merge(request),
            None => *pending = Some(request),
        }
        drop(pending);
        self.wake.notify_one();
    }

    /// Takes the merged pending push, if any.
    pub fn take_pending(&self) -> Option<PushRequest> {
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
    counter: AtomicU64,
}

impl Connections {
    /// Registers a new connection.
    pub fn register(
        &self,
        proxy: Proxy,
        flavour: Flavour,
        peer: Option<SocketAddr>,
    ) -> Arc<ConnectionHandle> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        let handle = Arc::new(ConnectionHandle {
            id: format!("{}-{n}", proxy.id),
            proxy,
            flavour,
            peer,
            connected_at: SystemTime::now(),
            state: Mutex::default(),
            pending: Mutex::default(),
            wake: Notify::new(),
        });
        self.by_id
            .write()
            .expect("connections poisoned")
            .insert(handle.id.clone(), handle.clone());
        handle
    }

    /// Removes a connection.
    pub fn deregister(&self, id: &str) {
        self.by_id.write().expect("connections poisoned").remove(id);
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

    /// Queues `request` on every connection; returns them (sorted by id).
    pub fn enqueue_all(&self, request: &PushRequest) -> Vec<Arc<ConnectionHandle>> {
        let all = self.all();
        for c in &all {
            c.enqueue(request.clone());
        }
        all
    }
}

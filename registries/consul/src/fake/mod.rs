//! A fake Consul HTTP API for tests (feature `test-support`).
//!
//! A real HTTP/1.1 server on `127.0.0.1:<port 0>` answering the endpoints the
//! registry reads, in Consul's JSON shapes:
//! - `GET /v1/catalog/services`: `{"web": ["tag", ...]}`;
//! - `GET /v1/health/service/<name>` (`passing` supported): `[{"Node", "Service",
//!   "Checks"}]`, the node's `serfHealth` check plus one check per instance;
//! - `GET /v1/agent/self` (`Config.Datacenter`, `Config.NodeName`) and
//!   `GET /v1/catalog/datacenters`.
//!
//! Blocking queries work as in Consul: both list endpoints answer with
//! `X-Consul-Index`; a request with `index=N` is held until the index of what it reads
//! moves past N or its `wait` (default 5m, at most 10m, no jitter here) elapses. The
//! catalog's index moves when instances are registered or removed; a service's index
//! also moves when one of its checks (or its nodes' `serfHealth`) changes, as Consul's
//! per-service indexes do. `dc=` other than the server's datacenter gets Consul's
//! `500 No path to datacenter`. With a token required, a request without it, or with
//! another one, gets `403` (`Permission denied` / `ACL not found`); tokens are read
//! from `X-Consul-Token`, `Authorization: Bearer` or `?token=`.
//!
//! The test drives it directly: [`FakeConsul::register`] / [`FakeConsul::deregister`]
//! / [`FakeConsul::set_health`] change the catalog (one raft index for every write);
//! [`FakeConsul::set_index`] moves the index backwards (as a snapshot restore does:
//! held queries are answered at once); [`FakeConsul::fail_with`] makes every request
//! fail; [`FakeConsul::go_down`] closes the listener and every connection and
//! [`FakeConsul::come_back`] listens on the same port again, with the same state;
//! [`FakeConsul::requests`] tells what clients asked.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::net::TcpSocket;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

mod http;

/// A check status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckStatus {
    /// `passing`.
    Passing,
    /// `warning`.
    Warning,
    /// `critical`.
    Critical,
    /// `maintenance` (maintenance mode).
    Maintenance,
}

impl CheckStatus {
    /// Consul's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Passing => "passing",
            CheckStatus::Warning => "warning",
            CheckStatus::Critical => "critical",
            CheckStatus::Maintenance => "maintenance",
        }
    }
}

/// A service instance to register.
#[derive(Clone, Debug, PartialEq)]
pub struct Instance {
    /// Service name.
    pub service: String,
    /// Instance id (unique in this fake).
    pub id: String,
    /// Node name.
    pub node: String,
    /// Node address.
    pub node_address: String,
    /// The node's datacenter (the server's when `None`).
    pub datacenter: Option<String>,
    /// Service address (empty: the node's).
    pub address: String,
    /// Port.
    pub port: u16,
    /// Tags.
    pub tags: Vec<String>,
    /// Service meta.
    pub meta: BTreeMap<String, String>,
    /// `Weights.Passing`.
    pub weight: u32,
    /// Status of the instance's own check.
    pub status: CheckStatus,
}

impl Instance {
    /// Instance `id` of `service` on port `port` of a node `node-<address>` at
    /// `address` (the service itself registered without an address, as agents
    /// usually do), passing.
    pub fn new(service: &str, id: &str, address: &str, port: u16) -> Instance {
        Instance {
            service: service.into(),
            id: id.into(),
            node: format!("node-{address}"),
            node_address: address.into(),
            datacenter: None,
            address: String::new(),
            port,
            tags: Vec::new(),
            meta: BTreeMap::new(),
            weight: 1,
            status: CheckStatus::Passing,
        }
    }

    /// On node `node` at `address`.
    pub fn on_node(mut self, node: &str, address: &str) -> Self {
        self.node = node.into();
        self.node_address = address.into();
        self
    }

    /// With its own service address.
    pub fn with_address(mut self, address: &str) -> Self {
        self.address = address.into();
        self
    }

    /// With these tags.
    pub fn with_tags(mut self, tags: &[&str]) -> Self {
        self.tags = tags.iter().map(|t| t.to_string()).collect();
        self
    }

    /// With a service meta entry.
    pub fn with_meta(mut self, key: &str, value: &str) -> Self {
        self.meta.insert(key.into(), value.into());
        self
    }

    /// With its check in `status`.
    pub fn with_status(mut self, status: CheckStatus) -> Self {
        self.status = status;
        self
    }

    /// With `Weights.Passing`.
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// On a node of another datacenter (a WAN-federated view).
    pub fn in_datacenter(mut self, dc: &str) -> Self {
        self.datacenter = Some(dc.into());
        self
    }
}

/// One request the server received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    /// HTTP method.
    pub method: String,
    /// URL path (`/v1/health/service/web`).
    pub path: String,
    /// Decoded query parameters.
    pub query: BTreeMap<String, String>,
    /// The token presented, from any of the places Consul reads it.
    pub token: Option<String>,
    /// The `X-Consul-Token` header as sent.
    pub token_header: Option<String>,
    /// When it arrived.
    pub at: Instant,
}

impl RecordedRequest {
    /// The `index` parameter (`None`: not a blocking query).
    pub fn index(&self) -> Option<u64> {
        self.query.get("index").and_then(|i| i.parse().ok())
    }

    /// The `wait` parameter.
    pub fn wait(&self) -> Option<&str> {
        self.query.get("wait").map(String::as_str)
    }
}

#[derive(Clone, Debug)]
struct Registered {
    instance: Instance,
    create_index: u64,
    modify_index: u64,
}

#[derive(Clone, Debug)]
struct NodeState {
    address: String,
    datacenter: Option<String>,
    serf: CheckStatus,
}

#[derive(Debug)]
struct State {
    datacenter: String,
    node_name: String,
    /// The last raft index handed out.
    index: u64,
    /// Index of the catalog's service list.
    services_index: u64,
    /// Per service name: index of its instances and checks (kept after removal).
    service_index: BTreeMap<String, u64>,
    instances: BTreeMap<String, Registered>,
    nodes: BTreeMap<String, NodeState>,
    raw: BTreeMap<String, Vec<Value>>,
    token: Option<String>,
    failing: Option<u16>,
    blocking: bool,
    /// Bumped when held queries must answer at once (index reset).
    abandon: u64,
    held: usize,
    requests: Vec<RecordedRequest>,
}

impl State {
    fn write(&mut self, service: &str, catalog: bool) -> u64 {
        self.index += 1;
        self.service_index.insert(service.to_string(), self.index);
        if catalog {
            self.services_index = self.index;
        }
        self.index
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Bumped on every change; held queries wait on it.
    changes: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("fake Consul state poisoned")
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n += 1);
    }
}

/// The fake Consul server. Dropping it stops the server.
#[derive(Debug)]
pub struct FakeConsul {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for FakeConsul {
    fn drop(&mut self) {
        if let Some(task) = self.server.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}

fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

impl FakeConsul {
    /// A server for datacenter `dc1` on `127.0.0.1:0`.
    pub async fn start() -> std::io::Result<FakeConsul> {
        Self::start_in("dc1").await
    }

    /// A server for `datacenter` on `127.0.0.1:0`.
    pub async fn start_in(datacenter: &str) -> std::io::Result<FakeConsul> {
        let listener = listen(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                datacenter: datacenter.into(),
                node_name: "consul-server-1".into(),
                index: 1,
                services_index: 1,
                service_index: BTreeMap::new(),
                instances: BTreeMap::new(),
                nodes: BTreeMap::new(),
                raw: BTreeMap::new(),
                token: None,
                failing: None,
                blocking: true,
                abandon: 0,
                held: 0,
                requests: Vec::new(),
            }),
            changes: watch::channel(0).0,
        });
        let task = tokio::spawn(http::serve(listener, shared.clone()));
        Ok(FakeConsul {
            addr,
            shared,
            server: Mutex::new(Some(task)),
        })
    }

    /// The bound address (kept across [`FakeConsul::go_down`] / `come_back`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The server's datacenter.
    pub fn datacenter(&self) -> String {
        self.shared.lock().datacenter.clone()
    }

    fn update<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let out = f(&mut self.shared.lock());
        self.shared.changed();
        out
    }

    /// Registers (or replaces) an instance; returns the new index.
    pub fn register(&self, instance: Instance) -> u64 {
        self.update(|st| {
            let node = st.nodes.entry(instance.node.clone()).or_insert(NodeState {
                address: instance.node_address.clone(),
                datacenter: instance.datacenter.clone(),
                serf: CheckStatus::Passing,
            });
            node.address = instance.node_address.clone();
            node.datacenter = instance.datacenter.clone();
            let previous = st.instances.get(&instance.id).cloned();
            if let Some(old) = &previous
                && old.instance.service != instance.service
            {
                st.write(&old.instance.service, true);
            }
            let index = st.write(&instance.service, true);
            let create_index = previous.map_or(index, |p| p.create_index);
            st.instances.insert(
                instance.id.clone(),
                Registered {
                    instance,
                    create_index,
                    modify_index: index,
                },
            );
            index
        })
    }

    /// Removes an instance; returns whether it existed.
    pub fn deregister(&self, id: &str) -> bool {
        self.update(|st| match st.instances.remove(id) {
            Some(old) => {
                st.write(&old.instance.service, true);
                true
            }
            None => false,
        })
    }

    /// Removes every instance (and raw entry) of `service`; returns how many.
    pub fn remove_service(&self, service: &str) -> usize {
        self.update(|st| {
            let before = st.instances.len();
            st.instances.retain(|_, r| r.instance.service != service);
            let removed =
                before - st.instances.len() + st.raw.remove(service).map_or(0, |r| r.len());
            if removed > 0 {
                st.write(service, true);
            }
            removed
        })
    }

    /// Sets the status of an instance's check; returns whether the instance exists.
    pub fn set_health(&self, id: &str, status: CheckStatus) -> bool {
        self.update(|st| {
            let Some(service) = st.instances.get(id).map(|r| r.instance.service.clone()) else {
                return false;
            };
            let index = st.write(&service, false);
            let r = st.instances.get_mut(id).expect("looked up above");
            r.instance.status = status;
            r.modify_index = index;
            true
        })
    }

    /// Sets a node's `serfHealth` check (affects every instance on it); returns whether
    /// the node exists.
    pub fn set_node_health(&self, node: &str, status: CheckStatus) -> bool {
        self.update(|st| {
            let Some(n) = st.nodes.get_mut(node) else {
                return false;
            };
            n.serf = status;
            let services: Vec<String> = st
                .instances
                .values()
                .filter(|r| r.instance.node == node)
                .map(|r| r.instance.service.clone())
                .collect();
            for s in services {
                st.write(&s, false);
            }
            true
        })
    }

    /// Adds a raw JSON entry to `service`'s health answer (and the service to the
    /// catalog): for malformed instances.
    pub fn add_raw_entry(&self, service: &str, entry: Value) -> u64 {
        self.update(|st| {
            st.raw.entry(service.to_string()).or_default().push(entry);
            st.write(service, true)
        })
    }

    /// The last raft index.
    pub fn index(&self) -> u64 {
        self.shared.lock().index
    }

    /// Moves every index to at most `index` (backwards, as after a snapshot restore)
    /// and answers every held query at once with the new, lower index. Later writes
    /// count on from `index`.
    pub fn set_index(&self, index: u64) {
        self.update(|st| {
            let index = index.max(1);
            st.index = index;
            st.services_index = st.services_index.min(index);
            for i in st.service_index.values_mut() {
                *i = (*i).min(index);
            }
            st.abandon += 1;
        });
    }

    /// Requires `token` on every request (`None`: no ACLs).
    pub fn require_token(&self, token: Option<&str>) {
        self.update(|st| st.token = token.map(str::to_string));
    }

    /// Makes every request fail with `status` (500, 503, ...) until called with
    /// `None`. Held queries fail too when they wake.
    pub fn fail_with(&self, status: Option<u16>) {
        self.update(|st| st.failing = status);
    }

    /// With `false`, blocking queries answer at once whatever their index (a server
    /// whose index does not move), to test client-side rate limiting.
    pub fn set_blocking(&self, blocking: bool) {
        self.update(|st| {
            st.blocking = blocking;
            st.abandon += 1;
        });
    }

    /// Closes the listener and every open connection, held queries included.
    pub async fn go_down(&self) {
        let task = self.server.lock().expect("server handle poisoned").take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
    }

    /// Listens on the same address again, with the state it had.
    pub async fn come_back(&self) -> std::io::Result<()> {
        let listener = listen(self.addr)?;
        let task = tokio::spawn(http::serve(listener, self.shared.clone()));
        if let Some(old) = self
            .server
            .lock()
            .expect("server handle poisoned")
            .replace(task)
        {
            old.abort();
        }
        Ok(())
    }

    /// Whether the server is listening.
    pub fn is_up(&self) -> bool {
        self.server
            .lock()
            .expect("server handle poisoned")
            .is_some()
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    /// The requests to `path`.
    pub fn requests_to(&self, path: &str) -> Vec<RecordedRequest> {
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    /// Blocking queries being held right now.
    pub fn held_queries(&self) -> usize {
        self.shared.lock().held
    }
}

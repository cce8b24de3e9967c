//! A fake Nacos server for tests (feature `test-support`), written from Nacos's
//! published wire format: the gRPC Payload envelope (`nacos_grpc_service.proto`) with
//! the JSON bodies of Nacos's request and response classes, and the 1.x HTTP open API.
//!
//! - gRPC on `<HTTP port> + 1000` (as Nacos listens): `Request/request` answers
//!   `ServerCheckRequest` (`ServerCheckResponse` with a connection id and
//!   `supportAbilityNegotiation`), and, once the connection is registered,
//!   `ServiceListRequest`, `SubscribeServiceRequest` and `HealthCheckRequest`; a
//!   request on a connection not registered yet gets an `ErrorResponse` with error
//!   code 301. `BiRequestStream/requestBiStream` registers the connection on its
//!   `ConnectionSetupRequest` and answers `SetupAckRequest`; every change of a
//!   subscribed service is pushed as a `NotifySubscriberRequest` (also right after a
//!   subscription, as Nacos does), and the client's `NotifySubscriberResponse`s are
//!   counted.
//! - HTTP under `/nacos`: `POST /v1/auth/login`, `GET /v1/ns/service/list` (`count`,
//!   `doms`), `GET /v1/ns/instance/list` (a `ServiceInfo` whose `name` is
//!   `group@@service`, as 1.x writes it).
//! - Auth, when required: a token from login (`accessToken` header in gRPC;
//!   `Authorization: Bearer` or `accessToken` in HTTP), and/or the access-key
//!   signature (`ak`, `data`, `signature`). Refusals are what Nacos answers: HTTP 403,
//!   or the request's response with `resultCode` 500 and `errorCode` 403.
//!
//! The test drives it directly: [`FakeNacos::register`] and friends change the
//! catalog; [`FakeNacos::go_down`] closes both listeners and every connection and
//! [`FakeNacos::come_back`] listens on the same ports again with the same state.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::wire::Payload;

mod grpc;
mod http;

/// An instance to register.
#[derive(Clone, Debug, PartialEq)]
pub struct Instance {
    /// Namespace id.
    pub namespace: String,
    /// Group.
    pub group: String,
    /// Service name.
    pub service: String,
    /// Address.
    pub ip: String,
    /// Port.
    pub port: u16,
    /// Weight.
    pub weight: f64,
    /// Healthy.
    pub healthy: bool,
    /// Enabled.
    pub enabled: bool,
    /// Nacos cluster.
    pub cluster: String,
    /// Metadata.
    pub metadata: BTreeMap<String, String>,
}

impl Instance {
    /// An instance of `service` in `public` / `DEFAULT_GROUP`, cluster `DEFAULT`,
    /// healthy, enabled, weight 1.
    pub fn new(service: &str, ip: &str, port: u16) -> Instance {
        Instance {
            namespace: "public".into(),
            group: "DEFAULT_GROUP".into(),
            service: service.into(),
            ip: ip.into(),
            port,
            weight: 1.0,
            healthy: true,
            enabled: true,
            cluster: "DEFAULT".into(),
            metadata: BTreeMap::new(),
        }
    }

    /// In namespace `ns` and group `group`.
    pub fn in_group(mut self, ns: &str, group: &str) -> Self {
        self.namespace = ns.into();
        self.group = group.into();
        self
    }

    /// With a metadata entry.
    pub fn with_meta(mut self, key: &str, value: &str) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// In Nacos cluster `cluster`.
    pub fn in_cluster(mut self, cluster: &str) -> Self {
        self.cluster = cluster.into();
        self
    }

    /// With this health.
    pub fn healthy(mut self, healthy: bool) -> Self {
        self.healthy = healthy;
        self
    }

    /// With this weight.
    pub fn with_weight(mut self, weight: f64) -> Self {
        self.weight = weight;
        self
    }

    fn key(&self) -> ServiceKey {
        (
            self.namespace.clone(),
            self.group.clone(),
            self.service.clone(),
        )
    }

    fn id(&self) -> String {
        format!(
            "{}#{}#{}#{}@@{}",
            self.ip, self.port, self.cluster, self.group, self.service
        )
    }

    /// The host JSON, as Nacos's `Instance` serialises.
    fn to_json(&self) -> Value {
        json!({
            "instanceId": self.id(), "ip": self.ip, "port": self.port,
            "weight": self.weight, "healthy": self.healthy, "enabled": self.enabled,
            "ephemeral": true, "clusterName": self.cluster,
            "serviceName": format!("{}@@{}", self.group, self.service),
            "metadata": self.metadata,
            "instanceHeartBeatInterval": 5000, "instanceHeartBeatTimeOut": 15000,
            "ipDeleteTimeout": 30000, "instanceIdGenerator": "simple",
        })
    }
}

type ServiceKey = (String, String, String);

/// One request the server received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// `grpc` or `http`.
    pub transport: &'static str,
    /// The Payload type (gRPC) or the path (HTTP).
    pub what: String,
    /// Credential headers presented (gRPC `Metadata.headers`; HTTP `Authorization`,
    /// `ak`, `data`, `signature`) and the HTTP query string under `?query`.
    pub headers: BTreeMap<String, String>,
}

/// A registered gRPC connection.
#[derive(Debug)]
struct Conn {
    out: mpsc::UnboundedSender<Result<Payload, tonic::Status>>,
    subscribed: BTreeSet<ServiceKey>,
}

#[derive(Debug, Default)]
struct State {
    services: BTreeMap<ServiceKey, BTreeMap<String, Instance>>,
    login: Option<(String, String)>,
    tokens: BTreeSet<String>,
    access_key: Option<(String, String)>,
    conns: BTreeMap<u64, Conn>,
    requests: Vec<Recorded>,
    pushes_acked: u64,
    /// Pushes sent.
    pushes: u64,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    next_id: AtomicU64,
    /// Last `lastRefTime` handed out (ms; strictly increasing).
    clock: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("fake Nacos state poisoned")
    }

    fn next(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn now_ms(&self) -> u64 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        let mut last = self.clock.load(Ordering::Relaxed);
        loop {
            let next = wall.max(last + 1);
            match self
                .clock
                .compare_exchange(last, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }

    /// The `ServiceInfo` of a service; `grouped_name`: `name` as `group@@service`.
    fn service_info(&self, st: &State, key: &ServiceKey, grouped_name: bool) -> Value {
        let hosts: Vec<Value> = st
            .services
            .get(key)
            .map(|m| m.values().map(Instance::to_json).collect())
            .unwrap_or_default();
        let name = if grouped_name {
            format!("{}@@{}", key.1, key.2)
        } else {
            key.2.clone()
        };
        json!({
            "name": name, "groupName": key.1, "clusters": "", "cacheMillis": 10000,
            "hosts": hosts, "lastRefTime": self.now_ms(), "checksum": "",
            "allIPs": false, "reachProtectionThreshold": false, "valid": true,
        })
    }

    /// Pushes `key`'s instances to every connection subscribed to it.
    fn push(&self, st: &mut State, key: &ServiceKey) {
        let info = self.service_info(st, key, false);
        let mut sent = 0;
        for conn in st.conns.values() {
            if conn.subscribed.contains(key) {
                let body = json!({
                    "headers": {}, "requestId": self.next().to_string(), "module": "naming",
                    "namespace": key.0, "serviceName": key.2, "groupName": key.1,
                    "serviceInfo": info,
                });
                let _ = conn
                    .out
                    .send(Ok(grpc::payload("NotifySubscriberRequest", &body)));
                sent += 1;
            }
        }
        st.pushes += sent;
    }

    /// Whether `headers` carry acceptable credentials; the refusal message if not.
    fn authorize(&self, st: &State, headers: &BTreeMap<String, String>) -> Result<(), String> {
        if st.login.is_some() {
            match headers.get("accessToken") {
                Some(t) if st.tokens.contains(t) => {}
                Some(_) => return Err("token invalid!".into()),
                None => return Err("user not found!".into()),
            }
        }
        if let Some((ak, sk)) = &st.access_key {
            let signed = headers.get("ak") == Some(ak)
                && match (headers.get("data"), headers.get("signature")) {
                    (Some(data), Some(sig)) => crate::auth::sign(data, sk) == *sig,
                    _ => false,
                };
            if !signed {
                return Err("validate signature failed".into());
            }
        }
        Ok(())
    }
}

/// The fake Nacos server. Dropping it stops the server.
#[derive(Debug)]
pub struct FakeNacos {
    http_addr: SocketAddr,
    grpc_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for FakeNacos {
    fn drop(&mut self) {
        for task in self.tasks.get_mut().map(std::mem::take).unwrap_or_default() {
            task.abort();
        }
    }
}

fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

impl FakeNacos {
    /// A Nacos 2.x: HTTP on `127.0.0.1:<port>`, gRPC on `<port> + 1000`.
    pub async fn start() -> std::io::Result<FakeNacos> {
        let local = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut last = None;
        for _ in 0..50 {
            let http = listen(local)?;
            let port = http.local_addr()?.port();
            let Some(grpc_port) = port.checked_add(1000) else {
                continue;
            };
            match listen(SocketAddr::from(([127, 0, 0, 1], grpc_port))) {
                Ok(grpc) => return Ok(Self::serve(http, Some(grpc))),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no port pair found")))
    }

    /// A Nacos 1.x: the HTTP API only.
    pub async fn start_http_only() -> std::io::Result<FakeNacos> {
        let http = listen(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        Ok(Self::serve(http, None))
    }

    fn serve(http: TcpListener, grpc: Option<TcpListener>) -> FakeNacos {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            next_id: AtomicU64::new(0),
            clock: AtomicU64::new(0),
        });
        let fake = FakeNacos {
            http_addr: http.local_addr().expect("bound"),
            grpc_addr: grpc.as_ref().map(|g| g.local_addr().expect("bound")),
            shared,
            tasks: Mutex::new(Vec::new()),
        };
        fake.spawn(http, grpc);
        fake
    }

    fn spawn(&self, http: TcpListener, grpc: Option<TcpListener>) {
        let mut tasks = self.tasks.lock().expect("tasks poisoned");
        tasks.push(tokio::spawn(http::serve(http, self.shared.clone())));
        if let Some(grpc) = grpc {
            tasks.push(tokio::spawn(grpc::serve(grpc, self.shared.clone())));
        }
    }

    /// `127.0.0.1:<HTTP port>`, as `--nacosServerAddrs` takes it.
    pub fn server_addr(&self) -> String {
        self.http_addr.to_string()
    }

    /// The gRPC address (`None` for a 1.x server).
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc_addr
    }

    /// Registers (or replaces) an instance and pushes the change.
    pub fn register(&self, instance: Instance) {
        let mut st = self.shared.lock();
        let key = instance.key();
        st.services
            .entry(key.clone())
            .or_default()
            .insert(instance.id(), instance);
        self.shared.push(&mut st, &key);
    }

    /// Registers many instances of one service with one push.
    pub fn register_all(&self, instances: impl IntoIterator<Item = Instance>) {
        let mut st = self.shared.lock();
        let mut keys = BTreeSet::new();
        for instance in instances {
            let key = instance.key();
            st.services
                .entry(key.clone())
                .or_default()
                .insert(instance.id(), instance);
            keys.insert(key);
        }
        for key in keys {
            self.shared.push(&mut st, &key);
        }
    }

    /// Removes the instance at `ip:port` of `service` (public, DEFAULT_GROUP); returns
    /// whether it existed.
    pub fn deregister(&self, service: &str, ip: &str, port: u16) -> bool {
        let mut st = self.shared.lock();
        let key: ServiceKey = ("public".into(), "DEFAULT_GROUP".into(), service.into());
        let removed = st.services.get_mut(&key).is_some_and(|m| {
            let before = m.len();
            m.retain(|_, i| !(i.ip == ip && i.port == port));
            m.len() != before
        });
        if removed {
            self.shared.push(&mut st, &key);
        }
        removed
    }

    /// Removes a service (public, DEFAULT_GROUP) with its instances.
    pub fn remove_service(&self, service: &str) {
        let mut st = self.shared.lock();
        let key: ServiceKey = ("public".into(), "DEFAULT_GROUP".into(), service.into());
        if st.services.remove(&key).is_some() {
            self.shared.push(&mut st, &key);
        }
    }

    /// Removes every service.
    pub fn clear(&self) {
        let mut st = self.shared.lock();
        let keys: Vec<ServiceKey> = st.services.keys().cloned().collect();
        st.services.clear();
        for key in keys {
            self.shared.push(&mut st, &key);
        }
    }

    /// Requires a login with `username` and `password` (`None`: no auth).
    pub fn require_login(&self, login: Option<(&str, &str)>) {
        self.shared.lock().login = login.map(|(u, p)| (u.to_string(), p.to_string()));
    }

    /// Requires the access-key signature with this key pair (`None`: no signature).
    pub fn require_access_key(&self, pair: Option<(&str, &str)>) {
        self.shared.lock().access_key = pair.map(|(a, s)| (a.to_string(), s.to_string()));
    }

    /// Forgets every issued token (as a changed secret key or password does).
    pub fn revoke_tokens(&self) {
        self.shared.lock().tokens.clear();
    }

    /// Closes both listeners and every connection.
    pub async fn go_down(&self) {
        let tasks = std::mem::take(&mut *self.tasks.lock().expect("tasks poisoned"));
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
        self.shared.lock().conns.clear();
    }

    /// Listens on the same ports again, with the state it had.
    pub async fn come_back(&self) -> std::io::Result<()> {
        let http = listen(self.http_addr)?;
        let grpc = self.grpc_addr.map(listen).transpose()?;
        self.spawn(http, grpc);
        Ok(())
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().requests.clone()
    }

    /// The requests of a type (gRPC) or path (HTTP).
    pub fn requests_of(&self, what: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.what == what)
            .collect()
    }

    /// Pushes sent, and pushes the client acknowledged (`NotifySubscriberResponse`).
    pub fn pushes(&self) -> (u64, u64) {
        let st = self.shared.lock();
        (st.pushes, st.pushes_acked)
    }

    /// Sends every registered connection a server request of `kind`
    /// (`ClientDetectionRequest`, `ConnectResetRequest`) with no fields beyond the
    /// common ones.
    pub fn send_server_request(&self, kind: &str) {
        let st = self.shared.lock();
        for conn in st.conns.values() {
            let body = json!({"headers": {}, "requestId": self.shared.next().to_string(),
                              "module": "internal"});
            let _ = conn.out.send(Ok(grpc::payload(kind, &body)));
        }
    }

    /// Registered gRPC connections.
    pub fn connections(&self) -> usize {
        self.shared.lock().conns.len()
    }
}

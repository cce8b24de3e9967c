//! A fake Eureka server for tests (feature `test-support`), written from Eureka's
//! published REST API (the wiki's "Eureka REST operations") and the JSON a real
//! Eureka server emits, not from this crate's types.
//!
//! A real HTTP/1.1 server on `127.0.0.1:<port 0>` serving, under `/eureka`:
//! - `GET /eureka/apps`: `{"applications": {"versions__delta": "<n>", "apps__hashcode":
//!   "<code>", "application": [{"name": "WEB", "instance": [...]}]}}`, each instance as
//!   Eureka's Jackson codec writes it (`instanceId`, `hostName`, `app`, `ipAddr`,
//!   `status`, `overriddenStatus`, `port: {"$": 8080, "@enabled": "true"}`,
//!   `securePort`, `countryId`, `dataCenterInfo` with its `@class`, `leaseInfo`,
//!   `metadata` (`{"@class": "java.util.Collections$EmptyMap"}` when empty),
//!   `homePageUrl`, `statusPageUrl`, `healthCheckUrl`, `vipAddress`,
//!   `secureVipAddress`, `isCoordinatingDiscoveryServer`, `lastUpdatedTimestamp`,
//!   `lastDirtyTimestamp`, `actionType`);
//! - `GET /eureka/apps/delta`: the same shape holding the instances changed within
//!   the delta window (3 minutes unless set; the latest change of each instance, as
//!   Eureka's recently-changed queue gives it), each with its `actionType`, and the
//!   `apps__hashcode` of the whole registry now.
//!
//! The reconcile hash code is computed as Eureka's server computes it: instances
//! counted per status, statuses sorted, `<STATUS>_<count>_` each.
//!
//! Behaviours a test turns on: the XStream-era JSON ([`FakeEureka::set_xstream_json`]:
//! one-element lists as objects, port numbers as strings, `overriddenstatus`),
//! HTTP basic auth as Spring Security answers it (401 with `WWW-Authenticate`),
//! a 403 for a refused role, Eureka's own empty 403 while it is not ready to serve
//! (`set_not_ready`) and on `apps/delta` with `eureka.disableDelta` (`disable_delta`),
//! any failure status (`fail_with`), the delta window passing
//! ([`FakeEureka::expire_delta`]), and the server going away and coming back on the
//! same port.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::TcpSocket;
use tokio::task::JoinHandle;
use tokio::time::Instant;

mod http;

/// An instance status as Eureka spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// `UP`.
    Up,
    /// `DOWN`.
    Down,
    /// `STARTING`.
    Starting,
    /// `OUT_OF_SERVICE`.
    OutOfService,
    /// `UNKNOWN`.
    Unknown,
}

impl Status {
    /// Eureka's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Up => "UP",
            Status::Down => "DOWN",
            Status::Starting => "STARTING",
            Status::OutOfService => "OUT_OF_SERVICE",
            Status::Unknown => "UNKNOWN",
        }
    }
}

/// An instance to register.
#[derive(Clone, Debug, PartialEq)]
pub struct Instance {
    /// Application name (Eureka upper-cases it).
    pub app: String,
    /// `instanceId`.
    pub id: String,
    /// `hostName`.
    pub host_name: String,
    /// `ipAddr`.
    pub ip: String,
    /// Non-secure port and whether it is enabled.
    pub port: (u16, bool),
    /// Secure port and whether it is enabled.
    pub secure_port: (u16, bool),
    /// `status`.
    pub status: Status,
    /// `overriddenStatus`.
    pub overridden: Status,
    /// `metadata`.
    pub metadata: BTreeMap<String, String>,
    /// An AWS availability zone: `dataCenterInfo` is `AmazonInfo` with it.
    pub aws_zone: Option<String>,
}

impl Instance {
    /// Instance `id` of `app` at `ip`, non-secure port `port` enabled, secure port
    /// 443 disabled, `UP`, no metadata, in Eureka's `MyOwn` data center.
    pub fn new(app: &str, id: &str, ip: &str, port: u16) -> Instance {
        Instance {
            app: app.to_ascii_uppercase(),
            id: id.into(),
            host_name: ip.into(),
            ip: ip.into(),
            port: (port, true),
            secure_port: (443, false),
            status: Status::Up,
            overridden: Status::Unknown,
            metadata: BTreeMap::new(),
            aws_zone: None,
        }
    }

    /// With the secure port `port` enabled.
    pub fn with_secure_port(mut self, port: u16) -> Self {
        self.secure_port = (port, true);
        self
    }

    /// With the non-secure port disabled.
    pub fn without_port(mut self) -> Self {
        self.port.1 = false;
        self
    }

    /// With `status`.
    pub fn with_status(mut self, status: Status) -> Self {
        self.status = status;
        self
    }

    /// With a metadata entry.
    pub fn with_metadata(mut self, key: &str, value: &str) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// In an AWS availability zone (`AmazonInfo` data center).
    pub fn in_aws_zone(mut self, zone: &str) -> Self {
        self.aws_zone = Some(zone.into());
        self
    }
}

/// One request the server received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    /// HTTP method.
    pub method: String,
    /// URL path (`/eureka/apps/delta`).
    pub path: String,
    /// The `Authorization` header as sent.
    pub authorization: Option<String>,
    /// The `Accept` header as sent.
    pub accept: Option<String>,
    /// When it arrived.
    pub at: Instant,
}

#[derive(Clone, Debug)]
struct Registered {
    instance: Instance,
    registered_ms: u64,
    updated_ms: u64,
}

#[derive(Clone, Debug)]
struct Change {
    at: Instant,
    action: &'static str,
    entry: Registered,
}

#[derive(Debug)]
struct State {
    /// APP -> id -> instance.
    apps: BTreeMap<String, BTreeMap<String, Registered>>,
    /// (APP, id) -> its latest change within the window, in change order.
    recent: VecDeque<((String, String), Change)>,
    retention: Duration,
    version: u64,
    clock_ms: u64,
    credentials: Option<(String, String)>,
    forbidden: bool,
    not_ready: bool,
    delta_disabled: bool,
    failing: Option<u16>,
    xstream: bool,
    requests: Vec<RecordedRequest>,
}

impl State {
    fn tick(&mut self) -> u64 {
        self.clock_ms += 1000;
        self.version += 1;
        self.clock_ms
    }

    fn changed(&mut self, action: &'static str, entry: Registered) {
        let key = (entry.instance.app.clone(), entry.instance.id.clone());
        self.recent.retain(|(k, _)| *k != key);
        self.recent.push_back((
            key,
            Change {
                at: Instant::now(),
                action,
                entry,
            },
        ));
    }

    fn hash_code(&self) -> String {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for r in self.apps.values().flat_map(BTreeMap::values) {
            *counts.entry(r.instance.status.as_str()).or_default() += 1;
        }
        counts.iter().map(|(s, n)| format!("{s}_{n}_")).collect()
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("fake Eureka state poisoned")
    }
}

/// The fake Eureka server. Dropping it stops the server.
#[derive(Debug)]
pub struct FakeEureka {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for FakeEureka {
    fn drop(&mut self) {
        if let Some(task) = self.server.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}

fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

impl FakeEureka {
    /// A server on `127.0.0.1:0` with an empty registry.
    pub async fn start() -> std::io::Result<FakeEureka> {
        let listener = listen(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                apps: BTreeMap::new(),
                recent: VecDeque::new(),
                retention: Duration::from_secs(180),
                version: 0,
                clock_ms: 1_700_000_000_000,
                credentials: None,
                forbidden: false,
                not_ready: false,
                delta_disabled: false,
                failing: None,
                xstream: false,
                requests: Vec::new(),
            }),
        });
        let task = tokio::spawn(http::serve(listener, shared.clone()));
        Ok(FakeEureka {
            addr,
            shared,
            server: Mutex::new(Some(task)),
        })
    }

    /// The bound address (kept across [`FakeEureka::go_down`] / `come_back`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The service URL: `http://127.0.0.1:<port>/eureka`.
    pub fn url(&self) -> String {
        format!("http://{}/eureka", self.addr)
    }

    fn update<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.shared.lock())
    }

    /// Registers (or re-registers) an instance: `ADDED` in the delta.
    pub fn register(&self, instance: Instance) {
        self.update(|st| {
            let now = st.tick();
            let apps = st.apps.entry(instance.app.clone()).or_default();
            let registered_ms = apps.get(&instance.id).map_or(now, |r| r.registered_ms);
            let entry = Registered {
                instance,
                registered_ms,
                updated_ms: now,
            };
            apps.insert(entry.instance.id.clone(), entry.clone());
            st.changed("ADDED", entry);
        });
    }

    /// Registers many instances at once (one version step), for large catalogs.
    pub fn register_all(&self, instances: impl IntoIterator<Item = Instance>) {
        self.update(|st| {
            let now = st.tick();
            for instance in instances {
                let entry = Registered {
                    instance,
                    registered_ms: now,
                    updated_ms: now,
                };
                st.apps
                    .entry(entry.instance.app.clone())
                    .or_default()
                    .insert(entry.instance.id.clone(), entry.clone());
                st.changed("ADDED", entry);
            }
        });
    }

    /// Sets an instance's status (`MODIFIED` in the delta); returns whether it exists.
    pub fn set_status(&self, app: &str, id: &str, status: Status) -> bool {
        self.update(|st| {
            let now = st.tick();
            let Some(r) = st
                .apps
                .get_mut(&app.to_ascii_uppercase())
                .and_then(|a| a.get_mut(id))
            else {
                return false;
            };
            r.instance.status = status;
            r.updated_ms = now;
            let entry = r.clone();
            st.changed("MODIFIED", entry);
            true
        })
    }

    /// Cancels an instance (`DELETED` in the delta); returns whether it existed.
    pub fn deregister(&self, app: &str, id: &str) -> bool {
        self.update(|st| {
            st.tick();
            let app = app.to_ascii_uppercase();
            let Some(entry) = st.apps.get_mut(&app).and_then(|a| a.remove(id)) else {
                return false;
            };
            if st.apps.get(&app).is_some_and(BTreeMap::is_empty) {
                st.apps.remove(&app);
            }
            st.changed("DELETED", entry);
            true
        })
    }

    /// Cancels every instance (a server that lost its registry).
    pub fn clear(&self) {
        self.update(|st| {
            st.tick();
            let apps = std::mem::take(&mut st.apps);
            for entry in apps.into_values().flat_map(BTreeMap::into_values) {
                st.changed("DELETED", entry);
            }
        });
    }

    /// Forgets every recent change, as the delta window passing does: a client that
    /// did not fetch in time misses them.
    pub fn expire_delta(&self) {
        self.update(|st| st.recent.clear());
    }

    /// The delta window (`eureka.retentionTimeInMSInDeltaQueue`, 3 minutes).
    pub fn set_delta_retention(&self, retention: Duration) {
        self.update(|st| st.retention = retention);
    }

    /// The reconcile hash code of the registry.
    pub fn hash_code(&self) -> String {
        self.shared.lock().hash_code()
    }

    /// The size in bytes of the `apps` answer as it would be served now.
    pub fn apps_body_len(&self) -> usize {
        http::full_body_len(&self.shared.lock())
    }

    /// Requires HTTP basic auth with these credentials (`None`: open).
    pub fn require_basic_auth(&self, credentials: Option<(&str, &str)>) {
        self.update(|st| {
            st.credentials = credentials.map(|(u, p)| (u.to_string(), p.to_string()));
        });
    }

    /// Answers every authenticated request with Spring Security's 403 (a user
    /// without the needed role).
    pub fn forbid(&self, forbidden: bool) {
        self.update(|st| st.forbidden = forbidden);
    }

    /// Answers as Eureka does while it refuses access (waiting for its peers at
    /// start-up): 403 with no body, on both endpoints.
    pub fn set_not_ready(&self, not_ready: bool) {
        self.update(|st| st.not_ready = not_ready);
    }

    /// `eureka.disableDelta`: `apps/delta` answers 403 with no body.
    pub fn disable_delta(&self, disabled: bool) {
        self.update(|st| st.delta_disabled = disabled);
    }

    /// Makes every request fail with `status` until called with `None`.
    pub fn fail_with(&self, status: Option<u16>) {
        self.update(|st| st.failing = status);
    }

    /// The XStream-era JSON: one-element lists as objects, ports as strings,
    /// `overriddenstatus`, `versions__delta` as a number.
    pub fn set_xstream_json(&self, xstream: bool) {
        self.update(|st| st.xstream = xstream);
    }

    /// Closes the listener and every open connection.
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

    /// Every request received so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    /// The requests to `path`.
    pub fn requests_to(&self, path: &str) -> Vec<RecordedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.path == path)
            .collect()
    }
}

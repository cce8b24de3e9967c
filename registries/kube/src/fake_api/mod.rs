//! A fake Kubernetes API server for tests (feature `test-support`).
//!
//! A real HTTP/1.1 server on `127.0.0.1:<port 0>` that speaks the wire format
//! kube-rs (and client-go) expect: objects are k8s-openapi types serialised as JSON;
//! LIST returns `{kind: <Kind>List, metadata: {resourceVersion, continue}, items}` with
//! `limit`/`continue` paging; WATCH (`?watch=true&resourceVersion=N`) is a chunked
//! stream of `{"type": "ADDED|MODIFIED|DELETED|BOOKMARK|ERROR", "object": ...}` lines
//! replaying every change after `N`, then following live ones. A watch from a version
//! older than the retained history gets the API server's answer: an `ERROR` event
//! carrying a `Status` with code 410 (`Expired`), after which clients relist.
//! `fieldSelector`/`labelSelector` support `=`, `==`, `!=` (and label existence), with
//! the API server's rule that an object leaving the selection is a `DELETED` event.
//!
//! Custom resources (Istio's CRDs) are served as plain JSON once a test installs their
//! type with [`FakeApiServer::install_crd`]: the same LIST/WATCH semantics under every
//! served version, plus the discovery documents `/apis/<group>` (APIGroup, with the
//! preferred version) and `/apis/<group>/<version>` (APIResourceList); see
//! [`CustomResource`]. Their objects are written with [`FakeApiServer::apply_custom`]
//! and [`FakeApiServer::delete_custom`].
//!
//! The test drives it directly: [`FakeApiServer::apply`] / [`FakeApiServer::delete`]
//! change objects (bumping one global resourceVersion, as etcd does),
//! [`FakeApiServer::drop_watches`] cuts every watch connection,
//! [`FakeApiServer::compact`] forgets history so resumed watches get 410, and
//! [`FakeApiServer::requests`] tells what the client asked.
//!
//! [`FakeApiServer::enforce`] turns on RBAC: an [`RbacPolicy`] (built from ClusterRole
//! and Role objects with [`RbacPolicy::from_roles`]) authorises each request by the
//! attributes the API server derives from it (verb, API group, resource, namespace, or
//! a non-resource path); a request no rule grants gets `403 Forbidden` and is recorded
//! as denied, and [`RbacPolicy::unused_grants`] tells which grants no request needed.
//!
//! Clients write over HTTP too: POST creates, PUT replaces (with the API server's
//! `AlreadyExists` / `NotFound` / `Conflict` answers) and DELETE removes a named
//! object. [`FakeApiServer::issue_token`] mints service-account tokens: a
//! `TokenReview` (`POST /apis/authentication.k8s.io/v1/tokenreviews`) answers for them
//! as the API server's authenticators do, and a client using one as its bearer token
//! ([`FakeApiServer::client_with_token`]) is recorded as that account
//! ([`RecordedRequest::user`]), so tests tell replicas apart. A
//! `SubjectAccessReview` (`POST /apis/authorization.k8s.io/v1/subjectaccessreviews`)
//! allows what the test granted with [`FakeApiServer::grant_access`]. The TokenRequest
//! subresource (`POST .../serviceaccounts/<name>/token`) mints such tokens for an
//! existing account, and a created `kubernetes.io/service-account-token` Secret naming
//! one is filled with a token and [`FAKE_CLUSTER_CA`] as the token controller fills it.
//!
//! Simplifications: a continued LIST page reflects the current objects rather than a
//! snapshot at the list's version (clients replay the watch from that version, so they
//! converge all the same); tokens are opaque strings, not signed JWTs.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::body::Bytes;
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use self::custom::CustomView;
use self::selector::Selector;

mod access;
mod custom;
mod http;
pub mod objects;
mod path;
mod rbac;
mod response;
mod selector;
mod service_accounts;
mod tokens;

pub use custom::CustomResource;
pub use rbac::{
    DEFAULT_DISCOVERY_URLS, DEFAULT_USER, Grant, PolicyRule, RbacPolicy, RequestAttributes, Scope,
};
pub use service_accounts::FAKE_CLUSTER_CA;
pub use tokens::API_SERVER_AUDIENCE;

/// One request the server received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    /// HTTP method.
    pub method: String,
    /// URL path (`/api/v1/pods`).
    pub path: String,
    /// Decoded query parameters.
    pub query: BTreeMap<String, String>,
    /// Refused with `403 Forbidden` by the enforced [`RbacPolicy`].
    pub denied: bool,
    /// The user the request authenticated as: the service account of a bearer token
    /// minted with [`FakeApiServer::issue_token`]; `None` without one (or with a
    /// token the server did not mint, or an expired one).
    pub user: Option<String>,
}

impl RecordedRequest {
    /// A WATCH (as opposed to a LIST or GET).
    pub fn is_watch(&self) -> bool {
        matches!(
            self.query.get("watch").map(String::as_str),
            Some("true" | "1")
        )
    }

    /// What the API server authorises this request as (verb, group, resource,
    /// namespace; or a non-resource path).
    pub fn attributes(&self) -> RequestAttributes {
        RequestAttributes::of(&self.method, &self.path, &self.query)
    }

    /// The `resourceVersion` parameter.
    pub fn resource_version(&self) -> Option<&str> {
        self.query.get("resourceVersion").map(String::as_str)
    }
}

/// The fake API server. Dropping it stops the server and ends every watch.
#[derive(Debug)]
pub struct FakeApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<ApiState>,
}

#[derive(Debug)]
struct ApiState {
    /// The last resourceVersion handed out (global, like etcd's revision).
    rv: u64,
    /// History holds every change after this version; older watches get 410.
    oldest: u64,
    collections: HashMap<String, Collection>,
    history: VecDeque<Arc<Change>>,
    watches: Vec<WatchSub>,
    requests: Vec<RecordedRequest>,
    /// Installed custom resource types.
    crds: Vec<CustomResource>,
    /// When set, requests it does not allow are answered `403 Forbidden`.
    policy: Option<RbacPolicy>,
    /// When set, a create in a namespace that does not exist is `404 NotFound`
    /// (`namespaces "<ns>" not found`), as a real API server answers.
    require_namespaces: bool,
    /// Service-account tokens minted by the test.
    tokens: tokens::TokenTable,
    /// What `SubjectAccessReview`s allow, and the reviews asked.
    access: access::AccessTable,
}

impl Default for ApiState {
    fn default() -> Self {
        ApiState {
            rv: 1,
            oldest: 1,
            collections: HashMap::new(),
            history: VecDeque::new(),
            watches: Vec::new(),
            requests: Vec::new(),
            crds: Vec::new(),
            policy: None,
            require_namespaces: false,
            tokens: tokens::TokenTable::default(),
            access: access::AccessTable::default(),
        }
    }
}

/// All objects of one resource, keyed by (namespace, name); cluster-scoped objects
/// have an empty namespace.
#[derive(Debug, Default)]
struct Collection {
    api_version: String,
    kind: String,
    objects: BTreeMap<(String, String), Value>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChangeType {
    Added,
    Modified,
    Deleted,
}

#[derive(Debug)]
struct Change {
    rv: u64,
    collection: String,
    namespace: String,
    kind: ChangeType,
    /// The object before the change (for selector transitions and deletions).
    old: Option<Value>,
    /// The object after the change (for a deletion: the last state, new version).
    new: Value,
}

#[derive(Debug)]
enum WatchMsg {
    Line(Bytes),
    /// End the response cleanly (as when `timeoutSeconds` expires).
    End,
    /// Break the connection mid-stream.
    Abort,
}

#[derive(Debug)]
struct WatchSub {
    collection: String,
    namespace: Option<String>,
    selector: Selector,
    bookmarks: bool,
    api_version: String,
    kind: String,
    /// For a custom resource: the version its objects are shown in.
    custom: Option<CustomView>,
    tx: mpsc::UnboundedSender<WatchMsg>,
}

/// The collection path of a resource type: `/api/v1/pods`, `/apis/<g>/<v>/<plural>`.
fn collection_of<K: Resource<DynamicType = ()>>() -> String {
    let (group, version, plural) = (K::group(&()), K::version(&()), K::plural(&()));
    if group.is_empty() {
        format!("/api/{version}/{plural}")
    } else {
        format!("/apis/{group}/{version}/{plural}")
    }
}

impl FakeApiServer {
    /// Binds `127.0.0.1:0` and serves until dropped.
    pub async fn start() -> std::io::Result<FakeApiServer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .fallback(http::handle)
            .with_state(shared.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(FakeApiServer {
            addr,
            shared,
            stop: Some(stop),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig (YAML) for this server, as a remote-cluster secret holds it: the
    /// plain-HTTP server URL and a user without credentials.
    pub fn kubeconfig(&self) -> String {
        self.render_kubeconfig("{}")
    }

    /// The same kubeconfig with a bearer token (the server accepts any): another text
    /// for the same server, as a credential rotation produces.
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        self.render_kubeconfig(&format!("{{token: {token:?}}}"))
    }

    fn render_kubeconfig(&self, user: &str) -> String {
        format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: fake\n  \
               cluster:\n    \
                 server: {url}\n\
             users:\n\
             - name: fake\n  \
               user: {user}\n\
             contexts:\n\
             - name: fake\n  \
               context:\n    \
                 cluster: fake\n    \
                 user: fake\n\
             current-context: fake\n",
            url = self.url()
        )
    }

    /// A kube client pointed at this server.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url().parse().expect("the server URL is valid"));
        kube::Client::try_from(config).expect("a plain-HTTP kube client builds")
    }

    /// A kube client that authenticates with `token` (a bearer token, as a pod's
    /// projected service-account token is used): with a token from
    /// [`FakeApiServer::issue_token`] its requests are recorded as that account's
    /// ([`RecordedRequest::user`]), so a test tells apart what each replica did.
    pub fn client_with_token(&self, token: &str) -> kube::Client {
        let mut config = kube::Config::new(self.url().parse().expect("the server URL is valid"));
        config.headers.push((
            axum::http::header::AUTHORIZATION,
            format!("Bearer {token}")
                .parse()
                .expect("a token is a valid header value"),
        ));
        kube::Client::try_from(config).expect("a plain-HTTP kube client builds")
    }

    /// Mints a token for service account `namespace/service_account`, as the
    /// TokenRequest API does: valid for `audiences` (the API server's own,
    /// [`API_SERVER_AUDIENCE`], when empty) until `expires`, bound to `pod` (name,
    /// uid) when given. A `TokenReview` of it answers as the API server would, and a
    /// client using it ([`FakeApiServer::client_with_token`]) is that account.
    pub fn issue_token(
        &self,
        namespace: &str,
        service_account: &str,
        audiences: &[&str],
        expires: std::time::SystemTime,
        pod: Option<(&str, &str)>,
    ) -> String {
        let audiences = if audiences.is_empty() {
            vec![API_SERVER_AUDIENCE.to_string()]
        } else {
            audiences.iter().map(|a| a.to_string()).collect()
        };
        self.lock().tokens.issue(tokens::IssuedToken {
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
            audiences,
            expires,
            pod: pod.map(|(name, uid)| (name.to_string(), uid.to_string())),
        })
    }

    /// Lets `user` do `verb` on `resource` in `namespace` as far as a
    /// `SubjectAccessReview` tells (everything else is denied).
    pub fn grant_access(&self, user: &str, verb: &str, resource: &str, namespace: &str) {
        self.lock().access.grants.insert((
            user.to_string(),
            verb.to_string(),
            resource.to_string(),
            namespace.to_string(),
        ));
    }

    /// Takes back a grant of [`FakeApiServer::grant_access`].
    pub fn revoke_access(&self, user: &str, verb: &str, resource: &str, namespace: &str) {
        self.lock().access.grants.remove(&(
            user.to_string(),
            verb.to_string(),
            resource.to_string(),
            namespace.to_string(),
        ));
    }

    /// The `SubjectAccessReview`s asked so far, oldest first: (user, verb, resource,
    /// namespace).
    pub fn access_reviews(&self) -> Vec<(String, String, String, String)> {
        self.lock().access.reviews.clone()
    }

    /// The requests `user` made (see [`RecordedRequest::user`]), oldest first.
    pub fn requests_by(&self, user: &str) -> Vec<RecordedRequest> {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.user.as_deref() == Some(user))
            .cloned()
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, ApiState> {
        self.shared.state.lock().expect("fake API state poisoned")
    }

    /// Creates or replaces an object (ADDED or MODIFIED), setting its
    /// `resourceVersion` (and `uid` / `creationTimestamp` when absent, as the API
    /// server does on create). Returns the new resourceVersion.
    ///
    /// Panics on an object without `metadata.name` (a test bug).
    pub fn apply<K: Resource<DynamicType = ()> + Serialize>(&self, obj: &K) -> u64 {
        let meta = obj.meta();
        let name = meta.name.clone().expect("objects need metadata.name");
        let namespace = meta.namespace.clone().unwrap_or_default();
        let mut value = serde_json::to_value(obj).expect("k8s objects serialise");
        value["apiVersion"] = json!(K::api_version(&()));
        value["kind"] = json!(K::kind(&()));
        let mut state = self.lock();
        state.store(
            collection_of::<K>(),
            (K::api_version(&()).to_string(), K::kind(&()).to_string()),
            (namespace, name),
            value,
        )
    }

    /// Deletes an object (DELETED, carrying its last state at a new resourceVersion).
    /// Returns the new resourceVersion, or `None` if there was no such object.
    pub fn delete<K: Resource<DynamicType = ()>>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<u64> {
        let key = (namespace.unwrap_or("").to_string(), name.to_string());
        self.lock().remove(&collection_of::<K>(), key)
    }

    /// Installs a custom resource type (as creating its CRD does), or replaces the
    /// served versions of an installed one. Objects already stored stay.
    pub fn install_crd(&self, crd: CustomResource) {
        let mut state = self.lock();
        state
            .crds
            .retain(|c| !(c.group == crd.group && c.plural == crd.plural));
        state.crds.push(crd);
    }

    /// Installs every resource of `crds` ([`CustomResource::istio_networking`]).
    pub fn install_crds(&self, crds: impl IntoIterator<Item = CustomResource>) {
        for crd in crds {
            self.install_crd(crd);
        }
    }

    /// Creates or replaces a custom object given as JSON (`apiVersion`, `kind`,
    /// `metadata`, ...), like [`FakeApiServer::apply`]; it is served in every version
    /// of its type. Returns the new resourceVersion.
    ///
    /// Panics when its type is not installed in the object's version, or on an object
    /// without `metadata.name` (test bugs; the API server would refuse both).
    pub fn apply_custom(&self, obj: &Value) -> u64 {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        let (group, version) = api_version
            .split_once('/')
            .expect("custom objects have apiVersion group/version");
        let name = obj["metadata"]["name"]
            .as_str()
            .expect("objects need metadata.name")
            .to_string();
        let mut state = self.lock();
        let crd = state
            .custom_by_kind(group, kind)
            .filter(|crd| crd.versions.iter().any(|v| v == version))
            .unwrap_or_else(|| panic!("{kind} {api_version} is not installed"));
        let namespace = if crd.namespaced {
            obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string()
        } else {
            String::new()
        };
        let collection = crd.collection();
        let mut value = obj.clone();
        if crd.namespaced {
            value["metadata"]["namespace"] = json!(namespace);
        }
        // metadata.generation: 1, then one more per spec change.
        let old = state
            .collections
            .get(&collection)
            .and_then(|c| c.objects.get(&(namespace.clone(), name.clone())));
        let generation = match old {
            Some(old) if old["spec"] == value["spec"] => {
                old["metadata"]["generation"].as_i64().unwrap_or(1)
            }
            Some(old) => old["metadata"]["generation"].as_i64().unwrap_or(1) + 1,
            None => 1,
        };
        value["metadata"]["generation"] = json!(generation);
        state.store(
            collection,
            (api_version.to_string(), kind.to_string()),
            (namespace, name),
            value,
        )
    }

    /// Deletes a custom object of `kind` in `group` (an empty namespace for a
    /// cluster-scoped one). Returns the new resourceVersion, or `None` if there was no
    /// such object (or type).
    pub fn delete_custom(
        &self,
        group: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<u64> {
        let mut state = self.lock();
        let collection = state.custom_by_kind(group, kind)?.collection();
        state.remove(&collection, (namespace.to_string(), name.to_string()))
    }

    /// The stored custom object of `kind` in `group`, with the `apiVersion` it was
    /// last written with.
    pub fn get_custom(
        &self,
        group: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Value> {
        let state = self.lock();
        let collection = state.custom_by_kind(group, kind)?.collection();
        state
            .collections
            .get(&collection)?
            .objects
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// The stored object, as a client would read it.
    pub fn get<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<K> {
        let state = self.lock();
        let key = (namespace.unwrap_or("").to_string(), name.to_string());
        let value = state
            .collections
            .get(&collection_of::<K>())?
            .objects
            .get(&key)?
            .clone();
        Some(serde_json::from_value(value).expect("stored objects deserialise"))
    }

    /// The current (last handed out) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Breaks every open watch connection mid-stream, as a network failure or an API
    /// server restart does. Returns how many there were.
    pub fn drop_watches(&self) -> usize {
        self.close_watches(|| WatchMsg::Abort)
    }

    /// Ends every open watch cleanly, as the API server does when `timeoutSeconds`
    /// expires. Returns how many there were.
    pub fn end_watches(&self) -> usize {
        self.close_watches(|| WatchMsg::End)
    }

    fn close_watches(&self, msg: fn() -> WatchMsg) -> usize {
        let mut state = self.lock();
        let watches = std::mem::take(&mut state.watches);
        watches
            .into_iter()
            .filter(|w| w.tx.send(msg()).is_ok())
            .count()
    }

    /// Open watch connections.
    pub fn active_watches(&self) -> usize {
        let mut state = self.lock();
        state.watches.retain(|w| !w.tx.is_closed());
        state.watches.len()
    }

    /// Forgets all history (etcd compaction): a watch resumed from any version before
    /// the current one gets `410 Gone`.
    pub fn compact(&self) {
        let mut state = self.lock();
        state.history.clear();
        state.oldest = state.rv;
    }

    /// Sends a BOOKMARK at the current resourceVersion on every watch that allows
    /// them. Returns how many were sent.
    pub fn bookmark(&self) -> usize {
        let mut state = self.lock();
        let rv = state.rv;
        state.watches.retain(|w| !w.tx.is_closed());
        state
            .watches
            .iter()
            .filter(|w| w.bookmarks)
            .filter(|w| {
                w.tx.send(WatchMsg::Line(bookmark_line(&w.api_version, &w.kind, rv)))
                    .is_ok()
            })
            .count()
    }

    /// Authorises every later request with `policy`, as an API server with RBAC does
    /// for the user it names: a request no rule allows is answered `403 Forbidden` (a
    /// `Status` with reason `Forbidden`) and recorded as denied. Replaces any policy
    /// enforced before. Objects written through the Rust API are not affected.
    pub fn enforce(&self, policy: RbacPolicy) {
        self.lock().policy = Some(policy);
    }

    /// From now on, creates in a namespace that does not exist are refused with
    /// `404 NotFound` (`namespaces "<ns>" not found`), as a real API server refuses
    /// them. Off by default, so tests need not create every namespace they use.
    pub fn require_namespaces(&self) {
        self.lock().require_namespaces = true;
    }

    /// The enforced policy, if any.
    pub fn policy(&self) -> Option<RbacPolicy> {
        self.lock().policy.clone()
    }

    /// The requests the enforced policy refused, oldest first.
    pub fn denied_requests(&self) -> Vec<RecordedRequest> {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.denied)
            .cloned()
            .collect()
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.clone()
    }

    /// Requests for `K`'s collection: `(lists, watches)`.
    pub fn request_counts<K: Resource<DynamicType = ()>>(&self) -> (usize, usize) {
        let collection = collection_of::<K>();
        let state = self.lock();
        let mine = state
            .requests
            .iter()
            .filter(|r| path::collection_path(&r.path).is_some_and(|p| p.collection == collection));
        mine.fold(
            (0, 0),
            |(l, w), r| {
                if r.is_watch() { (l, w + 1) } else { (l + 1, w) }
            },
        )
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.end_watches();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl ApiState {
    /// Stores `value` under `key` in `collection` at a new resourceVersion (setting
    /// `uid` and `creationTimestamp` on create) and records the change.
    fn store(
        &mut self,
        collection: String,
        (api_version, kind): (String, String),
        key: (String, String),
        mut value: Value,
    ) -> u64 {
        self.rv += 1;
        let rv = self.rv;
        let entry = self.collections.entry(collection.clone()).or_default();
        entry.api_version = api_version;
        entry.kind = kind;
        let old = entry.objects.get(&key).cloned();
        let metadata = &mut value["metadata"];
        metadata["resourceVersion"] = json!(rv.to_string());
        if metadata.get("uid").is_none_or(Value::is_null) {
            let uid = old
                .as_ref()
                .and_then(|o| o["metadata"]["uid"].as_str().map(str::to_string))
                .unwrap_or_else(|| format!("uid-{rv}"));
            metadata["uid"] = json!(uid);
        }
        if metadata.get("creationTimestamp").is_none_or(Value::is_null) {
            let created = old
                .as_ref()
                .map(|o| o["metadata"]["creationTimestamp"].clone())
                .filter(|t| !t.is_null())
                .unwrap_or_else(|| json!(now_rfc3339()));
            metadata["creationTimestamp"] = created;
        }
        let namespace = key.0.clone();
        entry.objects.insert(key, value.clone());
        let kind = if old.is_some() {
            ChangeType::Modified
        } else {
            ChangeType::Added
        };
        self.record(Change {
            rv,
            collection,
            namespace,
            kind,
            old,
            new: value,
        });
        rv
    }

    /// Removes the object under `key` from `collection` at a new resourceVersion.
    fn remove(&mut self, collection: &str, key: (String, String)) -> Option<u64> {
        let old = self.collections.get_mut(collection)?.objects.remove(&key)?;
        self.rv += 1;
        let rv = self.rv;
        let mut last = old.clone();
        last["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.record(Change {
            rv,
            collection: collection.to_string(),
            namespace: key.0,
            kind: ChangeType::Deleted,
            old: Some(old),
            new: last,
        });
        Some(rv)
    }

    fn record(&mut self, change: Change) {
        let change = Arc::new(change);
        self.watches.retain(|w| match w.event_for(&change) {
            Some(line) => w.tx.send(WatchMsg::Line(line)).is_ok(),
            None => !w.tx.is_closed(),
        });
        self.history.push_back(change);
    }
}

impl WatchSub {
    fn sees(&self, change: &Change) -> bool {
        change.collection == self.collection
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == change.namespace)
    }

    /// The line this watch gets for a change, if any (selector transitions turn into
    /// ADDED / DELETED, as the API server's watch cache does).
    fn event_for(&self, change: &Change) -> Option<Bytes> {
        if !self.sees(change) {
            return None;
        }
        let was = change
            .old
            .as_ref()
            .is_some_and(|o| self.selector.matches(o));
        let is = self.selector.matches(&change.new);
        let (kind, object) = match (change.kind, was, is) {
            (ChangeType::Deleted, true, _) => ("DELETED", change.new.clone()),
            (ChangeType::Deleted, false, _) => return None,
            (_, true, true) => ("MODIFIED", change.new.clone()),
            (_, false, true) => ("ADDED", change.new.clone()),
            (_, true, false) => {
                let mut last = change.old.clone().expect("was matching, so existed");
                last["metadata"]["resourceVersion"] = json!(change.rv.to_string());
                ("DELETED", last)
            }
            (_, false, false) => return None,
        };
        Some(self.line(kind, &object))
    }

    /// The event line for `object`, shown in this watch's version for a custom
    /// resource.
    fn line(&self, kind: &str, object: &Value) -> Bytes {
        match &self.custom {
            Some(view) => event_line(kind, &view.present(object)),
            None => event_line(kind, object),
        }
    }
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({ "type": kind, "object": object }))
        .expect("JSON values serialise");
    line.push(b'\n');
    Bytes::from(line)
}

fn bookmark_line(api_version: &str, kind: &str, rv: u64) -> Bytes {
    event_line(
        "BOOKMARK",
        &json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": { "resourceVersion": rv.to_string() },
        }),
    )
}

fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

//! The xDS protocol state of one connection, as plain data: what the proxy watches per
//! type, what was sent and acknowledged, and what each request asks the server to do.
//! No IO here; the stream shell feeds requests in and sends what this decides.
//!
//! State of the world (Istio's rules):
//! - a request with `error_detail` is a NACK: recorded, never answered;
//! - empty names on a non-wildcard type (EDS, RDS) unsubscribe;
//! - the first request for a type, or one with an empty nonce, gets the full state;
//! - a nonce other than the last one sent is stale and ignored;
//! - an ACK replaces the names; wildcard types answer any change of names, others only
//!   answer when names were added.
//!
//! Delta: subscriptions are changed by every request (even one with an old nonce, since
//! a dropped change would never be repeated); `*` toggles wildcard; an initial request
//! with no names on CDS/LDS is a wildcard; only new subscriptions are answered; the
//! server remembers what the client holds (name -> version) and sends differences.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::SystemTime;

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use serde::Serialize;

use super::intern::{Interner, Recent};
use crate::xds::wire::SotwRequest;
use crate::xds::{Resource, TypeUrl};

/// What a Delta client holds of one type: name -> content version.
pub type HeldMap = BTreeMap<String, Arc<str>>;

static NAME_SETS: LazyLock<Interner<BTreeSet<String>>> = LazyLock::new(Interner::default);
static HELD_MAPS: LazyLock<Interner<HeldMap>> = LazyLock::new(Interner::default);

/// Applies a change (names removed, resources sent) to a shared held map. Every
/// proxy holding the same map gets the same change on an incremental push, so the new
/// map is derived once and shared.
fn update_held(held: &mut Arc<HeldMap>, removed: &BTreeSet<String>, sent: &[Resource]) {
    let mut h = foldhash::fast::FixedState::default().build_hasher();
    removed.hash(&mut h);
    for r in sent {
        (&*r.name, &*r.version).hash(&mut h);
    }
    *held = HELD_MAPS.derive(held, h.finish(), |held| {
        let mut held = held.clone();
        for name in removed {
            held.remove(name);
        }
        for r in sent {
            held.insert(r.name.to_string(), r.version.clone());
        }
        held
    });
}

/// One Delta difference, kept with its inputs (held, so their addresses cannot be
/// reused while it stands).
struct Diff {
    type_url: TypeUrl,
    partial: bool,
    held: Arc<HeldMap>,
    names: Arc<BTreeSet<String>>,
    current: Vec<Resource>,
    changed: Vec<Resource>,
    removed: Vec<String>,
    held_after: Arc<HeldMap>,
}

/// The last Delta differences, by a digest of the identity of their inputs, newest
/// last. Connections of one shape hold the same interned map and names and get the
/// very same resources in a push (every ztunnel gets every Address: 11,000 of them
/// with 10,000 pods), so the difference (a map look-up and a version comparison per
/// resource) is computed once per push, not once per connection.
static DIFFS: LazyLock<Mutex<DiffMemo>> = LazyLock::new(Mutex::default);

type DiffMemo = std::collections::VecDeque<(u64, Arc<Diff>)>;

/// How many differences [`DIFFS`] keeps: one per distinct shape in a push.
const DIFFS_KEPT: usize = 16;

fn diff_digest(
    type_url: TypeUrl,
    partial: bool,
    held: &Arc<HeldMap>,
    names: &Arc<BTreeSet<String>>,
    current: &[Resource],
) -> u64 {
    let mut h = foldhash::fast::FixedState::default().build_hasher();
    h.write_usize(type_url.index());
    h.write_u8(u8::from(partial));
    h.write_usize(if held.is_empty() {
        0
    } else {
        Arc::as_ptr(held) as usize
    });
    h.write_usize(if names.is_empty() {
        0
    } else {
        Arc::as_ptr(names) as usize
    });
    hash_identities(&mut h, current);
    h.finish()
}

/// Hashes `resources` by identity (their addresses), in order.
pub(super) fn hash_identities(h: &mut impl Hasher, resources: &[Resource]) {
    for r in resources {
        h.write_usize(Arc::as_ptr(r) as usize);
    }
}

/// Whether `a` and `b` are the very same resources, in order.
pub(super) fn same_resources(a: &[Resource], b: &[Resource]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}

fn remembered_diff(
    digest: u64,
    type_url: TypeUrl,
    partial: bool,
    held: &Arc<HeldMap>,
    names: &Arc<BTreeSet<String>>,
    current: &[Resource],
) -> Option<Arc<Diff>> {
    let kept = DIFFS.lock().expect("diff memo poisoned");
    kept.iter()
        .rev()
        .find(|(d, diff)| {
            *d == digest
                && diff.type_url == type_url
                && diff.partial == partial
                // Empty maps and sets are equal whatever their address (a new
                // connection's are its own).
                && (Arc::ptr_eq(&diff.held, held) || diff.held.is_empty() && held.is_empty())
                && (Arc::ptr_eq(&diff.names, names) || diff.names.is_empty() && names.is_empty())
                && same_resources(&diff.current, current)
        })
        .map(|(_, diff)| diff.clone())
}

#[cfg(test)]
thread_local! {
    /// Delta differences computed (not found in [`DIFFS`]) on this thread.
    static DIFFS_COMPUTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn remember_diff(digest: u64, diff: Diff) {
    #[cfg(test)]
    DIFFS_COMPUTED.with(|n| n.set(n.get() + 1));
    let mut kept = DIFFS.lock().expect("diff memo poisoned");
    kept.push_back((digest, Arc::new(diff)));
    while kept.len() > DIFFS_KEPT {
        kept.pop_front();
    }
}

fn shared_names(names: BTreeSet<String>) -> Arc<BTreeSet<String>> {
    NAME_SETS.intern(names)
}

/// The last name lists that set a subscription, by digest, with the shared set each
/// gave. Every sidecar of one shape subscribes to the same thousands of EDS names in
/// the same order: a list seen before is recognised by one comparison of its encoded
/// bytes, not decoded, collected and interned again per connection. Each entry keeps
/// a copy of the list's bytes and its set alive; the lists are also what requests are
/// decoded against first (`xds::wire::recall`), so that a repeated list is neither
/// walked nor hashed again.
type NameListEntry = (crate::xds::wire::ResourceNames, Arc<BTreeSet<String>>);
static RECENT_NAME_LISTS: LazyLock<Mutex<Recent<NameListEntry>>> =
    LazyLock::new(|| Mutex::new(Recent::new(16)));

/// The shared set of `requested` (whose digest is `digest`).
fn names_of_request(
    requested: &crate::xds::wire::ResourceNames,
    digest: u64,
) -> Arc<BTreeSet<String>> {
    if let Some((_, names)) = RECENT_NAME_LISTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .find(digest, |(list, _)| list.same_as(requested))
    {
        return names.clone();
    }
    let names = shared_names(
        requested
            .iter()
            .map(|n| String::from_utf8_lossy(&n).into_owned())
            .collect(),
    );
    let mut recent = RECENT_NAME_LISTS.lock().unwrap_or_else(|e| e.into_inner());
    recent.insert(digest, (requested.kept(), names.clone()));
    crate::xds::wire::recall(
        recent
            .newest_first()
            .map(|(list, _)| list.clone())
            .collect(),
    );
    names
}

/// The last full responses' held maps, by a digest of the identity of their
/// resources (see [`held_after`]). Each entry keeps its resources alive, so their
/// addresses cannot be reused while it stands. A push sends one full response per
/// distinct config (namespaces, Sidecar scopes), the rest are repeats.
type FullResponseEntry = (Vec<Resource>, Arc<HeldMap>);
static FULL_RESPONSES: LazyLock<Mutex<Recent<FullResponseEntry>>> =
    LazyLock::new(|| Mutex::new(Recent::new(32)));

/// The shared held map of a client that accepts exactly `resources`. The same
/// response goes to every proxy of one shape (2,000 sidecars of one mesh get the very
/// same 2,000 load assignments), so the map is built and interned once per distinct
/// response, found again by the identity of the resources: not rebuilt (thousands of
/// names copied, hashed and compared with the interned copy) per connection. A
/// response unique to its proxy (clusters that include its own inbound ones) costs one
/// digest of its pointers more than building the map.
fn held_after(resources: &[Resource]) -> Arc<HeldMap> {
    let mut h = foldhash::fast::FixedState::default().build_hasher();
    hash_identities(&mut h, resources);
    let digest = h.finish();
    if let Some((_, held)) = FULL_RESPONSES
        .lock()
        .expect("held memo poisoned")
        .find(digest, |(r, _)| same_resources(r, resources))
    {
        return held.clone();
    }
    let held = HELD_MAPS.intern(
        resources
            .iter()
            .map(|r| (r.name.to_string(), r.version.clone()))
            .collect(),
    );
    FULL_RESPONSES
        .lock()
        .expect("held memo poisoned")
        .insert(digest, (resources.to_vec(), held.clone()));
    held
}

/// What a connection watches for one type and where the conversation stands.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Watch {
    /// Explicitly subscribed names, shared with every connection subscribed to the
    /// same set (see [`super::intern`]).
    pub names: Arc<BTreeSet<String>>,
    /// State of the world: a digest of the names as last requested, in order, so
    /// an ACK that repeats them is recognised without reading them.
    #[serde(skip)]
    pub names_digest: u64,
    /// Subscribed to everything of the type.
    pub wildcard: bool,
    /// Nonce of the last response sent.
    pub nonce_sent: Option<Arc<str>>,
    /// Version of the last response sent.
    pub version_sent: Option<Arc<str>>,
    /// When the last response was sent.
    pub last_sent: Option<SystemTime>,
    /// Nonce of the last response the proxy accepted.
    pub nonce_acked: Option<Arc<str>>,
    /// Version the proxy last accepted.
    pub version_acked: Option<Arc<str>>,
    /// The last rejection (serialized as `last_error` and `nonce_nacked`).
    #[serde(flatten)]
    rejection: Rejection,
    /// What the proxy holds, name -> content version, shared with every connection
    /// holding the same (see [`super::intern`]). Delta sends differences from it;
    /// state of the world skips a push that would resend exactly it.
    #[serde(skip)]
    pub held: Arc<HeldMap>,
}

/// A watch's last rejection, boxed: most watches never see one, and every
/// connection holds four or five watches (four words less each: a sidecar's four fit
/// in 512 bytes, not 640).
#[derive(Clone, Debug, Default)]
struct Rejection(Option<Box<Rejected>>);

#[derive(Clone, Debug, Default)]
struct Rejected {
    /// Error of the last rejected response, cleared by the next ACK.
    error: Option<String>,
    /// Nonce of the last rejected response.
    nonce: Option<Arc<str>>,
}

impl Serialize for Rejection {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let rejected = self.0.as_deref();
        let mut out = s.serialize_struct("Rejection", 2)?;
        out.serialize_field("last_error", &rejected.and_then(|r| r.error.as_deref()))?;
        out.serialize_field("nonce_nacked", &rejected.and_then(|r| r.nonce.as_deref()))?;
        out.end()
    }
}

impl Watch {
    /// Error of the last rejected response, cleared by the next ACK.
    pub fn last_error(&self) -> Option<&str> {
        self.rejection.0.as_ref().and_then(|r| r.error.as_deref())
    }

    /// Nonce of the last rejected response.
    pub fn nonce_nacked(&self) -> Option<&Arc<str>> {
        self.rejection.0.as_ref().and_then(|r| r.nonce.as_ref())
    }

    /// Records a rejection of the response sent with `nonce`.
    fn rejected(&mut self, error: String, nonce: &str) {
        let nonce = self.shared_nonce(nonce);
        let r = self.rejection.0.get_or_insert_with(Box::default);
        r.error = Some(error);
        r.nonce = Some(nonce);
    }

    /// An ACK clears the last error (not the rejected nonce).
    fn clear_error(&mut self) {
        if let Some(r) = &mut self.rejection.0 {
            r.error = None;
        }
    }

    /// `nonce` as held: the very string of the last response sent when it is that
    /// one (an idle connection's watches then hold one copy of each nonce, not three).
    fn shared_nonce(&self, nonce: &str) -> Arc<str> {
        match &self.nonce_sent {
            Some(sent) if **sent == *nonce => sent.clone(),
            _ => Arc::from(nonce),
        }
    }

    /// The last response sent was acknowledged.
    pub fn acked(&self) -> bool {
        self.nonce_sent.is_some() && self.nonce_sent == self.nonce_acked
    }

    /// The last response sent was rejected.
    pub fn nacked(&self) -> bool {
        self.nonce_sent.is_some() && self.nonce_sent.as_ref() == self.nonce_nacked()
    }
}

/// Longest NACK detail kept per watch (for the log and debug output): a proxy's
/// `error_detail` can be a megabyte of its own config.
pub const MAX_ERROR_DETAIL: usize = 4096;

fn stored_error(message: &str) -> String {
    crate::logging::clip(message, MAX_ERROR_DETAIL).into_owned()
}

/// What to do with a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Send the full subscribed state of this type.
    Respond(TypeUrl),
    /// Accepted; nothing to send.
    Ack(TypeUrl),
    /// Rejected by the proxy with this error; nothing to send.
    Nack(TypeUrl, String),
    /// Answers an older response; ignored.
    Stale(TypeUrl),
    /// The type is no longer watched.
    Unsubscribed(TypeUrl),
    /// A type this server does not serve.
    UnknownType(String),
    /// A workload's health report ([`HEALTH_TYPE_URL`]): the error of its failed
    /// probe, or `None` when healthy. Not a subscription; never answered.
    Health(Option<String>),
}

/// The type URL of the health reports an istio-agent sends on its ADS stream when its
/// readiness probe changes (Istio's `HealthInfoType`).
pub const HEALTH_TYPE_URL: &str = "istio.io/health";

/// A map keyed by [`TypeUrl`], as small as what it holds: a connection watches four or
/// five types, and a `BTreeMap` would give each connection a node of eleven `Watch`es
/// (~2 KB).
#[derive(Debug, Clone)]
pub struct TypeMap<V>(Vec<(TypeUrl, V)>);

impl<V> Default for TypeMap<V> {
    fn default() -> Self {
        TypeMap(Vec::new())
    }
}

impl<V> TypeMap<V> {
    fn position(&self, t: TypeUrl) -> Result<usize, usize> {
        self.0.binary_search_by_key(&t, |(k, _)| *k)
    }

    /// The value of `t`.
    pub fn get(&self, t: &TypeUrl) -> Option<&V> {
        self.position(*t).ok().map(|i| &self.0[i].1)
    }

    /// The value of `t`, to change.
    pub fn get_mut(&mut self, t: &TypeUrl) -> Option<&mut V> {
        self.position(*t).ok().map(|i| &mut self.0[i].1)
    }

    /// Whether `t` has a value.
    pub fn contains_key(&self, t: &TypeUrl) -> bool {
        self.position(*t).is_ok()
    }

    /// Sets the value of `t`.
    pub fn insert(&mut self, t: TypeUrl, value: V) {
        match self.position(t) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => self.0.insert(i, (t, value)),
        }
    }

    /// Removes the value of `t`.
    pub fn remove(&mut self, t: &TypeUrl) -> Option<V> {
        self.position(*t).ok().map(|i| self.0.remove(i).1)
    }

    /// The entries, in [`TypeUrl`] order.
    pub fn iter(&self) -> impl Iterator<Item = (&TypeUrl, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl<V: Default> TypeMap<V> {
    /// The value of `t`, made default first if it has none.
    pub fn get_or_default(&mut self, t: TypeUrl) -> &mut V {
        let i = match self.position(t) {
            Ok(i) => i,
            Err(i) => {
                self.0.insert(i, (t, V::default()));
                i
            }
        };
        &mut self.0[i].1
    }
}

impl<V: Serialize> Serialize for TypeMap<V> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

/// The protocol state of one connection (either flavour).
#[derive(Debug, Default, Serialize)]
pub struct ConnectionState {
    /// Watches by type.
    pub watches: TypeMap<Watch>,
    /// Responses sent so far (for nonces).
    pub responses: u64,
}

impl ConnectionState {
    /// Applies a state-of-the-world request.
    pub fn on_sotw_request(&mut self, req: &SotwRequest) -> Action {
        if req.type_url == HEALTH_TYPE_URL {
            return Action::Health(req.error_detail.as_ref().map(|s| s.message.clone()));
        }
        let Some(type_url) = TypeUrl::parse(&req.type_url) else {
            return Action::UnknownType(req.type_url.clone());
        };
        if let Some(status) = &req.error_detail {
            let watch = self.watches.get_or_default(type_url);
            watch.rejected(stored_error(&status.message), &req.response_nonce);
            return Action::Nack(type_url, stored_error(&status.message));
        }
        let requested = &req.resource_names;
        if requested.is_empty() && !type_url.is_wildcard() {
            // Nothing asked: the watch (if any) goes.
            self.watches.remove(&type_url);
            return Action::Unsubscribed(type_url);
        }
        let digest = requested.digest();
        let collect = || names_of_request(requested, digest);
        let Some(watch) = self.watches.get_mut(&type_url) else {
            self.watches.insert(
                type_url,
                Watch {
                    names: collect(),
                    names_digest: digest,
                    wildcard: requested.is_empty(),
                    ..Default::default()
                },
            );
            return Action::Respond(type_url);
        };
        if req.response_nonce.is_empty() {
            watch.wildcard = requested.is_empty();
            watch.names = collect();
            watch.names_digest = digest;
            return Action::Respond(type_url);
        }
        if watch.nonce_sent.as_deref() != Some(req.response_nonce.as_str()) {
            return Action::Stale(type_url);
        }
        watch.nonce_acked = watch.nonce_sent.clone();
        watch.version_acked = Some(match &watch.version_sent {
            Some(sent) if **sent == *req.version_info => sent.clone(),
            _ => Arc::from(req.version_info.as_str()),
        });
        watch.clear_error();
        // The common ACK repeats the same names in the same order (an EDS ACK of a
        // large mesh carries thousands): the digest says so without a lookup.
        let (added, changed) = if digest == watch.names_digest {
            (false, false)
        } else {
            let names = collect();
            let added = names.iter().any(|n| !watch.names.contains(n));
            let changed = added || names.len() != watch.names.len();
            if changed {
                watch.names = names;
            }
            watch.names_digest = digest;
            (added, changed)
        };
        watch.wildcard = type_url.is_wildcard() && requested.is_empty();
        if (type_url.is_wildcard() && changed) || added {
            Action::Respond(type_url)
        } else {
            Action::Ack(type_url)
        }
    }

    /// Applies a Delta request.
    pub fn on_delta_request(&mut self, req: &DeltaDiscoveryRequest) -> Action {
        if req.type_url == HEALTH_TYPE_URL {
            return Action::Health(req.error_detail.as_ref().map(|s| s.message.clone()));
        }
        let Some(type_url) = TypeUrl::parse(&req.type_url) else {
            return Action::UnknownType(req.type_url.clone());
        };
        if let Some(status) = &req.error_detail {
            let watch = self.watches.get_or_default(type_url);
            watch.rejected(stored_error(&status.message), &req.response_nonce);
            return Action::Nack(type_url, stored_error(&status.message));
        }
        let first = !self.watches.contains_key(&type_url);
        let watch = self.watches.get_or_default(type_url);
        let mut added = false;
        let mut names: Option<BTreeSet<String>> = None;
        let mut held: Option<HeldMap> = None;
        let bulk = watch.names.is_empty() && !req.resource_names_subscribe.is_empty();
        if bulk {
            // A new subscription (a sidecar resuming after a reconnect names thousands):
            // built in one go from the sorted names, not name by name.
            let fresh: BTreeSet<String> = req
                .resource_names_subscribe
                .iter()
                .filter(|n| *n != "*")
                .cloned()
                .collect();
            added |= !fresh.is_empty();
            if !fresh.is_empty() {
                names = Some(fresh);
            }
        }
        for name in &req.resource_names_subscribe {
            if name == "*" {
                added |= !watch.wildcard;
                watch.wildcard = true;
            } else if !bulk && !watch.names.contains(name) {
                added = true;
                names
                    .get_or_insert_with(|| (*watch.names).clone())
                    .insert(name.clone());
            }
        }
        for name in &req.resource_names_unsubscribe {
            if name == "*" {
                watch.wildcard = false;
                continue;
            }
            let names = names.get_or_insert_with(|| (*watch.names).clone());
            names.remove(name);
            if watch.held.contains_key(name) {
                held.get_or_insert_with(|| (*watch.held).clone())
                    .remove(name);
            }
        }
        if let Some(names) = names {
            watch.names = shared_names(names);
        }
        if let Some(held) = held {
            watch.held = HELD_MAPS.intern(held);
        }
        if first {
            if req.resource_names_subscribe.is_empty() && type_url.is_wildcard() {
                watch.wildcard = true;
            }
            watch.held = HELD_MAPS.intern(
                req.initial_resource_versions
                    .iter()
                    .map(|(k, v)| (k.clone(), Arc::from(v.as_str())))
                    .collect(),
            );
            return Action::Respond(type_url);
        }
        if !req.response_nonce.is_empty() {
            if watch.nonce_sent.as_deref() == Some(req.response_nonce.as_str()) {
                watch.nonce_acked = watch.nonce_sent.clone();
                watch.version_acked = watch.version_sent.clone();
                watch.clear_error();
            } else if !added {
                return Action::Stale(type_url);
            }
        }
        if added {
            Action::Respond(type_url)
        } else {
            Action::Ack(type_url)
        }
    }

    /// The subscription of a type, if watched.
    pub fn watch(&self, type_url: TypeUrl) -> Option<&Watch> {
        self.watches.get(&type_url)
    }

    /// Records a response and returns its nonce: the version and a number unique for
    /// the server's lifetime (Istio: the version and a random UUID). The version is
    /// the snapshot's own string, shared by every connection sent it, and the nonce
    /// stays short: an idle connection holds both for each type it watches.
    pub fn record_sent(&mut self, type_url: TypeUrl, version: &Arc<str>) -> String {
        static SENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        self.responses += 1;
        let n = SENT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let nonce = format!("{version}/{n}");
        let watch = self.watches.get_or_default(type_url);
        watch.nonce_sent = Some(Arc::from(nonce.as_str()));
        watch.version_sent = Some(version.clone());
        watch.last_sent = Some(SystemTime::now());
        nonce
    }

    /// State of the world: whether a push of `resources` would repeat exactly what
    /// the proxy holds (same names, same content versions) and can be skipped. A
    /// direct answer to a request (`always`) is never skipped. When the response will
    /// be sent, records what the proxy then holds: all of `resources`, or for a
    /// partial (incremental EDS) response, those on top of what it held.
    pub fn sotw_unchanged(
        &mut self,
        type_url: TypeUrl,
        resources: &[Resource],
        partial: bool,
        always: bool,
    ) -> bool {
        let Some(watch) = self.watches.get_mut(&type_url) else {
            return false;
        };
        let holds = |held: &HeldMap, r: &Resource| held.get(&*r.name) == Some(&r.version);
        if partial {
            if !resources.iter().all(|r| holds(&watch.held, r)) {
                update_held(&mut watch.held, &BTreeSet::new(), resources);
            }
            return false;
        }
        // Held maps are interned (all but the initial empty one): equal content is the
        // same map.
        let after = held_after(resources);
        if Arc::ptr_eq(&watch.held, &after) || (watch.held.is_empty() && after.is_empty()) {
            return !always;
        }
        watch.held = after;
        false
    }

    /// Works out a Delta response from the full set of subscribed resources that
    /// exist now (`current`), or from a partial set when `partial` (incremental EDS:
    /// nothing is removed). Returns what to send and what to remove, and records
    /// both as held by the client.
    pub fn delta_diff(
        &mut self,
        type_url: TypeUrl,
        current: &[Resource],
        partial: bool,
    ) -> (Vec<Resource>, Vec<String>) {
        let Some(watch) = self.watches.get_mut(&type_url) else {
            return (Vec::new(), Vec::new());
        };
        let digest = diff_digest(type_url, partial, &watch.held, &watch.names, current);
        if let Some(diff) = remembered_diff(
            digest,
            type_url,
            partial,
            &watch.held,
            &watch.names,
            current,
        ) {
            watch.held = diff.held_after.clone();
            return (diff.changed.clone(), diff.removed.clone());
        }
        let (held_before, names, all) = (watch.held.clone(), watch.names.clone(), current.to_vec());
        // Placeholders stand for resources that do not exist: in Delta they are removals.
        let (gone, current): (Vec<Resource>, Vec<Resource>) =
            current.iter().cloned().partition(|r| r.placeholder);
        let mut removed: BTreeSet<String> = gone
            .iter()
            .filter(|r| watch.held.contains_key(&*r.name) || watch.names.contains(&*r.name))
            .map(|r| r.name.to_string())
            .collect();
        if !partial && type_url.sends_removals() {
            let present: BTreeSet<&str> = current.iter().map(|r| &*r.name).collect();
            // Names the client holds, or asked for by name, that no longer exist.
            for name in watch.held.keys().chain(watch.names.iter()) {
                if !present.contains(name.as_str()) {
                    removed.insert(name.clone());
                }
            }
        }
        let changed: Vec<Resource> = current
            .into_iter()
            .filter(|r| watch.held.get(&*r.name).is_none_or(|v| *v != r.version))
            .collect();
        if !removed.is_empty() || !changed.is_empty() {
            update_held(&mut watch.held, &removed, &changed);
        }
        let removed: Vec<String> = removed.into_iter().collect();
        remember_diff(
            digest,
            Diff {
                type_url,
                partial,
                held: held_before,
                names,
                current: all,
                changed: changed.clone(),
                removed: removed.clone(),
                held_after: watch.held.clone(),
            },
        );
        (changed, removed)
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    use envoy_types::pb::google::rpc::Status;

    use super::*;
    use crate::xds::EncodedResource;

    const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

    fn req(type_url: &str, names: &[&str], version: &str, nonce: &str) -> SotwRequest {
        SotwRequest::from(DiscoveryRequest {
            type_url: type_url.into(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            version_info: version.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        })
    }

    fn sent(state: &mut ConnectionState, t: TypeUrl) -> String {
        state.record_sent(t, &Arc::from("v1"))
    }

    #[test]
    fn health_reports_are_not_subscriptions() {
        let mut s = ConnectionState::default();
        let mut unhealthy = req(HEALTH_TYPE_URL, &[], "", "");
        unhealthy.error_detail = Some(Status {
            code: 13,
            message: "probe failed".into(),
            details: vec![],
        });
        assert!(matches!(
            s.on_sotw_request(&req(HEALTH_TYPE_URL, &[], "", "")),
            Action::Health(None)
        ));
        assert!(matches!(
            s.on_sotw_request(&unhealthy),
            Action::Health(Some(m)) if m == "probe failed"
        ));
        let delta = DeltaDiscoveryRequest {
            type_url: HEALTH_TYPE_URL.into(),
            ..Default::default()
        };
        assert!(matches!(s.on_delta_request(&delta), Action::Health(None)));
        assert!(TypeUrl::ALL.iter().all(|t| s.watch(*t).is_none()));
    }

    #[test]
    fn the_list_that_set_a_subscription_is_what_its_acks_are_read_as() {
        use prost::Message;
        let names: Vec<String> = (0..200)
            .map(|i| format!("outbound|80||conn-recall{i}.ns"))
            .collect();
        let wire = bytes::Bytes::from(
            DiscoveryRequest {
                type_url: EDS.into(),
                resource_names: names.clone(),
                ..Default::default()
            }
            .encode_to_vec(),
        );
        let in_wire = |name: &[u8]| {
            let start = wire.as_ptr() as usize;
            (start..start + wire.len()).contains(&(name.as_ptr() as usize))
        };
        let mut s = ConnectionState::default();
        let first = SotwRequest::decode(wire.clone()).unwrap();
        assert!(in_wire(&first.resource_names.iter().next().unwrap()));
        assert!(matches!(
            s.on_sotw_request(&first),
            Action::Respond(TypeUrl::Endpoint)
        ));
        let nonce = sent(&mut s, TypeUrl::Endpoint);
        // The ACK repeats the names: they are read as the list kept when the
        // subscription was set, not from the ACK's own bytes, and change nothing.
        let mut ack = DiscoveryRequest::decode(wire.clone()).unwrap();
        ack.version_info = "v1".into();
        ack.response_nonce = nonce;
        let ack = SotwRequest::decode(bytes::Bytes::from(ack.encode_to_vec())).unwrap();
        let read: Vec<String> = ack
            .resource_names
            .iter()
            .map(|n| String::from_utf8(n.into_owned()).unwrap())
            .collect();
        assert_eq!(read, names);
        assert!(!in_wire(&ack.resource_names.iter().next().unwrap()));
        assert!(matches!(
            s.on_sotw_request(&ack),
            Action::Ack(TypeUrl::Endpoint)
        ));
        assert_eq!(s.watch(TypeUrl::Endpoint).unwrap().names.len(), 200);
    }

    #[test]
    fn a_push_that_repeats_the_last_full_response_is_skipped() {
        let mut s = ConnectionState::default();
        s.on_sotw_request(&req(EDS, &["a", "b"], "", ""));
        let a1 = EncodedResource::encode(TypeUrl::Endpoint, "a", &"1".to_string());
        let b1 = EncodedResource::encode(TypeUrl::Endpoint, "b", &"1".to_string());
        let a2 = EncodedResource::encode(TypeUrl::Endpoint, "a", &"2".to_string());
        let full = vec![a1.clone(), b1.clone()];
        let t = TypeUrl::Endpoint;
        // The first answer is sent and remembered; the same push is then skipped...
        assert!(!s.sotw_unchanged(t, &full, false, true));
        assert!(s.sotw_unchanged(t, &full, false, false));
        // ...but never a direct answer to a request.
        assert!(!s.sotw_unchanged(t, &full, false, true));
        // Changed content is sent.
        let changed = vec![a2.clone(), b1.clone()];
        assert!(!s.sotw_unchanged(t, &changed, false, false));
        assert!(s.sotw_unchanged(t, &changed, false, false));
        // After a partial response that changes what the proxy holds, the full
        // set differs again.
        assert!(!s.sotw_unchanged(t, std::slice::from_ref(&a1), true, false));
        assert!(!s.sotw_unchanged(t, &changed, false, false));
        // A partial response is added to what the proxy holds: a full push of
        // exactly that is then skipped.
        assert!(!s.sotw_unchanged(t, std::slice::from_ref(&a2), true, false));
        assert!(s.sotw_unchanged(t, &changed, false, false));
        // A name dropped from the subscription makes the full set differ.
        assert!(!s.sotw_unchanged(t, std::slice::from_ref(&b1), false, false));
        assert!(s.sotw_unchanged(t, std::slice::from_ref(&b1), false, false));
        // An unwatched type never counts as unchanged.
        assert!(!s.sotw_unchanged(TypeUrl::Route, &[], false, false));
    }

    #[test]
    fn connections_asking_for_the_same_names_share_one_set() {
        let names = |s: &ConnectionState| s.watch(TypeUrl::Endpoint).unwrap().names.clone();
        let (mut x, mut y, mut z) = (
            ConnectionState::default(),
            ConnectionState::default(),
            ConnectionState::default(),
        );
        x.on_sotw_request(&req(EDS, &["shared-b", "shared-a"], "", ""));
        y.on_sotw_request(&req(EDS, &["shared-b", "shared-a"], "", ""));
        assert!(Arc::ptr_eq(&names(&x), &names(&y)));
        assert_eq!(
            names(&x).iter().map(String::as_str).collect::<Vec<_>>(),
            ["shared-a", "shared-b"]
        );
        // Another order is another list: the same set once collected and interned.
        z.on_sotw_request(&req(EDS, &["shared-a", "shared-b"], "", ""));
        assert!(Arc::ptr_eq(&names(&x), &names(&z)));
        // Other names are never taken for a remembered list.
        z.on_sotw_request(&req(EDS, &["shared-a", "shared-c"], "", ""));
        assert_eq!(
            names(&z).iter().map(String::as_str).collect::<Vec<_>>(),
            ["shared-a", "shared-c"]
        );
        assert_eq!(names(&x).len(), 2);
        assert!(names(&x).contains("shared-b"));
    }

    #[test]
    fn connections_sent_the_same_full_response_share_one_held_map() {
        let t = TypeUrl::Endpoint;
        let a1 = EncodedResource::encode(t, "held-a", &"1".to_string());
        let b1 = EncodedResource::encode(t, "held-b", &"1".to_string());
        let full = vec![a1.clone(), b1.clone()];
        let (mut x, mut y) = (ConnectionState::default(), ConnectionState::default());
        for s in [&mut x, &mut y] {
            s.on_sotw_request(&req(EDS, &["held-a", "held-b"], "", ""));
            assert!(!s.sotw_unchanged(t, &full, false, false));
        }
        let held = |s: &ConnectionState| s.watch(t).unwrap().held.clone();
        assert!(Arc::ptr_eq(&held(&x), &held(&y)));
        assert_eq!(held(&x).len(), 2);
        // Equal content in other allocations is the same held map too, so the
        // repeat is recognised.
        let again = vec![
            EncodedResource::encode(t, "held-a", &"1".to_string()),
            EncodedResource::encode(t, "held-b", &"1".to_string()),
        ];
        assert!(x.sotw_unchanged(t, &again, false, false));
        // Changed content is not.
        let changed = vec![a1, EncodedResource::encode(t, "held-b", &"2".to_string())];
        assert!(!y.sotw_unchanged(t, &changed, false, false));
        assert!(!Arc::ptr_eq(&held(&x), &held(&y)));
    }

    #[test]
    fn the_names_digest_tells_lists_apart() {
        let d = |names: &[&str]| req(EDS, names, "", "").resource_names.digest();
        let base = d(&["outbound|80||a.ns.svc.cluster.local", "b"]);
        assert_eq!(base, d(&["outbound|80||a.ns.svc.cluster.local", "b"]));
        for other in [
            d(&["outbound|80||a.ns.svc.cluster.local"]),
            d(&["b", "outbound|80||a.ns.svc.cluster.local"]),
            d(&["outbound|80||a.ns.svc.cluster.locaL", "b"]),
            d(&["outbound|80||a.ns.svc.cluster.local", "b", ""]),
            d(&["outbound|80||a.ns.svc.cluster.localb"]),
            d(&[]),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn connections_with_equal_subscriptions_share_one_copy() {
        let (mut a, mut b) = (ConnectionState::default(), ConnectionState::default());
        a.on_sotw_request(&req(EDS, &["share-x", "share-y"], "", ""));
        b.on_sotw_request(&req(EDS, &["share-y", "share-x", "share-x"], "", ""));
        let names = |s: &ConnectionState| s.watch(TypeUrl::Endpoint).unwrap().names.clone();
        assert!(Arc::ptr_eq(&names(&a), &names(&b)));

        // Delta: what each client holds after the same response is one map.
        let resources = vec![EncodedResource::encode(
            TypeUrl::Cluster,
            "share-c",
            &"1".to_string(),
        )];
        let (mut a, mut b) = (ConnectionState::default(), ConnectionState::default());
        for s in [&mut a, &mut b] {
            s.on_delta_request(&DeltaDiscoveryRequest {
                type_url: CDS.into(),
                ..Default::default()
            });
            let (changed, _) = s.delta_diff(TypeUrl::Cluster, &resources.clone(), false);
            assert_eq!(changed.len(), 1);
        }
        let held = |s: &ConnectionState| s.watch(TypeUrl::Cluster).unwrap().held.clone();
        assert!(Arc::ptr_eq(&held(&a), &held(&b)));
        assert_eq!(held(&a).len(), 1);
    }

    #[test]
    fn connections_of_one_shape_share_one_difference_per_push() {
        let first: Vec<Resource> = (0..50).map(|i| res(&format!("w{i}"), "1")).collect();
        let mut second = first.clone();
        second[7] = res("w7", "2");
        second.pop();
        let computed = || DIFFS_COMPUTED.with(|n| n.get());
        let mut states: Vec<ConnectionState> = (0..5).map(|_| ConnectionState::default()).collect();
        for s in &mut states {
            s.on_delta_request(&DeltaDiscoveryRequest {
                type_url: CDS.into(),
                ..Default::default()
            });
        }
        let start = computed();
        for s in &mut states {
            let (changed, removed) = s.delta_diff(TypeUrl::Cluster, &first.clone(), false);
            assert_eq!((changed.len(), removed.len()), (50, 0));
        }
        assert_eq!(
            computed() - start,
            1,
            "the first push: one difference for all"
        );
        for s in &mut states {
            let (changed, removed) = s.delta_diff(TypeUrl::Cluster, &second.clone(), false);
            assert_eq!(changed.len(), 1);
            assert!(Arc::ptr_eq(&changed[0], &second[7]));
            assert_eq!(removed, vec!["w49".to_string()]);
        }
        assert_eq!(computed() - start, 2, "the second push: one more");
        let held = |s: &ConnectionState| s.watch(TypeUrl::Cluster).unwrap().held.clone();
        assert!(
            states
                .iter()
                .all(|s| Arc::ptr_eq(&held(s), &held(&states[0])))
        );
        assert_eq!(
            held(&states[0]).get("w7").map(|v| &**v),
            Some(&*second[7].version)
        );
        // A connection holding something else gets its own difference.
        let mut other = ConnectionState::default();
        other.on_delta_request(&DeltaDiscoveryRequest {
            type_url: CDS.into(),
            ..Default::default()
        });
        let (changed, _) = other.delta_diff(TypeUrl::Cluster, &second.clone(), false);
        assert_eq!(changed.len(), 49);
        assert_eq!(computed() - start, 3);
    }

    #[test]
    fn initial_ack_and_wildcard_change() {
        let mut s = ConnectionState::default();
        assert_eq!(
            s.on_sotw_request(&req(CDS, &[], "", "")),
            Action::Respond(TypeUrl::Cluster)
        );
        assert!(s.watch(TypeUrl::Cluster).unwrap().wildcard);
        let nonce = sent(&mut s, TypeUrl::Cluster);
        assert_eq!(
            s.on_sotw_request(&req(CDS, &[], "v1", &nonce)),
            Action::Ack(TypeUrl::Cluster)
        );
        let w = s.watch(TypeUrl::Cluster).unwrap();
        assert_eq!(w.nonce_acked.as_deref(), Some(nonce.as_str()));
        assert_eq!(w.version_acked.as_deref(), Some("v1"));
        // An idle connection holds one copy of its last nonce and version per type.
        let (sent, acked) = (
            w.nonce_sent.as_ref().unwrap(),
            w.nonce_acked.as_ref().unwrap(),
        );
        assert!(
            Arc::ptr_eq(sent, acked),
            "the ACKed nonce is the sent one's string"
        );
        let (sent, acked) = (
            w.version_sent.as_ref().unwrap(),
            w.version_acked.as_ref().unwrap(),
        );
        assert!(Arc::ptr_eq(sent, acked));
        // A wildcard type answers any change of names, even a removal.
        assert_eq!(
            s.on_sotw_request(&req(CDS, &["a"], "v1", &nonce)),
            Action::Respond(TypeUrl::Cluster)
        );
        assert_eq!(
            s.on_sotw_request(&req(CDS, &[], "v1", &nonce)),
            Action::Respond(TypeUrl::Cluster)
        );
    }

    #[test]
    fn nack_is_recorded_and_not_answered_then_cleared_by_ack() {
        let mut s = ConnectionState::default();
        s.on_sotw_request(&req(CDS, &[], "", ""));
        let nonce = sent(&mut s, TypeUrl::Cluster);
        let mut nack = req(CDS, &[], "", &nonce);
        nack.error_detail = Some(Status {
            code: 3,
            message: "bad cluster".into(),
            details: vec![],
        });
        assert_eq!(
            s.on_sotw_request(&nack),
            Action::Nack(TypeUrl::Cluster, "bad cluster".into())
        );
        let w = s.watch(TypeUrl::Cluster).unwrap();
        assert_eq!(w.last_error(), Some("bad cluster"));
        assert!(w.nacked());
        // The rejection, boxed apart, reads as the two fields it was.
        let json = serde_json::to_value(w).unwrap();
        assert_eq!(json["last_error"], "bad cluster");
        assert_eq!(json["nonce_nacked"], nonce.as_str());
        let nonce2 = sent(&mut s, TypeUrl::Cluster);
        assert_eq!(
            s.on_sotw_request(&req(CDS, &[], "v1", &nonce2)),
            Action::Ack(TypeUrl::Cluster)
        );
        let w = s.watch(TypeUrl::Cluster).unwrap();
        assert!(w.last_error().is_none());
        assert_eq!(w.nonce_nacked().map(|n| &**n), Some(nonce.as_str()));
        let fresh = serde_json::to_value(Watch::default()).unwrap();
        assert!(fresh["last_error"].is_null() && fresh["nonce_nacked"].is_null());
        assert!(fresh.get("rejection").is_none());
        // Four watches (a sidecar's) in 512 bytes: jemalloc's size class below 640.
        assert!(4 * std::mem::size_of::<(TypeUrl, Watch)>() <= 512);
    }

    #[test]
    fn stale_nonce_is_ignored() {
        let mut s = ConnectionState::default();
        s.on_sotw_request(&req(EDS, &["a"], "", ""));
        let old = sent(&mut s, TypeUrl::Endpoint);
        let _new = sent(&mut s, TypeUrl::Endpoint);
        assert_eq!(
            s.on_sotw_request(&req(EDS, &["a", "b"], "v1", &old)),
            Action::Stale(TypeUrl::Endpoint)
        );
        assert_eq!(
            s.watch(TypeUrl::Endpoint).unwrap().names.len(),
            1,
            "a stale request changes nothing"
        );
    }

    #[test]
    fn eds_answers_added_names_only_and_unsubscribes_on_empty() {
        let mut s = ConnectionState::default();
        assert_eq!(
            s.on_sotw_request(&req(EDS, &["a", "b"], "", "")),
            Action::Respond(TypeUrl::Endpoint)
        );
        assert!(!s.watch(TypeUrl::Endpoint).unwrap().wildcard);
        let n = sent(&mut s, TypeUrl::Endpoint);
        assert_eq!(
            s.on_sotw_request(&req(EDS, &["a"], "v1", &n)),
            Action::Ack(TypeUrl::Endpoint)
        );
        assert_eq!(
            s.watch(TypeUrl::Endpoint).unwrap().names.as_ref(),
            &BTreeSet::from(["a".to_string()]),
            "a removal is recorded without a response"
        );
        // Repeated names are the same subscription.
        assert_eq!(
            s.on_sotw_request(&req(EDS, &["a", "a"], "v1", &n)),
            Action::Ack(TypeUrl::Endpoint)
        );
        assert_eq!(s.watch(TypeUrl::Endpoint).unwrap().names.len(), 1);
        assert_eq!(
            s.on_sotw_request(&req(EDS, &["a", "c"], "v1", &n)),
            Action::Respond(TypeUrl::Endpoint)
        );
        assert_eq!(
            s.on_sotw_request(&req(EDS, &[], "v1", &n)),
            Action::Unsubscribed(TypeUrl::Endpoint)
        );
        assert!(s.watch(TypeUrl::Endpoint).is_none());
    }

    #[test]
    fn empty_nonce_on_existing_watch_is_a_fresh_request() {
        let mut s = ConnectionState::default();
        s.on_sotw_request(&req(EDS, &["a"], "", ""));
        sent(&mut s, TypeUrl::Endpoint);
        assert_eq!(
            s.on_sotw_request(&req(EDS, &["b"], "", "")),
            Action::Respond(TypeUrl::Endpoint)
        );
        assert_eq!(
            s.watch(TypeUrl::Endpoint).unwrap().names.as_ref(),
            &BTreeSet::from(["b".to_string()])
        );
    }

    #[test]
    fn unknown_types_are_reported() {
        let mut s = ConnectionState::default();
        let t = "type.googleapis.com/envoy.config.route.v3.ScopedRouteConfiguration";
        assert_eq!(
            s.on_sotw_request(&req(t, &["x"], "", "")),
            Action::UnknownType(t.into())
        );
    }

    fn dreq(t: &str, sub: &[&str], unsub: &[&str], nonce: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: t.into(),
            resource_names_subscribe: sub.iter().map(|s| s.to_string()).collect(),
            resource_names_unsubscribe: unsub.iter().map(|s| s.to_string()).collect(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn res(name: &str, payload: &str) -> Resource {
        EncodedResource::encode(
            TypeUrl::Endpoint,
            name,
            &envoy_types::pb::google::protobuf::StringValue {
                value: payload.into(),
            },
        )
    }

    #[test]
    fn delta_subscribe_unsubscribe_and_diff() {
        let mut s = ConnectionState::default();
        assert_eq!(
            s.on_delta_request(&dreq(EDS, &["a", "b"], &[], "")),
            Action::Respond(TypeUrl::Endpoint)
        );
        let (send, removed) =
            s.delta_diff(TypeUrl::Endpoint, &[res("a", "1"), res("b", "1")], false);
        assert_eq!(send.len(), 2);
        assert!(removed.is_empty());
        let n = s.record_sent(TypeUrl::Endpoint, &Arc::from("v1"));
        // ACK: nothing new.
        assert_eq!(
            s.on_delta_request(&dreq(EDS, &[], &[], &n)),
            Action::Ack(TypeUrl::Endpoint)
        );
        // Unchanged content is not re-sent; a changed one is.
        let (send, _) = s.delta_diff(TypeUrl::Endpoint, &[res("a", "1"), res("b", "2")], false);
        assert_eq!(send.iter().map(|r| &*r.name).collect::<Vec<_>>(), vec!["b"]);
        // b disappears -> removed.
        let (send, removed) = s.delta_diff(TypeUrl::Endpoint, &[res("a", "1")], false);
        assert!(send.is_empty());
        assert_eq!(removed, vec!["b".to_string()]);
        // Subscribing c (even with an old nonce) answers; unsubscribing alone does not.
        assert_eq!(
            s.on_delta_request(&dreq(EDS, &["c"], &[], "old")),
            Action::Respond(TypeUrl::Endpoint)
        );
        assert_eq!(
            s.on_delta_request(&dreq(EDS, &[], &["a"], "old")),
            Action::Stale(TypeUrl::Endpoint)
        );
        assert!(
            !s.watch(TypeUrl::Endpoint).unwrap().names.contains("a"),
            "the unsubscribe still applies"
        );
    }

    #[test]
    fn delta_wildcard_and_initial_versions() {
        let mut s = ConnectionState::default();
        let mut first = dreq(CDS, &[], &[], "");
        first
            .initial_resource_versions
            .insert("a".into(), res("a", "1").version.to_string());
        assert_eq!(
            s.on_delta_request(&first),
            Action::Respond(TypeUrl::Cluster)
        );
        assert!(s.watch(TypeUrl::Cluster).unwrap().wildcard);
        let (send, removed) =
            s.delta_diff(TypeUrl::Cluster, &[res("a", "1"), res("b", "1")], false);
        assert_eq!(
            send.iter().map(|r| &*r.name).collect::<Vec<_>>(),
            vec!["b"],
            "a is already held at that version"
        );
        assert!(removed.is_empty());
        let (_, removed) = s.delta_diff(TypeUrl::Cluster, &[res("b", "1")], false);
        assert_eq!(removed, vec!["a".to_string()]);
        // Partial (incremental) pushes never remove.
        let (send, removed) = s.delta_diff(TypeUrl::Cluster, &[res("b", "2")], true);
        assert_eq!((send.len(), removed.len()), (1, 0));
    }
}

#[cfg(test)]
mod type_map_tests {
    use super::*;

    #[test]
    fn a_type_map_keeps_type_order_and_serializes_as_a_map() {
        let mut m = TypeMap::<u32>::default();
        m.insert(TypeUrl::Route, 3);
        *m.get_or_default(TypeUrl::Cluster) += 1;
        *m.get_or_default(TypeUrl::Cluster) += 1;
        m.insert(TypeUrl::Listener, 2);
        assert_eq!(m.get(&TypeUrl::Cluster), Some(&2));
        assert!(!m.contains_key(&TypeUrl::Endpoint));
        let order: Vec<TypeUrl> = m.iter().map(|(t, _)| *t).collect();
        assert_eq!(order, [TypeUrl::Cluster, TypeUrl::Listener, TypeUrl::Route]);
        assert_eq!(m.remove(&TypeUrl::Listener), Some(2));
        assert_eq!(m.get_mut(&TypeUrl::Listener), None);
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(json.as_object().unwrap().len(), 2);
    }
}

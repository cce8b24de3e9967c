//! One simulated proxy's side of the ADS conversation, as plain data: what it
//! subscribes to, what it holds, which changes a response carries, and when its config
//! is complete. No IO; [`super::client`] feeds responses in and sends what this returns.
//!
//! It follows resources the way Envoy does:
//! - **sidecar**: CDS wildcard; EDS for every EDS cluster received; once the clusters
//!   are warm (every EDS name answered), LDS wildcard; RDS for every route name the
//!   listeners' HTTP connection managers use.
//! - **proxyless gRPC**: LDS for `host:port` of each watched service; RDS for the route
//!   names of the API listeners; CDS for the clusters the routes use; EDS for those.
//!
//! Subscriptions follow changes (a new cluster subscribes its EDS name, a removed one
//! unsubscribes it), every response is ACKed (after the subscription changes it caused,
//! as Envoy does), and a response that does not decode is NACKed.
//!
//! State of the world: CDS and LDS responses are the full set (what is left out is
//! gone); EDS and RDS responses update only the resources they carry. Delta: resources
//! are added or replaced one by one and `removed_resources` removes them.
//!
//! What it holds of each type is a [`Table`] of names, hashes and the facts the checks
//! read ([`super::tables`]), shared with the proxies that hold the same
//! (`decode: lean`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use prost::Message;

use super::lite::{
    ClaLite, ClusterLite, DeltaResponseLite, ListenerLite, RouteConfigurationLite, RouteNameLite,
    SotwResponseLite, route_name_and_marker,
};
use super::plan::Plan;
use super::registry::namespace_name;
use super::scenario::{Flavour, Mode};
use super::tables::{Facts, NameSet, Resource, Table, Update};
use meshfed::xds::TypeUrl;

/// A request to send.
#[derive(Clone, Debug, PartialEq)]
pub enum Outgoing {
    /// On a state-of-the-world stream.
    Sotw(SotwOut),
    /// On a Delta stream.
    Delta(DeltaDiscoveryRequest),
}

/// A state-of-the-world request: `request` (its `resource_names` left empty) and the
/// subscription's names, spliced in pre-encoded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SotwOut {
    /// Every field but `resource_names`.
    pub request: DiscoveryRequest,
    /// `resource_names`.
    pub names: Arc<NameSet>,
}

impl prost::Message for SotwOut {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        self.request.encode_raw(buf);
        buf.put_slice(self.names.encoded());
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Decoding (never done by the tool) reads names into `request`.
        self.request.merge_field(tag, wire_type, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.request.encoded_len() + self.names.encoded().len()
    }

    fn clear(&mut self) {
        self.request.clear();
        self.names = Arc::default();
    }
}

/// What handling one response produced.
#[derive(Debug, Default)]
pub struct Step {
    /// The type and resource count of the response, when it had a known type.
    pub received: Option<(TypeUrl, usize)>,
    /// Requests to send, in order: subscription changes first, the ACK (or NACK) last.
    pub requests: Vec<Outgoing>,
    /// Changes this response carried that the proxy had not seen before; they count
    /// as observed once `requests` are sent.
    pub observed: Vec<u32>,
    /// Why the response was NACKed.
    pub rejected: Option<String>,
}

/// One type's subscription and where its conversation stands.
#[derive(Debug, Default)]
struct Subscription {
    /// The first request was made.
    started: bool,
    /// Subscribed to everything of the type.
    wildcard: bool,
    /// Subscribed names (shared with the proxies subscribed to the same).
    names: Arc<NameSet>,
    /// Last accepted SotW version.
    version: String,
    /// Nonce of the last response.
    nonce: String,
    /// Responses received.
    responses: u64,
    /// A response arrived since names were last added.
    answered: bool,
    /// Delta: subscribed names the server reported as removed (they do not exist).
    gone: HashSet<Arc<str>, crate::tables::NameHasher>,
    /// Delta: re-stated on a new stream with what is held, and not answered on it yet.
    resumed: bool,
}

impl Subscription {
    /// The SotW request that (re)states this subscription, ACKing the last response.
    fn sotw_request(&self, type_url: TypeUrl) -> SotwOut {
        SotwOut {
            request: DiscoveryRequest {
                type_url: type_url.as_str().into(),
                version_info: self.version.clone(),
                response_nonce: self.nonce.clone(),
                ..Default::default()
            },
            names: self.names.clone(),
        }
    }
}

/// The types a simulated proxy subscribes to and follows: not secrets (sidecars get
/// theirs from their agent), not NDS (the simulated agents do not capture DNS).
pub const FOLLOWED: [TypeUrl; 4] = [
    TypeUrl::Cluster,
    TypeUrl::Endpoint,
    TypeUrl::Listener,
    TypeUrl::Route,
];

/// The EDS name of a cluster's facts.
fn eds_names(facts: &Facts) -> Vec<Arc<str>> {
    match facts {
        Facts::Cluster(Some(eds)) => vec![eds.clone()],
        _ => Vec::new(),
    }
}

/// The route names of a listener's facts.
fn route_names(facts: &Facts) -> Vec<Arc<str>> {
    match facts {
        Facts::Listener(routes) => routes.clone(),
        _ => Vec::new(),
    }
}

/// The clusters of a route configuration's facts.
fn route_clusters(facts: &Facts) -> Vec<Arc<str>> {
    match facts {
        Facts::Route(clusters, _) => clusters.clone(),
        _ => Vec::new(),
    }
}

/// A simulated proxy's protocol state (see the module docs).
#[derive(Debug)]
pub struct ProxyState {
    plan: Arc<Plan>,
    flavour: Flavour,
    /// Its namespace number (`load-<n>`).
    namespace: usize,
    /// Proxyless: the services watched.
    watched: Vec<usize>,
    /// What it holds, by type.
    tables: [Arc<Table>; TypeUrl::ALL.len()],
    subs: [Subscription; TypeUrl::ALL.len()],
    /// Per service: the newest endpoint change seen in its assignment.
    marker_seen: HashMap<usize, u32>,
    /// The newest config change seen in a route name.
    config_seen: Option<u32>,
    /// Changes observed already (kept across reconnects, so none counts twice).
    observed: Vec<u64>,
}

impl ProxyState {
    /// Proxy number `index` of the run, speaking `flavour` (of the scenario: with
    /// `mixed`, the proxy's own).
    pub fn new(plan: Arc<Plan>, flavour: Flavour, index: usize) -> ProxyState {
        let watched = match plan.mode {
            Mode::Sidecar => Vec::new(),
            Mode::Grpc => plan.grpc_watch(index),
            Mode::Ztunnel => {
                unreachable!("ztunnels are simulated by crate::ztunnel, not as proxies")
            }
        };
        let words = plan.changes.len().div_ceil(64);
        ProxyState {
            namespace: plan.proxy_namespace(index),
            tables: std::array::from_fn(|_| plan.shared.empty()),
            plan,
            flavour: flavour.of_proxy(index),
            watched,
            subs: Default::default(),
            marker_seen: HashMap::new(),
            config_seen: None,
            observed: vec![0; words],
        }
    }

    /// Its namespace number (`load-<n>`).
    pub fn namespace(&self) -> usize {
        self.namespace
    }

    /// The flavour it speaks (`sotw` or `delta`).
    pub fn flavour(&self) -> Flavour {
        self.flavour
    }

    /// The services a proxyless client watches (empty for sidecars).
    pub fn watched(&self) -> &[usize] {
        &self.watched
    }

    /// What it holds of `type_url`.
    pub fn table(&self, type_url: TypeUrl) -> &Arc<Table> {
        &self.tables[type_url.index()]
    }

    /// Starts (or restarts, on a new stream) the conversation and returns the first
    /// requests. A state-of-the-world proxy forgets what it held (the server sends
    /// everything again); a Delta proxy keeps it and resumes, as Envoy does.
    pub fn start(&mut self) -> Vec<Outgoing> {
        if self.flavour == Flavour::Delta && self.subs.iter().any(|s| s.started) {
            return self.resume();
        }
        self.tables = std::array::from_fn(|_| self.plan.shared.empty());
        self.subs = Default::default();
        let mut step = Step::default();
        match self.plan.mode {
            Mode::Sidecar => self.subscribe_wildcard(TypeUrl::Cluster, &mut step),
            Mode::Grpc => {
                let names = self
                    .watched
                    .iter()
                    .map(|s| self.plan.listener_name(*s).clone())
                    .collect();
                self.resubscribe(TypeUrl::Listener, Arc::new(NameSet::new(names)), &mut step);
            }
            Mode::Ztunnel => {
                unreachable!("ztunnels are simulated by crate::ztunnel, not as proxies")
            }
        }
        step.requests
    }

    /// A Delta proxy's first requests on a new stream, as Envoy makes them: every
    /// subscription re-stated (CDS, EDS, LDS, RDS in that order) with the versions of
    /// what it holds in `initial_resource_versions`, so the server sends only what
    /// changed. Each counts as resolved again once the server answered it.
    fn resume(&mut self) -> Vec<Outgoing> {
        let mut requests = Vec::new();
        for type_url in FOLLOWED {
            let table = self.tables[type_url.index()].clone();
            let sub = &mut self.subs[type_url.index()];
            if !sub.started || (!sub.wildcard && sub.names.is_empty()) {
                continue;
            }
            sub.resumed = true;
            sub.responses = 0;
            sub.answered = false;
            let initial_resource_versions = table
                .entries()
                .filter_map(|e| {
                    let version = e.resource.version.get()?;
                    Some((e.resource.name.to_string(), version.to_string()))
                })
                .collect();
            let resource_names_subscribe = match sub.wildcard {
                true => Vec::new(),
                false => sub.names.names().map(String::from).collect(),
            };
            requests.push(Outgoing::Delta(DeltaDiscoveryRequest {
                type_url: type_url.as_str().into(),
                resource_names_subscribe,
                initial_resource_versions,
                ..Default::default()
            }));
        }
        requests
    }

    /// Handles a state-of-the-world response.
    pub fn on_sotw(&mut self, response: SotwResponseLite) -> Step {
        let mut step = Step::default();
        let Some(type_url) = TypeUrl::parse(&response.type_url) else {
            return step;
        };
        step.received = Some((type_url, response.resources.len()));
        let put = self.plan.shared.entries(
            type_url,
            response.resources.iter().map(|r| &r.value[..]),
            |bytes| self.decode(type_url, bytes),
        );
        let put = match put {
            Ok(put) => put,
            Err(err) => {
                self.reject(type_url, &response.nonce, err, &mut step);
                return step;
            }
        };
        // CDS and LDS responses are complete sets; EDS and RDS ones update.
        let update = Update {
            complete: type_url.is_wildcard(),
            put,
            remove: Vec::new(),
        };
        self.apply(type_url, update, &mut step);
        let sub = &mut self.subs[type_url.index()];
        sub.version = response.version_info;
        sub.nonce = response.nonce;
        self.follow(type_url, &mut step);
        let request = self.subs[type_url.index()].sotw_request(type_url);
        step.requests.push(Outgoing::Sotw(request));
        step
    }

    /// Handles a Delta response.
    pub fn on_delta(&mut self, response: DeltaResponseLite) -> Step {
        let mut step = Step::default();
        let Some(type_url) = TypeUrl::parse(&response.type_url) else {
            return step;
        };
        step.received = Some((type_url, response.resources.len()));
        let put = self.plan.shared.entries(
            type_url,
            response
                .resources
                .iter()
                .filter_map(|r| r.resource.as_ref())
                .map(|any| &any.value[..]),
            |bytes| self.decode(type_url, bytes),
        );
        let put = match put {
            Ok(put) => put,
            Err(err) => {
                self.reject(type_url, &response.nonce, err, &mut step);
                return step;
            }
        };
        let carried = response.resources.iter().filter(|r| r.resource.is_some());
        for (e, r) in put.iter().zip(carried) {
            if !r.version.is_empty() {
                e.resource
                    .version
                    .get_or_init(|| Arc::from(r.version.as_str()));
            }
        }
        let removed: Vec<Arc<str>> = response
            .removed_resources
            .iter()
            .map(|n| self.plan.intern(n))
            .collect();
        let sub = &mut self.subs[type_url.index()];
        for e in &put {
            sub.gone.remove(&e.resource.name);
        }
        for name in &removed {
            if sub.names.contains(name) {
                sub.gone.insert(name.clone());
            }
        }
        let update = Update {
            complete: false,
            put,
            remove: removed,
        };
        self.apply(type_url, update, &mut step);
        self.follow(type_url, &mut step);
        step.requests.push(Outgoing::Delta(DeltaDiscoveryRequest {
            type_url: type_url.as_str().into(),
            response_nonce: response.nonce,
            ..Default::default()
        }));
        step
    }

    fn reject(&mut self, type_url: TypeUrl, nonce: &str, err: prost::DecodeError, step: &mut Step) {
        let message = format!("cannot decode a {} resource: {err}", type_url.short());
        let error_detail = Some(RpcStatus {
            code: 3,
            message: message.clone(),
            details: vec![],
        });
        let sub = &mut self.subs[type_url.index()];
        sub.nonce = nonce.to_string();
        step.requests.push(match self.flavour {
            Flavour::Delta => Outgoing::Delta(DeltaDiscoveryRequest {
                type_url: type_url.as_str().into(),
                response_nonce: nonce.to_string(),
                error_detail,
                ..Default::default()
            }),
            _ => Outgoing::Sotw(SotwOut {
                request: DiscoveryRequest {
                    type_url: type_url.as_str().into(),
                    version_info: sub.version.clone(),
                    response_nonce: nonce.to_string(),
                    error_detail,
                    ..Default::default()
                },
                names: sub.names.clone(),
            }),
        });
        step.rejected = Some(message);
    }

    fn decode(&self, type_url: TypeUrl, bytes: &[u8]) -> Result<Resource, prost::DecodeError> {
        let intern = |n: &str| self.plan.intern(n);
        let (name, facts) = match type_url {
            TypeUrl::Cluster => {
                let c = ClusterLite::decode(bytes)?;
                let eds = c.eds_name().map(intern);
                (intern(&c.name), Facts::Cluster(eds))
            }
            TypeUrl::Endpoint => {
                let cla = ClaLite::decode(bytes)?;
                let marker = cla.markers().max();
                (
                    intern(&cla.cluster_name),
                    Facts::Assignment(cla.endpoint_count(), marker),
                )
            }
            TypeUrl::Listener => {
                let l = ListenerLite::decode(bytes)?;
                let routes = l.route_names()?.iter().map(|n| intern(n)).collect();
                (intern(&l.name), Facts::Listener(routes))
            }
            TypeUrl::Route => match self.plan.mode {
                // Sidecars follow no name out of routes: without config changes to
                // look for, only the name is decoded.
                Mode::Sidecar if !self.plan.has_config_changes() => (
                    intern(&RouteNameLite::decode(bytes)?.name),
                    Facts::Route(Vec::new(), None),
                ),
                Mode::Sidecar => {
                    let (name, marker) = route_name_and_marker(bytes)?;
                    (intern(&name), Facts::Route(Vec::new(), marker))
                }
                Mode::Grpc => {
                    let r = RouteConfigurationLite::decode(bytes)?;
                    let clusters = r.cluster_names().iter().map(|n| intern(n)).collect();
                    (intern(&r.name), Facts::Route(clusters, r.newest_marker()))
                }
                Mode::Ztunnel => {
                    unreachable!("ztunnels are simulated by crate::ztunnel, not as proxies")
                }
            },
            // A Secret's name is field 1, as a route configuration's (and as a
            // TypedExtensionConfig's).
            TypeUrl::Secret | TypeUrl::ExtensionConfig => {
                (intern(&RouteNameLite::decode(bytes)?.name), Facts::Other)
            }
            // Simulated proxies subscribe to no MCP or ambient type.
            TypeUrl::NameTable | TypeUrl::Address | TypeUrl::Authorization | TypeUrl::Mcp(_) => {
                (intern(""), Facts::Other)
            }
        };
        Ok(Resource::new(name, facts))
    }

    fn holds(&self, type_url: TypeUrl, name: &str) -> bool {
        self.tables[type_url.index()].contains(name)
    }

    /// Stores what a response carried and notes the changes it shows.
    fn apply(&mut self, type_url: TypeUrl, mut update: Update, step: &mut Step) {
        if matches!(type_url, TypeUrl::Secret | TypeUrl::NameTable) {
            // Not followed: nothing held.
            update.put.clear();
            update.remove.clear();
            update.complete = false;
        }
        let old = self.tables[type_url.index()].clone();
        for e in &update.put {
            let name = &e.resource.name;
            if old.get(name).is_some_and(|held| held.hash == e.hash) {
                continue;
            }
            match &e.resource.facts {
                Facts::Cluster(_) => {
                    if !old.contains(name)
                        && let Some(change) = self
                            .plan
                            .service_of_cluster(name)
                            .and_then(|s| self.plan.added_by(s))
                    {
                        self.note(change, step);
                    }
                }
                Facts::Assignment(_, marker) => {
                    if let (Some(marker), Some(service)) =
                        (*marker, self.plan.service_of_cluster(name))
                    {
                        let seen = self.marker_seen.get(&service).copied();
                        if seen.is_none_or(|s| marker > s) {
                            self.marker_seen.insert(service, marker);
                            let plan = self.plan.clone();
                            for change in plan.endpoint_changes_between(service, seen, marker) {
                                self.note(change, step);
                            }
                        }
                    }
                }
                Facts::Route(_, marker) => {
                    if let Some(marker) = *marker
                        && self.config_seen.is_none_or(|s| marker > s)
                    {
                        let seen = self.config_seen.replace(marker);
                        let plan = self.plan.clone();
                        for change in plan.config_changes_between(seen, marker) {
                            self.note(change, step);
                        }
                    }
                }
                Facts::Listener(_) | Facts::Other => {}
            }
        }
        // Clusters that leave: removed by name, or left out of a complete set.
        if type_url == TypeUrl::Cluster {
            let gone: Vec<Arc<str>> = if update.complete {
                let present: HashSet<&str> = update.put.iter().map(|e| &*e.resource.name).collect();
                old.names()
                    .filter(|n| !present.contains(&***n))
                    .cloned()
                    .collect()
            } else {
                update
                    .remove
                    .iter()
                    .filter(|n| old.contains(n))
                    .cloned()
                    .collect()
            };
            for name in gone {
                if let Some(change) = self
                    .plan
                    .service_of_cluster(&name)
                    .and_then(|s| self.plan.removed_by(s))
                {
                    self.note(change, step);
                }
            }
        }
        self.tables[type_url.index()] = self.plan.shared.update(type_url, &old, update);
        let sub = &mut self.subs[type_url.index()];
        sub.responses += 1;
        sub.answered = true;
        sub.resumed = false;
    }

    fn note(&mut self, change: u32, step: &mut Step) {
        let (word, bit) = ((change / 64) as usize, change % 64);
        if let Some(w) = self.observed.get_mut(word)
            && *w & (1 << bit) == 0
        {
            *w |= 1 << bit;
            step.observed.push(change);
        }
    }

    /// Moves the subscriptions that depend on what a response of `changed` changed.
    /// Only the types downstream of it are looked at: an EDS response, the common
    /// one, moves no subscription. The names a table makes the proxy subscribe to are
    /// worked out once per table ([`Table::derived`]), not per proxy.
    fn follow(&mut self, changed: TypeUrl, step: &mut Step) {
        let responded = |s: &Self, t: TypeUrl| s.subs[t.index()].responses > 0;
        match self.plan.mode {
            Mode::Sidecar => {
                if changed == TypeUrl::Cluster {
                    let eds = self.table(TypeUrl::Cluster).derived(eds_names);
                    self.resubscribe(TypeUrl::Endpoint, eds, step);
                }
                // Listeners once the clusters are warm, as Envoy does.
                if matches!(changed, TypeUrl::Cluster | TypeUrl::Endpoint)
                    && responded(self, TypeUrl::Cluster)
                    && !self.subs[TypeUrl::Listener.index()].started
                    && self.resolved(TypeUrl::Endpoint)
                {
                    self.subscribe_wildcard(TypeUrl::Listener, step);
                }
                if changed == TypeUrl::Listener {
                    let routes = self.table(TypeUrl::Listener).derived(route_names);
                    self.resubscribe(TypeUrl::Route, routes, step);
                }
            }
            Mode::Grpc => {
                // Listeners name routes, routes name clusters, clusters name EDS names.
                let mut dirty = changed;
                if dirty == TypeUrl::Listener {
                    let routes = self.table(TypeUrl::Listener).derived(route_names);
                    self.resubscribe(TypeUrl::Route, routes, step);
                    dirty = TypeUrl::Route;
                }
                if dirty == TypeUrl::Route && responded(self, TypeUrl::Route) {
                    // The route table holds only subscribed names (see `resubscribe`).
                    let clusters = self.table(TypeUrl::Route).derived(route_clusters);
                    self.resubscribe(TypeUrl::Cluster, clusters, step);
                    dirty = TypeUrl::Cluster;
                }
                if dirty == TypeUrl::Cluster && responded(self, TypeUrl::Cluster) {
                    let eds = self.table(TypeUrl::Cluster).derived(eds_names);
                    self.resubscribe(TypeUrl::Endpoint, eds, step);
                }
            }
            Mode::Ztunnel => {
                unreachable!("ztunnels are simulated by crate::ztunnel, not as proxies")
            }
        }
    }

    fn subscribe_wildcard(&mut self, type_url: TypeUrl, step: &mut Step) {
        let sub = &mut self.subs[type_url.index()];
        sub.started = true;
        sub.wildcard = true;
        step.requests.push(match self.flavour {
            Flavour::Delta => Outgoing::Delta(DeltaDiscoveryRequest {
                type_url: type_url.as_str().into(),
                ..Default::default()
            }),
            _ => Outgoing::Sotw(SotwOut {
                request: DiscoveryRequest {
                    type_url: type_url.as_str().into(),
                    ..Default::default()
                },
                names: Arc::default(),
            }),
        });
    }

    /// Subscribes `type_url` to exactly `names`, sending a request when they changed.
    fn resubscribe(&mut self, type_url: TypeUrl, names: Arc<NameSet>, step: &mut Step) {
        let sub = &mut self.subs[type_url.index()];
        if sub.started && (Arc::ptr_eq(&sub.names, &names) || sub.names.set() == names.set()) {
            return;
        }
        let first = !sub.started;
        let added: Vec<String> = names
            .names()
            .filter(|n| !sub.names.contains(n))
            .map(String::from)
            .collect();
        let dropped: Vec<Arc<str>> = sub
            .names
            .set()
            .iter()
            .filter(|n| !names.contains(n))
            .cloned()
            .collect();
        sub.started = true;
        if !added.is_empty() {
            sub.answered = false;
        }
        sub.gone.retain(|n| names.contains(n));
        sub.names = names;
        // What is no longer subscribed is dropped (EDS and RDS hold by name).
        if matches!(type_url, TypeUrl::Endpoint | TypeUrl::Route) && !dropped.is_empty() {
            let old = self.tables[type_url.index()].clone();
            let remove = dropped
                .iter()
                .filter(|n| old.contains(n))
                .cloned()
                .collect();
            self.tables[type_url.index()] = self.plan.shared.update(
                type_url,
                &old,
                Update {
                    remove,
                    ..Update::default()
                },
            );
        }
        let sub = &self.subs[type_url.index()];
        if first && sub.names.is_empty() {
            // Nothing to ask for yet; an empty non-wildcard request means nothing.
            return;
        }
        step.requests.push(match self.flavour {
            Flavour::Delta => Outgoing::Delta(DeltaDiscoveryRequest {
                type_url: type_url.as_str().into(),
                resource_names_subscribe: added,
                resource_names_unsubscribe: dropped.iter().map(|n| n.to_string()).collect(),
                ..Default::default()
            }),
            _ => Outgoing::Sotw(sub.sotw_request(type_url)),
        });
    }

    /// Every subscribed name of `type_url` is held or known not to exist. A sidecar's
    /// RDS is also resolved once the server answered its latest subscription, even
    /// without every name: a server that does not serve sidecar routes (yet) is a gap
    /// to report ([`ProxyState::unserved`]), not a proxy that never converges.
    fn resolved(&self, type_url: TypeUrl) -> bool {
        self.unresolved(type_url).is_none()
    }

    fn unresolved(&self, type_url: TypeUrl) -> Option<String> {
        let sub = &self.subs[type_url.index()];
        if !sub.started {
            return Some(format!("{} not requested yet", type_url.short()));
        }
        if sub.resumed {
            return Some(format!(
                "no {} response since the stream resumed",
                type_url.short()
            ));
        }
        if sub.wildcard || sub.names.is_empty() {
            return (sub.wildcard && sub.responses == 0)
                .then(|| format!("no {} response yet", type_url.short()));
        }
        if self.plan.mode == Mode::Sidecar && type_url == TypeUrl::Route && sub.answered {
            return None;
        }
        // Checked after every response until complete: one pass, nothing collected.
        let mut missing = sub
            .names
            .set()
            .iter()
            .filter(|n| !self.holds(type_url, n) && !sub.gone.contains(*n));
        let first = missing.next()?;
        let count = 1 + missing.count();
        Some(format!(
            "{count} of {} {} names not received (e.g. {first:?})",
            sub.names.len(),
            type_url.short()
        ))
    }

    /// Why the config is not complete yet; `None` once it is. With `consistent`, the
    /// config must also match the registry the run started with: every cluster (one
    /// per port) of every service the sidecar imports (all, or its namespace's with
    /// `sidecarScope: namespace`) and no other, and every endpoint in the assignment of
    /// each such (sidecars) or watched (proxyless) service's cluster.
    pub fn gap(&self, consistent: bool) -> Option<String> {
        for type_url in FOLLOWED {
            if let Some(gap) = self.unresolved(type_url) {
                return Some(gap);
            }
        }
        if !consistent {
            return None;
        }
        let eps = self.plan.endpoints_per_service;
        let clusters = self.table(TypeUrl::Cluster);
        let assignments = self.table(TypeUrl::Endpoint);
        let short_assignment = |name: &Arc<str>| {
            let eds = match self.plan.mode {
                Mode::Sidecar => match clusters.get(name).map(|e| &e.resource.facts) {
                    Some(Facts::Cluster(eds)) => eds.clone(),
                    _ => None,
                },
                Mode::Grpc => Some(name.clone()),
                Mode::Ztunnel => {
                    unreachable!("ztunnels are simulated by crate::ztunnel, not as proxies")
                }
            };
            let have = eds.and_then(|n| match assignments.get(&n).map(|e| &e.resource.facts) {
                Some(Facts::Assignment(count, _)) => Some(*count),
                _ => None,
            });
            (have != Some(eps))
                .then(|| format!("{name}: {have:?} endpoints, the registry has {eps}"))
        };
        match self.plan.mode {
            Mode::Sidecar => {
                let mut held = Vec::new();
                for name in clusters.names() {
                    let Some(service) = self.plan.service_of_cluster(name) else {
                        continue;
                    };
                    if !self.plan.sidecar_sees(self.namespace, service) {
                        return Some(format!(
                            "cds has {name}, outside the proxy's Sidecar scope (namespace {})",
                            namespace_name(self.namespace)
                        ));
                    }
                    if self.plan.initially_present(service) {
                        held.push(name);
                    }
                }
                let services = self.plan.sidecar_initial_services(self.namespace);
                let ports = self.plan.ports_per_service;
                if held.len() != services * ports {
                    return Some(match ports {
                        1 => format!(
                            "cds has {} of the {services} services' clusters",
                            held.len()
                        ),
                        _ => format!(
                            "cds has {} of the {} clusters of the {services} services",
                            held.len(),
                            services * ports
                        ),
                    });
                }
                held.into_iter().find_map(short_assignment)
            }
            Mode::Grpc => self
                .watched
                .iter()
                .find_map(|s| short_assignment(self.plan.cluster_name(*s))),
            Mode::Ztunnel => {
                unreachable!("ztunnels are simulated by crate::ztunnel, not as proxies")
            }
        }
    }

    /// Whether the config is complete (see [`ProxyState::gap`]).
    pub fn is_complete(&self, consistent: bool) -> bool {
        self.gap(consistent).is_none()
    }

    /// Names subscribed and never sent, by type (see [`ProxyState::resolved`]).
    pub fn unserved(&self) -> Vec<(TypeUrl, Arc<str>)> {
        FOLLOWED
            .into_iter()
            .flat_map(|t| {
                let sub = &self.subs[t.index()];
                sub.names
                    .set()
                    .iter()
                    .filter(move |n| !self.holds(t, n) && !sub.gone.contains(*n))
                    .map(move |n| (t, n.clone()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
    use envoy_types::pb::envoy::config::core::v3::{
        Address, SocketAddress, address, socket_address,
    };
    use envoy_types::pb::envoy::config::endpoint::v3::{
        ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
    };
    use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
    use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, Rds, http_connection_manager,
    };
    use envoy_types::pb::google::protobuf::Any;

    use std::collections::BTreeSet;

    use super::*;
    use crate::lite::{DeltaResourceLite, ResourceAny};
    use crate::marker::marker_port;
    use crate::registry::Registry;
    use crate::scenario::{Churn, Scenario};

    fn plan(mode: Mode) -> Arc<Plan> {
        let scenario = Scenario {
            services: 2,
            endpoints_per_service: 2,
            mode,
            grpc_services_per_client: 1,
            churn: Churn {
                endpoint_changes: 2,
                service_adds: 1,
                ..Churn::default()
            },
            ..Scenario::default()
        };
        let mut registry = Registry::new(&scenario);
        let kinds = registry.plan(&scenario);
        Arc::new(Plan::new(&scenario, &registry, &kinds))
    }

    fn cluster(name: &str) -> ResourceAny {
        let c = Cluster {
            name: name.into(),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::Eds as i32,
            )),
            ..Default::default()
        };
        ResourceAny {
            value: c.encode_to_vec().into(),
        }
    }

    fn assignment(name: &str, ports: &[u32]) -> ResourceAny {
        let lb_endpoints = ports
            .iter()
            .map(|port| LbEndpoint {
                host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                    address: Some(Address {
                        address: Some(address::Address::SocketAddress(SocketAddress {
                            address: "172.16.0.1".into(),
                            port_specifier: Some(socket_address::PortSpecifier::PortValue(*port)),
                            ..Default::default()
                        })),
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            })
            .collect();
        let cla = ClusterLoadAssignment {
            cluster_name: name.into(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints,
                ..Default::default()
            }],
            ..Default::default()
        };
        ResourceAny {
            value: cla.encode_to_vec().into(),
        }
    }

    fn listener(name: &str, route: &str) -> ResourceAny {
        let hcm = HttpConnectionManager {
            route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
                route_config_name: route.into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let l = Listener {
            name: name.into(),
            filter_chains: vec![FilterChain {
                filters: vec![Filter {
                    name: "hcm".into(),
                    config_type: Some(filter::ConfigType::TypedConfig(Any {
                        type_url: "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager".into(),
                        value: hcm.encode_to_vec(),
                    })),
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        ResourceAny {
            value: l.encode_to_vec().into(),
        }
    }

    /// A Delta sidecar's whole config for the clusters `names` (one listener with
    /// route `8080`, no routes), each response made by `delta`.
    fn delta_config(
        p: &mut ProxyState,
        names: &[String],
        delta: impl Fn(TypeUrl, Vec<(String, ResourceAny)>) -> DeltaResponseLite,
    ) {
        p.on_delta(delta(
            TypeUrl::Cluster,
            names.iter().map(|n| (n.clone(), cluster(n))).collect(),
        ));
        p.on_delta(delta(
            TypeUrl::Endpoint,
            names
                .iter()
                .map(|n| (n.clone(), assignment(n, &[9080, 9080])))
                .collect(),
        ));
        p.on_delta(delta(
            TypeUrl::Listener,
            vec![("0.0.0.0_8080".into(), listener("0.0.0.0_8080", "8080"))],
        ));
        p.on_delta(delta(TypeUrl::Route, vec![]));
    }

    fn sotw(t: TypeUrl, nonce: &str, resources: Vec<ResourceAny>) -> SotwResponseLite {
        SotwResponseLite {
            version_info: format!("v-{nonce}"),
            resources,
            type_url: t.as_str().into(),
            nonce: nonce.into(),
        }
    }

    fn sotw_requests(step: &Step) -> Vec<(&str, Vec<String>, &str)> {
        step.requests
            .iter()
            .map(|r| match r {
                Outgoing::Sotw(r) => (
                    TypeUrl::parse(&r.request.type_url).unwrap().short(),
                    r.names.names().map(String::from).collect(),
                    r.request.response_nonce.as_str(),
                ),
                Outgoing::Delta(_) => panic!("delta request on a sotw stream"),
            })
            .collect()
    }

    #[test]
    fn sotw_requests_encode_their_names_as_resource_names() {
        let names: BTreeSet<Arc<str>> = ["outbound|80||a.ns.svc.cluster.local", "b", ""]
            .into_iter()
            .map(Arc::from)
            .collect();
        let out = SotwOut {
            request: DiscoveryRequest {
                type_url: TypeUrl::Endpoint.as_str().into(),
                version_info: "v1".into(),
                response_nonce: "n1".into(),
                ..Default::default()
            },
            names: Arc::new(NameSet::new(names)),
        };
        let wire = out.encode_to_vec();
        assert_eq!(wire.len(), out.encoded_len());
        let read = DiscoveryRequest::decode(&wire[..]).unwrap();
        assert_eq!(
            read.resource_names,
            ["", "b", "outbound|80||a.ns.svc.cluster.local"]
        );
        assert_eq!(
            (
                read.type_url.as_str(),
                read.version_info.as_str(),
                read.response_nonce.as_str()
            ),
            (TypeUrl::Endpoint.as_str(), "v1", "n1")
        );
    }

    #[test]
    fn namespace_scoped_sidecars_expect_their_namespace_only() {
        let scenario = Scenario {
            services: 4,
            endpoints_per_service: 1,
            namespaces: 2,
            sidecar_scope: crate::scenario::SidecarScope::Namespace,
            ..Scenario::default()
        };
        let mut registry = Registry::new(&scenario);
        let kinds = registry.plan(&scenario);
        let plan = Arc::new(Plan::new(&scenario, &registry, &kinds));
        // Proxy 1 is in load-1, with svc-1 and svc-3.
        let mut p = ProxyState::new(plan.clone(), Flavour::Sotw, 1);
        assert_eq!(p.namespace(), 1);
        p.start();
        let [c0, c1, c3] = [0, 1, 3].map(|s| plan.cluster_name(s).to_string());
        let config = |p: &mut ProxyState, clusters: &[&String]| {
            p.on_sotw(sotw(
                TypeUrl::Cluster,
                "c",
                clusters.iter().map(|c| cluster(c)).collect(),
            ));
            p.on_sotw(sotw(
                TypeUrl::Endpoint,
                "e",
                clusters.iter().map(|c| assignment(c, &[9080])).collect(),
            ));
            p.on_sotw(sotw(
                TypeUrl::Listener,
                "l",
                vec![listener("0.0.0.0_8080", "8080")],
            ));
            p.on_sotw(sotw(TypeUrl::Route, "r", vec![]));
        };
        config(&mut p, &[&c1, &c3, &c0]);
        let gap = p.gap(true).expect("a cluster outside the scope");
        assert!(gap.contains("outside the proxy's Sidecar scope"), "{gap}");
        config(&mut p, &[&c1]);
        assert_eq!(
            p.gap(true).as_deref(),
            Some("cds has 1 of the 2 services' clusters")
        );
        config(&mut p, &[&c1, &c3]);
        assert!(p.is_complete(true), "{:?}", p.gap(true));
    }

    #[test]
    fn sidecar_sotw_follows_cds_eds_lds_rds_and_sees_changes() {
        let plan = plan(Mode::Sidecar);
        let mut p = ProxyState::new(plan.clone(), Flavour::Sotw, 0);
        let first = p.start();
        assert_eq!(first.len(), 1, "CDS wildcard");
        let c0 = plan.cluster_name(0).to_string();
        let c1 = plan.cluster_name(1).to_string();
        let step = p.on_sotw(sotw(
            TypeUrl::Cluster,
            "1",
            vec![cluster(&c0), cluster(&c1)],
        ));
        assert_eq!(
            sotw_requests(&step),
            vec![
                ("eds", vec![c0.clone(), c1.clone()], ""),
                ("cds", vec![], "1")
            ],
            "EDS subscription first, then the CDS ACK"
        );
        assert!(!p.is_complete(true));
        let step = p.on_sotw(sotw(
            TypeUrl::Endpoint,
            "2",
            vec![assignment(&c0, &[9080, 9080])],
        ));
        assert_eq!(
            sotw_requests(&step).len(),
            1,
            "no LDS until every cluster is warm"
        );
        let step = p.on_sotw(sotw(
            TypeUrl::Endpoint,
            "3",
            vec![assignment(&c1, &[9080, 9080])],
        ));
        assert_eq!(
            sotw_requests(&step),
            vec![
                ("lds", vec![], ""),
                ("eds", vec![c0.clone(), c1.clone()], "3")
            ]
        );
        let step = p.on_sotw(sotw(
            TypeUrl::Listener,
            "4",
            vec![listener("0.0.0.0_8080", "8080")],
        ));
        assert_eq!(
            sotw_requests(&step),
            vec![("rds", vec!["8080".into()], ""), ("lds", vec![], "4")]
        );
        assert!(!p.is_complete(true), "RDS not answered yet");
        // A server that answers RDS without the route: resolved, reported as unserved.
        p.on_sotw(sotw(TypeUrl::Route, "5", vec![]));
        assert!(p.is_complete(true), "{:?}", p.gap(true));
        assert_eq!(p.unserved().len(), 1);
        let step = p.on_sotw(sotw(
            TypeUrl::Route,
            "6",
            vec![ResourceAny {
                value: RouteConfiguration {
                    name: "8080".into(),
                    ..Default::default()
                }
                .encode_to_vec()
                .into(),
            }],
        ));
        assert_eq!(
            sotw_requests(&step),
            vec![("rds", vec!["8080".into()], "6")]
        );
        assert!(p.unserved().is_empty());

        // Endpoint changes: the newest marker also shows the earlier changes of the
        // same service.
        let endpoint_changes: Vec<u32> = (0..plan.changes.len() as u32)
            .filter(|c| {
                plan.changes[*c as usize].kind == super::super::registry::ChangeKind::Endpoint
            })
            .collect();
        let last = *endpoint_changes.last().unwrap();
        let service = plan.changes[last as usize].service.unwrap();
        let name = plan.cluster_name(service).to_string();
        let step = p.on_sotw(sotw(
            TypeUrl::Endpoint,
            "7",
            vec![assignment(
                &name,
                &[9080, u32::from(marker_port(last as usize))],
            )],
        ));
        let expected: Vec<u32> = plan.endpoint_changes_between(service, None, last).collect();
        assert_eq!(step.observed, expected);
        let step = p.on_sotw(sotw(
            TypeUrl::Endpoint,
            "8",
            vec![assignment(
                &name,
                &[9080, u32::from(marker_port(last as usize))],
            )],
        ));
        assert!(step.observed.is_empty(), "each change is observed once");

        // The added service: its cluster appears in CDS; EDS is subscribed for it.
        let added = plan.service_count() - 1;
        let c2 = plan.cluster_name(added).to_string();
        let step = p.on_sotw(sotw(
            TypeUrl::Cluster,
            "9",
            vec![cluster(&c0), cluster(&c1), cluster(&c2)],
        ));
        assert_eq!(step.observed, vec![plan.added_by(added).unwrap()]);
        assert_eq!(sotw_requests(&step)[0].0, "eds");
        assert_eq!(sotw_requests(&step)[0].1.len(), 3);
    }

    #[test]
    fn grpc_delta_follows_lds_rds_cds_eds() {
        let plan = plan(Mode::Grpc);
        let mut p = ProxyState::new(plan.clone(), Flavour::Delta, 1);
        let service = p.watched()[0];
        let first = p.start();
        let Outgoing::Delta(lds) = &first[0] else {
            panic!()
        };
        assert_eq!(
            lds.resource_names_subscribe,
            vec![plan.listener_name(service).to_string()]
        );
        let cluster_name = plan.cluster_name(service).to_string();
        let delta =
            |t: TypeUrl, nonce: &str, resources: Vec<(&str, ResourceAny)>| DeltaResponseLite {
                system_version_info: "v".into(),
                resources: resources
                    .into_iter()
                    .map(|(name, r)| DeltaResourceLite {
                        version: "1".into(),
                        resource: Some(r),
                        name: name.into(),
                    })
                    .collect(),
                type_url: t.as_str().into(),
                nonce: nonce.into(),
                removed_resources: vec![],
            };
        let lname = plan.listener_name(service).to_string();
        let step = p.on_delta(delta(
            TypeUrl::Listener,
            "1",
            vec![(&lname, listener(&lname, &cluster_name))],
        ));
        let subscribed: Vec<Vec<String>> = step
            .requests
            .iter()
            .map(|r| match r {
                Outgoing::Delta(r) => r.resource_names_subscribe.clone(),
                Outgoing::Sotw(_) => panic!(),
            })
            .collect();
        assert_eq!(subscribed, vec![vec![cluster_name.clone()], vec![]]);
        let route = ResourceAny {
            value: RouteConfiguration {
                name: cluster_name.clone(),
                virtual_hosts: vec![envoy_types::pb::envoy::config::route::v3::VirtualHost {
                    routes: vec![envoy_types::pb::envoy::config::route::v3::Route {
                        action: Some(envoy_types::pb::envoy::config::route::v3::route::Action::Route(
                            envoy_types::pb::envoy::config::route::v3::RouteAction {
                                cluster_specifier: Some(envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier::Cluster(cluster_name.clone())),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }
            .encode_to_vec()
            .into(),
        };
        let step = p.on_delta(delta(TypeUrl::Route, "2", vec![(&cluster_name, route)]));
        assert_eq!(step.requests.len(), 2, "CDS subscription + RDS ACK");
        let step = p.on_delta(delta(
            TypeUrl::Cluster,
            "3",
            vec![(&cluster_name, cluster(&cluster_name))],
        ));
        assert_eq!(step.requests.len(), 2, "EDS subscription + CDS ACK");
        assert!(!p.is_complete(true));
        p.on_delta(delta(
            TypeUrl::Endpoint,
            "4",
            vec![(&cluster_name, assignment(&cluster_name, &[9080]))],
        ));
        assert!(p.is_complete(false));
        assert!(
            p.gap(true).unwrap().contains("Some(1) endpoints"),
            "{:?}",
            p.gap(true)
        );
        p.on_delta(delta(
            TypeUrl::Endpoint,
            "5",
            vec![(&cluster_name, assignment(&cluster_name, &[9080, 9080]))],
        ));
        assert!(p.is_complete(true));
    }

    #[test]
    fn lean_proxies_share_tables_and_see_changes_in_the_http_port() {
        for decode in [crate::scenario::Decode::Lean, crate::scenario::Decode::Full] {
            let scenario = Scenario {
                services: 2,
                ports_per_service: 2,
                endpoints_per_service: 2,
                decode,
                churn: Churn {
                    endpoint_changes: 1,
                    ..Churn::default()
                },
                ..Scenario::default()
            };
            let mut registry = Registry::new(&scenario);
            let kinds = registry.plan(&scenario);
            let plan = Arc::new(Plan::new(&scenario, &registry, &kinds));
            let names: Vec<String> = (0..2)
                .flat_map(|s| plan.cluster_names(s).iter().map(|n| n.to_string()))
                .collect();
            assert_eq!(names.len(), 4);
            let sotw_config = |p: &mut ProxyState, clusters: &[String]| {
                p.start();
                p.on_sotw(sotw(
                    TypeUrl::Cluster,
                    "c",
                    clusters.iter().map(|c| cluster(c)).collect(),
                ));
                p.on_sotw(sotw(
                    TypeUrl::Endpoint,
                    "e",
                    clusters
                        .iter()
                        .map(|c| assignment(c, &[9080, 9080]))
                        .collect(),
                ));
                p.on_sotw(sotw(
                    TypeUrl::Listener,
                    "l",
                    vec![listener("0.0.0.0_8080", "8080")],
                ));
                p.on_sotw(sotw(TypeUrl::Route, "r", vec![]));
            };
            let mut a = ProxyState::new(plan.clone(), Flavour::Mixed, 0);
            assert_eq!(a.flavour(), Flavour::Sotw);
            // One port's cluster missing: not converged.
            sotw_config(&mut a, &names[..3]);
            assert_eq!(
                a.gap(true).as_deref(),
                Some("cds has 3 of the 4 clusters of the 2 services")
            );
            sotw_config(&mut a, &names);
            assert!(a.is_complete(true), "{:?}", a.gap(true));

            // A Delta proxy receiving the same resources holds the same tables.
            let mut b = ProxyState::new(plan.clone(), Flavour::Mixed, 1);
            assert_eq!(b.flavour(), Flavour::Delta);
            b.start();
            let delta = |t: TypeUrl, resources: Vec<(String, ResourceAny)>| DeltaResponseLite {
                system_version_info: "v".into(),
                resources: resources
                    .into_iter()
                    .map(|(name, r)| DeltaResourceLite {
                        version: "1".into(),
                        resource: Some(r),
                        name,
                    })
                    .collect(),
                type_url: t.as_str().into(),
                nonce: "n".into(),
                removed_resources: vec![],
            };
            delta_config(&mut b, &names, delta);
            assert!(b.is_complete(true), "{:?}", b.gap(true));
            let shared = decode == crate::scenario::Decode::Lean;
            for t in [TypeUrl::Cluster, TypeUrl::Endpoint] {
                assert_eq!(
                    Arc::ptr_eq(a.table(t), b.table(t)),
                    shared,
                    "{decode:?} {t:?}"
                );
            }

            // The endpoint change shows in the HTTP port's assignment: both see it,
            // once, and (lean) move to one new table.
            let service = plan.changes[0].service.unwrap();
            let http = plan.cluster_name(service).to_string();
            let marked = assignment(&http, &[9080, u32::from(marker_port(0))]);
            let step = a.on_sotw(sotw(TypeUrl::Endpoint, "e2", vec![marked.clone()]));
            assert_eq!(step.observed, [0]);
            let step = b.on_delta(delta(TypeUrl::Endpoint, vec![(http.clone(), marked)]));
            assert_eq!(step.observed, [0]);
            assert_eq!(
                Arc::ptr_eq(a.table(TypeUrl::Endpoint), b.table(TypeUrl::Endpoint)),
                shared
            );
            let grpc = plan.cluster_names(service)[1].to_string();
            let step = a.on_sotw(sotw(
                TypeUrl::Endpoint,
                "e3",
                vec![assignment(&grpc, &[17070, 17070])],
            ));
            assert!(step.observed.is_empty());
            assert!(a.is_complete(false));
        }
    }

    #[test]
    fn a_delta_sidecar_resumes_with_what_it_holds_and_converges_on_the_answers() {
        let plan = plan(Mode::Sidecar);
        let names: Vec<String> = (0..2)
            .flat_map(|s| plan.cluster_names(s).iter().map(|n| n.to_string()))
            .collect();
        let delta = |t: TypeUrl, resources: Vec<(String, ResourceAny)>| DeltaResponseLite {
            system_version_info: "v".into(),
            resources: resources
                .into_iter()
                .map(|(name, r)| DeltaResourceLite {
                    version: format!("ver-{name}"),
                    resource: Some(r),
                    name,
                })
                .collect(),
            type_url: t.as_str().into(),
            nonce: "n".into(),
            removed_resources: vec![],
        };
        let mut p = ProxyState::new(plan.clone(), Flavour::Delta, 0);
        p.start();
        delta_config(&mut p, &names, delta);
        assert!(p.is_complete(true), "{:?}", p.gap(true));

        // A new stream: every subscription re-stated with the versions held.
        let requests = p.start();
        let requests: Vec<&DeltaDiscoveryRequest> = requests
            .iter()
            .map(|r| match r {
                Outgoing::Delta(r) => r,
                Outgoing::Sotw(_) => panic!("a sotw request from a delta proxy"),
            })
            .collect();
        let types: Vec<&str> = requests.iter().map(|r| r.type_url.as_str()).collect();
        assert_eq!(
            types,
            [
                TypeUrl::Cluster.as_str(),
                TypeUrl::Endpoint.as_str(),
                TypeUrl::Listener.as_str(),
                TypeUrl::Route.as_str()
            ]
        );
        let cds = requests[0];
        assert!(
            cds.resource_names_subscribe.is_empty(),
            "CDS stays wildcard"
        );
        assert_eq!(cds.initial_resource_versions.len(), names.len());
        for n in &names {
            assert_eq!(cds.initial_resource_versions[n], format!("ver-{n}"));
        }
        let eds = requests[1];
        let subscribed: BTreeSet<&str> = eds
            .resource_names_subscribe
            .iter()
            .map(|n| n.as_str())
            .collect();
        let held: BTreeSet<&str> = eds
            .initial_resource_versions
            .keys()
            .map(|n| n.as_str())
            .collect();
        assert_eq!(subscribed, held, "EDS re-subscribes what it holds");
        assert_eq!(requests[3].resource_names_subscribe, ["8080"]);
        assert!(
            requests[3].initial_resource_versions.is_empty(),
            "no route was held"
        );

        // Held, but not converged until the server answered each subscription.
        assert_eq!(
            p.gap(false).as_deref(),
            Some("no cds response since the stream resumed")
        );
        for t in FOLLOWED {
            assert!(!p.is_complete(false));
            p.on_delta(delta(t, vec![]));
        }
        assert!(p.is_complete(true), "{:?}", p.gap(true));

        // A state-of-the-world proxy starts over.
        let mut s = ProxyState::new(plan, Flavour::Sotw, 0);
        s.start();
        s.on_sotw(sotw(
            TypeUrl::Cluster,
            "c",
            names.iter().map(|n| cluster(n)).collect(),
        ));
        s.start();
        assert!(s.table(TypeUrl::Cluster).is_empty());
    }

    #[test]
    fn undecodable_responses_are_nacked() {
        let plan = plan(Mode::Sidecar);
        let mut p = ProxyState::new(plan, Flavour::Sotw, 0);
        p.start();
        let step = p.on_sotw(sotw(
            TypeUrl::Cluster,
            "1",
            vec![ResourceAny {
                value: vec![0xff, 0xff].into(),
            }],
        ));
        assert!(step.rejected.is_some());
        let Outgoing::Sotw(nack) = &step.requests[0] else {
            panic!()
        };
        assert!(nack.request.error_detail.is_some());
        assert_eq!(
            nack.request.version_info, "",
            "the last accepted version stays"
        );
    }
}

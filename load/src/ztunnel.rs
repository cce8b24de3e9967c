//! A simulated ztunnel (`mode: ztunnel`): one Delta ADS stream over its own HTTP/2
//! connection to the plaintext port, or over TLS to the secure port presenting the
//! certificate of the ztunnel service account (`istio-system/ztunnel`), as ztunnel opens it
//! to istiod:
//!
//! - node id `ztunnel~<ip>~ztunnel-<i>.istio-system~istio-system.svc.cluster.local`,
//!   metadata `NAME`, `NAMESPACE`, `INSTANCE_IPS` and `NODE_NAME` (`node-<i>`), a
//!   `clusterid` header;
//! - a first request per type (`istio.workload.Address`, then
//!   `istio.security.Authorization`), each with the node and no names (wildcard),
//!   and after a reconnect the names it holds in `initial_resource_versions` (with
//!   empty versions, as ztunnel sends them);
//! - every response ACKed with its type URL and nonce only.
//!
//! What it keeps ([`ZtunnelState`]) is what convergence and the changes need: per
//! Address name it holds (numbered by the shared [`AmbientPlan`]) a hash of its
//! version, and which changes it has seen. A resource body is decoded only when its
//! name is one a change shows under. Converged = a response of both types arrived and
//! every Workload and Service of the registry the run started with is held.

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use envoy_types::pb::google::rpc::Status;
use meshfed::model::proxy::json_to_struct;
use meshfed::xds::TypeUrl;
use meshfed_api::workload::{Address, address};
use prost::Message as _;
use tokio::sync::{mpsc, watch};

use super::ambient::{AmbientPlan, Expect};
use super::client::{endpoint, grpc_frame, open_stream, receive_window};
use super::lite::DeltaResponseLite;
use super::record::Recorder;

/// The Delta ADS method.
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// The two types a ztunnel watches, in the order it subscribes.
pub const TYPES: [TypeUrl; 2] = [TypeUrl::Address, TypeUrl::Authorization];

const VERSIONS: foldhash::fast::FixedState =
    foldhash::fast::FixedState::with_seed(0x7a74_756e_6e65_6c01);

fn version_hash(version: &str) -> u64 {
    VERSIONS.hash_one(version)
}

/// The node of ztunnel `index`, on node `node-<index>`.
pub fn node(index: usize) -> Node {
    let n = index as u32 + 1;
    let ip = format!("10.200.{}.{}", (n >> 8) & 0xff, n & 0xff);
    let name = format!("ztunnel-{index}");
    let metadata = serde_json::json!({
        "NAME": name,
        "NAMESPACE": "istio-system",
        "INSTANCE_IPS": ip,
        "NODE_NAME": format!("node-{index}"),
    });
    Node {
        id: format!("ztunnel~{ip}~{name}.istio-system~istio-system.svc.cluster.local"),
        metadata: Some(json_to_struct(&metadata)),
        ..Default::default()
    }
}

/// What one response did to a ztunnel.
#[derive(Debug, Default)]
pub struct Step {
    /// The ACK (or NACK) to send.
    pub ack: DeltaDiscoveryRequest,
    /// The response's type, when one of the two.
    pub type_url: Option<TypeUrl>,
    /// Resources and removals it carried.
    pub resources: usize,
    /// Changes it showed for the first time.
    pub observed: Vec<u32>,
    /// Why it was NACKed.
    pub rejected: Option<String>,
    /// Resources it carried at the version already held.
    pub redundant: u64,
    /// Names it carried that the run never made (a few).
    pub unexpected: Vec<String>,
}

/// What a simulated ztunnel holds (see the module docs).
#[derive(Debug)]
pub struct ZtunnelState {
    plan: Arc<AmbientPlan>,
    /// Address resources: name number -> hash of the version.
    held: HashMap<u32, u64>,
    /// Address names the plan does not know (the server sent what the run never
    /// made) -> version hash.
    pub unexpected: HashMap<String, u64>,
    /// Authorization resources: name -> version hash.
    authorizations: HashMap<String, u64>,
    /// Names of the starting registry held.
    initial_held: usize,
    /// A response of each type arrived on the current stream.
    answered: [bool; 2],
    /// Per change: seen.
    observed: Vec<bool>,
    /// Resources received at the version already held (sent again for nothing).
    pub redundant: u64,
}

impl ZtunnelState {
    /// A ztunnel holding nothing.
    pub fn new(plan: Arc<AmbientPlan>) -> ZtunnelState {
        ZtunnelState {
            observed: vec![false; plan.changes.len()],
            plan,
            held: HashMap::new(),
            unexpected: HashMap::new(),
            authorizations: HashMap::new(),
            initial_held: 0,
            answered: [false; 2],
            redundant: 0,
        }
    }

    /// The first requests of a stream: one per type, with the node, no names, and
    /// what it holds as `initial_resource_versions`.
    pub fn start(&mut self, node: &Node) -> Vec<DeltaDiscoveryRequest> {
        self.answered = [false; 2];
        TYPES
            .iter()
            .map(|t| {
                let initial_resource_versions = match t {
                    TypeUrl::Address => self
                        .held
                        .keys()
                        .map(|id| (self.plan.name(*id).to_string(), String::new()))
                        .chain(self.unexpected.keys().map(|n| (n.clone(), String::new())))
                        .collect(),
                    _ => self
                        .authorizations
                        .keys()
                        .map(|n| (n.clone(), String::new()))
                        .collect(),
                };
                DeltaDiscoveryRequest {
                    node: Some(node.clone()),
                    type_url: t.as_str().to_string(),
                    initial_resource_versions,
                    ..Default::default()
                }
            })
            .collect()
    }

    /// Every Workload and Service of the starting registry is held and both types
    /// have answered on this stream.
    pub fn is_converged(&self) -> bool {
        self.answered() && self.initial_held == self.plan.initial_count
    }

    /// A response of both types arrived on this stream (ztunnel is ready).
    pub fn answered(&self) -> bool {
        self.answered.iter().all(|a| *a)
    }

    /// Address resources held.
    pub fn held(&self) -> usize {
        self.held.len() + self.unexpected.len()
    }

    /// Whether name number `id` is held.
    pub fn holds(&self, id: u32) -> bool {
        self.held.contains_key(&id)
    }

    /// What it misses to be converged.
    pub fn gap(&self) -> String {
        let mut parts = Vec::new();
        for (t, answered) in TYPES.iter().zip(self.answered) {
            if !answered {
                parts.push(format!("no {} response", t.short()));
            }
        }
        let missing = self.plan.initial_count - self.initial_held;
        if missing > 0 {
            let some = self.plan.missing(|id| self.holds(id), 3);
            parts.push(format!(
                "{missing} of {} addresses missing (e.g. {some:?})",
                self.plan.initial_count
            ));
        }
        parts.join("; ")
    }

    fn observe(&mut self, change: u32, step: &mut Step) {
        if !std::mem::replace(&mut self.observed[change as usize], true) {
            step.observed.push(change);
        }
    }

    /// Applies a response and says what to send back.
    pub fn on_response(&mut self, response: DeltaResponseLite) -> Step {
        let mut step = Step {
            ack: DeltaDiscoveryRequest {
                type_url: response.type_url.clone(),
                response_nonce: response.nonce.clone(),
                ..Default::default()
            },
            resources: response.resources.len() + response.removed_resources.len(),
            ..Step::default()
        };
        match TypeUrl::parse(&response.type_url) {
            Some(TypeUrl::Address) => {
                step.type_url = Some(TypeUrl::Address);
                self.answered[0] = true;
                if let Err(reason) = self.on_addresses(response, &mut step) {
                    step.ack.error_detail = Some(Status {
                        code: 3,
                        message: reason.clone(),
                        ..Default::default()
                    });
                    step.rejected = Some(reason);
                }
            }
            Some(TypeUrl::Authorization) => {
                step.type_url = Some(TypeUrl::Authorization);
                self.answered[1] = true;
                for name in &response.removed_resources {
                    self.authorizations.remove(name);
                }
                for r in response.resources {
                    self.authorizations.insert(r.name, version_hash(&r.version));
                }
            }
            _ => {
                let reason = format!("a response of a type not asked for: {}", response.type_url);
                step.ack.error_detail = Some(Status {
                    code: 3,
                    message: reason.clone(),
                    ..Default::default()
                });
                step.rejected = Some(reason);
            }
        }
        step
    }

    fn on_addresses(&mut self, response: DeltaResponseLite, step: &mut Step) -> Result<(), String> {
        let plan = self.plan.clone();
        for name in &response.removed_resources {
            let Some(id) = plan.id(name) else {
                self.unexpected.remove(name);
                continue;
            };
            if self.held.remove(&id).is_some() && plan.is_initial(id) {
                self.initial_held -= 1;
            }
            for change in plan.changes_of(id) {
                if plan.changes[*change as usize].expect == Expect::Absent {
                    self.observe(*change, step);
                }
            }
        }
        for r in response.resources {
            let hash = version_hash(&r.version);
            let Some(id) = plan.id(&r.name) else {
                if step.unexpected.len() < 3 {
                    step.unexpected.push(r.name.clone());
                }
                self.unexpected.insert(r.name, hash);
                continue;
            };
            match self.held.insert(id, hash) {
                None if plan.is_initial(id) => self.initial_held += 1,
                Some(old) if old == hash => {
                    self.redundant += 1;
                    step.redundant += 1;
                }
                _ => {}
            }
            let changes = plan.changes_of(id);
            if changes.is_empty() {
                continue;
            }
            let body = r.resource.map(|a| a.value).unwrap_or_default();
            let revision = canonical_revision(&body)
                .map_err(|e| format!("{}: not an istio.workload.Address: {e}", r.name))?;
            // The newest label change this content shows; older ones on the same pod
            // were superseded by it (changes merged into one push count as seen).
            let shown = changes.iter().rev().find(|c| {
                matches!(&plan.changes[**c as usize].expect,
                    Expect::Revision(v) if Some(v.as_str()) == revision.as_deref())
            });
            for change in changes {
                match &plan.changes[*change as usize].expect {
                    Expect::Present => self.observe(*change, step),
                    Expect::Revision(_) if shown.is_some_and(|s| *change <= *s) => {
                        self.observe(*change, step);
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

/// The canonical revision of an Address body that is a Workload.
fn canonical_revision(body: &Bytes) -> Result<Option<String>, prost::DecodeError> {
    Ok(match Address::decode(body.clone())?.r#type {
        Some(address::Type::Workload(w)) => Some(w.canonical_revision),
        _ => None,
    })
}

/// The namespace ztunnel runs in (its node id's and its identity's).
const ZTUNNEL_NAMESPACE: &str = "istio-system";

/// Everything a simulated ztunnel needs.
#[derive(Clone, Debug)]
pub struct ZtunnelConfig {
    /// Its number (and its node's).
    pub index: usize,
    /// The run's expectations.
    pub plan: Arc<AmbientPlan>,
    /// The server's ADS address (the secure one with `tls`).
    pub address: SocketAddr,
    /// TLS to the secure port, presenting the ztunnel service account.
    pub tls: Option<Arc<crate::tls::ClientTls>>,
    /// The `clusterid` header.
    pub cluster_id: String,
    /// Where it reports.
    pub recorder: Arc<Recorder>,
    /// Bumped when the driver wants unconverged ztunnels to say what they miss.
    pub report: watch::Receiver<u64>,
    /// HTTP/2 receive window.
    pub ztunnels: usize,
}

/// Counts the ztunnel as a watcher of changes while its stream is up and converged.
struct Watching<'a>(&'a Recorder);

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.0.live_converged.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts the stream as connected while it lives.
struct Connected<'a>(&'a Recorder);

impl Drop for Connected<'_> {
    fn drop(&mut self) {
        self.0.connected.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What the ztunnels report besides the recorder's counters.
#[derive(Debug, Default, Clone)]
pub struct Leftover {
    /// Resources sent again at the version it held.
    pub redundant: u64,
    /// Names it held that the run never made (a few).
    pub unexpected: Vec<String>,
}

/// Runs a simulated ztunnel until its task is aborted; reconnects, as ztunnel, after
/// a failed stream (10 ms, doubling up to 15 s).
pub async fn run_ztunnel(mut config: ZtunnelConfig, leftovers: Arc<std::sync::Mutex<Leftover>>) {
    let started = Instant::now();
    let node = node(config.index);
    let mut state = ZtunnelState::new(config.plan.clone());
    let mut converged_once = false;
    let mut backoff = Duration::from_millis(10);
    loop {
        let result = stream(
            &mut config,
            &node,
            &mut state,
            started,
            &mut converged_once,
            &leftovers,
        )
        .await;
        let err = match result {
            Ok(()) => "stream ended by the server".to_string(),
            Err(err) => format!("{err:#}"),
        };
        let recorder = &config.recorder;
        recorder.stream_failures.fetch_add(1, Ordering::Relaxed);
        recorder.error(err);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(15));
    }
}

/// One stream, from connect to failure.
async fn stream(
    config: &mut ZtunnelConfig,
    node: &Node,
    state: &mut ZtunnelState,
    started: Instant,
    converged_once: &mut bool,
    leftovers: &std::sync::Mutex<Leftover>,
) -> anyhow::Result<()> {
    let recorder = config.recorder.clone();
    let window = receive_window(config.ztunnels);
    let channel = match &config.tls {
        None => {
            meshfed::testing::plain_connect(endpoint(config.address, window)?, config.address)
                .await?
        }
        Some(tls) => {
            let identity = crate::tls::spiffe_id(tls.trust_domain(), ZTUNNEL_NAMESPACE, "ztunnel");
            tls.connect(endpoint(config.address, window)?, config.address, &identity)
                .await?
        }
    };
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    for request in state.start(node) {
        tx.send(grpc_frame(&request))
            .map_err(|_| anyhow::anyhow!("request stream closed"))?;
    }
    let gate = crate::gate::ConnectionGate::new(None);
    let mut inbound = open_stream(channel, DELTA_PATH, rx, gate, Some(&config.cluster_id)).await?;
    recorder.connected.fetch_add(1, Ordering::SeqCst);
    let _connected = Connected(&recorder);
    let mut watching: Option<Watching<'_>> = None;
    let mut report_open = true;
    loop {
        let message = tokio::select! {
            message = inbound.message() => message?,
            changed = config.report.changed(), if report_open => {
                report_open = changed.is_ok();
                if report_open && watching.is_none() {
                    recorder.missing(format!("ztunnel {}: {}", config.index, state.gap()));
                }
                continue;
            }
        };
        let Some(bytes) = message else {
            return Ok(());
        };
        let size = bytes.len();
        let response = DeltaResponseLite::decode(bytes)
            .map_err(|e| anyhow::anyhow!("a response that is not a DeltaDiscoveryResponse: {e}"))?;
        let step = state.on_response(response);
        if let Some(t) = step.type_url {
            recorder.received(t, step.resources, size);
        }
        if let Some(reason) = &step.rejected {
            recorder.nacks.fetch_add(1, Ordering::Relaxed);
            recorder.error(format!("ztunnel {} NACKed: {reason}", config.index));
        }
        if step.redundant > 0 || !step.unexpected.is_empty() {
            let mut l = leftovers.lock().expect("leftovers");
            l.redundant += step.redundant;
            for name in &step.unexpected {
                if l.unexpected.len() < 10 && !l.unexpected.contains(name) {
                    l.unexpected.push(name.clone());
                }
            }
        }
        tx.send(grpc_frame(&step.ack))
            .map_err(|_| anyhow::anyhow!("request stream closed"))?;
        let acked = Instant::now();
        for change in step.observed {
            recorder.observe(change, acked);
        }
        // Once converged, a reconnected ztunnel watches again when both types have
        // answered (the churn may have removed pods of the starting registry).
        if watching.is_none() && (state.is_converged() || (*converged_once && state.answered())) {
            if !std::mem::replace(converged_once, true) {
                recorder.proxy_converged(acked.duration_since(started), acked);
            }
            recorder.live_converged.fetch_add(1, Ordering::SeqCst);
            watching = Some(Watching(&recorder));
        }
    }
}

#[cfg(test)]
mod tests {
    use meshfed_api::workload::Workload;

    use super::*;
    use crate::ambient::{AmbientRegistry, PodChangeKind};
    use crate::lite::{DeltaResourceLite, ResourceAny};
    use crate::scenario::{Churn, Flavour, Mode, Scenario};

    fn plan() -> (Arc<AmbientPlan>, Vec<String>) {
        let s = Scenario {
            mode: Mode::Ztunnel,
            flavour: Flavour::Delta,
            services: 2,
            endpoints_per_service: 2,
            proxies: 2,
            churn: Churn {
                pod_changes: 2,
                pod_adds: 1,
                pod_removes: 1,
                ..Churn::default()
            },
            ..Scenario::default()
        };
        let mut registry = AmbientRegistry::new(&s);
        let names = registry.address_names();
        let kinds = [
            PodChangeKind::Label,
            PodChangeKind::Add,
            PodChangeKind::Label,
            PodChangeKind::Remove,
        ];
        let _ = registry.plan(&s);
        (Arc::new(AmbientPlan::new(&registry, &kinds)), names)
    }

    fn workload(revision: &str) -> Bytes {
        Address {
            r#type: Some(address::Type::Workload(Workload {
                canonical_revision: revision.into(),
                ..Default::default()
            })),
        }
        .encode_to_vec()
        .into()
    }

    fn response(
        type_url: TypeUrl,
        nonce: &str,
        resources: &[(&str, &str, Bytes)],
        removed: &[&str],
    ) -> DeltaResponseLite {
        DeltaResponseLite {
            system_version_info: String::new(),
            type_url: type_url.as_str().into(),
            nonce: nonce.into(),
            resources: resources
                .iter()
                .map(|(name, version, body)| DeltaResourceLite {
                    name: name.to_string(),
                    version: version.to_string(),
                    resource: Some(ResourceAny {
                        value: body.clone(),
                    }),
                })
                .collect(),
            removed_resources: removed.iter().map(|n| n.to_string()).collect(),
        }
    }

    #[test]
    fn asks_like_ztunnel_and_acks_with_type_and_nonce_only() {
        let (plan, _) = plan();
        let mut z = ZtunnelState::new(plan);
        let node = node(7);
        assert_eq!(
            node.id,
            "ztunnel~10.200.0.8~ztunnel-7.istio-system~istio-system.svc.cluster.local"
        );
        let first = z.start(&node);
        assert_eq!(
            first
                .iter()
                .map(|r| r.type_url.as_str())
                .collect::<Vec<_>>(),
            [
                "type.googleapis.com/istio.workload.Address",
                "type.googleapis.com/istio.security.Authorization"
            ]
        );
        for r in &first {
            assert!(r.resource_names_subscribe.is_empty(), "wildcard");
            assert_eq!(r.node.as_ref().unwrap().id, node.id);
            assert!(r.initial_resource_versions.is_empty());
        }
        let step = z.on_response(response(TypeUrl::Authorization, "n1", &[], &[]));
        assert_eq!(
            step.ack,
            DeltaDiscoveryRequest {
                type_url: TypeUrl::Authorization.as_str().into(),
                response_nonce: "n1".into(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn converges_on_every_name_and_sees_each_change_once() {
        let (plan, names) = plan();
        let mut z = ZtunnelState::new(plan.clone());
        z.start(&node(0));
        let all: Vec<(&str, &str, Bytes)> = names
            .iter()
            .map(|n| (n.as_str(), "v1", workload("v1")))
            .collect();
        let step = z.on_response(response(TypeUrl::Address, "a", &all[1..], &[]));
        assert!(step.observed.is_empty() && step.rejected.is_none());
        assert!(!z.is_converged());
        assert!(z.gap().contains("1 of 6 addresses missing"), "{}", z.gap());
        assert!(z.gap().contains("no authorization response"), "{}", z.gap());
        z.on_response(response(TypeUrl::Address, "b", &all[..1], &[]));
        z.on_response(response(TypeUrl::Authorization, "c", &[], &[]));
        assert!(z.is_converged(), "{}", z.gap());

        // Change 0 (a label) is seen when the pod's Workload shows its revision; the
        // same content again is redundant and sees nothing new.
        let label = &plan.changes[0];
        let shown = (label.name.as_str(), "v2", workload("load-change-0"));
        assert_eq!(
            z.on_response(response(
                TypeUrl::Address,
                "d",
                std::slice::from_ref(&shown),
                &[]
            ))
            .observed,
            [0]
        );
        let again = z.on_response(response(TypeUrl::Address, "e", &[shown], &[]));
        assert!(again.observed.is_empty());
        assert_eq!((again.redundant, z.redundant), (1, 1));
        // The added pod (1), then the second label change (2), seen once.
        let added = (plan.changes[1].name.as_str(), "v1", workload("v1"));
        assert_eq!(
            z.on_response(response(TypeUrl::Address, "f", &[added], &[]))
                .observed,
            [1]
        );
        let second = &plan.changes[2];
        let body = workload("load-change-2");
        let step = z.on_response(response(
            TypeUrl::Address,
            "g",
            &[(second.name.as_str(), "v3", body)],
            &[],
        ));
        assert_eq!(step.observed, [2]);
        // The removal (3): the added pod goes.
        let step = z.on_response(response(
            TypeUrl::Address,
            "h",
            &[],
            &[plan.changes[3].name.as_str()],
        ));
        assert_eq!(step.observed, [3]);
        assert!(
            z.is_converged(),
            "the starting registry's names are still held"
        );

        // A reconnect sends every held name, versions empty, and waits for both types.
        let again = z.start(&node(0));
        assert_eq!(again[0].initial_resource_versions.len(), z.held());
        assert!(
            again[0]
                .initial_resource_versions
                .values()
                .all(String::is_empty)
        );
        assert!(!z.is_converged());
    }

    #[test]
    fn merged_label_changes_count_as_seen_and_garbage_is_nacked() {
        let (plan, _) = plan();
        let mut z = ZtunnelState::new(plan.clone());
        // Changes 0 and 2 may touch the same pod; the newest revision shown sees every
        // older label change on it.
        let (a, b) = (&plan.changes[0], &plan.changes[2]);
        let step = z.on_response(response(
            TypeUrl::Address,
            "a",
            &[(b.name.as_str(), "v9", workload("load-change-2"))],
            &[],
        ));
        if a.name == b.name {
            assert_eq!(step.observed, [0, 2]);
        } else {
            assert_eq!(step.observed, [2]);
        }
        let garbage = Bytes::from_static(&[0xff, 0xff, 0xff]);
        let step = z.on_response(response(
            TypeUrl::Address,
            "b",
            &[(a.name.as_str(), "v10", garbage)],
            &[],
        ));
        assert!(step.rejected.is_some());
        assert_eq!(step.ack.error_detail.as_ref().unwrap().code, 3);
        let step = z.on_response(response(TypeUrl::Cluster, "c", &[], &[]));
        assert!(step.rejected.unwrap().contains("not asked for"));
        let step = z.on_response(response(
            TypeUrl::Address,
            "d",
            &[("x/y", "1", workload("v1"))],
            &[],
        ));
        assert!(step.rejected.is_none());
        assert_eq!(step.unexpected, ["x/y"]);
        assert_eq!(z.unexpected.len(), 1, "a name the run never made");
    }
}

//! The mock registry of `mode: ztunnel`: ambient pods behind services, spread over
//! nodes, changed one pod at a time; and the plan of what every ztunnel must hold
//! (the Address resource names) and how each change shows in it.
//!
//! - Service `j` is `svc-<j>.load-<j % namespaces>.svc.cluster.local`, VIP
//!   `10.96.x.y`, one port `http` 8080 -> 9080; the server sends it as the Address
//!   named `<namespace>/<hostname>`.
//! - Its pods `pod-<j>-<k>` (`172.16.x.y`) carry `istio.io/dataplane-mode: ambient`,
//!   `app: svc-<j>`, `version: v1`, the service account `default` of their namespace,
//!   and run on node `node-<p % nodes>` (`p`: the pod's number in the file); each is
//!   the Workload whose uid the mock registry gives it,
//!   `/mock/<namespace>/<hostname>/<pod>` (an empty cluster id: the mock registry's).
//! - A pod change sets one random pod's `version` label to `load-change-<i>`: its
//!   Workload's canonical revision says which change a ztunnel holds. A pod add gives
//!   a random service a pod `pod-add-<n>`; a pod remove takes an added pod away, else
//!   a random original one.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::sync::Arc;

use serde::Serialize;

use super::registry::{SplitMix, namespace_name};
use super::scenario::Scenario;

/// The service port of every service (HTTP).
pub const SERVICE_PORT: u16 = 8080;
/// The port every pod serves on.
pub const TARGET_PORT: u16 = 9080;
/// The `version` label of a pod no change has touched.
pub const INITIAL_VERSION: &str = "v1";
/// The prefix of the `version` label a pod change sets (then the change number).
pub const VERSION_MARKER: &str = "load-change-";

/// One kind of pod change.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum PodChangeKind {
    /// A pod's `version` label changed.
    Label,
    /// A pod was added.
    Add,
    /// A pod was removed.
    Remove,
}

impl PodChangeKind {
    /// Name in tables and JSON.
    pub fn label(self) -> &'static str {
        match self {
            PodChangeKind::Label => "pod_change",
            PodChangeKind::Add => "pod_add",
            PodChangeKind::Remove => "pod_remove",
        }
    }
}

/// What a ztunnel holds once it has a change.
#[derive(Clone, Debug, PartialEq)]
pub enum Expect {
    /// The Workload with this canonical revision.
    Revision(String),
    /// The Workload, whatever it says.
    Present,
    /// No such resource.
    Absent,
}

/// A change as applied: its kind, the Address resource it shows in, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct PodChange {
    /// What kind.
    pub kind: PodChangeKind,
    /// The Workload's uid (its resource name).
    pub name: String,
    /// What a ztunnel that has the change holds under that name.
    pub expect: Expect,
}

#[derive(Clone, Debug)]
struct Pod {
    service: usize,
    name: String,
    ip: Ipv4Addr,
    node: usize,
    version: String,
    present: bool,
}

/// The ambient mock registry's current content.
#[derive(Clone, Debug)]
pub struct AmbientRegistry {
    namespaces: usize,
    services: usize,
    nodes: usize,
    pods: Vec<Pod>,
    added: usize,
    /// Added pods not removed yet, oldest first.
    removable_added: std::collections::VecDeque<usize>,
    rng: SplitMix,
}

impl AmbientRegistry {
    /// The registry a ztunnel scenario starts with.
    pub fn new(scenario: &Scenario) -> AmbientRegistry {
        let mut registry = AmbientRegistry {
            namespaces: scenario.namespaces,
            services: scenario.services,
            nodes: scenario.node_count().max(1),
            pods: Vec::with_capacity(
                scenario.services * scenario.endpoints_per_service + scenario.churn.pod_adds,
            ),
            added: 0,
            removable_added: Default::default(),
            rng: SplitMix(scenario.seed),
        };
        for j in 0..scenario.services {
            for k in 0..scenario.endpoints_per_service {
                registry.push_pod(j, format!("pod-{j}-{k}"));
            }
        }
        registry
    }

    fn push_pod(&mut self, service: usize, name: String) -> usize {
        let p = self.pods.len();
        let n = u32::try_from(p).unwrap_or(u32::MAX) + 1;
        self.pods.push(Pod {
            service,
            name,
            ip: Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 16, 0, 0)).wrapping_add(n)),
            node: p % self.nodes,
            version: INITIAL_VERSION.to_string(),
            present: true,
        });
        p
    }

    fn namespace(&self, service: usize) -> String {
        namespace_name(service % self.namespaces)
    }

    /// The hostname of service `j`.
    pub fn host(&self, service: usize) -> String {
        format!(
            "svc-{service}.{}.svc.cluster.local",
            self.namespace(service)
        )
    }

    /// The Address resource name of service `j` (`namespace/hostname`).
    pub fn service_name(&self, service: usize) -> String {
        format!("{}/{}", self.namespace(service), self.host(service))
    }

    /// The Workload uid of pod `p` as the server names it.
    fn uid(&self, p: usize) -> String {
        let pod = &self.pods[p];
        format!(
            "/mock/{}/{}/{}",
            self.namespace(pod.service),
            self.host(pod.service),
            pod.name
        )
    }

    /// Every Address resource name the server sends now: services, then the
    /// Workloads of the pods present.
    pub fn address_names(&self) -> Vec<String> {
        let mut names: Vec<String> = (0..self.services).map(|j| self.service_name(j)).collect();
        names.extend(
            (0..self.pods.len())
                .filter(|p| self.pods[*p].present)
                .map(|p| self.uid(p)),
        );
        names
    }

    /// The order of the churn: the scenario's pod changes, shuffled with its seed.
    pub fn plan(&mut self, scenario: &Scenario) -> Vec<PodChangeKind> {
        let churn = &scenario.churn;
        let mut plan = Vec::with_capacity(churn.pod_total());
        plan.extend(std::iter::repeat_n(PodChangeKind::Label, churn.pod_changes));
        plan.extend(std::iter::repeat_n(PodChangeKind::Add, churn.pod_adds));
        plan.extend(std::iter::repeat_n(
            PodChangeKind::Remove,
            churn.pod_removes,
        ));
        for i in (1..plan.len()).rev() {
            let j = self.rng.below(i + 1);
            plan.swap(i, j);
        }
        plan
    }

    fn random_present_pod(&mut self) -> usize {
        loop {
            let p = self.rng.below(self.pods.len());
            if self.pods[p].present {
                return p;
            }
        }
    }

    /// Applies change number `index` of kind `kind`.
    pub fn apply(&mut self, index: usize, kind: PodChangeKind) -> PodChange {
        match kind {
            PodChangeKind::Label => {
                let p = self.random_present_pod();
                let version = format!("{VERSION_MARKER}{index}");
                self.pods[p].version = version.clone();
                PodChange {
                    kind,
                    name: self.uid(p),
                    expect: Expect::Revision(version),
                }
            }
            PodChangeKind::Add => {
                let service = self.rng.below(self.services);
                let n = self.added;
                self.added += 1;
                let p = self.push_pod(service, format!("pod-add-{n}"));
                self.removable_added.push_back(p);
                PodChange {
                    kind,
                    name: self.uid(p),
                    expect: Expect::Present,
                }
            }
            PodChangeKind::Remove => {
                let p = match self.removable_added.pop_front() {
                    Some(p) => p,
                    None => self.random_present_pod(),
                };
                self.pods[p].present = false;
                PodChange {
                    kind,
                    name: self.uid(p),
                    expect: Expect::Absent,
                }
            }
        }
    }

    /// The mock-registry file as JSON (which is YAML too), rewritten whole on every
    /// change.
    pub fn render(&self) -> String {
        let mut by_service: Vec<Vec<usize>> = vec![Vec::new(); self.services];
        for (p, pod) in self.pods.iter().enumerate() {
            if pod.present {
                by_service[pod.service].push(p);
            }
        }
        let mut out = String::with_capacity(64 + self.pods.len() * 330);
        out.push_str("{\"services\": [");
        for (j, pods) in by_service.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            let ns = self.namespace(j);
            let vip = Ipv4Addr::from(
                u32::from(Ipv4Addr::new(10, 96, 0, 0))
                    .wrapping_add(u32::try_from(j).unwrap_or(u32::MAX) + 1),
            );
            // Names, namespaces and addresses are generated: nothing to escape.
            let _ = write!(
                out,
                "\n{{\"hostname\": \"{}\", \"namespace\": \"{ns}\", \"addresses\": [\"{vip}\"], \
                 \"ports\": [{{\"name\": \"http\", \"port\": {SERVICE_PORT}, \"protocol\": \"HTTP\"}}], \
                 \"endpoints\": [",
                self.host(j)
            );
            for (i, p) in pods.iter().enumerate() {
                let pod = &self.pods[*p];
                let comma = if i == 0 { "" } else { "," };
                let _ = write!(
                    out,
                    "{comma}\n  {{\"address\": \"{}\", \"name\": \"{}\", \"node\": \"node-{}\", \
                     \"ports\": {{\"http\": {TARGET_PORT}}}, \
                     \"serviceAccount\": \"spiffe://cluster.local/ns/{ns}/sa/default\", \
                     \"labels\": {{\"istio.io/dataplane-mode\": \"ambient\", \"app\": \"svc-{j}\", \
                     \"version\": \"{}\"}}}}",
                    pod.ip, pod.name, pod.node, pod.version
                );
            }
            out.push_str("]}");
        }
        out.push_str("\n]}\n");
        out
    }
}

/// What every ztunnel must hold and how each change shows, fixed before the first
/// ztunnel connects; shared read-only by all. Names are numbered so that a ztunnel
/// keeps numbers, not text.
#[derive(Debug)]
pub struct AmbientPlan {
    /// Every Address name the run will ever have, by number.
    names: Vec<Arc<str>>,
    ids: HashMap<Arc<str>, u32>,
    /// Per name number: held before the churn (what convergence needs).
    initial: Vec<bool>,
    /// How many names are held before the churn.
    pub initial_count: usize,
    /// Services (the first names) before the churn.
    pub services: usize,
    /// Every change, in order.
    pub changes: Vec<PodChange>,
    /// Per name number: the changes that show under it, ascending.
    by_name: HashMap<u32, Vec<u32>>,
}

impl AmbientPlan {
    /// Works the churn out on a copy of `registry` (in the state the run starts from,
    /// its plan drawn) so the run, applying `kinds` in the same order, makes exactly
    /// these changes.
    pub fn new(registry: &AmbientRegistry, kinds: &[PodChangeKind]) -> AmbientPlan {
        let initial_names = registry.address_names();
        let mut dry = registry.clone();
        let changes: Vec<PodChange> = kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| dry.apply(i, *kind))
            .collect();
        let mut plan = AmbientPlan {
            names: Vec::new(),
            ids: HashMap::new(),
            initial: Vec::new(),
            initial_count: initial_names.len(),
            services: registry.services,
            changes: Vec::new(),
            by_name: HashMap::new(),
        };
        for name in initial_names {
            let id = plan.intern(&name);
            plan.initial[id as usize] = true;
        }
        for (i, change) in changes.iter().enumerate() {
            let id = plan.intern(&change.name);
            plan.by_name.entry(id).or_default().push(i as u32);
        }
        plan.changes = changes;
        plan
    }

    fn intern(&mut self, name: &str) -> u32 {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = u32::try_from(self.names.len()).expect("fewer than 4 billion names");
        let name: Arc<str> = Arc::from(name);
        self.names.push(name.clone());
        self.ids.insert(name, id);
        self.initial.push(false);
        id
    }

    /// The number of a name the plan knows.
    pub fn id(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    /// The name of a number.
    pub fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }

    /// Whether the name is held before the churn.
    pub fn is_initial(&self, id: u32) -> bool {
        self.initial[id as usize]
    }

    /// The changes that show under name `id`, ascending.
    pub fn changes_of(&self, id: u32) -> &[u32] {
        self.by_name.get(&id).map_or(&[], Vec::as_slice)
    }

    /// Initial names not in `held` (the first `limit`), for reports.
    pub fn missing(&self, held: impl Fn(u32) -> bool, limit: usize) -> Vec<&str> {
        (0..self.names.len() as u32)
            .filter(|id| self.is_initial(*id) && !held(*id))
            .take(limit)
            .map(|id| self.name(id))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use meshfed_registry::mock_file::parse_mock_registry;

    use super::*;
    use crate::scenario::{Churn, Flavour, Mode};

    fn scenario() -> Scenario {
        Scenario {
            mode: Mode::Ztunnel,
            flavour: Flavour::Delta,
            services: 4,
            endpoints_per_service: 3,
            namespaces: 2,
            proxies: 5,
            churn: Churn {
                pod_changes: 3,
                pod_adds: 2,
                pod_removes: 3,
                ..Churn::default()
            },
            ..Scenario::default()
        }
    }

    #[test]
    fn the_file_holds_ambient_pods_spread_over_the_nodes() {
        let s = scenario();
        let registry = AmbientRegistry::new(&s);
        let path = std::path::Path::new("ambient.json");
        let services = parse_mock_registry(path, &registry.render()).unwrap();
        assert_eq!(services.len(), 4);
        let mut nodes = std::collections::BTreeSet::new();
        let mut uids = Vec::new();
        for s in &services {
            assert_eq!(s.endpoints.len(), 3);
            for ep in &s.endpoints {
                let meta = ep.workload.as_deref().unwrap();
                assert_eq!(meta.dataplane_mode, "ambient");
                assert!(
                    ep.service_account
                        .as_deref()
                        .unwrap()
                        .ends_with("/sa/default")
                );
                nodes.insert(meta.node_name.clone());
                uids.push(meta.uid.clone());
            }
        }
        assert_eq!(
            nodes.len(),
            5,
            "12 pods over the 5 ztunnels' nodes: {nodes:?}"
        );
        let mut expected = registry.address_names();
        assert_eq!(expected.len(), 4 + 12);
        assert_eq!(expected[0], "load-0/svc-0.load-0.svc.cluster.local");
        let workloads = expected.split_off(4);
        uids.sort();
        let mut sorted = workloads.clone();
        sorted.sort();
        assert_eq!(
            uids, sorted,
            "the plan names workloads as the registry does"
        );
    }

    #[test]
    fn the_plan_is_the_run() {
        let s = scenario();
        let mut registry = AmbientRegistry::new(&s);
        let kinds = registry.plan(&s);
        assert_eq!(kinds.len(), 8);
        let plan = AmbientPlan::new(&registry, &kinds);
        assert_eq!(plan.initial_count, 16);
        for (i, kind) in kinds.iter().enumerate() {
            let change = registry.apply(i, *kind);
            assert_eq!(change, plan.changes[i]);
            let id = plan.id(&change.name).unwrap();
            assert!(plan.changes_of(id).contains(&(i as u32)));
            match kind {
                PodChangeKind::Label => {
                    assert_eq!(change.expect, Expect::Revision(format!("load-change-{i}")));
                    assert!(registry.render().contains(&format!("\"load-change-{i}\"")));
                }
                PodChangeKind::Add => assert!(!plan.is_initial(id)),
                PodChangeKind::Remove => assert_eq!(change.expect, Expect::Absent),
            }
        }
        // 3 removals, the 2 added pods first.
        assert_eq!(registry.address_names().len(), 16 + 2 - 3);
        let services = parse_mock_registry(std::path::Path::new("x.json"), &registry.render());
        assert_eq!(services.unwrap().len(), 4, "services stay when pods go");
    }
}

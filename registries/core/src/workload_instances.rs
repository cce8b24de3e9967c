//! WorkloadEntries as Kubernetes registries see them: the feed through which a
//! Kubernetes Service selects WorkloadEntries (Istio's
//! `PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES`, on by default).
//!
//! The ServiceEntry registry reads every WorkloadEntry of every config store; after
//! each of its refreshes it publishes them here ([`WorkloadEntryFeed::publish`]) in a
//! compact, port-less form ([`WorkloadEntryInstance`]), grouped by namespace. A
//! Kubernetes registry subscribes ([`WorkloadEntryFeed::subscribe`]) and adds the
//! entries of a Service's namespace whose labels its selector matches to that
//! Service's endpoints, in its own shard, with the Service's target ports.
//!
//! Publishing keeps the `Arc` of every namespace whose entries did not change, so a
//! subscriber finds what changed by comparing pointers, namespace by namespace, and
//! recomputes only the Services of the namespaces that did.
//!
//! What is published, as Istio's ServiceEntry controller announces WorkloadEntries to
//! the Kubernetes controller (`convertWorkloadEntryToWorkloadInstance`):
//! - entries whose address is an IP, and entries with no address (reachable only
//!   through their network's gateway); not those with a host name or a `unix://`
//!   address, which only DNS ServiceEntries can use;
//! - labels: the spec's, with the object's metadata labels on top;
//! - network: the `network` field only (Istio's instance has no other source for it);
//! - locality: `locality`, else the `topology.istio.io/locality` label (else the
//!   legacy `istio-locality` one, dots for slashes);
//! - TLS mode: the `security.istio.io/tlsMode` label, else `istio` when the entry has
//!   a service account, else `disabled`;
//! - ports (service port name or target port name -> port on the workload), weight
//!   and the service account's name as given;
//! - health: a health-checked entry (`proxy.istio.io/health-checks-enabled`) whose
//!   `Healthy` condition is not `True` is unhealthy, and leaves EDS like any
//!   unhealthy endpoint.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use tokio::sync::watch;

use crate::config::ConfigObject;
use crate::model::{HealthStatus, Locality, NetworkId, TlsMode};

/// The label that sets an endpoint's TLS mode.
const LABEL_TLS_MODE: &str = "security.istio.io/tlsMode";
/// The label that gives a workload's locality (`region/zone/subzone`).
const LABEL_LOCALITY: &str = "topology.istio.io/locality";
/// The legacy locality label (`region.zone.subzone`).
const LABEL_LOCALITY_LEGACY: &str = "istio-locality";

/// One WorkloadEntry, as a Kubernetes Service that selects it needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadEntryInstance {
    /// `metadata.name`.
    pub name: String,
    /// The workload's IP; `None` for an entry without an address.
    pub address: Option<IpAddr>,
    /// Spec labels with the metadata labels on top (what selectors match).
    pub labels: BTreeMap<String, String>,
    /// `ports`: a (service or target) port name -> the port on the workload.
    pub ports: BTreeMap<String, u32>,
    /// `network` (empty when not set).
    pub network: NetworkId,
    /// `locality`, else the locality labels.
    pub locality: Locality,
    /// `weight` (0 when not set).
    pub weight: u32,
    /// `serviceAccount` as given (a name in the entry's namespace), empty when unset.
    pub service_account: String,
    /// From the TLS mode label, else the service account.
    pub tls_mode: TlsMode,
    /// Unhealthy while a health-checked entry's `Healthy` condition is not `True`
    /// ([`workload_entry_health`]).
    pub health: HealthStatus,
    /// `metadata.creationTimestamp`.
    pub creation_time: std::time::SystemTime,
}

impl WorkloadEntryInstance {
    /// The instance of a WorkloadEntry object; `None` for objects of another kind and
    /// for entries no Kubernetes Service can use (a host name or `unix://` address).
    pub fn from_object(obj: &ConfigObject) -> Option<WorkloadEntryInstance> {
        let we = obj.spec.as_workload_entry()?;
        let address = if we.address.is_empty() {
            None
        } else {
            Some(we.address.parse::<IpAddr>().ok()?)
        };
        let mut labels = we.labels.clone();
        labels.extend(obj.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        let locality = if !we.locality.is_empty() {
            Locality::parse(&we.locality)
        } else if let Some(l) = labels.get(LABEL_LOCALITY).filter(|l| !l.is_empty()) {
            Locality::parse(&l.replace('.', "/"))
        } else if let Some(l) = labels.get(LABEL_LOCALITY_LEGACY).filter(|l| !l.is_empty()) {
            Locality::parse(&l.replace('.', "/"))
        } else {
            Locality::default()
        };
        let tls_mode = match labels.get(LABEL_TLS_MODE) {
            Some(mode) if mode == TlsMode::Istio.as_str() => TlsMode::Istio,
            Some(_) => TlsMode::Disabled,
            None if !we.service_account.is_empty() => TlsMode::Istio,
            None => TlsMode::Disabled,
        };
        Some(WorkloadEntryInstance {
            name: obj.name.clone(),
            address,
            labels,
            ports: we.ports.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            network: NetworkId::new(&we.network),
            locality,
            weight: we.weight,
            service_account: we.service_account.clone(),
            creation_time: obj.creation_time,
            tls_mode,
            health: workload_entry_health(obj),
        })
    }

    /// Whether every label of `selector` is on this entry; an empty selector matches
    /// nothing (a Service without a selector selects no workload).
    pub fn selected_by(&self, selector: &BTreeMap<String, String>) -> bool {
        !selector.is_empty() && selector.iter().all(|(k, v)| self.labels.get(k) == Some(v))
    }
}

/// The annotation that makes a WorkloadEntry's `Healthy` condition count (set on
/// auto-registered entries whose proxy has a readiness probe).
pub const ANNOTATION_HEALTH_CHECKS: &str = "proxy.istio.io/health-checks-enabled";

/// A WorkloadEntry's health as Istio's `IsHealthy` reads it: healthy unless its
/// `proxy.istio.io/health-checks-enabled` annotation is `"true"`; then healthy only
/// with a `Healthy` condition whose status is `True` (unhealthy until the agent has
/// reported).
pub fn workload_entry_health(obj: &ConfigObject) -> HealthStatus {
    if obj
        .annotations
        .get(ANNOTATION_HEALTH_CHECKS)
        .map(String::as_str)
        != Some("true")
    {
        return HealthStatus::Healthy;
    }
    match obj.condition("Healthy") {
        Some(c) if c.status == "True" => HealthStatus::Healthy,
        _ => HealthStatus::Unhealthy,
    }
}

/// The entries of one namespace, by name.
pub type NamespaceEntries = BTreeMap<String, Arc<WorkloadEntryInstance>>;

/// Every published WorkloadEntry, by namespace. A namespace whose entries did not
/// change between two publications keeps its `Arc`.
pub type WorkloadEntrySet = BTreeMap<String, Arc<NamespaceEntries>>;

/// The channel from the ServiceEntry registry to the Kubernetes registries. Cheap to
/// clone; clones share one channel. [`WorkloadEntryFeed::none`] is a feed nobody
/// publishes to (a registry that subscribes sees no entries).
#[derive(Clone)]
pub struct WorkloadEntryFeed {
    sender: Arc<watch::Sender<Arc<WorkloadEntrySet>>>,
    /// False for [`WorkloadEntryFeed::disabled`]: publishing does nothing.
    enabled: bool,
}

/// Counts, not the entries (a registry's settings are logged with their feed).
impl std::fmt::Debug for WorkloadEntryFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.sender.borrow();
        f.debug_struct("WorkloadEntryFeed")
            .field("enabled", &self.enabled)
            .field("namespaces", &set.len())
            .field("entries", &set.values().map(|n| n.len()).sum::<usize>())
            .finish()
    }
}

impl Default for WorkloadEntryFeed {
    fn default() -> Self {
        WorkloadEntryFeed::none()
    }
}

/// Feeds compare equal whatever they carry (a registry's settings hold one, and two
/// settings that differ only in their feed are the same settings).
impl PartialEq for WorkloadEntryFeed {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl WorkloadEntryFeed {
    /// An empty feed.
    pub fn new() -> WorkloadEntryFeed {
        WorkloadEntryFeed {
            sender: Arc::new(watch::Sender::new(Arc::default())),
            enabled: true,
        }
    }

    /// A feed that stays empty whatever is published to it: Services select no
    /// WorkloadEntries (`PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES=false`).
    pub fn disabled() -> WorkloadEntryFeed {
        WorkloadEntryFeed {
            enabled: false,
            ..WorkloadEntryFeed::new()
        }
    }

    /// A feed nobody publishes to.
    pub fn none() -> WorkloadEntryFeed {
        WorkloadEntryFeed::new()
    }

    /// A receiver of every publication, starting with the current set (marked seen).
    pub fn subscribe(&self) -> watch::Receiver<Arc<WorkloadEntrySet>> {
        self.sender.subscribe()
    }

    /// The current set.
    pub fn current(&self) -> Arc<WorkloadEntrySet> {
        self.sender.borrow().clone()
    }

    /// Publishes the WorkloadEntries among `objects` (other kinds are ignored). Only
    /// the namespaces whose entries changed get a new `Arc`; subscribers are woken only
    /// when one did. Returns whether anything changed.
    pub fn publish(&self, objects: &[Arc<ConfigObject>]) -> bool {
        if !self.enabled {
            return false;
        }
        let mut next: BTreeMap<String, NamespaceEntries> = BTreeMap::new();
        for obj in objects {
            if let Some(instance) = WorkloadEntryInstance::from_object(obj) {
                // Equal objects from several stores: the first store's wins.
                next.entry(obj.namespace.clone())
                    .or_default()
                    .entry(obj.name.clone())
                    .or_insert_with(|| Arc::new(instance));
            }
        }
        self.sender.send_if_modified(|current| {
            let mut set = WorkloadEntrySet::new();
            let mut changed = next.len() != current.len();
            for (namespace, entries) in next {
                match current.get(&namespace) {
                    Some(old) if **old == entries => {
                        set.insert(namespace, old.clone());
                    }
                    _ => {
                        changed = true;
                        set.insert(namespace, Arc::new(entries));
                    }
                }
            }
            if changed {
                *current = Arc::new(set);
            }
            changed
        })
    }
}

/// The entries that differ between two versions of one namespace (added, removed or
/// changed), each as it was and as it is.
pub fn changed_entries<'a>(
    old: Option<&'a NamespaceEntries>,
    new: Option<&'a NamespaceEntries>,
) -> Vec<(
    Option<&'a WorkloadEntryInstance>,
    Option<&'a WorkloadEntryInstance>,
)> {
    let get =
        |map: Option<&'a NamespaceEntries>, name: &str| map.and_then(|m| m.get(name)).map(|e| &**e);
    let names: BTreeSet<&'a String> = old
        .into_iter()
        .flat_map(|m| m.keys())
        .chain(new.into_iter().flat_map(|m| m.keys()))
        .collect();
    names
        .into_iter()
        .filter_map(|name| {
            let (before, after) = (get(old, name), get(new, name));
            (before != after).then_some((before, after))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshfed_api::networking::v1alpha3 as net;

    fn entry(ns: &str, name: &str, address: &str, labels: &[(&str, &str)]) -> Arc<ConfigObject> {
        let we = net::WorkloadEntry {
            address: address.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        Arc::new(ConfigObject::new(ns, name, we))
    }

    #[test]
    fn entries_convert_as_istio_announces_them() {
        let mut we = net::WorkloadEntry {
            address: "10.0.0.1".into(),
            labels: [("app".to_string(), "a".to_string())].into(),
            network: "net-2".into(),
            locality: "r/z/s".into(),
            weight: 3,
            service_account: "vm".into(),
            ..Default::default()
        };
        we.ports.insert("http".into(), 9080);
        let mut obj = ConfigObject::new("ns", "vm-1", we);
        obj.labels.insert("app".into(), "b".into());
        obj.labels
            .insert(LABEL_LOCALITY.into(), "ignored.by.field".into());
        let i = WorkloadEntryInstance::from_object(&obj).unwrap();
        assert_eq!(i.address, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(i.labels["app"], "b", "metadata labels win");
        assert_eq!(i.network.as_str(), "net-2");
        assert_eq!(i.locality.to_string(), "r/z/s");
        assert_eq!(i.weight, 3);
        assert_eq!(i.ports["http"], 9080);
        assert_eq!(i.tls_mode, TlsMode::Istio, "a service account means mTLS");

        let labelled = entry(
            "ns",
            "x",
            "",
            &[(LABEL_LOCALITY, "r.z"), ("topology.istio.io/network", "n")],
        );
        let i = WorkloadEntryInstance::from_object(&labelled).unwrap();
        assert_eq!(i.address, None, "an address-less entry is announced");
        assert_eq!(i.locality.to_string(), "r/z/");
        assert!(i.network.is_empty(), "only the network field sets it");
        assert_eq!(i.tls_mode, TlsMode::Disabled);

        for address in ["vm.example.com", "unix:///sock"] {
            assert!(WorkloadEntryInstance::from_object(&entry("ns", "x", address, &[])).is_none());
        }
    }

    #[test]
    fn empty_selectors_select_nothing() {
        let i = WorkloadEntryInstance::from_object(&entry("ns", "x", "1.1.1.1", &[("app", "a")]))
            .unwrap();
        assert!(!i.selected_by(&BTreeMap::new()));
        assert!(i.selected_by(&[("app".to_string(), "a".to_string())].into()));
        assert!(!i.selected_by(&[("app".to_string(), "b".to_string())].into()));
    }

    #[test]
    fn publishing_keeps_unchanged_namespaces_and_wakes_only_on_change() {
        let feed = WorkloadEntryFeed::new();
        let mut rx = feed.subscribe();
        let a = entry("a", "vm", "1.1.1.1", &[("app", "a")]);
        let b = entry("b", "vm", "2.2.2.2", &[("app", "b")]);
        assert!(feed.publish(&[a.clone(), b.clone()]));
        assert!(rx.has_changed().unwrap());
        let first = rx.borrow_and_update().clone();
        assert!(!feed.publish(&[a.clone(), b.clone()]), "same content");
        assert!(!rx.has_changed().unwrap());

        let b2 = entry("b", "vm", "2.2.2.3", &[("app", "b")]);
        assert!(feed.publish(&[a.clone(), b2]));
        let second = rx.borrow_and_update().clone();
        assert!(Arc::ptr_eq(&first["a"], &second["a"]), "a kept its Arc");
        assert!(!Arc::ptr_eq(&first["b"], &second["b"]));
        let changed = changed_entries(Some(&first["b"]), Some(&second["b"]));
        assert_eq!(changed.len(), 1);
        assert_eq!(
            changed[0].1.unwrap().address,
            Some("2.2.2.3".parse().unwrap())
        );

        assert!(feed.publish(std::slice::from_ref(&a)));
        let third = rx.borrow_and_update().clone();
        assert!(!third.contains_key("b"));
        let gone = changed_entries(Some(&second["b"]), None);
        assert!(gone[0].0.is_some() && gone[0].1.is_none());

        let off = WorkloadEntryFeed::disabled();
        assert!(!off.publish(&[a]));
        assert!(off.current().is_empty());
    }
}

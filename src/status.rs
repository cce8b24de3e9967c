//! Config status (`--enableStatus`, Istio's `PILOT_ENABLE_STATUS`): what the leader
//! writes on the Istio config objects read from Kubernetes, computed here from what
//! the server knows and handed to [`meshfed_kube::status::run_status_writer`].
//!
//! - `Reconciled` (Istio's distribution reporting): `N/M proxies up to date.`, `True`
//!   when N = M. M is the proxies connected to this replica; N those that have
//!   acknowledged every response this replica sent them (nothing in flight, nothing
//!   NACKed). An object rejected by validation is in no proxy's config: `0/M`. A
//!   change still inside the debounce window is not yet in any response, so for that
//!   moment a proxy that ACKed everything counts as up to date.
//! - `validationMessages`: a rejected object gets Istio's `IST0106`
//!   (`SchemaValidationError`, ERROR); analyzer messages per object are added from
//!   the [`AnalysisMessages`] source when one is given.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use meshfed_kube::KubeConfigStore;
use meshfed_kube::status::{DesiredStatus, DesiredStatuses, Level, Progress, ValidationMessage};
use meshfed_registry::config::{ConfigObject, ConfigStore, Kind, ObjectId, RejectedConfig};
use tokio::sync::watch;

use crate::ads::Connections;

/// Analyzer output per object (Istio's `IST0xxx` messages), read at each interval.
pub type AnalysisMessages =
    Arc<dyn Fn() -> BTreeMap<ObjectId, Vec<ValidationMessage>> + Send + Sync>;

/// The analyzers the server runs for `validationMessages`: the ones whose inputs it
/// holds whole (the Istio config and every registry's services). Those that read
/// pods or Kubernetes Service selectors, and the schema analyzer (a rejected object
/// already carries IST0106), stay with `meshfed analyze`.
pub const SERVER_ANALYZERS: &[&str] = &[
    "virtualservice.DestinationHostAnalyzer",
    "virtualservice.DestinationRuleAnalyzer",
    "virtualservice.GatewayAnalyzer",
    "virtualservice.ConflictingMeshGatewayHostsAnalyzer",
];

/// Analyzer messages for the objects `store` holds, with the services of the
/// current snapshot as the hosts destinations may name. Recomputed only when the
/// store's objects or the snapshot change.
pub fn analysis_source(
    store: KubeConfigStore,
    snapshot: Arc<arc_swap::ArcSwap<crate::push::snapshot::Snapshot>>,
    root_namespace: String,
    domain: String,
) -> AnalysisMessages {
    type Memo = (
        Vec<Arc<ConfigObject>>,
        usize,
        BTreeMap<ObjectId, Vec<ValidationMessage>>,
    );
    let memo: std::sync::Mutex<Option<Memo>> = std::sync::Mutex::new(None);
    Arc::new(move || {
        let objects = store.all();
        let current = snapshot.load_full();
        let services = current.services().all();
        // The snapshot is identified by its service list's address and the store by
        // its objects (shared `Arc`s, compared by pointer first).
        let services_id = services.as_ptr() as usize;
        let mut memo = memo.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((seen, id, messages)) = memo.as_ref()
            && *id == services_id
            && seen.len() == objects.len()
            && seen.iter().zip(&objects).all(|(a, b)| Arc::ptr_eq(a, b))
        {
            return messages.clone();
        }
        let messages = analyze_objects(&objects, services, &root_namespace, &domain);
        *memo = Some((objects, services_id, messages.clone()));
        messages
    })
}

/// Runs [`SERVER_ANALYZERS`] over `objects`, destinations resolved against `services`.
pub fn analyze_objects(
    objects: &[Arc<ConfigObject>],
    services: &[Arc<meshfed_registry::Service>],
    root_namespace: &str,
    domain: &str,
) -> BTreeMap<ObjectId, Vec<ValidationMessage>> {
    use meshfed_registry::analysis;
    let mut inputs = analysis::Inputs::new();
    inputs.root_namespace = root_namespace.to_string();
    inputs.domain = domain.to_string();
    inputs.configs = objects
        .iter()
        .map(|o| ((**o).clone(), Vec::new()))
        .collect();
    inputs.registry_hosts = services
        .iter()
        .map(|svc| analysis::RegistryHost {
            hostname: svc.hostname.to_string(),
            ports: svc.ports.iter().map(|p| u32::from(p.port.get())).collect(),
            visible_in: analysis::export_scopes(
                &svc.export_to.0.iter().cloned().collect::<Vec<_>>(),
                &svc.namespace.to_string(),
            ),
        })
        .collect();
    let mut out: BTreeMap<ObjectId, Vec<ValidationMessage>> = BTreeMap::new();
    for m in analysis::analyze_with(&inputs, |name| SERVER_ANALYZERS.contains(&name)) {
        let Some(kind) = Kind::from_name(&m.object.kind) else {
            continue;
        };
        let level = match m.level {
            analysis::Level::Error => Level::Error,
            analysis::Level::Warning => Level::Warning,
            analysis::Level::Info => Level::Info,
        };
        out.entry(ObjectId::new(kind, &m.object.namespace, &m.object.name))
            .or_default()
            .push(ValidationMessage::istio(m.code, m.name, level));
    }
    out
}

/// How many connected proxies have acknowledged everything sent to them.
pub fn progress(connections: &Connections) -> Progress {
    let all = connections.all();
    let acked = all
        .iter()
        .filter(|c| {
            let state = c.state.lock().expect("state poisoned");
            state
                .watches
                .iter()
                .all(|(_, w)| w.nonce_sent.is_none() || w.acked())
        })
        .count();
    Progress {
        acked,
        total: all.len(),
    }
}

/// The status every object should carry: `objects` accepted (in force), `rejected`
/// refused by validation, `analysis` messages by object.
pub fn desired_statuses(
    objects: &[Arc<ConfigObject>],
    rejected: &[RejectedConfig],
    progress: Progress,
    analysis: &BTreeMap<ObjectId, Vec<ValidationMessage>>,
) -> BTreeMap<ObjectId, DesiredStatus> {
    let mut out = BTreeMap::new();
    // The Gateway API kinds carry the Gateway API's status, not Istio's.
    for obj in objects.iter().filter(|o| !o.kind.is_gateway_api()) {
        out.insert(
            ObjectId::new(obj.kind, &obj.namespace, &obj.name),
            DesiredStatus {
                reconciled: Some(progress),
                messages: Vec::new(),
                ..Default::default()
            },
        );
    }
    for r in rejected {
        let Some(kind) = Kind::from_name(&r.kind).filter(|k| !k.is_gateway_api()) else {
            continue;
        };
        if r.name.is_empty() {
            continue;
        }
        // Rejected now, even where an earlier version stays in force.
        out.insert(
            ObjectId::new(kind, &r.namespace, &r.name),
            DesiredStatus {
                reconciled: Some(Progress {
                    acked: 0,
                    total: progress.total,
                }),
                messages: vec![ValidationMessage::istio(
                    "IST0106",
                    "SchemaValidationError",
                    Level::Error,
                )],
                ..Default::default()
            },
        );
    }
    for (id, messages) in analysis {
        if let Some(status) = out.get_mut(id) {
            status.messages.extend(messages.iter().cloned());
        }
    }
    for status in out.values_mut() {
        status.messages.sort();
        status.messages.dedup();
    }
    out
}

/// The Gateway API status the translation computed, and the controller name owning
/// its route parent entries: read at each interval.
pub type GatewayApiStatus = Arc<
    dyn Fn() -> (
            Vec<meshfed_registry::config::gateway_api::status::ObjectStatus>,
            String,
        ) + Send
        + Sync,
>;

/// Adds the Gateway API status of the objects among `objects` (those read from the
/// cluster) to `out`: written in the Gateway API's shape, as istiod writes it.
pub fn add_gateway_api_statuses(
    out: &mut BTreeMap<ObjectId, meshfed_kube::status::DesiredStatus>,
    objects: &[Arc<ConfigObject>],
    statuses: &[meshfed_registry::config::gateway_api::status::ObjectStatus],
    controller: &str,
) {
    // A GatewayClass's (cluster-scoped) status is shown, not written.
    for s in statuses.iter().filter(|s| s.kind != Kind::GatewayClass) {
        let held = objects
            .iter()
            .any(|o| o.kind == s.kind && o.namespace == s.namespace && o.name == s.name);
        if held {
            out.insert(
                ObjectId::new(s.kind, &s.namespace, &s.name),
                meshfed_kube::status::DesiredStatus {
                    gateway_api: Some((s.status.to_string(), controller.to_string())),
                    ..Default::default()
                },
            );
        }
    }
}

/// Computes the desired statuses every `interval` into `tx` until `shutdown`.
pub async fn run_status_source(
    store: KubeConfigStore,
    connections: Arc<Connections>,
    analysis: Option<AnalysisMessages>,
    gateway_api: Option<GatewayApiStatus>,
    interval: Duration,
    tx: watch::Sender<DesiredStatuses>,
    shutdown: impl Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            _ = ticks.tick() => {}
        }
        if !store.has_synced() {
            continue;
        }
        let extra = analysis.as_ref().map(|f| f()).unwrap_or_default();
        let objects = store.all();
        let mut desired =
            desired_statuses(&objects, &store.rejected(), progress(&connections), &extra);
        if let Some(source) = &gateway_api {
            let (statuses, controller) = source();
            add_gateway_api_statuses(&mut desired, &objects, &statuses, &controller);
        }
        tx.send_if_modified(|current| {
            if **current == desired {
                return false;
            }
            *current = Arc::new(desired);
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejected_objects_carry_ist0106_and_analysis_adds_to_accepted_ones() {
        let rejected = RejectedConfig {
            source: "kubernetes:c/default/bad".into(),
            kind: "VirtualService".into(),
            namespace: "default".into(),
            name: "bad".into(),
            errors: vec!["spec.http[0]: weights add up to 110".into()],
        };
        let good = ObjectId::new(Kind::VirtualService, "default", "good");
        let analysis = BTreeMap::from([(
            good.clone(),
            vec![ValidationMessage::istio(
                "IST0101",
                "ReferencedResourceNotFound",
                Level::Error,
            )],
        )]);
        let progress = Progress { acked: 2, total: 3 };
        let out = desired_statuses(&[], &[rejected], progress, &analysis);
        let bad = &out[&ObjectId::new(Kind::VirtualService, "default", "bad")];
        assert_eq!(bad.reconciled, Some(Progress { acked: 0, total: 3 }));
        assert_eq!(bad.messages[0].code, "IST0106");
        assert_eq!(
            bad.messages[0].documentation_url,
            "https://istio.io/latest/docs/reference/config/analysis/ist0106/"
        );
        assert!(
            !out.contains_key(&good),
            "analysis of an object not in the store is dropped"
        );
    }
}

//! What a WorkloadEntry of a connected workload looks like: its name, how it is built
//! from the WorkloadGroup and the proxy, and the annotations that record which
//! control-plane instance holds its connection (Istio's names and formats).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::SystemTime;

use meshfed_api::networking::v1alpha3 as net;
use meshfed_registry::config::{ConfigObject, format_rfc3339, parse_rfc3339};
use meshfed_registry::serviceentry::ANNOTATION_HEALTH_CHECKS;

use crate::model::Proxy;

/// On an auto-registered entry: the WorkloadGroup it was made from.
pub const ANNOTATION_GROUP: &str = "istio.io/autoRegistrationGroup";
/// The control-plane instance that holds (or last held) the workload's connection.
pub const ANNOTATION_CONTROLLER: &str = "istio.io/workloadController";
/// When the workload connected (RFC 3339 with nanoseconds).
pub const ANNOTATION_CONNECTED_AT: &str = "istio.io/connectedAt";
/// When the workload disconnected (RFC 3339 with nanoseconds).
pub const ANNOTATION_DISCONNECTED_AT: &str = "istio.io/disconnectedAt";
/// The status condition the agent's health reports set.
pub const CONDITION_HEALTHY: &str = "Healthy";
/// The label Istio gives a proxy's locality (`region/zone/subzone`); dropped from an
/// entry's labels (`/` is not allowed in a label value; the entry has `locality`).
const LABEL_LOCALITY: &str = "istio-locality";
/// Kubernetes' longest object name.
const MAX_NAME: usize = 253;

/// The facts of a connecting proxy that registration reads, taken once when it
/// connects (Istio's `model.Proxy` fields of the same names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// The node id, for messages.
    pub node_id: String,
    /// The first of the proxy's IPs (`INSTANCE_IPS`), if any.
    pub ip: Option<IpAddr>,
    /// The config namespace (`NAMESPACE`).
    pub namespace: String,
    /// `NETWORK`.
    pub network: String,
    /// `AUTO_REGISTER_GROUP`: the WorkloadGroup to register into.
    pub group: String,
    /// `WORKLOAD_ENTRY`: an existing entry the proxy runs as (health checks without
    /// auto-registration).
    pub workload_entry: String,
    /// `LABELS` as sent.
    pub labels: BTreeMap<String, String>,
    /// The node's locality, `region/zone/subzone` (empty when unset).
    pub locality: String,
    /// Whether `PROXY_CONFIG` has a `readinessProbe` (the agent then reports health).
    pub readiness_probe: bool,
    /// The verified identity's (namespace, service account); `None` without one.
    pub identity: Option<(String, String)>,
}

impl Workload {
    /// The facts of `proxy`.
    pub fn of(proxy: &Proxy) -> Workload {
        let meta = |key: &str| {
            proxy
                .metadata
                .get(key)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let identity = proxy
            .verified_identity
            .as_deref()
            .and_then(crate::authn::parse_spiffe)
            .map(|id| (id.namespace.to_string(), id.service_account.to_string()));
        let readiness_probe = proxy
            .metadata
            .get("PROXY_CONFIG")
            .and_then(|pc| pc.get("readinessProbe"))
            .is_some_and(|p| !p.is_null());
        let locality = if proxy.locality.region.is_empty()
            && proxy.locality.zone.is_empty()
            && proxy.locality.subzone.is_empty()
        {
            String::new()
        } else {
            // Istio's LocalityToString: region/zone/subzone, trailing empty parts
            // dropped.
            let parts = [
                proxy.locality.region.as_str(),
                proxy.locality.zone.as_str(),
                proxy.locality.subzone.as_str(),
            ];
            let last = parts.iter().rposition(|p| !p.is_empty()).unwrap_or(0);
            parts[..=last].join("/")
        };
        Workload {
            node_id: proxy.node_id.clone(),
            ip: proxy.ip_addresses.first().copied(),
            namespace: proxy.namespace.clone(),
            network: proxy.network.to_string(),
            group: meta("AUTO_REGISTER_GROUP"),
            workload_entry: meta("WORKLOAD_ENTRY"),
            labels: proxy.labels.clone(),
            locality,
            readiness_probe,
            identity,
        }
    }

    /// What identifies one workload across its connections: network, IP, group and
    /// namespace.
    pub fn key(&self) -> WorkloadKey {
        WorkloadKey {
            network: self.network.clone(),
            ip: self.ip,
            group: self.group.clone(),
            namespace: self.namespace.clone(),
        }
    }
}

/// One workload, whatever connection it came on.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadKey {
    /// Its network.
    pub network: String,
    /// Its first IP.
    pub ip: Option<IpAddr>,
    /// Its WorkloadGroup.
    pub group: String,
    /// Its namespace.
    pub namespace: String,
}

/// Why a proxy that asked for auto-registration gets no entry name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// No IP in the node.
    #[error("auto-registration of {0} failed: missing IP addresses")]
    MissingIp(String),
    /// No namespace in the node.
    #[error("auto-registration of {0} failed: missing namespace")]
    MissingNamespace(String),
}

/// The auto-registered entry's name, as Istio makes it: `<group>-<ip>` (an IPv6
/// address with `-` for `:`), then `-<network>` when the proxy names one; cut from the
/// front to 253 characters. `Ok(None)` when the proxy names no group.
pub fn entry_name(workload: &Workload) -> Result<Option<String>, NameError> {
    if workload.group.is_empty() {
        return Ok(None);
    }
    let Some(ip) = workload.ip else {
        return Err(NameError::MissingIp(workload.node_id.clone()));
    };
    if workload.namespace.is_empty() {
        return Err(NameError::MissingNamespace(workload.node_id.clone()));
    }
    let mut name = format!("{}-{}", workload.group, ip.to_string().replace(':', "-"));
    if !workload.network.is_empty() {
        name.push('-');
        name.push_str(&workload.network);
    }
    if name.len() > MAX_NAME {
        let cut = name.len() - MAX_NAME;
        let cut = (cut..name.len())
            .find(|i| name.is_char_boundary(*i))
            .unwrap_or(cut);
        name = name[cut..].to_string();
        tracing::warn!(
            "generated WorkloadEntry name is too long, consider making the WorkloadGroup name shorter. Shortening from beginning to: {name}"
        );
    }
    Ok(Some(name))
}

/// The entry Istio creates for `workload` from `group`: the group's template with the
/// proxy's address; labels from the template, then the group's metadata labels, then
/// the proxy's (without `istio-locality`), on both the spec and the object;
/// annotations `istio.io/autoRegistrationGroup` and the group's metadata annotations,
/// plus `proxy.istio.io/health-checks-enabled: "true"` when the proxy has a readiness
/// probe; the proxy's network and locality over the template's.
pub fn entry_from_group(name: &str, workload: &Workload, group: &ConfigObject) -> ConfigObject {
    let spec: Option<&net::WorkloadGroup> = group.spec.get();
    let spec = spec.cloned().unwrap_or_default();
    let mut entry = spec.template.clone().unwrap_or_default();
    entry.address = workload.ip.map(|ip| ip.to_string()).unwrap_or_default();
    let mut annotations = BTreeMap::from([(ANNOTATION_GROUP.to_string(), group.name.clone())]);
    if let Some(meta) = &spec.metadata {
        entry.labels.extend(meta.labels.clone());
        annotations.extend(meta.annotations.clone());
    }
    entry.labels.extend(workload.labels.clone());
    entry.labels.remove(LABEL_LOCALITY);
    if !workload.network.is_empty() {
        entry.network = workload.network.clone();
    }
    if !workload.locality.is_empty() {
        entry.locality = workload.locality.clone();
    }
    if workload.readiness_probe {
        annotations.insert(ANNOTATION_HEALTH_CHECKS.to_string(), "true".to_string());
    }
    let mut obj = ConfigObject::new(&workload.namespace, name, entry.clone());
    obj.labels = entry.labels;
    obj.annotations = annotations;
    obj
}

/// Sets the annotations of an entry connected to `instance` at `at` (and drops the
/// disconnect time).
pub fn set_connected(obj: &mut ConfigObject, instance: &str, at: SystemTime) {
    obj.annotations
        .insert(ANNOTATION_CONTROLLER.to_string(), instance.to_string());
    obj.annotations
        .insert(ANNOTATION_CONNECTED_AT.to_string(), format_time(at));
    obj.annotations.remove(ANNOTATION_DISCONNECTED_AT);
}

/// An annotation's time (`None` when absent or unreadable, as Istio's zero time).
pub fn annotation_time(obj: &ConfigObject, key: &str) -> Option<SystemTime> {
    obj.annotations.get(key).and_then(|t| parse_rfc3339(t).ok())
}

/// Go's `time.RFC3339Nano` form, in UTC.
pub fn format_time(t: SystemTime) -> String {
    format_rfc3339(t)
}

/// Whether the entry was made by auto-registration.
pub fn is_auto_registered(obj: &ConfigObject) -> bool {
    obj.annotations
        .get(ANNOTATION_GROUP)
        .is_some_and(|g| !g.is_empty())
}

/// Whether the entry is one a workload without auto-registration reports health for
/// (a controller annotation and no group).
pub fn is_health_checked(obj: &ConfigObject) -> bool {
    obj.annotations
        .get(ANNOTATION_CONTROLLER)
        .is_some_and(|c| !c.is_empty())
        && !is_auto_registered(obj)
}

/// Whether the entry takes health reports: it has the
/// `proxy.istio.io/health-checks-enabled` annotation, whatever its value (Istio's
/// `IsEligibleForHealthStatusUpdates`).
pub fn takes_health_reports(obj: &ConfigObject) -> bool {
    obj.annotations.contains_key(ANNOTATION_HEALTH_CHECKS)
}

/// Whether the entry has a `Healthy` condition.
pub fn has_health_condition(obj: &ConfigObject) -> bool {
    obj.condition(CONDITION_HEALTHY).is_some()
}

/// The entries of VMs that connect (auto-registered, or health-checked with a
/// controller annotation) in `stores`, for `/debug/registryz`: where each is, which
/// instance holds it and since when, and its health.
pub fn debug_list(
    stores: &[std::sync::Arc<dyn meshfed_registry::config::ConfigStore>],
) -> Vec<serde_json::Value> {
    let mut out: Vec<serde_json::Value> = stores
        .iter()
        .flat_map(|s| s.list(meshfed_registry::config::Kind::WorkloadEntry))
        .filter(|e| is_auto_registered(e) || is_health_checked(e))
        .map(|e| {
            let spec = e.spec.as_workload_entry();
            let annotation = |key: &str| e.annotations.get(key).cloned();
            let health = e.condition(CONDITION_HEALTHY);
            serde_json::json!({
                "namespace": e.namespace,
                "name": e.name,
                "address": spec.map(|s| s.address.clone()),
                "network": spec.map(|s| s.network.clone()),
                "group": annotation(ANNOTATION_GROUP),
                "controller": annotation(ANNOTATION_CONTROLLER),
                "connected_at": annotation(ANNOTATION_CONNECTED_AT),
                "disconnected_at": annotation(ANNOTATION_DISCONNECTED_AT),
                "health_checks": e.annotations.get(ANNOTATION_HEALTH_CHECKS),
                "healthy": health.map(|c| c.status.clone()),
                "health_message": health.map(|c| c.message.clone()).filter(|m| !m.is_empty()),
            })
        })
        .collect();
    out.sort_by(|a, b| {
        (a["namespace"].as_str(), a["name"].as_str())
            .cmp(&(b["namespace"].as_str(), b["name"].as_str()))
    });
    out
}

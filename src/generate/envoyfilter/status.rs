//! What became of each EnvoyFilter's patches: per EnvoyFilter and patch type
//! (`cluster`, `listener`, `filterchain`, `networkfilter`, `httpfilter`,
//! `listenerfilter`, `route`, `vhost`), whether a patch applied to some proxy's
//! resource since the EnvoyFilter last changed, and the patches rejected because their
//! value does not convert to its Envoy type (naming the field).
//!
//! Exported as Istio's `pilot_envoy_filter_status{name, patch, result}` gauge
//! (`result="applied"`: 1 when applied, 0 when it matched nothing so far;
//! `result="error"`: the number of rejected patches) and listed under `envoyFilters`
//! in `/debug/configz` ([`report`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{LazyLock, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde::Serialize;

#[derive(Default)]
struct State {
    /// EnvoyFilter -> patch type -> applied at least once.
    applied: BTreeMap<String, BTreeMap<&'static str, bool>>,
    /// EnvoyFilter -> rejected patches (`field: reason`).
    errors: BTreeMap<String, Vec<String>>,
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(Mutex::default);

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records that a patch of `key` of `patch` type applied (or matched nothing).
pub fn record(key: &str, patch: &'static str, applied: bool) {
    let mut s = state();
    // No allocation when the EnvoyFilter is known (every resource patched records).
    if let Some(v) = s.applied.get_mut(key) {
        *v.entry(patch).or_default() |= applied;
    } else {
        s.applied
            .insert(key.to_string(), BTreeMap::from([(patch, applied)]));
    }
}

/// Records a patch rejected at `field` for `reason` (logged once per change).
pub fn reject(key: &str, field: &str, reason: &str) {
    tracing::warn!(
        envoy_filter = key,
        field,
        "EnvoyFilter patch rejected: {reason}"
    );
    state()
        .errors
        .entry(key.to_string())
        .or_default()
        .push(format!("{field}: {reason}"));
}

/// Forgets what is known of `key` (the EnvoyFilter changed).
pub fn clear(key: &str) {
    let mut s = state();
    s.applied.remove(key);
    s.errors.remove(key);
}

/// One EnvoyFilter's status, for `/debug/configz`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FilterStatus {
    /// `namespace/name`.
    pub name: String,
    /// Patch types with a patch applied to some resource.
    pub applied: Vec<&'static str>,
    /// Patch types whose patches matched nothing so far.
    pub matched_nothing: Vec<&'static str>,
    /// Rejected patches (`spec.configPatches[i].patch.value: reason`).
    pub errors: Vec<String>,
    /// What selects nothing meshfed serves (`spec.targetRefs[i]: reason`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_applied: Vec<String>,
}

/// Every EnvoyFilter known to the patcher, by name.
pub fn report() -> Vec<FilterStatus> {
    let s = state();
    let mut out: BTreeMap<String, FilterStatus> = BTreeMap::new();
    for (key, patches) in &s.applied {
        let e = out.entry(key.clone()).or_insert_with(|| FilterStatus {
            name: key.clone(),
            ..FilterStatus::default()
        });
        for (patch, applied) in patches {
            if *applied {
                e.applied.push(patch);
            } else {
                e.matched_nothing.push(patch);
            }
        }
    }
    for (key, errors) in &s.errors {
        out.entry(key.clone())
            .or_insert_with(|| FilterStatus {
                name: key.clone(),
                ..FilterStatus::default()
            })
            .errors
            .clone_from(errors);
    }
    out.into_values().collect()
}

/// [`report`] for the EnvoyFilters `held` (namespace, name, spec): those the stores
/// hold, each with its `targetRefs` that select nothing meshfed serves (known whether
/// or not a proxy was ever generated for).
pub fn report_held(
    held: &[(
        String,
        String,
        &meshfed_api::networking::v1alpha3::EnvoyFilter,
    )],
) -> Vec<FilterStatus> {
    let mut known: BTreeMap<String, FilterStatus> =
        report().into_iter().map(|s| (s.name.clone(), s)).collect();
    let mut out = Vec::new();
    for (namespace, name, spec) in held {
        let key = format!("{namespace}/{name}");
        let mut status = known.remove(&key).unwrap_or_else(|| FilterStatus {
            name: key.clone(),
            ..FilterStatus::default()
        });
        status.not_applied = super::unserved_target_refs(spec, namespace);
        if status
            != (FilterStatus {
                name: key,
                ..FilterStatus::default()
            })
        {
            out.push(status);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The `pilot_envoy_filter_status` collector.
#[derive(Debug, Default)]
pub struct EnvoyFilterMetrics;

impl EnvoyFilterMetrics {
    /// Registers the collector with `registry`.
    pub fn register(registry: &mut Registry) {
        registry.register_collector(Box::new(EnvoyFilterMetrics));
    }
}

impl Collector for EnvoyFilterMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let rows: Vec<(String, &'static str, &'static str, i64)> = {
            let s = state();
            let mut rows: Vec<_> = s
                .applied
                .iter()
                .flat_map(|(k, patches)| {
                    patches
                        .iter()
                        .map(|(p, a)| (k.clone(), *p, "applied", i64::from(*a)))
                })
                .collect();
            rows.extend(s.errors.iter().map(|(k, e)| {
                (
                    k.clone(),
                    "value",
                    "error",
                    i64::try_from(e.len()).unwrap_or(i64::MAX),
                )
            }));
            rows
        };
        let mut family = encoder.encode_descriptor(
            "pilot_envoy_filter_status",
            "Status of Envoy filters whether it was applied or errored.",
            None,
            MetricType::Gauge,
        )?;
        for (name, patch, result, value) in rows {
            let labels = [
                ("name", name.as_str()),
                ("patch", patch),
                ("result", result),
            ];
            ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

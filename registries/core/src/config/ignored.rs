//! Objects of kinds meshfed does not read: reported, never dropped in silence.
//!
//! A config file may hold objects of other groups (`apps/v1 Deployment`) or of Istio
//! kinds meshfed does not declare yet ([`crate::config::kinds`]: `ProxyConfig`, the
//! Gateway API's `XBackendTrafficPolicy`, ...). They are not applied. `meshfed
//! validate` warns about each one (and fails with `--strict`); a store fed from files
//! lists them ([`ConfigStore::ignored`], shown under `ignored` in `/debug/configz` and
//! counted by `meshfed_config_ignored{kind}`) and logs one WARN per kind the first time
//! it meets one.
//!
//! The Kubernetes CRD store has nothing to report: it watches the declared kinds only.
//!
//! [`ConfigStore::ignored`]: crate::config::ConfigStore::ignored

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Mutex;

use serde::Serialize;

/// An object of a kind meshfed does not read.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IgnoredConfig {
    /// Its `kind`.
    pub kind: String,
    /// Its `apiVersion`.
    pub api_version: String,
    /// Its `metadata.namespace` as written (empty when not given).
    pub namespace: String,
    /// Its `metadata.name` (empty when not given).
    pub name: String,
    /// Where it was found (`path:line`).
    pub source: String,
}

impl IgnoredConfig {
    /// `group/kind` (`networking.istio.io/EnvoyFilter`, `apps/Deployment`; the core
    /// group is empty): what one WARN is about.
    pub fn group_kind(&self) -> String {
        let group = self.api_version.rsplit_once('/').map_or("", |(g, _)| g);
        format!("{group}/{}", self.kind)
    }
}

impl fmt::Display for IgnoredConfig {
    /// `source: apiVersion Kind namespace/name`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} {}", self.source, self.api_version, self.kind)?;
        match (self.namespace.is_empty(), self.name.is_empty()) {
            (_, true) => Ok(()),
            (true, false) => write!(f, " {}", self.name),
            (false, false) => write!(f, " {}/{}", self.namespace, self.name),
        }
    }
}

/// What a file-fed store currently ignores, and the kinds it has warned about.
#[derive(Debug, Default)]
pub(crate) struct IgnoredLog {
    state: Mutex<IgnoredState>,
}

#[derive(Debug, Default)]
struct IgnoredState {
    objects: Vec<IgnoredConfig>,
    /// `group/kind`s already warned about (once per kind for the store's life, not
    /// per object or per reload).
    warned: BTreeSet<String>,
}

impl IgnoredLog {
    /// Replaces the ignored objects with what the last read found; a kind met for the
    /// first time is logged (one WARN, naming an example and the count).
    pub(crate) fn replace(&self, objects: Vec<IgnoredConfig>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for object in &objects {
            let group_kind = object.group_kind();
            if state.warned.insert(group_kind.clone()) {
                let count = objects
                    .iter()
                    .filter(|o| o.group_kind() == group_kind)
                    .count();
                tracing::warn!(
                    kind = %group_kind,
                    count,
                    example = %object,
                    "config of a kind meshfed does not read is ignored, not applied (listed under `ignored` in /debug/configz)"
                );
            }
        }
        state.objects = objects;
    }

    /// The ignored objects, in read order.
    pub(crate) fn list(&self) -> Vec<IgnoredConfig> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .objects
            .clone()
    }

    #[cfg(test)]
    fn warned(&self) -> Vec<String> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.warned.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ignored(api_version: &str, kind: &str, name: &str) -> IgnoredConfig {
        IgnoredConfig {
            kind: kind.to_string(),
            api_version: api_version.to_string(),
            namespace: "ns".to_string(),
            name: name.to_string(),
            source: "f.yaml:1".to_string(),
        }
    }

    #[test]
    fn one_warning_per_kind_for_the_store_life() {
        let log = IgnoredLog::default();
        log.replace(vec![
            ignored("networking.istio.io/v1alpha3", "EnvoyFilter", "a"),
            ignored("networking.istio.io/v1alpha3", "EnvoyFilter", "b"),
            ignored(
                "gateway.networking.k8s.io/v1alpha3",
                "BackendTLSPolicy",
                "r",
            ),
        ]);
        assert_eq!(
            log.warned(),
            [
                "gateway.networking.k8s.io/BackendTLSPolicy",
                "networking.istio.io/EnvoyFilter"
            ]
        );
        assert_eq!(log.list().len(), 3);
        // A reload that drops them lists nothing, and one that brings one back does not
        // warn again.
        log.replace(Vec::new());
        assert!(log.list().is_empty());
        log.replace(vec![ignored("networking.istio.io/v1", "EnvoyFilter", "c")]);
        assert_eq!(log.warned().len(), 2);
        assert_eq!(
            log.list()[0].to_string(),
            "f.yaml:1: networking.istio.io/v1 EnvoyFilter ns/c"
        );
    }
}

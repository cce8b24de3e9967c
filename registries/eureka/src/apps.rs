//! The local copy of the Eureka registry, as a Eureka client keeps it: replaced by a
//! full fetch, updated by deltas, and checked against the server with the reconcile
//! hash code.
//!
//! The hash code is Eureka's `Applications.getReconcileHashCode`: the instances
//! counted per status name, the statuses in sorted order, each written
//! `<STATUS>_<count>_` (`DOWN_1_UP_2_`; empty for no instance). A delta carries the
//! server's code for its whole registry; a client whose copy gives another code after
//! applying the delta has missed a change and fetches everything again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::api::{ActionType, Applications, Instance};

/// Application name (upper-cased, as Eureka keys them) -> instance id -> instance.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LocalApps {
    apps: BTreeMap<String, BTreeMap<String, Arc<Instance>>>,
}

/// What applying an answer did.
#[derive(Debug, Default, PartialEq)]
pub struct Applied {
    /// Applications whose instances changed (added, changed, removed, or gone).
    pub changed: BTreeSet<String>,
    /// Instances that could not be decoded, each with its reason.
    pub skipped: Vec<String>,
}

/// Eureka's reconcile hash code of a status count.
pub fn reconcile_hash_code(counts: &BTreeMap<&'static str, usize>) -> String {
    counts
        .iter()
        .map(|(status, n)| format!("{status}_{n}_"))
        .collect()
}

fn app_key(name: &str) -> String {
    name.trim().to_ascii_uppercase()
}

fn decode(app: &str, raw: &serde_json::Value, skipped: &mut Vec<String>) -> Option<Instance> {
    match Instance::parse(raw) {
        Ok(i) => Some(i),
        Err(why) => {
            skipped.push(format!(
                "application {app}: an instance cannot be read: {why}"
            ));
            None
        }
    }
}

impl LocalApps {
    /// The copy a full fetch gives, and the applications that differ from `self`.
    pub fn from_full(&self, full: &Applications) -> (LocalApps, Applied) {
        let mut next = LocalApps::default();
        let mut applied = Applied::default();
        for app in &full.application {
            let key = app_key(&app.name);
            if key.is_empty() {
                applied
                    .skipped
                    .push("an application without a name".to_string());
                continue;
            }
            let instances = next.apps.entry(key.clone()).or_default();
            for raw in &app.instance {
                if let Some(i) = decode(&key, raw, &mut applied.skipped) {
                    let i = Instance { action: None, ..i };
                    instances.insert(i.id.clone(), Arc::new(i));
                }
            }
        }
        next.apps.retain(|_, instances| !instances.is_empty());
        let names: BTreeSet<&String> = self.apps.keys().chain(next.apps.keys()).collect();
        applied.changed = names
            .into_iter()
            .filter(|n| self.apps.get(*n) != next.apps.get(*n))
            .cloned()
            .collect();
        (next, applied)
    }

    /// Applies a delta as Eureka clients do (`updateDelta`): `ADDED` and `MODIFIED`
    /// put the instance (creating its application), `DELETED` removes it (and its
    /// application with its last instance). The server repeats changes for the whole
    /// delta window, so applying one twice changes nothing.
    pub fn apply_delta(&mut self, delta: &Applications) -> Applied {
        let mut applied = Applied::default();
        for app in &delta.application {
            let key = app_key(&app.name);
            for raw in &app.instance {
                let Some(i) = decode(&key, raw, &mut applied.skipped) else {
                    continue;
                };
                let Some(action) = i.action else {
                    applied.skipped.push(format!(
                        "application {key}: delta instance {} has no actionType",
                        i.id
                    ));
                    continue;
                };
                let instance = Instance { action: None, ..i };
                match action {
                    ActionType::Added | ActionType::Modified => {
                        let instances = self.apps.entry(key.clone()).or_default();
                        if instances.get(&instance.id).map(|i| &**i) != Some(&instance) {
                            instances.insert(instance.id.clone(), Arc::new(instance));
                            applied.changed.insert(key.clone());
                        }
                    }
                    ActionType::Deleted => {
                        if let Some(instances) = self.apps.get_mut(&key)
                            && instances.remove(&instance.id).is_some()
                        {
                            applied.changed.insert(key.clone());
                            if instances.is_empty() {
                                self.apps.remove(&key);
                            }
                        }
                    }
                }
            }
        }
        applied
    }

    /// The reconcile hash code of this copy.
    pub fn hash_code(&self) -> String {
        let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
        for i in self.apps.values().flat_map(BTreeMap::values) {
            *counts.entry(i.status.as_str()).or_default() += 1;
        }
        reconcile_hash_code(&counts)
    }

    /// True with no application.
    pub fn is_empty(&self) -> bool {
        self.apps.is_empty()
    }

    /// Number of applications.
    pub fn app_count(&self) -> usize {
        self.apps.len()
    }

    /// Number of instances.
    pub fn instance_count(&self) -> usize {
        self.apps.values().map(BTreeMap::len).sum()
    }

    /// The instances of `app` (upper-cased name), by id.
    pub fn instances(&self, app: &str) -> Option<&BTreeMap<String, Arc<Instance>>> {
        self.apps.get(app)
    }

    /// Application names.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.apps.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::decode_applications;
    use serde_json::{Value, json};

    fn instance(app: &str, id: &str, status: &str, action: Option<&str>) -> Value {
        let mut v = json!({"instanceId": id, "hostName": id, "app": app, "ipAddr": "10.0.0.1",
            "status": status, "port": {"$": 80, "@enabled": "true"}});
        if let Some(a) = action {
            v["actionType"] = json!(a);
        }
        v
    }

    fn apps(list: Value) -> Applications {
        decode_applications(
            json!({"applications": {"application": list}})
                .to_string()
                .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn the_hash_code_is_eurekas() {
        let mut counts = BTreeMap::new();
        counts.insert("UP", 2);
        counts.insert("DOWN", 1);
        assert_eq!(reconcile_hash_code(&counts), "DOWN_1_UP_2_");
        assert_eq!(reconcile_hash_code(&BTreeMap::new()), "");
        let (local, _) = LocalApps::default().from_full(&apps(json!([
            {"name": "WEB", "instance": [instance("WEB", "a", "UP", None), instance("WEB", "b", "STARTING", None)]},
            {"name": "API", "instance": instance("API", "c", "OUT_OF_SERVICE", None)},
            {"name": "DB", "instance": [instance("DB", "d", "UP", None), instance("DB", "e", "bogus", None)]},
        ])));
        assert_eq!(
            local.hash_code(),
            "OUT_OF_SERVICE_1_STARTING_1_UNKNOWN_1_UP_2_"
        );
        assert_eq!(local.instance_count(), 5);
    }

    #[test]
    fn deltas_add_modify_and_delete() {
        let (mut local, applied) = LocalApps::default().from_full(&apps(json!([
            {"name": "web", "instance": [instance("WEB", "a", "UP", None), instance("WEB", "b", "UP", None)]},
        ])));
        assert_eq!(applied.changed, BTreeSet::from(["WEB".to_string()]));
        let delta = apps(json!([
            {"name": "WEB", "instance": [instance("WEB", "a", "DOWN", Some("MODIFIED")), instance("WEB", "b", "UP", Some("DELETED"))]},
            {"name": "API", "instance": [instance("API", "c", "UP", Some("ADDED"))]},
        ]));
        let applied = local.apply_delta(&delta);
        assert_eq!(applied.changed.len(), 2);
        assert_eq!(local.hash_code(), "DOWN_1_UP_1_");
        // The window repeats it: nothing changes the second time.
        assert!(local.apply_delta(&delta).changed.is_empty());
        let gone = apps(
            json!([{"name": "API", "instance": [instance("API", "c", "UP", Some("DELETED"))]}]),
        );
        local.apply_delta(&gone);
        assert!(
            local.instances("API").is_none(),
            "the last instance takes its application"
        );
        let bad = apps(
            json!([{"name": "API", "instance": [instance("API", "x", "UP", None), json!(7)]}]),
        );
        assert_eq!(local.apply_delta(&bad).skipped.len(), 2);
    }

    #[test]
    fn a_full_fetch_reports_the_applications_that_differ() {
        let (local, _) = LocalApps::default().from_full(&apps(json!([
            {"name": "WEB", "instance": [instance("WEB", "a", "UP", None)]},
            {"name": "API", "instance": [instance("API", "c", "UP", None)]},
        ])));
        let (next, applied) = local.from_full(&apps(json!([
            {"name": "WEB", "instance": [instance("WEB", "a", "UP", None)]},
            {"name": "DB", "instance": [instance("DB", "d", "UP", None)]},
        ])));
        assert_eq!(
            applied.changed,
            BTreeSet::from(["API".to_string(), "DB".to_string()])
        );
        assert_eq!(next.app_count(), 2);
    }
}

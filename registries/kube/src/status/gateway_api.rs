//! The status of a Gateway API object as istiod writes it: the status computed by the
//! translation (`meshfed_registry::config::gateway_api::status`) with every
//! condition's `observedGeneration` set and its `lastTransitionTime` kept from the
//! object's current condition of that type while the condition's status is unchanged
//! (else `now`). A route's `parents` entries and a policy's `ancestors` entries of
//! other controllers stay as they are, first (as istiod orders them).

use serde_json::{Map, Value, json};

/// The controller name of a policy's mesh (Service) ancestors.
const MESH_CONTROLLER: &str = "istio.io/mesh-controller";

/// The new `status` of a Gateway API object whose current status is `current`, or
/// `None` when writing would change nothing. `desired` is the translation's status;
/// `controller` the controller name whose route parent entries are ours.
pub fn merged_gateway_status(
    current: Option<&Value>,
    desired: &Value,
    generation: Option<i64>,
    controller: &str,
    now: &str,
) -> Option<Value> {
    let empty = json!({});
    let current = current.filter(|v| v.is_object()).unwrap_or(&empty);
    let mut next = desired.clone();
    stamp(
        next.get_mut("conditions"),
        current.get("conditions"),
        generation,
        now,
    );
    if let Some(listeners) = next.get_mut("listeners").and_then(Value::as_array_mut) {
        for l in listeners {
            let old = current["listeners"]
                .as_array()
                .and_then(|ls| ls.iter().find(|o| o["name"] == l["name"]));
            stamp(
                l.get_mut("conditions"),
                old.and_then(|o| o.get("conditions")),
                generation,
                now,
            );
        }
    }
    if let Some(parents) = next.get_mut("parents").and_then(Value::as_array_mut) {
        for p in parents.iter_mut() {
            let old = current["parents"].as_array().and_then(|ps| {
                ps.iter().find(|o| {
                    o["parentRef"] == p["parentRef"] && o["controllerName"] == p["controllerName"]
                })
            });
            stamp(
                p.get_mut("conditions"),
                old.and_then(|o| o.get("conditions")),
                generation,
                now,
            );
        }
        // Other controllers' entries kept first, as istiod merges them.
        let mut merged: Vec<Value> = current["parents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|o| o["controllerName"] != controller)
            .cloned()
            .collect();
        merged.append(parents);
        *parents = merged;
    }
    // A policy's ancestors: ours (the gateway controller's and the mesh controller's)
    // stamped as above; other controllers' kept first, as istiod merges them.
    if let Some(ancestors) = next.get_mut("ancestors").and_then(Value::as_array_mut) {
        let ours = |c: &Value| c == controller || c == MESH_CONTROLLER;
        for a in ancestors.iter_mut() {
            let old = current["ancestors"].as_array().and_then(|xs| {
                xs.iter().find(|o| {
                    o["ancestorRef"] == a["ancestorRef"]
                        && o["controllerName"] == a["controllerName"]
                })
            });
            stamp(
                a.get_mut("conditions"),
                old.and_then(|o| o.get("conditions")),
                generation,
                now,
            );
        }
        let mut merged: Vec<Value> = current["ancestors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|o| !ours(&o["controllerName"]))
            .cloned()
            .collect();
        merged.append(ancestors);
        *ancestors = merged;
    }
    // Fields the translation does not own (another writer's) are kept.
    if let (Some(next), Some(old)) = (next.as_object_mut(), current.as_object()) {
        for (k, v) in old {
            next.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    (next != *current).then_some(next)
}

fn stamp(conditions: Option<&mut Value>, old: Option<&Value>, generation: Option<i64>, now: &str) {
    let Some(conditions) = conditions.and_then(Value::as_array_mut) else {
        return;
    };
    for c in conditions {
        let Some(c) = c.as_object_mut() else { continue };
        let previous: Option<&Map<String, Value>> = old
            .and_then(Value::as_array)
            .and_then(|os| os.iter().find(|o| o["type"] == c["type"]))
            .and_then(Value::as_object);
        let transition = match previous {
            Some(p) if p.get("status") == c.get("status") => p
                .get("lastTransitionTime")
                .cloned()
                .unwrap_or_else(|| json!(now)),
            _ => json!(now),
        };
        c.insert("lastTransitionTime".into(), transition);
        if let Some(g) = generation {
            c.insert("observedGeneration".into(), json!(g));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTROLLER: &str = "istio.io/gateway-controller";

    fn route(status: &str) -> Value {
        json!({"parents": [{
            "conditions": [{"type": "Accepted", "status": status, "reason": "Accepted", "message": "Route was valid"}],
            "controllerName": CONTROLLER,
            "parentRef": {"name": "gw"},
        }]})
    }

    #[test]
    fn transition_times_are_kept_until_the_status_changes() {
        let first = merged_gateway_status(None, &route("True"), Some(2), CONTROLLER, "t1").unwrap();
        assert_eq!(
            first["parents"][0]["conditions"][0]["lastTransitionTime"],
            "t1"
        );
        assert_eq!(
            first["parents"][0]["conditions"][0]["observedGeneration"],
            2
        );
        assert_eq!(
            merged_gateway_status(Some(&first), &route("True"), Some(2), CONTROLLER, "t2"),
            None
        );
        let next = merged_gateway_status(Some(&first), &route("False"), Some(2), CONTROLLER, "t3")
            .unwrap();
        assert_eq!(
            next["parents"][0]["conditions"][0]["lastTransitionTime"],
            "t3"
        );
    }

    #[test]
    fn other_controllers_parents_stay_first() {
        let current = json!({"parents": [{"controllerName": "example.com/other", "parentRef": {"name": "x"}, "conditions": []}]});
        let next =
            merged_gateway_status(Some(&current), &route("True"), None, CONTROLLER, "t").unwrap();
        let names: Vec<&str> = next["parents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["controllerName"].as_str().unwrap())
            .collect();
        // Istio's `status` golden: other controllers' entries first, then ours.
        assert_eq!(names, ["example.com/other", CONTROLLER]);
    }
    #[test]
    fn a_policys_ancestors_of_other_controllers_are_kept_first() {
        let ours = json!({"ancestors": [{
            "ancestorRef": {"group": "", "kind": "Service", "name": "httpbin"},
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "Configuration is valid"}],
            "controllerName": MESH_CONTROLLER,
        }]});
        let current = json!({"ancestors": [
            {"ancestorRef": {"group": "", "kind": "Service", "name": "httpbin"}, "controllerName": "example.com/other", "conditions": []},
            {"ancestorRef": {"group": "", "kind": "Service", "name": "gone"}, "controllerName": MESH_CONTROLLER, "conditions": []},
        ]});
        let next = merged_gateway_status(Some(&current), &ours, Some(1), CONTROLLER, "t").unwrap();
        let names: Vec<(&str, &str)> = next["ancestors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["controllerName"].as_str().unwrap(),
                    a["ancestorRef"]["name"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("example.com/other", "httpbin"),
                (MESH_CONTROLLER, "httpbin")
            ]
        );
        assert_eq!(
            next["ancestors"][1]["conditions"][0]["lastTransitionTime"],
            "t"
        );
    }
}

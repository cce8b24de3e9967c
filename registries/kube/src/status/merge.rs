//! The status to write: the object's current `status` with the desired `Reconciled`
//! condition, validation messages and observed generation put in, everything else
//! (other conditions, e.g. a WorkloadEntry's `Healthy`) kept.

use serde_json::{Map, Value, json};

use super::DesiredStatus;

/// The condition type Istio's distribution reporting writes.
pub const RECONCILED: &str = "Reconciled";

/// The new `status` of an object whose current status is `current` (`None` or
/// `null` when it has none) and whose `metadata.generation` is `generation`, or `None`
/// when writing would change nothing. A `Reconciled` condition whose status and
/// message are already as desired is kept as it is (timestamps included), as
/// Istio's `ReconcileStatuses` does; otherwise it gets `now` (RFC 3339) as its probe
/// time, and as its transition time when its status changes.
pub fn merged_status(
    current: Option<&Value>,
    desired: &DesiredStatus,
    generation: Option<i64>,
    now: &str,
) -> Option<Value> {
    let current = current.filter(|v| v.is_object());
    let mut status: Map<String, Value> = current
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if let Some(progress) = desired.reconciled {
        let want_status = if progress.acked == progress.total {
            "True"
        } else {
            "False"
        };
        let want_message = format!("{}/{} proxies up to date.", progress.acked, progress.total);
        let mut conditions: Vec<Value> = status
            .get("conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let at = conditions.iter().position(|c| c["type"] == RECONCILED);
        let old = at.map(|i| conditions[i].clone());
        let same = old
            .as_ref()
            .is_some_and(|c| c["status"] == want_status && c["message"] == want_message.as_str());
        if !same {
            let transition = match &old {
                Some(c) if c["status"] == want_status => c["lastTransitionTime"].clone(),
                _ => json!(now),
            };
            let condition = json!({
                "type": RECONCILED,
                "status": want_status,
                "lastProbeTime": now,
                "lastTransitionTime": transition,
                "message": want_message,
            });
            match at {
                Some(i) => conditions[i] = condition,
                None => conditions.push(condition),
            }
            status.insert("conditions".into(), Value::Array(conditions));
        }
    }
    if desired.messages.is_empty() {
        status.remove("validationMessages");
    } else {
        let messages = desired
            .messages
            .iter()
            .map(|m| {
                json!({
                    "type": {"name": m.name, "code": m.code},
                    "level": m.level.as_str(),
                    "documentationUrl": m.documentation_url,
                })
            })
            .collect();
        status.insert("validationMessages".into(), Value::Array(messages));
    }
    if let Some(generation) = generation {
        // int64 in proto3 JSON is a string; the CRD takes either.
        let same = match status.get("observedGeneration") {
            Some(Value::String(s)) => s.parse::<i64>().ok() == Some(generation),
            Some(Value::Number(n)) => n.as_i64() == Some(generation),
            _ => false,
        };
        if !same {
            status.insert(
                "observedGeneration".into(),
                Value::String(generation.to_string()),
            );
        }
    }
    let before = current.cloned().unwrap_or_else(|| json!({}));
    let after = Value::Object(status);
    (after != before).then_some(after)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{Level, Progress, ValidationMessage};

    fn desired(acked: usize, total: usize) -> DesiredStatus {
        DesiredStatus {
            reconciled: Some(Progress { acked, total }),
            messages: vec![ValidationMessage::istio(
                "IST0106",
                "SchemaValidationError",
                Level::Error,
            )],
            ..Default::default()
        }
    }

    #[test]
    fn istios_shape_and_nothing_written_when_nothing_changes() {
        let first = merged_status(None, &desired(1, 2), Some(3), "2026-01-01T00:00:00Z").unwrap();
        assert_eq!(
            first,
            json!({
                "conditions": [{
                    "type": "Reconciled", "status": "False",
                    "lastProbeTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "message": "1/2 proxies up to date.",
                }],
                "validationMessages": [{
                    "type": {"name": "SchemaValidationError", "code": "IST0106"},
                    "level": "ERROR",
                    "documentationUrl": "https://istio.io/latest/docs/reference/config/analysis/ist0106/",
                }],
                "observedGeneration": "3",
            })
        );
        assert_eq!(
            merged_status(Some(&first), &desired(1, 2), Some(3), "later"),
            None,
            "same status and message: no write, even later"
        );
        let next = merged_status(Some(&first), &desired(2, 2), Some(3), "later").unwrap();
        assert_eq!(next["conditions"][0]["status"], "True");
        assert_eq!(next["conditions"][0]["lastTransitionTime"], "later");
    }

    #[test]
    fn other_conditions_stay_and_empty_messages_are_removed() {
        let current = json!({
            "conditions": [{"type": "Healthy", "status": "True"}],
            "validationMessages": [{"type": {"code": "IST0101"}}],
            "observedGeneration": 2,
        });
        let next = merged_status(
            Some(&current),
            &DesiredStatus {
                reconciled: Some(Progress { acked: 0, total: 0 }),
                messages: vec![],
                ..Default::default()
            },
            Some(2),
            "t",
        )
        .unwrap();
        assert_eq!(next["conditions"][0]["type"], "Healthy");
        assert_eq!(next["conditions"][1]["message"], "0/0 proxies up to date.");
        assert!(next.get("validationMessages").is_none());
        assert_eq!(
            next["observedGeneration"], 2,
            "an integer generation is kept"
        );
    }
}

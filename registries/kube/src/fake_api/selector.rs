//! `fieldSelector` / `labelSelector` for the fake API server: the equality-based forms
//! (`=`, `==`, `!=`, and label existence `k` / `!k`); set-based forms are refused.

use std::collections::BTreeMap;

use serde_json::Value;

/// A parsed `fieldSelector` + `labelSelector` (equality-based forms only).
#[derive(Debug, Default)]
pub(super) struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Debug)]
struct Requirement {
    target: Target,
    op: Op,
}

#[derive(Debug)]
enum Target {
    /// A dotted path into the object (`status.phase`).
    Field(Vec<String>),
    /// A label key.
    Label(String),
}

#[derive(Debug)]
enum Op {
    Equals(String),
    NotEquals(String),
    Exists,
    NotExists,
}

impl Selector {
    pub(super) fn parse(query: &BTreeMap<String, String>) -> Result<Selector, String> {
        let mut requirements = Vec::new();
        for (param, is_label) in [("fieldSelector", false), ("labelSelector", true)] {
            let Some(text) = query.get(param) else {
                continue;
            };
            for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                let (key, op) = if let Some((k, v)) = term.split_once("!=") {
                    (k, Op::NotEquals(v.to_string()))
                } else if let Some((k, v)) = term.split_once("==") {
                    (k, Op::Equals(v.to_string()))
                } else if let Some((k, v)) = term.split_once('=') {
                    (k, Op::Equals(v.to_string()))
                } else if !is_label || term.contains(' ') {
                    return Err(format!("{param}: unsupported term {term:?}"));
                } else if let Some(k) = term.strip_prefix('!') {
                    (k, Op::NotExists)
                } else {
                    (term, Op::Exists)
                };
                let key = key.trim();
                let target = if is_label {
                    Target::Label(key.to_string())
                } else {
                    Target::Field(key.split('.').map(str::to_string).collect())
                };
                requirements.push(Requirement { target, op });
            }
        }
        Ok(Selector { requirements })
    }

    pub(super) fn matches(&self, obj: &Value) -> bool {
        self.requirements.iter().all(|r| {
            let value = match &r.target {
                Target::Label(key) => obj["metadata"]["labels"].get(key),
                Target::Field(path) => path.iter().try_fold(obj, |v, k| v.get(k)),
            };
            let text = value.map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
            match &r.op {
                Op::Equals(want) => text.as_deref().unwrap_or("") == want,
                Op::NotEquals(want) => text.as_deref().unwrap_or("") != want,
                Op::Exists => text.is_some(),
                Op::NotExists => text.is_none(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_match_fields_and_labels() {
        let query = BTreeMap::from([
            (
                "fieldSelector".to_string(),
                "status.phase!=Failed".to_string(),
            ),
            ("labelSelector".to_string(), "app=a,!canary".to_string()),
        ]);
        let s = Selector::parse(&query).unwrap();
        let pod = |phase: &str, labels: Value| json!({"metadata": {"labels": labels}, "status": {"phase": phase}});
        assert!(s.matches(&pod("Running", json!({"app": "a"}))));
        assert!(!s.matches(&pod("Failed", json!({"app": "a"}))));
        assert!(!s.matches(&pod("Running", json!({"app": "a", "canary": "1"}))));
        let bad = BTreeMap::from([("labelSelector".to_string(), "app in (a)".to_string())]);
        assert!(Selector::parse(&bad).is_err());
    }
}

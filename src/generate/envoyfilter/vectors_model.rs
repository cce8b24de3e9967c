//! `pilot/pkg/model/envoyfilter_test.go` (`TestEnvoyFilterMatch`: proxy version
//! matching), ported, and the selection and ordering rules of Istio's
//! `PushContext.EnvoyFilters` (root namespace, own namespace, selector, targetRefs,
//! priority, root first, creation time, name) checked as meshfed tests.

use serde_json::json;

use super::patches_for;
use super::vectors_support::{ef, proxy};
use meshfed_api::networking::v1alpha3::envoy_filter::ApplyTo;

const FILE: &str = "model/envoyfilter_test.go";

type Outcome = (&'static str, String, Result<(), String>);

fn version_case(regex: &str, versions: &[(&str, bool)]) -> Result<(), String> {
    let e = ef(
        "ns",
        "v",
        0,
        json!({"configPatches": [{"applyTo": "CLUSTER", "match": {"proxy": {"proxyVersion": regex}},
            "patch": {"operation": "REMOVE"}}]}),
    );
    let mut wrong = Vec::new();
    for (v, want) in versions {
        let p = proxy("sidecar", "ns", json!({"ISTIO_VERSION": v}));
        let got = patches_for(std::slice::from_ref(&e), "istio-config", &p)
            .is_some_and(|p| !p.of(ApplyTo::Cluster).is_empty());
        if got != *want {
            wrong.push(format!("{v}: got {got}"));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join(", "))
    }
}

pub(super) fn all() -> Vec<Outcome> {
    vec![
        (
            FILE,
            "TestEnvoyFilterMatch/version prefix match".into(),
            version_case(
                r"^1\.6.*",
                &[
                    ("1.6", true),
                    ("1.6.0", true),
                    ("1.6-dev.foo", true),
                    ("1.5", false),
                    ("11.6", false),
                    ("foo1.6", false),
                ],
            ),
        ),
        (
            FILE,
            "TestEnvoyFilterMatch/version prefix mismatch".into(),
            version_case(
                r"1\.6.*",
                &[
                    ("1.6", true),
                    ("1.6.0", true),
                    ("1.6-dev.foo", true),
                    ("1.5", false),
                    ("11.6", true),
                    ("foo1.6", true),
                ],
            ),
        ),
        (
            FILE,
            "TestEnvoyFilterMatch/non-numeric".into(),
            version_case(
                "foobar",
                &[
                    ("1.6", false),
                    ("1.6.0", false),
                    ("1.6-dev.foo", false),
                    ("foobar", true),
                ],
            ),
        ),
    ]
}

fn names(
    efs: &[std::sync::Arc<
        crate::push::config_index::Config<meshfed_api::networking::v1alpha3::EnvoyFilter>,
    >],
    p: &crate::model::Proxy,
) -> Vec<String> {
    patches_for(efs, "istio-config", p)
        .map(|p| p.keys.iter().map(ToString::to_string).collect())
        .unwrap_or_default()
}

#[test]
fn selection_follows_namespace_selector_and_target_refs() {
    let any = json!({"configPatches": []});
    let efs = vec![
        ef("istio-config", "mesh", 0, any.clone()),
        ef("foo", "ns-wide", 0, any.clone()),
        ef(
            "foo",
            "only-a",
            0,
            json!({"workloadSelector": {"labels": {"app": "a"}}}),
        ),
        ef(
            "foo",
            "targeted",
            0,
            json!({"targetRefs": [{"kind": "Service", "name": "a"}]}),
        ),
        ef("bar", "other-ns", 0, any),
    ];
    let a = proxy("sidecar", "foo", json!({"LABELS": {"app": "a"}}));
    let b = proxy("sidecar", "foo", json!({"LABELS": {"app": "b"}}));
    let gw = proxy("router", "baz", json!({}));
    assert_eq!(
        names(&efs, &a),
        ["istio-config/mesh", "foo/ns-wide", "foo/only-a"]
    );
    assert_eq!(names(&efs, &b), ["istio-config/mesh", "foo/ns-wide"]);
    assert_eq!(names(&efs, &gw), ["istio-config/mesh"]);
}

#[test]
fn order_is_priority_then_root_then_creation_then_name() {
    let any = json!({"configPatches": []});
    let prio = |n: i32| json!({"priority": n, "configPatches": []});
    let efs = vec![
        ef("foo", "late", 20, any.clone()),
        ef("foo", "b-same-time", 10, any.clone()),
        ef("foo", "a-same-time", 10, any.clone()),
        ef("istio-config", "root-late", 30, any),
        ef("foo", "first", 99, prio(-5)),
        ef("istio-config", "root-last", 0, prio(7)),
    ];
    let p = proxy("sidecar", "foo", json!({}));
    assert_eq!(
        names(&efs, &p),
        [
            "foo/first",
            "istio-config/root-late",
            "foo/a-same-time",
            "foo/b-same-time",
            "foo/late",
            "istio-config/root-last",
        ]
    );
}

#[test]
fn proxy_metadata_must_all_match() {
    let e = ef(
        "ns",
        "m",
        0,
        json!({"configPatches": [{"applyTo": "CLUSTER", "match": {"proxy": {"metadata": {"A": "1", "B": "2"}}},
            "patch": {"operation": "REMOVE"}}]}),
    );
    let has = |meta| {
        patches_for(
            std::slice::from_ref(&e),
            "istio-config",
            &proxy("sidecar", "ns", meta),
        )
        .is_some_and(|p| !p.of(ApplyTo::Cluster).is_empty())
    };
    assert!(has(json!({"A": "1", "B": "2"})));
    assert!(!has(json!({"A": "1"})));
    assert!(!has(json!({"A": "1", "B": "3"})));
}

#[test]
fn target_refs_select_the_named_gateway_api_gateway_of_the_same_namespace() {
    let gw_ref = |name: &str| json!({"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": name}]});
    let efs = vec![
        ef("gw", "to-g1", 0, gw_ref("g1")),
        ef("gw", "to-g2", 0, gw_ref("g2")),
        ef("istio-config", "root-to-g1", 0, gw_ref("g1")),
        ef(
            "gw",
            "other-ns-ref",
            0,
            json!({"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "g1", "namespace": "x"}]}),
        ),
        ef(
            "gw",
            "waypoint",
            0,
            json!({"targetRefs": [{"kind": "Service", "name": "g1"}]}),
        ),
        ef(
            "gw",
            "selector",
            0,
            json!({"workloadSelector": {"labels": {"app": "g"}}}),
        ),
    ];
    let label = "gateway.networking.k8s.io/gateway-name";
    let g1 = proxy("router", "gw", json!({"LABELS": {label: "g1", "app": "g"}}));
    // Istio: a root-namespace targetRef does not attach to another namespace's
    // gateway; selectors still apply to Gateway API gateways.
    assert_eq!(names(&efs, &g1), ["gw/selector", "gw/to-g1"]);
    // A classic gateway or sidecar without the label: no targetRef applies.
    let classic = proxy("router", "gw", json!({"LABELS": {"app": "g"}}));
    assert_eq!(names(&efs, &classic), ["gw/selector"]);
    let other = proxy("router", "other", json!({"LABELS": {label: "g1"}}));
    assert!(names(&efs, &other).is_empty());
    // The waypoint and cross-namespace targets are reported.
    let unserved = |e: &crate::push::config_index::Config<
        meshfed_api::networking::v1alpha3::EnvoyFilter,
    >| { super::unserved_target_refs(&e.spec, &e.namespace) };
    assert!(unserved(&efs[0]).is_empty());
    assert!(
        unserved(&efs[3])[0].contains("namespace \"x\""),
        "{:?}",
        unserved(&efs[3])
    );
    assert!(
        unserved(&efs[4])[0].contains("waypoints"),
        "{:?}",
        unserved(&efs[4])
    );
}

#[test]
fn listener_adds_run_per_direction_for_sidecars_and_any_adds_once() {
    let add = |ctx: &str, name: &str| {
        json!({"applyTo": "LISTENER", "match": {"context": ctx},
            "patch": {"operation": "ADD", "value": {"name": name,
                "address": {"socket_address": {"address": "0.0.0.0", "port_value": 9000}}}}})
    };
    let e = ef(
        "ns",
        "adds",
        0,
        json!({"configPatches": [add("SIDECAR_INBOUND", "in"), add("SIDECAR_OUTBOUND", "out"),
            add("ANY", "any"), add("GATEWAY", "gw")]}),
    );
    let added = |kind: &str| {
        let p = proxy(kind, "ns", json!({}));
        let patches = patches_for(std::slice::from_ref(&e), "istio-config", &p).unwrap();
        super::listener::apply(&patches, Vec::new(), &p, super::listener::add_contexts(&p))
            .iter()
            .map(|r| r.name.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(added("sidecar"), ["out", "any", "in"]);
    assert_eq!(added("router"), ["any", "gw"]);
}

//! `pilot/pkg/model/envoyfilter_test.go` (`TestEnvoyFilterMatch`: proxy version
//! matching) and the EnvoyFilter tests of `pilot/pkg/model/push_context_test.go`
//! (`TestEnvoyFilters`: selection; `TestEnvoyFilterOrder`,
//! `TestEnvoyFilterOrderAcrossNamespaces`: ordering), ported, and the selection and
//! ordering rules of Istio's `PushContext.EnvoyFilters` (root namespace, own namespace,
//! selector, targetRefs, priority, root first, creation time, name) checked as meshfed
//! tests. `TestEnvoyFilterUpdate` checks how istiod updates its per-namespace index in
//! place; meshfed rebuilds the selection from the snapshot, so it has no counterpart.
//!
//! Istio's push context tests give patches an empty `Patch` ("we don't care about the
//! patch content"); meshfed rejects a patch without operation, so the ports use
//! `REMOVE`, which needs no value.

use serde_json::json;

use super::patches_for;
use super::vectors_support::{ef, proxy};
use meshfed_api::networking::v1alpha3::envoy_filter::ApplyTo;

const FILE: &str = "model/envoyfilter_test.go";
const PUSH_CONTEXT: &str = "model/push_context_test.go";

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
    let mut out = envoy_filter_match();
    out.extend(envoy_filters());
    out.push((
        PUSH_CONTEXT,
        "TestEnvoyFilterOrder".into(),
        envoy_filter_order(),
    ));
    out.push((
        PUSH_CONTEXT,
        "TestEnvoyFilterOrderAcrossNamespaces".into(),
        order_across_namespaces(),
    ));
    out
}

/// `TestEnvoyFilters`: Istio's push context lists the same four EnvoyFilters (of
/// `test-ns`) under `test-ns` and under the root namespace `istio-system`; here they
/// are objects of both namespaces.
fn envoy_filters() -> Vec<Outcome> {
    let patch = |apply_to: &str, version: bool| {
        let mut p = json!({"applyTo": apply_to, "patch": {"operation": "REMOVE"}});
        if version {
            p["match"] = json!({"proxy": {"proxyVersion": "1\\.4.*"}});
        }
        p
    };
    let gateway = |name: &str| json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": name}]);
    let specs = [
        (
            "ef1",
            json!({"workloadSelector": {"labels": {"app": "v1"}},
                "configPatches": [patch("LISTENER", true)]}),
        ),
        (
            "ef2",
            json!({"workloadSelector": {"labels": {"app": "v1"}},
                "configPatches": [patch("CLUSTER", true)]}),
        ),
        (
            "ef-with-target-ref",
            json!({"targetRefs": gateway("gateway-1"), "configPatches": [patch("CLUSTER", true)]}),
        ),
        (
            "ef-for-waypoint",
            json!({"targetRefs": gateway("waypoint"), "configPatches": [patch("CLUSTER", false)]}),
        ),
    ];
    let efs: Vec<_> = ["istio-system", "test-ns"]
        .iter()
        .flat_map(|ns| specs.iter().map(|(n, s)| ef(ns, n, 0, s.clone())))
        .collect();
    let app_v1 = json!({"app": "v1"});
    let cases = [
        (
            "proxy matches two envoyfilters",
            "sidecar",
            "test-ns",
            app_v1.clone(),
            "1.4.0",
            2,
            2,
        ),
        (
            "proxy in root namespace matches an envoyfilter",
            "sidecar",
            "istio-system",
            app_v1.clone(),
            "1.4.0",
            1,
            1,
        ),
        (
            "proxy matches no envoyfilter",
            "sidecar",
            "test-ns",
            json!({"app": "v2"}),
            "1.4.0",
            0,
            0,
        ),
        (
            "proxy matches envoyfilter in root ns",
            "sidecar",
            "test-n2",
            app_v1.clone(),
            "1.4.0",
            1,
            1,
        ),
        (
            "proxy version matches no envoyfilters",
            "sidecar",
            "test-ns",
            app_v1,
            "1.3.0",
            0,
            0,
        ),
        (
            "proxy matched target ref",
            "sidecar",
            "test-ns",
            json!({"gateway.networking.k8s.io/gateway-name": "gateway-1"}),
            "1.4.0",
            0,
            2,
        ),
        (
            "waypoint matched",
            "waypoint",
            "test-ns",
            json!({"gateway.networking.k8s.io/gateway-name": "waypoint"}),
            "1.4.0",
            0,
            2,
        ),
    ];
    cases
        .into_iter()
        .map(|(name, kind, ns, labels, version, listeners, clusters)| {
            let p = proxy(
                kind,
                ns,
                json!({"LABELS": labels, "ISTIO_VERSION": version}),
            );
            let got = patches_for(&efs, "istio-system", &p).map_or((0, 0), |p| {
                (p.of(ApplyTo::Listener).len(), p.of(ApplyTo::Cluster).len())
            });
            let outcome = if got == (listeners, clusters) {
                Ok(())
            } else {
                Err(format!(
                    "(listener, cluster) patches: got {got:?}, want {:?}",
                    (listeners, clusters)
                ))
            };
            (PUSH_CONTEXT, format!("TestEnvoyFilters/{name}"), outcome)
        })
        .collect()
}

/// `TestEnvoyFilterOrder`: the order of each namespace's EnvoyFilters (creation
/// times: none, one shared `ctime`, and a later one).
fn envoy_filter_order() -> Result<(), String> {
    let spec = |priority: i32| json!({"priority": priority, "configPatches": []});
    let efs = [
        ("default-priority", "testns-1", 0, 0),
        ("default-priority", "testns", 0, 0),
        ("b-medium-priority", "testns-1", 10, 100),
        ("a-medium-priority", "testns-1", 10, 100),
        ("b-medium-priority", "testns", 10, 100),
        ("a-medium-priority", "testns", 10, 100),
        ("a-low-priority", "testns", 20, 200),
        ("b-low-priority", "testns", 20, 100),
        ("high-priority", "testns", -1, 0),
        ("super-high-priority", "testns", -10, 0),
    ]
    .map(|(name, ns, priority, created)| ef(ns, name, created, spec(priority)));
    let ordered = |ns: &str| {
        let mut of_ns: Vec<_> = efs.iter().filter(|e| e.namespace == ns).collect();
        super::order(&mut of_ns, "istio-system");
        of_ns
            .iter()
            .map(|e| format!("{}/{}", e.namespace, e.name))
            .collect::<Vec<_>>()
    };
    let want = [
        "testns/super-high-priority",
        "testns/high-priority",
        "testns/default-priority",
        "testns/a-medium-priority",
        "testns/b-medium-priority",
        "testns/b-low-priority",
        "testns/a-low-priority",
    ];
    let want1 = [
        "testns-1/default-priority",
        "testns-1/a-medium-priority",
        "testns-1/b-medium-priority",
    ];
    let (got, got1) = (ordered("testns"), ordered("testns-1"));
    if got == want && got1 == want1 {
        Ok(())
    } else {
        Err(format!("got {got:?} and {got1:?}"))
    }
}

/// `TestEnvoyFilterOrderAcrossNamespaces`: priority orders a namespace's filter before
/// the root namespace's.
fn order_across_namespaces() -> Result<(), String> {
    let spec = |name: &str, priority: i32| {
        json!({"priority": priority, "configPatches": [{"applyTo": "HTTP_FILTER",
            "match": {"proxy": {"proxyVersion": "foobar"}},
            "patch": {"operation": "INSERT_BEFORE", "value": {"name": name}}}]})
    };
    let efs = vec![
        ef("test-ns", "filter-1", 0, spec("filter-1", -5)),
        ef("istio-system", "filter-2", 0, spec("filter-2", -1)),
    ];
    let p = proxy(
        "sidecar",
        "test-ns",
        json!({"LABELS": {"app": "v1"}, "ISTIO_VERSION": "foobar"}),
    );
    let got: Vec<String> = patches_for(&efs, "istio-system", &p)
        .map(|p| {
            p.of(ApplyTo::HttpFilter)
                .iter()
                .map(|x| x.key.to_string())
                .collect()
        })
        .unwrap_or_default();
    if got == ["test-ns/filter-1", "istio-system/filter-2"] {
        Ok(())
    } else {
        Err(format!("got {got:?}"))
    }
}

fn envoy_filter_match() -> Vec<Outcome> {
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

#[test]
fn push_selectors_follow_the_workload_selector_or_the_named_gateways() {
    use std::collections::BTreeMap;
    let label = |v: &str| {
        Some(BTreeMap::from([(
            super::GATEWAY_NAME_LABEL.to_string(),
            v.to_string(),
        )]))
    };
    let sel = |spec| {
        let ef = ef("gw", "e", 0, spec);
        crate::xds::deps::envoy_filter_selectors(&ef.spec, &ef.namespace)
    };
    assert_eq!(sel(json!({"configPatches": []})), vec![None]);
    assert_eq!(
        sel(json!({"workloadSelector": {"labels": {"app": "a"}}})),
        vec![Some(BTreeMap::from([("app".to_string(), "a".to_string())]))]
    );
    let gw = |name: &str, ns: &str| json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": name, "namespace": ns});
    assert_eq!(
        sel(
            json!({"targetRefs": [gw("public", ""), gw("private", "gw"), gw("elsewhere", "other"),
            {"kind": "Service", "name": "public"}]})
        ),
        vec![label("public"), label("private")],
        "gateways of its own namespace only; waypoint targets select none"
    );
    assert!(sel(json!({"targetRefs": [{"kind": "Service", "name": "a"}]})).is_empty());
}

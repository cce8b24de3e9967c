//! Istio's vectors for ztunnel's policies, ours to run:
//! - `TestRBACConvert` (ambient `ambientindex_test.go`, inputs and goldens under
//!   `ambient/testdata`): one policy file in, the `Authorization` as YAML out;
//! - `TestConvertAuthorizationPolicyStatus` (`authorization_test.go`): the condition a
//!   policy gets;
//! - `TestAmbientIndex_Policy` (`ambientindex_test.go`): a workload's
//!   `authorization_policies` through a sequence of policy changes;
//!
//! and the selection rules of `buildWorkloadPolicies`.
//!
//! Every vector passes or is listed in [`KNOWN_GAPS`] with its reason; a listed vector
//! that passes fails [`known_gaps_still_fail`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshfed_api::security::v1beta1::{AuthorizationPolicy, PeerAuthentication};
use serde_json::Value;

use super::peer::namespace_policy;
use super::*;
use crate::push::config_index::{Config, ConfigSet};

/// Istio's test root namespace (`systemNS`).
const ROOT: &str = "istio-system";

fn yaml(s: &str) -> Value {
    serde_norway::from_str(s).expect("yaml")
}

fn config<T: serde::de::DeserializeOwned>(doc: &Value, age: u64) -> Config<T> {
    let meta = &doc["metadata"];
    Config {
        name: meta["name"].as_str().unwrap_or_default().to_string(),
        namespace: meta["namespace"].as_str().unwrap_or_default().to_string(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        creation_time: SystemTime::UNIX_EPOCH + Duration::from_secs(age),
        spec: serde_json::from_value(doc["spec"].clone()).expect("spec"),
    }
}

/// Runs Istio's `TestRBACConvert` harness over one input file: an AuthorizationPolicy
/// is converted alone; PeerAuthentications are sorted into root, namespace and
/// workload policies (one file holds one kind) and the workload one (else the
/// namespace one) is converted. The output as proto3 JSON, `Null` for none.
fn rbac_convert(input: &str) -> Value {
    let docs: Vec<Value> = input.split("\n---\n").map(yaml).collect();
    let out = match docs[0]["kind"].as_str() {
        Some("AuthorizationPolicy") => {
            let ap: Config<AuthorizationPolicy> = config(&docs[0], 0);
            convert_authorization_policy(ROOT, &ap).0
        }
        Some("PeerAuthentication") => {
            let pas: Vec<Arc<Config<PeerAuthentication>>> = docs
                .iter()
                .map(|d| Arc::new(config::<PeerAuthentication>(d, 0)))
                .collect();
            if pas.len() == 1 {
                convert_peer_authentication(ROOT, &pas[0], None, None)
            } else {
                let root = namespace_policy(&pas, ROOT);
                let workload = pas
                    .iter()
                    .find(|p| p.namespace != ROOT && p.spec.selector.is_some());
                let ns = workload.and_then(|w| namespace_policy(&pas, &w.namespace));
                match workload {
                    Some(w) => convert_peer_authentication(ROOT, w, ns, root),
                    // Istio passes the namespace policy as the workload one.
                    None => {
                        let ns = pas.iter().find(|p| p.namespace != ROOT);
                        ns.and_then(|n| convert_peer_authentication(ROOT, n, None, root))
                    }
                }
            }
        }
        other => panic!("unexpected kind {other:?}"),
    };
    out.map_or(Value::Null, |a| serde_json::to_value(&a).expect("json"))
}

struct Golden {
    name: &'static str,
    input: &'static str,
    /// The golden YAML; empty for "no policy".
    golden: &'static str,
}

/// `TestRBACConvert`'s files. Where the index held no golden for the input, the
/// expectation is worked out from Istio's conversion code and says so.
const RBAC_CONVERT: &[Golden] = &[
    Golden {
        name: "allow-full",
        input: include_str!("testdata/allow-full-in.yaml"),
        golden: include_str!("testdata/allow-full.yaml"),
    },
    Golden {
        name: "allow-groups",
        input: include_str!("testdata/allow-groups-in.yaml"),
        golden: include_str!("testdata/allow-groups.yaml"),
    },
    Golden {
        name: "peer-authn-disable",
        input: include_str!("testdata/peer-authn-disable-in.yaml"),
        golden: "",
    },
    Golden {
        name: "peer-authn-disable-port-mtls-strict",
        input: include_str!("testdata/peer-authn-disable-port-mtls-strict-in.yaml"),
        golden: include_str!("testdata/peer-authn-disable-port-mtls-strict.yaml"),
    },
    Golden {
        name: "peer-authn-permissive",
        input: include_str!("testdata/peer-authn-permissive-in.yaml"),
        golden: "",
    },
    Golden {
        name: "peer-authn-permissive-root-permissive-namespace-strict-workload-ports",
        input: include_str!(
            "testdata/peer-authn-permissive-root-permissive-namespace-strict-workload-ports-in.yaml"
        ),
        golden: include_str!(
            "testdata/peer-authn-permissive-root-permissive-namespace-strict-workload-ports.yaml"
        ),
    },
    Golden {
        name: "peer-authn-permissive-root-permissive-workload",
        input: include_str!("testdata/peer-authn-permissive-root-permissive-workload-in.yaml"),
        golden: "",
    },
    Golden {
        name: "peer-authn-permissive-root-strict-namespace-permissive-workload",
        input: include_str!(
            "testdata/peer-authn-permissive-root-strict-namespace-permissive-workload-in.yaml"
        ),
        golden: include_str!(
            "testdata/peer-authn-permissive-root-strict-namespace-permissive-workload.yaml"
        ),
    },
    Golden {
        name: "peer-authn-strict",
        input: include_str!("testdata/peer-authn-strict-in.yaml"),
        golden: "",
    },
    Golden {
        name: "peer-authn-strict-and-disable-port-mtls",
        input: include_str!("testdata/peer-authn-strict-and-disable-port-mtls-in.yaml"),
        golden: include_str!("testdata/peer-authn-strict-and-disable-port-mtls.yaml"),
    },
    Golden {
        name: "peer-authn-strict-and-permissive-port-mtls",
        input: include_str!("testdata/peer-authn-strict-and-permissive-port-mtls-in.yaml"),
        golden: include_str!("testdata/peer-authn-strict-and-permissive-port-mtls.yaml"),
    },
    Golden {
        name: "peer-authn-strict-root-permissive-namespace-strict-workload",
        input: include_str!(
            "testdata/peer-authn-strict-root-permissive-namespace-strict-workload-in.yaml"
        ),
        golden: include_str!(
            "testdata/peer-authn-strict-root-permissive-namespace-strict-workload.yaml"
        ),
    },
    Golden {
        name: "peer-authn-strict-root-permissive-workload",
        input: include_str!("testdata/peer-authn-strict-root-permissive-workload-in.yaml"),
        golden: include_str!("testdata/peer-authn-strict-root-permissive-workload.yaml"),
    },
    Golden {
        name: "peer-authn-unset-port-mtls-permissive",
        input: include_str!("testdata/peer-authn-unset-port-mtls-permissive-in.yaml"),
        golden: "",
    },
    Golden {
        name: "peer-authn-unset-port-mtls-strict",
        input: include_str!("testdata/peer-authn-unset-port-mtls-strict-in.yaml"),
        golden: include_str!("testdata/peer-authn-unset-port-mtls-strict.yaml"),
    },
];

/// A status vector: name, policy spec, expected (reason, message).
type StatusVector = (
    &'static str,
    &'static str,
    Option<(&'static str, &'static str)>,
);

/// `TestConvertAuthorizationPolicyStatus`.
const STATUS: &[StatusVector] = &[
    (
        "no status - targetRef is not for ztunnel",
        "targetRef: {kind: Service, name: test-svc}\nrules: []",
        None,
    ),
    (
        "no status - policy is fine",
        "rules:\n- from: [{source: {principals: [trust/ns/echo-1234/]}}]\n  to: [{operation: {ports: [http]}}]",
        None,
    ),
    (
        "unsupported AUDIT action",
        "action: AUDIT\nrules:\n- from: [{source: {principals: [trust/ns/echo-1234/]}}]\n  to: [{operation: {ports: [http]}}]",
        Some((
            "UnsupportedValue",
            "ztunnel does not support the AUDIT action",
        )),
    ),
    (
        "unsupported CUSTOM action",
        "action: CUSTOM\nrules:\n- from: [{source: {principals: [trust/ns/echo-1234/]}}]\n  to: [{operation: {ports: [http]}}]",
        Some((
            "UnsupportedValue",
            "ztunnel does not support the CUSTOM action",
        )),
    ),
    (
        "unsupported HTTP methods",
        "rules:\n- from: [{source: {requestPrincipals: [example.com/sub-1]}}]\n  to: [{operation: {methods: [GET]}}]\n  when: [{key: request.auth.presenter, values: [presenter.example.com]}]",
        Some((
            "UnsupportedValue",
            "ztunnel does not support HTTP attributes (found: methods, request.auth.presenter, requestPrincipals). \
             In ambient mode you must use a waypoint proxy to enforce HTTP rules. \
             Within an ALLOW policy, rules matching HTTP attributes are omitted. \
             This will be more restrictive than requested.",
        )),
    ),
];

/// Vectors meshfed does not pass yet, with the reason.
const KNOWN_GAPS: &[(&str, &str)] = &[];

fn rbac_convert_passes(v: &Golden) -> Result<(), String> {
    let got = rbac_convert(v.input);
    let want = if v.golden.trim().is_empty() {
        Value::Null
    } else {
        yaml(v.golden)
    };
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "got {}\nwant {}",
            serde_json::to_string_pretty(&got).unwrap_or_default(),
            serde_json::to_string_pretty(&want).unwrap_or_default()
        ))
    }
}

fn status_passes(spec: &str, want: Option<(&str, &str)>) -> Result<(), String> {
    let ap = Config {
        name: String::new(),
        namespace: String::new(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        creation_time: SystemTime::UNIX_EPOCH,
        spec: serde_json::from_value::<AuthorizationPolicy>(yaml(spec)).expect("spec"),
    };
    let got = convert_authorization_policy("test-system", &ap).1;
    let got = got.as_ref().map(|f| (f.reason, f.message.as_str()));
    if got == want {
        Ok(())
    } else {
        Err(format!("got {got:?}, want {want:?}"))
    }
}

/// Every vector by name, with whether it passes.
fn all_vectors() -> Vec<(String, Result<(), String>)> {
    let mut out = Vec::new();
    for v in RBAC_CONVERT {
        out.push((
            format!("TestRBACConvert/{}", v.name),
            rbac_convert_passes(v),
        ));
    }
    for (name, spec, want) in STATUS {
        out.push((
            format!("TestConvertAuthorizationPolicyStatus/{name}"),
            status_passes(spec, *want),
        ));
    }
    out.extend(ambient_index_policy());
    out
}

/// The config of one step of `TestAmbientIndex_Policy`: objects by (namespace, name).
#[derive(Default)]
struct World {
    aps: BTreeMap<(String, String), String>,
    pas: BTreeMap<(String, String), String>,
}

impl World {
    fn ap(&mut self, ns: &str, name: &str, spec: &str) {
        self.aps.insert((ns.into(), name.into()), spec.into());
    }
    fn pa(&mut self, ns: &str, name: &str, spec: &str) {
        self.pas.insert((ns.into(), name.into()), spec.into());
    }
    fn policies(&self) -> AmbientPolicies {
        let aps: Vec<(&str, &str, &str)> = self
            .aps
            .iter()
            .map(|((ns, n), s)| (ns.as_str(), n.as_str(), s.as_str()))
            .collect();
        let pas: Vec<(&str, &str, &str, u64)> = self
            .pas
            .iter()
            .map(|((ns, n), s)| (ns.as_str(), n.as_str(), s.as_str(), 0))
            .collect();
        AmbientPolicies::build(&index(&aps, &pas))
    }
}

/// `TestAmbientIndex_Policy` (ambient `ambientindex_test.go`): policies added,
/// changed and deleted one after the other, and after each step the
/// `authorization_policies` of `pod1` (ns1, `app: a`; or another pod) or the served
/// set. Istio's push events between the steps are not compared (meshfed rebuilds the
/// type per snapshot and Delta sends what changed).
fn ambient_index_policy() -> Vec<(String, Result<(), String>)> {
    const S: &str = "istio-system/istio_converted_static_strict";
    const W: &str = "ns1/converted_peer_authentication_selector";
    const WS: &str = "ns1/converted_peer_authentication_selector-strict";
    let a = labels(&[("app", "a")]);
    let not_a = labels(&[("app", "not-a")]);
    let mut out = Vec::new();
    let mut w = World::default();
    let mut step = 0;
    let mut check = |w: &World, what: &str, labels: &BTreeMap<String, String>, want: &[&str]| {
        step += 1;
        let got = w.policies().workload_policies("ns1", labels);
        let result = if got == want {
            Ok(())
        } else {
            Err(format!("got {got:?}, want {want:?}"))
        };
        out.push((format!("TestAmbientIndex_Policy/{step:02} {what}"), result));
    };
    let sel = |mode: &str, ports: &str| {
        format!(
            "selector: {{matchLabels: {{app: a}}}}\nmtls: {{{mode}}}\nportLevelMtls: {{{ports}}}"
        )
    };
    w.pa(ROOT, "global", "mtls: {mode: PERMISSIVE}");
    let served = w.policies().get(S).is_some();
    w.pa("ns1", "namespace", "mtls: {mode: STRICT}");
    check(&w, "namespace STRICT", &a, &[S]);
    w.pa("ns1", "selector", &sel("mode: STRICT", ""));
    check(&w, "workload STRICT", &a, &[S]);
    w.pa("ns1", "selector", &sel("mode: PERMISSIVE", ""));
    check(&w, "workload PERMISSIVE", &a, &[]);
    w.pa(
        "ns1",
        "selector",
        &sel("mode: PERMISSIVE", "'9090': {mode: STRICT}"),
    );
    check(&w, "workload PERMISSIVE, port STRICT", &a, &[W]);
    check(&w, "pod2 outside the selector", &not_a, &[S]);
    check(&w, "pod2 relabelled into it", &a, &[W]);
    w.pa(
        ROOT,
        "global-selector",
        "selector: {matchLabels: {app: a}}\nmtls: {mode: STRICT}",
    );
    check(&w, "a root-namespace selector is ignored", &a, &[W]);
    w.pas.remove(&(ROOT.into(), "global-selector".into()));
    w.pa(
        "ns1",
        "selector",
        &sel("mode: PERMISSIVE", "'9090': {mode: PERMISSIVE}"),
    );
    check(&w, "workload and port PERMISSIVE", &a, &[]);
    w.pa("ns1", "namespace", "mtls: {mode: PERMISSIVE}");
    check(&w, "namespace PERMISSIVE", &a, &[]);
    w.pa("ns1", "selector", &sel("mode: STRICT", ""));
    check(&w, "workload STRICT without ports", &a, &[S]);
    w.pa(
        "ns1",
        "selector",
        &sel("mode: STRICT", "'9090': {mode: PERMISSIVE}"),
    );
    check(&w, "workload STRICT, port PERMISSIVE", &a, &[W]);
    w.pa("ns1", "selector", &sel("", "'9090': {mode: STRICT}"));
    check(&w, "workload UNSET, port STRICT", &a, &[W]);
    w.pa("ns1", "namespace", "mtls: {mode: STRICT}");
    check(&w, "namespace STRICT again", &a, &[S]);
    w.pa("ns1", "selector", &sel("", "'9090': {mode: PERMISSIVE}"));
    check(&w, "workload UNSET, port PERMISSIVE", &a, &[W]);
    w.pas.remove(&("ns1".into(), "selector".into()));
    check(&w, "workload policy deleted", &a, &[S]);
    w.pas.clear();
    let removed = w.policies().get(S).is_none();
    w.ap(ROOT, "global", "{}");
    w.ap("ns1", "namespace", "{}");
    check(&w, "global and namespace AuthorizationPolicies", &a, &[]);
    w.ap("ns1", "selector", "selector: {matchLabels: {app: a}}");
    check(&w, "selector AuthorizationPolicy", &a, &["ns1/selector"]);
    check(&w, "pod3 outside it", &not_a, &[]);
    check(&w, "pod3 relabelled into it", &a, &["ns1/selector"]);
    w.ap(ROOT, "global-selector", "selector: {matchLabels: {app: a}}");
    check(
        &w,
        "root-namespace selector AuthorizationPolicy",
        &a,
        &["istio-system/global-selector", "ns1/selector"],
    );
    w.ap(
        ROOT,
        "global-selector",
        "selector: {matchLabels: {app: not-a}}",
    );
    check(&w, "it selects no more", &a, &["ns1/selector"]);
    w.pa(ROOT, "strict", "mtls: {mode: STRICT}");
    check(&w, "mesh STRICT", &a, &["ns1/selector", S]);
    w.pa(
        "ns1",
        "selector-strict",
        "selector: {matchLabels: {app: a}}\nmtls: {mode: STRICT}",
    );
    check(
        &w,
        "workload STRICT under mesh STRICT",
        &a,
        &["ns1/selector", S],
    );
    w.pa(
        "ns1",
        "selector-strict",
        "selector: {matchLabels: {app: a}}\nmtls: {mode: PERMISSIVE}",
    );
    check(
        &w,
        "workload PERMISSIVE under mesh STRICT",
        &a,
        &["ns1/selector"],
    );
    w.pa(
        "ns1",
        "selector-strict",
        "selector: {matchLabels: {app: a}}\nmtls: {mode: DISABLE}",
    );
    check(&w, "workload DISABLE", &a, &["ns1/selector"]);
    w.pa(
        "ns1",
        "selector-strict",
        "selector: {matchLabels: {app: a}}\nmtls: {mode: STRICT}\nportLevelMtls: {'9090': {mode: PERMISSIVE}}",
    );
    check(
        &w,
        "workload STRICT, port PERMISSIVE",
        &a,
        &["ns1/selector", WS],
    );
    w.ap(
        "ns1",
        "selector",
        "selector: {matchLabels: {app: a}}\nrules: [{from: [{source: {principals: [cluster.local/ns/ns1/sa/sa1]}}]}]",
    );
    check(
        &w,
        "a rule added to the AuthorizationPolicy",
        &a,
        &["ns1/selector", WS],
    );
    w.aps.remove(&("ns1".into(), "selector".into()));
    check(&w, "AuthorizationPolicy deleted", &a, &[WS]);
    w.pas.remove(&("ns1".into(), "selector-strict".into()));
    check(&w, "workload PeerAuthentication deleted", &a, &[S]);
    w.pas.clear();
    check(&w, "mesh PeerAuthentication deleted", &a, &[]);
    w.ap(
        "ns1",
        "gateway-targeted",
        "targetRef: {group: gateway.networking.k8s.io, kind: Gateway, name: dummy-waypoint}",
    );
    let targeted = w.policies().get("ns1/gateway-targeted").is_none();
    for (what, ok) in [
        (
            "static STRICT policy served with a PeerAuthentication",
            served,
        ),
        ("static STRICT policy removed with the last one", removed),
        ("a Gateway-targeted policy is not served", targeted),
    ] {
        out.push((
            format!("TestAmbientIndex_Policy/{what}"),
            if ok { Ok(()) } else { Err("no".into()) },
        ));
    }
    out
}

#[test]
fn istio_vectors_pass() {
    let results = all_vectors();
    let mut failures = Vec::new();
    for (name, result) in &results {
        if KNOWN_GAPS.iter().any(|(gap, _)| gap == name) {
            continue;
        }
        if let Err(e) = result {
            failures.push(format!("{name}: {e}"));
        }
    }
    let passed = results.iter().filter(|(_, r)| r.is_ok()).count();
    eprintln!(
        "ambient authorization vectors: {} ported, {passed} pass",
        results.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn known_gaps_still_fail() {
    let results = all_vectors();
    for (gap, reason) in KNOWN_GAPS {
        let found = results.iter().find(|(name, _)| name == gap);
        let (_, result) = found.unwrap_or_else(|| panic!("known gap {gap} is not a vector"));
        assert!(
            result.is_err(),
            "{gap} passes now: remove it from KNOWN_GAPS ({reason})"
        );
    }
}

// === Selection (`buildWorkloadPolicies`) and the served set ===

pub(crate) fn index(aps: &[(&str, &str, &str)], pas: &[(&str, &str, &str, u64)]) -> ConfigIndex {
    let mut mesh = crate::mesh::MeshSettings::default();
    mesh.config.root_namespace = ROOT.to_string();
    let mut set = ConfigSet::default();
    for (ns, name, spec) in aps {
        let doc =
            serde_json::json!({"metadata": {"name": name, "namespace": ns}, "spec": yaml(spec)});
        set.authorization_policies.push(config(&doc, 0));
    }
    for (ns, name, spec, age) in pas {
        let doc =
            serde_json::json!({"metadata": {"name": name, "namespace": ns}, "spec": yaml(spec)});
        set.peer_authentications.push(config(&doc, *age));
    }
    ConfigIndex::new(set, "cluster.local", &mesh)
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn served_set_names_scopes_and_static_strict_policy() {
    let idx = index(
        &[
            ("istio-system", "mesh-wide", "action: DENY\nrules: [{}]"),
            (
                "ns1",
                "ns-wide",
                "rules: [{from: [{source: {namespaces: [a]}}]}]",
            ),
            (
                "ns1",
                "selected",
                "selector: {matchLabels: {app: a}}\nrules: [{}]",
            ),
            (
                "ns1",
                "custom",
                "action: CUSTOM\nprovider: {name: x}\nrules: [{}]",
            ),
            (
                "ns1",
                "waypoint",
                "targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: w}]",
            ),
        ],
        &[("ns1", "strict", "mtls: {mode: STRICT}", 0)],
    );
    let p = AmbientPolicies::build(&idx);
    let names: Vec<&str> = p.resources().keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "istio-system/istio_converted_static_strict",
            "istio-system/mesh-wide",
            "ns1/ns-wide",
            "ns1/selected",
        ]
    );
    use meshfed_api::security::Scope;
    assert_eq!(
        p.get("istio-system/mesh-wide").unwrap().scope(),
        Scope::Global
    );
    assert_eq!(p.get("ns1/ns-wide").unwrap().scope(), Scope::Namespace);
    assert_eq!(
        p.get("ns1/selected").unwrap().scope(),
        Scope::WorkloadSelector
    );
    let strict = p.get("istio-system/istio_converted_static_strict").unwrap();
    assert_eq!(strict, &static_strict_policy("istio-system"));
    assert_eq!(
        p.findings(),
        [Finding {
            policy: "ns1/custom".into(),
            reason: UNSUPPORTED_VALUE,
            message: "ztunnel does not support the CUSTOM action".into(),
        }]
    );
    // Without PeerAuthentications there is no static policy.
    let p = AmbientPolicies::build(&index(&[], &[]));
    assert!(p.resources().is_empty());
}

#[test]
fn workload_lists_selected_policies_then_peer_authentication_keys() {
    let idx = index(
        &[
            (
                "istio-system",
                "root-selected",
                "selector: {matchLabels: {app: a}}",
            ),
            ("istio-system", "root-wide", "{}"),
            ("ns1", "b-selected", "selector: {matchLabels: {app: a}}"),
            (
                "ns1",
                "a-selected",
                "selector: {matchLabels: {app: a, v: '1'}}",
            ),
            ("ns1", "other-app", "selector: {matchLabels: {app: b}}"),
            ("ns2", "other-ns", "selector: {matchLabels: {app: a}}"),
            ("ns1", "empty-selector", "selector: {}"),
        ],
        &[
            ("istio-system", "mesh", "mtls: {mode: STRICT}", 0),
            (
                "ns1",
                "ports",
                "selector: {matchLabels: {app: a}}\nportLevelMtls: {'9090': {mode: PERMISSIVE}}",
                1,
            ),
        ],
    );
    let p = AmbientPolicies::build(&idx);
    assert_eq!(
        p.workload_policies("ns1", &labels(&[("app", "a"), ("v", "1")])),
        [
            "istio-system/root-selected",
            "ns1/a-selected",
            "ns1/b-selected",
            // Mesh STRICT with a PERMISSIVE port: the converted policy carries the
            // STRICT mode, so the static one is not listed.
            "ns1/converted_peer_authentication_ports",
        ]
    );
    assert_eq!(
        p.workload_policies("ns1", &labels(&[("app", "b")])),
        [
            "ns1/other-app",
            "istio-system/istio_converted_static_strict"
        ]
    );
    // The converted port policy exists and merges the inherited STRICT mode.
    let converted = p.get("ns1/converted_peer_authentication_ports").unwrap();
    assert_eq!(converted.groups.len(), 1);
    assert_eq!(converted.groups[0].rules.len(), 2);
}

#[test]
fn peer_authentication_keys_follow_the_effective_mode() {
    let keys = |pas: &[(&str, &str, &str, u64)], ns: &str, l: &[(&str, &str)]| {
        let idx = index(&[], pas);
        AmbientPolicies::build(&idx).workload_policies(ns, &labels(l))
    };
    let strict = "istio-system/istio_converted_static_strict";
    // Mesh STRICT, namespace PERMISSIVE: not strict.
    assert!(
        keys(
            &[
                ("istio-system", "m", "mtls: {mode: STRICT}", 0),
                ("ns1", "n", "mtls: {mode: PERMISSIVE}", 0),
            ],
            "ns1",
            &[]
        )
        .is_empty()
    );
    // Namespace UNSET inherits the mesh's STRICT.
    assert_eq!(
        keys(
            &[
                ("istio-system", "m", "mtls: {mode: STRICT}", 0),
                ("ns1", "n", "mtls: {}", 0),
            ],
            "ns1",
            &[]
        ),
        [strict]
    );
    // The oldest namespace policy wins.
    assert_eq!(
        keys(
            &[
                ("ns1", "new", "mtls: {mode: PERMISSIVE}", 5),
                ("ns1", "old", "mtls: {mode: STRICT}", 1),
            ],
            "ns1",
            &[]
        ),
        [strict]
    );
    // Workload PERMISSIVE with a STRICT port: its converted policy, no static one.
    assert_eq!(
        keys(
            &[
                ("istio-system", "m", "mtls: {mode: STRICT}", 0),
                (
                    "ns1",
                    "w",
                    "selector: {matchLabels: {app: a}}\nmtls: {mode: PERMISSIVE}\nportLevelMtls: {'80': {mode: STRICT}}",
                    0
                ),
            ],
            "ns1",
            &[("app", "a")]
        ),
        ["ns1/converted_peer_authentication_w"]
    );
    // A workload policy in another namespace does not apply.
    assert_eq!(
        keys(
            &[
                ("istio-system", "m", "mtls: {mode: STRICT}", 0),
                (
                    "ns2",
                    "w",
                    "selector: {matchLabels: {app: a}}\nmtls: {mode: DISABLE}",
                    0
                ),
            ],
            "ns1",
            &[("app", "a")]
        ),
        [strict]
    );
}

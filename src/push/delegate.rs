//! VirtualService delegation (Istio's `mergeVirtualServicesIfNeeded`,
//! `pilot/pkg/model/virtualservice.go`): a *root* VirtualService hands the requests
//! of an HTTP rule to a *delegate* (`http[].delegate {name, namespace}`), a
//! VirtualService without hosts. Before anything reads VirtualServices, every root
//! gets the delegate's rules in place of the delegating rule, and delegates
//! disappear as VirtualServices of their own.
//!
//! The rules, as Istio's:
//! - A delegate is any VirtualService without `hosts`; its namespace defaults to the
//!   root's. A delegate that does not exist, or whose `exportTo` (default: the mesh's
//!   `defaultVirtualServiceExportTo`; `.` is its own namespace) does not include the
//!   root's namespace or `*`, drops the delegating rule only.
//! - Each delegate rule becomes one rule of the root. Its matches are merged with the
//!   root rule's: no root matches -> the delegate's; no delegate matches -> the
//!   root's; otherwise every delegate match must be a subset of at least one root
//!   match (else the delegate rule is dropped), and each compatible (root, delegate)
//!   pair gives one merged match (delegate fields win, maps are unioned, names are
//!   joined `root-delegate`).
//! - Two string matches conflict unless one is absent, or the root's is an exact
//!   equal to the delegate's exact, or the root's is a prefix of the delegate's
//!   prefix or exact; a regex conflicts with anything but an absent match.
//! - The delegate rule keeps its own rewrite, timeout, retries, fault, mirror(s),
//!   mirror percentage, CORS policy and headers, and takes the root rule's where it
//!   has none; its name becomes `root-delegate` (or whichever is set).
//!
//! Destination hosts were made FQDNs with each object's own namespace before this
//! runs, as Istio resolves short names before it merges.

use std::collections::{BTreeMap, BTreeSet};

use meshfed_api::networking::v1alpha3::string_match::MatchType;
use meshfed_api::networking::v1alpha3::{HttpMatchRequest, HttpRoute, StringMatch, VirtualService};

use super::config_object::Config;

/// Merges delegates into their roots; returns the VirtualServices that stand (every
/// one with hosts, roots merged), in input order.
pub fn merge_virtual_services(
    all: Vec<Config<VirtualService>>,
    default_export: &[String],
) -> Vec<Config<VirtualService>> {
    if !all
        .iter()
        .any(|vs| vs.spec.hosts.is_empty() || is_root(&vs.spec))
    {
        return all;
    }
    let mut delegates: BTreeMap<(String, String), (Config<VirtualService>, BTreeSet<String>)> =
        BTreeMap::new();
    let mut out = Vec::with_capacity(all.len());
    for vs in all {
        if vs.spec.hosts.is_empty() {
            let export = if vs.spec.export_to.is_empty() {
                default_export
            } else {
                &vs.spec.export_to
            };
            let export: BTreeSet<String> = export
                .iter()
                .map(|e| {
                    if e == "." {
                        vs.namespace.clone()
                    } else {
                        e.clone()
                    }
                })
                .collect();
            delegates.insert((vs.namespace.clone(), vs.name.clone()), (vs, export));
        } else {
            out.push(vs);
        }
    }
    for root in out.iter_mut().filter(|vs| is_root(&vs.spec)) {
        let rules = std::mem::take(&mut root.spec.http);
        let mut merged = Vec::with_capacity(rules.len());
        for rule in rules {
            let Some(delegate) = &rule.delegate else {
                merged.push(rule);
                continue;
            };
            let namespace = if delegate.namespace.is_empty() {
                root.namespace.clone()
            } else {
                delegate.namespace.clone()
            };
            let Some((target, export)) = delegates.get(&(namespace, delegate.name.clone())) else {
                tracing::debug!(root = %format!("{}/{}", root.namespace, root.name), delegate = %delegate.name, "delegate VirtualService not found");
                continue;
            };
            if !export.contains("*") && !export.contains(&root.namespace) {
                tracing::debug!(root = %format!("{}/{}", root.namespace, root.name), delegate = %delegate.name, "delegate VirtualService not exported to the root's namespace");
                continue;
            }
            merged.extend(merge_http_routes(&rule, &target.spec.http));
        }
        root.spec.http = merged;
    }
    out
}

fn is_root(vs: &VirtualService) -> bool {
    vs.http.iter().any(|r| r.delegate.is_some())
}

/// The rules of `delegate` merged under the `root` rule; a rule whose matches conflict
/// with the root's is left out.
pub fn merge_http_routes(root: &HttpRoute, delegate: &[HttpRoute]) -> Vec<HttpRoute> {
    let mut root = root.clone();
    root.delegate = None;
    delegate
        .iter()
        .filter_map(|d| merge_http_route(&root, d.clone()))
        .collect()
}

fn merge_http_route(root: &HttpRoute, mut delegate: HttpRoute) -> Option<HttpRoute> {
    delegate.r#match = merge_http_match_requests(&root.r#match, &delegate.r#match)?;
    if delegate.name.is_empty() {
        delegate.name = root.name.clone();
    } else if !root.name.is_empty() {
        delegate.name = format!("{}-{}", root.name, delegate.name);
    }
    fn inherit<T: Clone>(own: &mut Option<T>, root: &Option<T>) {
        if own.is_none() {
            own.clone_from(root);
        }
    }
    inherit(&mut delegate.rewrite, &root.rewrite);
    inherit(&mut delegate.timeout, &root.timeout);
    inherit(&mut delegate.retries, &root.retries);
    inherit(&mut delegate.fault, &root.fault);
    inherit(&mut delegate.mirror, &root.mirror);
    if delegate.mirrors.is_empty() {
        delegate.mirrors.clone_from(&root.mirrors);
    }
    inherit(&mut delegate.mirror_percent, &root.mirror_percent);
    inherit(&mut delegate.mirror_percentage, &root.mirror_percentage);
    inherit(&mut delegate.cors_policy, &root.cors_policy);
    inherit(&mut delegate.headers, &root.headers);
    Some(delegate)
}

/// The merged matches, or `None` when a delegate match is a subset of no root match.
pub fn merge_http_match_requests(
    root: &[HttpMatchRequest],
    delegate: &[HttpMatchRequest],
) -> Option<Vec<HttpMatchRequest>> {
    if root.is_empty() {
        return Some(delegate.to_vec());
    }
    if delegate.is_empty() {
        return Some(root.to_vec());
    }
    let mut out = Vec::new();
    for leaf in delegate {
        let mut found = false;
        for r in root {
            if has_conflict(r, leaf) {
                continue;
            }
            out.push(merge_http_match_request(r, leaf));
            found = true;
        }
        if !found {
            return None;
        }
    }
    (!out.is_empty()).then_some(out)
}

fn merge_http_match_request(
    root: &HttpMatchRequest,
    delegate: &HttpMatchRequest,
) -> HttpMatchRequest {
    let mut out = delegate.clone();
    if out.name.is_empty() {
        out.name = root.name.clone();
    } else if !root.name.is_empty() {
        out.name = format!("{}-{}", root.name, out.name);
    }
    for (own, root) in [
        (&mut out.uri, &root.uri),
        (&mut out.scheme, &root.scheme),
        (&mut out.method, &root.method),
        (&mut out.authority, &root.authority),
    ] {
        if own.is_none() {
            own.clone_from(root);
        }
    }
    fn union<V: Clone>(
        root: &BTreeMap<String, V>,
        own: &BTreeMap<String, V>,
    ) -> BTreeMap<String, V> {
        let mut map = root.clone();
        map.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
        map
    }
    out.headers = union(&root.headers, &delegate.headers);
    out.without_headers = union(&root.without_headers, &delegate.without_headers);
    out.query_params = union(&root.query_params, &delegate.query_params);
    if out.port == 0 {
        out.port = root.port;
    }
    out.source_labels = union(&root.source_labels, &delegate.source_labels);
    if out.source_namespace.is_empty() {
        out.source_namespace.clone_from(&root.source_namespace);
    }
    if out.gateways.is_empty() {
        out.gateways.clone_from(&root.gateways);
    }
    out
}

/// Whether the delegate match `leaf` can not be a subset of the root match `root`.
pub fn has_conflict(root: &HttpMatchRequest, leaf: &HttpMatchRequest) -> bool {
    let pairs = [
        (&root.uri, &leaf.uri),
        (&root.scheme, &leaf.scheme),
        (&root.method, &leaf.method),
        (&root.authority, &leaf.authority),
    ];
    if pairs
        .iter()
        .any(|(r, l)| string_match_conflict(r.as_ref(), l.as_ref()))
    {
        return true;
    }
    let map_conflict = |root: &BTreeMap<String, StringMatch>,
                        leaf: &BTreeMap<String, StringMatch>| {
        leaf.iter()
            .any(|(k, l)| string_match_conflict(root.get(k), Some(l)))
    };
    if map_conflict(&root.headers, &leaf.headers)
        || map_conflict(&root.without_headers, &leaf.without_headers)
        || map_conflict(&root.query_params, &leaf.query_params)
    {
        return true;
    }
    if root.ignore_uri_case != leaf.ignore_uri_case {
        return true;
    }
    if root.port > 0 && leaf.port > 0 && root.port != leaf.port {
        return true;
    }
    if !root.source_namespace.is_empty() && leaf.source_namespace != root.source_namespace {
        return true;
    }
    if leaf
        .source_labels
        .iter()
        .any(|(k, v)| root.source_labels.get(k).is_some_and(|r| r != v))
    {
        return true;
    }
    if !root.gateways.is_empty() && !leaf.gateways.is_empty() {
        if root.gateways.len() < leaf.gateways.len() {
            return true;
        }
        if leaf.gateways.iter().any(|g| !root.gateways.contains(g)) {
            return true;
        }
    }
    false
}

/// A string match as Istio's getters read it: (exact, prefix, regex), empty when
/// not of that kind.
fn kinds(m: &StringMatch) -> (&str, &str, &str) {
    match &m.match_type {
        Some(MatchType::Exact(s)) => (s, "", ""),
        Some(MatchType::Prefix(s)) => ("", s, ""),
        Some(MatchType::Regex(s)) => ("", "", s),
        None => ("", "", ""),
    }
}

fn string_match_conflict(root: Option<&StringMatch>, leaf: Option<&StringMatch>) -> bool {
    let (Some(root), Some(leaf)) = (root, leaf) else {
        return false;
    };
    let (r_exact, r_prefix, r_regex) = kinds(root);
    let (l_exact, l_prefix, l_regex) = kinds(leaf);
    if !r_regex.is_empty() && (!l_regex.is_empty() || !l_prefix.is_empty() || !l_exact.is_empty()) {
        return true;
    }
    if !l_regex.is_empty() && (!r_regex.is_empty() || !r_prefix.is_empty() || !r_exact.is_empty()) {
        return true;
    }
    if !r_exact.is_empty() {
        return !l_prefix.is_empty() || l_exact != r_exact;
    }
    if !r_prefix.is_empty() {
        if !l_prefix.is_empty() {
            return !l_prefix.starts_with(r_prefix);
        }
        if !l_exact.is_empty() {
            return !l_exact.starts_with(r_prefix);
        }
    }
    true
}

/// Istio's vectors (`pilot/pkg/model/virtualservice_test.go`: TestMergeVirtualServices,
/// TestMergeHttpRoutes, TestMergeHTTPMatchRequests, TestHasConflict), as JSON.
#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).expect("valid vector")
    }

    fn config(name: &str, namespace: &str, spec: Value) -> Config<VirtualService> {
        Config {
            name: name.into(),
            namespace: namespace.into(),
            labels: BTreeMap::new(),
            annotations: Default::default(),
            creation_time: std::time::SystemTime::UNIX_EPOCH,
            spec: from(spec),
        }
    }

    fn dest(host: &str, subset: &str) -> Value {
        if subset.is_empty() {
            json!([{"destination": {"host": host, "port": {"number": 80}}}])
        } else {
            json!([{"destination": {"host": host, "port": {"number": 80}, "subset": subset}}])
        }
    }

    fn prefix(p: &str) -> Value {
        json!({"uri": {"prefix": p}})
    }

    fn independent() -> Config<VirtualService> {
        config(
            "virtual-service",
            "default",
            json!({"hosts": ["example.org"], "gateways": ["gateway"],
                   "http": [{"route": dest("example.org", "")}]}),
        )
    }

    fn root_vs(name: &str, ns: &str, delegate: Value) -> Config<VirtualService> {
        config(
            name,
            ns,
            json!({"hosts": ["*.org"], "gateways": ["gateway"], "http": [
                {"match": [prefix("/productpage"), {"uri": {"exact": "/login"}}], "delegate": delegate},
                {"route": dest("example.org", "")}]}),
        )
    }

    fn root() -> Config<VirtualService> {
        root_vs(
            "root-vs",
            "istio-system",
            json!({"name": "productpage-vs", "namespace": "default"}),
        )
    }

    fn one_root() -> Config<VirtualService> {
        config(
            "root-vs",
            "istio-system",
            json!({"hosts": ["*.org"], "gateways": ["gateway"],
                   "http": [{"route": dest("example.org", "")}]}),
        )
    }

    fn delegate_vs(ns: &str, export: Value) -> Config<VirtualService> {
        config(
            "productpage-vs",
            ns,
            json!({"hosts": [], "gateways": ["gateway"], "exportTo": export, "http": [
                {"match": [prefix("/productpage/v1")], "route": dest("productpage.org", "v1")},
                {"match": [prefix("/productpage/v2")], "route": dest("productpage.org", "v2")},
                {"route": dest("productpage.org", "v3")}]}),
        )
    }

    fn merged(name: &str, ns: &str) -> Config<VirtualService> {
        config(
            name,
            ns,
            json!({"hosts": ["*.org"], "gateways": ["gateway"], "http": [
                {"match": [prefix("/productpage/v1")], "route": dest("productpage.org", "v1")},
                {"match": [prefix("/productpage/v2")], "route": dest("productpage.org", "v2")},
                {"match": [prefix("/productpage"), {"uri": {"exact": "/login"}}],
                 "route": dest("productpage.org", "v3")},
                {"route": dest("example.org", "")}]}),
        )
    }

    fn merge(all: Vec<Config<VirtualService>>) -> Vec<Config<VirtualService>> {
        merge_virtual_services(all, &["*".to_string()])
    }

    #[test]
    fn merge_virtual_services_vectors() {
        assert_eq!(
            merge(vec![independent()]),
            vec![independent()],
            "one independent vs"
        );
        assert_eq!(merge(vec![root()]), vec![one_root()], "one root vs");
        assert_eq!(
            merge(vec![delegate_vs("default", json!(["istio-system"]))]),
            vec![],
            "one delegate vs"
        );
        assert_eq!(
            merge(vec![
                root(),
                delegate_vs("default", json!(["istio-system"]))
            ]),
            vec![merged("root-vs", "istio-system")],
            "root and delegate vs"
        );

        let conflicted = config(
            "productpage-vs",
            "default",
            json!({"hosts": [], "gateways": ["gateway"], "http": [
                {"match": [prefix("/productpage/v1")], "route": dest("productpage.org", "v1")},
                {"match": [prefix("/productpage/v2")], "route": dest("productpage.org", "v2")},
                {"match": [{"name": "mismatch", "uri": {"prefix": "/mis-match/path"}}],
                 "route": dest("productpage.org", "v3")}]}),
        );
        let merged2 = config(
            "root-vs",
            "istio-system",
            json!({"hosts": ["*.org"], "gateways": ["gateway"], "http": [
                {"match": [prefix("/productpage/v1")], "route": dest("productpage.org", "v1")},
                {"match": [prefix("/productpage/v2")], "route": dest("productpage.org", "v2")},
                {"route": dest("example.org", "")}]}),
        );
        assert_eq!(
            merge(vec![root(), conflicted]),
            vec![merged2],
            "root and conflicted delegate vs"
        );

        let multi = config(
            "root-vs",
            "istio-system",
            json!({"hosts": ["*.org"], "gateways": ["gateway"], "http": [
                {"match": [prefix("/productpage")],
                 "delegate": {"name": "productpage-vs", "namespace": "default"}},
                {"match": [prefix("/legacy/path")], "rewrite": {"uri": "/productpage"},
                 "delegate": {"name": "productpage-vs", "namespace": "default"}}]}),
        );
        let single = config(
            "productpage-vs",
            "default",
            json!({"hosts": [], "gateways": ["gateway"],
                   "http": [{"route": dest("productpage.org", "v1")}]}),
        );
        let merged3 = config(
            "root-vs",
            "istio-system",
            json!({"hosts": ["*.org"], "gateways": ["gateway"], "http": [
                {"match": [prefix("/productpage")], "route": dest("productpage.org", "v1")},
                {"match": [prefix("/legacy/path")], "rewrite": {"uri": "/productpage"},
                 "route": dest("productpage.org", "v1")}]}),
        );
        assert_eq!(
            merge(vec![multi, single]),
            vec![merged3],
            "multiple routes delegate to one"
        );

        assert_eq!(
            merge(vec![
                root_vs("default-vs", "default", json!({"name": "productpage-vs"})),
                delegate_vs("default", json!([])),
            ]),
            vec![merged("default-vs", "default")],
            "root not specify delegate namespace"
        );

        let not_exported = config(
            "productpage-vs",
            "default2",
            json!({"hosts": [], "gateways": ["gateway"], "exportTo": ["."]}),
        );
        assert_eq!(
            merge(vec![root(), not_exported]),
            vec![one_root()],
            "delegate not exported to root vs namespace"
        );
    }

    #[test]
    fn merge_http_routes_vectors() {
        let delegate: Vec<HttpRoute> = from(json!([
            {"match": [{"uri": {"prefix": "/productpage/v1"}, "headers": {"version": {"exact": "v1"}}}],
             "route": dest("productpage.org", "v1")},
            {"match": [{"uri": {"prefix": "/productpage/v2"}, "headers": {"version": {"exact": "v2"}}},
                       {"headers": {"version": {"exact": "v2"}}, "queryParams": {"version": {"exact": "v2"}}}],
             "route": dest("productpage.org", "v2")}]));
        // root catch all
        let root: HttpRoute = from(json!({
            "timeout": "10s",
            "headers": {"request": {"add": {"istio": "test"}, "remove": ["trace-id"]}},
            "delegate": {"name": "delegate", "namespace": "default"}}));
        let expected: Vec<HttpRoute> = from(json!([
            {"match": [{"uri": {"prefix": "/productpage/v1"}, "headers": {"version": {"exact": "v1"}}}],
             "route": dest("productpage.org", "v1"), "timeout": "10s",
             "headers": {"request": {"add": {"istio": "test"}, "remove": ["trace-id"]}}},
            {"match": [{"uri": {"prefix": "/productpage/v2"}, "headers": {"version": {"exact": "v2"}}},
                       {"headers": {"version": {"exact": "v2"}}, "queryParams": {"version": {"exact": "v2"}}}],
             "route": dest("productpage.org", "v2"), "timeout": "10s",
             "headers": {"request": {"add": {"istio": "test"}, "remove": ["trace-id"]}}}]));
        assert_eq!(
            merge_http_routes(&root, &delegate),
            expected,
            "root catch all"
        );

        // delegate with empty match
        let root: HttpRoute = from(json!({
            "match": [{"uri": {"prefix": "/productpage"}, "port": 8080}],
            "delegate": {"name": "delegate", "namespace": "default"}}));
        let mut delegate = delegate;
        delegate.push(from(json!({"route": dest("productpage.org", "v3")})));
        let expected: Vec<HttpRoute> = from(json!([
            {"match": [{"uri": {"prefix": "/productpage/v1"}, "headers": {"version": {"exact": "v1"}}, "port": 8080}],
             "route": dest("productpage.org", "v1")},
            {"match": [{"uri": {"prefix": "/productpage/v2"}, "headers": {"version": {"exact": "v2"}}, "port": 8080},
                       {"uri": {"prefix": "/productpage"}, "headers": {"version": {"exact": "v2"}},
                        "queryParams": {"version": {"exact": "v2"}}, "port": 8080}],
             "route": dest("productpage.org", "v2")},
            {"match": [{"uri": {"prefix": "/productpage"}, "port": 8080}],
             "route": dest("productpage.org", "v3")}]));
        assert_eq!(
            merge_http_routes(&root, &delegate),
            expected,
            "delegate with empty match"
        );
    }

    #[test]
    fn merge_http_match_requests_vectors() {
        let cases: Vec<(&str, Value, Value, Value)> = vec![
            (
                "url match",
                json!([prefix("/productpage")]),
                json!([{"uri": {"exact": "/productpage/v1"}}]),
                json!([{"uri": {"exact": "/productpage/v1"}}]),
            ),
            (
                "multi url match",
                json!([prefix("/productpage"), prefix("/reviews")]),
                json!([{"uri": {"exact": "/productpage/v1"}}, {"uri": {"exact": "/reviews/v1"}}]),
                json!([{"uri": {"exact": "/productpage/v1"}}, {"uri": {"exact": "/reviews/v1"}}]),
            ),
            (
                "url mismatch",
                json!([prefix("/productpage")]),
                json!([{"uri": {"exact": "/reviews"}}]),
                Value::Null,
            ),
            (
                "url match, one conflicts",
                json!([prefix("/productpage")]),
                json!([{"uri": {"exact": "/productpage/v1"}}, {"uri": {"exact": "/reviews"}}]),
                Value::Null,
            ),
            (
                "headers",
                json!([{"headers": {"header": {"exact": "h1"}}}]),
                json!([]),
                json!([{"headers": {"header": {"exact": "h1"}}}]),
            ),
            (
                "headers conflict",
                json!([{"headers": {"header": {"exact": "h1"}}}]),
                json!([{"headers": {"header": {"exact": "h2"}}}]),
                Value::Null,
            ),
            (
                "headers union",
                json!([{"headers": {"header": {"exact": "h1"}}}]),
                json!([{"headers": {"header-2": {"exact": "h2"}}}]),
                json!([{"headers": {"header": {"exact": "h1"}, "header-2": {"exact": "h2"}}}]),
            ),
            (
                "complicated merge",
                json!([{"uri": {"prefix": "/productpage"}, "headers": {"header": {"exact": "h1"}},
                     "port": 8080, "authority": {"exact": "productpage.com"}}]),
                json!([{"uri": {"exact": "/productpage/v1"}}, {"uri": {"exact": "/productpage/v2"}}]),
                json!([{"uri": {"exact": "/productpage/v1"}, "headers": {"header": {"exact": "h1"}},
                     "port": 8080, "authority": {"exact": "productpage.com"}},
                    {"uri": {"exact": "/productpage/v2"}, "headers": {"header": {"exact": "h1"}},
                     "port": 8080, "authority": {"exact": "productpage.com"}}]),
            ),
            (
                "conflicted merge",
                json!([{"uri": {"prefix": "/productpage"}, "headers": {"header": {"exact": "h1"}},
                     "port": 8080, "authority": {"exact": "productpage.com"}}]),
                json!([{"uri": {"exact": "/productpage/v1"}}, {"uri": {"exact": "/productpage/v2"}, "port": 9090}]),
                Value::Null,
            ),
            (
                "gateway merge",
                json!([{"uri": {"prefix": "/productpage"}, "gateways": ["ingress-gateway", "mesh"]}]),
                json!([{"uri": {"exact": "/productpage/v1"}, "gateways": ["ingress-gateway"]},
                    {"uri": {"exact": "/productpage/v2"}, "gateways": ["mesh"]}]),
                json!([{"uri": {"exact": "/productpage/v1"}, "gateways": ["ingress-gateway"]},
                    {"uri": {"exact": "/productpage/v2"}, "gateways": ["mesh"]}]),
            ),
            (
                "gateway conflicted merge",
                json!([{"uri": {"prefix": "/productpage"}, "gateways": ["ingress-gateway"]}]),
                json!([{"uri": {"exact": "/productpage/v1"}, "gateways": ["ingress-gateway"]},
                    {"uri": {"exact": "/productpage/v2"}, "gateways": ["mesh"]}]),
                Value::Null,
            ),
            (
                "source labels merge",
                json!([{"sourceLabels": {"app": "test"}}]),
                json!([{"sourceLabels": {"version": "v1"}}]),
                json!([{"sourceLabels": {"app": "test", "version": "v1"}}]),
            ),
        ];
        for (name, root, delegate, expected) in cases {
            let root: Vec<HttpMatchRequest> = from(root);
            let delegate: Vec<HttpMatchRequest> = from(delegate);
            let expected: Option<Vec<HttpMatchRequest>> = from(expected);
            assert_eq!(
                merge_http_match_requests(&root, &delegate),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn has_conflict_vectors() {
        let cases: Vec<(&str, Value, Value, bool)> = vec![
            (
                "regex uri",
                json!({"uri": {"regex": "^/productpage"}}),
                prefix("/productpage/v2"),
                true,
            ),
            (
                "match uri",
                prefix("/productpage"),
                prefix("/productpage/v2"),
                false,
            ),
            (
                "mismatch uri",
                prefix("/productpage/v2"),
                prefix("/productpage"),
                true,
            ),
            (
                "match uri exact",
                prefix("/productpage/v2"),
                json!({"uri": {"exact": "/productpage/v2"}}),
                false,
            ),
            (
                "headers not equal",
                json!({"headers": {"header": {"exact": "h1"}}}),
                json!({"headers": {"header": {"exact": "h2"}}}),
                true,
            ),
            (
                "headers equal",
                json!({"headers": {"header": {"exact": "h1"}}}),
                json!({"headers": {"header": {"exact": "h1"}}}),
                false,
            ),
            (
                "headers match",
                json!({"headers": {"header": {"prefix": "h1"}}}),
                json!({"headers": {"header": {"exact": "h1-v1"}}}),
                false,
            ),
            (
                "headers mismatch",
                json!({"headers": {"header": {"prefix": "h1"}}}),
                json!({"headers": {"header": {"exact": "h2"}}}),
                true,
            ),
            (
                "headers prefix mismatch",
                json!({"headers": {"header": {"prefix": "h1"}}}),
                json!({"headers": {"header": {"prefix": "h2"}}}),
                true,
            ),
            (
                "diff headers",
                json!({"headers": {"header": {"exact": "h1"}}}),
                json!({"headers": {"header-2": {"exact": "h2"}}}),
                false,
            ),
            (
                "withoutHeaders mismatch",
                json!({"withoutHeaders": {"header": {"prefix": "h1"}}}),
                json!({"withoutHeaders": {"header": {"exact": "h2"}}}),
                true,
            ),
            (
                "port 0/8080",
                json!({"port": 0}),
                json!({"port": 8080}),
                false,
            ),
            (
                "port 8080/0",
                json!({"port": 8080}),
                json!({"port": 0}),
                false,
            ),
            (
                "port 8080/8090",
                json!({"port": 8080}),
                json!({"port": 8090}),
                true,
            ),
            (
                "sourceLabels mismatch",
                json!({"sourceLabels": {"a": "b"}}),
                json!({"sourceLabels": {"a": "c"}}),
                true,
            ),
            (
                "sourceNamespace mismatch",
                json!({"sourceNamespace": "test1"}),
                json!({"sourceNamespace": "test2"}),
                true,
            ),
            (
                "root has less gateways than delegate",
                json!({"gateways": ["ingress-gateway"]}),
                json!({"gateways": ["ingress-gateway", "mesh"]}),
                true,
            ),
        ];
        for (name, root, leaf, expected) in cases {
            let root: HttpMatchRequest = from(root);
            let leaf: HttpMatchRequest = from(leaf);
            assert_eq!(has_conflict(&root, &leaf), expected, "{name}");
        }
    }
}

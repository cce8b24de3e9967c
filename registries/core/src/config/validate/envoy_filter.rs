//! Validation of `networking.istio.io` EnvoyFilter, after Istio's `ValidateEnvoyFilter`
//! (`pkg/config/validation/envoyfilter`), plus the warnings Istio's EnvoyFilter
//! analyzer gives for patches whose effect depends on ordering or on the proxy version
//! (IST0151 to IST0155).
//!
//! Whether a patch value converts to the Envoy type its `applyTo` names (and which
//! `@type`s it uses) needs the descriptors of every Envoy type, which this crate does
//! not carry: the server installs a [`ValueChecker`] ([`install_value_checker`]) and
//! its errors and warnings are reported at `spec.configPatches[i].patch.value`. Without
//! one installed the values are not checked here; the patch engine still rejects a
//! value it cannot convert, per patch, when it applies it.

use std::sync::OnceLock;

use meshfed_api::networking::v1alpha3 as net;
use net::envoy_filter::{ApplyTo, envoy_config_object_match::ObjectTypes, patch::Operation};

use super::common::validate_selector_labels;
use super::{FieldPath, Findings, Validation};

/// Checks one patch value (`patch.value` as proto JSON) against the Envoy type of its
/// `applyTo`: `Ok(warnings)` when it converts (unknown fields, frozen `@type`s and
/// filters without `typed_config` are warnings, as Istio's strict pass), `Err(reason)`
/// when it does not.
pub type ValueChecker = fn(ApplyTo, &serde_json::Value) -> Result<Vec<String>, String>;

static VALUE_CHECKER: OnceLock<ValueChecker> = OnceLock::new();

/// Installs the checker of patch values (once; later calls are ignored).
pub fn install_value_checker(checker: ValueChecker) {
    let _ = VALUE_CHECKER.set(checker);
}

/// The name of the HTTP connection manager network filter.
pub const HTTP_CONNECTION_MANAGER: &str = "envoy.filters.network.http_connection_manager";

/// Filter names Envoy deprecated, and their canonical names (Istio's
/// `ReverseDeprecatedFilterNames`).
pub const DEPRECATED_FILTER_NAMES: &[(&str, &str)] = &[
    ("envoy.http_connection_manager", HTTP_CONNECTION_MANAGER),
    ("envoy.tcp_proxy", "envoy.filters.network.tcp_proxy"),
    ("envoy.mongo_proxy", "envoy.filters.network.mongo_proxy"),
    ("envoy.redis_proxy", "envoy.filters.network.redis_proxy"),
    ("envoy.ratelimit", "envoy.filters.network.ratelimit"),
    ("envoy.router", "envoy.filters.http.router"),
    ("envoy.cors", "envoy.filters.http.cors"),
    ("envoy.fault", "envoy.filters.http.fault"),
    ("envoy.lua", "envoy.filters.http.lua"),
    ("envoy.ext_authz", "envoy.filters.http.ext_authz"),
    ("envoy.grpc_web", "envoy.filters.http.grpc_web"),
    ("envoy.gzip", "envoy.filters.http.gzip"),
    ("envoy.health_check", "envoy.filters.http.health_check"),
    (
        "envoy.listener.tls_inspector",
        "envoy.filters.listener.tls_inspector",
    ),
    (
        "envoy.listener.http_inspector",
        "envoy.filters.listener.http_inspector",
    ),
    (
        "envoy.listener.original_dst",
        "envoy.filters.listener.original_dst",
    ),
    ("envoy.transport_sockets.tls", "envoy.transport_sockets.tls"),
];

const GENERAL_WARNING: &str = "EnvoyFilter exposes internal implementation details that may \
    change at any time. Prefer other APIs if possible, and exercise extreme caution, \
    especially around upgrades.";

/// EnvoyFilter: Istio's rules for each patch (apply-to set, patch and operation set,
/// a value unless removing, a proxy version regex that compiles, a match of the class
/// the apply-to needs, filter and sub-filter matches with names), the selector's
/// labels, and the analyzer's warnings.
pub fn validate_envoy_filter(ef: &net::EnvoyFilter) -> Validation {
    let mut f = Findings::new();
    let spec = FieldPath::spec();
    f.warn(&FieldPath::root(), GENERAL_WARNING);
    if let Some(selector) = &ef.workload_selector {
        validate_selector_labels(
            &mut f,
            &spec.field("workloadSelector").field("labels"),
            &selector.labels,
            "the EnvoyFilter will be applied to all services in namespace",
        );
        if !ef.target_refs.is_empty() {
            f.error(
                &spec.field("targetRefs"),
                "only one of targetRefs or workloadSelector can be set",
            );
        }
    }
    // As istiod, targetRefs attach to Gateway API gateways of the EnvoyFilter's
    // namespace; the waypoint targets attach to proxies meshfed does not serve.
    for (i, r) in ef.target_refs.iter().enumerate() {
        let at = spec.field("targetRefs").index(i);
        let gateway = r.group == "gateway.networking.k8s.io" && r.kind == "Gateway";
        if gateway && !r.namespace.is_empty() {
            f.warn(
                &at.field("namespace"),
                "a targetRef to another namespace matches nothing; only the EnvoyFilter's own namespace is matched",
            );
        } else if matches!(r.kind.as_str(), "Service" | "ServiceEntry" | "GatewayClass") {
            f.warn(
                &at,
                format!(
                    "{} {:?} attaches the EnvoyFilter to waypoints, which meshfed does not serve: not applied",
                    r.kind, r.name
                ),
            );
        } else if !gateway {
            f.warn(
                &at,
                format!("{}/{} selects no proxy: not applied", r.group, r.kind),
            );
        }
    }
    for (i, cp) in ef.config_patches.iter().enumerate() {
        patch(&mut f, &spec.field("configPatches").index(i), cp);
    }
    analyzer(&mut f, &spec, ef);
    f.finish()
}

fn patch(f: &mut Findings, at: &FieldPath, cp: &net::envoy_filter::EnvoyConfigObjectPatch) {
    let apply_to = ApplyTo::try_from(cp.apply_to).unwrap_or(ApplyTo::Invalid);
    if apply_to == ApplyTo::Invalid {
        f.error(&at.field("applyTo"), "Envoy filter: missing applyTo");
        return;
    }
    let Some(p) = &cp.patch else {
        f.error(&at.field("patch"), "Envoy filter: missing patch");
        return;
    };
    let op = Operation::try_from(p.operation).unwrap_or(Operation::Invalid);
    if op == Operation::Invalid {
        f.error(
            &at.field("patch").field("operation"),
            "Envoy filter: missing patch operation",
        );
        return;
    }
    if op != Operation::Remove && p.value.is_none() {
        f.error(
            &at.field("patch").field("value"),
            "Envoy filter: missing patch value for non-remove operation",
        );
        return;
    }
    let m = cp.r#match.as_ref();
    let proxy_version = m
        .and_then(|m| m.proxy.as_ref())
        .map_or("", |p| p.proxy_version.as_str());
    if !proxy_version.is_empty() {
        let check = super::regex::validate_re2(proxy_version).and_then(|()| {
            regex::Regex::new(proxy_version)
                .map(drop)
                .map_err(|e| e.to_string())
        });
        if let Err(e) = check {
            f.error(
                &at.field("match").field("proxy").field("proxyVersion"),
                format!("Envoy filter: invalid regex for proxy version, [{e}]"),
            );
            return;
        }
    }
    let object = m.and_then(|m| m.object_types.as_ref());
    let match_at = at.field("match");
    match apply_to {
        ApplyTo::Listener
        | ApplyTo::FilterChain
        | ApplyTo::NetworkFilter
        | ApplyTo::HttpFilter
        | ApplyTo::ListenerFilter => {
            if let Some(object) = object {
                let ObjectTypes::Listener(l) = object else {
                    f.error(
                        &match_at,
                        "Envoy filter: applyTo for listener class objects cannot have non listener match",
                    );
                    return;
                };
                if let Some(filter) = l.filter_chain.as_ref().and_then(|c| c.filter.as_ref()) {
                    let fat = match_at
                        .field("listener")
                        .field("filterChain")
                        .field("filter");
                    if matches!(apply_to, ApplyTo::Listener | ApplyTo::FilterChain) {
                        f.warn(
                            &fat,
                            format!(
                                "Envoy filter: filter match has no effect when used with {}",
                                apply_to.as_str_name()
                            ),
                        );
                    }
                    if filter.name.is_empty() {
                        f.error(
                            &fat.field("name"),
                            "Envoy filter: filter match has no name to match on",
                        );
                        return;
                    }
                    if let Some(sub) = &filter.sub_filter {
                        if apply_to != ApplyTo::HttpFilter {
                            f.error(
                                &fat.field("subFilter"),
                                "Envoy filter: subfilter match can be used with applyTo HTTP_FILTER only",
                            );
                            return;
                        }
                        if filter.name != HTTP_CONNECTION_MANAGER
                            && filter.name != "envoy.http_connection_manager"
                        {
                            f.error(
                                &fat.field("subFilter"),
                                format!(
                                    "Envoy filter: subfilter match requires filter match with {HTTP_CONNECTION_MANAGER}"
                                ),
                            );
                            return;
                        }
                        if sub.name.is_empty() {
                            f.error(
                                &fat.field("subFilter").field("name"),
                                "Envoy filter: subfilter match has no name to match on",
                            );
                            return;
                        }
                        deprecated_name(f, &fat.field("subFilter").field("name"), &sub.name);
                    }
                    deprecated_name(f, &fat.field("name"), &filter.name);
                }
            }
        }
        ApplyTo::RouteConfiguration | ApplyTo::VirtualHost | ApplyTo::HttpRoute => {
            if object.is_some_and(|o| !matches!(o, ObjectTypes::RouteConfiguration(_))) {
                f.error(
                    &match_at,
                    "Envoy filter: applyTo for http route class objects cannot have non route configuration match",
                );
            }
        }
        ApplyTo::Cluster => {
            if object.is_some_and(|o| !matches!(o, ObjectTypes::Cluster(_))) {
                f.error(
                    &match_at,
                    "Envoy filter: applyTo for cluster class objects cannot have non cluster match",
                );
            }
        }
        ApplyTo::ExtensionConfig | ApplyTo::Invalid => {}
    }
    if let (Some(value), Some(checker)) = (&p.value, VALUE_CHECKER.get()) {
        let vat = at.field("patch").field("value");
        match serde_json::to_value(value) {
            Ok(json) => match checker(apply_to, &json) {
                Ok(warnings) => warnings.into_iter().for_each(|w| f.warn(&vat, w)),
                Err(e) => f.error(&vat, e),
            },
            Err(e) => f.error(&vat, e.to_string()),
        }
    }
}

fn deprecated_name(f: &mut Findings, at: &FieldPath, name: &str) {
    if let Some((_, new)) = DEPRECATED_FILTER_NAMES
        .iter()
        .find(|(old, new)| *old == name && old != new)
    {
        f.warn(
            at,
            format!("using deprecated filter name \"{name}\"; use \"{new}\" instead"),
        );
    }
}

const IST0151: &str = "IST0151: This EnvoyFilter does not have a priority and has a relative patch \
     operation set which can cause the EnvoyFilter not to be applied. Using the \
     INSERT_FIRST or ADD option or setting the priority may help in ensuring the \
     EnvoyFilter is applied correctly.";
const IST0155: &str = "IST0155: This EnvoyFilter does not have a priority and has a relative patch \
     operation (INSERT_BEFORE/AFTER, REPLACE, MERGE, DELETE) and proxyVersion set \
     which can cause the EnvoyFilter not to be applied during an upgrade. Using the \
     INSERT_FIRST or ADD option or setting the priority may help in ensuring the \
     EnvoyFilter is applied correctly.";

/// The warnings of Istio's `envoyfilter.EnvoyPatchAnalyzer`, patch by patch: `ADD` on
/// `ROUTE_CONFIGURATION`/`HTTP_ROUTE` (IST0153); `REMOVE` there (IST0154); `REPLACE` where
/// it does nothing (IST0152); otherwise, for the relative operations (`MERGE`, `REMOVE`,
/// `REPLACE`, `INSERT_BEFORE`, `INSERT_AFTER`) without a `priority`, IST0151, or IST0155
/// when an earlier patch with a `proxyVersion` match names the same filter (the value's
/// `name`, else the matched filter's). Istio relates patches across every EnvoyFilter
/// it analyzes; a validation sees one object, so only its own earlier patches count.
fn analyzer(f: &mut Findings, spec: &FieldPath, ef: &net::EnvoyFilter) {
    // (from the value, name) of the patches with a proxyVersion so far.
    let mut versioned: Vec<(bool, String)> = Vec::new();
    for (i, cp) in ef.config_patches.iter().enumerate() {
        let Some(p) = &cp.patch else { break };
        let at = spec.field("configPatches").index(i);
        let op_at = at.field("patch").field("operation");
        let apply_to = ApplyTo::try_from(cp.apply_to).unwrap_or(ApplyTo::Invalid);
        let op = Operation::try_from(p.operation).unwrap_or(Operation::Invalid);
        let m = cp.r#match.as_ref();
        let value_name = p
            .value
            .as_ref()
            .and_then(|v| v.fields.get("name"))
            .and_then(|v| serde_json::to_value(v).ok())
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string));
        let name = match (&p.value, value_name) {
            (_, Some(n)) => (true, n),
            (Some(v), None) if !v.fields.is_empty() => (
                false,
                m.and_then(|m| match &m.object_types {
                    Some(ObjectTypes::Listener(l)) => l.filter_chain.as_ref(),
                    _ => None,
                })
                .and_then(|c| c.filter.as_ref())
                .map(|f| f.name.clone())
                .unwrap_or_default(),
            ),
            _ => (false, String::new()),
        };
        let route_class = matches!(apply_to, ApplyTo::RouteConfiguration | ApplyTo::HttpRoute);
        let relative = match op {
            Operation::Add => {
                if route_class {
                    f.warn(
                        &op_at,
                        "IST0153: The ADD operation will be ignored when applyTo is set to \
                         ROUTE_CONFIGURATION, or HTTP_ROUTE.",
                    );
                }
                false
            }
            Operation::Remove if route_class => {
                f.warn(
                    &op_at,
                    "IST0154: The REMOVE operation will be ignored when applyTo is set to \
                     ROUTE_CONFIGURATION, or HTTP_ROUTE.",
                );
                false
            }
            Operation::Replace
                if !matches!(
                    apply_to,
                    ApplyTo::HttpFilter
                        | ApplyTo::NetworkFilter
                        | ApplyTo::ListenerFilter
                        | ApplyTo::VirtualHost
                        | ApplyTo::ExtensionConfig
                ) =>
            {
                f.warn(
                    &op_at,
                    "IST0152: The REPLACE operation is only valid for HTTP_FILTER and NETWORK_FILTER.",
                );
                false
            }
            Operation::Remove
            | Operation::Replace
            | Operation::InsertBefore
            | Operation::InsertAfter
            | Operation::Merge => true,
            _ => false,
        };
        if relative && ef.priority == 0 {
            if versioned.contains(&name) {
                f.warn(&op_at, IST0155);
            } else {
                f.warn(&op_at, IST0151);
            }
        }
        if m.and_then(|m| m.proxy.as_ref())
            .is_some_and(|p| !p.proxy_version.is_empty())
        {
            versioned.push(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    fn check(yaml: &str) -> Validation {
        validate_envoy_filter(&spec(yaml))
    }

    #[test]
    fn every_ef_gets_istios_general_warning() {
        let w = assert_ok(&check(
            "configPatches: [{applyTo: CLUSTER, patch: {operation: MERGE, value: {connect_timeout: 1s}}}]",
        ));
        assert!(
            w.iter()
                .any(|w| w.message.contains("internal implementation details"))
        );
    }

    #[test]
    fn patches_need_apply_to_operation_and_value() {
        assert_error(
            &check("configPatches: [{patch: {operation: MERGE, value: {}}}]"),
            "spec.configPatches[0].applyTo",
            "missing applyTo",
        );
        assert_error(
            &check("configPatches: [{applyTo: CLUSTER}]"),
            "spec.configPatches[0].patch",
            "missing patch",
        );
        assert_error(
            &check("configPatches: [{applyTo: CLUSTER, patch: {value: {}}}]"),
            "spec.configPatches[0].patch.operation",
            "missing patch operation",
        );
        assert_error(
            &check("configPatches: [{applyTo: CLUSTER, patch: {operation: ADD}}]"),
            "spec.configPatches[0].patch.value",
            "missing patch value for non-remove operation",
        );
        assert_ok(&check(
            "configPatches: [{applyTo: CLUSTER, patch: {operation: REMOVE}}]",
        ));
    }

    #[test]
    fn proxy_version_regex_must_compile() {
        assert_error(
            &check(
                "configPatches: [{applyTo: CLUSTER, match: {proxy: {proxyVersion: '%#@~++=('}}, patch: {operation: REMOVE}}]",
            ),
            "spec.configPatches[0].match.proxy.proxyVersion",
            "invalid regex for proxy version",
        );
        assert_ok(&check(
            "configPatches: [{applyTo: CLUSTER, match: {proxy: {proxyVersion: '^1\\.2.*'}}, patch: {operation: REMOVE}}]",
        ));
    }

    #[test]
    fn match_class_must_fit_apply_to() {
        assert_error(
            &check(
                "configPatches: [{applyTo: LISTENER, match: {cluster: {service: a}}, patch: {operation: REMOVE}}]",
            ),
            "spec.configPatches[0].match",
            "non listener match",
        );
        assert_error(
            &check(
                "configPatches: [{applyTo: HTTP_ROUTE, match: {listener: {name: a}}, patch: {operation: MERGE, value: {}}}]",
            ),
            "spec.configPatches[0].match",
            "non route configuration match",
        );
        assert_error(
            &check(
                "configPatches: [{applyTo: CLUSTER, match: {listener: {name: a}}, patch: {operation: MERGE, value: {}}}]",
            ),
            "spec.configPatches[0].match",
            "non cluster match",
        );
    }

    #[test]
    fn filter_and_sub_filter_matches() {
        assert_error(
            &check(
                "configPatches: [{applyTo: NETWORK_FILTER, match: {listener: {filterChain: {filter: {}}}}, patch: {operation: REMOVE}}]",
            ),
            "spec.configPatches[0].match.listener.filterChain.filter.name",
            "filter match has no name",
        );
        assert_error(
            &check(
                "configPatches: [{applyTo: NETWORK_FILTER, match: {listener: {filterChain: {filter: {name: x, subFilter: {name: y}}}}}, patch: {operation: REMOVE}}]",
            ),
            "spec.configPatches[0].match.listener.filterChain.filter.subFilter",
            "HTTP_FILTER only",
        );
        assert_error(
            &check(
                "configPatches: [{applyTo: HTTP_FILTER, match: {listener: {filterChain: {filter: {name: x, subFilter: {name: y}}}}}, patch: {operation: REMOVE}}]",
            ),
            "spec.configPatches[0].match.listener.filterChain.filter.subFilter",
            "requires filter match with envoy.filters.network.http_connection_manager",
        );
        assert_warning(
            &check(
                "configPatches: [{applyTo: HTTP_FILTER, match: {listener: {filterChain: {filter: {name: envoy.http_connection_manager, subFilter: {name: envoy.router}}}}}, patch: {operation: REMOVE}}]",
            ),
            "spec.configPatches[0].match.listener.filterChain.filter.subFilter.name",
            "using deprecated filter name \"envoy.router\"",
        );
        assert_warning(
            &check(
                "configPatches: [{applyTo: LISTENER, match: {listener: {filterChain: {filter: {name: envoy.filters.network.tcp_proxy}}}}, patch: {operation: REMOVE}}]",
            ),
            "spec.configPatches[0].match.listener.filterChain.filter",
            "filter match has no effect when used with LISTENER",
        );
    }

    #[test]
    fn selector_labels_and_target_refs() {
        assert_warning(
            &check("workloadSelector: {labels: {}}\nconfigPatches: []"),
            "spec.workloadSelector.labels",
            "applied to all services in namespace",
        );
        assert_error(
            &check("workloadSelector: {labels: {app: a}}\ntargetRefs: [{kind: Gateway, name: g}]"),
            "spec.targetRefs",
            "only one of targetRefs or workloadSelector",
        );
        // A Gateway API Gateway is served; waypoint targets are reported.
        let w = assert_ok(&check(
            "targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: g}]\nconfigPatches: []",
        ));
        assert!(
            !w.iter()
                .any(|w| w.field.to_string().starts_with("spec.targetRefs")),
            "{w:?}"
        );
        for kind in [
            "{kind: Service, name: s}",
            "{group: gateway.networking.k8s.io, kind: GatewayClass, name: istio-waypoint}",
        ] {
            assert_warning(
                &check(&format!("targetRefs: [{kind}]\nconfigPatches: []")),
                "spec.targetRefs[0]",
                "waypoints, which meshfed does not serve",
            );
        }
    }

    #[test]
    fn analyzer_warnings() {
        assert_warning(
            &check(
                "configPatches: [{applyTo: HTTP_FILTER, patch: {operation: INSERT_BEFORE, value: {name: a}}}]",
            ),
            "spec.configPatches[0].patch.operation",
            "IST0151",
        );
        let w = assert_ok(&check(
            "priority: 10\nconfigPatches: [{applyTo: HTTP_FILTER, patch: {operation: INSERT_BEFORE, value: {name: a}}}]",
        ));
        assert!(!w.iter().any(|w| w.message.contains("IST0151")), "{w:?}");
        // As Istio's analyzer: IST0155 when an earlier patch with a proxyVersion names
        // the same filter; a MERGE alone is relative (IST0151).
        let versioned = check(
            "configPatches: [{applyTo: HTTP_FILTER, match: {proxy: {proxyVersion: '^1\\.2.*'}}, patch: {operation: INSERT_BEFORE, value: {name: lua}}},
              {applyTo: HTTP_FILTER, patch: {operation: INSERT_AFTER, value: {name: lua}}},
              {applyTo: HTTP_FILTER, patch: {operation: INSERT_AFTER, value: {name: other}}}]",
        );
        assert_warning(
            &versioned,
            "spec.configPatches[0].patch.operation",
            "IST0151",
        );
        assert_warning(
            &versioned,
            "spec.configPatches[1].patch.operation",
            "IST0155",
        );
        assert_warning(
            &versioned,
            "spec.configPatches[2].patch.operation",
            "IST0151",
        );
        assert_warning(
            &check(
                "configPatches: [{applyTo: CLUSTER, match: {proxy: {proxyVersion: '^1\\.2.*'}}, patch: {operation: MERGE, value: {}}}]",
            ),
            "spec.configPatches[0].patch.operation",
            "IST0151",
        );
        assert_warning(
            &check("configPatches: [{applyTo: HTTP_ROUTE, patch: {operation: REMOVE}}]"),
            "spec.configPatches[0].patch.operation",
            "IST0154",
        );
        assert_warning(
            &check("configPatches: [{applyTo: CLUSTER, patch: {operation: REPLACE, value: {}}}]"),
            "spec.configPatches[0].patch.operation",
            "IST0152",
        );
        assert_warning(
            &check("configPatches: [{applyTo: HTTP_ROUTE, patch: {operation: ADD, value: {}}}]"),
            "spec.configPatches[0].patch.operation",
            "IST0153",
        );
    }
}

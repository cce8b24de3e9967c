//! HTTPRoute and GRPCRoute rules to Istio HTTP routes (istiod's `convertHTTPRoute`,
//! `convertGRPCRoute`), one VirtualService per parent and hostname, merged across
//! routes by key and sorted as the Gateway API orders matches (`mergeHTTPRoutes`,
//! `sortHTTPRoutes`).

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::{Map, Value, json};

use super::super::status::{ObjectStatus, RouteParentStatus, route_status};
use super::super::types::*;
use super::super::validate::parse_duration;
use super::parents::{Attached, Parents};
use super::{
    GENERATED, Inputs, Obj, PARENTS_ANNOTATION, generated, parent_name, reference_allowed,
};
use crate::config::{ConfigObject, Kind};

/// A VirtualService before merging: its merge key and content.
pub struct Keyed {
    key: String,
    namespace: String,
    name: String,
    creation_time: SystemTime,
    parents: String,
    host: String,
    gateway: String,
    http: Vec<Value>,
}

/// What converting a route's rules found wrong: `ResolvedRefs` (reason, message) and
/// `Accepted` failures.
#[derive(Default)]
pub(super) struct RuleErrors {
    pub unresolved: Option<(String, String)>,
    pub not_accepted: Option<(String, String)>,
}

/// The context of one route's conversion.
pub(super) struct Route<'a> {
    pub kind: Kind,
    pub object: &'a ConfigObject,
    /// The route's parentRefs: a backend that is one of its parent Services is
    /// reachable from any namespace (a consumer route, GAMMA).
    pub parent_refs: &'a [ParentReference],
    pub inputs: &'a Inputs<'a>,
    pub grants: &'a [Obj<'a, ReferenceGrantSpec>],
}

/// A Gateway API duration as a proto3 JSON duration (`1ms` -> `0.001s`).
pub(super) fn duration(text: &str) -> Option<String> {
    let d = parse_duration(text).ok()?;
    let nanos = d.subsec_nanos();
    Some(if nanos == 0 {
        format!("{}s", d.as_secs())
    } else {
        let frac = format!("{nanos:09}");
        format!("{}.{}s", d.as_secs(), frac.trim_end_matches('0'))
    })
}

impl Route<'_> {
    fn ns(&self) -> &str {
        &self.object.namespace
    }

    /// One backend as an Istio destination, or why it cannot be one.
    pub fn destination(&self, b: &BackendRef, errors: &mut RuleErrors) -> Option<Value> {
        let group = b.group.as_deref().unwrap_or("");
        let kind = b.kind.as_deref().unwrap_or("Service");
        let ns = b.namespace.as_deref().unwrap_or(self.ns());
        let host = match (group, kind) {
            ("" | "core", "Service") => {
                let parent_service = self.parent_refs.iter().any(|p| {
                    matches!(p.group.as_deref(), Some("" | "core"))
                        && p.kind.as_deref() == Some("Service")
                        && p.name == b.name
                        && p.namespace.as_deref().unwrap_or(self.ns()) == ns
                });
                if !parent_service
                    && !reference_allowed(
                        self.grants,
                        self.kind.as_str(),
                        self.ns(),
                        "",
                        "Service",
                        ns,
                        &b.name,
                    )
                {
                    errors.unresolved.get_or_insert((
                        "RefNotPermitted".into(),
                        format!(
                            "backendRef {}/{ns} not accessible to a {} in namespace {:?} (missing a ReferenceGrant?)",
                            b.name,
                            self.kind.as_str(),
                            self.ns()
                        ),
                    ));
                    return None;
                }
                let host = format!("{}.{ns}.svc.{}", b.name, self.inputs.domain);
                if !(self.inputs.service_exists)(&host) {
                    errors.unresolved.get_or_insert((
                        "BackendNotFound".into(),
                        format!("backend({host}) not found"),
                    ));
                }
                host
            }
            ("networking.istio.io", "Hostname") => {
                if b.namespace.is_some() {
                    errors.unresolved.get_or_insert((
                        "InvalidKind".into(),
                        "namespace may not be set with Hostname type".into(),
                    ));
                    return None;
                }
                // A ServiceEntry (or any registry's) host, looked up like a Service.
                if !(self.inputs.service_exists)(&b.name) {
                    errors.unresolved.get_or_insert((
                        "BackendNotFound".into(),
                        format!("backend({}) not found", b.name),
                    ));
                }
                b.name.clone()
            }
            _ => {
                errors.unresolved.get_or_insert((
                    "InvalidKind".into(),
                    format!("referencing unsupported backendRef: group {group:?} kind {kind:?}"),
                ));
                return None;
            }
        };
        let mut dest = json!({"host": host});
        if let Some(p) = b.port {
            dest["port"] = json!({"number": p});
        }
        Some(dest)
    }

    /// The backends of a rule as an Istio route (weighted), with their own filters.
    fn backends(&self, refs: &[BackendRef], errors: &mut RuleErrors) -> Option<Vec<Value>> {
        let mut out = Vec::new();
        for b in refs {
            let weight = b.weight.unwrap_or(1);
            // An invalid backend keeps its share of the traffic as an empty
            // destination (which fails those requests), as istiod does.
            let dest = self.destination(b, errors).unwrap_or_else(|| json!({}));
            if weight == 0 {
                continue;
            }
            let mut entry = json!({"destination": dest});
            if refs.len() > 1 {
                entry["weight"] = json!(weight);
            }
            let mut headers = Map::new();
            for f in &b.filters {
                header_filters(f, &mut headers);
            }
            if !headers.is_empty() {
                entry["headers"] = Value::Object(headers);
            }
            out.push(entry);
        }
        // Every backend of weight 0: the rule answers 500. Invalid backends keep their
        // empty destinations (those requests fail), as istiod's do.
        if out.is_empty() && !refs.is_empty() {
            return None;
        }
        Some(out)
    }
}

fn header_filters(f: &HttpRouteFilter, headers: &mut Map<String, Value>) {
    for (which, m) in [
        ("request", &f.request_header_modifier),
        ("response", &f.response_header_modifier),
    ] {
        let Some(m) = m else { continue };
        let mut ops = Map::new();
        let pairs = |list: &[HeaderValue]| {
            Value::Object(
                list.iter()
                    .map(|h| (h.name.clone(), json!(h.value)))
                    .collect(),
            )
        };
        if !m.set.is_empty() {
            ops.insert("set".into(), pairs(&m.set));
        }
        if !m.add.is_empty() {
            ops.insert("add".into(), pairs(&m.add));
        }
        if !m.remove.is_empty() {
            ops.insert("remove".into(), json!(m.remove));
        }
        headers.insert(which.into(), Value::Object(ops));
    }
}

fn string_match(kind: Option<&str>, value: &str) -> Value {
    match kind {
        Some("RegularExpression") => json!({"regex": value}),
        _ => json!({"exact": value}),
    }
}

fn cors(c: &Cors) -> Value {
    let origins: Vec<Value> = c
        .allow_origins
        .iter()
        .map(|o| {
            if o == "*" {
                json!({"regex": r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s?#]+$"})
            } else if o.contains('*') {
                let parts: Vec<String> = o.split('*').map(regex_escape).collect();
                json!({"regex": format!("^{}$", parts.join(".*"))})
            } else {
                json!({"exact": o})
            }
        })
        .collect();
    let mut out = json!({"unmatchedPreflights": "IGNORE"});
    if !origins.is_empty() {
        out["allowOrigins"] = json!(origins);
    }
    for (key, list) in [
        ("allowMethods", &c.allow_methods),
        ("allowHeaders", &c.allow_headers),
        ("exposeHeaders", &c.expose_headers),
    ] {
        if !list.is_empty() {
            out[key] = json!(list);
        }
    }
    if let Some(age) = c.max_age {
        out["maxAge"] = json!(format!("{age}s"));
    }
    if c.allow_credentials == Some(true) {
        out["allowCredentials"] = json!(true);
    }
    out
}

fn regex_escape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The filters shared by HTTP and gRPC rules, applied to `route`.
fn apply_filters(
    r: &Route,
    filters: &[HttpRouteFilter],
    prefix: Option<&str>,
    route: &mut Map<String, Value>,
    errors: &mut RuleErrors,
) {
    let mut headers = Map::new();
    let mut mirrors = Vec::new();
    for f in filters {
        header_filters(f, &mut headers);
        if let Some(m) = &f.request_mirror {
            let mut e = RuleErrors::default();
            if let Some(dest) = r.destination(&m.backend_ref, &mut e) {
                let mut mirror = json!({"destination": dest});
                let percent = match (&m.fraction, m.percent) {
                    (Some(f), _) => {
                        Some(f.numerator as f64 * 100.0 / f.denominator.unwrap_or(100) as f64)
                    }
                    (None, Some(p)) => Some(p as f64),
                    _ => None,
                };
                if let Some(p) = percent {
                    mirror["percentage"] = json!({"value": p});
                }
                mirrors.push(mirror);
            }
            if e.unresolved.is_some() {
                errors.unresolved = errors.unresolved.take().or(e.unresolved);
            }
        }
        if let Some(rd) = &f.request_redirect {
            let mut out = Map::new();
            if let Some(s) = &rd.scheme {
                out.insert("scheme".into(), json!(s));
                // A new scheme without a port redirects to the scheme's default port.
                if rd.port.is_none() {
                    out.insert("derivePort".into(), json!("FROM_PROTOCOL_DEFAULT"));
                }
            }
            if let Some(h) = &rd.hostname {
                out.insert("authority".into(), json!(h));
            }
            if let Some(p) = rd.port {
                out.insert("port".into(), json!(p));
            }
            out.insert("redirectCode".into(), json!(rd.status_code.unwrap_or(302)));
            if let Some(p) = &rd.path {
                match p.kind.as_str() {
                    "ReplaceFullPath" => {
                        out.insert(
                            "uri".into(),
                            json!(p.replace_full_path.clone().unwrap_or_default()),
                        );
                    }
                    _ => {
                        out.insert(
                            "uri".into(),
                            json!(format!(
                                "%PREFIX()%{}",
                                p.replace_prefix_match.clone().unwrap_or_default()
                            )),
                        );
                    }
                }
            }
            route.insert("redirect".into(), Value::Object(out));
        }
        if let Some(rw) = &f.url_rewrite {
            let mut out = Map::new();
            if let Some(h) = &rw.hostname {
                out.insert("authority".into(), json!(h));
            }
            if let Some(p) = &rw.path {
                match p.kind.as_str() {
                    "ReplaceFullPath" => {
                        out.insert(
                            "uriRegexRewrite".into(),
                            json!({"match": "/.*", "rewrite": p.replace_full_path.clone().unwrap_or_default()}),
                        );
                    }
                    _ => {
                        let to = p.replace_prefix_match.clone().unwrap_or_default();
                        let to = if to.is_empty() && prefix.is_some() {
                            "/".to_string()
                        } else {
                            to
                        };
                        out.insert("uri".into(), json!(to));
                    }
                }
            }
            route.insert("rewrite".into(), Value::Object(out));
        }
        if let Some(c) = &f.cors {
            route.insert("corsPolicy".into(), cors(c));
        }
        if matches!(f.kind.as_str(), "ExtensionRef" | "ExternalAuth") {
            errors.not_accepted.get_or_insert((
                "UnsupportedValue".into(),
                format!("unsupported filter type {:?}", f.kind),
            ));
        }
    }
    if !headers.is_empty() {
        route.insert("headers".into(), Value::Object(headers));
    }
    if !mirrors.is_empty() {
        route.insert("mirrors".into(), json!(mirrors));
    }
}

/// One HTTPRoute rule with at most one match.
fn http_rule(
    r: &Route,
    rule: &HttpRouteRule,
    m: Option<&HttpRouteMatch>,
    n: usize,
    errors: &mut RuleErrors,
) -> Value {
    let mut route = Map::new();
    let mut prefix = None;
    if let Some(m) = m {
        let mut out = Map::new();
        if let Some(p) = &m.path {
            let value = p.value.clone().unwrap_or_else(|| "/".into());
            let uri = match p.kind.as_deref().unwrap_or("PathPrefix") {
                "Exact" => json!({"exact": value}),
                "RegularExpression" => json!({"regex": value}),
                _ => {
                    let v = if value.len() > 1 {
                        value.trim_end_matches('/').to_string()
                    } else {
                        value
                    };
                    prefix = Some(v.clone());
                    json!({"prefix": v})
                }
            };
            out.insert("uri".into(), uri);
        }
        if !m.headers.is_empty() {
            out.insert(
                "headers".into(),
                Value::Object(
                    m.headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_ascii_lowercase(),
                                string_match(h.kind.as_deref(), &h.value),
                            )
                        })
                        .collect(),
                ),
            );
        }
        if !m.query_params.is_empty() {
            out.insert(
                "queryParams".into(),
                Value::Object(
                    m.query_params
                        .iter()
                        .map(|h| (h.name.clone(), string_match(h.kind.as_deref(), &h.value)))
                        .collect(),
                ),
            );
        }
        if let Some(method) = &m.method {
            out.insert("method".into(), json!({"exact": method}));
        }
        route.insert("match".into(), json!([out]));
    }
    route.insert(
        "name".into(),
        json!(
            rule.name
                .clone()
                .unwrap_or_else(|| format!("{}.{}.{n}", r.object.namespace, r.object.name))
        ),
    );
    apply_filters(r, &rule.filters, prefix.as_deref(), &mut route, errors);
    finish_rule(r, &rule.backend_refs, &mut route, errors);
    if let Some(t) = &rule.timeouts
        && let Some(d) = t
            .backend_request
            .as_deref()
            .or(t.request.as_deref())
            .and_then(duration)
    {
        route.insert("timeout".into(), json!(d));
    }
    if let Some(rt) = &rule.retry {
        let attempts = rt.attempts.unwrap_or(2);
        let retries = if attempts == 0 {
            json!({})
        } else {
            let mut on = "connect-failure,refused-stream,unavailable,cancelled".to_string();
            for c in &rt.codes {
                on.push_str(&format!(",{c}"));
            }
            let mut v = json!({"attempts": attempts, "retryOn": on});
            if let Some(b) = rt.backoff.as_deref().and_then(duration) {
                v["backoff"] = json!(b);
            }
            v
        };
        route.insert("retries".into(), retries);
    }
    Value::Object(route)
}

/// The destinations of a rule, unless it redirects: a 404 where it names no backend
/// (nothing routes there), a 500 where every backend has weight 0; an invalid backend
/// keeps its share as an empty destination.
fn finish_rule(
    r: &Route,
    refs: &[BackendRef],
    route: &mut Map<String, Value>,
    errors: &mut RuleErrors,
) {
    if route.contains_key("redirect") {
        return;
    }
    if refs.is_empty() {
        route.insert("directResponse".into(), json!({"status": 404}));
        return;
    }
    match r.backends(refs, errors) {
        Some(dests) if !dests.is_empty() => {
            route.insert("route".into(), json!(dests));
        }
        _ => {
            route.insert("directResponse".into(), json!({"status": 500}));
        }
    }
}

/// One GRPCRoute rule with at most one match.
fn grpc_rule(
    r: &Route,
    rule: &GrpcRouteRule,
    m: Option<&GrpcRouteMatch>,
    n: usize,
    errors: &mut RuleErrors,
) -> Value {
    let mut route = Map::new();
    if let Some(m) = m {
        let mut out = Map::new();
        if let Some(method) = &m.method {
            let regex = method.kind.as_deref() == Some("RegularExpression");
            let uri = match (&method.service, &method.method, regex) {
                (Some(s), Some(me), false) => json!({"exact": format!("/{s}/{me}")}),
                (Some(s), None, false) => json!({"prefix": format!("/{s}/")}),
                (s, me, _) => json!({"regex": format!(
                    "/{}/{}",
                    s.clone().unwrap_or_else(|| "[^/]+".into()),
                    me.clone().unwrap_or_else(|| "[^/]+".into())
                )}),
            };
            out.insert("uri".into(), uri);
        }
        if !m.headers.is_empty() {
            out.insert(
                "headers".into(),
                Value::Object(
                    m.headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_ascii_lowercase(),
                                string_match(h.kind.as_deref(), &h.value),
                            )
                        })
                        .collect(),
                ),
            );
        }
        route.insert("match".into(), json!([out]));
    }
    route.insert(
        "name".into(),
        json!(
            rule.name
                .clone()
                .unwrap_or_else(|| format!("{}.{}.{n}", r.object.namespace, r.object.name))
        ),
    );
    apply_filters(r, &rule.filters, None, &mut route, errors);
    finish_rule(r, &rule.backend_refs, &mut route, errors);
    Value::Object(route)
}

/// The rank of a route's first match for sorting: matches before none; exact, then
/// prefix (longer first), then regex; then method, more headers, more query params.
fn rank(route: &Value) -> Option<(i32, usize, bool, usize, usize)> {
    let m = route["match"].as_array()?.first()?;
    let (kind, len) = match &m["uri"] {
        Value::Object(u) if u.contains_key("exact") => (3, u["exact"].as_str().map_or(0, str::len)),
        Value::Object(u) if u.contains_key("prefix") => {
            (2, u["prefix"].as_str().map_or(0, str::len))
        }
        Value::Object(u) if u.contains_key("regex") => (1, u["regex"].as_str().map_or(0, str::len)),
        _ => (0, 0),
    };
    let count = |k: &str| m[k].as_object().map_or(0, Map::len);
    Some((
        kind,
        len,
        m.get("method").is_some(),
        count("headers"),
        count("queryParams"),
    ))
}

/// Sorts routes as the Gateway API orders matches (stable).
pub(super) fn sort_routes(routes: &mut [Value]) {
    routes.sort_by(|a, b| match (rank(a), rank(b)) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (Some(_), None) => std::cmp::Ordering::Less,
        (Some(x), Some(y)) => y.cmp(&x),
    });
}

/// Adds a port to every match (a mesh parentRef naming a port).
fn with_port(routes: &[Value], port: u32) -> Vec<Value> {
    routes
        .iter()
        .map(|r| {
            let mut r = r.clone();
            match r.get_mut("match").and_then(Value::as_array_mut) {
                Some(ms) => ms.iter_mut().for_each(|m| m["port"] = json!(port)),
                None => r["match"] = json!([{"port": port}]),
            }
            r
        })
        .collect()
}

/// The VirtualServices of a route's parents and its status.
fn finish(
    r: &Route,
    attached: Vec<Attached>,
    mesh_routes: &[Value],
    gw_routes: &[Value],
    errors: RuleErrors,
) -> (Vec<Keyed>, ObjectStatus) {
    let mut out = Vec::new();
    let mut statuses = Vec::new();
    for (echo, parents, failure) in attached {
        let bound = parents.len();
        let failure = failure.or_else(|| errors.not_accepted.clone());
        if failure.is_none() {
            for p in &parents {
                let (key, routes) = if p.mesh {
                    match p.port {
                        Some(port) => (format!("{}/{port}", r.ns()), with_port(mesh_routes, port)),
                        None => (r.ns().to_string(), mesh_routes.to_vec()),
                    }
                } else {
                    (p.internal_name.clone(), gw_routes.to_vec())
                };
                if routes.is_empty() {
                    continue;
                }
                for h in p.http_hosts.as_ref().unwrap_or(&p.hosts) {
                    out.push(Keyed {
                        key: format!("{key}/{h}"),
                        namespace: r.ns().to_string(),
                        name: r.object.name.clone(),
                        creation_time: r.object.creation_time,
                        parents: parent_name(r.kind, r.object),
                        host: h.clone(),
                        gateway: p.internal_name.clone(),
                        http: routes.clone(),
                    });
                }
            }
        }
        statuses.push(RouteParentStatus {
            parent_ref: echo,
            not_accepted: failure,
            unresolved: errors.unresolved.clone(),
            bound,
        });
    }
    (
        out,
        route_status(r.kind, r.object, r.inputs.controller, &statuses),
    )
}

/// An HTTPRoute: its VirtualServices (before merging) and status.
pub fn http_route(
    route: &Obj<HttpRouteSpec>,
    parents: &mut Parents,
    inputs: &Inputs,
    grants: &[Obj<ReferenceGrantSpec>],
) -> (Vec<Keyed>, ObjectStatus) {
    let spec = &route.spec;
    let target = (Kind::HTTPRoute, &spec.parent_refs[..], &spec.hostnames[..]);
    convert_route(
        route.object,
        target,
        parents,
        inputs,
        grants,
        |r, errors| rule_routes(&spec.rules, |rule| &rule.matches, http_rule, r, errors),
    )
}

/// A GRPCRoute: its VirtualServices (before merging) and status.
pub fn grpc_route(
    route: &Obj<GrpcRouteSpec>,
    parents: &mut Parents,
    inputs: &Inputs,
    grants: &[Obj<ReferenceGrantSpec>],
) -> (Vec<Keyed>, ObjectStatus) {
    let spec = &route.spec;
    let target = (Kind::GRPCRoute, &spec.parent_refs[..], &spec.hostnames[..]);
    convert_route(
        route.object,
        target,
        parents,
        inputs,
        grants,
        |r, errors| rule_routes(&spec.rules, |rule| &rule.matches, grpc_rule, r, errors),
    )
}

/// What an HTTP or gRPC route is and attaches to: its kind, parentRefs and hostnames.
type RouteTarget<'s> = (Kind, &'s [ParentReference], &'s [String]);

/// The conversion both HTTP-like route kinds share: the parentRefs resolved, the
/// rules converted by `routes`, the VirtualServices and status assembled.
fn convert_route(
    object: &ConfigObject,
    (kind, parent_refs, hostnames): RouteTarget<'_>,
    parents: &mut Parents,
    inputs: &Inputs,
    grants: &[Obj<ReferenceGrantSpec>],
    routes: impl FnOnce(&Route, &mut RuleErrors) -> Vec<Value>,
) -> (Vec<Keyed>, ObjectStatus) {
    let r = Route {
        kind,
        object,
        parent_refs,
        inputs,
        grants,
    };
    let attached = parents.attach(kind, object, parent_refs, hostnames, inputs);
    let mut errors = RuleErrors::default();
    let routes = routes(&r, &mut errors);
    finish(&r, attached, &routes, &routes, errors)
}

/// One Istio HTTP route per rule and match (a rule without matches gives one).
fn rule_routes<R, M>(
    rules: &[R],
    matches: impl Fn(&R) -> &[M],
    convert: impl Fn(&Route, &R, Option<&M>, usize, &mut RuleErrors) -> Value,
    r: &Route,
    errors: &mut RuleErrors,
) -> Vec<Value> {
    let mut routes = Vec::new();
    for (n, rule) in rules.iter().enumerate() {
        let matches = matches(rule);
        if matches.is_empty() {
            routes.push(convert(r, rule, None, n, errors));
        }
        for m in matches {
            routes.push(convert(r, rule, Some(m), n, errors));
        }
    }
    routes
}

/// Merges the VirtualServices of one key (parent and host) across routes, oldest
/// route first; the name is the key with `/` as `~`.
pub fn merge(keyed: Vec<Keyed>) -> Vec<ConfigObject> {
    let mut groups: BTreeMap<String, Vec<Keyed>> = BTreeMap::new();
    for k in keyed {
        groups.entry(k.key.clone()).or_default().push(k);
    }
    groups
        .into_iter()
        .filter_map(|(key, mut group)| {
            group.sort_by(|a, b| {
                (a.creation_time, &a.namespace, &a.name).cmp(&(
                    b.creation_time,
                    &b.namespace,
                    &b.name,
                ))
            });
            let base = &group[0];
            let mut http: Vec<Value> = group.iter().flat_map(|g| g.http.clone()).collect();
            sort_routes(&mut http);
            let mut parents: Vec<&str> = Vec::new();
            for g in &group {
                if !parents.contains(&g.parents.as_str()) {
                    parents.push(&g.parents);
                }
            }
            let mut annotations = BTreeMap::new();
            annotations.insert(PARENTS_ANNOTATION.to_string(), parents.join(","));
            annotations.insert(
                "internal.istio.io/route-semantics".to_string(),
                "gateway".to_string(),
            );
            let _ = GENERATED;
            generated(
                Kind::VirtualService,
                &base.namespace,
                &key.replace('/', "~"),
                annotations,
                base.creation_time,
                &json!({"hosts": [base.host], "gateways": [base.gateway], "http": http}),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_proto_durations() {
        assert_eq!(duration("1ms").as_deref(), Some("0.001s"));
        assert_eq!(duration("10s").as_deref(), Some("10s"));
        assert_eq!(duration("1m500ms").as_deref(), Some("60.5s"));
    }

    #[test]
    fn routes_sort_as_the_api_orders_matches() {
        let mut routes = vec![
            json!({"name": "none"}),
            json!({"match": [{"uri": {"regex": ".*foo"}}]}),
            json!({"match": [{"uri": {"prefix": "/"}}]}),
            json!({"match": [{"uri": {"prefix": "/foobar"}}]}),
            json!({"match": [{"uri": {"exact": "/foo"}}]}),
            json!({"match": [{"method": {"exact": "GET"}}]}),
        ];
        sort_routes(&mut routes);
        let order: Vec<String> = routes.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            order,
            [
                r#"{"match":[{"uri":{"exact":"/foo"}}]}"#,
                r#"{"match":[{"uri":{"prefix":"/foobar"}}]}"#,
                r#"{"match":[{"uri":{"prefix":"/"}}]}"#,
                r#"{"match":[{"uri":{"regex":".*foo"}}]}"#,
                r#"{"match":[{"method":{"exact":"GET"}}]}"#,
                r#"{"name":"none"}"#,
            ]
        );
    }
}

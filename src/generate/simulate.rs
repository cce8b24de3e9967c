//! A small simulator over generated xDS resources, for behaviour tests (the idea of
//! Istio's `pilot/pkg/simulation`): "a request for this host and path with these
//! headers lands on that cluster", checked against the route tables Envoy would
//! receive rather than against the generator's internals.
//!
//! [`route`] follows Envoy's HTTP routing: a virtual host is chosen by the request's
//! authority (exact domain, then the longest `*.suffix` wildcard, then the longest
//! `prefix.*` wildcard, then `*`; case-insensitive; the port is part of the authority
//! unless the table sets `ignore_port_in_host_matching`), then the first route whose
//! path (prefix, exact path, path-separated prefix or full-match RE2 regex, honouring
//! `case_sensitive`), headers (string matchers, presence, inversion, missing-as-empty),
//! query parameters, gRPC and TLS conditions all match decides the outcome. Virtual
//! hosts that require TLS answer plain requests with a redirect to https. Runtime
//! fractions are taken as always on.
//!
//! [`simulate_call`] goes one level up, to connections: the listener Envoy hands a
//! connection to (by original destination), the filter chain that takes it (Envoy's
//! filter chain match, with what the TLS and HTTP inspectors detect), and then the
//! HTTP route or the TCP proxy's cluster — the method of Istio's
//! `pilot/pkg/simulation/traffic.go`.
//!
//! Before routing, the connection manager's path normalization and RBAC filters
//! apply ([`normalized_path`], [`rbac_verdict`]).
//!
//! [`check_consistency`] cross-checks one proxy's CDS, LDS, RDS and EDS answers the way
//! Envoy would trip over them: references to clusters or route tables that were not
//! sent, EDS clusters whose load assignment is not served, and duplicate names or
//! domains Envoy rejects.

use std::collections::{BTreeSet, HashSet};

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::{
    HeaderMatcher, QueryParameterMatcher, RedirectAction, Route, RouteConfiguration, RouteMatch,
    VirtualHost, header_matcher, query_parameter_matcher, redirect_action, route, route_action,
    route_match, virtual_host,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    RegexMatchAndSubstitute, RegexMatcher, StringMatcher, string_matcher,
};
use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};
use regex::Regex;

use super::rds::referenced_clusters;

mod http_filters;
mod listener;

pub use http_filters::{normalized_path, rbac_verdict};
pub use listener::{
    Call, CallMode, CallProtocol, CallResult, TlsMode, match_filter_chain, select_listener,
    simulate_call, simulate_call_without_cds,
};

/// One HTTP request as a client sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Host name or address the client dials (no port).
    pub host: String,
    /// Port the client dials. The authority carries it unless it is the scheme's
    /// default (80 for plain HTTP, 443 for TLS), as HTTP clients do.
    pub port: u16,
    /// Path with optional query string (`/a/b?x=1`).
    pub path: String,
    /// Method (`GET`).
    pub method: String,
    /// Request headers (names are case-insensitive; repeated names are joined with `,`
    /// as Envoy does).
    pub headers: Vec<(String, String)>,
    /// Whether the request arrives over TLS (`:scheme` https).
    pub tls: bool,
}

impl Request {
    /// A plain `GET host:port path` with no headers.
    pub fn new(host: &str, port: u16, path: &str) -> Request {
        Request {
            host: host.to_string(),
            port,
            path: path.to_string(),
            method: "GET".to_string(),
            headers: Vec::new(),
            tls: false,
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Sets the method.
    pub fn method(mut self, method: &str) -> Request {
        self.method = method.to_string();
        self
    }

    /// Marks the request as arriving over TLS.
    pub fn tls(mut self) -> Request {
        self.tls = true;
        self
    }

    /// The `:authority` the client sends.
    pub fn authority(&self) -> String {
        let default_port = if self.tls { 443 } else { 80 };
        let host = if self.host.contains(':') && self.host.parse::<std::net::IpAddr>().is_ok() {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == default_port || self.port == 0 {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }

    fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }

    /// The path without query string and fragment (what path matchers see).
    fn path_only(&self) -> &str {
        let end = self.path.find(['?', '#']).unwrap_or(self.path.len());
        &self.path[..end]
    }

    /// The first value of each query parameter, in order.
    fn query(&self) -> Vec<(&str, &str)> {
        let Some((_, q)) = self.path.split_once('?') else {
            return Vec::new();
        };
        let q = q.split('#').next().unwrap_or("");
        q.split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
            .collect()
    }

    /// The value of a header as Envoy's matchers see it (pseudo-headers included).
    fn header_value(&self, name: &str) -> Option<String> {
        let name = name.to_ascii_lowercase();
        match name.as_str() {
            ":authority" | "host" => return Some(self.authority()),
            ":method" => return Some(self.method.clone()),
            ":path" => return Some(self.path.clone()),
            ":scheme" => return Some(self.scheme().to_string()),
            _ => {}
        }
        let values: Vec<&str> = self
            .headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(&name))
            .map(|(_, v)| v.as_str())
            .collect();
        (!values.is_empty()).then(|| values.join(","))
    }
}

/// Where a request ends up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteOutcome {
    /// Forwarded to one cluster.
    Cluster(String),
    /// Split across clusters by weight.
    WeightedClusters(Vec<(String, u32)>),
    /// Answered with a redirect.
    Redirect {
        scheme: String,
        host: String,
        /// Explicit port in the new location, if any.
        port: Option<u32>,
        path: String,
        /// HTTP status (301, 302, 303, 307, 308).
        code: u32,
    },
    /// Answered directly with a status.
    DirectResponse(u32),
}

/// Why a request could not be routed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SimError {
    /// No virtual host's domains match the authority (Envoy answers 404).
    #[error("no virtual host matches authority {0:?}")]
    NoVirtualHost(String),
    /// The virtual host has no matching route (Envoy answers 404, `NR`).
    #[error("no route in virtual host {0:?} matches")]
    NoRoute(String),
    /// A regex in the config does not compile (Envoy would reject the config).
    #[error("invalid regex {0:?}: {1}")]
    InvalidRegex(String, String),
    /// The config uses something the simulator does not model.
    #[error("not supported by the simulator: {0}")]
    Unsupported(String),
    /// A call that cannot be made (ALPN on a plaintext connection).
    #[error("invalid call: {0}")]
    InvalidCall(String),
    /// No listener takes the connection (it is refused).
    #[error("no listener matched {0}")]
    NoListener(String),
    /// The listener has no chain for the connection and no default chain (Envoy
    /// closes it).
    #[error("no filter chain of listener {0} matched")]
    NoFilterChain(String),
    /// Several chains match equally well (Envoy rejects such a listener).
    #[error("multiple filter chains of listener {0} matched")]
    MultipleFilterChains(String),
    /// The chain cannot speak the call's protocol: TLS or raw TCP into an HTTP
    /// connection manager that does not terminate TLS.
    #[error("protocol error: {0}")]
    ProtocolError(String),
    /// Plaintext into a chain that terminates TLS.
    #[error("invalid TLS: chain {0} expects a TLS handshake")]
    TlsError(String),
    /// The chain's TLS and the call disagree on mutual TLS: a client certificate
    /// required from a call without one, or a mesh mTLS call into a chain that does
    /// not require it.
    #[error("invalid mTLS: chain {0}")]
    MtlsError(String),
    /// The chain's HTTP connection manager names a route table RDS did not send.
    #[error("route configuration {0:?} was not served")]
    RouteConfigNotFound(String),
    /// The outcome names a cluster CDS did not send (Envoy answers 503, `NC`).
    #[error("cluster {0:?} was not served")]
    ClusterNotFound(String),
}

/// The virtual host and route a request matched, and the outcome.
#[derive(Clone, Debug)]
pub struct Matched<'a> {
    pub virtual_host: &'a VirtualHost,
    /// `None` when the virtual host itself answered (TLS required).
    pub route: Option<&'a Route>,
    pub outcome: RouteOutcome,
}

/// Routes `req` through `config`.
pub fn route(config: &RouteConfiguration, req: &Request) -> Result<RouteOutcome, SimError> {
    resolve(config, req).map(|m| m.outcome)
}

/// Routes `req` through `config`, returning what matched.
pub fn resolve<'a>(config: &'a RouteConfiguration, req: &Request) -> Result<Matched<'a>, SimError> {
    let mut authority = req.authority();
    if config.ignore_port_in_host_matching {
        authority = strip_port(&authority).to_string();
    }
    let vh = select_virtual_host(config, &authority)
        .ok_or_else(|| SimError::NoVirtualHost(authority.clone()))?;
    if !req.tls && vh.require_tls != virtual_host::TlsRequirementType::None as i32 {
        return Ok(Matched {
            virtual_host: vh,
            route: None,
            outcome: RouteOutcome::Redirect {
                scheme: "https".to_string(),
                host: strip_port(&req.authority()).to_string(),
                port: None,
                path: req.path.clone(),
                code: 301,
            },
        });
    }
    for r in &vh.routes {
        let Some(m) = &r.r#match else {
            continue;
        };
        if route_matches(m, req)? {
            return Ok(Matched {
                virtual_host: vh,
                route: Some(r),
                outcome: outcome(r, m, req)?,
            });
        }
    }
    Err(SimError::NoRoute(vh.name.clone()))
}

/// Envoy's virtual host selection for an authority.
pub fn select_virtual_host<'a>(
    config: &'a RouteConfiguration,
    authority: &str,
) -> Option<&'a VirtualHost> {
    let host = authority.to_ascii_lowercase();
    let mut suffix: Option<(usize, &VirtualHost)> = None;
    let mut prefix: Option<(usize, &VirtualHost)> = None;
    let mut default = None;
    for vh in &config.virtual_hosts {
        for domain in &vh.domains {
            let domain = domain.to_ascii_lowercase();
            if domain == "*" {
                default.get_or_insert(vh);
            } else if let Some(s) = domain.strip_prefix('*') {
                // The wildcard must stand for at least one character.
                if host.len() > s.len()
                    && host.ends_with(s)
                    && suffix.is_none_or(|(len, _)| s.len() > len)
                {
                    suffix = Some((s.len(), vh));
                }
            } else if let Some(p) = domain.strip_suffix('*') {
                if host.len() > p.len()
                    && host.starts_with(p)
                    && prefix.is_none_or(|(len, _)| p.len() > len)
                {
                    prefix = Some((p.len(), vh));
                }
            } else if domain == host {
                return Some(vh);
            }
        }
    }
    suffix.or(prefix).map(|(_, vh)| vh).or(default)
}

fn strip_port(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority
            .find(']')
            .map_or(authority, |end| &authority[..=end]);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => authority,
    }
}

fn compile(regex: &str) -> Result<Regex, SimError> {
    Regex::new(&format!("^(?:{regex})$"))
        .map_err(|e| SimError::InvalidRegex(regex.to_string(), e.to_string()))
}

fn full_match(m: &RegexMatcher, value: &str) -> Result<bool, SimError> {
    Ok(compile(&m.regex)?.is_match(value))
}

fn route_matches(m: &RouteMatch, req: &Request) -> Result<bool, SimError> {
    let case_sensitive = m.case_sensitive.is_none_or(|b| b.value);
    let path = req.path_only();
    let eq = |a: &str, b: &str| {
        if case_sensitive {
            a == b
        } else {
            a.eq_ignore_ascii_case(b)
        }
    };
    let starts = |p: &str| {
        path.len() >= p.len() && path.is_char_boundary(p.len()) && eq(&path[..p.len()], p)
    };
    let path_ok = match &m.path_specifier {
        Some(route_match::PathSpecifier::Prefix(p)) => starts(p),
        Some(route_match::PathSpecifier::Path(p)) => eq(path, p),
        Some(route_match::PathSpecifier::SafeRegex(r)) => full_match(r, path)?,
        Some(route_match::PathSpecifier::PathSeparatedPrefix(p)) => {
            eq(path, p) || (starts(p) && path[p.len()..].starts_with('/'))
        }
        Some(route_match::PathSpecifier::ConnectMatcher(_)) => req.method == "CONNECT",
        Some(route_match::PathSpecifier::PathMatchPolicy(_)) => {
            return Err(SimError::Unsupported("path_match_policy".into()));
        }
        None => return Err(SimError::Unsupported("route without path matcher".into())),
    };
    if !path_ok {
        return Ok(false);
    }
    for h in &m.headers {
        if !header_matches(h, req)? {
            return Ok(false);
        }
    }
    let query = req.query();
    for q in &m.query_parameters {
        if !query_matches(q, &query)? {
            return Ok(false);
        }
    }
    if m.grpc.is_some()
        && !req
            .header_value("content-type")
            .is_some_and(|ct| ct.starts_with("application/grpc"))
    {
        return Ok(false);
    }
    if let Some(tls) = &m.tls_context {
        if tls.presented.is_some_and(|p| p.value != req.tls) {
            return Ok(false);
        }
        if tls.validated.is_some_and(|v| v.value && !req.tls) {
            return Ok(false);
        }
    }
    if !m.dynamic_metadata.is_empty() || !m.filter_state.is_empty() || !m.cookies.is_empty() {
        return Err(SimError::Unsupported(
            "dynamic metadata, filter state or cookie matchers".into(),
        ));
    }
    Ok(true)
}

#[allow(deprecated)]
fn header_matches(h: &HeaderMatcher, req: &Request) -> Result<bool, SimError> {
    use header_matcher::HeaderMatchSpecifier as S;
    let value = req.header_value(&h.name);
    let Some(value) = value.or_else(|| h.treat_missing_header_as_empty.then(String::new)) else {
        // A missing header only satisfies a presence test for absence.
        let present_test = match &h.header_match_specifier {
            Some(S::PresentMatch(p)) => Some(*p),
            _ => None,
        };
        return Ok(if h.invert_match {
            present_test == Some(true)
        } else {
            present_test == Some(false)
        });
    };
    let matched = match &h.header_match_specifier {
        None => true,
        Some(S::PresentMatch(p)) => *p,
        Some(S::StringMatch(sm)) => string_matches(sm, &value)?,
        Some(S::ExactMatch(e)) => value == *e,
        Some(S::PrefixMatch(p)) => value.starts_with(p.as_str()),
        Some(S::SuffixMatch(s)) => value.ends_with(s.as_str()),
        Some(S::ContainsMatch(c)) => value.contains(c.as_str()),
        Some(S::SafeRegexMatch(r)) => full_match(r, &value)?,
        Some(S::RangeMatch(r)) => value
            .parse::<i64>()
            .is_ok_and(|v| v >= r.start && v < r.end),
    };
    Ok(matched != h.invert_match)
}

fn query_matches(q: &QueryParameterMatcher, query: &[(&str, &str)]) -> Result<bool, SimError> {
    use query_parameter_matcher::QueryParameterMatchSpecifier as S;
    let Some((_, value)) = query.iter().find(|(k, _)| *k == q.name) else {
        return Ok(false);
    };
    match &q.query_parameter_match_specifier {
        None => Ok(true),
        Some(S::PresentMatch(p)) => Ok(*p),
        Some(S::StringMatch(sm)) => string_matches(sm, value),
    }
}

/// Envoy's `StringMatcher` on one value.
pub fn string_matches(sm: &StringMatcher, value: &str) -> Result<bool, SimError> {
    use string_matcher::MatchPattern as P;
    let (v, ic) = (value, sm.ignore_case);
    let norm = |s: &str| {
        if ic {
            s.to_ascii_lowercase()
        } else {
            s.to_string()
        }
    };
    Ok(match &sm.match_pattern {
        Some(P::Exact(e)) => norm(v) == norm(e),
        Some(P::Prefix(p)) => norm(v).starts_with(&norm(p)),
        Some(P::Suffix(s)) => norm(v).ends_with(&norm(s)),
        Some(P::Contains(c)) => norm(v).contains(&norm(c)),
        Some(P::SafeRegex(r)) => full_match(r, v)?,
        Some(P::Custom(_)) | None => {
            return Err(SimError::Unsupported("custom string matcher".into()));
        }
    })
}

fn outcome(r: &Route, m: &RouteMatch, req: &Request) -> Result<RouteOutcome, SimError> {
    match &r.action {
        Some(route::Action::Route(a)) => match &a.cluster_specifier {
            Some(route_action::ClusterSpecifier::Cluster(c)) => {
                Ok(RouteOutcome::Cluster(c.clone()))
            }
            Some(route_action::ClusterSpecifier::WeightedClusters(w)) => {
                Ok(RouteOutcome::WeightedClusters(
                    w.clusters
                        .iter()
                        .map(|c| (c.name.clone(), c.weight.map_or(0, |w| w.value)))
                        .collect(),
                ))
            }
            other => Err(SimError::Unsupported(format!(
                "cluster specifier {other:?}"
            ))),
        },
        Some(route::Action::Redirect(rd)) => redirect(rd, m, req),
        Some(route::Action::DirectResponse(d)) => Ok(RouteOutcome::DirectResponse(d.status)),
        other => Err(SimError::Unsupported(format!("route action {other:?}"))),
    }
}

/// Envoy's redirect: scheme, host, port and path rewritten as configured, the rest
/// taken from the request (a scheme change drops the original port).
fn redirect(rd: &RedirectAction, m: &RouteMatch, req: &Request) -> Result<RouteOutcome, SimError> {
    use redirect_action::{
        PathRewriteSpecifier as P, RedirectResponseCode as C, SchemeRewriteSpecifier as S,
    };
    let original_scheme = req.scheme();
    let scheme = match &rd.scheme_rewrite_specifier {
        Some(S::HttpsRedirect(true)) => "https".to_string(),
        Some(S::SchemeRedirect(s)) if !s.is_empty() => s.clone(),
        _ => original_scheme.to_string(),
    };
    let authority = req.authority();
    let host = if rd.host_redirect.is_empty() {
        strip_port(&authority).to_string()
    } else {
        rd.host_redirect.clone()
    };
    let port = if rd.port_redirect != 0 {
        Some(rd.port_redirect)
    } else if scheme != original_scheme || !rd.host_redirect.is_empty() {
        None
    } else {
        (authority != strip_port(&authority)).then_some(u32::from(req.port))
    };
    let (path_only, query) = match req.path.split_once('?') {
        Some((p, q)) => (p, format!("?{q}")),
        None => (req.path.as_str(), String::new()),
    };
    let query = if rd.strip_query { String::new() } else { query };
    let path = match &rd.path_rewrite_specifier {
        Some(P::PathRedirect(p)) if !p.is_empty() => {
            if p.contains('?') {
                p.clone()
            } else {
                format!("{p}{query}")
            }
        }
        Some(P::PrefixRewrite(new_prefix)) => {
            let old = match &m.path_specifier {
                Some(route_match::PathSpecifier::Prefix(p)) => p.as_str(),
                _ => "",
            };
            let rest = path_only.get(old.len()..).unwrap_or("");
            format!("{new_prefix}{rest}{query}")
        }
        Some(P::RegexRewrite(rr)) => format!("{}{query}", regex_rewrite(rr, path_only)?),
        _ => format!("{path_only}{query}"),
    };
    let code = match C::try_from(rd.response_code).unwrap_or(C::MovedPermanently) {
        C::MovedPermanently => 301,
        C::Found => 302,
        C::SeeOther => 303,
        C::TemporaryRedirect => 307,
        C::PermanentRedirect => 308,
    };
    Ok(RouteOutcome::Redirect {
        scheme,
        host,
        port,
        path,
        code,
    })
}

/// Applies an Envoy `RegexMatchAndSubstitute` (RE2 `\N` group references) to `value`.
pub fn regex_rewrite(rr: &RegexMatchAndSubstitute, value: &str) -> Result<String, SimError> {
    let pattern = rr.pattern.as_ref().map_or("", |p| p.regex.as_str());
    let re = Regex::new(pattern)
        .map_err(|e| SimError::InvalidRegex(pattern.to_string(), e.to_string()))?;
    // RE2 writes group references as \1; the regex crate as ${1}.
    let substitution = Regex::new(r"\\(\d)")
        .expect("static regex")
        .replace_all(&rr.substitution.replace('$', "$$"), "$${$1}")
        .into_owned();
    Ok(re.replace_all(value, substitution.as_str()).into_owned())
}

// ---------------------------------------------------------------------------------
// Consistency

/// Problems Envoy would have with one proxy's resources, sorted: clusters referenced by
/// routes or listeners that CDS did not send, RDS names referenced by listeners that
/// were not sent, EDS clusters whose load assignment (`service_name`, else the cluster
/// name) is not in `eds_names`, and duplicate cluster, route table, virtual host names
/// or domains.
pub fn check_consistency(
    clusters: &[Cluster],
    listeners: &[Listener],
    routes: &[RouteConfiguration],
    eds_names: &BTreeSet<String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut cluster_names: HashSet<&str> = HashSet::new();
    for c in clusters {
        if !cluster_names.insert(&c.name) {
            problems.push(format!("cluster {}: sent twice", c.name));
        }
        let eds = c.cluster_discovery_type
            == Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::Eds as i32,
            ));
        if eds {
            let service = c
                .eds_cluster_config
                .as_ref()
                .map(|e| e.service_name.as_str())
                .filter(|s| !s.is_empty())
                .unwrap_or(&c.name);
            if !eds_names.contains(service) {
                problems.push(format!(
                    "cluster {}: EDS load assignment {service} is not served",
                    c.name
                ));
            }
        }
    }
    let mut route_names: HashSet<&str> = HashSet::new();
    for rc in routes {
        if !route_names.insert(&rc.name) {
            problems.push(format!("route {}: sent twice", rc.name));
        }
        check_route_config(
            rc,
            &format!("route {}", rc.name),
            &cluster_names,
            &mut problems,
        );
    }
    for l in listeners {
        let chains = l.filter_chains.iter().chain(l.default_filter_chain.iter());
        for chain in chains {
            check_filter_chain(l, chain, &cluster_names, &route_names, &mut problems);
        }
        if let Some(api) = l
            .api_listener
            .as_ref()
            .and_then(|a| a.api_listener.as_ref())
        {
            check_network_filter(&l.name, api, &cluster_names, &route_names, &mut problems);
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

fn check_route_config(
    rc: &RouteConfiguration,
    what: &str,
    clusters: &HashSet<&str>,
    problems: &mut Vec<String>,
) {
    let mut vh_names = HashSet::new();
    let mut domains = HashSet::new();
    for vh in &rc.virtual_hosts {
        if !vh_names.insert(vh.name.as_str()) {
            problems.push(format!("{what}: duplicate virtual host {}", vh.name));
        }
        for d in &vh.domains {
            if !domains.insert(d.to_ascii_lowercase()) {
                problems.push(format!(
                    "{what}: domain {d} of virtual host {} is used twice",
                    vh.name
                ));
            }
        }
    }
    for c in referenced_clusters(rc) {
        if !clusters.contains(c.as_str()) {
            problems.push(format!("{what}: cluster {c} is not in CDS"));
        }
    }
}

fn check_filter_chain(
    l: &Listener,
    chain: &FilterChain,
    clusters: &HashSet<&str>,
    route_names: &HashSet<&str>,
    problems: &mut Vec<String>,
) {
    for f in &chain.filters {
        if let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type {
            check_network_filter(&l.name, any, clusters, route_names, problems);
        }
    }
}

fn check_network_filter(
    listener: &str,
    any: &Any,
    clusters: &HashSet<&str>,
    route_names: &HashSet<&str>,
    problems: &mut Vec<String>,
) {
    if any.type_url == HttpConnectionManager::type_url() {
        let Ok(hcm) = HttpConnectionManager::decode(any.value.as_slice()) else {
            problems.push(format!(
                "listener {listener}: undecodable HTTP connection manager"
            ));
            return;
        };
        match &hcm.route_specifier {
            Some(http_connection_manager::RouteSpecifier::Rds(rds))
                if !route_names.contains(rds.route_config_name.as_str()) =>
            {
                problems.push(format!(
                    "listener {listener}: RDS route {} is not served",
                    rds.route_config_name
                ));
            }
            Some(http_connection_manager::RouteSpecifier::RouteConfig(rc)) => {
                check_route_config(rc, &format!("listener {listener}"), clusters, problems);
            }
            _ => {}
        }
    } else if any.type_url == TcpProxy::type_url() {
        let Ok(tcp) = TcpProxy::decode(any.value.as_slice()) else {
            problems.push(format!("listener {listener}: undecodable TCP proxy"));
            return;
        };
        let names: Vec<&str> = match &tcp.cluster_specifier {
            Some(tcp_proxy::ClusterSpecifier::Cluster(c)) => vec![c.as_str()],
            Some(tcp_proxy::ClusterSpecifier::WeightedClusters(w)) => {
                w.clusters.iter().map(|c| c.name.as_str()).collect()
            }
            None => Vec::new(),
        };
        for c in names {
            if !clusters.contains(c) {
                problems.push(format!("listener {listener}: cluster {c} is not in CDS"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::EdsClusterConfig;
    use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Filter};
    use envoy_types::pb::envoy::config::route::v3::{
        RouteAction, WeightedCluster, weighted_cluster,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::Rds;
    use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};

    use super::*;

    fn to(cluster: &str) -> Option<route::Action> {
        Some(route::Action::Route(RouteAction {
            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster.into())),
            ..Default::default()
        }))
    }

    fn prefix(p: &str) -> RouteMatch {
        RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix(p.into())),
            ..Default::default()
        }
    }

    fn vh(name: &str, domains: &[&str], routes: Vec<Route>) -> VirtualHost {
        VirtualHost {
            name: name.into(),
            domains: domains.iter().map(|d| d.to_string()).collect(),
            routes,
            ..Default::default()
        }
    }

    fn rt(name: &str, m: RouteMatch, cluster: &str) -> Route {
        Route {
            name: name.into(),
            r#match: Some(m),
            action: to(cluster),
            ..Default::default()
        }
    }

    fn table(vhs: Vec<VirtualHost>) -> RouteConfiguration {
        RouteConfiguration {
            name: "80".into(),
            virtual_hosts: vhs,
            ..Default::default()
        }
    }

    fn cluster_of(config: &RouteConfiguration, req: &Request) -> String {
        match route(config, req) {
            Ok(RouteOutcome::Cluster(c)) => c,
            other => panic!("expected a cluster for {req:?}, got {other:?}"),
        }
    }

    #[test]
    fn virtual_host_selection_follows_envoy_precedence() {
        let config = table(vec![
            vh("default", &["*"], vec![rt("r", prefix("/"), "any")]),
            vh(
                "exact",
                &["api.example.com"],
                vec![rt("r", prefix("/"), "exact")],
            ),
            vh(
                "suffix",
                &["*.example.com"],
                vec![rt("r", prefix("/"), "suffix")],
            ),
            vh(
                "longer",
                &["*.v1.example.com"],
                vec![rt("r", prefix("/"), "longer")],
            ),
            vh(
                "prefix",
                &["internal.*"],
                vec![rt("r", prefix("/"), "prefix")],
            ),
            vh("port", &["svc:8080"], vec![rt("r", prefix("/"), "port")]),
        ]);
        let c = |host: &str, port: u16| cluster_of(&config, &Request::new(host, port, "/"));
        assert_eq!(c("api.example.com", 80), "exact");
        assert_eq!(c("API.Example.com", 80), "exact", "case-insensitive");
        assert_eq!(c("x.example.com", 80), "suffix");
        assert_eq!(c("a.v1.example.com", 80), "longer", "longest suffix wins");
        assert_eq!(c("internal.corp", 80), "prefix");
        assert_eq!(c("svc", 8080), "port");
        assert_eq!(c("svc", 80), "any", "port is part of the authority");
        assert_eq!(
            c("example.com", 80),
            "any",
            "a wildcard stands for something"
        );
        assert_eq!(
            c("api.example.com", 8080),
            "any",
            "the port is part of the authority: api.example.com:8080 matches neither"
        );

        let mut ignoring = config.clone();
        ignoring.ignore_port_in_host_matching = true;
        assert_eq!(
            cluster_of(&ignoring, &Request::new("api.example.com", 8080, "/")),
            "exact"
        );
        let none = table(vec![vh("only", &["a"], vec![])]);
        assert_eq!(
            route(&none, &Request::new("b", 80, "/")),
            Err(SimError::NoVirtualHost("b".into()))
        );
        assert_eq!(
            route(&none, &Request::new("a", 80, "/")),
            Err(SimError::NoRoute("only".into()))
        );
    }

    #[test]
    fn path_matchers_and_case() {
        let regex = RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::SafeRegex(RegexMatcher {
                regex: "/re+gex/[0-9]+".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let exact = RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Path("/exact".into())),
            case_sensitive: Some(BoolValue { value: false }),
            ..Default::default()
        };
        let sep = RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::PathSeparatedPrefix(
                "/dir".into(),
            )),
            ..Default::default()
        };
        let config = table(vec![vh(
            "h",
            &["*"],
            vec![
                rt("regex", regex, "regex"),
                rt("exact", exact, "exact"),
                rt("sep", sep, "sep"),
                rt("prefix", prefix("/pre"), "prefix"),
            ],
        )]);
        let c = |path: &str| route(&config, &Request::new("h", 80, path));
        assert_eq!(
            c("/reeegex/42?x=1"),
            Ok(RouteOutcome::Cluster("regex".into()))
        );
        assert_eq!(
            c("/x/regex/42"),
            Err(SimError::NoRoute("h".into())),
            "regexes match the whole path"
        );
        assert_eq!(c("/EXACT"), Ok(RouteOutcome::Cluster("exact".into())));
        assert_eq!(c("/dir/a"), Ok(RouteOutcome::Cluster("sep".into())));
        assert_eq!(c("/dir"), Ok(RouteOutcome::Cluster("sep".into())));
        assert_eq!(c("/directory"), Err(SimError::NoRoute("h".into())));
        assert_eq!(c("/prefixed"), Ok(RouteOutcome::Cluster("prefix".into())));
        assert_eq!(c("/PREfixed"), Err(SimError::NoRoute("h".into())));
    }

    #[test]
    fn header_and_query_matchers() {
        let exact = |v: &str| {
            Some(header_matcher::HeaderMatchSpecifier::StringMatch(
                StringMatcher {
                    match_pattern: Some(string_matcher::MatchPattern::Exact(v.into())),
                    ..Default::default()
                },
            ))
        };
        let mut m = prefix("/");
        m.headers = vec![
            HeaderMatcher {
                name: "end-user".into(),
                header_match_specifier: exact("jason"),
                ..Default::default()
            },
            HeaderMatcher {
                name: "x-canary".into(),
                header_match_specifier: exact("no"),
                invert_match: true,
                treat_missing_header_as_empty: true,
            },
            HeaderMatcher {
                name: ":method".into(),
                header_match_specifier: exact("POST"),
                ..Default::default()
            },
        ];
        m.query_parameters = vec![QueryParameterMatcher {
            name: "debug".into(),
            query_parameter_match_specifier: Some(
                query_parameter_matcher::QueryParameterMatchSpecifier::PresentMatch(true),
            ),
        }];
        let config = table(vec![vh("h", &["*"], vec![rt("m", m, "matched")])]);
        let ok = Request::new("h", 80, "/?debug")
            .method("POST")
            .header("End-User", "jason");
        assert_eq!(cluster_of(&config, &ok), "matched");
        assert!(route(&config, &ok.clone().header("x-canary", "no")).is_err());
        assert!(
            route(&config, &ok.clone().header("x-canary", "yes")).is_ok(),
            "an inverted matcher matches other values"
        );
        assert!(route(&config, &ok.clone().method("GET")).is_err());
        assert!(
            route(
                &config,
                &Request {
                    path: "/".into(),
                    ..ok.clone()
                }
            )
            .is_err()
        );
        let mut no_user = ok.clone();
        no_user.headers.clear();
        assert!(route(&config, &no_user).is_err());
    }

    #[test]
    fn redirects_and_required_tls() {
        let rd = RedirectAction {
            host_redirect: "new.example.com".into(),
            path_rewrite_specifier: Some(redirect_action::PathRewriteSpecifier::PrefixRewrite(
                "/v2".into(),
            )),
            response_code: redirect_action::RedirectResponseCode::Found as i32,
            ..Default::default()
        };
        let mut secure = vh(
            "secure",
            &["secure.example.com"],
            vec![rt("r", prefix("/"), "c")],
        );
        secure.require_tls = virtual_host::TlsRequirementType::All as i32;
        let config = table(vec![
            vh(
                "h",
                &["old.example.com"],
                vec![Route {
                    name: "r".into(),
                    r#match: Some(prefix("/v1")),
                    action: Some(route::Action::Redirect(rd)),
                    ..Default::default()
                }],
            ),
            secure,
        ]);
        assert_eq!(
            route(&config, &Request::new("old.example.com", 80, "/v1/a?q=1")),
            Ok(RouteOutcome::Redirect {
                scheme: "http".into(),
                host: "new.example.com".into(),
                port: None,
                path: "/v2/a?q=1".into(),
                code: 302,
            })
        );
        assert_eq!(
            route(&config, &Request::new("secure.example.com", 80, "/x")),
            Ok(RouteOutcome::Redirect {
                scheme: "https".into(),
                host: "secure.example.com".into(),
                port: None,
                path: "/x".into(),
                code: 301,
            })
        );
        assert_eq!(
            route(
                &config,
                &Request::new("secure.example.com", 443, "/x").tls()
            ),
            Ok(RouteOutcome::Cluster("c".into()))
        );
        let rr = RegexMatchAndSubstitute {
            pattern: Some(RegexMatcher {
                regex: "^/service/([^/]+)(/.*)$".into(),
                ..Default::default()
            }),
            substitution: "\\2/instance/\\1".into(),
        };
        assert_eq!(
            regex_rewrite(&rr, "/service/foo/v1/api").unwrap(),
            "/v1/api/instance/foo"
        );
    }

    fn eds_cluster(name: &str) -> Cluster {
        Cluster {
            name: name.into(),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::Eds as i32,
            )),
            eds_cluster_config: Some(EdsClusterConfig {
                service_name: name.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn hcm_listener(name: &str, rds: &str) -> Listener {
        let hcm = HttpConnectionManager {
            route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
                route_config_name: rds.into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        Listener {
            name: name.into(),
            filter_chains: vec![FilterChain {
                filters: vec![Filter {
                    name: "envoy.filters.network.http_connection_manager".into(),
                    config_type: Some(filter::ConfigType::TypedConfig(Any {
                        type_url: HttpConnectionManager::type_url(),
                        value: hcm.encode_to_vec(),
                    })),
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn consistency_problems_are_reported() {
        let clusters = vec![eds_cluster("outbound|80||a"), eds_cluster("outbound|80||b")];
        let tcp = TcpProxy {
            cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(
                "outbound|5432||db".into(),
            )),
            ..Default::default()
        };
        let mut tcp_listener = hcm_listener("0.0.0.0_5432", "unused");
        tcp_listener.filter_chains[0].filters[0].config_type =
            Some(filter::ConfigType::TypedConfig(Any {
                type_url: TcpProxy::type_url(),
                value: tcp.encode_to_vec(),
            }));
        let api = Listener {
            name: "api".into(),
            api_listener: Some(ApiListener {
                api_listener: hcm_listener("x", "missing-api")
                    .filter_chains
                    .remove(0)
                    .filters
                    .remove(0)
                    .config_type
                    .map(|c| match c {
                        filter::ConfigType::TypedConfig(a) => a,
                        _ => unreachable!(),
                    }),
            }),
            ..Default::default()
        };
        let listeners = vec![
            hcm_listener("0.0.0.0_80", "80"),
            hcm_listener("0.0.0.0_81", "81"),
            tcp_listener,
            api,
        ];
        let weighted = Route {
            name: "w".into(),
            r#match: Some(prefix("/")),
            action: Some(route::Action::Route(RouteAction {
                cluster_specifier: Some(route_action::ClusterSpecifier::WeightedClusters(
                    WeightedCluster {
                        clusters: vec![weighted_cluster::ClusterWeight {
                            name: "outbound|80|v9|a".into(),
                            weight: Some(UInt32Value { value: 100 }),
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                )),
                ..Default::default()
            })),
            ..Default::default()
        };
        let routes = vec![table(vec![
            vh(
                "a",
                &["a", "shared"],
                vec![rt("r", prefix("/"), "outbound|80||a")],
            ),
            vh("b", &["SHARED"], vec![weighted]),
            vh("b", &["b"], vec![]),
        ])];
        let eds: BTreeSet<String> = ["outbound|80||a".to_string()].into();
        let problems = check_consistency(&clusters, &listeners, &routes, &eds);
        assert_eq!(
            problems,
            vec![
                "cluster outbound|80||b: EDS load assignment outbound|80||b is not served",
                "listener 0.0.0.0_5432: cluster outbound|5432||db is not in CDS",
                "listener 0.0.0.0_81: RDS route 81 is not served",
                "listener api: RDS route missing-api is not served",
                "route 80: cluster outbound|80|v9|a is not in CDS",
                "route 80: domain SHARED of virtual host b is used twice",
                "route 80: duplicate virtual host b",
            ]
        );
        let eds_all: BTreeSet<String> =
            ["outbound|80||a".to_string(), "outbound|80||b".to_string()].into();
        assert_eq!(
            check_consistency(
                &clusters,
                &listeners[..1],
                &[table(vec![vh(
                    "a",
                    &["a"],
                    vec![rt("r", prefix("/"), "outbound|80||a")]
                )])],
                &eds_all
            ),
            Vec::<String>::new()
        );
    }
}

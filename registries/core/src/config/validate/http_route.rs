//! The HTTP rules of a VirtualService (Istio's `validateHTTPRoute`): what a rule may
//! combine, matches, header manipulation, CORS, faults, mirrors, redirects, direct
//! responses, retries, rewrites and the delegate rules.

use meshfed_api::networking::v1alpha3 as net;
use net::http_fault_injection::{abort::ErrorType, delay::HttpDelayType};
use net::string_match::MatchType;

use super::common::{
    check_duration, is_dns1123_label, is_dns1123_subdomain, validate_duration,
    validate_header_name, validate_labels, validate_match_header_name, validate_percent,
    validate_percentage, validate_port,
};
use super::regex::validate_re2;
use super::route_common::{
    validate_destination, validate_gateway_names, validate_route_destinations,
};
use super::{FieldPath, Findings};

/// Retry conditions Envoy knows (`x-envoy-retry-on`, `x-envoy-retry-grpc-on`).
const RETRY_ON: &[&str] = &[
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "retriable-headers",
    "envoy-ratelimited",
    "http3-post-connect-failure",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];

const HTTP_METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE",
];

/// gRPC status codes by name, in code order (the names Istio accepts in
/// `abort.grpcStatus`): the validator checks names against it, the route generator
/// translates them with [`grpc_status_code`].
pub const GRPC_STATUSES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The code of a gRPC status name (`UNAVAILABLE` -> 14); `None` for another name.
pub fn grpc_status_code(name: &str) -> Option<u32> {
    GRPC_STATUSES
        .iter()
        .position(|n| *n == name)
        .map(|code| code as u32)
}

/// Header-name prefix of JWT claim based routing (gateways only).
const JWT_CLAIM_PREFIX: &str = "@request.auth.claims";

/// The claim path of a header-match key that routes on a JWT claim (Istio's
/// `jwt.ToRoutingClaim`): `@request.auth.claims.a.b` or `@request.auth.claims[a][b]`
/// (the prefix in any case) gives `[a, b]`; `None` for other keys and for a key with
/// an empty claim name.
pub fn jwt_routing_claim(name: &str) -> Option<Vec<&str>> {
    let prefix = name.get(..JWT_CLAIM_PREFIX.len())?;
    if !prefix.eq_ignore_ascii_case(JWT_CLAIM_PREFIX) {
        return None;
    }
    let rest = &name[JWT_CLAIM_PREFIX.len()..];
    let claims: Vec<&str> = if let Some(dotted) = rest.strip_prefix('.') {
        dotted.split('.').collect()
    } else if let Some(inner) = rest.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        inner.split("][").collect()
    } else {
        return None;
    };
    (!claims.iter().any(|c| c.is_empty())).then_some(claims)
}

/// What an HTTP rule is, for the delegate rules.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum RouteType {
    /// A rule of an ordinary VirtualService.
    Independent,
    /// A rule that hands matching requests to a delegate VirtualService.
    Root,
    /// A rule of a delegate VirtualService (one without hosts).
    Delegate,
}

pub(super) fn validate_http_route(
    f: &mut Findings,
    at: &FieldPath,
    http: &net::HttpRoute,
    route_type: RouteType,
    applies_to_gateway: bool,
) {
    validate_http_route_conflicts(f, at, http, route_type);
    for (j, m) in http.r#match.iter().enumerate() {
        validate_http_match(
            f,
            &at.field("match").index(j),
            m,
            route_type,
            applies_to_gateway,
        );
    }
    validate_header_operations(f, &at.field("headers"), http.headers.as_ref());
    if let Some(cors) = &http.cors_policy {
        validate_cors(f, &at.field("corsPolicy"), cors);
    }
    if let Some(fault) = &http.fault {
        validate_fault(f, &at.field("fault"), fault);
    }
    if let Some(percent) = http.mirror_percent {
        let here = at.field("mirrorPercent");
        if percent.value > 100 {
            f.error(
                &here,
                format!(
                    "mirror_percent must have a max value of 100 (it has {})",
                    percent.value
                ),
            );
        }
        f.warn(
            &here,
            "using deprecated setting \"mirrorPercent\", use \"mirrorPercentage\" instead",
        );
    }
    if let Some(p) = &http.mirror_percentage {
        validate_mirror_percentage(f, &at.field("mirrorPercentage"), p.value);
    }
    if let Some(mirror) = &http.mirror {
        validate_destination(f, &at.field("mirror"), mirror);
    }
    for (k, mirror) in http.mirrors.iter().enumerate() {
        let here = at.field("mirrors").index(k);
        match &mirror.destination {
            None => f.error(
                &here.field("destination"),
                "destination is required for mirrors",
            ),
            Some(d) => validate_destination(f, &here.field("destination"), d),
        }
        if let Some(p) = &mirror.percentage {
            validate_mirror_percentage(f, &here.field("percentage"), p.value);
        }
    }
    if let Some(redirect) = &http.redirect {
        validate_redirect(f, &at.field("redirect"), redirect);
    }
    if let Some(direct) = &http.direct_response {
        validate_direct_response(f, &at.field("directResponse"), direct);
    }
    if let Some(retries) = &http.retries {
        validate_retries(f, &at.field("retries"), retries);
    }
    if let Some(rewrite) = &http.rewrite {
        validate_rewrite(f, &at.field("rewrite"), rewrite);
    }
    validate_authority_rewrite(f, at, http);
    if let Some(delegate) = &http.delegate {
        let here = at.field("delegate");
        if delegate.name.is_empty() {
            f.error(&here.field("name"), "delegate name is required");
        } else if !is_dns1123_subdomain(&delegate.name) {
            f.error(
                &here.field("name"),
                format!("invalid delegate name {:?}", delegate.name),
            );
        }
        if !delegate.namespace.is_empty() && !is_dns1123_label(&delegate.namespace) {
            f.error(
                &here.field("namespace"),
                format!("invalid delegate namespace {:?}", delegate.namespace),
            );
        }
    }
    let destinations: Vec<(Option<&net::Destination>, i32)> = http
        .route
        .iter()
        .map(|r| (r.destination.as_ref(), r.weight))
        .collect();
    validate_route_destinations(f, &at.field("route"), &destinations);
    for (k, r) in http.route.iter().enumerate() {
        validate_header_operations(
            f,
            &at.field("route").index(k).field("headers"),
            r.headers.as_ref(),
        );
    }
    check_duration(f, &at.field("timeout"), http.timeout.as_ref());
}

/// What a rule may combine: a root rule only delegates; redirect, direct response and
/// route exclude each other; something must answer the request.
fn validate_http_route_conflicts(
    f: &mut Findings,
    at: &FieldPath,
    http: &net::HttpRoute,
    route_type: RouteType,
) {
    if route_type == RouteType::Root {
        if http.redirect.is_some() {
            f.error(
                &at.field("redirect"),
                "root HTTP route (with delegate) must not specify redirect",
            );
        }
        if !http.route.is_empty() {
            f.error(
                &at.field("route"),
                "root HTTP route (with delegate) must not specify route",
            );
        }
        if http.direct_response.is_some() {
            f.error(
                &at.field("directResponse"),
                "root HTTP route (with delegate) must not specify directResponse",
            );
        }
        return;
    }
    if route_type == RouteType::Delegate && http.delegate.is_some() {
        f.error(
            &at.field("delegate"),
            "delegate HTTP route cannot contain delegate",
        );
    }
    if http.redirect.is_some() {
        if !http.route.is_empty() {
            f.error(
                &at.field("redirect"),
                "HTTP route cannot contain both route and redirect",
            );
        }
        if http.fault.is_some() {
            f.error(
                &at.field("fault"),
                "HTTP route cannot contain both fault and redirect",
            );
        }
        if http.rewrite.is_some() {
            f.error(
                &at.field("rewrite"),
                "HTTP route rule cannot contain both rewrite and redirect",
            );
        }
    }
    if http.direct_response.is_some() {
        let here = at.field("directResponse");
        if !http.route.is_empty() {
            f.error(
                &here,
                "HTTP route cannot contain both route and directResponse",
            );
        }
        if http.redirect.is_some() {
            f.error(
                &here,
                "HTTP route cannot contain both redirect and directResponse",
            );
        }
        if http.fault.is_some() {
            f.error(
                &here,
                "HTTP route cannot contain both fault and directResponse",
            );
        }
        if http.rewrite.is_some() {
            f.error(
                &here,
                "HTTP route cannot contain both rewrite and directResponse",
            );
        }
        if http.mirror.is_some() || !http.mirrors.is_empty() {
            f.error(
                &here,
                "HTTP route cannot contain both mirror and directResponse",
            );
        }
    }
    if http.redirect.is_none() && http.direct_response.is_none() && http.route.is_empty() {
        f.error(at, "HTTP route, redirect or directResponse is required");
    }
}

fn validate_http_match(
    f: &mut Findings,
    at: &FieldPath,
    m: &net::HttpMatchRequest,
    route_type: RouteType,
    applies_to_gateway: bool,
) {
    let delegating = route_type != RouteType::Independent;
    let single = [
        ("uri", m.uri.as_ref()),
        ("scheme", m.scheme.as_ref()),
        ("method", m.method.as_ref()),
        ("authority", m.authority.as_ref()),
    ];
    for (field, sm) in single {
        if let Some(sm) = sm {
            validate_string_match(f, &at.field(field), sm, delegating);
        }
    }
    let maps = [
        ("headers", &m.headers),
        ("queryParams", &m.query_params),
        ("withoutHeaders", &m.without_headers),
    ];
    for (field, map) in maps {
        for (name, sm) in map {
            let here = at.field(field).key(name);
            if field != "queryParams" {
                // Istio checks the prefix as written for the gateway rule, and the
                // claim syntax (prefix in any case) before the header-name rule.
                if name.starts_with(JWT_CLAIM_PREFIX) && !applies_to_gateway {
                    f.error(
                        &here,
                        format!(
                            "JWT claim based routing (key: {name}) is only supported for gateways"
                        ),
                    );
                }
                if jwt_routing_claim(name).is_none() {
                    f.check(&here, validate_match_header_name(name));
                }
            }
            validate_string_match(f, &here, sm, delegating);
        }
    }
    if m.port != 0 {
        f.check(&at.field("port"), validate_port(m.port));
    }
    validate_labels(f, &at.field("sourceLabels"), &m.source_labels);
    validate_gateway_names(f, &at.field("gateways"), &m.gateways);
    if !m.source_namespace.is_empty() && !is_dns1123_label(&m.source_namespace) {
        f.error(
            &at.field("sourceNamespace"),
            format!("sourceNamespace match {} is invalid", m.source_namespace),
        );
    }
}

/// A StringMatch: regexes must compile; delegation does not support regexes.
fn validate_string_match(
    f: &mut Findings,
    at: &FieldPath,
    sm: &net::StringMatch,
    delegating: bool,
) {
    if let Some(MatchType::Regex(re)) = &sm.match_type {
        let here = at.field("regex");
        if delegating {
            f.error(&here, "regex match is not supported for delegating");
        } else {
            f.check(&here, validate_re2(re));
        }
    }
}

/// Header manipulation: names must be settable (no pseudo headers, Host only through
/// the authority), values must be valid Envoy header values.
fn validate_header_operations(f: &mut Findings, at: &FieldPath, headers: Option<&net::Headers>) {
    let Some(headers) = headers else { return };
    if let Some(request) = &headers.request {
        let here = at.field("request");
        for (field, map) in [("set", &request.set), ("add", &request.add)] {
            for (name, value) in map {
                let there = here.field(field).key(name);
                f.check(&there, header_with_authority_operation_name(name));
                f.check(&there, validate_header_value(value));
            }
        }
        for (i, name) in request.remove.iter().enumerate() {
            f.check(&here.field("remove").index(i), header_operation_name(name));
        }
    }
    if let Some(response) = &headers.response {
        let here = at.field("response");
        for (field, map) in [("set", &response.set), ("add", &response.add)] {
            for (name, value) in map {
                let there = here.field(field).key(name);
                f.check(&there, header_operation_name(name));
                f.check(&there, validate_header_value(value));
            }
        }
        for (i, name) in response.remove.iter().enumerate() {
            f.check(&here.field("remove").index(i), header_operation_name(name));
        }
    }
}

fn is_internal_header(name: &str) -> bool {
    name.starts_with(':') || name.eq_ignore_ascii_case("host")
}

fn is_authority_header(name: &str) -> bool {
    name.eq_ignore_ascii_case(":authority") || name.eq_ignore_ascii_case("host")
}

fn header_with_authority_operation_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("header name cannot be empty".to_string());
    }
    if is_internal_header(name) && !is_authority_header(name) {
        return Err(format!(
            "invalid header {name:?}: header cannot have \":\" prefix"
        ));
    }
    if name.eq_ignore_ascii_case(":authority") {
        return Ok(());
    }
    // Istio stops here; Envoy refuses a name that is not a token.
    validate_header_name(name)
}

fn header_operation_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("header name cannot be empty".to_string());
    }
    if name.eq_ignore_ascii_case("host") {
        return Err(format!("invalid header {name:?}: cannot set Host header"));
    }
    if is_internal_header(name) {
        return Err(format!(
            "invalid header {name:?}: header cannot have \":\" prefix"
        ));
    }
    validate_header_name(name)
}

/// An Envoy header value: no control characters, and every `%` either doubled (`%%`)
/// or opening a `%VARIABLE%` that is closed.
fn validate_header_value(value: &str) -> Result<(), String> {
    if value
        .chars()
        .any(|c| (c < ' ' && c != '\t') || c == '\u{7f}')
    {
        return Err(format!(
            "header value configuration {value:?} is invalid: control characters are not allowed"
        ));
    }
    let mut rest = value;
    while let Some(pos) = rest.find('%') {
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('%') {
            rest = tail;
            continue;
        }
        match after.find('%') {
            Some(end) if end > 0 => rest = &after[end + 1..],
            _ => {
                return Err(format!(
                    "header value configuration {value:?} is invalid: unterminated %VARIABLE% (write %% for a literal %)"
                ));
            }
        }
    }
    Ok(())
}

/// Rewriting the authority is allowed in one place only.
fn validate_authority_rewrite(f: &mut Findings, at: &FieldPath, http: &net::HttpRoute) {
    let mut current = http
        .rewrite
        .as_ref()
        .map(|r| r.authority.clone())
        .unwrap_or_default();
    let Some(request) = http.headers.as_ref().and_then(|h| h.request.as_ref()) else {
        return;
    };
    for (field, map) in [("set", &request.set), ("add", &request.add)] {
        for (name, value) in map {
            if !is_authority_header(name) {
                continue;
            }
            if !current.is_empty() {
                f.error(
                    &at.field("headers").field("request").field(field).key(name),
                    format!(
                        "authority header cannot be set multiple times: have {current:?}, attempting to set {value:?}"
                    ),
                );
            }
            current = value.clone();
        }
    }
}

fn validate_cors(f: &mut Findings, at: &FieldPath, cors: &net::CorsPolicy) {
    for (i, origin) in cors.allow_origins.iter().enumerate() {
        let here = at.field("allowOrigins").index(i);
        let value = match &origin.match_type {
            Some(MatchType::Exact(v) | MatchType::Prefix(v) | MatchType::Regex(v)) => v.as_str(),
            None => "",
        };
        if value.is_empty() {
            f.error(
                &here,
                "an allowOrigins entry needs a non-empty exact, prefix or regex",
            );
        } else if let Some(MatchType::Regex(re)) = &origin.match_type {
            f.check(&here.field("regex"), validate_re2(re));
        }
    }
    for (i, method) in cors.allow_methods.iter().enumerate() {
        if !HTTP_METHODS.contains(&method.as_str()) {
            f.error(
                &at.field("allowMethods").index(i),
                format!("{method:?} is not a supported HTTP method"),
            );
        }
    }
    for (field, names) in [
        ("allowHeaders", &cors.allow_headers),
        ("exposeHeaders", &cors.expose_headers),
    ] {
        for (i, name) in names.iter().enumerate() {
            if name != "*" {
                f.check(&at.field(field).index(i), validate_header_name(name));
            }
        }
    }
    if let Some(max_age) = &cors.max_age {
        let here = at.field("maxAge");
        f.check(&here, validate_duration(max_age));
        if max_age.nanos != 0 {
            f.error(
                &here,
                "max_age duration is accurate only to seconds precision",
            );
        }
    }
}

fn validate_fault(f: &mut Findings, at: &FieldPath, fault: &net::HttpFaultInjection) {
    if fault.abort.is_none() && fault.delay.is_none() {
        f.error(at, "HTTP fault injection must have an abort and/or a delay");
    }
    if let Some(abort) = &fault.abort {
        let here = at.field("abort");
        if let Some(p) = &abort.percentage {
            f.check(&here.field("percentage"), validate_percentage(p.value));
        }
        match &abort.error_type {
            Some(ErrorType::HttpStatus(status)) => {
                if !(200..=599).contains(status) {
                    f.error(
                        &here.field("httpStatus"),
                        format!("HTTP status {status} is not in range 200-599"),
                    );
                }
            }
            Some(ErrorType::GrpcStatus(status)) => {
                let known = GRPC_STATUSES.contains(&status.as_str())
                    || status.parse::<u8>().is_ok_and(|n| n <= 16);
                if !known {
                    f.error(
                        &here.field("grpcStatus"),
                        format!(
                            "gRPC status {status:?} is not supported; use a name such as NOT_FOUND or UNAVAILABLE"
                        ),
                    );
                }
            }
            Some(ErrorType::Http2Error(_)) => f.error(
                &here.field("http2Error"),
                "HTTP/2 abort fault injection not supported yet",
            ),
            None => f.warn(&here, "abort configured, but error type not set"),
        }
    }
    if let Some(delay) = &fault.delay {
        let here = at.field("delay");
        if let Some(p) = &delay.percentage {
            f.check(&here.field("percentage"), validate_percentage(p.value));
        }
        if delay.percent != 0 {
            f.check(&here.field("percent"), validate_percent(delay.percent));
            f.warn(
                &here.field("percent"),
                "using deprecated setting \"percent\", use \"percentage\" instead",
            );
        }
        match &delay.http_delay_type {
            Some(HttpDelayType::FixedDelay(d)) => {
                f.check(&here.field("fixedDelay"), validate_duration(d));
            }
            Some(HttpDelayType::ExponentialDelay(_)) => f.error(
                &here.field("exponentialDelay"),
                "exponentialDelay not supported yet",
            ),
            None => f.warn(
                &here,
                "delay configured without fixedDelay; it has no effect",
            ),
        }
    }
}

fn validate_mirror_percentage(f: &mut Findings, at: &FieldPath, value: f64) {
    if value > 100.0 {
        f.error(
            at,
            format!("mirror percentage must have a max value of 100 (it has {value})"),
        );
    }
    if value < 0.0 {
        f.error(
            at,
            format!("mirror percentage must have a min value of 0 (it has {value})"),
        );
    }
}

fn validate_redirect(f: &mut Findings, at: &FieldPath, redirect: &net::HttpRedirect) {
    use net::http_redirect::RedirectPort;
    if redirect.uri.is_empty()
        && redirect.authority.is_empty()
        && redirect.redirect_port.is_none()
        && redirect.scheme.is_empty()
    {
        f.error(at, "redirect must specify URI, authority, scheme, or port");
    }
    if redirect.redirect_code != 0 && !(300..=399).contains(&redirect.redirect_code) {
        f.error(
            &at.field("redirectCode"),
            format!(
                "{} is not a valid redirect code, must be 3xx",
                redirect.redirect_code
            ),
        );
    }
    if !redirect.scheme.is_empty() && redirect.scheme != "http" && redirect.scheme != "https" {
        f.error(
            &at.field("scheme"),
            "invalid redirect scheme, must be \"http\" or \"https\"",
        );
    }
    if let Some(RedirectPort::Port(port)) = redirect.redirect_port
        && port > 0
    {
        f.check(&at.field("port"), validate_port(port));
    }
}

fn validate_direct_response(f: &mut Findings, at: &FieldPath, direct: &net::HttpDirectResponse) {
    use net::http_body::Specifier;
    if let Some(body) = &direct.body {
        let size = match &body.specifier {
            Some(Specifier::String(s)) => s.len(),
            Some(Specifier::Bytes(b)) => b.len(),
            None => 0,
        };
        if size > 1024 * 1024 {
            f.error(
                &at.field("body"),
                "large direct_responses may impact control plane performance, must be less than 1MB",
            );
        } else if size > 100 * 1024 {
            f.warn(
                &at.field("body"),
                "large direct_responses may impact control plane performance",
            );
        }
    }
    if !(200..=599).contains(&direct.status) {
        f.error(
            &at.field("status"),
            format!("HTTP status {} is not in range 200-599", direct.status),
        );
    }
}

fn validate_retries(f: &mut Findings, at: &FieldPath, retries: &net::HttpRetry) {
    if retries.attempts < 0 {
        f.error(&at.field("attempts"), "attempts cannot be negative");
    }
    if retries.attempts == 0
        && (retries.per_try_timeout.is_some()
            || !retries.retry_on.is_empty()
            || retries.retry_remote_localities.is_some())
    {
        f.error(
            at,
            "http retry policy configured when attempts are set to 0 (disabled)",
        );
    }
    check_duration(
        f,
        &at.field("perTryTimeout"),
        retries.per_try_timeout.as_ref(),
    );
    if !retries.retry_on.is_empty() {
        for policy in retries.retry_on.split(',') {
            let status_code = policy
                .parse::<u16>()
                .is_ok_and(|n| (100..=599).contains(&n));
            if !status_code && !RETRY_ON.contains(&policy) {
                f.error(
                    &at.field("retryOn"),
                    format!("{policy:?} is not a valid retryOn policy"),
                );
            }
        }
    }
}

fn validate_rewrite(f: &mut Findings, at: &FieldPath, rewrite: &net::HttpRewrite) {
    if !rewrite.uri.is_empty() && rewrite.uri_regex_rewrite.is_some() {
        f.error(at, "rewrite may only contain one of URI or UriRegexRewrite");
    }
    if rewrite.uri.is_empty() && rewrite.uri_regex_rewrite.is_none() && rewrite.authority.is_empty()
    {
        f.error(
            at,
            "rewrite must specify at least one of URI, UriRegexRewrite, or authority",
        );
    }
    if let Some(re) = &rewrite.uri_regex_rewrite {
        let here = at.field("uriRegexRewrite");
        if re.r#match.is_empty() || re.rewrite.is_empty() {
            f.error(
                &here,
                "UriRegexRewrite requires both Rewrite and Match fields to be specified",
            );
        } else {
            f.check(&here.field("match"), validate_re2(&re.r#match));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Validation;
    use super::super::test_support::{assert_error, assert_ok, assert_warning, spec};
    use super::super::virtual_service::validate_virtual_service;
    use super::*;

    fn check(yaml: &str) -> Validation {
        validate_virtual_service("default", &spec::<net::VirtualService>(yaml))
    }

    #[test]
    fn matches() {
        let with_match = |m: &str| {
            check(&format!(
                "hosts: [a]\nhttp:\n- match: [{m}]\n  route: [{{destination: {{host: a}}}}]\n"
            ))
        };
        assert_error(
            &with_match("{uri: {regex: \"(unclosed\"}}"),
            "spec.http[0].match[0].uri.regex",
            "invalid regex",
        );
        assert_error(
            &with_match("{headers: {x-a: {regex: \"a(?=b)\"}}}"),
            "spec.http[0].match[0].headers[x-a].regex",
            "invalid regex",
        );
        assert_error(
            &with_match("{queryParams: {q: {regex: \"[\"}}}"),
            "spec.http[0].match[0].queryParams[q].regex",
            "invalid regex",
        );
        assert_error(
            &with_match("{headers: {\"bad header\": {exact: a}}}"),
            "spec.http[0].match[0].headers[bad header]",
            "not a valid header name",
        );
        assert_error(
            &with_match("{withoutHeaders: {\"x:y\": {exact: a}}}"),
            "spec.http[0].match[0].withoutHeaders[x:y]",
            "not a valid header name",
        );
        // Issue 15 finding 5: Envoy (RE2) refuses these, so validation must too.
        assert_error(
            &with_match("{uri: {regex: \"a{1001}\"}}"),
            "spec.http[0].match[0].uri.regex",
            "invalid repetition size: {1001}",
        );
        assert_ok(&with_match("{uri: {regex: \"a{1000}\"}}"));
        assert_error(
            &with_match("{authority: {regex: \"(x{10}){101}\"}}"),
            "spec.http[0].match[0].authority.regex",
            "nested repetition counts",
        );
        assert_error(
            // RE2 sizes this at 38004 instructions.
            &with_match(
                "{method: {regex: \"(abc|def|ghi|jkl|mno|pqr|stu|vwx|yza|bcd|efg|hij){1000}\"}}",
            ),
            "spec.http[0].match[0].method.regex",
            "program size",
        );
        assert_error(
            &with_match("{headers: {\"Bad Header:\": {exact: a}}}"),
            "spec.http[0].match[0].headers[Bad Header:]",
            "not a valid header name",
        );
        assert_ok(&with_match(
            "{headers: {\":authority\": {exact: a}, X-Upper.Case: {prefix: b}}}",
        ));
        assert_error(
            &with_match("{port: 70000}"),
            "spec.http[0].match[0].port",
            "1..65535",
        );
        assert_error(
            &with_match("{sourceNamespace: Not_A_Namespace}"),
            "spec.http[0].match[0].sourceNamespace",
            "invalid",
        );
        assert_error(
            &with_match("{headers: {\"@request.auth.claims.group\": {exact: a}}}"),
            "spec.http[0].match[0].headers[@request.auth.claims.group]",
            "only supported for gateways",
        );
        assert_error(
            &with_match("{sourceLabels: {app: \"a b\"}}"),
            "spec.http[0].match[0].sourceLabels[app]",
            "invalid label value",
        );
    }

    /// Istio's `TestToRoutingClaim` (`pkg/jwt/routing_test.go`).
    #[test]
    fn jwt_routing_claims_parse_as_istio_parses_them() {
        let cases: [(&str, Option<&[&str]>); 19] = [
            ("@request.auth.claims", None),
            ("@request.auth.claims-", None),
            ("request.auth.claims.", None),
            ("@request.auth.claims.", None),
            ("@request.auth.claims-abc", None),
            ("x-some-other-header", None),
            ("@request.auth.claims.key1", Some(&["key1"])),
            ("@request.auth.claims.key1.KEY2", Some(&["key1", "KEY2"])),
            ("@request.auth.claims.key1-key2", Some(&["key1-key2"])),
            ("@request.auth.claims[]", None),
            ("@request.auth.claims[key1", None),
            ("@request.auth.claims]key1", None),
            ("@request.auth.claims.[key1]", Some(&["[key1]"])),
            ("@request.auth.claims[key1]", Some(&["key1"])),
            ("@request.auth.claims[key1][key2]", Some(&["key1", "key2"])),
            ("@request.auth.claims[key1][KEY2]", Some(&["key1", "KEY2"])),
            ("@request.auth.claims[key1] [key2]", Some(&["key1] [key2"])),
            (
                "@request.auth.claims[test-issuer-2@istio.io]",
                Some(&["test-issuer-2@istio.io"]),
            ),
            (
                "@request.auth.claims[test-issuer-2@istio.io][key1]",
                Some(&["test-issuer-2@istio.io", "key1"]),
            ),
        ];
        for (name, want) in cases {
            assert_eq!(jwt_routing_claim(name).as_deref(), want, "{name}");
        }
        // The prefix in any case.
        assert_eq!(
            jwt_routing_claim("@Request.Auth.Claims[group]").as_deref(),
            Some(&["group"][..])
        );
    }

    #[test]
    fn jwt_claim_keys_are_accepted_on_gateways_and_malformed_ones_refused() {
        let on_gateway = |m: &str| {
            check(&format!(
                "hosts: [a.example.com]\ngateways: [gw, mesh]\nhttp:\n- match: [{m}]\n  route: [{{destination: {{host: a}}}}]\n"
            ))
        };
        for key in [
            "@request.auth.claims.group",
            "@request.auth.claims[nested][key]",
            "@Request.Auth.Claims.group",
        ] {
            assert_ok(&on_gateway(&format!(
                "{{headers: {{\"{key}\": {{exact: a}}}}}}"
            )));
            assert_ok(&on_gateway(&format!(
                "{{withoutHeaders: {{\"{key}\": {{exact: a}}}}}}"
            )));
        }
        for key in [
            "@request.auth.claims.",
            "@request.auth.claims[]",
            "@request.auth.claims[a",
        ] {
            assert_error(
                &on_gateway(&format!("{{headers: {{\"{key}\": {{exact: a}}}}}}")),
                &format!("spec.http[0].match[0].headers[{key}]"),
                "header name",
            );
        }
    }

    #[test]
    fn timeouts_retries_and_faults() {
        let rule = |extra: &str| {
            check(&format!(
                "hosts: [a]\nhttp:\n- route: [{{destination: {{host: a}}}}]\n  {extra}\n"
            ))
        };
        assert_error(&rule("timeout: 0s"), "spec.http[0].timeout", "at least 1ms");
        assert_error(
            &rule("timeout: -1s"),
            "spec.http[0].timeout",
            "at least 1ms",
        );
        assert_error(
            &rule("timeout: 1.5ms"),
            "spec.http[0].timeout",
            "ms precision",
        );
        assert_error(
            &rule("retries: {attempts: 2, perTryTimeout: 0s}"),
            "spec.http[0].retries.perTryTimeout",
            "at least 1ms",
        );
        assert_error(
            &rule("retries: {attempts: -1}"),
            "spec.http[0].retries.attempts",
            "cannot be negative",
        );
        assert_error(
            &rule("retries: {attempts: 0, retryOn: 5xx}"),
            "spec.http[0].retries",
            "attempts are set to 0",
        );
        assert_error(
            &rule("retries: {attempts: 1, retryOn: \"5xx,sometimes\"}"),
            "spec.http[0].retries.retryOn",
            "\"sometimes\" is not a valid retryOn policy",
        );
        assert_error(
            &rule("fault: {}"),
            "spec.http[0].fault",
            "abort and/or a delay",
        );
        assert_error(
            &rule("fault: {abort: {httpStatus: 600, percentage: {value: 10}}}"),
            "spec.http[0].fault.abort.httpStatus",
            "not in range 200-599",
        );
        assert_error(
            &rule("fault: {abort: {httpStatus: 199}}"),
            "spec.http[0].fault.abort.httpStatus",
            "not in range 200-599",
        );
        assert_error(
            &rule("fault: {abort: {httpStatus: 503, percentage: {value: 101}}}"),
            "spec.http[0].fault.abort.percentage",
            "[0.0001, 100.0]",
        );
        assert_error(
            &rule("fault: {delay: {fixedDelay: 1s, percentage: {value: -5}}}"),
            "spec.http[0].fault.delay.percentage",
            "[0.0001, 100.0]",
        );
        assert_error(
            &rule("fault: {delay: {fixedDelay: 1s, percent: 150}}"),
            "spec.http[0].fault.delay.percent",
            "not in range 0..100",
        );
        assert_error(
            &rule("fault: {abort: {grpcStatus: NOPE}}"),
            "spec.http[0].fault.abort.grpcStatus",
            "not supported",
        );
        assert_warning(
            &rule("fault: {abort: {percentage: {value: 5}}}"),
            "spec.http[0].fault.abort",
            "error type not set",
        );
        assert_error(
            &rule("mirrorPercentage: {value: 150}"),
            "spec.http[0].mirrorPercentage",
            "max value of 100",
        );
        assert_error(
            &rule("corsPolicy: {allowMethods: [FETCH]}"),
            "spec.http[0].corsPolicy.allowMethods[0]",
            "not a supported HTTP method",
        );
        assert_error(
            &rule("corsPolicy: {maxAge: 1.5s}"),
            "spec.http[0].corsPolicy.maxAge",
            "seconds precision",
        );
    }

    #[test]
    fn route_redirect_and_direct_response_exclude_each_other() {
        let base = "hosts: [a]\nhttp:\n- route: [{destination: {host: a}}]\n";
        assert_error(
            &check(&format!("{base}  redirect: {{uri: /x}}\n")),
            "spec.http[0].redirect",
            "both route and redirect",
        );
        assert_error(
            &check(&format!("{base}  directResponse: {{status: 200}}\n")),
            "spec.http[0].directResponse",
            "both route and directResponse",
        );
        assert_error(
            &check("hosts: [a]\nhttp:\n- redirect: {uri: /x}\n  directResponse: {status: 200}\n"),
            "spec.http[0].directResponse",
            "both redirect and directResponse",
        );
        assert_error(
            &check(
                "hosts: [a]\nhttp:\n- redirect: {uri: /x}\n  fault: {abort: {httpStatus: 500}}\n",
            ),
            "spec.http[0].fault",
            "both fault and redirect",
        );
        assert_error(
            &check("hosts: [a]\nhttp:\n- redirect: {}\n"),
            "spec.http[0].redirect",
            "must specify URI, authority, scheme, or port",
        );
        assert_error(
            &check("hosts: [a]\nhttp:\n- redirect: {uri: /x, redirectCode: 200}\n"),
            "spec.http[0].redirect.redirectCode",
            "must be 3xx",
        );
        assert_error(
            &check("hosts: [a]\nhttp:\n- redirect: {uri: /x, scheme: ftp}\n"),
            "spec.http[0].redirect.scheme",
            "http",
        );
        assert_error(
            &check("hosts: [a]\nhttp:\n- directResponse: {status: 99}\n"),
            "spec.http[0].directResponse.status",
            "not in range 200-599",
        );
        assert_error(
            &check("hosts: [a]\nhttp:\n- route: [{destination: {host: a}}]\n  rewrite: {}\n"),
            "spec.http[0].rewrite",
            "at least one of URI",
        );
        assert_error(
            &check(
                "hosts: [a]\nhttp:\n- route: [{destination: {host: a}}]\n  rewrite: {uriRegexRewrite: {match: \"(\", rewrite: x}}\n",
            ),
            "spec.http[0].rewrite.uriRegexRewrite.match",
            "invalid regex",
        );
    }

    #[test]
    fn delegates() {
        // A delegate VirtualService has no hosts, gateways, tls or tcp.
        let delegate = "http: [{match: [{uri: {prefix: /r}}], route: [{destination: {host: r}}]}]";
        assert_warning(&check(delegate), "spec.hosts", "only used as a delegate");
        assert_error(
            &check(&format!("gateways: [gw]\n{delegate}")),
            "spec.gateways",
            "delegate virtual service must have no gateways",
        );
        assert_error(
            &check(&format!(
                "{delegate}\ntcp: [{{route: [{{destination: {{host: r}}}}]}}]"
            )),
            "spec.tcp",
            "no tcp route",
        );
        assert_error(
            &check("http: [{delegate: {name: other}}]"),
            "spec.http[0].delegate",
            "delegate HTTP route cannot contain delegate",
        );
        assert_error(
            &check("http: [{match: [{uri: {regex: \"^/r\"}}], route: [{destination: {host: r}}]}]"),
            "spec.http[0].match[0].uri.regex",
            "not supported for delegating",
        );
        // A root rule only delegates.
        assert_ok(&check(
            "hosts: [a]\nhttp: [{match: [{uri: {prefix: /r}}], delegate: {name: r, namespace: ns}}]",
        ));
        assert_error(
            &check("hosts: [a]\nhttp: [{delegate: {name: r}, route: [{destination: {host: a}}]}]"),
            "spec.http[0].route",
            "must not specify route",
        );
        assert_error(
            &check("hosts: [a]\nhttp: [{delegate: {name: \"\"}}]"),
            "spec.http[0].delegate.name",
            "required",
        );
    }

    #[test]
    fn header_operations() {
        let rule = |headers: &str| {
            check(&format!(
                "hosts: [a]\nhttp:\n- route: [{{destination: {{host: a}}}}]\n  headers: {headers}\n"
            ))
        };
        assert_error(
            &rule("{request: {set: {\":path\": /x}}}"),
            "spec.http[0].headers.request.set[:path]",
            "cannot have \":\" prefix",
        );
        assert_error(
            &rule("{response: {set: {host: x}}}"),
            "spec.http[0].headers.response.set[host]",
            "cannot set Host header",
        );
        assert_error(
            &rule("{request: {add: {x-a: \"100%\"}}}"),
            "spec.http[0].headers.request.add[x-a]",
            "unterminated",
        );
        assert_ok(&rule("{request: {add: {x-a: \"100%% of %HOSTNAME%\"}}}"));
        // Istio lets any name through here; Envoy wants a token.
        assert_error(
            &rule("{request: {set: {\"Bad Header:\": x}}}"),
            "spec.http[0].headers.request.set[Bad Header:]",
            "not a valid header name",
        );
        assert_error(
            &rule("{response: {remove: [\"a b\"]}}"),
            "spec.http[0].headers.response.remove[0]",
            "not a valid header name",
        );
        assert_error(
            &rule("{response: {add: {x-a: \"line\\r\\nInjected: 1\"}}}"),
            "spec.http[0].headers.response.add[x-a]",
            "control characters",
        );
        assert_ok(&rule("{request: {set: {Host: b}}}"));
        assert_error(
            &check(
                "hosts: [a]\nhttp:\n- route: [{destination: {host: a}}]\n  rewrite: {authority: b}\n  headers: {request: {set: {\":authority\": c}}}\n",
            ),
            "spec.http[0].headers.request.set[:authority]",
            "cannot be set multiple times",
        );
    }
}

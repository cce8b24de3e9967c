//! The Gateway API's own validation rules: the OpenAPI and CEL constraints of its CRDs
//! (`config/crd` of kubernetes-sigs/gateway-api), which the API server enforces before
//! istiod sees an object. meshfed applies them to objects from every source (the
//! config directory has no API server in front of it). Errors name the field.

use std::collections::BTreeSet;

use super::types::*;
use crate::config::validate::Findings;
use crate::config::validate::{FieldPath, Validation};

const PROTOCOLS_WITH_TLS: [&str; 2] = ["HTTPS", "TLS"];

/// A `Hostname` (RFC 1123, optionally with a leading `*.` label; no IPs, no port).
fn check_hostname(name: &str) -> Result<(), String> {
    let rest = name.strip_prefix("*.").unwrap_or(name);
    let valid = !name.is_empty()
        && name.len() <= 253
        && rest.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if !valid {
        return Err(format!(
            "invalid hostname {name:?}: lowercase RFC 1123 labels, optionally prefixed by \"*.\""
        ));
    }
    if rest
        .split('.')
        .all(|l| l.chars().all(|c| c.is_ascii_digit()))
    {
        return Err(format!(
            "invalid hostname {name:?}: an IP address is not a hostname"
        ));
    }
    Ok(())
}

/// A Gateway API duration (`1h`, `10s`, `500ms`: up to four number+unit pairs of
/// `h`, `m`, `s`, `ms`).
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("invalid duration {text:?}: use e.g. 10s, 500ms, 1h30m");
    let mut rest = text;
    let mut total = std::time::Duration::ZERO;
    let mut parts = 0;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (std::time::Duration::from_millis(1), 2)
        } else if rest.starts_with('h') {
            (std::time::Duration::from_secs(3600), 1)
        } else if rest.starts_with('m') {
            (std::time::Duration::from_secs(60), 1)
        } else if rest.starts_with('s') {
            (std::time::Duration::from_secs(1), 1)
        } else {
            return Err(bad());
        };
        rest = &rest[len..];
        total += unit * u32::try_from(n).map_err(|_| bad())?;
        parts += 1;
    }
    if parts > 4 {
        return Err(bad());
    }
    Ok(total)
}

fn check_port(f: &mut Findings, at: &FieldPath, port: u32) {
    if !(1..=65535).contains(&port) {
        f.error(at, format!("port {port} must be between 1 and 65535"));
    }
}

/// `GatewayClass`: a controller name is `<domain>/<path>`.
pub fn validate_gateway_class(spec: &GatewayClassSpec) -> Validation {
    let mut f = Findings::new();
    let at = FieldPath::spec().field("controllerName");
    match spec.controller_name.split_once('/') {
        Some((domain, path)) if !domain.is_empty() && !path.is_empty() => {}
        _ => f.error(
            &at,
            format!(
                "controllerName {:?} must be a domain-prefixed path (istio.io/gateway-controller)",
                spec.controller_name
            ),
        ),
    }
    f.finish()
}

/// The GatewayClass of Istio's ambient waypoint proxies.
pub const WAYPOINT_CLASS: &str = "istio-waypoint";

/// What `meshfed validate` says of a waypoint Gateway.
pub const WAYPOINT_WARNING: &str = "waypoint proxies are not served by meshfed yet: once this \
     Gateway reports an address, workloads and services that use it (istio.io/use-waypoint) \
     name it to ztunnel, but the waypoint's own configuration (HBONE listeners, its routes \
     and policies) is not generated";

/// `Gateway`: listeners (unique names, ports, TLS as the protocol requires, hostnames)
/// and addresses; a waypoint Gateway (class `istio-waypoint`) is warned about.
pub fn validate_gateway(spec: &GatewaySpec) -> Validation {
    let mut f = Findings::new();
    let root = FieldPath::spec();
    if spec.gateway_class_name.is_empty() {
        f.error(
            &root.field("gatewayClassName"),
            "gatewayClassName is required",
        );
    }
    if spec.gateway_class_name == WAYPOINT_CLASS {
        f.warn(&root.field("gatewayClassName"), WAYPOINT_WARNING);
    }
    if spec.listeners.is_empty() || spec.listeners.len() > 64 {
        f.error(
            &root.field("listeners"),
            "between 1 and 64 listeners are required",
        );
    }
    let mut names = BTreeSet::new();
    let mut combos = BTreeSet::new();
    for (i, l) in spec.listeners.iter().enumerate() {
        let at = root.field("listeners").index(i);
        if !names.insert(l.name.as_str()) {
            f.error(
                &at.field("name"),
                format!("listener name {:?} must be unique", l.name),
            );
        }
        if !combos.insert((
            l.port,
            l.protocol.as_str(),
            l.hostname.as_deref().unwrap_or(""),
        )) {
            f.error(
                &at,
                "the combination of port, protocol and hostname must be unique for each listener",
            );
        }
        check_port(&mut f, &at.field("port"), l.port);
        if let Some(h) = &l.hostname {
            if matches!(l.protocol.as_str(), "TCP" | "UDP") {
                f.error(
                    &at.field("hostname"),
                    "hostname must not be specified for protocols ['TCP', 'UDP']",
                );
            } else {
                f.check(&at.field("hostname"), check_hostname(h));
            }
        }
        let needs_tls = PROTOCOLS_WITH_TLS.contains(&l.protocol.as_str());
        match (&l.tls, needs_tls) {
            (None, true) => f.error(
                &at.field("tls"),
                "tls config must be set for protocols ['HTTPS', 'TLS']",
            ),
            (Some(_), false) if matches!(l.protocol.as_str(), "HTTP" | "TCP" | "UDP") => f.error(
                &at.field("tls"),
                "tls must not be specified for protocols ['HTTP', 'TCP', 'UDP']",
            ),
            (Some(tls), _) => {
                let mode = tls.mode.as_deref().unwrap_or("Terminate");
                if !matches!(mode, "Terminate" | "Passthrough") {
                    f.error(
                        &at.field("tls").field("mode"),
                        format!("unknown TLS mode {mode:?}: Terminate or Passthrough"),
                    );
                }
                if mode == "Terminate" && tls.certificate_refs.is_empty() && tls.options.is_empty()
                {
                    f.error(
                        &at.field("tls").field("certificateRefs"),
                        "certificateRefs or options must be specified when mode is Terminate",
                    );
                }
                if l.protocol == "HTTPS" && mode == "Passthrough" {
                    f.error(
                        &at.field("tls").field("mode"),
                        "an HTTPS listener cannot use Passthrough",
                    );
                }
            }
            _ => {}
        }
        if let Some(from) = l
            .allowed_routes
            .as_ref()
            .and_then(|a| a.namespaces.as_ref())
            .and_then(|n| n.from.as_deref())
            && !matches!(from, "All" | "Same" | "Selector" | "None")
        {
            f.error(
                &at.field("allowedRoutes").field("namespaces").field("from"),
                format!("unknown value {from:?}: All, Same, Selector or None"),
            );
        }
    }
    for (i, a) in spec.addresses.iter().enumerate() {
        let at = root.field("addresses").index(i);
        let kind = a.kind.as_deref().unwrap_or("IPAddress");
        if kind == "IPAddress" && a.value.parse::<std::net::IpAddr>().is_err() {
            f.error(
                &at.field("value"),
                format!("{:?} is not an IP address", a.value),
            );
        }
        if kind == "Hostname" {
            f.check(&at.field("value"), check_hostname(&a.value));
        }
    }
    f.finish()
}

fn validate_parent_refs(f: &mut Findings, root: &FieldPath, refs: &[ParentReference]) {
    if refs.len() > 32 {
        f.error(&root.field("parentRefs"), "at most 32 parentRefs");
    }
    for (i, r) in refs.iter().enumerate() {
        let at = root.field("parentRefs").index(i);
        if r.name.is_empty() {
            f.error(&at.field("name"), "name is required");
        }
        if let Some(p) = r.port {
            check_port(f, &at.field("port"), p);
        }
    }
    let mut seen = BTreeSet::new();
    for (i, r) in refs.iter().enumerate() {
        let key = (
            &r.group,
            &r.kind,
            &r.namespace,
            &r.name,
            &r.section_name,
            r.port,
        );
        if !seen.insert(key) {
            f.error(
                &root.field("parentRefs").index(i),
                "sectionName or port must be unique when parentRefs includes 2 or more references to the same parent",
            );
        }
    }
}

fn validate_hostnames(f: &mut Findings, root: &FieldPath, hostnames: &[String]) {
    if hostnames.len() > 16 {
        f.error(&root.field("hostnames"), "at most 16 hostnames");
    }
    for (i, h) in hostnames.iter().enumerate() {
        f.check(&root.field("hostnames").index(i), check_hostname(h));
    }
}

fn validate_backend(f: &mut Findings, at: &FieldPath, b: &BackendRef) {
    if b.name.is_empty() {
        f.error(&at.field("name"), "name is required");
    }
    let core = b.group.as_deref().unwrap_or("").is_empty();
    if core && b.kind.as_deref().unwrap_or("Service") == "Service" && b.port.is_none() {
        f.error(at, "Must have port for Service reference");
    }
    if let Some(p) = b.port {
        check_port(f, &at.field("port"), p);
    }
    if let Some(w) = b.weight
        && !(0..=1_000_000).contains(&w)
    {
        f.error(
            &at.field("weight"),
            format!("weight {w} must be between 0 and 1000000"),
        );
    }
}

fn validate_filters(f: &mut Findings, at: &FieldPath, filters: &[HttpRouteFilter], grpc: bool) {
    let mut seen = BTreeSet::new();
    for (i, filter) in filters.iter().enumerate() {
        let at = at.index(i);
        let set = [
            (
                "RequestHeaderModifier",
                filter.request_header_modifier.is_some(),
            ),
            (
                "ResponseHeaderModifier",
                filter.response_header_modifier.is_some(),
            ),
            ("RequestMirror", filter.request_mirror.is_some()),
            ("RequestRedirect", filter.request_redirect.is_some()),
            ("URLRewrite", filter.url_rewrite.is_some()),
            ("CORS", filter.cors.is_some()),
            ("ExtensionRef", filter.extension_ref.is_some()),
            ("ExternalAuth", filter.external_auth.is_some()),
        ];
        let Some(&(_, present)) = set.iter().find(|(k, _)| *k == filter.kind) else {
            f.error(
                &at.field("type"),
                format!("unknown filter type {:?}", filter.kind),
            );
            continue;
        };
        if grpc
            && matches!(
                filter.kind.as_str(),
                "RequestRedirect" | "URLRewrite" | "CORS" | "ExternalAuth"
            )
        {
            f.error(
                &at.field("type"),
                format!(
                    "filter type {:?} is not allowed in a GRPCRoute",
                    filter.kind
                ),
            );
        }
        if !present {
            f.error(
                &at,
                format!(
                    "filter.{} must be specified for {} filter.type",
                    field_of(&filter.kind),
                    filter.kind
                ),
            );
        }
        for (kind, p) in set {
            if p && kind != filter.kind {
                f.error(
                    &at,
                    format!(
                        "filter.{} must be nil if the filter.type is not {kind}",
                        field_of(kind)
                    ),
                );
            }
        }
        if filter.kind != "RequestMirror"
            && filter.kind != "ExtensionRef"
            && !seen.insert(filter.kind.as_str())
        {
            f.error(
                &at.field("type"),
                format!("{} filter cannot be repeated", filter.kind),
            );
        }
        if let Some(m) = &filter.request_mirror {
            validate_backend(
                f,
                &at.field("requestMirror").field("backendRef"),
                &m.backend_ref,
            );
            if m.percent.is_some() && m.fraction.is_some() {
                f.error(
                    &at.field("requestMirror"),
                    "Only one of percent or fraction may be specified in HTTPRequestMirrorFilter",
                );
            }
        }
        for (name, modifier) in [
            ("requestHeaderModifier", &filter.request_header_modifier),
            ("responseHeaderModifier", &filter.response_header_modifier),
        ] {
            if let Some(m) = modifier {
                let mut names = BTreeSet::new();
                for h in m.set.iter().chain(&m.add) {
                    if !names.insert(h.name.to_ascii_lowercase()) {
                        f.error(
                            &at.field(name),
                            format!("header name {:?} must be unique within set and add", h.name),
                        );
                    }
                }
            }
        }
        let path_modifiers = [
            (
                "requestRedirect",
                filter
                    .request_redirect
                    .as_ref()
                    .and_then(|r| r.path.as_ref()),
            ),
            (
                "urlRewrite",
                filter.url_rewrite.as_ref().and_then(|r| r.path.as_ref()),
            ),
        ];
        for (name, path) in path_modifiers {
            if let Some(p) = path {
                let at = at.field(name).field("path");
                match p.kind.as_str() {
                    "ReplaceFullPath" if p.replace_full_path.is_none() => f.error(&at, "replaceFullPath must be specified when type is set to 'ReplaceFullPath'"),
                    "ReplacePrefixMatch" if p.replace_prefix_match.is_none() => f.error(&at, "replacePrefixMatch must be specified when type is set to 'ReplacePrefixMatch'"),
                    "ReplaceFullPath" | "ReplacePrefixMatch" => {}
                    other => f.error(&at.field("type"), format!("unknown path modifier type {other:?}")),
                }
            }
        }
        if let Some(r) = &filter.request_redirect {
            if let Some(code) = r.status_code
                && code != 301
                && code != 302
                && code != 303
                && code != 307
                && code != 308
            {
                f.error(
                    &at.field("requestRedirect").field("statusCode"),
                    format!("unsupported status code {code}: 301, 302, 303, 307 or 308"),
                );
            }
            if let Some(s) = &r.scheme
                && s != "http"
                && s != "https"
            {
                f.error(
                    &at.field("requestRedirect").field("scheme"),
                    format!("unsupported scheme {s:?}: http or https"),
                );
            }
        }
    }
    if seen.contains("RequestRedirect") && seen.contains("URLRewrite") {
        f.error(at, "May specify either httpRouteFilterRequestRedirect or httpRouteFilterRequestRewrite, but not both");
    }
}

fn field_of(kind: &str) -> &'static str {
    match kind {
        "RequestHeaderModifier" => "requestHeaderModifier",
        "ResponseHeaderModifier" => "responseHeaderModifier",
        "RequestMirror" => "requestMirror",
        "RequestRedirect" => "requestRedirect",
        "URLRewrite" => "urlRewrite",
        "CORS" => "cors",
        "ExtensionRef" => "extensionRef",
        _ => "externalAuth",
    }
}

/// `HTTPRoute`.
pub fn validate_http_route(spec: &HttpRouteSpec) -> Validation {
    let mut f = Findings::new();
    let root = FieldPath::spec();
    validate_parent_refs(&mut f, &root, &spec.parent_refs);
    validate_hostnames(&mut f, &root, &spec.hostnames);
    if spec.rules.len() > 16 {
        f.error(&root.field("rules"), "at most 16 rules");
    }
    for (i, rule) in spec.rules.iter().enumerate() {
        let at = root.field("rules").index(i);
        for (j, m) in rule.matches.iter().enumerate() {
            let at = at.field("matches").index(j);
            if let Some(p) = &m.path {
                let kind = p.kind.as_deref().unwrap_or("PathPrefix");
                let value = p.value.as_deref().unwrap_or("/");
                match kind {
                    "Exact" | "PathPrefix" => {
                        if !value.starts_with('/') {
                            f.error(&at.field("path").field("value"), "value must be an absolute path and start with '/' when type one of ['Exact', 'PathPrefix']");
                        }
                        if value.contains("//")
                            || value.contains("/./")
                            || value.contains("/../")
                            || value.contains("%2f")
                            || value.contains("%2F")
                            || value.contains('#')
                        {
                            f.error(&at.field("path").field("value"), "must not contain '//', '/./', '/../', '%2f', '%2F' or '#' when type one of ['Exact', 'PathPrefix']");
                        }
                    }
                    "RegularExpression" => {}
                    other => f.error(
                        &at.field("path").field("type"),
                        format!("unknown path match type {other:?}"),
                    ),
                }
            }
            for (list, name) in [(&m.headers, "headers"), (&m.query_params, "queryParams")] {
                let mut names = BTreeSet::new();
                for (k, h) in list.iter().enumerate() {
                    let key = if name == "headers" {
                        h.name.to_ascii_lowercase()
                    } else {
                        h.name.clone()
                    };
                    if !names.insert(key) {
                        f.error(
                            &at.field(name).index(k).field("name"),
                            format!("{name} must have unique names"),
                        );
                    }
                }
            }
        }
        if rule.matches.len() > 64 {
            f.error(&at.field("matches"), "at most 64 matches");
        }
        validate_filters(&mut f, &at.field("filters"), &rule.filters, false);
        for (j, b) in rule.backend_refs.iter().enumerate() {
            let bat = at.field("backendRefs").index(j);
            validate_backend(&mut f, &bat, b);
            validate_filters(&mut f, &bat.field("filters"), &b.filters, false);
        }
        if let Some(t) = &rule.timeouts {
            let request = t.request.as_deref().map(parse_duration);
            let backend = t.backend_request.as_deref().map(parse_duration);
            if let Some(Err(e)) = &request {
                f.error(&at.field("timeouts").field("request"), e.clone());
            }
            if let Some(Err(e)) = &backend {
                f.error(&at.field("timeouts").field("backendRequest"), e.clone());
            }
            if let (Some(Ok(r)), Some(Ok(b))) = (request, backend)
                && !r.is_zero()
                && b > r
            {
                f.error(
                    &at.field("timeouts"),
                    "backendRequest timeout cannot be longer than request timeout",
                );
            }
        }
        if let Some(r) = &rule.retry {
            if let Some(b) = &r.backoff {
                f.check(
                    &at.field("retry").field("backoff"),
                    parse_duration(b).map(|_| ()),
                );
            }
            for (k, code) in r.codes.iter().enumerate() {
                if !(400..=599).contains(code) {
                    f.error(
                        &at.field("retry").field("codes").index(k),
                        format!("retry code {code} must be between 400 and 599"),
                    );
                }
            }
        }
    }
    f.finish()
}

/// `GRPCRoute`.
pub fn validate_grpc_route(spec: &GrpcRouteSpec) -> Validation {
    let mut f = Findings::new();
    let root = FieldPath::spec();
    validate_parent_refs(&mut f, &root, &spec.parent_refs);
    validate_hostnames(&mut f, &root, &spec.hostnames);
    for (i, rule) in spec.rules.iter().enumerate() {
        let at = root.field("rules").index(i);
        for (j, m) in rule.matches.iter().enumerate() {
            if let Some(method) = &m.method {
                let at = at.field("matches").index(j).field("method");
                let kind = method.kind.as_deref().unwrap_or("Exact");
                if method.service.is_none() && method.method.is_none() {
                    f.error(
                        &at,
                        "One or both of 'service' or 'method' must be specified",
                    );
                }
                if !matches!(kind, "Exact" | "RegularExpression") {
                    f.error(
                        &at.field("type"),
                        format!("unknown method match type {kind:?}"),
                    );
                }
            }
        }
        validate_filters(&mut f, &at.field("filters"), &rule.filters, true);
        for (j, b) in rule.backend_refs.iter().enumerate() {
            let bat = at.field("backendRefs").index(j);
            validate_backend(&mut f, &bat, b);
            validate_filters(&mut f, &bat.field("filters"), &b.filters, true);
        }
    }
    f.finish()
}

fn validate_stream_rules(f: &mut Findings, root: &FieldPath, rules: &[StreamRouteRule]) {
    if rules.is_empty() || rules.len() > 16 {
        f.error(&root.field("rules"), "between 1 and 16 rules are required");
    }
    for (i, rule) in rules.iter().enumerate() {
        let at = root.field("rules").index(i);
        if rule.backend_refs.is_empty() {
            f.error(
                &at.field("backendRefs"),
                "at least one backendRef is required",
            );
        }
        for (j, b) in rule.backend_refs.iter().enumerate() {
            let bat = at.field("backendRefs").index(j);
            validate_backend(f, &bat, b);
            if !b.filters.is_empty() {
                f.error(
                    &bat.field("filters"),
                    "filters are not part of this route kind",
                );
            }
        }
    }
}

/// `TCPRoute`.
pub fn validate_tcp_route(spec: &TcpRouteSpec) -> Validation {
    let mut f = Findings::new();
    let root = FieldPath::spec();
    validate_parent_refs(&mut f, &root, &spec.parent_refs);
    validate_stream_rules(&mut f, &root, &spec.rules);
    f.finish()
}

/// `TLSRoute`.
pub fn validate_tls_route(spec: &TlsRouteSpec) -> Validation {
    let mut f = Findings::new();
    let root = FieldPath::spec();
    validate_parent_refs(&mut f, &root, &spec.parent_refs);
    validate_hostnames(&mut f, &root, &spec.hostnames);
    validate_stream_rules(&mut f, &root, &spec.rules);
    f.finish()
}

/// `ReferenceGrant`: 1 to 16 `from` and `to` entries.
pub fn validate_reference_grant(spec: &ReferenceGrantSpec) -> Validation {
    let mut f = Findings::new();
    let root = FieldPath::spec();
    if spec.from.is_empty() || spec.from.len() > 16 {
        f.error(
            &root.field("from"),
            "between 1 and 16 from entries are required",
        );
    }
    if spec.to.is_empty() || spec.to.len() > 16 {
        f.error(
            &root.field("to"),
            "between 1 and 16 to entries are required",
        );
    }
    for (i, from) in spec.from.iter().enumerate() {
        if from.namespace.is_empty() {
            f.error(
                &root.field("from").index(i).field("namespace"),
                "namespace is required",
            );
        }
    }
    f.finish()
}

/// `BackendTLSPolicy`: 1 to 16 distinct `targetRefs`; `validation.hostname` a precise
/// hostname; exactly one of `caCertificateRefs` (at most 8) and
/// `wellKnownCACertificates` (`System`); at most 5 `subjectAltNames`, each with the
/// field its type names.
pub fn validate_backend_tls_policy(spec: &BackendTlsPolicySpec) -> Validation {
    let mut f = Findings::new();
    let root = FieldPath::spec();
    let targets = root.field("targetRefs");
    if spec.target_refs.is_empty() || spec.target_refs.len() > 16 {
        f.error(&targets, "between 1 and 16 targetRefs are required");
    }
    let mut seen = BTreeSet::new();
    for (i, t) in spec.target_refs.iter().enumerate() {
        if t.kind.is_empty() || t.name.is_empty() {
            f.error(&targets.index(i), "kind and name are required");
        }
        let key = (&t.group, &t.kind, &t.name, t.section_name.as_deref());
        if !seen.insert(key) {
            f.error(
                &targets.index(i),
                "sectionName must be unique when targetRefs includes 2 or more references to the same target",
            );
        }
    }
    let validation = root.field("validation");
    let v = &spec.validation;
    if v.hostname.is_empty() {
        f.error(&validation.field("hostname"), "hostname is required");
    } else if v.hostname.starts_with('*') {
        f.error(
            &validation.field("hostname"),
            format!(
                "invalid hostname {:?}: a precise hostname, no wildcard",
                v.hostname
            ),
        );
    } else if let Err(e) = check_hostname(&v.hostname) {
        f.error(&validation.field("hostname"), e);
    }
    match (
        v.ca_certificate_refs.is_empty(),
        &v.well_known_ca_certificates,
    ) {
        (false, Some(_)) => f.error(
            &validation,
            "must not contain both caCertificateRefs and wellKnownCACertificates",
        ),
        (true, None) => f.error(
            &validation,
            "must specify either caCertificateRefs or wellKnownCACertificates",
        ),
        _ => {}
    }
    if v.ca_certificate_refs.len() > 8 {
        f.error(
            &validation.field("caCertificateRefs"),
            "at most 8 caCertificateRefs",
        );
    }
    if let Some(wk) = &v.well_known_ca_certificates
        && wk != "System"
    {
        f.error(
            &validation.field("wellKnownCACertificates"),
            format!("unsupported value {wk:?}: System"),
        );
    }
    let sans = validation.field("subjectAltNames");
    if v.subject_alt_names.len() > 5 {
        f.error(&sans, "at most 5 subjectAltNames");
    }
    for (i, san) in v.subject_alt_names.iter().enumerate() {
        let path = sans.index(i);
        let filled = |o: &Option<String>| o.as_deref().is_some_and(|s| !s.is_empty());
        match san.kind.as_str() {
            "Hostname" if !filled(&san.hostname) || filled(&san.uri) => f.error(
                &path,
                "SubjectAltName element must contain Hostname, if Type is set to Hostname, and not URI",
            ),
            "URI" if !filled(&san.uri) || filled(&san.hostname) => f.error(
                &path,
                "SubjectAltName element must contain URI, if Type is set to URI, and not Hostname",
            ),
            "Hostname" | "URI" => {}
            other => f.error(
                &path.field("type"),
                format!("unsupported value {other:?}: Hostname, URI"),
            ),
        }
    }
    f.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waypoint_gateways_are_warned_about() {
        let gateway = |class: &str| GatewaySpec {
            gateway_class_name: class.into(),
            listeners: vec![Listener {
                name: "mesh".into(),
                port: 15008,
                protocol: "HBONE".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let warnings = validate_gateway(&gateway("istio-waypoint")).expect("valid");
        assert!(
            warnings
                .iter()
                .any(|w| w.field.to_string() == "spec.gatewayClassName"
                    && w.message.contains("waypoint proxies")),
            "{warnings:?}"
        );
        let plain = validate_gateway(&gateway("istio")).expect("valid");
        assert!(!plain.iter().any(|w| w.message.contains("waypoint")));
    }

    #[test]
    fn durations_follow_the_api() {
        assert_eq!(
            parse_duration("1ms"),
            Ok(std::time::Duration::from_millis(1))
        );
        assert_eq!(
            parse_duration("1h30m"),
            Ok(std::time::Duration::from_secs(5400))
        );
        assert!(parse_duration("1.5s").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("10").is_err());
    }

    #[test]
    fn listeners_need_tls_as_their_protocol_says() {
        let spec: GatewaySpec = serde_json::from_value(serde_json::json!({
            "gatewayClassName": "istio",
            "listeners": [
                {"name": "a", "port": 443, "protocol": "HTTPS"},
                {"name": "a", "port": 80, "protocol": "TCP", "hostname": "x.example"},
            ]
        }))
        .unwrap();
        let errors = validate_gateway(&spec).unwrap_err();
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(
            text.iter()
                .any(|e| e.starts_with("spec.listeners[0].tls: tls config must be set")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|e| e.starts_with("spec.listeners[1].name: listener name")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|e| e.starts_with("spec.listeners[1].hostname: hostname must not")),
            "{text:?}"
        );
    }

    #[test]
    fn filters_carry_exactly_their_field() {
        let spec: HttpRouteSpec = serde_json::from_value(serde_json::json!({
            "rules": [{
                "filters": [{"type": "RequestRedirect"}, {"type": "URLRewrite", "urlRewrite": {}}],
                "backendRefs": [{"name": "svc"}],
                "timeouts": {"request": "1s", "backendRequest": "2s"}
            }]
        }))
        .unwrap();
        let text: Vec<String> = validate_http_route(&spec)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(text.contains(&"spec.rules[0].filters[0]: filter.requestRedirect must be specified for RequestRedirect filter.type".to_string()), "{text:?}");
        assert!(text.iter().any(|e| e.contains("but not both")), "{text:?}");
        assert!(
            text.contains(
                &"spec.rules[0].backendRefs[0]: Must have port for Service reference".to_string()
            ),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|e| e.contains("backendRequest timeout cannot be longer")),
            "{text:?}"
        );
    }
    #[test]
    fn backend_tls_policies_are_held_to_the_api_rules() {
        let policy = |validation: serde_json::Value| -> BackendTlsPolicySpec {
            serde_json::from_value(serde_json::json!({
                "targetRefs": [{"group": "", "kind": "Service", "name": "web"}],
                "validation": validation,
            }))
            .unwrap()
        };
        let errors = |spec: &BackendTlsPolicySpec| -> Vec<String> {
            validate_backend_tls_policy(spec)
                .err()
                .unwrap_or_default()
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert!(
            errors(&policy(
                serde_json::json!({"hostname": "web.example.com", "wellKnownCACertificates": "System"})
            ))
            .is_empty()
        );
        let both = errors(&policy(serde_json::json!({
            "hostname": "web.example.com",
            "wellKnownCACertificates": "System",
            "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "ca"}],
        })));
        assert!(both[0].contains("must not contain both"), "{both:?}");
        let neither = errors(&policy(serde_json::json!({"hostname": "web.example.com"})));
        assert!(neither[0].contains("must specify either"), "{neither:?}");
        let wildcard = errors(&policy(
            serde_json::json!({"hostname": "*.example.com", "wellKnownCACertificates": "System"}),
        ));
        assert!(wildcard[0].contains("validation.hostname"), "{wildcard:?}");
        let san = errors(&policy(serde_json::json!({
            "hostname": "web.example.com",
            "wellKnownCACertificates": "System",
            "subjectAltNames": [{"type": "URI", "hostname": "web"}],
        })));
        assert!(san[0].contains("subjectAltNames[0]"), "{san:?}");
        let mut twice = policy(
            serde_json::json!({"hostname": "web.example.com", "wellKnownCACertificates": "System"}),
        );
        twice.target_refs.push(twice.target_refs[0].clone());
        assert!(errors(&twice)[0].contains("targetRefs[1]"));
    }
}

//! Checks shared by several kinds: names, hosts, ports, addresses, labels, durations,
//! header names and values, exportTo (regexes: [`super::regex`]). Each mirrors the Istio helper of the same purpose
//! (`pkg/config/validation/agent`, `pkg/config/labels`, `pkg/config/host`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use meshfed_api::Duration;

use super::{FieldPath, Findings};

/// `unix://` — the prefix of a Unix domain socket address.
pub(crate) const UNIX_PREFIX: &str = "unix://";

const DNS1123_LABEL_MAX: usize = 63;

/// An RFC 1123 label as Istio checks it: letters (either case), digits and `-`, starting
/// and ending with a letter or digit, at most 63 characters.
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= DNS1123_LABEL_MAX
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
}

/// A Kubernetes object name: lower case DNS labels joined by dots, at most 253
/// characters.
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && !s.bytes().any(|b| b.is_ascii_uppercase())
        && s.split('.').all(is_dns1123_label)
}

/// A label that may carry a leading wildcard: `*`, `*foo`, `*-foo` or a plain label.
fn is_wildcard_dns1123_label(s: &str) -> bool {
    if s == "*" {
        return true;
    }
    let rest = s
        .strip_prefix("*-")
        .or_else(|| s.strip_prefix('*'))
        .unwrap_or(s);
    is_dns1123_label(rest) && s.len() <= DNS1123_LABEL_MAX
}

fn check_dns1123_preconditions(name: &str) -> Result<(), String> {
    if name.len() > 255 {
        return Err(format!("domain name {name:?} too long (max 255)"));
    }
    if name.is_empty() {
        return Err("empty domain name not allowed".to_string());
    }
    Ok(())
}

fn validate_dns1123_labels(domain: &str) -> Result<(), String> {
    let parts: Vec<&str> = domain.split('.').collect();
    let tld = parts[parts.len() - 1];
    if !tld.is_empty() && tld.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "domain name {domain:?} invalid (top level domain {tld:?} cannot be all-numeric)"
        ));
    }
    for (i, label) in parts.iter().enumerate() {
        // A trailing dot (`istio.io.`) is allowed.
        if i == parts.len() - 1 && label.is_empty() {
            return Ok(());
        }
        if !is_dns1123_label(label) {
            return Err(format!(
                "domain name {domain:?} invalid (label {label:?} invalid)"
            ));
        }
    }
    Ok(())
}

/// A fully qualified (or short) domain name without wildcards.
pub(crate) fn validate_fqdn(fqdn: &str) -> Result<(), String> {
    check_dns1123_preconditions(fqdn)?;
    validate_dns1123_labels(fqdn)
}

/// A domain name whose first label may be a wildcard: `*`, `*.example.com`,
/// `reviews`, `reviews.default.svc.cluster.local`.
pub(crate) fn validate_wildcard_domain(domain: &str) -> Result<(), String> {
    check_dns1123_preconditions(domain)?;
    let (first, rest) = match domain.split_once('.') {
        Some((first, rest)) => (first, Some(rest)),
        None => (domain, None),
    };
    if !is_wildcard_dns1123_label(first) {
        return Err(format!(
            "domain name {domain:?} invalid (label {first:?} invalid)"
        ));
    }
    match rest {
        Some(rest) => validate_dns1123_labels(rest),
        None => Ok(()),
    }
}

/// Istio's rule for hosts of a VirtualService bound to gateways: like
/// [`validate_wildcard_domain`], plus the `outbound_.<port>_...` SNI names Istio
/// generates.
pub(crate) fn validate_gateway_bound_domain(sni: bool, domain: &str) -> Result<(), String> {
    check_dns1123_preconditions(domain)?;
    let first = domain.split('.').next().unwrap_or_default();
    if sni && first == "outbound_" {
        let valid = domain
            .strip_prefix("outbound_.")
            .and_then(|rest| rest.bytes().next())
            .is_some_and(|b| (b'0'..=b'8').contains(&b));
        return if valid {
            Ok(())
        } else {
            Err(format!(
                "domain name {domain:?} invalid (label {first:?} invalid)"
            ))
        };
    }
    validate_wildcard_domain(domain)
}

/// A `*` that is not the whole first label (`foo*.example.com`, `*foo.com`).
pub(crate) fn partial_wildcard(host: &str) -> Option<String> {
    (host.contains('*') && host != "*" && !host.starts_with("*."))
        .then(|| format!("partial wildcard {host:?} not allowed"))
}

/// True for a wildcard host (`*`, `*.example.com`).
pub(crate) fn is_wildcard_host(host: &str) -> bool {
    host.starts_with('*')
}

/// Istio's `host.Name.Matches`: the two hosts (either may be a wildcard) overlap.
pub(crate) fn hosts_match(a: &str, b: &str) -> bool {
    match (is_wildcard_host(a), is_wildcard_host(b)) {
        (true, true) => {
            if a.len() < b.len() {
                b[1..].ends_with(&a[1..])
            } else {
                a[1..].ends_with(&b[1..])
            }
        }
        (true, false) => b.ends_with(&a[1..]),
        (false, true) => a.ends_with(&b[1..]),
        (false, false) => a == b,
    }
}

/// Istio's `host.Name.SubsetOf`: every name matched by `a` is matched by `b`.
pub(crate) fn host_subset_of(a: &str, b: &str) -> bool {
    if is_wildcard_host(b) {
        if is_wildcard_host(a) {
            a[1..].ends_with(&b[1..])
        } else {
            a.ends_with(&b[1..])
        }
    } else {
        !is_wildcard_host(a) && a == b
    }
}

/// A port number in 1..=65535.
pub(crate) fn validate_port(port: u32) -> Result<(), String> {
    if (1..=65535).contains(&port) {
        Ok(())
    } else {
        Err(format!("port number {port} must be in the range 1..65535"))
    }
}

/// An IPv4 or IPv6 address.
pub(crate) fn is_ip(s: &str) -> bool {
    s.parse::<IpAddr>().is_ok()
}

/// An IP address.
pub(crate) fn validate_ip(s: &str) -> Result<(), String> {
    if is_ip(s) {
        Ok(())
    } else {
        Err(format!("{s} is not a valid IP"))
    }
}

/// An IP address or a CIDR block (`10.0.0.0/8`, `2001:db8::/32`).
pub(crate) fn validate_ip_subnet(s: &str) -> Result<(), String> {
    if s.matches('/').count() == 1 {
        let (addr, len) = s.split_once('/').unwrap_or_default();
        let max = match addr.parse::<IpAddr>() {
            Ok(IpAddr::V4(_)) => 32,
            Ok(IpAddr::V6(_)) => 128,
            Err(_) => return Err(format!("{s} is not a valid CIDR block")),
        };
        match len.parse::<u8>() {
            Ok(n) if n <= max && !len.starts_with('+') => Ok(()),
            _ => Err(format!("{s} is not a valid CIDR block")),
        }
    } else {
        validate_ip(s)
    }
}

/// The path of a Unix domain socket: absolute and not a directory, or an abstract
/// socket `@name`.
pub(crate) fn validate_unix_address(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("unix address must not be empty".to_string());
    }
    if path.starts_with('@') {
        return Ok(());
    }
    if !path.starts_with('/') || path.ends_with('/') {
        return Err(format!("{path} is not an absolute path to a file"));
    }
    Ok(())
}

/// A port name: a DNS label.
pub(crate) fn validate_port_name(name: &str) -> Result<(), String> {
    if is_dns1123_label(name) {
        Ok(())
    } else {
        Err(format!("invalid port name: {name:?}"))
    }
}

/// A protocol Istio knows, or empty (sniffed).
pub(crate) fn validate_protocol(protocol: &str) -> Result<(), String> {
    use crate::model::Protocol;
    let known = matches!(Protocol::parse_known(protocol), Some(p) if p != Protocol::Unsupported);
    if protocol.is_empty() || known {
        Ok(())
    } else {
        Err(format!(
            "unsupported protocol {protocol:?} (supported: HTTP, HTTPS, HTTP2, GRPC, GRPC-Web, TCP, TLS, UDP, \
             Mongo, Redis, MySQL, HTTP_PROXY)"
        ))
    }
}

/// A duration used as a timeout or interval: at least 1ms, in whole milliseconds.
pub(crate) fn validate_duration(d: &Duration) -> Result<(), String> {
    let nanos = d.as_nanos();
    if nanos < 1_000_000 {
        return Err(format!("duration {d} must be at least 1ms"));
    }
    if nanos % 1_000_000 != 0 {
        return Err(format!(
            "duration {d}: only durations to ms precision are supported"
        ));
    }
    Ok(())
}

/// Checks an optional duration field.
pub(crate) fn check_duration(findings: &mut Findings, at: &FieldPath, d: Option<&Duration>) {
    if let Some(d) = d {
        findings.check(at, validate_duration(d));
    }
}

/// A Kubernetes label or annotation key: an optional DNS subdomain prefix and `/`,
/// then a name of at most 63 characters.
pub(crate) fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && (prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(is_dns1123_label))
    {
        return Err(format!(
            "invalid label key {key:?}: the prefix before '/' must be a DNS subdomain"
        ));
    }
    if name.is_empty() || name.len() > 63 || !is_qualified_name(name) {
        return Err(format!(
            "invalid label key {key:?}: the name must be 1-63 characters of letters, digits, '-', '_' \
             and '.', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// A label value: empty, or up to 63 letters, digits, `-`, `_` and `.`, starting and
/// ending with a letter or digit.
pub(crate) fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || (value.len() <= 63 && is_qualified_name(value)) {
        Ok(())
    } else {
        Err(format!(
            "invalid label value {value:?}: at most 63 characters of letters, digits, '-', '_' and '.', \
             starting and ending with a letter or digit"
        ))
    }
}

fn is_qualified_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Checks every key and value of a label map.
pub(crate) fn validate_labels(
    findings: &mut Findings,
    at: &FieldPath,
    labels: &BTreeMap<String, String>,
) {
    for (key, value) in labels {
        let here = at.key(key);
        findings.check(&here, validate_label_key(key));
        findings.check(&here, validate_label_value(value));
    }
}

/// A workload selector's labels (Sidecar, ServiceEntry, DestinationRule): no empty
/// keys, no wildcards; an empty selector selects everything and is warned about.
pub(crate) fn validate_selector_labels(
    findings: &mut Findings,
    at: &FieldPath,
    labels: &BTreeMap<String, String>,
    empty_means: &str,
) {
    for (key, value) in labels {
        let here = at.key(key);
        if key.is_empty() {
            findings.error(
                &here,
                format!("empty key is not supported in selector: \"{key}={value}\""),
            );
        }
        if key.contains('*') || value.contains('*') {
            findings.error(
                &here,
                format!("wildcard is not supported in selector: \"{key}={value}\""),
            );
        }
    }
    if labels.is_empty() {
        findings.warn(
            at,
            format!("workload selector specified without labels; {empty_means}"),
        );
    }
}

/// An HTTP field name: an RFC 9110 token (`tchar`: letters, digits and
/// ``!#$%&'*+-.^_`|~``), as Istio's `validHeaderNameRegex` and Envoy's strict
/// `HTTP_HEADER_NAME` rule (minus its pseudo-header colon) have it. Upper case is a
/// valid token; Envoy lower-cases names itself.
pub(crate) fn validate_header_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("header name cannot be empty".to_string());
    }
    if name.bytes().all(is_tchar) {
        Ok(())
    } else {
        Err(format!(
            "header name {name:?} is not a valid header name (an RFC 9110 token: letters, digits \
             and !#$%&'*+-.^_`|~)"
        ))
    }
}

/// A header name in a match: a token, or one of the HTTP/2 pseudo-headers Istio lets
/// routes match on (`ValidateHTTPHeaderNameOrJwtClaimRoute`).
pub(crate) fn validate_match_header_name(name: &str) -> Result<(), String> {
    const PSEUDO_HEADERS: &[&str] = &[":method", ":scheme", ":authority", ":path", ":status"];
    if PSEUDO_HEADERS.contains(&name) {
        return Ok(());
    }
    validate_header_name(name)
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A percentage (`Percent`): 0, or 0.0001..=100.
pub(crate) fn validate_percentage(value: f64) -> Result<(), String> {
    if !(0.0..=100.0).contains(&value) || (value > 0.0 && value < 0.0001) {
        Err(format!(
            "percentage {value} is neither 0.0, nor in range [0.0001, 100.0]"
        ))
    } else {
        Ok(())
    }
}

/// An integer percentage: 0..=100.
pub(crate) fn validate_percent(value: i32) -> Result<(), String> {
    if (0..=100).contains(&value) {
        Ok(())
    } else {
        Err(format!("percentage {value} is not in range 0..100"))
    }
}

/// `exportTo`: `.`, `*`, `~` (ServiceEntry only) or namespace names, no duplicates, and
/// `*`/`~` only on their own.
pub(crate) fn validate_export_to(
    findings: &mut Findings,
    at: &FieldPath,
    namespace: &str,
    export_to: &[String],
    is_service_entry: bool,
) {
    let mut seen = BTreeSet::new();
    for (i, entry) in export_to.iter().enumerate() {
        let here = at.index(i);
        let key = if entry == "." {
            namespace
        } else {
            entry.as_str()
        };
        if !seen.insert(key.to_string()) {
            if key != entry {
                findings.error(
                    &here,
                    format!("duplicate entries in exportTo: . and current namespace {namespace}"),
                );
            } else {
                findings.error(
                    &here,
                    format!("duplicate entries in exportTo for entry {entry}"),
                );
            }
            continue;
        }
        let valid = match entry.as_str() {
            "." | "*" => true,
            "~" => is_service_entry,
            ns => is_dns1123_label(ns),
        };
        if !valid {
            findings.error(
                &here,
                format!(
                    "invalid exportTo value {entry:?}: expected \".\", \"*\"{} or a namespace name",
                    if is_service_entry { ", \"~\"" } else { "" }
                ),
            );
        }
    }
    if export_to.len() > 1 && export_to.iter().any(|e| e == "*") {
        findings.error(
            at,
            "cannot have both public (*) and non-public exportTo values for a resource",
        );
    }
    if export_to.len() > 1 && export_to.iter().any(|e| e == "~") {
        findings.error(at, "cannot export service entry to no one (~) and someone");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        assert!(is_dns1123_label("reviews"));
        assert!(is_dns1123_label("Reviews-2"));
        assert!(!is_dns1123_label("-reviews"));
        assert!(!is_dns1123_label("a.b"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1123_subdomain("reviews.v1"));
        assert!(!is_dns1123_subdomain("Reviews"));

        assert!(validate_wildcard_domain("*").is_ok());
        assert!(validate_wildcard_domain("*.example.com").is_ok());
        assert!(validate_wildcard_domain("reviews").is_ok());
        assert!(validate_wildcard_domain("reviews.default.svc.cluster.local").is_ok());
        assert!(validate_wildcard_domain("istio.io.").is_ok());
        assert!(validate_wildcard_domain("").is_err());
        assert!(validate_wildcard_domain("a.*.com").is_err());
        assert!(validate_wildcard_domain("a..com").is_err());
        assert!(validate_wildcard_domain("foo.123").is_err());
        assert!(validate_wildcard_domain("under_score.com").is_err());
        assert!(validate_fqdn("*.example.com").is_err());
        assert!(validate_fqdn("api.example.com").is_ok());
    }

    #[test]
    fn host_matching_is_istios() {
        assert!(hosts_match("*.com", "*.foo.com"));
        assert!(hosts_match("*.foo.com", "a.foo.com"));
        assert!(hosts_match("a.foo.com", "a.foo.com"));
        assert!(!hosts_match("a.foo.com", "b.foo.com"));
        assert!(host_subset_of("a.foo.com", "*.foo.com"));
        assert!(host_subset_of("*.a.foo.com", "*.foo.com"));
        assert!(!host_subset_of("*.foo.com", "a.foo.com"));
    }

    #[test]
    fn addresses() {
        assert!(validate_ip_subnet("10.0.0.0/8").is_ok());
        assert!(validate_ip_subnet("2001:db8::/32").is_ok());
        assert!(validate_ip_subnet("10.0.0.1").is_ok());
        assert!(validate_ip_subnet("10.0.0.0/33").is_err());
        assert!(validate_ip_subnet("10.0.0.0/8/8").is_err());
        assert!(validate_ip_subnet("example.com").is_err());
        assert!(validate_unix_address("/var/run/a.sock").is_ok());
        assert!(validate_unix_address("@abstract").is_ok());
        assert!(validate_unix_address("relative.sock").is_err());
        assert!(validate_unix_address("/var/run/").is_err());
    }

    #[test]
    fn labels_and_durations() {
        assert!(validate_label_key("app").is_ok());
        assert!(validate_label_key("topology.istio.io/network").is_ok());
        assert!(validate_label_key("/app").is_err());
        assert!(validate_label_key("a b").is_err());
        assert!(validate_label_value("").is_ok());
        assert!(validate_label_value("v1.2_3").is_ok());
        assert!(validate_label_value("-v1").is_err());
        assert!(validate_duration(&Duration::from_millis(1)).is_ok());
        assert!(validate_duration(&Duration::from_secs(0)).is_err());
        assert!(validate_duration(&Duration::new(0, 1_500_000)).is_err());
        assert!(validate_duration(&Duration::from_secs(-1)).is_err());
    }

    #[test]
    fn header_names_are_rfc9110_tokens() {
        for good in ["x-request-id", "X-Upper", "a.b", "x_y", "!#$%&'*+-.^_`|~09"] {
            assert!(validate_header_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "Bad Header:",
            "x:y",
            "a b",
            "a\"b",
            "x(y)",
            "caf\u{e9}",
            "x\ny",
            ":path",
        ] {
            assert!(validate_header_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_match_header_name(":authority").is_ok());
        assert!(validate_match_header_name(":path").is_ok());
        assert!(validate_match_header_name(":foo").is_err());
        assert!(validate_match_header_name("Bad Header:").is_err());
    }

    #[test]
    fn protocols() {
        assert!(validate_protocol("").is_ok(), "empty means sniffed");
        assert!(validate_protocol("http2").is_ok());
        assert!(validate_protocol("GRPC-Web").is_ok());
        assert!(validate_protocol("HTTPZ").is_err());
        assert!(validate_protocol("unsupported").is_err());
    }
}

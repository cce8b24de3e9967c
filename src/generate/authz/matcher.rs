//! Envoy matchers for AuthorizationPolicy values, with Istio's wildcard rules: a value
//! is `*` (anything), `*x` (ends with x), `x*` (starts with x) or exact.

use envoy_types::pb::envoy::config::core::v3::CidrRange;
use envoy_types::pb::envoy::config::route::v3::{HeaderMatcher, header_matcher};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    ListMatcher, MetadataMatcher, OrMatcher, PathMatcher, RegexMatcher, StringMatcher,
    ValueMatcher, list_matcher, metadata_matcher, path_matcher, string_matcher, value_matcher,
};
use envoy_types::pb::google::protobuf::UInt32Value;

/// Escapes the characters RE2 treats as operators (the set Go's `regexp.QuoteMeta`
/// escapes; `-` stays as is).
pub fn quote_meta(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn pattern(p: string_matcher::MatchPattern, ignore_case: bool) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(p),
        ignore_case,
    }
}

/// A safe-regex string matcher.
pub fn regex(r: &str) -> StringMatcher {
    pattern(
        string_matcher::MatchPattern::SafeRegex(RegexMatcher {
            regex: r.to_string(),
            ..Default::default()
        }),
        false,
    )
}

pub fn exact(v: &str, ignore_case: bool) -> StringMatcher {
    pattern(
        string_matcher::MatchPattern::Exact(v.to_string()),
        ignore_case,
    )
}

pub fn prefix(v: &str, ignore_case: bool) -> StringMatcher {
    pattern(
        string_matcher::MatchPattern::Prefix(v.to_string()),
        ignore_case,
    )
}

pub fn suffix(v: &str, ignore_case: bool) -> StringMatcher {
    pattern(
        string_matcher::MatchPattern::Suffix(v.to_string()),
        ignore_case,
    )
}

/// A value with wildcards, matched against strings that start with `pfx` followed by
/// the value: `*` matches anything non-empty (whatever the prefix), `*x` becomes a
/// suffix match (a regex when there is a prefix), `x*` a prefix match. As in Istio,
/// the rest of a `*x` value goes into the regex unescaped (so `.` or `[0]` in it are
/// regex syntax).
pub fn string_with_prefix(v: &str, pfx: &str) -> StringMatcher {
    if v == "*" {
        regex(".+")
    } else if let Some(rest) = v.strip_prefix('*') {
        if pfx.is_empty() {
            suffix(rest, false)
        } else {
            regex(&format!("{pfx}.*{rest}"))
        }
    } else if let Some(rest) = v.strip_suffix('*') {
        prefix(&format!("{pfx}{rest}"), false)
    } else {
        exact(&format!("{pfx}{v}"), false)
    }
}

/// [`string_with_prefix`] without a prefix.
pub fn string(v: &str) -> StringMatcher {
    string_with_prefix(v, "")
}

fn header_with(name: &str, m: header_matcher::HeaderMatchSpecifier) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(m),
        ..Default::default()
    }
}

/// A header matcher: `*` is presence, `*x` suffix, `x*` prefix, else exact.
pub fn header(name: &str, v: &str) -> HeaderMatcher {
    header_ci(name, v, false)
}

/// [`header`], case-insensitive on the value (`:authority`).
pub fn header_ci(name: &str, v: &str, ignore_case: bool) -> HeaderMatcher {
    use header_matcher::HeaderMatchSpecifier as S;
    let spec = if v == "*" {
        S::PresentMatch(true)
    } else if let Some(rest) = v.strip_prefix('*') {
        S::StringMatch(suffix(rest, ignore_case))
    } else if let Some(rest) = v.strip_suffix('*') {
        S::StringMatch(prefix(rest, ignore_case))
    } else {
        S::StringMatch(exact(v, ignore_case))
    };
    header_with(name, spec)
}

/// The host matcher: `:authority`, case-insensitive.
pub fn host(v: &str) -> HeaderMatcher {
    header_ci(":authority", v, true)
}

/// A path matcher on the path without query.
pub fn path(v: &str) -> PathMatcher {
    PathMatcher {
        rule: Some(path_matcher::Rule::Path(string(v))),
    }
}

/// Whether a path uses Istio's URI template operators (`{*}`, `{**}`).
pub fn is_uri_template(v: &str) -> bool {
    v.contains("{*}") || v.contains("{**}")
}

/// The Envoy URI template for an Istio path with `{*}` / `{**}` operators.
pub fn uri_template(v: &str) -> String {
    v.replace("{**}", "**").replace("{*}", "*")
}

/// A metadata matcher on `filter` at `path` with a string value matcher.
pub fn metadata(filter: &str, path: &[&str], m: StringMatcher) -> MetadataMatcher {
    metadata_value(
        filter,
        path,
        ValueMatcher {
            match_pattern: Some(value_matcher::MatchPattern::StringMatch(m)),
        },
    )
}

fn metadata_value(filter: &str, path: &[&str], v: ValueMatcher) -> MetadataMatcher {
    MetadataMatcher {
        filter: filter.to_string(),
        path: path
            .iter()
            .map(|k| metadata_matcher::PathSegment {
                segment: Some(metadata_matcher::path_segment::Segment::Key(k.to_string())),
            })
            .collect(),
        value: Some(v),
        invert: false,
    }
}

/// A metadata matcher for a value that is a list with an element matching `m`.
pub fn metadata_list(filter: &str, path: &[&str], m: StringMatcher) -> MetadataMatcher {
    let list = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
            ListMatcher {
                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(ValueMatcher {
                    match_pattern: Some(value_matcher::MatchPattern::StringMatch(m)),
                }))),
            },
        ))),
    };
    metadata_value(filter, path, list)
}

/// A value matcher for any of `values` (each with the usual wildcards).
pub fn any_of(values: &[String]) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
            value_matchers: values
                .iter()
                .map(|v| ValueMatcher {
                    match_pattern: Some(value_matcher::MatchPattern::StringMatch(string(v))),
                })
                .collect(),
        })),
    }
}

/// A metadata matcher for a value that is any of `values`.
pub fn metadata_any_of(filter: &str, path: &[&str], values: &[String]) -> MetadataMatcher {
    metadata_value(filter, path, any_of(values))
}

/// A metadata matcher for a JWT claim that is any of `values`, or a list holding one
/// of them.
pub fn claim_any_of(filter: &str, path: &[&str], values: &[String]) -> MetadataMatcher {
    let any = any_of(values);
    let list = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
            ListMatcher {
                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(any.clone()))),
            },
        ))),
    };
    metadata_value(
        filter,
        path,
        ValueMatcher {
            match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
                value_matchers: vec![list, any],
            })),
        },
    )
}

/// An IP or CIDR block (`1.2.3.4`, `10.0.0.0/8`, `::1`) as a range with the host
/// bits cleared.
pub fn cidr(v: &str) -> Result<CidrRange, String> {
    let (addr, len) = match v.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (v, None),
    };
    let ip: std::net::IpAddr = addr
        .trim()
        .parse()
        .map_err(|_| format!("invalid IP address or CIDR range {v:?}"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len: u32 = match len {
        Some(l) => l
            .trim()
            .parse()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(|| format!("invalid CIDR prefix length in {v:?}"))?,
        None => max,
    };
    let masked = match ip {
        std::net::IpAddr::V4(a) => {
            let bits = u32::from(a);
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            std::net::IpAddr::V4((bits & mask).into())
        }
        std::net::IpAddr::V6(a) => {
            let bits = u128::from(a);
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            std::net::IpAddr::V6((bits & mask).into())
        }
    };
    Ok(CidrRange {
        address_prefix: masked.to_string(),
        prefix_len: Some(UInt32Value { value: len }),
    })
}

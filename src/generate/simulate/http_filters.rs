//! What an HTTP connection manager does to a request before it is routed: the path
//! normalization it is configured with, and its RBAC filters' verdict.
//!
//! Path normalization follows Envoy: first `path_with_escaped_slashes_action`
//! (`UNESCAPE_AND_FORWARD` turns `%2F` into `/` and `%5C` into `\`), then with
//! `normalize_path` the URL canonicalization (backslashes become slashes, escapes of
//! unreserved characters are decoded, `.` and `..` segments are removed as RFC 3986
//! says), then with `merge_slashes` runs of slashes become one. The query string is
//! left alone and the fragment is dropped.
//!
//! RBAC: each `envoy.filters.http.rbac` filter's enforced `rules` in order; a DENY
//! policy that matches, or an ALLOW filter none of whose policies matches, answers 403.
//! Permissions on paths, headers, methods, destination ports and their and/or/not
//! combinations are modelled, principals only as `any` (and/or/not of it); anything
//! else is [`SimError::Unsupported`], so a test cannot pass by accident.

use envoy_types::pb::envoy::config::rbac::v3::{
    Permission, Principal, Rbac as RbacRules, permission, principal, rbac::Action,
};
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::PathWithEscapedSlashesAction, http_filter,
};
use envoy_types::pb::envoy::r#type::matcher::v3::path_matcher;
use prost::{Message, Name};

use super::{Request, SimError, header_matches, string_matches};

/// The RBAC HTTP filter's name.
const RBAC_FILTER: &str = "envoy.filters.http.rbac";

/// The `:path` the filters and routes of `hcm` see for a request sent with `path`.
pub fn normalized_path(hcm: &HttpConnectionManager, path: &str) -> String {
    let (path, query) = match path.find('?') {
        Some(i) => (&path[..i], &path[i..]),
        None => (path, ""),
    };
    let path = path.split('#').next().unwrap_or("");
    let mut out = path.to_string();
    if hcm.path_with_escaped_slashes_action
        == PathWithEscapedSlashesAction::UnescapeAndForward as i32
    {
        out = unescape_slashes(&out);
    }
    if hcm.normalize_path.is_some_and(|b| b.value) {
        out = remove_dot_segments(&decode_unreserved(&out.replace('\\', "/")));
    }
    if hcm.merge_slashes {
        let mut merged = String::with_capacity(out.len());
        for c in out.chars() {
            if !(c == '/' && merged.ends_with('/')) {
                merged.push(c);
            }
        }
        out = merged;
    }
    out + query
}

/// `%2F` / `%2f` to `/`, `%5C` / `%5c` to `\`.
fn unescape_slashes(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 3).map(str::to_ascii_uppercase);
        match code.as_deref() {
            Some("2F") => out.push('/'),
            Some("5C") => out.push('\\'),
            _ => {
                out.push('%');
                rest = &rest[i + 1..];
                continue;
            }
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    out
}

/// Decodes the escapes of unreserved characters (letters, digits, `-._~`); other
/// escapes stay as written.
fn decode_unreserved(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let decoded = rest
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .filter(|b| b.is_ascii_alphanumeric() || b"-._~".contains(b));
        match decoded {
            Some(b) => {
                out.push(char::from(b));
                rest = &rest[i + 3..];
            }
            None => {
                out.push('%');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// RFC 3986 section 5.2.4.
fn remove_dot_segments(path: &str) -> String {
    let mut input = path.to_string();
    let mut out = String::with_capacity(path.len());
    let pop = |out: &mut String| {
        let cut = out.rfind('/').unwrap_or(0);
        out.truncate(cut);
    };
    while !input.is_empty() {
        if input.starts_with("../") {
            input.drain(..3);
        } else if input.starts_with("./") {
            input.drain(..2);
        } else if input.starts_with("/./") {
            input.replace_range(..3, "/");
        } else if input == "/." {
            input = "/".into();
        } else if input.starts_with("/../") {
            input.replace_range(..4, "/");
            pop(&mut out);
        } else if input == "/.." {
            input = "/".into();
            pop(&mut out);
        } else if input == "." || input == ".." {
            input.clear();
        } else {
            let start = usize::from(input.starts_with('/'));
            let end = input[start..].find('/').map_or(input.len(), |i| i + start);
            out.push_str(&input[..end]);
            input.drain(..end);
        }
    }
    out
}

/// The status the connection manager's RBAC filters answer `req` with (403), or
/// `None` when they let it through.
pub fn rbac_verdict(
    hcm: &HttpConnectionManager,
    req: &Request,
    port: u16,
) -> Result<Option<u32>, SimError> {
    for f in hcm.http_filters.iter().filter(|f| f.name == RBAC_FILTER) {
        let Some(http_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
            continue;
        };
        if any.type_url != HttpRbac::type_url() {
            continue;
        }
        let config = HttpRbac::decode(any.value.as_slice())
            .map_err(|e| SimError::Unsupported(format!("undecodable RBAC: {e}")))?;
        let Some(rules) = config.rules else {
            continue;
        };
        if !allows(&rules, req, port)? {
            return Ok(Some(403));
        }
    }
    Ok(None)
}

fn allows(rules: &RbacRules, req: &Request, port: u16) -> Result<bool, SimError> {
    let mut matched = false;
    // Sorted, so an unsupported rule is reported the same way every time.
    let mut policies: Vec<_> = rules.policies.iter().collect();
    policies.sort_by(|a, b| a.0.cmp(b.0));
    for (name, policy) in policies {
        if policy.condition.is_some() || policy.checked_condition.is_some() {
            return Err(SimError::Unsupported(format!("RBAC condition of {name}")));
        }
        let mut p = false;
        for permission in &policy.permissions {
            p |= permission_matches(permission, req, port)?;
        }
        let mut who = false;
        for principal in &policy.principals {
            who |= principal_matches(principal)?;
        }
        matched |= p && who;
    }
    Ok(match Action::try_from(rules.action) {
        Ok(Action::Allow) => matched,
        Ok(Action::Deny) => !matched,
        _ => true,
    })
}

fn permission_matches(p: &Permission, req: &Request, port: u16) -> Result<bool, SimError> {
    use permission::Rule;
    Ok(match &p.rule {
        Some(Rule::Any(any)) => *any,
        Some(Rule::AndRules(set)) => {
            let mut all = true;
            for r in &set.rules {
                all &= permission_matches(r, req, port)?;
            }
            all
        }
        Some(Rule::OrRules(set)) => {
            let mut one = false;
            for r in &set.rules {
                one |= permission_matches(r, req, port)?;
            }
            one
        }
        Some(Rule::NotRule(r)) => !permission_matches(r, req, port)?,
        Some(Rule::UrlPath(m)) => match &m.rule {
            Some(path_matcher::Rule::Path(sm)) => string_matches(sm, req.path_only())?,
            None => false,
        },
        Some(Rule::Header(h)) => header_matches(h, req)?,
        Some(Rule::DestinationPort(p)) => *p == u32::from(port),
        other => {
            return Err(SimError::Unsupported(format!("RBAC permission {other:?}")));
        }
    })
}

fn principal_matches(p: &Principal) -> Result<bool, SimError> {
    use principal::Identifier;
    Ok(match &p.identifier {
        Some(Identifier::Any(any)) => *any,
        Some(Identifier::AndIds(set)) => {
            let mut all = true;
            for id in &set.ids {
                all &= principal_matches(id)?;
            }
            all
        }
        Some(Identifier::OrIds(set)) => {
            let mut one = false;
            for id in &set.ids {
                one |= principal_matches(id)?;
            }
            one
        }
        Some(Identifier::NotId(id)) => !principal_matches(id)?,
        other => {
            return Err(SimError::Unsupported(format!("RBAC principal {other:?}")));
        }
    })
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::google::protobuf::BoolValue;
    use meshfed_api::mesh::v1alpha1::mesh_config::proxy_path_normalization::NormalizationType;

    use super::*;

    /// A connection manager configured as Istio configures it for `normalization`.
    fn hcm(normalization: NormalizationType) -> HttpConnectionManager {
        let (normalize, merge, action) =
            crate::generate::lds::hcm::path_normalization(normalization);
        HttpConnectionManager {
            normalize_path: Some(BoolValue { value: normalize }),
            merge_slashes: merge,
            path_with_escaped_slashes_action: action as i32,
            ..Default::default()
        }
    }

    /// Istio's `TestNormalization` (tests/integration/security/normalization_test.go):
    /// the path the application receives, per MeshConfig `pathNormalization`, as a
    /// real Envoy produced it.
    #[test]
    fn istio_normalization_vectors() {
        use NormalizationType::*;
        let cases: &[(NormalizationType, &[(&str, &str)])] = &[
            (
                None,
                &[
                    ("/", "/"),
                    ("/app/", "/app/"),
                    ("/app/../admin", "/app/../admin"),
                    ("/app", "/app"),
                    ("/app//", "/app//"),
                    ("/app/%2f", "/app/%2f"),
                    ("/app%2f/", "/app%2f/"),
                    ("/xyz%30..//abc", "/xyz%30..//abc"),
                    ("/app/%2E./admin", "/app/%2E./admin"),
                    (r"/app\admin", r"/app\admin"),
                    (r"/app/\/\/\admin", r"/app/\/\/\admin"),
                    (r"/%2Fapp%5cadmin%5Cabc", r"/%2Fapp%5cadmin%5Cabc"),
                    (
                        r"/%5Capp%2f%5c%2F%2e%2e%2fadmin%5c\abc",
                        r"/%5Capp%2f%5c%2F%2e%2e%2fadmin%5c\abc",
                    ),
                    ("/app//../admin", "/app//../admin"),
                    ("/app//../../admin", "/app//../../admin"),
                ],
            ),
            (
                Base,
                &[
                    ("/", "/"),
                    ("/app/", "/app/"),
                    ("/app/../admin", "/admin"),
                    ("/app", "/app"),
                    ("/app//", "/app//"),
                    ("/app/%2f", "/app/%2f"),
                    ("/app%2f/", "/app%2f/"),
                    ("/xyz%30..//abc", "/xyz0..//abc"),
                    ("/app/%2E./admin", "/admin"),
                    (r"/app\admin", "/app/admin"),
                    (r"/app/\/\/\admin", "/app//////admin"),
                    (r"/%2Fapp%5cadmin%5Cabc", r"/%2Fapp%5cadmin%5Cabc"),
                    (
                        r"/%5Capp%2f%5c%2F%2e%2e%2fadmin%5c\abc",
                        "/%5Capp%2f%5c%2F..%2fadmin%5c/abc",
                    ),
                    ("/app//../admin", "/app/admin"),
                    ("/app//../../admin", "/admin"),
                ],
            ),
            (
                MergeSlashes,
                &[
                    ("/", "/"),
                    ("/app#foo", "/app"),
                    ("/app/", "/app/"),
                    ("/app/../admin", "/admin"),
                    ("/app", "/app"),
                    ("/app//", "/app/"),
                    ("/app/%2f", "/app/%2f"),
                    ("/app%2f/", "/app%2f/"),
                    ("/xyz%30..//abc", "/xyz0../abc"),
                    ("/app/%2E./admin", "/admin"),
                    (r"/app\admin", "/app/admin"),
                    (r"/app/\/\/\admin", "/app/admin"),
                    (r"/%2Fapp%5cadmin%5Cabc", r"/%2Fapp%5cadmin%5Cabc"),
                    (
                        r"/%5Capp%2f%5c%2F%2e%2e%2fadmin%5c\abc",
                        "/%5Capp%2f%5c%2F..%2fadmin%5c/abc",
                    ),
                    ("/app//../admin", "/app/admin"),
                    ("/app//../../admin", "/admin"),
                ],
            ),
            (
                DecodeAndMergeSlashes,
                &[
                    ("/", "/"),
                    ("/app/", "/app/"),
                    ("/app/../admin", "/admin"),
                    ("/app", "/app"),
                    ("/app//", "/app/"),
                    ("/app/%2f", "/app/"),
                    ("/app%2f/", "/app/"),
                    ("/xyz%30..//abc", "/xyz0../abc"),
                    ("/app/%2E./admin", "/admin"),
                    (r"/app\admin", "/app/admin"),
                    (r"/app/\/\/\admin", "/app/admin"),
                    (r"/%2Fapp%5cadmin%5Cabc", "/app/admin/abc"),
                    (r"/%5Capp%2f%5c%2F%2e%2e%2fadmin%5c\abc", "/app/admin/abc"),
                    ("/app//../admin", "/app/admin"),
                    ("/app//../../admin", "/admin"),
                ],
            ),
        ];
        let mut failed = Vec::new();
        let mut total = 0;
        for (normalization, vectors) in cases {
            let hcm = hcm(*normalization);
            for (input, expected) in *vectors {
                total += 1;
                let got = normalized_path(&hcm, input);
                if got != *expected {
                    failed.push(format!("{normalization:?} {input}: {got} != {expected}"));
                }
            }
        }
        assert!(
            failed.is_empty(),
            "{} of {total} failed:\n{}",
            failed.len(),
            failed.join("\n")
        );
        // The query string is not normalized.
        assert_eq!(normalized_path(&hcm(Base), "/a/../b?x=/../y"), "/b?x=/../y");
    }
}

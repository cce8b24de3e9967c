//! Validation of the `security.istio.io` kinds, after Istio's
//! `ValidatePeerAuthentication`, `ValidateRequestAuthentication` and
//! `ValidateAuthorizationPolicy` (`pkg/config/validation`) and the attribute checks of
//! `pkg/config/security`.
//!
//! Beyond Istio: an inline `jwks` is checked for the shape of a JSON Web Key Set (a
//! `keys` array of objects with a known `kty`) rather than parsed with a JOSE library;
//! a JWKS Istio's parser accepts and this check refuses is a bug.

use meshfed_api::security::v1beta1 as sec;
use meshfed_api::r#type::v1beta1::{PolicyTargetReference, WorkloadSelector};
use sec::authorization_policy::Action;

use super::common::{check_duration, validate_header_name, validate_selector_labels};
use super::{FieldPath, Findings, Validation};

/// PeerAuthentication: port-level modes need a selector, ports are 1..65535.
pub fn validate_peer_authentication(pa: &sec::PeerAuthentication) -> Validation {
    let mut f = Findings::new();
    let spec = FieldPath::spec();
    let empty_selector = pa
        .selector
        .as_ref()
        .is_none_or(|s| s.match_labels.is_empty());
    if empty_selector && !pa.port_level_mtls.is_empty() {
        f.error(
            &spec.field("portLevelMtls"),
            "mesh/namespace peer authentication cannot have port level mTLS",
        );
    }
    for port in pa.port_level_mtls.keys() {
        if *port == 0 || *port > 65535 {
            f.error(
                &spec.field("portLevelMtls").key(&port.to_string()),
                "port must be in range 1..65535",
            );
        }
    }
    selector(&mut f, &spec, pa.selector.as_ref());
    f.finish()
}

/// RequestAuthentication: one way of selecting, each JWT rule well formed.
pub fn validate_request_authentication(ra: &sec::RequestAuthentication) -> Validation {
    let mut f = Findings::new();
    let spec = FieldPath::spec();
    targets(
        &mut f,
        &spec,
        ra.selector.as_ref(),
        ra.target_ref.as_ref(),
        &ra.target_refs,
    );
    for (i, rule) in ra.jwt_rules.iter().enumerate() {
        jwt_rule(&mut f, &spec.field("jwtRules").index(i), rule);
    }
    f.finish()
}

/// AuthorizationPolicy: selection, action and provider, every rule.
pub fn validate_authorization_policy(ap: &sec::AuthorizationPolicy) -> Validation {
    let mut f = Findings::new();
    let spec = FieldPath::spec();
    targets(
        &mut f,
        &spec,
        ap.selector.as_ref(),
        ap.target_ref.as_ref(),
        &ap.target_refs,
    );
    let action = Action::try_from(ap.action).unwrap_or(Action::Allow);
    let provider = ap
        .action_detail
        .as_ref()
        .map(|sec::authorization_policy::ActionDetail::Provider(p)| p);
    if action == Action::Custom {
        if ap.rules.is_empty() {
            f.error(
                &spec.field("rules"),
                "CUSTOM action without `rules` is meaningless as it will never be triggered, \
                 add an empty rule `{}` if you want it be triggered for every request",
            );
        } else if provider.is_none_or(|p| p.name.is_empty()) {
            f.error(
                &spec.field("provider").field("name"),
                "`provider.name` must not be empty",
            );
        }
        for (i, rule) in ap.rules.iter().enumerate() {
            let at = spec.field("rules").index(i);
            for (j, from) in rule.from.iter().enumerate() {
                let Some(src) = &from.source else { continue };
                let here = at.field("from").index(j).field("source");
                for (set, name) in [
                    (!src.namespaces.is_empty(), "namespaces"),
                    (!src.not_namespaces.is_empty(), "notNamespaces"),
                    (!src.service_accounts.is_empty(), "serviceAccounts"),
                    (!src.not_service_accounts.is_empty(), "notServiceAccounts"),
                    (!src.principals.is_empty(), "principals"),
                    (!src.not_principals.is_empty(), "notPrincipals"),
                    (!src.request_principals.is_empty(), "requestPrincipals"),
                    (
                        !src.not_request_principals.is_empty(),
                        "notRequestPrincipals",
                    ),
                ] {
                    if set {
                        f.error(
                            &here.field(name),
                            format!("{name} is currently not supported with CUSTOM action"),
                        );
                    }
                }
            }
            for (j, when) in rule.when.iter().enumerate() {
                let key = when.key.as_str();
                if matches!(
                    key,
                    "source.namespace" | "source.serviceAccount" | "source.principal"
                ) || key.starts_with("request.auth.")
                {
                    f.error(
                        &at.field("when").index(j).field("key"),
                        format!("{key} is currently not supported with CUSTOM action"),
                    );
                }
            }
        }
    } else if provider.is_some() {
        f.error(
            &spec.field("provider"),
            format!(
                "`provider` must not be with non CUSTOM action, found {}",
                action.as_str_name()
            ),
        );
    }
    if action == Action::Deny && ap.rules.is_empty() {
        f.error(
            &spec.field("rules"),
            "DENY action without `rules` is meaningless as it will never be triggered, \
             add an empty rule `{}` if you want it be triggered for every request",
        );
    }
    for (i, r) in ap.rules.iter().enumerate() {
        rule(&mut f, &spec.field("rules").index(i), r, action);
    }
    f.finish()
}

fn selector(f: &mut Findings, spec: &FieldPath, selector: Option<&WorkloadSelector>) {
    if let Some(s) = selector {
        validate_selector_labels(
            f,
            &spec.field("selector").field("matchLabels"),
            &s.match_labels,
            "the policy applies to every workload of its namespace",
        );
    }
}

pub(crate) fn targets(
    f: &mut Findings,
    spec: &FieldPath,
    sel: Option<&WorkloadSelector>,
    target_ref: Option<&PolicyTargetReference>,
    target_refs: &[PolicyTargetReference],
) {
    let set = usize::from(sel.is_some())
        + usize::from(target_ref.is_some())
        + usize::from(!target_refs.is_empty());
    if set > 1 {
        f.error(
            spec,
            "only one of targetRefs or workloadSelector can be set",
        );
    }
    selector(f, spec, sel);
    if let Some(r) = target_ref {
        target(f, &spec.field("targetRef"), r);
    }
    for (i, r) in target_refs.iter().enumerate() {
        target(f, &spec.field("targetRefs").index(i), r);
    }
}

/// Istio allows Service, ServiceEntry, Gateway API Gateway and GatewayClass targets.
fn target(f: &mut Findings, at: &FieldPath, r: &PolicyTargetReference) {
    if r.name.is_empty() {
        f.error(&at.field("name"), "targetRef name must be set");
    }
    if !r.namespace.is_empty() {
        f.error(
            &at.field("namespace"),
            "targetRef namespace must not be set; cross namespace referencing is not supported",
        );
    }
    let group = if r.group.is_empty() {
        "core"
    } else {
        r.group.as_str()
    };
    let allowed = matches!(
        (group, r.kind.as_str()),
        ("core", "Service")
            | ("networking.istio.io", "ServiceEntry")
            | ("gateway.networking.k8s.io", "Gateway")
            | ("gateway.networking.k8s.io", "GatewayClass")
    );
    if !allowed {
        f.error(
            at,
            format!(
                "targetRef must be to one of Service, ServiceEntry, gateway.networking.k8s.io \
                 Gateway or GatewayClass but was {}/{}",
                r.group, r.kind
            ),
        );
    }
}

fn jwt_rule(f: &mut Findings, at: &FieldPath, rule: &sec::JwtRule) {
    for (i, a) in rule.audiences.iter().enumerate() {
        if a.is_empty() {
            f.error(
                &at.field("audiences").index(i),
                "audience must be non-empty string",
            );
        }
    }
    if rule.issuer.is_empty() && rule.jwks_uri.is_empty() {
        f.error(
            &at.field("issuer"),
            "issuer or jwksUri must be non-empty string",
        );
    }
    if !rule.jwks_uri.is_empty() {
        f.check(&at.field("jwksUri"), check_jwks_uri(&rule.jwks_uri));
    }
    if !rule.jwks.is_empty() {
        f.check(&at.field("jwks"), check_jwks(&rule.jwks));
    }
    for (i, h) in rule.from_headers.iter().enumerate() {
        if h.name.is_empty() {
            f.error(
                &at.field("fromHeaders").index(i).field("name"),
                "location header name must be non-empty string",
            );
        }
    }
    for (i, p) in rule.from_params.iter().enumerate() {
        if p.is_empty() {
            f.error(
                &at.field("fromParams").index(i),
                "location query must be non-empty string",
            );
        }
    }
    for (i, c) in rule.from_cookies.iter().enumerate() {
        if c.is_empty() {
            f.error(
                &at.field("fromCookies").index(i),
                "cookie name must be non-empty string",
            );
        }
    }
    for (i, c) in rule.output_claim_to_headers.iter().enumerate() {
        let here = at.field("outputClaimToHeaders").index(i);
        if c.claim.is_empty() || c.header.is_empty() {
            f.error(
                &here,
                "outputClaimToHeaders header and claim value must be non-empty string",
            );
            continue;
        }
        f.check(&here.field("header"), validate_header_name(&c.header));
    }
    check_duration(f, &at.field("timeout"), rule.timeout.as_ref());
}

/// Istio's `ParseJwksURI`: an http or https URL with a host.
fn check_jwks_uri(uri: &str) -> Result<(), String> {
    let (scheme, rest) = uri
        .split_once("://")
        .ok_or_else(|| format!("invalid jwksUri {uri:?}: not a URL"))?;
    if scheme != "http" && scheme != "https" {
        return Err(format!("URI scheme {scheme:?} is not supported"));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.is_empty() {
        return Err(format!("invalid jwksUri {uri:?}: no host"));
    }
    if let Some((_, port)) = host.rsplit_once(':').filter(|_| !host.ends_with(']'))
        && port.parse::<u16>().is_err()
    {
        return Err(format!("invalid jwksUri {uri:?}: bad port {port:?}"));
    }
    Ok(())
}

/// A JSON Web Key Set: `{"keys": [{"kty": ...}, ...]}`.
fn check_jwks(jwks: &str) -> Result<(), String> {
    let value: serde_json::Value =
        serde_json::from_str(jwks).map_err(|e| format!("jwks parse error: {e}"))?;
    let keys = value
        .get("keys")
        .and_then(|k| k.as_array())
        .ok_or("jwks parse error: no `keys` array")?;
    for (i, key) in keys.iter().enumerate() {
        match key.get("kty").and_then(|k| k.as_str()) {
            Some("RSA" | "EC" | "oct" | "OKP") => {}
            Some(other) => return Err(format!("jwks parse error: key {i}: unknown kty {other:?}")),
            None => return Err(format!("jwks parse error: key {i} has no kty")),
        }
    }
    Ok(())
}

fn rule(f: &mut Findings, at: &FieldPath, rule: &sec::Rule, action: Action) {
    let mut tcp_in_from = false;
    let mut tcp_in_to = false;
    for (j, from) in rule.from.iter().enumerate() {
        let here = at.field("from").index(j).field("source");
        let Some(src) = &from.source else {
            f.error(&here, "`from.source` must not be nil");
            continue;
        };
        let peer = src.principals.len()
            + src.not_principals.len()
            + src.namespaces.len()
            + src.not_namespaces.len();
        if peer > 0 && src.service_accounts.len() + src.not_service_accounts.len() > 0 {
            f.error(
                &here,
                "cannot set serviceAccounts with namespaces or principals",
            );
        }
        let lists: [(&str, &Vec<String>); 12] = [
            ("principals", &src.principals),
            ("notPrincipals", &src.not_principals),
            ("requestPrincipals", &src.request_principals),
            ("notRequestPrincipals", &src.not_request_principals),
            ("namespaces", &src.namespaces),
            ("notNamespaces", &src.not_namespaces),
            ("ipBlocks", &src.ip_blocks),
            ("notIpBlocks", &src.not_ip_blocks),
            ("remoteIpBlocks", &src.remote_ip_blocks),
            ("notRemoteIpBlocks", &src.not_remote_ip_blocks),
            ("serviceAccounts", &src.service_accounts),
            ("notServiceAccounts", &src.not_service_accounts),
        ];
        if lists.iter().all(|(_, v)| v.is_empty()) {
            f.error(&here, "`from.source` must not be empty");
        }
        for (name, values) in lists {
            let field = here.field(name);
            match name {
                "serviceAccounts" | "notServiceAccounts" => {
                    f.check(&field, check_service_accounts(name, values))
                }
                _ => f.check(&field, check_empty(name, values)),
            }
            if name.ends_with("pBlocks") || name.ends_with("IpBlocks") {
                f.check(&field, check_ips(values));
            }
            if name == "principals" || name == "notPrincipals" {
                for (k, v) in values.iter().enumerate() {
                    if let Some(why) = principal_never_matches(v) {
                        f.warn(&field.index(k), why);
                    }
                }
            }
        }
        tcp_in_from |= !(src.principals.is_empty()
            && src.not_principals.is_empty()
            && src.ip_blocks.is_empty()
            && src.not_ip_blocks.is_empty()
            && src.namespaces.is_empty()
            && src.not_namespaces.is_empty()
            && src.remote_ip_blocks.is_empty()
            && src.not_remote_ip_blocks.is_empty()
            && src.service_accounts.is_empty()
            && src.not_service_accounts.is_empty());
    }
    for (j, to) in rule.to.iter().enumerate() {
        let here = at.field("to").index(j).field("operation");
        let Some(op) = &to.operation else {
            f.error(&here, "`to.operation` must not be nil");
            continue;
        };
        let lists: [(&str, &Vec<String>); 8] = [
            ("ports", &op.ports),
            ("methods", &op.methods),
            ("paths", &op.paths),
            ("hosts", &op.hosts),
            ("notPorts", &op.not_ports),
            ("notMethods", &op.not_methods),
            ("notPaths", &op.not_paths),
            ("notHosts", &op.not_hosts),
        ];
        if lists.iter().all(|(_, v)| v.is_empty()) {
            f.error(&here, "`to.operation` must not be empty");
        }
        for (name, values) in lists {
            let field = here.field(name);
            f.check(&field, check_empty(name, values));
            if name.ends_with("orts") {
                f.check(&field, check_ports(values));
            }
            if name.ends_with("aths") {
                f.check(&field, check_path_templates(name, values));
            }
        }
        tcp_in_to |= !(op.ports.is_empty() && op.not_ports.is_empty());
    }
    for (j, c) in rule.when.iter().enumerate() {
        let here = at.field("when").index(j);
        if c.key.is_empty() {
            f.error(&here.field("key"), "`key` must not be empty");
        } else if c.values.is_empty() && c.not_values.is_empty() {
            f.error(
                &here,
                format!(
                    "at least one of `values` or `notValues` must be set for key {}",
                    c.key
                ),
            );
        } else {
            if let Err(e) = check_attribute(&c.key, &c.values) {
                f.error(
                    &here.field("values"),
                    format!("invalid `value` for `key` {}: {e}", c.key),
                );
            }
            if let Err(e) = check_attribute(&c.key, &c.not_values) {
                f.error(
                    &here.field("notValues"),
                    format!("invalid `notValue` for `key` {}: {e}", c.key),
                );
            }
        }
    }
    let from_set = rule.from.iter().any(|r| r.source.is_some());
    let to_set = rule.to.iter().any(|r| r.operation.is_some());
    if action == Action::Deny && ((from_set && !to_set && !tcp_in_from) || (to_set && !tcp_in_to)) {
        f.warn(
            at,
            "configured AuthorizationPolicy will deny all traffic to TCP ports under its scope \
             due to the use of only HTTP attributes in a DENY rule; it is recommended to \
             explicitly specify the port",
        );
    }
}

fn check_empty(name: &str, values: &[String]) -> Result<(), String> {
    if values.iter().any(String::is_empty) {
        return Err(format!("empty value not allowed, found in {name}"));
    }
    Ok(())
}

fn check_service_accounts(name: &str, values: &[String]) -> Result<(), String> {
    if values.len() > 16 {
        return Err("may not have more than 16 values".into());
    }
    for v in values {
        if v.is_empty() {
            return Err(format!("empty value not allowed, found in {name}"));
        }
        if v.contains('*') {
            return Err(format!("wildcard not allowed, found in {name}"));
        }
        let expected = "expected format 'serviceAccount' or 'namespace/serviceAccount'";
        match v.matches('/').count() {
            0 => {}
            1 => {
                let (ns, sa) = v.split_once('/').unwrap_or_default();
                if ns.is_empty() {
                    return Err(format!("{expected}, found empty namespace {v:?} in {name}"));
                }
                if sa.is_empty() {
                    return Err(format!(
                        "{expected}, found empty serviceAccount {v:?} in {name}"
                    ));
                }
            }
            _ => return Err(format!("{expected}, found {v:?} in {name}")),
        }
        if v.len() > 320 {
            return Err(format!(
                "value cannot exceed 320 characters, found {v:?} in {name}"
            ));
        }
    }
    Ok(())
}

fn check_ips(values: &[String]) -> Result<(), String> {
    for v in values {
        match v.split_once('/') {
            Some((ip, len)) => {
                let ok = ip.parse::<std::net::IpAddr>().is_ok_and(|ip| {
                    len.parse::<u8>()
                        .is_ok_and(|l| l <= if ip.is_ipv4() { 32 } else { 128 })
                });
                if !ok {
                    return Err(format!("bad CIDR range ({v})"));
                }
            }
            None => {
                if v.parse::<std::net::IpAddr>().is_err() {
                    return Err(format!("bad IP address ({v})"));
                }
            }
        }
    }
    Ok(())
}

fn check_ports(values: &[String]) -> Result<(), String> {
    for v in values {
        if !v.parse::<u32>().is_ok_and(|p| p <= 65535) {
            return Err(format!("bad port ({v})"));
        }
    }
    Ok(())
}

/// `{*}` (one segment) and `{**}` (the rest, last only) templates; other braces and,
/// in a templated path, characters outside RFC 3986 `pchar` are refused.
fn check_path_templates(name: &str, paths: &[String]) -> Result<(), String> {
    for path in paths {
        let templated = path.contains("{*}") || path.contains("{**}");
        let mut any_seen = false;
        for glob in path.trim_matches('/').split('/') {
            match glob {
                "{*}" | "{**}" if any_seen => {
                    return Err(format!(
                        "invalid or unsupported path {path}, found in {name}. {{**}} is not the last operator"
                    ));
                }
                "{*}" => continue,
                "{**}" => {
                    any_seen = true;
                    continue;
                }
                _ => {}
            }
            if glob.contains(['{', '}']) {
                return Err(format!(
                    "invalid or unsupported path {path}, found in {name}. Contains '{{' or '}}' beyond a supported path template"
                ));
            }
            let pchar = |c: char| c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@%".contains(c);
            if templated && !glob.chars().all(pchar) {
                return Err(format!(
                    "invalid or unsupported path {path}, found in {name}. Contains segment {glob} with invalid string literal"
                ));
            }
        }
    }
    Ok(())
}

/// A `when` key and its values (Istio's `ValidateAttribute`).
fn check_attribute(key: &str, values: &[String]) -> Result<(), String> {
    check_empty(key, values)?;
    let map_key = |key: &str| {
        let open = key.find('[');
        match open {
            Some(open) if key.ends_with(']') && open > 0 && open < key.len() - 2 => Ok(()),
            _ => Err(format!("bad key ({key}): should have format a[b]")),
        }
    };
    match key {
        k if k.starts_with("request.headers") => map_key(k),
        "source.ip" | "remote.ip" | "destination.ip" => check_ips(values),
        "source.serviceAccount" => check_service_accounts(key, values),
        "source.namespace"
        | "source.principal"
        | "request.auth.principal"
        | "request.auth.audiences"
        | "request.auth.presenter"
        | "connection.sni" => Ok(()),
        k if k.starts_with("request.auth.claims") => map_key(k),
        "destination.port" => check_ports(values),
        k if k.starts_with("experimental.envoy.filters.") => map_key(k),
        "destination.namespace" => Err(format!(
            "attribute {key} is replaced by the metadata.namespace"
        )),
        k if k.starts_with("destination.labels") => Err(format!(
            "attribute {key} is replaced by the workload selector"
        )),
        "destination.name" | "destination.user" => Err(format!(
            "deprecated attribute {key}: only supported in v1alpha1"
        )),
        _ => Err(format!("unknown attribute: {key}")),
    }
}

/// Why a peer principal as written can never equal a peer's identity, if it cannot.
/// Istio accepts these and builds a matcher that never matches (`spiffe://` is
/// prepended to the value; `*` is a wildcard only as its first or last character).
fn principal_never_matches(p: &str) -> Option<String> {
    if p.starts_with("spiffe://") {
        return Some(format!(
            "principal {p:?} never matches: principals are written without the \
             `spiffe://` scheme (`<trust domain>/ns/<namespace>/sa/<service account>`)"
        ));
    }
    let inner = p.strip_prefix('*').unwrap_or(p);
    let inner = inner.strip_suffix('*').unwrap_or(inner);
    if p != "*" && (inner.contains('*') || (p.starts_with('*') && p.ends_with('*'))) {
        return Some(format!(
            "principal {p:?} never matches: `*` is a wildcard only as the first or the \
             last character of a principal"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::validate_text;

    /// Errors (or, with `Ok`, warnings) of one object, as `meshfed validate` prints them.
    fn check(kind: &str, spec: &str) -> Result<Vec<String>, Vec<String>> {
        let yaml = format!(
            "apiVersion: security.istio.io/v1\nkind: {kind}\nmetadata: {{name: p, namespace: foo}}\nspec:\n{spec}"
        );
        let report = validate_text(Path::new("p.yaml"), &yaml);
        let text = |d: &[crate::config::source::Diagnostic]| -> Vec<String> {
            d.iter().map(|d| d.to_string()).collect()
        };
        if report.errors.is_empty() {
            assert_eq!(report.objects.len(), 1, "{report:?}");
            // A security object meshfed does not fully enforce says so once; the rest
            // are the object's own warnings.
            let (not_enforced, rest): (Vec<String>, Vec<String>) = text(&report.warnings)
                .into_iter()
                .partition(|w| w.contains("enforced"));
            assert!(not_enforced.len() <= 1, "{not_enforced:?}");
            for w in &not_enforced {
                assert!(w.contains(&format!("{kind} foo/p: spec: {kind} ")), "{w}");
            }
            Ok(rest)
        } else {
            Err(text(&report.errors))
        }
    }

    fn error(kind: &str, spec: &str, want: &str) {
        match check(kind, spec) {
            Err(errors) => assert!(
                errors.iter().any(|e| e.contains(want)),
                "{want:?} not in {errors:?}"
            ),
            Ok(w) => panic!("accepted ({w:?}), wanted {want:?}"),
        }
    }

    #[test]
    fn principals_that_never_match_are_warned_about() {
        let warnings = check(
            "AuthorizationPolicy",
            "  rules:\n  - from:\n    - source:\n        principals: [\"spiffe://cluster.local/ns/a/sa/b\", \"cluster.local/ns/*/sa/b\", \"*\", \"*-suffix\", \"prefix-*\"]\n        notPrincipals: [\"*mid*\"]\n",
        )
        .unwrap();
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings[0].contains("principals[0]") && warnings[0].contains("spiffe://"));
        assert!(warnings[1].contains("principals[1]") && warnings[1].contains("first or the last"));
        assert!(warnings[2].contains("notPrincipals[0]"));
    }

    #[test]
    fn peer_authentication() {
        assert_eq!(
            check(
                "PeerAuthentication",
                "  selector: {matchLabels: {app: a}}\n  mtls: {mode: STRICT}\n  portLevelMtls:\n    8080: {mode: DISABLE}\n"
            ),
            Ok(vec![])
        );
        error(
            "PeerAuthentication",
            "  portLevelMtls:\n    8080: {mode: DISABLE}\n",
            "p.yaml:5: PeerAuthentication foo/p: spec.portLevelMtls: mesh/namespace peer authentication cannot have port level mTLS",
        );
        error(
            "PeerAuthentication",
            "  selector: {matchLabels: {app: a}}\n  portLevelMtls:\n    0: {mode: DISABLE}\n",
            "port must be in range 1..65535",
        );
        error(
            "PeerAuthentication",
            "  mtls: {mode: STRICTEST}\n",
            "spec.mtls.mode",
        );
        error(
            "PeerAuthentication",
            "  selector: {matchLabels: {app: \"*\"}}\n",
            "wildcard is not supported in selector",
        );
    }

    #[test]
    fn request_authentication() {
        let ok = "  jwtRules:\n  - issuer: https://example.com\n    jwksUri: https://example.com/jwks.json\n    fromHeaders: [{name: x-jwt, prefix: \"Bearer \"}]\n";
        assert_eq!(check("RequestAuthentication", ok), Ok(vec![]));
        error(
            "RequestAuthentication",
            "  jwtRules:\n  - audiences: [\"\"]\n",
            "issuer or jwksUri must be non-empty string",
        );
        error(
            "RequestAuthentication",
            "  jwtRules:\n  - audiences: [\"\"]\n    issuer: i\n",
            "spec.jwtRules[0].audiences[0]: audience must be non-empty string",
        );
        error(
            "RequestAuthentication",
            "  jwtRules:\n  - issuer: i\n    jwksUri: ftp://example.com/keys\n",
            "URI scheme \"ftp\" is not supported",
        );
        error(
            "RequestAuthentication",
            "  jwtRules:\n  - issuer: i\n    jwks: '{\"keys\": [{\"n\": \"abc\"}]}'\n",
            "spec.jwtRules[0].jwks: jwks parse error: key 0 has no kty",
        );
        error(
            "RequestAuthentication",
            "  jwtRules:\n  - issuer: i\n    jwks: 'not json'\n",
            "jwks parse error",
        );
        error(
            "RequestAuthentication",
            "  jwtRules:\n  - issuer: i\n    outputClaimToHeaders: [{header: \"bad header\", claim: sub}]\n",
            "spec.jwtRules[0].outputClaimToHeaders[0].header",
        );
        error(
            "RequestAuthentication",
            "  selector: {matchLabels: {app: a}}\n  targetRef: {kind: Gateway, group: gateway.networking.k8s.io, name: gw}\n",
            "only one of targetRefs or workloadSelector can be set",
        );
        error(
            "RequestAuthentication",
            "  targetRef: {kind: Deployment, group: apps, name: gw}\n",
            "targetRef must be to one of",
        );
    }

    /// The "not enforced" warning of one security object, if any.
    fn gap(kind: &str, spec: &str) -> Option<String> {
        let yaml = format!(
            "apiVersion: security.istio.io/v1\nkind: {kind}\nmetadata: {{name: p, namespace: foo}}\nspec:\n{spec}"
        );
        let report = validate_text(Path::new("p.yaml"), &yaml);
        assert!(report.errors.is_empty(), "{report:?}");
        report
            .warnings
            .iter()
            .map(|d| d.to_string())
            .find(|w| w.contains("enforced"))
    }

    #[test]
    fn only_what_some_proxy_kind_does_not_apply_is_reported() {
        // Sidecars, gateways and proxyless gRPC servers all apply ALLOW and DENY
        // policies and PeerAuthentications.
        assert_eq!(
            gap("AuthorizationPolicy", "  action: ALLOW\n  rules: [{}]\n"),
            None
        );
        assert_eq!(
            gap("AuthorizationPolicy", "  action: DENY\n  rules: [{}]\n"),
            None
        );
        assert_eq!(gap("PeerAuthentication", "  mtls: {mode: STRICT}\n"), None);
        let targeted = gap(
            "AuthorizationPolicy",
            "  targetRef: {kind: Gateway, group: gateway.networking.k8s.io, name: gw}\n  rules: [{}]\n",
        )
        .unwrap();
        assert!(targeted.contains("Gateway API gateways"), "{targeted}");
        let audit = gap("AuthorizationPolicy", "  action: AUDIT\n  rules: [{}]\n").unwrap();
        assert!(
            audit.contains("proxyless gRPC servers have no audit action"),
            "{audit}"
        );
    }

    #[test]
    fn request_authentication_says_where_it_is_enforced() {
        let gap = |spec: &str| gap("RequestAuthentication", spec).unwrap();
        let selected = gap("  jwtRules: [{issuer: i, jwksUri: 'https://i/keys'}]\n");
        assert!(
            selected.contains("enforced on sidecars' inbound HTTP chains and on gateways"),
            "{selected}"
        );
        assert!(!selected.contains("not enforced"), "{selected}");
        let targeted = gap(
            "  targetRef: {kind: Gateway, group: gateway.networking.k8s.io, name: gw}\n  jwtRules: [{issuer: i}]\n",
        );
        assert!(targeted.contains("not enforced"), "{targeted}");
    }

    #[test]
    fn authorization_policy() {
        let allow = "  selector: {matchLabels: {app: httpbin}}\n  rules:\n  - from:\n    - source: {principals: [cluster.local/ns/default/sa/sleep]}\n    - source: {namespaces: [test], notIpBlocks: [10.0.0.0/8]}\n    to:\n    - operation: {methods: [GET], paths: [\"/info*\", \"/api/{*}/x/{**}\"], ports: [\"8080\"]}\n    when:\n    - key: \"request.auth.claims[iss]\"\n      values: [https://accounts.google.com]\n";
        assert_eq!(check("AuthorizationPolicy", allow), Ok(vec![]));
        // Allow-nothing and allow-all are fine.
        assert_eq!(check("AuthorizationPolicy", "  {}\n"), Ok(vec![]));
        assert_eq!(check("AuthorizationPolicy", "  rules: [{}]\n"), Ok(vec![]));
        error(
            "AuthorizationPolicy",
            "  action: DENY\n",
            "DENY action without `rules` is meaningless",
        );
        error(
            "AuthorizationPolicy",
            "  action: CUSTOM\n  rules: [{}]\n",
            "`provider.name` must not be empty",
        );
        error(
            "AuthorizationPolicy",
            "  action: ALLOW\n  provider: {name: ext}\n  rules: [{}]\n",
            "`provider` must not be with non CUSTOM action, found ALLOW",
        );
        error(
            "AuthorizationPolicy",
            "  action: CUSTOM\n  provider: {name: ext}\n  rules:\n  - from: [{source: {principals: [a]}}]\n",
            "principals is currently not supported with CUSTOM action",
        );
        error("AuthorizationPolicy", "  action: FORBID\n", "spec.action");
        error(
            "AuthorizationPolicy",
            "  rules:\n  - from: [{source: {}}]\n",
            "spec.rules[0].from[0].source: `from.source` must not be empty",
        );
        error(
            "AuthorizationPolicy",
            "  rules:\n  - from: [{source: {ipBlocks: [10.0.0.300]}}]\n",
            "bad IP address (10.0.0.300)",
        );
        error(
            "AuthorizationPolicy",
            "  rules:\n  - to: [{operation: {ports: [\"99999\"]}}]\n",
            "bad port (99999)",
        );
        error(
            "AuthorizationPolicy",
            "  rules:\n  - to: [{operation: {paths: [\"/a/{**}/b/{*}\"]}}]\n",
            "{**} is not the last operator",
        );
        error(
            "AuthorizationPolicy",
            "  rules:\n  - when: [{key: \"request.auth.claims\", values: [a]}]\n",
            "bad key (request.auth.claims): should have format a[b]",
        );
        error(
            "AuthorizationPolicy",
            "  rules:\n  - when: [{key: source.ip}]\n",
            "at least one of `values` or `notValues` must be set for key source.ip",
        );
        error(
            "AuthorizationPolicy",
            "  rules:\n  - when: [{key: \"destination.labels[app]\", values: [a]}]\n",
            "attribute destination.labels[app] is replaced by the workload selector",
        );
        error(
            "AuthorizationPolicy",
            "  rules:\n  - when: [{key: request.color, values: [a]}]\n",
            "unknown attribute: request.color",
        );
        error(
            "AuthorizationPolicy",
            "  rules:\n  - from: [{source: {serviceAccounts: [a/b/c]}}]\n",
            "expected format 'serviceAccount' or 'namespace/serviceAccount'",
        );
        error(
            "AuthorizationPolicy",
            "  rules:\n  - from: [{source: {serviceAccounts: [sa], principals: [p]}}]\n",
            "cannot set serviceAccounts with namespaces or principals",
        );
        // A DENY rule of HTTP attributes only denies every TCP connection: warned.
        let warnings = check(
            "AuthorizationPolicy",
            "  action: DENY\n  rules:\n  - to: [{operation: {methods: [POST]}}]\n",
        )
        .unwrap();
        assert!(
            warnings[0].contains(
                "spec.rules[0]: configured AuthorizationPolicy will deny all traffic to TCP ports"
            ),
            "{warnings:?}"
        );
        // Scoped to a port: quiet.
        assert_eq!(
            check(
                "AuthorizationPolicy",
                "  action: DENY\n  rules:\n  - to: [{operation: {methods: [POST], ports: [\"8080\"]}}]\n"
            ),
            Ok(vec![])
        );
    }

    #[test]
    fn custom_policies_are_said_to_deny_when_their_provider_is_not_an_ext_authz_one() {
        use crate::config::validation::not_enforced_in;
        let object = |provider: &str| {
            let yaml = format!(
                "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: p, namespace: foo}}\nspec:\n  action: CUSTOM\n  provider: {{name: {provider}}}\n  rules: [{{to: [{{operation: {{paths: [/a]}}}}]}}]\n"
            );
            let parsed = crate::config::source::parse_text(Path::new("p.yaml"), &yaml);
            parsed
                .entries
                .into_iter()
                .find_map(|e| match e {
                    crate::config::source::Entry::Object { obj, .. } => Some(obj),
                    _ => None,
                })
                .expect("one valid object")
        };
        let mesh: meshfed_api::mesh::v1alpha1::MeshConfig = serde_json::from_value(serde_json::json!({
            "extensionProviders": [
                {"name": "authz", "envoyExtAuthzGrpc": {"service": "a.foo.svc.cluster.local", "port": 9000}},
                {"name": "zipkin", "zipkin": {"service": "z.foo.svc.cluster.local", "port": 9411}}
            ]
        }))
        .unwrap();
        let known = not_enforced_in(&object("authz"), Some(&mesh)).unwrap();
        assert!(
            known.contains("enforced on sidecars and gateways: proxyless gRPC servers"),
            "{known}"
        );
        for other in ["zipkin", "missing"] {
            let gap = not_enforced_in(&object(other), Some(&mesh)).unwrap();
            assert!(gap.contains("not an ext_authz extension provider"), "{gap}");
        }
    }

    #[test]
    fn security_kinds_are_read_in_v1_and_v1beta1_only() {
        for version in ["v1", "v1beta1"] {
            let yaml = format!(
                "apiVersion: security.istio.io/{version}\nkind: PeerAuthentication\nmetadata: {{name: p}}\nspec: {{mtls: {{mode: STRICT}}}}\n"
            );
            let report = validate_text(Path::new("p.yaml"), &yaml);
            assert!(report.errors.is_empty(), "{report:?}");
            assert_eq!(report.objects.len(), 1);
        }
        let report = validate_text(
            Path::new("p.yaml"),
            "apiVersion: security.istio.io/v1alpha1\nkind: PeerAuthentication\nmetadata: {name: p}\n",
        );
        assert!(
            report.errors[0]
                .to_string()
                .contains("apiVersion security.istio.io/v1alpha1 is not supported for PeerAuthentication (use security.istio.io/v1, v1beta1)"),
            "{report:?}"
        );
        // A networking group PeerAuthentication is not ours.
        let report = validate_text(
            Path::new("p.yaml"),
            "apiVersion: networking.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: p}\n",
        );
        assert!(
            report.objects.is_empty() && report.errors.is_empty(),
            "{report:?}"
        );
    }
}

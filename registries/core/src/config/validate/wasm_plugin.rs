//! Validation of `extensions.istio.io` WasmPlugin, after Istio's `ValidateWasmPlugin`
//! (`pkg/config/validation`): one way of selecting (selector, targetRef or targetRefs,
//! the targets of the kinds Istio allows), a URL whose scheme is one of `oci`, `file`,
//! `http`, `https` (or none, which means `oci`), a 64-digit lowercase hex `sha256`,
//! the length limits of `imagePullSecret` (253) and `pluginName` (256), named and
//! distinct VM environment variables, and `match` ports in 1..=65535.
//!
//! Beyond Istio's Go URL parser: a URL is refused when it holds whitespace or control
//! characters, which Go's request-URI parser refuses in either of its two attempts.

use meshfed_api::extensions::v1alpha1 as ext;

use super::security::targets;
use super::{FieldPath, Findings, Validation};

/// The URL schemes a WasmPlugin may use (`""` means `oci`).
const SCHEMES: [&str; 5] = ["", "file", "http", "https", "oci"];

/// WasmPlugin: see the module doc.
pub fn validate_wasm_plugin(p: &ext::WasmPlugin) -> Validation {
    let mut f = Findings::new();
    let spec = FieldPath::spec();
    targets(
        &mut f,
        &spec,
        p.selector.as_ref(),
        p.target_ref.as_ref(),
        &p.target_refs,
    );
    f.check(&spec.field("url"), url(&p.url));
    f.check(&spec.field("sha256"), sha256(&p.sha256));
    if p.image_pull_secret.len() > 253 {
        f.error(
            &spec.field("imagePullSecret"),
            "field imagePullSecret must not be longer than 253 characters",
        );
    }
    if p.plugin_name.len() > 256 {
        f.error(
            &spec.field("pluginName"),
            "field pluginName must not be longer than 256 characters",
        );
    }
    if let Some(vm) = &p.vm_config {
        let mut seen = std::collections::BTreeSet::new();
        for (i, env) in vm.env.iter().enumerate() {
            let at = spec.field("vmConfig").field("env").index(i);
            if env.name.is_empty() {
                f.error(&at.field("name"), "spec.vmConfig.env invalid");
            } else if !seen.insert(env.name.as_str()) {
                f.error(&at.field("name"), "duplicate env");
            }
        }
    }
    for (i, m) in p.r#match.iter().enumerate() {
        for (k, port) in m.ports.iter().enumerate() {
            if port.number == 0 || port.number > 65535 {
                f.error(
                    &spec.field("match").index(i).field("ports").index(k),
                    format!(
                        "spec.Match[{i}].Ports[{k}] is out of range: {}",
                        port.number
                    ),
                );
            }
        }
    }
    f.finish()
}

/// The URL check: set, parseable, of a known scheme. As Go's `ParseRequestURI`, a
/// scheme counts only when a `/` follows its colon (`oci://...`, `file:///...`); any
/// other text is read as a host and path (`ghcr.io:5000/x` is `http://ghcr.io:5000/x`).
fn url(url: &str) -> Result<(), String> {
    if url.is_empty() {
        return Err("url field needs to be set".into());
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("failed to parse url: invalid character in {url:?}"));
    }
    if let Some((scheme, rest)) = url.split_once(':') {
        let is_scheme = scheme
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        let lower = scheme.to_ascii_lowercase();
        if is_scheme && rest.starts_with('/') && !SCHEMES.contains(&lower.as_str()) {
            return Err(format!("url contains unsupported scheme: {lower}"));
        }
    }
    Ok(())
}

fn sha256(sha: &str) -> Result<(), String> {
    if sha.is_empty() {
        return Ok(());
    }
    if sha.len() != 64 {
        return Err("sha256 field must be 64 characters long".into());
    }
    if !sha.chars().all(|c| matches!(c, 'a'..='f' | '0'..='9')) {
        return Err("sha256 field must match [a-f0-9]{64} pattern".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{assert_error, assert_ok, spec};
    use super::*;

    fn check(yaml: &str) -> Validation {
        validate_wasm_plugin(&spec(yaml))
    }

    #[test]
    fn istio_valid_plugins_pass() {
        for yaml in [
            "url: file:///opt/filters/openid.wasm\nsha256: 1ef0c9a92b0420cf25f7fe5d481b231464bc88f486ca3b9c83ed5cc21d2f6210\nphase: AUTHN",
            "url: oci://private-registry:5000/openid-connect/openid:latest\nimagePullPolicy: IfNotPresent\nimagePullSecret: private-registry-pull-secret",
            "url: https://private-bucket/filters/openid.wasm\nvmConfig: {env: [{name: POD_NAME, valueFrom: HOST}, {name: TRUST_DOMAIN, value: cluster.local}]}",
            "url: ghcr.io/istio/plugin:1.0\nselector: {matchLabels: {istio: ingressgateway}}",
            "url: ghcr.io:5000/plugin\nmatch: [{mode: SERVER, ports: [{number: 8080}]}]",
            "url: oci://x\ntargetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: gw}]",
        ] {
            assert_ok(&check(yaml));
        }
    }

    #[test]
    fn istio_invalid_plugins_fail_at_their_field() {
        assert_error(
            &check("phase: AUTHN"),
            "spec.url",
            "url field needs to be set",
        );
        assert_error(
            &check("url: ftp://x/y"),
            "spec.url",
            "url contains unsupported scheme: ftp",
        );
        assert_error(
            &check("url: oci://x\nsha256: abc"),
            "spec.sha256",
            "must be 64 characters long",
        );
        assert_error(
            &check(&format!("url: oci://x\nsha256: {}", "G".repeat(64))),
            "spec.sha256",
            "must match [a-f0-9]{64} pattern",
        );
        assert_error(
            &check(&format!(
                "url: oci://x\nimagePullSecret: {}",
                "a".repeat(254)
            )),
            "spec.imagePullSecret",
            "253",
        );
        assert_error(
            &check(&format!("url: oci://x\npluginName: {}", "a".repeat(257))),
            "spec.pluginName",
            "256",
        );
        assert_error(
            &check("url: oci://x\nvmConfig: {env: [{name: A}, {name: A}]}"),
            "spec.vmConfig.env[1].name",
            "duplicate env",
        );
        assert_error(
            &check("url: oci://x\nvmConfig: {env: [{value: x}]}"),
            "spec.vmConfig.env[0].name",
            "spec.vmConfig.env invalid",
        );
        assert_error(
            &check("url: oci://x\nmatch: [{ports: [{number: 0}]}]"),
            "spec.match[0].ports[0]",
            "out of range: 0",
        );
        assert_error(
            &check("url: oci://x\nmatch: [{ports: [{number: 80}, {number: 65536}]}]"),
            "spec.match[0].ports[1]",
            "out of range: 65536",
        );
        assert_error(
            &check(
                "url: oci://x\nselector: {matchLabels: {a: b}}\ntargetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: g}]",
            ),
            "spec",
            "only one of targetRefs or workloadSelector can be set",
        );
        assert_error(
            &check("url: oci://x\ntargetRefs: [{kind: Deployment, group: apps, name: g}]"),
            "spec.targetRefs[0]",
            "targetRef must be to one of",
        );
    }
}

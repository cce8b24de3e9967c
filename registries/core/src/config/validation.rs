//! Validation of whole config objects, after Istio's `pkg/config/validation`.
//!
//! [`validate`] checks one [`ConfigObject`]: its metadata and its spec, with the rules of
//! its kind (the validator its declaration in [`crate::config::kinds`] names, from
//! [`crate::config::validate`]). The answer is either the list of warnings (the object is
//! usable) or the list of every error found, each naming the field ([`FieldPath`]) and the
//! reason. [`not_enforced_in`] says what meshfed does not apply yet of a valid object.

use crate::config::model::{ConfigObject, Kind, Spec};
use crate::config::validate::common;
use crate::config::validate::{FieldPath, Findings, Validation};

/// Validates a config object: metadata (name, namespace, labels) and the spec with the
/// rules of its kind.
pub fn validate(obj: &ConfigObject) -> Validation {
    let mut findings = Findings::new();
    validate_metadata(obj, &mut findings);
    if obj.kind != obj.spec.kind() {
        findings.error(
            &FieldPath::root().field("kind"),
            format!(
                "kind {} does not match the spec, which is a {}",
                obj.kind,
                obj.spec.kind()
            ),
        );
    }
    findings.absorb(obj.spec.validate_spec(&obj.namespace));
    findings.absorb(Ok(obj.spec.unsupported_fields()));
    if let Some(gap) = not_enforced(obj) {
        findings.warn(&FieldPath::spec(), gap);
    }
    findings.finish()
}

/// What meshfed does not apply yet of a valid object, said where the user looks
/// (`meshfed validate`, the store's warnings); `None` when it is applied. Without
/// the mesh config, see [`not_enforced_in`].
pub fn not_enforced(obj: &ConfigObject) -> Option<String> {
    not_enforced_in(obj, None)
}

/// [`not_enforced`], knowing the mesh config: a CUSTOM AuthorizationPolicy whose
/// provider is not an ext_authz extension provider of it is said to deny instead.
pub fn not_enforced_in(
    obj: &ConfigObject,
    mesh: Option<&meshfed_api::mesh::v1alpha1::MeshConfig>,
) -> Option<String> {
    use meshfed_api::mesh::v1alpha1::mesh_config::extension_provider::Provider;
    use meshfed_api::security::v1beta1::authorization_policy::{Action, ActionDetail};
    match &obj.spec {
        Spec::RequestAuthentication(ra)
            if ra.target_ref.is_some() || !ra.target_refs.is_empty() =>
        {
            Some(
                "RequestAuthentication with targetRef(s) is not enforced by meshfed yet: \
                 Gateway API gateways get no JWT filter from it"
                    .into(),
            )
        }
        Spec::RequestAuthentication(_) => Some(
            "RequestAuthentication is enforced on sidecars' inbound HTTP chains and on \
             gateways: proxyless gRPC servers do not validate its tokens (nor do they in \
             Istio)"
                .into(),
        ),
        Spec::AuthorizationPolicy(ap) if ap.target_ref.is_some() || !ap.target_refs.is_empty() => {
            Some(
                "AuthorizationPolicy with targetRef(s) is not enforced by meshfed: it attaches \
                 to Gateway API gateways, which meshfed does not serve (sidecars and Istio \
                 gateways take selector policies only, as in Istio)"
                    .into(),
            )
        }
        Spec::AuthorizationPolicy(ap) => {
            let provider = match &ap.action_detail {
                Some(ActionDetail::Provider(p)) => p.name.as_str(),
                None => "",
            };
            let ext_authz = |p: &meshfed_api::mesh::v1alpha1::mesh_config::ExtensionProvider| {
                p.name == provider
                    && matches!(
                        p.provider,
                        Some(Provider::EnvoyExtAuthzHttp(_) | Provider::EnvoyExtAuthzGrpc(_))
                    )
            };
            match (ap.action(), mesh) {
                (Action::Custom, Some(mesh)) if !mesh.extension_providers.iter().any(ext_authz) => {
                    Some(format!(
                        "AuthorizationPolicy with action CUSTOM names provider {provider:?}, \
                         which is not an ext_authz extension provider of the mesh config \
                         (envoyExtAuthzHttp or envoyExtAuthzGrpc): its rules deny the requests \
                         they match instead"
                    ))
                }
                (Action::Custom, _) => Some(
                    "AuthorizationPolicy with action CUSTOM is enforced on sidecars and \
                     gateways: proxyless gRPC servers have no ext_authz and do not apply it"
                        .into(),
                ),
                (Action::Audit, _) => Some(
                    "AuthorizationPolicy with action AUDIT is enforced on sidecars and \
                     gateways: proxyless gRPC servers have no audit action"
                        .into(),
                ),
                _ => None,
            }
        }
        Spec::Telemetry(t) if t.target_ref.is_some() || !t.target_refs.is_empty() => Some(
            "Telemetry with targetRef(s) is not applied by meshfed: it attaches to Gateway \
             API resources, which meshfed does not serve"
                .into(),
        ),
        Spec::Telemetry(t) => {
            let found = crate::config::validate::unknown_providers(t, mesh?);
            (!found.is_empty()).then(|| {
                found
                    .iter()
                    .map(|(field, why)| format!("{field}: {why}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
        }
        _ => None,
    }
}

fn validate_metadata(obj: &ConfigObject, findings: &mut Findings) {
    let metadata = FieldPath::root().field("metadata");
    let name = metadata.field("name");
    if obj.name.is_empty() {
        findings.error(&name, "name is required");
    } else if !common::is_dns1123_subdomain(&obj.name) {
        findings.error(
            &name,
            format!(
                "{:?} is not a valid name (lower case letters, digits, '-' and '.', starting and ending with \
                 a letter or digit, at most 253 characters)",
                obj.name
            ),
        );
    } else if obj.kind == Kind::Gateway && !common::is_dns1123_label(&obj.name) {
        // Istio: a Gateway name is referenced as `namespace/name`, so no dots.
        findings.error(
            &name,
            format!(
                "invalid gateway name {:?}: must be a DNS label (no dots)",
                obj.name
            ),
        );
    }
    let namespace = metadata.field("namespace");
    if !common::is_dns1123_label(&obj.namespace)
        || obj.namespace.bytes().any(|b| b.is_ascii_uppercase())
    {
        findings.error(
            &namespace,
            format!(
                "{:?} is not a valid namespace (a lower case DNS label: letters, digits and '-', at most 63 characters)",
                obj.namespace
            ),
        );
    }
    common::validate_labels(findings, &metadata.field("labels"), &obj.labels);
    for key in obj.annotations.keys() {
        if let Err(reason) = common::validate_label_key(key) {
            findings.error(&metadata.field("annotations").key(key), reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::validate::test_support::*;
    use meshfed_api::networking::v1alpha3 as net;

    fn gateway(name: &str, namespace: &str) -> ConfigObject {
        let gw: net::Gateway =
            spec("servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]");
        ConfigObject::new(namespace, name, gw)
    }

    #[test]
    fn metadata_is_checked() {
        assert_ok(&validate(&gateway("public", "istio-system")));
        assert_error(
            &validate(&gateway("", "default")),
            "metadata.name",
            "required",
        );
        assert_error(
            &validate(&gateway("Public_GW", "default")),
            "metadata.name",
            "not a valid name",
        );
        assert_error(
            &validate(&gateway("gw.v1", "default")),
            "metadata.name",
            "invalid gateway name",
        );
        assert_error(
            &validate(&gateway("gw", "Default")),
            "metadata.namespace",
            "not a valid namespace",
        );
        let mut labelled = gateway("gw", "default");
        labelled.labels.insert("app".into(), "bad value!".into());
        assert_error(
            &validate(&labelled),
            "metadata.labels[app]",
            "invalid label value",
        );
    }

    #[test]
    fn kind_must_match_the_spec() {
        let mut obj = gateway("gw", "default");
        obj.kind = Kind::Sidecar;
        assert_error(&validate(&obj), "kind", "does not match");
    }
}

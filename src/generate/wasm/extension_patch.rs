//! EnvoyFilter `EXTENSION_CONFIG` patches on the extension configs (ECDS) a proxy is
//! served, as Istio's `envoyfilter/extension_configuration_patch.go`
//! (`InsertedExtensionConfigurations`) applies them: an `ADD` patch of an EnvoyFilter
//! selecting the proxy (selection, order and proxy matches are
//! `generate::envoyfilter`'s) contributes its `TypedExtensionConfig` when the proxy asks
//! for that name; the added configs come before the WasmPlugins' ones. Istio applies no
//! other operation to extension configs: a `MERGE`, `REPLACE` or `REMOVE` patch of
//! `EXTENSION_CONFIG` is recorded as having matched nothing (`pilot_envoy_filter_status`,
//! `/debug/configz`), never applied in silence.

use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use meshfed_api::networking::v1alpha3::envoy_filter::ApplyTo;
use meshfed_api::networking::v1alpha3::envoy_filter::patch::Operation;

use crate::generate::envoyfilter::{ProxyPatches, status};

/// The extension configs the `ADD` patches of `patches` add, among `names`, in patch
/// order (each a fresh copy).
pub fn inserted_extension_configs(
    patches: Option<&ProxyPatches>,
    names: &[String],
) -> Vec<TypedExtensionConfig> {
    let Some(patches) = patches else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for p in patches.of(ApplyTo::ExtensionConfig) {
        if p.operation != Operation::Add {
            status::record(&p.key, "extensionconfig", false);
            continue;
        }
        let Some(config) = p.typed::<TypedExtensionConfig>() else {
            status::reject(
                &p.key,
                "configPatches.patch.value",
                "not an envoy.config.core.v3.TypedExtensionConfig",
            );
            continue;
        };
        let wanted = names.contains(&config.name);
        status::record(&p.key, "extensionconfig", wanted);
        if wanted {
            out.push(config);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    //! Istio's `extension_configuration_patch_test.go` (`TestInsertedExtensionConfig`)
    //! ported: three EXTENSION_CONFIG patches (two ADD, one MERGE) of an EnvoyFilter of
    //! the proxy's namespace, and the names a sidecar asks for.

    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::generate::envoyfilter::patches_for;
    use crate::model::Proxy;
    use crate::model::proxy::json_to_struct;
    use crate::push::config_index::Config;

    fn ef(ns: &str, name: &str, spec: serde_json::Value) -> Config<EnvoyFilterSpec> {
        Config {
            name: name.into(),
            namespace: ns.into(),
            labels: Default::default(),
            annotations: Default::default(),
            creation_time: std::time::UNIX_EPOCH,
            spec: serde_json::from_value(spec).expect("EnvoyFilter spec"),
        }
    }

    fn proxy(ns: &str) -> Proxy {
        let node = envoy_types::pb::envoy::config::core::v3::Node {
            id: format!("sidecar~10.0.0.1~pod.{ns}~{ns}.svc.cluster.local"),
            metadata: Some(json_to_struct(&json!({"CLUSTER_ID": "c1"}))),
            ..Default::default()
        };
        Proxy::from_node(Some(&node)).unwrap()
    }

    use meshfed_api::networking::v1alpha3::EnvoyFilter as EnvoyFilterSpec;

    /// Vectors that do not pass, and why.
    const KNOWN_GAPS: &[(&str, &str)] = &[];

    fn patch(operation: &str, name: &str) -> serde_json::Value {
        json!({
            "applyTo": "EXTENSION_CONFIG",
            "match": {"context": "SIDECAR_OUTBOUND"},
            "patch": {"operation": operation, "value": {"name": name}},
        })
    }

    fn run(requested: &[&str], want: &[&str]) -> Result<(), String> {
        let filter = ef(
            "not-default",
            "test-envoyfilter",
            json!({"configPatches": [
                patch("ADD", "add-extension-config1"),
                patch("ADD", "add-extension-config2"),
                patch("MERGE", "merge-extension-config"),
            ]}),
        );
        let p = proxy("not-default");
        let patches = patches_for(&[Arc::new(filter)], "istio-config", &p);
        let names: Vec<String> = requested.iter().map(|s| s.to_string()).collect();
        let got = inserted_extension_configs(patches.as_ref(), &names);
        let want: Vec<TypedExtensionConfig> = want
            .iter()
            .map(|n| TypedExtensionConfig {
                name: n.to_string(),
                typed_config: None,
            })
            .collect();
        if got == want {
            Ok(())
        } else {
            Err(format!("got {got:?}, want {want:?}"))
        }
    }

    #[test]
    fn inserted_extension_config_vectors() {
        let vectors: [(&str, &[&str], &[&str]); 3] = [
            (
                "add extension config",
                &["add-extension-config1", "add-extension-config2"],
                &["add-extension-config1", "add-extension-config2"],
            ),
            ("miss extension config", &["random-extension-config"], &[]),
            (
                "only add extension config",
                &["merge-extension-config"],
                &[],
            ),
        ];
        let mut passed = 0;
        for (name, requested, want) in vectors {
            let gap = KNOWN_GAPS.iter().find(|(n, _)| *n == name);
            match (run(requested, want), gap) {
                (Ok(()), None) => passed += 1,
                (Ok(()), Some((_, why))) => {
                    panic!("{name} passes now: take it off the known gaps ({why})")
                }
                (Err(e), None) => panic!("{name}: {e}"),
                (Err(_), Some(_)) => {}
            }
        }
        assert_eq!(passed, vectors.len() - KNOWN_GAPS.len());
    }
}

//! The extension configs (ECDS, `envoy.config.core.v3.TypedExtensionConfig`) of
//! WasmPlugins, as istiod builds them (`model/extensions.go`, `extension/wasmplugin.go`
//! `InsertedExtensionConfigurations`): an HTTP (`envoy.extensions.filters.http.wasm.v3.Wasm`)
//! or network (`...network.wasm.v3.Wasm`) Wasm filter whose VM runs on V8 and whose code
//! is the plugin's URL as a remote data source (cluster `_`, 30 s timeout, the
//! plugin's `sha256`) for every scheme but `file://`, which is a local file. The proxy's
//! agent fetches remote code and rewrites the source to the local file before Envoy
//! sees it. The VM's environment carries what the agent needs:
//! `ISTIO_META_WASM_IMAGE_PULL_SECRET` (the pull secret's content, see
//! [`PullSecrets`]), `ISTIO_META_WASM_IMAGE_PULL_POLICY` and
//! `ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION`, next to the plugin's own `vmConfig.env`.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{
    AsyncDataSource, DataSource, HttpUri, RemoteDataSource, TypedExtensionConfig,
    async_data_source, data_source, http_uri,
};
use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm as HttpWasm;
use envoy_types::pb::envoy::extensions::filters::network::wasm::v3::Wasm as NetworkWasm;
use envoy_types::pb::envoy::extensions::wasm::v3::{
    EnvironmentVariables, FailurePolicy, PluginConfig, VmConfig, plugin_config,
};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use meshfed_api::extensions::v1alpha1 as ext;
use prost::Message;

use super::Plugin;
use crate::generate::proto::{pack, stable_map};
use crate::xds::{EncodedResource, Resource, TypeUrl};

/// The VM environment variable that carries the image pull secret.
pub const SECRET_ENV: &str = "ISTIO_META_WASM_IMAGE_PULL_SECRET";
/// The VM environment variable that carries the pull policy.
pub const POLICY_ENV: &str = "ISTIO_META_WASM_IMAGE_PULL_POLICY";
/// The VM environment variable that carries the plugin's resource version.
pub const RESOURCE_VERSION_ENV: &str = "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION";
/// The Wasm runtime.
pub const RUNTIME: &str = "envoy.wasm.runtime.v8";

/// The pull secrets an ECDS response may carry: by `kubernetes://<namespace>/<name>`,
/// the `.dockerconfigjson` of the Secret, for the secrets this proxy may read (Istio:
/// only a proxy with a verified identity, only Secrets of the plugin's namespace).
/// A name without an entry is sent empty, as Istio does when it cannot read it.
pub type PullSecrets = BTreeMap<String, Arc<str>>;

/// The secret resource name of a plugin's `imagePullSecret`
/// (`kubernetes://<plugin namespace>/<name>`; Istio forces the plugin's namespace),
/// `None` when the plugin names none.
pub fn pull_secret_name(plugin: &Plugin) -> Option<String> {
    let secret = plugin.spec.image_pull_secret.as_str();
    if secret.is_empty() {
        return None;
    }
    // Istio reads `kubernetes://name` and `kubernetes://ns/name` too, keeping the name.
    let name = secret
        .strip_prefix("kubernetes://")
        .map_or(secret, |rest| rest.rsplit('/').next().unwrap_or(rest));
    Some(format!("kubernetes://{}/{}", plugin.namespace, name))
}

/// The plugin's `PluginConfig` (Istio's `buildWasmPluginConfigCommon`).
pub fn plugin_config(plugin: &Plugin, secrets: &PullSecrets) -> PluginConfig {
    let spec = &plugin.spec;
    let configuration = match &spec.plugin_config {
        Some(s) if !s.fields.is_empty() => Any {
            type_url: "type.googleapis.com/google.protobuf.StringValue".into(),
            value: go_json(s).encode_to_vec(),
        },
        _ => Any::default(),
    };
    let mut env: Vec<(String, String)> = Vec::new();
    if let Some(secret) = pull_secret_name(plugin) {
        let content = secrets
            .get(&secret)
            .map_or(String::new(), |s| s.to_string());
        env.push((SECRET_ENV.into(), content));
    }
    if spec.image_pull_policy() != ext::PullPolicy::UnspecifiedPolicy {
        env.push((
            POLICY_ENV.into(),
            spec.image_pull_policy().as_str_name().into(),
        ));
    }
    env.push((RESOURCE_VERSION_ENV.into(), plugin.resource_version.clone()));
    let mut host_env_keys = Vec::new();
    for e in spec.vm_config.iter().flat_map(|vm| &vm.env) {
        match e.value_from() {
            ext::EnvValueSource::Inline => env.push((e.name.clone(), e.value.clone())),
            ext::EnvValueSource::Host => host_env_keys.push(e.name.clone()),
        }
    }
    let failure_policy = match spec.fail_strategy() {
        // Envoy's default is FAIL_CLOSED: nothing to say.
        ext::FailStrategy::FailClose => FailurePolicy::Unspecified,
        ext::FailStrategy::FailOpen => FailurePolicy::FailOpen,
        ext::FailStrategy::FailReload => FailurePolicy::FailReload,
    };
    PluginConfig {
        name: format!("{}.{}", plugin.namespace, plugin.name),
        root_id: spec.plugin_name.clone(),
        configuration: Some(configuration),
        failure_policy: failure_policy as i32,
        vm: Some(plugin_config::Vm::VmConfig(VmConfig {
            runtime: RUNTIME.into(),
            code: Some(code(&spec.url, &spec.sha256)),
            environment_variables: Some(EnvironmentVariables {
                host_env_keys,
                key_values: stable_map(env),
            }),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// `pluginConfig` as compact JSON with sorted keys, numbers written as Go's protojson
/// writes them (`1`, not `1.0`, for whole numbers).
fn go_json(config: &pbjson_types::Struct) -> String {
    fn whole_numbers(v: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match v {
            Value::Number(n) => match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => Value::from(f as i64),
                _ => Value::Number(n),
            },
            Value::Array(a) => Value::Array(a.into_iter().map(whole_numbers).collect()),
            Value::Object(o) => {
                Value::Object(o.into_iter().map(|(k, v)| (k, whole_numbers(v))).collect())
            }
            other => other,
        }
    }
    serde_json::to_value(config)
        .map(whole_numbers)
        .map(|v| v.to_string())
        .unwrap_or_default()
}

/// The module's source: a local file for `file://`, else the URL (scheme `oci://` when
/// none is given) as a remote source the agent fetches.
fn code(url: &str, sha256: &str) -> AsyncDataSource {
    if let Some(path) = url.strip_prefix("file://") {
        return AsyncDataSource {
            specifier: Some(async_data_source::Specifier::Local(DataSource {
                specifier: Some(data_source::Specifier::Filename(path.into())),
                ..Default::default()
            })),
        };
    }
    AsyncDataSource {
        specifier: Some(async_data_source::Specifier::Remote(RemoteDataSource {
            http_uri: Some(HttpUri {
                uri: with_scheme(url),
                timeout: Some(PbDuration {
                    seconds: 30,
                    nanos: 0,
                }),
                http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster("_".into())),
            }),
            sha256: sha256.into(),
            ..Default::default()
        })),
    }
}

/// Go's `url.Parse` then scheme `oci` when none: `ghcr.io/x` is `oci://ghcr.io/x`, the
/// empty URL `oci:`.
fn with_scheme(url: &str) -> String {
    let has_scheme = url.split_once(':').is_some_and(|(s, _)| {
        s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    });
    if has_scheme {
        url.to_string()
    } else if url.is_empty() {
        "oci:".into()
    } else if url.starts_with("//") {
        format!("oci:{url}")
    } else {
        format!("oci://{url}")
    }
}

/// The extension config of `plugin`, named `name` (its ECDS resource name).
pub fn extension_config(
    plugin: &Plugin,
    name: &str,
    secrets: &PullSecrets,
) -> TypedExtensionConfig {
    let config = plugin_config(plugin, secrets);
    let typed_config = if plugin.is_network() {
        pack(&NetworkWasm {
            config: Some(config),
        })
    } else {
        pack(&HttpWasm {
            config: Some(config),
        })
    };
    TypedExtensionConfig {
        name: name.into(),
        typed_config: Some(typed_config),
    }
}

/// Istio's `InsertedExtensionConfigurations`: the extension configs of `plugins` whose
/// resource name (`name_of`) is among `names`, in the plugins' order.
pub fn inserted_extension_configs(
    plugins: &[Arc<Plugin>],
    names: &[String],
    name_of: impl Fn(&Plugin) -> String,
    secrets: &PullSecrets,
) -> Vec<TypedExtensionConfig> {
    plugins
        .iter()
        .filter_map(|p| {
            let name = name_of(p);
            names
                .contains(&name)
                .then(|| extension_config(p, &name, secrets))
        })
        .collect()
}

/// Encodes an extension config as an ECDS resource. In tests it is held to Envoy's
/// rules as Envoy receives it: after the agent has replaced a remote code source with
/// the local file it fetched (Envoy would refuse the remote source of an image
/// without `sha256`, which it never sees).
pub fn encode(config: &TypedExtensionConfig) -> Resource {
    let bytes = bytes::Bytes::from(config.encode_to_vec());
    #[cfg(any(test, feature = "testing"))]
    {
        let fetched = as_fetched_by_agent(config);
        crate::xds::pgv::assert_valid(
            &config.name,
            TypeUrl::ExtensionConfig.as_str(),
            &fetched.encode_to_vec(),
        );
    }
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    Arc::new(EncodedResource {
        name: Arc::from(config.name.as_str()),
        body: crate::xds::wire::SharedAny {
            type_url: TypeUrl::ExtensionConfig.as_str(),
            value: bytes,
        },
        version: Arc::from(format!("{:016x}", h.finish())),
        placeholder: false,
    })
}

/// `config` as the agent forwards it to Envoy: a remote code source becomes a local
/// file, and the pull secret is taken out of the VM's environment.
pub fn as_fetched_by_agent(config: &TypedExtensionConfig) -> TypedExtensionConfig {
    let rewrite = |c: &mut PluginConfig| {
        if let Some(plugin_config::Vm::VmConfig(vm)) = &mut c.vm {
            if let Some(AsyncDataSource {
                specifier: Some(async_data_source::Specifier::Remote(_)),
            }) = &vm.code
            {
                vm.code = Some(AsyncDataSource {
                    specifier: Some(async_data_source::Specifier::Local(DataSource {
                        specifier: Some(data_source::Specifier::Filename(
                            "/var/lib/istio/data/module.wasm".into(),
                        )),
                        ..Default::default()
                    })),
                });
            }
            if let Some(env) = &mut vm.environment_variables {
                env.key_values.remove(SECRET_ENV);
            }
        }
    };
    let mut out = config.clone();
    if let Some(any) = &mut out.typed_config {
        if let Ok(mut w) = HttpWasm::decode(any.value.as_slice())
            && any.type_url.ends_with("http.wasm.v3.Wasm")
        {
            if let Some(c) = &mut w.config {
                rewrite(c);
            }
            *any = pack(&w);
        } else if let Ok(mut w) = NetworkWasm::decode(any.value.as_slice())
            && any.type_url.ends_with("network.wasm.v3.Wasm")
        {
            if let Some(c) = &mut w.config {
                rewrite(c);
            }
            *any = pack(&w);
        }
    }
    out
}

//! WasmPlugin image pull Secrets in ECDS, as istiod's `xds/ecds.go` handles them: a
//! plugin's `imagePullSecret` names a `kubernetes.io/dockerconfigjson` Secret of the
//! plugin's own namespace; an ECDS answer carries its `.dockerconfigjson` in the VM
//! environment ([`super::ecds::SECRET_ENV`]) of the plugins the proxy watches, for
//! the proxy's agent to pull the image with (the agent removes it before Envoy sees
//! the config). It is sent only to a proxy with a verified identity whose service
//! account may list the Secrets of that namespace (the SubjectAccessReview SDS makes
//! for gateway credentials, through [`PullSecretReader`]); otherwise the variable goes out
//! empty, with a warning naming the plugin and
//! `meshfed_wasm_pull_secrets_withheld_total{plugin}`.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::Plugin;
use super::ecds::{PullSecrets, pull_secret_name};
use crate::model::Proxy;
use crate::push::snapshot::Snapshot;

/// Reads image pull Secrets for authorized proxies (implemented by SDS).
pub trait PullSecretReader {
    /// The `.dockerconfigjson` of `namespace/name` for WasmPlugin `plugin` when
    /// `proxy` may read it.
    fn pull_secret(
        &self,
        connection: &str,
        plugin: &str,
        proxy: &Proxy,
        namespace: &str,
        name: &str,
    ) -> Option<Vec<u8>>;
}

/// The plugins selecting `proxy` (as the snapshot knows it) whose ECDS resource is
/// among `names`.
fn watched_plugins(
    snapshot: &Snapshot,
    proxy: &Proxy,
    names: &BTreeSet<String>,
) -> Vec<Arc<Plugin>> {
    let all = super::all_plugins(snapshot);
    if all.is_empty() {
        return Vec::new();
    }
    let view = snapshot.proxy_view(proxy);
    super::for_proxy(
        &all,
        &snapshot.config().root_namespace,
        &view.namespace,
        &view.labels,
    )
    .into_iter()
    .filter(|p| names.contains(&p.resource_name()))
    .collect()
}

/// The pull Secrets (`namespace`, `name`) of the plugins `proxy` watches.
pub fn referenced(
    snapshot: &Snapshot,
    proxy: &Proxy,
    names: &BTreeSet<String>,
) -> BTreeSet<(String, String)> {
    watched_plugins(snapshot, proxy, names)
        .iter()
        .filter(|p| pull_secret_name(p).is_some())
        .map(|p| (p.namespace.clone(), secret_of(p).to_string()))
        .collect()
}

/// The Secret's name in the plugin's `imagePullSecret` (`name`, `kubernetes://name`
/// or `kubernetes://ns/name`: the namespace is always the plugin's).
fn secret_of(plugin: &Plugin) -> &str {
    let secret = plugin.spec.image_pull_secret.as_str();
    secret
        .strip_prefix("kubernetes://")
        .map_or(secret, |rest| rest.rsplit('/').next().unwrap_or(rest))
}

/// The pull Secrets `proxy` may be sent, by their resource name
/// ([`pull_secret_name`]), for the plugins it watches; `None` for `sds` (no secure
/// port) sends none.
pub fn secrets_for(
    sds: Option<&dyn PullSecretReader>,
    connection: &str,
    plugins: &[Arc<Plugin>],
    proxy: &Proxy,
    names: &[String],
) -> PullSecrets {
    let mut out = PullSecrets::new();
    for plugin in plugins {
        let Some(resource) = pull_secret_name(plugin) else {
            continue;
        };
        if !names.contains(&plugin.resource_name()) || out.contains_key(&resource) {
            continue;
        }
        let Some(sds) = sds else {
            continue;
        };
        let id = format!("{}/{}", plugin.namespace, plugin.name);
        if let Some(content) =
            sds.pull_secret(connection, &id, proxy, &plugin.namespace, secret_of(plugin))
        {
            out.insert(
                resource,
                Arc::from(String::from_utf8_lossy(&content).as_ref()),
            );
        }
    }
    out
}

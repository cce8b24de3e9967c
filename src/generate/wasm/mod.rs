//! WasmPlugin (`extensions.istio.io/v1alpha1`): which plugins apply to a proxy and to
//! each of its listeners, the extension configs (ECDS) that carry them
//! ([`ecds`]), and the references to those configs in the listeners' filter lists
//! ([`filters`]), as Istio's `pilot/pkg/model/extensions.go`,
//! `push_context.go WasmPluginsByListenerInfo` and
//! `networking/core/extension/wasmplugin.go` do.
//!
//! Selection: a plugin of the proxy's own namespace or of the root namespace applies
//! when its `selector` (none: every workload) matches the proxy's labels; a plugin with
//! `targetRefs` applies only to the gateway it names (`kind: Gateway` of
//! `gateway.networking.k8s.io`, matched by the proxy's
//! `gateway.networking.k8s.io/gateway-name` label in the plugin's namespace).
//! Ordering: own namespace first, then the root namespace, each oldest first; then,
//! stably, by `priority`, highest first (a plugin without priority after every plugin
//! with one). `match` narrows a plugin to listeners by mode (`CLIENT`: outbound and
//! gateways, `SERVER`: inbound, `UNDEFINED`/`CLIENT_AND_SERVER`: both) and port.

pub mod ecds;
pub mod extension_patch;
pub mod filters;
pub mod pull;

use std::collections::BTreeMap;
use std::sync::Arc;

use meshfed_api::extensions::v1alpha1 as ext;
use meshfed_api::r#type::v1beta1::WorkloadMode;
use meshfed_registry::config::Kind;

use crate::push::snapshot::Snapshot;

/// The prefix of the ECDS resource names of WasmPlugins (Istio's
/// `WasmPluginResourceNamePrefix`): `extensions.istio.io/wasmplugin/<namespace>.<name>`.
pub const RESOURCE_PREFIX: &str = "extensions.istio.io/wasmplugin/";

pub use crate::xds::deps::GATEWAY_NAME_LABEL;

/// One WasmPlugin as the generators use it.
#[derive(Clone, Debug, PartialEq)]
pub struct Plugin {
    pub name: String,
    pub namespace: String,
    /// The object's `resourceVersion` (sent to the agent, which re-pulls `Always`
    /// images when it changes).
    pub resource_version: String,
    pub creation_time: std::time::SystemTime,
    pub spec: ext::WasmPlugin,
}

impl Plugin {
    /// Its ECDS resource name, which its filter references name too.
    pub fn resource_name(&self) -> String {
        format!("{RESOURCE_PREFIX}{}.{}", self.namespace, self.name)
    }

    /// The phase it goes in.
    pub fn phase(&self) -> ext::PluginPhase {
        self.spec.phase()
    }

    /// A network filter (`type: NETWORK`); HTTP otherwise.
    pub fn is_network(&self) -> bool {
        self.spec.r#type() == ext::PluginType::Network
    }

    /// Its priority; a plugin without one sorts after every plugin with one.
    fn priority(&self) -> i32 {
        self.spec.priority.as_ref().map_or(i32::MIN, |p| p.value)
    }
}

/// The class of listener a filter chain belongs to (Istio's `ListenerClass`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListenerClass {
    SidecarInbound,
    SidecarOutbound,
    Gateway,
}

/// What a plugin's `match` is tested against: a listener's class and port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerInfo {
    pub class: ListenerClass,
    pub port: u32,
}

/// Whether one of `plugin`'s traffic selectors (none: all) takes `info`; `None` means
/// "any listener" (ECDS), which every plugin matches.
pub fn matches_listener(plugin: &ext::WasmPlugin, info: Option<ListenerInfo>) -> bool {
    let Some(info) = info else {
        return true;
    };
    plugin.r#match.is_empty()
        || plugin.r#match.iter().any(|m| {
            let mode = match m.mode() {
                WorkloadMode::Undefined | WorkloadMode::ClientAndServer => true,
                WorkloadMode::Client => info.class != ListenerClass::SidecarInbound,
                WorkloadMode::Server => info.class == ListenerClass::SidecarInbound,
            };
            let port = m.ports.is_empty()
                || m.ports
                    .iter()
                    .any(|p| p.number != 0 && p.number == info.port);
            mode && port
        })
}

/// Whether `plugin` (of its namespace) selects a proxy of `namespace` with `labels`
/// (see the module doc). `root` is the mesh's root namespace.
pub fn selects(
    plugin: &Plugin,
    root: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let spec = &plugin.spec;
    let refs: Vec<_> = spec.target_ref.iter().chain(&spec.target_refs).collect();
    if !refs.is_empty() {
        // Only Gateway API gateways of the plugin's own namespace are served; the other
        // targets (GatewayClass, Services of waypoints, ServiceEntries) attach to
        // proxies meshfed does not run.
        return plugin.namespace == namespace
            && refs.iter().any(|r| {
                r.group == "gateway.networking.k8s.io"
                    && r.kind == "Gateway"
                    && labels.get(GATEWAY_NAME_LABEL) == Some(&r.name)
            });
    }
    if plugin.namespace != namespace && plugin.namespace != root {
        return false;
    }
    spec.selector
        .as_ref()
        .is_none_or(|s| s.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// The WasmPlugins of the snapshot, oldest first (then namespace and name), with the
/// resource version of their object.
pub fn all_plugins(snapshot: &Snapshot) -> Vec<Arc<Plugin>> {
    let config = snapshot.config();
    let objects = config.objects_of(Kind::WasmPlugin);
    config
        .wasm_plugins()
        .iter()
        .map(|c| {
            let resource_version = objects
                .binary_search_by(|o| {
                    (o.namespace.as_str(), o.name.as_str())
                        .cmp(&(c.namespace.as_str(), c.name.as_str()))
                })
                .map(|i| objects[i].resource_version.clone())
                .unwrap_or_default();
            Arc::new(Plugin {
                name: c.name.clone(),
                namespace: c.namespace.clone(),
                resource_version,
                creation_time: c.creation_time,
                spec: c.spec.clone(),
            })
        })
        .collect()
}

/// The plugins that apply to a proxy of `namespace` with `labels`, in Istio's order
/// (see the module doc).
pub fn for_proxy(
    plugins: &[Arc<Plugin>],
    root: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<Arc<Plugin>> {
    let mut out: Vec<Arc<Plugin>> = Vec::new();
    let mut namespaces = vec![namespace];
    if root != namespace {
        namespaces.push(root);
    }
    for ns in namespaces {
        out.extend(
            plugins
                .iter()
                .filter(|p| p.namespace == ns && selects(p, root, namespace, labels))
                .cloned(),
        );
    }
    // Stable: equal priorities keep the namespace and age order.
    out.sort_by_key(|p| std::cmp::Reverse(p.priority()));
    out
}

/// The plugins of `phase` among `plugins` that take listener `info` and are of the
/// kind (`network`) a filter list holds.
pub fn of_phase<'a>(
    plugins: &'a [Arc<Plugin>],
    phase: ext::PluginPhase,
    network: bool,
    info: ListenerInfo,
) -> impl Iterator<Item = &'a Arc<Plugin>> + 'a {
    plugins.iter().filter(move |p| {
        p.phase() == phase && p.is_network() == network && matches_listener(&p.spec, Some(info))
    })
}

/// Adds the filter references of the WasmPlugins selecting `client` to its listeners
/// (the listener generators' hook).
pub fn apply_to_listeners(
    snapshot: &Snapshot,
    client: &crate::model::ClientView,
    listeners: &mut [envoy_types::pb::envoy::config::listener::v3::Listener],
) {
    let all = all_plugins(snapshot);
    if all.is_empty() {
        return;
    }
    let plugins = for_proxy(
        &all,
        &snapshot.config().root_namespace,
        &client.namespace,
        &client.labels,
    );
    filters::apply_to_listeners(listeners, &plugins, client.is_router());
}

/// ECDS for `proxy`: the extension configs of the WasmPlugins selecting it that it
/// subscribed to, in Istio's order. Names it asks for that no plugin of it has are
/// left out (Istio sends nothing for them, and never removals). No pull Secret is
/// sent (see [`ecds_for_connection`]).
pub fn ecds_resources(
    snapshot: &Snapshot,
    proxy: &crate::model::Proxy,
    sub: crate::generate::Subscription<'_>,
) -> Vec<crate::xds::Resource> {
    ecds_with_secrets(snapshot, proxy, sub, None, "")
}

/// [`ecds_resources`] for connection `connection` of `proxy` (not yet resolved by
/// [`Snapshot::proxy_view`]), with the image pull Secrets SDS lets it read
/// ([`pull`]).
pub fn ecds_for_connection(
    snapshot: &Snapshot,
    proxy: &crate::model::Proxy,
    sub: crate::generate::Subscription<'_>,
    sds: Option<&dyn pull::PullSecretReader>,
    connection: &str,
) -> Vec<crate::xds::Resource> {
    let proxy = snapshot.proxy_view(proxy);
    ecds_with_secrets(snapshot, &proxy, sub, sds, connection)
}

fn ecds_with_secrets(
    snapshot: &Snapshot,
    proxy: &crate::model::Proxy,
    sub: crate::generate::Subscription<'_>,
    sds: Option<&dyn pull::PullSecretReader>,
    connection: &str,
) -> Vec<crate::xds::Resource> {
    let all = all_plugins(snapshot);
    let plugins = for_proxy(
        &all,
        &snapshot.config().root_namespace,
        &proxy.namespace,
        &proxy.labels,
    );
    let names: Vec<String> = sub.names.iter().cloned().collect();
    let secrets = pull::secrets_for(sds, connection, &plugins, proxy, &names);
    // EnvoyFilter ADD patches first, then the plugins, as istiod.
    let mut configs = extension_patch::inserted_extension_configs(
        crate::generate::envoyfilter::select(snapshot, proxy).as_ref(),
        &names,
    );
    configs.extend(ecds::inserted_extension_configs(
        &plugins,
        &names,
        Plugin::resource_name,
        &secrets,
    ));
    configs.iter().map(ecds::encode).collect()
}

#[cfg(test)]
mod tests;

//! Assembling a snapshot's config from the config stores: every object of a kind
//! that feeds the config index ([`Feeds::ConfigIndex`], declared in
//! `meshfed_registry::config::kinds`) goes into its place of the [`ConfigSet`], which
//! [`ConfigIndex::new`] indexes. The same pass counts what is rejected and what is not
//! fully applied (and warns when that changes); [`IgnoredMetrics`] counts the objects
//! of kinds meshfed does not read.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};

use meshfed_api::security::v1beta1::RequestAuthentication;
use meshfed_registry::config::{ConfigObject, ConfigStore, Feeds, Spec};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use super::config_index::{ConfigIndex, ConfigSet};
use super::config_object::Config;
use super::jwks_table::JwksTable;
use super::{ConfigSourceFn, PushMetrics};

/// Puts `object` in its place of `set`. Objects of kinds that do not feed the config
/// index (ServiceEntry and WorkloadEntry feed the service registry; some kinds feed
/// nothing yet) have none.
pub fn add_to_set(set: &mut ConfigSet, object: &ConfigObject) {
    match &object.spec {
        Spec::VirtualService(vs) => set.virtual_services.push(Config::of(object, vs)),
        Spec::DestinationRule(dr) => set.destination_rules.push(Config::of(object, dr)),
        Spec::Gateway(g) => set.gateways.push(Config::of(object, g)),
        Spec::Sidecar(sc) => set.sidecars.push(Config::of(object, sc)),
        Spec::PeerAuthentication(pa) => set.peer_authentications.push(Config::of(object, pa)),
        Spec::RequestAuthentication(ra) => set.request_authentications.push(Config::of(object, ra)),
        Spec::AuthorizationPolicy(ap) => set.authorization_policies.push(Config::of(object, ap)),
        Spec::Telemetry(t) => set.telemetries.push(Config::of(object, t)),
        Spec::EnvoyFilter(e) => set.envoy_filters.push(Config::of(object, e)),
        Spec::WasmPlugin(w) => set.wasm_plugins.push(Config::of(object, w)),
        // The Gateway API kinds are read from `set.objects` by their translation
        // (`meshfed_registry::config::gateway_api::convert`).
        _ if object.kind.is_gateway_api() => {}
        #[allow(unreachable_patterns)]
        _ => debug_assert_ne!(
            object.kind.info().feeds,
            Feeds::ConfigIndex,
            "{} feeds the config index but has no place in ConfigSet",
            object.kind
        ),
    }
}

/// Builds the snapshot's config index from every store in `stores`: the objects of
/// kinds that feed it, the mesh config and `domain`; `jwks` gives the keys of the
/// RequestAuthentications (fetched so far; new ones are fetched and push when they
/// arrive). Sets `meshfed_config_rejected` and `meshfed_config_not_enforced` and logs
/// a WARN whenever the objects not fully applied change. `service_hosts` gives the
/// registries' service hostnames with their ports (name, number) and
/// `service_addresses` a service's external addresses (a Gateway's
/// `status.addresses`), read only when there are Gateway API objects.
pub fn config_source(
    stores: Vec<Arc<dyn ConfigStore>>,
    domain: &str,
    gateway_controller: &str,
    metrics: Arc<PushMetrics>,
    jwks: impl Fn(&[Config<RequestAuthentication>]) -> Arc<JwksTable> + Send + Sync + 'static,
    service_hosts: impl Fn() -> HashMap<String, Vec<(String, u32)>> + Send + Sync + 'static,
    service_addresses: impl Fn(&str) -> Vec<String> + Send + Sync + 'static,
) -> ConfigSourceFn {
    let domain = domain.to_string();
    let gateway_controller = gateway_controller.to_string();
    // The security objects last warned about, so a WARN goes out when they change.
    let warned: Arc<Mutex<Vec<String>>> = Arc::default();
    Arc::new(move |mesh| {
        let mut set = ConfigSet::default();
        let rejected: usize = stores.iter().map(|s| s.rejected().len()).sum();
        metrics.config_rejected.set(rejected as i64);
        let mut not_enforced = Vec::new();
        for store in &stores {
            for object in store.all() {
                if let Some(gap) = meshfed_registry::config::validation::not_enforced_in(
                    &object,
                    Some(&mesh.config),
                ) {
                    not_enforced.push(format!(
                        "{} {}/{} ({}): {gap}",
                        object.kind, object.namespace, object.name, object.source
                    ));
                }
                // Fields of Istio's API set in the object that meshfed does not act on.
                let unsupported = object.spec.unsupported_fields();
                if !unsupported.is_empty() {
                    let fields: Vec<String> =
                        unsupported.iter().map(|w| w.field.to_string()).collect();
                    not_enforced.push(format!(
                        "{} {}/{} ({}): {}: {}",
                        object.kind,
                        object.namespace,
                        object.name,
                        object.source,
                        fields.join(", "),
                        meshfed_registry::config::spec_json::NOT_ACTED_ON_MESSAGE
                    ));
                }
                add_to_set(&mut set, &object);
                set.objects.push(object);
            }
        }
        set.namespaces = namespace_labels(&stores).map(Arc::new);
        translate_gateway_api(
            &mut set,
            &domain,
            &gateway_controller,
            &stores,
            &service_hosts,
            &service_addresses,
        );
        metrics.config_not_enforced.set(not_enforced.len() as i64);
        not_enforced.sort();
        let mut last = warned.lock().unwrap_or_else(|e| e.into_inner());
        if *last != not_enforced {
            if !not_enforced.is_empty() {
                tracing::warn!(
                    objects = %not_enforced.join("; "),
                    "config objects meshfed does not fully apply yet"
                );
            }
            *last = not_enforced;
        }
        let keys = jwks(&set.request_authentications);
        ConfigIndex::new(set, &domain, mesh).with_jwks(keys)
    })
}

/// The namespace labels the stores know (the first store naming a namespace wins);
/// `None` when no store reads Namespaces.
fn namespace_labels(
    stores: &[Arc<dyn ConfigStore>],
) -> Option<meshfed_registry::config::NamespaceLabels> {
    let mut namespaces: Option<meshfed_registry::config::NamespaceLabels> = None;
    for labels in stores.iter().filter_map(|s| s.namespace_labels()) {
        let all = namespaces.get_or_insert_with(Default::default);
        for (name, l) in labels {
            all.entry(name).or_insert(l);
        }
    }
    namespaces
}

/// Translates the set's Gateway API objects (Istio's `pilot/pkg/config/kube/gateway`)
/// and puts the Istio Gateways and VirtualServices produced beside the user's, so the
/// generators serve them like any other; the translation and status are kept for
/// `/debug/configz` and the status writer. Backends and parent Services are looked
/// up among `service_hosts` (the snapshot rebuilds the config when one of those looked
/// up appears or goes: [`convert::Output::stale`]); namespace labels
/// (`set.namespaces`) and ConfigMaps are the stores'.
fn translate_gateway_api(
    set: &mut ConfigSet,
    domain: &str,
    controller: &str,
    stores: &[Arc<dyn ConfigStore>],
    service_hosts: &dyn Fn() -> HashMap<String, Vec<(String, u32)>>,
    service_addresses: &dyn Fn(&str) -> Vec<String>,
) {
    use meshfed_registry::config::gateway_api::convert;
    if !set.objects.iter().any(|o| o.kind.is_gateway_api()) {
        return;
    }
    let hosts = service_hosts();
    let mut config_maps: Option<meshfed_registry::config::ConfigMaps> = None;
    for maps in stores.iter().filter_map(|s| s.config_maps()) {
        let all = config_maps.get_or_insert_with(Default::default);
        for (name, data) in maps {
            all.entry(name).or_insert(data);
        }
    }
    let output = convert::convert(&convert::Inputs {
        objects: &set.objects,
        domain,
        controller,
        service_exists: &|h| hosts.contains_key(h),
        namespaces: set.namespaces.as_deref(),
        service_addresses,
        service_ports: &|h| hosts.get(h).cloned(),
        config_maps: config_maps.as_ref(),
    });
    for object in &output.objects {
        add_to_set(set, object);
    }
    set.gateway_api = Arc::new(output);
}

/// `meshfed_config_ignored{kind}`: objects of kinds meshfed does not read that the
/// stores hold right now, by kind (read when scraped; a kind seen once stays listed,
/// at 0 when it is gone).
#[derive(Clone)]
pub struct IgnoredMetrics {
    stores: Vec<Arc<dyn ConfigStore>>,
    seen: Arc<Mutex<BTreeSet<String>>>,
}

impl fmt::Debug for IgnoredMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IgnoredMetrics").finish_non_exhaustive()
    }
}

impl IgnoredMetrics {
    /// Counts the ignored objects of `stores` in `registry`.
    pub fn register(stores: Vec<Arc<dyn ConfigStore>>, registry: &mut Registry) {
        registry.register_collector(Box::new(IgnoredMetrics {
            stores,
            seen: Arc::default(),
        }));
    }

    /// The current count by kind, with every kind seen before.
    fn counts(&self) -> BTreeMap<String, i64> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut counts: BTreeMap<String, i64> = seen.iter().map(|kind| (kind.clone(), 0)).collect();
        for store in &self.stores {
            for object in store.ignored() {
                *counts.entry(object.kind).or_default() += 1;
            }
        }
        seen.extend(counts.keys().cloned());
        counts
    }
}

impl Collector for IgnoredMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let counts = self.counts();
        meshfed_registry::metrics::encode_gauges(
            &mut encoder,
            "meshfed_config_ignored",
            "Config objects of kinds meshfed does not read (another group, or an Istio kind not supported yet), found in config files and not applied; listed under `ignored` in /debug/configz",
            "kind",
            counts.iter().map(|(k, n)| (k.as_str(), *n)),
        )
    }
}

#[cfg(test)]
mod tests {
    use meshfed_registry::config::{Kind, MemoryConfigStore};

    use super::*;

    /// Every kind declared to feed the config index has a place in the set.
    #[test]
    fn every_kind_that_feeds_the_index_has_a_place() {
        let empty = serde_json::Value::Null;
        // The Gateway API kinds feed it through their translation (see
        // `translate_gateway_api`), not a list of their own.
        for kind in Kind::ALL.into_iter().filter(|k| !k.is_gateway_api()) {
            let spec = Spec::from_value(kind, &empty).unwrap();
            let mut set = ConfigSet::default();
            add_to_set(&mut set, &ConfigObject::new("ns", "n", spec));
            let placed = format!("{set:?}") != format!("{:?}", ConfigSet::default());
            assert_eq!(
                placed,
                kind.info().feeds == Feeds::ConfigIndex,
                "{kind}: {:?}",
                kind.info().feeds
            );
        }
    }

    #[test]
    fn ignored_objects_are_counted_by_kind() {
        let (sink, _events) = meshfed_registry::UpdateSink::new(Default::default());
        let stores: Vec<Arc<dyn ConfigStore>> = vec![Arc::new(MemoryConfigStore::new(sink))];
        let mut registry = Registry::default();
        IgnoredMetrics::register(stores, &mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("# TYPE meshfed_config_ignored gauge"),
            "{text}"
        );
    }
}

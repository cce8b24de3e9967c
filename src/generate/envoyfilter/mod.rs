//! EnvoyFilter: which EnvoyFilters apply to a proxy, and their patches applied to the
//! clusters, listeners and route configurations generated for it, as Istio's
//! `pilot/pkg/networking/core/envoyfilter` applies them.
//!
//! Selection ([`select`], Istio's `PushContext.EnvoyFilters`): the EnvoyFilters of the
//! root namespace, then those of the proxy's own namespace, each without a
//! `workloadSelector` or with one whose labels the proxy carries; an EnvoyFilter with
//! `targetRefs` selects the proxies of the Gateway API gateways it names (waypoint
//! targets are reported, see [`selects`]).
//! They are ordered by `priority`, then root namespace first, then creation time, then
//! `name.namespace`; their patches keep that order, and a patch whose `proxy` match
//! (version regex, metadata) does not hold is left out.
//!
//! Application ([`apply`]): the cached, unpatched resources of a proxy with matching
//! patches are decoded, patched ([`cluster`], [`listener`], [`route`]) and re-encoded;
//! a resource no patch changed keeps its shared encoding, and what a patch set makes of
//! a resource is shared by every proxy with that patch set ([`memo`]). A patch whose
//! value does not convert to its Envoy type is rejected alone ([`status`]).

#[cfg(test)]
mod bench;
pub mod cluster;
pub mod listener;
pub mod memo;
pub mod route;
pub mod status;
pub mod value;
#[cfg(test)]
mod vectors;
#[cfg(test)]
mod vectors_listener;
#[cfg(test)]
mod vectors_listener_apply;
#[cfg(test)]
mod vectors_model;
#[cfg(test)]
mod vectors_route;
#[cfg(test)]
mod vectors_support;
#[cfg(test)]
mod vectors_util;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex};

use meshfed_api::networking::v1alpha3::EnvoyFilter;
use meshfed_api::networking::v1alpha3::envoy_filter::{
    ApplyTo, EnvoyConfigObjectMatch, PatchContext, patch::Operation,
};
use prost_reflect::DynamicMessage;

use crate::model::Proxy;
use crate::push::config_index::Config;
use crate::push::snapshot::Snapshot;
use crate::xds::deps::{GATEWAY_NAME_LABEL, is_gateway_ref};
use crate::xds::{Resource, ResourceList, TypeUrl};

/// Installs the check of patch values into config validation (`meshfed validate`,
/// the webhook, the stores): a value that does not convert to its Envoy type is an
/// error at `spec.configPatches[i].patch.value`, unknown fields a warning.
pub fn install() {
    meshfed_registry::config::validate::envoy_filter::install_value_checker(value::check);
}

/// One patch of an EnvoyFilter, ready to apply.
#[derive(Debug)]
pub struct Patch {
    /// `namespace/name` of its EnvoyFilter.
    pub key: Arc<str>,
    /// What it applies to.
    pub apply_to: ApplyTo,
    /// The operation (`INSERT_*` become `ADD` where Istio makes them so).
    pub operation: Operation,
    /// The match (a match-all `ANY` one when the patch has none).
    pub matcher: EnvoyConfigObjectMatch,
    /// The value as its Envoy message; `None` for `REMOVE` without a value.
    pub value: Option<DynamicMessage>,
    /// Its encoding (what typed copies are decoded from).
    pub bytes: Vec<u8>,
    /// Unique among every patch compiled by this process (see [`memo`]).
    pub id: u64,
    /// A `CLUSTER` `MERGE` without a transport socket: the bytes that merge the value
    /// into an encoded cluster ([`value::merge_bytes`]).
    pub cluster_merge: Option<Vec<u8>>,
    proxy_version: Option<regex::Regex>,
}

/// The next [`Patch::id`].
static NEXT_PATCH_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Patch {
    /// The patch context holds: `ANY` or the same context.
    pub fn context_matches(&self, ctx: PatchContext) -> bool {
        self.matcher.context == PatchContext::Any as i32 || self.matcher.context == ctx as i32
    }

    /// The value as a typed message (a fresh copy).
    pub fn typed<M: prost::Message + Default>(&self) -> Option<M> {
        self.value.as_ref()?;
        M::decode(self.bytes.as_slice()).ok()
    }

    fn proxy_matches(&self, proxy: &Proxy) -> bool {
        let Some(pm) = &self.matcher.proxy else {
            return true;
        };
        if let Some(re) = &self.proxy_version {
            match proxy.istio_version.as_deref() {
                Some(v) if !v.is_empty() && re.is_match(v) => {}
                _ => return false,
            }
        }
        pm.metadata
            .iter()
            .all(|(k, v)| proxy.metadata.get(k).and_then(|m| m.as_str()) == Some(v.as_str()))
    }
}

/// One EnvoyFilter's patches.
#[derive(Debug)]
pub struct Compiled {
    pub key: Arc<str>,
    pub patches: Vec<Arc<Patch>>,
}

/// Compiles an EnvoyFilter: each patch's value converted to its Envoy type. A value
/// that does not convert rejects that patch, reported through [`status`].
pub fn compile(config: &Config<EnvoyFilter>) -> Compiled {
    let key: Arc<str> = Arc::from(format!("{}/{}", config.namespace, config.name));
    let mut patches = Vec::new();
    for (i, cp) in config.spec.config_patches.iter().enumerate() {
        let Some(p) = &cp.patch else { continue };
        let apply_to = ApplyTo::try_from(cp.apply_to).unwrap_or(ApplyTo::Invalid);
        let mut operation = Operation::try_from(p.operation).unwrap_or(Operation::Invalid);
        if apply_to == ApplyTo::Invalid || operation == Operation::Invalid {
            continue;
        }
        if matches!(
            operation,
            Operation::InsertAfter | Operation::InsertBefore | Operation::InsertFirst
        ) && !matches!(
            apply_to,
            ApplyTo::HttpFilter
                | ApplyTo::NetworkFilter
                | ApplyTo::HttpRoute
                | ApplyTo::ListenerFilter
        ) {
            operation = Operation::Add;
        }
        let value = match &p.value {
            None => None,
            Some(v) => {
                let json = serde_json::to_value(v).unwrap_or_default();
                match value::from_json(apply_to, &json, false) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        status::reject(&key, &format!("spec.configPatches[{i}].patch.value"), &e);
                        continue;
                    }
                }
            }
        };
        if value.is_none() && operation != Operation::Remove {
            continue;
        }
        let matcher = cp.r#match.clone().unwrap_or_default();
        let proxy_version = matcher
            .proxy
            .as_ref()
            .filter(|p| !p.proxy_version.is_empty())
            .and_then(|p| regex::Regex::new(&p.proxy_version).ok());
        let bytes = value
            .as_ref()
            .map(prost::Message::encode_to_vec)
            .unwrap_or_default();
        let cluster_merge = value
            .as_ref()
            .filter(|v| {
                apply_to == ApplyTo::Cluster
                    && operation == Operation::Merge
                    && !v.has_field_by_name("transport_socket")
            })
            .map(value::merge_bytes);
        patches.push(Arc::new(Patch {
            key: key.clone(),
            apply_to,
            operation,
            matcher,
            value,
            bytes,
            id: NEXT_PATCH_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            cluster_merge,
            proxy_version,
        }));
    }
    Compiled { key, patches }
}

/// Compiled EnvoyFilters, with the config objects they were compiled from.
#[derive(Default)]
struct CompiledCache {
    /// By the address of the config object (held, so the address stays its own).
    by_object: HashMap<usize, (Arc<Config<EnvoyFilter>>, Arc<Compiled>)>,
    /// `(namespace, name)` -> the address of the last object compiled for it.
    by_name: HashMap<(String, String), usize>,
}

static COMPILED: LazyLock<Mutex<CompiledCache>> = LazyLock::new(Mutex::default);

/// The compiled patches of `config`. Every snapshot built after a config change holds
/// new objects; one with the spec of the last object of its name keeps that object's
/// compiled patches (their ids, so what [`memo`] holds for them stays valid, and their
/// status). A changed spec is compiled anew.
fn compiled(config: &Arc<Config<EnvoyFilter>>) -> Arc<Compiled> {
    let address = Arc::as_ptr(config) as usize;
    let mut cache = COMPILED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, out)) = cache.by_object.get(&address) {
        return out.clone();
    }
    let name = (config.namespace.clone(), config.name.clone());
    if let Some(previous) = cache.by_name.get(&name).copied() {
        let reuse = cache
            .by_object
            .get(&previous)
            .filter(|(old, _)| old.spec == config.spec)
            .map(|(_, out)| out.clone());
        cache.by_object.remove(&previous);
        if let Some(out) = reuse {
            cache
                .by_object
                .insert(address, (config.clone(), out.clone()));
            cache.by_name.insert(name, address);
            return out;
        }
    }
    status::clear(&format!("{}/{}", config.namespace, config.name));
    let out = Arc::new(compile(config));
    cache
        .by_object
        .insert(address, (config.clone(), out.clone()));
    cache.by_name.insert(name, address);
    out
}

/// The patches that apply to one proxy, by apply-to, in application order.
#[derive(Debug, Default)]
pub struct ProxyPatches {
    by_apply_to: BTreeMap<i32, Vec<Arc<Patch>>>,
    /// `namespace/name` of every EnvoyFilter selected.
    pub keys: Vec<Arc<str>>,
}

impl ProxyPatches {
    /// The patches of `apply_to`.
    pub fn of(&self, apply_to: ApplyTo) -> &[Arc<Patch>] {
        self.by_apply_to
            .get(&(apply_to as i32))
            .map_or(&[], Vec::as_slice)
    }

    fn any_of(&self, kinds: &[ApplyTo]) -> bool {
        kinds.iter().any(|k| !self.of(*k).is_empty())
    }
}

/// Whether an EnvoyFilter of `namespace` with `selector` selects a proxy of
/// `proxy_namespace` with `labels`, under `root` (the root namespace), as Istio's
/// `WorkloadPolicyMatcher.ShouldAttachPolicy` (for `PolicyMatcherForProxy`) decides:
/// without `targetRefs`, by `workloadSelector` (Gateway API gateways included, Istio's
/// default `ENABLE_SELECTOR_BASED_K8S_GATEWAY_POLICY`); with `targetRefs`, only the
/// proxies of a Gateway API gateway (label `gateway.networking.k8s.io/gateway-name`)
/// that a `kind: Gateway` reference of the EnvoyFilter's own namespace names. The
/// other targets (`Service`, `ServiceEntry`, `GatewayClass istio-waypoint`) attach to
/// waypoints, which meshfed does not serve ([`unserved_target_refs`]).
pub fn selects(
    ef: &Config<EnvoyFilter>,
    root: &str,
    proxy_namespace: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    if ef.namespace != root && ef.namespace != proxy_namespace {
        return false;
    }
    if !ef.spec.target_refs.is_empty() {
        let Some(gateway) = labels.get(GATEWAY_NAME_LABEL) else {
            return false;
        };
        return ef.namespace == proxy_namespace
            && ef.spec.target_refs.iter().any(|r| {
                is_gateway_ref(r)
                    && &r.name == gateway
                    && (r.namespace.is_empty() || r.namespace == proxy_namespace)
            });
    }
    ef.spec
        .workload_selector
        .as_ref()
        .is_none_or(|s| s.labels.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// The `targetRefs` of an EnvoyFilter that select no proxy meshfed serves, each as
/// `spec.targetRefs[i]: reason` (reported in `/debug/configz` and by `meshfed
/// validate`): waypoint targets, and references to another namespace.
pub fn unserved_target_refs(ef: &EnvoyFilter, namespace: &str) -> Vec<String> {
    ef.target_refs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let why = if is_gateway_ref(r) {
                if r.namespace.is_empty() || r.namespace == namespace {
                    return None;
                }
                format!("names namespace {:?}; only the EnvoyFilter's own namespace is matched", r.namespace)
            } else if matches!(r.kind.as_str(), "Service" | "ServiceEntry" | "GatewayClass") {
                format!(
                    "{} {:?} attaches the EnvoyFilter to waypoints, which meshfed does not serve: not applied",
                    r.kind, r.name
                )
            } else {
                format!("{}/{} {:?} selects no proxy: not applied", r.group, r.kind, r.name)
            };
            Some(format!("spec.targetRefs[{i}]: {why}"))
        })
        .collect()
}

/// The EnvoyFilters selecting `proxy` and their patches that match it (see the module
/// doc); `None` when there are none.
pub fn select(snapshot: &Snapshot, proxy: &Proxy) -> Option<ProxyPatches> {
    let config = snapshot.config();
    patches_for(config.envoy_filters(), &config.root_namespace, proxy)
}

/// [`select`] over `efs` with root namespace `root`.
pub fn patches_for(
    efs: &[Arc<Config<EnvoyFilter>>],
    root: &str,
    proxy: &Proxy,
) -> Option<ProxyPatches> {
    let mut chosen: Vec<&Arc<Config<EnvoyFilter>>> = efs
        .iter()
        .filter(|ef| selects(ef, root, &proxy.namespace, &proxy.labels))
        .collect();
    if chosen.is_empty() {
        return None;
    }
    order(&mut chosen, root);
    let mut out = ProxyPatches::default();
    for ef in chosen {
        let c = compiled(ef);
        out.keys.push(c.key.clone());
        for p in &c.patches {
            if p.proxy_matches(proxy) {
                out.by_apply_to
                    .entry(p.apply_to as i32)
                    .or_default()
                    .push(p.clone());
            }
        }
    }
    Some(out)
}

/// Istio's order of the EnvoyFilters of a proxy: priority, root namespace first,
/// creation time, then `name.namespace`.
pub fn order(efs: &mut [&Arc<Config<EnvoyFilter>>], root: &str) {
    efs.sort_by(|a, b| {
        a.spec
            .priority
            .cmp(&b.spec.priority)
            .then_with(|| (b.namespace == root).cmp(&(a.namespace == root)))
            .then_with(|| a.creation_time.cmp(&b.creation_time))
            .then_with(|| {
                format!("{}.{}", a.name, a.namespace).cmp(&format!("{}.{}", b.name, b.namespace))
            })
    });
}

/// The patch context of a proxy's resource: `GATEWAY` for routers, else inbound or
/// outbound by the resource.
pub fn context(proxy: &Proxy, inbound: bool) -> PatchContext {
    if proxy.is_router() {
        PatchContext::Gateway
    } else if inbound {
        PatchContext::SidecarInbound
    } else {
        PatchContext::SidecarOutbound
    }
}

/// `resources` of `type_url` for `proxy` with the patches of the EnvoyFilters that
/// select it applied; `wildcard` (the whole list was asked for) lets `ADD` patches add
/// clusters and listeners.
pub fn apply(
    type_url: TypeUrl,
    resources: ResourceList,
    snapshot: &Snapshot,
    proxy: &Proxy,
    wildcard: bool,
) -> ResourceList {
    let relevant: &[ApplyTo] = match type_url {
        TypeUrl::Cluster => &[ApplyTo::Cluster],
        TypeUrl::Listener => &[
            ApplyTo::Listener,
            ApplyTo::FilterChain,
            ApplyTo::NetworkFilter,
            ApplyTo::HttpFilter,
            ApplyTo::ListenerFilter,
        ],
        TypeUrl::Route => &[
            ApplyTo::RouteConfiguration,
            ApplyTo::VirtualHost,
            ApplyTo::HttpRoute,
        ],
        _ => return resources,
    };
    let Some(patches) = select(snapshot, proxy).filter(|p| p.any_of(relevant)) else {
        return resources;
    };
    // Each resource is patched once per patch set and shared (see `memo`); the
    // additions of `ADD` patches follow.
    let set = memo::patch_set(&patches, relevant, proxy.is_router());
    let out: Vec<Resource> = match type_url {
        TypeUrl::Cluster => {
            let inbound_seen = resources.iter().any(cluster::is_inbound);
            // A `service` match of an inbound cluster reads the services the sidecar
            // serves on its port, so they are part of an inbound cluster's patch set.
            let inbound = if !proxy.is_router() && cluster::matches_inbound_services(&patches) {
                cluster::inbound_hosts(snapshot, proxy)
            } else {
                cluster::InboundHosts::new()
            };
            let inbound_set = memo::with_input(set, &inbound);
            let set_of = |r: &Resource| {
                if cluster::is_inbound(r) {
                    inbound_set
                } else {
                    set
                }
            };
            let mut out = memo::patched(type_url, set_of, resources.into_vec(), |r| {
                cluster::patch_one(&patches, r, proxy, &inbound)
            });
            if wildcard {
                out.extend(cluster::added(&patches, proxy, inbound_seen));
            }
            out
        }
        TypeUrl::Listener => {
            let mut out = memo::patched(
                type_url,
                |_| set,
                resources.into_vec(),
                |r| listener::patch_one(&patches, r, proxy),
            );
            if wildcard {
                let mut present = out.iter().map(|r| r.name.to_string()).collect();
                for ctx in listener::add_contexts(proxy) {
                    out.extend(listener::added(&patches, *ctx, &mut present));
                }
            }
            out
        }
        _ => {
            // A router's route configurations are matched through its port map too
            // (a `portNumber` naming a Gateway server port matches the route
            // configuration of its target port), so the map is part of the patch set.
            let port_map = if proxy.is_router() && route::matches_ports(&patches) {
                super::gateway_port_map(snapshot, proxy)
            } else {
                route::GatewayPortMap::new()
            };
            let set = memo::with_input(set, &port_map);
            memo::patched(
                type_url,
                |_| set,
                resources.into_vec(),
                |r| Some(route::patch_one(&patches, r, proxy, &port_map)),
            )
        }
    };
    out.into()
}

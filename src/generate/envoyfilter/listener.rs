//! `LISTENER`, `LISTENER_FILTER`, `FILTER_CHAIN`, `NETWORK_FILTER` and `HTTP_FILTER`
//! patches (Istio's `listener_patch.go`), applied per listener in Istio's order:
//! listener merges and removals, listener filters, then per filter chain the chain
//! patches, network filter operations and merges, and the HTTP filters of connection
//! managers; chains and listeners added last.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, Listener, ListenerFilter, filter, listener_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_filter,
};
use envoy_types::pb::google::protobuf::Any;
use meshfed_api::networking::v1alpha3::envoy_filter::{
    ApplyTo, PatchContext, envoy_config_object_match::ObjectTypes, listener_match, patch::Operation,
};
use prost::{Message, Name};

use super::{Patch, ProxyPatches, context, status, value};
use crate::generate::lds::{VIRTUAL_INBOUND, VIRTUAL_OUTBOUND};
use crate::model::Proxy;
use crate::xds::{EncodedResource, Resource, TypeUrl};

const HCM: &str = "envoy.filters.network.http_connection_manager";

fn lmatch(p: &Patch) -> Option<&meshfed_api::networking::v1alpha3::envoy_filter::ListenerMatch> {
    match &p.matcher.object_types {
        Some(ObjectTypes::Listener(l)) => Some(l),
        _ => None,
    }
}

fn is_virtual(l: &Listener) -> bool {
    l.name == VIRTUAL_INBOUND || l.name == VIRTUAL_OUTBOUND
}

fn port(l: &Listener) -> Option<u32> {
    match l.address.as_ref()?.address.as_ref()? {
        address::Address::SocketAddress(s) => match s.port_specifier {
            Some(socket_address::PortSpecifier::PortValue(p)) => Some(p),
            _ => None,
        },
        _ => None,
    }
}

/// Istio's `listenerMatch`.
pub fn listener_match(l: &Listener, p: &Patch) -> bool {
    let Some(m) = lmatch(p) else { return true };
    if !m.name.is_empty() && m.name != l.name {
        return false;
    }
    if p.apply_to != ApplyTo::Listener && is_virtual(l) {
        return true;
    }
    m.port_number == 0 || port(l) == Some(m.port_number)
}

/// Istio's `filterChainMatch` (the listener already matched).
pub fn filter_chain_match(l: &Listener, fc: &FilterChain, p: &Patch) -> bool {
    let Some(m) = lmatch(p) else { return true };
    let fcm = fc.filter_chain_match.as_ref();
    let dport = fcm
        .and_then(|f| f.destination_port.as_ref())
        .map(|v| v.value);
    if is_virtual(l) && m.port_number > 0 && dport.unwrap_or(0) != m.port_number {
        return false;
    }
    let Some(c) = &m.filter_chain else {
        return true;
    };
    if !c.name.is_empty() && c.name != fc.name {
        return false;
    }
    if !c.sni.is_empty() && !fcm.is_some_and(|f| f.server_names.contains(&c.sni)) {
        return false;
    }
    if !c.transport_protocol.is_empty()
        && fcm.is_none_or(|f| f.transport_protocol != c.transport_protocol)
    {
        return false;
    }
    if !c.application_protocols.is_empty() {
        let Some(f) = fcm else { return false };
        if !c
            .application_protocols
            .split(',')
            .all(|a| f.application_protocols.iter().any(|x| x == a))
        {
            return false;
        }
    }
    c.destination_port == 0 || dport == Some(c.destination_port)
}

fn filter_match_of(p: &Patch) -> Option<&listener_match::FilterMatch> {
    lmatch(p)?.filter_chain.as_ref()?.filter.as_ref()
}

fn network_filter_match(f: &Filter, p: &Patch) -> bool {
    filter_match_of(p).is_none_or(|m| m.name == f.name)
}

fn sub_filter_of(p: &Patch) -> Option<&str> {
    filter_match_of(p)?
        .sub_filter
        .as_ref()
        .map(|s| s.name.as_str())
}

fn http_filter_match(h: &HttpFilter, p: &Patch) -> bool {
    sub_filter_of(p).is_none_or(|n| n == h.name)
}

fn listener_filter_name(p: &Patch) -> Option<&str> {
    lmatch(p)
        .map(|m| m.listener_filter.as_str())
        .filter(|n| !n.is_empty())
}

/// An ordered-list operation of Istio (`ADD`, `INSERT_FIRST`, `INSERT_BEFORE`,
/// `INSERT_AFTER`, `REPLACE`, `REMOVE`) on `list`; `has_match` tells whether the patch
/// names an element, `matches` which elements it names. Returns whether it applied.
pub(super) fn list_op<T: Clone>(
    list: &mut Vec<T>,
    op: Operation,
    value: Option<T>,
    has_match: bool,
    matches: impl Fn(&T) -> bool,
    insert_first_counts: bool,
) -> bool {
    let first = || list.iter().position(&matches);
    match (op, value) {
        (Operation::Add, Some(v)) => {
            list.push(v);
            true
        }
        (Operation::InsertFirst, Some(v)) => {
            list.insert(0, v);
            insert_first_counts
        }
        (Operation::InsertAfter, Some(v)) => {
            if !has_match {
                list.push(v);
                return false;
            }
            match first() {
                Some(i) => {
                    list.insert(i + 1, v);
                    true
                }
                None => false,
            }
        }
        (Operation::InsertBefore, Some(v)) => {
            if !has_match {
                list.insert(0, v);
                return false;
            }
            match first() {
                Some(i) => {
                    list.insert(i, v);
                    true
                }
                None => false,
            }
        }
        (Operation::Replace, Some(v)) => {
            if !has_match {
                return false;
            }
            match first() {
                Some(i) => {
                    list[i] = v;
                    true
                }
                None => false,
            }
        }
        (Operation::Remove, _) => {
            if has_match {
                list.retain(|x| !matches(x));
            }
            false
        }
        _ => false,
    }
}

fn merge_typed_any(dst: &Option<Any>, src: &Option<Any>) -> Option<Any> {
    let (d, s) = (dst.as_ref()?, src.as_ref()?);
    Some(value::merge_any(d, s).unwrap_or_else(|_| d.clone()))
}

fn patch_listener_filters(patches: &[Arc<Patch>], ctx: PatchContext, l: &mut Listener) {
    for p in patches {
        if !p.context_matches(ctx) || !listener_match(l, p) {
            status::record(&p.key, "listenerfilter", false);
            continue;
        }
        let name = listener_filter_name(p);
        let applied = if p.operation == Operation::Merge {
            let Some(user) = p.typed::<ListenerFilter>() else {
                continue;
            };
            if name.is_none() {
                continue;
            }
            let mut applied = false;
            for lf in l
                .listener_filters
                .iter_mut()
                .filter(|f| Some(f.name.as_str()) == name)
            {
                let Some(listener_filter::ConfigType::TypedConfig(d)) = &lf.config_type else {
                    continue;
                };
                if let Some(listener_filter::ConfigType::TypedConfig(s)) = &user.config_type {
                    let merged = value::merge_any(d, s).unwrap_or_else(|_| d.clone());
                    lf.config_type = Some(listener_filter::ConfigType::TypedConfig(merged));
                }
                applied = true;
            }
            applied
        } else {
            list_op(
                &mut l.listener_filters,
                p.operation,
                p.typed::<ListenerFilter>(),
                name.is_some(),
                |f| name.is_none_or(|n| n == f.name),
                true,
            )
        };
        status::record(&p.key, "listenerfilter", applied);
    }
}

fn patch_http_filters(
    patches: &ProxyPatches,
    ctx: PatchContext,
    l: &Listener,
    fc: &FilterChain,
    f: &mut Filter,
) {
    let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        return;
    };
    let Ok(mut hcm) = HttpConnectionManager::decode(any.value.as_slice()) else {
        return;
    };
    let list = patches.of(ApplyTo::HttpFilter);
    for p in list {
        if !p.context_matches(ctx)
            || !listener_match(l, p)
            || !filter_chain_match(l, fc, p)
            || !network_filter_match(f, p)
        {
            status::record(&p.key, "httpfilter", false);
            continue;
        }
        if p.operation == Operation::Merge {
            continue;
        }
        let has = sub_filter_of(p).is_some();
        let applied = list_op(
            &mut hcm.http_filters,
            p.operation,
            p.typed::<HttpFilter>(),
            has,
            |h| http_filter_match(h, p),
            false,
        );
        status::record(&p.key, "httpfilter", applied);
    }
    for h in &mut hcm.http_filters {
        for p in list {
            if p.operation != Operation::Merge {
                continue;
            }
            if !p.context_matches(ctx)
                || !listener_match(l, p)
                || !filter_chain_match(l, fc, p)
                || !network_filter_match(f, p)
                || !http_filter_match(h, p)
            {
                status::record(&p.key, "httpfilter", false);
                continue;
            }
            let Some(http_filter::ConfigType::TypedConfig(d)) = &h.config_type else {
                continue;
            };
            let Some(user) = p.typed::<HttpFilter>() else {
                continue;
            };
            let merged = match &user.config_type {
                Some(http_filter::ConfigType::TypedConfig(s)) => {
                    Some(value::merge_any(d, s).unwrap_or_else(|_| d.clone()))
                }
                _ => None,
            };
            if !user.name.is_empty() {
                h.name = user.name;
            }
            if let Some(m) = merged {
                h.config_type = Some(http_filter::ConfigType::TypedConfig(m));
            }
            status::record(&p.key, "httpfilter", true);
        }
    }
    f.config_type = Some(filter::ConfigType::TypedConfig(Any {
        type_url: format!("type.googleapis.com/{}", HttpConnectionManager::full_name()),
        value: hcm.encode_to_vec(),
    }));
}

fn patch_network_filters(
    patches: &ProxyPatches,
    ctx: PatchContext,
    l: &Listener,
    fc: &mut FilterChain,
) {
    let list = patches.of(ApplyTo::NetworkFilter);
    for p in list {
        if !p.context_matches(ctx) || !listener_match(l, p) || !filter_chain_match(l, fc, p) {
            status::record(&p.key, "networkfilter", false);
            continue;
        }
        if p.operation == Operation::Merge {
            continue;
        }
        let has = filter_match_of(p).is_some();
        let applied = list_op(
            &mut fc.filters,
            p.operation,
            p.typed::<Filter>(),
            has,
            |f| network_filter_match(f, p),
            true,
        );
        status::record(&p.key, "networkfilter", applied);
    }
    let snapshot = fc.clone();
    for f in &mut fc.filters {
        for p in list {
            if !p.context_matches(ctx)
                || !listener_match(l, p)
                || !filter_chain_match(l, &snapshot, p)
                || !network_filter_match(f, p)
            {
                status::record(&p.key, "networkfilter", false);
                continue;
            }
            if p.operation != Operation::Merge {
                continue;
            }
            let Some(filter::ConfigType::TypedConfig(_)) = &f.config_type else {
                continue;
            };
            let Some(user) = p.typed::<Filter>() else {
                continue;
            };
            let dst = match &f.config_type {
                Some(filter::ConfigType::TypedConfig(a)) => Some(a.clone()),
                _ => None,
            };
            let src = match &user.config_type {
                Some(filter::ConfigType::TypedConfig(a)) => Some(a.clone()),
                _ => None,
            };
            if src.is_some() {
                status::record(&p.key, "networkfilter", true);
            }
            let merged = merge_typed_any(&dst, &src);
            if !user.name.is_empty() {
                f.name = user.name;
            }
            if let Some(m) = merged {
                f.config_type = Some(filter::ConfigType::TypedConfig(m));
            }
        }
        if f.name == HCM {
            patch_http_filters(patches, ctx, l, &snapshot, f);
        }
    }
}

/// Istio's `mergeTransportSocketListener`: whether the value's transport socket was
/// merged into the chain's socket of the same name.
fn merge_chain_socket(fc: &mut FilterChain, v: &FilterChain) -> bool {
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    let (Some(src), Some(dst)) = (&v.transport_socket, fc.transport_socket.as_mut()) else {
        return false;
    };
    if src.name != dst.name {
        return false;
    }
    if let (Some(ConfigType::TypedConfig(d)), Some(ConfigType::TypedConfig(s))) =
        (&dst.config_type, &src.config_type)
        && let Ok(m) = value::merge_any(d, s)
    {
        dst.config_type = Some(ConfigType::TypedConfig(m));
    }
    true
}

/// Patches one chain; `false` when a patch removes it.
fn patch_chain(
    patches: &ProxyPatches,
    ctx: PatchContext,
    l: &Listener,
    fc: &mut FilterChain,
) -> bool {
    for p in patches.of(ApplyTo::FilterChain) {
        if !p.context_matches(ctx) || !listener_match(l, p) || !filter_chain_match(l, fc, p) {
            status::record(&p.key, "filterchain", false);
            continue;
        }
        status::record(&p.key, "filterchain", true);
        match p.operation {
            Operation::Remove => return false,
            Operation::Merge => {
                let Some(v) = p.typed::<FilterChain>() else {
                    continue;
                };
                if !merge_chain_socket(fc, &v)
                    && let Some(src) = &p.value
                    && let Err(e) = value::merge_into(fc, src)
                {
                    status::reject(&p.key, "filterchain", &e);
                }
            }
            _ => {}
        }
    }
    patch_network_filters(patches, ctx, l, fc);
    true
}

/// Patches one listener; `None` when a patch removes it.
pub(crate) fn patch_listener(
    patches: &ProxyPatches,
    ctx: PatchContext,
    mut l: Listener,
) -> Option<Listener> {
    for p in patches.of(ApplyTo::Listener) {
        if !p.context_matches(ctx) || !listener_match(&l, p) {
            status::record(&p.key, "listener", false);
            continue;
        }
        status::record(&p.key, "listener", true);
        match p.operation {
            Operation::Remove => return None,
            Operation::Merge => {
                if let Some(src) = &p.value
                    && let Err(e) = value::merge_into(&mut l, src)
                {
                    status::reject(&p.key, "listener", &e);
                }
            }
            _ => {}
        }
    }
    patch_listener_filters(patches.of(ApplyTo::ListenerFilter), ctx, &mut l);
    let chains = std::mem::take(&mut l.filter_chains);
    let mut kept = Vec::with_capacity(chains.len());
    for mut fc in chains {
        if fc.filters.is_empty() {
            kept.push(fc);
            continue;
        }
        if patch_chain(patches, ctx, &l, &mut fc) {
            kept.push(fc);
        }
    }
    if let Some(mut fc) = l.default_filter_chain.take()
        && !fc.filters.is_empty()
    {
        l.default_filter_chain = patch_chain(patches, ctx, &l, &mut fc).then_some(fc);
    }
    for p in patches.of(ApplyTo::FilterChain) {
        if p.operation != Operation::Add {
            continue;
        }
        if !p.context_matches(ctx) || !listener_match(&l, p) {
            status::record(&p.key, "filterchain", false);
            continue;
        }
        status::record(&p.key, "filterchain", true);
        kept.extend(p.typed::<FilterChain>());
    }
    l.filter_chains = kept;
    Some(l)
}

/// One listener of `proxy` patched: `None` when a patch removed it; the same resource
/// when nothing changed it.
pub fn patch_one(patches: &ProxyPatches, r: &Resource, proxy: &Proxy) -> Option<Resource> {
    let Ok(l) = Listener::decode(r.body.value.as_ref()) else {
        return Some(r.clone());
    };
    let ctx = context(proxy, l.name == VIRTUAL_INBOUND);
    match patch_listener(patches, ctx, l.clone())? {
        p if p == l => Some(r.clone()),
        p => Some(EncodedResource::encode(
            TypeUrl::Listener,
            p.name.clone(),
            &p,
        )),
    }
}

/// The listeners the `ADD` patches of context `ctx` give (a whole list asked for),
/// as Istio's `ApplyListenerPatches` for one direction: a router's with `GATEWAY`, a
/// sidecar's once with `SIDECAR_OUTBOUND` (its outbound listeners) and once with
/// `SIDECAR_INBOUND` (its inbound ones). Names in `present` are not added again (an
/// `ANY` patch would otherwise add its listener once per direction, which Envoy
/// refuses as a duplicate name).
pub fn added(
    patches: &ProxyPatches,
    ctx: PatchContext,
    present: &mut std::collections::HashSet<String>,
) -> Vec<Resource> {
    let mut out = Vec::new();
    for p in patches.of(ApplyTo::Listener) {
        if p.operation != Operation::Add {
            continue;
        }
        if !p.context_matches(ctx) {
            status::record(&p.key, "listener", false);
            continue;
        }
        status::record(&p.key, "listener", true);
        if let Some(l) = p.typed::<Listener>()
            && present.insert(l.name.clone())
        {
            out.push(EncodedResource::encode(
                TypeUrl::Listener,
                l.name.clone(),
                &l,
            ));
        }
    }
    out
}

/// The contexts whose `ADD` patches add listeners to `proxy`'s list, in Istio's
/// order (outbound, then inbound, for sidecars).
pub fn add_contexts(proxy: &Proxy) -> &'static [PatchContext] {
    if proxy.is_router() {
        &[PatchContext::Gateway]
    } else {
        &[PatchContext::SidecarOutbound, PatchContext::SidecarInbound]
    }
}

/// Patches the listeners of `proxy`; the `ADD` patches of `add` contexts add
/// listeners (none: Istio's `skipAdds`).
pub fn apply(
    patches: &ProxyPatches,
    listeners: Vec<Resource>,
    proxy: &Proxy,
    add: &[PatchContext],
) -> Vec<Resource> {
    let mut out: Vec<Resource> = listeners
        .iter()
        .filter_map(|r| patch_one(patches, r, proxy))
        .collect();
    let mut present = out.iter().map(|r| r.name.to_string()).collect();
    for ctx in add {
        out.extend(added(patches, *ctx, &mut present));
    }
    out
}

//! `/debug/config_dump?proxyID=`: what one proxy was sent, as Envoy's admin
//! `ConfigDump` in proto3 JSON (the shape `curl envoy:15000/config_dump` prints, so
//! the same tools and habits work on both sides).
//!
//! Like istiod, the resources are regenerated rather than recorded: for each type the
//! connection watches, the generator the ADS stream uses runs over the current snapshot
//! with the connection's subscription. Generators are pure and their output is cached
//! per snapshot, so while the snapshot version equals the version last sent (the
//! `version_info` shown), these are the bytes the proxy got. A Delta connection shows
//! only the names it holds. A type that was never answered shows no resources.
//!
//! A connection watching the ambient types (a ztunnel) gets one more entry after
//! Envoy's: what it holds of `istio.workload.Address` and `istio.security.Authorization`
//! as a CSDS `ClientConfig` (`envoy.service.status.v3`), one `generic_xds_configs` item
//! per resource with its `type_url`, `name`, `version_info`, `last_updated`,
//! `client_status` and the resource as `xds_config` (proto3 JSON with its `"@type"`).
//! istiod's config dump has no ambient entry (a ztunnel's shows empty Envoy sections);
//! this is the shape istiod's CSDS uses for types that are not Envoy's.
//!
//! Rendering goes through descriptors compiled from envoy-types' `.proto` sources by
//! `build.rs`, so nested `Any`s (the connection manager in a filter chain, TLS
//! transport sockets, per-route filter configs) are expanded with their `"@type"`. An
//! `Any` of a type without a descriptor renders alone as `{"@type", "value": base64}`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use axum::http::StatusCode;
use envoy_types::pb::envoy::admin::v3::{
    ClientResourceStatus, ClustersConfigDump, EcdsConfigDump, EndpointsConfigDump,
    ListenersConfigDump, RoutesConfigDump, SecretsConfigDump, clusters_config_dump,
    ecds_config_dump, endpoints_config_dump, listeners_config_dump, routes_config_dump,
};
use envoy_types::pb::google::protobuf::{Any, Timestamp};
use prost::{Message, Name};
use prost_reflect::{
    DescriptorPool, DynamicMessage, MessageDescriptor, ReflectMessage, SerializeOptions,
};
use serde_json::{Value, json};

use super::AdminState;
use crate::ads::{ConnectionHandle, Connections, Flavour};
use crate::generate::{Scope, Subscription, generate};
use crate::xds::TypeUrl;

/// The encoded `FileDescriptorSet` from `build.rs`; empty when the build found no
/// envoy `.proto` sources.
static DESCRIPTORS: &[u8] = crate::xds::ENVOY_DESCRIPTORS;

/// The stand-in for an `Any` without a descriptor (declared in `build.rs`).
const OPAQUE_ANY: &str = "meshfed.admin.v1.OpaqueAny";
const OPAQUE_ANY_URL: &str = "type.googleapis.com/meshfed.admin.v1.OpaqueAny";

/// How deep `Any`s may nest before the rest is shown opaque (guards the stack against
/// hostile or corrupt bytes; real configs nest two or three deep).
const MAX_ANY_DEPTH: usize = 32;

/// Dump order, as Envoy's admin prints them.
const DUMP_ORDER: [TypeUrl; 4] = [
    TypeUrl::Cluster,
    TypeUrl::Listener,
    TypeUrl::Route,
    TypeUrl::Endpoint,
];

/// The ambient types, dumped after Envoy's in one `ClientConfig` entry.
const AMBIENT_TYPES: [TypeUrl; 2] = [TypeUrl::Address, TypeUrl::Authorization];

/// The `"@type"` of the ambient entry.
const CLIENT_CONFIG_URL: &str = "type.googleapis.com/envoy.service.status.v3.ClientConfig";

type Answer = Result<Value, (StatusCode, String)>;

/// The `/debug/config_dump` handler. `proxyID` names a connection id, a proxy id
/// (`pod.namespace`) or a full node id; several connections of one proxy resolve to
/// the newest. `types=cds,lds,...` limits the dump.
pub(super) fn config_dump(state: &AdminState, query: &BTreeMap<String, String>) -> Answer {
    // Without descriptors nothing can be rendered, whatever was asked.
    let renderer =
        Renderer::shared().map_err(|m| error(StatusCode::SERVICE_UNAVAILABLE, m, None))?;
    let Some(id) = query.get("proxyID").filter(|id| !id.is_empty()) else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "missing ?proxyID=<proxy id, node id or connection id> (see /debug/syncz)",
            None,
        ));
    };
    let types = match query.get("types") {
        Some(list) => parse_types(list).map_err(|m| error(StatusCode::BAD_REQUEST, &m, None))?,
        None => DUMP_ORDER.into_iter().chain(AMBIENT_TYPES).collect(),
    };
    let Some(connection) = find_connection(&state.connections, id) else {
        return Err(error(
            StatusCode::NOT_FOUND,
            &format!("no connected proxy with id {id:?} (see /debug/syncz)"),
            Some(id),
        ));
    };
    let dumps = type_dumps(state, &connection, &types);
    render_config_dump(renderer, &dumps)
        .map_err(|m| error(StatusCode::INTERNAL_SERVER_ERROR, &m, Some(id)))
}

/// What one connection was sent of each of `types`, regenerated from the current
/// snapshot: the one builder behind `/debug/config_dump`, the `istio.io/debug/config_dump`
/// xDS type and CSDS.
pub fn type_dumps(
    state: &AdminState,
    connection: &ConnectionHandle,
    types: &[TypeUrl],
) -> Vec<TypeDump> {
    let snapshot = state.pipeline.snapshot().load_full();
    types
        .iter()
        .map(|&type_url| {
            let sent = SentState::of(connection, type_url);
            let mut resources: Vec<(String, Any)> = match &sent {
                Some(sent) if sent.version.is_some() => {
                    let subscription = Subscription {
                        wildcard: sent.wildcard,
                        names: &sent.names,
                        interned: None,
                    };
                    generate(
                        type_url,
                        &snapshot,
                        &connection.proxy,
                        subscription,
                        Scope::All,
                        &state.generator,
                    )
                    .into_iter()
                    .filter(|r| match &sent.held {
                        Some(held) => held.contains(&*r.name),
                        None => true,
                    })
                    .filter_map(|r| {
                        let any = Any::decode(r.body.encode_to_vec().as_slice()).ok()?;
                        Some((r.name.to_string(), any))
                    })
                    .collect()
                }
                _ => Vec::new(),
            };
            resources.sort_by(|a, b| a.0.cmp(&b.0));
            TypeDump {
                type_url,
                watched: sent.is_some(),
                sent: sent.unwrap_or_default(),
                resources,
            }
        })
        .collect()
}

/// A JSON error body (the dispatcher sends it as the response text).
fn error(status: StatusCode, message: &str, proxy_id: Option<&str>) -> (StatusCode, String) {
    let mut body = json!({ "error": message });
    if let Some(id) = proxy_id {
        body["proxyID"] = json!(id);
    }
    (status, format!("{body}\n"))
}

fn parse_types(list: &str) -> Result<Vec<TypeUrl>, String> {
    let wanted: BTreeSet<TypeUrl> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            // Secrets are never dumped (private keys): `sds` is not a dump type.
            DUMP_ORDER
                .into_iter()
                .chain(AMBIENT_TYPES)
                .find(|t| t.short() == s)
                .ok_or_else(|| {
                    format!(
                        "unknown type {s:?} in ?types= (use cds, eds, lds, rds, wds, authorization; NDS: /debug/ndsz)"
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    Ok(DUMP_ORDER
        .into_iter()
        .chain(AMBIENT_TYPES)
        .filter(|t| wanted.contains(t))
        .collect())
}

/// The connection `id` names: its connection id exactly, else the newest connection of
/// the proxy with that proxy id or node id.
pub fn find_connection(connections: &Connections, id: &str) -> Option<Arc<ConnectionHandle>> {
    let all = connections.all();
    if let Some(exact) = all.iter().find(|c| c.id == id) {
        return Some(exact.clone());
    }
    all.into_iter()
        .filter(|c| c.proxy.id == id || c.proxy.node_id == id)
        .max_by_key(|c| (c.connected_at, connection_counter(&c.id)))
}

/// The counter suffix of a connection id (`<proxy id>-<n>`).
fn connection_counter(connection_id: &str) -> u64 {
    connection_id
        .rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

// === the conversation state of one type ===

/// What a connection was sent for one type, copied out of its state so the lock is
/// not held while generating.
#[derive(Clone, Debug, Default)]
struct SentState {
    wildcard: bool,
    names: BTreeSet<String>,
    /// Version of the last response sent; `None` when the type was never answered.
    version: Option<String>,
    last_sent: Option<SystemTime>,
    status: ClientResourceStatus,
    /// Delta: the names the proxy holds (the server removed the others).
    held: Option<BTreeSet<String>>,
}

impl SentState {
    fn of(connection: &ConnectionHandle, type_url: TypeUrl) -> Option<SentState> {
        let state = connection.state.lock().expect("state poisoned");
        let watch = state.watch(type_url)?;
        let status = if watch.acked() {
            ClientResourceStatus::Acked
        } else if watch.nacked() {
            ClientResourceStatus::Nacked
        } else {
            ClientResourceStatus::Unknown
        };
        Some(SentState {
            wildcard: watch.wildcard,
            names: (*watch.names).clone(),
            version: watch.version_sent.as_deref().map(str::to_string),
            last_sent: watch.last_sent,
            status,
            held: (connection.flavour == Flavour::Delta)
                .then(|| watch.held.keys().cloned().collect()),
        })
    }
}

/// One type's part of the dump.
#[derive(Debug)]
pub struct TypeDump {
    /// The type.
    pub type_url: TypeUrl,
    watched: bool,
    sent: SentState,
    /// The resources, name and `Any`, sorted by name.
    pub resources: Vec<(String, Any)>,
}

impl TypeDump {
    /// Version of the last response sent; `None` when the type was never answered.
    pub fn version(&self) -> Option<&str> {
        self.sent.version.as_deref()
    }

    /// When the last response was sent.
    pub fn last_sent(&self) -> Option<Timestamp> {
        self.sent.last_sent.map(timestamp)
    }

    /// The proxy's answer to the last response (ACKed, NACKed, or unknown yet).
    pub fn status(&self) -> ClientResourceStatus {
        self.sent.status
    }

    /// Whether the type is watched at all.
    pub fn watched(&self) -> bool {
        self.watched
    }

    /// The admin `*ConfigDump` message of this type, packed in an `Any`.
    pub fn to_any(&self) -> Option<Any> {
        let version = self.sent.version.clone().unwrap_or_default();
        let last_updated = self.sent.last_sent.map(timestamp);
        let status = self.sent.status as i32;
        let resources = self.resources.iter().cloned();
        Some(match self.type_url {
            TypeUrl::Cluster => pack(&ClustersConfigDump {
                version_info: version.clone(),
                dynamic_active_clusters: resources
                    .map(|(_, cluster)| clusters_config_dump::DynamicCluster {
                        version_info: version.clone(),
                        cluster: Some(cluster),
                        last_updated,
                        client_status: status,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            TypeUrl::Listener => pack(&ListenersConfigDump {
                version_info: version.clone(),
                dynamic_listeners: resources
                    .map(|(name, listener)| listeners_config_dump::DynamicListener {
                        name,
                        active_state: Some(listeners_config_dump::DynamicListenerState {
                            version_info: version.clone(),
                            listener: Some(listener),
                            last_updated,
                        }),
                        client_status: status,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            TypeUrl::Route => pack(&RoutesConfigDump {
                dynamic_route_configs: resources
                    .map(|(_, route_config)| routes_config_dump::DynamicRouteConfig {
                        version_info: version.clone(),
                        route_config: Some(route_config),
                        last_updated,
                        client_status: status,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            TypeUrl::Endpoint => pack(&EndpointsConfigDump {
                dynamic_endpoint_configs: resources
                    .map(
                        |(_, endpoint_config)| endpoints_config_dump::DynamicEndpointConfig {
                            version_info: version.clone(),
                            endpoint_config: Some(endpoint_config),
                            last_updated,
                            client_status: status,
                            ..Default::default()
                        },
                    )
                    .collect(),
                ..Default::default()
            }),
            // Never dumped (private keys); `/debug/sdsz` lists names and errors.
            TypeUrl::Secret => pack(&SecretsConfigDump::default()),
            TypeUrl::ExtensionConfig => pack(&EcdsConfigDump {
                ecds_filters: resources
                    .map(|(_, ecds_filter)| ecds_config_dump::EcdsFilterConfig {
                        version_info: version.clone(),
                        ecds_filter: Some(ecds_filter),
                        last_updated,
                        client_status: status,
                        ..Default::default()
                    })
                    .collect(),
            }),
            // Not Envoy types: `/debug/ndsz` and `/debug/ambientz` show them.
            TypeUrl::NameTable | TypeUrl::Address | TypeUrl::Authorization | TypeUrl::Mcp(_) => {
                return None;
            }
        })
    }
}

fn pack<M: Message + Name>(message: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: message.encode_to_vec(),
    }
}

fn timestamp(t: SystemTime) -> Timestamp {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    Timestamp {
        seconds: since.as_secs() as i64,
        nanos: since.subsec_nanos() as i32,
    }
}

/// `{"configs": [...]}` for the given type dumps, in their order.
fn render_config_dump(renderer: &Renderer, dumps: &[TypeDump]) -> Result<Value, String> {
    let configs = dumps
        .iter()
        .filter_map(|dump| Some((dump, dump.to_any()?)))
        .map(|(dump, any)| {
            renderer
                .render_any(&any.type_url, &any.value)
                .map_err(|e| format!("rendering the {} dump: {e}", dump.type_url.short()))
        })
        .collect::<Result<Vec<Value>, String>>()?;
    let mut configs = configs;
    configs.extend(ambient_entry(renderer, dumps)?);
    Ok(json!({ "configs": configs }))
}

/// The ambient types the connection watches, as one CSDS `ClientConfig` (see the
/// module docs); `None` when it watches neither.
fn ambient_entry(renderer: &Renderer, dumps: &[TypeDump]) -> Result<Option<Value>, String> {
    let mut items = Vec::new();
    let mut watched = false;
    for dump in dumps
        .iter()
        .filter(|d| AMBIENT_TYPES.contains(&d.type_url) && d.watched())
    {
        watched = true;
        let mut base = serde_json::Map::new();
        base.insert("type_url".into(), json!(dump.type_url.as_str()));
        if let Some(version) = dump.version() {
            base.insert("version_info".into(), json!(version));
        }
        if let Some(t) = dump.last_sent() {
            let t = renderer.render_any(
                "type.googleapis.com/google.protobuf.Timestamp",
                &t.encode_to_vec(),
            )?;
            base.insert("last_updated".into(), t);
        }
        base.insert("client_status".into(), json!(dump.status().as_str_name()));
        if dump.resources.is_empty() {
            items.push(Value::Object(base));
            continue;
        }
        for (name, any) in &dump.resources {
            let mut item = base.clone();
            item.insert("name".into(), json!(name));
            item.insert("xds_config".into(), ambient_resource_json(any)?);
            items.push(Value::Object(item));
        }
    }
    Ok(watched.then(|| json!({ "@type": CLIENT_CONFIG_URL, "generic_xds_configs": items })))
}

/// An `Address` or `Authorization` resource as proto3 JSON with its `"@type"`.
fn ambient_resource_json(any: &Any) -> Result<Value, String> {
    let decoded = if any.type_url == TypeUrl::Address.as_str() {
        meshfed_api::workload::Address::decode(any.value.as_slice())
            .map_err(|e| e.to_string())
            .and_then(|m| serde_json::to_value(m).map_err(|e| e.to_string()))
    } else {
        meshfed_api::security::Authorization::decode(any.value.as_slice())
            .map_err(|e| e.to_string())
            .and_then(|m| serde_json::to_value(m).map_err(|e| e.to_string()))
    }
    .map_err(|e| format!("decoding {}: {e}", any.type_url))?;
    let mut out = serde_json::Map::new();
    out.insert("@type".into(), json!(any.type_url));
    if let Value::Object(fields) = decoded {
        out.extend(fields);
    }
    Ok(Value::Object(out))
}

// === proto3 JSON rendering ===

/// Renders encoded messages as proto3 JSON the way Envoy's admin prints them: proto
/// field names, 64-bit integers as strings, defaults left out, every `Any` expanded
/// with its `"@type"`.
#[derive(Debug)]
struct Renderer {
    any: MessageDescriptor,
    opaque: MessageDescriptor,
}

impl Renderer {
    /// The renderer over the compiled-in descriptors, built once; the error says why
    /// this build cannot render.
    fn shared() -> Result<&'static Renderer, &'static str> {
        static SHARED: OnceLock<Result<Renderer, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| Renderer::from_descriptor_set(DESCRIPTORS))
            .as_ref()
            .map_err(String::as_str)
    }

    fn from_descriptor_set(bytes: &[u8]) -> Result<Renderer, String> {
        if bytes.is_empty() {
            return Err(format!(
                "config_dump is unavailable in this build: {}",
                option_env!("MESHFED_CONFIG_DUMP_UNAVAILABLE")
                    .unwrap_or("no envoy descriptors were compiled in")
            ));
        }
        let pool = DescriptorPool::decode(bytes)
            .map_err(|e| format!("decoding the compiled-in envoy descriptors: {e}"))?;
        let message = |name: &str| {
            pool.get_message_by_name(name)
                .ok_or_else(|| format!("the compiled-in descriptors lack {name}"))
        };
        Ok(Renderer {
            any: message("google.protobuf.Any")?,
            opaque: message(OPAQUE_ANY)?,
        })
    }

    fn pool(&self) -> &DescriptorPool {
        self.any.parent_pool()
    }

    /// Renders one `Any` (type URL and encoded value) as `{"@type": ..., fields}`.
    fn render_any(&self, type_url: &str, value: &[u8]) -> Result<Value, String> {
        let mut any = DynamicMessage::new(self.any.clone());
        any.set_field_by_number(1, prost_reflect::Value::String(type_url.to_string()));
        any.set_field_by_number(2, prost_reflect::Value::Bytes(value.to_vec().into()));
        self.resolve_any(&mut any, 0);
        let options = SerializeOptions::new().use_proto_field_name(true);
        let mut json = any
            .serialize_with_options(serde_json::value::Serializer, &options)
            .map_err(|e| e.to_string())?;
        unwrap_opaque(&mut json);
        Ok(json)
    }

    /// Makes every `Any` under `message` renderable: known payloads are resolved
    /// recursively, unknown or undecodable ones become an opaque stand-in.
    fn resolve_message(&self, message: &mut DynamicMessage, depth: usize) {
        if message.descriptor() == self.any {
            self.resolve_any(message, depth);
            return;
        }
        for (_, value) in message.fields_mut() {
            self.resolve_value(value, depth);
        }
    }

    fn resolve_value(&self, value: &mut prost_reflect::Value, depth: usize) {
        use prost_reflect::Value as V;
        match value {
            V::Message(message) => self.resolve_message(message, depth),
            V::List(items) => items.iter_mut().for_each(|v| self.resolve_value(v, depth)),
            V::Map(entries) => entries
                .values_mut()
                .for_each(|v| self.resolve_value(v, depth)),
            _ => {}
        }
    }

    fn resolve_any(&self, any: &mut DynamicMessage, depth: usize) {
        let type_url = any
            .get_field_by_number(1)
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let value = any
            .get_field_by_number(2)
            .and_then(|v| v.as_bytes().cloned())
            .unwrap_or_default();
        let payload = type_url
            .rsplit_once('/')
            .filter(|_| depth < MAX_ANY_DEPTH)
            .and_then(|(_, name)| self.pool().get_message_by_name(name))
            .and_then(|descriptor| DynamicMessage::decode(descriptor, value.as_ref()).ok());
        match payload {
            Some(mut payload) => {
                self.resolve_message(&mut payload, depth + 1);
                any.set_field_by_number(
                    2,
                    prost_reflect::Value::Bytes(payload.encode_to_vec().into()),
                );
            }
            None => {
                let mut opaque = DynamicMessage::new(self.opaque.clone());
                opaque.set_field_by_number(1, prost_reflect::Value::String(type_url));
                opaque.set_field_by_number(2, prost_reflect::Value::Bytes(value));
                any.set_field_by_number(1, prost_reflect::Value::String(OPAQUE_ANY_URL.into()));
                any.set_field_by_number(
                    2,
                    prost_reflect::Value::Bytes(opaque.encode_to_vec().into()),
                );
            }
        }
    }
}

/// Rewrites each rendered opaque stand-in to `{"@type": <original>, "value": base64}`.
fn unwrap_opaque(json: &mut Value) {
    match json {
        Value::Object(map) => {
            if map.get("@type").and_then(Value::as_str) == Some(OPAQUE_ANY_URL) {
                let type_url = map.remove("type_url").unwrap_or_else(|| json!(""));
                let value = map.remove("value").unwrap_or_else(|| json!(""));
                map.clear();
                map.insert("@type".into(), type_url);
                map.insert("value".into(), value);
            } else {
                map.values_mut().for_each(unwrap_opaque);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(unwrap_opaque),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
    use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
    use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, HttpFilter, Rds, http_connection_manager, http_filter,
    };
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    use envoy_types::pb::google::protobuf::{Duration, UInt32Value};

    use super::*;

    fn renderer() -> &'static Renderer {
        Renderer::shared().expect("this build compiled the envoy descriptors")
    }

    fn listener_with_hcm(unknown_filter: bool) -> Listener {
        let mut http_filters = vec![HttpFilter {
            name: "envoy.filters.http.router".into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(pack(
                &Router::default(),
            ))),
            ..Default::default()
        }];
        if unknown_filter {
            http_filters.insert(
                0,
                HttpFilter {
                    name: "acme.magic".into(),
                    config_type: Some(http_filter::ConfigType::TypedConfig(Any {
                        type_url: "type.googleapis.com/acme.Magic".into(),
                        value: vec![1, 2, 3],
                    })),
                    ..Default::default()
                },
            );
        }
        let hcm = HttpConnectionManager {
            stat_prefix: "outbound_0.0.0.0_80".into(),
            route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
                route_config_name: "80".into(),
                ..Default::default()
            })),
            http_filters,
            ..Default::default()
        };
        Listener {
            name: "0.0.0.0_80".into(),
            filter_chains: vec![FilterChain {
                filters: vec![Filter {
                    name: "envoy.filters.network.http_connection_manager".into(),
                    config_type: Some(filter::ConfigType::TypedConfig(pack(&hcm))),
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn nested_anys_render_with_their_type_and_proto_field_names() {
        let json = renderer()
            .render_any(
                "type.googleapis.com/envoy.config.listener.v3.Listener",
                &listener_with_hcm(false).encode_to_vec(),
            )
            .unwrap();
        assert_eq!(
            json["@type"],
            "type.googleapis.com/envoy.config.listener.v3.Listener"
        );
        let hcm = &json["filter_chains"][0]["filters"][0]["typed_config"];
        assert_eq!(
            hcm["@type"],
            "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
        );
        assert_eq!(hcm["stat_prefix"], "outbound_0.0.0.0_80");
        assert_eq!(hcm["rds"]["route_config_name"], "80");
        assert_eq!(
            hcm["http_filters"][0]["typed_config"]["@type"],
            "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
        );
    }

    #[test]
    fn an_unknown_any_renders_opaque_and_the_rest_still_expands() {
        let json = renderer()
            .render_any(
                "type.googleapis.com/envoy.config.listener.v3.Listener",
                &listener_with_hcm(true).encode_to_vec(),
            )
            .unwrap();
        let filters = &json["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"];
        assert_eq!(
            filters[0]["typed_config"],
            json!({"@type": "type.googleapis.com/acme.Magic", "value": "AQID"})
        );
        assert_eq!(
            filters[1]["typed_config"]["@type"],
            "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
        );
        // The outermost Any may be unknown too, and undecodable bytes do not fail it.
        assert_eq!(
            renderer()
                .render_any(
                    "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                    &[0xff]
                )
                .unwrap(),
            json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "value": "/w=="})
        );
        assert_eq!(
            renderer().render_any("no-slash", &[]).unwrap(),
            json!({"@type": "no-slash", "value": ""})
        );
    }

    #[test]
    fn well_known_types_render_in_their_json_forms() {
        let cluster = Cluster {
            name: "outbound|80||a.default.svc.cluster.local".into(),
            connect_timeout: Some(Duration {
                seconds: 10,
                nanos: 0,
            }),
            per_connection_buffer_limit_bytes: Some(UInt32Value { value: 32768 }),
            transport_socket: Some(TransportSocket {
                name: "envoy.transport_sockets.tls".into(),
                config_type: Some(transport_socket::ConfigType::TypedConfig(pack(
                    &UpstreamTlsContext {
                        sni: "a.default.svc.cluster.local".into(),
                        ..Default::default()
                    },
                ))),
            }),
            ..Default::default()
        };
        let json = renderer()
            .render_any(&Cluster::type_url(), &cluster.encode_to_vec())
            .unwrap();
        assert_eq!(json["connect_timeout"], "10s");
        assert_eq!(json["per_connection_buffer_limit_bytes"], 32768);
        assert_eq!(
            json["transport_socket"]["typed_config"]["@type"],
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
        );
        assert_eq!(
            json["transport_socket"]["typed_config"]["sni"],
            "a.default.svc.cluster.local"
        );
    }

    #[test]
    fn dumps_use_envoys_admin_field_names_in_envoys_order() {
        let cluster = Cluster {
            name: "BlackHoleCluster".into(),
            ..Default::default()
        };
        let sent = SentState {
            version: Some("2024-01-01T00:00:00Z/7".into()),
            last_sent: Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1500)),
            status: ClientResourceStatus::Acked,
            ..Default::default()
        };
        let dumps: Vec<TypeDump> = DUMP_ORDER
            .into_iter()
            .map(|type_url| TypeDump {
                type_url,
                watched: true,
                sent: sent.clone(),
                resources: match type_url {
                    TypeUrl::Cluster => vec![(cluster.name.clone(), pack(&cluster))],
                    TypeUrl::Listener => {
                        vec![("0.0.0.0_80".to_string(), pack(&listener_with_hcm(false)))]
                    }
                    _ => Vec::new(),
                },
            })
            .collect();
        let json = render_config_dump(renderer(), &dumps).unwrap();
        let types: Vec<&str> = json["configs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["@type"].as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            [
                "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
                "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
                "type.googleapis.com/envoy.admin.v3.RoutesConfigDump",
                "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump",
            ]
        );
        let clusters = &json["configs"][0];
        assert_eq!(clusters["version_info"], "2024-01-01T00:00:00Z/7");
        let active = &clusters["dynamic_active_clusters"][0];
        assert_eq!(active["version_info"], "2024-01-01T00:00:00Z/7");
        assert_eq!(active["cluster"]["name"], "BlackHoleCluster");
        assert_eq!(
            active["cluster"]["@type"],
            "type.googleapis.com/envoy.config.cluster.v3.Cluster"
        );
        assert_eq!(active["last_updated"], "1970-01-01T00:00:01.500Z");
        assert_eq!(active["client_status"], "ACKED");
        let listener = &json["configs"][1]["dynamic_listeners"][0];
        assert_eq!(listener["name"], "0.0.0.0_80");
        assert_eq!(
            listener["active_state"]["listener"]["filter_chains"][0]["filters"][0]["typed_config"]
                ["@type"],
            "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
        );
        // Empty types still appear, as Envoy prints them.
        assert_eq!(
            json["configs"][3],
            json!({"@type": "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump"})
        );
    }

    #[test]
    fn types_parse_in_dump_order_and_unknown_ones_are_refused() {
        assert_eq!(
            parse_types("rds, cds").unwrap(),
            [TypeUrl::Cluster, TypeUrl::Route]
        );
        assert!(parse_types("cds,sds").unwrap_err().contains("\"sds\""));
    }

    #[test]
    fn ambient_types_dump_after_envoys_as_one_client_config() {
        assert_eq!(
            parse_types("authorization,wds,cds").unwrap(),
            [TypeUrl::Cluster, TypeUrl::Address, TypeUrl::Authorization]
        );
        let workload = meshfed_api::workload::Address {
            r#type: Some(meshfed_api::workload::address::Type::Workload(
                meshfed_api::workload::Workload {
                    uid: "c//Pod/ns/p".into(),
                    name: "p".into(),
                    ..Default::default()
                },
            )),
        };
        let dump = |type_url, watched, resources: Vec<(String, Any)>| TypeDump {
            type_url,
            watched,
            sent: SentState {
                version: watched.then(|| "v7".to_string()),
                status: ClientResourceStatus::Acked,
                ..Default::default()
            },
            resources,
        };
        let dumps = [
            dump(TypeUrl::Cluster, false, Vec::new()),
            dump(
                TypeUrl::Address,
                true,
                vec![(
                    "c//Pod/ns/p".into(),
                    Any {
                        type_url: TypeUrl::Address.as_str().into(),
                        value: workload.encode_to_vec(),
                    },
                )],
            ),
            dump(TypeUrl::Authorization, true, Vec::new()),
        ];
        let out = render_config_dump(renderer(), &dumps).unwrap();
        let configs = out["configs"].as_array().unwrap();
        assert_eq!(configs.len(), 2, "{out}");
        assert_eq!(configs[1]["@type"], CLIENT_CONFIG_URL);
        let items = configs[1]["generic_xds_configs"].as_array().unwrap();
        assert_eq!(items.len(), 2, "{out}");
        assert_eq!(items[0]["name"], "c//Pod/ns/p");
        assert_eq!(items[0]["version_info"], "v7");
        assert_eq!(items[0]["client_status"], "ACKED");
        assert_eq!(items[0]["xds_config"]["@type"], TypeUrl::Address.as_str());
        assert_eq!(items[0]["xds_config"]["workload"]["uid"], "c//Pod/ns/p");
        // A type without resources: its status only.
        assert_eq!(items[1]["type_url"], TypeUrl::Authorization.as_str());
        assert!(items[1].get("name").is_none() && items[1].get("xds_config").is_none());
        // A sidecar (neither type watched) gets no ambient entry.
        let sidecar = [
            dump(TypeUrl::Cluster, true, Vec::new()),
            dump(TypeUrl::Address, false, Vec::new()),
        ];
        let out = render_config_dump(renderer(), &sidecar).unwrap();
        assert_eq!(out["configs"].as_array().unwrap().len(), 1, "{out}");
    }

    #[test]
    fn a_missing_descriptor_set_explains_itself() {
        let err = Renderer::from_descriptor_set(&[]).unwrap_err();
        assert!(err.contains("unavailable"), "{err}");
    }
}

//! Debug over xDS, as istiod serves it to istioctl (`pilot/pkg/xds/statusgen.go`,
//! `debuggen.go`): `istio.io/debug/syncz` (a `ClientConfig` per connected proxy with
//! each type's sync status), `istio.io/debug/config_dump` (one proxy's dump, from the
//! builder behind `/debug/config_dump`), `istio.io/debug` (a debug page by path,
//! served by the admin debug table) and `istio.io/connections` (one `Node` per
//! proxy, for `istioctl x version`); and CSDS ([`csds`]).
//!
//! Who may ask: on the plaintext port anyone (istiod's 15010), except
//! `istio.io/debug`, which needs an identity as in istiod. On the secure port the
//! caller's verified identity must be in the system namespace; a workload elsewhere
//! gets only what istiod's `activeNamespaceDebuggers` give it (`istio.io/debug` with
//! `config_dump`, `ndsz`, `edsz`). A refusal ends the stream with istiod's message.

pub mod csds;

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::status::v3::{
    ClientConfig, ClientStatusRequest, ClientStatusResponse, ConfigStatus,
    client_config::GenericXdsConfig,
};
use prost::Message;
use tracing::{info, warn};

use crate::admin::AdminState;
use crate::admin::config_dump::{find_connection, type_dumps};
use crate::ads::ConnectionHandle;
use crate::ads::debug::{
    CONFIG_DUMP_TYPE, CONNECT_TYPE, CONNECTIONS_TYPE, DEBUG_TYPE, DebugCaller, DebugResource,
    DebugSource, SYNCZ_TYPE,
};
use crate::xds::TypeUrl;

/// `type.googleapis.com/envoy.service.status.v3.ClientConfig`.
pub const CLIENT_CONFIG_URL: &str = "type.googleapis.com/envoy.service.status.v3.ClientConfig";
const NODE_URL: &str = "type.googleapis.com/envoy.config.core.v3.Node";
/// The types syncz reports, in istiod's order.
const SYNCZ_TYPES: [TypeUrl; 5] = [
    TypeUrl::Listener,
    TypeUrl::Route,
    TypeUrl::Endpoint,
    TypeUrl::Cluster,
    TypeUrl::ExtensionConfig,
];

/// The types of an xDS config dump (istiod's connection dump without endpoints).
const DUMP_TYPES: [TypeUrl; 3] = [TypeUrl::Cluster, TypeUrl::Listener, TypeUrl::Route];

/// The debug pages a workload outside the system namespace may read over
/// `istio.io/debug` (istiod's `activeNamespaceDebuggers`).
const NAMESPACE_DEBUGGERS: [&str; 3] = ["config_dump", "ndsz", "edsz"];

/// Answers Istio's debug types from the admin state.
#[derive(Debug)]
pub struct XdsDebug {
    state: AdminState,
    system_namespace: String,
}

impl XdsDebug {
    /// Answers from `state`; identities in `system_namespace` may read everything.
    pub fn new(state: AdminState, system_namespace: &str) -> Self {
        XdsDebug {
            state,
            system_namespace: system_namespace.to_string(),
        }
    }

    /// Whether a verified identity is in the system namespace.
    fn in_system_namespace(&self, identity: &str) -> bool {
        crate::authn::parse_spiffe(identity).is_some_and(|id| id.namespace == self.system_namespace)
    }

    /// The secure port's rule for everything but `istio.io/debug`: an identity in
    /// the system namespace.
    pub fn authorize(&self, caller: DebugCaller<'_>) -> Result<(), String> {
        if !caller.secure {
            return Ok(());
        }
        match caller.identity {
            Some(identity) if self.in_system_namespace(identity) => Ok(()),
            Some(identity) => Err(denied(identity)),
            None => Err("authentication required".into()),
        }
    }

    /// istiod's `DebugGen`: one debug page by path, identity required.
    fn debug_page(
        &self,
        caller: DebugCaller<'_>,
        names: &[String],
    ) -> Result<Vec<DebugResource>, String> {
        let Some(identity) = caller.identity else {
            warn!(
                "refusing istio.io/debug without an identity: connect over the secure port, authenticated"
            );
            return Err("authentication required".into());
        };
        let resource = match names {
            [] => return Err("debug type is required".into()),
            [one] => one,
            _ => return Err("only one debug request is allowed".into()),
        };
        let (path, query) = resource.split_once('?').unwrap_or((resource, ""));
        if !self.in_system_namespace(identity) && !NAMESPACE_DEBUGGERS.contains(&path) {
            return Err(denied(identity));
        }
        let query: BTreeMap<String, String> = query
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (k.to_string(), v.to_string())
            })
            .collect();
        let body = if path == "list" {
            crate::admin::debug::list().to_string()
        } else {
            crate::admin::debug::answer(&self.state, path, &query).2
        };
        Ok(vec![DebugResource::new(
            resource.clone(),
            DEBUG_TYPE,
            body.into_bytes(),
        )])
    }

    /// One `ClientConfig` per connected proxy (istiod's `debugSyncz`).
    pub fn syncz(&self) -> Vec<DebugResource> {
        self.state
            .connections
            .all()
            .iter()
            .map(|c| {
                let config = sync_status(c);
                let name = c.proxy.id.clone();
                DebugResource::new(name, CLIENT_CONFIG_URL, config.encode_to_vec())
            })
            .collect()
    }

    /// One proxy's config dump, one resource per dump type (istiod's
    /// `debugConfigDump`): nothing when the proxy is not connected here.
    fn config_dump(&self, names: &[String]) -> Vec<DebugResource> {
        let [id] = names else {
            info!(
                names = names.len(),
                "istio.io/debug/config_dump needs exactly one resource name (the proxy id)"
            );
            return Vec::new();
        };
        let Some(connection) = find_connection(&self.state.connections, id) else {
            info!(proxy = %crate::logging::clip(id, crate::logging::NODE_ID_LOG_MAX), "istio.io/debug/config_dump: no such proxy connected here");
            return Vec::new();
        };
        type_dumps(&self.state, &connection, &DUMP_TYPES)
            .iter()
            .filter_map(|dump| {
                let any = dump.to_any()?;
                Some(DebugResource::new(
                    String::new(),
                    dump_type_url(dump.type_url)?,
                    any.value,
                ))
            })
            .collect()
    }

    /// One `Node` per connected proxy (`istio.io/connections`).
    fn connections(&self) -> Vec<DebugResource> {
        self.state
            .connections
            .all()
            .iter()
            .map(|c| {
                let node = Node {
                    id: c.proxy.node_id.clone(),
                    metadata: Some(node_metadata(c)),
                    user_agent_name: c.proxy.user_agent.clone(),
                    ..Default::default()
                };
                DebugResource::new(c.proxy.id.clone(), NODE_URL, node.encode_to_vec())
            })
            .collect()
    }
}

impl DebugSource for XdsDebug {
    fn answer(
        &self,
        caller: DebugCaller<'_>,
        type_url: &str,
        names: &[String],
    ) -> Result<Vec<DebugResource>, String> {
        if type_url == DEBUG_TYPE {
            return self.debug_page(caller, names);
        }
        self.authorize(caller)?;
        Ok(match type_url {
            SYNCZ_TYPE => self.syncz(),
            CONFIG_DUMP_TYPE => self.config_dump(names),
            CONNECTIONS_TYPE | CONNECT_TYPE => self.connections(),
            // Other istio.io/debug/* types: nothing, as istiod's status generator.
            _ => Vec::new(),
        })
    }

    fn client_status(
        &self,
        caller: DebugCaller<'_>,
        request: &ClientStatusRequest,
    ) -> Result<ClientStatusResponse, tonic::Status> {
        self.authorize(caller)
            .map_err(tonic::Status::permission_denied)?;
        csds::client_status(&self.state, request)
    }
}

/// istiod's refusal of debug data to an identity outside the system namespace.
fn denied(identity: &str) -> String {
    format!("the debug info is not available for current identity: {identity:?}")
}

/// The admin dump type URL of a resource type.
fn dump_type_url(type_url: TypeUrl) -> Option<&'static str> {
    Some(match type_url {
        TypeUrl::Cluster => "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
        TypeUrl::Listener => "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
        TypeUrl::Route => "type.googleapis.com/envoy.admin.v3.RoutesConfigDump",
        TypeUrl::Endpoint => "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump",
        TypeUrl::Secret => "type.googleapis.com/envoy.admin.v3.SecretsConfigDump",
        TypeUrl::ExtensionConfig => "type.googleapis.com/envoy.admin.v3.EcdsConfigDump",
        TypeUrl::NameTable | TypeUrl::Address | TypeUrl::Authorization | TypeUrl::Mcp(_) => {
            return None;
        }
    })
}

/// The node metadata istiod's syncz carries: `CLUSTER_ID`, `NAMESPACE` and
/// `ISTIO_VERSION` as the proxy sent them, each only when set.
pub(crate) fn node_metadata(c: &ConnectionHandle) -> envoy_types::pb::google::protobuf::Struct {
    let get = |key: &str| {
        c.proxy
            .metadata
            .get(key)
            .and_then(|v| v.as_str())
            .unwrap_or("")
    };
    let fields: Vec<(&str, &str)> = ["CLUSTER_ID", "NAMESPACE", "ISTIO_VERSION"]
        .into_iter()
        .map(|k| (k, get(k)))
        .filter(|(_, v)| !v.is_empty())
        .collect();
    crate::generate::proto::string_struct(&fields)
}

/// A proxy's sync status per type, as istiod encodes it: `ClientConfig.node` with the
/// proxy id (`pod.namespace`) and [`node_metadata`], one `generic_xds_configs` entry
/// per type with only `type_url` and `config_status` set.
pub fn sync_status(c: &ConnectionHandle) -> ClientConfig {
    let state = c.state.lock().expect("state poisoned");
    let generic_xds_configs = SYNCZ_TYPES
        .iter()
        .map(|t| {
            let status = type_status(state.watch(*t));
            GenericXdsConfig {
                type_url: t.as_str().to_string(),
                config_status: status as i32,
                ..Default::default()
            }
        })
        .collect();
    drop(state);
    #[allow(deprecated)]
    ClientConfig {
        node: Some(Node {
            id: c.proxy.id.clone(),
            metadata: Some(node_metadata(c)),
            ..Default::default()
        }),
        generic_xds_configs,
        ..Default::default()
    }
}

/// istiod's `debugSyncStatus`: never sent, acknowledged, or sent and not yet (or
/// not) acknowledged.
pub fn type_status(watch: Option<&crate::ads::connection::Watch>) -> ConfigStatus {
    let Some(watch) = watch else {
        return ConfigStatus::NotSent;
    };
    if watch.nonce_sent.is_none() {
        ConfigStatus::NotSent
    } else if watch.acked() {
        ConfigStatus::Synced
    } else {
        ConfigStatus::Stale
    }
}

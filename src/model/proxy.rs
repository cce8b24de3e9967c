//! The proxy behind a connection: Istio's node id `Type~IP~ID~Domain` and the node
//! metadata keys (`CLUSTER_ID`, `NETWORK`, `NAMESPACE`, `LABELS`, `GENERATOR`,
//! `INSTANCE_IPS`, ...).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use meshfed_registry::{ClusterId, Locality, NetworkId, WorkloadInstance, WorkloadQuery};
use serde::Serialize;

/// The first field of the node id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeType {
    /// An application sidecar (or a proxyless gRPC client).
    Sidecar,
    /// A gateway.
    Router,
    /// An ambient waypoint.
    Waypoint,
    /// An ambient node proxy.
    Ztunnel,
}

impl NodeType {
    fn parse(s: &str) -> Option<NodeType> {
        Some(match s {
            "sidecar" => NodeType::Sidecar,
            "router" => NodeType::Router,
            "waypoint" => NodeType::Waypoint,
            "ztunnel" => NodeType::Ztunnel,
            _ => return None,
        })
    }
}

/// Which generator family serves the proxy (metadata `GENERATOR`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Generator {
    /// Envoy sidecars and gateways.
    Envoy,
    /// Proxyless gRPC clients.
    Grpc,
    /// istioctl's debug clients (`GENERATOR=event`, Istio's status generator): the
    /// stream asks for debug types only, is no proxy and is never pushed config.
    Event,
    /// MCP-over-xDS clients (`GENERATOR=api`: an istiod reading config sources): Istio
    /// config as `istio.mcp.v1alpha1.Resource`s for `<group>/<version>/<kind>` types,
    /// the Envoy types from the default generators, as istiod's `APIGenerator`.
    Api,
}

/// The kinds of proxy whose config is generated differently, and so reads different
/// things (the declared dependencies of `xds::deps`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyClass {
    /// An Envoy sidecar (Istio's generator for `sidecar` nodes).
    Sidecar,
    /// An Envoy gateway (`router` nodes).
    Router,
    /// A proxyless gRPC client or server (`GENERATOR=grpc`).
    Grpc,
}

/// What the listener, route and proxyless generators may know of a proxy: its
/// namespace, cluster, labels (its workload's when a registry knows it), DNS domain
/// and kind. It is part of their cache keys, so two proxies that agree on all of it
/// share those resources, and a generator handed it cannot read anything else.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct ClientView {
    /// Config namespace.
    pub namespace: String,
    /// Metadata `CLUSTER_ID`.
    pub cluster_id: Option<ClusterId>,
    /// Workload labels.
    pub labels: BTreeMap<String, String>,
    /// DNS domain, for short-name expansion.
    pub dns_domain: String,
    /// Generator family.
    pub generator: Generator,
    /// Node type.
    pub node_type: NodeType,
    /// Whether the proxy uses ServiceEntries' auto-allocated addresses
    /// ([`Proxy::uses_auto_allocated_ips`]).
    pub uses_auto_allocated: bool,
    /// Metadata `INTERCEPTION_MODE` is `NONE`: no traffic is redirected to the proxy,
    /// so it has no `virtualInbound` and binds its inbound listeners.
    pub interception_none: bool,
    /// A gateway's `gatewayTopology` from its metadata `PROXY_CONFIG` (the proxy's
    /// merged ProxyConfig); the default for other proxies, which do not read it.
    pub gateway_topology: GatewayTopology,
    /// Metadata `HTTP10` is `1`: the proxy's connection managers accept HTTP/1.0.
    pub http10: bool,
    /// Metadata `IDLE_TIMEOUT` (a duration such as `30s`): the idle timeout of the
    /// proxy's connection managers; unset or unreadable, Envoy's default.
    pub idle_timeout: Option<std::time::Duration>,
}

/// ProxyConfig `gatewayTopology`: what a gateway's connection managers trust and
/// forward.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct GatewayTopology {
    /// `numTrustedProxies`: trusted hops in `X-Forwarded-For`.
    pub num_trusted_proxies: u32,
    /// `forwardClientCertDetails` as Istio numbers it (`UNDEFINED` 0, `SANITIZE` 1,
    /// `FORWARD_ONLY` 2, `APPEND_FORWARD` 3, `SANITIZE_SET` 4, `ALWAYS_FORWARD_ONLY` 5).
    pub forward_client_cert_details: u8,
}

impl GatewayTopology {
    /// Reads `gatewayTopology` of a `PROXY_CONFIG` object (proto3 JSON: the enum by
    /// name or number, the count as a number or a string); anything absent or
    /// unreadable is left at its default.
    pub fn from_proxy_config(proxy_config: Option<&serde_json::Value>) -> GatewayTopology {
        let Some(t) = proxy_config.and_then(|c| c.get("gatewayTopology")) else {
            return GatewayTopology::default();
        };
        let num_trusted_proxies = match t.get("numTrustedProxies") {
            // Node metadata is a protobuf Struct: its numbers arrive as doubles.
            Some(serde_json::Value::Number(n)) => n.as_u64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                    .map(|f| f as u64)
            }),
            Some(serde_json::Value::String(s)) => s.parse().ok(),
            _ => None,
        }
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0);
        const NAMES: [&str; 6] = [
            "UNDEFINED",
            "SANITIZE",
            "FORWARD_ONLY",
            "APPEND_FORWARD",
            "SANITIZE_SET",
            "ALWAYS_FORWARD_ONLY",
        ];
        let forward_client_cert_details = match t.get("forwardClientCertDetails") {
            Some(serde_json::Value::String(s)) => NAMES.iter().position(|n| n == s),
            Some(serde_json::Value::Number(n)) => n
                .as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < NAMES.len() as f64)
                .map(|f| f as usize),
            _ => None,
        }
        .and_then(|n| u8::try_from(n).ok())
        .unwrap_or(0);
        GatewayTopology {
            num_trusted_proxies,
            forward_client_cert_details,
        }
    }
}

impl ClientView {
    /// True for gateways (`router` nodes).
    pub fn is_router(&self) -> bool {
        self.node_type == NodeType::Router
    }
}

/// The longest node id accepted, in bytes. Istio's ids are four short parts
/// (`sidecar~10.0.0.1~pod.ns~ns.svc.cluster.local`); anything near this is not a proxy.
pub const MAX_NODE_ID: usize = 4096;

/// Why a node was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum NodeError {
    /// The first request carried no node.
    #[error("the first request on a stream must carry a node")]
    Missing,
    /// The node id is longer than [`MAX_NODE_ID`].
    #[error("node id of {0} bytes is longer than the limit of {MAX_NODE_ID}")]
    IdTooLong(usize),
    /// The id does not have four `~`-separated parts.
    #[error(
        "node id {0:?} must have the form Type~IP~ID~Domain (4 parts separated by '~'), found {1} part(s)"
    )]
    Parts(String, usize),
    /// Unknown first field.
    #[error(
        "node id {0:?}: unknown node type {1:?} (expected sidecar, router, waypoint or ztunnel)"
    )]
    Type(String, String),
    /// No usable IP in the id nor in `INSTANCE_IPS`.
    #[error("node id {0:?}: {1:?} is not an IP address and metadata INSTANCE_IPS has no valid IP")]
    Ip(String, String),
    /// A metadata key has the wrong shape.
    #[error("node metadata {0}: {1}")]
    Metadata(&'static str, String),
}

/// Everything the control plane knows about the proxy on a connection.
#[derive(Clone, Debug, Serialize)]
pub struct Proxy {
    /// The full node id.
    pub node_id: String,
    /// Node type.
    pub node_type: NodeType,
    /// Proxy IPs: `INSTANCE_IPS` when valid, else the id's IP field.
    pub ip_addresses: Vec<IpAddr>,
    /// The id field: `<pod>.<namespace>` on Kubernetes.
    pub id: String,
    /// DNS domain, `<namespace>.svc.<suffix>`, used for short-name expansion.
    pub dns_domain: String,
    /// Config namespace: metadata `NAMESPACE`, else the first label of the domain.
    pub namespace: String,
    /// Metadata `CLUSTER_ID`.
    pub cluster_id: Option<ClusterId>,
    /// Metadata `NETWORK` (empty when unset).
    pub network: NetworkId,
    /// Workload labels: metadata `LABELS` as sent; generators see the registry's
    /// labels instead when it knows the workload ([`Proxy::with_workload`]).
    pub labels: BTreeMap<String, String>,
    /// Node locality (a fallback: registry topology wins).
    pub locality: Locality,
    /// Generator selected by `GENERATOR`.
    pub generator: Generator,
    /// A `GENERATOR` this server does not know, answered with the default
    /// generators as istiod does (logged once by the stream).
    pub generator_fallback: Option<String>,
    /// Metadata `ISTIO_VERSION`, if set.
    pub istio_version: Option<String>,
    /// Node `user_agent_name` (e.g. "envoy", "gRPC C-core linux Python").
    pub user_agent: String,
    /// The raw metadata, for debug output (shared: proxies are copied per push when
    /// their workload's labels apply).
    pub metadata: Arc<serde_json::Value>,
    /// The identity the secure port authenticated and matched to the node (Istio's
    /// `VerifiedIdentity`); `None` on the plaintext port.
    pub verified_identity: Option<String>,
    /// The registry's answer for this proxy's workload, remembered by the snapshots
    /// that share it (see [`WorkloadMemo`]).
    #[serde(skip)]
    pub workload_memo: WorkloadMemo,
}

/// The workload a proxy runs as, remembered with the generation of the answers it
/// came from (`push::snapshot::ProxyWorkloads`): endpoint-only snapshots share their
/// predecessor's answers, so each push to every proxy would otherwise look the same
/// answer up again in a map shared by all proxies. Not part of what the proxy is: a
/// copy starts empty.
#[derive(Default)]
pub struct WorkloadMemo(std::sync::Mutex<Option<(u64, Option<Arc<WorkloadInstance>>)>>);

impl WorkloadMemo {
    /// The answer remembered for `generation`.
    pub fn get(&self, generation: u64) -> Option<Option<Arc<WorkloadInstance>>> {
        let memo = self.0.lock().unwrap_or_else(|e| e.into_inner());
        memo.as_ref()
            .filter(|(g, _)| *g == generation)
            .map(|(_, w)| w.clone())
    }

    /// Remembers `answer` for `generation`.
    pub fn set(&self, generation: u64, answer: Option<Arc<WorkloadInstance>>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((generation, answer));
    }
}

impl Clone for WorkloadMemo {
    fn clone(&self) -> Self {
        WorkloadMemo::default()
    }
}

impl std::fmt::Debug for WorkloadMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkloadMemo")
    }
}

impl Proxy {
    /// Metadata `SERVICE_ACCOUNT` (empty when unset).
    pub fn service_account(&self) -> &str {
        self.metadata
            .get("SERVICE_ACCOUNT")
            .and_then(|v| v.as_str())
            .unwrap_or("")
    }

    /// Metadata `REQUESTED_NETWORK_VIEW`: the networks the proxy asks to see, a
    /// comma-separated list (Istio's `StringList`, split on `,` as sent), sorted and
    /// deduplicated; `None` when unset or empty (every network).
    pub fn requested_network_view(&self) -> Option<Vec<NetworkId>> {
        let raw = self.metadata.get("REQUESTED_NETWORK_VIEW")?.as_str()?;
        if raw.is_empty() {
            return None;
        }
        let mut networks: Vec<NetworkId> = raw.split(',').map(NetworkId::new).collect();
        networks.sort();
        networks.dedup();
        Some(networks)
    }

    /// True for gateways (`router` nodes).
    pub fn is_router(&self) -> bool {
        self.node_type == NodeType::Router
    }

    /// The facts of this proxy that listener, route and proxyless generators read.
    pub fn client_view(&self) -> ClientView {
        ClientView {
            namespace: self.namespace.clone(),
            cluster_id: self.cluster_id.clone(),
            labels: self.labels.clone(),
            dns_domain: self.dns_domain.clone(),
            generator: self.generator,
            node_type: self.node_type,
            uses_auto_allocated: self.uses_auto_allocated_ips(),
            interception_none: self.interception_none(),
            gateway_topology: if self.is_router() {
                GatewayTopology::from_proxy_config(self.metadata.get("PROXY_CONFIG"))
            } else {
                GatewayTopology::default()
            },
            http10: self.metadata.get("HTTP10").and_then(|v| v.as_str()) == Some("1"),
            idle_timeout: self
                .metadata
                .get("IDLE_TIMEOUT")
                .and_then(|v| v.as_str())
                .and_then(|s| meshfed_registry::source::parse_duration(s).ok()),
        }
    }

    /// Whether metadata `INTERCEPTION_MODE` is `NONE` (Istio's `InterceptionNone`):
    /// traffic reaches the proxy only on ports it binds.
    pub fn interception_none(&self) -> bool {
        self.metadata
            .get("INTERCEPTION_MODE")
            .and_then(|v| v.as_str())
            == Some("NONE")
    }

    /// A boolean metadata field as Istio's `StringBool` reads it: a JSON bool, or a
    /// string Go's `strconv.ParseBool` takes (`1`, `t`, `T`, `TRUE`, `true`, `True`);
    /// anything else is false.
    pub fn bool_meta(&self, key: &str) -> bool {
        match self.metadata.get(key) {
            Some(serde_json::Value::Bool(b)) => *b,
            Some(serde_json::Value::String(s)) => {
                matches!(s.as_str(), "1" | "t" | "T" | "TRUE" | "true" | "True")
            }
            _ => false,
        }
    }

    /// Whether the proxy's agent answers DNS from a name table (metadata `DNS_CAPTURE`,
    /// set from `ISTIO_META_DNS_CAPTURE`): only such a proxy is served NDS.
    pub fn captures_dns(&self) -> bool {
        self.bool_meta("DNS_CAPTURE")
    }

    /// Whether the proxy uses ServiceEntries' auto-allocated addresses (Istio's
    /// `nodeUsesAutoallocatedIPs` with the legacy allocator): metadata
    /// `DNS_AUTO_ALLOCATE` (`ISTIO_META_DNS_AUTO_ALLOCATE`) and `DNS_CAPTURE`
    /// (`ISTIO_META_DNS_CAPTURE`) both true. Such a proxy resolves those hosts to the
    /// allocated addresses through its DNS proxy, so its listeners and name table use
    /// them ([`meshfed_registry::Service::address_for_proxy`]).
    pub fn uses_auto_allocated_ips(&self) -> bool {
        self.bool_meta("DNS_AUTO_ALLOCATE") && self.bool_meta("DNS_CAPTURE")
    }

    /// Which generator family and shape serves this proxy.
    pub fn class(&self) -> ProxyClass {
        if self.generator == Generator::Grpc {
            ProxyClass::Grpc
        } else if self.is_router() {
            ProxyClass::Router
        } else {
            ProxyClass::Sidecar
        }
    }

    /// What a registry needs to find the workload this proxy runs as.
    pub fn workload_query(&self) -> WorkloadQuery<'_> {
        WorkloadQuery {
            ips: &self.ip_addresses,
            id: &self.id,
            namespace: &self.namespace,
            cluster: self.cluster_id.as_ref(),
        }
    }

    /// This proxy as the registry that knows its workload sees it (Istio sets a
    /// proxy's labels from its registry on every push): the workload's labels (its
    /// pod's plus topology labels) replace the metadata `LABELS`, which only count
    /// when no registry knows the workload; the workload's locality, when known,
    /// replaces the node's.
    pub fn with_workload(&self, workload: &WorkloadInstance) -> Proxy {
        let mut proxy = self.clone();
        proxy.labels = workload.labels.clone();
        if !workload.locality.is_empty() {
            proxy.locality = workload.locality.clone();
        }
        proxy
    }

    /// Parses and validates the node of a stream's first request.
    pub fn from_node(node: Option<&Node>) -> Result<Proxy, NodeError> {
        let node = node.ok_or(NodeError::Missing)?;
        if node.id.len() > MAX_NODE_ID {
            return Err(NodeError::IdTooLong(node.id.len()));
        }
        let metadata = node
            .metadata
            .as_ref()
            .map(struct_to_json)
            .unwrap_or(serde_json::Value::Null);
        let parts: Vec<&str> = node.id.split('~').collect();
        if parts.len() != 4 {
            return Err(NodeError::Parts(node.id.clone(), parts.len()));
        }
        let node_type = NodeType::parse(parts[0])
            .ok_or_else(|| NodeError::Type(node.id.clone(), parts[0].to_string()))?;
        let str_meta = |key: &str| {
            metadata
                .get(key)
                .and_then(|v| v.as_str())
                .filter(|s| !s.is_empty())
        };
        let mut ip_addresses: Vec<IpAddr> = str_meta("INSTANCE_IPS")
            .map(|ips| {
                ips.split(',')
                    .filter_map(|ip| ip.trim().parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        if ip_addresses.is_empty() {
            let ip = parts[1]
                .parse()
                .map_err(|_| NodeError::Ip(node.id.clone(), parts[1].to_string()))?;
            ip_addresses.push(ip);
        }
        let dns_domain = parts[3].to_string();
        let namespace = str_meta("NAMESPACE")
            .map(str::to_string)
            .unwrap_or_else(|| dns_domain.split('.').next().unwrap_or_default().to_string());
        let labels = match metadata.get("LABELS") {
            None | Some(serde_json::Value::Null) => BTreeMap::new(),
            Some(serde_json::Value::Object(map)) => map
                .iter()
                .map(|(k, v)| match v {
                    serde_json::Value::String(s) => Ok((k.clone(), s.clone())),
                    other => Err(NodeError::Metadata(
                        "LABELS",
                        format!("label {k:?} must be a string, got {other}"),
                    )),
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(NodeError::Metadata(
                    "LABELS",
                    format!("must be an object, got {other}"),
                ));
            }
        };
        // istiod falls back to the default generators for a GENERATOR it does not
        // know; so does this server, and the stream says so once.
        let (generator, generator_fallback) = match str_meta("GENERATOR") {
            None => (Generator::Envoy, None),
            Some("grpc") => (Generator::Grpc, None),
            Some("event") => (Generator::Event, None),
            Some("api") => (Generator::Api, None),
            Some(other) => (Generator::Envoy, Some(other.to_string())),
        };
        let locality = node
            .locality
            .as_ref()
            .map(|l| Locality {
                region: l.region.clone(),
                zone: l.zone.clone(),
                subzone: l.sub_zone.clone(),
            })
            .unwrap_or_default();
        Ok(Proxy {
            node_id: node.id.clone(),
            node_type,
            ip_addresses,
            id: parts[2].to_string(),
            dns_domain,
            namespace,
            cluster_id: str_meta("CLUSTER_ID").map(ClusterId::new),
            network: str_meta("NETWORK").map(NetworkId::new).unwrap_or_default(),
            labels,
            locality,
            generator,
            generator_fallback,
            istio_version: str_meta("ISTIO_VERSION").map(str::to_string),
            user_agent: node.user_agent_name.clone(),
            metadata: Arc::new(metadata),
            verified_identity: None,
            workload_memo: WorkloadMemo::default(),
        })
    }
}

/// Converts a protobuf `Struct` into JSON.
pub fn struct_to_json(s: &Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

fn value_to_json(v: &Value) -> serde_json::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(serde_json::Value::Null, Into::into)
        }
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_to_json(s),
        Some(Kind::ListValue(l)) => {
            serde_json::Value::Array(l.values.iter().map(value_to_json).collect())
        }
    }
}

/// Converts JSON into a protobuf `Struct` (test clients and the load tool use it to
/// build node metadata). Non-object input gives an empty struct.
pub fn json_to_struct(v: &serde_json::Value) -> Struct {
    let mut out = Struct::default();
    if let serde_json::Value::Object(map) = v {
        out.fields = map
            .iter()
            .map(|(k, v)| (k.clone(), json_to_value(v)))
            .collect();
    }
    out
}

fn json_to_value(v: &serde_json::Value) -> Value {
    use envoy_types::pb::google::protobuf::ListValue;
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        serde_json::Value::Object(_) => Kind::StructValue(json_to_struct(v)),
    };
    Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, meta: serde_json::Value) -> Node {
        Node {
            id: id.into(),
            metadata: Some(json_to_struct(&meta)),
            ..Default::default()
        }
    }

    #[test]
    fn parses_istio_node_ids_and_metadata() {
        let n = node(
            "sidecar~10.1.2.3~reviews-v1-abc.bookinfo~bookinfo.svc.cluster.local",
            serde_json::json!({"CLUSTER_ID": "c2", "NETWORK": "n2", "LABELS": {"app": "reviews"},
                               "INSTANCE_IPS": "10.1.2.3,fd00::3"}),
        );
        let p = Proxy::from_node(Some(&n)).unwrap();
        assert_eq!(p.node_type, NodeType::Sidecar);
        assert_eq!(p.id, "reviews-v1-abc.bookinfo");
        assert_eq!(
            p.namespace, "bookinfo",
            "namespace falls back to the domain's first label"
        );
        assert_eq!(p.cluster_id.unwrap().as_str(), "c2");
        assert_eq!(p.network.as_str(), "n2");
        assert_eq!(p.labels["app"], "reviews");
        assert_eq!(p.ip_addresses.len(), 2);
        assert_eq!(p.generator, Generator::Envoy);
    }

    #[test]
    fn requested_network_view_is_a_comma_separated_list() {
        let view = |meta: serde_json::Value| {
            let n = node("sidecar~10.0.0.1~a.ns~ns.svc.cluster.local", meta);
            Proxy::from_node(Some(&n)).unwrap().requested_network_view()
        };
        assert_eq!(view(serde_json::json!({})), None);
        assert_eq!(
            view(serde_json::json!({"REQUESTED_NETWORK_VIEW": ""})),
            None
        );
        assert_eq!(
            view(serde_json::json!({"REQUESTED_NETWORK_VIEW": "vm,n1,vm"})),
            Some(vec![NetworkId::new("n1"), NetworkId::new("vm")]),
            "sorted and deduplicated, split on commas as sent"
        );
    }

    #[test]
    fn auto_allocated_addresses_need_dns_auto_allocate_and_dns_capture() {
        let uses = |meta: serde_json::Value| {
            let n = node("sidecar~10.0.0.1~a.ns~ns.svc.cluster.local", meta);
            let p = Proxy::from_node(Some(&n)).unwrap();
            assert_eq!(
                p.client_view().uses_auto_allocated,
                p.uses_auto_allocated_ips()
            );
            p.uses_auto_allocated_ips()
        };
        assert!(uses(
            serde_json::json!({"DNS_AUTO_ALLOCATE": "true", "DNS_CAPTURE": "true"})
        ));
        assert!(uses(
            serde_json::json!({"DNS_AUTO_ALLOCATE": "1", "DNS_CAPTURE": "True"})
        ));
        assert!(!uses(serde_json::json!({"DNS_CAPTURE": "true"})));
        assert!(!uses(serde_json::json!({"DNS_AUTO_ALLOCATE": "true"})));
        assert!(!uses(
            serde_json::json!({"DNS_AUTO_ALLOCATE": "yes", "DNS_CAPTURE": "true"})
        ));
        assert!(!uses(serde_json::json!({})));
    }

    #[test]
    fn bad_node_ids_say_what_is_wrong() {
        let err =
            Proxy::from_node(Some(&node("sidecar~10.0.0.1~x", serde_json::json!({})))).unwrap_err();
        assert!(err.to_string().contains("Type~IP~ID~Domain"), "{err}");
        assert!(err.to_string().contains("3 part(s)"), "{err}");
        let err =
            Proxy::from_node(Some(&node("envoy~10.0.0.1~x~d", serde_json::json!({})))).unwrap_err();
        assert!(
            err.to_string().contains("unknown node type \"envoy\""),
            "{err}"
        );
        let err =
            Proxy::from_node(Some(&node("sidecar~nope~x~d", serde_json::json!({})))).unwrap_err();
        assert!(matches!(err, NodeError::Ip(..)), "{err}");
        let err = Proxy::from_node(None).unwrap_err();
        assert_eq!(err, NodeError::Missing);
        // An unknown GENERATOR is no error: the default generators answer (istiod).
        let fallback = Proxy::from_node(Some(&node(
            "sidecar~1.1.1.1~x~d",
            serde_json::json!({"GENERATOR": "foo"}),
        )))
        .unwrap();
        assert_eq!(fallback.generator, Generator::Envoy);
        assert_eq!(fallback.generator_fallback.as_deref(), Some("foo"));
        assert_eq!(fallback.class(), ProxyClass::Sidecar);
        let event = Proxy::from_node(Some(&node(
            "sidecar~1.1.1.1~x~d",
            serde_json::json!({"GENERATOR": "event"}),
        )))
        .unwrap();
        assert_eq!(event.generator, Generator::Event);
        assert_eq!(event.generator_fallback, None);
        let api = Proxy::from_node(Some(&node(
            "sidecar~1.1.1.1~x~d",
            serde_json::json!({"GENERATOR": "api"}),
        )))
        .unwrap();
        assert_eq!(api.generator, Generator::Api);
        assert_eq!(api.generator_fallback, None);
        assert_eq!(api.class(), ProxyClass::Sidecar);
        let long = format!("sidecar~10.0.0.1~{}~d", "x".repeat(MAX_NODE_ID));
        let err = Proxy::from_node(Some(&node(&long, serde_json::json!({})))).unwrap_err();
        assert_eq!(err, NodeError::IdTooLong(long.len()));
        assert!(
            err.to_string().len() < 100,
            "the message does not echo the id"
        );
    }

    #[test]
    fn instance_ips_replace_a_bad_id_ip_and_grpc_generator_is_selected() {
        let n = node(
            "sidecar~x~c.default~default.svc.cluster.local",
            serde_json::json!({"INSTANCE_IPS": "127.0.0.5", "GENERATOR": "grpc", "NAMESPACE": "other"}),
        );
        let p = Proxy::from_node(Some(&n)).unwrap();
        assert_eq!(p.ip_addresses[0].to_string(), "127.0.0.5");
        assert_eq!(p.generator, Generator::Grpc);
        assert_eq!(p.namespace, "other");
    }

    #[test]
    fn the_workload_s_labels_and_locality_replace_the_metadata() {
        let n = Node {
            locality: Some(envoy_types::pb::envoy::config::core::v3::Locality {
                region: "node-region".into(),
                ..Default::default()
            }),
            ..node(
                "sidecar~10.1.2.3~reviews-1.bookinfo~bookinfo.svc.cluster.local",
                serde_json::json!({"LABELS": {"app": "reviews", "stale": "yes"}}),
            )
        };
        let p = Proxy::from_node(Some(&n)).unwrap();
        let q = p.workload_query();
        assert_eq!((q.id, q.namespace), ("reviews-1.bookinfo", "bookinfo"));
        let workload = WorkloadInstance {
            name: "reviews-1".into(),
            namespace: "bookinfo".into(),
            cluster_id: "c1".into(),
            labels: [("app".to_string(), "reviews".to_string())].into(),
            locality: Locality::parse("r1/z1"),
            service_account: None,
            targets: Vec::new(),
        };
        let seen = p.with_workload(&workload);
        assert_eq!(
            seen.labels, workload.labels,
            "metadata-only labels are gone"
        );
        assert_eq!(seen.locality.to_string(), "r1/z1/");
        assert_eq!(seen.node_id, p.node_id);
        let unplaced = WorkloadInstance {
            locality: Locality::default(),
            ..workload
        };
        assert_eq!(p.with_workload(&unplaced).locality.region, "node-region");
    }
}

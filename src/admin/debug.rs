//! The debug endpoints: one table of path, description and handler.

use std::collections::BTreeMap;

use axum::extract::{Query, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};

use super::AdminState;
use crate::logging::{ERROR_DETAIL_LOG_MAX, NODE_ID_LOG_MAX, clip};

/// A debug handler: state and query parameters in, JSON or an HTTP error out.
type Handler = fn(&AdminState, &BTreeMap<String, String>) -> Answer;

/// One debug endpoint.
pub struct DebugEndpoint {
    /// Path below `/debug/`.
    pub path: &'static str,
    /// What it shows.
    pub description: &'static str,
    handler: Handler,
}

/// Every debug endpoint. `/debug/list` and `/debug` are generated from this table.
pub static DEBUG_ENDPOINTS: &[DebugEndpoint] = &[
    DebugEndpoint {
        path: "adsz",
        description: "Connected xDS clients: node, peer, metadata, subscriptions per type, connected since",
        handler: adsz,
    },
    DebugEndpoint {
        path: "syncz",
        description: "Per proxy and type: last sent and acknowledged nonce and version, last NACK error",
        handler: syncz,
    },
    DebugEndpoint {
        path: "config_dump",
        description: "?proxyID=<id>: what that proxy was sent (its subscriptions, current snapshot), as Envoy admin ConfigDump JSON; &types=cds,lds,rds,eds limits it",
        handler: super::config_dump::config_dump,
    },
    DebugEndpoint {
        path: "ndsz",
        description: "?proxyID=<id>: the DNS name table (NDS) of that proxy from the current snapshot; 404 when it does not capture DNS",
        handler: ndsz,
    },
    DebugEndpoint {
        path: "registryz",
        description: "Every merged service with the registries it came from, merge conflicts and who won, registry state, and the WorkloadEntries of connected VMs (auto-registered or health-checked)",
        handler: registryz,
    },
    DebugEndpoint {
        path: "endpointShardz",
        description: "Endpoint index: per service, per registry shard, the endpoints",
        handler: endpoint_shardz,
    },
    DebugEndpoint {
        path: "configz",
        description: "Every Istio config object in force (sorted), and every rejected one with its errors",
        handler: configz,
    },
    DebugEndpoint {
        path: "endpointz",
        description: "Alias of endpointShardz (Istio's older name)",
        handler: endpoint_shardz,
    },
    DebugEndpoint {
        path: "clusterz",
        description: "Remote clusters from multicluster Secrets: secret, kubeconfig hash, state, synced, stale",
        handler: clusterz,
    },
    DebugEndpoint {
        path: "push_status",
        description: "The last pushes: version, reasons, changes, build time, connections; the conflicts met generating the current snapshot (dropped listener chains)",
        handler: push_status,
    },
    DebugEndpoint {
        path: "networkz",
        description: "Networks (meshNetworks and gateway labels), how endpoints are placed in them, and each network's gateways with where each came from",
        handler: networkz,
    },
    DebugEndpoint {
        path: "ca",
        description: "The mesh CA: where it came from, the root bundle (PEM) workloads trust, and when the root and the signing certificate expire (never the key)",
        handler: ca,
    },
    DebugEndpoint {
        path: "sdsz",
        description: "Gateway credentials (SDS): per connection the Secret names requested, served, denied (why) and failed (why); per Secret why it cannot be served; the Kubernetes Secrets followed. Never key material",
        handler: sdsz,
    },
    DebugEndpoint {
        path: "cachez",
        description: "Resource cache of the current snapshot: hits, misses, size",
        handler: cachez,
    },
    DebugEndpoint {
        path: "duties",
        description: "The optional duties (CA Secret, leader Lease, root-cert ConfigMaps, config status): state (pending, done, failing), failed attempts and the last error with what to do",
        handler: duties,
    },
    DebugEndpoint {
        path: "ambientz",
        description: "Ambient (ztunnel): per connection watching istio.workload.Address or istio.security.Authorization, its subscription and what it holds (name -> version); ?resources=true adds every workload and service",
        handler: ambientz,
    },
];

fn ambientz(state: &AdminState, query: &BTreeMap<String, String>) -> Answer {
    let snapshot = state.pipeline.snapshot().load_full();
    let with = query.get("resources").is_some_and(|v| v == "true");
    Ok(crate::generate::ambient::ambientz(
        &state.connections,
        &snapshot,
        with,
        &state.generator.ambient,
    ))
}

/// `/debug/list`.
pub fn list() -> Value {
    Value::Array(
        DEBUG_ENDPOINTS
            .iter()
            .map(|e| json!({"path": format!("/debug/{}", e.path), "description": e.description}))
            .collect(),
    )
}

/// Routes `/debug/<path>` to its handler; `?pretty` indents the JSON.
pub async fn dispatch(
    State(state): State<AdminState>,
    uri: Uri,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let path = uri.path().trim_start_matches("/debug/");
    let (status, kind, body) = answer(&state, path, &query);
    (status, [(header::CONTENT_TYPE, kind)], body).into_response()
}

/// The answer of the debug page at `path` (below `/debug/`): status, content type
/// and body. Shared by the HTTP port and the `istio.io/debug` xDS type.
pub fn answer(
    state: &AdminState,
    path: &str,
    query: &BTreeMap<String, String>,
) -> (StatusCode, &'static str, String) {
    let Some(endpoint) = DEBUG_ENDPOINTS.iter().find(|e| e.path == path) else {
        return (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "no such debug endpoint; see /debug/list\n".into(),
        );
    };
    match (endpoint.handler)(state, query) {
        Ok(value) => {
            let body = if query.contains_key("pretty") {
                serde_json::to_string_pretty(&value)
            } else {
                serde_json::to_string(&value)
            }
            .unwrap_or_default();
            (StatusCode::OK, "application/json", body)
        }
        Err((status, message)) => {
            // Handlers that answer errors as JSON say so; others are plain text.
            let kind = if message.starts_with('{') {
                "application/json"
            } else {
                "text/plain; charset=utf-8"
            };
            (status, kind, message)
        }
    }
}

type Answer = Result<Value, (StatusCode, String)>;

/// A NACK's error detail as the debug pages show it: the proxy wrote it, so it is cut
/// at [`ERROR_DETAIL_LOG_MAX`] bytes (the connection keeps it whole).
fn clip_error(detail: Option<&str>) -> Option<std::borrow::Cow<'_, str>> {
    detail.map(|d| clip(d, ERROR_DETAIL_LOG_MAX))
}

fn to_json<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn duties(state: &AdminState, _: &BTreeMap<String, String>) -> Answer {
    Ok(json!({ "duties": to_json(&state.duties.views()) }))
}

fn ca(state: &AdminState, _: &BTreeMap<String, String>) -> Answer {
    let Some((ca, source)) = &state.ca else {
        return Ok(json!({"enabled": false}));
    };
    let rfc3339 = |t: Option<time::OffsetDateTime>| {
        t.and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
    };
    Ok(json!({
        "enabled": true,
        "source": source,
        "rootCert": ca.root_pem(),
        "rootNotAfter": rfc3339(ca.root_not_after()),
        "signingNotAfter": rfc3339(Some(ca.not_after())),
    }))
}

fn sdsz(state: &AdminState, _: &BTreeMap<String, String>) -> Answer {
    Ok(match &state.sds {
        Some(sds) => sds.debug(),
        None => json!({"enabled": false}),
    })
}

/// `/debug/ndsz?proxyID=`: what NDS gives that proxy now, as proto3 JSON.
fn ndsz(state: &AdminState, query: &BTreeMap<String, String>) -> Answer {
    let Some(id) = query.get("proxyID").filter(|id| !id.is_empty()) else {
        return Err((
            StatusCode::BAD_REQUEST,
            "missing ?proxyID=<proxy id, node id or connection id> (see /debug/syncz)\n".into(),
        ));
    };
    let Some(connection) = super::config_dump::find_connection(&state.connections, id) else {
        return Err((
            StatusCode::NOT_FOUND,
            format!(
                "no connected proxy with id {:?}\n",
                clip(id, NODE_ID_LOG_MAX)
            ),
        ));
    };
    if !connection.proxy.captures_dns() {
        return Err((
            StatusCode::NOT_FOUND,
            "DNS capture is not enabled for this proxy (metadata DNS_CAPTURE)\n".into(),
        ));
    }
    let snapshot = state.pipeline.snapshot().load_full();
    let table = crate::generate::nds::name_table(&snapshot, &connection.proxy).unwrap_or_default();
    Ok(to_json(&table))
}

fn adsz(state: &AdminState, _: &BTreeMap<String, String>) -> Answer {
    let clients: Vec<Value> = state
        .connections
        .all()
        .iter()
        .map(|c| {
            let st = c.state.lock().expect("state poisoned");
            let watches: BTreeMap<&str, Value> = st
                .watches
                .iter()
                .map(|(t, w)| (t.short(), json!({"wildcard": w.wildcard, "names": w.names, "lastError": clip_error(w.last_error())})))
                .collect();
            json!({
                "connectionId": clip(&c.id, NODE_ID_LOG_MAX),
                "node": clip(&c.proxy.node_id, NODE_ID_LOG_MAX),
                "peer": c.peer.map(|p| p.to_string()),
                "flavour": c.flavour,
                "connectedAt": humantime(c.connected_at),
                "proxy": {
                    "type": c.proxy.node_type, "ips": c.proxy.ip_addresses, "namespace": c.proxy.namespace,
                    "clusterId": c.proxy.cluster_id, "network": c.proxy.network, "labels": c.proxy.labels,
                    "generator": c.proxy.generator, "userAgent": c.proxy.user_agent,
                    "verifiedIdentity": c.proxy.verified_identity,
                },
                "metadata": c.proxy.metadata,
                "watches": watches,
            })
        })
        .collect();
    // The watch index: per type, the distinct subscribed name sets and the names in
    // them that an incremental push looks up.
    let index: BTreeMap<&str, Value> = state
        .connections
        .watch_index()
        .sizes()
        .into_iter()
        .map(|(t, sets, names)| (t.short(), json!({"nameSets": sets, "names": names})))
        .collect();
    Ok(json!({"totalClients": clients.len(), "clients": clients, "watchIndex": index}))
}

fn syncz(state: &AdminState, _: &BTreeMap<String, String>) -> Answer {
    let rows: Vec<Value> = state
        .connections
        .all()
        .iter()
        .map(|c| {
            let st = c.state.lock().expect("state poisoned");
            let types: BTreeMap<&str, Value> = st
                .watches
                .iter()
                .map(|(t, w)| {
                    (
                        t.short(),
                        json!({
                            "nonceSent": w.nonce_sent, "versionSent": w.version_sent,
                            "nonceAcked": w.nonce_acked, "versionAcked": w.version_acked,
                            "lastSent": w.last_sent.map(humantime),
                            "lastError": clip_error(w.last_error()),
                            "nonceNacked": w.nonce_nacked().map(|n| clip(n, NODE_ID_LOG_MAX)),
                            "synced": w.acked(),
                        }),
                    )
                })
                .collect();
            json!({
                "connectionId": clip(&c.id, NODE_ID_LOG_MAX),
                "proxyId": clip(&c.proxy.id, NODE_ID_LOG_MAX),
                "clusterId": c.proxy.cluster_id,
                "types": types,
            })
        })
        .collect();
    Ok(Value::Array(rows))
}

fn registryz(state: &AdminState, _: &BTreeMap<String, String>) -> Answer {
    let snapshot = state.pipeline.snapshot().load();
    let sources = snapshot.services().sources();
    let services: Vec<Value> = snapshot
        .services()
        .all()
        .iter()
        .map(|s| {
            let mut v = to_json(&**s);
            v["sources"] = to_json(&sources.get(&s.key()).cloned().unwrap_or_default());
            v["creation_time"] = json!(humantime(s.creation_time));
            v
        })
        .collect();
    let registries: Vec<Value> = state
        .aggregate
        .registries()
        .iter()
        .map(|r| {
            json!({"registry": r.shard_key().to_string(), "provider": r.provider(), "cluster": r.cluster_id(),
                   "synced": r.has_synced(), "stale": r.is_stale(), "services": r.services().len()})
        })
        .collect();
    Ok(json!({
        "version": &**snapshot.version(),
        "registries": registries,
        "services": services,
        "conflicts": to_json(&snapshot.services().conflicts()),
        "workload_entries": crate::autoregistration::entry::debug_list(&state.config_stores),
    }))
}

fn endpoint_shardz(state: &AdminState, _: &BTreeMap<String, String>) -> Answer {
    let snapshot = state.pipeline.snapshot().load();
    let mut by_key: BTreeMap<String, Value> = BTreeMap::new();
    for (key, shards) in snapshot.endpoints().iter() {
        let per_shard: BTreeMap<String, Value> = shards
            .shards
            .iter()
            .map(|(k, eps)| (k.to_string(), to_json(&eps)))
            .collect();
        by_key.insert(
            key.to_string(),
            json!({"shards": per_shard, "serviceAccounts": shards.service_accounts}),
        );
    }
    Ok(to_json(&by_key))
}

fn configz(state: &AdminState, _: &BTreeMap<String, String>) -> Answer {
    let mut objects: Vec<Value> = Vec::new();
    let mut rejected: Vec<Value> = Vec::new();
    // Objects of kinds meshfed does not read (found in config files, not applied).
    let mut ignored: Vec<Value> = Vec::new();
    // Config sources with a connection of their own (`xds://`): where objects come from.
    let sources: Vec<Value> = state
        .config_stores
        .iter()
        .filter_map(|s| s.source_status())
        .collect();
    for store in &state.config_stores {
        ignored.extend(store.ignored().iter().map(to_json));
        for o in store.all() {
            objects.push(json!({
                "kind": o.kind.as_str(), "namespace": o.namespace, "name": o.name, "source": o.source,
                "spec": to_json(&o.spec),
            }));
        }
        rejected.extend(store.rejected().iter().map(to_json));
    }
    let key = |v: &Value| {
        (
            v["kind"].as_str().unwrap_or("").to_string(),
            v["namespace"].as_str().unwrap_or("").to_string(),
            v["name"].as_str().unwrap_or("").to_string(),
        )
    };
    objects.sort_by_key(key);
    rejected.sort_by_key(key);
    ignored.sort_by_key(key);
    // Security policies whose selector no endpoint carries (Istio's IST0127).
    let snapshot = state.pipeline.snapshot().load();
    let selecting_nothing = crate::generate::authn::policies_selecting_nothing(&snapshot);
    // Telemetry naming providers the mesh config does not define (Istio's analyzers).
    let unknown_providers = crate::generate::telemetry::provider_findings(&snapshot);
    // WorkloadEntries without an address whose network has no gateway: no client
    // reaches them.
    let all: Vec<_> = state.config_stores.iter().flat_map(|s| s.all()).collect();
    let unplaced =
        crate::networks::unplaced_workloads(all.iter().map(|o| &**o), snapshot.network_view());
    // Fields of Istio's API set in objects that meshfed does not act on.
    let unsupported: Vec<Value> = all
        .iter()
        .flat_map(|o| {
            o.spec.unsupported_fields().into_iter().map(move |w| {
                json!({"kind": o.kind.as_str(), "namespace": o.namespace, "name": o.name,
                       "source": o.source, "field": w.field.to_string(), "message": w.message})
            })
        })
        .collect();
    // The Gateway API objects' translation: the Istio objects generated, the status
    // computed, and its failures (routes that attach to nothing, refs not permitted).
    let gateway_api = {
        let translated = snapshot.config().gateway_api();
        let generated: Vec<Value> = translated
            .objects
            .iter()
            .map(|o| {
                json!({"kind": o.kind.as_str(), "namespace": o.namespace, "name": o.name,
                            "annotations": o.annotations, "spec": to_json(&o.spec)})
            })
            .collect();
        let problems: Vec<Value> = translated
            .status
            .iter()
            .flat_map(|s| {
                s.problems().into_iter().map(move |p| {
                    json!({"kind": s.kind.as_str(), "namespace": s.namespace, "name": s.name, "problem": p})
                })
            })
            .collect();
        json!({"generated": generated, "status": to_json(&translated.status), "problems": problems})
    };
    // The status of the EnvoyFilters the stores hold (patches are compiled and
    // applied when a proxy they select is generated for).
    let held: Vec<_> = all
        .iter()
        .filter_map(|o| match &o.spec {
            meshfed_registry::config::Spec::EnvoyFilter(ef) => {
                Some((o.namespace.clone(), o.name.clone(), ef))
            }
            _ => None,
        })
        .collect();
    let envoy_filters = crate::generate::envoyfilter::status::report_held(&held);
    Ok(json!({
        "objects": objects,
        "gatewayApi": gateway_api,
        "rejected": rejected,
        "ignored": ignored,
        "selectingNoWorkload": selecting_nothing,
        "telemetryProviders": unknown_providers,
        // EnvoyFilters by patch type: applied, matched nothing so far, rejected
        // patches; targetRefs selecting nothing served.
        "envoyFilters": envoy_filters,
        "unplacedWorkloads": unplaced,
        "unsupportedFields": unsupported,
        "configSources": sources,
    }))
}

fn clusterz(state: &AdminState, _: &BTreeMap<String, String>) -> Answer {
    let Some(controller) = &state.multicluster else {
        return Ok(json!({"clusters": [], "note": "multicluster is off (no Kubernetes registry)"}));
    };
    let mut clusters: Vec<Value> = controller.clusters().iter().map(to_json).collect();
    clusters.sort_by_key(|c| c["cluster"].as_str().unwrap_or("").to_string());
    Ok(
        json!({"namespace": controller.namespace(), "synced": controller.has_synced(), "clusters": clusters}),
    )
}

fn push_status(state: &AdminState, _: &BTreeMap<String, String>) -> Answer {
    let history: Vec<Value> = state
        .pipeline
        .history()
        .iter()
        .map(|r| {
            let mut v = to_json(r);
            v["at"] = json!(humantime(r.at));
            v
        })
        .collect();
    // What generating the current snapshot's resources dropped (Istio's ProxyStatus).
    let conflicts = to_json(&state.pipeline.snapshot().load().conflicts().all());
    Ok(json!({"connections": state.connections.len(), "pushes": history, "conflicts": conflicts}))
}

fn networkz(state: &AdminState, _: &BTreeMap<String, String>) -> Answer {
    let snapshot = state.pipeline.snapshot().load();
    let networks = &snapshot.mesh().networks;
    let view = crate::networks::NetworkView::new(networks, snapshot.gateways());
    let mut value = crate::networks::networkz(networks, &view);
    value["version"] = json!(&**snapshot.version());
    Ok(value)
}

fn cachez(state: &AdminState, _: &BTreeMap<String, String>) -> Answer {
    let snapshot = state.pipeline.snapshot().load();
    Ok(json!({"version": &**snapshot.version(), "cache": to_json(&snapshot.cache().stats())}))
}

/// Seconds since the epoch with millisecond precision (sortable, diffable).
fn humantime(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| (d.as_millis() as f64) / 1000.0)
        .unwrap_or(0.0)
}

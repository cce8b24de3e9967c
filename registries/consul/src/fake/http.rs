//! The HTTP side of the fake Consul: the accept loop, routing, blocking and Consul's
//! JSON shapes.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{CheckStatus, RecordedRequest, Registered, Shared, State};

/// Accepts connections until aborted; aborting drops every connection with it.
pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req| handle(shared.clone(), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_str(content_type).expect("static content types are valid"),
    );
    response
}

fn text(status: StatusCode, message: &str) -> Reply {
    reply(status, "text/plain; charset=utf-8", message.to_string())
}

fn json_reply(value: &Value, index: Option<u64>) -> Reply {
    let mut response = reply(
        StatusCode::OK,
        "application/json",
        serde_json::to_vec(value).expect("JSON values serialise"),
    );
    if let Some(index) = index {
        let headers = response.headers_mut();
        headers.insert("X-Consul-Index", HeaderValue::from(index));
        headers.insert("X-Consul-KnownLeader", HeaderValue::from_static("true"));
        headers.insert("X-Consul-LastContact", HeaderValue::from_static("0"));
    }
    response
}

/// Consul's duration format for `wait`: `10s`, `5m`, `100ms`; a bare number is
/// seconds.
fn parse_wait(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (number, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| s.split_at(i));
    let n: f64 = number.parse().ok()?;
    let seconds = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(seconds).ok()
}

fn query_of(req: &Request<Incoming>) -> BTreeMap<String, String> {
    let Some(q) = req.uri().query() else {
        return BTreeMap::new();
    };
    reqwest::Url::parse(&format!("http://fake/?{q}"))
        .map(|u| u.query_pairs().into_owned().collect())
        .unwrap_or_default()
}

fn token_of(req: &Request<Incoming>, query: &BTreeMap<String, String>) -> Option<String> {
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    header("X-Consul-Token")
        .or_else(|| {
            header(AUTHORIZATION.as_str())
                .and_then(|v| v.strip_prefix("Bearer ").map(str::to_string))
        })
        .or_else(|| query.get("token").cloned())
}

/// What a blocking request reads.
enum Resource {
    Catalog,
    Health(String),
}

/// Answers that do not depend on the resource: failures, ACLs, datacenter.
fn precheck(st: &State, request: &RecordedRequest) -> Option<Reply> {
    if let Some(status) = st.failing {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return Some(text(status, "rpc error making call: fake Consul failure"));
    }
    if let Some(required) = &st.token {
        match &request.token {
            None => {
                return Some(text(
                    StatusCode::FORBIDDEN,
                    "Permission denied: anonymous token lacks permission 'service:read'",
                ));
            }
            Some(t) if t != required => {
                return Some(text(StatusCode::FORBIDDEN, "ACL not found"));
            }
            Some(_) => {}
        }
    }
    if let Some(dc) = request.query.get("dc")
        && *dc != st.datacenter
    {
        return Some(text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "No path to datacenter",
        ));
    }
    None
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Reply, Infallible> {
    let query = query_of(&req);
    let request = RecordedRequest {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        token: token_of(&req, &query),
        token_header: req
            .headers()
            .get("X-Consul-Token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        query,
        at: Instant::now(),
    };
    shared.lock().requests.push(request.clone());
    if req.method() != Method::GET {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"));
    }
    let resource = match request.path.as_str() {
        "/v1/agent/self" => {
            let st = shared.lock();
            return Ok(precheck(&st, &request).unwrap_or_else(|| {
                json_reply(
                    &json!({
                        "Config": {
                            "Datacenter": st.datacenter,
                            "PrimaryDatacenter": st.datacenter,
                            "NodeName": st.node_name,
                            "NodeID": "6a1f2bbe-0000-4000-8000-000000000001",
                            "Server": true,
                            "Version": "1.20.0-fake",
                        },
                        "Member": {"Name": st.node_name, "Addr": "127.0.0.1", "Port": 8301, "Status": 1},
                        "Meta": {"consul-network-segment": ""},
                    }),
                    None,
                )
            }));
        }
        "/v1/catalog/datacenters" => {
            let st = shared.lock();
            return Ok(precheck(&st, &request)
                .unwrap_or_else(|| json_reply(&json!([st.datacenter]), None)));
        }
        "/v1/catalog/services" => Resource::Catalog,
        path => match path.strip_prefix("/v1/health/service/") {
            Some(name) if !name.is_empty() && !name.contains('/') => {
                Resource::Health(name.to_string())
            }
            _ => return Ok(text(StatusCode::NOT_FOUND, "")),
        },
    };
    Ok(blocking(&shared, &request, &resource).await)
}

/// Decrements the held-query gauge however the wait ends (the client may hang up).
struct Held<'a>(&'a Shared);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.lock().held -= 1;
    }
}

async fn blocking(shared: &Shared, request: &RecordedRequest, resource: &Resource) -> Reply {
    let requested = request.index().unwrap_or(0);
    let wait = request
        .wait()
        .and_then(parse_wait)
        .unwrap_or(Duration::from_secs(300))
        .min(Duration::from_secs(600));
    let deadline = request.at + wait;
    let abandon = shared.lock().abandon;
    loop {
        let mut changes = shared.changes.subscribe();
        {
            let st = shared.lock();
            if let Some(reply) = precheck(&st, request) {
                return reply;
            }
            let current = index_of(&st, resource);
            if requested == 0
                || current > requested
                || st.abandon != abandon
                || !st.blocking
                || Instant::now() >= deadline
            {
                return json_reply(&body_of(&st, resource, request), Some(current));
            }
        }
        shared.lock().held += 1;
        let _held = Held(shared);
        tokio::select! {
            _ = changes.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}

fn index_of(st: &State, resource: &Resource) -> u64 {
    let index = match resource {
        Resource::Catalog => st.services_index,
        Resource::Health(name) => st
            .service_index
            .get(name)
            .copied()
            .unwrap_or(st.services_index),
    };
    index.max(1)
}

fn body_of(st: &State, resource: &Resource, request: &RecordedRequest) -> Value {
    match resource {
        Resource::Catalog => {
            let mut services: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
            for r in st.instances.values() {
                services
                    .entry(&r.instance.service)
                    .or_default()
                    .extend(r.instance.tags.iter().map(String::as_str));
            }
            for name in st.raw.keys() {
                services.entry(name).or_default();
            }
            json!(services)
        }
        Resource::Health(name) => {
            let passing_only = request.query.contains_key("passing");
            let mut entries: Vec<(&str, &str, Value)> = st
                .instances
                .values()
                .filter(|r| r.instance.service == *name)
                .filter_map(|r| {
                    let entry = entry_of(st, r);
                    let all_passing = entry["Checks"]
                        .as_array()
                        .is_some_and(|c| c.iter().all(|c| c["Status"] == "passing"));
                    (!passing_only || all_passing).then_some((
                        r.instance.node.as_str(),
                        r.instance.id.as_str(),
                        entry,
                    ))
                })
                .collect();
            entries.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
            let mut out: Vec<Value> = entries.into_iter().map(|(_, _, e)| e).collect();
            if !passing_only {
                out.extend(st.raw.get(name).cloned().unwrap_or_default());
            }
            Value::Array(out)
        }
    }
}

fn entry_of(st: &State, r: &Registered) -> Value {
    let i = &r.instance;
    let node = st.nodes.get(&i.node);
    let node_address = node.map_or(i.node_address.as_str(), |n| n.address.as_str());
    let datacenter = node
        .and_then(|n| n.datacenter.clone())
        .unwrap_or_else(|| st.datacenter.clone());
    let serf = node.map_or(CheckStatus::Passing, |n| n.serf);
    json!({
        "Node": {
            "ID": "",
            "Node": i.node,
            "Address": node_address,
            "Datacenter": datacenter,
            "TaggedAddresses": {"lan": node_address, "wan": node_address},
            "Meta": {"consul-network-segment": ""},
            "CreateIndex": r.create_index,
            "ModifyIndex": r.create_index,
        },
        "Service": {
            "ID": i.id,
            "Service": i.service,
            "Tags": i.tags,
            "Address": i.address,
            "Meta": i.meta,
            "Port": i.port,
            "Weights": {"Passing": i.weight, "Warning": 1},
            "EnableTagOverride": false,
            "Proxy": {"Mode": "", "MeshGateway": {}, "Expose": {}},
            "Connect": {},
            "CreateIndex": r.create_index,
            "ModifyIndex": r.modify_index,
        },
        "Checks": [
            {
                "Node": i.node,
                "CheckID": "serfHealth",
                "Name": "Serf Health Status",
                "Status": serf.as_str(),
                "Notes": "",
                "Output": "Agent alive and reachable",
                "ServiceID": "",
                "ServiceName": "",
                "ServiceTags": [],
                "Type": "",
                "CreateIndex": r.create_index,
                "ModifyIndex": r.modify_index,
            },
            {
                "Node": i.node,
                "CheckID": format!("service:{}", i.id),
                "Name": format!("Service '{}' check", i.service),
                "Status": i.status.as_str(),
                "Notes": "",
                "Output": "",
                "ServiceID": i.id,
                "ServiceName": i.service,
                "ServiceTags": i.tags,
                "Type": "ttl",
                "CreateIndex": r.create_index,
                "ModifyIndex": r.modify_index,
            },
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_parse_like_consul() {
        assert_eq!(parse_wait("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_wait("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_wait("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_wait("7"), Some(Duration::from_secs(7)));
        assert_eq!(parse_wait("x"), None);
    }
}

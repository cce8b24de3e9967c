//! The HTTP side of the fake Nacos: the 1.x open API under `/nacos`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::{Recorded, Shared};

/// Accepts connections until aborted; aborting drops every connection with it.
pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                // As Nacos's Netty servers do: no Nagle delay on small answers.
                let _ = stream.set_nodelay(true);
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

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
}

fn json_reply(value: &Value) -> Reply {
    let mut r = reply(
        StatusCode::OK,
        serde_json::to_vec(value).expect("JSON serialises"),
    );
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn pairs(s: &str) -> BTreeMap<String, String> {
    reqwest::Url::parse(&format!("http://fake/?{s}"))
        .map(|u| u.query_pairs().into_owned().collect())
        .unwrap_or_default()
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Reply, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let raw_query = req.uri().query().unwrap_or_default().to_string();
    let query = pairs(&raw_query);
    // The credentials as Nacos reads them: the bearer header, else `accessToken`.
    let mut headers = BTreeMap::new();
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let token = header("authorization")
        .and_then(|v| v.strip_prefix("Bearer ").map(str::to_string))
        .or_else(|| header("accessToken"))
        .or_else(|| query.get("accessToken").cloned());
    if let Some(t) = token {
        headers.insert("accessToken".to_string(), t);
    }
    for name in ["ak", "data", "signature"] {
        if let Some(v) = header(name) {
            headers.insert(name.to_string(), v);
        }
    }
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut recorded = headers.clone();
    recorded.insert("?query".into(), raw_query);
    let Some(api) = path.strip_prefix("/nacos") else {
        return Ok(reply(StatusCode::NOT_FOUND, "not found"));
    };
    let mut st = shared.lock();
    st.requests.push(Recorded {
        transport: "http",
        what: api.to_string(),
        headers: recorded,
    });
    if (method.clone(), api) == (Method::POST, "/v1/auth/login") {
        let form = pairs(&String::from_utf8_lossy(&body));
        let given = |k: &str| form.get(k).or_else(|| query.get(k)).cloned();
        return Ok(
            match (st.login.clone(), given("username"), given("password")) {
                (Some((u, p)), Some(gu), Some(gp)) if u == gu && p == gp => {
                    let token = format!("token-{}", shared.next());
                    st.tokens.insert(token.clone());
                    json_reply(&json!({"accessToken": token, "tokenTtl": 18000,
                                   "globalAdmin": true, "username": u}))
                }
                _ => reply(StatusCode::FORBIDDEN, "unknown user!"),
            },
        );
    }
    if method != Method::GET {
        return Ok(reply(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"));
    }
    if let Err(message) = shared.authorize(&st, &headers) {
        return Ok(reply(StatusCode::FORBIDDEN, message));
    }
    let q = |k: &str| query.get(k).cloned().unwrap_or_default();
    let namespace = match q("namespaceId") {
        ns if ns.is_empty() => "public".to_string(),
        ns => ns,
    };
    let group = match q("groupName") {
        g if g.is_empty() => "DEFAULT_GROUP".to_string(),
        g => g,
    };
    Ok(match api {
        "/v1/ns/service/list" => {
            let names: Vec<String> = st
                .services
                .keys()
                .filter(|(n, g, _)| *n == namespace && *g == group)
                .map(|(_, _, name)| name.clone())
                .collect();
            let page_no: usize = q("pageNo").parse().unwrap_or(1).max(1);
            let size: usize = q("pageSize").parse().unwrap_or(10).max(1);
            let page: Vec<&String> = names.iter().skip((page_no - 1) * size).take(size).collect();
            json_reply(&json!({"count": names.len(), "doms": page}))
        }
        "/v1/ns/instance/list" => {
            let key = (namespace, group, q("serviceName"));
            json_reply(&shared.service_info(&st, &key, true))
        }
        _ => reply(StatusCode::NOT_FOUND, "not found"),
    })
}

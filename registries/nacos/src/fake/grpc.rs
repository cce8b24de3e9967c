//! The gRPC side of the fake Nacos: `Request/request` and
//! `BiRequestStream/requestBiStream` over HTTP/2, one connection id per TCP
//! connection (Nacos ties a connection's unary requests to its stream the same way).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::{Conn, Recorded, Shared};
use crate::wire::{Metadata, Payload};

/// A Payload of `kind` with JSON `body`, as the server writes it.
pub(super) fn payload(kind: &str, body: &Value) -> Payload {
    Payload {
        metadata: Some(Metadata {
            r#type: kind.to_string(),
            client_ip: String::new(),
            headers: BTreeMap::new(),
        }),
        body: Some(prost_types::Any {
            type_url: String::new(),
            value: serde_json::to_vec(body).expect("JSON serialises"),
        }),
    }
}

fn ok(extra: Value) -> Value {
    let mut body = json!({"resultCode": 200, "errorCode": 0, "message": null,
                          "requestId": null, "success": true});
    if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
        b.extend(extra);
    }
    body
}

fn fail(code: i64, message: &str) -> Value {
    json!({"resultCode": 500, "errorCode": code, "message": message,
           "requestId": null, "success": false})
}

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
                let conn_id = shared.next();
                connections.spawn(async move {
                    let for_service = shared.clone();
                    let service = hyper::service::service_fn(move |req| {
                        handle(for_service.clone(), conn_id, req)
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .http2_only()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                    shared.lock().conns.remove(&conn_id);
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

type Reply = http::Response<tonic::body::Body>;

async fn handle(
    shared: Arc<Shared>,
    conn_id: u64,
    req: http::Request<Incoming>,
) -> Result<Reply, Infallible> {
    let codec = tonic_prost::ProstCodec::<Payload, Payload>::default();
    let mut grpc = tonic::server::Grpc::new(codec);
    Ok(match req.uri().path() {
        "/Request/request" => grpc.unary(Unary { shared, conn_id }, req).await,
        "/BiRequestStream/requestBiStream" => grpc.streaming(Bi { shared, conn_id }, req).await,
        _ => tonic::Status::unimplemented("unknown method").into_http(),
    })
}

fn open(p: &Payload) -> (String, Value, BTreeMap<String, String>) {
    let meta = p.metadata.clone().unwrap_or_default();
    let body = p
        .body
        .as_ref()
        .and_then(|b| serde_json::from_slice(&b.value).ok())
        .unwrap_or(Value::Null);
    (meta.r#type, body, meta.headers)
}

struct Unary {
    shared: Arc<Shared>,
    conn_id: u64,
}

type UnaryFuture =
    Pin<Box<dyn Future<Output = Result<tonic::Response<Payload>, tonic::Status>> + Send>>;

impl tonic::server::UnaryService<Payload> for Unary {
    type Response = Payload;
    type Future = UnaryFuture;

    fn call(&mut self, request: tonic::Request<Payload>) -> Self::Future {
        let shared = self.shared.clone();
        let conn_id = self.conn_id;
        Box::pin(async move {
            let (kind, body, headers) = open(request.get_ref());
            let (answer_kind, answer) = answer(&shared, conn_id, &kind, &body, &headers);
            Ok(tonic::Response::new(payload(&answer_kind, &answer)))
        })
    }
}

fn response_kind(kind: &str) -> String {
    match kind {
        "SubscribeServiceRequest" => "SubscribeServiceResponse".into(),
        "ServiceListRequest" => "ServiceListResponse".into(),
        "HealthCheckRequest" => "HealthCheckResponse".into(),
        "ServerCheckRequest" => "ServerCheckResponse".into(),
        _ => "ErrorResponse".into(),
    }
}

fn answer(
    shared: &Shared,
    conn_id: u64,
    kind: &str,
    body: &Value,
    headers: &BTreeMap<String, String>,
) -> (String, Value) {
    let mut st = shared.lock();
    st.requests.push(Recorded {
        transport: "grpc",
        what: kind.to_string(),
        headers: headers.clone(),
    });
    if kind == "ServerCheckRequest" {
        return (
            response_kind(kind),
            ok(json!({"connectionId": format!("{conn_id}_127.0.0.1_0"),
                      "supportAbilityNegotiation": true})),
        );
    }
    if !st.conns.contains_key(&conn_id) {
        return (
            "ErrorResponse".into(),
            fail(301, "Connection is unregistered."),
        );
    }
    if let Err(message) = shared.authorize(&st, headers) {
        return (response_kind(kind), fail(403, &message));
    }
    let s = |k: &str| body[k].as_str().unwrap_or_default().to_string();
    match kind {
        "HealthCheckRequest" => (response_kind(kind), ok(json!({}))),
        "ServiceListRequest" => {
            let (ns, group) = (s("namespace"), s("groupName"));
            let names: Vec<String> = st
                .services
                .keys()
                .filter(|(n, g, _)| *n == ns && *g == group)
                .map(|(_, _, name)| name.clone())
                .collect();
            let page_no = body["pageNo"].as_u64().unwrap_or(1).max(1) as usize;
            let size = body["pageSize"].as_u64().unwrap_or(10).max(1) as usize;
            let page: Vec<&String> = names.iter().skip((page_no - 1) * size).take(size).collect();
            (
                response_kind(kind),
                ok(json!({"count": names.len(), "serviceNames": page})),
            )
        }
        "SubscribeServiceRequest" => {
            let key = (s("namespace"), s("groupName"), s("serviceName"));
            let subscribe = body["subscribe"].as_bool().unwrap_or(true);
            let info = shared.service_info(&st, &key, false);
            if let Some(conn) = st.conns.get_mut(&conn_id) {
                if subscribe {
                    conn.subscribed.insert(key.clone());
                } else {
                    conn.subscribed.remove(&key);
                }
            }
            if subscribe {
                // Nacos also pushes to a new subscriber.
                let push = json!({
                    "headers": {}, "requestId": shared.next().to_string(), "module": "naming",
                    "namespace": key.0, "serviceName": key.2, "groupName": key.1,
                    "serviceInfo": shared.service_info(&st, &key, false),
                });
                if let Some(conn) = st.conns.get(&conn_id) {
                    let _ = conn.out.send(Ok(payload("NotifySubscriberRequest", &push)));
                }
                st.pushes += 1;
            }
            (response_kind(kind), ok(json!({"serviceInfo": info})))
        }
        _ => (
            "ErrorResponse".into(),
            fail(302, "RequestHandler Not Found"),
        ),
    }
}

struct Bi {
    shared: Arc<Shared>,
    conn_id: u64,
}

type BiStream = UnboundedReceiverStream<Result<Payload, tonic::Status>>;
type BiFuture =
    Pin<Box<dyn Future<Output = Result<tonic::Response<BiStream>, tonic::Status>> + Send>>;

impl tonic::server::StreamingService<Payload> for Bi {
    type Response = Payload;
    type ResponseStream = BiStream;
    type Future = BiFuture;

    fn call(&mut self, request: tonic::Request<tonic::Streaming<Payload>>) -> Self::Future {
        let shared = self.shared.clone();
        let conn_id = self.conn_id;
        Box::pin(async move {
            let (out, rx) = mpsc::unbounded_channel();
            let mut inbound = request.into_inner();
            tokio::spawn(async move {
                while let Some(Ok(p)) = inbound.next().await {
                    let (kind, _body, headers) = open(&p);
                    let mut st = shared.lock();
                    st.requests.push(Recorded {
                        transport: "grpc",
                        what: kind.clone(),
                        headers,
                    });
                    match kind.as_str() {
                        "ConnectionSetupRequest" => {
                            st.conns.insert(
                                conn_id,
                                Conn {
                                    out: out.clone(),
                                    subscribed: Default::default(),
                                },
                            );
                            let ack = json!({"headers": {}, "requestId": shared.next().to_string(),
                                             "module": "internal", "abilityTable": {}});
                            let _ = out.send(Ok(payload("SetupAckRequest", &ack)));
                        }
                        "NotifySubscriberResponse" => st.pushes_acked += 1,
                        "ConnectResetResponse" => {
                            // The client goes to reconnect: this connection is done.
                            st.conns.remove(&conn_id);
                        }
                        _ => {}
                    }
                }
                shared.lock().conns.remove(&conn_id);
            });
            Ok(tonic::Response::new(UnboundedReceiverStream::new(rx)))
        })
    }
}

//! One Nacos 2.x gRPC session, as Nacos's own clients run it:
//!
//! 1. `ServerCheckRequest` on `Request/request` (port = HTTP port + offset) answers
//!    `ServerCheckResponse` with the connection id;
//! 2. `BiRequestStream/requestBiStream` is opened on the same HTTP/2 connection with a
//!    `ConnectionSetupRequest` (client version, labels `source: sdk`, `module:
//!    naming`); a server that negotiates abilities answers `SetupAckRequest` once
//!    the connection is registered (older ones are given a moment, as the Java client
//!    does);
//! 3. `ServiceListRequest` pages list each namespace and group, and every service is
//!    subscribed (`SubscribeServiceRequest`, `subscribe: true`); its answer carries
//!    the instances, and later changes come as `NotifySubscriberRequest` pushes on the
//!    stream, each answered `NotifySubscriberResponse`;
//! 4. the server's `ClientDetectionRequest` is answered `ClientDetectionResponse`, a
//!    `ConnectResetRequest` ends the session (to reconnect), and a
//!    `HealthCheckRequest` is sent every keepalive interval;
//! 5. the lists are read again every refresh interval, new services subscribed and
//!    removed ones unsubscribed.
//!
//! A session ends only with an error (the stream or a request failed); the driver
//! reconnects, subscribing everything again.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt, stream};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, info};

use crate::api::ApiError;
use crate::convert::ServiceName;
use crate::driver::{Driven, Shared, list_catalog};
use crate::registry::ActiveTransport;
use crate::wire::{self, Payload, ServiceInfo};

/// How a session ended.
#[derive(Debug)]
pub(crate) enum SessionEnd {
    /// No session could be set up (no gRPC server there): the caller may fall back.
    Unavailable(ApiError),
    /// It ran and then failed.
    Failed(ApiError),
    /// The server asked the client to reconnect (`ConnectResetRequest`, Nacos moving
    /// clients between its servers): not a failure.
    Reset,
}

/// The version sent in `ConnectionSetupRequest`.
const CLIENT_VERSION: &str = concat!("meshfed-nacos:v", env!("CARGO_PKG_VERSION"));

/// The gRPC address of an HTTP base URL: its host, port + offset.
pub(crate) fn grpc_address(server: &str, offset: u16) -> Result<(String, u16), ApiError> {
    let url = reqwest::Url::parse(server).map_err(|e| ApiError::Transport(e.to_string()))?;
    let host = url.host_str().unwrap_or_default().to_string();
    let port = url.port_or_known_default().unwrap_or(8848);
    let grpc = port
        .checked_add(offset)
        .ok_or_else(|| ApiError::Transport(format!("gRPC port {port} + {offset} is past 65535")))?;
    Ok((host, grpc))
}

/// The address this host would use to reach `host:port` (no packet is sent), for
/// `Metadata.clientIp`.
async fn local_ip(host: &str, port: u16) -> String {
    async {
        let socket = tokio::net::UdpSocket::bind("0.0.0.0:0").await.ok()?;
        socket.connect((host, port)).await.ok()?;
        Some(socket.local_addr().ok()?.ip().to_string())
    }
    .await
    .unwrap_or_default()
}

/// An open connection: the unary client and what the stream reader reports.
struct Connection {
    grpc: tonic::client::Grpc<Channel>,
    client_ip: String,
    shared: Arc<Shared>,
}

impl Connection {
    /// One request on `Request/request`.
    async fn call(
        &self,
        kind: &str,
        resource: Option<(&str, &str)>,
        body: Value,
    ) -> Result<Value, ApiError> {
        let headers = self.shared.auth.headers(resource);
        let payload = wire::payload(kind, &self.client_ip, headers, &body);
        let mut grpc = self.grpc.clone();
        let codec = tonic_prost::ProstCodec::<Payload, Payload>::default();
        let call = async {
            grpc.ready()
                .await
                .map_err(|e| ApiError::Transport(e.to_string()))?;
            grpc.unary(
                tonic::Request::new(payload),
                PathAndQuery::from_static(wire::REQUEST_PATH),
                codec,
            )
            .await
            .map_err(|s| ApiError::Transport(format!("{kind}: {}", s.message())))
        };
        let answer = tokio::time::timeout(self.shared.config.request_timeout, call)
            .await
            .map_err(|_| ApiError::Transport(format!("{kind}: no answer in time")))??
            .into_inner();
        let (answer_kind, value) = wire::open(&answer).map_err(ApiError::Decode)?;
        if let Some((code, message)) = wire::failure(&answer_kind, &value) {
            return Err(ApiError::answer(code, kind, &message));
        }
        self.shared.stats.count_answer();
        Ok(value)
    }

    async fn list_page(
        &self,
        (namespace, group): (&str, &str),
        page_no: u32,
    ) -> Result<(u64, Vec<String>), ApiError> {
        let body = wire::request(
            "naming",
            None,
            json!({"namespace": namespace, "serviceName": "", "groupName": group,
                   "pageNo": page_no, "pageSize": self.shared.config.page_size,
                   "selector": ""}),
        );
        let value = self.call("ServiceListRequest", None, body).await?;
        let names = value["serviceNames"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|n| n.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        Ok((value["count"].as_u64().unwrap_or(0), names))
    }

    async fn subscribe(&self, name: &ServiceName, subscribe: bool) -> Result<Value, ApiError> {
        let body = wire::request(
            "naming",
            None,
            json!({"namespace": name.namespace, "serviceName": name.name,
                   "groupName": name.group, "subscribe": subscribe, "clusters": ""}),
        );
        self.call(
            "SubscribeServiceRequest",
            Some((&name.group, &name.name)),
            body,
        )
        .await
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

type PayloadStream = Pin<Box<dyn futures::Stream<Item = Result<Payload, tonic::Status>> + Send>>;

/// Runs one session against `server` until it fails.
pub(crate) async fn session(shared: &Arc<Shared>, server: &str, driven: &Driven) -> SessionEnd {
    let Opened {
        connection,
        mut ended,
        setup,
        reader,
    } = match connect(shared, server, driven).await {
        Ok(opened) => opened,
        Err(e) => return SessionEnd::Unavailable(e),
    };
    // The reader holds the stream (and so the connection) open: it goes with the
    // session, whichever way the session ends.
    let _reader = AbortOnDrop(reader);
    // Wait until the server registered the connection (requests before that are
    // refused as unregistered).
    let registered = tokio::select! {
        r = setup => r.ok(),
        _ = tokio::time::sleep(shared.config.request_timeout) => None,
    };
    if registered.is_none() {
        return SessionEnd::Unavailable(ApiError::Transport(
            "the server did not acknowledge the connection setup".into(),
        ));
    }
    driven.transport(ActiveTransport::Grpc);
    let mut subscribed: BTreeSet<ServiceName> = BTreeSet::new();
    let mut keepalive = tokio::time::interval(shared.config.keepalive_interval);
    keepalive.tick().await;
    loop {
        if let Err(e) = refresh(&connection, &mut subscribed, driven).await {
            return SessionEnd::Failed(e);
        }
        driven.fresh();
        let next = tokio::time::Instant::now() + shared.config.refresh_interval;
        loop {
            tokio::select! {
                reason = &mut ended => {
                    return match reason {
                        Ok(None) => SessionEnd::Reset,
                        Ok(Some(e)) => SessionEnd::Failed(e),
                        Err(_) => SessionEnd::Failed(ApiError::Transport(
                            "the stream reader stopped".into(),
                        )),
                    };
                }
                _ = tokio::time::sleep_until(next) => break,
                _ = keepalive.tick() => {
                    let body = wire::request("internal", None, json!({}));
                    if let Err(e) = connection.call("HealthCheckRequest", None, body).await {
                        return SessionEnd::Failed(e);
                    }
                }
            }
        }
    }
}

/// Lists the services, reports them, subscribes the new ones and unsubscribes the
/// removed ones.
async fn refresh(
    connection: &Connection,
    subscribed: &mut BTreeSet<ServiceName>,
    driven: &Driven,
) -> Result<(), ApiError> {
    let shared = &connection.shared;
    let catalog = list_catalog(&shared.config, &driven.namespace, |ns_group, page| {
        connection.list_page(ns_group, page)
    })
    .await?;
    driven.catalog(catalog.clone());
    for gone in subscribed.difference(&catalog).cloned().collect::<Vec<_>>() {
        debug!(service = %gone, "nacos: unsubscribing");
        connection.subscribe(&gone, false).await?;
        subscribed.remove(&gone);
    }
    let new: Vec<ServiceName> = catalog
        .iter()
        .filter(|n| !subscribed.contains(*n) && driven.wanted(n))
        .cloned()
        .collect();
    let answers = stream::iter(new.into_iter().map(|name| async move {
        let value = connection.subscribe(&name, true).await?;
        Ok::<_, ApiError>((name, value))
    }))
    .buffer_unordered(shared.config.max_concurrent_requests);
    let mut answers = std::pin::pin!(answers);
    while let Some((name, value)) = answers.try_next().await? {
        match ServiceInfo::parse(&value["serviceInfo"]) {
            Ok(info) => driven.instances(name.clone(), info),
            Err(e) => {
                return Err(ApiError::Decode(format!(
                    "the subscription answer for {name}: {e}"
                )));
            }
        }
        subscribed.insert(name);
    }
    Ok(())
}

/// A connection set up: the unary client, the stream's end, the server's setup
/// acknowledgement and the stream reader task.
struct Opened {
    connection: Connection,
    ended: oneshot::Receiver<Option<ApiError>>,
    setup: Pin<Box<dyn Future<Output = Result<(), watch::error::RecvError>> + Send>>,
    reader: tokio::task::JoinHandle<()>,
}

/// Connects, checks the server and opens the stream.
async fn connect(shared: &Arc<Shared>, server: &str, driven: &Driven) -> Result<Opened, ApiError> {
    shared.auth.ensure(&shared.http, server).await?;
    let (host, port) = grpc_address(server, shared.config.grpc_port_offset)?;
    let endpoint = Endpoint::from_shared(format!("http://{host}:{port}"))
        .map_err(|e| ApiError::Transport(e.to_string()))?
        .connect_timeout(shared.config.request_timeout)
        .tcp_nodelay(true);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| ApiError::Transport(format!("gRPC {host}:{port}: {e}")))?;
    let connection = Connection {
        grpc: tonic::client::Grpc::new(channel),
        client_ip: local_ip(&host, port).await,
        shared: shared.clone(),
    };
    let check = connection
        .call(
            "ServerCheckRequest",
            None,
            wire::request("internal", None, json!({})),
        )
        .await?;
    let connection_id = check["connectionId"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let negotiates = check["supportAbilityNegotiation"]
        .as_bool()
        .unwrap_or(false);
    info!(server = %format!("{host}:{port}"), connection_id, "nacos: gRPC connection checked");

    let (out_tx, out_rx) = mpsc::channel::<Payload>(1024);
    let labels = json!({"source": "sdk", "module": "naming"});
    let namespace = driven.namespace.clone();
    let setup = wire::request(
        "internal",
        None,
        json!({"clientVersion": CLIENT_VERSION, "abilityTable": {}, "tenant": namespace,
               "labels": labels}),
    );
    out_tx
        .send(wire::payload(
            "ConnectionSetupRequest",
            &connection.client_ip,
            shared.auth.headers(None),
            &setup,
        ))
        .await
        .map_err(|_| ApiError::Transport("the stream closed".into()))?;
    let mut grpc = connection.grpc.clone();
    let codec = tonic_prost::ProstCodec::<Payload, Payload>::default();
    let open = async move {
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        grpc.streaming(
            tonic::Request::new(ReceiverStream::new(out_rx)),
            PathAndQuery::from_static(wire::BI_STREAM_PATH),
            codec,
        )
        .await
    };
    // The server may send nothing (so no response headers) until it has something to
    // say: the stream is opened inside the reader, never awaited here.
    let inbound: PayloadStream = stream::once(open)
        .map(|r| match r {
            Ok(response) => response.into_inner().boxed(),
            Err(status) => stream::once(async move { Err(status) }).boxed(),
        })
        .flatten()
        .boxed();
    let (acked_tx, mut acked_rx) = watch::channel(false);
    let (end_tx, end_rx) = oneshot::channel();
    let reader = tokio::spawn(read_stream(
        inbound,
        out_tx,
        connection.client_ip.clone(),
        driven.clone(),
        acked_tx,
        end_tx,
    ));
    let setup: Pin<Box<dyn Future<Output = _> + Send>> = if negotiates {
        Box::pin(async move { acked_rx.wait_for(|a| *a).await.map(|_| ()) })
    } else {
        // Servers before ability negotiation register the connection as the setup
        // request arrives; the Java client gives them 100ms.
        Box::pin(async {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            Ok(())
        })
    };
    Ok(Opened {
        connection,
        ended: end_rx,
        setup,
        reader,
    })
}

/// Reads the server's requests until the stream ends, answering each as Nacos clients
/// do; the reason it ended goes to `end` (`None`: the server asked to reconnect).
async fn read_stream(
    mut inbound: PayloadStream,
    out: mpsc::Sender<Payload>,
    client_ip: String,
    driven: Driven,
    acked: watch::Sender<bool>,
    end: oneshot::Sender<Option<ApiError>>,
) {
    let reply = |kind: &str, request_id: &str| {
        wire::payload(
            kind,
            &client_ip,
            BTreeMap::new(),
            &wire::response(request_id),
        )
    };
    let reason = loop {
        let payload = tokio::select! {
            p = inbound.next() => p,
            _ = out.closed() => break Some(ApiError::Transport("the session ended".into())),
        };
        let payload = match payload {
            Some(Ok(p)) => p,
            Some(Err(status)) => {
                break Some(ApiError::Transport(format!(
                    "the stream failed: {}",
                    status.message()
                )));
            }
            None => break Some(ApiError::Transport("the server closed the stream".into())),
        };
        let (kind, body) = match wire::open(&payload) {
            Ok(x) => x,
            Err(e) => {
                debug!("nacos: ignoring a server message: {e}");
                continue;
            }
        };
        let request_id = body["requestId"].as_str().unwrap_or_default().to_string();
        let answer = match kind.as_str() {
            "NotifySubscriberRequest" => {
                driven.push(&body);
                Some("NotifySubscriberResponse")
            }
            "ClientDetectionRequest" => Some("ClientDetectionResponse"),
            "SetupAckRequest" => {
                acked.send_replace(true);
                None
            }
            "ConnectResetRequest" => {
                let _ = out.send(reply("ConnectResetResponse", &request_id)).await;
                // Let the answer leave before the connection is dropped: the stream
                // takes it off the queue, then a moment for the write.
                let drained = async {
                    while out.capacity() < out.max_capacity() {
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                };
                let _ = tokio::time::timeout(std::time::Duration::from_secs(1), drained).await;
                break None;
            }
            other => {
                debug!(kind = other, "nacos: no handler for a server request");
                None
            }
        };
        if let Some(kind) = answer
            && out.send(reply(kind, &request_id)).await.is_err()
        {
            break Some(ApiError::Transport("the session ended".into()));
        }
    };
    let _ = end.send(reason);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_port_is_the_http_port_plus_the_offset() {
        assert_eq!(
            grpc_address("http://10.0.0.1:8848/nacos", 1000).unwrap(),
            ("10.0.0.1".to_string(), 9848)
        );
        assert!(grpc_address("http://h:65000/nacos", 1000).is_err());
    }
}

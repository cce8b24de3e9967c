//! Clients that do not play by the rules: peers that never read, streams of broken
//! frames, connections that hold memory or descriptors. Each may only hurt itself.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use futures::StreamExt;
use meshfed::ads::TypeUrl;
use meshfed::testing::{AdsClient, FakeServer, node};
use meshfed_registry::Protocol;
use prost::Message;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::cli::Killed;
use crate::support::{self, discovery_args, http_get, service, wait_for_ready_file};

const SOTW: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// An HTTP/2 connection without gRPC on top: frames are written as given.
struct RawConnection {
    client: h2::client::SendRequest<Bytes>,
    driver: JoinHandle<Result<(), h2::Error>>,
}

impl RawConnection {
    /// Connects with the given initial stream window (0: the server may send nothing).
    async fn open(addr: SocketAddr, window: u32) -> RawConnection {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (client, connection) = h2::client::Builder::new()
            .initial_window_size(window)
            .handshake(tcp)
            .await
            .unwrap();
        RawConnection {
            client,
            driver: tokio::spawn(connection),
        }
    }

    /// Starts an ADS stream and writes `bytes` on it (the stream stays open unless
    /// `end`).
    async fn start(
        &mut self,
        bytes: Vec<u8>,
        end: bool,
    ) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("http://127.0.0.1{SOTW}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let mut client = self.client.clone().ready().await.unwrap();
        let (response, mut send) = client.send_request(request, false).unwrap();
        send.reserve_capacity(bytes.len());
        send.send_data(Bytes::from(bytes), end).unwrap();
        (response, send)
    }
}

/// The gRPC status a stream ended with (trailers, or headers of a trailers-only
/// response), and its message.
async fn status_of(response: h2::client::ResponseFuture) -> (String, String) {
    let response = tokio::time::timeout(Duration::from_secs(30), response)
        .await
        .expect("no response")
        .unwrap();
    let header = |map: &http::HeaderMap, key: &str| {
        map.get(key)
            .map(|v| v.to_str().unwrap_or_default().to_string())
    };
    if let Some(code) = header(response.headers(), "grpc-status") {
        let message = header(response.headers(), "grpc-message").unwrap_or_default();
        return (code, percent_decoded(&message));
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.unwrap().expect("trailers");
    (
        header(&trailers, "grpc-status").unwrap(),
        percent_decoded(&header(&trailers, "grpc-message").unwrap_or_default()),
    )
}

/// `grpc-message` is percent-encoded on the wire.
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One gRPC message frame.
fn frame(flag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![flag];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

fn cds_request(id: &str) -> Vec<u8> {
    DiscoveryRequest {
        node: Some(node(id)),
        type_url: TypeUrl::Cluster.as_str().into(),
        ..Default::default()
    }
    .encode_to_vec()
}

async fn metric(server: &FakeServer, sample: &str) -> f64 {
    let (_, text) = http_get(server.bound().monitoring, "/metrics").await;
    support::metric(&text, sample).unwrap_or(0.0)
}

async fn server_with(f: impl FnOnce(&mut meshfed::app::DiscoveryConfig)) -> FakeServer {
    let server = FakeServer::builder().configure(f).start().await.unwrap();
    server.sync().await;
    server
}

#[tokio::test]
async fn protocol_errors_end_the_stream_with_their_status_and_a_metric() {
    let server = server_with(|_| {}).await;
    let mut conn = RawConnection::open(server.grpc_addr(), 65_535).await;

    // Not a DiscoveryRequest: a length-delimited field that runs past the end.
    let (response, _send) = conn.start(frame(0, &[0x0a, 9, b'x']), true).await;
    let (code, message) = status_of(response).await;
    assert_eq!(code, "3", "INVALID_ARGUMENT: {message}");
    assert!(message.contains("malformed request message"), "{message}");

    // A node id that is not UTF-8 (node = field 2, id = field 1).
    let (response, _send) = conn
        .start(frame(0, &[0x12, 4, 0x0a, 2, 0xff, 0xfe]), true)
        .await;
    assert_eq!(status_of(response).await.0, "3");

    // Compressed: the gRPC flag byte is 1.
    let (response, _send) = conn.start(frame(1, &cds_request("x")), true).await;
    assert_eq!(status_of(response).await.0, "12", "UNIMPLEMENTED");

    // Oversize: a claimed length over 4 MiB is refused before its bytes arrive.
    let mut oversize = vec![0u8];
    oversize.extend_from_slice(&(5u32 << 20).to_be_bytes());
    let (response, _send) = conn.start(oversize, false).await;
    assert_eq!(status_of(response).await.0, "8", "RESOURCE_EXHAUSTED");

    // A node id of a megabyte.
    let long = format!(
        "sidecar~10.0.0.1~{}~ns.svc.cluster.local",
        "x".repeat(1 << 20)
    );
    let (response, _send) = conn.start(frame(0, &cds_request(&long)), true).await;
    let (code, message) = status_of(response).await;
    assert_eq!(code, "3");
    assert!(message.len() < 200, "the id is not echoed back");

    // The stream ends inside a message.
    let mut truncated = frame(
        0,
        &cds_request("sidecar~10.0.0.1~a.ns~ns.svc.cluster.local"),
    );
    truncated.truncate(truncated.len() - 3);
    let (response, _send) = conn.start(truncated, true).await;
    assert_eq!(status_of(response).await.0, "3");

    let errors = |reason: &'static str| {
        let server = &server;
        async move {
            metric(
                server,
                &format!("meshfed_xds_request_errors_total{{reason=\"{reason}\"}}"),
            )
            .await
        }
    };
    assert_eq!(errors("malformed").await, 2.0);
    assert_eq!(errors("compressed").await, 1.0);
    assert_eq!(errors("oversize").await, 1.0);
    assert_eq!(errors("bad_node").await, 1.0);
    assert_eq!(errors("truncated").await, 1.0);
    server.shutdown().await;
}

#[tokio::test]
async fn half_sent_messages_on_one_connection_hold_at_most_its_budget() {
    let server = server_with(|_| {}).await;
    let mut conn = RawConnection::open(server.grpc_addr(), 65_535).await;
    // Ten streams, each claiming 4 MiB and sending 2 MiB of it: 20 MiB against the
    // default budget of 16 MiB. The streams past the budget are refused; none of
    // them reserved its claimed length.
    let mut head = vec![0u8];
    head.extend_from_slice(&((4u32 << 20) - 16).to_be_bytes());
    head.extend(std::iter::repeat_n(0x0a, 2 << 20));
    let mut sends = Vec::new();
    let mut pending = futures::stream::FuturesUnordered::new();
    for _ in 0..10 {
        let (response, send) = conn.start(head.clone(), false).await;
        sends.push(send);
        pending.push(status_of(response));
    }
    // At most eight streams' 2 MiB fit in 16 MiB, so at least two are refused while
    // every stream is still open; only those can finish now.
    let mut refused = 0;
    let check_refused = |(code, message): (String, String)| {
        assert_eq!(code, "8", "{message}");
        assert!(message.contains("--maxConnectionRequestBytes"), "{message}");
    };
    for _ in 0..2 {
        check_refused(pending.next().await.unwrap());
        refused += 1;
    }
    // Ending the rest makes them finish: truncated, or refused if they were too.
    for send in &mut sends {
        // Refused streams are already closed; ending them again fails, harmlessly.
        let _ = send.send_data(Bytes::new(), true);
    }
    while let Some((code, message)) = pending.next().await {
        if code == "8" {
            check_refused((code, message));
            refused += 1;
        } else {
            assert_eq!(code, "3", "{message}");
        }
    }
    assert!(refused >= 2, "{refused} streams refused");
    assert_eq!(
        metric(
            &server,
            "meshfed_xds_request_errors_total{reason=\"buffer_limit\"}"
        )
        .await,
        refused as f64
    );
    server.shutdown().await;
}

/// Adds a service to the mock registry and waits until it is in the snapshot.
async fn add_service(server: &FakeServer, reg: &meshfed_registry::MemoryRegistry, i: usize) {
    reg.add_service(service(
        &format!("svc-{i}.default.svc.cluster.local"),
        "default",
        &[("http", 80, Protocol::Http)],
    ));
    server.sync().await;
}

#[tokio::test]
async fn proxies_that_never_read_do_not_hold_back_the_rest_of_the_mesh() {
    // The probe's scenario: 120 stuck clients, more than the 100 push slots, and no
    // send timeout, so only the slot rule keeps the mesh moving.
    let server = server_with(|c| {
        assert_eq!(c.push_throttle, 100);
        c.xds_limits.send_timeout = None;
    })
    .await;
    let reg = server.mock_registry("Kubernetes");
    add_service(&server, &reg, 0).await;
    let mut stuck = Vec::new();
    for i in 0..120 {
        // A window of 0: the server can send this client nothing at all.
        let mut conn = RawConnection::open(server.grpc_addr(), 0).await;
        let id = format!(
            "sidecar~10.0.{}.{}~stuck-{i}.default~default.svc.cluster.local",
            1 + i / 100,
            i % 100
        );
        let stream = conn.start(frame(0, &cds_request(&id)), false).await;
        stuck.push((conn, stream));
    }
    let mut healthy = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.0.0.9~ok.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    healthy.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    healthy.recv_clusters().await.unwrap();
    // Each change queues one more response on every stuck stream; after a handful
    // their queues are full and their tasks wait on them for ever.
    for i in 1..=8 {
        add_service(&server, &reg, i).await;
        let clusters = healthy.recv_clusters().await.unwrap();
        assert!(
            clusters
                .iter()
                .any(|c| c.name == format!("outbound|80||svc-{i}.default.svc.cluster.local")),
            "change {i} reached the healthy proxy"
        );
    }
    drop(stuck);
    server.shutdown().await;
}

#[tokio::test]
async fn a_proxy_that_takes_no_response_within_the_send_timeout_is_disconnected() {
    let server = server_with(|c| {
        c.xds_limits.send_timeout = Some(Duration::from_millis(200));
    })
    .await;
    let reg = server.mock_registry("Kubernetes");
    let mut conn = RawConnection::open(server.grpc_addr(), 0).await;
    let id = "sidecar~10.0.1.1~stuck.default~default.svc.cluster.local";
    let _stream = conn.start(frame(0, &cds_request(id)), false).await;
    // Changes until the stuck stream's queue is full and a send waits out the
    // timeout: the server then closes the whole connection.
    let mut i = 0;
    let closed = async {
        loop {
            i += 1;
            add_service(&server, &reg, i).await;
            if conn.driver.is_finished() {
                break;
            }
            tokio::task::yield_now().await;
            if metric(&server, "meshfed_xds_send_timeouts_total").await >= 1.0 {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), closed)
        .await
        .expect("the stuck connection was closed");
    tokio::time::timeout(Duration::from_secs(30), &mut conn.driver)
        .await
        .expect("the server closed the connection")
        .unwrap()
        .ok();
    assert_eq!(
        metric(&server, "meshfed_xds_send_timeouts_total").await,
        1.0
    );
    server.shutdown().await;
}

#[tokio::test]
async fn out_of_descriptors_the_server_backs_off_and_recovers() {
    // A process allowed 48 descriptors (soft and hard, so nothing can be raised),
    // offered 80 connections that never open a stream.
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready.json");
    let mut child = Killed(
        std::process::Command::new("sh")
            .arg("-c")
            .arg("ulimit -n 48 && exec \"$@\"")
            .arg("sh")
            .arg(env!("CARGO_BIN_EXE_meshfed"))
            .args(discovery_args(&ready, &["--handshakeTimeout", "1s"]))
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let json = wait_for_ready_file(&mut child.0, &ready).await;
    let addr = |key: &str| -> SocketAddr { json[key].as_str().unwrap().parse().unwrap() };
    let (grpc, monitoring) = (addr("grpcAddr"), addr("monitoringAddr"));
    let mut idle = Vec::new();
    for _ in 0..80 {
        idle.push(TcpStream::connect(grpc).await.unwrap());
    }
    // The server takes what it can, fails the rest with EMFILE and waits; the
    // handshake timeout frees descriptors and the rest are taken in turn. Then a real
    // proxy is served.
    let client = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let id = "sidecar~10.0.0.9~ok.default~default.svc.cluster.local";
            if let Ok(Ok(mut client)) =
                tokio::time::timeout(Duration::from_secs(5), AdsClient::connect(grpc, node(id)))
                    .await
                && client.subscribe(TypeUrl::Cluster, &[]).await.is_ok()
                && let Ok(clusters) = client.recv_clusters().await
            {
                break (client, clusters);
            }
        }
    })
    .await
    .expect("a proxy is served once the idle connections are gone");
    assert!(!client.1.is_empty());
    drop(idle);
    let (_, text) = http_get(monitoring, "/metrics").await;
    let errors = support::metric(&text, "meshfed_xds_accept_errors_total").unwrap();
    let timeouts = support::metric(&text, "meshfed_xds_handshake_timeouts_total").unwrap();
    // Spinning on the listener would count an error per wake-up: thousands a second.
    assert!(
        (1.0..100.0).contains(&errors),
        "{errors} accept errors: the accept loop backs off"
    );
    assert!(timeouts >= 1.0, "{timeouts}");
}

#[tokio::test]
async fn a_device_as_the_mock_file_is_refused_and_sigterm_ends_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready.json");
    let mut child = Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
            .args(discovery_args(&ready, &["--mockRegistryFile", "/dev/zero"]))
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_ready_file(&mut child.0, &ready).await;
    // The log, line by line, as the process writes it: the refusal is awaited before
    // SIGTERM (readiness does not wait for a mock file that cannot be read).
    let stdout = child.0.stdout.take().unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log = String::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.recv().await {
            log.push_str(&line);
            log.push('\n');
            if line.contains("/dev/zero") && line.contains("not a regular file") {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the device was not refused:\n{log}"));
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    // The drain deadline is 5 s; the process must be gone well within the bound.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = child.0.try_wait().unwrap() {
            break exit;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still running after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    reader.join().unwrap();
    while let Ok(line) = lines.try_recv() {
        log.push_str(&line);
        log.push('\n');
    }
    // SIGTERM right after start-up drains and exits 0 (not killed by the signal).
    assert!(exit.success(), "{exit:?}\n{log}");
    assert!(log.contains("meshfed stopped"), "{log}");
}

#[tokio::test]
async fn only_connections_without_a_call_are_cut_at_the_handshake_deadline() {
    let server = server_with(|c| {
        c.xds_limits.handshake_timeout = Some(Duration::from_millis(300));
    })
    .await;
    let reg = server.mock_registry("Kubernetes");
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.0.0.9~ok.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    client.recv_clusters().await.unwrap();
    // A connection that never makes a call, opened after the client's: once it has
    // been cut, the client's own deadline has passed too.
    let idle = TcpStream::connect(server.grpc_addr()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut buf = [0u8; 64];
        loop {
            idle.readable().await.unwrap();
            match idle.try_read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => break,
            }
        }
    })
    .await
    .expect("the idle connection is closed");
    assert_eq!(
        metric(&server, "meshfed_xds_handshake_timeouts_total").await,
        1.0
    );
    add_service(&server, &reg, 1).await;
    // The stream still gets pushes (an earlier one may come first).
    let mut pushed = false;
    for _ in 0..3 {
        let clusters = client.recv_clusters().await.unwrap();
        if clusters
            .iter()
            .any(|c| c.name == "outbound|80||svc-1.default.svc.cluster.local")
        {
            pushed = true;
            break;
        }
    }
    assert!(pushed, "the new service reached the client");
    server.shutdown().await;
}

#[tokio::test]
async fn create_certificate_on_the_plaintext_port_is_refused_with_a_metric() {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let server = server_with(|c| {
        c.ca = Some(meshfed::app::CaSource::Dir {
            cacerts: None,
            self_signed_dir: ca_dir.clone(),
        });
    })
    .await;
    assert!(
        ca_dir.join("root-cert.pem").is_file(),
        "the root was created"
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let request = meshfed_api::auth::v1::IstioCertificateRequest {
        csr: "-----BEGIN CERTIFICATE REQUEST-----\n-----END CERTIFICATE REQUEST-----\n".into(),
        ..Default::default()
    };
    let status = meshfed::testing::create_certificate(channel, Default::default(), request)
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert_eq!(
        metric(&server, "citadel_server_authentication_failure_count").await,
        1.0
    );
    assert_eq!(metric(&server, "citadel_server_csr_count").await, 1.0);
    server.shutdown().await;
}

#[tokio::test]
async fn connections_older_than_the_max_age_are_ended_so_proxies_rebalance() {
    let server = server_with(|c| {
        c.xds_limits.max_connection_age = Some(Duration::from_millis(300));
    })
    .await;
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.0.0.9~ok.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    client.recv_clusters().await.unwrap();
    // GOAWAY at 300 ms, the connection closed after the 10 s grace.
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if client.recv_error().await.is_ok() {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the aged connection was ended");
    server.shutdown().await;
}

//! Connections at scale on every port: a reconnect storm on the plaintext xDS port
//! loses no connection (the listen backlog), and 2,000 silent connections on the
//! secure port or on the admin ports keep no healthy client out.
//!
//! The tests that open thousands of sockets take [`heavy`] so that they never run at
//! the same time (the process's open-files limit is shared). Timeouts only detect a
//! failure; they measure nothing.

use std::net::SocketAddr;
use std::time::Duration;

use meshfed::app::{CaSource, DiscoveryConfig};
use meshfed::testing::{AdsClient, ClientTls, FakeServer, node, node_with, tls_channel};
use meshfed::xds::TypeUrl;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::metadata::MetadataMap;

use crate::support::{http_get, metric};

/// Generous bound for a whole phase; only reached when something is broken.
const BOUND: Duration = Duration::from_secs(60);

/// One socket-heavy test at a time.
async fn heavy() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}

async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {BOUND:?}"))
}

/// `n` TCP connections to `addr` that never send a byte, opened concurrently.
async fn silent_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let connects = futures::future::join_all((0..n).map(|_| TcpStream::connect(addr)));
    bounded("opening the silent connections", connects)
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .expect("every silent connection opens")
}

async fn embedded(f: impl FnOnce(&mut DiscoveryConfig)) -> FakeServer {
    let server = FakeServer::builder()
        .embedded_mock_registry()
        .configure(f)
        .start()
        .await
        .unwrap();
    server.sync().await;
    server
}

fn sidecar(i: usize) -> envoy_types::pb::envoy::config::core::v3::Node {
    node(&format!(
        "sidecar~10.1.{}.{}~app-{i}.default~default.svc.cluster.local",
        i / 250,
        i % 250 + 1
    ))
}

/// Connects to the plaintext port, sends the HTTP/2 preface and an empty SETTINGS
/// frame, and reads the server's first frame (its SETTINGS).
async fn http2_handshake(addr: SocketAddr) -> std::io::Result<u8> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await?;
    let mut header = [0u8; 9];
    stream.read_exact(&mut header).await?;
    Ok(header[3])
}

/// One ADS stream on the plaintext port: connect, subscribe to CDS, first response.
async fn ads_first_response(addr: SocketAddr, i: usize) -> anyhow::Result<usize> {
    let mut client = AdsClient::connect(addr, sidecar(i)).await?;
    client.subscribe(TypeUrl::Cluster, &[]).await?;
    Ok(client.recv_clusters().await?.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_storm_of_5000_clients_loses_no_connection() {
    let _heavy = heavy().await;
    let server = embedded(|_| {}).await;
    let addr = server.grpc_addr();

    // 5,000 connections at once, each through the HTTP/2 handshake: where a short
    // accept queue drops or resets connections.
    let storm = (0..5_000).map(|_| tokio::spawn(http2_handshake(addr)));
    let results = bounded("the HTTP/2 storm", futures::future::join_all(storm)).await;
    let failures: Vec<String> = results
        .into_iter()
        .map(|r| r.expect("task"))
        .filter_map(|r| match r {
            Ok(4) => None,
            Ok(other) => Some(format!("first frame of type {other}, not SETTINGS")),
            Err(err) => Some(format!("{:?}: {err}", err.kind())),
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of 5000 failed, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );

    // 1,000 full ADS streams at once, each to its first CDS response.
    let streams = (0..1_000).map(|i| tokio::spawn(ads_first_response(addr, i)));
    let results = bounded("the ADS storm", futures::future::join_all(streams)).await;
    let mut failures = Vec::new();
    for result in results {
        match result.expect("task") {
            Ok(clusters) => assert!(clusters > 0, "a first CDS response with clusters"),
            Err(err) => failures.push(format!("{err:#}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 1000 streams failed, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_proxy_gets_cds_on_the_secure_port_while_2000_silent_connections_are_held() {
    let _heavy = heavy().await;
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let server = embedded(|c| {
        c.ca = Some(CaSource::Dir {
            cacerts: None,
            self_signed_dir: ca_dir.clone(),
        });
        // Longer than the failure bound: a silent connection that held up the
        // others would hold them up until the bound.
        c.xds_limits.handshake_timeout = Some(Duration::from_secs(600));
    })
    .await;
    let secure = server.secure_grpc_addr();
    let _silent = silent_connections(secure, 2_000).await;

    let identity = "spiffe://cluster.local/ns/default/sa/app";
    let tls = ClientTls {
        roots_pem: std::fs::read_to_string(ca_dir.join("root-cert.pem")).unwrap(),
        identity: Some(crate::secure::issue(&ca_dir, identity)),
        server_name: "istiod.istio-system.svc".into(),
    };
    let clusters = bounded("a healthy proxy's connect and CDS", async {
        let channel = tls_channel(secure, &tls).await.unwrap();
        let node = node_with(
            "sidecar~10.0.0.1~app-1.default~default.svc.cluster.local",
            serde_json::json!({"SERVICE_ACCOUNT": "app"}),
        );
        let mut client = AdsClient::over(channel, MetadataMap::new(), node)
            .await
            .unwrap();
        client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
        client.recv_clusters().await.unwrap()
    })
    .await;
    assert!(!clusters.is_empty());
    // The silent connections are held (in their handshake), not refused.
    let text = http_get(server.bound().monitoring, "/metrics").await.1;
    let held = metric(&text, "meshfed_xds_tcp_connections").unwrap_or(0.0);
    assert!(held >= 2_000.0, "{held} connections held on the xDS ports");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_metrics_and_xds_answer_while_2000_silent_connections_are_on_each_admin_port() {
    let _heavy = heavy().await;
    let server = embedded(|c| {
        // Longer than the failure bound: only the connection cap frees places.
        c.admin_limits.read_header_timeout = Some(Duration::from_secs(600));
    })
    .await;
    let bound = server.bound();
    let _http_silent = silent_connections(bound.http, 2_000).await;
    let _monitoring_silent = silent_connections(bound.monitoring, 2_000).await;

    let (status, body) = bounded("/ready", http_get(bound.http, "/ready")).await;
    assert_eq!(status, 200, "{body}");
    let (status, text) = bounded("/metrics", http_get(bound.monitoring, "/metrics")).await;
    assert_eq!(status, 200);
    // The cap (1,024 per port) held the oldest silent connections and closed the
    // rest to make room, longest idle first; none was refused.
    for port in ["http", "monitoring"] {
        let evicted = metric(
            &text,
            &format!(r#"meshfed_admin_connections_closed_total{{port="{port}",reason="evicted"}}"#),
        )
        .unwrap_or(0.0);
        assert!(evicted >= 976.0, "{port}: {evicted} evicted\n{text}");
        assert_eq!(
            metric(
                &text,
                &format!(
                    r#"meshfed_admin_connections_closed_total{{port="{port}",reason="refused"}}"#
                ),
            )
            .unwrap_or(0.0),
            0.0
        );
    }
    let clusters = bounded(
        "a healthy proxy's CDS",
        ads_first_response(server.grpc_addr(), 0),
    )
    .await
    .unwrap();
    assert!(clusters > 0);
    server.shutdown().await;
}

//! Shutdown as a replica behind a Service sees it: `/ready` turns 503 at once, the ADS
//! streams are closed one by one over the drain duration (each proxy reconnects to
//! another replica), then the server stops.

use std::time::Duration;

use meshfed::ads::TypeUrl;
use meshfed::testing::{AdsClient, FakeServer, node};
use tokio::time::Instant;

use crate::support::*;

#[tokio::test]
async fn sigterm_drains_streams_gradually_after_readiness_turns_off() {
    let drain = Duration::from_secs(2);
    let server = FakeServer::builder()
        .embedded_mock_registry()
        .configure(|c| c.drain_duration = drain)
        .start()
        .await
        .unwrap();
    server.sync().await;
    let http = server.bound().http;
    let mut clients = Vec::new();
    for i in 0..12 {
        let mut client = AdsClient::connect(
            server.grpc_addr(),
            node(&format!(
                "sidecar~10.0.0.{i}~app-{i}.default~default.svc.cluster.local"
            )),
        )
        .await
        .unwrap();
        client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
        client.recv_clusters().await.unwrap();
        clients.push(client);
    }
    assert_eq!(http_get(http, "/ready").await.0, 200);

    let started = Instant::now();
    let stopping = tokio::spawn(server.shutdown());
    let (status, body) = eventually("/ready says draining", || async move {
        let (status, body) = http_get(http, "/ready").await;
        (status == 503).then_some((status, body))
    })
    .await;
    assert!(body.contains("draining"), "{status} {body}");

    // Each stream's end, observed concurrently.
    let ends = clients.iter_mut().map(|client| async move {
        let status = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match client.recv_error().await {
                    Ok(status) => break status,
                    // Still open: nothing within the receive timeout.
                    Err(_) => continue,
                }
            }
        })
        .await
        .expect("every stream is closed");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(status.message().contains("draining"), "{status:?}");
        started.elapsed()
    });
    let mut closed_at = futures::future::join_all(ends).await;
    closed_at.sort();
    let spread = closed_at[closed_at.len() - 1] - closed_at[0];
    assert!(
        spread >= drain / 4,
        "closed over {spread:?}, not all at once: {closed_at:?}"
    );
    assert!(
        closed_at[closed_at.len() - 1] < drain + Duration::from_secs(5),
        "{closed_at:?}"
    );
    tokio::time::timeout(Duration::from_secs(30), stopping)
        .await
        .expect("the server stops after the drain")
        .unwrap();
}

fn mock_registry(services: usize) -> String {
    let mut yaml = String::from("services:\n");
    for i in 0..services {
        yaml.push_str(&format!(
            "- hostname: svc-{i}.default.svc.cluster.local\n  namespace: default\n  \
             ports: [{{name: http, port: 80, protocol: HTTP}}]\n  \
             endpoints: [{{address: 10.0.{}.{}, ports: {{http: 8080}}}}]\n",
            i / 200,
            i % 200 + 1
        ));
    }
    yaml
}

/// One simulated proxy that follows CDS, reconnecting to the next address when its
/// stream ends, until it holds `want` clusters named in `needed`. It hands back its
/// client, so its stream stays open while the caller counts the server's connections.
async fn follow(
    addrs: [std::net::SocketAddr; 2],
    first: usize,
    id: String,
    needed: String,
) -> (usize, Instant, AdsClient) {
    let mut at = first;
    let mut reconnects = 0;
    loop {
        let mut client = match AdsClient::connect(addrs[at], node(&id)).await {
            Ok(client) => client,
            Err(_) => {
                at = (at + 1) % 2;
                reconnects += 1;
                continue;
            }
        };
        if client.subscribe(TypeUrl::Cluster, &[]).await.is_err() {
            at = (at + 1) % 2;
            reconnects += 1;
            continue;
        }
        loop {
            match client.recv_clusters().await {
                Ok(clusters) if clusters.iter().any(|c| c.name == needed) => {
                    return (reconnects, Instant::now(), client);
                }
                Ok(_) => continue,
                Err(_) => break,
            }
        }
        at = (at + 1) % 2;
        reconnects += 1;
    }
}

#[tokio::test]
async fn when_one_of_two_replicas_stops_every_proxy_moves_to_the_other_and_is_current() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mock.yaml");
    std::fs::write(&file, mock_registry(20)).unwrap();
    let start = |file: std::path::PathBuf| async move {
        let server = FakeServer::builder()
            .mock_registry_file(file)
            .configure(|c| c.drain_duration = Duration::from_secs(1))
            .start()
            .await
            .unwrap();
        server.sync().await;
        server
    };
    let a = start(file.clone()).await;
    let b = start(file.clone()).await;
    for server in [&a, &b] {
        let http = server.bound().http;
        eventually("replica ready", || async move {
            (http_get(http, "/ready").await.0 == 200).then_some(())
        })
        .await;
    }
    let addrs = [a.grpc_addr(), b.grpc_addr()];
    // 200 proxies, half on each replica, each waiting for a service that does not
    // exist yet.
    let needed = "outbound|80||svc-20.default.svc.cluster.local".to_string();
    let proxies: Vec<_> = (0..200)
        .map(|i| {
            tokio::spawn(follow(
                addrs,
                i % 2,
                format!(
                    "sidecar~10.1.{}.{}~p-{i}.default~default.svc.cluster.local",
                    i / 200,
                    i % 200 + 1
                ),
                needed.clone(),
            ))
        })
        .collect();
    eventually("200 proxies connected", || {
        let (a, b) = (
            a.server().connections().len(),
            b.server().connections().len(),
        );
        async move { (a + b == 200).then_some(()) }
    })
    .await;

    // Replica A stops; then the registry changes: every proxy must end up on B with
    // the new service.
    let stopped = Instant::now();
    a.shutdown().await;
    std::fs::write(&file, mock_registry(21)).unwrap();
    let results = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(proxies))
        .await
        .expect("every proxy is current within a minute");
    let mut moved = 0;
    let mut last = stopped;
    let mut clients = Vec::new();
    for result in results {
        let (reconnects, at, client) = result.unwrap();
        moved += usize::from(reconnects > 0);
        last = last.max(at);
        clients.push(client);
    }
    assert_eq!(
        moved, 100,
        "the proxies of the stopped replica moved, the others stayed"
    );
    assert_eq!(b.server().connections().len(), 200);
    drop(clients);
    eprintln!(
        "failover: 100 of 200 proxies moved; all 200 current {:?} after the replica began to stop (drain 1 s)",
        last - stopped
    );
    b.shutdown().await;
}

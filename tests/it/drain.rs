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

//! The mock registry file, end to end: edits reach connected proxies; bad edits don't.

use std::path::Path;

use meshfed::ads::TypeUrl;
use meshfed::testing::{AdsClient, FakeServer, node};

use crate::support::*;

const SIDECAR: &str = "sidecar~10.0.0.1~app-1.default~default.svc.cluster.local";

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

const ONE: &str = "services:
- hostname: echo.default.svc.cluster.local
  ports: [{name: grpc, port: 7070, protocol: GRPC}]
  endpoints:
  - {address: 127.0.0.1, ports: {grpc: 17070}}
";

const TWO: &str = "services:
- hostname: echo.default.svc.cluster.local
  ports: [{name: grpc, port: 7070, protocol: GRPC}]
  endpoints:
  - {address: 127.0.0.1, ports: {grpc: 17070}}
- hostname: extra.default.svc.cluster.local
  ports: [{name: http, port: 80, protocol: HTTP}]
";

#[tokio::test]
async fn file_edits_are_pushed_and_bad_edits_keep_the_last_good_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mock.yaml");
    std::fs::write(&path, ONE).unwrap();
    let server = FakeServer::builder()
        .mock_registry_file(&path)
        .start()
        .await
        .unwrap();
    let http = server.bound().http;
    eventually("the mock file to load", || async move {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;

    server.sync().await;
    let mut client = AdsClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    assert!(
        clusters
            .iter()
            .any(|c| c.name == "outbound|7070||echo.default.svc.cluster.local")
    );

    write_atomically(&path, TWO);
    let clusters = client.recv_clusters().await.unwrap();
    assert!(
        clusters
            .iter()
            .any(|c| c.name == "outbound|80||extra.default.svc.cluster.local")
    );

    // A broken file: rejected, counted, and the services stay.
    let status = server.server().mock_status().unwrap().clone();
    std::fs::write(
        &path,
        "services:\n- hostname: echo.default.svc.cluster.local\n  ports: [{name: grpc, port: 0}]\n",
    )
    .unwrap();
    let error = eventually("the bad edit to be rejected", || {
        let status = status.clone();
        async move { status.last_error() }
    })
    .await;
    assert!(
        error.contains("mock.yaml:3"),
        "the error names file and line: {error}"
    );
    let registryz = get_json(http, "/debug/registryz").await;
    assert_eq!(
        registryz["services"].as_array().unwrap().len(),
        2,
        "the last good content is still served"
    );

    // The next good edit applies and is pushed.
    write_atomically(&path, ONE);
    let clusters = client.recv_clusters().await.unwrap();
    assert!(
        clusters
            .iter()
            .all(|c| c.name != "outbound|80||extra.default.svc.cluster.local")
    );
    server.shutdown().await;
}

/// Istio's initial push context: `/ready` turns 200 only once a snapshot built from the
/// synced registry is in place, so a proxy that connects at that very moment gets every
/// service in its first response. The long debounce keeps the registry's own events
/// from reaching a snapshot first: without the readiness snapshot, the first answer
/// would come from the snapshot built before the file was read.
#[tokio::test]
async fn a_proxy_connecting_the_moment_the_server_is_ready_gets_every_service() {
    const SERVICES: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mock.yaml");
    let mut text = String::from("services:\n");
    for i in 0..SERVICES {
        text.push_str(&format!(
            "- hostname: svc-{i}.default.svc.cluster.local\n  ports: [{{name: http, port: 80, protocol: HTTP}}]\n  endpoints:\n  - {{address: 127.0.{}.{}, ports: {{http: 8080}}}}\n",
            i / 250,
            i % 250 + 1
        ));
    }
    std::fs::write(&path, text).unwrap();
    let server = FakeServer::builder()
        .mock_registry_file(&path)
        .debounce(meshfed::push::debounce::DebounceConfig {
            quiet: std::time::Duration::from_secs(60),
            max: std::time::Duration::from_secs(120),
            eds_debounce: true,
        })
        .start()
        .await
        .unwrap();
    let http = server.bound().http;
    eventually("the server to be ready", || async move {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
    let mut client = AdsClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    for i in 0..SERVICES {
        let name = format!("outbound|80||svc-{i}.default.svc.cluster.local");
        assert!(
            clusters.iter().any(|c| c.name == name),
            "{name} missing from the first answer ({} clusters)",
            clusters.len()
        );
    }
    server.shutdown().await;
}

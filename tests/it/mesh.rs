//! Mesh config files: applied at start, reloaded live with a full push.

use meshfed::ads::TypeUrl;
use meshfed::testing::{AdsClient, FakeServer, node};

use crate::support::*;

#[tokio::test]
async fn mesh_config_reload_pushes_to_every_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mesh.yaml");
    std::fs::write(&path, "connectTimeout: 1s\n").unwrap();
    let mesh_path = path.clone();
    let server = FakeServer::builder()
        .configure(|c| c.mesh_config = Some(mesh_path))
        .start()
        .await
        .unwrap();
    let reg = server.mock_registry("c1");
    add_http_service(
        &reg,
        "a.default.svc.cluster.local",
        "default",
        &["10.0.0.1"],
    );
    server.sync().await;

    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.0.0.1~x.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    assert!(
        clusters
            .iter()
            .all(|c| c.connect_timeout.unwrap().seconds == 1)
    );

    // An invalid file is ignored (no push); the next valid one is pushed.
    std::fs::write(&path, "connectTimeout: soon\n").unwrap();
    let tmp = dir.path().join("mesh.tmp");
    std::fs::write(&tmp, "connectTimeout: 3s\n").unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    assert!(
        clusters
            .iter()
            .all(|c| c.connect_timeout.unwrap().seconds == 3),
        "{clusters:?}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn an_invalid_mesh_config_at_start_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mesh.yaml");
    std::fs::write(&path, "outboundTrafficPolicy: {mode: SOMETIMES}\n").unwrap();
    let mesh_path = path.clone();
    let err = FakeServer::builder()
        .configure(|c| c.mesh_config = Some(mesh_path))
        .start()
        .await
        .unwrap_err();
    let message = format!("{err:#}");
    assert!(
        message.contains("mesh.yaml") && message.contains("SOMETIMES"),
        "{message}"
    );
}

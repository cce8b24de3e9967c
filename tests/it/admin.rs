//! The admin surface: readiness, metrics, version and the debug table.

use meshfed::ads::TypeUrl;
use meshfed::testing::{AdsClient, FakeServer, node};

use crate::support::*;

#[tokio::test]
async fn metrics_version_and_debug_endpoints() {
    let server = FakeServer::builder()
        .embedded_mock_registry()
        .start()
        .await
        .unwrap();
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.0.0.1~app.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    client.recv_clusters().await.unwrap();

    let monitoring = server.bound().monitoring;
    let (status, metrics) = http_get(monitoring, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(metric(&metrics, "pilot_xds"), Some(1.0), "{metrics}");
    // At least the response this client ACKed; a registry finishing its start-up in
    // the background may add a push.
    let cds_pushes = metric(&metrics, "pilot_xds_pushes{type=\"cds\"}").unwrap_or(0.0);
    assert!(cds_pushes >= 1.0, "{metrics}");
    assert_eq!(metric(&metrics, "pilot_services"), Some(2.0));
    for name in [
        "pilot_debounce_time",
        "pilot_proxy_convergence_time",
        "pilot_total_xds_rejects",
    ] {
        assert!(
            metrics.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{metrics}"
        );
    }

    assert_eq!(
        metric(
            &metrics,
            "meshfed_registry_synced{registry=\"Mock/Kubernetes\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "meshfed_registry_services{registry=\"Mock/Kubernetes\"}"
        ),
        Some(2.0)
    );

    let version = get_json(monitoring, "/version").await;
    assert_eq!(version["name"], "meshfed");

    // The table drives /debug/list, and every listed endpoint answers JSON on both ports.
    let list = get_json(server.bound().http, "/debug/list").await;
    let paths: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    for required in ["/debug/adsz", "/debug/registryz", "/debug/syncz"] {
        assert!(paths.contains(&required), "{paths:?}");
    }
    for path in &paths {
        get_json(server.bound().http, path).await;
        get_json(monitoring, path).await;
    }
    let registryz = get_json(server.bound().http, "/debug/registryz").await;
    let hosts: Vec<&str> = registryz["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["hostname"].as_str().unwrap())
        .collect();
    assert_eq!(
        hosts,
        vec![
            "echo.default.svc.cluster.local",
            "reviews.bookinfo.svc.cluster.local"
        ],
        "sorted"
    );
    assert_eq!(registryz["services"][0]["sources"][0], "Mock/Kubernetes");
    let adsz = get_json(server.bound().http, "/debug/adsz").await;
    assert_eq!(adsz["totalClients"], 1);
    server.shutdown().await;
}

#[tokio::test]
async fn merge_conflicts_show_in_registryz() {
    let server = FakeServer::builder().start().await.unwrap();
    let older = server.mock_registry("older");
    let newer = server.mock_registry("newer");
    let mut s = service(
        "api.example.com",
        "default",
        &[("http", 80, meshfed_registry::Protocol::Http)],
    );
    s.creation_time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(100);
    newer.add_service(s.clone());
    s.creation_time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(10);
    older.add_service(s);
    let http = server.bound().http;
    let registryz = eventually("the conflict to show", || async move {
        let r = get_json(http, "/debug/registryz").await;
        (!r["conflicts"].as_array().unwrap().is_empty()).then_some(r)
    })
    .await;
    assert_eq!(registryz["conflicts"][0]["winner"], "Mock/older");
    assert_eq!(registryz["conflicts"][0]["loser"], "Mock/newer");
    assert_eq!(registryz["conflicts"][0]["reason"], "OldestWins");
    assert_eq!(registryz["services"][0]["cluster_id"], "older");
    server.shutdown().await;
}

#[tokio::test]
async fn push_status_lists_reasons_changes_and_the_proxies_pushed() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    server.sync().await;
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.0.0.1~app-1.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    client.recv_clusters().await.unwrap();
    add_http_service(
        &reg,
        "a.default.svc.cluster.local",
        "default",
        &["10.0.0.9"],
    );
    client.recv_clusters().await.unwrap();
    let status = get_json(server.bound().http, "/debug/push_status").await;
    let last = &status["pushes"][0];
    assert_eq!(last["full"], true, "{status:#}");
    assert!(
        last["changes"]
            .to_string()
            .contains("a.default.svc.cluster.local"),
        "{status:#}"
    );
    assert_eq!(last["connections"], 1);
    assert!(
        last["proxies"][0]
            .as_str()
            .unwrap()
            .starts_with("app-1.default-"),
        "{status:#}"
    );
    server.shutdown().await;
}

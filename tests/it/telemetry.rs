//! The README's telemetry example (`examples/telemetry`) on the bundled mock registry,
//! and Telemetry objects naming providers the mesh config lacks.

use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use meshfed::testing::{AdsClient, FakeServer, ProxyConfig, node_with};
use prost::Message;

use crate::support::*;

/// Every connection manager of `listeners`.
fn connection_managers(listeners: &[Listener]) -> Vec<HttpConnectionManager> {
    listeners
        .iter()
        .flat_map(|l| l.filter_chains.iter().chain(l.default_filter_chain.iter()))
        .flat_map(|c| c.filters.iter())
        .filter(|f| f.name == "envoy.filters.network.http_connection_manager")
        .filter_map(|f| match &f.config_type {
            Some(filter::ConfigType::TypedConfig(a)) => {
                HttpConnectionManager::decode(a.value.as_slice()).ok()
            }
            _ => None,
        })
        .collect()
}

fn example() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/telemetry")
}

/// `meshfed validate` accepts the example with its mesh config and reports nothing;
/// without the mesh config it warns that the providers are unknown (as Istio's
/// analyzers would against the default mesh config).
#[test]
fn the_telemetry_example_validates() {
    let root = example();
    let run = |with_mesh: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"));
        cmd.args(["validate", "-f"]).arg(root.join("config"));
        if with_mesh {
            cmd.arg("--meshConfig").arg(root.join("mesh.yaml"));
        }
        cmd.output().unwrap()
    };
    let ok = run(true);
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{out}");
    assert!(out.contains("3 valid object(s), 0 error(s)"), "{out}");
    assert!(!out.contains("provider"), "{out}");
    let without = run(false);
    let out = String::from_utf8_lossy(&without.stdout);
    assert!(without.status.success(), "warnings only: {out}");
    assert!(
        out.contains(
            "spec.tracing[0].providers[0]: provider \"otel-tracing\" is not an extension provider"
        ),
        "{out}"
    );
}

/// The example served from the bundled mock registry: every object applies, nothing is
/// rejected, and no Telemetry names an unknown provider; a Telemetry naming one is
/// listed under `telemetryProviders` in `/debug/configz`.
#[tokio::test]
async fn the_telemetry_example_is_served_and_unknown_providers_are_reported() {
    let root = example();
    let mesh = root.join("mesh.yaml");
    let server = FakeServer::builder()
        .embedded_mock_registry()
        .config_dir(root.join("config"))
        .configure(move |c| c.mesh_config = Some(mesh))
        .start()
        .await
        .unwrap();
    ready_and_synced(&server).await;
    let configz = get_json(server.bound().http, "/debug/configz").await;
    assert_eq!(configz["objects"].as_array().unwrap().len(), 3, "{configz}");
    assert_eq!(configz["rejected"], serde_json::json!([]));
    assert_eq!(configz["telemetryProviders"], serde_json::json!([]));

    // What the sidecars of echo (default) and reviews (bookinfo) get.
    for (node, labels, stats) in [
        (
            "sidecar~127.0.0.1~echo-v1.default~default.svc.cluster.local",
            serde_json::json!({"app": "echo", "version": "v1"}),
            true,
        ),
        (
            "sidecar~127.0.1.1~reviews-v1.bookinfo~bookinfo.svc.cluster.local",
            serde_json::json!({"app": "reviews", "version": "v1"}),
            false,
        ),
    ] {
        let mut client = AdsClient::connect(
            server.grpc_addr(),
            node_with(node, serde_json::json!({"LABELS": labels})),
        )
        .await
        .unwrap();
        let ProxyConfig { listeners, .. } = client.fetch_config().await.unwrap();
        let hcms = connection_managers(&listeners);
        assert!(
            !hcms.is_empty(),
            "{node}: {:?}",
            listeners
                .iter()
                .map(|l| (
                    &l.name,
                    l.filter_chains
                        .iter()
                        .map(|c| c.filters.iter().map(|f| f.name.clone()).collect::<Vec<_>>())
                        .collect::<Vec<_>>()
                ))
                .collect::<Vec<_>>()
        );
        for hcm in &hcms {
            // JSON access logs to stdout.
            assert_eq!(hcm.access_log.len(), 1, "{node}");
            assert_eq!(hcm.access_log[0].name, "envoy.access_loggers.file");
            let Some(
                envoy_types::pb::envoy::config::accesslog::v3::access_log::ConfigType::TypedConfig(
                    any,
                ),
            ) = &hcm.access_log[0].config_type
            else {
                panic!("{node}: no access log config")
            };
            let file = envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog::decode(
                any.value.as_slice(),
            )
            .unwrap();
            assert_eq!(file.path, "/dev/stdout", "{node}");
            assert!(
                format!("{file:?}").contains("JsonFormat"),
                "{node}: JSON lines"
            );
            // 10% of traces to the collector.
            let tracing = hcm.tracing.as_ref().expect("tracing");
            assert_eq!(tracing.random_sampling.as_ref().unwrap().value, 10.0);
            let provider = tracing.provider.as_ref().unwrap();
            assert_eq!(provider.name, "envoy.tracers.opentelemetry");
            let Some(
                envoy_types::pb::envoy::config::trace::v3::tracing::http::ConfigType::TypedConfig(
                    any,
                ),
            ) = &provider.config_type
            else {
                panic!("{node}: no tracer config")
            };
            let otel = envoy_types::pb::envoy::config::trace::v3::OpenTelemetryConfig::decode(
                any.value.as_slice(),
            )
            .unwrap();
            assert!(
                format!("{:?}", otel.grpc_service)
                    .contains("outbound|4317||otel-collector.observability.svc.cluster.local"),
                "{otel:?}"
            );
            assert!(hcm.request_id_extension.is_some());
            // Metrics everywhere but in bookinfo.
            let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
            assert_eq!(names.contains(&"istio.stats"), stats, "{node}: {names:?}");
            assert_eq!(names[0], "istio.metadata_exchange", "{node}: {names:?}");
            assert_eq!(names[names.len() - 1], "envoy.filters.http.router");
        }
    }
    server.shutdown().await;

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("t.yaml"),
        "apiVersion: telemetry.istio.io/v1alpha1
kind: Telemetry
metadata: {name: typo, namespace: default}
spec:
  tracing: [{providers: [{name: otel-tracin}]}]
",
    )
    .unwrap();
    let server = FakeServer::builder()
        .embedded_mock_registry()
        .config_dir(dir.path())
        .start()
        .await
        .unwrap();
    ready_and_synced(&server).await;
    let configz = get_json(server.bound().http, "/debug/configz").await;
    let found = configz["telemetryProviders"].as_array().unwrap();
    assert_eq!(found.len(), 1, "{configz}");
    assert_eq!(found[0]["name"], "typo");
    assert_eq!(found[0]["field"], "spec.tracing[0].providers[0]");
    server.shutdown().await;
}

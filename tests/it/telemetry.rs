//! The README's telemetry example (`examples/telemetry`) on the bundled mock registry,
//! and Telemetry objects naming providers the mesh config lacks.

use meshfed::testing::FakeServer;

use crate::support::*;

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

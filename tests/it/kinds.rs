//! Config kinds: a WorkloadGroup is read from the config directory and the Rust API,
//! validated and listed; objects of kinds meshfed does not read (ProxyConfig, the
//! Gateway API's experimental XBackendTrafficPolicy, an `apps/v1` Deployment) are reported by `meshfed validate`,
//! `/debug/configz` and
//! a metric, never dropped in silence.

use meshfed::testing::FakeServer;

use crate::support::*;

const MIXED: &str = "apiVersion: networking.istio.io/v1beta1
kind: ProxyConfig
metadata: {name: lua, namespace: default}
spec: {concurrency: 2}
---
apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XBackendTrafficPolicy
metadata: {name: web, namespace: apps}
spec: {targetRefs: [{group: core, kind: Service, name: web}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: mesh-default, namespace: istio-system}
spec: {replicas: 1}
---
apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata: {name: vms, namespace: bookinfo}
spec:
  metadata: {labels: {app: ratings}}
  template: {ports: {http: 9080}, serviceAccount: ratings}
  probe: {periodSeconds: 5, httpGet: {port: 9080, path: /ready}}
";

fn validate(args: &[&str], path: &std::path::Path) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .arg("validate")
        .args(args)
        .arg("-f")
        .arg(path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn validate_warns_about_each_ignored_object_and_fails_with_strict() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mixed.yaml");
    std::fs::write(&file, MIXED).unwrap();
    let (ok, out) = validate(&[], dir.path());
    assert!(ok, "ignored objects are warnings: {out}");
    for (line, what) in [
        (
            1,
            "ProxyConfig default/lua: skipped: networking.istio.io/v1beta1 ProxyConfig",
        ),
        (
            6,
            "XBackendTrafficPolicy apps/web: skipped: gateway.networking.x-k8s.io/v1alpha1 XBackendTrafficPolicy",
        ),
        (
            11,
            "Deployment istio-system/mesh-default: skipped: apps/v1 Deployment",
        ),
    ] {
        let expected = format!(
            "warning: {}:{line}: {what} is not a kind meshfed reads; meshfed does not apply it",
            file.display()
        );
        assert!(out.contains(&expected), "{expected}\n{out}");
    }
    assert!(!out.contains("WorkloadGroup"), "a declared kind: {out}");
    assert!(
        out.contains(
            "1 valid object(s), 0 error(s), 3 ignored (kinds meshfed does not read) in 1 file(s)"
        ),
        "{out}"
    );

    let (ok, out) = validate(&["--strict"], dir.path());
    assert!(!ok, "--strict fails on ignored objects: {out}");

    // Without ignored objects --strict passes, and the summary is as before.
    std::fs::write(&file, &MIXED[MIXED.rfind("---\n").unwrap() + 4..]).unwrap();
    let (ok, out) = validate(&["--strict"], dir.path());
    assert!(ok, "{out}");
    assert!(
        out.contains("1 valid object(s), 0 error(s) in 1 file(s)"),
        "{out}"
    );
}

#[test]
fn validate_rejects_an_invalid_workload_group() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wg.yaml");
    std::fs::write(
        &file,
        "apiVersion: networking.istio.io/v1beta1
kind: WorkloadGroup
metadata: {name: vms, namespace: bookinfo}
spec:
  template: {address: 10.0.0.1}
  probe: {periodSeconds: -1}
",
    )
    .unwrap();
    let (ok, out) = validate(&[], &file);
    assert!(!ok, "{out}");
    assert!(
        out.contains("spec.probe.periodSeconds: periodSeconds must be non-negative"),
        "{out}"
    );
    assert!(
        out.contains("spec.probe: a probe needs exactly one of"),
        "{out}"
    );
}

#[tokio::test]
async fn configz_lists_workload_groups_and_ignored_objects_and_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mixed.yaml"), MIXED).unwrap();
    let server = FakeServer::builder()
        .config_dir(dir.path())
        .start()
        .await
        .unwrap();
    ready_and_synced(&server).await;
    // The Rust API takes a WorkloadGroup like any kind.
    let from_code: meshfed_api::networking::v1alpha3::WorkloadGroup =
        serde_json::from_value(serde_json::json!({"template": {"network": "vm-net"}})).unwrap();
    server
        .config_store()
        .apply(meshfed_registry::config::ConfigObject::new(
            "bookinfo",
            "from-code",
            from_code,
        ))
        .unwrap();

    let configz = get_json(server.bound().http, "/debug/configz").await;
    let objects: Vec<String> = configz["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| format!("{} {}/{}", o["kind"], o["namespace"], o["name"]).replace('"', ""))
        .collect();
    assert_eq!(
        objects,
        [
            "WorkloadGroup bookinfo/from-code",
            "WorkloadGroup bookinfo/vms"
        ]
    );
    let vms = &configz["objects"][1];
    assert_eq!(vms["spec"]["template"]["ports"]["http"], 9080, "{vms}");
    assert_eq!(vms["spec"]["probe"]["httpGet"]["path"], "/ready", "{vms}");
    let ignored: Vec<String> = configz["ignored"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let source = o["source"].as_str().unwrap();
            let line = source.rsplit_once(':').unwrap().1;
            format!(
                "{} {} {}/{} line {line}",
                o["apiVersion"], o["kind"], o["namespace"], o["name"]
            )
            .replace('"', "")
        })
        .collect();
    assert_eq!(
        ignored,
        [
            "apps/v1 Deployment istio-system/mesh-default line 11",
            "networking.istio.io/v1beta1 ProxyConfig default/lua line 1",
            "gateway.networking.x-k8s.io/v1alpha1 XBackendTrafficPolicy apps/web line 6",
        ],
        "{configz}"
    );

    let metrics = http_get(server.bound().monitoring, "/metrics").await.1;
    for kind in ["XBackendTrafficPolicy", "Deployment", "ProxyConfig"] {
        assert_eq!(
            metric(
                &metrics,
                &format!("meshfed_config_ignored{{kind=\"{kind}\"}}")
            ),
            Some(1.0),
            "{metrics}"
        );
    }
    assert_eq!(
        metric(&metrics, "meshfed_config_ignored{kind=\"WorkloadGroup\"}"),
        None,
        "{metrics}"
    );
    server.shutdown().await;
}

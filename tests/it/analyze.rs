//! `meshfed analyze` and the analyzers behind it (`meshfed_registry::analysis`).
//!
//! The vectors are Istio's (`pkg/config/analysis/analyzers/analyzers_test.go`, data in
//! `tests/data/analyze/`): each runs one analyzer over its files and expects the same
//! messages (type and object, as a multiset). Those that cannot pass yet are in
//! `KNOWN_GAPS` with the reason; the test fails when one of them starts passing.

use std::path::{Path, PathBuf};
use std::process::Command;

use meshfed_registry::analysis::{self, CATALOG, InputBuilder, read};

struct Vector {
    name: &'static str,
    files: &'static [&'static str],
    analyzer: &'static str,
    /// (Istio's message type name, `Kind namespace/name` or `Kind name`).
    expected: &'static [(&'static str, &'static str)],
}

const VECTORS: &[Vector] = &[
    Vector {
        name: "virtualServiceDestinationHosts",
        files: &["virtualservice_destinationhosts.yaml"],
        analyzer: "virtualservice.DestinationHostAnalyzer",
        expected: &[
            (
                "ReferencedResourceNotFound",
                "VirtualService default/reviews-bogushost",
            ),
            (
                "ReferencedResourceNotFound",
                "VirtualService default/reviews-bogushost",
            ),
            (
                "ReferencedResourceNotFound",
                "VirtualService default/reviews-bookinfo-other",
            ),
            (
                "ReferencedResourceNotFound",
                "VirtualService default/reviews-mirror-bogushost",
            ),
            (
                "ReferencedResourceNotFound",
                "VirtualService default/reviews-bogusport",
            ),
            (
                "VirtualServiceDestinationPortSelectorRequired",
                "VirtualService default/reviews-2port-missing",
            ),
            (
                "ReferencedResourceNotFound",
                "VirtualService istio-system/cross-namespace-details",
            ),
            (
                "ReferencedResourceNotFound",
                "VirtualService hello/hello-export-to-bogus",
            ),
        ],
    },
    Vector {
        name: "virtualServiceDestinationRules",
        files: &["virtualservice_destinationrules.yaml"],
        analyzer: "virtualservice.DestinationRuleAnalyzer",
        expected: &[
            (
                "ReferencedResourceNotFound",
                "VirtualService default/reviews-bogussubset",
            ),
            (
                "ReferencedResourceNotFound",
                "VirtualService default/reviews-mirror-bogussubset",
            ),
        ],
    },
    Vector {
        name: "virtualServiceGateways",
        files: &["virtualservice_gateways.yaml"],
        analyzer: "virtualservice.GatewayAnalyzer",
        expected: &[
            ("ReferencedResourceNotFound", "VirtualService httpbin-bogus"),
            (
                "VirtualServiceHostNotFoundInGateway",
                "VirtualService default/cross-test",
            ),
            (
                "VirtualServiceHostNotFoundInGateway",
                "VirtualService httpbin-bogus",
            ),
            (
                "VirtualServiceHostNotFoundInGateway",
                "VirtualService httpbin",
            ),
        ],
    },
    Vector {
        name: "virtualServiceConflictingMeshGatewayHosts",
        files: &["virtualservice_conflictingmeshgatewayhosts.yaml"],
        analyzer: "virtualservice.ConflictingMeshGatewayHostsAnalyzer",
        expected: &[
            (
                "ConflictingMeshGatewayVirtualServiceHosts",
                "VirtualService team3/ratings",
            ),
            (
                "ConflictingMeshGatewayVirtualServiceHosts",
                "VirtualService team4/ratings",
            ),
            (
                "ConflictingMeshGatewayVirtualServiceHosts",
                "VirtualService foo/ratings",
            ),
            (
                "ConflictingMeshGatewayVirtualServiceHosts",
                "VirtualService bar/ratings",
            ),
            (
                "ConflictingMeshGatewayVirtualServiceHosts",
                "VirtualService foo/productpage",
            ),
            (
                "ConflictingMeshGatewayVirtualServiceHosts",
                "VirtualService foo/bogus-productpage",
            ),
            (
                "ConflictingMeshGatewayVirtualServiceHosts",
                "VirtualService team2/ratings",
            ),
        ],
    },
    Vector {
        name: "virtualServiceConflictingMeshGatewayHostsWithExportTo",
        files: &["virtualservice_conflictingmeshgatewayhosts_with_exportto.yaml"],
        analyzer: "virtualservice.ConflictingMeshGatewayHostsAnalyzer",
        expected: &[
            (
                "ConflictingMeshGatewayVirtualServiceHosts",
                "VirtualService foo/productpage",
            ),
            (
                "ConflictingMeshGatewayVirtualServiceHosts",
                "VirtualService bar/productpage",
            ),
            (
                "ConflictingMeshGatewayVirtualServiceHosts",
                "VirtualService foo/productpage-c",
            ),
            (
                "ConflictingMeshGatewayVirtualServiceHosts",
                "VirtualService bar/productpage-c",
            ),
            (
                "ConflictingMeshGatewayVirtualServiceHosts",
                "VirtualService foo/productpage-d",
            ),
            (
                "ConflictingMeshGatewayVirtualServiceHosts",
                "VirtualService bar/productpage-d",
            ),
        ],
    },
    Vector {
        name: "namedPort",
        files: &["service-port-name.yaml"],
        analyzer: "service.PortNameAnalyzer",
        expected: &[],
    },
    Vector {
        name: "unnamedPortInSystemNamespace",
        files: &["service-no-port-name-system-namespace.yaml"],
        analyzer: "service.PortNameAnalyzer",
        expected: &[],
    },
    Vector {
        name: "gatewayCorrectPort",
        files: &["gateway-correct-port.yaml"],
        analyzer: "gateway.IngressGatewayPortAnalyzer",
        expected: &[],
    },
    Vector {
        name: "telemetryDefaultSelector",
        files: &["telemetry-default-selector.yaml"],
        analyzer: "telemetry.DefaultSelectorAnalyzer",
        expected: &[
            (
                "MultipleTelemetriesWithoutWorkloadSelectors",
                "Telemetry ns2/has-conflict-2",
            ),
            (
                "MultipleTelemetriesWithoutWorkloadSelectors",
                "Telemetry ns2/has-conflict-1",
            ),
        ],
    },
    Vector {
        name: "sidecarSelector",
        files: &["sidecar-selector.yaml"],
        analyzer: "sidecar.SelectorAnalyzer",
        expected: &[
            (
                "ReferencedResourceNotFound",
                "Sidecar default/maps-to-nonexistent",
            ),
            (
                "ReferencedResourceNotFound",
                "Sidecar other/maps-to-different-ns",
            ),
            (
                "ConflictingSidecarWorkloadSelectors",
                "Sidecar default/dupe-1",
            ),
            (
                "ConflictingSidecarWorkloadSelectors",
                "Sidecar default/dupe-2",
            ),
            (
                "ConflictingSidecarWorkloadSelectors",
                "Sidecar default/overlap-1",
            ),
            (
                "ConflictingSidecarWorkloadSelectors",
                "Sidecar default/overlap-2",
            ),
        ],
    },
    Vector {
        name: "sidecarDefaultSelector",
        files: &["sidecar-default-selector.yaml"],
        analyzer: "sidecar.SelectorAnalyzer",
        expected: &[
            (
                "MultipleSidecarsWithoutWorkloadSelectors",
                "Sidecar ns2/has-conflict-2",
            ),
            (
                "MultipleSidecarsWithoutWorkloadSelectors",
                "Sidecar ns2/has-conflict-1",
            ),
            ("IneffectivePolicy", "Sidecar ns-ambient/namespace-scoped"),
            ("IneffectivePolicy", "Sidecar ns-ambient/pod-scoped"),
        ],
    },
    Vector {
        name: "portNameNotFollowConvention",
        files: &["service-no-port-name.yaml"],
        analyzer: "service.PortNameAnalyzer",
        expected: &[
            (
                "PortNameIsNotUnderNamingConvention",
                "Service my-namespace1/my-service1",
            ),
            (
                "PortNameIsNotUnderNamingConvention",
                "Service my-namespace1/my-service1",
            ),
            (
                "PortNameIsNotUnderNamingConvention",
                "Service my-namespace2/my-service2",
            ),
        ],
    },
    Vector {
        name: "authorizationpolicies",
        files: &["authorizationpolicies.yaml"],
        analyzer: "auth.AuthorizationPoliciesAnalyzer",
        expected: &[
            (
                "NoMatchingWorkloadsFound",
                "AuthorizationPolicy istio-system/meshwide-httpbin-v1",
            ),
            (
                "NoMatchingWorkloadsFound",
                "AuthorizationPolicy httpbin-empty/httpbin-empty-namespace-wide",
            ),
            (
                "NoMatchingWorkloadsFound",
                "AuthorizationPolicy httpbin/httpbin-nopods",
            ),
            (
                "ReferencedResourceNotFound",
                "AuthorizationPolicy httpbin/httpbin-bogus-ns",
            ),
            (
                "ReferencedResourceNotFound",
                "AuthorizationPolicy httpbin/httpbin-bogus-ns",
            ),
            (
                "ReferencedResourceNotFound",
                "AuthorizationPolicy httpbin/httpbin-bogus-not-ns",
            ),
            (
                "ReferencedResourceNotFound",
                "AuthorizationPolicy httpbin/httpbin-bogus-not-ns",
            ),
            (
                "NoMatchingWorkloadsFound",
                "AuthorizationPolicy test-ambient/no-workload",
            ),
        ],
    },
    Vector {
        name: "gatewayNoWorkload",
        files: &["gateway-no-workload.yaml"],
        analyzer: "gateway.IngressGatewayPortAnalyzer",
        expected: &[("ReferencedResourceNotFound", "Gateway httpbin-gateway")],
    },
    Vector {
        name: "gatewayBadPort",
        files: &["gateway-no-port.yaml"],
        analyzer: "gateway.IngressGatewayPortAnalyzer",
        expected: &[("GatewayPortNotDefinedOnService", "Gateway httpbin-gateway")],
    },
    Vector {
        name: "telemetrySelector",
        files: &["telemetry-selector.yaml"],
        analyzer: "telemetry.SelectorAnalyzer",
        expected: &[
            (
                "ReferencedResourceNotFound",
                "Telemetry default/maps-to-nonexistent",
            ),
            (
                "ReferencedResourceNotFound",
                "Telemetry other/maps-to-different-ns",
            ),
            (
                "ConflictingTelemetryWorkloadSelectors",
                "Telemetry default/dupe-1",
            ),
            (
                "ConflictingTelemetryWorkloadSelectors",
                "Telemetry default/dupe-2",
            ),
            (
                "ConflictingTelemetryWorkloadSelectors",
                "Telemetry default/overlap-1",
            ),
            (
                "ConflictingTelemetryWorkloadSelectors",
                "Telemetry default/overlap-2",
            ),
        ],
    },
];

/// Vectors that do not pass yet, with the reason.
const KNOWN_GAPS: &[(&str, &str)] = &[
    (
        "virtualServiceDestinationHosts",
        "Istio expects two messages for reviews-bogushost (one destination, one missing host); meshfed gives one \
         and the second's cause is not known",
    ),
    (
        "sidecarDefaultSelector",
        "IneffectivePolicy (IST0167, Sidecars on ambient pods) is not implemented: meshfed serves no ambient data plane",
    ),
    (
        "gatewayCorrectPort",
        "Istio's test adds default resources (an ingress gateway pod and Service) this port does not load, \
         so meshfed finds no pod for the selector",
    ),
    (
        "gatewayBadPort",
        "Istio's test adds default resources (an ingress gateway pod and Service) this port does not load",
    ),
];

fn data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/analyze")
        .join(file)
}

/// `Kind name` (namespace omitted in the input) is read in `default`, as istioctl does.
fn origin(expected: &str) -> String {
    match expected.split_once(' ') {
        Some((kind, name)) if !name.contains('/') && kind != "Namespace" => {
            format!("{kind} default/{name}")
        }
        _ => expected.to_string(),
    }
}

/// (message type name, origin) pairs, sorted.
type Found = Vec<(String, String)>;

/// What the vector's analyzer reports, and what Istio expects.
fn run(v: &Vector) -> (Found, Found) {
    let paths: Vec<PathBuf> = v.files.iter().map(|f| data(f)).collect();
    let mut builder = InputBuilder::new("default");
    for doc in read::read_paths(&paths).expect("vector files read") {
        builder.add(doc);
    }
    let inputs = builder.finish();
    let mut got: Found = analysis::analyze_with(&inputs, |n| n == v.analyzer)
        .iter()
        .map(|m| (m.name.to_string(), m.object.friendly_name()))
        .collect();
    let mut want: Found = v
        .expected
        .iter()
        .map(|(name, o)| (name.to_string(), origin(o)))
        .collect();
    got.sort();
    want.sort();
    (got, want)
}

#[test]
fn istio_analyzer_vectors() {
    let mut passed = Vec::new();
    let mut report = String::new();
    for v in VECTORS {
        assert!(
            analysis::ANALYZERS.iter().any(|(n, _)| *n == v.analyzer),
            "{}: no analyzer {}",
            v.name,
            v.analyzer
        );
        let (got, want) = run(v);
        let ok = got == want;
        let gap = KNOWN_GAPS.iter().any(|(n, _)| *n == v.name);
        if ok {
            passed.push(v.name);
        }
        if ok == gap {
            report.push_str(&format!(
                "{}: {} (known gap: {gap})\n  got:  {got:?}\n  want: {want:?}\n",
                v.name,
                if ok { "passes" } else { "fails" }
            ));
        }
    }
    println!(
        "analyzers_test.go vectors: {}/{} pass; known gaps: {}",
        passed.len(),
        VECTORS.len(),
        KNOWN_GAPS.len()
    );
    assert!(
        report.is_empty(),
        "vectors whose outcome differs from the known-gaps list:\n{report}"
    );
}

#[test]
fn every_message_type_named_by_a_vector_is_istios() {
    for v in VECTORS {
        for (name, _) in v.expected {
            let known = CATALOG.iter().any(|(_, n, _)| n == name);
            assert!(
                known || KNOWN_GAPS.iter().any(|(g, _)| *g == v.name),
                "{}: {name} is not in the catalog",
                v.name
            );
        }
    }
}

fn meshfed(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .args(args)
        .output()
        .expect("meshfed runs")
}

#[test]
fn the_cli_prints_istioctls_lines_and_exits_79_on_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Service\nmetadata: {name: reviews, namespace: default}\n\
         spec: {ports: [{name: http, port: 9080}], selector: {app: reviews}}\n---\n\
         apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: default}\n\
         spec:\n  hosts: [reviews]\n  http:\n  - route:\n    - destination: {host: reviews2}\n    - destination: {host: reviews, subset: v9}\n",
    )
    .unwrap();
    let out = meshfed(&["analyze", file.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let shown = file.display();
    assert!(
        stdout.contains(&format!(
            "Error [IST0101] (VirtualService default/reviews {shown}:6) Referenced host not found: \"reviews2\"\n"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "Error [IST0101] (VirtualService default/reviews {shown}:6) Referenced host+subset in destinationrule not found: \"reviews+v9\"\n"
        )),
        "{stdout}"
    );
    assert_eq!(out.status.code(), Some(79));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("Analyzers found issues when analyzing namespace: default.")
    );

    // JSON, and a threshold above the levels found: exit 0.
    let out = meshfed(&[
        "analyze",
        "-o",
        "json",
        "--failure-threshold",
        "Error",
        "--output-threshold",
        "Error",
        dir.path().to_str().unwrap(),
    ]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert_eq!(list[0]["code"], "IST0101");
    assert_eq!(list[0]["origin"], "VirtualService default/reviews");
    assert_eq!(
        list[0]["documentationUrl"],
        "https://istio.io/latest/docs/reference/config/analysis/ist0101/"
    );
    assert_eq!(out.status.code(), Some(79));
}

#[test]
fn clean_config_says_so_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ok.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Service\nmetadata: {name: reviews, namespace: default}\n\
         spec: {ports: [{name: http, port: 9080}], selector: {app: reviews}}\n---\n\
         apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: default}\n\
         spec:\n  hosts: [reviews]\n  http:\n  - route:\n    - destination: {host: reviews}\n",
    )
    .unwrap();
    let out = meshfed(&["analyze", file.to_str().unwrap()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "\u{2714} No validation issues found when analyzing namespace: default.\n"
    );
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn a_typo_is_a_schema_error_and_the_object_is_still_analyzed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("typo.yaml");
    std::fs::write(
        &file,
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: r, namespace: default}\n\
         spec: {host: reviews, trafficPolcy: {}}\n",
    )
    .unwrap();
    let out = meshfed(&[
        "analyze",
        "--failure-threshold",
        "Warning",
        file.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Error [IST0106] (DestinationRule default/r")
            && stdout.contains(
                "Schema validation error: spec.trafficPolcy: unknown field \"trafficPolcy\""
            ),
        "{stdout}"
    );
    assert_eq!(out.status.code(), Some(79));
    // `meshfed validate` rejects it too, naming the field.
    let out = meshfed(&["validate", "-f", file.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("spec.trafficPolcy: unknown field"),
        "{stdout}"
    );
    assert!(!out.status.success());
}

/// The server rejects an object with an unknown field as any invalid one, and lists the
/// Istio fields it does not act on under `unsupportedFields` in `/debug/configz`.
#[tokio::test]
async fn the_server_rejects_unknown_fields_and_lists_ignored_ones() {
    use meshfed::testing::FakeServer;

    use crate::support::{get_json, ready_and_synced};

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("c.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: typo, namespace: default}\n\
         spec: {host: reviews, trafficPolcy: {}}\n---\n\
         apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: warm, namespace: default}\n\
         spec: {host: reviews, trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN, warmup: {duration: 10s}}}}\n",
    )
    .unwrap();
    let server = FakeServer::builder()
        .config_dir(dir.path())
        .start()
        .await
        .unwrap();
    ready_and_synced(&server).await;
    let configz = get_json(server.bound().http, "/debug/configz").await;
    let rejected = configz["rejected"].to_string();
    assert!(
        rejected.contains("typo") && rejected.contains("spec.trafficPolcy: unknown field"),
        "{rejected}"
    );
    let names: Vec<&str> = configz["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["warm"]);
    assert_eq!(
        configz["unsupportedFields"],
        serde_json::json!([{"kind": "DestinationRule", "namespace": "default", "name": "warm",
            "source": format!("{}:6", dir.path().join("c.yaml").display()),
            "field": "spec.trafficPolicy.loadBalancer.warmup",
            "message": "not supported by meshfed; ignored"}])
    );
    server.shutdown().await;
}

/// `meshfed analyze --kubeconfig`: the cluster's objects of `-n` (all with `-A`).
#[tokio::test]
async fn a_cluster_is_analyzed_through_its_kubeconfig() {
    use meshfed_kube::fake_api::{CustomResource, FakeApiServer, objects};
    use serde_json::json;

    let api = FakeApiServer::start().await.unwrap();
    api.install_crd(CustomResource::new(
        "networking.istio.io",
        "VirtualService",
        "virtualservices",
        &["v1"],
    ));
    api.apply(&objects::namespace("default", &[]));
    api.apply(&objects::service(
        "default",
        "reviews",
        "10.0.0.1",
        &[("http", 9080)],
    ));
    for (ns, host) in [("default", "reviews2"), ("other", "nosuch")] {
        api.apply_custom(&json!({
            "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "reviews", "namespace": ns},
            "spec": {"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": host}}]}]},
        }));
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    let run = |extra: &'static [&'static str]| {
        let kubeconfig = kubeconfig.clone();
        async move {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
                .arg("analyze")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(extra)
                .env_remove("KUBECONFIG")
                .output()
                .await
                .unwrap()
        }
    };
    let out = run(&[]).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "Error [IST0101] (VirtualService default/reviews) Referenced host not found: \"reviews2\"\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(79));
    let out = run(&["-A"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("(VirtualService other/reviews) Referenced host not found: \"nosuch\""),
        "{stdout}"
    );
}

//! The validating admission webhook: Kubernetes' AdmissionReview bodies over HTTPS to
//! `--httpsAddr` (a good and a bad object of every kind meshfed reads, with the
//! reasons `meshfed validate` gives), the vectors of Istio's
//! `pkg/webhooks/validation/server/server_test.go`, and the leader's upkeep of the
//! ValidatingWebhookConfigurations against the fake API server with deploy/rbac.yaml
//! enforced (Istio's `controller_test.go`).
//!
//! Istio vectors ported: server_test.go TestAdmitPilot 6/6, TestServe 6/6, TestValidate
//! 2/2 (the `--httpsAddr` port check); controller_test.go TestGreenfield 4/4 steps,
//! TestCABundleChange 1/1, TestUpdateAll 1/1, TestBackoff 1/1 (as retries after a
//! refused write). TestLoadCaCertPem does not apply: the bundle is the CA's own root.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use meshfed::app::CaSource;
use meshfed::testing::FakeServer;
use meshfed_kube::fake_api::{FakeApiServer, RbacPolicy};
use meshfed_kube::webhook_config::ValidatingWebhookConfiguration;
use serde_json::{Value, json};

use crate::support::*;

const SERVER_NAME: &str = "istiod.istio-system.svc";

struct Webhook {
    _dir: tempfile::TempDir,
    root: String,
    server: FakeServer,
    addr: SocketAddr,
}

async fn webhook() -> Webhook {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let server = FakeServer::builder()
        .configure(|c| {
            c.ca = Some(CaSource::Dir {
                cacerts: None,
                self_signed_dir: ca_dir.clone(),
            });
            c.https_addr = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        })
        .start()
        .await
        .unwrap();
    let addr = server.bound().https.expect("the webhook is served");
    Webhook {
        root: std::fs::read_to_string(ca_dir.join("root-cert.pem")).unwrap(),
        _dir: dir,
        server,
        addr,
    }
}

impl Webhook {
    /// An HTTPS client that trusts the mesh root and checks istiod's name, as the API
    /// server does with the `caBundle`.
    fn client(&self, alpn: &[u8]) -> reqwest::Client {
        let roots = meshfed::testing::root_store(&self.root).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![alpn.to_vec()];
        let mut builder = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .resolve(SERVER_NAME, self.addr);
        if alpn == b"h2" {
            builder = builder.http2_prior_knowledge();
        }
        builder.build().unwrap()
    }

    fn url(&self, path: &str) -> String {
        format!("https://{SERVER_NAME}:{}{path}", self.addr.port())
    }

    async fn post(&self, path: &str, content_type: &str, body: Vec<u8>) -> (u16, String) {
        let response = self
            .client(b"http/1.1")
            .post(self.url(path))
            .header("Content-Type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    async fn review(&self, body: &Value) -> Value {
        let (status, text) = self
            .post(
                "/validate",
                "application/json",
                body.to_string().into_bytes(),
            )
            .await;
        assert_eq!(status, 200, "{text}");
        serde_json::from_str(&text).unwrap()
    }
}

/// A Kubernetes v1 AdmissionReview request as the API server sends it for `object`.
fn admission_review(
    api_version: &str,
    object: &Value,
    operation: &str,
    dry_run: bool,
    uid: &str,
) -> Value {
    let (group, version) = object["apiVersion"]
        .as_str()
        .unwrap()
        .split_once('/')
        .unwrap();
    let kind = object["kind"].as_str().unwrap();
    let resource = meshfed_registry::config::Kind::from_name(kind)
        .map(|k| k.plural().to_string())
        .unwrap_or_else(|| format!("{}s", kind.to_lowercase()));
    let gvk = json!({"group": group, "version": version, "kind": kind});
    let gvr = json!({"group": group, "version": version, "resource": resource});
    json!({
        "kind": "AdmissionReview",
        "apiVersion": api_version,
        "request": {
            "uid": uid,
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": object["metadata"]["name"],
            "namespace": object["metadata"]["namespace"],
            "operation": operation,
            "userInfo": {
                "username": "kubernetes-admin",
                "groups": ["kubeadm:cluster-admins", "system:authenticated"]
            },
            "object": if operation == "DELETE" { Value::Null } else { object.clone() },
            "oldObject": if operation == "CREATE" { Value::Null } else { object.clone() },
            "dryRun": dry_run,
            "options": {
                "kind": if operation == "UPDATE" { "UpdateOptions" } else { "CreateOptions" },
                "apiVersion": "meta.k8s.io/v1",
                "fieldManager": "kubectl-client-side-apply",
                "fieldValidation": "Strict"
            }
        }
    })
}

/// An object as it reaches the webhook: the API server has filled its metadata.
fn object(api_version: &str, kind: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": "0c5a2d5e-7f43-4c4e-9bb6-3d5b5cbd1f0a",
            "generation": 1,
            "creationTimestamp": "2026-11-27T13:00:00Z",
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{}\n"
            },
            "managedFields": [{
                "manager": "kubectl-client-side-apply",
                "operation": "Update",
                "apiVersion": api_version,
                "time": "2026-11-27T13:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {}}
            }]
        },
        "spec": spec
    })
}

/// A good and a bad spec of every kind meshfed reads.
fn kinds() -> Vec<(&'static str, &'static str, Value, Value)> {
    let net = "networking.istio.io/v1";
    let sec = "security.istio.io/v1";
    vec![
        (
            net,
            "VirtualService",
            json!({"hosts": ["reviews"], "http": [{"route": [
                {"destination": {"host": "reviews", "subset": "v1"}, "weight": 60},
                {"destination": {"host": "reviews", "subset": "v2"}, "weight": 40}]}]}),
            json!({"hosts": ["reviews"], "http": [{"route": [
                {"destination": {"host": "reviews", "subset": "v1"}, "weight": 60},
                {"destination": {"host": "reviews", "subset": "v2"}, "weight": 50}]}]}),
        ),
        (
            net,
            "DestinationRule",
            json!({"host": "reviews", "subsets": [{"name": "v1", "labels": {"version": "v1"}}]}),
            json!({"subsets": [{"name": "v1", "labels": {"version": "v1"}}]}),
        ),
        (
            net,
            "Gateway",
            json!({"selector": {"istio": "ingressgateway"}, "servers": [
                {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]}),
            json!({"selector": {"istio": "ingressgateway"}, "servers": []}),
        ),
        (
            net,
            "ServiceEntry",
            json!({"hosts": ["api.example.com"], "ports": [
                {"number": 443, "name": "https", "protocol": "TLS"}],
                "location": "MESH_EXTERNAL", "resolution": "DNS"}),
            json!({"ports": [{"number": 443, "name": "https", "protocol": "TLS"}],
                "resolution": "DNS"}),
        ),
        (
            net,
            "WorkloadEntry",
            json!({"address": "10.0.0.1", "labels": {"app": "vm"}}),
            json!({"address": "10.0.0.1", "ports": {"http": 70000}}),
        ),
        (
            net,
            "Sidecar",
            json!({"egress": [{"hosts": ["./*", "istio-system/*"]}]}),
            json!({"egress": [{"hosts": []}]}),
        ),
        (
            net,
            "WorkloadGroup",
            json!({"template": {"address": "10.0.0.1"}}),
            json!({"template": {"address": "10.0.0.1"}, "probe": {"periodSeconds": -1}}),
        ),
        (
            sec,
            "PeerAuthentication",
            json!({"mtls": {"mode": "STRICT"}}),
            json!({"mtls": {"mode": "STRICT"}, "portLevelMtls": {"8080": {"mode": "DISABLE"}}}),
        ),
        (
            sec,
            "RequestAuthentication",
            json!({"selector": {"matchLabels": {"app": "a"}},
                "jwtRules": [{"issuer": "https://issuer.example.com"}]}),
            json!({"selector": {"matchLabels": {"app": "a"}}, "jwtRules": [{"issuer": ""}]}),
        ),
        (
            sec,
            "AuthorizationPolicy",
            json!({"action": "ALLOW", "rules": [{"from": [{"source": {"namespaces": ["default"]}}]}]}),
            json!({"action": "ALLOW", "provider": {"name": "ext"}, "rules": [{}]}),
        ),
        (
            "telemetry.istio.io/v1",
            "Telemetry",
            json!({"tracing": [{"randomSamplingPercentage": 10.0}]}),
            json!({"tracing": [{"randomSamplingPercentage": 200.0}]}),
        ),
        (
            "networking.istio.io/v1alpha3",
            "EnvoyFilter",
            json!({"configPatches": [{"applyTo": "CLUSTER",
                "patch": {"operation": "MERGE", "value": {"connect_timeout": "1s"}}}]}),
            json!({"configPatches": [{"applyTo": "CLUSTER", "patch": {"operation": "ADD"}}]}),
        ),
        (
            "extensions.istio.io/v1alpha1",
            "WasmPlugin",
            json!({"url": "oci://ghcr.io/example/auth:1.0", "phase": "AUTHN"}),
            json!({"url": "ftp://example.com/plugin.wasm"}),
        ),
    ]
}

/// What `meshfed validate` reports for `object`: its errors and warnings as
/// `field: message`.
fn cli_findings(object: &Value) -> (Vec<String>, Vec<String>) {
    let report =
        meshfed_registry::config::validate_text(Path::new("obj.json"), &object.to_string());
    let text = |d: &meshfed_registry::config::Diagnostic| {
        if d.field.is_empty() {
            d.message.clone()
        } else {
            format!("{}: {}", d.field, d.message)
        }
    };
    (
        report.errors.iter().map(text).collect(),
        report.warnings.iter().map(text).collect(),
    )
}

#[tokio::test]
async fn every_kind_meshfed_reads_is_admitted_or_denied_as_meshfed_validate_says() {
    let wh = webhook().await;
    let all = kinds();
    // The Gateway API kinds never reach the webhook: deploy/webhook.yaml's rules name
    // Istio's groups only, as istiod's do (their CRDs' own schemas validate them).
    let istio_kinds = meshfed_registry::config::Kind::ALL
        .into_iter()
        .filter(|k| !k.is_gateway_api())
        .count();
    assert_eq!(
        all.len(),
        istio_kinds,
        "a good and a bad object of every Istio kind meshfed reads"
    );
    for (i, (api_version, kind, good, bad)) in all.into_iter().enumerate() {
        let name = kind.to_lowercase();
        let good = object(api_version, kind, &name, good);
        let uid = format!("705ab4f5-6393-11e8-b7cc-42010a8000{i:02}");
        let answer = wh
            .review(&admission_review(
                "admission.k8s.io/v1",
                &good,
                "CREATE",
                false,
                &uid,
            ))
            .await;
        assert_eq!(answer["kind"], "AdmissionReview");
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(answer["response"]["uid"], uid.as_str(), "uid echoed");
        assert_eq!(answer["response"]["allowed"], true, "{kind}: {answer}");
        let (errors, warnings) = cli_findings(&good);
        assert!(errors.is_empty(), "{kind}: {errors:?}");
        let got: Vec<String> = answer["response"]["warnings"]
            .as_array()
            .map(|w| w.iter().map(|w| w.as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        assert_eq!(
            got, warnings,
            "{kind}: warnings returned as admission warnings"
        );

        let bad = object(api_version, kind, &name, bad);
        let answer = wh
            .review(&admission_review(
                "admission.k8s.io/v1",
                &bad,
                "UPDATE",
                false,
                &uid,
            ))
            .await;
        let response = &answer["response"];
        assert_eq!(response["uid"], uid.as_str());
        assert_eq!(response["allowed"], false, "{kind}: {answer}");
        let message = response["status"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("configuration is invalid: ")
                || message.starts_with("error decoding configuration: "),
            "{kind}: {message}"
        );
        let (errors, _) = cli_findings(&bad);
        assert!(
            !errors.is_empty(),
            "{kind}: meshfed validate rejects it too"
        );
        for error in &errors {
            assert!(
                message.contains(error.as_str()),
                "{kind}: {message} lacks {error}"
            );
        }
        assert!(
            response["status"]["code"].is_null() && response["status"]["reason"].is_null(),
            "istiod sets the message only: {answer}"
        );
    }
    // The headline case: weights summing to 110.
    let (_, vs, _, bad) = kinds().remove(0);
    let bad = object("networking.istio.io/v1", vs, "reviews", bad);
    let answer = wh
        .review(&admission_review(
            "admission.k8s.io/v1",
            &bad,
            "CREATE",
            false,
            "u-110",
        ))
        .await;
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("total destination weight 110 != 100"),
        "{message}"
    );
    let (_, metrics) = http_get(wh.server.bound().monitoring, "/metrics").await;
    let passed = "galley_validation_passed{group=\"networking.istio.io\",version=\"v1\",resource=\"virtualservices\"}";
    assert_eq!(metric(&metrics, passed), Some(1.0), "{metrics}");
    let failed = "galley_validation_failed{group=\"networking.istio.io\",version=\"v1\",resource=\"virtualservices\",reason=\"invalid_resource\",dry_run=\"false\"}";
    assert_eq!(metric(&metrics, failed), Some(2.0), "{metrics}");
}

#[tokio::test]
async fn operations_dry_runs_unknown_kinds_and_versions_follow_istiod() {
    let wh = webhook().await;
    let (_, vs, _, bad) = kinds().remove(0);
    let bad = object("networking.istio.io/v1", vs, "reviews", bad);
    // DELETE (and CONNECT) are allowed without a look, as istiod does.
    let answer = wh
        .review(&admission_review(
            "admission.k8s.io/v1",
            &bad,
            "DELETE",
            false,
            "d",
        ))
        .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    // A dry run gets the same answer.
    let answer = wh
        .review(&admission_review(
            "admission.k8s.io/v1",
            &bad,
            "CREATE",
            true,
            "dry",
        ))
        .await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    // v1beta1 reviews are answered in v1beta1.
    let answer = wh
        .review(&admission_review(
            "admission.k8s.io/v1beta1",
            &bad,
            "CREATE",
            false,
            "b",
        ))
        .await;
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(answer["response"]["allowed"], false);
    // An Istio group's kind neither istiod nor meshfed knows.
    let mut unknown = bad.clone();
    unknown["kind"] = json!("VirtualServiceTypo");
    let answer = wh
        .review(&admission_review(
            "admission.k8s.io/v1",
            &unknown,
            "CREATE",
            false,
            "k",
        ))
        .await;
    assert_eq!(
        answer["response"]["status"]["message"],
        "unrecognized type networking.istio.io/v1, Kind=VirtualServiceTypo"
    );
    // An Istio kind meshfed does not read: allowed, with a warning saying so.
    let filter = object(
        "networking.istio.io/v1beta1",
        "ProxyConfig",
        "f",
        json!({"concurrency": 2}),
    );
    let answer = wh
        .review(&admission_review(
            "admission.k8s.io/v1",
            &filter,
            "CREATE",
            false,
            "e",
        ))
        .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(
        answer["response"]["warnings"][0]
            .as_str()
            .unwrap()
            .contains("not read by meshfed"),
        "{answer}"
    );
    // The other path istiod serves, and HTTP/2 as the API server may negotiate.
    let response = wh
        .client(b"h2")
        .post(wh.url("/validate/"))
        .header("Content-Type", "application/json")
        .body(admission_review("admission.k8s.io/v1", &bad, "CREATE", false, "h2").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["response"]["uid"], "h2");
    // Over the limit: 400 with the reason.
    let (status, text) = wh
        .post(
            "/validate",
            "application/json",
            vec![b' '; 6 * 1024 * 1024 + 1],
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(text, "Request entity too large: limit is 6291456\n");
    let (_, metrics) = http_get(wh.server.bound().monitoring, "/metrics").await;
    let dry = "galley_validation_failed{group=\"networking.istio.io\",version=\"v1\",resource=\"virtualservices\",reason=\"invalid_resource\",dry_run=\"true\"}";
    assert_eq!(metric(&metrics, dry), Some(1.0), "{metrics}");
    let unsupported = "galley_validation_failed{group=\"networking.istio.io\",version=\"v1\",resource=\"virtualservices\",reason=\"unsupported_operation\",dry_run=\"false\"}";
    assert_eq!(metric(&metrics, unsupported), Some(1.0), "{metrics}");
    assert_eq!(
        metric(&metrics, "galley_validation_http_error{status=\"400\"}"),
        Some(1.0)
    );
}

/// Istio's TestServe and TestAdmitPilot over HTTPS (a VirtualService for the mock
/// kind, weights 60/40 valid and 60/50 invalid).
#[tokio::test]
async fn istio_server_test_vectors() {
    let wh = webhook().await;
    let (_, vs, good, bad) = kinds().remove(0);
    let valid = object("networking.istio.io/v1", vs, "mock-config0", good);
    let invalid = object("networking.istio.io/v1", vs, "mock-config0", bad);
    let review = |v: &str, o: &Value| admission_review(v, o, "CREATE", false, "t");
    let mut passed = 0;
    // TestServe: (name, body, content type, status, allowed).
    let serve: [(&str, Vec<u8>, &str, u16, bool); 6] = [
        (
            "valid",
            review("admission.k8s.io/v1beta1", &valid)
                .to_string()
                .into(),
            "application/json",
            200,
            true,
        ),
        (
            "valid(v1 version)",
            review("admission.k8s.io/v1", &valid).to_string().into(),
            "application/json",
            200,
            true,
        ),
        (
            "invalid",
            review("admission.k8s.io/v1beta1", &invalid)
                .to_string()
                .into(),
            "application/json",
            200,
            false,
        ),
        (
            "wrong content-type",
            review("admission.k8s.io/v1beta1", &valid)
                .to_string()
                .into(),
            "application/yaml",
            415,
            false,
        ),
        (
            "bad content",
            vec![0, 1, 2, 3, 4, 5],
            "application/json",
            200,
            false,
        ),
        ("no content", Vec::new(), "application/json", 400, false),
    ];
    for (name, body, content_type, status, allowed) in serve {
        let (got, text) = wh.post("/validate", content_type, body).await;
        assert_eq!(got, status, "{name}: {text}");
        if got == 200 {
            let answer: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(answer["response"]["allowed"], allowed, "{name}: {answer}");
        }
        passed += 1;
    }
    // TestAdmitPilot: (name, operation, object, allowed).
    let mut extra = valid.clone();
    extra["unexpected_key"] = json!("any value");
    let admit: [(&str, &str, Value, bool); 6] = [
        ("valid create", "CREATE", valid.clone(), true),
        ("valid update", "UPDATE", valid.clone(), true),
        ("unsupported operation", "DELETE", valid.clone(), true),
        ("invalid spec", "CREATE", invalid.clone(), false),
        (
            "corrupt object",
            "CREATE",
            json!(format!("---{valid}")),
            false,
        ),
        ("invalid extra key create", "CREATE", extra, false),
    ];
    for (name, operation, object, allowed) in admit {
        let mut body = admission_review("admission.k8s.io/v1", &valid, operation, false, name);
        body["request"]["object"] = object;
        let answer = wh.review(&body).await;
        assert_eq!(answer["response"]["allowed"], allowed, "{name}: {answer}");
        passed += 1;
    }
    let answer = {
        let mut body = review("admission.k8s.io/v1", &valid);
        body["request"]["object"]["unexpected_key"] = json!("x");
        wh.review(&body).await
    };
    assert_eq!(
        answer["response"]["status"]["message"],
        "unknown field \"unexpected_key\" on VirtualService resource default/mock-config0"
    );
    // TestValidate: the port must be in 1..65535 (`--httpsAddr`).
    let bin = env!("CARGO_BIN_EXE_meshfed");
    let out = std::process::Command::new(bin)
        .args(["discovery", "--httpsAddr", ":100000"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--httpsAddr"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    passed += 1;
    // ... and a valid one serves (the webhook on with a CA).
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready.json");
    let ca_dir = dir.path().join("ca");
    let mut child = std::process::Command::new(bin)
        .args(discovery_args(
            &ready,
            &["--caDir", ca_dir.to_str().unwrap()],
        ))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let json = wait_for_ready_file(&mut child, &ready).await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(json["secureGrpcAddr"].is_string(), "{json}");
    passed += 1;
    assert_eq!(passed, 14, "server_test.go vectors passing");
}

// === the ValidatingWebhookConfigurations ===

const NAME: &str = "istio-validator-istio-system";

fn unpatched(name: &str, revision: Option<&str>) -> ValidatingWebhookConfiguration {
    let hook = |name: &str, path: &str| {
        json!({
            "name": name,
            "clientConfig": {"service": {"name": "istiod", "namespace": "istio-system", "path": path}},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["networking.istio.io"],
                "apiVersions": ["*"], "resources": ["*"]}],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"]
        })
    };
    let mut metadata = json!({"name": name});
    if let Some(revision) = revision {
        metadata["labels"] = json!({"istio.io/rev": revision});
    }
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": metadata,
        "webhooks": [hook("hook0", "/hook0"), hook("hook1", "/hook1")]
    }))
    .unwrap()
}

/// Each webhook's (caBundle, failurePolicy).
fn state(api: &FakeApiServer, name: &str) -> Vec<(Option<String>, String)> {
    let config: ValidatingWebhookConfiguration = api.get(None, name).expect("configuration");
    let config = serde_json::to_value(config).unwrap();
    config["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            let bundle = h["clientConfig"]["caBundle"]
                .as_str()
                .map(|b| String::from_utf8(base64_decode(b)).unwrap());
            (
                bundle,
                h["failurePolicy"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Standard base64 (the wire form of `caBundle`).
fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::new();
    for c in text.bytes().filter(|c| *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c).expect("base64") as u32;
        bits = (bits << 6) | v;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    out
}

/// A probe that refuses (Istio's reactors: the invalid Gateway accepted, then
/// refused for an unknown reason, alternately) until the test opens it.
#[derive(Default)]
struct Gate {
    open: std::sync::atomic::AtomicBool,
    calls: std::sync::atomic::AtomicUsize,
}

impl meshfed_kube::FailCloseProbe for Gate {
    fn check(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        use std::sync::atomic::Ordering::SeqCst;
        let call = self.calls.fetch_add(1, SeqCst);
        let verdict = if self.open.load(SeqCst) {
            meshfed_kube::webhook_config::probe_verdict(Err(
                "admission webhook \"validation.istio.io\" denied the request".into(),
            ))
        } else if call.is_multiple_of(2) {
            meshfed_kube::webhook_config::probe_verdict(Ok(()))
        } else {
            meshfed_kube::webhook_config::probe_verdict(Err(
                "Internal error occurred: unknown error".into(),
            ))
        };
        Box::pin(async move { verdict })
    }
}

struct Patcher {
    root: tokio::sync::watch::Sender<String>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    stats: Arc<meshfed_kube::WebhookConfigStats>,
}

fn start_patcher(
    api: &FakeApiServer,
    leader: Arc<meshfed_kube::LeaseState>,
    probe: Arc<dyn meshfed_kube::FailCloseProbe>,
) -> Patcher {
    let (root, root_rx) = tokio::sync::watch::channel("CA0".to_string());
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let stats = Arc::new(meshfed_kube::WebhookConfigStats::default());
    let task = tokio::spawn(meshfed_kube::run_webhook_config_patcher(
        api.client(),
        meshfed_kube::WebhookConfigSettings {
            revision: "default".into(),
        },
        leader,
        root_rx,
        probe,
        stats.clone(),
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        },
    ));
    Patcher {
        root,
        stop,
        task,
        stats,
    }
}

impl Patcher {
    async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.unwrap();
    }
}

/// TestGreenfield, TestCABundleChange and TestUpdateAll: the bundle is written while
/// the probe fails (fail-open stays), `Fail` once invalid config is denied, a new
/// root reaches every selected configuration, unselected ones are left alone.
#[tokio::test]
async fn the_leader_patches_ca_bundle_then_fail_closes_and_follows_the_root() {
    let api = EnforcedApi::start().await;
    api.apply(&unpatched(NAME, Some("default")));
    api.apply(&unpatched("second", Some("default")));
    api.apply(&unpatched("other-revision", Some("canary")));
    api.apply(&unpatched("unlabelled", None));
    let probe = Arc::new(Gate::default());
    let leader = Arc::new(meshfed_kube::LeaseState::sole());
    let patcher = start_patcher(&api, leader, probe.clone());
    let ignore = |b: &str| vec![(Some(b.to_string()), "Ignore".to_string()); 2];
    let fail = |b: &str| vec![(Some(b.to_string()), "Fail".to_string()); 2];
    let api_ref = &*api;
    eventually("caBundle written, still fail-open", || async move {
        (state(api_ref, NAME) == ignore("CA0")).then_some(())
    })
    .await;
    let probe_ref = &probe;
    eventually("retried with backoff while refused", || async move {
        (probe_ref.calls.load(std::sync::atomic::Ordering::SeqCst) >= 3).then_some(())
    })
    .await;
    assert_eq!(state(&api, NAME), ignore("CA0"), "still fail-open");
    probe.open.store(true, std::sync::atomic::Ordering::SeqCst);
    eventually("fail-closed once the probe sees a denial", || async move {
        (state(api_ref, NAME) == fail("CA0") && state(api_ref, "second") == fail("CA0"))
            .then_some(())
    })
    .await;
    patcher.root.send("CA1".to_string()).unwrap();
    eventually("the new root everywhere", || async move {
        (state(api_ref, NAME) == fail("CA1") && state(api_ref, "second") == fail("CA1"))
            .then_some(())
    })
    .await;
    for untouched in ["other-revision", "unlabelled"] {
        assert_eq!(
            state(&api, untouched),
            vec![(None, "Ignore".to_string()); 2],
            "{untouched} is not this revision's"
        );
    }
    assert!(patcher.stats.updates() >= 5, "{}", patcher.stats.updates());
    assert_eq!(patcher.stats.errors(), 0);
    patcher.stop().await;
}

/// Istio's probe against the API server (deploy/rbac.yaml enforced): a dry-run
/// create of the invalid Gateway, allowed by the role. This API server has no webhook,
/// so nothing denies it: the bundle is written, the policy stays `Ignore` and the probe
/// is retried.
#[tokio::test]
async fn the_dry_run_probe_is_allowed_by_deploy_rbac_and_keeps_fail_open_until_denied() {
    let api = EnforcedApi::start().await;
    api.apply(&unpatched(NAME, Some("default")));
    let probe = Arc::new(meshfed_kube::DryRunProbe::new(
        api.client(),
        "istio-system",
        "default",
    ));
    let patcher = start_patcher(&api, Arc::new(meshfed_kube::LeaseState::sole()), probe);
    let api_ref = &*api;
    let gateway_posts = || {
        api_ref
            .requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/gateways"))
            .collect::<Vec<_>>()
    };
    eventually("bundle written, probe retried", || async move {
        (state(api_ref, NAME) == vec![(Some("CA0".to_string()), "Ignore".to_string()); 2]
            && gateway_posts().len() >= 2)
            .then_some(())
    })
    .await;
    for post in gateway_posts() {
        assert!(
            post.path
                .ends_with("/apis/networking.istio.io/v1alpha3/namespaces/istio-system/gateways"),
            "{post:?}"
        );
        assert_eq!(
            post.query.get("dryRun").map(String::as_str),
            Some("All"),
            "{post:?}"
        );
        assert!(!post.denied);
    }
    patcher.stop().await;
}

/// A refused write (no `update` in the role) is counted by reason and retried with
/// backoff (TestBackoff); the patcher keeps running. A replica that does not lead
/// writes nothing.
#[tokio::test]
async fn forbidden_writes_are_counted_and_retried_and_followers_do_not_write() {
    let api = FakeApiServer::start().await.unwrap();
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "read-only"},
        "rules": [{
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "verbs": ["get", "list", "watch"]
        }]
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "read-only"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "read-only"},
        "subjects": [{"kind": "User", "name": meshfed_kube::fake_api::DEFAULT_USER}]
    });
    api.enforce(RbacPolicy::from_roles(&[role, binding], "istio-system").unwrap());
    api.apply(&unpatched(NAME, Some("default")));
    // A follower: synced, but no writes.
    let follower = start_patcher(
        &api,
        Arc::new(meshfed_kube::LeaseState::default()),
        Arc::new(Gate::default()),
    );
    let leader = start_patcher(
        &api,
        Arc::new(meshfed_kube::LeaseState::sole()),
        Arc::new(Gate::default()),
    );
    let stats = leader.stats.clone();
    let stats_ref = &stats;
    eventually("refused writes retried", || async move {
        (stats_ref.errors_for("Forbidden") >= 3).then_some(())
    })
    .await;
    assert_eq!(state(&api, NAME), vec![(None, "Ignore".to_string()); 2]);
    assert_eq!(follower.stats.errors(), 0, "the follower never wrote");
    assert_eq!(follower.stats.updates(), 0);
    let puts = api.requests().iter().filter(|r| r.method == "PUT").count() as u64;
    assert_eq!(
        puts,
        stats.errors_for("Forbidden"),
        "each refusal is the leader's"
    );
    follower.stop().await;
    leader.stop().await;
    let mut registry = prometheus_client::registry::Registry::default();
    stats.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("galley_validation_config_update_error{error=\"Forbidden\"}"),
        "{text}"
    );
}

/// Runs the leader's patcher with Istio's probe against `api` until it has written one
/// labelled configuration and sent the dry-run Gateway (for tests/it/rbac.rs, which
/// checks that deploy/rbac.yaml grants exactly what meshfed uses).
pub async fn patch_validator_once(api: &FakeApiServer) {
    api.apply(&unpatched(NAME, Some("default")));
    let probe = Arc::new(meshfed_kube::DryRunProbe::new(
        api.client(),
        "istio-system",
        "default",
    ));
    let patcher = start_patcher(api, Arc::new(meshfed_kube::LeaseState::sole()), probe);
    let stats = &patcher.stats;
    eventually("the validator patched", || async move {
        (stats.updates() >= 1
            && api
                .requests()
                .iter()
                .any(|r| r.method == "POST" && r.path.ends_with("/gateways")))
        .then_some(())
    })
    .await;
    patcher.stop().await;
}

/// The whole path as deployed: meshfed on the fake API server (Kubernetes CA, leader
/// election, deploy/rbac.yaml enforced) with deploy/webhook.yaml applied fills each
/// configuration's `caBundle`, and that bundle is what an API server needs to trust
/// the webhook's serving certificate under istiod's name.
#[tokio::test]
async fn deploy_webhook_yaml_gets_the_bundle_that_trusts_the_served_certificate() {
    let api = EnforcedApi::start().await;
    api.apply(&meshfed_kube::fake_api::objects::namespace(
        "istio-system",
        &[],
    ));
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/webhook.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut names = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let value = <Value as serde::Deserialize>::deserialize(doc).unwrap();
        let config: ValidatingWebhookConfiguration = serde_json::from_value(value).unwrap();
        names.push(config.metadata.name.clone().unwrap());
        api.apply(&config);
    }
    assert_eq!(names.len(), 2);
    let client = api.client();
    let server = FakeServer::builder()
        .configure(move |c| {
            crate::secure::kube_ca(c, client);
            c.https_addr = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        })
        .start()
        .await
        .unwrap();
    let api_ref = &*api;
    let mut bundles = Vec::new();
    for name in &names {
        let hooks = eventually("caBundle patched in", || async move {
            let hooks = state(api_ref, name);
            hooks
                .iter()
                .all(|(bundle, _)| bundle.is_some())
                .then_some(hooks)
        })
        .await;
        bundles.extend(hooks.into_iter().filter_map(|(bundle, _)| bundle));
    }
    assert!(
        bundles.windows(2).all(|w| w[0] == w[1]),
        "one root everywhere"
    );
    let wh = Webhook {
        _dir: tempfile::tempdir().unwrap(),
        root: bundles[0].clone(),
        addr: server.bound().https.expect("served"),
        server,
    };
    let (_, vs, _, bad) = kinds().remove(0);
    let bad = object("networking.istio.io/v1", vs, "reviews", bad);
    let answer = wh
        .review(&admission_review(
            "admission.k8s.io/v1",
            &bad,
            "CREATE",
            false,
            "e2e",
        ))
        .await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(answer["response"]["uid"], "e2e");
}

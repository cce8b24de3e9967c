//! Gateway credentials over SDS (ADS type `…tls.v3.Secret`): Secrets from the fake
//! Kubernetes API (with deploy/rbac.yaml enforced) and from the config directory,
//! served to a gateway with a verified identity on the secure port only, authorized by
//! namespace and SubjectAccessReview, checked before they are sent, and pushed to the
//! gateways that requested them alone.

use std::path::PathBuf;

use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{Secret, secret};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use meshfed::app::{CaSource, KubeSettings, KubeSource};
use meshfed::testing::{
    AdsClient, ClientTls, DeltaClient, FakeServer, decode_all, decode_delta, node_with, tls_channel,
};
use meshfed::xds::TypeUrl;
use meshfed_kube::fake_api::objects;
use tonic::metadata::MetadataMap;

use crate::secure::issue;
use crate::support::*;

const NS: &str = "gwns";
const SA: &str = "gw";
const USER: &str = "system:serviceaccount:gwns:gw";
const SERVER_NAME: &str = "istiod.istio-system.svc";

/// A self-signed certificate for `host` and its key, PEM.
fn cert(host: &str) -> (Vec<u8>, Vec<u8>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![host.to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem().into_bytes(), key.serialize_pem().into_bytes())
}

/// [`cert`], expired yesterday.
fn expired_cert(host: &str) -> (Vec<u8>, Vec<u8>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![host.to_string()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let cert = params.self_signed(&key).unwrap();
    (cert.pem().into_bytes(), key.serialize_pem().into_bytes())
}

struct Mesh {
    _dir: tempfile::TempDir,
    ca_dir: PathBuf,
    api: Option<EnforcedApi>,
    server: FakeServer,
}

/// A server with the secure port (self-signed CA), reading Kubernetes from an
/// enforced fake API server when `kube`, and `config_dir` when given.
async fn mesh(kube: bool, config_dir: Option<PathBuf>) -> Mesh {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let api = if kube {
        Some(EnforcedApi::start().await)
    } else {
        None
    };
    let client = api.as_ref().map(|a| a.client());
    let mut builder = FakeServer::builder();
    if let Some(config_dir) = config_dir {
        builder = builder.config_dir(config_dir);
    }
    if client.is_none() {
        builder = builder.embedded_mock_registry();
    }
    let ca = ca_dir.clone();
    let server = builder
        .configure(move |c| {
            c.ca = Some(CaSource::Dir {
                cacerts: None,
                self_signed_dir: ca,
            });
            if let Some(client) = client {
                c.kubernetes = Some(KubeSettings {
                    source: KubeSource::Client(client),
                    namespaces: meshfed_kube::NamespaceFilter::All,
                    system_namespace: "istio-system".into(),
                    remote_secrets: Default::default(),
                });
            }
        })
        .start()
        .await
        .unwrap();
    let http = server.bound().http;
    eventually("ready", || async move {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
    Mesh {
        _dir: dir,
        ca_dir,
        api,
        server,
    }
}

fn gateway(pod: &str) -> envoy_types::pb::envoy::config::core::v3::Node {
    node_with(
        &format!("router~10.0.0.9~{pod}.{NS}~{NS}.svc.cluster.local"),
        serde_json::json!({"SERVICE_ACCOUNT": SA, "LABELS": {"istio": "ingressgateway"}}),
    )
}

impl Mesh {
    fn api(&self) -> &EnforcedApi {
        self.api.as_ref().expect("a Kubernetes mesh")
    }

    async fn channel(&self) -> tonic::transport::Channel {
        let tls = ClientTls {
            roots_pem: std::fs::read_to_string(self.ca_dir.join("root-cert.pem")).unwrap(),
            identity: Some(issue(
                &self.ca_dir,
                &format!("spiffe://cluster.local/ns/{NS}/sa/{SA}"),
            )),
            server_name: SERVER_NAME.into(),
        };
        tls_channel(self.server.secure_grpc_addr(), &tls)
            .await
            .unwrap()
    }

    async fn gateway(&self, pod: &str) -> AdsClient {
        AdsClient::over(self.channel().await, MetadataMap::new(), gateway(pod))
            .await
            .unwrap()
    }

    async fn sdsz(&self) -> serde_json::Value {
        get_json(self.server.bound().http, "/debug/sdsz").await
    }

    fn secret(&self, name: &str, data: &[(&str, &[u8])]) {
        self.api()
            .apply(&objects::secret(NS, name, "kubernetes.io/tls", data));
    }
}

fn bytes(source: &Option<DataSource>) -> &[u8] {
    match source.as_ref().and_then(|s| s.specifier.as_ref()) {
        Some(data_source::Specifier::InlineBytes(b)) => b,
        other => panic!("not inline bytes: {other:?}"),
    }
}

/// Receives SDS responses (acking them) until `done` holds for their secrets.
async fn recv_secrets(
    client: &mut AdsClient,
    mut done: impl FnMut(&[Secret]) -> bool,
) -> Vec<Secret> {
    loop {
        let response = client.recv_type(TypeUrl::Secret).await.unwrap();
        let secrets: Vec<Secret> = decode_all(&response).unwrap();
        if done(&secrets) {
            return secrets;
        }
    }
}

fn names(secrets: &[Secret]) -> Vec<&str> {
    let mut names: Vec<&str> = secrets.iter().map(|s| s.name.as_str()).collect();
    names.sort();
    names
}

fn tls_of(secret: &Secret) -> (&[u8], &[u8]) {
    match &secret.r#type {
        Some(secret::Type::TlsCertificate(t)) => {
            (bytes(&t.certificate_chain), bytes(&t.private_key))
        }
        other => panic!("{}: not a certificate: {other:?}", secret.name),
    }
}

#[tokio::test]
async fn a_gateway_gets_its_secrets_in_both_layouts_and_a_ca_alone() {
    let mesh = mesh(true, None).await;
    let (a_cert, a_key) = cert("a.example.com");
    let (b_cert, b_key) = cert("b.example.com");
    let (ca, _) = cert("ca.example.com");
    mesh.secret("a", &[("tls.crt", &a_cert), ("tls.key", &a_key)]);
    mesh.secret("b", &[("cert", &b_cert), ("key", &b_key), ("cacert", &ca)]);
    mesh.secret("a-cacert", &[("ca.crt", &ca), ("ca.crl", b"CRL")]);
    mesh.api().grant_access(USER, "list", "secrets", NS);
    let mut gw = mesh.gateway("gw-1").await;
    gw.subscribe(
        TypeUrl::Secret,
        &[
            "kubernetes://a",
            &format!("kubernetes://{NS}/b"),
            "kubernetes://a-cacert",
            "kubernetes://b-cacert",
        ],
    )
    .await
    .unwrap();
    let secrets = recv_secrets(&mut gw, |s| s.len() == 4).await;
    assert_eq!(
        names(&secrets),
        [
            "kubernetes://a",
            "kubernetes://a-cacert",
            "kubernetes://b-cacert",
            "kubernetes://gwns/b"
        ]
    );
    let by_name = |n: &str| secrets.iter().find(|s| s.name == n).unwrap();
    assert_eq!(tls_of(by_name("kubernetes://a")), (&a_cert[..], &a_key[..]));
    assert_eq!(
        tls_of(by_name("kubernetes://gwns/b")),
        (&b_cert[..], &b_key[..])
    );
    // `a-cacert` is read from the Secret of that name, `b-cacert` from `b`.
    for (name, crl) in [
        ("kubernetes://a-cacert", Some(&b"CRL"[..])),
        ("kubernetes://b-cacert", None),
    ] {
        match &by_name(name).r#type {
            Some(secret::Type::ValidationContext(v)) => {
                assert_eq!(bytes(&v.trusted_ca), &ca[..], "{name}");
                assert_eq!(
                    v.crl
                        .as_ref()
                        .map(|c| bytes(&Some(c.clone())).to_vec())
                        .as_deref(),
                    crl,
                    "{name}"
                );
            }
            other => panic!("{name}: not a validation context: {other:?}"),
        }
    }
    // The review was asked of the API server for the gateway's service account.
    assert!(mesh.api().access_reviews().contains(&(
        USER.into(),
        "list".into(),
        "secrets".into(),
        NS.into()
    )));
    // Key material never shows on the debug page.
    let sdsz = mesh.sdsz().await.to_string();
    assert!(!sdsz.contains("PRIVATE KEY"), "{sdsz}");
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn other_namespaces_and_denied_reviews_get_nothing_but_the_ca() {
    let mesh = mesh(true, None).await;
    let (a_cert, a_key) = cert("a.example.com");
    mesh.secret(
        "a",
        &[
            ("tls.crt", &a_cert),
            ("tls.key", &a_key),
            ("ca.crt", &a_cert),
        ],
    );
    mesh.api().apply(&objects::secret(
        "other",
        "a",
        "",
        &[("tls.crt", &a_cert), ("tls.key", &a_key)],
    ));
    // No access granted: the review denies.
    let mut gw = mesh.gateway("gw-1").await;
    gw.subscribe(
        TypeUrl::Secret,
        &[
            "kubernetes://a",
            "kubernetes://other/a",
            "kubernetes://a-cacert",
        ],
    )
    .await
    .unwrap();
    let secrets = recv_secrets(&mut gw, |s| !s.is_empty()).await;
    assert_eq!(names(&secrets), ["kubernetes://a-cacert"]);
    let sdsz = mesh.sdsz().await;
    let conn = sdsz["proxies"]
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap()
        .clone();
    let denied = conn["denied"].as_object().unwrap();
    assert!(
        denied["kubernetes://a"]
            .as_str()
            .unwrap()
            .contains("SubjectAccessReview"),
        "{sdsz}"
    );
    assert!(
        denied["kubernetes://other/a"]
            .as_str()
            .unwrap()
            .contains("namespace"),
        "{sdsz}"
    );
    // The other namespace's Secret is never even read.
    assert!(
        !mesh
            .api()
            .requests()
            .iter()
            .any(|r| r.path.contains("/namespaces/other/secrets")),
        "{}",
        describe(&mesh.api().requests())
    );
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn missing_malformed_and_mismatched_secrets_are_not_sent_and_show_in_sdsz() {
    let mesh = mesh(true, None).await;
    let (good_cert, good_key) = cert("good.example.com");
    let (_, other_key) = cert("other.example.com");
    mesh.secret("good", &[("tls.crt", &good_cert), ("tls.key", &good_key)]);
    mesh.secret(
        "bad-pem",
        &[("tls.crt", b"not a certificate"), ("tls.key", &good_key)],
    );
    mesh.secret(
        "mismatch",
        &[("tls.crt", &good_cert), ("tls.key", &other_key)],
    );
    mesh.secret("empty", &[("tls.crt", b""), ("tls.key", b"")]);
    let (old_cert, old_key) = expired_cert("old.example.com");
    mesh.secret("expired", &[("tls.crt", &old_cert), ("tls.key", &old_key)]);
    // Types istiod never reads are not found, however sound.
    mesh.api().apply(&objects::secret(
        NS,
        "helm",
        "helm.sh/release.v1",
        &[("tls.crt", &good_cert), ("tls.key", &good_key)],
    ));
    mesh.api().grant_access(USER, "list", "secrets", NS);
    let mut gw = mesh.gateway("gw-1").await;
    gw.subscribe(
        TypeUrl::Secret,
        &[
            "kubernetes://good",
            "kubernetes://expired",
            "kubernetes://bad-pem",
            "kubernetes://mismatch",
            "kubernetes://empty",
            "kubernetes://missing",
            "kubernetes://helm",
            "default",
        ],
    )
    .await
    .unwrap();
    let http = mesh.server.bound().http;
    let errors = eventually("every error in /debug/sdsz", || async move {
        let sdsz = get_json(http, "/debug/sdsz").await;
        let conn = sdsz["proxies"].as_object()?.values().next()?.clone();
        let errors = conn["errors"].as_object()?;
        let settled =
            errors.len() == 6 && !errors.values().any(|e| e.to_string().contains("waiting"));
        settled.then_some(conn["errors"].clone())
    })
    .await;
    let error = |n: &str| errors[n].as_str().unwrap().to_string();
    assert!(
        error("kubernetes://bad-pem").contains("tls.crt"),
        "{errors}"
    );
    assert!(
        error("kubernetes://mismatch").contains("does not match"),
        "{errors}"
    );
    assert!(error("kubernetes://empty").contains("empty"), "{errors}");
    assert!(
        error("kubernetes://missing").contains("not found"),
        "{errors}"
    );
    assert!(error("default").contains("unsupported"), "{errors}");
    assert!(error("kubernetes://helm").contains("not found"), "{errors}");
    let sdsz = mesh.sdsz().await;
    let per_secret: Vec<String> = sdsz["secretErrors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(per_secret, ["bad-pem", "empty", "mismatch"], "{sdsz}");
    // Only the sound ones went out, the expired one too (as istiod), metered.
    let secrets = recv_secrets(&mut gw, |s| s.len() == 2).await;
    assert_eq!(
        names(&secrets),
        ["kubernetes://expired", "kubernetes://good"]
    );
    let metrics = http_get(mesh.server.bound().monitoring, "/metrics").await.1;
    assert!(
        metric(&metrics, "pilot_sds_certificate_errors_total").unwrap() >= 6.0,
        "{metrics}"
    );
    assert!(
        metric(&metrics, "meshfed_sds_expired_certificates_served_total").unwrap() >= 1.0,
        "{metrics}"
    );
    mesh.server.shutdown().await;
}

/// The push records naming a change of Secret `name`.
fn secret_pushes(mesh: &Mesh, name: &str) -> Vec<serde_json::Value> {
    mesh.server
        .server()
        .pipeline()
        .history()
        .into_iter()
        .filter(|p| {
            p.changes
                .iter()
                .any(|c| c == &format!("Secret/{NS}/{name}"))
        })
        .map(|p| serde_json::json!({"connections": p.connections, "proxies": p.proxies}))
        .collect()
}

#[tokio::test]
async fn a_secret_change_pushes_only_sds_and_only_to_the_gateway_that_asked() {
    let mesh = mesh(true, None).await;
    let (a1, a1_key) = cert("a.example.com");
    let (b, b_key) = cert("b.example.com");
    mesh.secret("a", &[("tls.crt", &a1), ("tls.key", &a1_key)]);
    mesh.secret("b", &[("tls.crt", &b), ("tls.key", &b_key)]);
    mesh.api().grant_access(USER, "list", "secrets", NS);
    let mut gw_a = mesh.gateway("gw-a").await;
    let mut gw_b = mesh.gateway("gw-b").await;
    for (gw, name) in [(&mut gw_a, "kubernetes://a"), (&mut gw_b, "kubernetes://b")] {
        gw.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
        gw.recv_type(TypeUrl::Cluster).await.unwrap();
        gw.subscribe(TypeUrl::Listener, &[]).await.unwrap();
        gw.recv_type(TypeUrl::Listener).await.unwrap();
        gw.subscribe(TypeUrl::Secret, &[name]).await.unwrap();
        recv_secrets(gw, |s| s.len() == 1).await;
    }
    let (a2, a2_key) = cert("a2.example.com");
    let before = secret_pushes(&mesh, "a").len();
    mesh.secret("a", &[("tls.crt", &a2), ("tls.key", &a2_key)]);
    // The next response gw-a gets is the new secret: no CDS or LDS came before it.
    let response: DiscoveryResponse = gw_a.recv().await.unwrap();
    assert_eq!(response.type_url, TypeUrl::Secret.as_str());
    let secrets: Vec<Secret> = decode_all(&response).unwrap();
    assert_eq!(tls_of(&secrets[0]), (&a2[..], &a2_key[..]));
    gw_a.ack(&response).await.unwrap();
    // The push reached gw-a alone.
    let pushes = secret_pushes(&mesh, "a");
    assert_eq!(pushes.len(), before + 1, "{pushes:?}");
    let last = pushes.first().unwrap();
    assert_eq!(last["connections"], 1, "{pushes:?}");
    assert!(
        last["proxies"][0]
            .as_str()
            .unwrap()
            .starts_with(&format!("gw-a.{NS}")),
        "{pushes:?}"
    );
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn the_plaintext_port_gets_no_secrets() {
    let mesh = mesh(true, None).await;
    let (a_cert, a_key) = cert("a.example.com");
    mesh.secret("a", &[("tls.crt", &a_cert), ("tls.key", &a_key)]);
    mesh.api().grant_access(USER, "list", "secrets", NS);
    let mut plain = AdsClient::connect(mesh.server.grpc_addr(), gateway("gw-1"))
        .await
        .unwrap();
    plain
        .subscribe(TypeUrl::Secret, &["kubernetes://a"])
        .await
        .unwrap();
    let response = plain.recv_type(TypeUrl::Secret).await.unwrap();
    assert!(response.resources.is_empty());
    let sdsz = mesh.sdsz().await;
    let conn = sdsz["proxies"]
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap();
    assert!(
        conn["denied"]["kubernetes://a"]
            .as_str()
            .unwrap()
            .contains("verified identity"),
        "{sdsz}"
    );
    // Not even a review or a watch was made for it.
    assert!(mesh.api().access_reviews().is_empty());
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn delta_streams_get_secrets_and_their_updates() {
    let mesh = mesh(true, None).await;
    let (a1, a1_key) = cert("a.example.com");
    mesh.secret("a", &[("tls.crt", &a1), ("tls.key", &a1_key)]);
    mesh.api().grant_access(USER, "list", "secrets", NS);
    let mut gw = DeltaClient::over(mesh.channel().await, gateway("gw-1"))
        .await
        .unwrap();
    gw.subscribe(TypeUrl::Secret, &["kubernetes://a"], &[])
        .await
        .unwrap();
    let first = loop {
        let response = gw.recv_type(TypeUrl::Secret).await.unwrap();
        let secrets: Vec<Secret> = decode_delta(&response).unwrap();
        if let Some(s) = secrets.into_iter().next() {
            break s;
        }
    };
    assert_eq!(tls_of(&first), (&a1[..], &a1_key[..]));
    mesh.api().delete::<objects::types::Secret>(Some(NS), "a");
    let removed = gw.recv_type(TypeUrl::Secret).await.unwrap();
    assert_eq!(removed.removed_resources, ["kubernetes://a"]);
    mesh.server.shutdown().await;
}

fn secret_manifest(namespace: &str, name: &str, cert: &[u8], key: &[u8]) -> String {
    let indent = |pem: &[u8]| {
        String::from_utf8(pem.to_vec())
            .unwrap()
            .lines()
            .map(|l| format!("      {l}\n"))
            .collect::<String>()
    };
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: {namespace}\ntype: kubernetes.io/tls\nstringData:\n    tls.crt: |\n{}    tls.key: |\n{}",
        indent(cert),
        indent(key)
    )
}

#[tokio::test]
async fn config_dir_secrets_are_served_updated_and_invalid_ones_rejected_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (c1, k1) = cert("dir.example.com");
    let bad = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: bad\n  namespace: gwns\ndata:\n  tls.crt: '%%% not base64'\n";
    std::fs::write(
        dir.path().join("gw.yaml"),
        secret_manifest(NS, "dir-cert", &c1, &k1),
    )
    .unwrap();
    std::fs::write(dir.path().join("bad.yaml"), bad).unwrap();
    let mesh = mesh(false, Some(dir.path().to_path_buf())).await;
    // The invalid Secret is rejected with its file, object and field.
    let configz = get_json(mesh.server.bound().http, "/debug/configz").await;
    let rejected = configz["rejected"].to_string();
    assert!(
        rejected.contains("bad.yaml:")
            && rejected.contains("bad")
            && rejected.contains("data[tls.crt]"),
        "{rejected}"
    );
    let mut gw = mesh.gateway("gw-1").await;
    gw.subscribe(
        TypeUrl::Secret,
        &["kubernetes://dir-cert", "kubernetes://other/dir-cert"],
    )
    .await
    .unwrap();
    let secrets = recv_secrets(&mut gw, |s| !s.is_empty()).await;
    assert_eq!(names(&secrets), ["kubernetes://dir-cert"]);
    assert_eq!(tls_of(&secrets[0]), (&c1[..], &k1[..]));
    // Without Kubernetes the namespace rule alone applies.
    let sdsz = mesh.sdsz().await;
    assert!(
        sdsz.to_string().contains("not the proxy's namespace"),
        "{sdsz}"
    );
    // An edit is pushed.
    let (c2, k2) = cert("dir2.example.com");
    std::fs::write(
        dir.path().join("gw.yaml"),
        secret_manifest(NS, "dir-cert", &c2, &k2),
    )
    .unwrap();
    let secrets = recv_secrets(&mut gw, |s| s.len() == 1 && tls_of(&s[0]).0 == &c2[..]).await;
    assert_eq!(tls_of(&secrets[0]), (&c2[..], &k2[..]));
    mesh.server.shutdown().await;

    // `meshfed validate` reports the same.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .args(["validate", "-f"])
        .arg(dir.path().join("bad.yaml"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        text.contains("Secret") && text.contains("data[tls.crt]"),
        "{text}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .args(["validate", "-f"])
        .arg(dir.path().join("gw.yaml"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 valid object(s)"), "{text}");
}

#[tokio::test]
async fn kubernetes_gateway_names_are_served_while_a_gateway_of_the_proxy_references_them() {
    let mesh = mesh(true, None).await;
    let (c, k) = cert("shared.example.com");
    for name in ["shared", "unreferenced"] {
        mesh.api().apply(&objects::secret(
            "certs",
            name,
            "kubernetes.io/tls",
            &[("tls.crt", &c), ("tls.key", &k)],
        ));
    }
    let gateway = serde_json::json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "gw", "namespace": NS},
        "spec": {
            "selector": {"istio": "ingressgateway"},
            "servers": [{
                "port": {"number": 443, "name": "https", "protocol": "HTTPS"},
                "hosts": ["*"],
                "tls": {"mode": "SIMPLE", "credentialName": "kubernetes-gateway://certs/shared"},
            }],
        },
    });
    let meshfed_registry::config::Decoded::Object(gateway) =
        meshfed_registry::config::decode(&gateway, "test")
    else {
        panic!("not a Gateway");
    };
    mesh.server
        .config_store()
        .apply(gateway)
        .expect("valid Gateway");
    let mut gw = mesh.gateway("gw-1").await;
    gw.subscribe(
        TypeUrl::Secret,
        &[
            "kubernetes-gateway://certs/shared",
            "kubernetes-gateway://certs/unreferenced",
        ],
    )
    .await
    .unwrap();
    let secrets = recv_secrets(&mut gw, |s| !s.is_empty()).await;
    assert_eq!(names(&secrets), ["kubernetes-gateway://certs/shared"]);
    // No review is needed for these (the Gateway is the authorization).
    assert!(mesh.api().access_reviews().is_empty());
    // Once the Gateway goes, so does the credential.
    assert!(
        mesh.server
            .config_store()
            .delete(meshfed_registry::config::Kind::Gateway, NS, "gw")
    );
    recv_secrets(&mut gw, <[Secret]>::is_empty).await;
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn a_remote_cluster_gateway_reads_its_cluster_first_and_asks_its_own_api_server() {
    let mesh = mesh(true, None).await;
    let c2 = EnforcedApi::start().await;
    mesh.api().apply(&objects::remote_secret(
        "istio-system",
        "istio-remote-secret-c2",
        &[("c2", &c2.kubeconfig())],
    ));
    let http = mesh.server.bound().http;
    eventually("c2 synced", || async move {
        let r = get_json(http, "/debug/registryz").await;
        r["registries"]
            .as_array()?
            .iter()
            .any(|r| r["registry"] == "Kubernetes/c2" && r["synced"] == true)
            .then_some(())
    })
    .await;
    let (local, local_key) = cert("local.example.com");
    let (remote, remote_key) = cert("remote.example.com");
    mesh.secret("a", &[("tls.crt", &local), ("tls.key", &local_key)]);
    mesh.secret(
        "only-local",
        &[("tls.crt", &local), ("tls.key", &local_key)],
    );
    c2.apply(&objects::secret(
        NS,
        "a",
        "kubernetes.io/tls",
        &[("tls.crt", &remote), ("tls.key", &remote_key)],
    ));
    c2.grant_access(USER, "list", "secrets", NS);
    let node = node_with(
        &format!("router~10.0.0.9~gw-1.{NS}~{NS}.svc.cluster.local"),
        serde_json::json!({"SERVICE_ACCOUNT": SA, "CLUSTER_ID": "c2"}),
    );
    let mut gw = AdsClient::over(mesh.channel().await, MetadataMap::new(), node)
        .await
        .unwrap();
    gw.subscribe(
        TypeUrl::Secret,
        &["kubernetes://a", "kubernetes://only-local"],
    )
    .await
    .unwrap();
    let secrets = recv_secrets(&mut gw, |s| s.len() == 2).await;
    let by_name = |n: &str| secrets.iter().find(|s| s.name == n).unwrap();
    // The proxy's own cluster first, then the config cluster.
    assert_eq!(tls_of(by_name("kubernetes://a")).0, &remote[..]);
    assert_eq!(tls_of(by_name("kubernetes://only-local")).0, &local[..]);
    // The review went to the proxy's cluster only.
    assert_eq!(
        c2.access_reviews(),
        [(USER.into(), "list".into(), "secrets".into(), NS.into())]
    );
    assert!(mesh.api().access_reviews().is_empty());
    mesh.server.shutdown().await;
}

/// The Kubernetes Secrets meshfed follows, by name.
async fn followed(mesh: &Mesh) -> Vec<String> {
    let sdsz = mesh.sdsz().await;
    sdsz["followed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn secrets_no_longer_requested_are_no_longer_followed() {
    let mesh = mesh(true, None).await;
    let (c, k) = cert("a.example.com");
    mesh.secret("a", &[("tls.crt", &c), ("tls.key", &k)]);
    mesh.secret("b", &[("tls.crt", &c), ("tls.key", &k)]);
    mesh.api().grant_access(USER, "list", "secrets", NS);
    let mut gw = mesh.gateway("gw-1").await;
    gw.subscribe(TypeUrl::Secret, &["kubernetes://a"])
        .await
        .unwrap();
    recv_secrets(&mut gw, |s| s.len() == 1).await;
    assert_eq!(followed(&mesh).await, ["a"]);
    gw.subscribe(TypeUrl::Secret, &["kubernetes://b"])
        .await
        .unwrap();
    recv_secrets(&mut gw, |s| names(s) == ["kubernetes://b"]).await;
    assert_eq!(followed(&mesh).await, ["b"]);
    // A change of `a` now reaches nobody.
    let (before_a, before_b) = (
        secret_pushes(&mesh, "a").len(),
        secret_pushes(&mesh, "b").len(),
    );
    mesh.secret("a", &[("tls.crt", &c), ("tls.key", &k), ("x", b"y")]);
    mesh.secret("b", &[("tls.crt", &c), ("tls.key", &k), ("x", b"y")]);
    eventually("the change of b pushed", || async {
        (secret_pushes(&mesh, "b").len() > before_b).then_some(())
    })
    .await;
    assert_eq!(secret_pushes(&mesh, "a").len(), before_a);
    drop(gw);
    eventually("nothing followed once the gateway is gone", || async {
        followed(&mesh).await.is_empty().then_some(())
    })
    .await;
    mesh.server.shutdown().await;
}

fn validation_of(secret: &Secret) -> (&[u8], Option<&[u8]>) {
    match &secret.r#type {
        Some(secret::Type::ValidationContext(v)) => (
            bytes(&v.trusted_ca),
            v.crl.as_ref().map(|c| match c.specifier.as_ref() {
                Some(data_source::Specifier::InlineBytes(b)) => &b[..],
                other => panic!("not inline bytes: {other:?}"),
            }),
        ),
        other => panic!("{}: not a validation context: {other:?}", secret.name),
    }
}

/// `configmap://<ns>/<name>` (a BackendTLSPolicy's CA, or a DestinationRule's
/// `credentialName`): the CA of a ConfigMap of the config cluster, in any namespace,
/// to any proxy with an identity and without a review; followed by name, and pushed
/// when it changes.
#[tokio::test]
async fn config_map_cas_are_served_from_any_namespace_and_follow_their_changes() {
    let mesh = mesh(true, None).await;
    let (ca, _) = cert("ca.example.com");
    let ca = String::from_utf8(ca).unwrap();
    mesh.api()
        .apply(&objects::config_map("apps", "web-ca", &[("ca.crt", &ca)]));
    mesh.api().apply(&objects::config_map(
        "apps",
        "generic-ca",
        &[("cacert", &ca), ("crl", "CRL")],
    ));
    mesh.api()
        .apply(&objects::config_map("apps", "no-ca", &[("other", "x")]));
    let mut gw = mesh.gateway("gw-1").await;
    gw.subscribe(
        TypeUrl::Secret,
        &[
            "configmap://apps/web-ca-cacert",
            "configmap://apps/generic-ca",
            "configmap://apps/no-ca-cacert",
            "configmap://apps/missing-cacert",
            "configmap://no-namespace",
        ],
    )
    .await
    .unwrap();
    let secrets = recv_secrets(&mut gw, |s| s.len() == 2).await;
    assert_eq!(
        names(&secrets),
        [
            "configmap://apps/generic-ca",
            "configmap://apps/web-ca-cacert"
        ]
    );
    for s in &secrets {
        let crl = (s.name == "configmap://apps/generic-ca").then_some(&b"CRL"[..]);
        assert_eq!(validation_of(s), (ca.as_bytes(), crl), "{}", s.name);
    }
    // Not a Secret: no review is asked for.
    assert!(mesh.api().access_reviews().is_empty());
    let sdsz = mesh.sdsz().await;
    let conn = sdsz["proxies"]
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap();
    let errors = &conn["errors"];
    assert!(
        errors["configmap://apps/missing-cacert"]
            .as_str()
            .unwrap()
            .contains("ConfigMap apps/missing not found"),
        "{sdsz}"
    );
    assert!(
        errors["configmap://apps/no-ca-cacert"]
            .as_str()
            .unwrap()
            .contains("ca.crt"),
        "{sdsz}"
    );
    assert!(
        errors["configmap://no-namespace"]
            .as_str()
            .unwrap()
            .contains("needs a namespace"),
        "{sdsz}"
    );
    // Only the ConfigMaps asked for are followed, each by name.
    let mut followed = followed(&mesh).await;
    followed.sort();
    assert_eq!(followed, ["generic-ca", "missing", "no-ca", "web-ca"]);
    // A change is pushed; a ConfigMap created later is picked up.
    let (ca2, _) = cert("ca2.example.com");
    let ca2 = String::from_utf8(ca2).unwrap();
    mesh.api()
        .apply(&objects::config_map("apps", "web-ca", &[("ca.crt", &ca2)]));
    mesh.api()
        .apply(&objects::config_map("apps", "missing", &[("ca.crt", &ca2)]));
    let secrets = recv_secrets(&mut gw, |s| {
        s.iter()
            .filter(|s| validation_of(s).0 == ca2.as_bytes())
            .count()
            == 2
    })
    .await;
    assert_eq!(
        names(&secrets),
        [
            "configmap://apps/generic-ca",
            "configmap://apps/missing-cacert",
            "configmap://apps/web-ca-cacert"
        ]
    );
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn config_dir_config_map_cas_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _) = cert("ca.example.com");
    let indented: String = String::from_utf8(ca.clone())
        .unwrap()
        .lines()
        .map(|l| format!("    {l}\n"))
        .collect();
    std::fs::write(
        dir.path().join("ca.yaml"),
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-ca\n  namespace: apps\ndata:\n  ca.crt: |\n{indented}"),
    )
    .unwrap();
    let mesh = mesh(false, Some(dir.path().to_path_buf())).await;
    let mut gw = mesh.gateway("gw-1").await;
    gw.subscribe(TypeUrl::Secret, &["configmap://apps/web-ca-cacert"])
        .await
        .unwrap();
    let secrets = recv_secrets(&mut gw, |s| !s.is_empty()).await;
    assert_eq!(names(&secrets), ["configmap://apps/web-ca-cacert"]);
    assert_eq!(validation_of(&secrets[0]), (&ca[..], None));
    // An edit of the file is pushed.
    let (ca2, _) = cert("ca2.example.com");
    let indented: String = String::from_utf8(ca2.clone())
        .unwrap()
        .lines()
        .map(|l| format!("    {l}\n"))
        .collect();
    std::fs::write(
        dir.path().join("ca.yaml"),
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-ca\n  namespace: apps\ndata:\n  ca.crt: |\n{indented}"),
    )
    .unwrap();
    recv_secrets(&mut gw, |s| {
        s.len() == 1 && validation_of(&s[0]).0 == &ca2[..]
    })
    .await;
    mesh.server.shutdown().await;
}

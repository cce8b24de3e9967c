//! The secure xDS port: TLS with the mesh CA's serving certificate, client
//! certificates as identities, xDS admission by namespace and service account,
//! CreateCertificate over TLS, and the new-stream rate limit.

use std::path::{Path, PathBuf};
use std::time::Duration;

use meshfed::app::{CaSource, DiscoveryConfig};
use meshfed::ca::Ca;
use meshfed::testing::{
    AdsClient, ClientTls, DeltaClient, FakeServer, create_certificate, node_with, tls_channel,
};
use meshfed::xds::TypeUrl;
use meshfed_api::auth::v1::IstioCertificateRequest;
use tonic::Code;
use tonic::metadata::MetadataMap;

use crate::support::{http_get, metric};

const SERVER_NAME: &str = "istiod.istio-system.svc";

struct Mesh {
    _dir: tempfile::TempDir,
    ca_dir: PathBuf,
    server: FakeServer,
}

async fn mesh_with(f: impl FnOnce(&mut DiscoveryConfig)) -> Mesh {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let server = FakeServer::builder()
        .embedded_mock_registry()
        .configure(|c| {
            c.ca = Some(CaSource::Dir {
                cacerts: None,
                self_signed_dir: ca_dir.clone(),
            });
            f(c);
        })
        .start()
        .await
        .unwrap();
    server.sync().await;
    Mesh {
        _dir: dir,
        ca_dir,
        server,
    }
}

fn csr(key: &rcgen::KeyPair) -> String {
    rcgen::CertificateParams::new(vec!["ignored.example.com".to_string()])
        .unwrap()
        .serialize_request(key)
        .unwrap()
        .pem()
        .unwrap()
}

/// A workload certificate for `identity` from the CA kept in `ca_dir`: chain (without
/// the root) and key.
pub(crate) fn issue(ca_dir: &Path, identity: &str) -> (String, String) {
    Ca::self_signed(ca_dir, "cluster.local")
        .unwrap()
        .issue_key_pair(&[identity.to_string()], Duration::ZERO)
        .unwrap()
}

impl Mesh {
    fn root(&self) -> String {
        std::fs::read_to_string(self.ca_dir.join("root-cert.pem")).unwrap()
    }

    fn tls(&self, identity: Option<&str>) -> ClientTls {
        ClientTls {
            roots_pem: self.root(),
            identity: identity.map(|id| issue(&self.ca_dir, id)),
            server_name: SERVER_NAME.into(),
        }
    }

    async fn channel(&self, identity: Option<&str>) -> tonic::transport::Channel {
        tls_channel(self.server.secure_grpc_addr(), &self.tls(identity))
            .await
            .unwrap()
    }
}

fn sidecar(
    namespace: &str,
    service_account: &str,
) -> envoy_types::pb::envoy::config::core::v3::Node {
    node_with(
        &format!("sidecar~10.0.0.1~app-1.{namespace}~{namespace}.svc.cluster.local"),
        serde_json::json!({"SERVICE_ACCOUNT": service_account}),
    )
}

#[tokio::test]
async fn a_proxy_with_a_mesh_certificate_gets_config_on_the_secure_port() {
    let mesh = mesh_with(|_| {}).await;
    let channel = mesh
        .channel(Some("spiffe://cluster.local/ns/default/sa/app"))
        .await;
    let mut client = AdsClient::over(channel, MetadataMap::new(), sidecar("default", "app"))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    assert!(!clusters.is_empty());
    // The debug page shows the verified identity of the connection.
    let (status, body) = http_get(mesh.server.bound().http, "/debug/adsz").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("spiffe://cluster.local/ns/default/sa/app"),
        "{body}"
    );
    // The root is served for whoever needs it; the key never is.
    let ca = crate::support::get_json(mesh.server.bound().http, "/debug/ca").await;
    assert_eq!(ca["rootCert"], mesh.root(), "{ca}");
    assert!(
        ca["source"].as_str().unwrap().contains("self-signed"),
        "{ca}"
    );
    assert!(!ca.to_string().contains("PRIVATE KEY"), "{ca}");
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn delta_streams_are_served_and_admitted_on_the_secure_port_too() {
    let mesh = mesh_with(|_| {}).await;
    let id = "spiffe://cluster.local/ns/default/sa/app";
    let mut ok = DeltaClient::over(mesh.channel(Some(id)).await, sidecar("default", "app"))
        .await
        .unwrap();
    ok.subscribe(TypeUrl::Cluster, &[], &[]).await.unwrap();
    let cds = ok.recv_type(TypeUrl::Cluster).await.unwrap();
    assert!(!cds.resources.is_empty());
    let mut refused = DeltaClient::over(mesh.channel(Some(id)).await, sidecar("other", "app"))
        .await
        .unwrap();
    refused.subscribe(TypeUrl::Cluster, &[], &[]).await.unwrap();
    let error = refused.recv().await.unwrap_err();
    let status = error.downcast_ref::<tonic::Status>().expect("a status");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn a_node_claiming_another_namespace_or_account_is_refused() {
    let mesh = mesh_with(|_| {}).await;
    for (ns, sa) in [("other", "app"), ("default", "admin")] {
        let channel = mesh
            .channel(Some("spiffe://cluster.local/ns/default/sa/app"))
            .await;
        let mut client = AdsClient::over(channel, MetadataMap::new(), sidecar(ns, sa))
            .await
            .unwrap();
        client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
        let status = client.recv_error().await.unwrap();
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        assert!(
            status
                .message()
                .contains("spiffe://cluster.local/ns/default/sa/app")
                && status.message().contains(&format!("{ns}/{sa}")),
            "names both: {status:?}"
        );
    }
    let text = http_get(mesh.server.bound().monitoring, "/metrics").await.1;
    assert_eq!(
        metric(
            &text,
            r#"meshfed_xds_request_errors_total{reason="permission_denied"}"#
        ),
        Some(2.0),
        "{text}"
    );
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn a_stream_without_any_credential_is_unauthenticated() {
    let mesh = mesh_with(|_| {}).await;
    let channel = mesh.channel(None).await;
    let mut client = AdsClient::over(channel, MetadataMap::new(), sidecar("default", "app"))
        .await
        .unwrap();
    // Refused before the first request is read: the send may already find it closed.
    let _ = client.subscribe(TypeUrl::Cluster, &[]).await;
    let status = client.recv_error().await.unwrap();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_fails_the_handshake() {
    let mesh = mesh_with(|_| {}).await;
    let other = tempfile::tempdir().unwrap();
    let mut tls = mesh.tls(None);
    tls.identity = Some(issue(
        other.path(),
        "spiffe://cluster.local/ns/default/sa/app",
    ));
    let refused = async {
        let channel = tls_channel(mesh.server.secure_grpc_addr(), &tls).await?;
        let mut client =
            AdsClient::over(channel, MetadataMap::new(), sidecar("default", "app")).await?;
        client.subscribe(TypeUrl::Cluster, &[]).await?;
        client.recv().await
    }
    .await;
    assert!(refused.is_err(), "{refused:?}");
    let text = http_get(mesh.server.bound().monitoring, "/metrics").await.1;
    assert!(
        metric(&text, "meshfed_xds_tls_handshake_errors").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn create_certificate_over_tls_issues_the_callers_identity_only() {
    let mesh = mesh_with(|_| {}).await;
    let id = "spiffe://cluster.local/ns/default/sa/app";
    let key = rcgen::KeyPair::generate().unwrap();
    let request = IstioCertificateRequest {
        csr: csr(&key),
        validity_duration: 3600,
        ..Default::default()
    };
    let response = create_certificate(mesh.channel(Some(id)).await, MetadataMap::new(), request)
        .await
        .unwrap();
    assert_eq!(response.cert_chain.len(), 2, "leaf and root");
    assert_eq!(response.cert_chain[1], mesh.root());
    let (_, leaf) = x509_parser::pem::parse_x509_pem(response.cert_chain[0].as_bytes()).unwrap();
    let leaf = leaf.parse_x509().unwrap();
    let names: Vec<String> = leaf
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(names, [format!("URI({id})")]);
    let validity = leaf.validity();
    let lifetime = validity.not_after.timestamp() - validity.not_before.timestamp();
    assert_eq!(lifetime, 3600 + 120, "TTL plus Istio's 2-minute backdating");

    // A garbage CSR: InvalidArgument and a parsing error counted.
    let garbage = IstioCertificateRequest {
        csr: "not a CSR".into(),
        ..Default::default()
    };
    let status = create_certificate(mesh.channel(Some(id)).await, MetadataMap::new(), garbage)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    // No credential: Unauthenticated.
    let key = rcgen::KeyPair::generate().unwrap();
    let anonymous = IstioCertificateRequest {
        csr: csr(&key),
        ..Default::default()
    };
    let status = create_certificate(mesh.channel(None).await, MetadataMap::new(), anonymous)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let text = http_get(mesh.server.bound().monitoring, "/metrics").await.1;
    for (sample, value) in [
        ("citadel_server_csr_count", 3.0),
        ("citadel_server_success_cert_issuance_count", 1.0),
        ("citadel_server_csr_parsing_err_count", 1.0),
        ("citadel_server_authentication_failure_count", 1.0),
    ] {
        assert_eq!(metric(&text, sample), Some(value), "{sample}: {text}");
    }
    assert!(metric(&text, "citadel_server_root_cert_expiry_timestamp").unwrap() > 1.7e9);
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn the_plaintext_port_can_be_turned_off_and_the_secure_one_serves_alone() {
    let mesh = mesh_with(|c| c.grpc_addr = None).await;
    assert!(mesh.server.bound().grpc.is_none());
    let channel = mesh
        .channel(Some("spiffe://cluster.local/ns/default/sa/app"))
        .await;
    let mut client = AdsClient::over(channel, MetadataMap::new(), sidecar("default", "app"))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    client.recv_clusters().await.unwrap();
    mesh.server.shutdown().await;
}

#[tokio::test]
async fn new_streams_over_the_rate_are_refused_with_resource_exhausted() {
    // One every ten seconds, burst one: of three streams opened together, the first
    // goes at once; the others would wait longer than the one second a stream may
    // wait, and are refused (however slowly the machine opens them).
    let mesh = mesh_with(|c| c.max_requests_per_second = Some(0.1)).await;
    let addr = mesh.server.grpc_addr();
    let attempts = (0..3).map(|i| async move {
        let mut client = AdsClient::connect(
            addr,
            node_with(
                &format!("sidecar~10.0.0.{i}~app-{i}.default~default.svc.cluster.local"),
                serde_json::json!({}),
            ),
        )
        .await
        .unwrap();
        // A refused stream may end before this request is written.
        let _ = client.subscribe(TypeUrl::Cluster, &[]).await;
        client.recv().await.map(|_| ()).map_err(|e| {
            e.downcast::<tonic::Status>()
                .map(|s| s.code())
                .unwrap_or(Code::Unknown)
        })
    });
    let results = futures::future::join_all(attempts).await;
    let refused: Vec<_> = results.iter().filter_map(|r| r.err()).collect();
    assert_eq!(
        refused,
        [Code::ResourceExhausted, Code::ResourceExhausted],
        "{results:?}"
    );
    mesh.server.shutdown().await;
}

/// A JWT_RULE issuer with an inline JWKS, and tokens it signs (ES256).
struct VmIssuer {
    key: jsonwebtoken::EncodingKey,
    rule: String,
}

impl VmIssuer {
    fn new() -> VmIssuer {
        let pkcs8 = rcgen::KeyPair::generate().unwrap().serialize_der();
        let key = jsonwebtoken::EncodingKey::from_ec_der(&pkcs8);
        let mut jwk =
            jsonwebtoken::jwk::Jwk::from_encoding_key(&key, jsonwebtoken::Algorithm::ES256)
                .unwrap();
        jwk.common.key_id = Some("k1".into());
        let rule = serde_json::json!({
            "issuer": "https://issuer.example.com",
            "audiences": ["istio-ca"],
            "jwks": serde_json::json!({"keys": [jwk]}).to_string(),
        })
        .to_string();
        VmIssuer { key, rule }
    }

    fn token(&self, sub: &str, expires_in: i64) -> MetadataMap {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some("k1".into());
        let claims = serde_json::json!({
            "iss": "https://issuer.example.com",
            "sub": sub,
            "aud": ["istio-ca"],
            "exp": now + expires_in,
        });
        let token = jsonwebtoken::encode(&header, &claims, &self.key).unwrap();
        let mut metadata = MetadataMap::new();
        metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
        metadata
    }
}

#[tokio::test]
async fn a_vm_with_a_third_party_jwt_gets_its_certificate_and_config() {
    let issuer = VmIssuer::new();
    let rule = issuer.rule.clone();
    let mesh = mesh_with(move |c| c.secure.jwt_rule = Some(rule)).await;
    let good = issuer.token("system:serviceaccount:vm:vm-app", 600);
    let key = rcgen::KeyPair::generate().unwrap();
    let request = IstioCertificateRequest {
        csr: csr(&key),
        ..Default::default()
    };
    let response = create_certificate(mesh.channel(None).await, good.clone(), request.clone())
        .await
        .unwrap();
    let (_, leaf) = x509_parser::pem::parse_x509_pem(response.cert_chain[0].as_bytes()).unwrap();
    let leaf = leaf.parse_x509().unwrap();
    let san = leaf.subject_alternative_name().unwrap().unwrap();
    assert_eq!(
        san.value.general_names[0].to_string(),
        "URI(spiffe://cluster.local/ns/vm/sa/vm-app)"
    );
    let mut client = AdsClient::over(mesh.channel(None).await, good, sidecar("vm", "vm-app"))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    client.recv_clusters().await.unwrap();

    let expired = issuer.token("system:serviceaccount:vm:vm-app", -60);
    let status = create_certificate(mesh.channel(None).await, expired, request)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    mesh.server.shutdown().await;
}

/// Serving files issued by the CA of `ca_dir` for `name`, written into `dir`.
fn serving_files(ca_dir: &Path, dir: &Path, name: &str) -> meshfed::tls::TlsFiles {
    let ca = Ca::self_signed(ca_dir, "cluster.local").unwrap();
    let (chain, key) = ca.issue_serving(&[name.to_string()]).unwrap();
    let files = meshfed::tls::TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
        ca_cert: dir.join("ca.crt"),
    };
    // Written next to each other, then renamed in, as a Secret volume swaps them.
    for (path, text) in [
        (&files.cert, chain),
        (&files.key, key),
        (&files.ca_cert, ca.root_pem().to_string()),
    ] {
        let tmp = path.with_extension("new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }
    files
}

#[tokio::test]
async fn operator_serving_files_are_used_and_reloaded_when_they_change() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("first-ca"), dir.path().join("second-ca"));
    let files = serving_files(&first, dir.path(), "xds.example.com");
    let mesh = mesh_with(|c| c.secure.tls_files = Some(files)).await;
    let client_tls = |ca_dir: &Path, name: &str| ClientTls {
        roots_pem: std::fs::read_to_string(ca_dir.join("root-cert.pem")).unwrap(),
        // Client certificates from the mesh CA (the --caCertFile roots would do too).
        identity: Some(issue(
            &mesh.ca_dir,
            "spiffe://cluster.local/ns/default/sa/app",
        )),
        server_name: name.into(),
    };
    let addr = mesh.server.secure_grpc_addr();
    let serves = |tls: ClientTls| async move {
        let channel = tls_channel(addr, &tls).await?;
        let mut client =
            AdsClient::over(channel, MetadataMap::new(), sidecar("default", "app")).await?;
        client.subscribe(TypeUrl::Cluster, &[]).await?;
        client.recv_clusters().await
    };
    serves(client_tls(&first, "xds.example.com")).await.unwrap();

    serving_files(&second, dir.path(), "xds2.example.com");
    crate::support::eventually("the new serving certificate", || async {
        serves(client_tls(&second, "xds2.example.com")).await.ok()
    })
    .await;
    assert!(
        serves(client_tls(&first, "xds.example.com")).await.is_err(),
        "the old certificate is no longer served"
    );
    mesh.server.shutdown().await;
}

// ---------------------------------------------------------------------------------
// With Kubernetes: the CA in Secrets, tokens by TokenReview, the root in ConfigMaps.

use meshfed::app::{KubeSettings, KubeSource};
use meshfed_kube::fake_api::objects::ConfigMap;
use meshfed_kube::fake_api::objects::types::Secret;
use meshfed_kube::fake_api::{FakeApiServer, objects};

/// Reads Kubernetes through `client` (system namespace `istio-system`) and keeps the
/// CA in its Secrets, as deployed.
pub(crate) fn kube_ca(c: &mut DiscoveryConfig, client: meshfed_kube::Client) {
    c.kubernetes = Some(KubeSettings {
        source: KubeSource::Client(client),
        namespaces: meshfed_kube::NamespaceFilter::All,
        system_namespace: "istio-system".into(),
        remote_secrets: Default::default(),
    });
    c.ca = Some(CaSource::Kubernetes { cacerts: None });
}

/// A control plane on the fake API server with the Kubernetes CA (leader election
/// on, as deployed).
pub(crate) async fn kube_mesh(api: &FakeApiServer) -> FakeServer {
    let client = api.client();
    let server = FakeServer::builder()
        .configure(move |c| {
            kube_ca(c, client);
        })
        .start()
        .await
        .unwrap();
    let http = server.bound().http;
    crate::support::eventually("the Kubernetes registry to sync", || async move {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
    server
}

/// The `istio-ca-root-cert` ConfigMap of `namespace`, once published.
pub(crate) async fn published_root(api: &FakeApiServer, namespace: &str) -> String {
    crate::support::eventually("the root-cert ConfigMap", || async {
        api.get::<ConfigMap>(Some(namespace), "istio-ca-root-cert")
            .and_then(|cm| cm.data?.get("root-cert.pem").cloned())
    })
    .await
}

fn bearer(token: &str, cluster: Option<&str>) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
    if let Some(cluster) = cluster {
        metadata.insert("clusterid", cluster.parse().unwrap());
    }
    metadata
}

fn in_an_hour() -> std::time::SystemTime {
    std::time::SystemTime::now() + Duration::from_secs(3600)
}

#[tokio::test]
async fn kubernetes_tokens_get_their_identity_signed_under_the_published_root() {
    let api = FakeApiServer::start().await.unwrap();
    for ns in ["default", "istio-system", "kube-system", "kube-public"] {
        api.apply(&objects::namespace(ns, &[]));
    }
    let server = kube_mesh(&api).await;
    let root = published_root(&api, "default").await;
    assert_eq!(published_root(&api, "kube-system").await, root);
    let secret = api
        .get::<Secret>(Some("istio-system"), "istio-ca-secret")
        .expect("the self-signed root is kept in istio-ca-secret");
    assert_eq!(secret.type_.as_deref(), Some("istio.io/ca-root"));
    assert!(
        api.get::<ConfigMap>(Some("kube-public"), "istio-ca-root-cert")
            .is_none(),
        "kube-public is left alone"
    );
    let tls = ClientTls {
        roots_pem: root.clone(),
        identity: None,
        server_name: SERVER_NAME.into(),
    };
    let channel = || async { tls_channel(server.secure_grpc_addr(), &tls).await.unwrap() };
    let token = api.issue_token("default", "app", &["istio-ca"], in_an_hour(), None);
    let key = rcgen::KeyPair::generate().unwrap();
    let request = IstioCertificateRequest {
        csr: csr(&key),
        ..Default::default()
    };
    let response = create_certificate(
        channel().await,
        bearer(&token, Some("Kubernetes")),
        request.clone(),
    )
    .await
    .unwrap();
    assert_eq!(
        response.cert_chain.last().unwrap(),
        &root,
        "chains to the published root"
    );
    let (_, leaf) = x509_parser::pem::parse_x509_pem(response.cert_chain[0].as_bytes()).unwrap();
    let leaf = leaf.parse_x509().unwrap();
    let san = leaf.subject_alternative_name().unwrap().unwrap();
    assert_eq!(
        san.value.general_names[0].to_string(),
        "URI(spiffe://cluster.local/ns/default/sa/app)"
    );

    // The same token streams xDS for its own namespace only.
    let mut ok = AdsClient::over(
        channel().await,
        bearer(&token, None),
        sidecar("default", "app"),
    )
    .await
    .unwrap();
    ok.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    ok.recv_clusters().await.unwrap();
    let mut other = AdsClient::over(
        channel().await,
        bearer(&token, None),
        sidecar("other", "app"),
    )
    .await
    .unwrap();
    other.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let status = other.recv_error().await.unwrap();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("other/app"), "{status:?}");

    // Refused: another audience, expired, a cluster nobody knows.
    let wrong_audience = api.issue_token("default", "app", &["vault"], in_an_hour(), None);
    let expired = api.issue_token(
        "default",
        "app",
        &["istio-ca"],
        std::time::SystemTime::now() - Duration::from_secs(60),
        None,
    );
    for (metadata, why) in [
        (bearer(&wrong_audience, None), "audience"),
        (bearer(&expired, None), "expired"),
        (bearer(&token, Some("elsewhere")), "elsewhere"),
    ] {
        let status = create_certificate(channel().await, metadata, request.clone())
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{why}: {status:?}");
    }
    let text = http_get(server.bound().monitoring, "/metrics").await.1;
    assert_eq!(
        metric(&text, "citadel_server_authentication_failure_count"),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "citadel_server_success_cert_issuance_count"),
        Some(1.0)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn two_replicas_share_one_root_and_only_the_lease_holder_writes_configmaps() {
    let api = FakeApiServer::start().await.unwrap();
    for ns in ["default", "istio-system"] {
        api.apply(&objects::namespace(ns, &[]));
    }
    let replica = |identity: &str| {
        let token = api.issue_token("istio-system", identity, &[], in_an_hour(), None);
        let client = api.client_with_token(&token);
        let identity = identity.to_string();
        FakeServer::builder().configure(move |c| {
            kube_ca(c, client);
            c.lease = Some(meshfed::app::LeaseSettings {
                identity: Some(identity),
                duration: Duration::from_secs(2),
                renew_every: Duration::from_millis(200),
                ..Default::default()
            });
        })
    };
    let a = replica("a").start().await.unwrap();
    let root = published_root(&api, "default").await;
    let b = replica("b").start().await.unwrap();
    // B loaded the CA A created: its serving certificate chains to the same root.
    let tls = ClientTls {
        roots_pem: root.clone(),
        identity: None,
        server_name: SERVER_NAME.into(),
    };
    tls_channel(b.secure_grpc_addr(), &tls)
        .await
        .expect("replica b serves under the shared root");
    // A new namespace is published by A alone.
    api.apply(&objects::namespace("late", &[]));
    assert_eq!(published_root(&api, "late").await, root);
    let writes = |name: &str| {
        api.requests_by(&format!("system:serviceaccount:istio-system:{name}"))
            .iter()
            .filter(|r| r.method != "GET" && r.path.contains("/configmaps"))
            .count()
    };
    assert!(writes("a") >= 3, "a wrote every namespace");
    assert_eq!(writes("b"), 0, "b never writes while a holds the Lease");

    // A stops (and releases the Lease); B takes over within the lease duration.
    a.shutdown().await;
    api.apply(&objects::namespace("after", &[]));
    assert_eq!(published_root(&api, "after").await, root);
    assert!(writes("b") >= 1, "b took over");
    b.shutdown().await;
}

#[tokio::test]
async fn a_token_of_a_remote_cluster_is_reviewed_by_the_cluster_it_names() {
    let c1 = FakeApiServer::start().await.unwrap();
    let c2 = FakeApiServer::start().await.unwrap();
    for ns in ["default", "istio-system"] {
        c1.apply(&objects::namespace(ns, &[]));
        c2.apply(&objects::namespace(ns, &[]));
    }
    let client = c1.client();
    let server = FakeServer::builder()
        .cluster_id("c1")
        .configure(move |c| {
            kube_ca(c, client);
        })
        .start()
        .await
        .unwrap();
    c1.apply(&objects::remote_secret(
        "istio-system",
        "istio-remote-secret-c2",
        &[("c2", &c2.kubeconfig())],
    ));
    let http = server.bound().http;
    crate::support::eventually("remote cluster c2 running", || async move {
        let z = crate::support::get_json(http, "/debug/clusterz").await;
        let running = z["clusters"]
            .as_array()?
            .iter()
            .any(|c| c["cluster"] == "c2" && c["synced"] == true);
        running.then_some(())
    })
    .await;
    let root = published_root(&c1, "default").await;
    let tls = ClientTls {
        roots_pem: root,
        identity: None,
        server_name: SERVER_NAME.into(),
    };
    let ask = |metadata: MetadataMap| {
        let tls = tls.clone();
        let addr = server.secure_grpc_addr();
        async move {
            let key = rcgen::KeyPair::generate().unwrap();
            let request = IstioCertificateRequest {
                csr: csr(&key),
                ..Default::default()
            };
            create_certificate(tls_channel(addr, &tls).await.unwrap(), metadata, request).await
        }
    };
    let remote = c2.issue_token("default", "app", &["istio-ca"], in_an_hour(), None);
    let issued = ask(bearer(&remote, Some("c2"))).await.unwrap();
    let (_, leaf) = x509_parser::pem::parse_x509_pem(issued.cert_chain[0].as_bytes()).unwrap();
    let leaf = leaf.parse_x509().unwrap();
    let san = leaf.subject_alternative_name().unwrap().unwrap();
    assert_eq!(
        san.value.general_names[0].to_string(),
        "URI(spiffe://cluster.local/ns/default/sa/app)"
    );
    // The same token checked by the local cluster, and a local token sent to c2: both
    // unknown where they are reviewed.
    let status = ask(bearer(&remote, None)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let local = c1.issue_token("default", "app", &["istio-ca"], in_an_hour(), None);
    let status = ask(bearer(&local, Some("c2"))).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(
        ask(bearer(&local, Some("c1"))).await.is_ok(),
        "c1 is this cluster"
    );
    server.shutdown().await;
}

//! Replacing istiod in place: meshfed started where istiod ran finds istiod's
//! self-signed CA in Secret `istio-system/istio-ca-secret` (RSA 2048, PKCS#1, as
//! istiod writes it), keeps signing with it and keeps its root in the
//! `istio-ca-root-cert` ConfigMaps, so the workloads' certificates stay valid.

use std::time::Duration;

use meshfed::testing::{ClientTls, create_certificate, tls_channel};
use meshfed_api::auth::v1::IstioCertificateRequest;
use meshfed_kube::fake_api::objects::types::Secret;
use meshfed_kube::fake_api::{FakeApiServer, objects};
use tonic::Code;
use tonic::metadata::MetadataMap;

use crate::secure::{kube_mesh, published_root};

/// istiod's root: `O=cluster.local`, 10 years, RSA 2048 with a PKCS#1 key.
const ISTIOD_CERT: &str = include_str!("../data/istiod-ca/ca-cert.pem");
const ISTIOD_KEY: &str = include_str!("../data/istiod-ca/ca-key.pem");
/// A CSR on an RSA 16384 key (larger than meshfed verifies).
const CSR_RSA_16384: &str = include_str!("../data/istiod-ca/csr-rsa-16384.pem");
/// A CSR carrying a subject key identifier extension.
const CSR_WITH_SKI: &str = include_str!("../data/istiod-ca/csr-with-ski.pem");

/// Secret `istio-ca-secret` exactly as istiod's `BuildSecret` leaves it: type
/// `istio.io/ca-root`, the certificate as both `ca-cert.pem` and `root-cert.pem`,
/// the key in `ca-key.pem`, and empty `cert-chain.pem` and `key.pem`.
fn istiod_ca_secret() -> Secret {
    objects::secret(
        "istio-system",
        "istio-ca-secret",
        "istio.io/ca-root",
        &[
            ("ca-cert.pem", ISTIOD_CERT.as_bytes()),
            ("ca-key.pem", ISTIOD_KEY.as_bytes()),
            ("cert-chain.pem", b""),
            ("key.pem", b""),
            ("root-cert.pem", ISTIOD_CERT.as_bytes()),
        ],
    )
}

fn bearer(token: &str) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
    metadata
}

fn csr() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap()
}

#[tokio::test]
async fn istiods_ca_secret_keeps_signing_and_its_root_stays_published() {
    assert!(ISTIOD_KEY.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
    let api = FakeApiServer::start().await.unwrap();
    for ns in ["default", "istio-system"] {
        api.apply(&objects::namespace(ns, &[]));
    }
    let stored = api.apply(&istiod_ca_secret());
    let server = kube_mesh(&api).await;

    // The same root in every namespace's istio-ca-root-cert.
    let root = published_root(&api, "default").await;
    assert_eq!(root, ISTIOD_CERT);
    assert_eq!(published_root(&api, "istio-system").await, ISTIOD_CERT);

    let tls = ClientTls {
        roots_pem: ISTIOD_CERT.into(),
        identity: None,
        server_name: "istiod.istio-system.svc".into(),
    };
    let channel = || async { tls_channel(server.secure_grpc_addr(), &tls).await.unwrap() };
    let token = api.issue_token(
        "default",
        "app",
        &["istio-ca"],
        std::time::SystemTime::now() + Duration::from_secs(3600),
        None,
    );
    let mut issued = Vec::new();
    for csr in [csr(), CSR_WITH_SKI.to_string()] {
        let request = IstioCertificateRequest {
            csr,
            ..Default::default()
        };
        let response = create_certificate(channel().await, bearer(&token), request)
            .await
            .expect("signed (CSR extensions are ignored, not refused)");
        assert_eq!(response.cert_chain.last().unwrap(), ISTIOD_CERT);
        issued.push(response.cert_chain[0].clone());
    }
    let (_, root_pem) = x509_parser::pem::parse_x509_pem(ISTIOD_CERT.as_bytes()).unwrap();
    let root_cert = root_pem.parse_x509().unwrap();
    for leaf in &issued {
        let (_, leaf) = x509_parser::pem::parse_x509_pem(leaf.as_bytes()).unwrap();
        let leaf = leaf.parse_x509().unwrap();
        leaf.verify_signature(Some(root_cert.public_key()))
            .expect("chains to istiod's root");
        assert_eq!(
            leaf.signature_algorithm.algorithm.to_id_string(),
            "1.2.840.113549.1.1.11",
            "sha256WithRSAEncryption, as istiod signs with an RSA key"
        );
        assert_eq!(
            leaf.subject_alternative_name()
                .unwrap()
                .unwrap()
                .value
                .general_names[0]
                .to_string(),
            "URI(spiffe://cluster.local/ns/default/sa/app)"
        );
    }

    // A CSR whose key is too large says so.
    let status = create_certificate(
        channel().await,
        bearer(&token),
        IstioCertificateRequest {
            csr: CSR_RSA_16384.into(),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("RSA key of 16384 bits"),
        "{status:?}"
    );

    // istiod's Secret is read, never rewritten.
    let secret = api
        .get::<Secret>(Some("istio-system"), "istio-ca-secret")
        .unwrap();
    assert_eq!(
        secret.metadata.resource_version.as_deref(),
        Some(stored.to_string().as_str())
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_plugged_in_cacerts_secret_with_a_pkcs1_key_signs() {
    let api = FakeApiServer::start().await.unwrap();
    for ns in ["default", "istio-system"] {
        api.apply(&objects::namespace(ns, &[]));
    }
    // The root signs directly: `cert-chain.pem` holds the signing certificate.
    api.apply(&objects::secret(
        "istio-system",
        "cacerts",
        "Opaque",
        &[
            ("ca-cert.pem", ISTIOD_CERT.as_bytes()),
            ("ca-key.pem", ISTIOD_KEY.as_bytes()),
            ("cert-chain.pem", ISTIOD_CERT.as_bytes()),
            ("root-cert.pem", ISTIOD_CERT.as_bytes()),
        ],
    ));
    let server = kube_mesh(&api).await;
    assert_eq!(published_root(&api, "default").await, ISTIOD_CERT);
    assert!(
        api.get::<Secret>(Some("istio-system"), "istio-ca-secret")
            .is_none(),
        "a plugged-in CA creates no self-signed one"
    );
    server.shutdown().await;
}

//! The security pieces against the fake API server: `review_token` against tokens
//! the fake mints (on the real wire format and with RBAC), and the CA's Secrets.

use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use meshfed_kube::ca_secret::CacertsLayout;
use meshfed_kube::fake_api::objects::{self, types};
use meshfed_kube::fake_api::{FakeApiServer, PolicyRule, RbacPolicy, Scope};
use meshfed_kube::{
    CaSecretError, TokenReviewError, load_or_create_self_signed, read_cacerts, review_token,
};

fn hour() -> SystemTime {
    SystemTime::now() + Duration::from_secs(3600)
}

fn ca() -> Vec<String> {
    vec!["istio-ca".to_string()]
}

#[tokio::test]
async fn a_valid_pod_bound_token_names_its_service_account_and_pod() {
    let api = FakeApiServer::start().await.unwrap();
    let token = api.issue_token(
        "bookinfo",
        "reviews",
        &["istio-ca"],
        hour(),
        Some(("reviews-v1-abc", "0f1e-uid")),
    );
    let account = review_token(&api.client(), &token, &ca()).await.unwrap();
    assert_eq!(account.namespace, "bookinfo");
    assert_eq!(account.service_account, "reviews");
    assert_eq!(account.pod_name.as_deref(), Some("reviews-v1-abc"));
    assert_eq!(account.pod_uid.as_deref(), Some("0f1e-uid"));

    let unbound = api.issue_token("bookinfo", "ratings", &["istio-ca", "other"], hour(), None);
    let account = review_token(&api.client(), &unbound, &ca()).await.unwrap();
    assert_eq!(account.service_account, "ratings");
    assert_eq!(account.pod_name, None);
    let posted = api
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path == "/apis/authentication.k8s.io/v1/tokenreviews")
        .count();
    assert_eq!(posted, 2, "one TokenReview per review");
}

/// The raw answer, as any client (client-go, kube-rs) reads it.
async fn raw_review(api: &FakeApiServer, spec: serde_json::Value) -> (u16, serde_json::Value) {
    let client = api.client();
    let body = serde_json::to_vec(&serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": spec,
    }))
    .unwrap();
    let request = http_request("/apis/authentication.k8s.io/v1/tokenreviews", body);
    let answer = client.send(request.map(Into::into)).await.unwrap();
    let code = answer.status().as_u16();
    let bytes = axum::body::to_bytes(axum::body::Body::new(answer.into_body()), usize::MAX)
        .await
        .unwrap();
    (code, serde_json::from_slice(&bytes).unwrap())
}

fn http_request(path: &str, body: Vec<u8>) -> axum::http::Request<Vec<u8>> {
    axum::http::Request::post(path)
        .header("content-type", "application/json")
        .body(body)
        .unwrap()
}

#[tokio::test]
async fn the_wire_answer_is_a_created_token_review_with_status() {
    let api = FakeApiServer::start().await.unwrap();
    let token = api.issue_token("ns", "sa", &["istio-ca"], hour(), Some(("p", "u")));
    let (code, review) = raw_review(
        &api,
        serde_json::json!({"token": token, "audiences": ["istio-ca", "x"]}),
    )
    .await;
    assert_eq!(code, 201);
    assert_eq!(review["kind"], "TokenReview");
    assert_eq!(review["apiVersion"], "authentication.k8s.io/v1");
    assert_eq!(review["spec"]["token"], token.as_str());
    let status = &review["status"];
    assert_eq!(status["authenticated"], true);
    assert_eq!(status["audiences"], serde_json::json!(["istio-ca"]));
    assert_eq!(status["user"]["username"], "system:serviceaccount:ns:sa");
    assert_eq!(
        status["user"]["groups"],
        serde_json::json!([
            "system:serviceaccounts",
            "system:serviceaccounts:ns",
            "system:authenticated"
        ])
    );
    assert_eq!(
        status["user"]["extra"]["authentication.kubernetes.io/pod-name"],
        serde_json::json!(["p"])
    );
    assert!(status["user"]["uid"].is_string());

    let (code, review) = raw_review(&api, serde_json::json!({"token": "garbage"})).await;
    assert_eq!(code, 201, "a refused token is still a created review");
    assert!(review["status"]["authenticated"].is_null());
    assert_eq!(review["status"]["user"], serde_json::json!({}));
    assert!(review["status"]["error"].is_string());

    let (code, review) = raw_review(&api, serde_json::json!({})).await;
    assert_eq!(code, 400, "{review}");
}

#[tokio::test]
async fn refusals_carry_the_api_servers_reason() {
    let api = FakeApiServer::start().await.unwrap();
    let client = api.client();
    let unknown = review_token(&client, "not-a-token", &ca())
        .await
        .unwrap_err();
    assert!(matches!(unknown, TokenReviewError::Refused(_)), "{unknown}");

    let expired = api.issue_token(
        "ns",
        "sa",
        &["istio-ca"],
        SystemTime::now() - Duration::from_secs(1),
        None,
    );
    let err = review_token(&client, &expired, &ca()).await.unwrap_err();
    assert!(
        matches!(&err, TokenReviewError::Refused(e) if e.contains("expired")),
        "{err}"
    );

    let other = api.issue_token("ns", "sa", &["vault"], hour(), None);
    let err = review_token(&client, &other, &ca()).await.unwrap_err();
    let TokenReviewError::Refused(message) = &err else {
        panic!("{err}");
    };
    assert!(
        message.contains(
            r#"token audiences ["vault"] is invalid for the target audiences ["istio-ca"]"#
        ),
        "{message}"
    );

    // No audiences asked: the API server's own; a token minted for it passes.
    let default = api.issue_token("ns", "sa", &[], hour(), None);
    assert!(review_token(&client, &default, &[]).await.is_ok());
    assert!(review_token(&client, &default, &ca()).await.is_err());
}

#[tokio::test]
async fn creating_token_reviews_needs_rbac() {
    let api = FakeApiServer::start().await.unwrap();
    api.enforce(RbacPolicy::default());
    let token = api.issue_token("ns", "sa", &["istio-ca"], hour(), None);
    let err = review_token(&api.client(), &token, &ca())
        .await
        .unwrap_err();
    match &err {
        TokenReviewError::Api(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403);
            assert!(
                status.message.contains("tokenreviews"),
                "{}",
                status.message
            );
        }
        other => panic!("expected Forbidden, got {other}"),
    }
    api.enforce(RbacPolicy::default().allow(
        Scope::Cluster,
        PolicyRule {
            api_groups: vec!["authentication.k8s.io".into()],
            resources: vec!["tokenreviews".into()],
            verbs: vec!["create".into()],
            ..Default::default()
        },
    ));
    let account = review_token(&api.client(), &token, &ca()).await.unwrap();
    assert_eq!(account.service_account, "sa");
}

// === CA material in Secrets ===

const NS: &str = "istio-system";

fn secret(name: &str, data: &[(&str, &str)]) -> types::Secret {
    types::Secret {
        metadata: objects::meta(NS, name, &[]),
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

#[tokio::test]
async fn cacerts_all_keys_none_or_an_incomplete_bundle() {
    let api = FakeApiServer::start().await.unwrap();
    let client = api.client();
    assert_eq!(read_cacerts(&client, NS).await.unwrap(), None, "no Secret");
    api.apply(&secret("cacerts", &[("unrelated", "x")]));
    assert_eq!(
        read_cacerts(&client, NS).await.unwrap(),
        None,
        "none of the keys"
    );

    api.apply(&secret(
        "cacerts",
        &[("ca-cert.pem", "CERT"), ("root-cert.pem", "ROOT")],
    ));
    let err = read_cacerts(&client, NS).await.unwrap_err();
    assert!(matches!(&err, CaSecretError::Incomplete { missing, .. }
        if missing == &["ca-key.pem".to_string(), "cert-chain.pem".to_string()]));
    let message = err.to_string();
    assert!(
        message.contains("incomplete signing CA bundle")
            && message.contains("ca-key.pem, cert-chain.pem"),
        "{message}"
    );

    api.apply(&secret(
        "cacerts",
        &[
            ("ca-cert.pem", "CERT"),
            ("ca-key.pem", "KEY"),
            ("root-cert.pem", "ROOT"),
            ("cert-chain.pem", "CHAIN"),
        ],
    ));
    let pems = read_cacerts(&client, NS).await.unwrap().unwrap();
    assert_eq!(pems.layout, CacertsLayout::Istio);
    assert_eq!(
        (
            &*pems.ca_cert,
            &*pems.ca_key,
            &*pems.root_cert,
            &*pems.cert_chain
        ),
        ("CERT", "KEY", "ROOT", "CHAIN")
    );
}

#[tokio::test]
async fn cacerts_in_the_kubernetes_tls_layout() {
    let api = FakeApiServer::start().await.unwrap();
    let client = api.client();
    api.apply(&secret(
        "cacerts",
        &[
            ("tls.crt", "SIGNING\n"),
            ("tls.key", "KEY"),
            ("ca.crt", "ROOT\n"),
        ],
    ));
    let pems = read_cacerts(&client, NS).await.unwrap().unwrap();
    assert_eq!(pems.layout, CacertsLayout::KubernetesTls);
    assert_eq!(pems.ca_cert, "SIGNING\n");
    assert_eq!(pems.ca_key, "KEY");
    assert_eq!(pems.root_cert, "ROOT\n");
    assert_eq!(pems.cert_chain, "SIGNING\nROOT\n");

    api.apply(&secret("cacerts", &[("tls.crt", "SIGNING\n")]));
    let err = read_cacerts(&client, NS).await.unwrap_err();
    assert!(err.to_string().contains("missing tls.key, ca.crt"), "{err}");
}

#[tokio::test]
async fn the_self_signed_ca_is_created_once_and_then_read() {
    let api = FakeApiServer::start().await.unwrap();
    let client = api.client();
    let first = load_or_create_self_signed(&client, NS, || {
        Ok::<_, String>(("CERT-1".to_string(), "KEY-1".to_string()))
    })
    .await
    .unwrap();
    assert_eq!(first, ("CERT-1".to_string(), "KEY-1".to_string()));
    let stored: types::Secret = api.get(Some(NS), "istio-ca-secret").unwrap();
    assert_eq!(stored.type_.as_deref(), Some("istio.io/ca-root"));
    let data = stored.data.unwrap();
    let text = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
    assert_eq!(text("ca-cert.pem"), "CERT-1");
    assert_eq!(text("ca-key.pem"), "KEY-1");
    assert_eq!(text("root-cert.pem"), "CERT-1");
    assert_eq!(text("cert-chain.pem"), "");

    let second = load_or_create_self_signed(&client, NS, || -> Result<(String, String), String> {
        panic!("a stored CA is not generated again")
    })
    .await
    .unwrap();
    assert_eq!(second, first);

    let failed = FakeApiServer::start().await.unwrap();
    let err = load_or_create_self_signed(&failed.client(), NS, || {
        Err::<(String, String), _>("no entropy")
    })
    .await
    .unwrap_err();
    assert!(
        matches!(&err, CaSecretError::Generate(e) if e == "no entropy"),
        "{err}"
    );
    assert!(
        failed
            .get::<types::Secret>(Some(NS), "istio-ca-secret")
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_racing_end_with_one_root() {
    let api = FakeApiServer::start().await.unwrap();
    // Both replicas read "no Secret" before either generates: the barrier holds each
    // generator until the other has got there too, so both create and one gets 409.
    let both_generating = Arc::new(Barrier::new(2));
    let replica = |n: u32| {
        let client = api.client();
        let barrier = both_generating.clone();
        tokio::spawn(async move {
            load_or_create_self_signed(&client, NS, move || {
                barrier.wait();
                Ok::<_, String>((format!("CERT-{n}"), format!("KEY-{n}")))
            })
            .await
        })
    };
    let (a, b) = (replica(1), replica(2));
    let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
    assert_eq!(a, b, "both replicas use the same root");
    let stored: types::Secret = api.get(Some(NS), "istio-ca-secret").unwrap();
    let cert = String::from_utf8(stored.data.unwrap()["ca-cert.pem"].0.clone()).unwrap();
    assert_eq!(a.0, cert, "the stored one");
    let creates = api
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/secrets"))
        .count();
    assert_eq!(creates, 2, "both tried to create; one lost the race");
}

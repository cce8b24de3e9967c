//! RequestAuthentication end to end: a policy in the config directory, its JWKS served
//! by a loopback issuer, fetched by the control plane and inlined into the sidecar's
//! inbound `jwt_authn` filter.

use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::JwtAuthentication;
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::jwt_provider::JwksSourceSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_filter,
};
use meshfed::ads::TypeUrl;
use meshfed::testing::{AdsClient, FakeServer, decode_all, node_with};
use meshfed_registry::{Protocol, ServiceKey};
use prost::Message;

use crate::support::*;

const KEYS: &str = r#"{"keys":[{"kty":"RSA","kid":"k","e":"AQAB","n":"sA"}]}"#;
const REVIEWS: &str = "reviews.default.svc.cluster.local";

/// The inline JWKS of the `jwt_authn` filter on the inbound chain of port 9080.
fn inbound_jwks(listeners: &[Listener]) -> Option<String> {
    let vi = listeners.iter().find(|l| l.name == "virtualInbound")?;
    let chain = vi.filter_chains.iter().find(|c| c.name == "0.0.0.0_9080")?;
    // The connection manager (after the metadata exchange filter).
    let hcm = chain
        .filters
        .iter()
        .find(|f| f.name == "envoy.filters.network.http_connection_manager")?;
    let Some(filter::ConfigType::TypedConfig(any)) = &hcm.config_type else {
        return None;
    };
    let hcm = HttpConnectionManager::decode(any.value.as_slice()).ok()?;
    let jwt = hcm
        .http_filters
        .iter()
        .find(|f| f.name == "envoy.filters.http.jwt_authn")?;
    let Some(http_filter::ConfigType::TypedConfig(any)) = &jwt.config_type else {
        return None;
    };
    let config = JwtAuthentication::decode(any.value.as_slice()).ok()?;
    match &config.providers["origins-0"].jwks_source_specifier {
        Some(JwksSourceSpecifier::LocalJwks(ds)) => match &ds.specifier {
            Some(Specifier::InlineString(s)) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_authentication_gets_its_jwks_fetched_and_inlined_on_the_inbound_chain() {
    let issuer = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer_url = format!("http://{}", issuer.local_addr().unwrap());
    let app = axum::Router::new().route("/keys", axum::routing::get(|| async { KEYS }));
    tokio::spawn(async move { axum::serve(issuer, app).await });

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ra.yaml"),
        format!(
            "apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: jwt, namespace: default}}
spec:
  selector: {{matchLabels: {{app: reviews}}}}
  jwtRules:
  - issuer: {issuer_url}
    jwksUri: {issuer_url}/keys
"
        ),
    )
    .unwrap();
    let server = FakeServer::builder()
        .config_dir(dir.path())
        .start()
        .await
        .unwrap();
    let reg = server.mock_registry("c1");
    reg.add_service(service(
        REVIEWS,
        "default",
        &[("http", 9080, Protocol::Http)],
    ));
    reg.set_endpoints(
        &ServiceKey::new(REVIEWS, "default"),
        vec![endpoint("10.0.0.1", "http", 9080, "r1/z1")],
    );
    ready_and_synced(&server).await;

    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            "sidecar~10.0.0.1~reviews-1.default~default.svc.cluster.local",
            serde_json::json!({"LABELS": {"app": "reviews"}}),
        ),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Listener, &[]).await.unwrap();
    // The first answer may predate the fetch (the fake JWKS: tokens refused); the
    // fetch pushes the keys.
    let mut seen = Vec::new();
    for _ in 0..5 {
        let listeners: Vec<Listener> =
            decode_all(&client.recv_type(TypeUrl::Listener).await.unwrap()).unwrap();
        let jwks = inbound_jwks(&listeners).expect("a jwt_authn filter on 0.0.0.0_9080");
        if jwks == KEYS {
            break;
        }
        assert!(jwks.contains("\"kid\":\"abc\""), "the fake JWKS: {jwks}");
        seen.push(jwks);
    }
    assert!(seen.len() < 5, "the fetched keys never arrived: {seen:?}");
    let metrics = http_get(server.bound().monitoring, "/metrics").await.1;
    assert_eq!(
        metric(&metrics, "pilot_jwks_resolver_network_fetch_success_total"),
        Some(1.0),
        "{metrics}"
    );
    server.shutdown().await;
}

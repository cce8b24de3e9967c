//! The resolver against loopback HTTP servers (port 0, no sleeps: fetches are
//! awaited through [`JwksResolver::wait_fetched`]).

use std::time::UNIX_EPOCH;

use meshfed_api::security::v1beta1::JwtRule;
use meshfed_registry::{EndpointIndex, RegistryEvent};
use tokio::sync::mpsc::UnboundedReceiver;

use super::*;
use crate::generate::jwt::{fake_jwks, jwt_authentication};

const KEYS_1: &str = r#"{"keys":[{"kty":"RSA","kid":"one","e":"AQAB","n":"sA"}]}"#;
const KEYS_2: &str = r#"{"keys":[{"kty":"RSA","kid":"two","e":"AQAB","n":"sQ"}]}"#;

use crate::authn::jwt::test_issuer::Issuer;

fn ra(name: &str, issuer: &str, uri: &str) -> Config<RequestAuthentication> {
    Config {
        name: name.into(),
        namespace: "ns".into(),
        labels: Default::default(),
        annotations: Default::default(),
        creation_time: UNIX_EPOCH,
        spec: RequestAuthentication {
            jwt_rules: vec![JwtRule {
                issuer: issuer.into(),
                jwks_uri: uri.into(),
                ..Default::default()
            }],
            ..Default::default()
        },
    }
}

fn resolver() -> (
    JwksResolver,
    UnboundedReceiver<RegistryEvent>,
    Arc<JwksMetrics>,
) {
    let (sink, rx) = UpdateSink::new(Arc::new(EndpointIndex::new()));
    let metrics = Arc::new(JwksMetrics::default());
    (JwksResolver::new(sink, metrics.clone()), rx, metrics)
}

/// The inline document the generator gives the only rule of `policy`.
fn inlined(policy: &Config<RequestAuthentication>, table: &JwksTable) -> String {
    let rule = &policy.spec.jwt_rules[0];
    let config = jwt_authentication(&[rule], table, false).unwrap();
    let provider = &config.providers["origins-0"];
    use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
    use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::jwt_provider::JwksSourceSpecifier;
    match &provider.jwks_source_specifier {
        Some(JwksSourceSpecifier::LocalJwks(ds)) => match &ds.specifier {
            Some(Specifier::InlineString(s)) => s.clone(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

/// The RequestAuthentication keys of the next push request.
fn pushed(rx: &mut UnboundedReceiver<RegistryEvent>) -> Vec<String> {
    match rx.try_recv() {
        Ok(RegistryEvent::Push(request)) => {
            assert!(request.full);
            request
                .configs_updated
                .iter()
                .map(|k| {
                    assert_eq!(k.kind, ConfigKind::RequestAuthentication);
                    format!("{}/{}", k.namespace, k.name)
                })
                .collect()
        }
        other => panic!("no push: {other:?}"),
    }
}

#[tokio::test]
async fn a_jwks_uri_is_fetched_inlined_and_pushed_and_a_key_change_pushes_again() {
    let issuer = Issuer::serve(KEYS_1.into()).await;
    let (resolver, mut rx, metrics) = resolver();
    let policy = ra("jwt", &issuer.url, &format!("{}/keys", issuer.url));
    // Not fetched yet: tokens are refused meanwhile.
    let table = resolver.table_for([&policy]);
    assert_eq!(
        inlined(&policy, &table),
        fake_jwks(&format!("{}/keys", issuer.url))
    );
    resolver.wait_fetched(1).await;
    assert_eq!(pushed(&mut rx), ["ns/jwt"]);
    let table = resolver.table_for([&policy]);
    assert_eq!(inlined(&policy, &table), KEYS_1);
    assert_eq!(metrics.fetch_success.get(), 1);
    // Rebuilding the index does not fetch again.
    assert_eq!(issuer.fetches(), 1);
    // A refresh with the same keys pushes nothing; new keys push.
    assert!(!resolver.refresh().await);
    assert!(rx.try_recv().is_err(), "unchanged keys push nothing");
    issuer.rotate(KEYS_2.into());
    assert!(!resolver.refresh().await);
    assert_eq!(pushed(&mut rx), ["ns/jwt"]);
    assert_eq!(inlined(&policy, &resolver.table_for([&policy])), KEYS_2);
    assert_eq!(metrics.fetch_success.get(), 3);
}

#[tokio::test]
async fn an_unreachable_jwks_uri_gives_the_fake_jwks_and_counts_a_failure() {
    let closed = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let uri = format!("http://{closed}/keys");
    let (resolver, mut rx, metrics) = resolver();
    let policy = ra("jwt", "https://issuer.example", &uri);
    resolver.table_for([&policy]);
    resolver.wait_fetched(1).await;
    assert_eq!(metrics.fetch_fail.get(), 1);
    assert_eq!(metrics.fetch_success.get(), 0);
    assert!(rx.try_recv().is_err(), "nothing changed for the proxies");
    let table = resolver.table_for([&policy]);
    assert!(table.is_empty());
    assert_eq!(inlined(&policy, &table), fake_jwks(&uri));
    // The refresh tries again, and fails again.
    assert!(resolver.refresh().await);
    assert_eq!(metrics.fetch_fail.get(), 2);
}

#[tokio::test]
async fn a_failed_refresh_keeps_the_keys_fetched_before() {
    let issuer = Issuer::serve(KEYS_1.into()).await;
    let (resolver, mut rx, _) = resolver();
    let policy = ra("jwt", &issuer.url, &format!("{}/keys", issuer.url));
    resolver.table_for([&policy]);
    resolver.wait_fetched(1).await;
    pushed(&mut rx);
    issuer.rotate("not a key set".into());
    assert!(resolver.refresh().await, "not a JWKS: a failure");
    assert!(rx.try_recv().is_err());
    assert_eq!(inlined(&policy, &resolver.table_for([&policy])), KEYS_1);
}

#[tokio::test]
async fn without_jwks_uri_the_keys_are_found_through_oidc_discovery() {
    let issuer = Issuer::serve(KEYS_1.into()).await;
    let (resolver, mut rx, metrics) = resolver();
    let policy = ra("oidc", &issuer.url, "");
    resolver.table_for([&policy]);
    resolver.wait_fetched(1).await;
    assert_eq!(pushed(&mut rx), ["ns/oidc"]);
    assert_eq!(inlined(&policy, &resolver.table_for([&policy])), KEYS_1);
    // The discovery document and the keys.
    assert_eq!(metrics.fetch_success.get(), 2);
}

#[tokio::test]
async fn keys_no_policy_names_are_forgotten_and_inline_keys_are_never_fetched() {
    let issuer = Issuer::serve(KEYS_1.into()).await;
    let (resolver, _rx, _) = resolver();
    let policy = ra("jwt", &issuer.url, &format!("{}/keys", issuer.url));
    resolver.table_for([&policy]);
    resolver.wait_fetched(1).await;
    assert_eq!(resolver.table_for([&policy]).len(), 1);
    let mut inline = ra("inline", "https://other", "");
    inline.spec.jwt_rules[0].jwks = KEYS_2.into();
    assert!(resolver.table_for([&inline]).is_empty());
    assert!(!resolver.refresh().await, "nothing left to fetch");
    assert_eq!(issuer.fetches(), 1);
}

#[test]
fn refreshes_back_off_after_failures_as_istio_does() {
    let m = Duration::from_secs(60);
    assert_eq!(next_refresh(REFRESH_INTERVAL, false, false), 20 * m);
    assert_eq!(next_refresh(REFRESH_INTERVAL, true, false), m);
    assert_eq!(next_refresh(m, true, true), 2 * m);
    assert_eq!(next_refresh(32 * m, true, true), 60 * m);
    assert_eq!(next_refresh(60 * m, true, true), 60 * m);
    assert_eq!(next_refresh(4 * m, false, true), 20 * m);
}

#[test]
fn fetch_modes_are_read_as_istio_reads_them() {
    use crate::generate::jwt::JwksFetchMode;
    for (value, mode) in [
        (None, JwksFetchMode::Istiod),
        (Some("false"), JwksFetchMode::Istiod),
        (Some("istiod"), JwksFetchMode::Istiod),
        (Some("true"), JwksFetchMode::Envoy),
        (Some("Envoy"), JwksFetchMode::Envoy),
        (Some("hybrid"), JwksFetchMode::Hybrid),
    ] {
        assert_eq!(JwksFetchMode::parse(value), (mode, None), "{value:?}");
    }
    let (mode, warning) = JwksFetchMode::parse(Some("sometimes"));
    assert_eq!(mode, JwksFetchMode::Istiod);
    assert!(warning.unwrap().contains("sometimes"));
}

#[tokio::test]
async fn in_envoy_mode_only_oidc_discovery_is_fetched_here() {
    use crate::generate::jwt::JwksFetchMode;
    let followed = |mode: JwksFetchMode| {
        let (sink, _rx) = UpdateSink::new(Arc::new(EndpointIndex::new()));
        let resolver = JwksResolver::with_mode(sink, Arc::new(JwksMetrics::default()), mode);
        // Loopback addresses nothing listens on: the fetches fail, which is fine here.
        let with_uri = ra("uri", "https://a.example", "http://127.0.0.1:1/keys");
        let discovery = ra("oidc", "http://127.0.0.1:1", "");
        let table = resolver.table_for([&with_uri, &discovery]);
        assert_eq!(table.mode(), mode);
        let entries = resolver.inner.entries.lock().unwrap();
        entries.keys().map(|k| k.issuer.clone()).collect::<Vec<_>>()
    };
    assert_eq!(followed(JwksFetchMode::Envoy), ["http://127.0.0.1:1"]);
    assert_eq!(
        followed(JwksFetchMode::Hybrid),
        ["http://127.0.0.1:1", "https://a.example"]
    );
    assert_eq!(
        followed(JwksFetchMode::Istiod),
        ["http://127.0.0.1:1", "https://a.example"]
    );
}

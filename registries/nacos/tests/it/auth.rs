//! Credentials: login tokens and access-key signatures on both transports, refusals
//! counted apart, and no secret in any log line.

use meshfed_nacos::fake::{FakeNacos, Instance};
use meshfed_nacos::{Credentials, Transport};
use meshfed_registry::ServiceRegistry;

use crate::support::*;

const PASSWORD: &str = "pa55-w0rd-xyz";
const SECRET_KEY: &str = "s3cret-k3y-abc";

#[tokio::test(flavor = "current_thread")]
async fn logins_and_signatures_are_sent_and_refusals_counted_without_leaking() {
    let (logs, _guard) = Logs::capture();
    let nacos = FakeNacos::start().await.unwrap();
    nacos.register(Instance::new("web", "10.0.0.1", 8080));
    nacos.require_login(Some(("nacos", PASSWORD)));
    nacos.require_access_key(Some(("ak-1", SECRET_KEY)));

    // A wrong password: refused at login, counted as an auth failure, never synced.
    let mut config = config(&nacos);
    config.credentials = Credentials {
        username: Some("nacos".into()),
        password: Some("wrong-pa55".into()),
        access_key: Some("ak-1".into()),
        secret_key: Some(SECRET_KEY.into()),
        ..Credentials::default()
    };
    let wrong = Running::start(config.clone());
    let registry = wrong.registry.clone();
    eventually("refusals to be counted", || async {
        (registry.stats().auth_failures().1 >= 2).then_some(())
    })
    .await;
    assert!(!registry.has_synced());
    assert!(registry.is_stale());
    wrong.stop().await;

    // The right one, over gRPC then HTTP.
    config.credentials.password = Some(PASSWORD.into());
    for transport in [Transport::Grpc, Transport::Http] {
        config.transport = transport;
        let mut right = Running::start(config.clone());
        right.synced().await;
        assert_eq!(right.addresses("web"), ["10.0.0.1"]);
        right.stop().await;
    }
    let subscribe = nacos.requests_of("SubscribeServiceRequest");
    let headers = &subscribe[0].headers;
    assert!(headers["accessToken"].starts_with("token-"), "{headers:?}");
    assert!(
        headers["data"].ends_with("@@DEFAULT_GROUP@@web"),
        "{headers:?}"
    );
    let http = nacos.requests_of("/v1/ns/instance/list");
    assert!(http[0].headers.contains_key("accessToken"));
    assert!(
        !http[0].headers["?query"].contains("token"),
        "the token is not in the URL: {:?}",
        http[0].headers
    );

    // Revoked tokens are refused over gRPC, counted, and a new login recovers.
    config.transport = Transport::Grpc;
    let mut revoked = Running::start(config.clone());
    revoked.synced().await;
    let registry = revoked.registry.clone();
    nacos.revoke_tokens();
    nacos.register(Instance::new("db", "10.0.3.1", 5432));
    eventually("a gRPC refusal", || async {
        (registry.stats().auth_failures().0 >= 1).then_some(())
    })
    .await;
    eventually("the new service after a new login", || async {
        registry.service(&revoked.key("db")).map(|_| ())
    })
    .await;
    // The refused session's connection was closed, not left behind.
    eventually("one registered connection", || async {
        (nacos.connections() == 1).then_some(())
    })
    .await;
    revoked.stop().await;

    let text = logs.text();
    assert!(text.contains("refused the credentials"), "{text}");
    for secret in [PASSWORD, SECRET_KEY, "token-"] {
        assert!(!text.contains(secret), "{secret:?} in the logs:\n{text}");
    }
}

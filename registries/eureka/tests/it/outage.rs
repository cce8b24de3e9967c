//! Eureka unreachable, failing or refusing: the last view is kept and marked stale,
//! refusals are counted apart and no credential is ever logged; an emptied registry
//! is warned about; a second server takes over.

use meshfed_eureka::fake::{FakeEureka, Instance};
use meshfed_eureka::{EurekaConfig, FullReason};
use meshfed_registry::{RegistryEvent, ServiceRegistry};

use crate::support::{Harness, capture_logs, config, key};

const PASSWORD: &str = "s3cr3t-pa55";

async fn web() -> FakeEureka {
    let eureka = FakeEureka::start().await.unwrap();
    eureka.register(Instance::new("WEB", "web-1", "10.0.0.1", 8080));
    eureka.register(Instance::new("WEB", "web-2", "10.0.0.2", 8080));
    eureka
}

fn no_full_push(events: &[RegistryEvent]) {
    for e in events {
        if let RegistryEvent::Push(p) = e {
            assert!(!p.full, "nothing was removed or changed: {p:?}");
        }
    }
}

#[tokio::test]
async fn an_outage_keeps_the_last_view_marked_stale_then_recovers() {
    let (mut h, _) = Harness::synced(web().await).await;
    h.eureka.go_down().await;
    h.round().await;
    assert!(h.registry.is_stale());
    assert!(h.registry.has_synced());
    assert_eq!(
        h.addresses(&key("web")),
        ["10.0.0.1", "10.0.0.2"],
        "the last endpoints are kept"
    );
    assert!(h.registry.service(&key("web")).is_some());
    no_full_push(&h.pending());
    let error = h.registry.stats().last_error().unwrap();
    assert!(
        error.contains("cannot reach Eureka at http://127.0.0.1:"),
        "{error}"
    );
    assert_eq!(
        h.registry.stats().auth_failures(),
        (0, 0),
        "an outage is not a refusal"
    );

    // Changes made meanwhile arrive after it comes back (a full fetch: the delta
    // window may have passed).
    h.eureka
        .register(Instance::new("WEB", "web-3", "10.0.0.3", 8080));
    h.eureka.deregister("WEB", "web-1");
    h.eureka.expire_delta();
    h.eureka.come_back().await.unwrap();
    h.until("fresh with the changes", |h| {
        (!h.registry.is_stale() && h.addresses(&key("web")) == ["10.0.0.2", "10.0.0.3"])
            .then_some(())
    })
    .await;
    assert_eq!(h.registry.stats().full_fetches(FullReason::Initial), 2);
    h.stop().await;
}

#[tokio::test]
async fn error_answers_mark_stale_and_recover() {
    let (h, _) = Harness::synced(web().await).await;
    h.eureka.fail_with(Some(503));
    h.round().await;
    assert!(h.registry.is_stale());
    let error = h.registry.stats().last_error().unwrap();
    assert!(error.contains("HTTP 503"), "{error}");
    assert_eq!(h.addresses(&key("web")).len(), 2);
    h.eureka.fail_with(None);
    h.until("fresh", |h| (!h.registry.is_stale()).then_some(()))
        .await;
    h.stop().await;
}

#[tokio::test]
async fn basic_auth_from_the_url_is_sent_and_refusals_are_counted_apart_without_secrets() {
    let (logs, _guard) = capture_logs();
    let eureka = web().await;
    eureka.require_basic_auth(Some(("meshfed", PASSWORD)));
    let url = eureka
        .url()
        .replace("http://", &format!("http://meshfed:{PASSWORD}@"));
    let mut c = config(&url);
    // Rounds only when asked, so that each refusal is counted once.
    c.retry_interval = c.fetch_interval;
    assert!(!format!("{c:?}").contains(PASSWORD));
    let mut h = Harness::start(eureka, c);
    h.wait_synced().await;
    let requests = h.eureka.requests();
    // base64("meshfed:s3cr3t-pa55")
    assert_eq!(
        requests[0].authorization.as_deref(),
        Some("Basic bWVzaGZlZDpzM2NyM3QtcGE1NQ==")
    );

    // The password is rotated on the server: 401s, counted apart, the view kept.
    h.eureka.require_basic_auth(Some(("meshfed", "rotated")));
    h.round().await;
    assert_eq!(h.registry.stats().auth_failures(), (1, 0));
    assert!(h.registry.is_stale());
    assert_eq!(h.addresses(&key("web")).len(), 2);
    let error = h.registry.stats().last_error().unwrap();
    assert!(
        error.contains("Eureka refused the request (HTTP 401)"),
        "{error}"
    );
    assert!(error.contains("--eurekaServerURL"), "{error}");
    // A role missing: 403, counted apart from the 401s.
    h.eureka.require_basic_auth(None);
    h.eureka.forbid(true);
    h.round().await;
    assert_eq!(h.registry.stats().auth_failures(), (1, 1));
    h.eureka.forbid(false);
    h.round().await;
    assert!(!h.registry.is_stale());

    let text = logs.text();
    assert!(text.contains("HTTP 401"), "the refusal is logged: {text}");
    assert!(
        !text.contains(PASSWORD),
        "no credential in the logs: {text}"
    );
    assert!(!text.contains("bWVzaGZlZDpzM2NyM3QtcGE1NQ"), "{text}");
    assert!(!format!("{:?}", h.registry).contains(PASSWORD));
    h.stop().await;
}

#[tokio::test]
async fn credentials_from_the_flags_go_to_urls_without_user_info() {
    let eureka = web().await;
    eureka.require_basic_auth(Some(("meshfed", PASSWORD)));
    let c = EurekaConfig {
        credentials: Some(meshfed_eureka::Credentials {
            username: "meshfed".into(),
            password: PASSWORD.into(),
        }),
        ..config(&eureka.url())
    };
    let mut h = Harness::start(eureka, c);
    h.wait_synced().await;
    assert_eq!(h.addresses(&key("web")).len(), 2);
    h.stop().await;
}

#[tokio::test]
async fn an_emptied_registry_is_warned_about_and_withdrawn() {
    let (logs, _guard) = capture_logs();
    let (mut h, _) = Harness::synced(web().await).await;
    // Every instance cancelled: the delta deletes them all.
    h.eureka.clear();
    h.round().await;
    assert_eq!(h.registry.stats().deltas(), 1);
    assert_eq!(h.registry.stats().hash_mismatches(), 0);
    assert!(h.registry.services().is_empty());
    assert!(h.endpoints(&key("web")).is_empty());
    assert!(h.pushes().iter().any(|p| p.full));
    assert!(
        logs.text()
            .contains("the registry lists no applications any more; withdrawing all 1"),
        "{}",
        logs.text()
    );
    h.stop().await;
}

#[tokio::test]
async fn a_second_server_takes_over_when_the_first_is_down() {
    let down = FakeEureka::start().await.unwrap();
    down.go_down().await;
    let up = web().await;
    let mut c = config(&down.url());
    c.servers
        .push(meshfed_eureka::EurekaServer::parse(&up.url()).unwrap());
    let mut h = Harness::start(up, c);
    h.wait_synced().await;
    assert_eq!(h.addresses(&key("web")).len(), 2);
    assert_eq!(h.registry.stats().failovers(), 1);
    // The server that answered is asked first from then on.
    h.eureka
        .register(Instance::new("WEB", "web-3", "10.0.0.3", 8080));
    h.round().await;
    assert_eq!(h.registry.stats().failovers(), 1);
    assert_eq!(h.registry.stats().deltas(), 1);
    assert_eq!(h.addresses(&key("web")).len(), 3);
    drop(down);
    h.stop().await;
}

#[tokio::test]
async fn a_server_not_ready_yet_delays_the_sync() {
    let eureka = web().await;
    eureka.set_not_ready(true);
    let mut c = config_with_fast_retries();
    c.servers = config(&eureka.url()).servers;
    let h = Harness::start(eureka, c);
    h.until("a refusal", |h| {
        (h.registry.stats().errors() > 0).then_some(())
    })
    .await;
    assert!(!h.registry.has_synced());
    h.eureka.set_not_ready(false);
    h.until("the sync", |h| h.registry.has_synced().then_some(()))
        .await;
    assert!(!h.registry.is_stale());
    h.stop().await;
}

fn config_with_fast_retries() -> EurekaConfig {
    EurekaConfig {
        fetch_interval: std::time::Duration::from_millis(50),
        retry_interval: std::time::Duration::from_millis(5),
        ..EurekaConfig::default()
    }
}

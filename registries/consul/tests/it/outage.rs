//! Consul unreachable or failing: the last view is kept and marked stale, and the
//! registry recovers by itself. Tokens and datacenters.

use meshfed_consul::fake::{FakeConsul, Instance};
use meshfed_consul::{ConsulConfig, ConsulRegistry, Error};
use meshfed_registry::{EndpointIndex, RegistryEvent, ServiceKey, ServiceRegistry, UpdateSink};

use crate::support::{Harness, config, key};

async fn web() -> FakeConsul {
    let consul = FakeConsul::start().await.unwrap();
    consul.register(Instance::new("web", "web-1", "10.0.0.1", 80).with_tags(&["http"]));
    consul.register(Instance::new("web", "web-2", "10.0.0.2", 80).with_tags(&["http"]));
    consul
}

fn no_deletion(events: &[RegistryEvent]) {
    for e in events {
        if let RegistryEvent::Push(p) = e {
            assert!(!p.full, "nothing was removed or changed: {p:?}");
        }
    }
}

#[tokio::test]
async fn consul_down_keeps_the_last_view_marked_stale_then_recovers() {
    let (mut h, _) = Harness::synced(web().await).await;
    h.idle(2).await;

    h.consul.go_down().await;
    h.until("stale", |h| h.registry.is_stale().then_some(()))
        .await;
    assert_eq!(
        h.endpoints(&key("web")).len(),
        2,
        "the last endpoints are kept"
    );
    assert!(h.registry.service(&key("web")).is_some());
    assert!(h.registry.has_synced());
    no_deletion(&h.pending());
    let errors = h.registry.stats().errors();
    assert!(errors >= 1);
    assert!(
        h.registry
            .stats()
            .last_error()
            .unwrap()
            .contains("cannot reach Consul")
    );

    // Changes made while it was unreachable arrive after it comes back.
    h.consul
        .register(Instance::new("web", "web-3", "10.0.0.3", 80).with_tags(&["http"]));
    h.consul.come_back().await.unwrap();
    h.until("fresh with the new instance", |h| {
        (!h.registry.is_stale() && h.endpoints(&key("web")).len() == 3).then_some(())
    })
    .await;
    h.idle(2).await;
    h.stop().await;
}

#[tokio::test]
async fn error_answers_mark_stale_and_recover() {
    let (mut h, _) = Harness::synced(web().await).await;
    h.idle(2).await;

    h.consul.fail_with(Some(500));
    h.until("stale", |h| h.registry.is_stale().then_some(()))
        .await;
    assert!(
        h.registry
            .stats()
            .last_error()
            .unwrap()
            .contains("HTTP 500")
    );
    assert_eq!(h.endpoints(&key("web")).len(), 2);
    no_deletion(&h.pending());

    h.consul.fail_with(None);
    h.until("fresh", |h| (!h.registry.is_stale()).then_some(()))
        .await;
    h.idle(2).await;
    // Still following changes.
    h.consul.deregister("web-1");
    h.until("web-1 gone", |h| {
        (h.endpoints(&key("web")).len() == 1).then_some(())
    })
    .await;
    h.stop().await;
}

#[tokio::test]
async fn the_token_is_sent_in_the_header() {
    let consul = web().await;
    consul.require_token(Some("s3cr3t"));
    let mut c = config(&consul);
    c.token = Some("s3cr3t".into());
    let mut h = Harness::start(consul, c).await;
    h.wait_synced().await;
    let requests = h.consul.requests();
    assert!(requests.len() >= 3);
    for r in &requests {
        assert_eq!(r.token_header.as_deref(), Some("s3cr3t"), "{r:?}");
        assert!(!r.query.contains_key("token"), "never in the URL");
    }
    h.stop().await;
}

#[tokio::test]
async fn a_refused_token_is_retried_until_accepted() {
    let consul = web().await;
    consul.require_token(Some("right"));
    let mut c = config(&consul);
    c.token = Some("wrong".into());
    c.datacenter = Some("dc1".into());
    let mut h = Harness::start(consul, c).await;
    h.until("a refusal, and the registry stale", |h| {
        h.registry
            .stats()
            .last_error()
            .filter(|e| e.contains("HTTP 403") && e.contains("ACL not found"))
            .filter(|_| h.registry.is_stale())
    })
    .await;
    assert!(!h.registry.has_synced());

    // The operator fixes the ACLs: the registry gets there by itself.
    h.consul.require_token(None);
    h.wait_synced().await;
    assert!(!h.registry.is_stale());
    assert_eq!(h.endpoints(&key("web")).len(), 2);
    h.stop().await;
}

#[tokio::test]
async fn without_a_datacenter_an_unreachable_consul_fails_the_start() {
    let consul = web().await;
    consul.go_down().await;
    let (sink, _rx) = UpdateSink::new(std::sync::Arc::new(EndpointIndex::new()));
    let err = ConsulRegistry::start(config(&consul), sink, std::future::pending())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Datacenter(_)), "{err}");
    assert!(err.to_string().contains("--consulDatacenter"));

    // With one it starts, waits, and syncs once Consul is there.
    let mut c = config(&consul);
    c.datacenter = Some("dc1".into());
    let mut h = Harness::start(consul, c).await;
    h.until("a failed query", |h| {
        (h.registry.stats().errors() > 0).then_some(())
    })
    .await;
    assert!(!h.registry.has_synced());
    h.consul.come_back().await.unwrap();
    h.wait_synced().await;
    assert_eq!(h.registry.services().len(), 1);
    h.stop().await;
}

#[tokio::test]
async fn an_explicit_datacenter_is_queried_and_named() {
    let consul = FakeConsul::start_in("east").await.unwrap();
    consul.register(Instance::new("web", "web-1", "10.0.0.1", 80));
    let c = ConsulConfig {
        datacenter: Some("east".into()),
        domain_suffix: "service.{dc}.consul".into(),
        namespace: "consul".into(),
        ..config(&consul)
    };
    let mut h = Harness::start(consul, c).await;
    h.wait_synced().await;
    assert_eq!(h.registry.cluster_id().as_str(), "east");
    assert!(h.consul.requests_to("/v1/agent/self").is_empty());
    assert!(
        h.consul
            .requests()
            .iter()
            .all(|r| r.query.get("dc").map(String::as_str) == Some("east"))
    );
    let web = ServiceKey::new("web.service.east.consul", "consul");
    assert_eq!(h.endpoints(&web).len(), 1);
    assert_eq!(
        h.registry.service(&web).unwrap().namespace.as_str(),
        "consul"
    );

    // Another datacenter the server does not know: Consul's 500, retried, stale.
    let consul = FakeConsul::start().await.unwrap();
    let c = ConsulConfig {
        datacenter: Some("west".into()),
        ..config(&consul)
    };
    let h2 = Harness::start(consul, c).await;
    h2.until("no path to datacenter", |h| {
        h.registry
            .stats()
            .last_error()
            .filter(|e| e.contains("No path to datacenter"))
    })
    .await;
    h2.stop().await;
    h.stop().await;
}

#[tokio::test]
async fn a_token_revoked_during_an_outage_is_an_auth_failure_and_the_view_stays() {
    const TOKEN: &str = "s3cr3t-token";
    let consul = web().await;
    consul.require_token(Some(TOKEN));
    let mut c = config(&consul);
    c.token = Some(TOKEN.into());
    let mut h = Harness::start(consul, c).await;
    h.wait_synced().await;
    h.idle(2).await;

    h.consul.go_down().await;
    h.until("stale", |h| h.registry.is_stale().then_some(()))
        .await;
    assert_eq!(
        h.registry.stats().auth_failures(),
        (0, 0),
        "an outage is not"
    );

    // Consul comes back, but the token was revoked meanwhile.
    h.consul.require_token(Some("another"));
    h.consul.come_back().await.unwrap();
    let error = h
        .until("a 403 counted", |h| {
            let (_, forbidden) = h.registry.stats().auth_failures();
            (forbidden >= 1).then(|| h.registry.stats().last_error().unwrap())
        })
        .await;
    assert!(
        error.contains("Consul refused the ACL token (HTTP 403) for /v1/"),
        "{error}"
    );
    assert!(error.contains("--consulToken"), "{error}");
    assert!(!error.contains(TOKEN), "never the token: {error}");
    assert_eq!(
        h.registry.stats().auth_failures().0,
        0,
        "no 401 was answered"
    );
    // The last known view is served all along.
    assert!(h.registry.is_stale());
    assert_eq!(h.endpoints(&key("web")).len(), 2);
    assert!(h.registry.service(&key("web")).is_some());
    no_deletion(&h.pending());

    // A new token is issued for the old secret: the registry recovers by itself.
    h.consul.require_token(Some(TOKEN));
    h.until("fresh", |h| (!h.registry.is_stale()).then_some(()))
        .await;
    assert_eq!(h.endpoints(&key("web")).len(), 2);
    h.stop().await;
}

#[tokio::test]
async fn a_401_is_counted_apart_from_a_403() {
    let consul = web().await;
    let h = Harness::synced(consul).await.0;
    h.idle(2).await;
    h.consul.fail_with(Some(401));
    h.until("a 401 counted", |h| {
        (h.registry.stats().auth_failures().0 >= 1).then_some(())
    })
    .await;
    assert_eq!(h.registry.stats().auth_failures().1, 0);
    assert!(
        h.registry
            .stats()
            .last_error()
            .unwrap()
            .contains("refused the ACL token (HTTP 401)")
    );
    assert_eq!(h.endpoints(&key("web")).len(), 2);
    h.consul.fail_with(None);
    h.until("fresh", |h| (!h.registry.is_stale()).then_some(()))
        .await;
    h.stop().await;
}

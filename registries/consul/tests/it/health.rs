//! Health checks decide endpoint health; flips are incremental pushes for one
//! hostname.

use meshfed_consul::fake::{CheckStatus, FakeConsul, Instance};
use meshfed_registry::{HealthStatus, PushRequest};

use crate::support::{Harness, config, key};

fn health(h: &Harness, name: &str) -> Vec<(String, HealthStatus)> {
    h.endpoints(&key(name))
        .iter()
        .map(|e| (e.address.to_string(), e.health))
        .collect()
}

fn only_web_endpoints(push: &PushRequest) {
    assert!(push.is_endpoints_only(), "{push:?}");
    assert!(
        push.updated_hostnames().all(|n| n == "web.service.consul"),
        "{push:?}"
    );
}

async fn two_services() -> FakeConsul {
    let consul = FakeConsul::start().await.unwrap();
    consul.register(Instance::new("web", "web-1", "10.0.0.1", 80).with_tags(&["http"]));
    consul.register(Instance::new("web", "web-2", "10.0.0.2", 80).with_tags(&["http"]));
    consul.register(Instance::new("api", "api-1", "10.0.1.1", 90));
    consul
}

#[tokio::test]
async fn passing_critical_passing_flips_endpoint_health() {
    let (mut h, _) = Harness::synced(two_services().await).await;
    use HealthStatus::*;
    assert_eq!(
        health(&h, "web"),
        vec![("10.0.0.1".into(), Healthy), ("10.0.0.2".into(), Healthy)]
    );
    h.idle(3).await;
    let catalog_queries = h.consul.requests_to("/v1/catalog/services").len();

    h.consul.set_health("web-2", CheckStatus::Critical);
    only_web_endpoints(&h.next_push().await);
    assert_eq!(health(&h, "web")[1], ("10.0.0.2".into(), Unhealthy));

    h.consul.set_health("web-2", CheckStatus::Passing);
    only_web_endpoints(&h.next_push().await);
    assert_eq!(health(&h, "web")[1], ("10.0.0.2".into(), Healthy));

    // Maintenance counts as critical; so does a failing node check.
    h.consul.set_health("web-1", CheckStatus::Maintenance);
    only_web_endpoints(&h.next_push().await);
    assert_eq!(health(&h, "web")[0].1, Unhealthy);
    h.consul.set_health("web-1", CheckStatus::Passing);
    only_web_endpoints(&h.next_push().await);
    h.consul
        .set_node_health("node-10.0.0.2", CheckStatus::Critical);
    only_web_endpoints(&h.next_push().await);
    assert_eq!(
        health(&h, "web"),
        vec![("10.0.0.1".into(), Healthy), ("10.0.0.2".into(), Unhealthy)]
    );

    // Health lives in the checks, not the catalog's service list: its loop never woke.
    h.idle(3).await;
    assert_eq!(
        h.consul.requests_to("/v1/catalog/services").len(),
        catalog_queries
    );
    assert!(h.pending().is_empty(), "one push per change");
    h.stop().await;
}

#[tokio::test]
async fn warning_is_healthy_by_default() {
    let consul = two_services().await;
    consul.set_health("web-1", CheckStatus::Warning);
    let (h, _) = Harness::synced(consul).await;
    assert_eq!(health(&h, "web")[0].1, HealthStatus::Healthy);
    h.stop().await;
}

#[tokio::test]
async fn warning_can_count_as_unhealthy() {
    let consul = two_services().await;
    consul.set_health("web-1", CheckStatus::Warning);
    let mut c = config(&consul);
    c.warning_health = HealthStatus::Unhealthy;
    let mut h = Harness::start(consul, c).await;
    h.wait_synced().await;
    assert_eq!(health(&h, "web")[0].1, HealthStatus::Unhealthy);
    assert_eq!(health(&h, "web")[1].1, HealthStatus::Healthy);
    h.stop().await;
}

//! Discovery over gRPC (subscriptions, pushes) and over the HTTP fallback.

use meshfed_nacos::fake::{FakeNacos, Instance};
use meshfed_nacos::{ActiveTransport, Transport};
use meshfed_registry::{HealthStatus, Locality, Protocol, ServiceRegistry};

use crate::support::*;

#[tokio::test]
async fn grpc_subscriptions_follow_pushes() {
    let nacos = FakeNacos::start().await.unwrap();
    nacos.register(Instance::new("web", "10.0.0.1", 8080).in_cluster("HZ"));
    nacos.register(Instance::new("web", "10.0.0.2", 8080).with_meta("version", "v2"));
    nacos.register(Instance::new("api", "10.0.1.1", 9090).with_meta("protocol", "grpc"));
    nacos.register(Instance::new("other", "10.0.2.1", 80).in_group("public", "OTHER"));
    let mut config = config(&nacos);
    config
        .localities
        .insert("HZ".into(), Locality::parse("cn-hangzhou/cn-hangzhou-a"));
    let mut nacos_registry = Running::start(config);
    nacos_registry.synced().await;
    let registry = nacos_registry.registry.clone();

    assert_eq!(registry.stats().transport(), ActiveTransport::Grpc);
    let mut hosts: Vec<String> = registry
        .services()
        .iter()
        .map(|s| s.hostname.to_string())
        .collect();
    hosts.sort();
    assert_eq!(
        hosts,
        [
            "api.default-group.public.nacos",
            "web.default-group.public.nacos"
        ],
        "only DEFAULT_GROUP is read"
    );
    let api = registry.service(&nacos_registry.key("api")).unwrap();
    assert_eq!(api.ports[0].protocol, Protocol::Grpc);
    assert_eq!(registry.shard_key().to_string(), "Nacos/nacos");
    let web = registry.endpoints(&nacos_registry.key("web"));
    assert_eq!(web.len(), 2);
    assert_eq!(web[0].locality.zone, "cn-hangzhou-a");
    assert_eq!(web[1].labels["version"], "v2");
    assert_eq!(nacos.requests_of("SubscribeServiceRequest").len(), 2);
    assert_eq!(nacos.requests_of("ConnectionSetupRequest").len(), 1);

    // A change is pushed (no listing needed) and acknowledged.
    nacos.register(Instance::new("web", "10.0.0.3", 8080).healthy(false));
    eventually("the pushed instance", || async {
        (nacos_registry.addresses("web").len() == 3).then_some(())
    })
    .await;
    let sick = registry
        .endpoints(&nacos_registry.key("web"))
        .into_iter()
        .find(|e| e.address.to_string() == "10.0.0.3")
        .unwrap();
    assert_eq!(sick.health, HealthStatus::Unhealthy);
    eventually("the pushes to be acknowledged", || async {
        let (sent, acked) = nacos.pushes();
        (sent > 0 && sent == acked).then_some(())
    })
    .await;
    assert!(registry.stats().pushes() >= 1);
    // A new service is found at the next listing and subscribed.
    nacos.register(Instance::new("db", "10.0.3.1", 5432).with_meta("protocol", "tcp"));
    eventually("the new service", || async {
        registry.service(&nacos_registry.key("db")).map(|_| ())
    })
    .await;
    // The connection is kept alive with HealthCheckRequest (every 500ms here).
    eventually("a keepalive", || async {
        (!nacos.requests_of("HealthCheckRequest").is_empty()).then_some(())
    })
    .await;
    nacos_registry.stop().await;
}

#[tokio::test]
async fn a_nacos_without_grpc_is_polled_over_http() {
    let nacos = FakeNacos::start_http_only().await.unwrap();
    nacos.register(Instance::new("web", "10.0.0.1", 8080));
    let mut nacos_registry = Running::start(config(&nacos));
    nacos_registry.synced().await;
    assert_eq!(
        nacos_registry.registry.stats().transport(),
        ActiveTransport::Http
    );
    assert_eq!(nacos_registry.addresses("web"), ["10.0.0.1"]);
    nacos.register(Instance::new("web", "10.0.0.2", 8080));
    eventually("the polled change", || async {
        (nacos_registry.addresses("web").len() == 2).then_some(())
    })
    .await;
    let list = nacos.requests_of("/v1/ns/service/list");
    assert!(
        list[0].headers["?query"].contains("namespaceId=public"),
        "{list:?}"
    );
    nacos_registry.stop().await;
}

#[tokio::test]
async fn http_only_is_honoured_against_a_grpc_server() {
    let nacos = FakeNacos::start().await.unwrap();
    nacos.register(Instance::new("web", "10.0.0.1", 8080));
    let mut config = config(&nacos);
    config.transport = Transport::Http;
    let mut nacos_registry = Running::start(config);
    nacos_registry.synced().await;
    assert_eq!(nacos_registry.addresses("web"), ["10.0.0.1"]);
    assert!(nacos.requests_of("ServerCheckRequest").is_empty());
    nacos_registry.stop().await;
}

#[tokio::test]
async fn metrics_report_the_registrys_counters_under_their_names() {
    let nacos = FakeNacos::start().await.unwrap();
    nacos.register(Instance::new("web", "10.0.0.1", 8080).with_meta("bad key", "x"));
    nacos.register(Instance::new("bad.name", "10.0.0.2", 8080));
    let mut off = Instance::new("web", "10.0.0.3", 8080);
    off.enabled = false;
    nacos.register(off);
    let mut nacos_registry = Running::start(config(&nacos));
    nacos_registry.synced().await;
    let mut registry = prometheus_client::registry::Registry::default();
    nacos_registry.registry.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        "meshfed_nacos_skipped{kind=\"service\"} 1",
        "meshfed_nacos_skipped{kind=\"label\"} ",
        "meshfed_nacos_excluded_instances{registry=\"nacos\"} 1",
        "meshfed_nacos_services{registry=\"nacos\"} 1",
        "meshfed_nacos_transport{transport=\"grpc\"} 1",
        "meshfed_nacos_transport{transport=\"http\"} 0",
        "meshfed_nacos_auth_failures{transport=\"grpc\"} 0",
        "meshfed_nacos_requests{result=\"error\"} 0",
    ] {
        assert!(text.contains(line), "{line:?} missing in\n{text}");
    }
    nacos_registry.stop().await;
}

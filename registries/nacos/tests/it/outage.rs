//! Outages keep the last known view (stale), recovery resyncs; an emptied catalog is
//! applied and warned about.

use meshfed_nacos::fake::{FakeNacos, Instance};
use meshfed_registry::ServiceRegistry;

use crate::support::*;

#[tokio::test]
async fn an_outage_keeps_the_last_known_view_until_nacos_answers_again() {
    let nacos = FakeNacos::start().await.unwrap();
    nacos.register(Instance::new("web", "10.0.0.1", 8080));
    nacos.register(Instance::new("web", "10.0.0.2", 8080));
    let mut nacos_registry = Running::start(config(&nacos));
    nacos_registry.synced().await;
    let registry = nacos_registry.registry.clone();
    assert!(!registry.is_stale());

    nacos.go_down().await;
    eventually("the registry to turn stale", || async {
        registry.is_stale().then_some(())
    })
    .await;
    assert_eq!(nacos_registry.addresses("web"), ["10.0.0.1", "10.0.0.2"]);
    assert!(registry.stats().errors() >= 1);
    assert!(registry.stats().last_error().is_some());

    // A change made while it was away arrives once it is back.
    nacos.deregister("web", "10.0.0.1", 8080);
    nacos.come_back().await.unwrap();
    eventually("the change made during the outage", || async {
        (nacos_registry.addresses("web") == ["10.0.0.2"]).then_some(())
    })
    .await;
    eventually("the registry to be fresh", || async {
        (!registry.is_stale()).then_some(())
    })
    .await;
    nacos_registry.stop().await;
}

#[tokio::test(flavor = "current_thread")]
async fn an_emptied_catalog_withdraws_the_services_with_a_warning() {
    let (logs, _guard) = Logs::capture();
    let nacos = FakeNacos::start().await.unwrap();
    nacos.register(Instance::new("web", "10.0.0.1", 8080));
    nacos.register(Instance::new("api", "10.0.1.1", 8080));
    let mut nacos_registry = Running::start(config(&nacos));
    nacos_registry.synced().await;
    let registry = nacos_registry.registry.clone();
    assert_eq!(registry.services().len(), 2);
    nacos.clear();
    eventually("the services to be withdrawn", || async {
        registry.services().is_empty().then_some(())
    })
    .await;
    assert!(
        logs.text()
            .contains("lists no services any more; withdrawing all 2"),
        "{}",
        logs.text()
    );
    nacos_registry.stop().await;
}

#[tokio::test]
async fn server_requests_are_answered_and_a_reset_reconnects() {
    let nacos = FakeNacos::start().await.unwrap();
    nacos.register(Instance::new("web", "10.0.0.1", 8080));
    let mut nacos_registry = Running::start(config(&nacos));
    nacos_registry.synced().await;

    nacos.send_server_request("ClientDetectionRequest");
    eventually("the detection answer", || async {
        (!nacos.requests_of("ClientDetectionResponse").is_empty()).then_some(())
    })
    .await;

    // Nacos rebalancing clients: answered, then a new connection set up and every
    // service subscribed again, with changes still followed.
    nacos.send_server_request("ConnectResetRequest");
    eventually("a new connection", || async {
        (nacos.requests_of("ConnectionSetupRequest").len() == 2 && nacos.connections() == 1)
            .then_some(())
    })
    .await;
    assert_eq!(nacos.requests_of("ConnectResetResponse").len(), 1);
    let registry = nacos_registry.registry.clone();
    assert_eq!(registry.stats().errors(), 0, "a reset is not a failure");
    nacos.register(Instance::new("web", "10.0.0.2", 8080));
    eventually("the change after the reconnection", || async {
        (nacos_registry.addresses("web").len() == 2).then_some(())
    })
    .await;
    assert!(nacos.requests_of("SubscribeServiceRequest").len() >= 2);
    nacos_registry.stop().await;
}

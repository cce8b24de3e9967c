//! Full fetch, deltas, the reconcile hash code and Eureka's JSON quirks.

use std::time::Instant;

use meshfed_eureka::FullReason;
use meshfed_eureka::fake::{FakeEureka, Instance, Status};
use meshfed_registry::{HealthStatus, Protocol, ServiceRegistry};

use crate::support::{Harness, key};

async fn catalog() -> FakeEureka {
    let eureka = FakeEureka::start().await.unwrap();
    eureka.register(
        Instance::new("WEB", "web-1", "10.0.0.1", 8080)
            .with_secure_port(8443)
            .with_metadata("version", "v1")
            .with_metadata("zone", "zone-a"),
    );
    eureka.register(Instance::new("WEB", "web-2", "10.0.0.2", 8080).with_metadata("version", "v2"));
    eureka.register(Instance::new("api-gateway", "api-1", "10.0.1.1", 9090));
    eureka
}

#[tokio::test]
async fn a_full_fetch_gives_services_ports_labels_and_health() {
    let (h, pushes) = Harness::synced(catalog().await).await;
    assert!(
        pushes.iter().any(|p| p.full),
        "the services are announced: {pushes:?}"
    );
    let web = h.registry.service(&key("web")).expect("WEB is web.eureka");
    let ports: Vec<_> = web
        .ports
        .iter()
        .map(|p| (&*p.name, p.port.get(), p.protocol))
        .collect();
    assert_eq!(
        ports,
        [
            ("http", 8080, Protocol::Http),
            ("https", 8443, Protocol::Https)
        ]
    );
    assert_eq!(web.provider.as_str(), "Eureka");
    assert!(h.registry.service(&key("api-gateway")).is_some());
    assert_eq!(h.addresses(&key("web")), ["10.0.0.1", "10.0.0.2"]);
    let web1 = &h.endpoints(&key("web"))[0];
    assert_eq!(web1.labels.get("version").map(String::as_str), Some("v1"));
    assert_eq!(web1.locality.zone, "zone-a");
    assert_eq!(web1.ports.get("https"), Some(&8443));
    assert_eq!(web1.health, HealthStatus::Healthy);
    assert_eq!(h.registry.shard_key().to_string(), "Eureka/eureka");

    // One full fetch of /eureka/apps, asking for JSON.
    let requests = h.eureka.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].path, "/eureka/apps");
    assert_eq!(requests[0].accept.as_deref(), Some("application/json"));
    assert_eq!(h.registry.stats().full_fetches(FullReason::Initial), 1);
    assert_eq!(h.registry.stats().catalog(), (2, 3));
    h.stop().await;
}

#[tokio::test]
async fn deltas_add_modify_and_delete_instances() {
    let (mut h, _) = Harness::synced(catalog().await).await;
    h.eureka
        .register(Instance::new("WEB", "web-3", "10.0.0.3", 8080));
    h.eureka.set_status("WEB", "web-2", Status::Down);
    h.eureka.deregister("API-GATEWAY", "api-1");
    h.round().await;

    assert_eq!(h.eureka.requests_to("/eureka/apps/delta").len(), 1);
    assert_eq!(h.registry.stats().deltas(), 1);
    assert_eq!(h.registry.stats().hash_mismatches(), 0);
    assert_eq!(
        h.registry.stats().full_fetches(FullReason::Initial),
        1,
        "no second full fetch"
    );
    assert_eq!(
        h.addresses(&key("web")),
        ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    );
    let web2 = h
        .endpoints(&key("web"))
        .into_iter()
        .find(|e| e.address.to_string() == "10.0.0.2")
        .unwrap();
    assert_eq!(web2.health, HealthStatus::Unhealthy, "DOWN is not ready");
    assert!(
        h.registry.service(&key("api-gateway")).is_none(),
        "its last instance left"
    );
    let pushes = h.pushes();
    assert!(
        pushes.iter().any(|p| p.full),
        "a removed service is a full push: {pushes:?}"
    );

    // The same delta window again changes nothing and pushes nothing.
    h.round().await;
    assert_eq!(h.registry.stats().deltas(), 2);
    assert!(h.pushes().is_empty());
    h.stop().await;
}

#[tokio::test]
async fn a_hash_code_mismatch_fetches_everything_again() {
    let (mut h, _) = Harness::synced(catalog().await).await;
    // A change the client never sees in a delta: the window passed.
    h.eureka
        .register(Instance::new("WEB", "web-3", "10.0.0.3", 8080));
    h.eureka.expire_delta();
    h.round().await;
    assert_eq!(h.registry.stats().hash_mismatches(), 1);
    assert_eq!(
        h.registry.stats().deltas(),
        0,
        "the delta was not applied alone"
    );
    assert_eq!(h.eureka.requests_to("/eureka/apps").len(), 2);
    assert_eq!(
        h.addresses(&key("web")),
        ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    );
    assert!(!h.pushes().is_empty());

    // In step again: deltas from then on.
    h.eureka.set_status("WEB", "web-3", Status::OutOfService);
    h.round().await;
    assert_eq!(h.registry.stats().hash_mismatches(), 1);
    assert_eq!(h.registry.stats().deltas(), 1);
    assert_eq!(h.eureka.hash_code(), "OUT_OF_SERVICE_1_UP_3_");
    h.stop().await;
}

#[tokio::test]
async fn a_refused_delta_falls_back_to_full_fetches() {
    let (h, _) = Harness::synced(catalog().await).await;
    h.eureka.disable_delta(true);
    h.eureka
        .register(Instance::new("WEB", "web-3", "10.0.0.3", 8080));
    h.round().await;
    assert_eq!(h.registry.stats().full_fetches(FullReason::DeltaRefused), 1);
    assert_eq!(
        h.registry.stats().auth_failures(),
        (0, 0),
        "Eureka's own 403 on the delta"
    );
    assert!(!h.registry.is_stale());
    assert_eq!(h.addresses(&key("web")).len(), 3);
    h.stop().await;
}

#[tokio::test]
async fn xstream_json_single_objects_and_string_ports_are_read() {
    let eureka = FakeEureka::start().await.unwrap();
    eureka.set_xstream_json(true);
    eureka.register(
        Instance::new("WEB", "web-1", "10.0.0.1", 8080)
            .in_aws_zone("us-east-1a")
            .with_metadata("bad key", "x"),
    );
    let (mut h, _) = Harness::synced(eureka).await;
    let eps = h.endpoints(&key("web"));
    assert_eq!(eps.len(), 1);
    assert_eq!(eps[0].ports.get("http"), Some(&8080));
    assert_eq!(
        (
            eps[0].locality.region.as_str(),
            eps[0].locality.zone.as_str()
        ),
        ("us-east-1", "us-east-1a")
    );
    assert_eq!(
        h.registry.stats().invalid_labels(),
        1,
        "reported, not silently dropped"
    );
    // Deltas in that shape too.
    h.eureka.set_status("WEB", "web-1", Status::Starting);
    h.round().await;
    assert_eq!(h.registry.stats().deltas(), 1);
    assert_eq!(h.endpoints(&key("web"))[0].health, HealthStatus::Unhealthy);
    assert!(!h.pushes().is_empty());
    h.stop().await;
}

#[tokio::test]
async fn bad_names_and_instances_are_skipped_and_counted() {
    let eureka = FakeEureka::start().await.unwrap();
    eureka.register(Instance::new("WEB", "web-1", "10.0.0.1", 8080));
    eureka.register(Instance::new("WEB", "web-2", "web-2.local", 8080));
    eureka.register(Instance::new("BAD.NAME", "x-1", "10.0.3.1", 80));
    let (h, _) = Harness::synced(eureka).await;
    assert_eq!(h.addresses(&key("web")), ["10.0.0.1"]);
    assert_eq!(h.registry.services().len(), 1);
    assert_eq!(h.registry.stats().skipped_apps(), 1);
    assert_eq!(h.registry.stats().skipped_instances(), 1);
    h.stop().await;
}

#[tokio::test]
async fn a_large_catalog_syncs_in_one_fetch() {
    const APPS: usize = 1_000;
    const PER_APP: usize = 10;
    let eureka = FakeEureka::start().await.unwrap();
    eureka.register_all((0..APPS).flat_map(|a| {
        (0..PER_APP).map(move |i| {
            let n = a * PER_APP + i;
            Instance::new(
                &format!("app-{a}"),
                &format!("app-{a}-{i}"),
                &format!("10.{}.{}.{}", n / 65536, (n / 256) % 256, n % 256),
                8080,
            )
            .with_metadata("version", "v1")
        })
    }));
    let started = Instant::now();
    let (mut h, pushes) = Harness::synced(eureka).await;
    let took = started.elapsed();
    assert_eq!(h.registry.services().len(), APPS);
    assert_eq!(
        h.registry.stats().catalog(),
        (APPS as u64, (APPS * PER_APP) as u64)
    );
    assert_eq!(h.endpoints(&key("app-999")).len(), PER_APP);
    assert!(!pushes.is_empty());
    eprintln!("10,000 instances: first sync in {took:?}");

    // A delta over the large copy touches one application.
    h.eureka.set_status("APP-7", "app-7-3", Status::Down);
    h.round().await;
    assert_eq!(h.registry.stats().deltas(), 1);
    assert_eq!(h.registry.stats().hash_mismatches(), 0);
    let pushes = h.pushes();
    assert_eq!(pushes.len(), 1, "{pushes:?}");
    assert!(!pushes[0].full, "an instance change is an EDS push");
    h.stop().await;
}

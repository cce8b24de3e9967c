//! The catalog becomes mesh services; services come and go; only what changed is
//! pushed; malformed entries are skipped alone.

use meshfed_consul::fake::{FakeConsul, Instance};
use meshfed_registry::{
    ConfigKind, HealthStatus, Protocol, ProviderId, PushRequest, ServiceRegistry, TlsMode,
};
use serde_json::json;

use crate::support::{Harness, key};

fn hostnames(push: &PushRequest) -> Vec<&str> {
    let mut names: Vec<&str> = push.configs_updated.iter().map(|k| &*k.name).collect();
    names.sort();
    names.dedup();
    names
}

async fn with_web() -> FakeConsul {
    let consul = FakeConsul::start().await.expect("fake Consul");
    consul.register(
        Instance::new("web", "web-1", "10.0.0.1", 8080)
            .with_meta("protocol", "http")
            .with_tags(&["primary", "version|v1", "security.istio.io/tlsMode|istio"]),
    );
    consul.register(
        Instance::new("web", "web-2", "10.0.0.2", 8080)
            .with_meta("protocol", "http")
            .with_tags(&["version|v2"]),
    );
    consul
}

#[tokio::test]
async fn catalog_services_become_mesh_services() {
    let consul = with_web().await;
    consul.register(
        Instance::new("api", "api-1", "10.0.1.1", 9090)
            .on_node("vm-1", "10.0.1.1")
            .with_address("10.9.0.1")
            .with_tags(&["grpc"]),
    );
    consul.register(Instance::new("db", "db-1", "10.0.2.1", 5432).in_datacenter("dc2"));
    let (h, pushes) = Harness::synced(consul).await;

    // The cluster id is the agent's datacenter.
    assert_eq!(h.registry.cluster_id().as_str(), "dc1");
    assert_eq!(h.registry.provider(), ProviderId::Consul);
    assert_eq!(h.consul.requests_to("/v1/agent/self").len(), 1);
    assert!(!h.registry.is_stale());

    // The sync announced the three services at once.
    let announced: Vec<&str> = pushes.iter().flat_map(hostnames).collect();
    for name in ["api", "db", "web"] {
        assert!(
            announced.contains(&key(name).hostname.as_str()),
            "{announced:?}"
        );
    }

    let web = h.registry.service(&key("web")).expect("web published");
    assert_eq!(web.provider, ProviderId::Consul);
    assert_eq!(web.cluster_id.as_str(), "dc1");
    assert_eq!(web.creation_time, std::time::SystemTime::UNIX_EPOCH);
    let ports: Vec<_> = web
        .ports
        .iter()
        .map(|p| (&*p.name, p.port.get(), p.protocol))
        .collect();
    assert_eq!(ports, vec![("http", 8080, Protocol::Http)]);
    let eps = h.endpoints(&key("web"));
    assert_eq!(eps.len(), 2);
    let web1 = &eps[0];
    assert_eq!(web1.address.to_string(), "10.0.0.1", "the node address");
    assert_eq!(web1.ports.get("http"), Some(&8080));
    assert_eq!(web1.labels.get("version").map(String::as_str), Some("v1"));
    assert!(!web1.labels.contains_key("primary"));
    assert_eq!(web1.tls_mode, TlsMode::Istio);
    assert_eq!(web1.locality.region, "dc1");
    assert_eq!(web1.cluster_id.as_str(), "dc1");
    assert_eq!(web1.health, HealthStatus::Healthy);
    assert_eq!(eps[1].tls_mode, TlsMode::Disabled);

    let api = h.registry.service(&key("api")).unwrap();
    assert_eq!(
        api.ports[0].protocol,
        Protocol::Grpc,
        "protocol from the tag"
    );
    assert_eq!(
        h.endpoints(&key("api"))[0].address.to_string(),
        "10.9.0.1",
        "the service address wins"
    );
    let db = h.registry.service(&key("db")).unwrap();
    assert_eq!(
        (&*db.ports[0].name, db.ports[0].protocol),
        ("tcp", Protocol::Tcp)
    );
    assert_eq!(
        h.endpoints(&key("db"))[0].locality.region,
        "dc2",
        "the node's datacenter"
    );
    h.stop().await;
}

#[tokio::test]
async fn services_added_and_removed_and_only_changes_pushed() {
    let (mut h, _) = Harness::synced(with_web().await).await;
    h.idle(2).await;

    // A new service: full pushes naming only it.
    h.consul
        .register(Instance::new("api", "api-1", "10.0.1.1", 9090).with_meta("protocol", "grpc"));
    let push = h.next_push().await;
    assert!(push.full);
    assert_eq!(hostnames(&push), vec!["api.service.consul"]);
    h.until("api published", |h| h.registry.service(&key("api")))
        .await;
    h.idle(3).await;
    for event in h.pending() {
        let meshfed_registry::RegistryEvent::Push(p) = event else {
            panic!()
        };
        assert_eq!(hostnames(&p), vec!["api.service.consul"]);
    }

    // A new instance of an existing service on a known port: EDS for web only.
    h.consul
        .register(Instance::new("web", "web-3", "10.0.0.3", 8080).with_meta("protocol", "http"));
    let push = h.next_push().await;
    assert!(push.is_endpoints_only(), "{push:?}");
    assert_eq!(hostnames(&push), vec!["web.service.consul"]);
    assert!(
        push.configs_updated
            .iter()
            .all(|k| k.kind == ConfigKind::Endpoints)
    );
    assert_eq!(h.endpoints(&key("web")).len(), 3);

    // An instance on a new port changes the service: full push for web.
    h.consul
        .register(Instance::new("web", "web-4", "10.0.0.4", 8443).with_meta("protocol", "https"));
    let push = h.next_push().await;
    assert!(push.full);
    assert_eq!(hostnames(&push), vec!["web.service.consul"]);
    assert_eq!(h.registry.service(&key("web")).unwrap().ports.len(), 2);

    // The catalog drops api: deleted with its endpoints.
    h.idle(3).await;
    h.pending();
    assert_eq!(h.consul.remove_service("api"), 1);
    // (The api health loop may report the empty instance list first: EDS only.)
    loop {
        let push = h.next_push().await;
        assert_eq!(hostnames(&push), vec!["api.service.consul"]);
        if push.full {
            break;
        }
    }
    assert!(h.registry.service(&key("api")).is_none());
    assert!(!h.index.contains(&key("api")));
    h.idle(2).await;
    assert_eq!(h.registry.stats().watched_services(), 1);

    // Its last instance leaving removes a service from the catalog too.
    for id in ["web-1", "web-2", "web-3", "web-4"] {
        h.consul.deregister(id);
    }
    h.until("web removed", |h| {
        h.registry.service(&key("web")).is_none().then_some(())
    })
    .await;
    assert!(h.registry.services().is_empty());
    h.stop().await;
}

#[tokio::test]
async fn malformed_entries_and_names_are_skipped_alone() {
    let consul = with_web().await;
    consul.add_raw_entry(
        "web",
        json!({"Node": {"Node": "n9", "Address": "10.0.0.9"},
               "Service": {"ID": "web-bad", "Service": "web", "Port": "eighty"}}),
    );
    consul.register(Instance::new("web", "web-host", "web.example.com", 8080));
    consul.register(Instance::new("bad.name", "x-1", "10.0.3.1", 80));
    consul.add_raw_entry("junk", json!("not an object"));
    let (h, _) = Harness::synced(consul).await;

    assert_eq!(
        h.endpoints(&key("web")).len(),
        2,
        "the good instances are kept"
    );
    let stats = h.registry.stats();
    assert!(stats.skipped_entries() >= 3, "{}", stats.skipped_entries());
    assert_eq!(
        stats.skipped_services(),
        1,
        "bad.name cannot be a hostname label"
    );
    let names: Vec<String> = h
        .registry
        .services()
        .iter()
        .map(|s| s.hostname.to_string())
        .collect();
    assert_eq!(
        names,
        vec!["web.service.consul"],
        "junk has no usable instance"
    );

    // The registry keeps working.
    h.consul
        .register(Instance::new("web", "web-3", "10.0.0.3", 8080).with_meta("protocol", "http"));
    h.until("the new instance", |h| {
        (h.endpoints(&key("web")).len() == 3).then_some(())
    })
    .await;
    h.stop().await;
}

use std::time::Duration;

use meshfed_registry::{EndpointIndex, RegistryEvent, TriggerReason};

use super::*;
use crate::config::{GatewayServiceRef, MeshGateways};
use crate::fake_api::FakeApiServer;
use crate::fake_api::objects;

fn gateway_service(
    name: &str,
    labels: &[(&str, &str)],
    port: i32,
    ip: &str,
) -> k8s_openapi::api::core::v1::Service {
    let mut svc = objects::load_balancer("istio-system", name, "10.96.0.99", &[("tls", port)], ip);
    for (k, v) in labels {
        svc.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(k.to_string(), v.to_string());
    }
    svc
}

async fn until(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn gateways_come_from_labelled_services_and_mesh_networks() {
    let api = FakeApiServer::start().await.unwrap();
    api.apply(&gateway_service(
        "eastwest",
        &[("topology.istio.io/network", "n2")],
        15443,
        "192.0.2.10",
    ));
    api.apply(&gateway_service(
        "custom-port",
        &[
            ("topology.istio.io/network", "n2"),
            ("networking.istio.io/gatewayPort", "16443"),
        ],
        16443,
        "192.0.2.11",
    ));
    // Labelled but not listening on its mTLS port: ignored.
    api.apply(&gateway_service(
        "wrong-port",
        &[("topology.istio.io/network", "n2")],
        8443,
        "192.0.2.12",
    ));
    api.apply(&gateway_service("by-name", &[], 15443, "192.0.2.13"));
    let config = KubeRegistryConfig {
        mesh_gateways: MeshGateways::fixed(vec![GatewayServiceRef {
            network: "n3".into(),
            hostname: "by-name.istio-system.svc.cluster.local".into(),
            port: 15443,
        }]),
        ..KubeRegistryConfig::new("c2")
    };
    let (sink, mut events) = UpdateSink::new(Arc::new(EndpointIndex::new()));
    let (registry, task) = KubeRegistry::start(api.client(), config, sink, std::future::pending())
        .await
        .unwrap();
    registry.wait_for(SyncPhase::Synced).await;
    let gateways: Vec<(String, String, u16, String)> = registry
        .network_gateways()
        .into_iter()
        .map(|g| {
            (
                g.network.to_string(),
                g.address.to_string(),
                g.port,
                g.source,
            )
        })
        .collect();
    assert_eq!(
        gateways,
        vec![
            (
                "n2".into(),
                "192.0.2.10".into(),
                15443,
                "label topology.istio.io/network on service istio-system/eastwest@c2".into()
            ),
            (
                "n2".into(),
                "192.0.2.11".into(),
                16443,
                "label topology.istio.io/network on service istio-system/custom-port@c2".into()
            ),
            (
                "n3".into(),
                "192.0.2.13".into(),
                15443,
                "registryServiceName by-name.istio-system.svc.cluster.local@c2".into()
            ),
        ]
    );
    let mut forced = 0;
    while let Ok(event) = events.try_recv() {
        if let RegistryEvent::Push(r) = event
            && r.forced
            && r.reasons.contains_key(&TriggerReason::Networks)
        {
            forced += 1;
        }
    }
    assert_eq!(forced, 1, "the gateways found at sync force one push");

    // The gateway's address changes: another forced push.
    api.apply(&gateway_service(
        "eastwest",
        &[("topology.istio.io/network", "n2")],
        15443,
        "192.0.2.20",
    ));
    until("the new address", || {
        registry
            .network_gateways()
            .iter()
            .any(|g| g.address.to_string() == "192.0.2.20")
    })
    .await;
    let event = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(RegistryEvent::Push(r)) = events.recv().await
                && r.forced
            {
                return r;
            }
        }
    })
    .await
    .unwrap();
    assert!(event.reasons.contains_key(&TriggerReason::Networks));
    task.abort();
}

/// Istio (`getGatewayDetails`, reference §6.3): a labelled service that lists ports is
/// a gateway only if one is its mTLS port; one that lists none is a gateway on the
/// mTLS port; a `gatewayPort` label that is not a number leaves the default 15443.
#[tokio::test]
async fn labelled_gateways_list_their_mtls_port_or_none() {
    let api = FakeApiServer::start().await.unwrap();
    let mut no_ports = gateway_service(
        "no-ports",
        &[("topology.istio.io/network", "n2")],
        15443,
        "192.0.2.30",
    );
    no_ports.spec.as_mut().unwrap().ports = None;
    api.apply(&no_ports);
    api.apply(&gateway_service(
        "other-port",
        &[("topology.istio.io/network", "n2")],
        8443,
        "192.0.2.32",
    ));
    api.apply(&gateway_service(
        "bad-port-label",
        &[
            ("topology.istio.io/network", "n2"),
            ("networking.istio.io/gatewayPort", "not-a-port"),
        ],
        15443,
        "192.0.2.31",
    ));
    let (sink, _events) = UpdateSink::new(Arc::new(EndpointIndex::new()));
    let (registry, task) = KubeRegistry::start(
        api.client(),
        KubeRegistryConfig::new("c2"),
        sink,
        std::future::pending(),
    )
    .await
    .unwrap();
    registry.wait_for(SyncPhase::Synced).await;
    let mut gateways: Vec<(String, u16)> = registry
        .network_gateways()
        .into_iter()
        .map(|g| (g.address.to_string(), g.port))
        .collect();
    gateways.sort();
    assert_eq!(
        gateways,
        vec![
            ("192.0.2.30".to_string(), 15443),
            ("192.0.2.31".to_string(), 15443),
        ],
        "the service listing no port is a gateway on 15443, the bad label defaults to \
         15443, a service listing only another port is none"
    );
    task.abort();
}

#[tokio::test]
async fn a_paused_registry_lists_but_tells_nothing_until_resumed() {
    let api = FakeApiServer::start().await.unwrap();
    api.apply(&objects::service(
        "default",
        "a",
        "10.96.0.1",
        &[("http", 80)],
    ));
    let index = Arc::new(EndpointIndex::new());
    let (sink, mut events) = UpdateSink::new(index.clone());
    let (registry, task) = KubeRegistry::start_paused(
        api.client(),
        KubeRegistryConfig::new("c1"),
        sink,
        std::future::pending(),
    )
    .await
    .unwrap();
    registry.wait_for(SyncPhase::Listed).await;
    // A change while paused is applied but not told.
    api.apply(&objects::service(
        "default",
        "b",
        "10.96.0.2",
        &[("http", 80)],
    ));
    until("b applied", || {
        registry.stats().objects(ResourceKind::Service) == 2
    })
    .await;
    assert!(!registry.has_synced());
    assert!(registry.services().is_empty());
    assert!(events.try_recv().is_err(), "nothing reached the sink");
    registry.resume();
    registry.wait_for(SyncPhase::Synced).await;
    assert_eq!(registry.services().len(), 2);
    assert!(registry.has_synced());
    assert!(events.try_recv().is_ok());
    task.abort();
}

impl KubeRegistry {
    /// The look-up the serving side makes: the workloads frozen now, asked once.
    fn workload(&self, query: &WorkloadQuery<'_>) -> Option<WorkloadInstance> {
        self.workloads()?.find(query)
    }
}

fn query<'a>(ips: &'a [IpAddr], id: &'a str, cluster: Option<&'a ClusterId>) -> WorkloadQuery<'a> {
    WorkloadQuery {
        ips,
        id,
        namespace: "default",
        cluster,
    }
}

#[tokio::test]
async fn a_pod_ip_reused_across_clusters_is_the_named_cluster_s_pod() {
    let ip: IpAddr = "10.1.0.5".parse().unwrap();
    let index = Arc::new(EndpointIndex::new());
    let (sink, _events) = UpdateSink::new(index);
    let aggregate = meshfed_registry::Aggregate::new("c1");
    let mut apis = Vec::new();
    let mut tasks = Vec::new();
    for (cluster, app) in [("c1", "reviews"), ("c2", "ratings")] {
        let api = FakeApiServer::start().await.unwrap();
        api.apply(&objects::service(
            "default",
            app,
            "10.96.0.1",
            &[("http", 9080)],
        ));
        api.apply(&objects::pod(
            "default",
            &format!("{app}-1"),
            app,
            "10.1.0.5",
            "n1",
        ));
        let (registry, task) = KubeRegistry::start(
            api.client(),
            KubeRegistryConfig::new(cluster),
            sink.clone(),
            std::future::pending(),
        )
        .await
        .unwrap();
        registry.wait_for(SyncPhase::Synced).await;
        aggregate.add_registry(registry);
        apis.push(api);
        tasks.push(task);
    }
    let sources = aggregate.workload_sources();
    let find = |cluster: Option<&str>| {
        let cluster = cluster.map(ClusterId::new);
        sources
            .find(&query(&[ip], "x.default", cluster.as_ref()))
            .map(|w| {
                (
                    w.cluster_id.to_string(),
                    w.name,
                    w.targets[0].service.hostname.to_string(),
                )
            })
    };
    assert_eq!(
        find(Some("c2")),
        Some((
            "c2".into(),
            "ratings-1".into(),
            "ratings.default.svc.cluster.local".into()
        ))
    );
    assert_eq!(find(Some("c1")).unwrap().1, "reviews-1");
    assert_eq!(
        find(None).unwrap().1,
        "reviews-1",
        "no CLUSTER_ID: the primary first"
    );
    assert_eq!(find(Some("c3")), None);
    for task in tasks {
        task.abort();
    }
}

#[tokio::test]
async fn a_change_to_a_pod_a_proxy_runs_as_is_pushed() {
    let api = FakeApiServer::start().await.unwrap();
    api.apply(&objects::pod("default", "watched", "a", "10.1.0.5", "n1"));
    api.apply(&objects::pod("default", "unwatched", "a", "10.1.0.6", "n1"));
    let (sink, mut events) = UpdateSink::new(Arc::new(EndpointIndex::new()));
    let (registry, task) = KubeRegistry::start(
        api.client(),
        KubeRegistryConfig::new("c1"),
        sink,
        std::future::pending(),
    )
    .await
    .unwrap();
    registry.wait_for(SyncPhase::Synced).await;
    let watched: IpAddr = "10.1.0.5".parse().unwrap();
    let w = registry
        .workload(&query(&[watched], "watched.default", None))
        .unwrap();
    assert_eq!(w.labels["app"], "a");
    assert!(
        registry
            .workload(&query(&[watched], "watched.default", Some(&"c2".into())))
            .is_none(),
        "a proxy of another cluster is not this registry's"
    );

    // Relabel the pod nobody runs as, then the one a proxy was looked up by: only
    // the second is pushed.
    api.apply(&objects::pod("default", "unwatched", "b", "10.1.0.6", "n1"));
    api.apply(&objects::pod("default", "watched", "b", "10.1.0.5", "n1"));
    let request = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(RegistryEvent::Push(r)) = events.recv().await
                && r.configs_updated
                    .iter()
                    .any(|k| k.kind == ConfigKind::Workload)
            {
                return r;
            }
        }
    })
    .await
    .unwrap();
    assert!(request.full && request.reasons.contains_key(&TriggerReason::Proxy));
    assert_eq!(
        request.configs_updated.iter().collect::<Vec<_>>(),
        vec![&ConfigKey::new(ConfigKind::Workload, "watched", "default")]
    );
    let w = registry
        .workload(&query(&[watched], "watched.default", None))
        .unwrap();
    assert_eq!(w.labels["app"], "b", "the look-up sees the pushed change");
    task.abort();
}

/// What the writer does with a batch of pod updates: flush, publish the views,
/// then ask `pods_changed` which pods to push (the writer sends those as
/// `PushRequest::full(TriggerReason::Proxy, keys)`; returned here instead).
fn publish(
    registry: &KubeRegistry,
    state: &mut crate::state::ClusterState,
    pods: &[(&str, &str, &str)],
) -> Vec<ConfigKey> {
    for (name, app, ip) in pods {
        let pod = crate::convert::convert_pod(&objects::pod("default", name, app, ip, "n1"));
        state.apply(crate::state::Update::Pod(
            crate::convert::ObjectKey::new("default", name),
            pod.unwrap(),
        ));
    }
    let flush = state.flush();
    if let Some(view) = flush.view {
        registry.view.store(view);
    }
    if let Some(pods) = flush.pods {
        registry.pods.store(pods);
    }
    registry.pods_changed(&flush.changed_pods)
}

/// The Workload keys of the pushes sent to `events` so far (and asserts that every
/// push is a full `Proxy` push).
fn pushed_workloads(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<RegistryEvent>,
) -> Vec<ConfigKey> {
    let mut keys = Vec::new();
    while let Ok(event) = events.try_recv() {
        let RegistryEvent::Push(r) = event else {
            panic!("unexpected {event:?}");
        };
        assert!(r.full && r.reasons.contains_key(&TriggerReason::Proxy));
        assert!(
            r.configs_updated
                .iter()
                .all(|k| k.kind == ConfigKind::Workload)
        );
        keys.extend(r.configs_updated);
    }
    keys
}

/// The race frozen views add, built step by step (no writer task, no timing): a
/// snapshot freezes the pods; a pod changes and is published before any proxy was
/// looked up at its IP, so the writer pushes nothing; then a proxy at that IP is
/// looked up in the frozen view. The look-up must answer from the frozen pods (the
/// snapshot's) and push the pod, or the proxy would keep its old labels.
#[test]
fn a_look_up_in_a_frozen_view_pushes_a_pod_change_the_writer_could_not() {
    let (sink, mut events) = UpdateSink::new(Arc::new(EndpointIndex::new()));
    let registry = KubeRegistry::new(KubeRegistryConfig::new("c1"), sink, false);
    let mut state = crate::state::ClusterState::new(registry.config.clone());
    let p: IpAddr = "10.1.0.5".parse().unwrap();
    let q: IpAddr = "10.1.0.6".parse().unwrap();
    let p_key = ConfigKey::new(ConfigKind::Workload, "p", "default");
    let labels = |w: Option<WorkloadInstance>| w.map(|w| w.labels["app"].clone());
    assert_eq!(
        publish(
            &registry,
            &mut state,
            &[("p", "a", "10.1.0.5"), ("q", "a", "10.1.0.6")]
        ),
        vec![],
        "no proxy looked up yet"
    );

    let frozen = registry.workloads().unwrap();
    assert_eq!(
        publish(&registry, &mut state, &[("p", "b", "10.1.0.5")]),
        vec![],
        "the writer knows no proxy at p's IP"
    );
    assert!(pushed_workloads(&mut events).is_empty());
    assert_eq!(
        labels(frozen.find(&query(&[p], "p.default", None))).as_deref(),
        Some("a"),
        "the frozen view answers as it was frozen"
    );
    assert_eq!(
        pushed_workloads(&mut events),
        vec![p_key.clone()],
        "the look-up pushes the pod the writer did not"
    );
    assert_eq!(
        labels(registry.workload(&query(&[p], "p.default", None))).as_deref(),
        Some("b"),
        "a view frozen now (the pushed snapshot's) has the change"
    );
    assert!(pushed_workloads(&mut events).is_empty());

    // Another pod changes after a freeze: the frozen pods are stale, but p's answer
    // is the same, so nothing is pushed.
    let frozen = registry.workloads().unwrap();
    assert_eq!(
        publish(&registry, &mut state, &[("q", "b", "10.1.0.6")]),
        vec![]
    );
    assert_eq!(
        labels(frozen.find(&query(&[p], "p.default", None))).as_deref(),
        Some("b")
    );
    assert!(pushed_workloads(&mut events).is_empty());
    // A proxy of another cluster is not this registry's: no answer, no push, and
    // its IP is not recorded.
    assert!(
        frozen
            .find(&query(&[q], "q.default", Some(&"c2".into())))
            .is_none()
    );
    assert!(pushed_workloads(&mut events).is_empty());
    assert_eq!(
        publish(&registry, &mut state, &[("q", "c", "10.1.0.6")]),
        vec![]
    );

    // The IPs the frozen look-ups recorded keep the writer's own protection: the
    // next change to p is the writer's push.
    assert_eq!(
        publish(&registry, &mut state, &[("p", "c", "10.1.0.5")]),
        vec![p_key]
    );
}

/// Istio's NodePort gateways (`traffic.istio.io/nodeSelector` on a NodePort service):
/// the ExternalIPs of the selected nodes, on the node port of the gateway port, both
/// for a labelled service and for a meshNetworks `registryServiceName`; a node change
/// is followed.
#[tokio::test]
async fn node_port_gateways_are_the_selected_nodes_external_ips() {
    use k8s_openapi::api::core::v1::ServicePort;
    let api = FakeApiServer::start().await.unwrap();
    let node = |name: &str, ip: &str, gateway: bool| {
        let mut n = objects::node(name, "r", "z");
        n.status.as_mut().unwrap().addresses.as_mut().unwrap()[0].address = ip.to_string();
        if gateway {
            n.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert("gateway".into(), "yes".into());
        }
        n
    };
    api.apply(&node("n1", "3.3.3.3", true));
    api.apply(&node("n2", "4.4.4.4", false));
    let node_port = |name: &str, labels: &[(&str, &str)], selector: &str| {
        let mut svc = objects::service("istio-system", name, "10.96.0.50", &[("tls", 15443)]);
        let spec = svc.spec.as_mut().unwrap();
        spec.type_ = Some("NodePort".into());
        spec.ports = Some(vec![ServicePort {
            name: Some("tls".into()),
            port: 15443,
            node_port: Some(25443),
            ..Default::default()
        }]);
        let meta = &mut svc.metadata;
        for (k, v) in labels {
            meta.labels
                .get_or_insert_with(Default::default)
                .insert(k.to_string(), v.to_string());
        }
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert("traffic.istio.io/nodeSelector".into(), selector.into());
        svc
    };
    api.apply(&node_port(
        "eastwest",
        &[("topology.istio.io/network", "n2")],
        r#"{"gateway": "yes"}"#,
    ));
    api.apply(&node_port("ingress", &[], "{}"));
    let mut config = KubeRegistryConfig::new("c1");
    config.mesh_gateways = MeshGateways::new(|_| {
        vec![GatewayServiceRef {
            network: NetworkId::new("n1"),
            hostname: "ingress.istio-system.svc.cluster.local".into(),
            port: 15443,
        }]
    });
    let (sink, _events) = UpdateSink::new(Arc::new(EndpointIndex::new()));
    let (registry, task) = KubeRegistry::start(api.client(), config, sink, std::future::pending())
        .await
        .unwrap();
    registry.wait_for(SyncPhase::Synced).await;
    let gateways = || {
        let mut g: Vec<(String, String, u16)> = registry
            .network_gateways()
            .into_iter()
            .map(|g| (g.network.to_string(), g.address.to_string(), g.port))
            .collect();
        g.sort();
        g
    };
    let s = |n: &str, a: &str, p: u16| (n.to_string(), a.to_string(), p);
    assert_eq!(
        gateways(),
        vec![
            s("n1", "3.3.3.3", 25443),
            s("n1", "4.4.4.4", 25443),
            s("n2", "3.3.3.3", 25443),
        ]
    );
    // The second node joins the east-west gateway's selection.
    api.apply(&node("n2", "4.4.4.4", true));
    until("the relabelled node serves the gateway", || {
        gateways().contains(&s("n2", "4.4.4.4", 25443))
    })
    .await;
    task.abort();
}

#[tokio::test]
async fn with_ambient_workloads_a_pod_backing_no_service_is_pushed_and_listed() {
    let api = FakeApiServer::start().await.unwrap();
    api.apply(&objects::pod("default", "lone", "a", "10.1.0.7", "n1"));
    let (sink, mut events) = UpdateSink::new(Arc::new(EndpointIndex::new()));
    let config = KubeRegistryConfig {
        ambient_workloads: true,
        ..KubeRegistryConfig::new("c1")
    };
    let (registry, task) = KubeRegistry::start(api.client(), config, sink, std::future::pending())
        .await
        .unwrap();
    registry.wait_for(SyncPhase::Synced).await;
    let listed = |registry: &KubeRegistry| -> Vec<(String, String)> {
        registry
            .workloads()
            .unwrap()
            .every_workload()
            .iter()
            .map(|e| {
                let w = e.workload.as_deref().unwrap();
                (w.uid.clone(), e.labels["app"].clone())
            })
            .collect()
    };
    assert_eq!(
        listed(&registry),
        vec![("c1//Pod/default/lone".to_string(), "a".to_string())]
    );
    while events.try_recv().is_ok() {}

    // Relabelled: no Service's endpoints change, an endpoint-only push naming no
    // service follows.
    api.apply(&objects::pod("default", "lone", "b", "10.1.0.7", "n1"));
    let request = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(RegistryEvent::Push(r)) = events.recv().await {
                return r;
            }
        }
    })
    .await
    .unwrap();
    assert!(request.is_endpoints_only());
    assert_eq!(
        request.configs_updated.iter().collect::<Vec<_>>(),
        vec![&ConfigKey::new(
            ConfigKind::Endpoints,
            "workloads",
            "Kubernetes/c1"
        )]
    );
    assert_eq!(
        listed(&registry),
        vec![("c1//Pod/default/lone".to_string(), "b".to_string())]
    );
    task.abort();
}

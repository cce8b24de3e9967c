//! Root-cert distribution against the fake API server: the publisher keeps
//! `istio-ca-root-cert` in every namespace it should, and with two replicas only the
//! Lease holder writes.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshfed_kube::fake_api::objects::{self, ConfigMap};
use meshfed_kube::fake_api::{FakeApiServer, PolicyRule, RbacPolicy, RecordedRequest, Scope};
use meshfed_kube::root_cert::ROOT_CERT_CONFIGMAP;
use meshfed_kube::{
    LeaseConfig, LeaseState, RootCertStats, WriteResult, run_lease, run_root_cert_publisher,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const SYSTEM: &str = "istio-system";
const PUBLISHED: &[&str] = &["default", "kube-system", SYSTEM];
const EXCLUDED: &[&str] = &["kube-public", "kube-node-lease", "local-path-storage"];
const WAIT: Duration = Duration::from_secs(15);

/// Polls `check` every 10 ms until it holds, failing after [`WAIT`].
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The published root in `namespace`, if any.
fn root_in(api: &FakeApiServer, namespace: &str) -> Option<String> {
    let cm: ConfigMap = api.get(Some(namespace), ROOT_CERT_CONFIGMAP)?;
    cm.data?.get("root-cert.pem").cloned()
}

fn all_hold(api: &FakeApiServer, namespaces: &[&str], root: &str) -> bool {
    namespaces
        .iter()
        .all(|ns| root_in(api, ns).as_deref() == Some(root))
}

fn is_config_map_write(r: &RecordedRequest) -> bool {
    (r.method == "POST" || r.method == "PUT") && r.path.contains("/configmaps") && !r.denied
}

fn config_map_writes(requests: &[RecordedRequest]) -> usize {
    requests.iter().filter(|r| is_config_map_write(r)).count()
}

fn cluster(api: &FakeApiServer) {
    for ns in PUBLISHED.iter().chain(EXCLUDED) {
        api.apply(&objects::namespace(ns, &[]));
    }
    let mut leaving = objects::namespace("leaving", &[]);
    leaving.status = Some(k8s_openapi::api::core::v1::NamespaceStatus {
        phase: Some("Terminating".into()),
        ..Default::default()
    });
    api.apply(&leaving);
}

/// One istiod replica's election and publisher, stopped by `stop` or aborted.
struct Replica {
    user: String,
    leader: Arc<LeaseState>,
    stats: Arc<RootCertStats>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Replica {
    /// Starts a replica as service account `name` (its own bearer token, so the fake
    /// API records its requests as `system:serviceaccount:istio-system:<name>`).
    fn start(api: &FakeApiServer, name: &str, root: watch::Receiver<String>) -> Replica {
        let token = api.issue_token(
            SYSTEM,
            name,
            &[],
            SystemTime::now() + Duration::from_secs(3600),
            None,
        );
        let client = api.client_with_token(&token);
        let leader = Arc::new(LeaseState::default());
        let stats = Arc::new(RootCertStats::default());
        let (stop, stopped) = watch::channel(false);
        let shutdown = move || {
            let mut stopped = stopped.clone();
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            }
        };
        let config = LeaseConfig {
            duration: Duration::from_secs(1),
            renew_every: Duration::from_millis(100),
            ..LeaseConfig::new(SYSTEM, "istio-namespace-controller-election", name)
        };
        let tasks = vec![
            tokio::spawn(run_lease(
                client.clone(),
                config,
                leader.clone(),
                shutdown(),
            )),
            tokio::spawn(run_root_cert_publisher(
                client,
                leader.clone(),
                root,
                stats.clone(),
                shutdown(),
            )),
        ];
        Replica {
            user: format!("system:serviceaccount:{SYSTEM}:{name}"),
            leader,
            stats,
            stop,
            tasks,
        }
    }

    fn writes(&self, api: &FakeApiServer) -> usize {
        config_map_writes(&api.requests_by(&self.user))
    }

    /// Dies without releasing the Lease (a crashed pod).
    fn crash(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

#[tokio::test]
async fn the_configmap_is_kept_in_every_namespace_but_the_excluded_ones() {
    let api = FakeApiServer::start().await.unwrap();
    cluster(&api);
    let (root, root_rx) = watch::channel("ROOT-1".to_string());
    let replica = Replica::start(&api, "istiod", root_rx);
    until("published in every namespace", || {
        all_hold(&api, PUBLISHED, "ROOT-1")
    })
    .await;
    for ns in EXCLUDED.iter().chain(&["leaving"]) {
        assert_eq!(root_in(&api, ns), None, "{ns} gets none");
    }
    let cm: ConfigMap = api.get(Some("default"), ROOT_CERT_CONFIGMAP).unwrap();
    assert_eq!(
        cm.metadata
            .labels
            .as_ref()
            .unwrap()
            .get("istio.io/config")
            .map(String::as_str),
        Some("true")
    );

    // An unrelated namespace change writes nothing; a new namespace gets one write.
    // (The namespace watch delivers both in order, so once `late` has its ConfigMap
    // the change to `default` was handled.)
    let before = config_map_writes(&api.requests());
    api.apply(&objects::namespace("default", &[("team", "a")]));
    api.apply(&objects::namespace("late", &[]));
    until("the new namespace has one", || {
        root_in(&api, "late").as_deref() == Some("ROOT-1")
    })
    .await;
    assert_eq!(config_map_writes(&api.requests()), before + 1);

    api.delete::<ConfigMap>(Some("default"), ROOT_CERT_CONFIGMAP);
    until("a deleted ConfigMap is re-created", || {
        root_in(&api, "default").as_deref() == Some("ROOT-1")
    })
    .await;

    let mut tampered = objects::config_map(
        "kube-system",
        ROOT_CERT_CONFIGMAP,
        &[("root-cert.pem", "TAMPERED"), ("note", "kept")],
    );
    tampered.metadata.labels = cm.metadata.labels.clone();
    api.apply(&tampered);
    until("an edited value is restored", || {
        root_in(&api, "kube-system").as_deref() == Some("ROOT-1")
    })
    .await;
    let restored: ConfigMap = api.get(Some("kube-system"), ROOT_CERT_CONFIGMAP).unwrap();
    assert_eq!(restored.data.unwrap()["note"], "kept", "other keys stay");

    root.send_replace("ROOT-2".to_string());
    until("the new root everywhere", || {
        all_hold(&api, &["default", "kube-system", SYSTEM, "late"], "ROOT-2")
    })
    .await;
    for ns in EXCLUDED {
        assert_eq!(root_in(&api, ns), None, "{ns} still gets none");
    }
    // The counters move once each write's answer is back: wait for them too.
    let stats = &replica.stats;
    until(
        "3 at start, late and the re-created default created",
        || stats.writes(WriteResult::Created) == 5,
    )
    .await;
    until("the tampered one and 4 new roots updated", || {
        stats.writes(WriteResult::Updated) == 5
    })
    .await;
    assert_eq!(stats.writes(WriteResult::Error), 0);

    let mut registry = prometheus_client::registry::Registry::default();
    stats.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(r#"meshfed_root_cert_configmap_writes_total{result="created"} 5"#),
        "{text}"
    );
    replica.stop().await;
}

#[tokio::test]
async fn only_the_lease_holder_writes_and_the_other_takes_over() {
    let api = FakeApiServer::start().await.unwrap();
    cluster(&api);
    let (root, root_rx) = watch::channel("ROOT-1".to_string());
    let a = Replica::start(&api, "istiod-a", root_rx.clone());
    let b = Replica::start(&api, "istiod-b", root_rx);
    until("published", || all_hold(&api, PUBLISHED, "ROOT-1")).await;
    until("one leader", || {
        a.leader.is_leader() || b.leader.is_leader()
    })
    .await;
    let (holder, other) = if a.leader.is_leader() {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert!(!other.leader.is_leader());
    assert!(holder.writes(&api) >= PUBLISHED.len());
    assert_eq!(
        other.writes(&api),
        0,
        "the replica without the Lease writes nothing"
    );
    assert_eq!(other.stats.writes(WriteResult::Created), 0);

    // A namespace added while the holder leads: still only the holder writes.
    api.apply(&objects::namespace("late", &[]));
    until("late published", || root_in(&api, "late").is_some()).await;
    assert_eq!(other.writes(&api), 0);

    // The holder crashes (no release): the other takes the Lease once it expires and
    // rolls out the new root.
    holder.crash();
    let holder_writes = holder.writes(&api);
    root.send_replace("ROOT-2".to_string());
    until("the other replica leads", || other.leader.is_leader()).await;
    until("the new root everywhere", || {
        all_hold(&api, &["default", "kube-system", SYSTEM, "late"], "ROOT-2")
    })
    .await;
    assert!(other.writes(&api) >= 4, "the new leader wrote the new root");
    assert_eq!(
        holder.writes(&api),
        holder_writes,
        "the crashed one wrote nothing more"
    );
    for ns in EXCLUDED {
        assert_eq!(root_in(&api, ns), None);
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_forbidden_namespace_is_counted_and_the_others_are_published() {
    let api = FakeApiServer::start().await.unwrap();
    api.apply(&objects::namespace("default", &[]));
    api.apply(&objects::namespace("locked", &[]));
    let rule = |groups: &[&str], resources: &[&str], verbs: &[&str]| PolicyRule {
        api_groups: groups.iter().map(|s| s.to_string()).collect(),
        resources: resources.iter().map(|s| s.to_string()).collect(),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    api.enforce(
        RbacPolicy::new("system:serviceaccount:istio-system:istiod")
            .allow(
                Scope::Cluster,
                rule(&[""], &["namespaces"], &["list", "watch"]),
            )
            .allow(
                Scope::Cluster,
                rule(&[""], &["configmaps"], &["get", "list", "watch"]),
            )
            .allow(
                Scope::Namespace("default".into()),
                rule(&[""], &["configmaps"], &["create", "update"]),
            )
            .allow(
                Scope::Namespace(SYSTEM.into()),
                rule(
                    &["coordination.k8s.io"],
                    &["leases"],
                    &["get", "create", "update"],
                ),
            ),
    );
    let (_root, root_rx) = watch::channel("ROOT".to_string());
    let replica = Replica::start(&api, "istiod", root_rx);
    until("default published", || {
        root_in(&api, "default").as_deref() == Some("ROOT")
    })
    .await;
    until("the refusal counted", || {
        replica.stats.writes(WriteResult::Error) >= 1
    })
    .await;
    assert_eq!(root_in(&api, "locked"), None);
    let denied = api.denied_requests();
    assert!(
        denied
            .iter()
            .all(|r| r.method == "POST" && r.path == "/api/v1/namespaces/locked/configmaps"),
        "{denied:?}"
    );
    replica.stop().await;
}

//! Config status (`--enableStatus`) against the fake API server with deploy/rbac.yaml
//! enforced: the leader writes Istio's `Reconciled` condition, validation messages
//! and observed generation through the status subresource, skips writes that change
//! nothing, paces its API calls, and a replica that does not lead writes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use meshfed::app::{KubeSettings, KubeSource};
use meshfed::testing::{AdsClient, FakeServer, node};
use meshfed::xds::TypeUrl;
use meshfed_kube::fake_api::{CustomResource, FakeApiServer, objects};
use meshfed_kube::status::{DesiredStatus, Progress, StatusSettings, StatusStats};
use meshfed_kube::{KubeConfigStore, KubeConfigStoreConfig, LeaseState};
use meshfed_registry::config::{Kind, ObjectId};
use serde_json::{Value, json};

use crate::support::*;

const NS: &str = "istio-system";

fn virtual_service(name: &str, weights: (i32, i32)) -> Value {
    objects::istio(
        "v1",
        "VirtualService",
        "default",
        name,
        json!({
            "hosts": ["reviews.default.svc.cluster.local"],
            "http": [{"route": [
                {"destination": {"host": "reviews", "subset": "v1"}, "weight": weights.0},
                {"destination": {"host": "reviews", "subset": "v2"}, "weight": weights.1},
            ]}],
        }),
    )
}

fn status_of(api: &FakeApiServer, name: &str) -> Value {
    api.get_custom("networking.istio.io", "VirtualService", "default", name)
        .map(|o| o["status"].clone())
        .unwrap_or(Value::Null)
}

fn status_puts(api: &FakeApiServer) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.method == "PUT" && r.path.ends_with("/status"))
        .count()
}

#[tokio::test]
async fn the_leader_writes_reconciled_and_validation_messages_with_rbac_enforced() {
    let api = EnforcedApi::start().await;
    api.apply(&objects::namespace(NS, &[]));
    api.apply(&objects::namespace("default", &[]));
    api.install_crds(CustomResource::istio(&[
        "v1", "v1beta1", "v1alpha3", "v1alpha1",
    ]));
    api.apply_custom(&virtual_service("good", (50, 50)));
    api.apply_custom(&virtual_service("bad", (60, 50)));
    // What the good one names exists: the Service and the DestinationRule's subsets.
    api.apply(&objects::service(
        "default",
        "reviews",
        "10.96.0.20",
        &[("http", 9080)],
    ));
    api.apply_custom(&objects::istio(
        "v1",
        "DestinationRule",
        "default",
        "reviews",
        json!({
            "host": "reviews",
            "subsets": [
                {"name": "v1", "labels": {"version": "v1"}},
                {"name": "v2", "labels": {"version": "v2"}},
            ],
        }),
    ));
    // A valid object naming a host no registry has: the analyzers' IST0101.
    api.apply_custom(&objects::istio(
        "v1",
        "VirtualService",
        "default",
        "dangling",
        json!({
            "hosts": ["dangling.example.com"],
            "http": [{"route": [{"destination": {"host": "nowhere.default.svc.cluster.local"}}]}],
        }),
    ));
    let client = api.client();
    let server = FakeServer::builder()
        .configure(move |c| {
            c.kubernetes = Some(KubeSettings {
                source: KubeSource::Client(client),
                namespaces: meshfed_kube::NamespaceFilter::All,
                system_namespace: NS.into(),
                remote_secrets: Default::default(),
            });
            c.status = Some(StatusSettings {
                interval: Duration::from_millis(20),
                ..Default::default()
            });
        })
        .start()
        .await
        .unwrap();
    let api = &api;

    // No proxy yet: 0/0 is all of them.
    let good = eventually("the good object's status", || async move {
        let s = status_of(api, "good");
        (s["conditions"][0]["message"] == "0/0 proxies up to date.").then_some(s)
    })
    .await;
    assert_eq!(good["conditions"][0]["type"], "Reconciled");
    assert_eq!(good["conditions"][0]["status"], "True");
    assert!(good["conditions"][0]["lastProbeTime"].is_string());
    assert_eq!(good["observedGeneration"], "1");
    assert!(good.get("validationMessages").is_none(), "{good}");

    let dangling = eventually("the dangling object's analysis", || async move {
        let s = status_of(api, "dangling");
        s["validationMessages"].is_array().then_some(s)
    })
    .await;
    assert_eq!(
        dangling["validationMessages"],
        json!([{
            "type": {"name": "ReferencedResourceNotFound", "code": "IST0101"},
            "level": "ERROR",
            "documentationUrl": "https://istio.io/latest/docs/reference/config/analysis/ist0101/",
        }]),
        "{dangling}"
    );

    let bad = eventually("the rejected object's status", || async move {
        let s = status_of(api, "bad");
        s["validationMessages"].is_array().then_some(s)
    })
    .await;
    assert_eq!(
        bad["validationMessages"],
        json!([{
            "type": {"name": "SchemaValidationError", "code": "IST0106"},
            "level": "ERROR",
            "documentationUrl": "https://istio.io/latest/docs/reference/config/analysis/ist0106/",
        }])
    );
    assert_eq!(
        bad["conditions"][0]["status"], "True",
        "0/0: no proxy lacks it"
    );

    // A proxy that ACKs what it was sent counts as up to date.
    let mut ads = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.1.0.9~a.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    ads.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let response = ads.recv().await.unwrap();
    ads.ack(&response).await.unwrap();
    eventually("1/1 on the good object", || async move {
        (status_of(api, "good")["conditions"][0]["message"] == "1/1 proxies up to date.")
            .then_some(())
    })
    .await;
    let bad = status_of(api, "bad");
    assert_eq!(bad["conditions"][0]["status"], "False", "{bad}");
    assert_eq!(bad["conditions"][0]["message"], "0/1 proxies up to date.");

    // Every PUT the API server saw is counted once the writer has its answer.
    let monitoring = server.bound().monitoring;
    eventually(
        "status writes counted as the API server saw them",
        || async move {
            let text = http_get(monitoring, "/metrics").await.1;
            let written = metric(
                &text,
                "meshfed_config_status_writes_total{result=\"written\"}",
            );
            (written == Some(status_puts(api) as f64)).then_some(())
        },
    )
    .await;
    server.shutdown().await;
}

/// The writer alone on a paused clock: a replica that does not lead writes nothing;
/// the leader writes, at most `burst` calls at once and then `qps` per second.
#[tokio::test(start_paused = true)]
async fn only_the_leader_writes_and_its_calls_are_rate_limited() {
    let api = FakeApiServer::start().await.unwrap();
    api.enforce(deploy_rbac());
    api.install_crds(CustomResource::istio(&[
        "v1", "v1beta1", "v1alpha3", "v1alpha1",
    ]));
    let names = ["a", "b", "c", "d"];
    for name in names {
        api.apply_custom(&virtual_service(name, (50, 50)));
    }
    let (sink, _events) =
        meshfed_registry::UpdateSink::new(Arc::new(meshfed_registry::EndpointIndex::new()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let shutdown = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let (store, _task) = KubeConfigStore::start(
        api.client(),
        KubeConfigStoreConfig::new("c1"),
        sink,
        shutdown(),
    )
    .unwrap();
    store.wait_synced().await;
    let desired: BTreeMap<ObjectId, DesiredStatus> = names
        .iter()
        .map(|n| {
            (
                ObjectId::new(Kind::VirtualService, "default", n),
                DesiredStatus {
                    reconciled: Some(Progress { acked: 1, total: 1 }),
                    messages: vec![],
                    ..Default::default()
                },
            )
        })
        .collect();
    let (_tx, rx) = tokio::sync::watch::channel(Arc::new(desired));
    let settings = StatusSettings {
        qps: 1.0,
        burst: 2,
        interval: Duration::from_millis(100),
    };
    let run = |leader: Arc<LeaseState>, stats: Arc<StatusStats>| {
        let writer = meshfed_kube::status::StatusWriter {
            client: api.client(),
            store: store.clone(),
            leader,
            settings: settings.clone(),
            stats,
            duties: None,
        };
        tokio::spawn(meshfed_kube::status::run_status_writer(
            writer,
            rx.clone(),
            shutdown(),
        ))
    };

    // Not the leader: ten intervals, no call.
    let follower = Arc::new(StatusStats::default());
    let task = run(Arc::new(LeaseState::default()), follower.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        status_puts(&api),
        0,
        "a replica that does not lead writes nothing"
    );
    assert_eq!(
        api.requests()
            .iter()
            .filter(|r| r.path.ends_with("/status"))
            .count(),
        0
    );
    task.abort();

    // The leader: 4 objects = 8 calls (read, write); a burst of 2, then 1 per second.
    let stats = Arc::new(StatusStats::default());
    let start = tokio::time::Instant::now();
    let _leader = run(Arc::new(LeaseState::sole()), stats.clone());
    let stats_ref = &stats;
    let api_ref = &api;
    loop {
        if stats_ref.written.load(std::sync::atomic::Ordering::Relaxed) == 4 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "four writes within a minute"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_secs(6),
        "8 calls at burst 2 and 1/s take at least 6 s: {elapsed:?}"
    );
    assert_eq!(status_puts(api_ref), 4);
    // Nothing changes: ten more seconds of intervals read and write nothing.
    // (The config store's own watches may reconnect meanwhile: only status calls count.)
    let status_calls = || {
        api_ref
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/status"))
            .count()
    };
    let calls = status_calls();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(status_calls(), calls, "no call while nothing changes");
    for name in names {
        assert_eq!(
            status_of(api_ref, name)["conditions"][0]["message"],
            "1/1 proxies up to date."
        );
    }
    let _ = stop.send(true);
}

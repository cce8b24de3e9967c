//! The vectors of Istio's `pilot/pkg/autoregistration/controller_test.go`, each Go
//! test a test here (its subtests in order, named in comments), over the in-memory
//! entry store with tokio's paused clock (the Go tests' 50 ms grace period and sleeps
//! become paused-time advances). 36 vectors:
//!
//! | Go test | vectors | here |
//! |---|---|---|
//! | TestNonAutoRegisteredWorkloads | 4 | `non_auto_registered_workloads` |
//! | TestAutoregistrationLifecycle | 13 | `autoregistration_lifecycle` |
//! | TestAutoregistrationDisabled | 2 | `autoregistration_disabled` |
//! | TestUpdateHealthCondition | 2 | `update_health_condition` (known gap: network `litNw`) |
//! | TestWorkloadEntryFromGroup | 1 | `workload_entry_from_group` (no owner reference) |
//! | ..._UnsuitableForHealthChecks_WorkloadEntryNotFound | 1 | `unsuitable_for_health_checks_workload_entry_not_found` |
//! | ..._UnsuitableForHealthChecks_ShouldNotBeTreatedAsConnected | 2 | `unsuitable_for_health_checks_not_treated_as_connected` |
//! | ..._SuitableForHealthChecks_ShouldBeTreatedAsConnected | 3 | `suitable_for_health_checks_treated_as_connected` |
//! | ..._SuitableForHealthChecks_ShouldSupportLifecycle | 6 | `suitable_for_health_checks_lifecycle` |
//! | ..._SuitableForHealthChecks_ShouldUpdateHealthCondition | 2 | `suitable_for_health_checks_update_health_condition` |
//!
//! All pass; two differ from Istio's and are pinned: an entry name with upper-case
//! letters is refused (as the API server refuses it; the health vector runs with
//! `litnw`), and the entry carries no owner reference (README, Differences).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshfed_api::networking::v1alpha3 as net;
use meshfed_registry::config::{ConfigObject, ConfigStore, Kind, MemoryConfigStore};
use meshfed_registry::{EndpointIndex, UpdateSink};

use super::entry::*;
use super::health::HealthEvent;
use super::store::{EntryStore, Groups, MemoryEntryStore};
use super::*;
use crate::drain::{self, ShutdownTrigger};

const GRACE: Duration = Duration::from_millis(50);

struct Fixture {
    store: MemoryConfigStore,
    entries: Arc<MemoryEntryStore>,
    _events: tokio::sync::mpsc::UnboundedReceiver<meshfed_registry::RegistryEvent>,
}

impl Fixture {
    fn new() -> Fixture {
        let (sink, events) = UpdateSink::new(Arc::new(EndpointIndex::new()));
        let store = MemoryConfigStore::new(sink);
        Fixture {
            entries: Arc::new(MemoryEntryStore::new(store.clone())),
            store,
            _events: events,
        }
    }

    fn controller(&self, instance: &str, settings: Settings) -> Arc<Controller> {
        Controller::new(
            instance,
            self.entries.clone(),
            Groups::new(vec![Arc::new(self.store.clone()) as Arc<dyn ConfigStore>]),
            settings,
            Arc::new(AutoRegistrationMetrics::default()),
        )
    }

    fn create(&self, obj: ConfigObject) {
        self.store.apply(obj).expect("valid object");
    }

    fn entry(&self, namespace: &str, name: &str) -> Option<Arc<ConfigObject>> {
        self.entries.entry(namespace, name)
    }
}

fn settings() -> Settings {
    Settings {
        grace_period: GRACE,
        ..Settings::default()
    }
}

/// Runs a controller's task until the trigger is dropped or pulled.
fn run(c: &Arc<Controller>) -> ShutdownTrigger {
    let (trigger, shutdown) = drain::channel();
    tokio::spawn(c.clone().run(shutdown));
    trigger
}

fn group(namespace: &str, name: &str, sa: &str) -> ConfigObject {
    let mut obj = ConfigObject::new(
        namespace,
        name,
        net::WorkloadGroup {
            metadata: None,
            template: Some(net::WorkloadEntry {
                ports: BTreeMap::from([("http".to_string(), 80)]),
                labels: BTreeMap::from([("app".to_string(), "a".to_string())]),
                network: "nw0".into(),
                locality: "reg0/zone0/subzone0".into(),
                weight: 1,
                service_account: sa.into(),
                ..Default::default()
            }),
            probe: None,
        },
    );
    obj.labels = BTreeMap::from([("grouplabel".to_string(), "notonentry".to_string())]);
    obj
}

fn wg_a() -> ConfigObject {
    group("a", "wg-a", "sa-a")
}

fn we_b() -> ConfigObject {
    let mut obj = ConfigObject::new(
        "b",
        "we-without-auto-registration",
        net::WorkloadEntry {
            address: "10.0.0.1".into(),
            network: "nw0".into(),
            ..Default::default()
        },
    );
    obj.annotations = BTreeMap::from([(
        "proxy.istio.io/health-checks-enabled".to_string(),
        "true".to_string(),
    )]);
    obj
}

/// Istio's `setup`: two controllers over one store, with wg-a in `a` and `wrong` and
/// wg-b (no service account) in `a`.
fn setup() -> (Fixture, Arc<Controller>, Arc<Controller>) {
    let f = Fixture::new();
    let c1 = f.controller("pilot-1", settings());
    let c2 = f.controller("pilot-2", settings());
    f.create(wg_a());
    f.create(group("wrong", "wg-a", "sa-a"));
    f.create(group("a", "wg-b", ""));
    (f, c1, c2)
}

/// Istio's `fakeProxy`.
fn fake_proxy(ip: &str, wg: &ConfigObject, network: &str, sa: &str) -> Workload {
    Workload {
        node_id: format!(
            "sidecar~{ip}~vm.{}~{}.svc.cluster.local",
            wg.namespace, wg.namespace
        ),
        ip: ip.parse().ok(),
        namespace: wg.namespace.clone(),
        network: network.into(),
        group: wg.name.clone(),
        workload_entry: String::new(),
        labels: BTreeMap::from([("merge".to_string(), "me".to_string())]),
        locality: String::new(),
        readiness_probe: false,
        identity: (!wg.namespace.is_empty() && !sa.is_empty())
            .then(|| (wg.namespace.clone(), sa.to_string())),
    }
}

/// Istio's `fakeProxySuitableForHealthChecks`.
fn health_checked_proxy(we: &ConfigObject) -> Workload {
    let spec = we.spec.as_workload_entry().expect("a WorkloadEntry");
    Workload {
        node_id: format!("{}.{}", we.name, we.namespace),
        ip: spec.address.parse().ok(),
        namespace: we.namespace.clone(),
        network: spec.network.clone(),
        group: String::new(),
        workload_entry: we.name.clone(),
        labels: BTreeMap::new(),
        locality: String::new(),
        readiness_probe: true,
        identity: Some((we.namespace.clone(), "my-sa".into())),
    }
}

/// Istio's fake connection id: `<ip>-<connect time>`.
fn conn(w: &Workload, at: SystemTime) -> String {
    format!("{:?}-{at:?}", w.ip)
}

fn name_of(wg: &ConfigObject, w: &Workload) -> String {
    entry_name(w)
        .unwrap()
        .unwrap_or_else(|| format!("{}-?", wg.name))
}

/// Istio's `checkEntry`.
fn check_entry(
    f: &Fixture,
    wg: &ConfigObject,
    w: &Workload,
    locality: &str,
    connected_to: &str,
) -> Result<(), String> {
    let name = name_of(wg, w);
    let Some(cfg) = f.entry(&wg.namespace, &name) else {
        return Err(format!(
            "expected WorkloadEntry {}/{name} to exist",
            wg.namespace
        ));
    };
    let tmpl = wg
        .spec
        .get::<net::WorkloadGroup>()
        .and_then(|g| g.template.clone())
        .unwrap_or_default();
    let we = cfg.spec.as_workload_entry().unwrap();
    let mut errors = Vec::new();
    if we.ports != tmpl.ports {
        errors.push("expected ports from WorkloadGroup".to_string());
    }
    if Some(we.address.clone()) != w.ip.map(|ip| ip.to_string()) {
        errors.push(format!("entry has address {}", we.address));
    }
    let network = if w.network.is_empty() {
        &tmpl.network
    } else {
        &w.network
    };
    if &we.network != network {
        errors.push(format!("entry has network {}", we.network));
    }
    let loc = if locality.is_empty() {
        tmpl.locality.as_str()
    } else {
        locality
    };
    if we.locality != loc {
        errors.push(format!(
            "entry has locality {}; expected {loc}",
            we.locality
        ));
    }
    if !connected_to.is_empty() {
        let got = cfg.annotations.get(ANNOTATION_CONTROLLER);
        if got.map(String::as_str) != Some(connected_to) {
            errors.push(format!(
                "expected WorkloadEntry to be updated by {connected_to}; got {got:?}"
            ));
        }
        if !cfg.annotations.contains_key(ANNOTATION_CONNECTED_AT) {
            errors.push("expected connection timestamp to be set".into());
        }
    } else if !cfg.annotations.contains_key(ANNOTATION_DISCONNECTED_AT) {
        errors.push("expected disconnection timestamp to be set".into());
    }
    if cfg.labels != we.labels {
        errors.push("spec labels on WorkloadEntry should match meta labels".into());
    }
    for (k, v) in &tmpl.labels {
        if !w.labels.contains_key(k) && we.labels.get(k) != Some(v) {
            errors.push(format!(
                "labels missing on WorkloadEntry: {k}={v} from template"
            ));
        }
    }
    for (k, v) in &w.labels {
        if we.labels.get(k) != Some(v) {
            errors.push(format!(
                "labels missing on WorkloadEntry: {k}={v} from proxy meta"
            ));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

fn check_no_entry(f: &Fixture, wg: &ConfigObject, w: &Workload) -> Result<(), String> {
    match f.entry(&wg.namespace, &name_of(wg, w)) {
        Some(_) => Err("did not expect WorkloadEntry to exist".into()),
        None => Ok(()),
    }
}

/// Istio's `retry.UntilSuccessOrFail` over paused time: checks every 5 ms for up to
/// `within`.
async fn eventually(within: Duration, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match check() {
            Ok(()) => return,
            Err(e) if tokio::time::Instant::now() >= deadline => panic!("{e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

fn health_of(f: &Fixture, namespace: &str, name: &str) -> Option<String> {
    f.entry(namespace, name)?
        .condition(CONDITION_HEALTHY)
        .map(|c| c.status.clone())
}

// === TestNonAutoRegisteredWorkloads ===

#[tokio::test(start_paused = true)]
async fn non_auto_registered_workloads() {
    let f = Fixture::new();
    let c = f.controller("", settings());
    f.create(wg_a());
    let _run = run(&c);
    let base = fake_proxy("1.2.3.4", &wg_a(), "", "sa-a");
    let cases = [
        (
            "missing group",
            Workload {
                group: String::new(),
                ..base.clone()
            },
        ),
        (
            "missing ip",
            Workload {
                ip: None,
                ..base.clone()
            },
        ),
        (
            "missing namespace",
            Workload {
                namespace: String::new(),
                ..base.clone()
            },
        ),
        (
            "non-existent group",
            Workload {
                group: "dne".into(),
                ..base.clone()
            },
        ),
    ];
    for (name, w) in cases {
        let _ = c.on_connect("c", w, c.now()).await;
        assert!(
            f.entries.entries().is_empty(),
            "{name}: expected 0 WorkloadEntry"
        );
    }
}

// === TestAutoregistrationLifecycle (one test: its subtests share state) ===

#[tokio::test(start_paused = true)]
async fn autoregistration_lifecycle() {
    let max_conn_age = Duration::from_secs(3600);
    let f = Fixture::new();
    let c1 = f.controller("pilot-1", settings());
    let c2 = f.controller(
        "pilot-2",
        Settings {
            max_connection_age: Some(max_conn_age),
            ..settings()
        },
    );
    f.create(wg_a());
    f.create(group("wrong", "wg-a", "sa-a"));
    let wg_b = group("a", "wg-b", "");
    f.create(wg_b.clone());
    let stop1 = run(&c1);
    let _stop2 = run(&c2);
    let wg = wg_a();
    let loc = "reg1/zone1/subzone1";
    let node = |ip: &str, nw: &str| Workload {
        locality: loc.into(),
        ..fake_proxy(ip, &wg, nw, "sa-a")
    };
    let p = node("1.2.3.4", "nw1");
    let p2 = node("1.2.3.4", "nw2");
    let p3 = node("1.2.3.5", "nw1");

    // initial registration
    let t1 = c1.now();
    let mut p1conn1 = (conn(&p, t1), t1);
    c1.on_connect(&p1conn1.0, p.clone(), t1).await.unwrap();
    check_entry(&f, &wg, &p, loc, "pilot-1").unwrap();

    // multinetwork same ip
    let t = c2.now();
    let p2conn1 = conn(&p2, t);
    c2.on_connect(&p2conn1, p2.clone(), t).await.unwrap();
    check_entry(&f, &wg, &p, loc, "pilot-1").unwrap();
    check_entry(&f, &wg, &p2, loc, "pilot-2").unwrap();
    c2.on_disconnect(&p2conn1).await;

    // fast reconnect / same instance
    c1.on_disconnect(&p1conn1.0).await;
    tokio::time::sleep(GRACE / 2).await;
    check_entry(&f, &wg, &p, loc, "").unwrap();
    let t = c1.now();
    p1conn1 = (conn(&p, t), t);
    c1.on_connect(&p1conn1.0, p.clone(), t).await.unwrap();
    check_entry(&f, &wg, &p, loc, "pilot-1").unwrap();

    // fast reconnect / same instance: connect before disconnect
    let t = p1conn1.1 + Duration::from_millis(10);
    let p1conn2 = (conn(&p, t), t);
    c1.on_connect(&p1conn2.0, p.clone(), t).await.unwrap();
    c1.on_disconnect(&p1conn1.0).await;
    tokio::time::sleep(GRACE / 2).await;
    check_entry(&f, &wg, &p, loc, "pilot-1").unwrap();

    // fast reconnect / different instance
    c1.on_disconnect(&p1conn2.0).await;
    tokio::time::sleep(GRACE / 2).await;
    check_entry(&f, &wg, &p, loc, "").unwrap();
    let t = c2.now();
    p1conn1 = (conn(&p, t), t);
    c2.on_connect(&p1conn1.0, p.clone(), t).await.unwrap();
    check_entry(&f, &wg, &p, loc, "pilot-2").unwrap();

    // slow reconnect
    c2.on_disconnect(&p1conn1.0).await;
    eventually(Duration::from_secs(1), || check_no_entry(&f, &wg, &p)).await;
    let t = c1.now();
    p1conn1 = (conn(&p, t), t);
    c1.on_connect(&p1conn1.0, p.clone(), t).await.unwrap();
    check_entry(&f, &wg, &p, loc, "pilot-1").unwrap();

    // garbage collected if pilot stops after disconnect
    c1.on_disconnect(&p1conn1.0).await;
    stop1.trigger();
    eventually(GRACE * 21, || check_no_entry(&f, &wg, &p)).await;

    // garbage collected if pilot and workload stops simultaneously before pilot can
    // do anything
    let t = c2.now() - 2 * max_conn_age;
    let p3conn1 = conn(&p3, t);
    c2.on_connect(&p3conn1, p3.clone(), t).await.unwrap();
    eventually(GRACE * 21, || check_no_entry(&f, &wg, &p3)).await;
    c2.on_disconnect(&p3conn1).await;

    // workload group recreate
    let t = c2.now();
    p1conn1 = (conn(&p, t), t);
    c2.on_connect(&p1conn1.0, p.clone(), t).await.unwrap();
    check_entry(&f, &wg, &p, loc, "pilot-2").unwrap();
    assert!(f.store.delete(Kind::WorkloadGroup, "a", "wg-a"));
    assert!(f.store.delete(Kind::WorkloadEntry, "a", &name_of(&wg, &p)));
    f.create(wg_a());
    eventually(Duration::from_secs(1), || {
        check_entry(&f, &wg, &p, loc, "pilot-2")
    })
    .await;
    c2.on_disconnect(&p1conn1.0).await;

    // unverified client
    let p = fake_proxy("1.2.3.6", &wg, "nw1", "");
    assert!(c1.on_connect("u", p.clone(), c1.now()).await.is_err());
    check_no_entry(&f, &wg, &p).unwrap();

    // wrong SA client
    let p = fake_proxy("1.2.3.6", &wg, "nw1", "wrong");
    assert!(c1.on_connect("w", p.clone(), c1.now()).await.is_err());
    check_no_entry(&f, &wg, &p).unwrap();

    // wrong NS client
    let mut p = fake_proxy("1.2.3.6", &wg, "nw1", "sa-a");
    p.namespace = "wrong".into();
    assert!(c1.on_connect("n", p.clone(), c1.now()).await.is_err());
    check_no_entry(&f, &wg, &p).unwrap();

    // no SA WG
    let p = Workload {
        locality: "reg0/zone0/subzone0".into(),
        ..fake_proxy("1.2.3.6", &wg_b, "nw1", "sa-a")
    };
    c1.on_connect("s", p.clone(), c1.now()).await.unwrap();
    check_entry(&f, &wg_b, &p, "reg0/zone0/subzone0", "pilot-1").unwrap();
}

// === TestAutoregistrationDisabled ===

#[tokio::test(start_paused = true)]
async fn autoregistration_disabled() {
    let f = Fixture::new();
    f.create(we_b());
    let c = f.controller(
        "pilot-x",
        Settings {
            auto_registration: false,
            ..settings()
        },
    );
    let _run = run(&c);
    // health check still works
    let proxy = health_checked_proxy(&we_b());
    let t = c.now();
    c.on_connect(&conn(&proxy, t), proxy.clone(), t)
        .await
        .unwrap();
    c.on_health(&conn(&proxy, t), HealthEvent::from_error_detail(None));
    eventually(Duration::from_secs(1), || {
        match health_of(&f, "b", "we-without-auto-registration").as_deref() {
            Some("True") => Ok(()),
            other => Err(format!("health {other:?}")),
        }
    })
    .await;
    // registration does nothing
    let p = fake_proxy("1.2.3.4", &wg_a(), "litNw", "sa-a");
    c.on_connect("r", p.clone(), c.now()).await.unwrap();
    check_no_entry(&f, &wg_a(), &p).unwrap();
}

// === TestUpdateHealthCondition ===

#[tokio::test(start_paused = true)]
async fn update_health_condition() {
    let (f, ig, ig2) = setup();
    let _r1 = run(&ig);
    let _r2 = run(&ig2);
    // Known gap: Istio's vector uses network `litNw`, so the entry is named
    // `wg-a-1.2.3.4-litNw`. Istio's in-memory test store takes that name; the
    // Kubernetes API server (and meshfed's in-memory store, which validates names as
    // it does) refuses it: not a DNS-1123 subdomain. The vector runs below with
    // `litnw`. This assertion fails if the upper-case name is ever accepted, so the
    // gap is revisited.
    let upper = fake_proxy("1.2.3.4", &wg_a(), "litNw", "sa-a");
    let err = ig
        .on_connect("upper", upper, ig.now())
        .await
        .expect_err("known gap: an upper-case network makes an invalid entry name");
    assert!(err.to_string().contains("is not a valid name"), "{err}");
    ig.on_disconnect("upper").await;

    let p = Workload {
        locality: "reg1/zone1/subzone1".into(),
        ..fake_proxy("1.2.3.4", &wg_a(), "litnw", "sa-a")
    };
    let t = ig.now();
    ig.on_connect(&conn(&p, t), p.clone(), t).await.unwrap();
    let name = name_of(&wg_a(), &p);
    for (healthy, want) in [(true, "True"), (false, "False")] {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let event = HealthEvent {
            healthy,
            message: if healthy { "" } else { "lol health bad" }.into(),
        };
        ig.on_health(&conn(&p, t), event);
        eventually(Duration::from_secs(1), || {
            match health_of(&f, "a", &name).as_deref() {
                Some(s) if s == want => Ok(()),
                other => Err(format!("health {other:?}, want {want}")),
            }
        })
        .await;
    }
    let entry = f.entry("a", &name).unwrap();
    assert_eq!(
        entry.condition(CONDITION_HEALTHY).unwrap().message,
        "lol health bad"
    );
}

// === TestWorkloadEntryFromGroup ===

#[test]
fn workload_entry_from_group() {
    let mut group = ConfigObject::new(
        "a",
        "wg-a",
        net::WorkloadGroup {
            metadata: Some(net::workload_group::ObjectMeta {
                labels: BTreeMap::from([("foo".to_string(), "bar".to_string())]),
                annotations: BTreeMap::from([("foo".to_string(), "bar".to_string())]),
            }),
            template: Some(net::WorkloadEntry {
                ports: BTreeMap::from([("http".to_string(), 80)]),
                labels: BTreeMap::from([("app".to_string(), "a".to_string())]),
                weight: 1,
                network: "nw0".into(),
                locality: "rgn1/zone1/subzone1".into(),
                service_account: "sa-a".into(),
                ..Default::default()
            }),
            probe: None,
        },
    );
    group.labels = BTreeMap::from([("grouplabel".to_string(), "notonentry".to_string())]);
    let mut proxy = fake_proxy("10.0.0.1", &group, "nw1", "sa");
    proxy
        .labels
        .insert("istio-locality".into(), "rgn2/zone2/subzone2".into());
    proxy.locality = "rgn2/zone2/subzone2".into();
    let got = entry_from_group("test-we", &proxy, &group);
    let want_labels: BTreeMap<String, String> = [("app", "a"), ("foo", "bar"), ("merge", "me")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut want = ConfigObject::new(
        "a",
        "test-we",
        net::WorkloadEntry {
            address: "10.0.0.1".into(),
            ports: BTreeMap::from([("http".to_string(), 80)]),
            labels: want_labels.clone(),
            network: "nw1".into(),
            locality: "rgn2/zone2/subzone2".into(),
            weight: 1,
            service_account: "sa-a".into(),
        },
    );
    want.labels = want_labels;
    want.annotations = BTreeMap::from([
        (ANNOTATION_GROUP.to_string(), "wg-a".to_string()),
        ("foo".to_string(), "bar".to_string()),
    ]);
    // Known gap: Istio also sets the group as the entry's controlling owner reference
    // (README, Differences); this fails once meshfed writes one, so the gap is
    // revisited.
    let written = serde_json::to_value(&got).unwrap();
    assert!(
        written["metadata"]["ownerReferences"].is_null(),
        "known gap closed: drop it from the README and compare the owner reference"
    );
    assert_eq!(got.spec, want.spec);
    assert_eq!(got.labels, want.labels);
    assert_eq!(got.annotations, want.annotations);
    assert_eq!(
        (got.namespace.as_str(), got.name.as_str()),
        ("a", "test-we")
    );
}

// === TestNonAutoregisteredWorkloads_UnsuitableForHealthChecks_WorkloadEntryNotFound ===

#[tokio::test(start_paused = true)]
async fn unsuitable_for_health_checks_workload_entry_not_found() {
    let f = Fixture::new();
    f.create(we_b());
    let c = f.controller("pilot-x", settings());
    let _run = run(&c);
    let mut proxy = health_checked_proxy(&we_b());
    proxy.workload_entry = "non-exisiting-workload-entry".into();
    assert!(c.on_connect("c", proxy, c.now()).await.is_err());
}

// === TestNonAutoregisteredWorkloads_UnsuitableForHealthChecks_ShouldNotBeTreatedAsConnected ===

#[tokio::test(start_paused = true)]
async fn unsuitable_for_health_checks_not_treated_as_connected() {
    let no_annotation = {
        let mut we = we_b();
        we.annotations
            .remove("proxy.istio.io/health-checks-enabled");
        we
    };
    let cases = [
        ("when proxy.Metadata.WorkloadEntry is not set", we_b(), true),
        (
            "when 'proxy.istio.io/health-checks-enabled' annotation is missing",
            no_annotation,
            false,
        ),
    ];
    for (name, we, clear_meta) in cases {
        let f = Fixture::new();
        f.create(we.clone());
        let c = f.controller("pilot-x", settings());
        let _run = run(&c);
        let mut proxy = health_checked_proxy(&we);
        if clear_meta {
            proxy.workload_entry = String::new();
        }
        c.on_connect("c", proxy, c.now()).await.unwrap();
        let wle = f.entry(&we.namespace, &we.name).expect("must exist");
        assert_eq!(
            wle.annotations, we.annotations,
            "{name}: should not have been changed"
        );
    }
}

// === TestNonAutoregisteredWorkloads_SuitableForHealthChecks_ShouldBeTreatedAsConnected ===

#[tokio::test(start_paused = true)]
async fn suitable_for_health_checks_treated_as_connected() {
    for value in ["", "false", "true"] {
        let f = Fixture::new();
        let mut we = we_b();
        we.annotations
            .insert("proxy.istio.io/health-checks-enabled".into(), value.into());
        f.create(we.clone());
        let c = f.controller("pilot-x", settings());
        let _run = run(&c);
        let proxy = health_checked_proxy(&we);
        let now = c.now();
        c.on_connect("c", proxy, now).await.unwrap();
        let wle = f.entry(&we.namespace, &we.name).expect("must exist");
        assert_eq!(
            wle.annotations
                .get(ANNOTATION_CONTROLLER)
                .map(String::as_str),
            Some("pilot-x"),
            "{value:?}"
        );
        assert_eq!(
            wle.annotations.get(ANNOTATION_CONNECTED_AT),
            Some(&format_time(now)),
            "{value:?}"
        );
    }
}

fn check_non_auto_registered(f: &Fixture, we: &ConfigObject, connected_to: &str) {
    let cfg = f.entry(&we.namespace, &we.name).expect("must exist");
    if connected_to.is_empty() {
        assert!(cfg.annotations.contains_key(ANNOTATION_DISCONNECTED_AT));
    } else {
        assert_eq!(
            cfg.annotations
                .get(ANNOTATION_CONTROLLER)
                .map(String::as_str),
            Some(connected_to)
        );
        assert!(cfg.annotations.contains_key(ANNOTATION_CONNECTED_AT));
    }
}

// === TestNonAutoregisteredWorkloads_SuitableForHealthChecks_ShouldSupportLifecycle ===

#[tokio::test(start_paused = true)]
async fn suitable_for_health_checks_lifecycle() {
    let (f, c1, c2) = setup();
    let we = we_b();
    f.create(we.clone());
    let _r1 = run(&c1);
    let _r2 = run(&c2);
    let p = health_checked_proxy(&we);
    let disconnected = || {
        let cfg = f.entry(&we.namespace, &we.name);
        match cfg {
            Some(cfg) if cfg.annotations.contains_key(ANNOTATION_DISCONNECTED_AT) => Ok(()),
            _ => Err("expected disconnection timestamp".to_string()),
        }
    };

    // initial connect
    let mut orig = c1.now();
    c1.on_connect(&conn(&p, orig), p.clone(), orig)
        .await
        .unwrap();
    check_non_auto_registered(&f, &we, "pilot-1");

    // reconnect / same instance: disconnect then connect
    c1.on_disconnect(&conn(&p, orig)).await;
    eventually(Duration::from_secs(1), disconnected).await;
    check_non_auto_registered(&f, &we, "");
    orig = c1.now();
    c1.on_connect(&conn(&p, orig), p.clone(), orig)
        .await
        .unwrap();
    check_non_auto_registered(&f, &we, "pilot-1");

    // reconnect / same instance: connect before disconnect
    let next = orig + Duration::from_millis(10);
    c1.on_connect(&conn(&p, next), p.clone(), next)
        .await
        .unwrap();
    check_non_auto_registered(&f, &we, "pilot-1");
    c1.on_disconnect(&conn(&p, orig)).await;
    check_non_auto_registered(&f, &we, "pilot-1");
    tokio::time::sleep(Duration::from_millis(10)).await;
    orig = next;

    // reconnect / different instance: disconnect then connect
    c1.on_disconnect(&conn(&p, orig)).await;
    eventually(Duration::from_secs(1), disconnected).await;
    check_non_auto_registered(&f, &we, "");
    orig = c2.now();
    c2.on_connect(&conn(&p, orig), p.clone(), orig)
        .await
        .unwrap();
    check_non_auto_registered(&f, &we, "pilot-2");

    // reconnect / different instance: connect before disconnect
    let next = orig + Duration::from_millis(10);
    c2.on_connect(&conn(&p, next), p.clone(), next)
        .await
        .unwrap();
    check_non_auto_registered(&f, &we, "pilot-2");
    c2.on_disconnect(&conn(&p, orig)).await;
    check_non_auto_registered(&f, &we, "pilot-2");
    tokio::time::sleep(Duration::from_millis(10)).await;
    orig = next;

    // disconnect for longer than grace period
    c2.on_health(&conn(&p, orig), HealthEvent::from_error_detail(None));
    eventually(Duration::from_secs(1), || {
        match health_of(&f, &we.namespace, &we.name).as_deref() {
            Some("True") => Ok(()),
            other => Err(format!("health {other:?}")),
        }
    })
    .await;
    c2.on_disconnect(&conn(&p, orig)).await;
    eventually(Duration::from_secs(1), disconnected).await;
    check_non_auto_registered(&f, &we, "");
    eventually(GRACE * 21, || {
        match health_of(&f, &we.namespace, &we.name) {
            None => Ok(()),
            Some(s) => Err(format!("expected no Healthy condition, got {s}")),
        }
    })
    .await;
}

// === TestNonAutoregisteredWorkloads_SuitableForHealthChecks_ShouldUpdateHealthCondition ===

#[tokio::test(start_paused = true)]
async fn suitable_for_health_checks_update_health_condition() {
    let (f, c1, c2) = setup();
    let we = we_b();
    f.create(we.clone());
    let _r1 = run(&c1);
    let _r2 = run(&c2);
    let p = health_checked_proxy(&we);
    let t = c1.now();
    c1.on_connect(&conn(&p, t), p.clone(), t).await.unwrap();
    for (healthy, want) in [(true, "True"), (false, "False")] {
        tokio::time::sleep(Duration::from_millis(1)).await;
        c1.on_health(
            &conn(&p, t),
            HealthEvent {
                healthy,
                message: "lol health bad".into(),
            },
        );
        eventually(Duration::from_secs(1), || {
            match health_of(&f, &we.namespace, &we.name).as_deref() {
                Some(s) if s == want => Ok(()),
                other => Err(format!("health {other:?}, want {want}")),
            }
        })
        .await;
    }
}

// === ours: what the vectors leave out ===

#[test]
fn entry_names_follow_istio() {
    let wg = wg_a();
    let v6 = fake_proxy("2001:db8::1", &wg, "", "sa-a");
    assert_eq!(entry_name(&v6).unwrap().unwrap(), "wg-a-2001-db8--1");
    let nw = fake_proxy("10.0.0.1", &wg, "net-2", "sa-a");
    assert_eq!(entry_name(&nw).unwrap().unwrap(), "wg-a-10.0.0.1-net-2");
    let mut long = nw.clone();
    long.group = "g".repeat(300);
    let name = entry_name(&long).unwrap().unwrap();
    assert_eq!(name.len(), 253);
    assert!(name.ends_with("-10.0.0.1-net-2"));
}

#[tokio::test(start_paused = true)]
async fn a_readiness_probe_enables_health_checks_and_unhealthy_leaves_eds() {
    let (f, c1, _c2) = setup();
    let _r1 = run(&c1);
    let p = Workload {
        readiness_probe: true,
        ..fake_proxy("10.1.0.1", &wg_a(), "", "sa-a")
    };
    let t = c1.now();
    c1.on_connect("c", p.clone(), t).await.unwrap();
    let name = name_of(&wg_a(), &p);
    let entry = f.entry("a", &name).unwrap();
    assert_eq!(
        entry
            .annotations
            .get("proxy.istio.io/health-checks-enabled")
            .map(String::as_str),
        Some("true")
    );
    // Until the agent reports, the entry does not count as healthy (Istio's IsHealthy).
    assert_eq!(
        meshfed_registry::serviceentry::workload_entry_health(&entry),
        meshfed_registry::HealthStatus::Unhealthy
    );
    c1.on_health("c", HealthEvent::from_error_detail(None));
    eventually(Duration::from_secs(1), || {
        let e = f.entry("a", &name).unwrap();
        match meshfed_registry::serviceentry::workload_entry_health(&e) {
            meshfed_registry::HealthStatus::Healthy => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn entries_left_by_stopped_instances_are_swept_after_a_restart() {
    // An entry disconnected long ago by an instance that no longer runs: a fresh
    // controller's first sweep removes it.
    let f = Fixture::new();
    f.create(wg_a());
    let mut stale = entry_from_group(
        "wg-a-10.0.0.9",
        &fake_proxy("10.0.0.9", &wg_a(), "", "sa-a"),
        &wg_a(),
    );
    stale.annotations.insert(
        ANNOTATION_DISCONNECTED_AT.into(),
        format_time(SystemTime::now() - GRACE * 2),
    );
    f.entries.create(stale).await.unwrap();
    let metrics = Arc::new(AutoRegistrationMetrics::default());
    let c = Controller::new(
        "pilot-new",
        f.entries.clone(),
        Groups::new(vec![Arc::new(f.store.clone()) as Arc<dyn ConfigStore>]),
        settings(),
        metrics.clone(),
    );
    let _run = run(&c);
    eventually(GRACE * 11, || match f.entry("a", "wg-a-10.0.0.9") {
        None => Ok(()),
        Some(_) => Err("still there".into()),
    })
    .await;
    assert_eq!(metrics.deletes.get(), 1);
}

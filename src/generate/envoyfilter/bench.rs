//! A measurement (ignored by default) of CDS for sidecars under EnvoyFilters, shaped
//! like `examples/scenarios/istio-reference-envoyfilter.yaml`: 1,000 HTTP services in
//! 10 namespaces, 2,000 sidecars in 40 label groups, 10 mesh-wide EnvoyFilters and
//! 40 selecting one group each. It reports the on-CPU time (the thread's
//! `/proc/thread-self/schedstat`) per CDS answer: without EnvoyFilters, with them on a
//! fresh snapshot, on a snapshot rebuilt from the same config (what every config
//! change does) and again on the same snapshot.
//!
//! ```console
//! $ cargo test --release -p meshfed --lib envoyfilter::bench -- --ignored --nocapture
//! ```
//! `MESHFED_BENCH_PROXIES` sets the number of sidecars (default 2,000).

use std::collections::BTreeSet;

use meshfed_registry::Protocol;
use serde_json::{Value, json};

use crate::generate::lds::tests::{default_mesh, proxy, service, snapshot};
use crate::generate::{GeneratorOptions, Scope, Subscription, generate};
use crate::push::config_index::{Config, ConfigSet};
use crate::push::snapshot::Snapshot;
use crate::xds::TypeUrl;

const GROUP: &str = "load.meshfed.io/group";

/// The thread's time on CPU so far, in nanoseconds.
fn on_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn ef(ns: &str, name: &str, spec: Value) -> Config<meshfed_api::networking::v1alpha3::EnvoyFilter> {
    Config {
        name: name.into(),
        namespace: ns.into(),
        labels: Default::default(),
        annotations: Default::default(),
        creation_time: std::time::UNIX_EPOCH,
        spec: serde_json::from_value(spec).unwrap(),
    }
}

fn lua(k: usize) -> Value {
    json!({"applyTo": "HTTP_FILTER",
        "match": {"context": "SIDECAR_OUTBOUND", "listener": {"filterChain": {"filter": {
            "name": "envoy.filters.network.http_connection_manager",
            "subFilter": {"name": "envoy.filters.http.router"}}}}},
        "patch": {"operation": "INSERT_BEFORE", "value": {"name": format!("lua-{k}"),
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                "default_source_code": {"inline_string": "function envoy_on_request(h) end"}}}}})
}

fn timeout(ms: usize) -> Value {
    json!({"applyTo": "CLUSTER", "match": {"context": "SIDECAR_OUTBOUND"},
        "patch": {"operation": "MERGE", "value": {"connect_timeout": format!("{}.{:03}s", ms / 1000, ms % 1000)}}})
}

fn envoy_filters() -> Vec<Config<meshfed_api::networking::v1alpha3::EnvoyFilter>> {
    let mut out = Vec::new();
    for k in 0..2 {
        out.push(ef(
            "istio-system",
            &format!("mesh-lua-{k}"),
            json!({"configPatches": [lua(k)]}),
        ));
        out.push(ef(
            "istio-system",
            &format!("mesh-timeout-{k}"),
            json!({"configPatches": [timeout(1000 + k)]}),
        ));
        out.push(ef("istio-system", &format!("mesh-rc-{k}"), json!({"configPatches": [{
            "applyTo": "ROUTE_CONFIGURATION", "patch": {"operation": "MERGE", "value": {
                "request_headers_to_add": [{"header": {"key": format!("x-mesh-{k}"), "value": "1"}}]}}}]})));
        out.push(ef("istio-system", &format!("mesh-vh-{k}"), json!({"configPatches": [{
            "applyTo": "VIRTUAL_HOST", "patch": {"operation": "MERGE", "value": {
                "response_headers_to_add": [{"header": {"key": format!("x-vh-{k}"), "value": "1"}}]}}}]})));
        out.push(ef(
            "istio-system",
            &format!("mesh-listener-{k}"),
            json!({"configPatches": [{
            "applyTo": "LISTENER", "patch": {"operation": "MERGE", "value": {
                "per_connection_buffer_limit_bytes": 32768 + k}}}]}),
        ));
    }
    for g in 0..40 {
        out.push(ef(
            &format!("ns{}", g % 10),
            &format!("group-{g}"),
            json!({"workloadSelector": {"labels": {GROUP: format!("g{g}")}},
                "configPatches": [lua(100 + g), timeout(2000 + g)]}),
        ));
    }
    out
}

fn snapshot_with(filters: bool) -> Snapshot {
    let services = (0..1000)
        .map(|i| {
            service(
                &format!("svc-{i}.ns{}.svc.cluster.local", i % 10),
                &format!("ns{}", i % 10),
                &format!("10.{}.{}.{}", 10 + i / 65536, (i / 256) % 256, i % 256),
                &[("http", 8080, Protocol::Http)],
            )
        })
        .collect();
    let set = ConfigSet {
        envoy_filters: if filters { envoy_filters() } else { Vec::new() },
        ..Default::default()
    };
    snapshot(services, set, default_mesh())
}

/// On-CPU microseconds per CDS answer of `proxies` on `snap`, and clusters sent.
fn cds(snap: &Snapshot, proxies: &[crate::model::Proxy]) -> (f64, usize) {
    let all = BTreeSet::new();
    let start = on_cpu_ns();
    let mut sent = 0;
    for p in proxies {
        let sub = Subscription {
            wildcard: true,
            names: &all,
            interned: None,
        };
        sent += generate(
            TypeUrl::Cluster,
            snap,
            p,
            sub,
            Scope::All,
            &GeneratorOptions::default(),
        )
        .len();
    }
    let ns = on_cpu_ns() - start;
    (ns as f64 / 1000.0 / proxies.len() as f64, sent)
}

#[test]
#[ignore = "a measurement: run with --release --ignored --nocapture"]
fn cds_cost_with_50_envoyfilters() {
    let n: usize = std::env::var("MESHFED_BENCH_PROXIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let proxies: Vec<_> = (0..n)
        .map(|i| {
            let ns = format!("ns{}", i % 10);
            proxy(
                &format!(
                    "sidecar~10.200.{}.{}~p{i}.{ns}~{ns}.svc.cluster.local",
                    i / 256,
                    i % 256
                ),
                json!({"app": format!("app-{}", i % 100), GROUP: format!("g{}", i % 40)}),
            )
        })
        .collect();
    let base = snapshot_with(false);
    let (b, clusters) = cds(&base, &proxies);
    let first = snapshot_with(true);
    let (f, patched) = cds(&first, &proxies);
    let (again, _) = cds(&first, &proxies);
    // A config change rebuilds the snapshot (and its EnvoyFilter objects) from the
    // same config.
    let rebuilt = snapshot_with(true);
    let (r, _) = cds(&rebuilt, &proxies);
    println!(
        "CDS on-CPU per answer, {n} sidecars, {} clusters each: no EnvoyFilter {b:.0} us; \
         50 EnvoyFilters: fresh snapshot {f:.0} us, same snapshot again {again:.0} us, \
         rebuilt snapshot {r:.0} us",
        clusters / n
    );
    assert_eq!(clusters, patched);
}

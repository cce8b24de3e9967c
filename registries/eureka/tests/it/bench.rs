//! The figures of BENCHMARKS.md's "Eureka registry: 10,000 instances" (ignored: run
//! in release, see there for the command).

use std::time::Instant;

use meshfed_eureka::fake::{FakeEureka, Instance, Status};
use meshfed_registry::ServiceRegistry;

use crate::support::{Harness, config, key};

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

// One thread, the fake's included: the figures include the fake building its answers
// (timed apart below), and RSS is not blurred by per-thread malloc arenas.
#[tokio::test]
#[ignore = "a benchmark: run it in release (BENCHMARKS.md)"]
async fn ten_thousand_instances_time_to_first_push_and_memory() {
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
            .with_secure_port(8443)
            .with_metadata("version", "v1")
            .with_metadata("zone", "zone-a")
        })
    }));
    // The size of the answer the registry decodes.
    let built = Instant::now();
    let body = eureka.apps_body_len();
    let fake_build = built.elapsed();
    let rss_before = rss_kib("VmRSS:");
    // The fake's own peak: building its 9 MB answer.
    let hwm_before = rss_kib("VmHWM:");
    let started = Instant::now();
    let c = config(&eureka.url());
    let mut h = Harness::start(eureka, c);
    let pushes = h.wait_synced().await;
    let first_push = started.elapsed();
    let rss_synced = rss_kib("VmRSS:");
    assert_eq!(h.registry.services().len(), APPS);
    assert!(!pushes.is_empty());

    // The steady state: one change in the delta window.
    h.eureka.expire_delta();
    h.eureka.set_status("APP-7", "app-7-3", Status::Down);
    let delta_started = Instant::now();
    h.round().await;
    let delta = delta_started.elapsed();
    let st = h.registry.stats();
    assert_eq!(
        st.deltas(),
        1,
        "errors {} last {:?} mismatches {} rounds {}",
        st.errors(),
        st.last_error(),
        st.hash_mismatches(),
        st.rounds()
    );
    // A change the delta window lost: the hash codes differ, everything is fetched.
    h.eureka
        .register(Instance::new("APP-7", "app-7-10", "10.200.0.1", 8080));
    h.eureka.expire_delta();
    let full_started = Instant::now();
    h.round().await;
    let refetch = full_started.elapsed();
    assert_eq!(h.registry.stats().hash_mismatches(), 1);
    assert_eq!(h.endpoints(&key("app-7")).len(), PER_APP + 1);
    println!(
        "10,000 instances / 1,000 applications, /apps body {:.1} MB (the fake builds it in {:?})\n\
         start -> synced (first push handed to the pipeline): {:?}\n\
         RSS before start {} MiB (peak {} MiB), synced {} MiB (+{} MiB), peak {} MiB\n\
         one delta round (one status change): {:?}\n\
         hash mismatch round (delta + full refetch): {:?}",
        body as f64 / 1e6,
        fake_build,
        first_push,
        rss_before / 1024,
        hwm_before / 1024,
        rss_synced / 1024,
        rss_synced.saturating_sub(rss_before) / 1024,
        rss_kib("VmHWM:") / 1024,
        delta,
        refetch,
    );
    h.stop().await;
}

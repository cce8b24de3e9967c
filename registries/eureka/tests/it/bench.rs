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
    let body = eureka.apps_body_len();
    let rss_before = rss_kib("VmRSS:");
    let started = Instant::now();
    let c = config(&eureka.url());
    let mut h = Harness::start(eureka, c);
    let pushes = h.wait_synced().await;
    let first_push = started.elapsed();
    let rss_synced = rss_kib("VmRSS:");
    assert_eq!(h.registry.services().len(), APPS);
    assert!(!pushes.is_empty());

    h.eureka.set_status("APP-7", "app-7-3", Status::Down);
    let delta_started = Instant::now();
    h.round().await;
    let delta = delta_started.elapsed();
    assert_eq!(h.registry.stats().deltas(), 1);
    h.eureka.expire_delta();
    h.eureka
        .register(Instance::new("APP-7", "app-7-10", "10.200.0.1", 8080));
    let full_started = Instant::now();
    h.round().await;
    let refetch = full_started.elapsed();
    assert_eq!(h.registry.stats().hash_mismatches(), 1);
    assert_eq!(h.endpoints(&key("app-7")).len(), PER_APP + 1);
    println!(
        "10,000 instances / 1,000 applications, /apps body {:.1} MB\n\
         start -> synced (first push handed to the pipeline): {:?}\n\
         RSS before start {} MiB, synced {} MiB (+{} MiB), peak {} MiB\n\
         one delta round (one status change): {:?}\n\
         hash mismatch round (delta + full refetch): {:?}",
        body as f64 / 1e6,
        first_push,
        rss_before / 1024,
        rss_synced / 1024,
        rss_synced.saturating_sub(rss_before) / 1024,
        rss_kib("VmHWM:") / 1024,
        delta,
        refetch,
    );
    h.stop().await;
}

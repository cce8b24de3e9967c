//! A large catalog: 10,000 instances in 1,000 services.

use std::time::Instant;

use meshfed_nacos::fake::{FakeNacos, Instance};
use meshfed_nacos::{NacosConfig, Transport};
use meshfed_registry::ServiceRegistry;

use crate::support::*;

/// Registers `services` services of `per_service` instances each.
pub fn fill(nacos: &FakeNacos, services: usize, per_service: usize) {
    for s in 0..services {
        nacos.register_all((0..per_service).map(|i| {
            let ip = format!("10.{}.{}.{}", s / 250, s % 250, i + 1);
            Instance::new(&format!("svc-{s}"), &ip, 8080).with_meta("version", "v1")
        }));
    }
}

/// This process's resident memory (kB), from /proc/self/status.
fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

async fn sync_large(config: NacosConfig, nacos: &FakeNacos) -> std::time::Duration {
    let before = rss_kb();
    let started = Instant::now();
    let mut nacos_registry = Running::start(config);
    nacos_registry.synced().await;
    let took = started.elapsed();
    let registry = nacos_registry.registry.clone();
    assert_eq!(registry.services().len(), 1000);
    let total: usize = registry
        .services()
        .iter()
        .map(|s| registry.endpoints(&s.key()).len())
        .sum();
    assert_eq!(total, 10_000);
    eprintln!(
        "resident memory: {before} kB with the fake Nacos filled, {} kB once synced (+{} kB); \
         {} requests, {} pushes",
        rss_kb(),
        rss_kb().saturating_sub(before),
        nacos.requests().len(),
        nacos.pushes().0
    );
    nacos_registry.stop().await;
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_instances_sync_over_grpc() {
    let nacos = FakeNacos::start().await.unwrap();
    fill(&nacos, 1000, 10);
    let took = sync_large(config(&nacos), &nacos).await;
    eprintln!("nacos gRPC: 10,000 instances in 1,000 services synced in {took:?}");
}

async fn bench(transport: Transport, name: &str) {
    let nacos = FakeNacos::start().await.unwrap();
    fill(&nacos, 1000, 10);
    let mut config = config(&nacos);
    config.transport = transport;
    config.refresh_interval = std::time::Duration::from_secs(30);
    let took = sync_large(config, &nacos).await;
    eprintln!("nacos {name}: 10,000 instances in 1,000 services synced in {took:?}");
}

/// The figures of BENCHMARKS.md ("Nacos registry: 10,000 instances"), one process per
/// transport: `cargo test --release -p meshfed-nacos --features test-support --test it
/// -- --ignored --nocapture large_catalog_bench_grpc` (and `_http`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn large_catalog_bench_grpc() {
    bench(Transport::Grpc, "gRPC").await;
}

/// See [`large_catalog_bench_grpc`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn large_catalog_bench_http() {
    bench(Transport::Http, "HTTP").await;
}

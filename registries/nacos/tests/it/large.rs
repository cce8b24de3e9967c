//! A large catalog: 10,000 instances in 1,000 services.

use std::time::Instant;

use meshfed_nacos::NacosConfig;
use meshfed_nacos::fake::{FakeNacos, Instance};
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

async fn sync_large(config: NacosConfig, nacos: &FakeNacos) -> std::time::Duration {
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
    let _ = nacos;
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

/// `cargo test --release -p meshfed-nacos --test it -- --ignored --nocapture
/// large_catalog_bench`: the figures of BENCHMARKS.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn large_catalog_bench() {
    let nacos = FakeNacos::start().await.unwrap();
    fill(&nacos, 1000, 10);
    let took = sync_large(config(&nacos), &nacos).await;
    eprintln!("nacos gRPC: 10,000 instances in 1,000 services synced in {took:?}");
}

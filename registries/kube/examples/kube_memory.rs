//! Memory held by the Kubernetes registry for 1,000 services and 10,000 pods (one
//! EndpointSlice of 10 endpoints per service, 3 nodes, 10 namespaces).
//!
//! The fake API server runs in a child process (this example started with `--serve`),
//! so the parent's resident memory (`/proc/self/statm`) holds only the registry side.
//! Two figures: growth from "client ready" to "first registry synced" (including what
//! the allocator keeps from decoding the lists), and from there to "a second,
//! identical registry synced" (what a registry really keeps: its compact state, its
//! reader view and the endpoint index it filled).
//!
//! ```text
//! cargo run --release -p meshfed-kube --features test-support --example kube_memory
//! ```

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshfed_kube::fake_api::FakeApiServer;
use meshfed_kube::fake_api::objects::{namespace, node, pod, service, slice};
use meshfed_kube::{KubeRegistry, KubeRegistryConfig, ResourceKind};
use meshfed_registry::{EndpointIndex, RegistryEvent, ServiceRegistry, UpdateSink};

const SERVICES: usize = 1_000;
const PODS_PER_SERVICE: usize = 10;
const NAMESPACES: usize = 10;

/// Resident set size in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm has a resident field");
    pages * 4096
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if std::env::args().nth(1).as_deref() == Some("--serve") {
        runtime.block_on(serve());
        return;
    }
    let mut child = Command::new(std::env::current_exe().expect("own path"))
        .arg("--serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the fake API server process");
    let mut url = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut url)
        .expect("the server prints its URL");
    runtime.block_on(measure(url.trim()));
    drop(child.stdin.take()); // the server exits when its stdin closes
    let _ = child.wait();
}

/// The child: populate a fake API server, print its URL, serve until stdin closes.
async fn serve() {
    let api = FakeApiServer::start().await.expect("fake API server");
    for n in 0..3 {
        api.apply(&node(
            &format!("node-{n}"),
            "region-1",
            &format!("zone-{n}"),
        ));
    }
    for ns in 0..NAMESPACES {
        api.apply(&namespace(&format!("ns-{ns}"), &[]));
    }
    for s in 0..SERVICES {
        let ns = format!("ns-{}", s % NAMESPACES);
        let name = format!("svc-{s}");
        let vip = format!("10.96.{}.{}", s / 250, s % 250 + 1);
        let ports = [("http", 80), ("grpc-api", 9090)];
        api.apply(&service(&ns, &name, &vip, &ports));
        let mut endpoints = Vec::new();
        for p in 0..PODS_PER_SERVICE {
            let i = s * PODS_PER_SERVICE + p;
            let pod_name = format!("{name}-{p}");
            let ip = format!("10.{}.{}.{}", 1 + i / 62_500, (i / 250) % 250, i % 250 + 1);
            api.apply(&pod(&ns, &pod_name, &name, &ip, &format!("node-{}", i % 3)));
            endpoints.push((ip, pod_name));
        }
        let refs: Vec<(&str, &str)> = endpoints
            .iter()
            .map(|(ip, p)| (ip.as_str(), p.as_str()))
            .collect();
        api.apply(&slice(&ns, &format!("{name}-abcde"), &name, &ports, &refs));
    }
    println!("{}", api.url());
    tokio::task::spawn_blocking(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
    })
    .await
    .expect("stdin reader");
}

type Synced = (Arc<KubeRegistry>, Arc<EndpointIndex>, Duration, usize);

async fn sync_one(client: kube::Client) -> Synced {
    let index = Arc::new(EndpointIndex::new());
    let (sink, mut events) = UpdateSink::new(index.clone());
    let started = Instant::now();
    let (registry, _task) = KubeRegistry::start(
        client,
        KubeRegistryConfig::new("Kubernetes"),
        sink,
        std::future::pending(),
    )
    .await
    .expect("registry starts");
    let mut pushes = 0usize;
    loop {
        match events.recv().await.expect("sink open") {
            RegistryEvent::Synced(_) => break,
            RegistryEvent::Push(_) => pushes += 1,
        }
    }
    (registry, index, started.elapsed(), pushes)
}

async fn measure(url: &str) {
    let client = kube::Client::try_from(kube::Config::new(url.parse().expect("server URL")))
        .expect("client");
    let ready = rss();
    let first = sync_one(client.clone()).await;
    let after_first = rss();
    let (registry, index, sync_time, pushes) = sync_one(client).await;
    let after_second = rss();
    drop(first);

    let stats = registry.stats();
    let endpoints: usize = index.snapshot().values().map(|s| s.len()).sum();
    println!(
        "synced in {:.2?}: {} services, {} slices, {} pods, {} nodes, {} namespaces; \
         {} endpoints in the index; {} push requests before Synced",
        sync_time,
        registry.services().len(),
        stats.objects(ResourceKind::EndpointSlice),
        stats.objects(ResourceKind::Pod),
        stats.objects(ResourceKind::Node),
        stats.objects(ResourceKind::Namespace),
        endpoints,
        pushes,
    );
    let pods = (SERVICES * PODS_PER_SERVICE) as f64;
    let kept = after_second.saturating_sub(after_first);
    println!(
        "RSS: {:.1} MiB with the client ready; first registry synced: {:.1} MiB \
         (+{:.1} MiB incl. allocator warm-up); second registry synced: {:.1} MiB \
         (+{:.1} MiB = {:.0} bytes per pod for registry state + endpoint index)",
        mib(ready),
        mib(after_first),
        mib(after_first.saturating_sub(ready)),
        mib(after_second),
        mib(kept),
        kept as f64 / pods,
    );
}

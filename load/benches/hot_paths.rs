//! Micro-benchmarks of the hot paths (issue 9): building a snapshot of 1,000 services,
//! split-horizon EDS for every cluster, and a sidecar's whole config generated, encoded
//! and shared with a second sidecar.
//!
//! ```text
//! cargo bench -p meshfed-load --bench hot_paths [-- FILTER]
//! ```
//!
//! The mesh is the one `meshfed load` serves (1,000 services `svc-<j>.load-<ns>` over
//! 10 namespaces, one HTTP port, 10 endpoints each), built by the load tool's own
//! registry model and loaded through the mock-registry file parser. Results and the
//! machine they were taken on are in `load/benches/README.md`.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, LazyLock};

use divan::Bencher;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use meshfed::generate::{GeneratorOptions, Scope, Subscription, generate, lds};
use meshfed::mesh::{MeshSettings, default_mesh_config};
use meshfed::model::proxy::Proxy;
use meshfed::push::config_index::{ConfigIndex, ConfigSet};
use meshfed::push::snapshot::Snapshot;
use meshfed::testing::node_with;
use meshfed::xds::deps::PushScope;
use meshfed::xds::response::SotwResponse;
use meshfed::xds::{ResourceList, TypeUrl};
use meshfed_api::mesh::v1alpha1::MeshNetworks;
use meshfed_load::lite::ClusterLite;
use meshfed_load::registry::Registry as LoadRegistry;
use meshfed_load::scenario::Scenario;
use meshfed_registry::{
    Aggregate, EndpointIndex, MemoryRegistry, ProviderId, PushRequest, ServiceKey,
    ServiceWithEndpoints, TlsMode, TriggerReason, UpdateSink, parse_mock_registry,
};
use prost::Message;

const SERVICES: usize = 1_000;
const ENDPOINTS_PER_SERVICE: usize = 10;
const NAMESPACES: usize = 10;

fn main() {
    divan::main();
}

// ---------------------------------------------------------------------------------
// Fixtures (built once, outside every measurement).

/// Registries and mesh settings behind a snapshot, and a snapshot whose resource cache
/// is never filled (the base of every "cold" run).
struct Mesh {
    aggregate: Aggregate,
    endpoints: Arc<EndpointIndex>,
    mesh: Arc<MeshSettings>,
    cold: Snapshot,
}

impl Mesh {
    /// The mesh with every service in each of `clusters` (Kubernetes registries, one
    /// per cluster) and each service's endpoints dealt round-robin over them.
    fn new(clusters: &[&str], networks: MeshNetworks) -> Mesh {
        let scenario = Scenario {
            name: "hot-paths".into(),
            services: SERVICES,
            endpoints_per_service: ENDPOINTS_PER_SERVICE,
            namespaces: NAMESPACES,
            ..Scenario::default()
        };
        let file = LoadRegistry::new(&scenario).render();
        let services = parse_mock_registry(Path::new("hot-paths.json"), &file)
            .expect("the load tool's registry parses");
        let endpoints = Arc::new(EndpointIndex::new());
        // Nobody drains the events: the benchmarks build snapshots themselves.
        let (sink, _events) = UpdateSink::new(endpoints.clone());
        let aggregate = Aggregate::new(clusters[0]);
        for (k, cluster) in clusters.iter().enumerate() {
            let registry =
                MemoryRegistry::with_provider(ProviderId::Kubernetes, *cluster, sink.clone());
            registry.replace_all(
                services
                    .iter()
                    .map(|s| ServiceWithEndpoints {
                        service: s.service.clone(),
                        endpoints: s
                            .endpoints
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| i % clusters.len() == k)
                            .map(|(_, e)| {
                                let mut e = e.clone();
                                e.tls_mode = TlsMode::Istio;
                                e
                            })
                            .collect(),
                    })
                    .collect(),
            );
            registry.mark_synced();
            aggregate.add_registry(Arc::new(registry));
        }
        let mesh = Arc::new(MeshSettings {
            config: default_mesh_config(),
            networks,
        });
        let mut m = Mesh {
            aggregate,
            endpoints,
            mesh,
            cold: Snapshot::empty(),
        };
        m.cold = m.build(
            &Snapshot::empty(),
            &PushRequest::forced(TriggerReason::Global),
        );
        assert_eq!(m.cold.services().all().len(), SERVICES);
        m
    }

    /// `Snapshot::build` as the push pipeline calls it.
    fn build(&self, previous: &Snapshot, request: &PushRequest) -> Snapshot {
        Snapshot::build(
            previous,
            &PushScope::new(request),
            &self.aggregate,
            &self.endpoints,
            self.mesh.clone(),
            &|m| ConfigIndex::new(ConfigSet::default(), "cluster.local", m),
            1,
        )
    }

    /// A new snapshot of the same mesh with an empty resource cache, as after an
    /// endpoint-only push (what a cold generation starts from).
    fn fresh(&self) -> Snapshot {
        self.build(&self.cold, &PushRequest::endpoints(&first_service()))
    }
}

fn first_service() -> ServiceKey {
    ServiceKey::new("svc-0.load-0.svc.cluster.local", "load-0")
}

/// One cluster, one flat network.
static FLAT: LazyLock<Mesh> = LazyLock::new(|| Mesh::new(&["cluster-a"], MeshNetworks::default()));

/// Clusters a, b, c on networks a, b, c (meshNetworks `fromRegistry`), each with
/// address gateways (two into network-b): split horizon applies.
static SPLIT: LazyLock<Mesh> = LazyLock::new(|| {
    let networks: MeshNetworks = serde_json::from_value(serde_json::json!({
        "networks": {
            "network-a": {"endpoints": [{"fromRegistry": "cluster-a"}],
                          "gateways": [{"address": "192.0.2.1", "port": 15443}]},
            "network-b": {"endpoints": [{"fromRegistry": "cluster-b"}],
                          "gateways": [{"address": "192.0.2.2", "port": 15443},
                                       {"address": "192.0.2.3", "port": 15443}]},
            "network-c": {"endpoints": [{"fromRegistry": "cluster-c"}],
                          "gateways": [{"address": "192.0.2.4", "port": 15443}]},
        }
    }))
    .expect("meshNetworks");
    let mesh = Mesh::new(&["cluster-a", "cluster-b", "cluster-c"], networks);
    // The fixture does what it says: a remote endpoint reaches network-a's sidecar as
    // its network's gateway.
    let name = BTreeSet::from(["outbound|8080||svc-0.load-0.svc.cluster.local".to_string()]);
    let cla = &load_assignments(&mesh.fresh(), &sidecar(1), &name)[0];
    let cla = ClusterLoadAssignment::decode(cla.body.value.clone()).expect("CLA decodes");
    assert!(
        format!("{cla:?}").contains("192.0.2.2"),
        "split horizon applies"
    );
    mesh
});

/// A sidecar in `load-0`, in cluster-a on network-a, whose IP is the `n`th endpoint of
/// `svc-0` (so it has inbound listeners and clusters too).
fn sidecar(n: u8) -> Proxy {
    let node = node_with(
        &format!("sidecar~172.16.0.{n}~bench-{n}.load-0~load-0.svc.cluster.local"),
        serde_json::json!({"CLUSTER_ID": "cluster-a", "NETWORK": "network-a"}),
    );
    Proxy::from_node(Some(&node)).expect("valid node")
}

/// What a sidecar subscribes to after its first CDS and LDS responses, as Envoy does:
/// CDS and LDS wildcard, EDS for every EDS cluster, RDS for every route table its
/// listeners name.
struct Subscriptions {
    /// Interned as the server holds a connection's names.
    eds: Arc<BTreeSet<String>>,
    rds: BTreeSet<String>,
}

impl Subscriptions {
    fn of(snapshot: &Snapshot, proxy: &Proxy) -> Subscriptions {
        let none = BTreeSet::new();
        let wildcard = Subscription {
            wildcard: true,
            names: &none,
            interned: None,
        };
        let options = GeneratorOptions::default();
        let eds = generate(
            TypeUrl::Cluster,
            snapshot,
            proxy,
            wildcard,
            Scope::All,
            &options,
        )
        .iter()
        .filter_map(|r| {
            let cluster = ClusterLite::decode(r.body.value.clone()).expect("cluster decodes");
            cluster.eds_name().map(str::to_string)
        })
        .collect::<BTreeSet<String>>()
        .into();
        let rds = generate(
            TypeUrl::Listener,
            snapshot,
            proxy,
            wildcard,
            Scope::All,
            &options,
        )
        .iter()
        .flat_map(|r| {
            let listener = Listener::decode(r.body.value.clone()).expect("listener decodes");
            lds::references(&listener).1
        })
        .collect();
        let subs = Subscriptions { eds, rds };
        assert_eq!(subs.eds.len(), SERVICES, "an EDS cluster per service");
        assert!(!subs.rds.is_empty(), "HTTP ports have route tables");
        subs
    }
}

/// The EDS names and RDS names of [`sidecar`]`(1)` on each mesh.
static FLAT_SUBS: LazyLock<Subscriptions> =
    LazyLock::new(|| Subscriptions::of(&FLAT.fresh(), &sidecar(1)));
static SPLIT_SUBS: LazyLock<Subscriptions> =
    LazyLock::new(|| Subscriptions::of(&SPLIT.fresh(), &sidecar(1)));

/// Every load assignment the proxy watches.
fn load_assignments(snapshot: &Snapshot, proxy: &Proxy, names: &BTreeSet<String>) -> ResourceList {
    generate(
        TypeUrl::Endpoint,
        snapshot,
        proxy,
        Subscription {
            wildcard: false,
            names,
            interned: None,
        },
        Scope::All,
        &GeneratorOptions::default(),
    )
}

/// The types a sidecar without DNS capture subscribes to, in push order.
const ENVOY_TYPES: [TypeUrl; 4] = [
    TypeUrl::Cluster,
    TypeUrl::Endpoint,
    TypeUrl::Listener,
    TypeUrl::Route,
];

/// A sidecar's whole config, CDS, EDS, LDS and RDS in push order.
fn sidecar_config(snapshot: &Snapshot, proxy: &Proxy, subs: &Subscriptions) -> [ResourceList; 4] {
    let none = BTreeSet::new();
    ENVOY_TYPES.map(|type_url| {
        let subscription = match type_url {
            TypeUrl::Cluster | TypeUrl::Listener => Subscription {
                wildcard: true,
                names: &none,
                interned: None,
            },
            TypeUrl::Endpoint => Subscription {
                wildcard: false,
                names: &subs.eds,
                interned: Some(&subs.eds),
            },
            TypeUrl::Route | TypeUrl::NameTable => Subscription {
                wildcard: false,
                names: &subs.rds,
                interned: None,
            },
            // Sidecars request no secrets from istiod, nor MCP or ambient types; no
            // WasmPlugin is in the scenario.
            TypeUrl::Secret
            | TypeUrl::Address
            | TypeUrl::Authorization
            | TypeUrl::ExtensionConfig
            | TypeUrl::Mcp(_) => Subscription {
                wildcard: false,
                names: &none,
                interned: None,
            },
        };
        generate(
            type_url,
            snapshot,
            proxy,
            subscription,
            Scope::All,
            &GeneratorOptions::default(),
        )
    })
}

/// The four SotW responses of a config, encoded into one reused buffer as the gRPC
/// codec does; returns the bytes written.
fn encode(version: &str, config: &[ResourceList; 4], buf: &mut Vec<u8>) -> usize {
    let mut total = 0;
    for (type_url, resources) in ENVOY_TYPES.into_iter().zip(config) {
        let response = SotwResponse {
            version_info: version.to_string(),
            resources: resources.clone(),
            type_url: type_url.as_str().to_string(),
            nonce: "1".to_string(),
            control_plane: Default::default(),
        };
        buf.clear();
        response.encode(buf).expect("a Vec grows");
        total += buf.len();
    }
    total
}

// ---------------------------------------------------------------------------------
// Benchmarks.

/// `Snapshot::build` for 1,000 services × 10 endpoints, as the push pipeline runs it.
#[divan::bench_group]
mod snapshot_build {
    use super::*;

    /// A forced full push: merge one cluster's registry, copy the endpoint index,
    /// rebuild the config index; the resource cache starts empty.
    #[divan::bench]
    fn full_1_cluster(bencher: Bencher) {
        let mesh = &*FLAT;
        let request = PushRequest::forced(TriggerReason::Global);
        bencher.bench(|| mesh.build(&mesh.cold, &request));
    }

    /// The same over three clusters' registries (3,000 services merged into 1,000).
    #[divan::bench]
    fn full_3_clusters(bencher: Bencher) {
        let mesh = &*SPLIT;
        let request = PushRequest::forced(TriggerReason::Global);
        bencher.bench(|| mesh.build(&mesh.cold, &request));
    }

    /// An endpoint-only push for one service after a sidecar's config was generated:
    /// the service index is reused and every other cached resource carried over.
    #[divan::bench]
    fn endpoints_only_carry_over(bencher: Bencher) {
        let mesh = &*FLAT;
        let previous = mesh.fresh();
        let _ = sidecar_config(&previous, &sidecar(1), &FLAT_SUBS);
        let request = PushRequest::endpoints(&first_service());
        bencher.bench(|| mesh.build(&previous, &request));
    }
}

/// EDS for the 1,000 clusters a sidecar on network-a watches, with endpoints on
/// networks a, b and c (split horizon: remote endpoints become their gateways).
#[divan::bench_group]
mod eds_split_horizon {
    use super::*;

    /// A fresh snapshot: every assignment generated and encoded.
    #[divan::bench]
    fn cold(bencher: Bencher) {
        let (mesh, names, proxy) = (&*SPLIT, &SPLIT_SUBS.eds, sidecar(1));
        bencher
            .with_inputs(|| mesh.fresh())
            .bench_local_refs(|snapshot| load_assignments(snapshot, &proxy, names));
    }

    /// The cache already holds them (another proxy with the same view asked first).
    #[divan::bench]
    fn warm(bencher: Bencher) {
        let (mesh, names, proxy) = (&*SPLIT, &SPLIT_SUBS.eds, sidecar(1));
        let snapshot = mesh.fresh();
        assert_eq!(load_assignments(&snapshot, &proxy, names).len(), SERVICES);
        bencher.bench(|| load_assignments(&snapshot, &proxy, names));
    }

    /// For comparison: cold on the flat one-cluster mesh (no split horizon).
    #[divan::bench]
    fn cold_flat(bencher: Bencher) {
        let (mesh, names, proxy) = (&*FLAT, &FLAT_SUBS.eds, sidecar(1));
        bencher
            .with_inputs(|| mesh.fresh())
            .bench_local_refs(|snapshot| load_assignments(snapshot, &proxy, names));
    }
}

/// One sidecar's whole config (CDS + EDS + LDS + RDS) over the 1,000-service mesh.
#[divan::bench_group]
mod sidecar_config {
    use super::*;

    /// Generate everything on a fresh snapshot (every resource built and encoded).
    #[divan::bench]
    fn generate_cold(bencher: Bencher) {
        let (mesh, subs, proxy) = (&*FLAT, &*FLAT_SUBS, sidecar(1));
        bencher
            .with_inputs(|| mesh.fresh())
            .bench_local_refs(|snapshot| sidecar_config(snapshot, &proxy, subs));
    }

    /// Generate everything again on the same snapshot: every resource a cache hit.
    #[divan::bench]
    fn generate_warm(bencher: Bencher) {
        let (mesh, subs, proxy) = (&*FLAT, &*FLAT_SUBS, sidecar(1));
        let snapshot = mesh.fresh();
        let _ = sidecar_config(&snapshot, &proxy, subs);
        bencher.bench(|| sidecar_config(&snapshot, &proxy, subs));
    }

    /// Wrap the generated resources in the four SotW responses (sharing their bytes)
    /// and encode them into a reused buffer.
    #[divan::bench]
    fn encode_responses(bencher: Bencher) {
        let (mesh, subs, proxy) = (&*FLAT, &*FLAT_SUBS, sidecar(1));
        let snapshot = mesh.fresh();
        let config = sidecar_config(&snapshot, &proxy, subs);
        let mut buf = Vec::new();
        bencher.bench_local(|| encode(snapshot.version(), &config, &mut buf));
    }

    /// The first sidecar of a push: cold generate, then encode.
    #[divan::bench]
    fn first_proxy(bencher: Bencher) {
        let (mesh, subs, proxy) = (&*FLAT, &*FLAT_SUBS, sidecar(1));
        let mut buf = Vec::new();
        bencher
            .with_inputs(|| mesh.fresh())
            .bench_local_refs(|snapshot| {
                let config = sidecar_config(snapshot, &proxy, subs);
                encode(snapshot.version(), &config, &mut buf)
            });
    }

    /// Each further sidecar of the same namespace and service (another pod IP) on a
    /// snapshot whose cache the first one filled: shared clusters, endpoints and
    /// routes, its own listeners and inbound cluster (they depend on its IP); generate,
    /// then encode.
    #[divan::bench]
    fn share_second_proxy(bencher: Bencher) {
        let (mesh, subs, first, second) = (&*FLAT, &*FLAT_SUBS, sidecar(1), sidecar(2));
        let mut buf = Vec::new();
        bencher
            .with_inputs(|| {
                let snapshot = mesh.fresh();
                let _ = sidecar_config(&snapshot, &first, subs);
                snapshot
            })
            .bench_local_refs(|snapshot| {
                let config = sidecar_config(snapshot, &second, subs);
                encode(snapshot.version(), &config, &mut buf)
            });
    }
}

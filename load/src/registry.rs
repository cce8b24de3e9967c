//! The mock registry the load tool drives: built from a scenario, changed by the churn,
//! and written (atomically) as the YAML file the server follows.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use super::marker::{ROUTE_MARKER, marker_port};
use super::scenario::{Mode, Scenario};

/// The port every endpoint serves on until a change gives it a marker.
pub const TARGET_PORT: u16 = 9080;

/// The first port of every service (HTTP for sidecars, GRPC for proxyless clients).
pub const SERVICE_PORT: u16 = 8080;

/// The second port of a service with `portsPerService: 2` (GRPC).
pub const GRPC_SERVICE_PORT: u16 = 7070;

/// The target port of the second port's endpoints (never changed by the churn: an
/// endpoint change moves the first port's target to a marker port).
pub const GRPC_TARGET_PORT: u16 = 17070;

/// The service whose VirtualService config changes rewrite (the first one, never
/// reserved for removal).
pub const CONFIG_SERVICE: usize = 0;

/// The file config changes rewrite in the server's config directory.
pub const VIRTUAL_SERVICE_FILE: &str = "load-virtual-service.yaml";

/// The file of the namespaces' Sidecars (`sidecarScope: namespace`) in the server's
/// config directory.
pub const SIDECAR_FILE: &str = "load-sidecars.yaml";

/// One kind of change.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// One endpoint of a service got a new port.
    Endpoint,
    /// A service was added.
    ServiceAdd,
    /// A service was removed.
    ServiceRemove,
    /// A VirtualService change: its route gets a new name (needs a server that reads
    /// a config directory, `--configDir`).
    Config,
}

impl ChangeKind {
    /// Every kind, in report order.
    pub const ALL: [ChangeKind; 4] = [
        ChangeKind::Endpoint,
        ChangeKind::ServiceAdd,
        ChangeKind::ServiceRemove,
        ChangeKind::Config,
    ];

    /// Name in tables.
    pub fn label(self) -> &'static str {
        match self {
            ChangeKind::Endpoint => "endpoint",
            ChangeKind::ServiceAdd => "service add",
            ChangeKind::ServiceRemove => "service remove",
            ChangeKind::Config => "config",
        }
    }
}

/// A change as applied to the registry.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// What kind.
    pub kind: ChangeKind,
    /// Index of the service it touched (none for a skipped config change).
    pub service: Option<usize>,
}

#[derive(Clone, Debug)]
struct ServiceModel {
    host: String,
    /// Namespace number (`load-<n>`).
    ns: usize,
    namespace: String,
    vip: Ipv4Addr,
    endpoints: Vec<(Ipv4Addr, u16)>,
    present: bool,
    /// Watched by clients and changed by endpoint churn.
    watchable: bool,
}

/// The registry's current content.
#[derive(Clone, Debug)]
pub struct Registry {
    services: Vec<ServiceModel>,
    namespaces: usize,
    endpoints_per_service: usize,
    ports_per_service: usize,
    mode: Mode,
    next_endpoint: u32,
    added: usize,
    /// Added services not removed yet, oldest first.
    removable_added: std::collections::VecDeque<usize>,
    /// Original services set aside for removal.
    reserved: Vec<usize>,
    /// Services endpoint churn may change.
    changeable: Vec<usize>,
    rng: SplitMix,
}

impl Registry {
    /// The registry a scenario starts with.
    pub fn new(scenario: &Scenario) -> Registry {
        let mut registry = Registry {
            services: Vec::with_capacity(scenario.services + scenario.churn.service_adds),
            namespaces: scenario.namespaces,
            endpoints_per_service: scenario.endpoints_per_service,
            ports_per_service: scenario.ports_per_service,
            mode: scenario.mode,
            next_endpoint: 1,
            added: 0,
            removable_added: Default::default(),
            reserved: Vec::new(),
            changeable: Vec::new(),
            rng: SplitMix(scenario.seed),
        };
        let watchable = scenario.watchable_services();
        for j in 0..scenario.services {
            let host = format!(
                "svc-{j}.{}.svc.cluster.local",
                namespace_name(j % scenario.namespaces)
            );
            let index = registry.push_service(host, j % scenario.namespaces, j < watchable);
            if j < watchable {
                if scenario.endpoints_per_service > 0 {
                    registry.changeable.push(index);
                }
            } else {
                registry.reserved.push(index);
            }
        }
        registry
    }

    fn push_service(&mut self, host: String, namespace: usize, watchable: bool) -> usize {
        let index = self.services.len();
        let endpoints = (0..self.endpoints_per_service)
            .map(|_| {
                let ip =
                    Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 16, 0, 0)) + self.next_endpoint);
                self.next_endpoint += 1;
                (ip, TARGET_PORT)
            })
            .collect();
        let vip_offset = u32::try_from(index).unwrap_or(u32::MAX) + 1;
        self.services.push(ServiceModel {
            host,
            ns: namespace,
            namespace: namespace_name(namespace),
            vip: Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)).wrapping_add(vip_offset)),
            endpoints,
            present: true,
            watchable,
        });
        index
    }

    /// Every service the registry has held, present or removed (indexes are
    /// `0..service_count()`).
    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// Whether the service is in the registry now.
    pub fn is_present(&self, service: usize) -> bool {
        self.services[service].present
    }

    /// Indexes of the services clients may watch (all original ones but the reserved).
    pub fn watchable(&self) -> Vec<usize> {
        (0..self.services.len())
            .filter(|i| self.services[*i].watchable && self.services[*i].present)
            .collect()
    }

    /// Indexes of the services present now.
    pub fn present(&self) -> Vec<usize> {
        (0..self.services.len())
            .filter(|i| self.services[*i].present)
            .collect()
    }

    /// The service's hostname.
    pub fn host(&self, service: usize) -> &str {
        &self.services[service].host
    }

    /// The service's namespace number (`load-<n>`).
    pub fn namespace_of(&self, service: usize) -> usize {
        self.services[service].ns
    }

    /// The CDS (and EDS) name of the service's first port, as Istio names it: the
    /// one endpoint changes show in.
    pub fn cluster_name(&self, service: usize) -> String {
        format!("outbound|{SERVICE_PORT}||{}", self.services[service].host)
    }

    /// The CDS (and EDS) names of every port of the service, the first port's first.
    pub fn cluster_names(&self, service: usize) -> Vec<String> {
        let host = &self.services[service].host;
        [SERVICE_PORT, GRPC_SERVICE_PORT][..self.ports_per_service]
            .iter()
            .map(|port| format!("outbound|{port}||{host}"))
            .collect()
    }

    /// The LDS name a proxyless client asks for.
    pub fn grpc_listener_name(&self, service: usize) -> String {
        format!("{}:{SERVICE_PORT}", self.services[service].host)
    }

    /// The order of the churn: the scenario's changes, shuffled with its seed.
    pub fn plan(&mut self, scenario: &Scenario) -> Vec<ChangeKind> {
        let churn = &scenario.churn;
        let mut plan = Vec::with_capacity(churn.total());
        plan.extend(std::iter::repeat_n(
            ChangeKind::Endpoint,
            churn.endpoint_changes,
        ));
        plan.extend(std::iter::repeat_n(
            ChangeKind::ServiceAdd,
            churn.service_adds,
        ));
        plan.extend(std::iter::repeat_n(
            ChangeKind::ServiceRemove,
            churn.service_removes,
        ));
        plan.extend(std::iter::repeat_n(
            ChangeKind::Config,
            churn.config_changes,
        ));
        for i in (1..plan.len()).rev() {
            let j = self.rng.below(i + 1);
            plan.swap(i, j);
        }
        // A removal must find a service to remove: one drawn before enough additions
        // swaps places with the next addition.
        let mut removable = scenario.reserved_services();
        let mut i = 0;
        while i < plan.len() {
            match plan[i] {
                ChangeKind::ServiceAdd => removable += 1,
                ChangeKind::ServiceRemove if removable == 0 => {
                    let add = (i + 1..plan.len())
                        .find(|j| plan[*j] == ChangeKind::ServiceAdd)
                        .expect("validated: removals never outnumber removable services");
                    plan.swap(i, add);
                    continue;
                }
                ChangeKind::ServiceRemove => removable -= 1,
                _ => {}
            }
            i += 1;
        }
        plan
    }

    /// Applies change number `index` of kind `kind`.
    pub fn apply(&mut self, index: usize, kind: ChangeKind) -> Applied {
        match kind {
            ChangeKind::Endpoint => {
                let service = self.changeable[self.rng.below(self.changeable.len())];
                let endpoints = &mut self.services[service].endpoints;
                let which = self.rng.below(endpoints.len());
                endpoints[which].1 = marker_port(index);
                Applied {
                    kind,
                    service: Some(service),
                }
            }
            ChangeKind::ServiceAdd => {
                let k = self.added;
                self.added += 1;
                let namespace = k % self.namespaces;
                let host = format!(
                    "svc-add-{k}.{}.svc.cluster.local",
                    namespace_name(namespace)
                );
                let service = self.push_service(host, namespace, false);
                self.removable_added.push_back(service);
                Applied {
                    kind,
                    service: Some(service),
                }
            }
            ChangeKind::ServiceRemove => {
                let service = self
                    .removable_added
                    .pop_front()
                    .or_else(|| self.reserved.pop())
                    .expect(
                        "the scenario was validated: removals never outnumber removable services",
                    );
                self.services[service].present = false;
                Applied {
                    kind,
                    service: Some(service),
                }
            }
            // A VirtualService route of the first service is renamed (see
            // `virtual_service`): the routes of every proxy that sees the service change.
            ChangeKind::Config => Applied {
                kind,
                service: Some(CONFIG_SERVICE),
            },
        }
    }

    /// The mock-registry file, as JSON (which is YAML too): it is rewritten whole on
    /// every change, and the server reads a JSON document several times faster.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(
            64 + self.services.len() * (200 + self.endpoints_per_service * 48),
        );
        out.push_str("{\"services\": [");
        let (port_name, protocol) = match self.mode {
            Mode::Sidecar | Mode::Ztunnel => ("http", "HTTP"),
            Mode::Grpc => ("grpc", "GRPC"),
        };
        let mut first = true;
        let mut ports = format!(
            "{{\"name\": \"{port_name}\", \"port\": {SERVICE_PORT}, \"protocol\": \"{protocol}\"}}"
        );
        let mut second_target = String::new();
        if self.ports_per_service > 1 {
            let _ = write!(
                ports,
                ", {{\"name\": \"grpc\", \"port\": {GRPC_SERVICE_PORT}, \"protocol\": \"GRPC\"}}"
            );
            second_target = format!(", \"grpc\": {GRPC_TARGET_PORT}");
        }
        for s in self.services.iter().filter(|s| s.present) {
            if !std::mem::take(&mut first) {
                out.push(',');
            }
            // Hostnames, namespaces and addresses are generated: nothing to escape.
            let _ = write!(
                out,
                "\n{{\"hostname\": \"{}\", \"namespace\": \"{}\", \"addresses\": [\"{}\"], \
                 \"ports\": [{ports}], \"endpoints\": [",
                s.host, s.namespace, s.vip
            );
            for (i, (ip, port)) in s.endpoints.iter().enumerate() {
                let comma = if i == 0 { "" } else { "," };
                let _ = write!(
                    out,
                    "{comma}\n  {{\"address\": \"{ip}\", \"ports\": {{\"{port_name}\": {port}{second_target}}}}}"
                );
            }
            out.push_str("]}");
        }
        out.push_str("\n]}\n");
        out
    }

    /// The VirtualService of the config churn (an Istio config file): one HTTP route
    /// to [`CONFIG_SERVICE`] named after the latest config change (`None`: before any).
    pub fn virtual_service(&self, change: Option<usize>) -> String {
        let s = &self.services[CONFIG_SERVICE];
        let route = match change {
            Some(i) => format!("{ROUTE_MARKER}{i}"),
            None => "load-initial".to_string(),
        };
        format!(
            "# Written by `meshfed load`; rewritten on every config change.\n\
             apiVersion: networking.istio.io/v1\n\
             kind: VirtualService\n\
             metadata:\n  name: load-churn\n  namespace: {ns}\n\
             spec:\n  hosts: [{host}]\n  http:\n  - name: {route}\n    route:\n    \
             - destination: {{host: {host}, port: {{number: {SERVICE_PORT}}}}}\n",
            ns = s.namespace,
            host = s.host,
        )
    }

    /// The Sidecars of `sidecarScope: namespace` (an Istio config file): one per
    /// namespace, named `default`, importing only the namespace's own services.
    pub fn sidecars(&self) -> String {
        let mut out = String::from(
            "# Written by `meshfed load` (sidecarScope: namespace): each sidecar imports only\n\
             # its own namespace's services.\n",
        );
        for ns in 0..self.namespaces {
            let _ = write!(
                out,
                "---\n\
                 apiVersion: networking.istio.io/v1\n\
                 kind: Sidecar\n\
                 metadata:\n  name: default\n  namespace: {}\n\
                 spec:\n  egress:\n  - hosts: [\"./*\"]\n",
                namespace_name(ns)
            );
        }
        out
    }

    /// Writes the file to `path` atomically: a temporary file in the same directory,
    /// then a rename over `path`.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        write_atomically(path, self.render().as_bytes())
    }
}

/// Namespace number `i`.
pub fn namespace_name(i: usize) -> String {
    format!("load-{i}")
}

/// Writes `bytes` to a temporary sibling of `path` and renames it over `path`.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("{}: not a file path", path.display()))?
        .to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// A small deterministic generator (SplitMix64), so runs repeat with the same seed.
#[derive(Clone, Debug)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use meshfed_registry::mock_file::parse_mock_registry;

    use super::*;
    use crate::marker::{marker_change, route_marker_change};
    use crate::scenario::Churn;

    fn scenario() -> Scenario {
        Scenario {
            services: 4,
            endpoints_per_service: 2,
            namespaces: 2,
            churn: Churn {
                rate: 1.0,
                endpoint_changes: 3,
                service_adds: 1,
                service_removes: 2,
                config_changes: 1,
                reconnect_storm: false,
                ..Churn::default()
            },
            ..Scenario::default()
        }
    }

    #[test]
    fn renders_a_file_the_server_accepts() {
        let sc = scenario();
        let mut registry = Registry::new(&sc);
        let text = registry.render();
        let services = parse_mock_registry(Path::new("t.yaml"), &text).unwrap();
        assert_eq!(services.len(), 4);
        assert_eq!(
            services[1].service.hostname.as_str(),
            "svc-1.load-1.svc.cluster.local"
        );
        assert_eq!(services[1].endpoints.len(), 2);
        assert_eq!(
            registry.cluster_name(1),
            "outbound|8080||svc-1.load-1.svc.cluster.local"
        );
        // One service is reserved for the removal that outnumbers the addition.
        assert_eq!(registry.watchable(), vec![0, 1, 2]);

        let plan = registry.plan(&sc);
        assert_eq!(plan.len(), 7);
        let mut applied = Vec::new();
        for (i, kind) in plan.iter().enumerate() {
            applied.push(registry.apply(i, *kind));
        }
        let text = registry.render();
        let services = parse_mock_registry(Path::new("t.yaml"), &text).unwrap();
        assert_eq!(services.len(), 3, "4 + 1 added - 2 removed");
        assert!(
            services
                .iter()
                .all(|s| s.service.hostname.as_str() != "svc-3.load-1.svc.cluster.local"),
            "the reserved service went"
        );
        let markers: Vec<u32> = services
            .iter()
            .flat_map(|s| s.endpoints.iter())
            .flat_map(|e| e.ports.values().copied())
            .filter_map(|p| marker_change(u32::from(p)))
            .collect();
        assert!(!markers.is_empty() && markers.len() <= 3, "{markers:?}");
        for m in markers {
            assert_eq!(plan[m as usize], ChangeKind::Endpoint);
            let service = applied[m as usize].service.unwrap();
            assert!(
                service < 3,
                "endpoint churn only touches watchable services"
            );
        }
    }

    #[test]
    fn two_ports_per_service_give_two_clusters_and_changes_move_the_http_port() {
        let sc = Scenario {
            ports_per_service: 2,
            ..scenario()
        };
        let mut registry = Registry::new(&sc);
        assert_eq!(
            registry.cluster_names(1),
            [
                "outbound|8080||svc-1.load-1.svc.cluster.local",
                "outbound|7070||svc-1.load-1.svc.cluster.local"
            ]
        );
        assert_eq!(registry.cluster_names(1)[0], registry.cluster_name(1));
        let services = parse_mock_registry(Path::new("t.yaml"), &registry.render()).unwrap();
        assert_eq!(services.len(), 4);
        let ports: Vec<(String, u16, String)> = services[0]
            .service
            .ports
            .iter()
            .map(|p| {
                (
                    p.name.to_string(),
                    p.port.get(),
                    format!("{:?}", p.protocol),
                )
            })
            .collect();
        assert_eq!(
            ports,
            [
                ("http".to_string(), 8080, "Http".to_string()),
                ("grpc".to_string(), 7070, "Grpc".to_string())
            ]
        );
        for e in &services[0].endpoints {
            assert_eq!(e.ports.get("http"), Some(&TARGET_PORT));
            assert_eq!(e.ports.get("grpc"), Some(&GRPC_TARGET_PORT));
        }
        // An endpoint change gives one endpoint's HTTP port a marker; its GRPC port stays.
        let applied = registry.apply(0, ChangeKind::Endpoint);
        let services = parse_mock_registry(Path::new("t.yaml"), &registry.render()).unwrap();
        let changed = &services[applied.service.unwrap()];
        let marked: Vec<_> = changed
            .endpoints
            .iter()
            .filter(|e| e.ports.get("http") == Some(&marker_port(0)))
            .collect();
        assert_eq!(marked.len(), 1);
        assert_eq!(marked[0].ports.get("grpc"), Some(&GRPC_TARGET_PORT));
        // One port (the default) renders as before: no GRPC port.
        let one = Registry::new(&scenario());
        assert_eq!(one.cluster_names(0).len(), 1);
        assert!(!one.render().contains("7070"));
    }

    #[test]
    fn removals_always_find_a_service() {
        for seed in 0..200 {
            let sc = Scenario {
                seed,
                services: 3,
                churn: Churn {
                    service_adds: 3,
                    service_removes: 4,
                    ..Churn::default()
                },
                ..Scenario::default()
            };
            let mut registry = Registry::new(&sc);
            let plan = registry.plan(&sc);
            for (i, kind) in plan.iter().enumerate() {
                registry.apply(i, *kind);
            }
            assert_eq!(registry.present().len(), 2, "seed {seed}: 3 + 3 - 4");
        }
    }

    #[test]
    fn plans_repeat_with_the_seed() {
        let sc = scenario();
        let a = Registry::new(&sc).plan(&sc);
        let b = Registry::new(&sc).plan(&sc);
        assert_eq!(a, b);
    }

    #[test]
    fn markers_round_trip() {
        assert_eq!(marker_change(u32::from(marker_port(7))), Some(7));
        assert_eq!(marker_change(u32::from(TARGET_PORT)), None);
        assert_eq!(route_marker_change("load-change-12"), Some(12));
        assert_eq!(route_marker_change("load-initial"), None);
    }

    #[test]
    fn virtual_service_is_yaml_naming_the_change() {
        let registry = Registry::new(&scenario());
        let text = registry.virtual_service(Some(3));
        let v: serde_json::Value = serde_norway::from_str(&text).unwrap();
        assert_eq!(v["kind"], "VirtualService");
        assert_eq!(v["metadata"]["namespace"], "load-0");
        assert_eq!(v["spec"]["hosts"][0], "svc-0.load-0.svc.cluster.local");
        assert_eq!(v["spec"]["http"][0]["name"], "load-change-3");
        assert_eq!(
            v["spec"]["http"][0]["route"][0]["destination"]["port"]["number"],
            8080
        );
    }

    #[test]
    fn sidecars_scope_each_namespace_to_itself() {
        let registry = Registry::new(&scenario());
        assert_eq!(registry.namespace_of(1), 1);
        assert_eq!(registry.namespace_of(2), 0);
        let text = registry.sidecars();
        let docs: Vec<serde_json::Value> = text
            .split("\n---\n")
            .skip(1)
            .map(|doc| serde_norway::from_str(doc).unwrap())
            .collect();
        assert_eq!(docs.len(), 2, "one per namespace: {text}");
        for (ns, doc) in docs.iter().enumerate() {
            assert_eq!(doc["apiVersion"], "networking.istio.io/v1");
            assert_eq!(doc["kind"], "Sidecar");
            assert_eq!(doc["metadata"]["namespace"], format!("load-{ns}"));
            assert_eq!(
                doc["spec"]["egress"],
                serde_json::json!([{"hosts": ["./*"]}])
            );
        }
        // The server's own config parser (what `meshfed validate` runs) takes them.
        let report = meshfed_registry::config::validate_text(Path::new(SIDECAR_FILE), &text);
        assert!(
            report.errors.is_empty() && report.warnings.is_empty(),
            "{report:?}"
        );
        assert_eq!(report.objects.len(), 2, "{report:?}");
    }

    #[test]
    fn atomic_write_replaces_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.yaml");
        write_atomically(&path, b"a").unwrap();
        write_atomically(&path, b"b").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"b");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}

//! A small world standing in for Istio's `ambientTestServer`
//! (`ambientindex_test.go`): namespaces, pods, WorkloadEntries, Services and
//! ServiceEntries in cluster `cluster0`, network `testnetwork`, domain
//! `company.com`, turned into what meshfed's registries present (services with the
//! endpoints their selectors pick, each endpoint carrying its workload object) and
//! built into the Address type. [`World::lookup`] answers as Istio's index `Lookup`
//! does, over meshfed's output: `""` everything, a uid that workload,
//! `network/IP` the services at that VIP with their workloads (else the workloads
//! at that IP), `namespace/hostname` the service with its workloads.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use meshfed_api::mesh::v1alpha1::MeshNetworks;
use meshfed_api::workload as wl;
use meshfed_registry::{
    Endpoint, HealthStatus, Port, Protocol, ProviderId, Resolution, Service, ShardKey,
    WorkloadKind, WorkloadMeta,
};

use meshfed_registry::config::gateway_api::{GatewayClassSpec, GatewaySpec};
use meshfed_registry::config::{ConfigObject, Kind, StatusAddress};

use super::build::{self, AmbientModel};
use super::waypoints::{WaypointInputs, Waypoints};
use crate::networks::NetworkView;

pub(super) const NS: &str = "ns1";
pub(super) const NW: &str = "testnetwork";
pub(super) const CLUSTER: &str = "cluster0";
pub(super) const DOMAIN: &str = "company.com";

pub(super) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A pod or WorkloadEntry.
#[derive(Clone)]
pub(super) struct Obj {
    pub kind: WorkloadKind,
    pub name: String,
    pub ns: String,
    /// Empty: no address.
    pub ip: String,
    pub sa: String,
    pub labels: BTreeMap<String, String>,
    pub ready: bool,
    /// Creation order (kept when the object is updated).
    pub created: u64,
}

/// A Kubernetes Service or a ServiceEntry host.
#[derive(Clone)]
pub(super) struct Svc {
    pub provider: ProviderId,
    /// Object name (the ServiceEntry's, for a ServiceEntry).
    pub name: String,
    pub ns: String,
    pub host: String,
    pub labels: BTreeMap<String, String>,
    /// (name, port, target port).
    pub ports: Vec<(String, u16, u16)>,
    /// Selects pods and WorkloadEntries of its namespace; `None`: inline endpoints.
    pub selector: Option<BTreeMap<String, String>>,
    pub vips: Vec<String>,
    /// Inline ServiceEntry endpoints: (address, port override for every port).
    pub inline: Vec<(String, Option<u16>)>,
    /// Whether a Kubernetes Service selects WorkloadEntries
    /// (`PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES`).
    pub selects_entries: bool,
}

#[derive(Default, Clone)]
pub(super) struct World {
    pub ns_labels: BTreeMap<String, BTreeMap<String, String>>,
    pub objs: Vec<Obj>,
    pub services: Vec<Svc>,
    /// AuthorizationPolicies: (namespace, name, spec YAML).
    pub aps: Vec<(String, String, String)>,
    /// Gateway API Gateways (waypoints) and GatewayClasses.
    pub gateways: Vec<Arc<ConfigObject>>,
    /// `DEFAULT_ALLOW_FROM_WAYPOINT`.
    pub default_allow_from_waypoint: bool,
}

impl World {
    /// An empty world with the `istio-waypoint` GatewayClass (the test server
    /// installs it).
    pub fn new() -> World {
        let mut w = World::default();
        w.waypoint_class(&[]);
        w
    }

    fn upsert(&mut self, mut o: Obj) {
        let same = |x: &Obj| x.kind == o.kind && x.name == o.name && x.ns == o.ns;
        o.created = match self.objs.iter().find(|x| same(x)) {
            Some(old) => old.created,
            None => self.objs.iter().map(|x| x.created + 1).max().unwrap_or(1),
        };
        self.objs.retain(|x| !same(x));
        self.objs.push(o);
    }

    /// `addPods`: a ready, running pod on `node1`.
    pub fn pod(&mut self, ip: &str, name: &str, sa: &str, l: &[(&str, &str)]) -> &mut Self {
        self.upsert(Obj {
            kind: WorkloadKind::Pod,
            name: name.into(),
            ns: NS.into(),
            ip: ip.into(),
            sa: sa.into(),
            labels: labels(l),
            ready: true,
            created: 0,
        });
        self
    }

    /// `addWorkloadEntries`.
    pub fn we(&mut self, ip: &str, name: &str, sa: &str, l: &[(&str, &str)]) -> &mut Self {
        self.upsert(Obj {
            kind: WorkloadKind::WorkloadEntry,
            name: name.into(),
            ns: NS.into(),
            ip: ip.into(),
            sa: sa.into(),
            labels: labels(l),
            ready: true,
            created: 0,
        });
        self
    }

    pub fn delete(&mut self, kind: WorkloadKind, name: &str) -> &mut Self {
        self.objs.retain(|x| !(x.kind == kind && x.name == name));
        self
    }

    /// `addService`: ports named after their number, target port = port.
    pub fn service(
        &mut self,
        name: &str,
        l: &[(&str, &str)],
        ports: &[u16],
        selector: &[(&str, &str)],
        vip: &str,
    ) -> &mut Self {
        self.services.retain(|s| !(s.name == name && s.ns == NS));
        self.services.push(Svc {
            provider: ProviderId::Kubernetes,
            name: name.into(),
            ns: NS.into(),
            host: format!("{name}.{NS}.svc.{DOMAIN}"),
            labels: labels(l),
            ports: ports.iter().map(|p| (p.to_string(), *p, *p)).collect(),
            selector: Some(labels(selector)),
            vips: vec![vip.into()],
            inline: Vec::new(),
            selects_entries: true,
        });
        self
    }

    pub fn delete_service(&mut self, name: &str) -> &mut Self {
        self.services.retain(|s| s.name != name);
        self
    }

    /// `addServiceEntry`: port `http` 80 -> 8080; inline endpoints (port override
    /// 8081) when `ep_addresses` is given, else a workload selector of `l`.
    pub fn service_entry(
        &mut self,
        host: &str,
        addresses: &[&str],
        name: &str,
        ns: &str,
        l: &[(&str, &str)],
        ep_addresses: Option<&[&str]>,
    ) -> &mut Self {
        self.services.retain(|s| !(s.name == name && s.ns == ns));
        self.services.push(Svc {
            provider: ProviderId::External,
            name: name.into(),
            ns: ns.into(),
            host: host.into(),
            labels: labels(l),
            ports: vec![("http".into(), 80, 8080)],
            selector: ep_addresses.is_none().then(|| labels(l)),
            vips: addresses.iter().map(|a| a.to_string()).collect(),
            inline: ep_addresses
                .unwrap_or_default()
                .iter()
                .map(|a| (a.to_string(), Some(8081)))
                .collect(),
            selects_entries: true,
        });
        self
    }

    pub fn delete_service_entry(&mut self, name: &str, ns: &str) -> &mut Self {
        self.services
            .retain(|s| !(s.provider == ProviderId::External && s.name == name && s.ns == ns));
        self
    }

    pub fn ns_label(&mut self, ns: &str, l: &[(&str, &str)]) -> &mut Self {
        self.ns_labels.insert(ns.into(), labels(l));
        self
    }

    /// `addWaypoint`: a waypoint Gateway `name` of class `istio-waypoint` with one
    /// HBONE listener (routes from the same namespace), for `traffic` (an unknown
    /// or empty value: `service`); when `ready`, reporting the IP `ip` and the host
    /// name `<name>.ns1.svc.company.com`.
    pub fn waypoint(&mut self, ip: &str, name: &str, traffic: &str, ready: bool) -> &mut Self {
        let host = format!("{name}.{NS}.svc.{DOMAIN}");
        self.waypoint_at(ip, &host, name, traffic, ready)
    }

    /// `addWaypointSpecificAddress`: [`World::waypoint`] with the status addresses
    /// given (`""`: none of that type).
    pub fn waypoint_at(
        &mut self,
        ip: &str,
        hostname: &str,
        name: &str,
        traffic: &str,
        ready: bool,
    ) -> &mut Self {
        let spec: GatewaySpec = serde_json::from_value(serde_json::json!({
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE",
                "allowedRoutes": {"namespaces": {"from": "Same"}}}],
        }))
        .unwrap();
        let mut o = ConfigObject::new(NS, name, spec);
        let traffic = match traffic {
            "service" | "workload" | "all" | "none" => traffic,
            _ => "service",
        };
        o.labels = labels(&[("istio.io/waypoint-for", traffic)]);
        if ready {
            for (kind, value) in [("IPAddress", ip), ("Hostname", hostname)] {
                if !value.is_empty() {
                    o.status_addresses.push(StatusAddress {
                        kind: kind.into(),
                        value: value.into(),
                    });
                }
            }
        }
        self.gateway_object(o)
    }

    pub fn delete_waypoint(&mut self, name: &str) -> &mut Self {
        self.gateways
            .retain(|g| !(g.kind == Kind::KubernetesGateway && g.name == name));
        self
    }

    /// A Gateway or GatewayClass object, replacing one of the same kind and name.
    pub fn gateway_object(&mut self, o: ConfigObject) -> &mut Self {
        self.gateways
            .retain(|g| !(g.kind == o.kind && g.name == o.name && g.namespace == o.namespace));
        self.gateways.push(Arc::new(o));
        self
    }

    /// The `istio-waypoint` GatewayClass with `annotations` (the test server
    /// installs it without).
    pub fn waypoint_class(&mut self, annotations: &[(&str, &str)]) -> &mut Self {
        let spec: GatewayClassSpec = serde_json::from_value(
            serde_json::json!({"controllerName": "istio.io/mesh-controller"}),
        )
        .unwrap();
        let mut o = ConfigObject::new("", "istio-waypoint", spec);
        o.annotations = labels(annotations);
        self.gateway_object(o)
    }

    pub fn policy(&mut self, ns: &str, name: &str, spec: &str) -> &mut Self {
        self.aps.retain(|(n, m, _)| !(n == ns && m == name));
        self.aps.push((ns.into(), name.into(), spec.into()));
        self
    }

    /// The endpoint the registry gives for `o` behind `svc`.
    fn endpoint(&self, o: &Obj, svc: Option<&Svc>, port_override: Option<u16>) -> Endpoint {
        let mut e = if o.ip.is_empty() {
            Endpoint::without_address()
        } else {
            Endpoint::new(o.ip.parse::<IpAddr>().unwrap())
        };
        for (name, _, target) in svc.iter().flat_map(|s| &s.ports) {
            e = e.with_port(name, port_override.unwrap_or(*target));
        }
        e.labels = o.labels.clone();
        e.cluster_id = CLUSTER.into();
        e.network = NW.into();
        e.health = if o.ready {
            HealthStatus::Healthy
        } else {
            HealthStatus::Unhealthy
        };
        if !o.sa.is_empty() {
            e.service_account = Some(format!("spiffe://cluster.local/ns/{}/sa/{}", o.ns, o.sa));
        }
        // The Kubernetes registry falls back to the namespace's label for pods only.
        let ns_labels = self
            .ns_labels
            .get(&o.ns)
            .filter(|_| o.kind == WorkloadKind::Pod);
        let from = |k: &str| {
            o.labels
                .get(k)
                .or_else(|| ns_labels.and_then(|l| l.get(k)))
                .cloned()
                .unwrap_or_default()
        };
        let uid = match o.kind {
            WorkloadKind::Pod => format!("{CLUSTER}//Pod/{}/{}", o.ns, o.name),
            WorkloadKind::WorkloadEntry => {
                format!(
                    "{CLUSTER}/networking.istio.io/WorkloadEntry/{}/{}",
                    o.ns, o.name
                )
            }
            _ => format!(
                "{CLUSTER}/networking.istio.io/ServiceEntry/{}/{}/{}",
                o.ns, o.name, o.ip
            ),
        };
        e.workload = Some(Arc::new(WorkloadMeta {
            kind: o.kind,
            name: o.name.clone(),
            namespace: o.ns.clone(),
            uid,
            node_name: if o.kind == WorkloadKind::Pod {
                "node1".into()
            } else {
                String::new()
            },
            workload_name: o.name.clone(),
            use_waypoint: from("istio.io/use-waypoint"),
            use_waypoint_namespace: from("istio.io/use-waypoint-namespace"),
            creation_time: (o.created > 0)
                .then(|| std::time::UNIX_EPOCH + std::time::Duration::from_secs(o.created)),
            ..WorkloadMeta::default()
        }));
        e
    }

    /// Services with the endpoints the registries would give them.
    pub fn inputs(&self) -> Vec<(Service, Vec<Endpoint>)> {
        self.services
            .iter()
            .map(|s| {
                let mut svc = Service::new(s.host.as_str(), s.ns.as_str(), s.provider, CLUSTER);
                for (name, port, _) in &s.ports {
                    svc.ports
                        .push(Port::new(name, *port, Protocol::Tcp).unwrap());
                }
                let vips: Vec<IpAddr> = s.vips.iter().map(|v| v.parse().unwrap()).collect();
                if !vips.is_empty() {
                    svc.cluster_vips.insert(CLUSTER.into(), vips);
                }
                svc.labels = s.labels.clone();
                if s.provider == ProviderId::External {
                    svc.resolution = Resolution::ClientSideLb;
                    svc.object_name = s.name.clone();
                }
                let mut eps = Vec::new();
                match &s.selector {
                    Some(sel) => {
                        for o in &self.objs {
                            let kind_ok = o.kind == WorkloadKind::Pod
                                || s.provider == ProviderId::External
                                || s.selects_entries;
                            if o.ns == s.ns
                                && kind_ok
                                && sel.iter().all(|(k, v)| o.labels.get(k) == Some(v))
                            {
                                eps.push(self.endpoint(o, Some(s), None));
                            }
                        }
                    }
                    None => {
                        for (addr, port) in &s.inline {
                            let o = Obj {
                                kind: WorkloadKind::ServiceEntry,
                                name: s.name.clone(),
                                ns: s.ns.clone(),
                                ip: addr.clone(),
                                sa: String::new(),
                                labels: s.labels.clone(),
                                ready: true,
                                created: 0,
                            };
                            eps.push(self.endpoint(&o, Some(s), *port));
                        }
                    }
                }
                (svc, eps)
            })
            .collect()
    }

    /// Every pod and WorkloadEntry as its registry presents it beside the services
    /// (no service ports), with its shard.
    pub fn standalone(&self) -> Vec<(ShardKey, Endpoint)> {
        self.objs
            .iter()
            .filter(|o| !o.ip.is_empty() || o.kind == WorkloadKind::WorkloadEntry)
            .map(|o| {
                let provider = match o.kind {
                    WorkloadKind::Pod => ProviderId::Kubernetes,
                    _ => ProviderId::External,
                };
                (
                    ShardKey::new(provider, CLUSTER),
                    self.endpoint(o, None, None),
                )
            })
            .collect()
    }

    /// The Address type meshfed builds.
    pub fn model(&self) -> AmbientModel {
        let networks: MeshNetworks = serde_json::from_value(serde_json::json!({
            "networks": {NW: {"endpoints": [{"fromRegistry": CLUSTER}], "gateways": []}}
        }))
        .unwrap();
        let view = NetworkView::new(&networks, &[]);
        let inputs = self.inputs();
        let shards: Vec<ShardKey> = inputs
            .iter()
            .map(|(s, _)| ShardKey::new(s.provider, s.cluster_id.clone()))
            .collect();
        let refs: Vec<build::ServiceEndpoints<'_>> = inputs
            .iter()
            .zip(&shards)
            .map(|((s, eps), shard)| (s, eps.iter().map(|e| (shard, e)).collect()))
            .collect();
        let every = self.standalone();
        let standalone: Vec<(&ShardKey, &Endpoint)> = every.iter().map(|(s, e)| (s, e)).collect();
        let waypoints = Waypoints::read(
            &self.gateways,
            WaypointInputs {
                domain: DOMAIN,
                service_exists: &|h| self.services.iter().any(|s| s.host == h),
                network_of: &|ip| build::ip_network(&view, &refs, ip),
                namespaces: Arc::new(self.ns_labels.clone()),
            },
        );
        let mut model = build::build(
            &refs,
            &standalone,
            &view,
            "cluster.local",
            DOMAIN,
            &waypoints,
            None,
        );
        let aps: Vec<(&str, &str, &str)> = self
            .aps
            .iter()
            .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
            .collect();
        let policies = crate::generate::ambient_authz::AmbientPolicies::build(
            &crate::generate::ambient_authz::tests::index(&aps, &[]),
        );
        build::attach_policies(&mut model, &refs, &standalone, &policies);
        if self.default_allow_from_waypoint {
            build::add_implicit_waypoint_policies(
                &mut model,
                &refs,
                &standalone,
                &waypoints,
                "cluster.local",
            );
        }
        model
    }
}

/// One answer of [`World::lookup`].
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // test values, compared whole
pub(super) enum Found {
    W(wl::Workload),
    S(wl::Service),
}

impl Found {
    pub fn name(&self) -> &str {
        match self {
            Found::W(w) => &w.name,
            Found::S(s) => &s.name,
        }
    }
    pub fn workload(&self) -> Option<&wl::Workload> {
        match self {
            Found::W(w) => Some(w),
            Found::S(_) => None,
        }
    }
}

/// `s.podXdsName`.
pub(super) fn pod_uid(name: &str) -> String {
    format!("{CLUSTER}//Pod/{NS}/{name}")
}

/// `s.wleXdsName`.
pub(super) fn we_uid(name: &str) -> String {
    format!("{CLUSTER}/networking.istio.io/WorkloadEntry/{NS}/{name}")
}

/// `s.seIPXdsName`.
pub(super) fn se_uid(name: &str, ip: &str) -> String {
    format!("{CLUSTER}/networking.istio.io/ServiceEntry/{NS}/{name}/{ip}")
}

/// `s.addrXdsName`.
pub(super) fn addr(ip: &str) -> String {
    format!("{NW}/{ip}")
}

/// `s.svcXdsName`.
pub(super) fn svc_key(name: &str) -> String {
    format!("{NS}/{name}.{NS}.svc.{DOMAIN}")
}

impl World {
    /// Istio's index `Lookup(key)` over meshfed's Address type.
    pub fn lookup(&self, key: &str) -> Vec<Found> {
        lookup(&self.model(), key)
    }
}

pub(super) fn lookup(m: &AmbientModel, key: &str) -> Vec<Found> {
    let with_workloads = |svc_key: &str, s: &wl::Service| {
        let mut out = vec![Found::S(s.clone())];
        out.extend(
            m.workloads
                .values()
                .filter(|w| w.services.contains_key(svc_key))
                .map(|w| Found::W(w.clone())),
        );
        out
    };
    if key.is_empty() {
        let mut out: Vec<Found> = m.workloads.values().cloned().map(Found::W).collect();
        out.extend(m.services.values().cloned().map(Found::S));
        return out;
    }
    if let Some(w) = m.workloads.get(key) {
        return vec![Found::W(w.clone())];
    }
    if let Some(s) = m.services.get(key) {
        return with_workloads(key, s);
    }
    let Some((network, ip)) = key.split_once('/') else {
        return Vec::new();
    };
    let Ok(ip) = ip.parse::<IpAddr>() else {
        return Vec::new();
    };
    let bytes = build::ip_bytes(ip);
    let services: Vec<Found> = m
        .services
        .iter()
        .filter(|(_, s)| {
            s.addresses
                .iter()
                .any(|a| a.address == bytes && a.network == network)
        })
        .flat_map(|(k, s)| with_workloads(k, s))
        .collect();
    if !services.is_empty() {
        return services;
    }
    m.workloads
        .values()
        .filter(|w| w.network == network && w.addresses.contains(&bytes))
        .map(|w| Found::W(w.clone()))
        .collect()
}

/// The names found, sorted (`assertAddresses`).
pub(super) fn names(found: &[Found]) -> Vec<String> {
    let mut v: Vec<String> = found.iter().map(|f| f.name().to_string()).collect();
    v.sort();
    v.dedup();
    v
}

/// `assertAddresses(key, names...)`.
pub(super) fn assert_addresses(w: &World, key: &str, want: &[&str]) -> Result<(), String> {
    let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    want.sort();
    super::tests_istio::check(
        &format!("addresses at {key:?}"),
        names(&w.lookup(key)),
        want,
    )
}

/// `assertWorkloads(key, status, names...)`.
pub(super) fn assert_workloads(
    w: &World,
    key: &str,
    status: wl::WorkloadStatus,
    want: &[&str],
) -> Result<(), String> {
    let found: Vec<Found> = w
        .lookup(key)
        .into_iter()
        .filter(|f| f.workload().is_some_and(|w| w.status == status as i32))
        .collect();
    let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    want.sort();
    super::tests_istio::check(
        &format!("{status:?} workloads at {key:?}"),
        names(&found),
        want,
    )
}

/// The waypoint host name of the first workload at `key` (`""`: none).
pub(super) fn workload_waypoint(w: &World, key: &str) -> Result<String, String> {
    let found = w.lookup(key);
    let wl = found
        .iter()
        .find_map(Found::workload)
        .ok_or_else(|| format!("no workload at {key:?}"))?;
    Ok(waypoint_host(wl.waypoint.as_ref()))
}

pub(super) fn waypoint_host(g: Option<&wl::GatewayAddress>) -> String {
    match g.and_then(|g| g.destination.as_ref()) {
        Some(wl::gateway_address::Destination::Hostname(h)) => h.hostname.clone(),
        Some(wl::gateway_address::Destination::Address(a)) => build::ip_of(&a.address)
            .map(|ip| ip.to_string())
            .unwrap_or_default(),
        None => String::new(),
    }
}

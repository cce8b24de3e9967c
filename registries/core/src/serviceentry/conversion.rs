//! The pure conversion of ServiceEntries and WorkloadEntries into services and
//! endpoints (the rules are in the module docs of [`super`]).

use super::*;
use crate::model::{HealthStatus, WorkloadKind, WorkloadMeta};

/// Converts ServiceEntries and WorkloadEntries (objects of other kinds are ignored)
/// into services with their endpoints, one per `(hostname, namespace)`. Pure; see the
/// module docs for the rules.
pub fn convert(
    service_entries: &[Arc<ConfigObject>],
    workload_entries: &[Arc<ConfigObject>],
    config: &ServiceEntryConfig,
) -> BTreeMap<ServiceKey, ServiceWithEndpoints> {
    let mut entries: Vec<(&ConfigObject, &net::ServiceEntry)> = service_entries
        .iter()
        .filter_map(|o| Some((&**o, o.spec.as_service_entry()?)))
        .collect();
    // Creation order; ties (objects from files have no creation time) by name and
    // namespace, as Istio sorts configs. The sort is stable: equal objects from
    // several stores keep the stores' order.
    entries.sort_by(|(a, _), (b, _)| {
        (a.creation_time, &a.name, &a.namespace).cmp(&(b.creation_time, &b.name, &b.namespace))
    });
    let workloads = Workloads::new(workload_entries);

    // Every ServiceEntry's contribution per key, in creation order.
    let mut contributions: BTreeMap<ServiceKey, Vec<ServiceWithEndpoints>> = BTreeMap::new();
    for (obj, se) in entries {
        for host in &se.hosts {
            let service = service_for(obj, se, host, config);
            let endpoints = endpoints_for(obj, se, host, &workloads, config);
            contributions
                .entry(service.key())
                .or_default()
                .push(ServiceWithEndpoints { service, endpoints });
        }
    }
    // Istio allocates over its services sorted by creation time (then host, then
    // namespace); the order decides who keeps its first slot on a collision. Each
    // entry's service takes a slot of its own, as in Istio: entries sharing a host
    // get the address of whichever of their slots comes first.
    let mut order: Vec<&mut Service> = contributions
        .values_mut()
        .flat_map(|parts| parts.iter_mut().map(|p| &mut p.service))
        .collect();
    order.sort_by(|a, b| {
        (a.creation_time, &a.hostname, &a.namespace).cmp(&(
            b.creation_time,
            &b.hostname,
            &b.namespace,
        ))
    });
    auto_allocation::allocate(order);
    contributions
        .into_iter()
        .map(|(key, parts)| (key, merge(parts)))
        .collect()
}

/// Whether a newer entry's ports join the service an older one defines (Istio's
/// `canMergeServices` in its SidecarScope): same resolution, labels and exportTo.
fn can_merge(oldest: &Service, newer: &Service) -> bool {
    oldest.resolution == newer.resolution
        && oldest.labels == newer.labels
        && oldest.export_to == newer.export_to
}

/// One service out of the contributions of several ServiceEntries (oldest first).
fn merge(parts: Vec<ServiceWithEndpoints>) -> ServiceWithEndpoints {
    let mut parts = parts.into_iter();
    let first = parts.next().expect("a key has at least one contribution");
    let mut service = first.service;
    let parts: Vec<ServiceWithEndpoints> = parts.collect();
    // Ports a newer entry adds (by number) join, when the entries can merge.
    for part in &parts {
        if !can_merge(&service, &part.service) {
            continue;
        }
        for port in &part.service.ports {
            if !service.ports.iter().any(|p| p.port == port.port) {
                service.ports.push(port.clone());
            }
        }
    }
    let parts = parts.into_iter();
    let round_robin = service.resolution == Resolution::DnsRoundRobinLb;
    let dns = matches!(
        service.resolution,
        Resolution::DnsLb | Resolution::DnsRoundRobinLb
    );
    // Port names already served (DNS round robin: one contributor per port).
    let mut claimed: BTreeSet<Arc<str>> = BTreeSet::new();
    let mut endpoints = Vec::new();
    for part in std::iter::once(first.endpoints).chain(parts.map(|p| p.endpoints)) {
        let mut ports_here = BTreeSet::new();
        for mut ep in part {
            // Host names only make sense in DNS clusters.
            if ep.hostname.is_some() && !dns {
                continue;
            }
            if round_robin {
                ep.ports.retain(|name, _| !claimed.contains(name));
                ports_here.extend(ep.ports.keys().cloned());
            }
            if !ep.ports.is_empty() {
                endpoints.push(ep);
            }
        }
        claimed.extend(ports_here);
    }
    ServiceWithEndpoints { service, endpoints }
}

/// The service a ServiceEntry declares for `host`.
fn service_for(
    obj: &ConfigObject,
    se: &net::ServiceEntry,
    host: &str,
    config: &ServiceEntryConfig,
) -> Service {
    let mut service = Service::new(
        host,
        obj.namespace.as_str(),
        ProviderId::External,
        config.cluster_id.clone(),
    );
    service.object_name = obj.name.clone();
    // What ztunnel is told each port targets: its `targetPort`, else the port.
    service.target_ports = se
        .ports
        .iter()
        .filter_map(|p| {
            let target = if p.target_port != 0 {
                p.target_port
            } else {
                p.number
            };
            Some((u16::try_from(p.number).ok()?, u16::try_from(target).ok()?))
        })
        .collect();
    service.traffic_distribution = crate::TrafficDistribution::parse(
        None,
        obj.annotations
            .get(crate::TRAFFIC_DISTRIBUTION_ANNOTATION)
            .map(String::as_str),
    );
    service.ports = se
        .ports
        .iter()
        .filter_map(|p| {
            Port::new(
                &p.name,
                u16::try_from(p.number).ok()?,
                Protocol::parse(&p.protocol),
            )
        })
        .collect();
    let mut vips: Vec<IpAddr> = Vec::new();
    let mut cidrs: Vec<String> = Vec::new();
    for a in &se.addresses {
        if let Some(ip) = vip(a) {
            vips.push(ip);
        } else if let Some(range) = cidr(a) {
            cidrs.push(range);
        } else {
            tracing::debug!(
                "ServiceEntry {}/{}: address {a} left out (neither an IP nor a CIDR)",
                obj.namespace,
                obj.name
            );
        }
    }
    if !vips.is_empty() {
        service.cluster_vips.insert(config.cluster_id.clone(), vips);
    }
    if !cidrs.is_empty() {
        service
            .cluster_cidrs
            .insert(config.cluster_id.clone(), cidrs);
    }
    service.resolution = match se.resolution() {
        SeResolution::None => Resolution::Passthrough,
        SeResolution::Static => Resolution::ClientSideLb,
        SeResolution::Dns => Resolution::DnsLb,
        SeResolution::DnsRoundRobin => Resolution::DnsRoundRobinLb,
    };
    service.location = match se.location() {
        Location::MeshExternal => MeshLocation::MeshExternal,
        Location::MeshInternal => MeshLocation::MeshInternal,
    };
    service.labels = obj.labels.clone();
    service.export_to = ExportTo(se.export_to.iter().cloned().collect());
    service.service_accounts = se.subject_alt_names.iter().cloned().collect();
    service.creation_time = obj.creation_time;
    service
}

/// An address as a VIP: an IP, or a CIDR of a single host (`/32`, `/128`).
fn vip(address: &str) -> Option<IpAddr> {
    match address.split_once('/') {
        None => address.parse().ok(),
        Some((ip, bits)) => {
            let ip: IpAddr = ip.parse().ok()?;
            let host_bits = if ip.is_ipv4() { "32" } else { "128" };
            (bits == host_bits).then_some(ip)
        }
    }
}

/// A CIDR address wider than one host, masked: `10.1.2.3/16` is `10.1.0.0/16`.
fn cidr(address: &str) -> Option<String> {
    let (ip, bits) = address.split_once('/')?;
    let ip: IpAddr = ip.parse().ok()?;
    let bits: u8 = bits.parse().ok()?;
    let network = match ip {
        IpAddr::V4(v4) if bits <= 32 => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            IpAddr::from(std::net::Ipv4Addr::from(u32::from(v4) & mask))
        }
        IpAddr::V6(v6) if bits <= 128 => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            IpAddr::from(std::net::Ipv6Addr::from(u128::from(v6) & mask))
        }
        _ => return None,
    };
    Some(format!("{network}/{bits}"))
}

/// The endpoints one ServiceEntry gives its service for `host`.
fn endpoints_for(
    obj: &ConfigObject,
    se: &net::ServiceEntry,
    host: &str,
    workloads: &Workloads<'_>,
    config: &ServiceEntryConfig,
) -> Vec<Endpoint> {
    let dns = matches!(
        se.resolution(),
        SeResolution::Dns | SeResolution::DnsRoundRobin
    );
    let namespace = obj.namespace.as_str();
    if let Some(selector) = &se.workload_selector {
        return workloads
            .selected(namespace, &selector.labels)
            .filter_map(|(name, we, labels, health)| {
                let ep = workload_endpoint(we, labels, namespace, &se.ports, dns, config).map(
                    |mut ep| {
                        ep.workload = Some(Arc::new(entry_workload(
                            WorkloadKind::WorkloadEntry,
                            name,
                            namespace,
                            &ep.labels,
                            config,
                        )));
                        Endpoint { health, ..ep }
                    },
                );
                if ep.is_none() {
                    tracing::debug!(
                        "WorkloadEntry {namespace}/{name} (selected by ServiceEntry {namespace}/{}): address {:?} left out",
                        obj.name,
                        we.address
                    );
                }
                ep
            })
            .collect();
    }
    if !se.endpoints.is_empty() {
        return se
            .endpoints
            .iter()
            .filter_map(|we| {
                let mut ep =
                    workload_endpoint(we, we.labels.clone(), namespace, &se.ports, dns, config)?;
                // Istio names an inline endpoint after its ServiceEntry and address.
                let name = format!("{}/{}", obj.name, we.address);
                let mut meta = entry_workload(
                    WorkloadKind::ServiceEntry,
                    &name,
                    namespace,
                    &ep.labels,
                    config,
                );
                meta.name = obj.name.to_string();
                meta.workload_name = obj.name.to_string();
                ep.workload = Some(Arc::new(meta));
                Some(ep)
            })
            .collect();
    }
    if dns {
        let mut ep = Endpoint::for_hostname(host);
        ep.cluster_id = config.cluster_id.clone();
        ep.ports = service_port_targets(&se.ports, &BTreeMap::new());
        return vec![ep];
    }
    Vec::new()
}

/// Every WorkloadEntry as a workload of its own, selected by a service or not: an
/// endpoint with no service ports carrying its workload record (what the ambient
/// Address type sends for it). Entries with a host-name or `unix://` address are left
/// out; one with a host name is a workload of that host name.
pub fn entry_workloads(
    workload_entries: &[Arc<ConfigObject>],
    config: &ServiceEntryConfig,
) -> Vec<Endpoint> {
    let workloads = Workloads::new(workload_entries);
    let mut out = Vec::new();
    for (namespace, entries) in &workloads.by_namespace {
        for (name, we, labels, health) in entries {
            let Some(mut ep) = workload_endpoint(we, labels.clone(), namespace, &[], true, config)
            else {
                continue;
            };
            ep.workload = Some(Arc::new(entry_workload(
                WorkloadKind::WorkloadEntry,
                name,
                namespace,
                &ep.labels,
                config,
            )));
            ep.health = *health;
            out.push(ep);
        }
    }
    out
}

/// The workload record of a WorkloadEntry (selected or inline) named `name`.
fn entry_workload(
    kind: WorkloadKind,
    name: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    config: &ServiceEntryConfig,
) -> WorkloadMeta {
    let group = match kind {
        WorkloadKind::ServiceEntry => "ServiceEntry",
        _ => "WorkloadEntry",
    };
    let label = |k: &str| labels.get(k).cloned().unwrap_or_default();
    WorkloadMeta {
        kind,
        name: name.to_string(),
        namespace: namespace.to_string(),
        uid: format!(
            "{}/networking.istio.io/{group}/{namespace}/{name}",
            config.cluster_id
        ),
        workload_name: name.to_string(),
        dataplane_mode: label("istio.io/dataplane-mode"),
        use_waypoint: label("istio.io/use-waypoint"),
        use_waypoint_namespace: label("istio.io/use-waypoint-namespace"),
        ..WorkloadMeta::default()
    }
}

/// Service port name -> the workload's port: the workload's own `ports[name]`, else
/// the port's `targetPort`, else the port number.
fn service_port_targets(
    ports: &[net::ServicePort],
    workload_ports: &BTreeMap<String, u32>,
) -> BTreeMap<Arc<str>, u16> {
    ports
        .iter()
        .filter_map(|p| {
            let target = workload_ports
                .get(&p.name)
                .copied()
                .filter(|&n| n != 0)
                .or((p.target_port != 0).then_some(p.target_port))
                .unwrap_or(p.number);
            Some((Arc::from(p.name.as_str()), u16::try_from(target).ok()?))
        })
        .collect()
}

/// A WorkloadEntry spec (inline or selected, with its effective `labels`) as an
/// endpoint of a service with `ports`; `None` when it cannot be served (a host name
/// outside a DNS service, a unix socket). An entry without an address becomes an
/// endpoint without one ([`Endpoint::without_address`]).
fn workload_endpoint(
    we: &net::WorkloadEntry,
    labels: BTreeMap<String, String>,
    namespace: &str,
    ports: &[net::ServicePort],
    dns: bool,
    config: &ServiceEntryConfig,
) -> Option<Endpoint> {
    let mut ep = match we.address.parse::<IpAddr>() {
        Ok(ip) => Endpoint::new(ip),
        // Reachable only through its network's gateway (validation requires a
        // network); split-horizon EDS sends it as that gateway to other networks.
        Err(_) if we.address.is_empty() => Endpoint::without_address(),
        Err(_) if we.address.starts_with("unix://") => return None,
        Err(_) if dns => Endpoint::for_hostname(we.address.as_str()),
        Err(_) => return None,
    };
    ep.ports = service_port_targets(ports, &we.ports);
    ep.network = NetworkId::new(if we.network.is_empty() {
        labels.get(LABEL_NETWORK).map_or("", String::as_str)
    } else {
        we.network.as_str()
    });
    ep.locality = if !we.locality.is_empty() {
        Locality::parse(&we.locality)
    } else if let Some(l) = labels.get(LABEL_LOCALITY) {
        Locality::parse(l)
    } else if let Some(l) = labels.get(LABEL_LOCALITY_LEGACY) {
        Locality::parse(&l.replace('.', "/"))
    } else {
        Locality::default()
    };
    ep.cluster_id = config.cluster_id.clone();
    ep.weight = we.weight.max(1);
    if !we.service_account.is_empty() {
        ep.service_account = Some(format!(
            "spiffe://{}/ns/{namespace}/sa/{}",
            config.trust_domain, we.service_account
        ));
    }
    ep.tls_mode = match labels.get(LABEL_TLS_MODE) {
        Some(mode) if mode == TlsMode::Istio.as_str() => TlsMode::Istio,
        Some(_) => TlsMode::Disabled,
        None if ep.service_account.is_some() => TlsMode::Istio,
        None => TlsMode::Disabled,
    };
    ep.labels = labels;
    Some(ep)
}

/// WorkloadEntries by namespace, each with its effective labels, sorted by name.
struct Workloads<'a> {
    by_namespace: BTreeMap<&'a str, Vec<(&'a str, &'a net::WorkloadEntry, Labels, HealthStatus)>>,
}

type Labels = BTreeMap<String, String>;

impl<'a> Workloads<'a> {
    fn new(objects: &'a [Arc<ConfigObject>]) -> Workloads<'a> {
        let mut by_namespace: BTreeMap<&str, Vec<_>> = BTreeMap::new();
        for obj in objects {
            let Some(we) = obj.spec.as_workload_entry() else {
                continue;
            };
            // Spec labels, with the object's own labels on top.
            let mut labels = we.labels.clone();
            labels.extend(obj.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            by_namespace
                .entry(obj.namespace.as_str())
                .or_default()
                .push((obj.name.as_str(), we, labels, workload_entry_health(obj)));
        }
        for list in by_namespace.values_mut() {
            list.sort_by_key(|(name, _, _, _)| *name);
        }
        Workloads { by_namespace }
    }

    /// The entries of `namespace` whose labels include every selector label.
    fn selected<'s>(
        &'s self,
        namespace: &str,
        selector: &'s BTreeMap<String, String>,
    ) -> impl Iterator<Item = (&'a str, &'a net::WorkloadEntry, Labels, HealthStatus)> + 's {
        self.by_namespace
            .get(namespace)
            .into_iter()
            .flatten()
            .filter(|(_, _, labels, _)| selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
            .map(|(name, we, labels, health)| (*name, *we, labels.clone(), *health))
    }
}

use crate::workload_instances::workload_entry_health;

#[cfg(test)]
mod health_tests {
    use super::*;
    use crate::config::{Condition, Decoded, decode};
    use crate::workload_instances::ANNOTATION_HEALTH_CHECKS;

    fn entry(annotation: Option<&str>, healthy: Option<&str>) -> Arc<ConfigObject> {
        let mut obj = ConfigObject::new(
            "vm",
            "billing-10.9.0.5",
            net::WorkloadEntry {
                address: "10.9.0.5".into(),
                labels: [("app".to_string(), "billing".to_string())].into(),
                ..Default::default()
            },
        );
        if let Some(value) = annotation {
            obj.annotations
                .insert(ANNOTATION_HEALTH_CHECKS.into(), value.into());
        }
        if let Some(status) = healthy {
            obj.conditions.push(Condition {
                kind: "Healthy".into(),
                status: status.into(),
                reason: String::new(),
                message: String::new(),
                last_probe_time: None,
                last_transition_time: None,
            });
        }
        Arc::new(obj)
    }

    /// A ServiceEntry's services carry its object name, each port's target (its
    /// `targetPort`, else the port) and the traffic-distribution annotation.
    #[test]
    fn services_carry_the_entry_name_target_ports_and_traffic_distribution() {
        let mut obj = ConfigObject::new(
            "ns",
            "payments",
            net::ServiceEntry {
                hosts: vec!["a.example.com".into()],
                ports: vec![
                    net::ServicePort {
                        number: 80,
                        name: "http".into(),
                        target_port: 8080,
                        ..Default::default()
                    },
                    net::ServicePort {
                        number: 443,
                        name: "https".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            },
        );
        obj.annotations.insert(
            crate::TRAFFIC_DISTRIBUTION_ANNOTATION.into(),
            "PreferSameNode".into(),
        );
        let se = match &obj.spec {
            crate::config::Spec::ServiceEntry(se) => se.clone(),
            _ => unreachable!(),
        };
        let s = service_for(
            &obj,
            &se,
            "a.example.com",
            &ServiceEntryConfig {
                cluster_id: "c1".into(),
                trust_domain: "cluster.local".into(),
            },
        );
        assert_eq!(s.object_name, "payments");
        assert_eq!(s.target_ports, BTreeMap::from([(80, 8080), (443, 443)]));
        assert_eq!(
            s.traffic_distribution,
            crate::TrafficDistribution::PreferSameNode
        );
    }

    #[test]
    fn health_checked_entries_follow_their_healthy_condition() {
        let se = Arc::new(ConfigObject::new(
            "vm",
            "billing",
            net::ServiceEntry {
                hosts: vec!["billing.vm.internal".into()],
                ports: vec![net::ServicePort {
                    number: 8080,
                    name: "http".into(),
                    protocol: "HTTP".into(),
                    ..Default::default()
                }],
                resolution: SeResolution::Static as i32,
                workload_selector: Some(net::WorkloadSelector {
                    labels: [("app".to_string(), "billing".to_string())].into(),
                }),
                ..Default::default()
            },
        ));
        let config = ServiceEntryConfig {
            cluster_id: "c1".into(),
            trust_domain: "cluster.local".into(),
        };
        for (annotation, condition, want) in [
            (None, None, HealthStatus::Healthy),
            (None, Some("False"), HealthStatus::Healthy),
            (Some("false"), Some("False"), HealthStatus::Healthy),
            (Some("true"), None, HealthStatus::Unhealthy),
            (Some("true"), Some("False"), HealthStatus::Unhealthy),
            (Some("true"), Some("True"), HealthStatus::Healthy),
        ] {
            let we = entry(annotation, condition);
            assert_eq!(
                workload_entry_health(&we),
                want,
                "{annotation:?} {condition:?}"
            );
            let all = convert(std::slice::from_ref(&se), &[we], &config);
            let svc = all
                .get(&crate::model::ServiceKey::new("billing.vm.internal", "vm"))
                .unwrap();
            assert_eq!(
                svc.endpoints[0].health, want,
                "{annotation:?} {condition:?}"
            );
        }
    }

    #[test]
    fn status_conditions_are_decoded_and_count_as_content() {
        let value = serde_json::json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "WorkloadEntry",
            "metadata": {"name": "e", "namespace": "vm"},
            "spec": {"address": "10.9.0.5"},
            "status": {"conditions": [
                {"type": "Healthy", "status": "False", "message": "probe failed",
                 "lastProbeTime": "2026-01-02T03:04:05.123456789Z"},
                {"status": "True"}
            ]}
        });
        let Decoded::Object(obj) = decode(&value, "test") else {
            panic!("not decoded");
        };
        let healthy = obj.condition("Healthy").expect("decoded");
        assert_eq!(
            (healthy.status.as_str(), healthy.message.as_str()),
            ("False", "probe failed")
        );
        assert!(healthy.last_probe_time.is_some());
        assert_eq!(
            obj.conditions.len(),
            1,
            "a condition without a type is left out"
        );
        let mut changed = obj.clone();
        changed.conditions[0].status = "True".into();
        assert!(!changed.same_content(&obj));
        // Written back in the Kubernetes form.
        let back = serde_json::to_value(&obj).unwrap();
        assert_eq!(
            back["status"]["conditions"][0]["lastProbeTime"],
            "2026-01-02T03:04:05.123456789Z"
        );
    }
}

//! ServiceEntry, WorkloadEntry and WorkloadGroup validation (Istio's
//! `ValidateServiceEntry`, `validateWorkloadEntry`, `ValidateWorkloadGroup`; reference
//! §4.5).
//!
//! Difference from Istio: a wildcard host is rejected with DNS and DNS_ROUND_ROBIN
//! resolution even when endpoints are given (Envoy cannot resolve a wildcard, and the
//! endpoints would be served for every matching name); Istio only rejects it when there
//! are no endpoints.

use std::collections::BTreeSet;

use meshfed_api::networking::v1alpha3 as net;
use net::service_entry::Resolution;

use super::common::{
    UNIX_PREFIX, is_ip, is_wildcard_host, partial_wildcard, validate_export_to, validate_fqdn,
    validate_header_name, validate_ip_subnet, validate_labels, validate_port, validate_port_name,
    validate_protocol, validate_selector_labels, validate_unix_address, validate_wildcard_domain,
};
use super::{FieldPath, Findings, Validation};
use crate::model::Protocol;

/// Validates a ServiceEntry spec in `namespace`.
pub fn validate_service_entry(namespace: &str, se: &net::ServiceEntry) -> Validation {
    let mut f = Findings::new();
    let spec = FieldPath::spec();
    let resolution = se.resolution();

    if let Some(selector) = &se.workload_selector {
        validate_selector_labels(
            &mut f,
            &spec.field("workloadSelector").field("labels"),
            &selector.labels,
            "service entry: will be applied to all services in namespace",
        );
        if !se.endpoints.is_empty() {
            f.error(
                &spec.field("workloadSelector"),
                "only one of WorkloadSelector or Endpoints is allowed in Service Entry",
            );
        }
    }

    validate_hosts(&mut f, se, resolution);

    let mut cidr_found = false;
    for (i, address) in se.addresses.iter().enumerate() {
        cidr_found |= address.contains('/');
        f.check(
            &spec.field("addresses").index(i),
            validate_ip_subnet(address),
        );
    }
    if cidr_found && !matches!(resolution, Resolution::None | Resolution::Static) {
        f.error(
            &spec.field("addresses"),
            "CIDR addresses are allowed only for NONE/STATIC resolution types",
        );
    }

    let service_ports = validate_ports(&mut f, se, resolution);

    let endpoints = spec.field("endpoints");
    match resolution {
        Resolution::None => {
            if !se.endpoints.is_empty() {
                f.error(
                    &endpoints,
                    "no endpoints should be provided for resolution type none",
                );
            }
            if se.workload_selector.is_some() {
                f.warn(
                    &spec.field("workloadSelector"),
                    "workloadSelector should not be set when resolution mode is NONE",
                );
            }
        }
        Resolution::Static => {
            for (i, endpoint) in se.endpoints.iter().enumerate() {
                check_workload_entry(
                    &mut f,
                    &endpoints.index(i),
                    endpoint,
                    Some(&service_ports),
                    false,
                );
            }
        }
        Resolution::Dns | Resolution::DnsRoundRobin => {
            let name = resolution.as_str_name();
            if se.endpoints.is_empty() {
                for (i, host) in se.hosts.iter().enumerate() {
                    if validate_fqdn(host).is_err() && !is_wildcard_host(host) {
                        f.error(
                            &spec.field("hosts").index(i),
                            format!(
                                "hosts must be FQDN if no endpoints are provided for resolution mode {name}"
                            ),
                        );
                    }
                }
            }
            if resolution == Resolution::DnsRoundRobin && se.endpoints.len() > 1 {
                f.error(
                    &endpoints,
                    format!("there must only be 0 or 1 endpoint for resolution mode {name}"),
                );
            }
            for (i, endpoint) in se.endpoints.iter().enumerate() {
                let at = endpoints.index(i);
                if !is_ip(&endpoint.address) && validate_fqdn(&endpoint.address).is_err() {
                    f.error(
                        &at.field("address"),
                        format!(
                            "endpoint address {:?} is not a valid FQDN or an IP address",
                            endpoint.address
                        ),
                    );
                }
                validate_labels(&mut f, &at.field("labels"), &endpoint.labels);
                check_endpoint_ports(&mut f, &at, endpoint, Some(&service_ports));
            }
            if se.workload_selector.is_some() {
                f.warn(
                    &spec.field("workloadSelector"),
                    format!("workloadSelector should not be set when resolution mode is {name}"),
                );
            }
        }
    }

    // Plain TCP cannot tell several hosts apart (HTTP has the authority, TLS the SNI),
    // unless the hosts are ignored (NONE).
    if resolution != Resolution::None && se.hosts.len() > 1 {
        let opaque = se.ports.iter().position(|p| {
            let protocol = Protocol::parse(&p.protocol);
            !protocol.is_http() && !matches!(protocol, Protocol::Https | Protocol::Tls)
        });
        if let Some(i) = opaque {
            f.error(
                &spec.field("ports").index(i).field("protocol"),
                "multiple hosts provided with non-HTTP, non-TLS ports",
            );
        }
    }

    validate_export_to(
        &mut f,
        &spec.field("exportTo"),
        namespace,
        &se.export_to,
        true,
    );
    f.finish()
}

fn validate_hosts(f: &mut Findings, se: &net::ServiceEntry, resolution: Resolution) {
    let at = FieldPath::spec().field("hosts");
    if se.hosts.is_empty() {
        f.error(&at, "service entry must have at least one host");
    }
    for (i, host) in se.hosts.iter().enumerate() {
        let here = at.index(i);
        if host == "*" {
            f.error(&here, format!("invalid host {host}"));
            continue;
        }
        f.check(&here, validate_wildcard_domain(host));
        if let Some(warning) = partial_wildcard(host) {
            f.warn(&here, warning);
        }
        if is_wildcard_host(host)
            && matches!(resolution, Resolution::Dns | Resolution::DnsRoundRobin)
        {
            f.error(
                &here,
                format!(
                    "wildcard host {host:?} is not allowed with resolution {}: a wildcard cannot be resolved; \
                     use resolution NONE",
                    resolution.as_str_name()
                ),
            );
        }
    }
}

/// Port names and numbers: valid and unique. Returns the set of port names.
fn validate_ports<'a>(
    f: &mut Findings,
    se: &'a net::ServiceEntry,
    resolution: Resolution,
) -> BTreeSet<&'a str> {
    let at = FieldPath::spec().field("ports");
    let mut names = BTreeSet::new();
    let mut numbers = BTreeSet::new();
    for (i, port) in se.ports.iter().enumerate() {
        let here = at.index(i);
        if !names.insert(port.name.as_str()) {
            f.error(
                &here.field("name"),
                format!("service entry port name {:?} already defined", port.name),
            );
        }
        if !numbers.insert(port.number) {
            f.error(
                &here.field("number"),
                format!("service entry port {} already defined", port.number),
            );
        }
        if port.target_port != 0 {
            f.check(&here.field("targetPort"), validate_port(port.target_port));
            if resolution == Resolution::None {
                f.warn(
                    &here.field("targetPort"),
                    "targetPort has no effect when resolution mode is NONE",
                );
            }
        }
        if se.addresses.is_empty() && (port.protocol.is_empty() || port.protocol == "TCP") {
            f.warn(
                &here.field("protocol"),
                "addresses are required for ports serving TCP (or unset) protocol when ISTIO_META_DNS_AUTO_ALLOCATE \
                 is not set on a proxy",
            );
        }
        f.check(&here.field("name"), validate_port_name(&port.name));
        f.check(&here.field("protocol"), validate_protocol(&port.protocol));
        f.check(&here.field("number"), validate_port(port.number));
    }
    names
}

/// Endpoint `ports`: valid names that name a service port, valid numbers.
fn check_endpoint_ports(
    f: &mut Findings,
    at: &FieldPath,
    we: &net::WorkloadEntry,
    service_ports: Option<&BTreeSet<&str>>,
) {
    for (name, number) in &we.ports {
        let here = at.field("ports").key(name);
        if let Some(ports) = service_ports
            && !ports.contains(name.as_str())
        {
            let known: Vec<&str> = ports.iter().copied().collect();
            f.error(
                &here,
                format!(
                    "endpoint port {name:?} is not defined by the service entry (its ports: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            );
        }
        f.check(&here, validate_port_name(name));
        f.check(&here, validate_port(*number));
    }
}

/// A workload entry, standalone or inline in a ServiceEntry (`service_ports` set).
fn check_workload_entry(
    f: &mut Findings,
    at: &FieldPath,
    we: &net::WorkloadEntry,
    service_ports: Option<&BTreeSet<&str>>,
    allow_fqdn: bool,
) {
    let address = at.field("address");
    if we.address.is_empty() {
        if we.network.is_empty() {
            f.error(&address, "address is required");
            return;
        }
        f.warn(
            &address,
            format!(
                "address is unset with network {:?}: clients of other networks reach it \
                 through that network's gateway, no client reaches it directly, and it \
                 gets no traffic while the network has no gateway (see /debug/configz \
                 unplacedWorkloads)",
                we.network
            ),
        );
    }
    let unix = we.address.starts_with(UNIX_PREFIX);
    if let Some(path) = we.address.strip_prefix(UNIX_PREFIX) {
        f.check(&address, validate_unix_address(path));
        if !we.ports.is_empty() {
            f.error(
                &at.field("ports"),
                format!("unix endpoint {} must not include ports", we.address),
            );
        }
    } else if !we.address.is_empty() && !is_ip(&we.address) {
        if !allow_fqdn {
            f.error(
                &address,
                format!(
                    "endpoint address {:?} is not a valid IP address (resolution STATIC needs IPs or unix:// addresses)",
                    we.address
                ),
            );
        } else if validate_fqdn(&we.address).is_err() {
            f.error(
                &address,
                format!(
                    "endpoint address {:?} is not a valid FQDN or an IP address",
                    we.address
                ),
            );
        }
    }
    check_endpoint_ports(f, at, we, service_ports);
    validate_labels(f, &at.field("labels"), &we.labels);
    if unix && service_ports.is_some_and(|p| p.len() != 1) {
        f.error(
            &address,
            "exactly 1 service port required for unix endpoints",
        );
    }
}

/// Validates a WorkloadEntry spec: an address (IP, host name or `unix://` path), valid
/// port names and numbers, valid labels.
pub fn validate_workload_entry(we: &net::WorkloadEntry) -> Validation {
    let mut f = Findings::new();
    check_workload_entry(&mut f, &FieldPath::spec(), we, None, true);
    f.finish()
}

/// Validates a WorkloadGroup spec (Istio's `ValidateWorkloadGroup`): the template is
/// required and its address left empty (registration fills it in), its labels and
/// ports are valid, so are the metadata labels, and the probe (if any) has exactly one
/// method, valid ports, non-negative timings, an HTTP or HTTPS scheme, valid header
/// names and a command for `exec`.
pub fn validate_workload_group(wg: &net::WorkloadGroup) -> Validation {
    let mut f = Findings::new();
    let spec = FieldPath::spec();
    if let Some(meta) = &wg.metadata {
        validate_labels(
            &mut f,
            &spec.field("metadata").field("labels"),
            &meta.labels,
        );
    }
    let at = spec.field("template");
    match &wg.template {
        None => f.error(&at, "template is required"),
        // Istio does not validate the template as a WorkloadEntry (its address is
        // filled in per workload when one registers), so what would make a registered
        // workload invalid is a warning here, not a rejection.
        Some(template) => {
            if !template.address.is_empty() {
                f.warn(
                    &at.field("address"),
                    "ignored: each workload that registers from this group gets its own address",
                );
            }
            let mut inner = Findings::new();
            check_endpoint_ports(&mut inner, &at, template, None);
            validate_labels(&mut inner, &at.field("labels"), &template.labels);
            for e in inner.into_errors() {
                f.warn(
                    &e.field,
                    format!(
                        "{}; a workload registering from this template would be rejected",
                        e.reason
                    ),
                );
            }
        }
    }
    if let Some(probe) = &wg.probe {
        check_readiness_probe(&mut f, &spec.field("probe"), probe);
    }
    f.finish()
}

/// Istio's `validateReadinessProbe`, with the gRPC method checked like the others.
fn check_readiness_probe(f: &mut Findings, at: &FieldPath, probe: &net::ReadinessProbe) {
    use net::readiness_probe::HealthCheckMethod;
    for (field, value) in [
        ("periodSeconds", probe.period_seconds),
        ("initialDelaySeconds", probe.initial_delay_seconds),
        ("timeoutSeconds", probe.timeout_seconds),
        ("successThreshold", probe.success_threshold),
        ("failureThreshold", probe.failure_threshold),
    ] {
        if value < 0 {
            f.error(&at.field(field), format!("{field} must be non-negative"));
        }
    }
    match &probe.health_check_method {
        None => f.error(
            at,
            "a probe needs exactly one of httpGet, tcpSocket, exec or grpc",
        ),
        Some(HealthCheckMethod::HttpGet(http)) => {
            let at = at.field("httpGet");
            f.check(&at.field("port"), validate_port(http.port));
            if !http.scheme.is_empty() && http.scheme != "HTTP" && http.scheme != "HTTPS" {
                f.error(
                    &at.field("scheme"),
                    "httpGet.scheme must be one of \"HTTPS\", \"HTTP\"",
                );
            }
            for (i, header) in http.http_headers.iter().enumerate() {
                let here = at.field("httpHeaders").index(i).field("name");
                f.check(&here, validate_header_name(&header.name));
            }
        }
        Some(HealthCheckMethod::TcpSocket(tcp)) => {
            f.check(
                &at.field("tcpSocket").field("port"),
                validate_port(tcp.port),
            );
        }
        Some(HealthCheckMethod::Exec(exec)) => {
            if exec.command.is_empty() {
                f.error(
                    &at.field("exec").field("command"),
                    "exec.command is required",
                );
            }
        }
        Some(HealthCheckMethod::Grpc(grpc)) => {
            f.check(&at.field("grpc").field("port"), validate_port(grpc.port));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{assert_error, assert_ok, assert_warning, spec};
    use super::*;

    fn check(yaml: &str) -> Validation {
        validate_service_entry("default", &spec::<net::ServiceEntry>(yaml))
    }

    fn we(yaml: &str) -> Validation {
        validate_workload_entry(&spec::<net::WorkloadEntry>(yaml))
    }

    #[test]
    fn valid_service_entries_pass() {
        for yaml in [
            "hosts: [api.example.com]\nports: [{number: 443, name: https, protocol: TLS}]\nresolution: DNS\nlocation: MESH_EXTERNAL",
            "hosts: [db.internal]\naddresses: [10.1.0.0/16]\nports: [{number: 5432, name: pg, protocol: TCP}]\nresolution: STATIC\nendpoints: [{address: 10.1.0.1, ports: {pg: 15432}}, {address: \"unix:///var/run/pg.sock\"}]",
            "hosts: [\"*.example.com\"]\nports: [{number: 80, name: http, protocol: HTTP}]\nresolution: NONE",
            "hosts: [vm.mesh]\naddresses: [10.9.0.1]\nports: [{number: 80, name: http, protocol: HTTP}]\nresolution: STATIC\nworkloadSelector: {labels: {app: vm}}",
            "hosts: [a.example.com]\nports: [{number: 80, name: http, protocol: HTTP}]\nresolution: DNS_ROUND_ROBIN\nendpoints: [{address: lb.example.com}]",
        ] {
            let warnings = assert_ok(&check(yaml));
            assert!(warnings.is_empty(), "{yaml}: {warnings:?}");
        }
    }

    #[test]
    fn hosts() {
        assert_error(
            &check("resolution: NONE"),
            "spec.hosts",
            "at least one host",
        );
        assert_error(&check("hosts: [\"*\"]"), "spec.hosts[0]", "invalid host *");
        assert_error(&check("hosts: [\"a b\"]"), "spec.hosts[0]", "invalid");
        assert_error(
            &check(
                "hosts: [\"*.example.com\"]\nresolution: DNS\nports: [{number: 80, name: http, protocol: HTTP}]",
            ),
            "spec.hosts[0]",
            "not allowed with resolution DNS",
        );
        assert_error(
            &check(
                "hosts: [\"*.example.com\"]\nresolution: DNS_ROUND_ROBIN\nports: [{number: 80, name: http, protocol: HTTP}]",
            ),
            "spec.hosts[0]",
            "not allowed with resolution DNS_ROUND_ROBIN",
        );
        assert_error(
            &check(
                "hosts: [a.example.com, b.example.com]\naddresses: [10.0.0.1]\nresolution: DNS\nports: [{number: 9000, name: tcp, protocol: TCP}]",
            ),
            "spec.ports[0].protocol",
            "multiple hosts provided with non-HTTP, non-TLS ports",
        );
    }

    #[test]
    fn selector_and_endpoints_exclude_each_other() {
        assert_error(
            &check(
                "hosts: [a.mesh]\naddresses: [10.0.0.1]\nresolution: STATIC\nworkloadSelector: {labels: {app: a}}\nendpoints: [{address: 10.0.0.2}]",
            ),
            "spec.workloadSelector",
            "only one of WorkloadSelector or Endpoints",
        );
        assert_error(
            &check("hosts: [a.mesh]\nresolution: STATIC\nworkloadSelector: {labels: {\"*\": a}}"),
            "spec.workloadSelector.labels[*]",
            "wildcard is not supported",
        );
        assert_warning(
            &check(
                "hosts: [a.mesh]\naddresses: [10.0.0.1]\nresolution: NONE\nports: [{number: 80, name: http, protocol: HTTP}]\nworkloadSelector: {labels: {app: a}}",
            ),
            "spec.workloadSelector",
            "should not be set when resolution mode is NONE",
        );
    }

    #[test]
    fn resolution_rules() {
        let http = "ports: [{number: 80, name: http, protocol: HTTP}]";
        assert_error(
            &check(&format!(
                "hosts: [a.mesh]\nresolution: NONE\n{http}\nendpoints: [{{address: 10.0.0.1}}]"
            )),
            "spec.endpoints",
            "no endpoints should be provided for resolution type none",
        );
        assert_error(
            &check(&format!(
                "hosts: [a.mesh]\nresolution: STATIC\n{http}\nendpoints: [{{address: a.example.com}}]"
            )),
            "spec.endpoints[0].address",
            "not a valid IP address",
        );
        assert_error(
            &check(&format!(
                "hosts: [a.mesh]\nresolution: STATIC\n{http}\nendpoints: [{{address: \"unix://relative\"}}]"
            )),
            "spec.endpoints[0].address",
            "not an absolute path",
        );
        assert_error(
            &check(&format!(
                "hosts: [a.mesh]\nresolution: DNS_ROUND_ROBIN\n{http}\nendpoints: [{{address: a.example.com}}, {{address: b.example.com}}]"
            )),
            "spec.endpoints",
            "only be 0 or 1 endpoint",
        );
        assert_error(
            &check(&format!(
                "hosts: [a.mesh]\nresolution: DNS\n{http}\nendpoints: [{{address: \"not a host\"}}]"
            )),
            "spec.endpoints[0].address",
            "not a valid FQDN or an IP address",
        );
        assert_error(
            &check(&format!(
                "hosts: [a.mesh]\nresolution: STATIC\n{http}\nendpoints: [{{address: 10.0.0.1, ports: {{grpc: 9000}}}}]"
            )),
            "spec.endpoints[0].ports[grpc]",
            "not defined by the service entry (its ports: http)",
        );
        assert_error(
            &check(&format!(
                "hosts: [a.mesh]\nresolution: DNS\n{http}\nendpoints: [{{address: b.example.com, ports: {{grpc: 9000}}}}]"
            )),
            "spec.endpoints[0].ports[grpc]",
            "not defined by the service entry",
        );
        assert_error(
            &check(&format!(
                "hosts: [a.mesh]\nresolution: STATIC\n{http}\nendpoints: [{{address: 10.0.0.1, ports: {{http: 0}}}}]"
            )),
            "spec.endpoints[0].ports[http]",
            "1..65535",
        );
    }

    #[test]
    fn addresses_and_ports() {
        assert_error(
            &check("hosts: [a.mesh]\naddresses: [a.example.com]\nresolution: NONE"),
            "spec.addresses[0]",
            "not a valid IP",
        );
        assert_error(
            &check(
                "hosts: [a.mesh]\naddresses: [10.0.0.0/8]\nresolution: DNS\nports: [{number: 80, name: http, protocol: HTTP}]",
            ),
            "spec.addresses",
            "CIDR addresses are allowed only for NONE/STATIC",
        );
        let two_ports = |a: &str, b: &str| {
            check(&format!(
                "hosts: [a.mesh]\naddresses: [10.0.0.1]\nresolution: NONE\nports: [{a}, {b}]"
            ))
        };
        assert_error(
            &two_ports(
                "{number: 80, name: http, protocol: HTTP}",
                "{number: 81, name: http, protocol: HTTP}",
            ),
            "spec.ports[1].name",
            "already defined",
        );
        assert_error(
            &two_ports(
                "{number: 80, name: http, protocol: HTTP}",
                "{number: 80, name: web, protocol: HTTP}",
            ),
            "spec.ports[1].number",
            "already defined",
        );
        assert_error(
            &two_ports(
                "{number: 80, name: Bad_Name, protocol: HTTP}",
                "{number: 81, name: web, protocol: HTTP}",
            ),
            "spec.ports[0].name",
            "invalid port name",
        );
        assert_error(
            &two_ports(
                "{number: 80, name: http, protocol: HTTPZ}",
                "{number: 81, name: web, protocol: HTTP}",
            ),
            "spec.ports[0].protocol",
            "unsupported protocol",
        );
        assert_error(
            &two_ports(
                "{number: 70000, name: http, protocol: HTTP}",
                "{number: 81, name: web, protocol: HTTP}",
            ),
            "spec.ports[0].number",
            "1..65535",
        );
        assert_warning(
            &check(
                "hosts: [a.mesh]\nresolution: NONE\nports: [{number: 9000, name: tcp, protocol: TCP}]",
            ),
            "spec.ports[0].protocol",
            "addresses are required",
        );
        assert_error(
            &check("hosts: [a.mesh]\nresolution: NONE\nexportTo: [\"~\", \"*\"]"),
            "spec.exportTo",
            "no one (~) and someone",
        );
    }

    #[test]
    fn workload_entries() {
        assert_ok(&we(
            "address: 10.0.0.1\nports: {http: 8080}\nlabels: {app: a}\nweight: 3",
        ));
        assert_ok(&we("address: vm1.example.com"));
        assert_ok(&we("address: \"unix:///var/run/app.sock\""));
        assert_error(
            &we("ports: {http: 80}"),
            "spec.address",
            "address is required",
        );
        assert_warning(&we("network: n2"), "spec.address", "unset with network");
        assert_error(
            &we("address: \"not an address\""),
            "spec.address",
            "not a valid FQDN or an IP",
        );
        assert_error(
            &we("address: \"unix:///var/run/app.sock\"\nports: {http: 80}"),
            "spec.ports",
            "must not include ports",
        );
        assert_error(
            &we("address: 10.0.0.1\nports: {http: 70000}"),
            "spec.ports[http]",
            "1..65535",
        );
        assert_error(
            &we("address: 10.0.0.1\nports: {Bad_Name: 80}"),
            "spec.ports[Bad_Name]",
            "invalid port name",
        );
        assert_error(
            &we("address: 10.0.0.1\nlabels: {app: \"a b\"}"),
            "spec.labels[app]",
            "invalid label value",
        );
    }

    fn wg(yaml: &str) -> Validation {
        validate_workload_group(&spec::<net::WorkloadGroup>(yaml))
    }

    /// Istio's TestValidateWorkloadGroup (pkg/config/validation): name, spec, valid.
    /// None of its cases expects a warning. "probe nil" (a method whose message is
    /// unset) reads from YAML as an empty method, which is invalid the same way.
    #[test]
    fn istio_workload_group_vectors() {
        let cases = [
            ("valid", "template: {}", true),
            (
                "invalid",
                "template: {}\nmetadata: {labels: {\".\": \"~\"}}",
                false,
            ),
            ("probe missing method", "template: {}\nprobe: {}", false),
            ("probe nil", "template: {}\nprobe: {httpGet: {}}", false),
            (
                "probe http empty",
                "template: {}\nprobe: {httpGet: {}}",
                false,
            ),
            (
                "probe http valid",
                "template: {}\nprobe: {httpGet: {port: 5}}",
                true,
            ),
            (
                "probe tcp invalid",
                "template: {}\nprobe: {tcpSocket: {}}",
                false,
            ),
            (
                "probe tcp valid",
                "template: {}\nprobe: {tcpSocket: {port: 5}}",
                true,
            ),
            (
                "probe exec invalid",
                "template: {}\nprobe: {exec: {}}",
                false,
            ),
            (
                "probe exec valid",
                "template: {}\nprobe: {exec: {command: [foo, bar]}}",
                true,
            ),
        ];
        for (name, yaml, valid) in cases {
            match wg(yaml) {
                Ok(warnings) => {
                    assert!(valid, "{name}: accepted, Istio rejects it");
                    assert!(warnings.is_empty(), "{name}: {warnings:?}");
                }
                Err(errors) => assert!(!valid, "{name}: rejected: {errors:?}"),
            }
        }
    }

    #[test]
    fn workload_groups() {
        for yaml in [
            "template: {ports: {http: 8080}, labels: {app: vm}, serviceAccount: vm}",
            "metadata: {labels: {app: vm}, annotations: {a: b}}\ntemplate: {network: vm-net}\nprobe: {periodSeconds: 5, httpGet: {port: 8080, path: /ready, scheme: HTTPS, httpHeaders: [{name: x-probe, value: '1'}]}}",
            "template: {}\nprobe: {tcpSocket: {port: 9000}}",
            "template: {}\nprobe: {exec: {command: [/bin/true]}}",
            "template: {}\nprobe: {grpc: {port: 9000, service: health}}",
        ] {
            let warnings = assert_ok(&wg(yaml));
            assert!(warnings.is_empty(), "{yaml}: {warnings:?}");
        }
        assert_error(
            &wg("probe: {tcpSocket: {port: 1}}"),
            "spec.template",
            "template is required",
        );
        for (yaml, field, text) in [
            (
                "template: {address: 10.0.0.1}",
                "spec.template.address",
                "ignored",
            ),
            (
                "template: {ports: {http: 0}}",
                "spec.template.ports[http]",
                "port number 0",
            ),
            (
                "template: {ports: {\"bad name\": 80}}",
                "spec.template.ports[bad name]",
                "would be rejected",
            ),
            (
                "template: {labels: {\"a b\": x}}",
                "spec.template.labels[a b]",
                "would be rejected",
            ),
        ] {
            let warnings = assert_ok(&wg(yaml));
            assert!(
                warnings
                    .iter()
                    .any(|w| w.field.to_string() == field && w.message.contains(text)),
                "{yaml}: {warnings:?}"
            );
        }
        assert_error(
            &wg("metadata: {labels: {\"a b\": x}}\ntemplate: {}"),
            "spec.metadata.labels[a b]",
            "",
        );
        assert_error(
            &wg("template: {}\nprobe: {periodSeconds: 5}"),
            "spec.probe",
            "exactly one of",
        );
        assert_error(
            &wg("template: {}\nprobe: {timeoutSeconds: -1, tcpSocket: {port: 80}}"),
            "spec.probe.timeoutSeconds",
            "timeoutSeconds must be non-negative",
        );
        assert_error(
            &wg("template: {}\nprobe: {httpGet: {path: /}}"),
            "spec.probe.httpGet.port",
            "port number 0",
        );
        assert_error(
            &wg("template: {}\nprobe: {httpGet: {port: 80, scheme: FTP}}"),
            "spec.probe.httpGet.scheme",
            "must be one of",
        );
        assert_error(
            &wg("template: {}\nprobe: {httpGet: {port: 80, httpHeaders: [{name: \"a b\"}]}}"),
            "spec.probe.httpGet.httpHeaders[0].name",
            "not a valid header name",
        );
        assert_error(
            &wg("template: {}\nprobe: {exec: {}}"),
            "spec.probe.exec.command",
            "exec.command is required",
        );
        assert_error(
            &wg("template: {}\nprobe: {grpc: {port: 70000}}"),
            "spec.probe.grpc.port",
            "port number 70000",
        );
    }
}

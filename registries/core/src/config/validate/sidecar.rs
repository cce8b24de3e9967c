//! Sidecar validation (Istio's `ValidateSidecar`).
//!
//! A Sidecar must configure something: egress listeners, ingress listeners, an outbound
//! traffic policy or an inbound connection pool (an empty Sidecar is an error, as in
//! Istio).

use std::collections::{BTreeMap, BTreeSet};

use meshfed_api::networking::v1alpha3 as net;
use net::CaptureMode;
use net::outbound_traffic_policy::Mode;
use net::server_tls_settings::TlSmode;

use super::common::{
    UNIX_PREFIX, validate_fqdn, validate_ip, validate_port, validate_port_name, validate_protocol,
    validate_selector_labels, validate_unix_address,
};
use super::destination_rule::validate_connection_pool;
use super::gateway::{validate_namespace_slash_host, validate_server_tls};
use super::{FieldPath, Findings, Validation};
use crate::model::Protocol;

/// Validates a Sidecar spec in `namespace`.
pub fn validate_sidecar(namespace: &str, sidecar: &net::Sidecar) -> Validation {
    let mut f = Findings::new();
    let spec = FieldPath::spec();
    if let Some(selector) = &sidecar.workload_selector {
        validate_selector_labels(
            &mut f,
            &spec.field("workloadSelector").field("labels"),
            &selector.labels,
            "sidecar: will be applied to all services in namespace",
        );
    }
    if sidecar.egress.is_empty()
        && sidecar.ingress.is_empty()
        && sidecar.outbound_traffic_policy.is_none()
        && sidecar.inbound_connection_pool.is_none()
    {
        f.error(
            &spec,
            "sidecar: empty configuration provided (set egress, ingress, outboundTrafficPolicy or \
             inboundConnectionPool)",
        );
        return f.finish();
    }

    let mut ingress_ports = BTreeSet::new();
    for (i, ingress) in sidecar.ingress.iter().enumerate() {
        validate_ingress(
            &mut f,
            &spec.field("ingress").index(i),
            ingress,
            &mut ingress_ports,
        );
    }
    if let Some(pool) = &sidecar.inbound_connection_pool {
        validate_connection_pool(&mut f, &spec.field("inboundConnectionPool"), pool);
    }

    let mut egress_ports = BTreeSet::new();
    let mut unix_binds = BTreeSet::new();
    let mut catch_all_seen = false;
    let last = sidecar.egress.len().saturating_sub(1);
    for (i, egress) in sidecar.egress.iter().enumerate() {
        let at = spec.field("egress").index(i);
        match &egress.port {
            None => {
                if catch_all_seen {
                    f.error(
                        &at.field("port"),
                        "sidecar: egress can have only one listener with empty port",
                    );
                    continue;
                }
                if i == last {
                    catch_all_seen = true;
                } else {
                    f.error(
                        &at.field("port"),
                        "sidecar: the egress listener with empty port should be the last listener in the list",
                    );
                }
            }
            Some(port) => {
                let here = at.field("port");
                if port.target_port > 0 {
                    f.error(
                        &here.field("targetPort"),
                        "targetPort has no impact on Sidecars",
                    );
                }
                validate_egress_port(&mut f, &at, port, &egress.bind, egress.capture_mode());
                if port.number == 0 {
                    if !unix_binds.insert(egress.bind.as_str()) {
                        f.error(
                            &at.field("bind"),
                            "sidecar: unix domain socket values for listeners must be unique",
                        );
                    }
                } else if !egress_ports.insert(port.number) {
                    f.error(
                        &here.field("number"),
                        "sidecar: ports on IP bound listeners must be unique",
                    );
                }
            }
        }
        validate_egress_hosts(&mut f, &at.field("hosts"), namespace, &egress.hosts);
    }

    if let Some(policy) = &sidecar.outbound_traffic_policy {
        validate_outbound_policy(&mut f, &spec.field("outboundTrafficPolicy"), policy);
    }
    f.finish()
}

fn validate_ingress(
    f: &mut Findings,
    at: &FieldPath,
    ingress: &net::IstioIngressListener,
    ports: &mut BTreeSet<u32>,
) {
    let Some(port) = &ingress.port else {
        f.error(
            &at.field("port"),
            "sidecar: port is required for ingress listeners",
        );
        return;
    };
    let here = at.field("port");
    if port.target_port > 0 {
        f.error(
            &here.field("targetPort"),
            "targetPort has no impact on Sidecars",
        );
    }
    if !port.name.is_empty() {
        f.check(&here.field("name"), validate_port_name(&port.name));
    }
    f.check(&here.field("protocol"), validate_protocol(&port.protocol));
    f.check(&here.field("number"), validate_port(port.number));
    if !ingress.bind.is_empty() {
        f.check(&at.field("bind"), validate_ip(&ingress.bind));
    }
    if !ports.insert(port.number) {
        f.error(
            &here.field("number"),
            "sidecar: ports on IP bound listeners must be unique",
        );
    }
    if !ingress.default_endpoint.is_empty() {
        f.check(
            &at.field("defaultEndpoint"),
            validate_default_endpoint(&ingress.default_endpoint),
        );
    }
    if let Some(tls) = &ingress.tls {
        let here = at.field("tls");
        if !tls.subject_alt_names.is_empty() {
            f.error(
                &here.field("subjectAltNames"),
                "sidecar: subjectAltNames is not supported in ingress tls",
            );
        }
        if tls.https_redirect {
            f.error(
                &here.field("httpsRedirect"),
                "sidecar: httpsRedirect is not supported",
            );
        }
        if !tls.credential_name.is_empty() {
            f.error(
                &here.field("credentialName"),
                "sidecar: credentialName is not currently supported",
            );
        }
        if matches!(tls.mode(), TlSmode::IstioMutual | TlSmode::AutoPassthrough) {
            f.error(
                &here.field("mode"),
                format!(
                    "configuration is invalid: cannot set mode to {} in sidecar ingress tls",
                    tls.mode().as_str_name()
                ),
            );
        }
        validate_server_tls(f, &here, tls);
    }
    if let Some(pool) = &ingress.connection_pool {
        validate_connection_pool(f, &at.field("connectionPool"), pool);
        if pool.http.is_some() && !Protocol::parse(&port.protocol).is_http() {
            f.warn(
                &at.field("connectionPool").field("http"),
                format!(
                    "sidecar: HTTP connection pool settings are configured for port {} ({:?}) but its protocol is \
                     not HTTP ({}); only TCP settings will apply",
                    port.number, port.name, port.protocol
                ),
            );
        }
    }
}

/// `127.0.0.1:PORT`, `0.0.0.0:PORT`, `[::1]:PORT`, `[::]:PORT`, `:PORT` or
/// `unix://path`.
fn validate_default_endpoint(endpoint: &str) -> Result<(), String> {
    if let Some(path) = endpoint.strip_prefix(UNIX_PREFIX) {
        return validate_unix_address(path);
    }
    let form = "sidecar: defaultEndpoint must be of form 127.0.0.1:<port>, 0.0.0.0:<port>, [::1]:<port>, \
                [::]:<port>, unix://filepath or unset";
    let (host, port) = endpoint.rsplit_once(':').ok_or_else(|| form.to_string())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if !matches!(host, "" | "127.0.0.1" | "0.0.0.0" | "::1" | "::") {
        return Err(form.to_string());
    }
    let port: u32 = port
        .parse()
        .map_err(|_| format!("sidecar: defaultEndpoint port ({port}) is not a number"))?;
    validate_port(port)
}

fn validate_egress_port(
    f: &mut Findings,
    at: &FieldPath,
    port: &net::SidecarPort,
    bind: &str,
    capture_mode: CaptureMode,
) {
    let here = at.field("port");
    if !port.name.is_empty() {
        f.check(&here.field("name"), validate_port_name(&port.name));
    }
    f.check(&here.field("protocol"), validate_protocol(&port.protocol));
    if port.number == 0 {
        match bind.strip_prefix(UNIX_PREFIX) {
            None => f.error(
                &at.field("bind"),
                "sidecar: ports with 0 value must have a unix domain socket bind address",
            ),
            Some(path) => f.check(&at.field("bind"), validate_unix_address(path)),
        }
        if !matches!(capture_mode, CaptureMode::Default | CaptureMode::None) {
            f.error(
                &at.field("captureMode"),
                "sidecar: captureMode must be DEFAULT/NONE for unix domain socket listeners",
            );
        }
    } else {
        f.check(&here.field("number"), validate_port(port.number));
        if !bind.is_empty() {
            f.check(&at.field("bind"), validate_ip(bind));
        }
    }
}

/// Egress hosts: `namespace/dnsName` (`./`, `*/`, `~/` or a namespace), at least one;
/// overlapping entries are warned about.
fn validate_egress_hosts(f: &mut Findings, at: &FieldPath, namespace: &str, hosts: &[String]) {
    if hosts.is_empty() {
        f.error(
            at,
            "sidecar: egress listener must contain at least one host",
        );
        return;
    }
    let mut by_namespace: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (i, host) in hosts.iter().enumerate() {
        let here = at.index(i);
        if let Some((ns, name)) = host.split_once('/') {
            let ns = if ns == "." { namespace } else { ns };
            let names = by_namespace.entry(ns).or_default();
            let duplicate = if name == "*" {
                !names.is_empty()
            } else {
                names.contains(name) || names.contains("*")
            };
            if duplicate {
                f.warn(&here, format!("duplicated egress host: {host}"));
            }
            names.insert(name);
        }
        validate_namespace_slash_host(f, &here, host, false);
    }
    if by_namespace.get("*").is_some_and(|n| n.contains("*")) && by_namespace.len() != 1 {
        f.warn(
            at,
            "`*/*` host select all resources, no other hosts can be added",
        );
    }
}

fn validate_outbound_policy(f: &mut Findings, at: &FieldPath, policy: &net::OutboundTrafficPolicy) {
    let Some(proxy) = &policy.egress_proxy else {
        return;
    };
    let here = at.field("egressProxy");
    if policy.mode() != Mode::AllowAny {
        f.error(
            &here,
            "sidecar: egress_proxy must be set only with ALLOW_ANY outbound_traffic_policy mode",
        );
        return;
    }
    f.check(&here.field("host"), validate_fqdn(&proxy.host));
    match &proxy.port {
        None => f.error(
            &here.field("port"),
            "sidecar: egress_proxy port must be non-nil",
        ),
        Some(port) => f.check(
            &here.field("port").field("number"),
            validate_port(port.number),
        ),
    }
    if !proxy.subset.is_empty() && !super::common::is_dns1123_label(&proxy.subset) {
        f.error(
            &here.field("subset"),
            format!("subset name is invalid: {}", proxy.subset),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{assert_error, assert_ok, assert_warning, spec};
    use super::*;

    fn check(yaml: &str) -> Validation {
        validate_sidecar("default", &spec::<net::Sidecar>(yaml))
    }

    #[test]
    fn a_full_valid_sidecar_passes() {
        let warnings = assert_ok(&check(
            r#"
workloadSelector: {labels: {app: ratings}}
ingress:
- port: {number: 9080, protocol: HTTP, name: somename}
  defaultEndpoint: 127.0.0.1:8080
  connectionPool: {http: {http1MaxPendingRequests: 10}}
- port: {number: 9443, protocol: HTTPS, name: tls}
  defaultEndpoint: unix:///var/run/app.sock
  tls: {mode: SIMPLE, serverCertificate: /c.pem, privateKey: /k.pem}
egress:
- port: {number: 9080, protocol: HTTP, name: egresshttp}
  hosts: ["prod-us1/*"]
- port: {number: 0, protocol: HTTP, name: uds}
  bind: unix:///var/run/egress.sock
  hosts: ["./reviews.default.svc.cluster.local"]
- hosts: ["istio-system/*", "~/*.internal.example.com"]
outboundTrafficPolicy: {mode: ALLOW_ANY, egressProxy: {host: egress.example.com, port: {number: 443}}}
"#,
        ));
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn something_must_be_configured() {
        assert_error(&check("{}"), "spec", "empty configuration");
        assert_ok(&check(
            "ingress: [{port: {number: 80, protocol: HTTP, name: http}}]",
        ));
        assert_ok(&check("outboundTrafficPolicy: {mode: REGISTRY_ONLY}"));
    }

    #[test]
    fn egress() {
        assert_error(
            &check("egress: [{port: {number: 80, protocol: HTTP}}]"),
            "spec.egress[0].hosts",
            "at least one host",
        );
        assert_error(
            &check("egress: [{hosts: [reviews.default.svc.cluster.local]}]"),
            "spec.egress[0].hosts[0]",
            "must be of form namespace/dnsName",
        );
        assert_error(
            &check("egress: [{hosts: [\"./reviews\"]}]"),
            "spec.egress[0].hosts[0]",
            "short names",
        );
        assert_error(
            &check("egress: [{hosts: [\"Bad_NS/*\"]}]"),
            "spec.egress[0].hosts[0]",
            "invalid namespace",
        );
        assert_error(
            &check("egress: [{hosts: [\"./*\"]}, {hosts: [\"*/*\"]}]"),
            "spec.egress[0].port",
            "should be the last listener",
        );
        assert_error(
            &check(
                "egress: [{port: {number: 80}, hosts: [\"./*\"]}, {hosts: [\"./*\"]}, {hosts: [\"*/*\"]}]",
            ),
            "spec.egress[1].port",
            "last listener",
        );
        assert_error(
            &check(
                "egress: [{port: {number: 80}, hosts: [\"./*\"]}, {port: {number: 80}, hosts: [\"*/*\"]}]",
            ),
            "spec.egress[1].port.number",
            "must be unique",
        );
        assert_error(
            &check("egress: [{port: {number: 0}, hosts: [\"./*\"]}]"),
            "spec.egress[0].bind",
            "unix domain socket bind",
        );
        assert_error(
            &check("egress: [{port: {number: 70000}, hosts: [\"./*\"]}]"),
            "spec.egress[0].port.number",
            "1..65535",
        );
        assert_warning(
            &check("egress: [{hosts: [\"*/*\", \"ns/a.example.com\"]}]"),
            "spec.egress[0].hosts",
            "`*/*` host select all resources",
        );
        assert_warning(
            &check("egress: [{hosts: [\"./a.example.com\", \"default/a.example.com\"]}]"),
            "spec.egress[0].hosts[1]",
            "duplicated egress host",
        );
    }

    #[test]
    fn ingress() {
        assert_error(
            &check("ingress: [{defaultEndpoint: 127.0.0.1:80}]"),
            "spec.ingress[0].port",
            "port is required",
        );
        assert_error(
            &check(
                "ingress: [{port: {number: 80, protocol: HTTP, name: http}, defaultEndpoint: 10.0.0.1:80}]",
            ),
            "spec.ingress[0].defaultEndpoint",
            "must be of form",
        );
        assert_error(
            &check(
                "ingress: [{port: {number: 80, protocol: HTTP, name: http}, defaultEndpoint: \"127.0.0.1:http\"}]",
            ),
            "spec.ingress[0].defaultEndpoint",
            "not a number",
        );
        assert_error(
            &check(
                "ingress: [{port: {number: 80, protocol: HTTP, name: a}}, {port: {number: 80, protocol: HTTP, name: b}}]",
            ),
            "spec.ingress[1].port.number",
            "must be unique",
        );
        assert_error(
            &check("ingress: [{port: {number: 80, protocol: FOO, name: a}}]"),
            "spec.ingress[0].port.protocol",
            "unsupported protocol",
        );
        assert_error(
            &check(
                "ingress: [{port: {number: 443, protocol: HTTPS, name: a}, tls: {mode: ISTIO_MUTUAL}}]",
            ),
            "spec.ingress[0].tls.mode",
            "cannot set mode to ISTIO_MUTUAL",
        );
    }

    #[test]
    fn selector_and_outbound_policy() {
        assert_error(
            &check(
                "workloadSelector: {labels: {\"\": a}}\noutboundTrafficPolicy: {mode: ALLOW_ANY}",
            ),
            "spec.workloadSelector.labels[]",
            "empty key",
        );
        assert_warning(
            &check("workloadSelector: {labels: {}}\noutboundTrafficPolicy: {mode: ALLOW_ANY}"),
            "spec.workloadSelector.labels",
            "without labels",
        );
        assert_error(
            &check(
                "outboundTrafficPolicy: {mode: REGISTRY_ONLY, egressProxy: {host: egress.example.com, port: {number: 443}}}",
            ),
            "spec.outboundTrafficPolicy.egressProxy",
            "only with ALLOW_ANY",
        );
        assert_error(
            &check(
                "outboundTrafficPolicy: {mode: ALLOW_ANY, egressProxy: {host: egress.example.com}}",
            ),
            "spec.outboundTrafficPolicy.egressProxy.port",
            "must be non-nil",
        );
    }
}

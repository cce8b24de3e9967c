//! Gateway validation (Istio's `ValidateGateway`, `validateServer`,
//! `validateTLSOptions`), plus the `namespace/host` and server-TLS checks the Sidecar
//! shares.
//!
//! Difference from Istio: `AUTO_PASSTHROUGH` on a server whose protocol is not `TLS`
//! is warned about (Istio only builds SNI-DNAT listeners for TLS servers).

use std::collections::BTreeSet;

use meshfed_api::networking::v1alpha3 as net;
use net::server_tls_settings::{TlSmode, TlsProtocol};

use super::common::{
    UNIX_PREFIX, is_dns1123_label, is_ip, partial_wildcard, validate_ip, validate_port,
    validate_unix_address, validate_wildcard_domain,
};
use super::{FieldPath, Findings, Validation};
use crate::model::Protocol;

/// Validates a Gateway spec. (The name rule, a DNS label, is checked with the
/// metadata.)
pub fn validate_gateway(gw: &net::Gateway) -> Validation {
    let mut f = Findings::new();
    let spec = FieldPath::spec();
    if gw.servers.is_empty() {
        f.error(
            &spec.field("servers"),
            "gateway must have at least one server",
        );
    }
    let mut port_names = BTreeSet::new();
    for (i, server) in gw.servers.iter().enumerate() {
        let at = spec.field("servers").index(i);
        validate_server(&mut f, &at, server);
        if let Some(port) = &server.port {
            if !port.name.is_empty() && !port_names.insert(port.name.as_str()) {
                f.error(
                    &at.field("port").field("name"),
                    format!(
                        "port names in servers must be unique: duplicate name {}",
                        port.name
                    ),
                );
            }
            let protocol = Protocol::parse(&port.protocol);
            if !protocol.is_http() && server.tls.as_ref().is_some_and(|t| t.https_redirect) {
                f.warn(
                    &at.field("tls").field("httpsRedirect"),
                    "tls.httpsRedirect should only be used with http servers",
                );
            }
        }
    }
    f.finish()
}

fn validate_server(f: &mut Findings, at: &FieldPath, server: &net::Server) {
    if server.hosts.is_empty() {
        f.error(
            &at.field("hosts"),
            "server config must contain at least one host",
        );
    }
    for (i, host) in server.hosts.iter().enumerate() {
        validate_namespace_slash_host(f, &at.field("hosts").index(i), host, true);
    }
    let port_ok = validate_server_port(f, at, server.port.as_ref(), &server.bind);
    validate_bind(f, at, server.port.as_ref().map(|p| p.number), &server.bind);
    if let Some(tls) = &server.tls {
        validate_server_tls(f, &at.field("tls"), tls);
    }
    let Some(port) = server.port.as_ref().filter(|_| port_ok) else {
        return;
    };
    let protocol = Protocol::parse(&port.protocol);
    let is_tls = matches!(protocol, Protocol::Https | Protocol::Tls);
    match &server.tls {
        None if is_tls => f.error(
            &at.field("tls"),
            format!(
                "server must have TLS settings for HTTPS/TLS protocols (port protocol is {})",
                port.protocol
            ),
        ),
        Some(tls) if !is_tls => {
            if protocol.is_http() {
                let only_redirect = tls.mode() == TlSmode::Passthrough
                    && tls.ca_certificates.is_empty()
                    && tls.private_key.is_empty()
                    && tls.server_certificate.is_empty();
                if !only_redirect {
                    f.error(
                        &at.field("tls"),
                        "server cannot have TLS settings for plain text HTTP ports",
                    );
                }
            } else {
                f.error(
                    &at.field("tls"),
                    "server cannot have TLS settings for non HTTPS/TLS ports",
                );
            }
        }
        Some(tls) if tls.mode() == TlSmode::AutoPassthrough && protocol != Protocol::Tls => f.warn(
            &at.field("tls").field("mode"),
            format!(
                "AUTO_PASSTHROUGH is meant for TLS servers; this server's protocol is {}",
                port.protocol
            ),
        ),
        _ => {}
    }
}

/// The server port: known protocol, valid number (0 only with a Unix socket bind), a
/// name. Returns whether the port is usable for the TLS checks.
fn validate_server_port(
    f: &mut Findings,
    at: &FieldPath,
    port: Option<&net::Port>,
    bind: &str,
) -> bool {
    let here = at.field("port");
    let Some(port) = port else {
        f.error(&here, "port is required");
        return false;
    };
    let errors_before = f.errors.len();
    if !matches!(Protocol::parse_known(&port.protocol), Some(p) if p != Protocol::Unsupported) {
        f.error(
            &here.field("protocol"),
            format!(
                "invalid protocol {:?}, supported protocols are HTTP, HTTP2, GRPC, GRPC-WEB, MONGO, REDIS, \
                 MYSQL, TCP, HTTPS, TLS",
                port.protocol
            ),
        );
    }
    if port.number > 0 || !bind.starts_with(UNIX_PREFIX) {
        f.check(&here.field("number"), validate_port(port.number));
    }
    if port.target_port > 0 {
        f.error(
            &here.field("targetPort"),
            "targetPort has no impact on Gateways",
        );
    }
    if port.name.is_empty() {
        f.error(&here.field("name"), "port name must be set");
    }
    f.errors.len() == errors_before
}

/// `bind`: an IP, or `unix://path` with port number 0.
pub(crate) fn validate_bind(
    f: &mut Findings,
    at: &FieldPath,
    port_number: Option<u32>,
    bind: &str,
) {
    let here = at.field("bind");
    if let Some(path) = bind.strip_prefix(UNIX_PREFIX) {
        f.check(&here, validate_unix_address(path));
        if port_number.is_some_and(|n| n != 0) {
            f.error(&here, "port number must be 0 for unix domain socket");
        }
    } else if !bind.is_empty() {
        f.check(&here, validate_ip(bind));
    }
}

/// Server-side TLS settings (Gateway servers and Sidecar ingress listeners).
pub(crate) fn validate_server_tls(f: &mut Findings, at: &FieldPath, tls: &net::ServerTlsSettings) {
    let mode = tls.mode();
    let min = tls.min_protocol_version();
    let max = tls.max_protocol_version();
    if matches!(min, TlsProtocol::Tlsv10 | TlsProtocol::Tlsv11) && tls.cipher_suites.is_empty() {
        f.warn(
            &at.field("minProtocolVersion"),
            "TLS version below TLSV1_2 require setting compatible ciphers as by default they no longer include compatible ciphers.",
        );
    }
    if min != TlsProtocol::TlsAuto && max != TlsProtocol::TlsAuto && min > max {
        f.error(
            &at.field("minProtocolVersion"),
            format!(
                "minProtocolVersion {} is higher than maxProtocolVersion {}",
                min.as_str_name(),
                max.as_str_name()
            ),
        );
    }
    let mut seen = BTreeSet::new();
    for cipher in &tls.cipher_suites {
        if !seen.insert(cipher.as_str()) {
            f.warn(
                &at.field("cipherSuites"),
                format!("ignoring duplicate cipher suite {cipher}"),
            );
        }
    }
    if mode == TlSmode::IstioMutual {
        let forbidden = [
            (
                "serverCertificate",
                &tls.server_certificate,
                "server certificate",
            ),
            ("privateKey", &tls.private_key, "private key"),
            ("caCertificates", &tls.ca_certificates, "CA bundle"),
            ("credentialName", &tls.credential_name, "credentialName"),
        ];
        for (field, value, what) in forbidden {
            if !value.is_empty() {
                f.error(
                    &at.field(field),
                    format!("ISTIO_MUTUAL TLS cannot have associated {what}"),
                );
            }
        }
        return;
    }
    if matches!(mode, TlSmode::Passthrough | TlSmode::AutoPassthrough)
        && (!tls.ca_crl.is_empty()
            || !tls.server_certificate.is_empty()
            || !tls.private_key.is_empty()
            || !tls.ca_certificates.is_empty()
            || !tls.credential_name.is_empty())
    {
        f.warn(
            &at.field("mode"),
            format!(
                "{} mode does not use certificates, they will be ignored",
                mode.as_str_name()
            ),
        );
    }
    let terminating = matches!(
        mode,
        TlSmode::Simple | TlSmode::Mutual | TlSmode::OptionalMutual
    );
    if terminating && !tls.credential_name.is_empty() {
        // Credentials come from the named secret.
        if !tls.ca_crl.is_empty() {
            f.error(
                &at.field("caCrl"),
                "CRL is not supported with credentialName. CRL has to be specified in the credential",
            );
        }
        return;
    }
    if terminating {
        let what = if mode == TlSmode::Simple {
            "SIMPLE"
        } else {
            "MUTUAL"
        };
        if tls.server_certificate.is_empty() {
            f.error(
                &at.field("serverCertificate"),
                format!("{what} TLS requires a server certificate (or set credentialName)"),
            );
        }
        if tls.private_key.is_empty() {
            f.error(
                &at.field("privateKey"),
                format!("{what} TLS requires a private key (or set credentialName)"),
            );
        }
        if mode != TlSmode::Simple && tls.ca_certificates.is_empty() {
            f.error(
                &at.field("caCertificates"),
                "MUTUAL TLS requires a client CA bundle (or set credentialName)",
            );
        }
    }
    if !tls.ca_crl.is_empty() && mode == TlSmode::Simple {
        f.error(&at.field("caCrl"), "CRL is not supported with SIMPLE TLS");
    }
}

/// `namespace/dnsName` hosts of Gateway servers and Sidecar egress listeners.
///
/// The namespace is `*`, `.`, a namespace name, or (Sidecars only) `~`. The host is
/// `*`, a wildcard domain or an FQDN (short names are not allowed), no partial
/// wildcard; gateways also take IPs and the old form without a namespace.
pub(crate) fn validate_namespace_slash_host(
    f: &mut Findings,
    at: &FieldPath,
    host: &str,
    is_gateway: bool,
) {
    let Some((ns, name)) = host.split_once('/') else {
        if is_gateway {
            validate_host_part(f, at, host, true);
        } else {
            f.error(
                at,
                format!("host {host:?} must be of form namespace/dnsName"),
            );
        }
        return;
    };
    if ns.is_empty() || name.is_empty() {
        f.error(
            at,
            "config namespace and dnsName in host entry cannot be empty",
        );
    }
    let special = matches!(ns, "*" | ".") || (!is_gateway && ns == "~");
    if !ns.is_empty() && !special && !is_dns1123_label(ns) {
        let what = if is_gateway { "gateway" } else { "sidecar" };
        f.error(at, format!("invalid namespace value {ns:?} in {what}"));
    }
    if !name.is_empty() {
        validate_host_part(f, at, name, is_gateway);
    }
}

fn validate_host_part(f: &mut Findings, at: &FieldPath, host: &str, is_gateway: bool) {
    if host != "*" && !host.contains('.') && !(is_gateway && is_ip(host)) {
        f.error(
            at,
            format!("short names (non FQDN) are not allowed: {host:?}"),
        );
    }
    if let Err(reason) = validate_wildcard_domain(host)
        && !(is_gateway && is_ip(host))
    {
        f.error(at, reason);
    }
    if let Some(reason) = partial_wildcard(host) {
        f.error(at, reason);
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{assert_error, assert_ok, assert_warning, spec};
    use super::*;

    fn check(yaml: &str) -> Validation {
        validate_gateway(&spec::<net::Gateway>(yaml))
    }

    fn server(s: &str) -> Validation {
        check(&format!("servers: [{s}]"))
    }

    #[test]
    fn a_full_valid_gateway_passes() {
        let warnings = assert_ok(&check(
            r#"
selector: {istio: ingressgateway}
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: ["*/*.example.com", "./api.example.com", "prod/web.example.com"]
  tls: {httpsRedirect: true}
- port: {number: 443, name: https, protocol: HTTPS}
  hosts: ["*.example.com"]
  tls: {mode: SIMPLE, credentialName: example-cert}
- port: {number: 8443, name: mtls, protocol: HTTPS}
  hosts: ["ns1/b.example.com"]
  tls: {mode: MUTUAL, serverCertificate: /c.pem, privateKey: /k.pem, caCertificates: /ca.pem}
- port: {number: 15443, name: tls, protocol: TLS}
  hosts: ["*.local"]
  tls: {mode: AUTO_PASSTHROUGH}
- port: {number: 9000, name: tcp, protocol: TCP}
  hosts: ["*"]
"#,
        ));
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn servers_and_ports() {
        assert_error(&check("servers: []"), "spec.servers", "at least one server");
        assert_error(
            &server("{port: {number: 80, name: http, protocol: HTTP}}"),
            "spec.servers[0].hosts",
            "at least one host",
        );
        assert_error(
            &server("{hosts: [\"*\"]}"),
            "spec.servers[0].port",
            "port is required",
        );
        assert_error(
            &server("{port: {number: 80, name: http, protocol: HTTPX}, hosts: [\"*\"]}"),
            "spec.servers[0].port.protocol",
            "invalid protocol",
        );
        assert_error(
            &server("{port: {number: 0, name: http, protocol: HTTP}, hosts: [\"*\"]}"),
            "spec.servers[0].port.number",
            "1..65535",
        );
        assert_error(
            &server("{port: {number: 80, protocol: HTTP}, hosts: [\"*\"]}"),
            "spec.servers[0].port.name",
            "port name must be set",
        );
        assert_error(
            &server(
                "{port: {number: 80, name: http, protocol: HTTP, targetPort: 8080}, hosts: [\"*\"]}",
            ),
            "spec.servers[0].port.targetPort",
            "no impact",
        );
        assert_error(
            &check(
                "servers: [{port: {number: 80, name: web, protocol: HTTP}, hosts: [\"*\"]}, {port: {number: 81, name: web, protocol: HTTP}, hosts: [\"*\"]}]",
            ),
            "spec.servers[1].port.name",
            "must be unique",
        );
        assert_error(
            &server(
                "{port: {number: 80, name: http, protocol: HTTP}, hosts: [\"*\"], bind: not-an-ip}",
            ),
            "spec.servers[0].bind",
            "not a valid IP",
        );
        assert_ok(&server(
            "{port: {number: 0, name: uds, protocol: HTTP}, hosts: [\"*\"], bind: \"unix:///var/run/gw.sock\"}",
        ));
    }

    #[test]
    fn hosts() {
        let host = |h: &str| {
            server(&format!(
                "{{port: {{number: 80, name: http, protocol: HTTP}}, hosts: [\"{h}\"]}}"
            ))
        };
        assert_error(&host("prod/web"), "spec.servers[0].hosts[0]", "short names");
        assert_error(
            &host("Bad_NS/a.example.com"),
            "spec.servers[0].hosts[0]",
            "invalid namespace",
        );
        assert_error(
            &host("~/a.example.com"),
            "spec.servers[0].hosts[0]",
            "invalid namespace",
        );
        assert_error(
            &host("/a.example.com"),
            "spec.servers[0].hosts[0]",
            "cannot be empty",
        );
        assert_error(
            &host("ns/a*.example.com"),
            "spec.servers[0].hosts[0]",
            "invalid",
        );
        assert_ok(&host("10.0.0.1"));
        assert_ok(&host("a.example.com"));
    }

    #[test]
    fn tls() {
        let https = |tls: &str| {
            server(&format!(
                "{{port: {{number: 443, name: https, protocol: HTTPS}}, hosts: [\"*\"], tls: {tls}}}"
            ))
        };
        assert_error(
            &server("{port: {number: 443, name: https, protocol: HTTPS}, hosts: [\"*\"]}"),
            "spec.servers[0].tls",
            "must have TLS settings",
        );
        assert_error(
            &https("{mode: SIMPLE, privateKey: /k.pem}"),
            "spec.servers[0].tls.serverCertificate",
            "SIMPLE TLS requires a server certificate",
        );
        assert_error(
            &https("{mode: SIMPLE, serverCertificate: /c.pem}"),
            "spec.servers[0].tls.privateKey",
            "requires a private key",
        );
        assert_error(
            &https("{mode: MUTUAL, serverCertificate: /c.pem, privateKey: /k.pem}"),
            "spec.servers[0].tls.caCertificates",
            "client CA bundle",
        );
        assert_ok(&https("{mode: MUTUAL, credentialName: gw-cert}"));
        assert_error(
            &https("{mode: ISTIO_MUTUAL, credentialName: x}"),
            "spec.servers[0].tls.credentialName",
            "ISTIO_MUTUAL TLS cannot have associated credentialName",
        );
        assert_error(
            &https("{mode: SIMPLE, credentialName: c, caCrl: /crl.pem}"),
            "spec.servers[0].tls.caCrl",
            "CRL is not supported with credentialName",
        );
        assert_warning(
            &https("{mode: PASSTHROUGH, serverCertificate: /c.pem}"),
            "spec.servers[0].tls.mode",
            "PASSTHROUGH mode does not use certificates",
        );
        assert_warning(
            &https("{mode: AUTO_PASSTHROUGH}"),
            "spec.servers[0].tls.mode",
            "AUTO_PASSTHROUGH is meant for TLS servers",
        );
        assert_error(
            &https(
                "{mode: SIMPLE, credentialName: c, minProtocolVersion: TLSV1_3, maxProtocolVersion: TLSV1_2}",
            ),
            "spec.servers[0].tls.minProtocolVersion",
            "higher than",
        );
        assert_error(
            &server(
                "{port: {number: 80, name: http, protocol: HTTP}, hosts: [\"*\"], tls: {mode: SIMPLE, credentialName: c}}",
            ),
            "spec.servers[0].tls",
            "plain text HTTP",
        );
        assert_error(
            &server(
                "{port: {number: 90, name: tcp, protocol: TCP}, hosts: [\"*\"], tls: {mode: SIMPLE, credentialName: c}}",
            ),
            "spec.servers[0].tls",
            "non HTTPS/TLS ports",
        );
        assert_warning(
            &https("{mode: SIMPLE, credentialName: c, httpsRedirect: true}"),
            "spec.servers[0].tls.httpsRedirect",
            "only be used with http servers",
        );
    }
}

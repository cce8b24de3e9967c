//! Light validation of the mesh-wide files: MeshConfig (`--meshConfig`) and
//! MeshNetworks (`--networksConfig`). Field paths start at the file's root
//! (`networks[network1].endpoints[0].fromCidr`).

use mesh::network::istio_network_gateway::Gw;
use mesh::network::network_endpoints::Ne;
use meshfed_api::mesh::v1alpha1 as mesh;

use super::common::{
    is_dns1123_label, is_ip, validate_duration, validate_export_to, validate_fqdn,
    validate_ip_subnet, validate_port, validate_wildcard_domain,
};
use super::destination_rule::validate_locality_lb;
use super::{FieldPath, Findings, Validation};

/// Validates meshNetworks: every endpoint rule is a CIDR or a registry name, every
/// gateway a registry service name (FQDN) or an address (IP or host name) with a port
/// in 1..=65535.
pub fn validate_mesh_networks(networks: &mesh::MeshNetworks) -> Validation {
    let mut f = Findings::new();
    let root = FieldPath::root().field("networks");
    for (name, network) in &networks.networks {
        let at = root.key(name);
        if name.is_empty() {
            f.error(&at, "network name cannot be empty");
        }
        for (i, endpoints) in network.endpoints.iter().enumerate() {
            let here = at.field("endpoints").index(i);
            match &endpoints.ne {
                None => f.error(&here, "network endpoints must set fromCidr or fromRegistry"),
                Some(Ne::FromCidr(cidr)) => {
                    f.check(&here.field("fromCidr"), validate_ip_subnet(cidr));
                }
                Some(Ne::FromRegistry(registry)) => {
                    if !is_dns1123_label(registry) {
                        f.error(
                            &here.field("fromRegistry"),
                            format!("invalid registry name: {registry:?}"),
                        );
                    }
                }
            }
        }
        for (i, gateway) in network.gateways.iter().enumerate() {
            let here = at.field("gateways").index(i);
            match &gateway.gw {
                None => f.error(&here, "gateway must set registryServiceName or address"),
                Some(Gw::RegistryServiceName(service)) => {
                    f.check(&here.field("registryServiceName"), validate_fqdn(service));
                }
                Some(Gw::Address(address)) => {
                    if !is_ip(address) && validate_fqdn(address).is_err() {
                        f.error(
                            &here.field("address"),
                            format!(
                                "gateway address {address:?} is not an IP address or a host name"
                            ),
                        );
                    }
                }
            }
            f.check(&here.field("port"), validate_port(gateway.port));
        }
    }
    f.finish()
}

/// Validates the parts of MeshConfig meshfed uses: ports, durations, names, exportTo
/// defaults, locality settings and service settings hosts.
pub fn validate_mesh_config(config: &mesh::MeshConfig) -> Validation {
    let mut f = Findings::new();
    let root = FieldPath::root();
    super::config_sources::check_into(&mut f, &config.config_sources);
    for (field, port) in [
        ("proxyListenPort", config.proxy_listen_port),
        ("proxyInboundListenPort", config.proxy_inbound_listen_port),
        ("proxyHttpPort", config.proxy_http_port),
    ] {
        if port != 0 {
            let checked = u32::try_from(port)
                .map_err(|_| format!("port number {port} must be in the range 1..65535"))
                .and_then(validate_port);
            f.check(&root.field(field), checked);
        }
    }
    if let Some(timeout) = &config.connect_timeout {
        let here = root.field("connectTimeout");
        f.check(&here, validate_duration(timeout));
        if timeout.as_nanos() > 3600 * 1_000_000_000 {
            f.error(
                &here,
                format!("connect timeout {timeout} must be at most 1h"),
            );
        }
    }
    if let Some(timeout) = &config.protocol_detection_timeout
        && timeout.as_nanos() != 0
    {
        f.check(
            &root.field("protocolDetectionTimeout"),
            validate_duration(timeout),
        );
    }
    if let Some(rate) = &config.dns_refresh_rate {
        f.check(&root.field("dnsRefreshRate"), validate_duration(rate));
    }
    if !config.root_namespace.is_empty() && !is_dns1123_label(&config.root_namespace) {
        f.error(
            &root.field("rootNamespace"),
            format!("invalid root namespace {:?}", config.root_namespace),
        );
    }
    if !config.trust_domain.is_empty() {
        f.check(
            &root.field("trustDomain"),
            validate_trust_domain(&config.trust_domain),
        );
    }
    for (i, alias) in config.trust_domain_aliases.iter().enumerate() {
        f.check(
            &root.field("trustDomainAliases").index(i),
            validate_trust_domain(alias),
        );
    }
    // The namespace only matters for `.` duplicates, which a default cannot have.
    validate_export_to(
        &mut f,
        &root.field("defaultServiceExportTo"),
        "",
        &config.default_service_export_to,
        true,
    );
    validate_export_to(
        &mut f,
        &root.field("defaultVirtualServiceExportTo"),
        "",
        &config.default_virtual_service_export_to,
        false,
    );
    validate_export_to(
        &mut f,
        &root.field("defaultDestinationRuleExportTo"),
        "",
        &config.default_destination_rule_export_to,
        false,
    );
    if let Some(locality) = &config.locality_lb_setting {
        validate_locality_lb(&mut f, &root.field("localityLbSetting"), locality, true);
    }
    for (i, settings) in config.service_settings.iter().enumerate() {
        for (j, host) in settings.hosts.iter().enumerate() {
            f.check(
                &root
                    .field("serviceSettings")
                    .index(i)
                    .field("hosts")
                    .index(j),
                validate_wildcard_domain(host),
            );
        }
    }
    if let Some(retry) = &config.default_http_retry_policy
        && retry.attempts < 0
    {
        f.error(
            &root.field("defaultHttpRetryPolicy").field("attempts"),
            "attempts cannot be negative",
        );
    }
    if config
        .mesh_m_tls
        .as_ref()
        .is_some_and(|t| !t.ecdh_curves.is_empty())
    {
        f.error(
            &root.field("meshMTLS").field("ecdhCurves"),
            "mesh TLS does not support ECDH curves configuration",
        );
    }
    validate_extension_providers_into(&mut f, config);
    f.finish()
}

/// Validates `extensionProviders` as Istio's `ValidateMeshConfig` does: names unique
/// and not empty, every ext_authz provider with a port in 1..=65535, a service
/// `[<namespace>/]<hostname>`, a known `statusOnError` code and a `pathPrefix`
/// starting with `/`. Field paths are `extensionProviders[<i>].<field>`.
pub fn validate_extension_providers(config: &mesh::MeshConfig) -> Validation {
    let mut f = Findings::new();
    validate_extension_providers_into(&mut f, config);
    f.finish()
}

fn validate_extension_providers_into(f: &mut Findings, config: &mesh::MeshConfig) {
    use mesh::mesh_config::extension_provider::Provider;
    let mut seen = std::collections::BTreeSet::new();
    for (i, provider) in config.extension_providers.iter().enumerate() {
        let at = FieldPath::root().field("extensionProviders").index(i);
        if provider.name.is_empty() {
            f.error(&at.field("name"), "empty extension provider name");
        } else if !seen.insert(provider.name.as_str()) {
            f.error(
                &at.field("name"),
                format!("duplicate extension provider name {}", provider.name),
            );
        }
        match &provider.provider {
            None => f.error(&at, "the provider kind is not set"),
            Some(Provider::EnvoyExtAuthzHttp(http)) => {
                let here = at.field("envoyExtAuthzHttp");
                validate_ext_authz_target(
                    f,
                    &here,
                    &http.service,
                    http.port,
                    &http.status_on_error,
                );
                if !http.path_prefix.is_empty() && !http.path_prefix.starts_with('/') {
                    f.error(
                        &here.field("pathPrefix"),
                        format!(
                            "pathPrefix should begin with `/` but found {:?}",
                            http.path_prefix
                        ),
                    );
                }
            }
            Some(Provider::EnvoyExtAuthzGrpc(grpc)) => {
                let here = at.field("envoyExtAuthzGrpc");
                validate_ext_authz_target(
                    f,
                    &here,
                    &grpc.service,
                    grpc.port,
                    &grpc.status_on_error,
                );
            }
            Some(Provider::Sds(sds)) => {
                let here = at.field("sds");
                if sds.name.is_empty() {
                    f.error(&here.field("name"), "empty SDS provider name");
                }
                f.check(&here.field("port"), validate_port(sds.port));
                f.check(
                    &here.field("service"),
                    validate_provider_service(&sds.service),
                );
            }
            // Tracing, metrics and access-log providers: read, not used.
            Some(_) => {}
        }
    }
}

/// The service, port and `statusOnError` checks both ext_authz kinds share.
fn validate_ext_authz_target(
    f: &mut Findings,
    at: &FieldPath,
    service: &str,
    port: u32,
    status_on_error: &str,
) {
    f.check(&at.field("port"), validate_port(port));
    f.check(&at.field("service"), validate_provider_service(service));
    if !status_on_error.is_empty() && ext_authz_status(status_on_error).is_none() {
        f.error(
            &at.field("statusOnError"),
            format!("unsupported statusOnError value {status_on_error}"),
        );
    }
}

/// Istio's rule for a provider's `service`: a host name or an IP address, or
/// `<namespace>/<hostname>` without wildcards.
fn validate_provider_service(service: &str) -> Result<(), String> {
    if service.is_empty() {
        return Err("service must not be empty".into());
    }
    match service.split_once('/') {
        None if validate_fqdn(service).is_ok() || is_ip(service) => Ok(()),
        None => Err(format!("invalid service fmt {service}")),
        Some((namespace, host)) => {
            if !is_dns1123_label(namespace) {
                return Err(format!(
                    "invalid namespace {namespace:?} in service {service}"
                ));
            }
            validate_fqdn(host)
        }
    }
}

/// The HTTP status codes Envoy's `envoy.type.v3.StatusCode` names (what
/// `statusOnError` may give), as the number.
pub fn ext_authz_status(text: &str) -> Option<i32> {
    const CODES: &[i32] = &[
        100, 200, 201, 202, 203, 204, 205, 206, 207, 208, 226, 300, 301, 302, 303, 304, 305, 307,
        308, 400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415, 416,
        417, 421, 422, 423, 424, 426, 428, 429, 431, 500, 501, 502, 503, 504, 505, 506, 507, 508,
        510, 511,
    ];
    let code: i32 = text.parse().ok()?;
    CODES.contains(&code).then_some(code)
}

fn validate_trust_domain(domain: &str) -> Result<(), String> {
    let parts: Vec<&str> = domain.split('.').collect();
    for (i, label) in parts.iter().enumerate() {
        if i == parts.len() - 1 && label.is_empty() && i > 0 {
            return Ok(());
        }
        if !is_dns1123_label(label) {
            return Err(format!("trust domain name {domain:?} invalid"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{assert_error, assert_ok, spec};
    use super::*;

    #[test]
    fn mesh_networks() {
        let ok: mesh::MeshNetworks = spec(
            r#"
networks:
  network1:
    endpoints: [{fromRegistry: Kubernetes}, {fromCidr: 192.168.0.0/16}]
    gateways: [{registryServiceName: istio-eastwestgateway.istio-system.svc.cluster.local, port: 15443}]
  network2:
    endpoints: [{fromCidr: 10.1.0.1}]
    gateways: [{address: 1.2.3.4, port: 15443}, {address: gw.example.com, port: 15443}]
"#,
        );
        assert_ok(&validate_mesh_networks(&ok));

        let bad: mesh::MeshNetworks = spec(
            r#"
networks:
  n1:
    endpoints: [{fromCidr: 10.0.0.0/33}, {}, {fromRegistry: "bad registry"}]
    gateways: [{address: 1.2.3.4, port: 0}, {address: "not an address", port: 15443}, {port: 15443}]
"#,
        );
        let result = validate_mesh_networks(&bad);
        assert_error(
            &result,
            "networks[n1].endpoints[0].fromCidr",
            "not a valid CIDR",
        );
        assert_error(
            &result,
            "networks[n1].endpoints[1]",
            "fromCidr or fromRegistry",
        );
        assert_error(
            &result,
            "networks[n1].endpoints[2].fromRegistry",
            "invalid registry name",
        );
        assert_error(&result, "networks[n1].gateways[0].port", "1..65535");
        assert_error(
            &result,
            "networks[n1].gateways[1].address",
            "not an IP address or a host name",
        );
        assert_error(
            &result,
            "networks[n1].gateways[2]",
            "registryServiceName or address",
        );
    }

    #[test]
    fn mesh_config() {
        let ok: mesh::MeshConfig = spec(
            "proxyListenPort: 15001\nconnectTimeout: 10s\nrootNamespace: istio-system\ntrustDomain: cluster.local\ndefaultServiceExportTo: [\"*\"]",
        );
        assert_ok(&validate_mesh_config(&ok));
        let bad: mesh::MeshConfig = spec(
            "proxyListenPort: 70000\nconnectTimeout: 2h\nrootNamespace: Bad_NS\ntrustDomain: \"a..b\"\ndefaultVirtualServiceExportTo: [\"~\"]\nserviceSettings: [{hosts: [\"a b\"]}]",
        );
        let result = validate_mesh_config(&bad);
        assert_error(&result, "proxyListenPort", "1..65535");
        assert_error(&result, "connectTimeout", "at most 1h");
        assert_error(&result, "rootNamespace", "invalid root namespace");
        assert_error(&result, "trustDomain", "invalid");
        assert_error(
            &result,
            "defaultVirtualServiceExportTo[0]",
            "invalid exportTo value",
        );
        assert_error(&result, "serviceSettings[0].hosts[0]", "invalid");
    }

    #[test]
    fn extension_providers_are_validated_as_istio_validates_them() {
        let ok: mesh::MeshConfig = spec(
            r#"
extensionProviders:
- name: http
  envoyExtAuthzHttp: {service: foo/authz.foo.svc.cluster.local, port: 8000, pathPrefix: /check, statusOnError: "503"}
- name: grpc
  envoyExtAuthzGrpc: {service: authz.foo.svc.cluster.local, port: 9000}
- name: tracing
  zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411}
"#,
        );
        assert_ok(&validate_mesh_config(&ok));
        let bad: mesh::MeshConfig = spec(
            r#"
extensionProviders:
- name: a
  envoyExtAuthzHttp: {service: "foo/my authz", port: 999999, pathPrefix: check, statusOnError: "999"}
- name: a
  envoyExtAuthzGrpc: {service: "", port: 9000}
- envoyExtAuthzGrpc: {service: x.y, port: 1}
"#,
        );
        let result = validate_extension_providers(&bad);
        assert_error(
            &result,
            "extensionProviders[0].envoyExtAuthzHttp.port",
            "1..65535",
        );
        assert_error(
            &result,
            "extensionProviders[0].envoyExtAuthzHttp.service",
            "invalid",
        );
        assert_error(
            &result,
            "extensionProviders[0].envoyExtAuthzHttp.pathPrefix",
            "begin with",
        );
        assert_error(
            &result,
            "extensionProviders[0].envoyExtAuthzHttp.statusOnError",
            "unsupported",
        );
        assert_error(&result, "extensionProviders[1].name", "duplicate");
        assert_error(
            &result,
            "extensionProviders[1].envoyExtAuthzGrpc.service",
            "must not be empty",
        );
        assert_error(
            &result,
            "extensionProviders[2].name",
            "empty extension provider name",
        );
    }

    #[test]
    fn sds_providers_need_a_name_a_service_and_a_port() {
        let ok: mesh::MeshConfig = spec(
            "extensionProviders:\n- name: sds\n  sds: {name: vault, service: vault.ns.svc.cluster.local, port: 8200}\n",
        );
        assert_ok(&validate_mesh_config(&ok));
        let bad: mesh::MeshConfig =
            spec("extensionProviders:\n- name: sds\n  sds: {service: \"\", port: 0}\n");
        let result = validate_extension_providers(&bad);
        assert_error(
            &result,
            "extensionProviders[0].sds.name",
            "empty SDS provider",
        );
        assert_error(&result, "extensionProviders[0].sds.port", "1..65535");
        assert_error(
            &result,
            "extensionProviders[0].sds.service",
            "must not be empty",
        );
    }
}

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
    f.finish()
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
}

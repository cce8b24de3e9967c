//! TLS termination on a Sidecar `ingress` listener (`ingress[].tls`), as Istio's
//! `BuildListenerTLSContext` builds it for file-based certificates: the workload's
//! certificate and key files, and for client validation its CA file, are served by the
//! proxy's own agent over SDS (cluster `sds-grpc`) as `file-cert:<cert>~<key>` and
//! `file-root:<ca>` (Istio's `default` / `ROOTCA` when a file is not given). The chain
//! matches `transport_protocol: tls` and the port's protocol is the one after
//! termination (HTTPS serves HTTP, TLS serves TCP).
//!
//! Istio applies it only with `ENABLE_TLS_ON_SIDECAR_INGRESS` and when the port's
//! PeerAuthentication mode is DISABLE; meshfed terminates no mesh mTLS on inbound ports
//! (it has no PeerAuthentication), so the user's TLS always applies. The mesh's
//! `tlsDefaults` and Istio's filtering of unsupported cipher suites are not applied.

use envoy_types::pb::envoy::config::core::v3::{
    DataSource, TransportSocket, data_source, transport_socket,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, TlsParameters,
};
use envoy_types::pb::google::protobuf::BoolValue;
use meshfed_api::networking::v1alpha3::ServerTlsSettings;
use meshfed_api::networking::v1alpha3::server_tls_settings::TlSmode;
use meshfed_registry::Protocol;

use crate::generate::upstream_tls::{SDS_DEFAULT, SDS_ROOT, agent_sds, combined_validation};

/// The ALPN a terminating listener offers (Istio's `ALPNHttp`).
const ALPN_HTTP: [&str; 2] = ["h2", "http/1.1"];

/// The transport protocol Envoy's TLS inspector reports for TLS.
pub const TLS_TRANSPORT: &str = "tls";

/// What an ingress port terminates TLS with.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct IngressTls {
    /// A client certificate is required (MUTUAL).
    pub require_client_certificate: bool,
    /// Client certificates are validated when given (MUTUAL, OPTIONAL_MUTUAL).
    pub validate_client: bool,
    pub server_certificate: String,
    pub private_key: String,
    pub ca_certificates: String,
    pub ca_crl: String,
    /// Istio's TLS protocol numbers, which are Envoy's.
    pub min_protocol_version: i32,
    pub max_protocol_version: i32,
    pub cipher_suites: Vec<String>,
}

impl IngressTls {
    /// The termination an ingress listener's `tls` asks for: SIMPLE, MUTUAL or
    /// OPTIONAL_MUTUAL (validation rejects the other modes).
    pub fn from_settings(tls: &ServerTlsSettings) -> Option<IngressTls> {
        let (require, validate) = match tls.mode() {
            TlSmode::Simple => (false, false),
            TlSmode::Mutual => (true, true),
            TlSmode::OptionalMutual => (false, true),
            _ => return None,
        };
        Some(IngressTls {
            require_client_certificate: require,
            validate_client: validate,
            server_certificate: tls.server_certificate.clone(),
            private_key: tls.private_key.clone(),
            ca_certificates: tls.ca_certificates.clone(),
            ca_crl: tls.ca_crl.clone(),
            min_protocol_version: tls.min_protocol_version,
            max_protocol_version: tls.max_protocol_version,
            cipher_suites: tls.cipher_suites.clone(),
        })
    }

    /// The protocol served once TLS is terminated (Istio's `AfterTLSTermination`).
    pub fn after_termination(protocol: Protocol) -> Protocol {
        match protocol {
            Protocol::Https => Protocol::Http,
            Protocol::Tls => Protocol::Tcp,
            other => other,
        }
    }

    /// The SDS name of the serving certificate.
    pub fn certificate_name(&self) -> String {
        crate::generate::upstream_tls::server_cert_name(&self.server_certificate, &self.private_key)
    }

    /// The SDS name of the CA validating clients.
    pub fn root_name(&self) -> String {
        crate::generate::upstream_tls::server_root_name(&self.ca_certificates)
    }

    /// The downstream TLS context of the chain.
    pub fn context(&self) -> DownstreamTlsContext {
        let mut common = CommonTlsContext {
            alpn_protocols: ALPN_HTTP.iter().map(|s| s.to_string()).collect(),
            tls_certificate_sds_secret_configs: vec![agent_sds(
                &self.certificate_name(),
                self.certificate_name() == SDS_DEFAULT,
            )],
            ..Default::default()
        };
        if self.validate_client {
            let crl = (!self.ca_crl.is_empty()).then(|| DataSource {
                specifier: Some(data_source::Specifier::Filename(self.ca_crl.clone())),
                ..Default::default()
            });
            common.validation_context_type = Some(combined_validation(
                Vec::new(),
                crl,
                agent_sds(&self.root_name(), self.root_name() == SDS_ROOT),
            ));
        }
        if self.min_protocol_version != 0
            || self.max_protocol_version != 0
            || !self.cipher_suites.is_empty()
        {
            common.tls_params = Some(TlsParameters {
                tls_minimum_protocol_version: self.min_protocol_version,
                tls_maximum_protocol_version: self.max_protocol_version,
                cipher_suites: self.cipher_suites.clone(),
                ..Default::default()
            });
        }
        DownstreamTlsContext {
            common_tls_context: Some(common),
            require_client_certificate: Some(BoolValue {
                value: self.require_client_certificate,
            }),
            ..Default::default()
        }
    }

    /// [`IngressTls::context`] as the chain's transport socket.
    pub fn transport_socket(&self) -> TransportSocket {
        TransportSocket {
            name: "envoy.transport_sockets.tls".into(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(super::pack(
                &self.context(),
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::grpc_service;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        SdsSecretConfig, common_tls_context,
    };
    use prost::Message;

    use super::super::tests::{default_mesh, proxy, snapshot};
    use super::super::{InboundPort, VIRTUAL_INBOUND, sidecar_listeners};
    use super::*;
    use crate::push::config_index::ConfigSet;

    fn settings(mode: TlSmode, ca: &str) -> ServerTlsSettings {
        ServerTlsSettings {
            mode: mode as i32,
            server_certificate: "httpbin.pem".into(),
            private_key: "httpbinkey.pem".into(),
            ca_certificates: ca.into(),
            ..Default::default()
        }
    }

    fn sds_cluster(sds: &SdsSecretConfig) -> String {
        use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
        match sds
            .sds_config
            .as_ref()
            .and_then(|c| c.config_source_specifier.as_ref())
        {
            Some(ConfigSourceSpecifier::ApiConfigSource(api)) => {
                match &api.grpc_services[0].target_specifier {
                    Some(grpc_service::TargetSpecifier::EnvoyGrpc(g)) => g.cluster_name.clone(),
                    other => panic!("{other:?}"),
                }
            }
            other => panic!("not the agent's SDS: {other:?}"),
        }
    }

    #[test]
    fn simple_and_mutual_contexts_name_the_files_served_by_the_agent() {
        let simple = IngressTls::from_settings(&settings(TlSmode::Simple, "")).unwrap();
        let ctx = simple.context();
        let common = ctx.common_tls_context.as_ref().unwrap();
        let cert = &common.tls_certificate_sds_secret_configs[0];
        assert_eq!(cert.name, "file-cert:httpbin.pem~httpbinkey.pem");
        assert_eq!(sds_cluster(cert), "sds-grpc");
        assert_eq!(common.alpn_protocols, ["h2", "http/1.1"]);
        assert!(common.validation_context_type.is_none());
        assert_eq!(ctx.require_client_certificate.map(|b| b.value), Some(false));

        let mutual = IngressTls::from_settings(&settings(TlSmode::Mutual, "rootCA.pem")).unwrap();
        let ctx = mutual.context();
        assert_eq!(ctx.require_client_certificate.map(|b| b.value), Some(true));
        let Some(common_tls_context::ValidationContextType::CombinedValidationContext(v)) = &ctx
            .common_tls_context
            .as_ref()
            .unwrap()
            .validation_context_type
        else {
            panic!("no combined validation context");
        };
        let root = v.validation_context_sds_secret_config.as_ref().unwrap();
        assert_eq!(root.name, "file-root:rootCA.pem");
        assert_eq!(sds_cluster(root), "sds-grpc");

        // Without a CA file the agent's root; OPTIONAL_MUTUAL validates, not requires.
        let optional = IngressTls::from_settings(&settings(TlSmode::OptionalMutual, "")).unwrap();
        assert_eq!(optional.root_name(), "ROOTCA");
        assert_eq!(
            optional
                .context()
                .require_client_certificate
                .map(|b| b.value),
            Some(false)
        );
        assert!(
            IngressTls::from_settings(&settings(TlSmode::Passthrough, "")).is_none(),
            "nothing to terminate"
        );
        assert_eq!(
            IngressTls::after_termination(Protocol::Https),
            Protocol::Http
        );
        assert_eq!(IngressTls::after_termination(Protocol::Tls), Protocol::Tcp);
    }

    /// The mesh with mTLS off: a Sidecar's TLS applies only there.
    fn mtls_off() -> ConfigSet {
        use meshfed_api::security::v1beta1::peer_authentication::mutual_tls::Mode;
        ConfigSet {
            peer_authentications: vec![crate::generate::authn::tests::pa(
                "istio-system",
                "default",
                0,
                &[],
                Mode::Disable,
                &[],
            )],
            ..Default::default()
        }
    }

    #[test]
    fn a_terminating_port_matches_tls_behind_the_tls_inspector() {
        let snap = snapshot(Vec::new(), mtls_off(), default_mesh());
        let p = proxy(
            "sidecar~10.0.0.9~app.default~default.svc.cluster.local",
            serde_json::json!({}),
        );
        let tls = IngressTls::from_settings(&settings(TlSmode::Simple, ""));
        let inbound = [
            InboundPort {
                tls: tls.clone(),
                ..InboundPort::captured(9080, true)
            },
            InboundPort::captured(9090, false),
            InboundPort {
                tls,
                bind: Some("127.0.0.1".into()),
                ..InboundPort::captured(9443, false)
            },
        ];
        let all = sidecar_listeners(&snap, &p.client_view(), &inbound);
        let vi = all.iter().find(|l| l.name == VIRTUAL_INBOUND).unwrap();
        let filters: Vec<&str> = vi
            .listener_filters
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(
            filters,
            [
                "envoy.filters.listener.original_dst",
                "envoy.filters.listener.tls_inspector",
                // For the plaintext passthrough chains.
                "envoy.filters.listener.http_inspector"
            ]
        );
        let chain = |name: &str| {
            vi.filter_chains
                .iter()
                .find(|c| c.name == name)
                .unwrap_or_else(|| panic!("no chain {name}"))
        };
        let tls_chain = chain("0.0.0.0_9080");
        assert_eq!(
            tls_chain
                .filter_chain_match
                .as_ref()
                .unwrap()
                .transport_protocol,
            "tls"
        );
        let socket = tls_chain.transport_socket.as_ref().unwrap();
        let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
            panic!("no typed config");
        };
        let ctx = DownstreamTlsContext::decode(any.value.as_slice()).unwrap();
        assert_eq!(
            ctx.common_tls_context
                .unwrap()
                .tls_certificate_sds_secret_configs[0]
                .name,
            "file-cert:httpbin.pem~httpbinkey.pem"
        );
        let plain = chain("0.0.0.0_9090");
        assert!(plain.transport_socket.is_none());
        assert_eq!(
            plain
                .filter_chain_match
                .as_ref()
                .unwrap()
                .transport_protocol,
            "raw_buffer"
        );

        let bound = all.iter().find(|l| l.name == "127.0.0.1_9443").unwrap();
        assert_eq!(
            bound.listener_filters[0].name,
            "envoy.filters.listener.tls_inspector"
        );
        assert!(bound.filter_chains[0].transport_socket.is_some());
    }

    #[test]
    fn inspectors_run_only_on_the_ports_that_need_them() {
        use envoy_types::pb::envoy::config::listener::v3::listener_filter_chain_match_predicate::Rule;
        let snap = snapshot(Vec::new(), mtls_off(), default_mesh());
        let p = proxy(
            "sidecar~10.0.0.9~app.default~default.svc.cluster.local",
            serde_json::json!({}),
        );
        let inbound = [
            InboundPort::for_protocol(81, Protocol::Unsupported),
            InboundPort::for_protocol(82, Protocol::Unsupported),
            InboundPort::for_protocol(83, Protocol::Http),
            InboundPort {
                tls: IngressTls::from_settings(&settings(TlSmode::Simple, "")),
                ..InboundPort::for_protocol(9443, Protocol::Tcp)
            },
        ];
        let all = sidecar_listeners(&snap, &p.client_view(), &inbound);
        let vi = all.iter().find(|l| l.name == VIRTUAL_INBOUND).unwrap();
        // The ports a predicate names, and whether it is negated (filter enabled only
        // there) or not (filter disabled there).
        let ports_of = |name: &str| -> (bool, Vec<i32>) {
            let f = vi.listener_filters.iter().find(|f| f.name == name).unwrap();
            let (negated, inner) = match f.filter_disabled.as_ref().unwrap().rule.as_ref() {
                Some(Rule::NotMatch(inner)) => (true, inner.as_ref().clone()),
                _ => (false, f.filter_disabled.clone().unwrap()),
            };
            let ranges = match inner.rule.as_ref().unwrap() {
                Rule::OrMatch(set) => set.rules.iter().map(|r| r.rule.clone().unwrap()).collect(),
                other => vec![other.clone()],
            };
            let ports = ranges
                .into_iter()
                .map(|r| match r {
                    Rule::DestinationPortRange(range) => {
                        assert_eq!(range.end, range.start + 1);
                        range.start
                    }
                    other => panic!("{other:?}"),
                })
                .collect();
            (negated, ports)
        };
        // The plaintext passthrough chains sniff HTTP on every undeclared port: the
        // HTTP inspector is on by default and off where no chain needs it.
        assert_eq!(
            ports_of("envoy.filters.listener.http_inspector"),
            (false, vec![83, 9443, 15006])
        );
        // Only port 9443 terminates TLS.
        assert_eq!(
            ports_of("envoy.filters.listener.tls_inspector"),
            (true, vec![9443])
        );
        let names: Vec<&str> = vi.filter_chains.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "virtualInbound-blackhole",
                "virtualInbound-catchall-http",
                "virtualInbound",
                "0.0.0.0_81",
                "0.0.0.0_81",
                "0.0.0.0_82",
                "0.0.0.0_82",
                "0.0.0.0_83",
                "0.0.0.0_9443",
            ]
        );
    }
}

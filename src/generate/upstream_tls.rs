//! The TLS a cluster gets towards its upstream, as istiod builds it (`cluster_tls.go`):
//! DestinationRule `tls` settings, auto mTLS, the SDS resources of the local agent and of
//! `credentialName`s, and the names of transport sockets and in-mesh ALPNs.

use std::net::IpAddr;

use envoy_types::pb::envoy::config::cluster::v3::cluster;
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiConfigSource, ApiVersion, ConfigSource, DataSource, GrpcService,
    TransportSocket, UpstreamHttpProtocolOptions, api_config_source, config_source, data_source,
    grpc_service, transport_socket,
};
use envoy_types::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, SdsSecretConfig, SubjectAltNameMatcher,
    TlsParameters, UpstreamTlsContext, common_tls_context, subject_alt_name_matcher,
    tls_parameters,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, Struct};
use meshfed_api::networking::v1alpha3::client_tls_settings::TlSmode;
use meshfed_api::networking::v1alpha3::load_balancer_settings::{LbPolicy, SimpleLb};
use meshfed_api::networking::v1alpha3::{ClientTlsSettings, TrafficPolicy};

use crate::model::proxy::NodeType;
use crate::push::snapshot::Snapshot;

use super::cluster_build::*;
use super::proto::*;

/// The TLS transport socket name.
pub const TLS_SOCKET: &str = "envoy.transport_sockets.tls";
/// The plaintext transport socket name.
pub const RAW_BUFFER_SOCKET: &str = "envoy.transport_sockets.raw_buffer";
/// SDS resource of the workload certificate (served by the local agent).
pub const SDS_DEFAULT: &str = "default";
/// SDS resource of the mesh root certificate (served by the local agent).
pub const SDS_ROOT: &str = "ROOTCA";
/// The bootstrap cluster of the local SDS server (istio-agent).
pub const SDS_CLUSTER: &str = "sds-grpc";
/// Suffix of the CA bundle resource that goes with a `credentialName`.
pub const SDS_CA_SUFFIX: &str = "-cacert";
/// Endpoint metadata value (`tlsMode`) of workloads that take Istio mTLS.
pub const ISTIO_TLS_MODE: &str = "istio";
/// ALPN of in-mesh connections (metadata exchange on).
pub const ALPN_IN_MESH: [&str; 2] = ["istio-peer-exchange", "istio"];
/// ALPN of in-mesh HTTP/2 connections (metadata exchange on).
pub const ALPN_IN_MESH_H2: [&str; 3] = ["istio-peer-exchange", "istio", "h2"];

// ---------------------------------------------------------------------------------
// TLS

/// The TLS settings a cluster gets and whether they were auto-detected (Istio's
/// buildUpstreamTLSSettings): DISABLE and SIMPLE as given; MUTUAL as given;
/// ISTIO_MUTUAL with the computed SNI and the service accounts unless the rule names
/// them; no TLS setting means auto mTLS for mesh-internal destinations when the mesh
/// enables it (passthrough destinations only when all their endpoints take mTLS).
pub fn upstream_tls_settings(
    tls: Option<&ClientTlsSettings>,
    policy: Option<&TrafficPolicy>,
    ctx: &PolicyContext<'_>,
) -> (Option<ClientTlsSettings>, bool) {
    if let Some(tls) = tls {
        if tls.mode != TlSmode::IstioMutual as i32 {
            return (Some(tls.clone()), false);
        }
        let sni = if tls.sni.is_empty() {
            ctx.istio_sni.to_string()
        } else {
            tls.sni.clone()
        };
        let sans = if tls.subject_alt_names.is_empty() {
            ctx.service_accounts.to_vec()
        } else {
            tls.subject_alt_names.clone()
        };
        return (Some(istio_mutual(sans, sni)), false);
    }
    let auto = ctx.mesh.enable_auto_mtls.is_none_or(|b| b.value);
    let passthrough = ctx.passthrough_resolution
        || matches!(
            policy
                .and_then(|p| p.load_balancer.as_ref())
                .and_then(|lb| lb.lb_policy.as_ref()),
            Some(LbPolicy::Simple(s)) if *s == SimpleLb::Passthrough as i32
        );
    if ctx.mesh_external
        || !auto
        || ctx.peer_mtls_disabled
        || (passthrough && !ctx.all_endpoints_istio_mtls)
    {
        return (None, false);
    }
    (
        Some(istio_mutual(
            ctx.service_accounts.to_vec(),
            ctx.istio_sni.to_string(),
        )),
        true,
    )
}

fn istio_mutual(subject_alt_names: Vec<String>, sni: String) -> ClientTlsSettings {
    ClientTlsSettings {
        mode: TlSmode::IstioMutual as i32,
        subject_alt_names,
        sni,
        ..Default::default()
    }
}

/// Puts the TLS context on the cluster: a plain transport socket, or for auto-detected
/// mTLS (except ORIGINAL_DST clusters) the socket matches `tlsMode-istio` (endpoints
/// labelled `tlsMode: istio`) and `tlsMode-disabled` (plaintext for the rest).
pub(super) fn apply_upstream_tls(
    c: &mut ClusterBuild,
    tls: Option<&ClientTlsSettings>,
    auto: bool,
    ctx: &PolicyContext<'_>,
) {
    let Some(context) = tls.and_then(|tls| upstream_tls_context(c, tls, ctx)) else {
        return;
    };
    let socket = TransportSocket {
        name: TLS_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack(&context))),
    };
    if auto && !is_original_dst(&c.cluster) {
        c.cluster.transport_socket_matches = vec![
            cluster::TransportSocketMatch {
                name: format!("tlsMode-{ISTIO_TLS_MODE}"),
                r#match: Some(string_struct(&[("tlsMode", ISTIO_TLS_MODE)])),
                transport_socket: Some(socket),
            },
            cluster::TransportSocketMatch {
                name: "tlsMode-disabled".to_string(),
                r#match: Some(Struct::default()),
                transport_socket: Some(raw_buffer_socket()),
            },
        ];
    } else {
        c.cluster.transport_socket = Some(socket);
    }
}

/// The plaintext transport socket.
pub fn raw_buffer_socket() -> TransportSocket {
    TransportSocket {
        name: RAW_BUFFER_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack(
            &RawBuffer::default(),
        ))),
    }
}

/// Istio's buildUpstreamClusterTLSContext. `None` for DISABLE, for SIMPLE/MUTUAL with a
/// `credentialName` on a sidecar when the rule selects no workloads (the secret is
/// only for gateways), and for MUTUAL without a client certificate and key.
pub fn upstream_tls_context(
    c: &mut ClusterBuild,
    tls: &ClientTlsSettings,
    ctx: &PolicyContext<'_>,
) -> Option<UpstreamTlsContext> {
    let mode = TlSmode::try_from(tls.mode).unwrap_or(TlSmode::Disable);
    let privileged = !tls.credential_name.is_empty()
        && !tls.credential_name.starts_with("configmap://")
        && tls.credential_name != "invalid://";
    if privileged
        && ctx.node_type == NodeType::Sidecar
        && !ctx.rule_has_selector
        && matches!(mode, TlSmode::Simple | TlSmode::Mutual)
    {
        return None;
    }
    let mut context = match mode {
        TlSmode::Disable => return None,
        TlSmode::IstioMutual => {
            let mut common = default_common_tls_context();
            common.tls_certificate_sds_secret_configs = vec![agent_sds(SDS_DEFAULT, true)];
            common.validation_context_type = Some(combined_validation(
                san_matchers(&tls.subject_alt_names),
                None,
                agent_sds(SDS_ROOT, true),
            ));
            common.alpn_protocols = if c.is_http2() {
                ALPN_IN_MESH_H2.iter().map(|s| s.to_string()).collect()
            } else {
                ALPN_IN_MESH.iter().map(|s| s.to_string()).collect()
            };
            UpstreamTlsContext {
                common_tls_context: Some(common),
                sni: if tls.sni.is_empty() {
                    c.cluster.name.clone()
                } else {
                    tls.sni.clone()
                },
                ..Default::default()
            }
        }
        TlSmode::Simple | TlSmode::Mutual => {
            simple_or_mutual_context(c, tls, mode == TlSmode::Mutual, ctx)?
        }
    };
    if let Some(defaults) = &ctx.mesh.tls_defaults
        && let Some(params) = context
            .common_tls_context
            .as_mut()
            .and_then(|c| c.tls_params.as_mut())
    {
        if !defaults.ecdh_curves.is_empty() {
            params.ecdh_curves = defaults.ecdh_curves.clone();
        }
        if !defaults.cipher_suites.is_empty() {
            params.cipher_suites = defaults.cipher_suites.clone();
        }
    }
    Some(context)
}

fn simple_or_mutual_context(
    c: &mut ClusterBuild,
    tls: &ClientTlsSettings,
    mutual: bool,
    ctx: &PolicyContext<'_>,
) -> Option<UpstreamTlsContext> {
    let insecure = tls.insecure_skip_verify.is_some_and(|b| b.value);
    // auto_sni / auto_san_validation when the rule leaves SNI / SANs to the request.
    let auto_sni = tls.sni.is_empty();
    let auto_san = auto_sni && tls.subject_alt_names.is_empty() && !insecure;
    if auto_sni || auto_san {
        let upstream = c
            .http()
            .upstream_http_protocol_options
            .get_or_insert_with(UpstreamHttpProtocolOptions::default);
        upstream.auto_sni |= auto_sni;
        upstream.auto_san_validation |= auto_san;
    }
    let sans = if ctx.service_entry && tls.subject_alt_names.is_empty() {
        ctx.service_accounts.to_vec()
    } else {
        tls.subject_alt_names.clone()
    };
    let mut common = default_common_tls_context();
    if !tls.credential_name.is_empty() {
        if mutual {
            common.tls_certificate_sds_secret_configs = vec![credential_sds(&tls.credential_name)];
        }
        if !insecure {
            common.validation_context_type = Some(combined_validation(
                san_matchers(&sans),
                None,
                credential_sds(&format!("{}{SDS_CA_SUFFIX}", tls.credential_name)),
            ));
        }
    } else {
        // Files mounted in the proxy are served by the local agent over SDS.
        let ca = if tls.ca_certificates.is_empty() {
            "system"
        } else {
            tls.ca_certificates.as_str()
        };
        if mutual {
            if tls.client_certificate.is_empty() || tls.private_key.is_empty() {
                return None;
            }
            common.tls_certificate_sds_secret_configs = vec![agent_sds(
                &file_cert_name(&tls.client_certificate, &tls.private_key),
                false,
            )];
        }
        common.validation_context_type = Some(if insecure {
            common_tls_context::ValidationContextType::ValidationContext(
                CertificateValidationContext::default(),
            )
        } else {
            let crl = (!tls.ca_crl.is_empty()).then(|| DataSource {
                specifier: Some(data_source::Specifier::Filename(tls.ca_crl.clone())),
                ..Default::default()
            });
            combined_validation(
                san_matchers(&sans),
                crl,
                agent_sds(&file_root_name(ca), false),
            )
        });
    }
    if c.is_http2() {
        common.alpn_protocols = vec!["h2".to_string()];
    }
    Some(UpstreamTlsContext {
        common_tls_context: Some(common),
        sni: tls.sni.clone(),
        ..Default::default()
    })
}

fn default_common_tls_context() -> CommonTlsContext {
    CommonTlsContext {
        tls_params: Some(TlsParameters {
            tls_minimum_protocol_version: tls_parameters::TlsProtocol::TlSv12 as i32,
            tls_maximum_protocol_version: tls_parameters::TlsProtocol::TlSv13 as i32,
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn combined_validation(
    sans: Vec<SubjectAltNameMatcher>,
    crl: Option<DataSource>,
    sds: SdsSecretConfig,
) -> common_tls_context::ValidationContextType {
    common_tls_context::ValidationContextType::CombinedValidationContext(
        common_tls_context::CombinedCertificateValidationContext {
            default_validation_context: Some(CertificateValidationContext {
                match_typed_subject_alt_names: sans,
                crl,
                ..Default::default()
            }),
            validation_context_sds_secret_config: Some(sds),
            ..Default::default()
        },
    )
}

/// Exact SAN matchers, typed by the form of the name: `scheme://...` (SPIFFE ids) as
/// URI, IP addresses as IP, anything else as DNS.
pub fn san_matchers(names: &[String]) -> Vec<SubjectAltNameMatcher> {
    use subject_alt_name_matcher::SanType;
    names
        .iter()
        .map(|name| {
            let san_type = if name.contains("://") {
                SanType::Uri
            } else if name.parse::<IpAddr>().is_ok() {
                SanType::IpAddress
            } else {
                SanType::Dns
            };
            SubjectAltNameMatcher {
                san_type: san_type as i32,
                matcher: Some(StringMatcher {
                    match_pattern: Some(string_matcher::MatchPattern::Exact(name.clone())),
                    ..Default::default()
                }),
                ..Default::default()
            }
        })
        .collect()
}

/// A secret from the local agent's SDS server (cluster `sds-grpc` in the proxy's
/// bootstrap). The workload certificate and root never time out (they always exist).
pub fn agent_sds(name: &str, no_fetch_timeout: bool) -> SdsSecretConfig {
    let mut sds = grpc_sds(name, SDS_CLUSTER);
    if let Some(source) = sds.sds_config.as_mut() {
        source.initial_fetch_timeout = no_fetch_timeout.then(PbDuration::default);
    }
    sds
}

/// A secret fetched over gRPC SDS from the server behind `cluster`.
pub fn grpc_sds(name: &str, cluster: &str) -> SdsSecretConfig {
    SdsSecretConfig {
        name: name.to_string(),
        sds_config: Some(ConfigSource {
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::ApiConfigSource(
                ApiConfigSource {
                    api_type: api_config_source::ApiType::Grpc as i32,
                    set_node_on_first_message_only: true,
                    transport_api_version: ApiVersion::V3 as i32,
                    grpc_services: vec![GrpcService {
                        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                            grpc_service::EnvoyGrpc {
                                cluster_name: cluster.to_string(),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            )),
            resource_api_version: ApiVersion::V3 as i32,
            ..Default::default()
        }),
    }
}

/// The agent's SDS name of mounted certificate and key files.
pub fn file_cert_name(cert: &str, key: &str) -> String {
    format!("file-cert:{cert}~{key}")
}

/// The agent's SDS name of a mounted CA bundle.
pub fn file_root_name(ca: &str) -> String {
    format!("file-root:{ca}")
}

/// A server's certificate (gateway, Sidecar ingress): its files, or without both the
/// workload's own (`default`).
pub fn server_cert_name(cert: &str, key: &str) -> String {
    if cert.is_empty() || key.is_empty() {
        SDS_DEFAULT.to_string()
    } else {
        file_cert_name(cert, key)
    }
}

/// The CA a server validates clients with: its file, or the mesh root (`ROOTCA`).
pub fn server_root_name(ca: &str) -> String {
    if ca.is_empty() {
        SDS_ROOT.to_string()
    } else {
        file_root_name(ca)
    }
}

/// The prefix of a `credentialName` served by an external SDS server.
pub const SDS_EXTERNAL_PREFIX: &str = "sds://";

/// The outbound cluster of the MeshConfig `sds` extension provider that an
/// `sds://<name>` credential names (Istio's `LookupCluster` on its service and port);
/// `None` for other credentials, an unknown provider or a service the registry does
/// not know (logged: the credential is then asked of istiod, which does not serve it).
pub fn external_sds_cluster(snapshot: &Snapshot, credential: &str) -> Option<String> {
    use meshfed_api::mesh::v1alpha1::mesh_config::extension_provider::Provider;
    let name = credential.strip_prefix(SDS_EXTERNAL_PREFIX)?;
    let provider = snapshot
        .mesh()
        .config
        .extension_providers
        .iter()
        .find_map(|p| match &p.provider {
            Some(Provider::Sds(sds)) if sds.name == name => Some(sds),
            _ => None,
        })?;
    let services = snapshot.services();
    match super::authz::ext_authz::lookup_cluster(&provider.service, provider.port, &|h| {
        services.namespaces_of(h)
    }) {
        Ok((_, cluster)) => Some(cluster),
        Err(e) => {
            tracing::warn!(credential, error = %e, "external SDS provider has no cluster");
            None
        }
    }
}

/// A server's (gateway's) `credentialName` secret: from the external SDS server's
/// cluster when `external` names one (see [`external_sds_cluster`]), else as
/// [`credential_sds`].
pub fn server_credential_sds(credential: &str, external: Option<&str>) -> SdsSecretConfig {
    match external {
        Some(cluster) => grpc_sds(credential, cluster),
        None => credential_sds(credential),
    }
}

/// A `credentialName` secret, fetched over ADS (`kubernetes://<name>` unless the name
/// already carries a type; `builtin://` means the workload's own certificate).
pub fn credential_sds(credential: &str) -> SdsSecretConfig {
    if credential == "builtin://" {
        return agent_sds(SDS_DEFAULT, true);
    }
    if credential == format!("builtin://{SDS_CA_SUFFIX}") {
        return agent_sds(SDS_ROOT, true);
    }
    let name = if ["configmap://", "kubernetes://", "kubernetes-gateway://"]
        .iter()
        .any(|p| credential.starts_with(p))
    {
        credential.to_string()
    } else {
        format!("kubernetes://{credential}")
    };
    SdsSecretConfig {
        name,
        sds_config: Some(ConfigSource {
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
                AggregatedConfigSource {},
            )),
            resource_api_version: ApiVersion::V3 as i32,
            ..Default::default()
        }),
    }
}

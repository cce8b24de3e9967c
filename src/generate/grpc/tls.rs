//! TLS settings of proxyless gRPC, for clusters (client mTLS) and server listeners.
//!
//! gRPC does not fetch certificates over SDS: it reads them from the plugins named in
//! its bootstrap's `certificate_providers` (gRFC A29; Istio's agent writes one called
//! `default`). The TLS contexts therefore only name a plugin instance and a
//! certificate: the workload's own certificate is `default`/`default`, the roots
//! `default`/`ROOTCA`, as Istio's grpc generator names them (`buildCommonTLSContext`).
//!
//! They are sent in the fields gRPC reads since 1.66 (`tls_certificate_provider_instance`
//! and the validation context's `ca_certificate_provider_instance`). Istio also sends
//! the deprecated fields older gRPC read, inside a `combined_validation_context`; Envoy
//! refuses that form without an SDS secret, which gRPC refuses in turn, so meshfed
//! keeps to the form both accept, and proxyless clients and servers need gRPC 1.66 or
//! later for mTLS.

use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateProviderPluginInstance, CertificateValidationContext, CommonTlsContext,
    DownstreamTlsContext, UpstreamTlsContext, common_tls_context,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::pb::google::protobuf::BoolValue;
use prost::{Message, Name};

/// The name gRPC requires on a TLS transport socket.
pub const TRANSPORT_SOCKET: &str = "envoy.transport_sockets.tls";
/// The certificate provider instance Istio's agent writes into gRPC's bootstrap.
pub const PROVIDER_INSTANCE: &str = "default";
/// The workload certificate of that instance.
pub const IDENTITY_CERT: &str = "default";
/// The roots of that instance.
pub const ROOT_CERT: &str = "ROOTCA";

/// A TLS context that presents the workload certificate and verifies the peer against
/// the mesh roots, accepting only the identities `sans` (any when empty; servers
/// cannot check SANs, so theirs is always empty).
#[allow(deprecated)] // gRPC reads `match_subject_alt_names`, not the typed matchers.
pub fn common_tls_context(sans: &[String]) -> CommonTlsContext {
    let plugin = |cert: &str| CertificateProviderPluginInstance {
        instance_name: PROVIDER_INSTANCE.into(),
        certificate_name: cert.into(),
    };
    CommonTlsContext {
        tls_certificate_provider_instance: Some(plugin(IDENTITY_CERT)),
        validation_context_type: Some(
            common_tls_context::ValidationContextType::ValidationContext(
                CertificateValidationContext {
                    ca_certificate_provider_instance: Some(plugin(ROOT_CERT)),
                    match_subject_alt_names: sans.iter().map(|s| exact(s)).collect(),
                    ..Default::default()
                },
            ),
        ),
        ..Default::default()
    }
}

fn exact(value: &str) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::Exact(value.into())),
        ignore_case: false,
    }
}

/// The client side of Istio mTLS to a destination whose workloads present `sans`.
pub fn upstream_socket(sans: &[String]) -> TransportSocket {
    socket(&UpstreamTlsContext {
        common_tls_context: Some(common_tls_context(sans)),
        ..Default::default()
    })
}

/// The server side of Istio mTLS: the client must present a mesh certificate.
pub fn downstream_socket() -> TransportSocket {
    socket(&DownstreamTlsContext {
        common_tls_context: Some(common_tls_context(&[])),
        require_client_certificate: Some(BoolValue { value: true }),
        ..Default::default()
    })
}

fn socket<M: Message + Name>(context: &M) -> TransportSocket {
    TransportSocket {
        name: TRANSPORT_SOCKET.into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(
            crate::generate::proto::pack(context),
        )),
    }
}

//! The Kubernetes Gateway API (`gateway.networking.k8s.io`): its kinds as serde types
//! ([`types`]), the API's own validation rules ([`validate`]), and the translation to
//! Istio Gateways and VirtualServices as istiod does it ([`convert`]) with the status
//! it computes ([`status`]).
//!
//! The kinds are declared in [`crate::config::kinds`] like the Istio ones; their specs
//! are not protos, so they travel over MCP as `google.protobuf.Struct`.

pub mod convert;
pub mod status;
pub mod types;
pub mod validate;

pub use types::*;

use prost::Message;
use serde_json::Value;

use crate::config::kinds::SpecType;
use crate::config::spec_json::decode_typed;
use crate::config::validate::{FieldError, Warning};

/// The name of the message the Gateway API specs travel as.
const STRUCT: &str = "google.protobuf.Struct";

macro_rules! struct_specs {
    ($($t:ty),* $(,)?) => {$(
        impl SpecType for $t {
            fn message_name() -> String {
                STRUCT.to_string()
            }

            fn from_json(value: &Value) -> Result<Self, Vec<FieldError>> {
                decode_typed(value).map_err(|e| vec![e])
            }

            // A Struct that decodes but is not a valid spec is reported as a decode
            // error, the only error the wire path carries.
            #[allow(deprecated)]
            fn decode_proto(bytes: &[u8]) -> Result<Self, prost::DecodeError> {
                let body = pbjson_types::Struct::decode(bytes)?;
                let value = serde_json::to_value(&body)
                    .map_err(|e| prost::DecodeError::new(e.to_string()))?;
                serde_json::from_value(value).map_err(|e| prost::DecodeError::new(e.to_string()))
            }

            fn encode_proto(&self) -> Vec<u8> {
                serde_json::to_value(self)
                    .ok()
                    .and_then(|v| serde_json::from_value::<pbjson_types::Struct>(v).ok())
                    .unwrap_or_default()
                    .encode_to_vec()
            }

            fn unsupported_fields(&self) -> Vec<Warning> {
                Vec::new()
            }
        }
    )*};
}

struct_specs!(
    GatewayClassSpec,
    GatewaySpec,
    HttpRouteSpec,
    GrpcRouteSpec,
    ReferenceGrantSpec,
    TcpRouteSpec,
    TlsRouteSpec,
);

/// The Gateway API group.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// Istio's GatewayClass controller name (`istio.io/gateway-controller`), the default of
/// `--gatewayControllerName`.
pub const DEFAULT_CONTROLLER: &str = "istio.io/gateway-controller";

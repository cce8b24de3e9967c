//! The Kubernetes Gateway API (`gateway.networking.k8s.io`): its kinds as serde types
//! ([`types`]), the API's own validation rules ([`validate`]), and the translation to
//! Istio Gateways and VirtualServices as istiod does it ([`convert`]) with the status
//! it computes ([`status`]).
//!
//! The kinds are declared in [`crate::config::kinds`] like the Istio ones; their specs
//! are not protos, so they travel over MCP as `google.protobuf.Struct` (their
//! `SpecType` is implemented there).

pub mod convert;
pub mod status;
pub mod types;
pub mod validate;

pub use types::*;

/// The Gateway API group.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// Istio's GatewayClass controller name (`istio.io/gateway-controller`), the default of
/// `--gatewayControllerName`.
pub const DEFAULT_CONTROLLER: &str = "istio.io/gateway-controller";

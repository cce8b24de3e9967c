//! meshfed's service model and the registry side of the control plane.
//!
//! - [`model`]: hostnames, services, ports, endpoints and the ids that tie them to a
//!   registry and cluster.
//! - [`endpoints`]: the endpoint index, one shard per registry per service.
//! - [`events`]: what registries tell the push pipeline, and the [`UpdateSink`] they
//!   tell it through.
//! - [`registry`]: the [`ServiceRegistry`] read trait; [`aggregate`]: all registries
//!   behind one view with an explicit merge policy.
//! - [`memory`]: the in-memory (mock) registry; [`mock_file`]: the same, fed from a
//!   watched YAML file.

pub mod aggregate;
pub mod endpoints;
pub mod events;
pub mod memory;
pub mod model;
pub mod registry;

pub use aggregate::{Aggregate, Conflict, ConflictReason, MergedServices};
pub use endpoints::{EndpointIndex, EndpointPush, EndpointShards};
pub use events::{ConfigKey, ConfigKind, PushRequest, RegistryEvent, TriggerReason, UpdateSink};
pub use memory::{MemoryRegistry, ServiceWithEndpoints};
pub use model::*;
pub use registry::{NetworkGateway, ServiceRegistry};

//! xDS resource types, at the bottom of the serving side beside [`crate::model`]: the
//! type URLs served, encoded resources shared by every connection, the wire messages
//! that carry them, the declared dependencies of each type ([`deps`]) and the names
//! resources are known by ([`names`]). Nothing here imports the rest of the crate but
//! the model.

pub mod deps;
pub mod mcp;
pub mod names;
#[cfg(any(test, feature = "testing"))]
pub mod pgv;
pub mod resource;
pub mod response;
pub mod wire;

/// The encoded `FileDescriptorSet` of Envoy's `.proto` files that `build.rs` compiles
/// from envoy-types' sources (with their `validate.rules` annotations): what
/// `/debug/config_dump` renders with and what [`pgv`] checks against. Empty when the
/// build found no sources.
pub static ENVOY_DESCRIPTORS: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/config_dump_descriptors.bin"));

pub use resource::{EncodedResource, Resource, ResourceList, TypeUrl};

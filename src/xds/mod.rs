//! xDS resource types, at the bottom of the serving side beside [`crate::model`]: the
//! type URLs served, encoded resources shared by every connection, the wire messages
//! that carry them, and the declared dependencies of each type ([`deps`]). Nothing
//! here imports the rest of the crate but the model.

pub mod deps;
pub mod resource;
pub mod wire;

pub use resource::{EncodedResource, Resource, TypeUrl};

//! meshfed: a multi-registry service-mesh control plane serving Istio-compatible xDS.
//!
//! The serving side lives here: the push pipeline ([`push`]), generators
//! ([`generate`]), the ADS server ([`ads`]), the admin HTTP surface ([`admin`]) and the
//! wiring ([`app`]). Registries and the mesh model are in `meshfed-registry`.
//! [`testing`] runs the whole control plane in-process for integration tests.

pub mod admin;
pub mod ads;
pub mod app;
pub mod authn;
pub mod autoregistration;
pub mod ca;
pub mod cert_service;
pub mod cli;
pub mod config_sources;
pub mod debug_xds;
pub mod drain;
pub mod generate;
pub mod jwks;
pub mod logging;
pub mod mesh;
pub mod metrics;
pub mod model;
#[cfg(test)]
mod module_circles;
pub mod networks;
pub mod push;
pub mod readiness;
pub mod registries;
pub mod sds;
pub mod status;
pub mod testing;
pub mod tls;
pub mod webhook;
pub mod xds;

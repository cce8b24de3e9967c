//! meshfed's Nacos registry: the only crate that talks to Nacos.
//!
//! [`NacosRegistry::start`] follows the services of the configured Nacos namespaces
//! and groups and turns them into mesh services: a Nacos service `web` of group
//! `DEFAULT_GROUP` in namespace `public` becomes `web.default-group.public.nacos`
//! (suffix configurable) in one mesh namespace, with the registry's cluster id. Nacos
//! 2.x is followed over gRPC as Nacos's own clients do (a subscription per service,
//! instance changes pushed by the server); the 1.x HTTP open API is polled when gRPC is
//! off or not answered. One writer task owns all state; the returned
//! [`NacosRegistry`] is the read side the aggregate holds, a snapshot swapped in
//! atomically. An unreachable or failing Nacos is retried with backoff while the last
//! known view is served and the registry reports itself stale.
//!
//! - [`config`]: [`NacosConfig`] and the setup [`Error`].
//! - [`wire`]: the Payload envelope and the JSON shapes; [`api`]: errors and the HTTP
//!   client; [`auth`]: tokens and access-key signatures; [`grpc`]: one gRPC session;
//!   `driver`: the loops per namespace and the choice of transport.
//! - [`convert`]: the pure conversions (ports, protocol, labels, health, locality).
//! - [`registry`]: the read handle and its counters ([`NacosStats`]).
//! - [`source`]: the registry as the server starts it ([`NacosKind`]: `--registries
//!   Nacos` and the `--nacos*` flags).
//! - `fake` (feature `test-support`): a fake Nacos server (gRPC with push, and the
//!   HTTP open API) for tests here and in the crates that use this one.

pub mod api;
pub mod auth;
pub mod config;
pub mod convert;
mod driver;
#[cfg(feature = "test-support")]
pub mod fake;
pub mod grpc;
pub mod registry;
pub mod source;
pub mod wire;
mod writer;

pub use api::{ApiError, NacosHttp};
pub use config::{Credentials, Error, NacosConfig, Result, Transport};
pub use driver::backoff;
pub use registry::{ActiveTransport, NacosRegistry, NacosStats};
pub use source::{NacosArgs, NacosKind};

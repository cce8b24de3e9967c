//! meshfed's Consul registry: the only crate that talks to Consul.
//!
//! [`ConsulRegistry::start`] follows one Consul datacenter's catalog and turns it into
//! mesh services as reference §5 describes, done the way its "Build" note asks: every
//! catalog service `web` becomes `web.service.consul` (suffix configurable) in one
//! namespace, with the datacenter as cluster id; `/v1/catalog/services` and each
//! service's `/v1/health/service/<name>` are followed with blocking queries
//! (`index` + `wait`, each with its own `X-Consul-Index`), so there is no polling;
//! only what changed is pushed, and instance or health changes only as EDS updates for
//! that hostname. One writer task owns the loops and all state; the returned
//! [`ConsulRegistry`] is the read side the aggregate holds, a snapshot swapped in
//! atomically. An unreachable or failing Consul is retried with backoff while the last
//! known view is served and the registry reports itself stale.
//!
//! - [`config`]: [`ConsulConfig`] and the setup [`Error`].
//! - [`api`]: the HTTP client ([`ConsulClient`]) and Consul's answer shapes.
//! - [`blocking`]: the blocking-query index rules ([`BlockingIndex`]) and the loops.
//! - [`convert`]: the pure conversions (ports, protocol, labels, health, ...).
//! - [`registry`]: the read handle and its counters ([`ConsulStats`]).
//! - [`source`]: the registry as the server starts it ([`ConsulKind`]: `--registries
//!   Consul` and the `--consul*` flags).
//! - `fake` (feature `test-support`): a fake Consul HTTP API for tests here and in
//!   the crates that use this one.

pub mod api;
pub mod blocking;
pub mod config;
pub mod convert;
#[cfg(feature = "test-support")]
pub mod fake;
pub mod registry;
pub mod source;
mod writer;

pub use api::{ApiError, ConsulClient};
pub use blocking::{BlockingIndex, IndexMove};
pub use config::{ConsulConfig, DATACENTER_PLACEHOLDER, Error, Result};
pub use registry::{ConsulRegistry, ConsulStats};
pub use source::{ConsulArgs, ConsulKind};

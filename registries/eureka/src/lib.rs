//! meshfed's Eureka registry: the only crate that talks to Eureka.
//!
//! [`EurekaRegistry::start`] follows a Eureka server's registry the way Eureka's own
//! clients do (`DiscoveryClient`): `GET apps` in full first, then every fetch interval
//! `GET apps/delta`, applying its `ADDED` / `MODIFIED` / `DELETED` instances to a local
//! copy and comparing the copy's reconcile hash code with the delta's
//! `apps__hashcode`; a mismatch fetches everything again. Every application `WEB`
//! becomes `web.eureka` (suffix configurable) in one namespace; its instances are its
//! endpoints (`http` and `https` ports, `UP` healthy, metadata as labels, zones as
//! localities). One writer task owns the loop and all state; the returned
//! [`EurekaRegistry`] is the read side the aggregate holds, a snapshot swapped in
//! atomically. An unreachable or failing Eureka is retried with backoff (and the next
//! server tried) while the last known view is served and the registry reports itself
//! stale.
//!
//! - [`config`]: [`EurekaConfig`], the servers and their credentials, the setup [`Error`].
//! - [`api`]: the HTTP client ([`EurekaClient`], failover) and Eureka's JSON shapes.
//! - [`apps`]: the local copy ([`LocalApps`]): full fetch, delta, reconcile hash code.
//! - [`convert`]: the pure conversions (ports, health, labels, locality).
//! - [`registry`]: the read handle and its counters ([`EurekaStats`]).
//! - [`source`]: the registry as the server starts it ([`EurekaKind`]: `--registries
//!   Eureka` and the `--eureka*` flags).
//! - `fake` (feature `test-support`): a fake Eureka server for tests here and in the
//!   crates that use this one.

pub mod api;
pub mod apps;
pub mod config;
pub mod convert;
#[cfg(feature = "test-support")]
pub mod fake;
pub mod registry;
pub mod source;
mod writer;

pub use api::{ApiError, EurekaClient, InstanceStatus};
pub use apps::LocalApps;
pub use config::{Credentials, Error, EurekaConfig, EurekaServer, Result};
pub use registry::{EurekaRegistry, EurekaStats, FullReason};
pub use source::{EurekaArgs, EurekaKind};

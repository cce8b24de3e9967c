//! meshfed's service model and the registry side of the control plane.
//!
//! - [`model`]: hostnames, services, ports, endpoints and the ids that tie them to a
//!   registry and cluster.
//! - [`endpoints`]: the endpoint index, one shard per registry per service.
//! - [`events`]: what registries tell the push pipeline, and the [`UpdateSink`] they
//!   tell it through.
//! - [`registry`]: the [`ServiceRegistry`] read trait and the frozen
//!   [`WorkloadLookup`] it hands out; [`aggregate`]: all registries
//!   behind one view with an explicit merge policy.
//! - [`memory`]: the in-memory (mock) registry; [`mock_file`]: the same, fed from a
//!   watched YAML file.
//! - [`follow`]: the one driver of every watched file (the follow loop, settle,
//!   backoff, last good content, the emptied-file rule).
//! - [`watch`]: watching config files and directories so that every kind of writer
//!   (in place, atomic rename, ConfigMap symlink swap) is noticed; [`read`]: reading
//!   them (regular files only, a size limit, settled content, retries).
//! - [`config`]: Istio config objects (VirtualService, DestinationRule, ...): model,
//!   validation, the [`ConfigStore`] trait, the memory and config-directory stores.
//! - [`serviceentry`]: the ServiceEntry / WorkloadEntry registry (provider `External`),
//!   fed from config stores.
//! - [`source`]: a registry as a source the server starts ([`RegistrySource`], its
//!   command-line side [`RegistryKind`]), and the mock and ServiceEntry sources.
//! - [`workload_instances`]: the WorkloadEntries the ServiceEntry registry publishes
//!   for Kubernetes Services to select.
//! - [`metrics`]: how the components here (and in the registry crates) define and
//!   register the Prometheus metrics of the state they own.

pub mod aggregate;
pub mod analysis;
pub mod catalog;
pub mod config;
pub mod endpoints;
pub mod events;
pub mod follow;
pub mod memory;
pub mod metrics;
pub mod mock_file;
pub mod model;
pub mod read;
pub mod registry;
pub mod serviceentry;
pub mod source;
pub mod watch;
pub mod workload_instances;

pub use aggregate::{Aggregate, Conflict, ConflictReason, MergedServices, WorkloadSources};
pub use config::{ConfigStore, FileConfigStore, MemoryConfigStore, RejectedConfig};
pub use endpoints::{EndpointIndex, EndpointPush, EndpointShards};
pub use events::{ConfigKey, ConfigKind, PushRequest, RegistryEvent, TriggerReason, UpdateSink};
pub use memory::{MemoryRegistry, ServiceWithEndpoints};
pub use mock_file::{
    MockFileError, MockFileOptions, MockFileStatus, load_mock_registry, parse_mock_registry,
    run_mock_file,
};
pub use model::*;
pub use registry::{NetworkGateway, ServiceRegistry, WorkloadLookup, WorkloadQuery};
pub use serviceentry::{ServiceEntryConfig, ServiceEntryRegistry};
pub use source::{RegistryKind, RegistrySource, SourceContext, StartedSource};
pub use watch::{PathWatcher, WatchError};
pub use workload_instances::{WorkloadEntryFeed, WorkloadEntryInstance};

/// Istio log scopes of this crate (`--log_output_level scope:level`) and the tracing
/// target each covers.
pub const LOG_SCOPES: &[(&str, &str)] = &[
    ("model", "meshfed_registry"),
    ("registry", "meshfed_registry"),
];

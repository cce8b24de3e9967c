//! A registry as a source the server starts: the one trait every registry crate
//! implements, and what the server hands it.
//!
//! - [`RegistryKind`]: a kind of registry as the command line knows it: its name in
//!   `--registries`, its flags (a `clap::Args` struct of its own crate), its log scopes,
//!   and the [`RegistrySource`] its flags describe.
//! - [`RegistrySource`]: one configured registry; [`RegistrySource::start`] starts it
//!   with what the server gives ([`SourceContext`]: the aggregate, the update sink, the
//!   shutdown signal, the task set) and returns a [`StartedSource`]: its readiness, its
//!   metrics and a handle for whoever needs more of it.
//!
//! The server lists the kinds it is built with in one place; adding a registry is a
//! crate implementing both traits and one line in that list.
//!
//! The implementations of this crate: the mock registry ([`mock`]) and the
//! ServiceEntry / WorkloadEntry registry ([`service_entries`], always on, not chosen in
//! `--registries`).

pub mod mock;
pub mod service_entries;

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::task::JoinSet;

use crate::aggregate::Aggregate;
use crate::events::UpdateSink;
use crate::model::{ClusterId, NetworkId};
use crate::workload_instances::WorkloadEntryFeed;

pub use mock::{EMBEDDED_MOCK_REGISTRY, MockArgs, MockKind, MockSource};
pub use service_entries::ServiceEntrySource;

/// Any error a source reports; the server adds no context of its own, so the message
/// says what failed (see [`SourceError`]).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A boxed future, for the object-safe [`RegistrySource::start`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An error with what was being done when it happened (`starting the Consul registry
/// (http://...)`) and its cause, which stays reachable through `source()`.
#[derive(Debug)]
pub struct SourceError {
    context: String,
    cause: Option<BoxError>,
}

impl SourceError {
    /// `cause`, while `context`.
    pub fn new(context: impl Into<String>, cause: impl Into<BoxError>) -> Self {
        SourceError {
            context: context.into(),
            cause: Some(cause.into()),
        }
    }

    /// A message with no cause (a bad flag combination).
    pub fn msg(message: impl Into<String>) -> Self {
        SourceError {
            context: message.into(),
            cause: None,
        }
    }
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.context)
    }
}

impl std::error::Error for SourceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Settings of the server that more than one registry kind reads from the command line.
#[derive(Clone, Debug)]
pub struct CommonSettings {
    /// The control plane's own cluster id (`--clusterID`).
    pub cluster_id: ClusterId,
    /// Istio's system namespace (`--systemNamespace`).
    pub system_namespace: String,
}

/// A kind of registry as the command line knows it. The server's list of kinds adds
/// every kind's flags to `meshfed discovery`, builds the source of each kind that
/// `--registries` names, and knows every kind's log scopes.
pub trait RegistryKind: Sync {
    /// Its name in `--registries` (also accepted in lower case), e.g. `Consul`.
    fn name(&self) -> &'static str;

    /// Istio log scopes (`--log_output_level scope:level`) of its crate, with the
    /// tracing target (module path) each covers.
    fn log_scopes(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }

    /// Adds its flags to the command (typically `TheArgs::augment_args(cmd)` of its
    /// own `clap::Args` struct).
    fn augment_args(&self, cmd: clap::Command) -> clap::Command;

    /// The registry its flags describe, when `--registries` names it.
    fn source(
        &self,
        flags: &clap::ArgMatches,
        common: &CommonSettings,
    ) -> Result<Arc<dyn RegistrySource>, BoxError>;

    /// Checks its flags when `--registries` does not name it (a flag given for a
    /// registry that is off is an error, not ignored).
    fn check_unselected(&self, _flags: &clap::ArgMatches) -> Result<(), BoxError> {
        Ok(())
    }

    /// True when `--registries` is absent and the environment says this registry is
    /// the one to use (a kubeconfig is present). The first detected kind is the
    /// default; with none, the mock registry's bundled example.
    fn detected(&self, _flags: &clap::ArgMatches) -> bool {
        false
    }
}

/// A meshNetworks gateway given by `registryServiceName` for one cluster: the service
/// whose external addresses lead into `network`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RegistryServiceGateway {
    /// The network behind the gateway.
    pub network: NetworkId,
    /// The gateway service's hostname.
    pub hostname: String,
    /// The gateway's mTLS port.
    pub port: u16,
}

type GatewayFn = dyn Fn(&ClusterId) -> Vec<RegistryServiceGateway> + Send + Sync;

/// The meshNetworks `registryServiceName` gateways of a cluster, answered from the
/// mesh settings in force (they reload).
#[derive(Clone)]
pub struct MeshGatewayLookup(Arc<GatewayFn>);

impl MeshGatewayLookup {
    /// Gateways from `lookup(cluster id)`.
    pub fn new(
        lookup: impl Fn(&ClusterId) -> Vec<RegistryServiceGateway> + Send + Sync + 'static,
    ) -> Self {
        MeshGatewayLookup(Arc::new(lookup))
    }

    /// No gateways.
    pub fn none() -> Self {
        MeshGatewayLookup::new(|_| Vec::new())
    }

    /// The gateways of `cluster`.
    pub fn for_cluster(&self, cluster: &ClusterId) -> Vec<RegistryServiceGateway> {
        (self.0)(cluster)
    }

    /// The lookup as a shared function.
    pub fn into_fn(self) -> Arc<GatewayFn> {
        self.0
    }
}

impl fmt::Debug for MeshGatewayLookup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MeshGatewayLookup(..)")
    }
}

type StopFn = dyn Fn() -> BoxFuture<'static, ()> + Send + Sync;

/// The server's shutdown, as futures a source's tasks wait on.
#[derive(Clone)]
pub struct StopSignal(Arc<StopFn>);

impl StopSignal {
    /// `wait()` makes one future that resolves at shutdown.
    pub fn new(wait: impl Fn() -> BoxFuture<'static, ()> + Send + Sync + 'static) -> Self {
        StopSignal(Arc::new(wait))
    }

    /// Resolves at shutdown.
    pub fn wait(&self) -> BoxFuture<'static, ()> {
        (self.0)()
    }
}

impl fmt::Debug for StopSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StopSignal(..)")
    }
}

/// What the server gives a source when it starts it.
pub struct SourceContext<'a> {
    /// The control plane's own cluster id.
    pub cluster_id: &'a ClusterId,
    /// DNS domain suffix (`--domain`).
    pub domain: &'a str,
    /// The mesh trust domain.
    pub trust_domain: &'a str,
    /// Size limit of every watched file (`--maxConfigFileSize`).
    pub max_file_size: u64,
    /// How long readiness waits for the remote clusters present at start.
    pub remote_cluster_timeout: Duration,
    /// meshNetworks `registryServiceName` gateways.
    pub mesh_gateways: &'a MeshGatewayLookup,
    /// The WorkloadEntries the ServiceEntry source publishes, for the Services of the
    /// config cluster's Kubernetes registry to select.
    pub workload_entries: &'a WorkloadEntryFeed,
    /// Where the source adds its registries.
    pub aggregate: &'a Arc<Aggregate>,
    /// Where its registries report changes.
    pub sink: &'a UpdateSink,
    /// Shutdown, for its tasks.
    pub stop: &'a StopSignal,
    /// Its long-running tasks go here; shutdown waits for them.
    pub tasks: &'a mut JoinSet<()>,
}

impl fmt::Debug for SourceContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceContext")
            .field("cluster_id", self.cluster_id)
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

/// One configured registry. `Any`, so that the server can recognise the kinds that
/// also have typed settings in its Rust API.
pub trait RegistrySource: Any + Send + Sync + fmt::Debug {
    /// Starts it: adds its registries to the aggregate, spawns its tasks, and returns
    /// once the registries are added (their initial sync shows in readiness).
    fn start<'a>(
        &'a self,
        ctx: SourceContext<'a>,
    ) -> BoxFuture<'a, Result<StartedSource, BoxError>>;
}

/// What readiness waits for in a source beyond its registries' `has_synced`.
pub trait SourceReadiness: Send + Sync + fmt::Debug {
    /// What still blocks readiness. `within_remote_timeout`: the start-up window in
    /// which remote clusters present at start are waited for is still open.
    fn pending(&self, within_remote_timeout: bool) -> Vec<String>;

    /// Clusters judged by [`SourceReadiness::pending`], not as local registries.
    fn remote_clusters(&self) -> Vec<ClusterId> {
        Vec::new()
    }
}

/// Registers the metrics of a started source.
pub type RegisterMetrics = Box<dyn FnOnce(&mut Registry) + Send>;

/// A started source.
#[derive(Default)]
pub struct StartedSource {
    /// Readiness beyond its registries' initial sync.
    pub readiness: Option<Arc<dyn SourceReadiness>>,
    /// Defines the metrics of the state it owns (read on every scrape).
    pub metrics: Option<RegisterMetrics>,
    /// What else it offers the server or an embedding program (the Kubernetes
    /// client, the mock file's load counters), found by type.
    pub handle: Option<Arc<dyn Any + Send + Sync>>,
}

impl StartedSource {
    /// Its handle, when it is a `T`.
    pub fn handle<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.handle.clone()?.downcast::<T>().ok()
    }
}

impl fmt::Debug for StartedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StartedSource")
            .field("readiness", &self.readiness)
            .field("metrics", &self.metrics.is_some())
            .field("handle", &self.handle.is_some())
            .finish()
    }
}

/// Parses a duration flag the way every `meshfed discovery` duration flag is read
/// (`100ms`, `2s`, `1m30s`); never negative.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d: meshfed_api::Duration = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    Duration::try_from(d).map_err(|_| format!("{s:?}: must not be negative"))
}

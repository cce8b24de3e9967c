//! The ServiceEntry / WorkloadEntry registry as a source: always on, over every config
//! store (provider `External`, the control plane's own cluster id).

use std::sync::Arc;

use super::{BoxError, BoxFuture, RegistrySource, SourceContext, StartedSource};
use crate::config::ConfigStore;
use crate::serviceentry::{ServiceEntryConfig, ServiceEntryRegistry};

/// The ServiceEntry registry over `stores`.
#[derive(Clone, Debug)]
pub struct ServiceEntrySource {
    /// The config stores whose ServiceEntries and WorkloadEntries it reads.
    pub stores: Vec<Arc<dyn ConfigStore>>,
}

impl RegistrySource for ServiceEntrySource {
    fn start<'a>(
        &'a self,
        ctx: SourceContext<'a>,
    ) -> BoxFuture<'a, Result<StartedSource, BoxError>> {
        Box::pin(async move {
            let config = ServiceEntryConfig {
                cluster_id: ctx.cluster_id.clone(),
                trust_domain: ctx.trust_domain.to_string(),
            };
            let registry = ServiceEntryRegistry::with_workload_feed(
                config,
                self.stores.clone(),
                ctx.sink.clone(),
                Some(ctx.workload_entries.clone()),
            );
            ctx.tasks.spawn(registry.clone().run(ctx.stop.wait()));
            ctx.aggregate.add_registry(Arc::new(registry.clone()));
            Ok(StartedSource {
                handle: Some(Arc::new(registry)),
                ..StartedSource::default()
            })
        })
    }
}

//! The mock registry as a source: the bundled example or a watched YAML file
//! (`--registries Mock`, `--mockRegistryFile`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, FromArgMatches};
use tracing::{error, info};

use super::{
    BoxError, BoxFuture, CommonSettings, RegistryKind, RegistrySource, SourceContext, SourceError,
    StartedSource,
};
use crate::memory::MemoryRegistry;
use crate::mock_file::{self, MockFileStatus};

/// The mock registry served when no file is given: a small echo service, so a
/// newcomer sees `meshfed discovery` serve at once.
pub const EMBEDDED_MOCK_REGISTRY: &str = include_str!("../../../../examples/mock-registry.yaml");

/// Where the mock registry comes from.
#[derive(Clone, Debug)]
pub enum MockSource {
    /// No mock registry.
    None,
    /// The bundled example ([`EMBEDDED_MOCK_REGISTRY`]).
    Embedded,
    /// A watched YAML file.
    File(PathBuf),
}

/// The mock registry's flags.
#[derive(Args, Clone, Debug)]
pub struct MockArgs {
    /// YAML file for the Mock registry (watched; edits apply live). Without it the
    /// bundled example is served.
    #[arg(long = "mockRegistryFile")]
    pub mock_registry_file: Option<PathBuf>,
}

/// `--registries Mock`.
#[derive(Clone, Copy, Debug)]
pub struct MockKind;

impl RegistryKind for MockKind {
    fn name(&self) -> &'static str {
        "Mock"
    }

    fn augment_args(&self, cmd: clap::Command) -> clap::Command {
        MockArgs::augment_args(cmd)
    }

    fn source(
        &self,
        flags: &clap::ArgMatches,
        _common: &CommonSettings,
    ) -> Result<Arc<dyn RegistrySource>, BoxError> {
        let args = MockArgs::from_arg_matches(flags)?;
        Ok(Arc::new(match args.mock_registry_file {
            Some(path) => MockSource::File(path),
            None => MockSource::Embedded,
        }))
    }

    fn check_unselected(&self, flags: &clap::ArgMatches) -> Result<(), BoxError> {
        if MockArgs::from_arg_matches(flags)?
            .mock_registry_file
            .is_some()
        {
            return Err(SourceError::msg(
                "--mockRegistryFile needs the Mock registry in --registries",
            )
            .into());
        }
        Ok(())
    }
}

impl RegistrySource for MockSource {
    fn start<'a>(
        &'a self,
        ctx: SourceContext<'a>,
    ) -> BoxFuture<'a, Result<StartedSource, BoxError>> {
        Box::pin(async move { self.start_now(ctx) })
    }
}

impl MockSource {
    fn start_now(&self, ctx: SourceContext<'_>) -> Result<StartedSource, BoxError> {
        match self {
            MockSource::None => Ok(StartedSource::default()),
            MockSource::Embedded => {
                let registry = MemoryRegistry::new(ctx.cluster_id.clone(), ctx.sink.clone());
                let services = mock_file::parse_mock_registry(
                    Path::new("<embedded mock-registry.yaml>"),
                    EMBEDDED_MOCK_REGISTRY,
                )
                .map_err(|e| SourceError::new("the embedded mock registry is invalid", e))?;
                registry.replace_all(services);
                ctx.aggregate.add_registry(Arc::new(registry));
                info!("mock registry: embedded example (use --mockRegistryFile to serve your own)");
                Ok(StartedSource::default())
            }
            MockSource::File(path) => {
                let registry =
                    MemoryRegistry::new_unsynced(ctx.cluster_id.clone(), ctx.sink.clone());
                ctx.aggregate.add_registry(Arc::new(registry.clone()));
                let status = MockFileStatus::new();
                let stop = ctx.stop.wait();
                let task_status = status.clone();
                let path = path.clone();
                let options = mock_file::MockFileOptions {
                    max_file_size: ctx.max_file_size,
                    ..mock_file::MockFileOptions::default()
                };
                info!(file = %path.display(), "mock registry: following file");
                ctx.tasks.spawn(async move {
                    if let Err(err) =
                        mock_file::run_mock_file(path, registry, task_status, options, stop).await
                    {
                        error!("mock registry file: {err}");
                    }
                });
                let metrics = status.clone();
                Ok(StartedSource {
                    readiness: None,
                    metrics: Some(Box::new(move |registry| metrics.register_metrics(registry))),
                    handle: Some(Arc::new(status)),
                })
            }
        }
    }
}

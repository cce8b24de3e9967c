//! The Consul registry as a source: `--registries Consul` and the `--consul*` flags.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, FromArgMatches};
use meshfed_registry::source::{
    BoxError, BoxFuture, CommonSettings, RegistryKind, RegistrySource, SourceContext, SourceError,
    StartedSource, parse_duration,
};
use tracing::info;

use crate::{ConsulConfig, ConsulRegistry};

/// Istio log scopes of this crate and the tracing target each covers.
pub const LOG_SCOPES: &[(&str, &str)] = &[("consul", "meshfed_consul")];

/// The Consul registry's flags.
#[derive(Args, Clone, Debug)]
pub struct ConsulArgs {
    /// Consul HTTP API address (with `--registries Consul`).
    #[arg(long = "consulserverURL", default_value = "http://127.0.0.1:8500")]
    pub consul_url: String,
    /// Consul: delay before retrying a failed query, doubled per further failure up to
    /// 30s. Changes are followed with blocking queries, not polled.
    #[arg(long = "consulserverInterval", default_value = "2s", value_parser = parse_duration)]
    pub consul_interval: Duration,
    /// Consul ACL token, sent as X-Consul-Token (else --consulTokenFile, else the
    /// CONSUL_HTTP_TOKEN environment variable).
    #[arg(long = "consulToken")]
    pub consul_token: Option<String>,
    /// File holding the Consul ACL token.
    #[arg(long = "consulTokenFile")]
    pub consul_token_file: Option<PathBuf>,
    /// PEM CA certificate(s) to trust for an https Consul URL.
    #[arg(long = "consulCACert")]
    pub consul_ca_cert: Option<PathBuf>,
    /// Consul datacenter to read; also the registry's cluster id. Default: the agent's.
    #[arg(long = "consulDatacenter")]
    pub consul_datacenter: Option<String>,
    /// Consul services become `<name>.<suffix>`; `{dc}` in the suffix is replaced by the
    /// datacenter (`service.{dc}.consul`).
    #[arg(long = "consulDomainSuffix", default_value = "service.consul")]
    pub consul_domain_suffix: String,
    /// Mesh namespace of the Consul services.
    #[arg(long = "consulNamespace", default_value = "default")]
    pub consul_namespace: String,
}

impl ConsulArgs {
    /// The registry's settings from the flags (the token read from its file or
    /// `CONSUL_HTTP_TOKEN` when not given).
    pub fn settings(&self) -> Result<ConsulConfig, SourceError> {
        let token = match (&self.consul_token, &self.consul_token_file) {
            (Some(token), _) => Some(token.clone()),
            (None, Some(file)) => Some(
                std::fs::read_to_string(file)
                    .map_err(|e| {
                        SourceError::new(format!("--consulTokenFile {}", file.display()), e)
                    })?
                    .trim()
                    .to_string(),
            ),
            (None, None) => std::env::var("CONSUL_HTTP_TOKEN").ok(),
        };
        Ok(ConsulConfig {
            token: token.filter(|t| !t.is_empty()),
            ca_cert: self.consul_ca_cert.clone(),
            datacenter: self.consul_datacenter.clone(),
            domain_suffix: self.consul_domain_suffix.clone(),
            namespace: self.consul_namespace.as_str().into(),
            retry_interval: self.consul_interval,
            max_retry_interval: self.consul_interval.max(Duration::from_secs(30)),
            ..ConsulConfig::new(&self.consul_url)
        })
    }
}

/// `--registries Consul`.
#[derive(Clone, Copy, Debug)]
pub struct ConsulKind;

impl RegistryKind for ConsulKind {
    fn name(&self) -> &'static str {
        "Consul"
    }

    fn log_scopes(&self) -> &'static [(&'static str, &'static str)] {
        LOG_SCOPES
    }

    fn augment_args(&self, cmd: clap::Command) -> clap::Command {
        ConsulArgs::augment_args(cmd)
    }

    fn source(
        &self,
        flags: &clap::ArgMatches,
        _common: &CommonSettings,
    ) -> Result<Arc<dyn RegistrySource>, BoxError> {
        Ok(Arc::new(ConsulArgs::from_arg_matches(flags)?.settings()?))
    }
}

impl RegistrySource for ConsulConfig {
    fn start<'a>(
        &'a self,
        ctx: SourceContext<'a>,
    ) -> BoxFuture<'a, Result<StartedSource, BoxError>> {
        Box::pin(async move {
            let (registry, writer) =
                ConsulRegistry::start(self.clone(), ctx.sink.clone(), ctx.stop.wait())
                    .await
                    .map_err(|e| {
                        SourceError::new(format!("starting the Consul registry ({})", self.url), e)
                    })?;
            info!(
                url = %self.url, datacenter = registry.datacenter(),
                "Consul registry started; /ready waits for its initial sync"
            );
            ctx.aggregate.add_registry(registry.clone());
            ctx.tasks.spawn(async move {
                let _ = writer.await;
            });
            let metrics = registry.clone();
            Ok(StartedSource {
                readiness: None,
                metrics: Some(Box::new(move |r| metrics.register_metrics(r))),
                handle: Some(registry),
            })
        })
    }
}

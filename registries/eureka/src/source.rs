//! The Eureka registry as a source: `--registries Eureka` and the `--eureka*` flags.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{Args, FromArgMatches};
use meshfed_registry::Locality;
use meshfed_registry::source::{
    BoxError, BoxFuture, CommonSettings, RegistryKind, RegistrySource, SourceContext, SourceError,
    StartedSource, parse_duration,
};
use tracing::info;

use crate::config::{Credentials, EurekaServer, parse_zone_locality};
use crate::{EurekaConfig, EurekaRegistry};

/// Istio log scopes of this crate and the tracing target each covers.
pub const LOG_SCOPES: &[(&str, &str)] = &[("eureka", "meshfed_eureka")];

/// The Eureka registry's flags.
#[derive(Args, Clone, Debug)]
pub struct EurekaArgs {
    /// Eureka service URL(s) (with `--registries Eureka`), comma-separated as Eureka
    /// clients' `serviceUrl.defaultZone`: tried in order, the next one when a server
    /// cannot be reached or answers 5xx. `http://user:password@host:8761/eureka` sends
    /// basic auth.
    #[arg(
        long = "eurekaServerURL",
        default_value = "http://127.0.0.1:8761/eureka",
        value_delimiter = ','
    )]
    pub eureka_urls: Vec<String>,
    /// Eureka: basic-auth user for the URLs without user info (the password is read
    /// from --eurekaPasswordFile).
    #[arg(long = "eurekaUsername")]
    pub eureka_username: Option<String>,
    /// File holding the basic-auth password of --eurekaUsername.
    #[arg(long = "eurekaPasswordFile")]
    pub eureka_password_file: Option<PathBuf>,
    /// Eureka: time between two fetches of the delta (Eureka clients'
    /// registryFetchIntervalSeconds).
    #[arg(long = "eurekaFetchInterval", default_value = "30s", value_parser = parse_duration)]
    pub eureka_fetch_interval: Duration,
    /// Eureka applications become `<app>.<suffix>`, lower-cased.
    #[arg(long = "eurekaDomainSuffix", default_value = "eureka")]
    pub eureka_domain_suffix: String,
    /// Mesh namespace of the Eureka applications.
    #[arg(long = "eurekaNamespace", default_value = "default")]
    pub eureka_namespace: String,
    /// Cluster id of the Eureka registry's endpoints (its shard is `Eureka/<id>`).
    #[arg(long = "eurekaClusterID", default_value = "eureka")]
    pub eureka_cluster_id: String,
    /// Locality region of the Eureka endpoints (default: from an AWS availability zone,
    /// else none).
    #[arg(long = "eurekaRegion")]
    pub eureka_region: Option<String>,
    /// Eureka zone -> locality, `zone=region/zone[/subzone]`, comma-separated or
    /// repeated; overrides --eurekaRegion for that zone.
    #[arg(long = "eurekaZoneLocality", value_delimiter = ',', value_parser = parse_zone_locality)]
    pub eureka_zone_localities: Vec<(String, Locality)>,
}

impl EurekaArgs {
    /// The registry's settings from the flags (the password read from its file).
    pub fn settings(&self) -> Result<EurekaConfig, SourceError> {
        let servers = self
            .eureka_urls
            .iter()
            .filter(|u| !u.trim().is_empty())
            .map(|u| EurekaServer::parse(u))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SourceError::new("--eurekaServerURL", e))?;
        let credentials = match (&self.eureka_username, &self.eureka_password_file) {
            (None, None) => None,
            (Some(username), Some(file)) => Some(Credentials {
                username: username.clone(),
                password: std::fs::read_to_string(file)
                    .map_err(|e| {
                        SourceError::new(format!("--eurekaPasswordFile {}", file.display()), e)
                    })?
                    .trim_end_matches(['\r', '\n'])
                    .to_string(),
            }),
            _ => {
                return Err(SourceError::msg(
                    "--eurekaUsername and --eurekaPasswordFile go together",
                ));
            }
        };
        let config = EurekaConfig {
            servers,
            credentials,
            fetch_interval: self.eureka_fetch_interval,
            retry_interval: self.eureka_fetch_interval.min(Duration::from_secs(1)),
            domain_suffix: self.eureka_domain_suffix.clone(),
            namespace: self.eureka_namespace.as_str().into(),
            cluster_id: self.eureka_cluster_id.clone(),
            region: self.eureka_region.clone().filter(|r| !r.is_empty()),
            zone_localities: self.eureka_zone_localities.iter().cloned().collect(),
            ..EurekaConfig::default()
        };
        config
            .validate()
            .map_err(|e| SourceError::new("the Eureka registry flags", e))?;
        Ok(config)
    }
}

/// `--registries Eureka`.
#[derive(Clone, Copy, Debug)]
pub struct EurekaKind;

impl RegistryKind for EurekaKind {
    fn name(&self) -> &'static str {
        "Eureka"
    }

    fn log_scopes(&self) -> &'static [(&'static str, &'static str)] {
        LOG_SCOPES
    }

    fn augment_args(&self, cmd: clap::Command) -> clap::Command {
        EurekaArgs::augment_args(cmd)
    }

    fn source(
        &self,
        flags: &clap::ArgMatches,
        _common: &CommonSettings,
    ) -> Result<Arc<dyn RegistrySource>, BoxError> {
        Ok(Arc::new(EurekaArgs::from_arg_matches(flags)?.settings()?))
    }

    /// A `--eureka*` flag given while `--registries` leaves Eureka out is an error.
    fn check_unselected(&self, flags: &clap::ArgMatches) -> Result<(), BoxError> {
        let own = EurekaArgs::augment_args(clap::Command::new("eureka"));
        for arg in own.get_arguments() {
            if flags.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine) {
                return Err(SourceError::msg(format!(
                    "--{} needs the Eureka registry in --registries",
                    arg.get_long().unwrap_or_default()
                ))
                .into());
            }
        }
        Ok(())
    }
}

impl RegistrySource for EurekaConfig {
    fn start<'a>(
        &'a self,
        ctx: SourceContext<'a>,
    ) -> BoxFuture<'a, Result<StartedSource, BoxError>> {
        Box::pin(async move {
            let (registry, writer) =
                EurekaRegistry::start(self.clone(), ctx.sink.clone(), ctx.stop.wait())
                    .map_err(|e| SourceError::new("starting the Eureka registry", e))?;
            info!(
                servers = ?self.server_urls(), cluster = %self.cluster_id,
                "Eureka registry started; /ready waits for its first fetch"
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        eureka: EurekaArgs,
    }

    #[test]
    fn flags_give_settings() {
        let cli = Cli::try_parse_from([
            "t",
            "--eurekaServerURL",
            "http://a:s3cr3t@e1:8761/eureka,http://e2:8761/eureka",
            "--eurekaFetchInterval",
            "5s",
            "--eurekaZoneLocality",
            "zone1=east/east-1a,zone2=east/east-1b",
        ])
        .unwrap();
        let c = cli.eureka.settings().unwrap();
        assert_eq!(
            c.server_urls(),
            ["http://e1:8761/eureka/", "http://e2:8761/eureka/"]
        );
        assert_eq!(c.servers[0].credentials.as_ref().unwrap().username, "a");
        assert_eq!(c.fetch_interval, Duration::from_secs(5));
        assert_eq!(c.zone_localities.len(), 2);
        assert!(!format!("{c:?}").contains("s3cr3t"));
        let cli = Cli::try_parse_from(["t", "--eurekaUsername", "u"]).unwrap();
        assert!(
            cli.eureka
                .settings()
                .unwrap_err()
                .to_string()
                .contains("go together")
        );
        let cli = Cli::try_parse_from(["t", "--eurekaServerURL", "h:1"]).unwrap();
        assert!(cli.eureka.settings().is_err());
    }

    #[test]
    fn eureka_flags_without_the_registry_are_refused() {
        let matches = Cli::command()
            .try_get_matches_from(["t", "--eurekaRegion", "east"])
            .unwrap();
        let err = EurekaKind.check_unselected(&matches).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--eurekaRegion needs the Eureka registry in --registries"
        );
        let defaults = Cli::command().try_get_matches_from(["t"]).unwrap();
        assert!(EurekaKind.check_unselected(&defaults).is_ok());
    }
}

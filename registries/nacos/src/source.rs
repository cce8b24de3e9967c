//! The Nacos registry as a source: `--registries Nacos` and the `--nacos*` flags.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, FromArgMatches};
use meshfed_registry::source::{
    BoxError, BoxFuture, CommonSettings, RegistryKind, RegistrySource, SourceContext, SourceError,
    StartedSource, parse_duration,
};
use meshfed_registry::{Locality, Namespace};
use tracing::info;

use crate::NacosRegistry;
use crate::config::{Credentials, NacosConfig, Transport, server_url};

/// Istio log scopes of this crate and the tracing target each covers.
pub const LOG_SCOPES: &[(&str, &str)] = &[("nacos", "meshfed_nacos")];

/// The Nacos registry's flags.
#[derive(Args, Clone, Debug)]
pub struct NacosArgs {
    /// Nacos servers' HTTP addresses, comma separated (`host:port`, or a URL whose path
    /// is the context path; default path /nacos). gRPC is at each port +
    /// --nacosGrpcPortOffset.
    #[arg(
        long = "nacosServerAddrs",
        default_value = "127.0.0.1:8848",
        value_delimiter = ','
    )]
    pub nacos_server_addrs: Vec<String>,
    /// Nacos namespace ids to read, comma separated (`public`: the default namespace).
    #[arg(
        long = "nacosNamespaceId",
        default_value = "public",
        value_delimiter = ','
    )]
    pub nacos_namespace_id: Vec<String>,
    /// Nacos groups to read in each namespace, comma separated.
    #[arg(
        long = "nacosGroups",
        default_value = "DEFAULT_GROUP",
        value_delimiter = ','
    )]
    pub nacos_groups: Vec<String>,
    /// Nacos username (logs in at /v1/auth/login; with --nacosPassword or
    /// --nacosPasswordFile).
    #[arg(long = "nacosUsername")]
    pub nacos_username: Option<String>,
    /// Nacos password (prefer --nacosPasswordFile: a flag shows in the process list).
    #[arg(long = "nacosPassword")]
    pub nacos_password: Option<String>,
    /// File holding the Nacos password.
    #[arg(long = "nacosPasswordFile")]
    pub nacos_password_file: Option<PathBuf>,
    /// File holding a Nacos access token issued beforehand (re-read at every
    /// connection), instead of a username and password.
    #[arg(long = "nacosTokenFile")]
    pub nacos_token_file: Option<PathBuf>,
    /// Access key for Nacos's access-key signature (with --nacosSecretKeyFile).
    #[arg(long = "nacosAccessKey")]
    pub nacos_access_key: Option<String>,
    /// File holding the secret key of --nacosAccessKey.
    #[arg(long = "nacosSecretKeyFile")]
    pub nacos_secret_key_file: Option<PathBuf>,
    /// Nacos services become `<service>.<group>.<namespace id>.<suffix>` (lower case,
    /// `_` written `-`).
    #[arg(long = "nacosDomainSuffix", default_value = "nacos")]
    pub nacos_domain_suffix: String,
    /// Mesh namespace of the Nacos services.
    #[arg(long = "nacosMeshNamespace", default_value = "default")]
    pub nacos_mesh_namespace: String,
    /// Cluster id of the Nacos registry (its shard is `Nacos/<id>`).
    #[arg(long = "nacosClusterID", default_value = "nacos")]
    pub nacos_cluster_id: String,
    /// Locality of a Nacos cluster's instances, `<clusterName>=<region>[/<zone>[/<subzone>]]`,
    /// comma separated; `*=` is the locality of unlisted clusters.
    #[arg(long = "nacosClusterLocality", value_delimiter = ',')]
    pub nacos_cluster_locality: Vec<String>,
    /// How to read Nacos: `auto` (gRPC push, else the HTTP API polled), `grpc` or `http`.
    #[arg(long = "nacosTransport", default_value = "auto", value_parser = Transport::parse)]
    pub nacos_transport: Transport,
    /// The gRPC port is the HTTP port plus this (Nacos's nacos.server.grpc.port.offset).
    #[arg(long = "nacosGrpcPortOffset", default_value_t = 1000)]
    pub nacos_grpc_port_offset: u16,
    /// How often service lists are read again (instances are pushed over gRPC); over
    /// HTTP, also how often every service's instances are read.
    #[arg(long = "nacosRefreshInterval", default_value = "30s", value_parser = parse_duration)]
    pub nacos_refresh_interval: Duration,
    /// Delay before retrying after a failure, doubled per further failure up to 30s.
    #[arg(long = "nacosRetryInterval", default_value = "2s", value_parser = parse_duration)]
    pub nacos_retry_interval: Duration,
}

fn read_secret(flag: &str, path: &PathBuf) -> Result<String, SourceError> {
    Ok(std::fs::read_to_string(path)
        .map_err(|e| SourceError::new(format!("{flag} {}", path.display()), e))?
        .trim()
        .to_string())
}

/// Parses `--nacosClusterLocality` entries.
pub fn parse_localities(entries: &[String]) -> Result<BTreeMap<String, Locality>, String> {
    let mut out = BTreeMap::new();
    for entry in entries.iter().filter(|e| !e.trim().is_empty()) {
        let Some((cluster, locality)) = entry.split_once('=') else {
            return Err(format!(
                "--nacosClusterLocality {entry:?}: expected <clusterName>=<region>[/<zone>[/<subzone>]]"
            ));
        };
        let cluster = cluster.trim();
        if cluster.is_empty() || out.contains_key(cluster) {
            return Err(format!(
                "--nacosClusterLocality {entry:?}: empty or repeated cluster name"
            ));
        }
        out.insert(cluster.to_string(), Locality::parse(locality.trim()));
    }
    Ok(out)
}

impl NacosArgs {
    /// The registry's settings from the flags (secrets read from their files).
    pub fn settings(&self) -> Result<NacosConfig, SourceError> {
        let password = match (&self.nacos_password, &self.nacos_password_file) {
            (Some(_), Some(_)) => {
                return Err(SourceError::msg(
                    "give --nacosPassword or --nacosPasswordFile, not both",
                ));
            }
            (Some(p), None) => Some(p.clone()),
            (None, Some(file)) => Some(read_secret("--nacosPasswordFile", file)?),
            (None, None) => None,
        };
        let secret_key = self
            .nacos_secret_key_file
            .as_ref()
            .map(|f| read_secret("--nacosSecretKeyFile", f))
            .transpose()?;
        let servers = self
            .nacos_server_addrs
            .iter()
            .map(|s| server_url(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SourceError::new("--nacosServerAddrs", e))?;
        let config = NacosConfig {
            servers,
            namespaces: self.nacos_namespace_id.clone(),
            groups: self.nacos_groups.clone(),
            credentials: Credentials {
                username: self.nacos_username.clone(),
                password,
                token_file: self.nacos_token_file.clone(),
                access_key: self.nacos_access_key.clone(),
                secret_key,
            },
            domain_suffix: self.nacos_domain_suffix.clone(),
            mesh_namespace: Namespace::new(&self.nacos_mesh_namespace),
            cluster_id: self.nacos_cluster_id.clone(),
            localities: parse_localities(&self.nacos_cluster_locality).map_err(SourceError::msg)?,
            transport: self.nacos_transport,
            grpc_port_offset: self.nacos_grpc_port_offset,
            refresh_interval: self.nacos_refresh_interval,
            retry_interval: self.nacos_retry_interval,
            max_retry_interval: self.nacos_retry_interval.max(Duration::from_secs(30)),
            ..NacosConfig::default()
        };
        config
            .validate()
            .map_err(|e| SourceError::new("the --nacos* flags", e))?;
        Ok(config)
    }
}

/// `--registries Nacos`.
#[derive(Clone, Copy, Debug)]
pub struct NacosKind;

impl RegistryKind for NacosKind {
    fn name(&self) -> &'static str {
        "Nacos"
    }

    fn log_scopes(&self) -> &'static [(&'static str, &'static str)] {
        LOG_SCOPES
    }

    fn augment_args(&self, cmd: clap::Command) -> clap::Command {
        NacosArgs::augment_args(cmd)
    }

    fn source(
        &self,
        flags: &clap::ArgMatches,
        _common: &CommonSettings,
    ) -> Result<Arc<dyn RegistrySource>, BoxError> {
        Ok(Arc::new(NacosArgs::from_arg_matches(flags)?.settings()?))
    }
}

impl RegistrySource for NacosConfig {
    fn start<'a>(
        &'a self,
        ctx: SourceContext<'a>,
    ) -> BoxFuture<'a, Result<StartedSource, BoxError>> {
        Box::pin(async move {
            let (registry, task) =
                NacosRegistry::start(self.clone(), ctx.sink.clone(), ctx.stop.wait()).map_err(
                    |e| {
                        SourceError::new(
                            format!("starting the Nacos registry ({:?})", self.servers),
                            e,
                        )
                    },
                )?;
            info!(
                servers = ?self.servers, cluster = %self.cluster_id,
                "Nacos registry started; /ready waits for its initial sync"
            );
            ctx.aggregate.add_registry(registry.clone());
            ctx.tasks.spawn(async move {
                let _ = task.await;
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
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        nacos: NacosArgs,
    }

    #[test]
    fn flags_make_settings() {
        let cli = Cli::try_parse_from([
            "t",
            "--nacosServerAddrs",
            "10.0.0.1:8848,10.0.0.2:8848",
            "--nacosGroups",
            "DEFAULT_GROUP,pay",
            "--nacosClusterLocality",
            "HZ=cn/hz-a,*=cn",
            "--nacosTransport",
            "http",
        ])
        .unwrap();
        let c = cli.nacos.settings().unwrap();
        assert_eq!(c.servers[1], "http://10.0.0.2:8848/nacos");
        assert_eq!(c.groups, ["DEFAULT_GROUP", "pay"]);
        assert_eq!(c.localities["HZ"].zone, "hz-a");
        assert_eq!(c.transport, Transport::Http);
        assert!(parse_localities(&["HZ".into()]).is_err());
        let bad = Cli::try_parse_from(["t", "--nacosUsername", "nacos"]).unwrap();
        assert!(
            bad.nacos
                .settings()
                .unwrap_err()
                .to_string()
                .contains("nacos")
        );
    }
}

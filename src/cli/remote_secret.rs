//! `meshfed create-remote-secret`: prints the Secret that lets a control plane read
//! the cluster of the current kubeconfig context, as `istioctl create-remote-secret`
//! prints it (`meshfed_kube::remote_secret` does the work). Apply it in the cluster
//! meshfed runs in; meshfed's secret controller starts a registry for the cluster.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use meshfed_kube::remote_secret::{self, AuthType, RemoteSecretOptions, SecretType};
use serde::Deserialize;
use serde_json::Value;

/// The reader's ServiceAccount, ClusterRole and ClusterRoleBinding (deploy/remote),
/// created when the reader service account is missing.
pub const READER_MANIFEST: &str = include_str!("../../deploy/remote/reader.yaml");

/// `--type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SecretTypeArg {
    /// `istio-remote-secret-<name>`: a cluster whose services the control plane reads.
    Remote,
    /// `istio-kubeconfig` (key `config`): the config cluster of an external control
    /// plane (istiod's; meshfed reads no config cluster).
    Config,
}

/// `--auth-type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AuthTypeArg {
    /// The service account's token.
    BearerToken,
    /// A client-go auth-provider plugin (--auth-plugin-name, --auth-plugin-config).
    Plugin,
}

/// `meshfed create-remote-secret` (istioctl's flags).
#[derive(Args, Debug, Clone)]
pub struct RemoteSecretArgs {
    /// The cluster's name: the Secret's key and the cluster id meshfed gives it (a
    /// DNS-1123 label). Default: the UID of namespace kube-system.
    #[arg(long = "name")]
    pub name: Option<String>,
    /// The API server address written into the kubeconfig (default: the
    /// kubeconfig's, which must be reachable from the control plane's cluster).
    #[arg(long = "server")]
    pub server: Option<String>,
    /// tls-server-name of the kubeconfig (when --server is a proxy in front of the
    /// API server).
    #[arg(long = "tls-server-name")]
    pub tls_server_name: Option<String>,
    /// The service account whose token the kubeconfig carries. Default:
    /// istio-reader-service-account (--type remote), istiod (--type config).
    #[arg(long = "service-account")]
    pub service_account: Option<String>,
    /// Create the reader service account (with its ClusterRole and binding, as in
    /// deploy/remote) when it does not exist.
    #[arg(long = "create-service-account", default_value_t = true, action = clap::ArgAction::Set,
        num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub create_service_account: bool,
    /// The token Secret (type kubernetes.io/service-account-token, naming the service
    /// account) to take the token from; default: the first such Secret, else one
    /// created.
    #[arg(long = "secret-name")]
    pub secret_name: Option<String>,
    /// Which Secret to write.
    #[arg(long = "type", value_enum, default_value = "remote")]
    pub secret_type: SecretTypeArg,
    /// How the kubeconfig authenticates.
    #[arg(long = "auth-type", value_enum, default_value = "bearer-token")]
    pub auth_type: AuthTypeArg,
    /// The auth-provider plugin's name (--auth-type plugin).
    #[arg(long = "auth-plugin-name")]
    pub auth_plugin_name: Option<String>,
    /// The auth-provider plugin's configuration, key=value (comma separated).
    #[arg(long = "auth-plugin-config", value_delimiter = ',')]
    pub auth_plugin_config: Vec<String>,
    /// The namespace of the service account, and of the Secret (where meshfed reads
    /// remote secrets: its --clusterRegistriesNamespace).
    #[arg(short = 'i', long = "istioNamespace", default_value = "istio-system")]
    pub istio_namespace: String,
    /// The kubeconfig of the cluster to read (default: KUBECONFIG, ~/.kube/config).
    #[arg(short = 'c', long = "kubeconfig")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current one).
    #[arg(long = "context")]
    pub context: Option<String>,
}

/// The reader objects of [`READER_MANIFEST`].
pub fn reader_objects() -> Vec<Value> {
    serde_norway::Deserializer::from_str(READER_MANIFEST)
        .filter_map(|doc| Value::deserialize(doc).ok())
        .filter(|v| {
            matches!(
                v["kind"].as_str(),
                Some("ServiceAccount" | "ClusterRole" | "ClusterRoleBinding")
            )
        })
        .collect()
}

/// The options `args` ask for.
pub fn options(args: &RemoteSecretArgs) -> anyhow::Result<RemoteSecretOptions> {
    let auth = match args.auth_type {
        AuthTypeArg::BearerToken => {
            if args.auth_plugin_name.is_some() || !args.auth_plugin_config.is_empty() {
                bail!("--auth-plugin-name and --auth-plugin-config need --auth-type=plugin");
            }
            AuthType::BearerToken
        }
        AuthTypeArg::Plugin => {
            let Some(name) = args.auth_plugin_name.clone().filter(|n| !n.is_empty()) else {
                bail!("--auth-type=plugin needs --auth-plugin-name");
            };
            let mut config = BTreeMap::new();
            for pair in &args.auth_plugin_config {
                let Some((k, v)) = pair.split_once('=') else {
                    bail!("--auth-plugin-config {pair:?}: expected key=value");
                };
                config.insert(k.to_string(), v.to_string());
            }
            AuthType::Plugin { name, config }
        }
    };
    Ok(RemoteSecretOptions {
        cluster_name: args.name.clone(),
        service_account: args.service_account.clone(),
        create_service_account: args.create_service_account,
        secret_type: match args.secret_type {
            SecretTypeArg::Remote => SecretType::Remote,
            SecretTypeArg::Config => SecretType::Config,
        },
        auth,
        server: args.server.clone().filter(|s| !s.is_empty()),
        tls_server_name: args.tls_server_name.clone(),
        secret_name: args.secret_name.clone(),
        reader_objects: reader_objects(),
        ..RemoteSecretOptions::new(&args.istio_namespace)
    })
}

/// Runs the command: the Secret on stdout, warnings and what was created on stderr.
pub fn run(args: RemoteSecretArgs) -> anyhow::Result<std::process::ExitCode> {
    if let Some(name) = &args.name
        && !remote_secret::is_dns1123_label(name)
    {
        bail!("{name} is not a valid DNS 1123 label");
    }
    let opts = options(&args)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let created = runtime.block_on(async {
        let (client, server) = meshfed_kube::cli_client::cli_client(
            args.kubeconfig.as_deref(),
            args.context.as_deref(),
        )
        .await
        .map_err(|e| anyhow::anyhow!("Kubernetes API: {e}"))?;
        anyhow::Ok(remote_secret::create_remote_secret(&client, &server, &opts).await?)
    })?;
    for what in &created.created {
        eprintln!("created {what}");
    }
    for warning in &created.warnings {
        eprintln!("warn: {warning}");
    }
    print!("{}", created.secret.to_yaml());
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// deploy/remote: the reader account, a ClusterRole and a binding of one to the
    /// other, and a kustomization that installs exactly that file.
    #[test]
    fn the_reader_manifest_binds_the_reader_account_to_its_role() {
        let objects = reader_objects();
        let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
        );
        let (account, role, binding) = (&objects[0], &objects[1], &objects[2]);
        assert_eq!(
            account["metadata"]["name"],
            meshfed_kube::remote_secret::READER_SERVICE_ACCOUNT
        );
        assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
        assert_eq!(binding["subjects"][0]["name"], account["metadata"]["name"]);
        let rules = role["rules"].as_array().unwrap();
        assert!(
            rules
                .iter()
                .flat_map(|r| r["verbs"].as_array().unwrap())
                .all(|v| v == "list" || v == "watch"),
            "the reader only lists and watches: {rules:?}"
        );
        let kustomization: Value =
            serde_norway::from_str(include_str!("../../deploy/remote/kustomization.yaml")).unwrap();
        assert_eq!(
            kustomization["resources"],
            serde_json::json!(["reader.yaml"])
        );
        assert_eq!(kustomization["namespace"], "istio-system");
    }
}

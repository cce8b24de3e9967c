//! The client of a command-line tool (`meshfed vm bootstrap`, `meshfed
//! create-remote-secret`), found as kubectl and istioctl find theirs.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// A client for the cluster a command talks to and the API server address as its
/// kubeconfig writes it: the kubeconfig file `kubeconfig` when given, else the
/// `KUBECONFIG` variable or `~/.kube/config`, else the in-cluster service account;
/// the kubeconfig's `context`, else its current context.
pub async fn cli_client(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<(kube::Client, String), String> {
    let file = match kubeconfig {
        Some(path) => Some(
            Kubeconfig::read_from(path)
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?,
        ),
        None => Kubeconfig::read().ok(),
    };
    let (config, server) = match file {
        Some(file) => {
            let name = context
                .map(str::to_string)
                .or_else(|| file.current_context.clone())
                .unwrap_or_default();
            let server = file
                .contexts
                .iter()
                .find(|c| c.name == name)
                .and_then(|c| c.context.as_ref())
                .and_then(|c| file.clusters.iter().find(|cl| cl.name == c.cluster))
                .and_then(|cl| cl.cluster.as_ref())
                .and_then(|cl| cl.server.clone())
                .ok_or_else(|| {
                    format!("kubeconfig: could not find the cluster of context {name:?}")
                })?;
            let options = KubeConfigOptions {
                context: context.map(str::to_string),
                ..Default::default()
            };
            let config = kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| format!("kubeconfig: {e}"))?;
            (config, server)
        }
        None if context.is_some() => {
            return Err(
                "--context needs a kubeconfig (--kubeconfig, KUBECONFIG or ~/.kube/config)".into(),
            );
        }
        None => {
            let config = kube::Config::incluster().map_err(|e| {
                format!("no kubeconfig (--kubeconfig, KUBECONFIG or ~/.kube/config) and not in a cluster: {e}")
            })?;
            let server = config.cluster_url.to_string();
            (config, server)
        }
    };
    let client = kube::Client::try_from(config).map_err(|e| format!("building the client: {e}"))?;
    Ok((client, server))
}

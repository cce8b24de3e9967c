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

/// Every object `meshfed analyze` reads from a cluster, as documents (`apiVersion`
/// and `kind` set): the config kinds meshfed reads, Services, Pods and Namespaces;
/// of `namespace` only when given (Namespaces always). A kind whose CRD is not
/// installed is left out with a warning (the second list).
pub async fn list_for_analysis(
    client: &kube::Client,
    namespace: Option<&str>,
) -> Result<(Vec<serde_json::Value>, Vec<String>), String> {
    use kube::api::{Api, ApiResource, DynamicObject, ListParams};
    use meshfed_registry::config::Kind;

    let core = |kind: &str, plural: &str| ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    let mut resources = vec![
        core("Namespace", "namespaces"),
        core("Service", "services"),
        core("Pod", "pods"),
    ];
    resources.extend(Kind::ALL.into_iter().map(|k| ApiResource {
        group: k.group().into(),
        version: k.versions()[0].into(),
        api_version: k.api_version().into(),
        kind: k.as_str().into(),
        plural: k.plural().into(),
    }));
    let (mut out, mut warnings) = (Vec::new(), Vec::new());
    for resource in resources {
        let api: Api<DynamicObject> = match namespace {
            Some(ns) if resource.kind != "Namespace" => {
                Api::namespaced_with(client.clone(), ns, &resource)
            }
            _ => Api::all_with(client.clone(), &resource),
        };
        let list = match api.list(&ListParams::default()).await {
            Ok(list) => list,
            Err(kube::Error::Api(status)) if status.code == 404 => {
                warnings.push(format!(
                    "{}/{} is not served by the cluster (CRD not installed?): skipped",
                    resource.api_version, resource.plural
                ));
                continue;
            }
            Err(e) => return Err(format!("listing {}: {e}", resource.plural)),
        };
        for item in list.items {
            let mut value = serde_json::to_value(&item).map_err(|e| e.to_string())?;
            value["apiVersion"] = resource.api_version.clone().into();
            value["kind"] = resource.kind.clone().into();
            out.push(value);
        }
    }
    Ok((out, warnings))
}

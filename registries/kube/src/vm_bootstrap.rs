//! What `meshfed vm bootstrap` reads from (and asks of) the API server, as `istioctl x
//! workload entry configure` does: a WorkloadGroup by name, ConfigMap data (the mesh
//! config `istio[-<rev>]`, the injector's values, `istio-ca-root-cert`), a token from
//! the TokenRequest API, and the address of the gateway a VM reaches the control plane
//! through. The files themselves are written by the `meshfed` crate.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::Value;

/// A request the API server refused or could not answer.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct BootstrapKubeError {
    /// What was asked (`reading ConfigMap istio-system/istio`).
    pub what: String,
    #[source]
    pub source: kube::Error,
}

type Result<T> = std::result::Result<T, BootstrapKubeError>;

fn wrap(what: String) -> impl FnOnce(kube::Error) -> BootstrapKubeError {
    move |source| BootstrapKubeError { what, source }
}

fn not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}

/// The WorkloadGroup `namespace/name` as a JSON object (`networking.istio.io/v1`,
/// else `v1alpha3` on an older control plane), `None` when it does not exist.
pub async fn workload_group(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<Value>> {
    for version in ["v1", "v1alpha3"] {
        let gvk = GroupVersionKind::gvk("networking.istio.io", version, "WorkloadGroup");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "workloadgroups");
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        match api.get(name).await {
            Ok(object) => {
                let value = serde_json::to_value(object).map_err(|e| BootstrapKubeError {
                    what: format!("reading WorkloadGroup {namespace}/{name}"),
                    source: kube::Error::SerdeError(e),
                })?;
                return Ok(Some(value));
            }
            Err(err) if not_found(&err) => continue,
            Err(err) => {
                return Err(wrap(format!("reading WorkloadGroup {namespace}/{name}"))(
                    err,
                ));
            }
        }
    }
    Ok(None)
}

/// The data of ConfigMap `namespace/name`, `None` when it does not exist.
pub async fn config_map_data(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, String>>> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let map = api
        .get_opt(name)
        .await
        .map_err(wrap(format!("reading ConfigMap {namespace}/{name}")))?;
    Ok(map.map(|m| m.data.unwrap_or_default()))
}

/// A token of service account `namespace/account` for `audiences`, valid for
/// `seconds` (the TokenRequest API: `POST .../serviceaccounts/<account>/token`).
pub async fn request_token(
    client: &kube::Client,
    namespace: &str,
    account: &str,
    audiences: &[&str],
    seconds: i64,
) -> Result<String> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        metadata: kube::api::ObjectMeta {
            name: Some(account.to_string()),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        },
        spec: TokenRequestSpec {
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
            expiration_seconds: Some(seconds),
            bound_object_ref: None,
        },
        status: None,
    };
    let answer = api
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .map_err(wrap(format!(
            "could not create a token under service account {account} in namespace {namespace}"
        )))?;
    Ok(answer.status.map(|s| s.token).unwrap_or_default())
}

/// The address of Service `namespace/name` as istioctl takes it for the VM's `hosts`
/// file: its first LoadBalancer ingress IP (empty when that entry has a hostname
/// only), else its first external IP; `None` when the Service does not exist or has
/// neither.
pub async fn gateway_address(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<String>> {
    let api: Api<Service> = Api::namespaced(client.clone(), namespace);
    let Some(service) = api
        .get_opt(name)
        .await
        .map_err(wrap(format!("reading Service {namespace}/{name}")))?
    else {
        return Ok(None);
    };
    let ingress = service
        .status
        .and_then(|s| s.load_balancer)
        .and_then(|lb| lb.ingress)
        .unwrap_or_default();
    if let Some(first) = ingress.first() {
        return Ok(Some(first.ip.clone().unwrap_or_default()));
    }
    Ok(service
        .spec
        .and_then(|s| s.external_ips)
        .and_then(|ips| ips.into_iter().next()))
}

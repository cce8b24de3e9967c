//! Writes WorkloadEntries through the API server (auto-registration of VMs): create,
//! replace, replace the `status` subresource, delete. Reads are the config store's
//! ([`crate::KubeConfigStore`]); every write names the `resourceVersion` it was based
//! on, so two replicas never overwrite each other's change unseen. The verbs used
//! are exactly those `deploy/rbac.yaml` grants on `workloadentries` and
//! `workloadentries/status`.

use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, PostParams, Preconditions};
use meshfed_registry::config::{ConfigObject, Kind};

use crate::crd::plural;

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
pub enum EntryWriteError {
    /// 404.
    #[error("not found")]
    NotFound,
    /// 409 `AlreadyExists`.
    #[error("already exists")]
    AlreadyExists,
    /// 409 `Conflict`: the object changed since it was read.
    #[error("conflict: the object has been modified")]
    Conflict,
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// WorkloadEntry writes of one cluster.
#[derive(Clone)]
pub struct WorkloadEntryWriter {
    client: kube::Client,
    resource: ApiResource,
}

impl std::fmt::Debug for WorkloadEntryWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadEntryWriter")
            .field("api_version", &self.resource.api_version)
            .finish_non_exhaustive()
    }
}

impl WorkloadEntryWriter {
    /// Writes through `client` in `version` of `networking.istio.io` (the served one).
    pub fn new(client: kube::Client, version: &str) -> WorkloadEntryWriter {
        let kind = Kind::WorkloadEntry;
        WorkloadEntryWriter {
            client,
            resource: ApiResource {
                group: kind.group().to_string(),
                version: version.to_string(),
                api_version: format!("{}/{version}", kind.group()),
                kind: kind.as_str().to_string(),
                plural: plural(kind).to_string(),
            },
        }
    }

    fn api(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &self.resource)
    }

    fn object(&self, obj: &ConfigObject) -> Result<DynamicObject, EntryWriteError> {
        let mut value =
            serde_json::to_value(obj).map_err(|e| EntryWriteError::Other(e.to_string()))?;
        value["apiVersion"] = self.resource.api_version.clone().into();
        serde_json::from_value(value).map_err(|e| EntryWriteError::Other(e.to_string()))
    }

    /// `POST`: creates `obj` (its resourceVersion and status are not sent).
    pub async fn create(&self, obj: &ConfigObject) -> Result<(), EntryWriteError> {
        let mut object = self.object(obj)?;
        object.metadata.resource_version = None;
        if let Some(map) = object.data.as_object_mut() {
            map.remove("status");
        }
        self.api(&obj.namespace)
            .create(&PostParams::default(), &object)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    /// `PUT`: replaces metadata and spec, if still at `obj.resource_version`.
    pub async fn replace(&self, obj: &ConfigObject) -> Result<(), EntryWriteError> {
        let object = self.object(obj)?;
        self.api(&obj.namespace)
            .replace(&obj.name, &PostParams::default(), &object)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    /// `PUT .../status`: replaces the status conditions, if still at
    /// `obj.resource_version`.
    pub async fn replace_status(&self, obj: &ConfigObject) -> Result<(), EntryWriteError> {
        let mut object = self.object(obj)?;
        if obj.conditions.is_empty()
            && let Some(map) = object.data.as_object_mut()
        {
            map.insert("status".into(), serde_json::json!({"conditions": []}));
        }
        self.api(&obj.namespace)
            .replace_status(&obj.name, &PostParams::default(), &object)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    /// `DELETE`, if still at `resource_version` (when not empty).
    pub async fn delete(
        &self,
        namespace: &str,
        name: &str,
        resource_version: &str,
    ) -> Result<(), EntryWriteError> {
        let params = DeleteParams {
            preconditions: (!resource_version.is_empty()).then(|| Preconditions {
                resource_version: Some(resource_version.to_string()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        self.api(namespace)
            .delete(name, &params)
            .await
            .map(|_| ())
            .map_err(classify)
    }
}

fn classify(err: kube::Error) -> EntryWriteError {
    match &err {
        kube::Error::Api(status) if status.code == 404 => EntryWriteError::NotFound,
        kube::Error::Api(status) if status.code == 409 && status.reason == "AlreadyExists" => {
            EntryWriteError::AlreadyExists
        }
        kube::Error::Api(status) if status.code == 409 => EntryWriteError::Conflict,
        _ => EntryWriteError::Other(err.to_string()),
    }
}

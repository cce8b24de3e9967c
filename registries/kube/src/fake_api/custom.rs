//! Custom resources in the fake API server: the types a test installs (what a
//! CustomResourceDefinition declares), where their objects live, and the discovery
//! documents a client reads to find them.
//!
//! A custom resource is served under every version it lists, as the API server does
//! for a CRD without a conversion webhook: one set of objects (one resourceVersion
//! sequence, one history), each answered with `apiVersion` set to the version the
//! request named. A request for a group that has custom resources but not this
//! plural or version is `404 NotFound`, as for a CRD that is not installed. Groups
//! without any custom resource keep the typed behaviour (an unknown collection is an
//! empty list).

use std::cmp::Reverse;
use std::collections::BTreeSet;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use meshfed_registry::config::Kind;
use meshfed_registry::config::kinds::{Group, NETWORKING, SECURITY};

use super::ApiState;
use super::path::ApiPath;
use super::response::{json_response, status};

/// A custom resource type as a CRD declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CustomResource {
    /// API group (`networking.istio.io`).
    pub group: String,
    /// Kind (`VirtualService`).
    pub kind: String,
    /// Plural resource name, the collection's last path segment (`virtualservices`).
    pub plural: String,
    /// The versions served (`v1`, `v1beta1`, ...), in any order.
    pub versions: Vec<String>,
    /// Namespaced (true) or cluster-scoped.
    pub namespaced: bool,
}

impl CustomResource {
    /// A namespaced custom resource served in `versions`.
    pub fn new(group: &str, kind: &str, plural: &str, versions: &[&str]) -> CustomResource {
        CustomResource {
            group: group.to_string(),
            kind: kind.to_string(),
            plural: plural.to_string(),
            versions: versions.iter().map(|v| v.to_string()).collect(),
            namespaced: true,
        }
    }

    /// The CRDs of every kind meshfed reads of `group` (as declared in
    /// [`meshfed_registry::config::kinds`]), each served in those of `versions` the
    /// group has.
    fn istio_group(group: Group, versions: &[&str]) -> Vec<CustomResource> {
        // A kind may have fewer versions than its group (EnvoyFilter: v1alpha3 only).
        Kind::ALL
            .iter()
            .map(|kind| kind.info())
            .filter(|info| info.group.name == group.name)
            .filter_map(|info| {
                let served: Vec<&str> = versions
                    .iter()
                    .copied()
                    .filter(|v| group.versions.contains(v) && info.group.versions.contains(v))
                    .collect();
                (!served.is_empty())
                    .then(|| CustomResource::new(group.name, info.kind, info.plural, &served))
            })
            .collect()
    }

    /// The CRDs of the `networking.istio.io` kinds meshfed reads (VirtualService,
    /// DestinationRule, Gateway, ServiceEntry, WorkloadEntry, Sidecar, ...), each served
    /// in `versions`.
    pub fn istio_networking(versions: &[&str]) -> Vec<CustomResource> {
        CustomResource::istio_group(NETWORKING, versions)
    }

    /// The CRDs of the `security.istio.io` kinds meshfed reads (PeerAuthentication,
    /// RequestAuthentication, AuthorizationPolicy), each served in those of `versions`
    /// the group has (`v1`, `v1beta1`).
    pub fn istio_security(versions: &[&str]) -> Vec<CustomResource> {
        CustomResource::istio_group(SECURITY, versions)
    }

    /// Every Istio group meshfed reads: [`CustomResource::istio_networking`],
    /// [`CustomResource::istio_security`] and `telemetry.istio.io` (in those of
    /// `versions` each group has).
    pub fn istio(versions: &[&str]) -> Vec<CustomResource> {
        let mut out = CustomResource::istio_networking(versions);
        out.extend(CustomResource::istio_security(versions));
        out.extend(CustomResource::istio_group(
            meshfed_registry::config::kinds::TELEMETRY,
            versions,
        ));
        out.extend(CustomResource::istio_group(
            meshfed_registry::config::kinds::EXTENSIONS,
            versions,
        ));
        out
    }

    /// Where its objects are stored: `/apis/<group>/<plural>`, one collection for every
    /// version (typed collections have four path segments, so the two never meet).
    pub(super) fn collection(&self) -> String {
        format!("/apis/{}/{}", self.group, self.plural)
    }

    fn serves(&self, version: &str) -> bool {
        self.versions.iter().any(|v| v == version)
    }
}

/// How a request for a custom resource is answered: the version it asked for and the
/// kind, written into every object and list returned.
#[derive(Clone, Debug)]
pub(super) struct CustomView {
    /// `group/version` as requested.
    pub(super) api_version: String,
    /// The resource's kind.
    pub(super) kind: String,
}

impl CustomView {
    /// The object as this request sees it (its `apiVersion` set to the requested one).
    pub(super) fn present(&self, obj: &Value) -> Value {
        let mut obj = obj.clone();
        obj["apiVersion"] = json!(self.api_version);
        obj
    }
}

impl ApiState {
    /// The installed custom resource of `group` with this kind.
    pub(super) fn custom_by_kind(&self, group: &str, kind: &str) -> Option<&CustomResource> {
        self.crds
            .iter()
            .find(|crd| crd.group == group && crd.kind == kind)
    }

    fn has_group(&self, group: &str) -> bool {
        self.crds.iter().any(|crd| crd.group == group)
    }

    /// Points a parsed collection path at the custom resource it names. `Ok(None)`: not
    /// a custom resource group (typed handling applies); `Err`: the group has custom
    /// resources but not this plural in this version.
    pub(super) fn resolve_custom(
        &self,
        path: &mut ApiPath,
    ) -> Result<Option<CustomView>, NotServed> {
        let Some((group, version)) = path.api_version.split_once('/') else {
            return Ok(None);
        };
        if !self.has_group(group) {
            return Ok(None);
        }
        let found = self
            .crds
            .iter()
            .find(|crd| crd.group == group && crd.plural == path.plural && crd.serves(version));
        let Some(crd) = found else {
            return Err(NotServed);
        };
        let misplaced = if crd.namespaced {
            // A namespaced object is read by name only within its namespace.
            path.name.is_some() && path.namespace.is_none()
        } else {
            path.namespace.is_some()
        };
        if misplaced {
            return Err(NotServed);
        }
        path.collection = crd.collection();
        Ok(Some(CustomView {
            api_version: path.api_version.clone(),
            kind: crd.kind.clone(),
        }))
    }

    /// The discovery documents of custom resource groups: `/apis/<group>` (APIGroup)
    /// and `/apis/<group>/<version>` (APIResourceList). `None` for any other path.
    pub(super) fn discovery(&self, path: &str) -> Option<Response> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        match segments.as_slice() {
            ["apis", group] if self.has_group(group) => Some(self.api_group(group)),
            ["apis", group, version] if self.has_group(group) => {
                Some(self.resource_list(group, version))
            }
            _ => None,
        }
    }

    /// The served versions of `group`, most preferred first (Kubernetes' order: GA, then
    /// beta, then alpha; higher numbers first).
    fn group_versions(&self, group: &str) -> Vec<String> {
        let versions: BTreeSet<&str> = self
            .crds
            .iter()
            .filter(|crd| crd.group == group)
            .flat_map(|crd| crd.versions.iter().map(String::as_str))
            .collect();
        let mut versions: Vec<String> = versions.into_iter().map(str::to_string).collect();
        versions.sort_by_key(|v| (Reverse(version_priority(v)), v.clone()));
        versions
    }

    fn api_group(&self, group: &str) -> Response {
        let versions: Vec<Value> = self
            .group_versions(group)
            .iter()
            .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
            .collect();
        let body = json!({
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": versions,
            "preferredVersion": versions.first().cloned().unwrap_or(Value::Null),
        });
        json_response(StatusCode::OK, &body)
    }

    fn resource_list(&self, group: &str, version: &str) -> Response {
        let mut resources = Vec::new();
        for crd in self
            .crds
            .iter()
            .filter(|crd| crd.group == group && crd.serves(version))
        {
            let singular = crd.kind.to_lowercase();
            resources.push(json!({
                "name": crd.plural,
                "singularName": singular,
                "namespaced": crd.namespaced,
                "kind": crd.kind,
                "verbs": ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"],
                "categories": ["istio-io"],
            }));
            // Istio's CRDs have a status subresource; clients must skip such entries.
            resources.push(json!({
                "name": format!("{}/status", crd.plural),
                "singularName": "",
                "namespaced": crd.namespaced,
                "kind": crd.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if resources.is_empty() {
            return not_found();
        }
        let body = json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": format!("{group}/{version}"),
            "resources": resources,
        });
        json_response(StatusCode::OK, &body)
    }
}

/// A custom resource path that nothing serves (answered with [`not_found`]).
#[derive(Debug)]
pub(super) struct NotServed;

/// What the API server answers for a path nothing serves.
pub(super) fn not_found() -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource".into(),
    )
}

/// Kubernetes' version order as a sortable key: stability (GA 2, beta 1, alpha 0),
/// major, minor. Versions outside the `v<major>[alpha|beta<minor>]` form sort last.
pub(super) fn version_priority(version: &str) -> Option<(u8, u32, u32)> {
    let rest = version.strip_prefix('v')?;
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let major: u32 = rest[..digits].parse().ok()?;
    let suffix = &rest[digits..];
    if suffix.is_empty() {
        return Some((2, major, 0));
    }
    let (stability, minor) = if let Some(minor) = suffix.strip_prefix("beta") {
        (1, minor)
    } else if let Some(minor) = suffix.strip_prefix("alpha") {
        (0, minor)
    } else {
        return None;
    };
    let minor = if minor.is_empty() {
        0
    } else {
        minor.parse().ok()?
    };
    Some((stability, major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_the_kubernetes_way() {
        let mut state = ApiState::default();
        state.crds.push(CustomResource::new(
            "g.io",
            "K",
            "ks",
            &["v1alpha3", "v1", "v2beta1", "v1beta1", "foo", "v2"],
        ));
        assert_eq!(
            state.group_versions("g.io"),
            ["v2", "v1", "v2beta1", "v1beta1", "v1alpha3", "foo"]
        );
        assert_eq!(version_priority("v1beta12"), Some((1, 1, 12)));
        assert_eq!(version_priority("x1"), None);
    }

    async fn body(response: Response) -> (u16, Value) {
        let code = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (code, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn discovery_documents_and_paths_follow_the_installed_versions() {
        let mut state = ApiState::default();
        state
            .crds
            .extend(CustomResource::istio_networking(&["v1alpha3", "v1beta1"]));
        let (code, group) = body(state.discovery("/apis/networking.istio.io").unwrap()).await;
        assert_eq!(code, 200);
        assert_eq!(group["kind"], "APIGroup");
        assert_eq!(group["preferredVersion"]["version"], "v1beta1");
        assert_eq!(
            group["versions"][1]["groupVersion"],
            "networking.istio.io/v1alpha3"
        );
        let (_, list) = body(
            state
                .discovery("/apis/networking.istio.io/v1beta1")
                .unwrap(),
        )
        .await;
        assert_eq!(list["kind"], "APIResourceList");
        assert_eq!(list["resources"][0]["name"], "virtualservices");
        assert_eq!(list["resources"][1]["name"], "virtualservices/status");
        let (code, _) = body(state.discovery("/apis/networking.istio.io/v1").unwrap()).await;
        assert_eq!(code, 404, "a version not served");
        assert!(
            state.discovery("/apis/apps").is_none(),
            "not a custom group"
        );

        let mut path = super::super::path::collection_path(
            "/apis/networking.istio.io/v1beta1/namespaces/a/sidecars",
        )
        .unwrap();
        let view = state.resolve_custom(&mut path).unwrap().unwrap();
        assert_eq!(path.collection, "/apis/networking.istio.io/sidecars");
        assert_eq!(
            view.present(&json!({"apiVersion": "x"}))["apiVersion"],
            "networking.istio.io/v1beta1"
        );
        for missing in [
            "/apis/networking.istio.io/v1/sidecars",
            "/apis/networking.istio.io/v1beta1/telemetries",
            "/apis/networking.istio.io/v1beta1/sidecars/name-without-namespace",
        ] {
            let mut path = super::super::path::collection_path(missing).unwrap();
            assert!(state.resolve_custom(&mut path).is_err(), "{missing}");
        }
        let mut typed = super::super::path::collection_path("/apis/apps/v1/deployments").unwrap();
        assert!(state.resolve_custom(&mut typed).unwrap().is_none());
    }
}

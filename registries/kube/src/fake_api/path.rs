//! Request paths of the fake API server, split into collection, API version, plural,
//! namespace and name (shared by the router, `http`, and the custom resources).

/// A request path split into its parts.
pub(super) struct ApiPath {
    /// `/api/v1/pods`.
    pub(super) collection: String,
    /// `v1` or `group/version`.
    pub(super) api_version: String,
    /// The resource's plural name (`pods`).
    pub(super) plural: String,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    /// `status` of `.../<name>/status`.
    pub(super) subresource: Option<String>,
}

/// `path` split into its parts; `None` for a path that names no collection.
pub(super) fn collection_path(path: &str) -> Option<ApiPath> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (prefix, api_version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => (format!("/api/{version}"), version.to_string(), rest),
        ["apis", group, version, rest @ ..] => (
            format!("/apis/{group}/{version}"),
            format!("{group}/{version}"),
            rest,
        ),
        _ => return None,
    };
    let (namespace, plural, name, subresource) = match rest {
        [plural] => (None, *plural, None, None),
        ["namespaces", ns, plural] => (Some(ns.to_string()), *plural, None, None),
        ["namespaces", ns, plural, name] => {
            (Some(ns.to_string()), *plural, Some(name.to_string()), None)
        }
        ["namespaces", ns, plural, name, sub] => (
            Some(ns.to_string()),
            *plural,
            Some(name.to_string()),
            Some(sub.to_string()),
        ),
        [plural, name] => (None, *plural, Some(name.to_string()), None),
        _ => return None,
    };
    Some(ApiPath {
        collection: format!("{prefix}/{plural}"),
        api_version,
        plural: plural.to_string(),
        namespace,
        name,
        subresource,
    })
}

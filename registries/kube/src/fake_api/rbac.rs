//! RBAC for the fake API server: a [`RbacPolicy`] of ClusterRole and Role rules, the
//! request attributes the API server authorises (verb, API group, resource, namespace;
//! or a non-resource path), and the `403 Forbidden` answer to a request no rule grants.
//!
//! The attributes follow the API server's request-info rules: `/api/<v>/...` is the
//! core group `""`, `/apis/<group>/<v>/...` a named group, `namespaces/<ns>/<resource>`
//! sets the namespace; a GET without an object name is `list`, or `watch` with
//! `watch=true`; paths shorter than a resource path (`/api`, `/apis/<group>`,
//! `/apis/<group>/<v>`, `/version`) are non-resource URLs.

use std::collections::BTreeMap;
use std::fmt;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::RecordedRequest;
use super::response::json_response;

/// The user named in `Forbidden` messages unless [`RbacPolicy::user`] says otherwise:
/// the service account deploy/ runs meshfed as.
pub const DEFAULT_USER: &str = "system:serviceaccount:istio-system:meshfed";

/// The non-resource URLs Kubernetes' default `system:discovery` and
/// `system:public-info-viewer` ClusterRoles let every authenticated user `get`. A
/// trailing `*` matches any suffix, as in RBAC rules.
pub const DEFAULT_DISCOVERY_URLS: &[&str] = &[
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/readyz",
    "/openapi",
    "/openapi/*",
    "/version",
    "/version/",
];

/// One RBAC policy rule: resource rules name API groups, resources (with
/// `resource/subresource` for subresources) and optionally object names; non-resource
/// rules name URL paths. `*` matches anything, as in Kubernetes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyRule {
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
    pub non_resource_urls: Vec<String>,
    pub verbs: Vec<String>,
}

/// Where a rule applies: every namespace and cluster-scoped objects (a ClusterRole), or
/// one namespace (a Role).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    Cluster,
    Namespace(String),
}

/// The rules a user holds. Requests no rule grants are answered `403 Forbidden`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbacPolicy {
    user: String,
    rules: Vec<(Scope, PolicyRule)>,
    discovery_defaults: bool,
}

impl Default for RbacPolicy {
    fn default() -> Self {
        RbacPolicy::new(DEFAULT_USER)
    }
}

/// What the API server authorises a request as.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RequestAttributes {
    /// A request for an API object or collection.
    Resource {
        verb: String,
        api_group: String,
        /// `pods`, or `pods/status` for a subresource.
        resource: String,
        /// Empty for a cluster-wide request.
        namespace: String,
        /// Empty for a collection.
        name: String,
    },
    /// Any other path (discovery documents, `/version`, health checks).
    NonResource { verb: String, path: String },
}

/// One grant of a policy, the unit [`RbacPolicy::unused_grants`] reports: a verb on a
/// resource of a group in a scope, or a verb on a non-resource URL.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Grant {
    Resource {
        scope: Scope,
        api_group: String,
        resource: String,
        verb: String,
    },
    NonResource {
        url: String,
        verb: String,
    },
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Grant::Resource {
                scope,
                api_group,
                resource,
                verb,
            } => {
                let group = if api_group.is_empty() {
                    "core"
                } else {
                    api_group
                };
                match scope {
                    Scope::Cluster => write!(f, "ClusterRole: {verb} {group}/{resource}"),
                    Scope::Namespace(ns) => write!(f, "Role in {ns}: {verb} {group}/{resource}"),
                }
            }
            Grant::NonResource { url, verb } => write!(f, "ClusterRole: {verb} {url}"),
        }
    }
}

impl RbacPolicy {
    /// A policy for `user` with no rules of its own; the default discovery URLs are
    /// allowed (see [`RbacPolicy::without_discovery_defaults`]).
    pub fn new(user: impl Into<String>) -> RbacPolicy {
        RbacPolicy {
            user: user.into(),
            rules: Vec::new(),
            discovery_defaults: true,
        }
    }

    /// Builds the policy from ClusterRole and Role objects (as parsed from YAML or
    /// JSON; other kinds are skipped). A Role's rules apply in its `metadata.namespace`,
    /// or in `role_namespace` when it has none (as a kustomization's `namespace:`
    /// sets it). Bindings are not read: every role is taken as bound to the user.
    pub fn from_roles<'a>(
        objects: impl IntoIterator<Item = &'a Value>,
        role_namespace: &str,
    ) -> Result<RbacPolicy, String> {
        let mut policy = RbacPolicy::default();
        for object in objects {
            let scope = match object["kind"].as_str() {
                Some("ClusterRole") => Scope::Cluster,
                Some("Role") => Scope::Namespace(
                    object["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or(role_namespace)
                        .to_string(),
                ),
                _ => continue,
            };
            let name = object["metadata"]["name"].as_str().unwrap_or("<unnamed>");
            let rules = match &object["rules"] {
                Value::Null => continue,
                Value::Array(rules) => rules,
                other => return Err(format!("{name}: rules is not a list: {other}")),
            };
            for rule in rules {
                let rule = parse_rule(rule).map_err(|e| format!("{name}: {e}"))?;
                policy = policy.allow(scope.clone(), rule);
            }
        }
        Ok(policy)
    }

    /// Names the user in `Forbidden` messages.
    pub fn user(mut self, user: impl Into<String>) -> RbacPolicy {
        self.user = user.into();
        self
    }

    /// Adds a rule in `scope`.
    pub fn allow(mut self, scope: Scope, rule: PolicyRule) -> RbacPolicy {
        self.rules.push((scope, rule));
        self
    }

    /// Drops the default discovery URLs ([`DEFAULT_DISCOVERY_URLS`]), as on a cluster
    /// whose `system:discovery` binding was narrowed: only the policy's own rules grant.
    pub fn without_discovery_defaults(mut self) -> RbacPolicy {
        self.discovery_defaults = false;
        self
    }

    /// Whether a request with these attributes is allowed.
    pub fn allows(&self, request: &RequestAttributes) -> bool {
        if let RequestAttributes::NonResource { verb, path } = request
            && self.discovery_defaults
            && verb == "get"
            && DEFAULT_DISCOVERY_URLS.iter().any(|u| url_matches(u, path))
        {
            return true;
        }
        self.rules
            .iter()
            .any(|(scope, rule)| rule_grants(scope, rule, request))
    }

    /// Every grant of the policy (each verb of each resource of each group, per scope;
    /// each verb of each non-resource URL), in order.
    pub fn grants(&self) -> Vec<Grant> {
        let mut out = Vec::new();
        for (scope, rule) in &self.rules {
            for verb in &rule.verbs {
                for url in &rule.non_resource_urls {
                    out.push(Grant::NonResource {
                        url: url.clone(),
                        verb: verb.clone(),
                    });
                }
                for api_group in &rule.api_groups {
                    for resource in &rule.resources {
                        out.push(Grant::Resource {
                            scope: scope.clone(),
                            api_group: api_group.clone(),
                            resource: resource.clone(),
                            verb: verb.clone(),
                        });
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// The grants no allowed request among `requests` used: what the policy gives
    /// beyond what the client asked for.
    pub fn unused_grants(&self, requests: &[RecordedRequest]) -> Vec<Grant> {
        let attributes: Vec<RequestAttributes> = requests
            .iter()
            .filter(|r| !r.denied)
            .map(RecordedRequest::attributes)
            .collect();
        self.grants()
            .into_iter()
            .filter(|grant| !attributes.iter().any(|a| grant_covers(grant, a)))
            .collect()
    }

    /// The API server's answer to a request this policy does not allow.
    pub(super) fn forbidden(&self, request: &RequestAttributes) -> Response {
        let user = &self.user;
        let (message, details) = match request {
            RequestAttributes::Resource {
                verb,
                api_group,
                resource,
                namespace,
                name,
            } => {
                let (plural, subresource) = match resource.split_once('/') {
                    Some((plural, sub)) => (plural, Some(sub)),
                    None => (resource.as_str(), None),
                };
                let object = if name.is_empty() {
                    plural.to_string()
                } else {
                    format!("{plural} {name:?}")
                };
                let scope = if namespace.is_empty() {
                    "at the cluster scope".to_string()
                } else {
                    format!("in the namespace {namespace:?}")
                };
                let what = match subresource {
                    Some(_) => resource.clone(),
                    None => plural.to_string(),
                };
                let mut details = json!({ "group": api_group, "kind": plural });
                if !name.is_empty() {
                    details["name"] = json!(name);
                }
                (
                    format!(
                        "{object} is forbidden: User {user:?} cannot {verb} resource {what:?} in API group {api_group:?} {scope}"
                    ),
                    details,
                )
            }
            RequestAttributes::NonResource { verb, path } => (
                format!("forbidden: User {user:?} cannot {verb} path {path:?}"),
                json!({}),
            ),
        };
        let body = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": "Forbidden",
            "details": details,
            "code": 403,
        });
        json_response(StatusCode::FORBIDDEN, &body)
    }
}

fn parse_rule(rule: &Value) -> Result<PolicyRule, String> {
    let list = |field: &str| -> Result<Vec<String>, String> {
        match &rule[field] {
            Value::Null => Ok(Vec::new()),
            Value::Array(items) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| format!("{field}: not a string: {v}"))
                })
                .collect(),
            other => Err(format!("{field} is not a list: {other}")),
        }
    };
    let parsed = PolicyRule {
        api_groups: list("apiGroups")?,
        resources: list("resources")?,
        resource_names: list("resourceNames")?,
        non_resource_urls: list("nonResourceURLs")?,
        verbs: list("verbs")?,
    };
    if parsed.verbs.is_empty() {
        return Err(format!("a rule without verbs: {rule}"));
    }
    if parsed.resources.is_empty() == parsed.non_resource_urls.is_empty() {
        return Err(format!(
            "a rule names resources or nonResourceURLs, one of them: {rule}"
        ));
    }
    Ok(parsed)
}

fn has(list: &[String], value: &str) -> bool {
    list.iter().any(|v| v == "*" || v == value)
}

/// A rule's resource entry against a request's `resource` (`pods`, `pods/status`):
/// exact, `*`, `*/<sub>` or `<resource>/*`.
fn resource_matches(entry: &str, resource: &str) -> bool {
    if entry == "*" || entry == resource {
        return true;
    }
    match (entry.split_once('/'), resource.split_once('/')) {
        (Some(("*", sub)), Some((_, want))) => sub == want,
        (Some((plural, "*")), Some((want, _))) => plural == want,
        _ => false,
    }
}

/// A rule's URL (a trailing `*` is a prefix match) against a request path.
fn url_matches(entry: &str, path: &str) -> bool {
    match entry.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => entry == path,
    }
}

fn rule_grants(scope: &Scope, rule: &PolicyRule, request: &RequestAttributes) -> bool {
    match request {
        RequestAttributes::Resource {
            verb,
            api_group,
            resource,
            namespace,
            name,
        } => {
            let in_scope = match scope {
                Scope::Cluster => true,
                Scope::Namespace(ns) => ns == namespace,
            };
            in_scope
                && has(&rule.verbs, verb)
                && has(&rule.api_groups, api_group)
                && rule.resources.iter().any(|r| resource_matches(r, resource))
                && (rule.resource_names.is_empty() || rule.resource_names.contains(name))
        }
        // Only a ClusterRole's non-resource rules count (a Role cannot hold them).
        RequestAttributes::NonResource { verb, path } => {
            *scope == Scope::Cluster
                && has(&rule.verbs, verb)
                && rule.non_resource_urls.iter().any(|u| url_matches(u, path))
        }
    }
}

fn grant_covers(grant: &Grant, request: &RequestAttributes) -> bool {
    match (grant, request) {
        (
            Grant::Resource {
                scope,
                api_group,
                resource,
                verb,
            },
            RequestAttributes::Resource {
                verb: v,
                api_group: g,
                resource: r,
                namespace,
                ..
            },
        ) => {
            let in_scope = match scope {
                Scope::Cluster => true,
                Scope::Namespace(ns) => ns == namespace,
            };
            in_scope
                && (verb == "*" || verb == v)
                && (api_group == "*" || api_group == g)
                && resource_matches(resource, r)
        }
        (Grant::NonResource { url, verb }, RequestAttributes::NonResource { verb: v, path }) => {
            (verb == "*" || verb == v) && url_matches(url, path)
        }
        _ => false,
    }
}

/// `watch` parameter values the API server reads as true (Go's `strconv.ParseBool`).
fn is_true(value: Option<&String>) -> bool {
    matches!(
        value.map(String::as_str),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True")
    )
}

impl RequestAttributes {
    /// The attributes of `method` on `path` with `query`, as the API server's
    /// request-info resolver derives them.
    pub fn of(method: &str, path: &str, query: &BTreeMap<String, String>) -> RequestAttributes {
        let non_resource = || RequestAttributes::NonResource {
            verb: method.to_ascii_lowercase(),
            path: path.to_string(),
        };
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (api_group, mut rest) = match parts.as_slice() {
            ["api", _version, rest @ ..] if !rest.is_empty() => ("", rest),
            ["apis", group, _version, rest @ ..] if !rest.is_empty() => (*group, rest),
            _ => return non_resource(),
        };
        // The deprecated `/watch/` prefix.
        let mut verb = match rest {
            ["watch", more @ ..] if !more.is_empty() => {
                rest = more;
                "watch"
            }
            _ => match method {
                "GET" | "HEAD" => "get",
                "POST" => "create",
                "PUT" => "update",
                "PATCH" => "patch",
                "DELETE" => "delete",
                _ => return non_resource(),
            },
        };
        let mut namespace = "";
        if let ["namespaces", ns, more @ ..] = rest {
            namespace = ns;
            // `namespaces/<ns>/status` and `/finalize` are the namespace's subresources.
            if !more.is_empty() && !matches!(more[0], "status" | "finalize") {
                rest = more;
            }
        }
        let resource = match rest {
            [resource, _name, sub, ..] => format!("{resource}/{sub}"),
            [resource, ..] => resource.to_string(),
            [] => return non_resource(),
        };
        let name = rest.get(1).copied().unwrap_or("");
        if name.is_empty() {
            verb = match verb {
                "get" if is_true(query.get("watch")) => "watch",
                "get" => "list",
                "delete" => "deletecollection",
                other => other,
            };
        }
        RequestAttributes::Resource {
            verb: verb.to_string(),
            api_group: api_group.to_string(),
            resource,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(method: &str, path: &str, query: &[(&str, &str)]) -> RequestAttributes {
        let query = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RequestAttributes::of(method, path, &query)
    }

    fn resource(verb: &str, group: &str, res: &str, ns: &str, name: &str) -> RequestAttributes {
        RequestAttributes::Resource {
            verb: verb.into(),
            api_group: group.into(),
            resource: res.into(),
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn non_resource(path: &str) -> RequestAttributes {
        RequestAttributes::NonResource {
            verb: "get".into(),
            path: path.into(),
        }
    }

    #[test]
    fn requests_map_to_the_api_servers_attributes() {
        assert_eq!(
            attrs("GET", "/api/v1/pods", &[]),
            resource("list", "", "pods", "", "")
        );
        assert_eq!(
            attrs("GET", "/api/v1/pods", &[("watch", "true")]),
            resource("watch", "", "pods", "", "")
        );
        assert_eq!(
            attrs("GET", "/api/v1/pods", &[("watch", "1")]),
            resource("watch", "", "pods", "", "")
        );
        assert_eq!(
            attrs("GET", "/api/v1/pods", &[("watch", "false")]),
            resource("list", "", "pods", "", "")
        );
        assert_eq!(
            attrs("GET", "/api/v1/namespaces/istio-system/configmaps", &[]),
            resource("list", "", "configmaps", "istio-system", "")
        );
        assert_eq!(
            attrs(
                "GET",
                "/api/v1/namespaces/istio-system/configmaps/istio",
                &[]
            ),
            resource("get", "", "configmaps", "istio-system", "istio")
        );
        assert_eq!(
            attrs("GET", "/api/v1/namespaces/default/pods/p/status", &[]),
            resource("get", "", "pods/status", "default", "p")
        );
        // A namespace object is in its own namespace.
        assert_eq!(
            attrs("GET", "/api/v1/namespaces/istio-system", &[]),
            resource("get", "", "namespaces", "istio-system", "istio-system")
        );
        assert_eq!(
            attrs("GET", "/api/v1/namespaces", &[("watch", "true")]),
            resource("watch", "", "namespaces", "", "")
        );
        assert_eq!(
            attrs("GET", "/apis/discovery.k8s.io/v1/endpointslices", &[]),
            resource("list", "discovery.k8s.io", "endpointslices", "", "")
        );
        assert_eq!(
            attrs(
                "GET",
                "/apis/networking.istio.io/v1/namespaces/default/virtualservices",
                &[("watch", "true")]
            ),
            resource(
                "watch",
                "networking.istio.io",
                "virtualservices",
                "default",
                ""
            )
        );
        assert_eq!(
            attrs("GET", "/api/v1/watch/namespaces/default/pods", &[]),
            resource("watch", "", "pods", "default", "")
        );
        for (method, verb) in [
            ("POST", "create"),
            ("PUT", "update"),
            ("PATCH", "patch"),
            ("DELETE", "delete"),
        ] {
            let name = if method == "POST" { "" } else { "a" };
            let path = if name.is_empty() {
                "/api/v1/namespaces/default/secrets".to_string()
            } else {
                format!("/api/v1/namespaces/default/secrets/{name}")
            };
            assert_eq!(
                attrs(method, &path, &[]),
                resource(verb, "", "secrets", "default", name)
            );
        }
        assert_eq!(
            attrs("DELETE", "/api/v1/namespaces/default/secrets", &[]),
            resource("deletecollection", "", "secrets", "default", "")
        );
        for path in [
            "/api",
            "/api/v1",
            "/apis",
            "/apis/networking.istio.io",
            "/apis/networking.istio.io/v1",
            "/version",
        ] {
            assert_eq!(attrs("GET", path, &[]), non_resource(path), "{path}");
        }
    }

    fn deploy_like() -> RbacPolicy {
        let roles = [
            json!({
                "kind": "ClusterRole",
                "metadata": {"name": "meshfed"},
                "rules": [
                    {"apiGroups": [""], "resources": ["services", "pods"], "verbs": ["list", "watch"]},
                    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]},
                    {"nonResourceURLs": ["/apis/networking.istio.io"], "verbs": ["get"]},
                ],
            }),
            json!({
                "kind": "Role",
                "metadata": {"name": "meshfed"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}],
            }),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "ignored"}}),
        ];
        RbacPolicy::from_roles(&roles, "istio-system").unwrap()
    }

    #[test]
    fn rules_grant_by_verb_group_resource_and_namespace() {
        let policy = deploy_like();
        assert!(policy.allows(&resource("list", "", "pods", "", "")));
        assert!(policy.allows(&resource("watch", "", "services", "default", "")));
        assert!(!policy.allows(&resource("get", "", "pods", "default", "p")));
        assert!(!policy.allows(&resource("list", "", "nodes", "", "")));
        assert!(!policy.allows(&resource("list", "apps", "pods", "", "")));
        assert!(!policy.allows(&resource("list", "", "pods/status", "", "")));
        // A watch needs `watch`, not only `list`.
        assert!(policy.allows(&resource(
            "list",
            "discovery.k8s.io",
            "endpointslices",
            "",
            ""
        )));
        assert!(!policy.allows(&resource(
            "watch",
            "discovery.k8s.io",
            "endpointslices",
            "",
            ""
        )));
        // The Role grants in its namespace only.
        assert!(policy.allows(&resource("list", "", "configmaps", "istio-system", "")));
        assert!(!policy.allows(&resource("list", "", "configmaps", "default", "")));
        assert!(!policy.allows(&resource("list", "", "configmaps", "", "")));
        // Discovery: the defaults and the rule's URL; nothing else.
        for path in ["/api", "/apis", "/version", "/apis/apps/v1"] {
            assert!(policy.allows(&non_resource(path)), "{path}");
        }
        assert!(!policy.allows(&non_resource("/metrics")));
        let narrowed = policy.clone().without_discovery_defaults();
        assert!(narrowed.allows(&non_resource("/apis/networking.istio.io")));
        assert!(!narrowed.allows(&non_resource("/apis/networking.istio.io/v1")));
        assert!(!narrowed.allows(&non_resource("/apis")));
    }

    #[test]
    fn malformed_roles_are_errors() {
        let roles = [
            json!({"kind": "Role", "metadata": {"name": "r"}, "rules": [{"apiGroups": [""], "resources": ["pods"]}]}),
        ];
        assert!(RbacPolicy::from_roles(&roles, "ns").is_err(), "no verbs");
        let roles = [
            json!({"kind": "ClusterRole", "metadata": {"name": "r"}, "rules": [{"verbs": ["get"]}]}),
        ];
        assert!(
            RbacPolicy::from_roles(&roles, "ns").is_err(),
            "nothing named"
        );
        let roles = [
            json!({"kind": "Role", "metadata": {"name": "r", "namespace": "other"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]}),
        ];
        let policy = RbacPolicy::from_roles(&roles, "ns").unwrap();
        assert!(policy.allows(&resource("list", "", "pods", "other", "")));
        assert!(!policy.allows(&resource("list", "", "pods", "ns", "")));
    }

    #[test]
    fn unused_grants_are_what_no_allowed_request_needed() {
        let policy = deploy_like();
        let request = |path: &str, watch: bool, denied: bool| RecordedRequest {
            method: "GET".into(),
            path: path.into(),
            query: if watch {
                BTreeMap::from([("watch".to_string(), "true".to_string())])
            } else {
                BTreeMap::new()
            },
            denied,
            user: None,
        };
        let requests = [
            request("/api/v1/pods", false, false),
            request("/api/v1/pods", true, false),
            request("/api/v1/services", false, false),
            // Denied requests use nothing.
            request("/api/v1/services", true, true),
            request("/apis/discovery.k8s.io/v1/endpointslices", false, false),
            // In another namespace than the Role's.
            request("/api/v1/namespaces/default/configmaps", false, false),
            request("/api/v1/namespaces/istio-system/configmaps", true, false),
        ];
        let unused: Vec<String> = policy
            .unused_grants(&requests)
            .iter()
            .map(Grant::to_string)
            .collect();
        assert_eq!(
            unused,
            [
                "ClusterRole: watch core/services",
                "Role in istio-system: list core/configmaps",
                "ClusterRole: get /apis/networking.istio.io",
            ]
        );
    }

    /// Through HTTP: a denied list is a `403` with the API server's `Status`, recorded
    /// as denied; allowed requests are served; discovery stays open.
    #[tokio::test]
    async fn the_server_answers_forbidden_and_records_the_denial() {
        use super::super::{FakeApiServer, objects};
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::api::{Api, ListParams};

        let api = FakeApiServer::start().await.unwrap();
        api.apply(&objects::config_map(
            "istio-system",
            "istio",
            &[("mesh", "")],
        ));
        api.enforce(deploy_like());
        let client = api.client();

        let allowed: Api<ConfigMap> = Api::namespaced(client.clone(), "istio-system");
        let list = allowed.list(&ListParams::default()).await.unwrap();
        assert_eq!(list.items.len(), 1);

        let other: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let Err(kube::Error::Api(status)) = other.list(&ListParams::default()).await else {
            panic!("a list of ConfigMaps outside the Role's namespace is refused");
        };
        assert_eq!(status.code, 403);
        assert_eq!(status.reason, "Forbidden");
        assert_eq!(
            status.message,
            "configmaps is forbidden: User \"system:serviceaccount:istio-system:meshfed\" \
             cannot list resource \"configmaps\" in API group \"\" in the namespace \"default\""
        );
        // A named get is a different verb from list.
        let Err(kube::Error::Api(status)) = allowed.get("istio").await else {
            panic!("get is not granted");
        };
        assert_eq!(status.code, 403);
        assert!(
            status
                .message
                .starts_with("configmaps \"istio\" is forbidden"),
            "{}",
            status.message
        );
        // Discovery documents are open to every user.
        let version = client.apiserver_version().await;
        assert!(
            !matches!(version, Err(kube::Error::Api(ref s)) if s.code == 403),
            "{version:?}"
        );

        let denied: Vec<(String, bool)> = api
            .denied_requests()
            .iter()
            .map(|r| (r.path.clone(), r.is_watch()))
            .collect();
        assert_eq!(
            denied,
            [
                ("/api/v1/namespaces/default/configmaps".to_string(), false),
                (
                    "/api/v1/namespaces/istio-system/configmaps/istio".to_string(),
                    false
                ),
            ]
        );
        assert_eq!(api.requests().iter().filter(|r| !r.denied).count(), 2);
    }
}

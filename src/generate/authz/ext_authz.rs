//! The ext_authz filters of CUSTOM AuthorizationPolicies, as Istio's authorization
//! builder makes them (`builder/extauthz.go`): one per usable provider of the mesh
//! config's `extensionProviders`, placed right after the provider's shadow RBAC
//! filter, and enabled only for requests (or connections) whose shadow effective
//! policy id starts with `istio-ext-authz-<provider>` — the ones a CUSTOM rule
//! matched.
//!
//! [`resolve`] turns the mesh config's providers into ready filter configs, looking
//! the provider's service up in the registry as Istio's `LookupCluster` does
//! (`<namespace>/<hostname>`, or a hostname defined in one namespace only) for the
//! cluster `outbound|<port>||<hostname>`. A provider that fails (bad port, unknown
//! service, bad status, ...) is kept with its reason, so that policies naming it
//! are denied instead of silently let through. Only the gRPC kind has a network
//! filter: an HTTP provider's CUSTOM policies are skipped on TCP chains.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{
    ApiVersion, GrpcService, HeaderValue, HttpUri, grpc_service, http_uri,
};
use envoy_types::pb::envoy::extensions::filters::http::buffer::v3::Buffer;
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::{
    AuthorizationRequest, AuthorizationResponse, BufferSettings, ExtAuthz as HttpExtAuthz,
    HttpService, ext_authz,
};
use envoy_types::pb::envoy::extensions::filters::network::ext_authz::v3::ExtAuthz as NetworkExtAuthz;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    ListStringMatcher, MetadataMatcher, StringMatcher, ValueMatcher, metadata_matcher,
    string_matcher, value_matcher,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_api::mesh::v1alpha1::mesh_config::extension_provider::{
    EnvoyExternalAuthorizationGrpcProvider as GrpcProvider,
    EnvoyExternalAuthorizationHttpProvider as HttpProvider,
    EnvoyExternalAuthorizationRequestBody as RequestBody, Provider,
};

use super::{EXT_AUTHZ_NAME_PREFIX, HTTP_RBAC, NETWORK_RBAC, TCP_STAT_PREFIX};

/// Name of the HTTP ext_authz filter.
pub const HTTP_EXT_AUTHZ: &str = "envoy.filters.http.ext_authz";
/// Name of the HTTP buffer filter placed before ext_authz for large bodies.
pub const HTTP_BUFFER: &str = "envoy.filters.http.buffer";
/// Envoy's default per-connection buffer limit (1 MiB): a provider asking for a
/// larger request body gets a buffer filter allowing that much, as in Istio.
const DEFAULT_BUFFER_LIMIT: u32 = 1024 * 1024;
/// Name of the network ext_authz filter.
pub const NETWORK_EXT_AUTHZ: &str = "envoy.filters.network.ext_authz";
/// The dynamic metadata key the CUSTOM shadow RBAC filter writes its matched policy
/// to (its shadow stat prefix followed by `shadow_effective_policy_id`).
pub const SHADOW_EFFECTIVE_POLICY_KEY: &str = "istio_ext_authz_shadow_effective_policy_id";
/// The timeout when the provider gives none (Istio's default).
const DEFAULT_TIMEOUT_SECS: i64 = 600;

/// The filter configs of one usable provider.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExtAuthz {
    /// For HTTP chains, before `http`: a buffer large enough for the request body
    /// the provider wants when that is over Envoy's default limit.
    pub buffer: Option<Buffer>,
    /// For HTTP chains (both kinds).
    pub http: Option<HttpExtAuthz>,
    /// For TCP chains (gRPC providers only).
    pub tcp: Option<NetworkExtAuthz>,
}

/// A provider by name: its filters, or why it cannot be used.
pub type Resolved = BTreeMap<String, Result<Arc<ExtAuthz>, String>>;

/// The snapshot's mesh-config providers resolved against its services (Istio's
/// `LookupCluster`), once per snapshot; a provider that cannot be used is logged then,
/// once.
pub fn providers(snapshot: &crate::push::snapshot::Snapshot) -> Arc<Resolved> {
    /// The per-snapshot value (its own type, for `Snapshot::derived`).
    struct Providers(Arc<Resolved>);
    let derived = snapshot.derived(|snapshot| {
        let services = snapshot.services();
        let resolved = resolve(&snapshot.mesh().config, &|host| {
            services.namespaces_of(host)
        });
        for (name, result) in &resolved {
            if let Err(e) = result {
                tracing::warn!(
                    provider = %name,
                    "ext_authz extension provider cannot be used; CUSTOM policies naming it \
                     deny what they match: {e}"
                );
            }
        }
        Providers(Arc::new(resolved))
    });
    Arc::clone(&derived.0)
}

/// The ext_authz providers of a mesh config, resolved with `namespaces_of`, which
/// lists the namespaces defining a service under a hostname. Providers of other
/// kinds (tracing, logging, ...) are left out: a CUSTOM policy naming one is refused.
pub fn resolve(mesh: &MeshConfig, namespaces_of: &dyn Fn(&str) -> Vec<String>) -> Resolved {
    let mut out = Resolved::new();
    for (i, p) in mesh.extension_providers.iter().enumerate() {
        let built = match &p.provider {
            Some(Provider::EnvoyExtAuthzHttp(http)) => http_provider(&p.name, http, namespaces_of),
            Some(Provider::EnvoyExtAuthzGrpc(grpc)) => grpc_provider(&p.name, grpc, namespaces_of),
            _ => continue,
        };
        let built = if p.name.is_empty() {
            Err(format!(
                "extension provider name must not be empty, found empty at index: {i}"
            ))
        } else if out.contains_key(&p.name) {
            Err(format!(
                "extension provider name must be unique, found duplicate: {}",
                p.name
            ))
        } else {
            built
        };
        let built =
            built.map_err(|e| format!("failed to parse extension provider {:?}: {e}", p.name));
        out.insert(p.name.clone(), built.map(Arc::new));
    }
    out
}

/// Istio's `LookupCluster`: the hostname and outbound cluster of a provider's
/// service, `<namespace>/<hostname>` or a hostname defined in one namespace.
pub fn lookup_cluster(
    service: &str,
    port: u32,
    namespaces_of: &dyn Fn(&str) -> Vec<String>,
) -> Result<(String, String), String> {
    if service.is_empty() {
        return Err("service must not be empty".into());
    }
    let cluster = |host: &str| format!("outbound|{port}||{host}");
    match service.split_once('/') {
        Some((namespace, host)) => {
            if namespaces_of(host).iter().any(|n| n == namespace) {
                return Ok((host.to_string(), cluster(host)));
            }
        }
        None => {
            let namespaces = namespaces_of(service);
            match namespaces.len() {
                1 => return Ok((service.to_string(), cluster(service))),
                0 => {}
                _ => {
                    return Err(format!(
                        "found {service} in multiple namespaces {namespaces:?}, specify the \
                         namespace explicitly in the format of <Namespace>/<Hostname>"
                    ));
                }
            }
        }
    }
    Err(format!(
        "could not find service {service} in Istio service registry"
    ))
}

/// The parts both kinds share: the port, the cluster and `statusOnError`.
fn target(
    service: &str,
    port: u32,
    status_on_error: &str,
    namespaces_of: &dyn Fn(&str) -> Vec<String>,
    errors: &mut Vec<String>,
) -> Option<(String, String, Option<HttpStatus>)> {
    if !(1..=65535).contains(&port) {
        errors.push(format!(
            "port must be in the range [1, 65535], found: {port}"
        ));
    }
    let found = lookup_cluster(service, port, namespaces_of)
        .map_err(|e| errors.push(e))
        .ok();
    let status = if status_on_error.is_empty() {
        None
    } else {
        match meshfed_registry::config::validate::ext_authz_status(status_on_error) {
            Some(code) => Some(HttpStatus { code }),
            None => {
                errors.push(format!("unsupported statusOnError {status_on_error}"));
                None
            }
        }
    };
    let (host, cluster) = found?;
    errors.is_empty().then_some((host, cluster, status))
}

fn http_provider(
    name: &str,
    p: &HttpProvider,
    namespaces_of: &dyn Fn(&str) -> Vec<String>,
) -> Result<ExtAuthz, String> {
    let mut errors = Vec::new();
    if !p.path_prefix.is_empty() && !p.path_prefix.starts_with('/') {
        errors.push(format!(
            "pathPrefix must begin with `/`, found: {:?}",
            p.path_prefix
        ));
    }
    for (field, values) in [
        (
            "includeRequestHeadersInCheck",
            &p.include_request_headers_in_check,
        ),
        ("includeHeadersInCheck", &p.include_headers_in_check),
        (
            "headersToDownstreamOnDeny",
            &p.headers_to_downstream_on_deny,
        ),
        (
            "headersToDownstreamOnAllow",
            &p.headers_to_downstream_on_allow,
        ),
        ("headersToUpstreamOnAllow", &p.headers_to_upstream_on_allow),
    ] {
        if values.iter().any(|v| v == "*") {
            errors.push(format!(
                "a single wildcard (\"*\") is not supported, change it to either prefix or \
                 suffix match: {field}"
            ));
        }
    }
    let found = target(
        &p.service,
        p.port,
        &p.status_on_error,
        namespaces_of,
        &mut errors,
    );
    let Some((host, cluster, status)) = found.filter(|_| errors.is_empty()) else {
        return Err(errors.join("; "));
    };
    // The deprecated list counts only when the new one is empty.
    let allowed_headers = header_matchers(&p.include_request_headers_in_check)
        .or_else(|| header_matchers(&p.include_headers_in_check));
    let headers_to_add: Vec<HeaderValue> = p
        .include_additional_headers_in_check
        .iter()
        .collect::<BTreeMap<_, _>>()
        .into_iter()
        .map(|(k, v)| HeaderValue {
            key: k.clone(),
            value: v.clone(),
            ..Default::default()
        })
        .collect();
    let authorization_response = (!p.headers_to_upstream_on_allow.is_empty()
        || !p.headers_to_downstream_on_deny.is_empty()
        || !p.headers_to_downstream_on_allow.is_empty())
    .then(|| AuthorizationResponse {
        allowed_upstream_headers: header_matchers(&p.headers_to_upstream_on_allow),
        allowed_client_headers: header_matchers(&p.headers_to_downstream_on_deny),
        allowed_client_headers_on_success: header_matchers(&p.headers_to_downstream_on_allow),
        ..Default::default()
    });
    let service = HttpService {
        path_prefix: p.path_prefix.clone(),
        server_uri: Some(HttpUri {
            // Required by Envoy but not used to connect: the cluster is.
            uri: format!("http://{host}"),
            timeout: Some(timeout(p.timeout.as_ref())),
            http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster)),
        }),
        authorization_request: (!headers_to_add.is_empty()).then(|| AuthorizationRequest {
            headers_to_add,
            ..Default::default()
        }),
        authorization_response,
        ..Default::default()
    };
    Ok(ExtAuthz {
        buffer: large_body_buffer(p.include_request_body_in_check.as_ref()),
        http: Some(HttpExtAuthz {
            status_on_error: status,
            failure_mode_allow: p.fail_open,
            transport_api_version: ApiVersion::V3 as i32,
            services: Some(ext_authz::Services::HttpService(service)),
            filter_enabled_metadata: Some(enabled_metadata(HTTP_RBAC, name)),
            with_request_body: p.include_request_body_in_check.as_ref().map(body),
            allowed_headers,
            ..Default::default()
        }),
        tcp: None,
    })
}

fn grpc_provider(
    name: &str,
    p: &GrpcProvider,
    namespaces_of: &dyn Fn(&str) -> Vec<String>,
) -> Result<ExtAuthz, String> {
    let mut errors = Vec::new();
    let found = target(
        &p.service,
        p.port,
        &p.status_on_error,
        namespaces_of,
        &mut errors,
    );
    let Some((host, cluster, status)) = found.filter(|_| errors.is_empty()) else {
        return Err(errors.join("; "));
    };
    let grpc = GrpcService {
        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
            grpc_service::EnvoyGrpc {
                cluster_name: cluster,
                // The cluster name's `|` is not valid in an authority; the host is.
                authority: host,
                ..Default::default()
            },
        )),
        timeout: Some(timeout(p.timeout.as_ref())),
        ..Default::default()
    };
    Ok(ExtAuthz {
        buffer: large_body_buffer(p.include_request_body_in_check.as_ref()),
        http: Some(HttpExtAuthz {
            status_on_error: status,
            failure_mode_allow: p.fail_open,
            transport_api_version: ApiVersion::V3 as i32,
            services: Some(ext_authz::Services::GrpcService(grpc.clone())),
            filter_enabled_metadata: Some(enabled_metadata(HTTP_RBAC, name)),
            with_request_body: p.include_request_body_in_check.as_ref().map(body),
            ..Default::default()
        }),
        tcp: Some(NetworkExtAuthz {
            stat_prefix: TCP_STAT_PREFIX.into(),
            grpc_service: Some(grpc),
            failure_mode_allow: p.fail_open,
            transport_api_version: ApiVersion::V3 as i32,
            filter_enabled_metadata: Some(enabled_metadata(NETWORK_RBAC, name)),
            ..Default::default()
        }),
    })
}

fn timeout(t: Option<&meshfed_api::Duration>) -> PbDuration {
    match t {
        Some(d) => PbDuration {
            seconds: d.seconds,
            nanos: d.nanos,
        },
        None => PbDuration {
            seconds: DEFAULT_TIMEOUT_SECS,
            nanos: 0,
        },
    }
}

/// A buffer filter for a request body larger than Envoy's default limit.
fn large_body_buffer(b: Option<&RequestBody>) -> Option<Buffer> {
    let bytes = b?.max_request_bytes;
    (bytes > DEFAULT_BUFFER_LIMIT).then_some(Buffer {
        max_request_bytes: Some(UInt32Value { value: bytes }),
    })
}

fn body(b: &RequestBody) -> BufferSettings {
    BufferSettings {
        max_request_bytes: b.max_request_bytes,
        allow_partial_message: b.allow_partial_message,
        pack_as_bytes: b.pack_as_bytes,
    }
}

/// Header names as case-insensitive matchers: `*suffix`, `prefix*`, else exact.
fn header_matchers(headers: &[String]) -> Option<ListStringMatcher> {
    if headers.is_empty() {
        return None;
    }
    let patterns = headers
        .iter()
        .map(|h| {
            let pattern = if let Some(suffix) = h.strip_prefix('*') {
                string_matcher::MatchPattern::Suffix(suffix.into())
            } else if let Some(prefix) = h.strip_suffix('*') {
                string_matcher::MatchPattern::Prefix(prefix.into())
            } else {
                string_matcher::MatchPattern::Exact(h.clone())
            };
            StringMatcher {
                match_pattern: Some(pattern),
                ignore_case: true,
            }
        })
        .collect();
    Some(ListStringMatcher { patterns })
}

/// Enables the filter only when the provider's shadow RBAC filter (named `filter`)
/// matched a CUSTOM rule: its effective policy id starts with
/// `istio-ext-authz-<provider>`.
fn enabled_metadata(filter: &str, provider: &str) -> MetadataMatcher {
    MetadataMatcher {
        filter: filter.into(),
        path: vec![metadata_matcher::PathSegment {
            segment: Some(metadata_matcher::path_segment::Segment::Key(
                SHADOW_EFFECTIVE_POLICY_KEY.into(),
            )),
        }],
        value: Some(ValueMatcher {
            match_pattern: Some(value_matcher::MatchPattern::StringMatch(StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Prefix(format!(
                    "{EXT_AUTHZ_NAME_PREFIX}-{provider}"
                ))),
                ignore_case: false,
            })),
        }),
        invert: false,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::generate::authz::vectors::policies;
    use crate::generate::authz::{AuthzOptions, http_filters, network_filters, select};

    /// `authz.foo...` is defined in foo; `shared.example.com` in two namespaces.
    fn registry(host: &str) -> Vec<String> {
        match host {
            "authz.foo.svc.cluster.local" => vec!["foo".into()],
            "shared.example.com" => vec!["a".into(), "b".into()],
            _ => Vec::new(),
        }
    }

    #[test]
    fn the_provider_service_is_looked_up_as_istio_looks_it_up() {
        assert_eq!(
            lookup_cluster("authz.foo.svc.cluster.local", 9000, &registry).unwrap(),
            (
                "authz.foo.svc.cluster.local".to_string(),
                "outbound|9000||authz.foo.svc.cluster.local".to_string()
            )
        );
        assert_eq!(
            lookup_cluster("b/shared.example.com", 80, &registry)
                .unwrap()
                .1,
            "outbound|80||shared.example.com"
        );
        let ambiguous = lookup_cluster("shared.example.com", 80, &registry).unwrap_err();
        assert!(ambiguous.contains("multiple namespaces"), "{ambiguous}");
        let wrong_ns =
            lookup_cluster("bar/authz.foo.svc.cluster.local", 80, &registry).unwrap_err();
        assert!(wrong_ns.contains("could not find service"), "{wrong_ns}");
        assert!(lookup_cluster("", 80, &registry).is_err());
    }

    fn mesh(providers: serde_json::Value) -> MeshConfig {
        serde_json::from_value(serde_json::json!({ "extensionProviders": providers })).unwrap()
    }

    #[test]
    fn unusable_providers_are_kept_with_their_reason_and_other_kinds_left_out() {
        let resolved = resolve(
            &mesh(serde_json::json!([
                {"name": "ok", "envoyExtAuthzGrpc": {"service": "authz.foo.svc.cluster.local", "port": 9000}},
                {"name": "missing", "envoyExtAuthzGrpc": {"service": "nope.foo.svc.cluster.local", "port": 9000}},
                {"name": "wildcard", "envoyExtAuthzHttp": {"service": "authz.foo.svc.cluster.local", "port": 9000, "includeRequestHeadersInCheck": ["*"]}},
                {"name": "tracing", "zipkin": {"service": "z.foo.svc.cluster.local", "port": 9411}}
            ])),
            &registry,
        );
        assert!(resolved["ok"].is_ok());
        assert!(
            resolved["missing"]
                .as_ref()
                .unwrap_err()
                .contains("could not find service")
        );
        assert!(
            resolved["wildcard"]
                .as_ref()
                .unwrap_err()
                .contains("single wildcard")
        );
        assert!(!resolved.contains_key("tracing"));
    }

    /// The filter names of the selected CUSTOM policy (provider `provider`) on HTTP
    /// and TCP chains.
    fn filters_for(provider: &str, mesh: &MeshConfig) -> (Vec<String>, Vec<String>) {
        let text = format!(
            "apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: ext, namespace: foo}}
spec: {{action: CUSTOM, provider: {{name: {provider}}}, rules: [{{to: [{{operation: {{ports: [\"80\"]}}}}]}}]}}
"
        );
        let all = policies(&text);
        let selected = select(&all, "istio-system", "foo", &BTreeMap::new());
        let opts = AuthzOptions {
            custom_providers: Some(Arc::new(resolve(mesh, &registry))),
            ..AuthzOptions::default()
        };
        let http = http_filters(&selected, &opts);
        let tcp = network_filters(&selected, &opts);
        http.iter().for_each(crate::xds::pgv::assert_message_valid);
        tcp.iter().for_each(crate::xds::pgv::assert_message_valid);
        (
            http.into_iter().map(|f| f.name).collect(),
            tcp.into_iter().map(|f| f.name).collect(),
        )
    }

    #[test]
    fn a_grpc_provider_checks_requests_and_connections_an_http_one_requests_only() {
        let providers = mesh(serde_json::json!([
            {"name": "grpc", "envoyExtAuthzGrpc": {"service": "authz.foo.svc.cluster.local", "port": 9000}},
            {"name": "http", "envoyExtAuthzHttp": {"service": "authz.foo.svc.cluster.local", "port": 8000}},
            {"name": "tracing", "zipkin": {"service": "z.foo.svc.cluster.local", "port": 9411}}
        ]));
        assert_eq!(
            filters_for("grpc", &providers),
            (
                vec![
                    super::super::HTTP_RBAC.to_string(),
                    HTTP_EXT_AUTHZ.to_string()
                ],
                vec![
                    super::super::NETWORK_RBAC.to_string(),
                    NETWORK_EXT_AUTHZ.to_string()
                ]
            )
        );
        assert_eq!(
            filters_for("http", &providers),
            (
                vec![
                    super::super::HTTP_RBAC.to_string(),
                    HTTP_EXT_AUTHZ.to_string()
                ],
                vec![]
            )
        );
        // A provider of another kind, or none by that name: one DENY RBAC filter, no
        // ext_authz.
        for name in ["tracing", "unknown"] {
            assert_eq!(
                filters_for(name, &providers),
                (
                    vec![super::super::HTTP_RBAC.to_string()],
                    vec![super::super::NETWORK_RBAC.to_string()]
                ),
                "{name}"
            );
        }
    }
}

//! The connection manager's `tracing` and `request_id_extension`, as Istio's
//! `pilot/pkg/networking/core/tracing.go` builds them: from the Telemetry API's
//! provider, sampling and custom tags, else (no Telemetry tracing, no default
//! tracing provider) from the mesh config's legacy `enableTracing` and
//! `defaultConfig.tracing`.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{
    GrpcService, HeaderValue, HeaderValueOption, HttpService, HttpUri, grpc_service,
    header_value_option, http_uri,
};
use envoy_types::pb::envoy::config::trace::v3::{
    DatadogConfig, OpenTelemetryConfig, SkyWalkingConfig, ZipkinConfig, tracing, zipkin_config,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    RequestIdExtension, http_connection_manager,
};
use envoy_types::pb::envoy::extensions::request_id::uuid::v3::UuidRequestIdConfig;
use envoy_types::pb::envoy::r#type::metadata::v3::{
    MetadataKey, MetadataKind, metadata_key, metadata_kind,
};
use envoy_types::pb::envoy::r#type::tracing::v3::{CustomTag, custom_tag};
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::{Any, BoolValue, UInt32Value};
use meshfed_api::mesh::v1alpha1::mesh_config::ExtensionProvider;
use meshfed_api::mesh::v1alpha1::mesh_config::extension_provider::{
    OpenTelemetryTracingProvider, Provider,
};
use meshfed_api::mesh::v1alpha1::{MeshConfig, Tracing as ProxyTracing};
use meshfed_api::telemetry::v1alpha1 as tel;

use super::merge::{ListenerClass, TracingConfig, TracingSpec};
use crate::generate::proto::pack;

/// Istio's `PILOT_TRACE_SAMPLING` default.
pub const DEFAULT_SAMPLING: f64 = 1.0;

/// The proxy facts tracing reads: what its span tags say and the service name the
/// tracers report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ProxyTags {
    /// Label `service.istio.io/canonical-name` (`unknown` when absent).
    pub canonical_service: String,
    /// Label `service.istio.io/canonical-revision` (`latest` when absent).
    pub canonical_revision: String,
    /// The mesh id.
    pub mesh_id: String,
    /// The proxy's namespace.
    pub namespace: String,
    /// The proxy's cluster (`unknown` when absent).
    pub cluster_id: String,
    /// The Envoy service cluster (`<app>.<namespace>`), the tracers' service name.
    pub service_cluster: String,
    /// A gateway: spans upstream (Istio's `PILOT_SPAWN_UPSTREAM_SPAN_FOR_GATEWAY`).
    pub router: bool,
}

impl ProxyTags {
    /// The tags of a proxy of `namespace` with `labels`.
    pub fn new(
        namespace: &str,
        labels: &BTreeMap<String, String>,
        cluster_id: Option<&str>,
        mesh: &MeshConfig,
        router: bool,
    ) -> ProxyTags {
        let label = |k: &str, default: &str| {
            labels
                .get(k)
                .filter(|v| !v.is_empty())
                .cloned()
                .unwrap_or_else(|| default.to_string())
        };
        let mesh_id = mesh
            .default_config
            .as_ref()
            .map(|c| c.mesh_id.clone())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| mesh.trust_domain.clone());
        ProxyTags {
            canonical_service: label("service.istio.io/canonical-name", "unknown"),
            canonical_revision: label("service.istio.io/canonical-revision", "latest"),
            mesh_id: if mesh_id.is_empty() {
                "unknown".into()
            } else {
                mesh_id
            },
            namespace: if namespace.is_empty() {
                "default".into()
            } else {
                namespace.to_string()
            },
            cluster_id: cluster_id
                .filter(|c| !c.is_empty())
                .unwrap_or("unknown")
                .to_string(),
            service_cluster: format!("{}.{namespace}", label("app", "istio-proxy")),
            router,
        }
    }
}

fn literal(tag: &str, value: &str) -> CustomTag {
    CustomTag {
        tag: tag.into(),
        r#type: Some(custom_tag::Type::Literal(custom_tag::Literal {
            value: value.into(),
        })),
    }
}

fn dry_run_tag(tag: &str, key: &str) -> CustomTag {
    CustomTag {
        tag: tag.into(),
        r#type: Some(custom_tag::Type::Metadata(custom_tag::Metadata {
            kind: Some(MetadataKind {
                kind: Some(metadata_kind::Kind::Request(metadata_kind::Request {})),
            }),
            metadata_key: Some(MetadataKey {
                key: "envoy.filters.http.rbac".into(),
                path: vec![metadata_key::PathSegment {
                    segment: Some(metadata_key::path_segment::Segment::Key(key.into())),
                }],
            }),
            default_value: String::new(),
        })),
    }
}

/// Istio's own span tags: the workload's canonical service and revision, mesh,
/// namespace and cluster, and the dry-run authorization results.
fn istio_tags(p: &ProxyTags) -> Vec<CustomTag> {
    vec![
        literal("istio.canonical_revision", &p.canonical_revision),
        literal("istio.canonical_service", &p.canonical_service),
        literal("istio.mesh_id", &p.mesh_id),
        literal("istio.namespace", &p.namespace),
        literal("istio.cluster_id", &p.cluster_id),
        dry_run_tag(
            "istio.authorization.dry_run.allow_policy.name",
            "istio_dry_run_allow_shadow_effective_policy_id",
        ),
        dry_run_tag(
            "istio.authorization.dry_run.allow_policy.result",
            "istio_dry_run_allow_shadow_engine_result",
        ),
        dry_run_tag(
            "istio.authorization.dry_run.deny_policy.name",
            "istio_dry_run_deny_shadow_effective_policy_id",
        ),
        dry_run_tag(
            "istio.authorization.dry_run.deny_policy.result",
            "istio_dry_run_deny_shadow_engine_result",
        ),
    ]
}

/// Where a custom tag's value comes from, as both the Telemetry API and MeshConfig
/// `defaultConfig.tracing` say it (two messages of the same shape).
enum TagSource<'a> {
    Literal(&'a str),
    Environment(&'a str, &'a str),
    Header(&'a str, &'a str),
}

/// Envoy's custom tag `name` from `source`.
fn custom_tag(name: &str, source: TagSource<'_>) -> CustomTag {
    let r#type = match source {
        TagSource::Literal(value) => custom_tag::Type::Literal(custom_tag::Literal {
            value: value.to_string(),
        }),
        TagSource::Environment(name, default_value) => {
            custom_tag::Type::Environment(custom_tag::Environment {
                name: name.to_string(),
                default_value: default_value.to_string(),
            })
        }
        TagSource::Header(name, default_value) => {
            custom_tag::Type::RequestHeader(custom_tag::Header {
                name: name.to_string(),
                default_value: default_value.to_string(),
            })
        }
    };
    CustomTag {
        tag: name.to_string(),
        r#type: Some(r#type),
    }
}

fn telemetry_tags(tags: &BTreeMap<String, tel::tracing::CustomTag>) -> Vec<CustomTag> {
    use tel::tracing::custom_tag::Type;
    tags.iter()
        .filter_map(|(name, t)| {
            let source = match t.r#type.as_ref()? {
                Type::Literal(l) => TagSource::Literal(&l.value),
                Type::Environment(e) => TagSource::Environment(&e.name, &e.default_value),
                Type::Header(h) => TagSource::Header(&h.name, &h.default_value),
            };
            Some(custom_tag(name, source))
        })
        .collect()
}

fn proxy_config_tags(tracing: Option<&ProxyTracing>) -> Vec<CustomTag> {
    use meshfed_api::mesh::v1alpha1::tracing::custom_tag::Type;
    let Some(t) = tracing else {
        return Vec::new();
    };
    t.custom_tags
        .iter()
        .filter_map(|(name, tag)| {
            let source = match tag.r#type.as_ref()? {
                Type::Literal(l) => TagSource::Literal(&l.value),
                Type::Environment(e) => TagSource::Environment(&e.name, &e.default_value),
                Type::Header(h) => TagSource::Header(&h.name, &h.default_value),
            };
            Some(custom_tag(name, source))
        })
        .collect()
}

fn proxy_tracing(mesh: &MeshConfig) -> Option<&ProxyTracing> {
    mesh.default_config
        .as_ref()
        .and_then(|c| c.tracing.as_ref())
}

/// `defaultConfig.tracing.sampling`, else `PILOT_TRACE_SAMPLING` (over 100 is 1).
pub fn proxy_config_sampling(mesh: &MeshConfig) -> f64 {
    match proxy_tracing(mesh).map(|t| t.sampling) {
        Some(s) if s != 0.0 => {
            if s > 100.0 {
                1.0
            } else {
                s
            }
        }
        _ => DEFAULT_SAMPLING,
    }
}

fn percent(value: f64) -> Option<Percent> {
    Some(Percent { value })
}

fn sampled(
    mut t: http_connection_manager::Tracing,
    random: f64,
) -> http_connection_manager::Tracing {
    t.client_sampling = percent(100.0);
    t.overall_sampling = percent(100.0);
    t.random_sampling = percent(random);
    t
}

/// What tracing gives one connection manager.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HcmTracing {
    /// The connection manager's `tracing`.
    pub tracing: Option<http_connection_manager::Tracing>,
    /// Its `request_id_extension` (always set, as Istio does).
    pub request_id_extension: Option<RequestIdExtension>,
}

/// The UUID request id extension (`use_request_id_for_trace_sampling`).
pub fn uuid_extension(use_request_id_for_trace_sampling: bool) -> RequestIdExtension {
    RequestIdExtension {
        typed_config: Some(pack(&UuidRequestIdConfig {
            pack_trace_reason: None,
            use_request_id_for_trace_sampling: Some(BoolValue {
                value: use_request_id_for_trace_sampling,
            }),
        })),
    }
}

/// The tracing of a `class` connection manager: from the Telemetry API (`config`),
/// else from the mesh config's legacy settings. `lookup` resolves a provider's
/// service as Istio's `LookupCluster`.
pub fn hcm_tracing(
    config: Option<&TracingConfig>,
    mesh: &MeshConfig,
    class: ListenerClass,
    tags: &ProxyTags,
    lookup: &super::ClusterLookup<'_>,
) -> HcmTracing {
    let proxy_cfg = proxy_tracing(mesh);
    let max_path = proxy_cfg
        .map(|t| t.max_path_tag_length)
        .filter(|l| *l != 0)
        .map(|value| UInt32Value { value });
    let Some(config) = config else {
        if !mesh.enable_tracing {
            return HcmTracing {
                tracing: None,
                request_id_extension: Some(uuid_extension(true)),
            };
        }
        let enable_istio_tags = proxy_cfg
            .and_then(|t| t.enable_istio_tags)
            .is_none_or(|b| b.value);
        let mut custom = if enable_istio_tags {
            istio_tags(tags)
        } else {
            Vec::new()
        };
        custom.extend(proxy_config_tags(proxy_cfg));
        custom.sort_by(|a, b| a.tag.cmp(&b.tag));
        let tracing = http_connection_manager::Tracing {
            custom_tags: custom,
            max_path_tag_length: max_path,
            ..Default::default()
        };
        return HcmTracing {
            tracing: Some(sampled(tracing, proxy_config_sampling(mesh))),
            request_id_extension: Some(uuid_extension(true)),
        };
    };
    let spec: &TracingSpec = match class {
        ListenerClass::SidecarInbound => &config.server,
        _ => &config.client,
    };
    if spec.disabled {
        return HcmTracing {
            tracing: None,
            request_id_extension: Some(uuid_extension(true)),
        };
    }
    // A spec without a provider still samples and tags (the tracer then comes from
    // the bootstrap), as Istio does.
    let (mut tracing, custom_sampler) = match spec.provider.as_ref() {
        Some(provider) => match provider_tracing(provider, tags, lookup) {
            Ok(t) => t,
            Err(e) => {
                ::tracing::warn!(provider = %provider.name, "not able to configure requested tracing provider: {e}");
                return HcmTracing {
                    tracing: None,
                    request_id_extension: Some(uuid_extension(true)),
                };
            }
        },
        None => (http_connection_manager::Tracing::default(), false),
    };
    let sampling = if custom_sampler {
        100.0
    } else {
        spec.random_sampling_percentage
            .unwrap_or_else(|| proxy_config_sampling(mesh))
    };
    let mut custom = if spec.enable_istio_tags {
        istio_tags(tags)
    } else {
        Vec::new()
    };
    match &spec.custom_tags {
        Some(t) if !t.is_empty() => custom.extend(telemetry_tags(t)),
        _ => custom.extend(proxy_config_tags(proxy_cfg)),
    }
    custom.sort_by(|a, b| a.tag.cmp(&b.tag));
    tracing.custom_tags = custom;
    if tracing.max_path_tag_length.is_none() {
        tracing.max_path_tag_length = max_path;
    }
    HcmTracing {
        tracing: Some(sampled(tracing, sampling)),
        request_id_extension: Some(uuid_extension(spec.use_request_id_for_trace_sampling)),
    }
}

fn http_provider(
    name: &str,
    config: Any,
    max_tag_length: u32,
    spawn_upstream_span: bool,
) -> http_connection_manager::Tracing {
    http_connection_manager::Tracing {
        provider: Some(tracing::Http {
            name: name.into(),
            config_type: Some(tracing::http::ConfigType::TypedConfig(config)),
        }),
        max_path_tag_length: (max_tag_length != 0).then_some(UInt32Value {
            value: max_tag_length,
        }),
        spawn_upstream_span: spawn_upstream_span.then_some(BoolValue { value: true }),
        ..Default::default()
    }
}

/// The connection manager tracing of a provider, and whether it brings its own
/// sampler (then every span reaches it: 100%).
fn provider_tracing(
    provider: &ExtensionProvider,
    tags: &ProxyTags,
    lookup: &super::ClusterLookup<'_>,
) -> Result<(http_connection_manager::Tracing, bool), String> {
    let cluster = |service: &str, port: u32| {
        lookup(service, port).map_err(|e| {
            format!(
                "could not find cluster for tracing provider {:?}: {e}",
                provider.name
            )
        })
    };
    let spawn = tags.router;
    match provider.provider.as_ref() {
        Some(Provider::Zipkin(z)) => {
            let (host, cluster) = cluster(&z.service, z.port)?;
            let cfg = ZipkinConfig {
                collector_cluster: cluster,
                collector_endpoint: if z.path.is_empty() {
                    "/api/v2/spans".into()
                } else {
                    z.path.clone()
                },
                collector_endpoint_version: zipkin_config::CollectorEndpointVersion::HttpJson
                    as i32,
                collector_hostname: host,
                trace_id_128bit: !z.enable_64bit_trace_id,
                shared_span_context: Some(BoolValue { value: false }),
                ..Default::default()
            };
            Ok((
                http_provider("envoy.tracers.zipkin", pack(&cfg), z.max_tag_length, spawn),
                false,
            ))
        }
        Some(Provider::Datadog(d)) => {
            let (host, cluster) = cluster(&d.service, d.port)?;
            let cfg = DatadogConfig {
                collector_cluster: cluster,
                service_name: tags.service_cluster.clone(),
                collector_hostname: host,
                ..Default::default()
            };
            Ok((
                http_provider("envoy.tracers.datadog", pack(&cfg), d.max_tag_length, spawn),
                false,
            ))
        }
        Some(Provider::Skywalking(s)) => {
            let (host, cluster) = cluster(&s.service, s.port)?;
            let cfg = SkyWalkingConfig {
                grpc_service: Some(envoy_grpc(&cluster, &host)),
                ..Default::default()
            };
            // SkyWalking always starts a child span.
            Ok((
                http_provider("envoy.tracers.skywalking", pack(&cfg), 0, true),
                false,
            ))
        }
        Some(Provider::Opentelemetry(o)) => {
            let (host, cluster) = cluster(&o.service, o.port)?;
            let cfg = otel_config(o, &host, &cluster, &tags.service_cluster)?;
            Ok((
                http_provider(
                    "envoy.tracers.opentelemetry",
                    pack(&cfg),
                    o.max_tag_length,
                    spawn,
                ),
                false,
            ))
        }
        Some(_) | None => Err(format!(
            "provider {:?} does not support tracing",
            provider.name
        )),
    }
}

fn envoy_grpc(cluster: &str, authority: &str) -> GrpcService {
    GrpcService {
        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
            grpc_service::EnvoyGrpc {
                cluster_name: cluster.into(),
                authority: authority.into(),
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

fn header_value(
    h: &meshfed_api::mesh::v1alpha1::mesh_config::extension_provider::HttpHeader,
) -> String {
    use meshfed_api::mesh::v1alpha1::mesh_config::extension_provider::http_header::HeaderValue as V;
    match &h.header_value {
        Some(V::Value(v)) => v.clone(),
        Some(V::EnvName(n)) => std::env::var(n).unwrap_or_default(),
        None => String::new(),
    }
}

fn otel_config(
    o: &OpenTelemetryTracingProvider,
    host: &str,
    cluster: &str,
    service_name: &str,
) -> Result<OpenTelemetryConfig, String> {
    let mut cfg = OpenTelemetryConfig {
        service_name: service_name.into(),
        ..Default::default()
    };
    if let Some(http) = &o.http {
        let path = http.path.trim_start_matches('/');
        let uri = if path.is_empty() {
            host.to_string()
        } else {
            format!("{}/{path}", host.trim_end_matches('/'))
        };
        cfg.http_service = Some(HttpService {
            http_uri: Some(HttpUri {
                uri,
                timeout: http.timeout.map(crate::generate::proto::pb_duration),
                http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster.into())),
            }),
            request_headers_to_add: http
                .headers
                .iter()
                .map(|h| HeaderValueOption {
                    header: Some(HeaderValue {
                        key: h.name.clone(),
                        value: header_value(h),
                        ..Default::default()
                    }),
                    append_action: header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd
                        as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
    } else {
        let mut grpc = envoy_grpc(cluster, host);
        if let Some(g) = &o.grpc {
            grpc.timeout = g.timeout.map(crate::generate::proto::pb_duration);
            grpc.initial_metadata = g
                .initial_metadata
                .iter()
                .map(|h| HeaderValue {
                    key: h.name.clone(),
                    value: header_value(h),
                    ..Default::default()
                })
                .collect();
        }
        cfg.grpc_service = Some(grpc);
    }
    Ok(cfg)
}

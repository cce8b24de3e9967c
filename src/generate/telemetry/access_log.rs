//! Access log entries of connection managers, TCP proxies and listeners, as Istio's
//! `pilot/pkg/networking/core/accesslog.go` and `model/telemetry_logging.go` build
//! them: from the Telemetry API's providers, else from the mesh config's legacy
//! `accessLogFile`/`accessLogEncoding`/`accessLogFormat` and
//! `enableEnvoyAccessLogService`.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::accesslog::v3::{
    AccessLog, AccessLogFilter, AndFilter, ExtensionFilter, ResponseFlagFilter, access_log,
    access_log_filter, extension_filter,
};
use envoy_types::pb::envoy::config::core::v3::{
    ApiVersion, DataSource, GrpcService, JsonFormatOptions, SubstitutionFormatString,
    TypedExtensionConfig, data_source, grpc_service, substitution_format_string,
};
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::{
    FileAccessLog, file_access_log,
};
use envoy_types::pb::envoy::extensions::access_loggers::filters::cel::v3::ExpressionFilter;
use envoy_types::pb::envoy::extensions::access_loggers::grpc::v3::{
    CommonGrpcAccessLogConfig, HttpGrpcAccessLogConfig, TcpGrpcAccessLogConfig,
};
use envoy_types::pb::envoy::extensions::access_loggers::open_telemetry::v3::OpenTelemetryAccessLogConfig;
use envoy_types::pb::envoy::extensions::formatter::req_without_query::v3::ReqWithoutQuery;
use envoy_types::pb::google::protobuf::{Struct, Value, value};
use envoy_types::pb::opentelemetry::proto::common::v1::{
    AnyValue, KeyValue, KeyValueList, any_value,
};
use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_api::mesh::v1alpha1::mesh_config::AccessLogEncoding;
use meshfed_api::mesh::v1alpha1::mesh_config::extension_provider::{
    EnvoyFileAccessLogProvider, EnvoyHttpGrpcV3LogProvider, EnvoyOpenTelemetryLogProvider,
    EnvoyTcpGrpcV3LogProvider, Provider, envoy_file_access_log_provider,
};
use meshfed_api::telemetry::v1alpha1 as tel;

use crate::generate::proto::pack;

/// Istio's default text format (1.9 onwards).
pub const TEXT_FORMAT: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% \
%PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% \
\"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% \
%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \
\"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% \
%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% \
%REQUESTED_SERVER_NAME% %ROUTE_NAME%\n";

/// Istio's default JSON fields (1.9 onwards).
pub const JSON_FIELDS: [(&str, &str); 24] = [
    ("start_time", "%START_TIME%"),
    ("route_name", "%ROUTE_NAME%"),
    ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
    ("protocol", "%PROTOCOL%"),
    ("response_code", "%RESPONSE_CODE%"),
    ("response_flags", "%RESPONSE_FLAGS%"),
    ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
    (
        "connection_termination_details",
        "%CONNECTION_TERMINATION_DETAILS%",
    ),
    ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"),
    ("duration", "%DURATION%"),
    (
        "upstream_service_time",
        "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    ),
    ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
    ("user_agent", "%REQ(USER-AGENT)%"),
    ("request_id", "%REQ(X-REQUEST-ID)%"),
    ("authority", "%REQ(:AUTHORITY)%"),
    ("upstream_host", "%UPSTREAM_HOST%"),
    ("upstream_cluster", "%UPSTREAM_CLUSTER_RAW%"),
    ("upstream_local_address", "%UPSTREAM_LOCAL_ADDRESS%"),
    ("downstream_local_address", "%DOWNSTREAM_LOCAL_ADDRESS%"),
    ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"),
    ("requested_server_name", "%REQUESTED_SERVER_NAME%"),
    (
        "upstream_transport_failure_reason",
        "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
    ),
];

/// Envoy's file logger.
pub const FILE_LOGGER: &str = "envoy.access_loggers.file";
/// Envoy's HTTP gRPC logger.
pub const HTTP_GRPC_LOGGER: &str = "envoy.access_loggers.http_grpc";
/// Envoy's TCP gRPC logger (Istio's name for it).
pub const TCP_GRPC_LOGGER: &str = "envoy.tcp_grpc_access_log";
/// Envoy's OpenTelemetry logger.
pub const OTEL_LOGGER: &str = "envoy.access_loggers.open_telemetry";
/// The cluster the legacy `enableEnvoyAccessLogService` sends to (from the bootstrap).
pub const ALS_CLUSTER: &str = "envoy_accesslog_service";

/// Filter state the gRPC loggers send by default (what metadata exchange records).
const PEER_STATE: [&str; 2] = ["upstream_peer", "downstream_peer"];
const PEER_STATE_WITH_WASM: [&str; 6] = [
    "upstream_peer",
    "downstream_peer",
    "wasm.upstream_peer",
    "wasm.upstream_peer_id",
    "wasm.downstream_peer",
    "wasm.downstream_peer_id",
];

pub use crate::generate::proto::stable_struct;

/// The Istio default JSON format as a `Struct`.
pub fn default_json_struct() -> Struct {
    stable_struct(JSON_FIELDS.iter().map(|(k, v)| {
        (
            k.to_string(),
            Value {
                kind: Some(value::Kind::StringValue(v.to_string())),
            },
        )
    }))
}

fn req_without_query() -> TypedExtensionConfig {
    TypedExtensionConfig {
        name: "envoy.formatter.req_without_query".into(),
        typed_config: Some(pack(&ReqWithoutQuery::default())),
    }
}

fn text_formatters(text: &str) -> Vec<TypedExtensionConfig> {
    if text.contains("%REQ_WITHOUT_QUERY") {
        vec![req_without_query()]
    } else {
        Vec::new()
    }
}

fn json_formatters(s: &Struct) -> Vec<TypedExtensionConfig> {
    let uses = s.fields.values().any(|v| {
        matches!(&v.kind, Some(value::Kind::StringValue(t)) if t.contains("%REQ_WITHOUT_QUERY"))
    });
    if uses {
        vec![req_without_query()]
    } else {
        Vec::new()
    }
}

/// A user's text format with the newline Istio adds when it is missing; Istio's default
/// when empty.
fn text_format(text: &str) -> String {
    if text.is_empty() {
        TEXT_FORMAT.to_string()
    } else if text.ends_with('\n') {
        text.to_string()
    } else {
        format!("{text}\n")
    }
}

fn text_log_format(text: String, omit_empty_values: bool) -> SubstitutionFormatString {
    SubstitutionFormatString {
        formatters: text_formatters(&text),
        format: Some(substitution_format_string::Format::TextFormatSource(
            DataSource {
                specifier: Some(data_source::Specifier::InlineString(text)),
                ..Default::default()
            },
        )),
        omit_empty_values,
        ..Default::default()
    }
}

// `sort_properties` is deprecated in Envoy; Istio still sets it.
#[allow(deprecated)]
fn json_log_format(fields: Struct, omit_empty_values: bool) -> SubstitutionFormatString {
    SubstitutionFormatString {
        formatters: json_formatters(&fields),
        format: Some(substitution_format_string::Format::JsonFormat(fields)),
        json_format_options: Some(JsonFormatOptions {
            sort_properties: false,
        }),
        omit_empty_values,
        ..Default::default()
    }
}

fn file_log(path: &str, format: SubstitutionFormatString) -> AccessLog {
    let fl = FileAccessLog {
        path: path.to_string(),
        access_log_format: Some(file_access_log::AccessLogFormat::LogFormat(format)),
    };
    AccessLog {
        name: FILE_LOGGER.into(),
        config_type: Some(access_log::ConfigType::TypedConfig(pack(&fl))),
        filter: None,
    }
}

/// The file log the mesh config's `accessLogFile`, `accessLogEncoding` and
/// `accessLogFormat` describe, to `path` (Istio's `FileAccessLogFromMeshConfig`). A
/// JSON format that does not parse falls back to Istio's default fields, as Istio does.
pub fn file_log_from_mesh(path: &str, mesh: &MeshConfig) -> AccessLog {
    let format = match mesh.access_log_encoding() {
        AccessLogEncoding::Text => text_log_format(
            if mesh.access_log_format.is_empty() {
                TEXT_FORMAT.to_string()
            } else {
                text_format(&mesh.access_log_format)
            },
            false,
        ),
        AccessLogEncoding::Json => {
            let fields = if mesh.access_log_format.is_empty() {
                default_json_struct()
            } else {
                match json_struct(&mesh.access_log_format) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::error!(
                            "accessLogFormat is not a JSON object, Istio's default JSON \
                             format is used: {e}"
                        );
                        default_json_struct()
                    }
                }
            };
            json_log_format(fields, false)
        }
    };
    file_log(path, format)
}

/// A JSON object as a protobuf `Struct`.
pub fn json_struct(text: &str) -> Result<Struct, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let serde_json::Value::Object(map) = value else {
        return Err("not a JSON object".into());
    };
    Ok(stable_struct(
        map.into_iter().map(|(k, v)| (k, json_value(v))),
    ))
}

fn json_value(v: serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match v {
        J::Null => value::Kind::NullValue(0),
        J::Bool(b) => value::Kind::BoolValue(b),
        J::Number(n) => value::Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => value::Kind::StringValue(s),
        J::Array(a) => value::Kind::ListValue(envoy_types::pb::google::protobuf::ListValue {
            values: a.into_iter().map(json_value).collect(),
        }),
        J::Object(o) => value::Kind::StructValue(stable_struct(
            o.into_iter().map(|(k, v)| (k, json_value(v))),
        )),
    };
    Value { kind: Some(kind) }
}

/// The API's `Struct` as Envoy's (the same message, two generated types).
pub fn envoy_struct(s: &pbjson_types::Struct) -> Struct {
    let json = serde_json::to_value(s).unwrap_or_default();
    json_struct(&json.to_string()).unwrap_or_default()
}

fn file_log_from_provider(
    name: &str,
    p: &EnvoyFileAccessLogProvider,
    mesh: &MeshConfig,
) -> AccessLog {
    use envoy_file_access_log_provider::log_format::LogFormat;
    // The built-in `envoy` provider without a format of its own follows the mesh config.
    if name == "envoy" && p.log_format.is_none() && !p.omit_empty_values {
        return file_log_from_mesh(&p.path, mesh);
    }
    let path = if p.path.is_empty() {
        "/dev/stdout"
    } else {
        &p.path
    };
    let format = match p.log_format.as_ref().and_then(|f| f.log_format.as_ref()) {
        Some(LogFormat::Text(t)) => text_log_format(text_format(t), p.omit_empty_values),
        Some(LogFormat::Labels(labels)) => {
            let fields = envoy_struct(labels);
            let fields = if fields.fields.is_empty() {
                default_json_struct()
            } else {
                fields
            };
            json_log_format(fields, p.omit_empty_values)
        }
        None => text_log_format(TEXT_FORMAT.to_string(), p.omit_empty_values),
    };
    file_log(path, format)
}

fn grpc_service(cluster: &str, authority: &str) -> GrpcService {
    GrpcService {
        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
            grpc_service::EnvoyGrpc {
                cluster_name: cluster.to_string(),
                authority: authority.to_string(),
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

fn common(
    log_name: &str,
    cluster: &str,
    authority: &str,
    state: Vec<String>,
) -> CommonGrpcAccessLogConfig {
    CommonGrpcAccessLogConfig {
        log_name: log_name.to_string(),
        grpc_service: Some(grpc_service(cluster, authority)),
        transport_api_version: ApiVersion::V3 as i32,
        filter_state_objects_to_log: state,
        ..Default::default()
    }
}

fn or_default(name: &str, default: &str) -> String {
    if name.is_empty() {
        default.to_string()
    } else {
        name.to_string()
    }
}

fn state_or_peer(state: &[String]) -> Vec<String> {
    if state.is_empty() {
        PEER_STATE.iter().map(|s| s.to_string()).collect()
    } else {
        state.to_vec()
    }
}

fn http_als(p: &EnvoyHttpGrpcV3LogProvider, host: &str, cluster: &str) -> AccessLog {
    let cfg = HttpGrpcAccessLogConfig {
        common_config: Some(common(
            &or_default(&p.log_name, "http_envoy_accesslog"),
            cluster,
            host,
            state_or_peer(&p.filter_state_objects_to_log),
        )),
        additional_request_headers_to_log: p.additional_request_headers_to_log.clone(),
        additional_response_headers_to_log: p.additional_response_headers_to_log.clone(),
        additional_response_trailers_to_log: p.additional_response_trailers_to_log.clone(),
    };
    AccessLog {
        name: HTTP_GRPC_LOGGER.into(),
        config_type: Some(access_log::ConfigType::TypedConfig(pack(&cfg))),
        filter: None,
    }
}

fn tcp_als(p: &EnvoyTcpGrpcV3LogProvider, host: &str, cluster: &str) -> AccessLog {
    let cfg = TcpGrpcAccessLogConfig {
        common_config: Some(common(
            &or_default(&p.log_name, "tcp_envoy_accesslog"),
            cluster,
            host,
            state_or_peer(&p.filter_state_objects_to_log),
        )),
    };
    AccessLog {
        name: TCP_GRPC_LOGGER.into(),
        config_type: Some(access_log::ConfigType::TypedConfig(pack(&cfg))),
        filter: None,
    }
}

// `common_config` is deprecated in Envoy; Istio still sets it.
#[allow(deprecated)]
fn otel_als(p: &EnvoyOpenTelemetryLogProvider, host: &str, cluster: &str) -> AccessLog {
    let format = p.log_format.as_ref();
    let text = format
        .map(|f| f.text.clone())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| TEXT_FORMAT.to_string());
    let labels = format.and_then(|f| f.labels.as_ref()).map(envoy_struct);
    let mut formatters = text_formatters(&text);
    if formatters.is_empty()
        && let Some(l) = &labels
    {
        formatters = json_formatters(l);
    }
    // Sorted by key, as Istio does, so the config is stable.
    let attributes = labels
        .filter(|l| !l.fields.is_empty())
        .map(|l| KeyValueList {
            values: l
                .fields
                .into_iter()
                .collect::<BTreeMap<_, _>>()
                .into_iter()
                .map(|(key, v)| KeyValue {
                    key,
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(match v.kind {
                            Some(value::Kind::StringValue(s)) => s,
                            _ => String::new(),
                        })),
                    }),
                    ..Default::default()
                })
                .collect(),
        });
    let cfg = OpenTelemetryAccessLogConfig {
        common_config: Some(common(
            &or_default(&p.log_name, "otel_envoy_accesslog"),
            cluster,
            host,
            PEER_STATE_WITH_WASM.iter().map(|s| s.to_string()).collect(),
        )),
        disable_builtin_labels: true,
        body: Some(AnyValue {
            value: Some(any_value::Value::StringValue(text)),
        }),
        attributes,
        formatters,
        ..Default::default()
    };
    AccessLog {
        name: OTEL_LOGGER.into(),
        config_type: Some(access_log::ConfigType::TypedConfig(pack(&cfg))),
        filter: None,
    }
}

/// The access log a provider writes, or `None` when it writes none (tracing and
/// metrics providers) or its service cannot be found (`lookup` gives the hostname and
/// cluster of a `[<namespace>/]<hostname>` and port, as Istio's `LookupCluster`).
pub fn provider_log(
    name: &str,
    provider: &Provider,
    mesh: &MeshConfig,
    lookup: &super::ClusterLookup<'_>,
) -> Option<AccessLog> {
    let found = |kind: &str, service: &str, port: u32| match lookup(service, port) {
        Ok(found) => Some(found),
        Err(e) => {
            tracing::error!(provider = %name, "could not find cluster for {kind} provider: {e}");
            None
        }
    };
    match provider {
        Provider::EnvoyFileAccessLog(p) => Some(file_log_from_provider(name, p, mesh)),
        Provider::EnvoyHttpAls(p) => {
            let (host, cluster) = found("http grpc", &p.service, p.port)?;
            Some(http_als(p, &host, &cluster))
        }
        Provider::EnvoyTcpAls(p) => {
            let (host, cluster) = found("tcp grpc", &p.service, p.port)?;
            Some(tcp_als(p, &host, &cluster))
        }
        Provider::EnvoyOtelAls(p) => {
            let (host, cluster) = found("open telemetry", &p.service, p.port)?;
            Some(otel_als(p, &host, &cluster))
        }
        _ => None,
    }
}

/// The legacy ALS logger of `enableEnvoyAccessLogService` (HTTP).
pub fn legacy_http_als() -> AccessLog {
    let cfg = HttpGrpcAccessLogConfig {
        common_config: Some(common(
            "http_envoy_accesslog",
            ALS_CLUSTER,
            "",
            PEER_STATE_WITH_WASM.iter().map(|s| s.to_string()).collect(),
        )),
        ..Default::default()
    };
    AccessLog {
        name: HTTP_GRPC_LOGGER.into(),
        config_type: Some(access_log::ConfigType::TypedConfig(pack(&cfg))),
        filter: None,
    }
}

/// The legacy ALS logger of `enableEnvoyAccessLogService` (TCP; `listener`: the
/// listener-level one, logging connections no chain took).
pub fn legacy_tcp_als(listener: bool) -> AccessLog {
    let name = if listener {
        "listener_envoy_accesslog"
    } else {
        "tcp_envoy_accesslog"
    };
    let cfg = TcpGrpcAccessLogConfig {
        common_config: Some(common(
            name,
            ALS_CLUSTER,
            "",
            PEER_STATE_WITH_WASM.iter().map(|s| s.to_string()).collect(),
        )),
    };
    AccessLog {
        name: TCP_GRPC_LOGGER.into(),
        config_type: Some(access_log::ConfigType::TypedConfig(pack(&cfg))),
        filter: listener.then(no_route_filter),
    }
}

/// Logs only connections no filter chain matched (`NR`): what listener-level logs
/// record.
pub fn no_route_filter() -> AccessLogFilter {
    AccessLogFilter {
        filter_specifier: Some(access_log_filter::FilterSpecifier::ResponseFlagFilter(
            ResponseFlagFilter {
                flags: vec!["NR".into()],
            },
        )),
    }
}

/// A Telemetry `filter.expression` as a CEL access log filter.
pub fn cel_filter(filter: &tel::access_logging::Filter) -> AccessLogFilter {
    let cel = ExpressionFilter {
        expression: filter.expression.clone(),
        ..Default::default()
    };
    AccessLogFilter {
        filter_specifier: Some(access_log_filter::FilterSpecifier::ExtensionFilter(
            ExtensionFilter {
                name: "envoy.access_loggers.extension_filters.cel".into(),
                config_type: Some(extension_filter::ConfigType::TypedConfig(pack(&cel))),
            },
        )),
    }
}

/// Several filters that must all pass (one stays itself; none is no filter).
pub fn and_filter(mut filters: Vec<AccessLogFilter>) -> Option<AccessLogFilter> {
    match filters.len() {
        0 => None,
        1 => filters.pop(),
        _ => Some(AccessLogFilter {
            filter_specifier: Some(access_log_filter::FilterSpecifier::AndFilter(AndFilter {
                filters,
            })),
        }),
    }
}

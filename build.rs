//! Compiles the protobuf descriptors that `/debug/config_dump` renders with.
//!
//! The config dump shows what a proxy was sent as Envoy's admin `ConfigDump` in proto3
//! JSON, and nested `Any`s (the connection manager inside a listener's filter chain, TLS
//! transport sockets, ...) can only be expanded with the descriptors of their types.
//! envoy-types ships its `.proto` sources but exposes no descriptor set, so this script
//! finds those sources and compiles only the files the generators can emit (imports
//! follow transitively) with protox, a pure-Rust compiler: no system `protoc`.
//!
//! Where the sources are looked for, first hit wins:
//! 1. `$MESHFED_ENVOY_PROTO_DIR` (the `proto/` directory of an envoy-types checkout);
//! 2. `vendor/envoy-types/proto` or `vendor/envoy-types-<version>/proto` (`cargo vendor`);
//! 3. the cargo registry sources (`$CARGO_HOME`, else `~/.cargo`) of the envoy-types
//!    version locked in `Cargo.lock`.
//!
//! Cargo is deliberately not asked (`cargo metadata`): a build script that calls cargo
//! can wait forever on the lock the outer build holds.
//!
//! When nothing is found the build still succeeds with a warning: the descriptor file is
//! left empty and `/debug/config_dump` answers 503 with the reason.

use std::path::{Path, PathBuf};
use std::{env, fs};

/// Files compiled, relative to envoy-types' `proto/data-plane-api`: the admin dump
/// envelopes, the four resource types, and every extension type the generators pack
/// into an `Any` (grep `src/generate` for `pack(`, `any(` and `type_url`).
const ENTRY_FILES: &[&str] = &[
    "envoy/admin/v3/config_dump_shared.proto",
    "envoy/config/cluster/v3/cluster.proto",
    "envoy/config/endpoint/v3/endpoint.proto",
    "envoy/config/listener/v3/listener.proto",
    "envoy/config/route/v3/route.proto",
    "envoy/extensions/filters/http/buffer/v3/buffer.proto",
    "envoy/extensions/filters/http/cors/v3/cors.proto",
    "envoy/extensions/filters/http/ext_authz/v3/ext_authz.proto",
    "envoy/extensions/filters/http/fault/v3/fault.proto",
    "envoy/extensions/filters/http/grpc_stats/v3/config.proto",
    "envoy/extensions/filters/http/grpc_web/v3/grpc_web.proto",
    "envoy/extensions/filters/http/rbac/v3/rbac.proto",
    "envoy/extensions/filters/http/router/v3/router.proto",
    "envoy/extensions/filters/listener/http_inspector/v3/http_inspector.proto",
    "envoy/extensions/filters/listener/original_dst/v3/original_dst.proto",
    "envoy/extensions/filters/listener/tls_inspector/v3/tls_inspector.proto",
    "envoy/extensions/filters/network/ext_authz/v3/ext_authz.proto",
    "envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto",
    "envoy/extensions/filters/network/rbac/v3/rbac.proto",
    "envoy/extensions/filters/network/tcp_proxy/v3/tcp_proxy.proto",
    "envoy/extensions/path/match/uri_template/v3/uri_template_match.proto",
    "envoy/extensions/retry/host/previous_hosts/v3/previous_hosts.proto",
    "envoy/extensions/retry/priority/previous_priorities/v3/previous_priorities_config.proto",
    "envoy/extensions/transport_sockets/raw_buffer/v3/raw_buffer.proto",
    "envoy/extensions/transport_sockets/tls/v3/secret.proto",
    "envoy/extensions/transport_sockets/tls/v3/tls.proto",
    "envoy/extensions/upstreams/http/v3/http_protocol_options.proto",
    // Telemetry: access loggers, their filters and formatters, tracers, request ids.
    "envoy/extensions/access_loggers/file/v3/file.proto",
    "envoy/extensions/access_loggers/grpc/v3/als.proto",
    "envoy/extensions/access_loggers/open_telemetry/v3/logs_service.proto",
    "envoy/extensions/access_loggers/filters/cel/v3/cel.proto",
    "envoy/extensions/formatter/req_without_query/v3/req_without_query.proto",
    "envoy/config/trace/v3/zipkin.proto",
    "envoy/config/trace/v3/datadog.proto",
    "envoy/config/trace/v3/skywalking.proto",
    "envoy/config/trace/v3/opentelemetry.proto",
    "envoy/extensions/request_id/uuid/v3/uuid.proto",
    // Types EnvoyFilter patch values commonly carry (`generate::envoyfilter` converts
    // values through these descriptors; an unknown type rejects the patch).
    "envoy/extensions/filters/http/lua/v3/lua.proto",
    "envoy/extensions/filters/http/wasm/v3/wasm.proto",
    "envoy/extensions/filters/network/wasm/v3/wasm.proto",
    "envoy/extensions/filters/http/header_to_metadata/v3/header_to_metadata.proto",
    "envoy/extensions/filters/http/compressor/v3/compressor.proto",
    "envoy/extensions/filters/http/health_check/v3/health_check.proto",
    "envoy/extensions/transport_sockets/alts/v3/alts.proto",
    "envoy/extensions/filters/listener/proxy_protocol/v3/proxy_protocol.proto",
    "envoy/extensions/filters/network/local_ratelimit/v3/local_rate_limit.proto",
    "envoy/extensions/filters/http/local_ratelimit/v3/local_rate_limit.proto",
    "envoy/extensions/filters/http/ratelimit/v3/rate_limit.proto",
    "envoy/extensions/filters/network/ratelimit/v3/rate_limit.proto",
    "envoy/extensions/filters/http/dynamic_forward_proxy/v3/dynamic_forward_proxy.proto",
    "envoy/extensions/filters/network/redis_proxy/v3/redis_proxy.proto",
    "envoy/extensions/filters/http/ext_proc/v3/ext_proc.proto",
    "envoy/extensions/filters/http/jwt_authn/v3/config.proto",
    "envoy/extensions/filters/http/header_mutation/v3/header_mutation.proto",
    "envoy/extensions/filters/http/set_metadata/v3/set_metadata.proto",
    "envoy/extensions/filters/http/csrf/v3/csrf.proto",
    "envoy/extensions/filters/http/oauth2/v3/oauth.proto",
    "envoy/extensions/filters/http/stateful_session/v3/stateful_session.proto",
    "envoy/extensions/filters/http/gzip/v3/gzip.proto",
    "envoy/extensions/compression/gzip/compressor/v3/gzip.proto",
];

/// Files that name `common.<x>.v3` types relative to their own package
/// (`envoy.extensions.filters...`): compiled in one set with other files of
/// `envoy.extensions.filters.common`, such a name resolves there and is not found.
/// They are compiled from copies whose names are fully qualified
/// (`.envoy.extensions.common.<x>.v3`), which is what they mean.
const RELATIVE_COMMON: &[&str] = &[
    "envoy/extensions/filters/http/local_ratelimit/v3/local_rate_limit.proto",
    "envoy/extensions/filters/http/ratelimit/v3/rate_limit.proto",
    "envoy/extensions/filters/network/ratelimit/v3/rate_limit.proto",
    "envoy/extensions/filters/http/dynamic_forward_proxy/v3/dynamic_forward_proxy.proto",
    "envoy/extensions/filters/network/redis_proxy/v3/redis_proxy.proto",
];

/// The `envoy.extensions.common` packages [`RELATIVE_COMMON`] files name relatively.
const COMMON_PACKAGES: &[&str] = &["ratelimit", "dynamic_forward_proxy", "aws"];

/// Import roots inside envoy-types' `proto/` directory.
const INCLUDE_ROOTS: &[&str] = &[
    "data-plane-api",
    "xds",
    "protoc-gen-validate",
    "googleapis",
    "cel-spec/proto",
    "opentelemetry-proto",
    "client_model",
];

/// A stand-in message for an `Any` whose type has no descriptor here. The renderer
/// swaps such an `Any` for this one, then rewrites the JSON to `{"@type", "value"}`.
/// Kept in sync with `src/admin/config_dump.rs`.
const OPAQUE_ANY_PROTO: &str = r#"syntax = "proto3";
package meshfed.admin.v1;
message OpaqueAny {
  string type_url = 1;
  bytes value = 2;
}
"#;

/// Istio's upstream ALPN override filter config (istio.io/api
/// `envoy/config/filter/http/alpn/v2alpha1/config.proto`, the fields Istio sets), which
/// outbound and gateway connection managers carry (`istio.alpn`).
const ISTIO_ALPN_PROTO: &str = r#"syntax = "proto3";
package istio.envoy.config.filter.http.alpn.v2alpha1;
message FilterConfig {
  enum Protocol {
    HTTP10 = 0;
    HTTP11 = 1;
    HTTP2 = 2;
  }
  message AlpnOverride {
    Protocol upstream_protocol = 1;
    repeated string alpn_override = 2;
  }
  repeated AlpnOverride alpn_override = 1;
}
"#;

/// Messages of Istio's proxy that listeners carry and envoy-types has no `.proto` of:
/// `udpa.type.v1.TypedStruct` (metadata exchange configs) and the fields of
/// `stats.PluginConfig` meshfed sets (`istio.stats`). Kept in sync with
/// `src/generate/telemetry/mod.rs`.
const ISTIO_PROXY_PROTOS: &[(&str, &str)] = &[
    (
        "udpa/type/v1/typed_struct.proto",
        r#"syntax = "proto3";
package udpa.type.v1;
import "google/protobuf/struct.proto";
message TypedStruct {
  string type_url = 1;
  google.protobuf.Struct value = 2;
}
"#,
    ),
    (
        "stats/config.proto",
        r#"syntax = "proto3";
package stats;
import "google/protobuf/duration.proto";
message MetricConfig {
  map<string, string> dimensions = 1;
  string name = 2;
  repeated string tags_to_remove = 3;
  bool drop = 5;
}
message PluginConfig {
  bool disable_host_header_fallback = 6;
  google.protobuf.Duration tcp_reporting_duration = 7;
  repeated MetricConfig metrics = 8;
}
"#,
    ),
];

const OUTPUT: &str = "config_dump_descriptors.bin";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=Cargo.lock");
    println!("cargo:rerun-if-env-changed=MESHFED_ENVOY_PROTO_DIR");
    println!("cargo:rerun-if-env-changed=CARGO_HOME");

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let started = std::time::Instant::now();
    let descriptors = find_proto_dir(&manifest_dir)
        .and_then(|dir| compile(&dir, &out_dir).map(|bytes| (dir, bytes)));
    let bytes = match descriptors {
        Ok((dir, bytes)) => {
            if env::var_os("MESHFED_BUILD_TIMING").is_some() {
                println!(
                    "cargo:warning=config_dump descriptors: {} bytes from {} in {:?}",
                    bytes.len(),
                    dir.display(),
                    started.elapsed()
                );
            }
            bytes
        }
        Err(reason) => {
            let reason = reason.replace(['\n', '\r'], " ");
            println!(
                "cargo:warning=/debug/config_dump will answer 503: {reason} (set MESHFED_ENVOY_PROTO_DIR to envoy-types' proto/ directory)"
            );
            println!("cargo:rustc-env=MESHFED_CONFIG_DUMP_UNAVAILABLE={reason}");
            Vec::new()
        }
    };
    fs::write(out_dir.join(OUTPUT), bytes).expect("write the descriptor set to OUT_DIR");
}

/// The envoy-types `proto/` directory to compile from.
fn find_proto_dir(manifest_dir: &Path) -> Result<PathBuf, String> {
    if let Some(dir) = env::var_os("MESHFED_ENVOY_PROTO_DIR") {
        let dir = PathBuf::from(dir);
        return if has_sources(&dir) {
            Ok(dir)
        } else {
            Err(format!(
                "MESHFED_ENVOY_PROTO_DIR={} holds no data-plane-api/{}",
                dir.display(),
                ENTRY_FILES[0]
            ))
        };
    }
    let version = locked_version(&manifest_dir.join("Cargo.lock"));
    let mut candidates = vec![manifest_dir.join("vendor/envoy-types/proto")];
    if let Some(v) = &version {
        candidates.push(manifest_dir.join(format!("vendor/envoy-types-{v}/proto")));
    }
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let mut registry_dirs: Vec<PathBuf> = Vec::new();
    if let Some(home) = &cargo_home {
        // One directory per registry index (crates.io's is `index.crates.io-<hash>`).
        if let Ok(entries) = fs::read_dir(home.join("registry/src")) {
            registry_dirs.extend(entries.flatten().map(|e| e.path()));
        }
    }
    registry_dirs.sort();
    match &version {
        Some(v) => candidates.extend(
            registry_dirs
                .iter()
                .map(|r| r.join(format!("envoy-types-{v}/proto"))),
        ),
        // No lock file (e.g. built as a dependency): the newest unpacked envoy-types.
        None => candidates.extend(newest_unpacked(&registry_dirs)),
    }
    if let Some(found) = candidates.iter().find(|c| has_sources(c)) {
        return Ok(found.clone());
    }
    Err(format!(
        "envoy-types {} .proto sources not found (looked in vendor/ and {})",
        version.as_deref().unwrap_or("(version not locked)"),
        cargo_home
            .map(|h| h.join("registry/src").display().to_string())
            .unwrap_or_else(|| "no CARGO_HOME or HOME".to_string()),
    ))
}

fn has_sources(proto_dir: &Path) -> bool {
    proto_dir
        .join("data-plane-api")
        .join(ENTRY_FILES[0])
        .is_file()
}

/// The envoy-types version in `Cargo.lock`, if the lock file names exactly one.
fn locked_version(lock: &Path) -> Option<String> {
    let text = fs::read_to_string(lock).ok()?;
    let mut versions = text.split("[[package]]").filter_map(|block| {
        let mut lines = block.lines().map(str::trim);
        lines.find(|l| *l == "name = \"envoy-types\"")?;
        block
            .lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix("version = \""))
            .and_then(|v| v.strip_suffix('"'))
            .map(str::to_string)
    });
    let first = versions.next()?;
    versions.next().is_none().then_some(first)
}

/// `envoy-types-<x.y.z>/proto` directories in the registries, newest version first.
fn newest_unpacked(registry_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut found: Vec<(Vec<u64>, PathBuf)> = Vec::new();
    for registry in registry_dirs {
        let Ok(entries) = fs::read_dir(registry) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(version) = name.strip_prefix("envoy-types-") else {
                continue;
            };
            let Ok(parts) = version
                .split('.')
                .map(str::parse)
                .collect::<Result<Vec<u64>, _>>()
            else {
                continue; // a pre-release or something else; skip
            };
            found.push((parts, entry.path().join("proto")));
        }
    }
    found.sort_by(|a, b| b.0.cmp(&a.0));
    found.into_iter().map(|(_, dir)| dir).collect()
}

/// Compiles [`ENTRY_FILES`] and their imports into an encoded `FileDescriptorSet`.
fn compile(proto_dir: &Path, out_dir: &Path) -> Result<Vec<u8>, String> {
    let local = out_dir.join("config_dump_proto");
    let opaque = local.join("meshfed/admin/v1/opaque_any.proto");
    fs::create_dir_all(opaque.parent().expect("has a parent"))
        .and_then(|()| fs::write(&opaque, OPAQUE_ANY_PROTO))
        .map_err(|e| format!("writing {}: {e}", opaque.display()))?;
    let alpn = local.join("istio/alpn/config.proto");
    fs::create_dir_all(alpn.parent().expect("has a parent"))
        .and_then(|()| fs::write(&alpn, ISTIO_ALPN_PROTO))
        .map_err(|e| format!("writing {}: {e}", alpn.display()))?;

    for (name, text) in ISTIO_PROXY_PROTOS {
        let path = local.join(name);
        fs::create_dir_all(path.parent().expect("has a parent"))
            .and_then(|()| fs::write(&path, text))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    // Qualified copies of the files in RELATIVE_COMMON, found before the originals.
    let qualified = out_dir.join("config_dump_proto_qualified");
    for name in RELATIVE_COMMON {
        let from = proto_dir.join("data-plane-api").join(name);
        let mut text =
            fs::read_to_string(&from).map_err(|e| format!("reading {}: {e}", from.display()))?;
        for package in COMMON_PACKAGES {
            for lead in [" ", "\t"] {
                text = text.replace(
                    &format!("{lead}common.{package}.v3."),
                    &format!("{lead}.envoy.extensions.common.{package}.v3."),
                );
            }
        }
        let to = qualified.join(name);
        fs::create_dir_all(to.parent().expect("has a parent"))
            .and_then(|()| fs::write(&to, text))
            .map_err(|e| format!("writing {}: {e}", to.display()))?;
    }
    let mut includes: Vec<PathBuf> = vec![qualified];
    includes.extend(
        INCLUDE_ROOTS
            .iter()
            .map(|r| proto_dir.join(r))
            .filter(|d| d.is_dir()),
    );
    includes.push(local);
    let mut compiler = protox::Compiler::new(&includes).map_err(|e| format!("protox: {e}"))?;
    compiler.include_imports(true).include_source_info(false);
    compiler
        .open_files(
            ENTRY_FILES
                .iter()
                .copied()
                .chain([
                    "meshfed/admin/v1/opaque_any.proto",
                    "istio/alpn/config.proto",
                ])
                .chain(ISTIO_PROXY_PROTOS.iter().map(|(name, _)| *name)),
        )
        .map_err(|e| format!("compiling envoy protos from {}: {e}", proto_dir.display()))?;
    Ok(compiler.encode_file_descriptor_set())
}

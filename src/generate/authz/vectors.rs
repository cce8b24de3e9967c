//! Istio's authorization builder vectors (`pilot/pkg/security/authz/builder/testdata`):
//! policies in, RBAC filter configs out, stored under `tests/data/authz/{http,tcp}` as
//! `<case>.policy.yaml` and `<case>.rbac[-<n>].yaml`, one file per filter in order
//! (RBAC or, for CUSTOM, ext_authz; for `single-policy`, `allow-full-rule` and the
//! ext_authz outputs Istio's `extended-*` expectation, the one for current proxies).
//! CUSTOM cases run with the mesh config providers of Istio's builder test
//! (`meshConfigGRPC`, `meshConfigHTTP`, `meshConfigInvalid`, and the providers with
//! only service, port, failOpen and statusOnError of its `*-clear-route-cache-default`
//! cases) and a registry holding `my-custom-ext-authz.foo.svc.cluster.local` in `foo`.
//! Both sides are read into the Envoy proto through the compiled-in descriptors and
//! compared as proto3 JSON.
//!
//! Normalized on both sides before comparing, because they are equivalent for Envoy
//! and Istio's releases spell them differently:
//! - the deprecated header fields `exactMatch` / `prefixMatch` / `suffixMatch` become
//!   `stringMatch {exact | prefix | suffix}`;
//! - `safeRegex.googleRe2: {}` (the deprecated, only engine) is dropped;
//! - `shadowRulesStatPrefix` is dropped when there are no shadow rules (no shadow stats
//!   are emitted then; Istio's releases print `istio_dry_run_` or
//!   `istio_dry_run_allow_` there);
//! - an ext_authz `filterEnabledMetadata` prefix `istio-ext-authz-<provider>` becomes
//!   `istio-ext-authz`: every shadow policy of a lone provider is named
//!   `istio-ext-authz-<provider>-...`, so both prefixes enable the filter for the
//!   same requests (the releases that put the provider into the names match on it).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use meshfed_api::security::v1beta1::AuthorizationPolicy;
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, SerializeOptions};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::trust_domain::TrustDomains;
use super::{AuthzOptions, http_filters, network_filters, select};
use crate::push::config_index::Config;

struct Vector {
    name: &'static str,
    tcp: bool,
    outputs: usize,
    trust_domain: Option<(&'static str, &'static [&'static str])>,
    /// Istio's `extended-*` expectation (JWT claims and envoy filter metadata matched
    /// per field, for current proxies) rather than the per-value one.
    extended: bool,
    /// The mesh config's `extensionProviders` (YAML).
    mesh: &'static str,
}

/// Istio's `meshConfigGRPC`.
const GRPC: &str = "- name: default
  envoyExtAuthzGrpc:
    service: foo/my-custom-ext-authz.foo.svc.cluster.local
    port: 9000
    timeout: 0.002s
    failOpen: true
    statusOnError: '403'
    includeRequestBodyInCheck: {maxRequestBytes: 4096, allowPartialMessage: true}
";
/// Istio's `meshConfigHTTP`.
const HTTP: &str = "- name: default
  envoyExtAuthzHttp:
    service: foo/my-custom-ext-authz.foo.svc.cluster.local
    port: 9000
    timeout: 10s
    failOpen: true
    statusOnError: '403'
    pathPrefix: /check
    includeRequestHeadersInCheck: [x-custom-id, x-prefix-*, '*-suffix']
    includeHeadersInCheck: [should-not-include-when-IncludeRequestHeadersInCheck-is-set]
    includeAdditionalHeadersInCheck: {x-header-1: value-1, x-header-2: value-2}
    includeRequestBodyInCheck: {maxRequestBytes: 2048, allowPartialMessage: true, packAsBytes: true}
    headersToUpstreamOnAllow: [Authorization, x-prefix-*, '*-suffix']
    headersToDownstreamOnDeny: [Set-cookie, x-prefix-*, '*-suffix']
    headersToDownstreamOnAllow: [Set-cookie, x-prefix-*, '*-suffix']
";
/// A gRPC provider with defaults for everything but failOpen and statusOnError.
const GRPC_DEFAULTS: &str = "- name: default
  envoyExtAuthzGrpc: {service: foo/my-custom-ext-authz.foo.svc.cluster.local, port: 9000, failOpen: true, statusOnError: '403'}
";
/// An HTTP provider with defaults for everything but failOpen and statusOnError.
const HTTP_DEFAULTS: &str = "- name: default
  envoyExtAuthzHttp: {service: foo/my-custom-ext-authz.foo.svc.cluster.local, port: 9000, failOpen: true, statusOnError: '403'}
";
/// An HTTP provider asking for a request body over Envoy's 1 MiB default buffer.
const HTTP_LARGE_BODY: &str = "- name: default
  envoyExtAuthzHttp:
    service: foo/my-custom-ext-authz.foo.svc.cluster.local
    port: 9000
    includeRequestBodyInCheck: {maxRequestBytes: 1048577}
";
/// Istio's `meshConfigInvalid`: unknown service, port out of range, relative path
/// prefix, unknown status.
const INVALID: &str = "- name: default
  envoyExtAuthzHttp: {service: foo/my-custom-ext-authz, port: 999999, pathPrefix: check, statusOnError: '999'}
";

const fn v(name: &'static str, tcp: bool, outputs: usize) -> Vector {
    Vector {
        name,
        tcp,
        outputs,
        trust_domain: None,
        extended: false,
        mesh: GRPC,
    }
}

/// A CUSTOM vector with its providers.
const fn custom(name: &'static str, tcp: bool, outputs: usize, mesh: &'static str) -> Vector {
    Vector {
        mesh,
        extended: true,
        ..v(name, tcp, outputs)
    }
}

/// A vector whose stored expectation is Istio's `extended-*` one.
const fn ext(name: &'static str) -> Vector {
    Vector {
        name,
        tcp: false,
        outputs: 1,
        trust_domain: None,
        extended: true,
        mesh: GRPC,
    }
}

const fn td(name: &'static str, domain: &'static str, aliases: &'static [&'static str]) -> Vector {
    Vector {
        name,
        tcp: false,
        outputs: 1,
        trust_domain: Some((domain, aliases)),
        extended: false,
        mesh: GRPC,
    }
}

/// The cases, with the trust domain bundles of Istio's builder test.
const VECTORS: &[Vector] = &[
    v("allow-empty-rule", false, 1),
    v("allow-nil-rule", false, 1),
    v("allow-path", false, 1),
    v("deny-empty-rule", false, 1),
    v("dry-run-allow", false, 1),
    v("dry-run-mix", false, 1),
    td("trust-domain-one-alias", "td1", &["cluster.local"]),
    td(
        "trust-domain-multiple-aliases",
        "td1",
        &["cluster.local", "some-td"],
    ),
    td("trust-domain-wildcard-in-principal", "td1", &["foobar"]),
    td(
        "trust-domain-aliases-in-source-principal",
        "new-td",
        &["old-td", "some-trustdomain"],
    ),
    v("deny-and-allow", false, 2),
    ext("single-policy"),
    ext("allow-full-rule"),
    v("multiple-policies", false, 1),
    custom("custom-grpc-provider", false, 2, GRPC),
    custom("custom-http-provider", false, 2, HTTP),
    custom(
        "custom-grpc-provider-clear-route-cache-default",
        false,
        2,
        GRPC_DEFAULTS,
    ),
    custom(
        "custom-http-provider-clear-route-cache-default",
        false,
        2,
        HTTP_DEFAULTS,
    ),
    custom(
        "custom-http-provider-with-max-request-body-bigger-than-1MiB",
        false,
        3,
        HTTP_LARGE_BODY,
    ),
    // Two providers at once (without Istio's multiple-provider flag).
    custom("custom-bad-multiple-providers", false, 1, HTTP),
    // The provider is not usable.
    custom("custom-bad-invalid-config", false, 1, INVALID),
    v("dry-run-allow-and-deny", false, 2),
    v("allow-both-http-tcp", true, 1),
    v("audit-both-http-tcp", true, 1),
    custom("custom-both-http-tcp", true, 2, GRPC),
    // Istio's `custom-only-http` case (an HTTP provider has no TCP filter, so nothing
    // is built on TCP), with the custom-both-http-tcp policies as input.
    custom("custom-http-provider-on-tcp", true, 0, HTTP),
    v("allow-only-http", true, 1),
    v("deny-both-http-tcp", true, 1),
    v("dry-run-mix", true, 1),
];

/// Vectors we do not match, and why. The test fails if one of them starts passing.
const KNOWN_DIFFERENCES: &[(&str, &str)] = &[
    (
        "http/dry-run-allow",
        "the stored expectation is of the Istio release that named every shadow stat \
         prefix `istio_dry_run_`; later releases (and we) use `istio_dry_run_allow_` for \
         ALLOW shadow rules",
    ),
    (
        "http/dry-run-allow-and-deny",
        "as http/dry-run-allow: the stored expectations use the shadow stat prefix \
         `istio_dry_run_` where later releases (and we) use `istio_dry_run_deny_` and \
         `istio_dry_run_allow_`",
    ),
    (
        "http/deny-and-allow.rbac-2",
        "the first filter (DENY) matches; the stored second one is of the Istio release \
         that matched `principals` on the `istio_authn` filter's `source.principal` \
         metadata, where later releases (and we) match the peer certificate \
         (`authenticated.principal_name`, `spiffe://allow`)",
    ),
    (
        "http/trust-domain-one-alias",
        "principals match; the stored expectation is of an Istio release that put \
         `namespaces` into the regex unescaped (`.*/ns/rule[0]-from[1]-ns[0]/.*`); the \
         release of the single-policy vector (and we) escape it \
         (`.*/ns/rule\\[0\\]-from\\[1\\]-ns\\[0\\]/.*`)",
    ),
    (
        "http/multiple-policies",
        "eight of the nine policies match; the stored expectation is of the Istio release \
         that matched `requestPrincipals` on the `istio_authn` filter's \
         `request.auth.principal` metadata, where later releases (and we, see the \
         single-policy vector) match the JWT payload's `iss` and `sub`",
    ),
    (
        "http/custom-grpc-provider.rbac-2",
        "the stored expectation is of the Istio release that set `clearRouteCache: true` \
         on every gRPC provider; later releases set it only when the provider asks (see \
         http/custom-grpc-provider-clear-route-cache-default), through a provider field \
         the istio/api release meshfed follows does not have",
    ),
    (
        "tcp/custom-both-http-tcp.rbac-1",
        "the rules match (HTTP-only rules dropped whole); the stored expectation is of \
         the Istio release that named CUSTOM shadow policies `istio-ext-authz-ns[..]`, \
         later releases (and we, see http/custom-grpc-provider) put the provider in: \
         `istio-ext-authz-default-ns[..]`",
    ),
    (
        "http/trust-domain-multiple-aliases",
        "as http/trust-domain-one-alias: an unescaped namespace regex in the stored \
         expectation",
    ),
];

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/authz")
}

fn pool() -> DescriptorPool {
    DescriptorPool::decode(crate::xds::ENVOY_DESCRIPTORS)
        .expect("the compiled-in envoy descriptors decode")
}

fn descriptor(pool: &DescriptorPool, tcp: bool) -> MessageDescriptor {
    let name = if tcp {
        "envoy.config.listener.v3.Filter"
    } else {
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter"
    };
    pool.get_message_by_name(name)
        .unwrap_or_else(|| panic!("descriptor {name} is compiled in"))
}

fn to_json(m: &DynamicMessage) -> Value {
    m.serialize_with_options(serde_json::value::Serializer, &SerializeOptions::new())
        .expect("serializes")
}

/// Rewrites the spellings Envoy treats as equal into one (see the module comment).
fn normalize(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (old, new) in [
                ("exactMatch", "exact"),
                ("prefixMatch", "prefix"),
                ("suffixMatch", "suffix"),
            ] {
                if let Some(x) = map.remove(old) {
                    map.insert("stringMatch".into(), json!({ new: x }));
                }
            }
            map.remove("googleRe2");
            if let Some(Value::String(prefix)) = map.get_mut("prefix")
                && prefix.starts_with("istio-ext-authz-")
                && !prefix.contains("-ns[")
            {
                *prefix = "istio-ext-authz".into();
            }
            if !map.contains_key("shadowRules") {
                map.remove("shadowRulesStatPrefix");
            }
            for x in map.values_mut() {
                normalize(x);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(normalize),
        _ => {}
    }
}

fn expected(pool: &DescriptorPool, tcp: bool, text: &str) -> Value {
    let yaml: Value = serde_norway::from_str(text).expect("expected YAML parses");
    let mut yaml = yaml;
    normalize(&mut yaml);
    let m = DynamicMessage::deserialize(descriptor(pool, tcp), yaml)
        .expect("expected YAML is the Envoy proto");
    let mut out = to_json(&m);
    normalize(&mut out);
    out
}

fn actual(pool: &DescriptorPool, tcp: bool, bytes: Vec<u8>) -> Value {
    let m = DynamicMessage::decode(descriptor(pool, tcp), bytes.as_slice()).expect("decodes");
    let mut out = to_json(&m);
    normalize(&mut out);
    out
}

/// The AuthorizationPolicies of a multi-document Kubernetes YAML file.
pub(super) fn policies(text: &str) -> Vec<Arc<Config<AuthorizationPolicy>>> {
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(text) {
        let value = Value::deserialize(doc).expect("policy YAML parses");
        if value.is_null() {
            continue;
        }
        let meta = &value["metadata"];
        let string_map = |v: &Value| -> BTreeMap<String, String> {
            v.as_object()
                .map(|m: &Map<String, Value>| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect()
                })
                .unwrap_or_default()
        };
        let spec = value.get("spec").cloned().unwrap_or_else(|| json!({}));
        out.push(Arc::new(Config {
            name: meta["name"].as_str().unwrap_or_default().to_string(),
            namespace: meta["namespace"].as_str().unwrap_or_default().to_string(),
            labels: string_map(&meta["labels"]),
            annotations: string_map(&meta["annotations"]),
            creation_time: SystemTime::UNIX_EPOCH,
            spec: serde_json::from_value(spec).expect("spec is an AuthorizationPolicy"),
        }));
    }
    out
}

/// The resolved providers of a vector's mesh config, with the builder test's registry.
fn providers(mesh: &str) -> super::ext_authz::Resolved {
    let list: Value = serde_norway::from_str(mesh).expect("providers YAML parses");
    let config: meshfed_api::mesh::v1alpha1::MeshConfig =
        serde_json::from_value(json!({ "extensionProviders": list }))
            .expect("providers are MeshConfig extensionProviders");
    super::ext_authz::resolve(&config, &|host| {
        if host == "my-custom-ext-authz.foo.svc.cluster.local" {
            vec!["foo".to_string()]
        } else {
            Vec::new()
        }
    })
}

/// One output file of a vector (`<dir>/<case>.rbac[-<n>]`) and whether it matched.
type FileResult = (String, Result<(), String>);

/// Runs one vector: per output file (`<dir>/<case>.rbac[-<n>]`), `Ok` when it
/// matches, else the difference; a wrong number of filters is an error of the case.
fn run(pool: &DescriptorPool, case: &Vector) -> Result<Vec<FileResult>, String> {
    let dir_name = if case.tcp { "tcp" } else { "http" };
    let dir = data_dir().join(dir_name);
    let read = |file: String| {
        std::fs::read_to_string(dir.join(&file)).unwrap_or_else(|e| panic!("{file}: {e}"))
    };
    let input = policies(&read(format!("{}.policy.yaml", case.name)));
    let labels: BTreeMap<String, String> = [("app", "httpbin"), ("version", "v1")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let selected = select(&input, "istio-system", "foo", &labels);
    let opts = AuthzOptions {
        trust_domains: case
            .trust_domain
            .map(|(d, a)| {
                TrustDomains::new(d, &a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            })
            .unwrap_or_default(),
        extended_jwt: case.extended,
        custom_providers: Some(Arc::new(providers(case.mesh))),
        multiple_custom_providers: false,
    };
    // Every filter also has to pass Envoy's own field rules (PGV).
    let got: Vec<Vec<u8>> = if case.tcp {
        let filters = network_filters(&selected, &opts);
        filters
            .iter()
            .for_each(crate::xds::pgv::assert_message_valid);
        filters.iter().map(Message::encode_to_vec).collect()
    } else {
        let filters = http_filters(&selected, &opts);
        filters
            .iter()
            .for_each(crate::xds::pgv::assert_message_valid);
        filters.iter().map(Message::encode_to_vec).collect()
    };
    if got.len() != case.outputs {
        return Err(format!("{} filters, want {}", got.len(), case.outputs));
    }
    let mut out = Vec::new();
    for (i, bytes) in got.into_iter().enumerate() {
        let stem = if case.outputs == 1 {
            format!("{}.rbac", case.name)
        } else {
            format!("{}.rbac-{}", case.name, i + 1)
        };
        let want = expected(pool, case.tcp, &read(format!("{stem}.yaml")));
        let have = actual(pool, case.tcp, bytes);
        let result = if want == have {
            Ok(())
        } else {
            Err(format!(
                "differs\n--- want\n{}\n--- got\n{}",
                serde_json::to_string_pretty(&want).unwrap_or_default(),
                serde_json::to_string_pretty(&have).unwrap_or_default()
            ))
        };
        out.push((format!("{dir_name}/{stem}"), result));
    }
    Ok(out)
}

#[test]
fn istio_builder_vectors() {
    let pool = pool();
    let mut failures = Vec::new();
    let mut known_seen = std::collections::BTreeSet::new();
    let (mut passed, mut files) = (0, 0);
    // A known difference names a case (`http/dry-run-allow`) or one of its files
    // (`http/deny-and-allow.rbac-2`).
    let known = |file: &str, case: &str| {
        KNOWN_DIFFERENCES
            .iter()
            .find(|(n, _)| *n == file || *n == case)
            .map(|(n, _)| *n)
    };
    for case in VECTORS {
        let id = format!("{}/{}", if case.tcp { "tcp" } else { "http" }, case.name);
        let results = match run(&pool, case) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{id}: {e}"));
                continue;
            }
        };
        for (file, result) in results {
            files += 1;
            match (result, known(&file, &id)) {
                (Ok(()), None) => passed += 1,
                (Ok(()), Some(k)) if k == file => failures.push(format!(
                    "{file} now passes: remove it from KNOWN_DIFFERENCES"
                )),
                (Ok(()), Some(_)) => passed += 1,
                (Err(e), Some(k)) => {
                    known_seen.insert(k);
                    eprintln!("{file} (known difference): {e}");
                }
                (Err(e), None) => failures.push(format!("{file}: {e}")),
            }
        }
    }
    for (id, _) in KNOWN_DIFFERENCES {
        if !known_seen.contains(id) {
            failures.push(format!(
                "{id} is listed in KNOWN_DIFFERENCES but nothing of it differs (or it is not a vector)"
            ));
        }
    }
    eprintln!(
        "{passed} of {files} filter outputs of {} Istio vectors match ({} known differences)",
        VECTORS.len(),
        KNOWN_DIFFERENCES.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

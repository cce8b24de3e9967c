//! Istio's authorization builder vectors (`pilot/pkg/security/authz/builder/testdata`):
//! policies in, RBAC filter configs out, stored under `tests/data/authz/{http,tcp}` as
//! `<case>.policy.yaml` and `<case>.rbac[-<n>].yaml` (for `single-policy` and
//! `allow-full-rule` Istio's `extended-*` expectation, the one for current proxies). Both sides are read into the
//! Envoy proto through the compiled-in descriptors and compared as proto3 JSON.
//!
//! Normalized on both sides before comparing, because they are equivalent for Envoy
//! and Istio's releases spell them differently:
//! - the deprecated header fields `exactMatch` / `prefixMatch` / `suffixMatch` become
//!   `stringMatch {exact | prefix | suffix}`;
//! - `safeRegex.googleRe2: {}` (the deprecated, only engine) is dropped;
//! - `shadowRulesStatPrefix` is dropped when there are no shadow rules (no shadow stats
//!   are emitted then; Istio's releases print `istio_dry_run_` or
//!   `istio_dry_run_allow_` there).

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
    /// The usable ext_authz providers of the mesh config.
    providers: &'static [&'static str],
}

const fn v(name: &'static str, tcp: bool, outputs: usize) -> Vector {
    Vector {
        name,
        tcp,
        outputs,
        trust_domain: None,
        extended: false,
        providers: &["default"],
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
        providers: &["default"],
    }
}

const fn td(name: &'static str, domain: &'static str, aliases: &'static [&'static str]) -> Vector {
    Vector {
        name,
        tcp: false,
        outputs: 1,
        trust_domain: Some((domain, aliases)),
        extended: false,
        providers: &["default"],
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
    // Istio's second filter (ext_authz) is not built here; the RBAC one is compared.
    v("custom-grpc-provider", false, 1),
    // Two providers at once (without Istio's multiple-provider flag).
    v("custom-bad-multiple-providers", false, 1),
    // The provider is not usable (Istio's test gives it an invalid port and path).
    Vector {
        providers: &[],
        ..v("custom-bad-invalid-config", false, 1)
    },
    v("dry-run-allow-and-deny", false, 2),
    v("allow-both-http-tcp", true, 1),
    v("audit-both-http-tcp", true, 1),
    v("custom-both-http-tcp", true, 1),
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
        "http/deny-and-allow",
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
        "tcp/custom-both-http-tcp",
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

/// Runs one vector: `Ok` when every output matches, else the first difference.
fn run(pool: &DescriptorPool, case: &Vector) -> Result<(), String> {
    let dir = data_dir().join(if case.tcp { "tcp" } else { "http" });
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
        custom_providers: Some(case.providers.iter().map(|p| p.to_string()).collect()),
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
    for (i, bytes) in got.into_iter().enumerate() {
        let file = if case.outputs == 1 {
            format!("{}.rbac.yaml", case.name)
        } else {
            format!("{}.rbac-{}.yaml", case.name, i + 1)
        };
        let want = expected(pool, case.tcp, &read(file.clone()));
        let have = actual(pool, case.tcp, bytes);
        if want != have {
            return Err(format!(
                "{file} differs\n--- want\n{}\n--- got\n{}",
                serde_json::to_string_pretty(&want).unwrap_or_default(),
                serde_json::to_string_pretty(&have).unwrap_or_default()
            ));
        }
    }
    Ok(())
}

#[test]
fn istio_builder_vectors() {
    let pool = pool();
    let mut failures = Vec::new();
    let mut passed = 0;
    for case in VECTORS {
        let id = format!("{}/{}", if case.tcp { "tcp" } else { "http" }, case.name);
        let known = KNOWN_DIFFERENCES.iter().find(|(n, _)| *n == id);
        match (run(&pool, case), known) {
            (Ok(()), None) => passed += 1,
            (Ok(()), Some(_)) => {
                failures.push(format!("{id} now passes: remove it from KNOWN_DIFFERENCES"))
            }
            (Err(e), Some(_)) => eprintln!("{id} (known difference): {e}"),
            (Err(e), None) => failures.push(format!("{id}: {e}")),
        }
    }
    for (id, _) in KNOWN_DIFFERENCES {
        assert!(
            VECTORS
                .iter()
                .any(|c| format!("{}/{}", if c.tcp { "tcp" } else { "http" }, c.name) == *id),
            "KNOWN_DIFFERENCES names an unknown vector {id}"
        );
    }
    eprintln!(
        "{passed} of {} Istio vectors pass ({} known differences)",
        VECTORS.len(),
        KNOWN_DIFFERENCES.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

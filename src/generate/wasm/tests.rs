//! Istio's `pilot/pkg/networking/core/extension/wasmplugin_test.go`
//! (`TestInsertedExtensionConfigurations`) ported, plus selection, ordering, `match`
//! and the filter positions.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{
    AsyncDataSource, HttpUri, RemoteDataSource, TypedExtensionConfig, async_data_source, http_uri,
};
use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm as HttpWasm;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::envoy::extensions::filters::network::wasm::v3::Wasm as NetworkWasm;
use envoy_types::pb::envoy::extensions::wasm::v3::{
    EnvironmentVariables, PluginConfig, VmConfig, plugin_config,
};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use meshfed_api::extensions::v1alpha1 as ext;

use super::ecds::{PullSecrets, inserted_extension_configs};
use super::*;
use crate::generate::proto::pack;

fn plugin(ns: &str, name: &str, yaml: &str) -> Arc<Plugin> {
    let value: serde_json::Value = serde_norway::from_str(yaml).unwrap();
    let value = if value.is_null() {
        serde_json::json!({})
    } else {
        value
    };
    Arc::new(Plugin {
        name: name.into(),
        namespace: ns.into(),
        resource_version: String::new(),
        creation_time: std::time::UNIX_EPOCH,
        spec: serde_json::from_value(value).unwrap(),
    })
}

/// The `httpFilter`/`networkFilter` of the Go test: an empty plugin's config.
fn expected_config(name: &str) -> PluginConfig {
    PluginConfig {
        name: name.into(),
        configuration: Some(Any::default()),
        vm: Some(plugin_config::Vm::VmConfig(VmConfig {
            runtime: "envoy.wasm.runtime.v8".into(),
            code: Some(AsyncDataSource {
                specifier: Some(async_data_source::Specifier::Remote(RemoteDataSource {
                    http_uri: Some(HttpUri {
                        uri: "oci:".into(),
                        http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster("_".into())),
                        timeout: Some(PbDuration {
                            seconds: 30,
                            nanos: 0,
                        }),
                    }),
                    ..Default::default()
                })),
            }),
            environment_variables: Some(EnvironmentVariables {
                key_values: [(
                    "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION".to_string(),
                    String::new(),
                )]
                .into(),
                ..Default::default()
            }),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// A vector of `TestInsertedExtensionConfigurations`: its plugins by name, the names
/// asked for, the extension configs expected (name, network).
struct Vector {
    name: &'static str,
    plugins: &'static [&'static str],
    names: &'static [&'static str],
    expected: &'static [(&'static str, bool)],
}

const VECTORS: &[Vector] = &[
    Vector {
        name: "empty",
        plugins: &[],
        // The Go test asks for `someAuthNFilter.Name` (no namespace).
        names: &["someAuthNFilter"],
        expected: &[],
    },
    Vector {
        name: "authn",
        plugins: &["someAuthNFilter", "someAuthZFilter"],
        names: &["istio-system.someAuthNFilter"],
        expected: &[("istio-system.someAuthNFilter", false)],
    },
    Vector {
        name: "network",
        plugins: &["someNetworkFilter"],
        names: &["istio-system.someNetworkFilter"],
        expected: &[("istio-system.someNetworkFilter", true)],
    },
    Vector {
        name: "combination of http and network",
        plugins: &["someAuthNFilter", "someNetworkFilter"],
        names: &[
            "istio-system.someAuthNFilter",
            "istio-system.someNetworkFilter",
        ],
        expected: &[
            ("istio-system.someAuthNFilter", false),
            ("istio-system.someNetworkFilter", true),
        ],
    },
];

/// The Go test's wrappers: priority 1 and 1000, one NETWORK. The Go test sets their
/// `ResourceName` to `<namespace>.<name>`, so the vectors name them so here too.
fn go_plugin(name: &str) -> Arc<Plugin> {
    match name {
        "someAuthNFilter" => plugin("istio-system", name, "priority: 1"),
        "someAuthZFilter" => plugin("istio-system", name, "priority: 1000"),
        "someNetworkFilter" => plugin("istio-system", name, "priority: 1000\ntype: NETWORK"),
        other => panic!("{other}"),
    }
}

/// Names the known-gaps list holds: vectors that do not pass yet, with the reason.
const KNOWN_GAPS: &[(&str, &str)] = &[];

fn run(v: &Vector) -> Result<(), String> {
    let plugins: Vec<Arc<Plugin>> = v.plugins.iter().map(|n| go_plugin(n)).collect();
    let names: Vec<String> = v.names.iter().map(|s| s.to_string()).collect();
    let got = inserted_extension_configs(
        &plugins,
        &names,
        |p| format!("{}.{}", p.namespace, p.name),
        &PullSecrets::new(),
    );
    let want: Vec<TypedExtensionConfig> = v
        .expected
        .iter()
        .map(|(name, network)| TypedExtensionConfig {
            name: name.to_string(),
            typed_config: Some(if *network {
                pack(&NetworkWasm {
                    config: Some(expected_config(name)),
                })
            } else {
                pack(&HttpWasm {
                    config: Some(expected_config(name)),
                })
            }),
        })
        .collect();
    // Compared decoded: maps in the configs encode in hash order.
    let decode = |c: &TypedExtensionConfig| {
        let any = c.typed_config.as_ref().unwrap();
        let config = if any.type_url.ends_with("network.wasm.v3.Wasm") {
            prost::Message::decode(any.value.as_slice()).map(|w: NetworkWasm| w.config)
        } else {
            prost::Message::decode(any.value.as_slice()).map(|w: HttpWasm| w.config)
        };
        (c.name.clone(), any.type_url.clone(), config.unwrap())
    };
    let got: Vec<_> = got.iter().map(decode).collect();
    let want: Vec<_> = want.iter().map(decode).collect();
    if got == want {
        Ok(())
    } else {
        Err(format!("got {got:#?}\nwant {want:#?}"))
    }
}

#[test]
fn inserted_extension_configurations_vectors() {
    let mut passed = 0;
    for v in VECTORS {
        let gap = KNOWN_GAPS.iter().find(|(n, _)| *n == v.name);
        match (run(v), gap) {
            (Ok(()), None) => passed += 1,
            (Ok(()), Some((_, why))) => {
                panic!("{} passes now: take it off the known gaps ({why})", v.name)
            }
            (Err(e), None) => panic!("{}: {e}", v.name),
            (Err(_), Some(_)) => {}
        }
    }
    assert_eq!(passed, VECTORS.len() - KNOWN_GAPS.len());
}

#[test]
fn every_vector_config_passes_envoys_rules_as_the_agent_forwards_it() {
    let plugins: Vec<Arc<Plugin>> = ["someAuthNFilter", "someNetworkFilter"]
        .iter()
        .map(|n| go_plugin(n))
        .collect();
    for p in &plugins {
        // Encoding checks the config (remote source replaced by the fetched file).
        ecds::encode(&ecds::extension_config(
            p,
            &p.resource_name(),
            &PullSecrets::new(),
        ));
    }
}

#[test]
fn resource_names_carry_istios_prefix() {
    let p = plugin("istio-system", "openid", "url: oci://x");
    assert_eq!(
        p.resource_name(),
        "extensions.istio.io/wasmplugin/istio-system.openid"
    );
    let config = ecds::plugin_config(&p, &PullSecrets::new());
    assert_eq!(config.name, "istio-system.openid");
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn selection_takes_own_and_root_namespace_and_orders_by_priority() {
    let all = vec![
        plugin("istio-system", "root-low", "url: oci://a\npriority: 1"),
        plugin("istio-system", "root-none", "url: oci://a"),
        plugin("apps", "own-high", "url: oci://a\npriority: 10"),
        plugin("apps", "own-none", "url: oci://a"),
        plugin("other", "elsewhere", "url: oci://a\npriority: 100"),
        plugin(
            "apps",
            "not-me",
            "url: oci://a\nselector: {matchLabels: {app: other}}",
        ),
        plugin(
            "istio-system",
            "root-selected",
            "url: oci://a\nselector: {matchLabels: {app: web}}\npriority: 1",
        ),
    ];
    let got: Vec<String> = for_proxy(&all, "istio-system", "apps", &labels(&[("app", "web")]))
        .iter()
        .map(|p| p.name.clone())
        .collect();
    // Priority highest first; without priority last; ties keep own namespace first,
    // then the root's, each in age order.
    assert_eq!(
        got,
        [
            "own-high",
            "root-low",
            "root-selected",
            "own-none",
            "root-none"
        ]
    );
}

#[test]
fn target_refs_select_the_named_gateway_only() {
    let p = plugin(
        "gw-ns",
        "p",
        "url: oci://a\ntargetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: web}]",
    );
    let gw = labels(&[(GATEWAY_NAME_LABEL, "web")]);
    assert!(selects(&p, "istio-system", "gw-ns", &gw));
    assert!(!selects(&p, "istio-system", "other", &gw));
    assert!(!selects(
        &p,
        "istio-system",
        "gw-ns",
        &labels(&[(GATEWAY_NAME_LABEL, "api")])
    ));
    assert!(!selects(&p, "istio-system", "gw-ns", &labels(&[])));
    assert_eq!(
        crate::xds::deps::wasm_plugin_selectors(&p.spec),
        vec![Some(labels(&[(GATEWAY_NAME_LABEL, "web")]))]
    );
}

#[test]
fn match_by_mode_and_port() {
    let info = |class, port| Some(ListenerInfo { class, port });
    use ListenerClass::*;
    let server_8080 = plugin("a", "p", "match: [{mode: SERVER, ports: [{number: 8080}]}]");
    assert!(matches_listener(
        &server_8080.spec,
        info(SidecarInbound, 8080)
    ));
    assert!(!matches_listener(
        &server_8080.spec,
        info(SidecarInbound, 9090)
    ));
    assert!(!matches_listener(
        &server_8080.spec,
        info(SidecarOutbound, 8080)
    ));
    assert!(matches_listener(&server_8080.spec, None));
    let client = plugin("a", "p", "match: [{mode: CLIENT}]");
    assert!(matches_listener(&client.spec, info(Gateway, 80)));
    assert!(matches_listener(&client.spec, info(SidecarOutbound, 80)));
    assert!(!matches_listener(&client.spec, info(SidecarInbound, 80)));
    let any = plugin(
        "a",
        "p",
        "match: [{mode: CLIENT_AND_SERVER}, {ports: [{number: 1}]}]",
    );
    assert!(matches_listener(&any.spec, info(SidecarInbound, 80)));
    let none = plugin("a", "p", "");
    assert!(matches_listener(&none.spec, info(SidecarInbound, 80)));
}

fn named(names: &[&str]) -> Vec<HttpFilter> {
    names
        .iter()
        .map(|n| HttpFilter {
            name: n.to_string(),
            ..Default::default()
        })
        .collect()
}

#[test]
fn http_references_go_at_their_phases_places() {
    let plugins = vec![
        plugin("ns", "authn", "phase: AUTHN"),
        plugin("ns", "authz", "phase: AUTHZ"),
        plugin("ns", "stats", "phase: STATS"),
        plugin("ns", "last", ""),
        plugin("ns", "net", "type: NETWORK"),
    ];
    let info = ListenerInfo {
        class: ListenerClass::SidecarInbound,
        port: 80,
    };
    let mut filters = named(&[
        "istio.metadata_exchange",
        "envoy.filters.http.rbac",
        "envoy.filters.http.ext_authz",
        "envoy.filters.http.jwt_authn",
        "envoy.filters.http.rbac",
        "envoy.filters.http.grpc_stats",
        "envoy.filters.http.router",
    ]);
    filters::insert_http(&mut filters, &plugins, info);
    let got: Vec<&str> = filters.iter().map(|f| f.name.as_str()).collect();
    let p = |n: &str| format!("extensions.istio.io/wasmplugin/ns.{n}");
    assert_eq!(
        got,
        [
            "istio.metadata_exchange",
            "envoy.filters.http.rbac",
            "envoy.filters.http.ext_authz",
            &p("authn"),
            "envoy.filters.http.jwt_authn",
            &p("authz"),
            "envoy.filters.http.rbac",
            &p("stats"),
            &p("last"),
            "envoy.filters.http.grpc_stats",
            "envoy.filters.http.router",
        ]
    );
    // Without any security filter: all of them before grpc_stats, in phase order.
    let mut bare = named(&["envoy.filters.http.grpc_stats", "envoy.filters.http.router"]);
    filters::insert_http(&mut bare, &plugins, info);
    let got: Vec<&str> = bare.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        got,
        [
            &p("authn"),
            &p("authz"),
            &p("stats"),
            &p("last"),
            "envoy.filters.http.grpc_stats",
            "envoy.filters.http.router",
        ]
    );
}

#[test]
fn network_references_go_at_their_phases_places() {
    use envoy_types::pb::envoy::config::listener::v3::Filter;
    let plugins = vec![
        plugin("ns", "authn", "phase: AUTHN\ntype: NETWORK"),
        plugin("ns", "stats", "phase: STATS\ntype: NETWORK"),
        plugin("ns", "last", "type: NETWORK"),
        plugin("ns", "http", ""),
    ];
    let info = ListenerInfo {
        class: ListenerClass::SidecarInbound,
        port: 80,
    };
    let mut chain: Vec<Filter> = [
        "istio.metadata_exchange",
        "envoy.filters.network.rbac",
        "istio.stats",
        "envoy.filters.network.tcp_proxy",
    ]
    .iter()
    .map(|n| Filter {
        name: n.to_string(),
        ..Default::default()
    })
    .collect();
    filters::insert_network(&mut chain, &plugins, info);
    let got: Vec<&str> = chain.iter().map(|f| f.name.as_str()).collect();
    let p = |n: &str| format!("extensions.istio.io/wasmplugin/ns.{n}");
    assert_eq!(
        got,
        [
            "istio.metadata_exchange",
            &p("authn"),
            "envoy.filters.network.rbac",
            &p("stats"),
            "istio.stats",
            &p("last"),
            "envoy.filters.network.tcp_proxy",
        ]
    );
}

#[test]
fn plugin_config_carries_istios_environment_and_failure_policy() {
    let p = plugin(
        "ns",
        "p",
        "url: ghcr.io/org/plugin:1.0\nsha256: 1ef0c9a92b0420cf25f7fe5d481b231464bc88f486ca3b9c83ed5cc21d2f6210\nimagePullPolicy: Always\nimagePullSecret: regcred\npluginName: root\nfailStrategy: FAIL_OPEN\npluginConfig: {b: 1, a: x}\nvmConfig: {env: [{name: POD_NAME, valueFrom: HOST}, {name: TD, value: cluster.local}]}",
    );
    let mut secrets = PullSecrets::new();
    secrets.insert(
        "kubernetes://ns/regcred".into(),
        Arc::from("{\"auths\":{}}"),
    );
    let c = ecds::plugin_config(&p, &secrets);
    assert_eq!(c.root_id, "root");
    assert_eq!(
        c.failure_policy,
        envoy_types::pb::envoy::extensions::wasm::v3::FailurePolicy::FailOpen as i32
    );
    let cfg = c.configuration.unwrap();
    assert_eq!(
        cfg.type_url,
        "type.googleapis.com/google.protobuf.StringValue"
    );
    let json: String = prost::Message::decode(cfg.value.as_slice()).unwrap();
    assert_eq!(json, r#"{"a":"x","b":1}"#);
    let Some(plugin_config::Vm::VmConfig(vm)) = c.vm else {
        panic!()
    };
    let env = vm.environment_variables.unwrap();
    assert_eq!(env.host_env_keys, ["POD_NAME"]);
    let kv: BTreeMap<_, _> = env.key_values.into_iter().collect();
    assert_eq!(
        kv,
        BTreeMap::from([
            (
                "ISTIO_META_WASM_IMAGE_PULL_SECRET".into(),
                "{\"auths\":{}}".into()
            ),
            ("ISTIO_META_WASM_IMAGE_PULL_POLICY".into(), "Always".into()),
            (
                "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION".into(),
                String::new()
            ),
            ("TD".into(), "cluster.local".into()),
        ])
    );
    let Some(AsyncDataSource {
        specifier: Some(async_data_source::Specifier::Remote(r)),
    }) = vm.code
    else {
        panic!()
    };
    assert_eq!(r.http_uri.unwrap().uri, "oci://ghcr.io/org/plugin:1.0");
    assert_eq!(r.sha256.len(), 64);
    // A secret the proxy may not read is sent empty.
    let c = ecds::plugin_config(&p, &PullSecrets::new());
    let Some(plugin_config::Vm::VmConfig(vm)) = c.vm else {
        panic!()
    };
    assert_eq!(
        vm.environment_variables.unwrap().key_values["ISTIO_META_WASM_IMAGE_PULL_SECRET"],
        ""
    );
    // file:// is a local file.
    let f = plugin("ns", "f", "url: file:///opt/filters/x.wasm");
    let Some(plugin_config::Vm::VmConfig(vm)) = ecds::plugin_config(&f, &secrets).vm else {
        panic!()
    };
    assert!(matches!(
        vm.code.unwrap().specifier,
        Some(async_data_source::Specifier::Local(_))
    ));
    let _ = ext::PluginPhase::Authn;
}

fn secret_env(plugin: &Plugin, secrets: &PullSecrets) -> Option<String> {
    let config = super::ecds::plugin_config(plugin, secrets);
    let Some(plugin_config::Vm::VmConfig(vm)) = config.vm else {
        panic!("no VM config");
    };
    vm.environment_variables?
        .key_values
        .get(super::ecds::SECRET_ENV)
        .cloned()
}

#[tokio::test]
async fn pull_secrets_are_withheld_without_an_authorized_identity_and_counted_by_plugin() {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = crate::sds::SdsMetrics::new(&mut registry);
    let (sink, _rx) = meshfed_registry::UpdateSink::new(Arc::default());
    let (_trigger, shutdown) = crate::drain::channel();
    let sds = crate::sds::Sds::new("c1".into(), None, None, sink, shutdown, metrics);
    let p = plugin("shop", "auth", "url: oci://x/y\nimagePullSecret: pull\n");
    let root = plugin(
        "istio-system",
        "mesh",
        "url: oci://x/y\nimagePullSecret: pull\n",
    );
    let plugins = vec![p.clone(), root.clone()];
    let names = vec![p.resource_name(), root.resource_name()];
    let node = crate::testing::node_with(
        "sidecar~10.0.0.1~a-1.shop~shop.svc.cluster.local",
        serde_json::json!({}),
    );
    let mut proxy = crate::model::Proxy::from_node(Some(&node)).unwrap();
    // No verified identity (the plaintext port): nothing, for either plugin.
    let secrets = pull::secrets_for(
        Some(&sds as &dyn pull::PullSecretReader),
        "conn-1",
        &plugins,
        &proxy,
        &names,
    );
    assert!(secrets.is_empty());
    assert_eq!(secret_env(&p, &secrets).as_deref(), Some(""));
    // Verified, but the root namespace's Secret is another namespace's (no API server
    // to review the access) and the own one does not exist.
    proxy.verified_identity = Some("spiffe://cluster.local/ns/shop/sa/default".into());
    let secrets = pull::secrets_for(
        Some(&sds as &dyn pull::PullSecretReader),
        "conn-1",
        &plugins,
        &proxy,
        &names,
    );
    assert!(secrets.is_empty());
    let why = sds
        .pull_secret(
            "conn-1",
            "istio-system/mesh",
            &proxy,
            "istio-system",
            "pull",
        )
        .unwrap_err();
    assert!(
        matches!(
            why,
            crate::sds::PullSecretError::Refused(crate::sds::Refusal::OtherNamespace { .. })
        ),
        "{why}"
    );
    let why = sds
        .pull_secret("conn-1", "shop/auth", &proxy, "shop", "pull")
        .unwrap_err();
    assert!(
        matches!(why, crate::sds::PullSecretError::NotFound { .. }),
        "{why}"
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for plugin in ["shop/auth", "istio-system/mesh"] {
        assert!(
            text.contains(&format!(
                "meshfed_wasm_pull_secrets_withheld_total{{plugin=\"{plugin}\"}}"
            )),
            "{text}"
        );
    }
    // A plugin the proxy does not watch is not looked at.
    let secrets = pull::secrets_for(
        Some(&sds as &dyn pull::PullSecretReader),
        "conn-1",
        &plugins,
        &proxy,
        &names[..0],
    );
    assert!(secrets.is_empty());
}

#[test]
fn a_sent_pull_secret_is_the_dockerconfigjson_content() {
    let p = plugin(
        "shop",
        "auth",
        "url: oci://x/y\nimagePullSecret: kubernetes://other/pull\n",
    );
    // The namespace is always the plugin's.
    let name = super::ecds::pull_secret_name(&p).unwrap();
    assert_eq!(name, "kubernetes://shop/pull");
    let secrets: PullSecrets = [(name, Arc::from("{\"auths\":{}}"))].into();
    assert_eq!(secret_env(&p, &secrets).as_deref(), Some("{\"auths\":{}}"));
}

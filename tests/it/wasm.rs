//! WasmPlugin over ECDS: a plugin selecting a workload puts a filter reference into
//! its listeners' connection managers (`config_discovery` over ADS) and is served as
//! an extension config (`TypedExtensionConfig`) over SotW and Delta, with its remote
//! code; a change to a plugin pushes only the proxies it selects.

use envoy_types::pb::envoy::config::core::v3::{TypedExtensionConfig, async_data_source};
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_filter,
};
use envoy_types::pb::envoy::extensions::wasm::v3::plugin_config;
use meshfed::ads::TypeUrl;
use meshfed::testing::{AdsClient, DeltaClient, FakeServer, decode_all, decode_delta, node_with};
use meshfed_api::extensions::v1alpha1 as ext;
use meshfed_registry::Protocol;
use meshfed_registry::config::ConfigObject;
use prost::Message;

use crate::support::*;

const APP_A: &str = "sidecar~10.9.0.1~a-1.shop~shop.svc.cluster.local";
const APP_B: &str = "sidecar~10.9.0.2~b-1.shop~shop.svc.cluster.local";
const RESOURCE: &str = "extensions.istio.io/wasmplugin/shop.auth";

fn labels(app: &str) -> serde_json::Value {
    serde_json::json!({"LABELS": {"app": app}})
}

fn plugin(yaml: &str) -> ext::WasmPlugin {
    let value: serde_json::Value = serde_norway::from_str(yaml).unwrap();
    serde_json::from_value(value).unwrap()
}

const AUTH: &str = "
selector: {matchLabels: {app: a}}
url: oci://ghcr.io/example/auth:1.0
phase: AUTHN
pluginConfig: {realm: shop}
";

async fn server() -> FakeServer {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    reg.add_service(service(
        "web.shop.svc.cluster.local",
        "shop",
        &[("http", 80, Protocol::Http)],
    ));
    server.sync().await;
    server
}

/// The HTTP filter names of every connection manager of `listeners`.
fn http_filter_names(listeners: &[Listener]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for l in listeners {
        for chain in l.filter_chains.iter().chain(&l.default_filter_chain) {
            for f in &chain.filters {
                if let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type
                    && any.type_url.ends_with("HttpConnectionManager")
                {
                    let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
                    out.push(hcm.http_filters.iter().map(|f| f.name.clone()).collect());
                }
            }
        }
    }
    out
}

fn remote_uri(config: &TypedExtensionConfig) -> String {
    let any = config.typed_config.as_ref().unwrap();
    assert_eq!(
        any.type_url,
        "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
    );
    let wasm = Wasm::decode(any.value.as_slice()).unwrap();
    let Some(plugin_config::Vm::VmConfig(vm)) = wasm.config.unwrap().vm else {
        panic!("no VM config");
    };
    match vm.code.unwrap().specifier.unwrap() {
        async_data_source::Specifier::Remote(r) => r.http_uri.unwrap().uri,
        other => panic!("not remote: {other:?}"),
    }
}

#[tokio::test]
async fn a_selected_sidecar_references_the_plugin_and_gets_it_over_ecds_sotw() {
    let server = server().await;
    server
        .config_store()
        .apply(ConfigObject::new("shop", "auth", plugin(AUTH)))
        .unwrap();
    server.sync().await;
    let mut a = AdsClient::connect(server.grpc_addr(), node_with(APP_A, labels("a")))
        .await
        .unwrap();
    a.subscribe(TypeUrl::Listener, &[]).await.unwrap();
    let listeners: Vec<Listener> =
        decode_all(&a.recv_type(TypeUrl::Listener).await.unwrap()).unwrap();
    let hcms = http_filter_names(&listeners);
    assert!(!hcms.is_empty());
    for filters in &hcms {
        assert!(filters.iter().any(|f| f == RESOURCE), "{filters:?}");
        assert_eq!(
            filters.last().map(String::as_str),
            Some("envoy.filters.http.router")
        );
    }
    // The reference finds its config over ADS.
    let outbound = listeners.iter().find(|l| l.name == "0.0.0.0_80").unwrap();
    let any = match &outbound.filter_chains[0]
        .filters
        .last()
        .unwrap()
        .config_type
    {
        Some(filter::ConfigType::TypedConfig(a)) => a.clone(),
        other => panic!("{other:?}"),
    };
    let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
    let reference = hcm
        .http_filters
        .iter()
        .find(|f| f.name == RESOURCE)
        .unwrap();
    let Some(http_filter::ConfigType::ConfigDiscovery(source)) = &reference.config_type else {
        panic!("{reference:?}");
    };
    assert_eq!(
        source.type_urls,
        [
            "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
        ]
    );
    assert_eq!(
        source.config_source.as_ref().unwrap().initial_fetch_timeout,
        Some(Default::default())
    );

    a.subscribe(TypeUrl::ExtensionConfig, &[RESOURCE])
        .await
        .unwrap();
    let response = a.recv_type(TypeUrl::ExtensionConfig).await.unwrap();
    assert_eq!(
        response.type_url,
        "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
    );
    let configs: Vec<TypedExtensionConfig> = decode_all(&response).unwrap();
    assert_eq!(configs.len(), 1);
    assert_eq!(configs[0].name, RESOURCE);
    assert_eq!(remote_uri(&configs[0]), "oci://ghcr.io/example/auth:1.0");

    // Another workload of the namespace is not selected: no reference, no config.
    let mut b = AdsClient::connect(server.grpc_addr(), node_with(APP_B, labels("b")))
        .await
        .unwrap();
    b.subscribe(TypeUrl::Listener, &[]).await.unwrap();
    let listeners: Vec<Listener> =
        decode_all(&b.recv_type(TypeUrl::Listener).await.unwrap()).unwrap();
    for filters in http_filter_names(&listeners) {
        assert!(!filters.iter().any(|f| f == RESOURCE), "{filters:?}");
    }
    b.subscribe(TypeUrl::ExtensionConfig, &[RESOURCE])
        .await
        .unwrap();
    let configs: Vec<TypedExtensionConfig> =
        decode_all(&b.recv_type(TypeUrl::ExtensionConfig).await.unwrap()).unwrap();
    assert!(configs.is_empty());
    server.shutdown().await;
}

#[tokio::test]
async fn ecds_over_delta_sends_the_config_and_its_changes_but_never_removes_it() {
    const OTHER: &str = "extensions.istio.io/wasmplugin/shop.stats";
    let stats = |tag: &str| {
        plugin(&format!(
            "selector: {{matchLabels: {{app: a}}}}\nurl: oci://ghcr.io/example/stats:{tag}\nphase: STATS"
        ))
    };
    let server = server().await;
    let store = server.config_store();
    store
        .apply(ConfigObject::new("shop", "auth", plugin(AUTH)))
        .unwrap();
    store
        .apply(ConfigObject::new("shop", "stats", stats("1")))
        .unwrap();
    server.sync().await;
    let mut a = DeltaClient::connect(server.grpc_addr(), node_with(APP_A, labels("a")))
        .await
        .unwrap();
    a.subscribe(TypeUrl::ExtensionConfig, &[RESOURCE, OTHER], &[])
        .await
        .unwrap();
    let response = a.recv_type(TypeUrl::ExtensionConfig).await.unwrap();
    let configs: Vec<TypedExtensionConfig> = decode_delta(&response).unwrap();
    let mut names: Vec<&str> = configs.iter().map(|c| c.name.as_str()).collect();
    names.sort();
    assert_eq!(names, [RESOURCE, OTHER]);
    a.ack(&response).await.unwrap();

    // A new URL: that config again, alone.
    let changed = AUTH.replace("auth:1.0", "auth:2.0");
    store
        .apply(ConfigObject::new("shop", "auth", plugin(&changed)))
        .unwrap();
    let response = a.recv_type(TypeUrl::ExtensionConfig).await.unwrap();
    let configs: Vec<TypedExtensionConfig> = decode_delta(&response).unwrap();
    assert_eq!(configs.len(), 1);
    assert_eq!(remote_uri(&configs[0]), "oci://ghcr.io/example/auth:2.0");
    a.ack(&response).await.unwrap();

    // Deleted: Istio sends no removal (a listener may still reference it), so the
    // deletion sends nothing and the next response, for the other plugin's change,
    // removes nothing.
    assert!(store.delete(meshfed_registry::config::Kind::WasmPlugin, "shop", "auth"));
    server.sync().await;
    store
        .apply(ConfigObject::new("shop", "stats", stats("2")))
        .unwrap();
    let response = a.recv_type(TypeUrl::ExtensionConfig).await.unwrap();
    assert!(response.removed_resources.is_empty(), "{response:?}");
    let configs: Vec<TypedExtensionConfig> = decode_delta(&response).unwrap();
    assert_eq!(configs.len(), 1);
    assert_eq!(configs[0].name, OTHER);
    server.shutdown().await;
}

#[tokio::test]
async fn a_plugin_change_pushes_only_the_proxies_it_selects() {
    let server = server().await;
    let mut clients = Vec::new();
    for (id, app) in [(APP_A, "a"), (APP_B, "b")] {
        let mut c = AdsClient::connect(server.grpc_addr(), node_with(id, labels(app)))
            .await
            .unwrap();
        c.subscribe(TypeUrl::Listener, &[]).await.unwrap();
        let first = c.recv_type(TypeUrl::Listener).await.unwrap();
        c.ack(&first).await.unwrap();
        clients.push(c);
    }
    let plugin_pushes = || {
        let pipeline = server.server().pipeline();
        move || {
            let found = pipeline
                .history()
                .into_iter()
                .find(|p| p.changes.iter().any(|c| c.contains("WasmPlugin")));
            std::future::ready(found)
        }
    };
    server
        .config_store()
        .apply(ConfigObject::new("shop", "auth", plugin(AUTH)))
        .unwrap();
    // The selected proxy gets listeners with the reference.
    let listeners: Vec<Listener> =
        decode_all(&clients[0].recv_type(TypeUrl::Listener).await.unwrap()).unwrap();
    assert!(
        http_filter_names(&listeners)
            .iter()
            .all(|f| f.iter().any(|n| n == RESOURCE))
    );
    let record = eventually("the push of the WasmPlugin", plugin_pushes()).await;
    assert_eq!(record.connections, 1, "{record:?}");
    assert!(record.proxies[0].starts_with("a-1.shop-"), "{record:?}");
    server.shutdown().await;
}

/// The worked example (`examples/wasmplugin`): served from the bundled mock registry,
/// the gateway's connection manager references the AUTHN plugin before Istio's
/// filters and the mesh-wide CLIENT plugin last before them, both found over ECDS; a
/// sidecar's outbound connection managers get the mesh-wide one, its inbound ones not.
#[tokio::test]
async fn the_wasmplugin_example_is_served_on_the_gateway() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/wasmplugin");
    let server = FakeServer::builder()
        .embedded_mock_registry()
        .config_dir(root.join("config"))
        .start()
        .await
        .unwrap();
    ready_and_synced(&server).await;
    let configz = get_json(server.bound().http, "/debug/configz").await;
    assert_eq!(configz["rejected"], serde_json::json!([]), "{configz}");

    const OPENID: &str = "extensions.istio.io/wasmplugin/istio-system.openid-connect";
    const HEADER: &str = "extensions.istio.io/wasmplugin/istio-system.add-header";
    let gateway = "router~10.0.0.9~ingress-1.istio-system~istio-system.svc.cluster.local";
    let mut gw = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            gateway,
            serde_json::json!({"LABELS": {"istio": "ingressgateway"}}),
        ),
    )
    .await
    .unwrap();
    gw.subscribe(TypeUrl::Listener, &[]).await.unwrap();
    let listeners: Vec<Listener> =
        decode_all(&gw.recv_type(TypeUrl::Listener).await.unwrap()).unwrap();
    let hcms = http_filter_names(&listeners);
    assert_eq!(hcms.len(), 1, "{listeners:?}");
    assert_eq!(
        hcms[0],
        [
            "istio.metadata_exchange",
            OPENID,
            HEADER,
            "envoy.filters.http.grpc_stats",
            "istio.alpn",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "istio.stats",
            "envoy.filters.http.router",
        ]
    );
    gw.subscribe(TypeUrl::ExtensionConfig, &[OPENID, HEADER])
        .await
        .unwrap();
    let configs: Vec<TypedExtensionConfig> =
        decode_all(&gw.recv_type(TypeUrl::ExtensionConfig).await.unwrap()).unwrap();
    let mut uris: Vec<(String, String)> = configs
        .iter()
        .map(|c| (c.name.clone(), remote_uri(c)))
        .collect();
    uris.sort();
    assert_eq!(
        uris,
        [
            (
                HEADER.to_string(),
                "https://plugins.example.com/add-header.wasm".to_string()
            ),
            (
                OPENID.to_string(),
                "oci://ghcr.io/example/openid-connect:1.0".to_string()
            ),
        ]
    );

    // A sidecar: the mesh-wide CLIENT plugin on outbound connection managers only.
    let sidecar = "sidecar~127.0.0.1~echo-v1.default~default.svc.cluster.local";
    let mut echo = AdsClient::connect(
        server.grpc_addr(),
        node_with(sidecar, serde_json::json!({"LABELS": {"app": "echo"}})),
    )
    .await
    .unwrap();
    echo.subscribe(TypeUrl::Listener, &[]).await.unwrap();
    let listeners: Vec<Listener> =
        decode_all(&echo.recv_type(TypeUrl::Listener).await.unwrap()).unwrap();
    for l in &listeners {
        let inbound = l.name == "virtualInbound";
        for filters in http_filter_names(std::slice::from_ref(l)) {
            assert_eq!(
                filters.iter().any(|f| f == HEADER),
                !inbound,
                "{}: {filters:?}",
                l.name
            );
            assert!(!filters.iter().any(|f| f == OPENID), "{filters:?}");
        }
    }
    server.shutdown().await;
}

/// The image pull Secret variable of an HTTP Wasm extension config.
fn pull_secret_env(config: &TypedExtensionConfig) -> Option<String> {
    let wasm = Wasm::decode(config.typed_config.as_ref().unwrap().value.as_slice()).unwrap();
    let Some(plugin_config::Vm::VmConfig(vm)) = wasm.config.unwrap().vm else {
        panic!("no VM config");
    };
    vm.environment_variables
        .unwrap()
        .key_values
        .get("ISTIO_META_WASM_IMAGE_PULL_SECRET")
        .cloned()
}

/// A plugin's image pull Secret reaches a gateway (on the secure port) only from a
/// `kubernetes.io/dockerconfigjson` Secret of a namespace its service account may list
/// Secrets of (SubjectAccessReview, deploy/rbac.yaml enforced); otherwise the variable
/// goes out empty and the plugin is counted.
#[tokio::test]
async fn image_pull_secrets_reach_only_proxies_authorized_for_their_namespace() {
    use meshfed::app::{CaSource, KubeSettings, KubeSource};
    use meshfed::testing::{ClientTls, tls_channel};
    use meshfed_kube::fake_api::objects;

    const NS: &str = "gwns";
    const USER: &str = "system:serviceaccount:gwns:gw";
    const DOCKER: &[u8] = br#"{"auths":{"ghcr.io":{"auth":"dXNlcjpwYXNz"}}}"#;
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let api = EnforcedApi::start().await;
    let client = api.client();
    let ca = ca_dir.clone();
    let server = FakeServer::builder()
        .configure(move |c| {
            c.ca = Some(CaSource::Dir {
                cacerts: None,
                self_signed_dir: ca,
            });
            c.kubernetes = Some(KubeSettings {
                source: KubeSource::Client(client),
                namespaces: meshfed_kube::NamespaceFilter::All,
                system_namespace: "istio-system".into(),
                remote_secrets: Default::default(),
            });
        })
        .start()
        .await
        .unwrap();
    let http = server.bound().http;
    eventually("ready", || async move {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
    let dockerconfig = "kubernetes.io/dockerconfigjson";
    api.apply(&objects::secret(
        NS,
        "pull",
        dockerconfig,
        &[(".dockerconfigjson", DOCKER)],
    ));
    api.apply(&objects::secret(
        NS,
        "tls",
        "kubernetes.io/tls",
        &[("tls.crt", b"x")],
    ));
    api.apply(&objects::secret(
        "istio-system",
        "pull",
        dockerconfig,
        &[(".dockerconfigjson", DOCKER)],
    ));
    api.grant_access(USER, "list", "secrets", NS);
    let with_secret = |secret: &str| {
        plugin(&format!(
            "url: oci://ghcr.io/example/auth:1.0\nimagePullSecret: {secret}\n"
        ))
    };
    let store = server.config_store();
    store
        .apply(ConfigObject::new(NS, "auth", with_secret("pull")))
        .unwrap();
    store
        .apply(ConfigObject::new(NS, "wrongtype", with_secret("tls")))
        .unwrap();
    store
        .apply(ConfigObject::new(
            "istio-system",
            "mesh",
            with_secret("pull"),
        ))
        .unwrap();
    server.sync().await;

    let tls = ClientTls {
        roots_pem: std::fs::read_to_string(ca_dir.join("root-cert.pem")).unwrap(),
        identity: Some(crate::secure::issue(
            &ca_dir,
            &format!("spiffe://cluster.local/ns/{NS}/sa/gw"),
        )),
        server_name: "istiod.istio-system.svc".into(),
    };
    let channel = tls_channel(server.secure_grpc_addr(), &tls).await.unwrap();
    let node = node_with(
        &format!("router~10.0.0.9~gw-1.{NS}~{NS}.svc.cluster.local"),
        serde_json::json!({"SERVICE_ACCOUNT": "gw", "LABELS": {"istio": "ingressgateway"}}),
    );
    let mut gw = AdsClient::over(channel, Default::default(), node)
        .await
        .unwrap();
    let names = [
        "extensions.istio.io/wasmplugin/gwns.auth",
        "extensions.istio.io/wasmplugin/gwns.wrongtype",
        "extensions.istio.io/wasmplugin/istio-system.mesh",
    ];
    gw.subscribe(TypeUrl::ExtensionConfig, &names)
        .await
        .unwrap();
    // The first answer may come before the Secret is read; its arrival pushes ECDS.
    let configs = loop {
        let configs: Vec<TypedExtensionConfig> =
            decode_all(&gw.recv_type(TypeUrl::ExtensionConfig).await.unwrap()).unwrap();
        let auth = configs.iter().find(|c| c.name == names[0]).unwrap();
        if pull_secret_env(auth).is_some_and(|s| !s.is_empty()) {
            break configs;
        }
    };
    let env =
        |name: &str| pull_secret_env(configs.iter().find(|c| c.name == name).unwrap()).unwrap();
    assert_eq!(env(names[0]).as_bytes(), DOCKER);
    // Not a dockerconfigjson Secret; a namespace the gateway may not list: empty.
    assert_eq!(env(names[1]), "");
    assert_eq!(env(names[2]), "");
    // Both reviews were asked of the API server.
    let reviews = api.access_reviews();
    for ns in [NS, "istio-system"] {
        assert!(
            reviews.contains(&(USER.into(), "list".into(), "secrets".into(), ns.into())),
            "{reviews:?}"
        );
    }
    // The Secret of the namespace it may not read is never fetched.
    assert!(
        !api.requests().iter().any(|r| {
            r.path.contains("/namespaces/istio-system/secrets")
                && r.query.values().any(|v| v.contains("pull"))
        }),
        "{}",
        describe(&api.requests())
    );
    // Counted once the Secret is read (the wrong type) or reviewed (the namespace).
    let monitoring = server.bound().monitoring;
    let metrics = eventually("withheld pull secrets counted", || async move {
        let metrics = http_get(monitoring, "/metrics").await.1;
        ["gwns/wrongtype", "istio-system/mesh"]
            .iter()
            .all(|plugin| {
                let sample =
                    format!("meshfed_wasm_pull_secrets_withheld_total{{plugin=\"{plugin}\"}}");
                metric(&metrics, &sample).is_some_and(|v| v >= 1.0)
            })
            .then_some(metrics)
    })
    .await;
    assert!(!metrics.contains("plugin=\"gwns/auth\""));
    server.shutdown().await;
}

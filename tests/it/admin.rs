//! The admin surface: readiness, metrics, version and the debug table.

use std::collections::BTreeSet;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use meshfed::ads::TypeUrl;
use meshfed::testing::{AdsClient, DeltaClient, FakeServer, decode_all, node};
use serde_json::Value;

use crate::support::*;

#[tokio::test]
async fn metrics_version_and_debug_endpoints() {
    let server = embedded_server().await;
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.0.0.1~app.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    client.recv_clusters().await.unwrap();
    // The connection handles its requests one at a time and counts a response once it
    // is sent: once the answer to a later request is in, the CDS response has been
    // counted, and a second CDS response would have come before the listeners.
    client.subscribe(TypeUrl::Listener, &[]).await.unwrap();
    client.recv_type(TypeUrl::Listener).await.unwrap();

    let monitoring = server.bound().monitoring;
    let (status, metrics) = http_get(monitoring, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(metric(&metrics, "pilot_xds"), Some(1.0), "{metrics}");
    // Every registry event was applied before the client connected (embedded_server)
    // and nothing changes afterwards, so the only CDS push is the answer to its
    // subscription; its ACK is answered with none.
    assert_eq!(
        metric(&metrics, "pilot_xds_pushes{type=\"cds\"}"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(metric(&metrics, "pilot_services"), Some(2.0));
    for name in [
        "pilot_debounce_time",
        "pilot_proxy_convergence_time",
        "pilot_total_xds_rejects",
    ] {
        assert!(
            metrics.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{metrics}"
        );
    }

    assert_eq!(
        metric(
            &metrics,
            "meshfed_registry_synced{registry=\"Mock/Kubernetes\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "meshfed_registry_services{registry=\"Mock/Kubernetes\"}"
        ),
        Some(2.0)
    );

    let version = get_json(monitoring, "/version").await;
    assert_eq!(version["name"], "meshfed");

    // The table drives /debug/list, and every listed endpoint answers JSON on both ports.
    let list = get_json(server.bound().http, "/debug/list").await;
    let paths: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    for required in ["/debug/adsz", "/debug/registryz", "/debug/syncz"] {
        assert!(paths.contains(&required), "{paths:?}");
    }
    for path in &paths {
        if matches!(*path, "/debug/config_dump" | "/debug/ndsz") {
            // Need ?proxyID=; see config_dump_shows_what_a_proxy_was_sent_as_envoy_json
            // and nds.rs.
            assert_eq!(http_get(server.bound().http, path).await.0, 400);
            assert_eq!(http_get(monitoring, path).await.0, 400);
            continue;
        }
        get_json(server.bound().http, path).await;
        get_json(monitoring, path).await;
    }
    let registryz = get_json(server.bound().http, "/debug/registryz").await;
    let hosts: Vec<&str> = registryz["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["hostname"].as_str().unwrap())
        .collect();
    assert_eq!(
        hosts,
        vec![
            "echo.default.svc.cluster.local",
            "reviews.bookinfo.svc.cluster.local"
        ],
        "sorted"
    );
    assert_eq!(registryz["services"][0]["sources"][0], "Mock/Kubernetes");
    let adsz = get_json(server.bound().http, "/debug/adsz").await;
    assert_eq!(adsz["totalClients"], 1);
    server.shutdown().await;
}

#[tokio::test]
async fn merge_conflicts_show_in_registryz() {
    let server = FakeServer::builder().start().await.unwrap();
    let older = server.mock_registry("older");
    let newer = server.mock_registry("newer");
    let mut s = service(
        "api.example.com",
        "default",
        &[("http", 80, meshfed_registry::Protocol::Http)],
    );
    s.creation_time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(100);
    newer.add_service(s.clone());
    s.creation_time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(10);
    older.add_service(s);
    let http = server.bound().http;
    let registryz = eventually("the conflict to show", || async move {
        let r = get_json(http, "/debug/registryz").await;
        (!r["conflicts"].as_array().unwrap().is_empty()).then_some(r)
    })
    .await;
    assert_eq!(registryz["conflicts"][0]["winner"], "Mock/older");
    assert_eq!(registryz["conflicts"][0]["loser"], "Mock/newer");
    assert_eq!(registryz["conflicts"][0]["reason"], "OldestWins");
    assert_eq!(registryz["services"][0]["cluster_id"], "older");
    server.shutdown().await;
}

#[tokio::test]
async fn push_status_lists_reasons_changes_and_the_proxies_pushed() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    server.sync().await;
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.0.0.1~app-1.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    client.recv_clusters().await.unwrap();
    add_http_service(
        &reg,
        "a.default.svc.cluster.local",
        "default",
        &["10.0.0.9"],
    );
    client.recv_clusters().await.unwrap();
    let status = get_json(server.bound().http, "/debug/push_status").await;
    let last = &status["pushes"][0];
    assert_eq!(last["full"], true, "{status:#}");
    assert!(
        last["changes"]
            .to_string()
            .contains("a.default.svc.cluster.local"),
        "{status:#}"
    );
    assert_eq!(last["connections"], 1);
    assert!(
        last["proxies"][0]
            .as_str()
            .unwrap()
            .starts_with("app-1.default-"),
        "{status:#}"
    );
    server.shutdown().await;
}

const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";

/// The config of `@type` `admin.v3.<kind>` in a config dump.
fn dump_of<'a>(dump: &'a Value, kind: &str) -> &'a Value {
    let wanted = format!("type.googleapis.com/envoy.admin.v3.{kind}");
    dump["configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["@type"] == wanted.as_str())
        .unwrap_or_else(|| panic!("no {kind} in {dump:#}"))
}

/// `field` of every entry of `list` in `config`, as strings.
fn strings(config: &Value, list: &str, field: &[&str]) -> BTreeSet<String> {
    config[list]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|entry| {
            let value = field.iter().fold(entry, |v, key| &v[*key]);
            value
                .as_str()
                .unwrap_or_else(|| panic!("{field:?} in {entry:#}"))
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn config_dump_shows_what_a_proxy_was_sent_as_envoy_json() {
    let server = embedded_server().await;
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.0.0.1~app.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    // What Envoy does: CDS, EDS for the EDS clusters, LDS, RDS for the named routes.
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let cds = client.recv_type(TypeUrl::Cluster).await.unwrap();
    let clusters: Vec<Cluster> = decode_all(&cds).unwrap();
    let eds_names: Vec<&str> = clusters
        .iter()
        .filter(|c| c.eds_cluster_config.is_some())
        .map(|c| c.name.as_str())
        .collect();
    client
        .subscribe(TypeUrl::Endpoint, &eds_names)
        .await
        .unwrap();
    let eds = client.recv_type(TypeUrl::Endpoint).await.unwrap();
    let assignments: Vec<ClusterLoadAssignment> = decode_all(&eds).unwrap();
    client.subscribe(TypeUrl::Listener, &[]).await.unwrap();
    let lds = client.recv_type(TypeUrl::Listener).await.unwrap();
    let listeners: Vec<Listener> = decode_all(&lds).unwrap();
    let route_names: BTreeSet<String> = listeners
        .iter()
        .flat_map(|l| meshfed::generate::lds::references(l).1)
        .collect();
    let route_refs: Vec<&str> = route_names.iter().map(String::as_str).collect();
    client.subscribe(TypeUrl::Route, &route_refs).await.unwrap();
    let rds = client.recv_type(TypeUrl::Route).await.unwrap();
    let routes: Vec<RouteConfiguration> = decode_all(&rds).unwrap();

    let http = server.bound().http;
    // The ACKs travel on their own; wait for the server to have seen the last one so
    // every dump below shows the same state.
    eventually("the proxy to ACK every type", || async move {
        let syncz = get_json(http, "/debug/syncz").await;
        let types = &syncz[0]["types"];
        ["cds", "eds", "lds", "rds"]
            .iter()
            .all(|t| types[*t]["synced"] == true)
            .then_some(())
    })
    .await;
    let dump = get_json(http, "/debug/config_dump?proxyID=app.default").await;
    let types: Vec<&str> = dump["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["@type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
            "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
            "type.googleapis.com/envoy.admin.v3.RoutesConfigDump",
            "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump",
        ]
    );

    // Clusters: the same names and version the proxy got.
    let cds_dump = dump_of(&dump, "ClustersConfigDump");
    assert_eq!(cds_dump["version_info"], cds.version_info.as_str());
    let dumped = strings(cds_dump, "dynamic_active_clusters", &["cluster", "name"]);
    let sent: BTreeSet<String> = clusters.iter().map(|c| c.name.clone()).collect();
    assert_eq!(dumped, sent);
    assert!(dumped.contains("outbound|8080||echo.default.svc.cluster.local"));
    assert_eq!(
        strings(cds_dump, "dynamic_active_clusters", &["version_info"]),
        BTreeSet::from([cds.version_info.clone()])
    );
    assert_eq!(
        cds_dump["dynamic_active_clusters"][0]["cluster"]["@type"],
        TypeUrl::Cluster.as_str()
    );
    assert_eq!(
        cds_dump["dynamic_active_clusters"][0]["client_status"],
        "ACKED"
    );

    // Listeners: nested Anys are expanded, the connection manager with its "@type".
    let lds_dump = dump_of(&dump, "ListenersConfigDump");
    assert_eq!(lds_dump["version_info"], lds.version_info.as_str());
    let dumped = strings(lds_dump, "dynamic_listeners", &["name"]);
    let sent: BTreeSet<String> = listeners.iter().map(|l| l.name.clone()).collect();
    assert_eq!(dumped, sent);
    let hcm = lds_dump["dynamic_listeners"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| {
            l["active_state"]["listener"]["filter_chains"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|chain| chain["filters"].as_array().cloned().unwrap_or_default())
        .map(|f| f["typed_config"].clone())
        .find(|config| config["@type"] == HCM_TYPE && config["rds"].is_object())
        .unwrap_or_else(|| panic!("no expanded connection manager using RDS in {lds_dump:#}"));
    assert!(route_names.contains(hcm["rds"]["route_config_name"].as_str().unwrap()));
    // The router closes the chain (after fault, cors and the rest).
    let filters = hcm["http_filters"].as_array().expect("http filters");
    assert_eq!(
        filters.last().unwrap()["typed_config"]["@type"],
        "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
        "{hcm:#}"
    );
    // An Any without a descriptor renders as {"@type", "value": <base64>}; fields named
    // `value` (percentages, tag literals, typed structs) are not that.
    fn opaque(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Object(o) => {
                (o.contains_key("@type") && o.get("value").is_some_and(|v| v.is_string()))
                    || o.values().any(opaque)
            }
            serde_json::Value::Array(a) => a.iter().any(opaque),
            _ => false,
        }
    }
    assert!(
        !opaque(lds_dump),
        "every Any in the listeners has a descriptor: {lds_dump:#}"
    );

    // Routes: the tables and virtual hosts the proxy got.
    let rds_dump = dump_of(&dump, "RoutesConfigDump");
    assert_eq!(
        strings(rds_dump, "dynamic_route_configs", &["route_config", "name"]),
        route_names
    );
    assert_eq!(
        strings(rds_dump, "dynamic_route_configs", &["version_info"]),
        BTreeSet::from([rds.version_info.clone()])
    );
    let vhosts: BTreeSet<String> = rds_dump["dynamic_route_configs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| strings(&r["route_config"], "virtual_hosts", &["name"]))
        .collect();
    let sent: BTreeSet<String> = routes
        .iter()
        .flat_map(|r| r.virtual_hosts.iter().map(|v| v.name.clone()))
        .collect();
    assert_eq!(vhosts, sent);
    assert!(
        vhosts.contains("echo.default.svc.cluster.local:8080"),
        "{vhosts:?}"
    );

    // Endpoints.
    let eds_dump = dump_of(&dump, "EndpointsConfigDump");
    assert_eq!(
        strings(
            eds_dump,
            "dynamic_endpoint_configs",
            &["endpoint_config", "cluster_name"]
        ),
        assignments.iter().map(|a| a.cluster_name.clone()).collect()
    );
    assert_eq!(
        strings(eds_dump, "dynamic_endpoint_configs", &["version_info"]),
        BTreeSet::from([eds.version_info.clone()])
    );

    // ?pretty indents the same document; the full node id finds the proxy too, and
    // ?types= limits the dump.
    let (status, pretty) = http_get(http, "/debug/config_dump?proxyID=app.default&pretty").await;
    assert_eq!(status, 200);
    assert!(
        pretty.starts_with("{\n  \"configs\": ["),
        "{}",
        &pretty[..40]
    );
    assert_eq!(serde_json::from_str::<Value>(&pretty).unwrap(), dump);
    let only = get_json(
        http,
        "/debug/config_dump?proxyID=sidecar~10.0.0.1~app.default~default.svc.cluster.local&types=rds,cds",
    )
    .await;
    let kinds: Vec<&str> = only["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["@type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
            "type.googleapis.com/envoy.admin.v3.RoutesConfigDump"
        ]
    );

    // An unknown proxy is a 404 naming it; no proxyID is a 400.
    let (status, body) = http_get(http, "/debug/config_dump?proxyID=ghost.default").await;
    assert_eq!(status, 404, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["proxyID"], "ghost.default");
    assert!(error["error"].as_str().unwrap().contains("ghost.default"));
    let (status, body) = http_get(http, "/debug/config_dump").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("proxyID"), "{body}");
    server.shutdown().await;
}

#[tokio::test]
async fn config_dump_of_a_delta_proxy_shows_what_it_holds() {
    let server = embedded_server().await;
    let mut client = DeltaClient::connect(
        server.grpc_addr(),
        node("sidecar~10.0.0.2~delta.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    let echo = "outbound|8080||echo.default.svc.cluster.local";
    client
        .subscribe(
            TypeUrl::Endpoint,
            &[echo, "outbound|80||gone.default.svc.cluster.local"],
            &[],
        )
        .await
        .unwrap();
    let eds = client.recv_type(TypeUrl::Endpoint).await.unwrap();
    let sent: Vec<&str> = eds.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(sent, [echo]);
    let http = server.bound().http;
    eventually("the proxy to ACK", || async move {
        let syncz = get_json(http, "/debug/syncz").await;
        (syncz[0]["types"]["eds"]["synced"] == true).then_some(())
    })
    .await;
    let dump = get_json(http, "/debug/config_dump?proxyID=delta.default&types=eds").await;
    let eds_dump = dump_of(&dump, "EndpointsConfigDump");
    assert_eq!(
        strings(
            eds_dump,
            "dynamic_endpoint_configs",
            &["endpoint_config", "cluster_name"]
        ),
        BTreeSet::from([echo.to_string()]),
        "the name that does not exist is not held: {dump:#}"
    );
    assert_eq!(
        eds_dump["dynamic_endpoint_configs"][0]["version_info"],
        eds.system_version_info.as_str()
    );
    server.shutdown().await;
}

#[tokio::test]
async fn debug_pages_clip_a_huge_nack_detail_and_node_id() {
    use meshfed::logging::{ERROR_DETAIL_LOG_MAX, NODE_ID_LOG_MAX};

    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    add_http_service(
        &reg,
        "a.default.svc.cluster.local",
        "default",
        &["10.0.0.1"],
    );
    server.sync().await;
    let pod = "p".repeat(600);
    let node_id = format!("sidecar~10.0.0.1~{pod}.default~default.svc.cluster.local");
    let mut client = AdsClient::connect(server.grpc_addr(), node(&node_id))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let rejected = client.recv().await.unwrap();
    let detail = format!("cluster a: {}", "x".repeat(20_000));
    client.nack(&rejected, &detail).await.unwrap();

    let http = server.bound().http;
    let adsz = eventually("the NACK to show in /debug/adsz", || async move {
        let adsz = get_json(http, "/debug/adsz").await;
        let error = adsz["clients"][0]["watches"]["cds"]["lastError"].clone();
        (!error.is_null()).then_some(adsz)
    })
    .await;
    let client_json = &adsz["clients"][0];
    let error = client_json["watches"]["cds"]["lastError"].as_str().unwrap();
    // A suffix says how long the whole was; the page never carries all of it.
    assert!(error.len() <= ERROR_DETAIL_LOG_MAX + 32, "{}", error.len());
    assert!(error.starts_with("cluster a: xxx"), "{error}");
    assert!(error.ends_with(" bytes)"), "{error}");
    let shown = client_json["node"].as_str().unwrap();
    assert!(shown.len() <= NODE_ID_LOG_MAX + 32, "{}", shown.len());
    assert!(shown.starts_with("sidecar~10.0.0.1~ppp"), "{shown}");

    let syncz = get_json(http, "/debug/syncz").await;
    let error = syncz[0]["types"]["cds"]["lastError"].as_str().unwrap();
    assert!(error.len() <= ERROR_DETAIL_LOG_MAX + 32, "{}", error.len());
    let proxy_id = syncz[0]["proxyId"].as_str().unwrap();
    assert!(proxy_id.len() <= NODE_ID_LOG_MAX + 32, "{}", proxy_id.len());
    server.shutdown().await;
}

/// Istio's conflict gauges: a TCP service dropped from a listener where an older one
/// matches the same traffic is counted by listener, once a sidecar's listeners are
/// built; the HTTP siblings Istio registers stay 0.
#[tokio::test]
async fn dropped_outbound_chains_are_counted_in_istios_conflict_gauges() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    for (host, created) in [("a.example.com", 1), ("b.example.com", 2)] {
        let mut svc = service(
            host,
            "default",
            &[("tcp", 9000, meshfed_registry::Protocol::Tcp)],
        );
        svc.creation_time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(created);
        reg.add_service(svc);
    }
    server.sync().await;
    let gauge = |metrics: &str, name: &str| metric(metrics, name);
    let (_, before) = http_get(server.bound().monitoring, "/metrics").await;
    assert_eq!(
        gauge(
            &before,
            "pilot_conflict_outbound_listener_tcp_over_current_tcp"
        ),
        Some(0.0),
        "{before}"
    );
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.0.0.1~app.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Listener, &[]).await.unwrap();
    client.recv_type(TypeUrl::Listener).await.unwrap();
    let (_, after) = http_get(server.bound().monitoring, "/metrics").await;
    assert_eq!(
        gauge(
            &after,
            "pilot_conflict_outbound_listener_tcp_over_current_tcp"
        ),
        Some(1.0),
        "{after}"
    );
    for sibling in [
        "pilot_conflict_outbound_listener_http_over_current_tcp",
        "pilot_conflict_outbound_listener_tcp_over_current_http",
    ] {
        assert_eq!(gauge(&after, sibling), Some(0.0), "{after}");
    }
    let status = get_json(server.bound().http, "/debug/push_status").await;
    assert_eq!(
        status["conflicts"]["pilot_conflict_outbound_listener_tcp_over_current_tcp"]["0.0.0.0_9000"],
        "Listener=0.0.0.0_9000 Accepted=TCP Rejected=TCP (b.example.com)",
        "{status:#}"
    );
    server.shutdown().await;
}

/// The push records naming a change of `kind` `namespace/name`, newest first.
fn pushes_of(server: &FakeServer, change: &str) -> Vec<Value> {
    server
        .server()
        .pipeline()
        .history()
        .into_iter()
        .filter(|p| p.changes.iter().any(|c| c == change))
        .map(|p| serde_json::json!({"connections": p.connections, "proxies": p.proxies}))
        .collect()
}

/// As Istio's `DependsOnConfig` for the namespace-scoped security kinds: a policy of
/// one namespace reaches the sidecars of that namespace (and the gateways); one of the
/// root namespace reaches every proxy.
#[tokio::test]
async fn a_security_policy_change_pushes_only_the_proxies_of_its_namespace() {
    use meshfed_api::security::v1beta1 as sec;
    use meshfed_registry::config::ConfigObject;
    let server = FakeServer::builder().start().await.unwrap();
    server.sync().await;
    let mut sidecars = Vec::new();
    for id in [
        "sidecar~10.0.0.1~a.foo~foo.svc.cluster.local",
        "sidecar~10.0.0.2~b.bar~bar.svc.cluster.local",
    ] {
        let mut c = AdsClient::connect(server.grpc_addr(), node(id))
            .await
            .unwrap();
        c.subscribe(TypeUrl::Listener, &[]).await.unwrap();
        c.recv_type(TypeUrl::Listener).await.unwrap();
        sidecars.push(c);
    }
    let apply = |namespace: &str, kind_spec: sec::AuthorizationPolicy| {
        server
            .config_store()
            .apply(ConfigObject::new(namespace, "p", kind_spec))
            .expect("valid policy");
    };
    // A policy of foo: only a.foo.
    apply("foo", sec::AuthorizationPolicy::default());
    let change = "AuthorizationPolicy/foo/p";
    let pushes = eventually("the foo policy's push", || async {
        let p = pushes_of(&server, change);
        (!p.is_empty()).then_some(p)
    })
    .await;
    assert_eq!(pushes[0]["connections"], 1, "{pushes:?}");
    assert!(
        pushes[0]["proxies"][0]
            .as_str()
            .unwrap()
            .starts_with("a.foo-"),
        "{pushes:?}"
    );
    // A policy of the root namespace: both.
    apply("istio-system", sec::AuthorizationPolicy::default());
    let change = "AuthorizationPolicy/istio-system/p";
    let pushes = eventually("the root policy's push", || async {
        let p = pushes_of(&server, change);
        (!p.is_empty()).then_some(p)
    })
    .await;
    assert_eq!(pushes[0]["connections"], 2, "{pushes:?}");
    server.shutdown().await;
}

/// Beyond Istio's namespace rule: a policy with a selector reaches the proxies it
/// selects (before or after the change), and a namespace-wide PeerAuthentication
/// every proxy, since clients' auto mTLS follows it.
#[tokio::test]
async fn a_security_policy_change_pushes_only_the_proxies_it_selects() {
    use meshfed_api::security::v1beta1 as sec;
    use meshfed_api::r#type::v1beta1::WorkloadSelector;
    use meshfed_registry::config::ConfigObject;
    let server = FakeServer::builder().start().await.unwrap();
    server.sync().await;
    let mut sidecars = Vec::new();
    for (id, app) in [
        ("sidecar~10.0.0.1~a.foo~foo.svc.cluster.local", "a"),
        ("sidecar~10.0.0.2~b.foo~foo.svc.cluster.local", "b"),
        ("sidecar~10.0.0.3~c.bar~bar.svc.cluster.local", "a"),
    ] {
        let mut c = AdsClient::connect(
            server.grpc_addr(),
            meshfed::testing::node_with(id, serde_json::json!({"LABELS": {"app": app}})),
        )
        .await
        .unwrap();
        c.subscribe(TypeUrl::Listener, &[]).await.unwrap();
        c.recv_type(TypeUrl::Listener).await.unwrap();
        c.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
        c.recv_type(TypeUrl::Cluster).await.unwrap();
        sidecars.push(c);
    }
    let selector = |app: &str| {
        Some(WorkloadSelector {
            match_labels: [("app".to_string(), app.to_string())].into(),
        })
    };
    let pushed = |change: &'static str| {
        let server = &server;
        async move {
            let pushes = eventually(change, || async {
                let p = pushes_of(server, change);
                (!p.is_empty()).then_some(p)
            })
            .await;
            let mut ids: Vec<String> = pushes[0]["proxies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap().split('-').next().unwrap().to_string())
                .collect();
            ids.sort();
            ids
        }
    };
    // An AuthorizationPolicy selecting app=a in foo: a.foo only.
    server
        .config_store()
        .apply(ConfigObject::new(
            "foo",
            "only-a",
            sec::AuthorizationPolicy {
                selector: selector("a"),
                ..Default::default()
            },
        ))
        .expect("valid policy");
    assert_eq!(pushed("AuthorizationPolicy/foo/only-a").await, ["a.foo"]);
    // Moving its selector to app=b: the proxies of both versions.
    server
        .config_store()
        .apply(ConfigObject::new(
            "foo",
            "only-a",
            sec::AuthorizationPolicy {
                selector: selector("b"),
                rules: vec![sec::Rule::default()],
                ..Default::default()
            },
        ))
        .expect("valid policy");
    let pushes = eventually("the selector change's push", || async {
        let p = pushes_of(&server, "AuthorizationPolicy/foo/only-a");
        (p.len() >= 2).then_some(p)
    })
    .await;
    let proxies = |push: &Value| -> Vec<String> {
        let mut ids: Vec<String> = push["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().split('-').next().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    assert!(
        pushes.iter().any(|p| proxies(p) == ["a.foo", "b.foo"]),
        "{pushes:?}"
    );
    // A namespace-wide PeerAuthentication: every proxy, for clients' auto mTLS.
    server
        .config_store()
        .apply(ConfigObject::new(
            "foo",
            "default",
            sec::PeerAuthentication::default(),
        ))
        .expect("valid policy");
    assert_eq!(
        pushed("PeerAuthentication/foo/default").await,
        ["a.foo", "b.foo", "c.bar"]
    );
    server.shutdown().await;
}

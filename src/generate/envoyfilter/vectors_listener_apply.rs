//! `TestApplyListenerPatches` of `listener_patch_test.go` (see `super::vectors`): the
//! "gateway lds", "sidecar outbound lds", "sidecar outbound lds - skip adds" and
//! "sidecar inbound virtual" cases, which share one list of 49 patches (one
//! EnvoyFilter each, `test-envoyfilter-<i>` in `not-default`, ordered by name as
//! istiod orders them), and the two waypoint cases. The listeners go through the
//! engine's LDS path ([`super::listener::apply`]: a router gets the gateway context, a
//! sidecar the inbound one on `virtualInbound` and the outbound one elsewhere; `ADD`ed
//! listeners of the contexts Istio's call adds for, none for its `skipAdds`).
//!
//! Where Istio's data would not pass Envoy's proto validation, the port completes it
//! the same way in inputs, patch values and outputs: socket addresses get the address
//! `0.0.0.0`, connection managers a stat prefix and an empty inline route
//! configuration, Redis proxies a stat prefix and connection pool settings.

use std::panic::{AssertUnwindSafe, catch_unwind};

use envoy_types::pb::envoy::config::listener::v3::Listener;
use prost::Message;
use serde_json::{Value, json};

use meshfed_api::networking::v1alpha3::envoy_filter::PatchContext;

use super::vectors_support::{ef, msg, proxy, render, valid};
use super::{listener, patches_for};
use crate::xds::{EncodedResource, TypeUrl};

const FILE: &str = "listener_patch_test.go";
/// Istio's calls of `ApplyListenerPatches` with adds: per direction for sidecars.
const OUTBOUND: PatchContext = PatchContext::SidecarOutbound;
const INBOUND: PatchContext = PatchContext::SidecarInbound;
const HCM: &str = "envoy.filters.network.http_connection_manager";
const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const REDIS: &str = "envoy.filters.network.redis_proxy";
const REDIS_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.network.redis_proxy.v3.RedisProxy";
const FAULT: &str = "envoy.filters.http.fault";
const FAULT_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault";
const DOWNSTREAM_TLS: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";

fn addr(port: u32) -> Value {
    json!({"socket_address": {"address": "0.0.0.0", "port_value": port}})
}

fn named(names: &[&str]) -> Value {
    Value::Array(names.iter().map(|n| json!({"name": n})).collect())
}

/// A connection manager filter with `http_filters` and more fields `extra`.
fn hcm_with(extra: Value, http_filters: Value) -> Value {
    let mut c = json!({"@type": HCM_TYPE, "stat_prefix": "s", "route_config": {"name": "r"},
        "http_filters": http_filters});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    json!({"name": HCM, "typed_config": c})
}

fn hcm(http_filters: Value) -> Value {
    hcm_with(json!({}), http_filters)
}

/// A Redis proxy filter named `name` with `extra` fields.
fn redis(name: &str, extra: Value) -> Value {
    let mut c = json!({"@type": REDIS_TYPE, "stat_prefix": "redis",
        "settings": {"op_timeout": "5s"}});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    json!({"name": name, "typed_config": c})
}

fn redis_replacement() -> Value {
    redis(
        "envoy.redis_proxy",
        json!({"stat_prefix": "redis_stats",
            "prefix_routes": {"catch_all_route": {"cluster": "custom-redis-cluster"}}}),
    )
}

fn downstream_tls(common: Value) -> Value {
    json!({"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": DOWNSTREAM_TLS, "common_tls_context": common}})
}

fn alts() -> Value {
    json!({"name": "transport_sockets.alts", "typed_config": {
        "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
        "type_url": "type.googleapis.com/envoy.extensions.transport_sockets.alts.v3.Alts",
        "value": {"handshaker_service": "1.2.3.4"}}})
}

/// A listener match with `listener` fields and context `ctx` ("" for none).
fn on(ctx: &str, listener: Value) -> Value {
    let mut m = json!({"listener": listener});
    if !ctx.is_empty() {
        m["context"] = json!(ctx);
    }
    m
}

/// The listener match of a connection manager's HTTP filter `sub` on `port` (0: any).
fn http_sub(port: u32, sub: &str) -> Value {
    let mut l = json!({"filterChain": {"filter": {"name": HCM, "subFilter": {"name": sub}}}});
    if port != 0 {
        l["portNumber"] = json!(port);
    }
    l
}

fn filter_on(port: u32, filter: &str) -> Value {
    json!({"portNumber": port, "filterChain": {"filter": {"name": filter}}})
}

fn patch(apply_to: &str, m: Value, op: &str, value: Option<Value>) -> Value {
    let mut p = json!({"applyTo": apply_to, "match": m, "patch": {"operation": op}});
    if let Some(v) = value {
        p["patch"]["value"] = v;
    }
    p
}

/// Istio's `configPatches`, in its order (index = EnvoyFilter number).
fn config_patches() -> Vec<Value> {
    let v = |x: Value| Some(x);
    let name = |n: &str| Some(json!({"name": n}));
    let vi = "virtualInbound";
    vec![
        // 0
        {
            let mut m = json!({"context": "SIDECAR_OUTBOUND"});
            m["proxy"] = json!({"metadata": {"foo": "sidecar"}});
            patch("LISTENER", m, "ADD", name("new-outbound-listener1"))
        },
        {
            let mut m = on("SIDECAR_OUTBOUND", filter_on(12345, "filter1"));
            m["proxy"] = json!({"proxyVersion": "^1\\.[2-9](.*?)$"});
            patch("NETWORK_FILTER", m, "INSERT_BEFORE", name("filter0"))
        },
        {
            let mut m = on("SIDECAR_OUTBOUND", filter_on(12345, "filter1"));
            m["proxy"] = json!({"proxyVersion": "^1\\.[5-9](.*?)$"});
            patch("NETWORK_FILTER", m, "INSERT_FIRST", name("filter0"))
        },
        patch(
            "NETWORK_FILTER",
            on("SIDECAR_OUTBOUND", filter_on(12345, "filter2")),
            "REMOVE",
            None,
        ),
        patch(
            "LISTENER",
            on("SIDECAR_INBOUND", json!({"portNumber": 12345})),
            "REMOVE",
            None,
        ),
        // 5: Istio's value `{listener_filters: nil}` is no JSON: an empty Struct.
        patch(
            "LISTENER",
            on("SIDECAR_INBOUND", json!({"portNumber": 80})),
            "MERGE",
            v(json!({})),
        ),
        patch(
            "FILTER_CHAIN",
            on(
                "SIDECAR_INBOUND",
                json!({"portNumber": 80, "filterChain": {"transportProtocol": "tls"}}),
            ),
            "REMOVE",
            None,
        ),
        patch(
            "LISTENER",
            on("GATEWAY", json!({"portNumber": 80})),
            "MERGE",
            v(json!({"listener_filters": [{"name": "foo"}]})),
        ),
        patch(
            "FILTER_CHAIN",
            on(
                "GATEWAY",
                json!({"portNumber": 80, "filterChain": {"sni": "*.foo.com"}}),
            ),
            "MERGE",
            v(json!({"filter_chain_match": {"server_names": ["foo.com"]}})),
        ),
        patch(
            "NETWORK_FILTER",
            on("", json!({"filterChain": {"filter": {"name": REDIS}}})),
            "MERGE",
            v(json!({"name": REDIS, "typed_config": {"@type": REDIS_TYPE,
                "settings": {"op_timeout": "0.2s"}}})),
        ),
        // 10
        patch(
            "HTTP_FILTER",
            on("GATEWAY", {
                let mut l = http_sub(80, "http-filter2");
                l["filterChain"]["sni"] = json!("*.foo.com");
                l
            }),
            "INSERT_AFTER",
            name("http-filter3"),
        ),
        patch(
            "HTTP_FILTER",
            on(
                "GATEWAY",
                http_sub(80, "http-filter-to-be-removed-then-add"),
            ),
            "REMOVE",
            None,
        ),
        patch(
            "HTTP_FILTER",
            on(
                "GATEWAY",
                http_sub(80, "http-filter-to-be-removed-then-add"),
            ),
            "ADD",
            name("http-filter-to-be-removed-then-add"),
        ),
        patch(
            "HTTP_FILTER",
            on("SIDECAR_INBOUND", http_sub(80, "http-filter2")),
            "INSERT_BEFORE",
            name("http-filter3"),
        ),
        patch(
            "HTTP_FILTER",
            on("SIDECAR_INBOUND", http_sub(0, "http-filter3")),
            "INSERT_BEFORE",
            name("http-filter-to-be-removed2"),
        ),
        patch(
            "HTTP_FILTER",
            on(
                "SIDECAR_INBOUND",
                http_sub(80, "http-filter-to-be-removed2"),
            ),
            "REMOVE",
            None,
        ),
        patch(
            "HTTP_FILTER",
            on("SIDECAR_INBOUND", http_sub(80, "http-filter2")),
            "INSERT_AFTER",
            name("http-filter4"),
        ),
        patch(
            "HTTP_FILTER",
            on("SIDECAR_INBOUND", http_sub(80, "http-filter-to-be-removed")),
            "REMOVE",
            None,
        ),
        patch(
            "HTTP_FILTER",
            on(
                "SIDECAR_INBOUND",
                http_sub(80, "http-filter-to-be-removed-then-add"),
            ),
            "REMOVE",
            None,
        ),
        patch(
            "HTTP_FILTER",
            on(
                "SIDECAR_INBOUND",
                http_sub(80, "http-filter-to-be-removed-then-add"),
            ),
            "ADD",
            name("http-filter-to-be-removed-then-add"),
        ),
        // 20
        patch(
            "HTTP_FILTER",
            on("SIDECAR_INBOUND", http_sub(80, FAULT)),
            "MERGE",
            v(json!({"name": FAULT, "typed_config": {"@type": FAULT_TYPE,
                "downstreamNodes": ["foo"]}})),
        ),
        patch(
            "HTTP_FILTER",
            on("SIDECAR_INBOUND", http_sub(80, "http-filter2")),
            "INSERT_FIRST",
            name("http-filter0"),
        ),
        patch(
            "HTTP_FILTER",
            on("SIDECAR_INBOUND", http_sub(80, FAULT)),
            "MERGE",
            v(json!({"typed_config": {"@type": FAULT_TYPE, "upstream_cluster": "scooby"}})),
        ),
        patch(
            "NETWORK_FILTER",
            on("SIDECAR_INBOUND", filter_on(80, HCM)),
            "MERGE",
            v(json!({"name": HCM, "typed_config": {
                "@type": "type.googleapis.com/type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "xffNumTrustedHops": "4"}})),
        ),
        patch(
            "NETWORK_FILTER",
            on("SIDECAR_INBOUND", filter_on(80, HCM)),
            "MERGE",
            v(json!({"name": HCM, "typed_config": {"@type": HCM_TYPE,
                "mergeSlashes": true, "alwaysSetRequestIdInResponse": true}})),
        ),
        patch(
            "HTTP_FILTER",
            on("SIDECAR_INBOUND", http_sub(80, "http-filter2")),
            "INSERT_AFTER",
            name("http-filter-5"),
        ),
        patch(
            "NETWORK_FILTER",
            on("", filter_on(6379, "filter1")),
            "REPLACE",
            v(redis_replacement()),
        ),
        patch(
            "NETWORK_FILTER",
            on("", filter_on(6381, "default-network-filter")),
            "REPLACE",
            name("default-network-filter-replaced"),
        ),
        patch(
            "NETWORK_FILTER",
            on("", filter_on(6381, "default-network-filter-removed")),
            "REMOVE",
            None,
        ),
        patch(
            "NETWORK_FILTER",
            on(
                "",
                filter_on(6380, "network-filter-should-not-be-replaced-not-match"),
            ),
            "REPLACE",
            name("network-filter-replaced-should-not-be-applied"),
        ),
        // 30
        patch(
            "HTTP_FILTER",
            on("", {
                let mut l = http_sub(0, "http-filter-to-be-replaced");
                l["name"] = json!("listener-http-filter-to-be-replaced");
                l
            }),
            "REPLACE",
            name("http-filter-replaced"),
        ),
        patch(
            "HTTP_FILTER",
            on("", {
                let mut l = http_sub(0, "http-filter-should-not-be-replaced-not-match");
                l["name"] = json!("listener-http-filter-to-be-replaced-not-found");
                l
            }),
            "REPLACE",
            name("http-filter-replaced-should-not-be-applied"),
        ),
        patch(
            "NETWORK_FILTER",
            on(
                "",
                json!({"name": vi, "filterChain": {"destinationPort": 6380,
                    "filter": {"name": "network-filter-to-be-replaced"}}}),
            ),
            "REPLACE",
            v(redis_replacement()),
        ),
        patch(
            "FILTER_CHAIN",
            on(
                "SIDECAR_OUTBOUND",
                json!({"portNumber": 12345, "filterChain": {"transportProtocol": "tls"}}),
            ),
            "MERGE",
            v(
                json!({"transport_socket": downstream_tls(json!({"tls_params": {
                "tls_maximum_protocol_version": "TLSv1_3",
                "tls_minimum_protocol_version": "TLSv1_2"}}))}),
            ),
        ),
        patch(
            "FILTER_CHAIN",
            on(
                "SIDECAR_OUTBOUND",
                json!({"portNumber": 12345, "filterChain": {"applicationProtocols": "http/1.1"}}),
            ),
            "REMOVE",
            None,
        ),
        patch(
            "LISTENER_FILTER",
            on("SIDECAR_OUTBOUND", json!({"portNumber": 12345})),
            "REMOVE",
            None,
        ),
        patch(
            "LISTENER_FILTER",
            on("SIDECAR_OUTBOUND", json!({"portNumber": 12345})),
            "ADD",
            name("http-filter-to-be-removed-then-add"),
        ),
        patch(
            "FILTER_CHAIN",
            on("SIDECAR_OUTBOUND", json!({"portNumber": 7777})),
            "MERGE",
            v(json!({"transport_socket": alts()})),
        ),
        patch(
            "FILTER_CHAIN",
            on("SIDECAR_OUTBOUND", json!({"portNumber": 7778})),
            "MERGE",
            v(json!({"transport_socket": alts()})),
        ),
        patch(
            "NETWORK_FILTER",
            on(
                "",
                json!({"name": vi, "filterChain": {"name": "filter-chain-name-match",
                    "filter": {"name": "custom-network-filter-2"}}}),
            ),
            "REMOVE",
            None,
        ),
        // 40
        patch(
            "NETWORK_FILTER",
            on(
                "",
                json!({"name": vi, "filterChain": {"name": "filter-chain-name-match",
                    "filter": {"name": "custom-network-filter-1"}}}),
            ),
            "INSERT_BEFORE",
            name("network-filter-to-be-removed"),
        ),
        patch(
            "NETWORK_FILTER",
            on(
                "",
                json!({"name": vi, "filterChain": {"name": "filter-chain-name-match",
                    "filter": {"name": "network-filter-to-be-removed"}}}),
            ),
            "REMOVE",
            None,
        ),
        patch(
            "FILTER_CHAIN",
            on("SIDECAR_INBOUND", json!({"portNumber": 80})),
            "MERGE",
            v(json!({"transport_socket": downstream_tls(
                json!({"alpn_protocols": ["h2-80", "http/1.1-80"]}))})),
        ),
        patch(
            "FILTER_CHAIN",
            on("SIDECAR_INBOUND", json!({"portNumber": 6380})),
            "MERGE",
            v(json!({"transport_socket": downstream_tls(
                json!({"alpn_protocols": ["h2-6380", "http/1.1-6380"]}))})),
        ),
        patch(
            "LISTENER_FILTER",
            on("SIDECAR_OUTBOUND", json!({"portNumber": 12345})),
            "ADD",
            name("envoy.filters.listener.proxy_protocol"),
        ),
        patch(
            "LISTENER_FILTER",
            on(
                "SIDECAR_OUTBOUND",
                json!({"portNumber": 12345, "listenerFilter": "envoy.filters.listener.proxy_protocol"}),
            ),
            "INSERT_BEFORE",
            name("before proxy_protocol"),
        ),
        patch(
            "LISTENER_FILTER",
            on(
                "SIDECAR_OUTBOUND",
                json!({"portNumber": 12345, "listenerFilter": "envoy.filters.listener.proxy_protocol"}),
            ),
            "INSERT_AFTER",
            name("after proxy_protocol"),
        ),
        patch(
            "LISTENER_FILTER",
            on(
                "SIDECAR_OUTBOUND",
                json!({"portNumber": 6381, "listenerFilter": "filter-to-be-removed"}),
            ),
            "REMOVE",
            None,
        ),
        patch(
            "LISTENER_FILTER",
            on(
                "SIDECAR_OUTBOUND",
                json!({"portNumber": 6381, "listenerFilter": "filter-before-replace"}),
            ),
            "REPLACE",
            name("filter-after-replace"),
        ),
    ]
}

/// The sidecar outbound listeners Istio's outbound cases share (`12345` aside).
fn outbound_rest(out: bool) -> Vec<Value> {
    let dp = |p: u32| json!({"destination_port": p});
    vec![
        json!({"name": "network-filter-to-be-replaced", "address": addr(6379),
        "filter_chains": [{"filters": if out {
            json!([redis_replacement(), {"name": "filter2"}])
        } else {
            named(&["filter1", "filter2"])
        }}]}),
        json!({"name": "redis-proxy", "filter_chains": [{"filter_chain_match": dp(9999),
            "filters": [redis(REDIS, json!({"settings": {"op_timeout": if out { "0.2s" } else { "5s" }}}))]}]}),
        json!({"name": "network-filter-to-be-replaced-not-found", "address": addr(6380),
            "filter_chains": [{"filters": named(&["network-filter-should-not-be-replaced"])}]}),
        json!({"name": "default-filter-chain", "address": addr(6381),
        "filter_chains": [{"filters": named(&["network-filter"])}],
        "default_filter_chain": {"filters": if out {
            named(&["default-network-filter-replaced"])
        } else {
            named(&["default-network-filter", "default-network-filter-removed"])
        }},
        "listener_filters": if out {
            named(&["filter-after-replace"])
        } else {
            named(&["filter-to-be-removed", "filter-before-replace"])
        }}),
        json!({"name": "another-listener"}),
        json!({"name": "listener-http-filter-to-be-replaced", "filter_chains": [{
            "filter_chain_match": dp(80),
            "filters": [hcm(named(&[if out { "http-filter-replaced" } else { "http-filter-to-be-replaced" }, "another-http-filter"]))]}]}),
        json!({"name": "listener-http-filter-to-be-replaced-not-found", "filter_chains": [{
            "filter_chain_match": dp(80),
            "filters": [hcm(named(&["http-filter-should-not-be-replaced", "another-http-filter"]))]}]}),
        json!({"name": "custom-tls-replacement", "address": addr(7777), "filter_chains": [{
            "transport_socket": if out { alts() } else {
                downstream_tls(json!({"tls_params": {}}))
            },
            "filters": named(&["filter"])}]}),
        {
            let mut fc = json!({"filters": named(&["filter"])});
            if out {
                fc["transport_socket"] = alts();
            }
            json!({"name": "custom-tls-addition", "address": addr(7778), "filter_chains": [fc]})
        },
    ]
}

fn listener_12345(input_tls: Value, out: bool) -> Value {
    let tls_fc = json!({"filter_chain_match": {"transport_protocol": "tls"},
        "transport_socket": downstream_tls(input_tls),
        "filters": named(&["envoy.transport_sockets.tls"])});
    let mut l = json!({"name": "12345", "address": addr(12345)});
    if out {
        l["filter_chains"] = json!([tls_fc, {"filters": named(&["filter0", "filter1"])}]);
        l["listener_filters"] = named(&[
            "http-filter-to-be-removed-then-add",
            "before proxy_protocol",
            "envoy.filters.listener.proxy_protocol",
            "after proxy_protocol",
        ]);
    } else {
        l["filter_chains"] = json!([tls_fc,
            {"filter_chain_match": {"application_protocols": ["http/1.1", "h2c"]},
             "filters": named(&["filter1"])},
            {"filters": named(&["filter1", "filter2"])}]);
    }
    l
}

fn sidecar_outbound() -> (Vec<Value>, Vec<Value>) {
    let in_tls = json!({"tls_params": {"ecdh_curves": ["X25519"], "tls_maximum_protocol_version": "TLSv1_1"}});
    let out_tls = json!({"tls_params": {"ecdh_curves": ["X25519"],
        "tls_maximum_protocol_version": "TLSv1_3", "tls_minimum_protocol_version": "TLSv1_2"}});
    let mut input = vec![listener_12345(in_tls, false)];
    input.extend(outbound_rest(false));
    let mut output = vec![listener_12345(out_tls, true)];
    output.extend(outbound_rest(true));
    output.push(json!({"name": "new-outbound-listener1"}));
    (input, output)
}

fn sidecar_outbound_no_add() -> (Vec<Value>, Vec<Value>) {
    let out_tls = json!({"tls_params": {
        "tls_maximum_protocol_version": "TLSv1_3", "tls_minimum_protocol_version": "TLSv1_2"}});
    let another = json!({"name": "another-listener"});
    // Istio's input TLS context is empty (no common context).
    let mut input_12345 = listener_12345(json!({}), false);
    input_12345["filter_chains"][0]["transport_socket"]["typed_config"]
        .as_object_mut()
        .unwrap()
        .remove("common_tls_context");
    (
        vec![input_12345, another.clone()],
        vec![listener_12345(out_tls, true), another],
    )
}

fn gateway() -> (Vec<Value>, Vec<Value>) {
    let another = json!({"name": "another-listener", "address": addr(443), "filter_chains": [{
        "filter_chain_match": {"server_names": ["nomatch.com", "*.foo.com"]},
        "filters": named(&["network-filter"])}]});
    let l80 = |names: &[&str], http: &[&str]| {
        json!({"name": "80", "address": addr(80), "filter_chains": [{
            "filter_chain_match": {"server_names": names},
            "filters": [hcm(named(http))]}]})
    };
    let mut out80 = l80(
        &["match.com", "*.foo.com", "foo.com"],
        &[
            "http-filter1",
            "http-filter2",
            "http-filter3",
            "http-filter-to-be-removed-then-add",
        ],
    );
    out80["listener_filters"] = named(&["foo"]);
    (
        vec![
            l80(
                &["match.com", "*.foo.com"],
                &["http-filter1", "http-filter2"],
            ),
            another.clone(),
        ],
        vec![out80, another],
    )
}

fn sidecar_inbound_virtual() -> (Vec<Value>, Vec<Value>) {
    let blackhole = json!({"name": "virtualInbound-blackhole",
        "filter_chain_match": {"destination_port": 15006},
        "filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": "BlackHoleCluster", "cluster": "BlackHoleCluster"}}]});
    let suffix = json!({"filter_chain_match": {"address_suffix": "0.0.0.0"},
        "filters": named(&["network-filter-should-not-be-replaced"])});
    let not_match = json!({"name": "filter-chain-name-not-match",
        "filters": named(&["custom-network-filter-1", "custom-network-filter-2"])});
    let catch_all = json!({"name": "catch-all", "filter_chain_match": {},
        "filters": [hcm(named(&["base"]))]});
    let fault = |v: Value| {
        let mut c = json!({"@type": FAULT_TYPE});
        for (k, x) in v.as_object().unwrap() {
            c[k] = x.clone();
        }
        json!({"name": FAULT, "typed_config": c})
    };
    let listener = |chains: Vec<Value>| {
        json!({"name": "virtualInbound", "use_original_dst": true,
            "traffic_direction": "INBOUND", "address": addr(15006), "filter_chains": chains})
    };
    let input = listener(vec![
        blackhole.clone(),
        json!({"filter_chain_match": {"destination_port": 80}, "filters": [hcm(json!([
            fault(json!({"upstream_cluster": "foobar"})),
            {"name": "http-filter2"}, {"name": "http-filter-to-be-removed"}]))]}),
        suffix.clone(),
        json!({"filter_chain_match": {"destination_port": 6380},
            "filters": named(&["network-filter-to-be-replaced"])}),
        not_match.clone(),
        json!({"name": "filter-chain-name-match",
            "filters": named(&["custom-network-filter-1", "custom-network-filter-2"])}),
        catch_all.clone(),
    ]);
    let output = listener(vec![
        blackhole,
        json!({"filter_chain_match": {"destination_port": 80},
            "transport_socket": downstream_tls(json!({"alpn_protocols": ["h2-80", "http/1.1-80"]})),
            "filters": [hcm_with(
                json!({"xff_num_trusted_hops": 4, "merge_slashes": true,
                    "always_set_request_id_in_response": true}),
                json!([{"name": "http-filter0"},
                    fault(json!({"upstream_cluster": "scooby", "downstream_nodes": ["foo"]})),
                    {"name": "http-filter3"}, {"name": "http-filter2"}, {"name": "http-filter-5"},
                    {"name": "http-filter4"}, {"name": "http-filter-to-be-removed-then-add"}]))]}),
        suffix,
        json!({"filter_chain_match": {"destination_port": 6380},
            "transport_socket": downstream_tls(json!({"alpn_protocols": ["h2-6380", "http/1.1-6380"]})),
            "filters": [redis_replacement()]}),
        not_match,
        json!({"name": "filter-chain-name-match", "filters": named(&["custom-network-filter-1"])}),
        catch_all,
    ]);
    (vec![input], vec![output])
}

/// Istio's `waypointConfigPatches` (one EnvoyFilter each, with `targetRefs` to the
/// Service and the ServiceEntry `foo`).
fn waypoint_patches() -> Vec<Value> {
    let wp = |waypoint: Value| json!({"context": "WAYPOINT", "waypoint": waypoint});
    vec![
        patch(
            "FILTER_CHAIN",
            wp(json!({})),
            "MERGE",
            Some(json!({"transport_socket": downstream_tls(
                json!({"alpn_protocols": ["h2-6380", "http/1.1-6380"]}))})),
        ),
        patch(
            "NETWORK_FILTER",
            wp(json!({"filter": {"name": HCM}})),
            "MERGE",
            Some(json!({"name": HCM, "typed_config": {"@type": HCM_TYPE,
                "max_request_headers_kb": 96}})),
        ),
        patch(
            "HTTP_FILTER",
            wp(json!({"filter": {"name": HCM, "subFilter": {"name": "http-filter-5"}}})),
            "REMOVE",
            None,
        ),
    ]
}

/// Istio's waypoint listener for the service `host`, patched (`out`) or not.
fn waypoint_listener(host: &str, out: bool) -> Value {
    let name = format!("inbound-vip|8000|http|{host}");
    let route_config = json!({"name": name, "virtual_hosts": [{"name": name, "domains": ["*"],
        "routes": [{"name": "bar.foo.0",
            "match": {"path_separated_prefix": "/", "case_sensitive": true},
            "route": {"cluster": name, "cluster_not_found_response_code": "INTERNAL_SERVER_ERROR"}}]}]});
    let mut http = vec![
        "http-filter0",
        FAULT,
        "http-filter3",
        "http-filter2",
        "http-filter-5",
        "http-filter4",
        "http-filter-to-be-removed-then-add",
    ];
    if out {
        http.retain(|f| *f != "http-filter-5");
    }
    let http: Vec<Value> = http
        .iter()
        .map(|f| {
            if *f == FAULT {
                json!({"name": FAULT, "typed_config": {"@type": FAULT_TYPE,
                    "upstream_cluster": "scooby", "downstream_nodes": ["foo"]}})
            } else {
                json!({"name": f})
            }
        })
        .collect();
    let mut extra = json!({"route_config": route_config});
    if out {
        extra["max_request_headers_kb"] = json!(96);
    }
    let mut fc = json!({"name": name, "filters": [hcm_with(extra, Value::Array(http))]});
    if out {
        fc["transport_socket"] =
            downstream_tls(json!({"alpn_protocols": ["h2-6380", "http/1.1-6380"]}));
    }
    json!({"name": "main_internal", "internal_listener": {}, "filter_chains": [fc]})
}

/// Runs `input` through the LDS patching of `kind` (`router` or `sidecar`) with the
/// EnvoyFilters made of `patches` and compares with `want`; a vector whose data does
/// not convert (a type the descriptors lack) fails with the reason.
fn run(
    kind: &str,
    patches: Vec<Value>,
    target_refs: bool,
    input: Vec<Value>,
    want: Vec<Value>,
    adds: &[PatchContext],
) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| {
        run_unchecked(kind, patches, target_refs, input, want, adds)
    }))
    .unwrap_or_else(|e| {
        Err(e
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "panicked".into()))
    })
}

fn run_unchecked(
    kind: &str,
    patches: Vec<Value>,
    target_refs: bool,
    input: Vec<Value>,
    want: Vec<Value>,
    adds: &[PatchContext],
) -> Result<(), String> {
    let efs: Vec<_> = patches
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let mut spec = json!({"configPatches": [p]});
            if target_refs {
                spec["targetRefs"] = json!([{"kind": "Service", "name": "foo"},
                    {"group": "networking.istio.io", "kind": "ServiceEntry", "name": "foo"}]);
            }
            ef("not-default", &format!("test-envoyfilter-{i}"), 0, spec)
        })
        .collect();
    let p = proxy(
        kind,
        "not-default",
        json!({"ISTIO_VERSION": "1.2.2", "foo": "sidecar", "bar": "proxy"}),
    );
    let resources: Vec<crate::xds::Resource> = input
        .into_iter()
        .map(|l| {
            let l: Listener = msg(l);
            EncodedResource::encode(TypeUrl::Listener, l.name.clone(), &l)
        })
        .collect();
    let got = catch_unwind(AssertUnwindSafe(|| {
        let Some(patches) = patches_for(&efs, "istio-config", &p) else {
            return Vec::new();
        };
        listener::apply(&patches, resources, &p, adds)
    }))
    .map_err(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "panicked".into())
    })?;
    let got: Vec<Listener> = got
        .iter()
        .map(|r| Listener::decode(r.body.value.as_ref()).unwrap())
        .collect();
    for l in &got {
        catch_unwind(AssertUnwindSafe(|| valid(&l.name, l)))
            .map_err(|_| format!("{} is not valid", l.name))?;
    }
    let got: Vec<Value> = got.iter().map(render).collect();
    let want: Vec<Value> = want
        .into_iter()
        .map(|l| render(&msg::<Listener>(l)))
        .collect();
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "got {}\nwant {}",
            serde_json::to_string_pretty(&got).unwrap(),
            serde_json::to_string_pretty(&want).unwrap()
        ))
    }
}

pub(super) fn all() -> Vec<(&'static str, String, Result<(), String>)> {
    let case = |name: &str| format!("TestApplyListenerPatches/{name}");
    let mut out = Vec::new();
    let (i, o) = gateway();
    out.push((
        FILE,
        case("gateway lds"),
        run(
            "router",
            config_patches(),
            false,
            i,
            o,
            &[PatchContext::Gateway],
        ),
    ));
    let (i, o) = sidecar_outbound();
    out.push((
        FILE,
        case("sidecar outbound lds"),
        run("sidecar", config_patches(), false, i, o, &[OUTBOUND]),
    ));
    let (i, o) = sidecar_outbound_no_add();
    out.push((
        FILE,
        case("sidecar outbound lds - skip adds"),
        run("sidecar", config_patches(), false, i, o, &[]),
    ));
    let (i, o) = sidecar_inbound_virtual();
    out.push((
        FILE,
        case("sidecar inbound virtual"),
        run("sidecar", config_patches(), false, i, o, &[INBOUND]),
    ));
    for (name, host) in [
        (
            "waypoint match Service",
            "foo.not-default.svc.cluster.local",
        ),
        ("waypoint match ServiceEntry", "foo.bar.com"),
    ] {
        out.push((
            FILE,
            case(name),
            run(
                "sidecar",
                waypoint_patches(),
                true,
                vec![waypoint_listener(host, false)],
                vec![waypoint_listener(host, true)],
                &[OUTBOUND, INBOUND],
            ),
        ));
    }
    out
}

//! `rc_patch_test.go`, ported (see `super::vectors`). Not ported: the "vh is nil" and
//! "route is nil" cases (a virtual host or route always exists here). Istio's route
//! inputs are skeletons Envoy itself would refuse (routes without a match or cluster,
//! virtual hosts without domains), so their outputs are not held to the proto
//! validation checker; route configurations patched when served are (every encoded
//! resource is checked in test builds).

use std::sync::Arc;

use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
use meshfed_api::networking::v1alpha3::envoy_filter::{ApplyTo, PatchContext};
use serde_json::{Value, json};

use super::vectors_support::{ef, msg, proxy, render};
use super::{Patch, patches_for, route};

const FILE: &str = "rc_patch_test.go";

type Outcome = (&'static str, String, Result<(), String>);

fn check(name: &str, ok: bool) -> Outcome {
    (
        FILE,
        name.to_string(),
        if ok { Ok(()) } else { Err("mismatch".into()) },
    )
}

/// The single patch of an EnvoyFilter with one `apply_to` patch matching `m`.
fn one(apply_to: &str, m: Value) -> Arc<Patch> {
    let e = ef(
        "ns",
        "one",
        0,
        json!({"configPatches": [{"applyTo": apply_to, "match": m,
            "patch": {"operation": "MERGE", "value": {}}}]}),
    );
    let p = patches_for(&[e], "istio-config", &proxy("sidecar", "ns", json!({}))).unwrap();
    let kind = ApplyTo::from_str_name(apply_to).unwrap();
    p.of(kind)[0].clone()
}

fn rc_match(m: Value) -> Value {
    json!({"routeConfiguration": m})
}

fn compare(got: &RouteConfiguration, want: Value) -> Result<(), String> {
    let want = render(&msg::<RouteConfiguration>(want));
    let got = render(got);
    if got == want {
        Ok(())
    } else {
        Err(format!("got {got}\nwant {want}"))
    }
}

fn apply_rc_ef()
-> Vec<Arc<crate::push::config_index::Config<meshfed_api::networking::v1alpha3::EnvoyFilter>>> {
    let route9090 = |route: Value| json!({"context": "ANY", "routeConfiguration": {"portNumber": 9090, "vhost": {"name": "test.com", "route": route}}});
    vec![ef(
        "not-default",
        "rc",
        0,
        json!({"configPatches": [
            {"applyTo": "ROUTE_CONFIGURATION", "match": {"context": "SIDECAR_OUTBOUND", "routeConfiguration": {"portNumber": 80}},
             "patch": {"operation": "MERGE", "value": {"request_headers_to_remove": ["h3", "h4"]}}},
            {"applyTo": "HTTP_ROUTE", "match": {"context": "SIDECAR_OUTBOUND", "routeConfiguration": {"portNumber": 80, "vhost": {"route": {"action": "ROUTE"}}}},
             "patch": {"operation": "MERGE", "value": {"route": {"prefix_rewrite": "/foo"}}}},
            {"applyTo": "HTTP_ROUTE", "match": {"context": "SIDECAR_OUTBOUND", "routeConfiguration": {"portNumber": 80, "vhost": {"route": {"name": "bar"}}}},
             "patch": {"operation": "REMOVE"}},
            {"applyTo": "VIRTUAL_HOST", "match": {"context": "SIDECAR_OUTBOUND", "routeConfiguration": {"vhost": {"name": "allow_any"}}},
             "patch": {"operation": "REMOVE"}},
            {"applyTo": "VIRTUAL_HOST", "patch": {"operation": "ADD", "value": {"name": "new-vhost"}}},
            {"applyTo": "VIRTUAL_HOST", "match": {"context": "GATEWAY", "routeConfiguration": {"vhost": {"name": "vhost1"}}},
             "patch": {"operation": "REMOVE"}},
            {"applyTo": "VIRTUAL_HOST", "match": {"context": "SIDECAR_INBOUND", "routeConfiguration": {"vhost": {"name": "vhost2"}}},
             "patch": {"operation": "REMOVE"}},
            {"applyTo": "VIRTUAL_HOST", "match": {"context": "ANY"},
             "patch": {"operation": "MERGE", "value": {"domains": ["domain:80"]}}},
            {"applyTo": "HTTP_ROUTE", "match": route9090(Value::Null),
             "patch": {"operation": "ADD", "value": {"name": "route4.0"}}},
            {"applyTo": "HTTP_ROUTE", "match": route9090(Value::Null),
             "patch": {"operation": "INSERT_FIRST", "value": {"name": "route0.0"}}},
            {"applyTo": "HTTP_ROUTE", "match": route9090(json!({"name": "route2.0"})),
             "patch": {"operation": "INSERT_AFTER", "value": {"name": "route2.5"}}},
            {"applyTo": "HTTP_ROUTE", "match": route9090(json!({"name": "route2.0"})),
             "patch": {"operation": "INSERT_BEFORE", "value": {"name": "route1.5"}}},
        ]}),
    )]
}

fn apply_rc(
    efs: &[Arc<
        crate::push::config_index::Config<meshfed_api::networking::v1alpha3::EnvoyFilter>,
    >],
    kind: &str,
    ctx: PatchContext,
    rc: Value,
    want: Value,
) -> Result<(), String> {
    let p = patches_for(efs, "istio-config", &proxy(kind, "not-default", json!({}))).unwrap();
    compare(
        &route::patch_route_configuration(&p, ctx, msg(rc), &Default::default()),
        want,
    )
}

pub(super) fn all() -> Vec<Outcome> {
    let mut out = Vec::new();
    // Test_virtualHostMatch
    let vh = |name: &str| VirtualHost {
        name: name.into(),
        ..Default::default()
    };
    let m = one(
        "VIRTUAL_HOST",
        rc_match(json!({"vhost": {"name": "scooby"}})),
    );
    out.push(check(
        "Test_virtualHostMatch/full match",
        route::virtual_host_match(&vh("scooby"), &m),
    ));
    out.push(check(
        "Test_virtualHostMatch/mismatch",
        !route::virtual_host_match(&vh("scoobydoo"), &m),
    ));
    // Test_routeConfigurationMatch
    let rc = |name: &str| RouteConfiguration {
        name: name.into(),
        ..Default::default()
    };
    let gw = json!({"portNumber": 443, "portName": "app1", "gateway": "ns1/gw1"});
    let map = |pairs: &[(u32, &[u32])]| -> route::GatewayPortMap {
        pairs
            .iter()
            .map(|(k, v)| (*k, v.iter().copied().collect()))
            .collect()
    };
    for (name, ctx, m, rc_name, port_map, want) in [
        (
            "nil route match",
            PatchContext::SidecarOutbound,
            json!({}),
            "",
            map(&[]),
            true,
        ),
        (
            "rc name mismatch",
            PatchContext::SidecarOutbound,
            rc_match(json!({"name": "scooby.80"})),
            "scooby.90",
            map(&[]),
            false,
        ),
        (
            "sidecar port match",
            PatchContext::SidecarOutbound,
            rc_match(json!({"portNumber": 80})),
            "80",
            map(&[]),
            true,
        ),
        (
            "sidecar port mismatch",
            PatchContext::SidecarOutbound,
            rc_match(json!({"portNumber": 80})),
            "90",
            map(&[]),
            false,
        ),
        (
            "gateway fields match",
            PatchContext::Gateway,
            rc_match(gw.clone()),
            "https.443.app1.gw1.ns1",
            map(&[]),
            true,
        ),
        (
            "gateway fields mismatch",
            PatchContext::Gateway,
            rc_match(gw),
            "http.80",
            map(&[]),
            false,
        ),
        (
            "http target port match",
            PatchContext::Gateway,
            rc_match(json!({"portNumber": 80})),
            "http.8080",
            map(&[(8080, &[80, 81])]),
            true,
        ),
        (
            "http target port no match",
            PatchContext::Gateway,
            rc_match(json!({"portNumber": 9090})),
            "http.9090",
            map(&[(8080, &[80, 81])]),
            true,
        ),
        (
            "https.443.app1.gw1.ns1",
            PatchContext::Gateway,
            rc_match(json!({"portNumber": 443})),
            "http.8443",
            map(&[(8443, &[443])]),
            true,
        ),
    ] {
        let p = one("ROUTE_CONFIGURATION", m);
        out.push(check(
            &format!("Test_routeConfigurationMatch/{name}"),
            route::route_configuration_match(ctx, &rc(rc_name), &p, &port_map) == want,
        ));
    }
    // TestApplyRouteConfigurationPatches
    let efs = apply_rc_ef();
    let fwd = |name: &str, prefix: &str| json!({"name": name, "route": {"prefix_rewrite": prefix}});
    let redirect =
        |name: &str, code: u32| json!({"name": name, "redirect": {"response_code": code}});
    for (name, kind, ctx, input, want) in [
        (
            "sidecar outbound rds patch",
            "sidecar",
            PatchContext::SidecarOutbound,
            json!({"name": "80", "virtual_hosts": [{"name": "foo.com", "domains": ["domain"],
                "routes": [fwd("foo", "/"), redirect("bar", 301)]}], "request_headers_to_remove": ["h1", "h2"]}),
            json!({"name": "80", "virtual_hosts": [{"name": "foo.com", "domains": ["domain", "domain:80"],
                "routes": [fwd("foo", "/foo")]}, {"name": "new-vhost"}], "request_headers_to_remove": ["h1", "h2", "h3", "h4"]}),
        ),
        (
            "sidecar inbound rc patch",
            "sidecar",
            PatchContext::SidecarInbound,
            json!({"name": "inbound|http|80", "virtual_hosts": [{"name": "vhost2"}]}),
            json!({"name": "inbound|http|80", "virtual_hosts": [{"name": "new-vhost"}]}),
        ),
        (
            "gateway rds patch",
            "router",
            PatchContext::Gateway,
            json!({"name": "80", "virtual_hosts": [{"name": "vhost1", "domains": ["domain"]}, {"name": "gateway", "domains": ["gateway"]}]}),
            json!({"name": "80", "virtual_hosts": [{"name": "gateway", "domains": ["gateway", "domain:80"]}, {"name": "new-vhost"}]}),
        ),
        (
            "array insert patch",
            "sidecar",
            PatchContext::SidecarOutbound,
            json!({"name": "9090", "virtual_hosts": [{"name": "test.com", "domains": ["domain"],
                "routes": [fwd("route1.0", "/"), redirect("route2.0", 301), redirect("route3.0", 404)]}]}),
            json!({"name": "9090", "virtual_hosts": [{"name": "test.com", "domains": ["domain", "domain:80"],
                "routes": [{"name": "route0.0"}, fwd("route1.0", "/"), {"name": "route1.5"}, redirect("route2.0", 301),
                    {"name": "route2.5"}, redirect("route3.0", 404), {"name": "route4.0"}]}, {"name": "new-vhost"}]}),
        ),
    ] {
        out.push((
            FILE,
            format!("TestApplyRouteConfigurationPatches/{name}"),
            apply_rc(&efs, kind, ctx, input, want),
        ));
    }
    // TestReplaceVhost
    let replace = vec![ef(
        "not-default",
        "replace",
        0,
        json!({"configPatches": [{"applyTo": "VIRTUAL_HOST",
            "match": {"context": "SIDECAR_INBOUND", "routeConfiguration": {"vhost": {"name": "to-be-replaced"}}},
            "patch": {"operation": "REPLACE", "value": {"name": "replaced", "domains": ["replaced.com"],
                "rate_limits": [{"actions": [{"request_headers": {"header_name": ":path", "descriptor_key": "PATH"}}]}]}}}]}),
    )];
    out.push((
        FILE,
        "TestReplaceVhost/sidecar inbound vhost replace".into(),
        apply_rc(
            &replace,
            "sidecar",
            PatchContext::SidecarInbound,
            json!({"name": "inbound|http|80", "virtual_hosts": [{"name": "to-be-replaced", "domains": ["xxx"], "routes": [fwd("xxx", "/xxx")]}]}),
            json!({"name": "inbound|http|80", "virtual_hosts": [{"name": "replaced", "domains": ["replaced.com"],
                "rate_limits": [{"actions": [{"request_headers": {"header_name": ":path", "descriptor_key": "PATH"}}]}]}]}),
        ),
    ));
    // Test_routeMatch
    let redirect_route: Route = msg(json!({"redirect": {}}));
    let named: Route = msg(json!({"name": "scooby"}));
    let rm = |r: Value| one("HTTP_ROUTE", rc_match(json!({"vhost": {"route": r}})));
    out.push(check(
        "Test_routeMatch/full match by name",
        route::route_match(&named, &rm(json!({"name": "scooby"}))),
    ));
    out.push(check(
        "Test_routeMatch/full match by action",
        route::route_match(&redirect_route, &rm(json!({"action": "REDIRECT"}))),
    ));
    out.push(check(
        "Test_routeMatch/mis match by action",
        !route::route_match(&redirect_route, &rm(json!({"action": "ROUTE"}))),
    ));
    // TestPatchHTTPRoute
    for name in ["normal", "shared"] {
        let e = vec![ef(
            "not-default",
            "http-route",
            0,
            json!({"configPatches": [{"applyTo": "HTTP_ROUTE",
                "match": {"routeConfiguration": {"vhost": {"name": name, "route": {"action": "ROUTE"}}}},
                "patch": {"operation": "MERGE", "value": {"route": {"prefix_rewrite": "/foo"}}}}]}),
        )];
        out.push((
            FILE,
            format!("TestPatchHTTPRoute/{name}"),
            apply_rc(
                &e,
                "router",
                PatchContext::Gateway,
                json!({"name": "normal", "virtual_hosts": [{"name": name, "domains": ["*"], "routes": [fwd(name, &format!("/{name}"))]}]}),
                json!({"name": "normal", "virtual_hosts": [{"name": name, "domains": ["*"], "routes": [fwd(name, "/foo")]}]}),
            ),
        ));
    }
    out
}

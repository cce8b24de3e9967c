//! `listener_patch_test.go` (see `super::vectors`): of `TestApplyListenerPatches`, the
//! "gateway lds with priority" case here; the cases sharing Istio's list of 49 patches
//! and the waypoint cases are in `super::vectors_listener_apply`. Istio's connection
//! manager here has no route configuration, which Envoy requires: the port gives it an
//! empty inline one (in input and output alike) so the output passes the checker.

use envoy_types::pb::envoy::config::listener::v3::Listener;
use meshfed_api::networking::v1alpha3::envoy_filter::PatchContext;
use serde_json::{Value, json};

use super::vectors_support::{ef, msg, proxy, render, valid};
use super::{listener, patches_for};

const FILE: &str = "listener_patch_test.go";

type Outcome = (&'static str, String, Result<(), String>);

const HCM: &str = "envoy.filters.network.http_connection_manager";
const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const TLS_INSPECTOR: &str =
    "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector";

fn gateway_listener(http_filters: Value, inspector: Value) -> Value {
    json!({
        "name": "80",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
        "filter_chains": [{"filters": [{"name": HCM, "typed_config": {
            "@type": HCM_TYPE, "stat_prefix": "s", "route_config": {"name": "r"},
            "http_filters": http_filters}}]}],
        "listener_filters": [{"name": "envoy.filters.listener.tls_inspector",
            "typed_config": inspector}],
    })
}

fn gateway_lds_with_priority() -> Result<(), String> {
    let sub = json!({"listener": {"portNumber": 80, "filterChain": {"filter": {
        "name": HCM, "subFilter": {"name": "http-filter-to-be-removed-then-add"}}}}});
    let mut m = sub.clone();
    m["context"] = json!("GATEWAY");
    let efs = vec![
        ef(
            "not-default",
            "test-envoyfilter-0",
            0,
            json!({"priority": 2, "configPatches": [{"applyTo": "HTTP_FILTER", "match": m,
                "patch": {"operation": "ADD", "value": {"name": "http-filter-to-be-removed-then-add"}}}]}),
        ),
        ef(
            "not-default",
            "test-envoyfilter-1",
            0,
            json!({"priority": 1, "configPatches": [{"applyTo": "HTTP_FILTER", "match": m,
                "patch": {"operation": "REMOVE"}}]}),
        ),
        ef(
            "not-default",
            "test-envoyfilter-2",
            0,
            json!({"priority": 0, "configPatches": [{"applyTo": "LISTENER_FILTER",
                "match": {"context": "GATEWAY", "listener": {"portNumber": 80,
                    "listenerFilter": "envoy.filters.listener.tls_inspector"}},
                "patch": {"operation": "MERGE", "value": {"name": "envoy.filters.listener.tls_inspector",
                    "typedConfig": {"@type": TLS_INSPECTOR, "initialReadBufferSize": 8192}}}}]}),
        ),
    ];
    let gw = proxy(
        "router",
        "not-default",
        json!({"ISTIO_VERSION": "1.2.2", "foo": "sidecar", "bar": "proxy"}),
    );
    let p = patches_for(&efs, "istio-config", &gw).unwrap();
    let input: Listener = msg(gateway_listener(json!([]), json!({"@type": TLS_INSPECTOR})));
    let got = listener::patch_listener(&p, PatchContext::Gateway, input).ok_or("removed")?;
    valid(&got.name, &got);
    let want = render(&msg::<Listener>(gateway_listener(
        json!([{"name": "http-filter-to-be-removed-then-add"}]),
        json!({"@type": TLS_INSPECTOR, "initial_read_buffer_size": 8192}),
    )));
    let got = render(&got);
    if got == want {
        Ok(())
    } else {
        Err(format!("got {got}\nwant {want}"))
    }
}

pub(super) fn all() -> Vec<Outcome> {
    let mut out = vec![(
        FILE,
        "TestApplyListenerPatches/gateway lds with priority".into(),
        gateway_lds_with_priority(),
    )];
    out.extend(super::vectors_listener_apply::all());
    out
}

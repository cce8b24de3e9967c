//! ztunnel's policies over Delta ADS: a client shaped like ztunnel (node type
//! `ztunnel`, a wildcard subscription to `istio.security.Authorization`, ACKs that
//! carry only the type and the nonce) gets the AuthorizationPolicies and
//! PeerAuthentications converted as Istio converts them, then each change as a
//! Delta update: a new policy alone, a deleted one as a removal.

use meshfed::ads::TypeUrl;
use meshfed::testing::{DeltaClient, FakeServer, decode_delta, node};
use meshfed_api::security as l4;
use meshfed_api::security::v1beta1 as sec;
use meshfed_registry::config::{ConfigObject, Kind};

const ZTUNNEL: &str = "ztunnel~10.0.0.9~ztunnel-x.istio-system~istio-system.svc.cluster.local";

fn spec<T: serde::de::DeserializeOwned>(json: serde_json::Value) -> T {
    serde_json::from_value(json).expect("spec")
}

fn names(r: &envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse) -> Vec<&str> {
    let mut n: Vec<&str> = r.resources.iter().map(|r| r.name.as_str()).collect();
    n.sort();
    n
}

#[tokio::test]
async fn ztunnel_receives_converted_policies_and_their_changes() {
    let server = FakeServer::builder().start().await.unwrap();
    let store = server.config_store();
    store
        .apply(ConfigObject::new(
            "ns1",
            "allow-sleep",
            spec::<sec::AuthorizationPolicy>(serde_json::json!({
                "selector": {"matchLabels": {"app": "httpbin"}},
                "rules": [{
                    "from": [{"source": {"principals": ["cluster.local/ns/ns1/sa/sleep"]}}],
                    "to": [{"operation": {"ports": ["8000"]}}]
                }]
            })),
        ))
        .expect("valid policy");
    store
        .apply(ConfigObject::new(
            "ns1",
            "strict",
            spec::<sec::PeerAuthentication>(serde_json::json!({"mtls": {"mode": "STRICT"}})),
        ))
        .expect("valid policy");
    server.sync().await;

    let mut ztunnel = DeltaClient::connect(server.grpc_addr(), node(ZTUNNEL))
        .await
        .unwrap();
    ztunnel
        .subscribe(TypeUrl::Authorization, &[], &[])
        .await
        .unwrap();
    let first = ztunnel.recv().await.unwrap();
    assert_eq!(
        first.type_url,
        "type.googleapis.com/istio.security.Authorization"
    );
    ztunnel
        .ack_nonce(TypeUrl::Authorization, &first.nonce)
        .await
        .unwrap();
    assert_eq!(
        names(&first),
        [
            "istio-system/istio_converted_static_strict",
            "ns1/allow-sleep"
        ]
    );
    let policies: Vec<l4::Authorization> = decode_delta(&first).unwrap();
    let allow = policies.iter().find(|p| p.name == "allow-sleep").unwrap();
    assert_eq!(allow.scope(), l4::Scope::WorkloadSelector);
    assert_eq!(allow.action(), l4::Action::Allow);
    let rules = &allow.groups[0].rules;
    assert_eq!(rules[0].matches[0].destination_ports, [8000]);
    assert_eq!(
        rules[1].matches[0].principals[0].match_type,
        Some(l4::string_match::MatchType::Exact(
            "cluster.local/ns/ns1/sa/sleep".into()
        ))
    );
    let strict = policies
        .iter()
        .find(|p| p.name == "istio_converted_static_strict")
        .unwrap();
    assert_eq!(strict.action(), l4::Action::Deny);

    // A new namespace-wide DENY policy: sent alone.
    store
        .apply(ConfigObject::new(
            "ns1",
            "deny-8080",
            spec::<sec::AuthorizationPolicy>(serde_json::json!({
                "action": "DENY",
                "rules": [{"to": [{"operation": {"ports": ["8080"], "methods": ["POST"]}}]}]
            })),
        ))
        .expect("valid policy");
    let update = ztunnel.recv().await.unwrap();
    ztunnel
        .ack_nonce(TypeUrl::Authorization, &update.nonce)
        .await
        .unwrap();
    assert_eq!(names(&update), ["ns1/deny-8080"]);
    assert!(update.removed_resources.is_empty(), "{update:?}");
    let deny: Vec<l4::Authorization> = decode_delta(&update).unwrap();
    assert_eq!(deny[0].scope(), l4::Scope::Namespace);
    // The HTTP method is dropped: the DENY applies to every connection to 8080.
    assert_eq!(
        deny[0].groups[0].rules[0].matches[0].destination_ports,
        [8080]
    );

    // The last PeerAuthentication goes: the static STRICT policy is removed.
    assert!(store.delete(Kind::PeerAuthentication, "ns1", "strict"));
    let update = ztunnel.recv().await.unwrap();
    ztunnel
        .ack_nonce(TypeUrl::Authorization, &update.nonce)
        .await
        .unwrap();
    assert!(update.resources.is_empty(), "{update:?}");
    assert_eq!(
        update.removed_resources,
        ["istio-system/istio_converted_static_strict"]
    );
    server.shutdown().await;
}

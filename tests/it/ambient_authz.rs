//! ztunnel's policies over Delta ADS: a client shaped like ztunnel (node type
//! `ztunnel`, a wildcard subscription to `istio.security.Authorization`, ACKs that
//! carry only the type and the nonce) gets the AuthorizationPolicies and
//! PeerAuthentications converted as Istio converts them, then each change as a
//! Delta update: a new policy alone, a deleted one as a removal. And ztunnel's
//! certificates: `CreateCertificate` with `ImpersonatedIdentity` on the secure port,
//! issued for a workload on the caller's node, refused for one on another node and for
//! a caller that is not a trusted node account.

use meshfed::ads::TypeUrl;
use meshfed::testing::{DeltaClient, FakeServer, decode_delta, node};
use meshfed_api::security as l4;
use meshfed_api::security::v1beta1 as sec;
use meshfed_kube::fake_api::{FakeApiServer, objects};
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

/// The next response of `type_url`, ACKed as ztunnel ACKs (type and nonce only);
/// responses of the other type on the way are ACKed and skipped.
async fn next_of(
    ztunnel: &mut DeltaClient,
    type_url: TypeUrl,
) -> envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse {
    loop {
        let r = ztunnel.recv().await.unwrap();
        let t = if r.type_url == type_url.as_str() {
            type_url
        } else if r.type_url == TypeUrl::Address.as_str() {
            TypeUrl::Address
        } else {
            TypeUrl::Authorization
        };
        ztunnel.ack_nonce(t, &r.nonce).await.unwrap();
        if t == type_url {
            return r;
        }
    }
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
    // httpbin's workload (as a registry outside Kubernetes gives it) in ns1.
    let mock = server.mock_registry("mock");
    mock.add_service(crate::support::service(
        "httpbin.mock",
        "ns1",
        &[("tcp", 8000, meshfed_registry::Protocol::Tcp)],
    ));
    let mut ep =
        meshfed_registry::Endpoint::new("10.9.0.1".parse().unwrap()).with_port("tcp", 8000);
    ep.labels.insert("app".into(), "httpbin".into());
    ep.workload = Some(std::sync::Arc::new(meshfed_registry::WorkloadMeta {
        kind: meshfed_registry::WorkloadKind::External,
        name: "httpbin-1".into(),
        namespace: "ns1".into(),
        uid: "mock/mock/ns1/httpbin.mock/httpbin-1".into(),
        workload_name: "httpbin".into(),
        ..Default::default()
    }));
    mock.set_endpoints(
        &meshfed_registry::ServiceKey::new("httpbin.mock", "ns1"),
        vec![ep],
    );
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

    // httpbin's Workload lists the policy selecting it and, its namespace being
    // STRICT, the static STRICT policy.
    ztunnel.subscribe(TypeUrl::Address, &[], &[]).await.unwrap();
    let addresses = ztunnel.recv().await.unwrap();
    assert_eq!(
        addresses.type_url,
        "type.googleapis.com/istio.workload.Address"
    );
    ztunnel
        .ack_nonce(TypeUrl::Address, &addresses.nonce)
        .await
        .unwrap();
    let workload = decode_delta::<meshfed_api::workload::Address>(&addresses)
        .unwrap()
        .into_iter()
        .find_map(|a| match a.r#type {
            Some(meshfed_api::workload::address::Type::Workload(w)) => Some(w),
            _ => None,
        })
        .expect("httpbin's workload");
    assert_eq!(
        workload.authorization_policies,
        [
            "ns1/allow-sleep",
            "istio-system/istio_converted_static_strict"
        ]
    );

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
    let update = next_of(&mut ztunnel, TypeUrl::Authorization).await;
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
    let update = next_of(&mut ztunnel, TypeUrl::Authorization).await;
    assert!(update.resources.is_empty(), "{update:?}");
    assert_eq!(
        update.removed_resources,
        ["istio-system/istio_converted_static_strict"]
    );
    server.shutdown().await;
}

fn impersonating(target: &str) -> meshfed_api::auth::v1::IstioCertificateRequest {
    let key = rcgen::KeyPair::generate().unwrap();
    let csr = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap();
    meshfed_api::auth::v1::IstioCertificateRequest {
        csr,
        metadata: Some(pbjson_types::Struct {
            fields: [(
                "ImpersonatedIdentity".to_string(),
                pbjson_types::Value::from(target.to_string()),
            )]
            .into(),
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn ztunnel_gets_the_certificates_of_its_node_only() {
    use meshfed::testing::{ClientTls, create_certificate, tls_channel};
    let api = FakeApiServer::start().await.unwrap();
    for ns in ["istio-system", "ns1", "ns2"] {
        api.apply(&objects::namespace(ns, &[]));
    }
    api.apply(&objects::node("node-a", "r1", "z1"));
    api.apply(&objects::node("node-b", "r1", "z1"));
    // The test client connects from 127.0.0.1: that is ztunnel-a's pod address.
    api.apply(&objects::pod(
        "istio-system",
        "ztunnel-a",
        "ztunnel",
        "127.0.0.1",
        "node-a",
    ));
    for (ns, app, ip, node) in [
        ("ns1", "app", "10.1.0.1", "node-a"),
        ("ns2", "db", "10.1.0.2", "node-b"),
    ] {
        api.apply(&objects::pod(ns, &format!("{app}-1"), app, ip, node));
        api.apply(&objects::service(ns, app, "10.96.0.1", &[("http", 80)]));
        api.apply(&objects::slice(
            ns,
            &format!("{app}-abc"),
            app,
            &[("http", 8080)],
            &[(ip, &format!("{app}-1"))],
        ));
    }
    let server = crate::secure::kube_mesh(&api).await;
    let root = crate::secure::published_root(&api, "istio-system").await;
    let tls = ClientTls {
        roots_pem: root,
        identity: None,
        server_name: "istiod.istio-system.svc".into(),
    };
    let in_an_hour = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    let bearer = |token: String| {
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert("authorization", format!("Bearer {token}").parse().unwrap());
        md
    };
    let ztunnel = bearer(api.issue_token(
        "istio-system",
        "ztunnel",
        &["istio-ca"],
        in_an_hour,
        Some(("ztunnel-a", "uid-ztunnel-a")),
    ));
    let app = "spiffe://cluster.local/ns/ns1/sa/app";
    let addr = server.secure_grpc_addr();
    let chain = crate::support::eventually("a certificate for app on node-a", || {
        let (tls, md) = (tls.clone(), ztunnel.clone());
        async move {
            let channel = tls_channel(addr, &tls).await.ok()?;
            create_certificate(channel, md, impersonating(app))
                .await
                .ok()
        }
    })
    .await;
    let leaf = pem::parse(&chain.cert_chain[0]).unwrap();
    assert_eq!(meshfed::authn::uri_sans(leaf.contents()).unwrap(), [app]);

    // db runs on node-b: refused.
    let channel = tls_channel(addr, &tls).await.unwrap();
    let status = create_certificate(
        channel,
        ztunnel.clone(),
        impersonating("spiffe://cluster.local/ns/ns2/sa/db"),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("caller's node"), "{status:?}");

    // A caller that is not a trusted node account: refused.
    let other = bearer(api.issue_token("ns1", "app", &["istio-ca"], in_an_hour, None));
    let channel = tls_channel(addr, &tls).await.unwrap();
    let status = create_certificate(channel, other, impersonating(app))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("trusted node account"),
        "{status:?}"
    );

    let metrics = crate::support::http_get(server.bound().monitoring, "/metrics")
        .await
        .1;
    assert!(
        crate::support::metric(&metrics, "citadel_server_authentication_failure_count").unwrap()
            >= 2.0,
        "{metrics}"
    );
    server.shutdown().await;
}

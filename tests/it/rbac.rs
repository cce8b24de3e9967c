//! deploy/rbac.yaml against what meshfed asks an API server for: one scenario runs
//! every watcher (the Kubernetes registry, the Istio config store, remote-cluster
//! Secrets, the `istio` ConfigMap, and a remote cluster found through a Secret) with
//! the role enforced, so a missing rule is a refused request, and every grant of the
//! role must be used by some request, so a rule broader than the code needs fails too.
//! The Kubernetes pieces of the CA, authentication and SDS (TokenReview, the CA's
//! Secrets, root-cert distribution, a followed gateway Secret and its
//! SubjectAccessReview) run beside the server against the same cluster.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshfed::app::{KubeSettings, KubeSource, RemoteSecretSettings};
use meshfed::testing::FakeServer;
use meshfed_kube::fake_api::{
    CustomResource, FakeApiServer, Grant, RecordedRequest, RequestAttributes, objects,
};

use crate::support::*;

const NS: &str = "istio-system";

/// One cluster with a service, its pod, node and slice, and the system namespace.
fn populate(api: &FakeApiServer, vip: &str, ip: &str) {
    api.apply(&objects::namespace(NS, &[]));
    api.apply(&objects::node("node-1", "r1", "z1"));
    api.apply(&objects::service(
        "default",
        "reviews",
        vip,
        &[("http", 80)],
    ));
    api.apply(&objects::pod(
        "default",
        "reviews-1",
        "reviews",
        ip,
        "node-1",
    ));
    api.apply(&objects::slice(
        "default",
        "reviews-abc",
        "reviews",
        &[("http", 9080)],
        &[(ip, "reviews-1")],
    ));
}

/// Runs what meshfed-kube offers the CA and the authenticators against `api`, as
/// the replica that holds the root-cert Lease: a TokenReview, both CA Secrets (the
/// self-signed one created), and root-cert publishing until it has created one
/// ConfigMap and replaced another.
async fn security_pieces(api: &FakeApiServer) {
    let client = api.client();
    crate::webhook::patch_validator_once(api).await;
    let token = api.issue_token(
        "default",
        "reviews",
        &["istio-ca"],
        SystemTime::now() + Duration::from_secs(3600),
        None,
    );
    let account = meshfed_kube::review_token(&client, &token, &["istio-ca".to_string()])
        .await
        .expect("TokenReview allowed");
    assert_eq!(account.service_account, "reviews");
    // SDS: the authorization of a gateway's service account, and one requested
    // Secret followed by name.
    api.grant_access(
        "system:serviceaccount:default:gw",
        "list",
        "secrets",
        "default",
    );
    assert!(
        meshfed_kube::may_list_secrets(&client, "system:serviceaccount:default:gw", "default")
            .await
            .expect("SubjectAccessReview allowed")
    );
    {
        use futures::StreamExt;
        let mut updates = std::pin::pin!(meshfed_kube::follow_secret(
            client.clone(),
            "default",
            "gw-cert"
        ));
        assert_eq!(
            updates.next().await,
            Some(meshfed_kube::SecretUpdate::Absent)
        );
    }
    assert_eq!(meshfed_kube::read_cacerts(&client, NS).await.unwrap(), None);
    meshfed_kube::load_or_create_self_signed(&client, NS, || {
        Ok::<_, String>(("CERT".to_string(), "KEY".to_string()))
    })
    .await
    .expect("self-signed CA stored");

    api.apply(&objects::namespace("default", &[]));
    let mut stale = objects::config_map(NS, "istio-ca-root-cert", &[("root-cert.pem", "OLD")]);
    stale.metadata.labels = Some([("istio.io/config".to_string(), "true".to_string())].into());
    api.apply(&stale);
    let leader = Arc::new(meshfed_kube::LeaseState::default());
    let stats = Arc::new(meshfed_kube::RootCertStats::default());
    let (_root, root) = tokio::sync::watch::channel("ROOT".to_string());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let shutdown = || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let lease = meshfed_kube::LeaseConfig {
        renew_every: Duration::from_millis(100),
        ..meshfed_kube::LeaseConfig::new(NS, "istio-namespace-controller-election", "meshfed-0")
    };
    let tasks = [
        tokio::spawn(meshfed_kube::run_lease(
            client.clone(),
            lease,
            leader.clone(),
            shutdown(),
        )),
        tokio::spawn(meshfed_kube::run_root_cert_publisher(
            client,
            leader,
            root,
            stats.clone(),
            shutdown(),
        )),
    ];
    let stats = &stats;
    eventually(
        "root cert created in default and replaced in the system namespace",
        || async move {
            use meshfed_kube::WriteResult::{Created, Updated};
            (stats.writes(Created) >= 1 && stats.writes(Updated) >= 1).then_some(())
        },
    )
    .await;
    let _ = stop.send(true);
    for task in tasks {
        task.await.unwrap();
    }
}

/// What RBAC saw of each allowed request: `verb group/resource` with its scope.
fn requested(requests: &[RecordedRequest]) -> BTreeSet<String> {
    requests
        .iter()
        .filter(|r| !r.denied)
        .map(|r| match r.attributes() {
            RequestAttributes::Resource {
                verb,
                api_group,
                resource,
                namespace,
                ..
            } => {
                let scope = if namespace.is_empty() {
                    "all namespaces".to_string()
                } else {
                    format!("in {namespace}")
                };
                let group = if api_group.is_empty() {
                    "core"
                } else {
                    &api_group
                };
                format!("{verb} {group}/{resource} {scope}")
            }
            RequestAttributes::NonResource { verb, path } => format!("{verb} {path}"),
        })
        .collect()
}

#[tokio::test]
async fn every_rule_of_deploy_rbac_is_used_and_nothing_meshfed_asks_is_refused() {
    // The local cluster narrows discovery to what deploy/ grants (no default
    // `system:discovery`), so the role's nonResourceURLs rule must carry `discover`.
    let c1 = FakeApiServer::start().await.unwrap();
    let policy = deploy_rbac().without_discovery_defaults();
    c1.enforce(policy.clone());
    let c2 = EnforcedApi::start().await;
    c1.install_crds(CustomResource::istio(&[
        "v1", "v1beta1", "v1alpha3", "v1alpha1",
    ]));
    populate(&c1, "10.96.0.7", "10.1.0.1");
    populate(&c2, "10.97.0.7", "10.2.0.1");
    c1.apply(&objects::config_map(
        NS,
        "istio",
        &[("mesh", "connectTimeout: 7s\n")],
    ));
    c1.apply(&objects::remote_secret(
        NS,
        "istio-remote-secret-c2",
        &[("c2", &c2.kubeconfig())],
    ));

    let client = c1.client();
    let server = FakeServer::builder()
        .cluster_id("c1")
        .configure(move |c| {
            c.kubernetes = Some(KubeSettings {
                source: KubeSource::Client(client),
                namespaces: meshfed_kube::NamespaceFilter::All,
                system_namespace: NS.into(),
                remote_secrets: RemoteSecretSettings::default(),
            });
            // A VM registers on the plaintext port (no identity to check).
            c.workload_entries.validate_identity = false;
            c.workload_entries.grace_period = Duration::from_millis(200);
            // Config status: the leader reads and writes every kind's status.
            c.status = Some(meshfed_kube::status::StatusSettings {
                interval: Duration::from_millis(50),
                ..Default::default()
            });
        })
        .start()
        .await
        .unwrap();
    // One object of every Istio kind (an empty spec: valid or rejected, each gets a
    // status).
    for kind in meshfed_registry::config::Kind::ALL
        .into_iter()
        .filter(|k| !k.is_gateway_api())
    {
        c1.apply_custom(&objects::istio(
            kind.versions()[0],
            kind.as_str(),
            "default",
            "status-probe",
            serde_json::json!({}),
        ));
    }
    // The Gateway API kinds (their CRDs, GatewayClass cluster-scoped), one object each:
    // watched, and their status written from the translation.
    for kind in meshfed_registry::config::Kind::ALL
        .into_iter()
        .filter(|k| k.is_gateway_api())
    {
        let mut crd =
            CustomResource::new(kind.group(), kind.as_str(), kind.plural(), kind.versions());
        crd.namespaced = kind != meshfed_registry::config::Kind::GatewayClass;
        c1.install_crd(crd);
        let spec = match kind {
            meshfed_registry::config::Kind::GatewayClass => {
                serde_json::json!({"controllerName": "istio.io/gateway-controller"})
            }
            meshfed_registry::config::Kind::KubernetesGateway => serde_json::json!({
                "gatewayClassName": "istio",
                "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}],
            }),
            meshfed_registry::config::Kind::ReferenceGrant => serde_json::json!({
                "from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "other"}],
                "to": [{"group": "", "kind": "Service"}],
            }),
            meshfed_registry::config::Kind::BackendTLSPolicy => serde_json::json!({
                "targetRefs": [{"group": "", "kind": "Service", "name": "svc"}],
                "validation": {"wellKnownCACertificates": "System", "hostname": "svc.example.com"},
            }),
            meshfed_registry::config::Kind::TCPRoute | meshfed_registry::config::Kind::TLSRoute => {
                serde_json::json!({"parentRefs": [{"name": "status-probe"}], "rules": [{"backendRefs": [{"name": "svc", "port": 80}]}]})
            }
            _ => serde_json::json!({"parentRefs": [{"name": "status-probe"}]}),
        };
        let mut object = serde_json::json!({
            "apiVersion": kind.api_version(),
            "kind": kind.as_str(),
            "metadata": {"name": "status-probe", "namespace": "default"},
            "spec": spec,
        });
        if kind == meshfed_registry::config::Kind::GatewayClass {
            object["metadata"] = serde_json::json!({"name": "istio"});
        }
        c1.apply_custom(&object);
    }
    let http = server.bound().http;
    let c1_ref = &c1;
    eventually("ready with c2 synced", || async move {
        let denied = c1_ref.denied_requests();
        assert!(denied.is_empty(), "c1 refused:\n{}", describe(&denied));
        if http_get(http, "/ready").await.0 != 200 {
            return None;
        }
        let r = get_json(http, "/debug/registryz").await;
        r["registries"]
            .as_array()?
            .iter()
            .any(|r| r["registry"] == "Kubernetes/c2" && r["synced"] == true)
            .then_some(())
    })
    .await;

    security_pieces(&c1).await;
    crate::autoregistration::register_report_and_leave(&c1, &server).await;

    // Every watcher lists, then watches: wait (bounded) until each grant was used,
    // and name what is left if one never is.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let unused: Vec<Grant> = loop {
        let unused = policy.unused_grants(&c1.requests());
        if unused.is_empty() || tokio::time::Instant::now() >= deadline {
            break unused;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let requests = c1.requests();
    let denied = c1.denied_requests();
    assert!(denied.is_empty(), "c1 refused:\n{}", describe(&denied));
    assert!(
        unused.is_empty(),
        "deploy/rbac.yaml grants what meshfed never asked for:\n  {}\nmeshfed asked for:\n  {}",
        unused
            .iter()
            .map(Grant::to_string)
            .collect::<Vec<_>>()
            .join("\n  "),
        requested(&requests)
            .into_iter()
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    // The remote cluster got reads only, all granted (checked again when c2 drops).
    let c2_denied = c2.denied_requests();
    assert!(
        c2_denied.is_empty(),
        "c2 refused:\n{}",
        describe(&c2_denied)
    );
    assert!(
        c2.requests().iter().all(|r| r.method == "GET"),
        "{}",
        describe(&c2.requests())
    );
    server.shutdown().await;
}

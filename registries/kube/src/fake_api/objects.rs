//! Builders for the Kubernetes objects tests feed the fake API server: the minimal
//! shape the real controllers produce. Tests change fields directly for anything
//! else.

use std::collections::BTreeMap;

/// Types tests name (for [`super::FakeApiServer::delete`], or to read an object back).
pub use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Container, LoadBalancerIngress, LoadBalancerStatus, Namespace, Node, NodeAddress, NodeStatus,
    ObjectReference, Pod, PodIP, PodSpec, PodStatus, Service, ServicePort, ServiceSpec,
    ServiceStatus,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::convert::{LABEL_REGION, LABEL_SERVICE_NAME, LABEL_ZONE};

/// The Kubernetes object types, so tests outside this crate need no k8s-openapi
/// dependency of their own.
pub mod types {
    pub use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, Service};
    pub use k8s_openapi::api::discovery::v1::EndpointSlice;
}

/// Metadata with a namespace (empty for cluster-scoped objects), a name and labels.
pub fn meta(namespace: &str, name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
        labels: (!labels.is_empty()).then(|| {
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        }),
        ..Default::default()
    }
}

/// A Namespace with labels.
pub fn namespace(name: &str, labels: &[(&str, &str)]) -> Namespace {
    Namespace {
        metadata: meta("", name, labels),
        ..Default::default()
    }
}

/// A Node in `region`/`zone` (standard topology labels) with one external IP.
pub fn node(name: &str, region: &str, zone: &str) -> Node {
    Node {
        metadata: meta("", name, &[(LABEL_REGION, region), (LABEL_ZONE, zone)]),
        spec: None,
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "ExternalIP".into(),
                address: "192.0.2.1".into(),
            }]),
            ..Default::default()
        }),
    }
}

/// A remote-cluster secret as `istioctl create-remote-secret` writes it: labelled
/// `istio/multiCluster=true`, one data key per cluster id holding its kubeconfig.
pub fn remote_secret(namespace: &str, name: &str, clusters: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: meta(namespace, name, &[("istio/multiCluster", "true")]),
        data: Some(
            clusters
                .iter()
                .map(|(id, kubeconfig)| {
                    (id.to_string(), ByteString(kubeconfig.as_bytes().to_vec()))
                })
                .collect(),
        ),
        ..Default::default()
    }
}

/// A Secret of `secret_type` (e.g. `kubernetes.io/tls`; empty: none) with these
/// keys.
pub fn secret(namespace: &str, name: &str, secret_type: &str, data: &[(&str, &[u8])]) -> Secret {
    Secret {
        metadata: meta(namespace, name, &[]),
        type_: (!secret_type.is_empty()).then(|| secret_type.to_string()),
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// A ServiceAccount (what a TokenRequest or a token Secret names).
pub fn service_account(namespace: &str, name: &str) -> ServiceAccount {
    ServiceAccount {
        metadata: meta(namespace, name, &[]),
        ..Default::default()
    }
}

/// A ConfigMap with string data (istiod's `istio` ConfigMap: keys `mesh` and
/// `meshNetworks`).
pub fn config_map(namespace: &str, name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: meta(namespace, name, &[]),
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

/// A ClusterIP Service selecting `app=<name>`, each port targeting the same number.
pub fn service(namespace: &str, name: &str, cluster_ip: &str, ports: &[(&str, i32)]) -> Service {
    Service {
        metadata: meta(namespace, name, &[("app", name)]),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some(cluster_ip.to_string()),
            cluster_ips: Some(vec![cluster_ip.to_string()]),
            selector: Some(BTreeMap::from([("app".to_string(), name.to_string())])),
            ports: Some(
                ports
                    .iter()
                    .map(|(port_name, port)| ServicePort {
                        name: Some(port_name.to_string()),
                        port: *port,
                        protocol: Some("TCP".into()),
                        target_port: Some(IntOrString::Int(*port)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    }
}

/// A LoadBalancer Service (like [`service`]) whose load balancer has the ingress IP
/// `ingress_ip`: an east-west gateway's shape.
pub fn load_balancer(
    namespace: &str,
    name: &str,
    cluster_ip: &str,
    ports: &[(&str, i32)],
    ingress_ip: &str,
) -> Service {
    let mut svc = service(namespace, name, cluster_ip, ports);
    if let Some(spec) = svc.spec.as_mut() {
        spec.type_ = Some("LoadBalancer".into());
    }
    svc.status = Some(ServiceStatus {
        load_balancer: Some(LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some(ingress_ip.to_string()),
                ..Default::default()
            }]),
        }),
        ..Default::default()
    });
    svc
}

/// A Running pod at `ip` on `node`, labelled `app=<app>`, with service account
/// `<app>` and the Istio sidecar's `security.istio.io/tlsMode=istio` label.
pub fn pod(namespace: &str, name: &str, app: &str, ip: &str, node: &str) -> Pod {
    Pod {
        metadata: meta(
            namespace,
            name,
            &[("app", app), ("security.istio.io/tlsMode", "istio")],
        ),
        spec: Some(PodSpec {
            node_name: Some(node.to_string()),
            service_account_name: Some(app.to_string()),
            containers: vec![Container {
                name: "app".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(ip.to_string()),
            pod_ips: Some(vec![PodIP { ip: ip.to_string() }]),
            conditions: Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// A ready slice endpoint at `ip`, pointing at pod `pod` when given.
pub fn slice_endpoint(namespace: &str, ip: &str, pod: Option<&str>) -> Endpoint {
    Endpoint {
        addresses: vec![ip.to_string()],
        conditions: Some(EndpointConditions {
            ready: Some(true),
            serving: Some(true),
            terminating: Some(false),
        }),
        target_ref: pod.map(|p| ObjectReference {
            kind: Some("Pod".into()),
            name: Some(p.to_string()),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An IPv4 EndpointSlice of `service` with these ports and `(ip, pod)` endpoints, all
/// ready.
pub fn slice(
    namespace: &str,
    name: &str,
    service: &str,
    ports: &[(&str, i32)],
    endpoints: &[(&str, &str)],
) -> EndpointSlice {
    EndpointSlice {
        metadata: meta(namespace, name, &[(LABEL_SERVICE_NAME, service)]),
        address_type: "IPv4".into(),
        ports: Some(
            ports
                .iter()
                .map(|(port_name, port)| EndpointPort {
                    name: Some(port_name.to_string()),
                    port: Some(*port),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                })
                .collect(),
        ),
        endpoints: endpoints
            .iter()
            .map(|(ip, pod)| slice_endpoint(namespace, ip, Some(pod)))
            .collect(),
    }
}

/// A `networking.istio.io/<version>` object of `kind` (VirtualService, ...) as JSON, for
/// [`FakeApiServer::apply_custom`](super::FakeApiServer::apply_custom).
pub fn istio(
    version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
    spec: serde_json::Value,
) -> serde_json::Value {
    let group = meshfed_registry::config::Kind::from_name(kind)
        .map_or("networking.istio.io", |k| k.group());
    serde_json::json!({
        "apiVersion": format!("{group}/{version}"),
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    })
}

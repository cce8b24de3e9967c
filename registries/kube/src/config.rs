//! What a Kubernetes registry is told at start, the client it reads through, and the
//! errors of both.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use meshfed_registry::{ClusterId, NetworkId, WorkloadEntryFeed};

/// Errors starting a Kubernetes registry or building its client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The registry configuration is unusable (names the field and why).
    #[error("kubernetes registry config: {0}")]
    InvalidConfig(String),
    /// The kubeconfig file given with `--kubeconfig` could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// What went wrong.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither `KUBECONFIG` / `~/.kube/config` nor the in-cluster service account gave a
    /// configuration.
    #[error("no Kubernetes configuration found: {0}")]
    Infer(#[from] kube::config::InferConfigError),
    /// The client could not be built from the configuration (bad TLS material, ...).
    #[error("building the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// This module's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which namespaces' Services, EndpointSlices and Pods become part of the mesh
/// (Istio's discovery selectors / `--appNamespace`). Namespaces and Nodes are always
/// read whole: namespace labels decide selection and the system namespace's network.
///
/// The filter applies to what the registry publishes, not to what it watches, so a
/// namespace whose labels start matching shows its services at once without a relist.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum NamespaceFilter {
    /// Every namespace.
    #[default]
    All,
    /// Only these namespaces (by name).
    Names(BTreeSet<String>),
    /// Namespaces whose labels match at least one selector (Istio `discoverySelectors`).
    /// An empty list selects every namespace, as in Istio.
    Selectors(Vec<LabelSelector>),
}

impl NamespaceFilter {
    /// Whether a namespace with this name and these labels is selected. `labels` is
    /// `None` while the Namespace object is unknown: a selector filter then does not
    /// select it (Istio behaves the same until the namespace informer has it).
    pub fn selects(&self, name: &str, labels: Option<&BTreeMap<String, String>>) -> bool {
        match self {
            NamespaceFilter::All => true,
            NamespaceFilter::Names(names) => names.contains(name),
            NamespaceFilter::Selectors(selectors) if selectors.is_empty() => true,
            NamespaceFilter::Selectors(selectors) => {
                labels.is_some_and(|labels| selectors.iter().any(|s| selector_matches(s, labels)))
            }
        }
    }

    fn validate(&self) -> Result<()> {
        let NamespaceFilter::Selectors(selectors) = self else {
            return Ok(());
        };
        for requirement in selectors
            .iter()
            .flat_map(|s| s.match_expressions.iter().flatten())
        {
            let values = requirement.values.as_deref().unwrap_or_default();
            match requirement.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(Error::InvalidConfig(format!(
                        "discovery selector on {:?}: operator {} needs values",
                        requirement.key, requirement.operator
                    )));
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(Error::InvalidConfig(format!(
                        "discovery selector on {:?}: operator {} takes no values",
                        requirement.key, requirement.operator
                    )));
                }
                "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
                other => {
                    return Err(Error::InvalidConfig(format!(
                        "discovery selector on {:?}: unknown operator {other:?} \
                         (In, NotIn, Exists, DoesNotExist)",
                        requirement.key
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Kubernetes label selector semantics: every `matchLabels` pair and every expression
/// must hold. An unknown operator never matches (validation rejects it up front).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    labels_ok
        && selector.match_expressions.iter().flatten().all(|r| {
            let values = r.values.as_deref().unwrap_or_default();
            let value = labels.get(&r.key);
            match r.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

/// How a Kubernetes registry converts what it reads.
#[derive(Clone, Debug, PartialEq)]
pub struct KubeRegistryConfig {
    /// The cluster this registry reads (`--clusterID`; Istio's default `Kubernetes`).
    /// Names the endpoint shard `Kubernetes/<cluster_id>`, the services' VIP map key and
    /// every endpoint's cluster.
    pub cluster_id: ClusterId,
    /// DNS suffix of service hostnames (`--domain`, default `cluster.local`):
    /// `name.namespace.svc.<domain>`.
    pub domain: String,
    /// Trust domain of the SPIFFE identities built from service accounts
    /// (`spiffe://<trust_domain>/ns/<ns>/sa/<sa>`, default `cluster.local`).
    pub trust_domain: String,
    /// The control plane's namespace (default `istio-system`); its
    /// `topology.istio.io/network` label is the cluster's default network.
    pub system_namespace: String,
    /// Which namespaces are part of the mesh.
    pub namespaces: NamespaceFilter,
    /// The meshNetworks `registryServiceName` gateways this cluster resolves (read at
    /// every use, so a meshNetworks reload applies without a restart).
    pub mesh_gateways: MeshGateways,
    /// The WorkloadEntries this cluster's Services select (Istio's
    /// `PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES`): the config cluster's registry gets
    /// the ServiceEntry registry's feed; remote clusters none.
    pub workload_entries: WorkloadEntryFeed,
    /// Every pod is a workload of the ambient Address type, whether or not a Service
    /// selects it: the registry's workloads list them all, and a change to pods that
    /// touches no Service's endpoints is pushed on its own. The server's Kubernetes
    /// source sets it; off, only the pods behind Services are workloads.
    pub ambient_workloads: bool,
}

impl Default for KubeRegistryConfig {
    fn default() -> Self {
        KubeRegistryConfig {
            cluster_id: ClusterId::new("Kubernetes"),
            domain: "cluster.local".to_string(),
            trust_domain: "cluster.local".to_string(),
            system_namespace: "istio-system".to_string(),
            namespaces: NamespaceFilter::All,
            mesh_gateways: MeshGateways::none(),
            workload_entries: WorkloadEntryFeed::none(),
            ambient_workloads: false,
        }
    }
}

/// A meshNetworks gateway given by `registryServiceName`: the service whose external
/// addresses (LoadBalancer ingress, `externalIPs`) lead into `network`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub struct GatewayServiceRef {
    /// The network behind the gateway.
    pub network: NetworkId,
    /// The gateway service's hostname (`istio-eastwestgateway.istio-system.svc.cluster.local`).
    pub hostname: String,
    /// The gateway's mTLS port (meshNetworks `port`).
    pub port: u16,
}

type MeshGatewaysFn = dyn Fn(&ClusterId) -> Vec<GatewayServiceRef> + Send + Sync;

/// Where a registry reads the meshNetworks `registryServiceName` gateways that apply to
/// its cluster: Istio honours such an entry only in the registries of the clusters the
/// network lists under `fromRegistry`. A function, so that the caller (which follows the
/// meshNetworks file) answers with the current content.
#[derive(Clone)]
pub struct MeshGateways(Option<Arc<MeshGatewaysFn>>);

impl MeshGateways {
    /// No meshNetworks gateways.
    pub fn none() -> Self {
        MeshGateways(None)
    }

    /// Gateways from `lookup(cluster id)`.
    pub fn new(
        lookup: impl Fn(&ClusterId) -> Vec<GatewayServiceRef> + Send + Sync + 'static,
    ) -> Self {
        MeshGateways(Some(Arc::new(lookup)))
    }

    /// A fixed list, whatever the cluster (tests).
    pub fn fixed(gateways: Vec<GatewayServiceRef>) -> Self {
        MeshGateways::new(move |_| gateways.clone())
    }

    /// The gateways `cluster` must resolve.
    pub fn for_cluster(&self, cluster: &ClusterId) -> Vec<GatewayServiceRef> {
        self.0.as_ref().map(|f| f(cluster)).unwrap_or_default()
    }
}

impl Default for MeshGateways {
    fn default() -> Self {
        MeshGateways::none()
    }
}

impl fmt::Debug for MeshGateways {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "MeshGateways(..)"
        } else {
            "MeshGateways(none)"
        })
    }
}

/// Two sources are equal when they are the same function (or both absent).
impl PartialEq for MeshGateways {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl KubeRegistryConfig {
    /// The defaults for the cluster `cluster_id`.
    pub fn new(cluster_id: impl Into<ClusterId>) -> Self {
        KubeRegistryConfig {
            cluster_id: cluster_id.into(),
            ..Self::default()
        }
    }

    /// Rejects settings that would produce nonsense names.
    pub fn validate(&self) -> Result<()> {
        if self.cluster_id.is_empty() {
            return Err(Error::InvalidConfig("cluster id is empty".into()));
        }
        for (field, value) in [
            ("domain", &self.domain),
            ("trust domain", &self.trust_domain),
        ] {
            if value.is_empty() || value.starts_with('.') || value.ends_with('.') {
                return Err(Error::InvalidConfig(format!(
                    "{field} {value:?}: expected a DNS suffix such as cluster.local"
                )));
            }
        }
        self.namespaces.validate()
    }
}

/// A client for the cluster: the kubeconfig file `kubeconfig` when given (its current
/// context), else the `KUBECONFIG` variable or `~/.kube/config`, else the in-cluster
/// service account (`KUBERNETES_SERVICE_HOST` and the mounted token), in that order.
pub async fn client_from(kubeconfig: Option<&Path>) -> Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let wrap = |source| Error::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(wrap)?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(wrap)?
        }
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors_follow_kubernetes_semantics() {
        let selector = LabelSelector {
            match_labels: Some(labels(&[("mesh", "on")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: Some(vec!["infra".into()]),
            }]),
        };
        assert!(selector_matches(&selector, &labels(&[("mesh", "on")])));
        assert!(!selector_matches(
            &selector,
            &labels(&[("mesh", "on"), ("tier", "infra")])
        ));
        assert!(!selector_matches(&selector, &labels(&[("mesh", "off")])));
        let filter = NamespaceFilter::Selectors(vec![selector]);
        assert!(filter.selects("a", Some(&labels(&[("mesh", "on")]))));
        assert!(
            !filter.selects("a", None),
            "unknown namespace is not selected"
        );
        assert!(NamespaceFilter::Selectors(vec![]).selects("a", None));
        let names = NamespaceFilter::Names(BTreeSet::from(["a".to_string()]));
        assert!(names.selects("a", None) && !names.selects("b", None));
    }

    #[test]
    fn validation_names_the_problem() {
        let mut config = KubeRegistryConfig::new("c1");
        assert!(config.validate().is_ok());
        config.domain = ".local".into();
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("domain")
        );
        let config = KubeRegistryConfig {
            namespaces: NamespaceFilter::Selectors(vec![LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "k".into(),
                    operator: "Like".into(),
                    values: None,
                }]),
            }]),
            ..KubeRegistryConfig::new("c1")
        };
        assert!(config.validate().unwrap_err().to_string().contains("Like"));
    }
}

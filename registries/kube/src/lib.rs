//! meshfed's Kubernetes registry: the only crate that talks to a Kubernetes API server.
//!
//! [`KubeRegistry::start`] watches Services, EndpointSlices, Pods, Nodes and Namespaces
//! of one cluster with kube-runtime watchers (list, then watch from the listed
//! resourceVersion; resume after a dropped connection; relist after `410 Gone`; retry
//! with backoff) and turns them into the mesh model as Istio's Kubernetes registry
//! does (reference §2). One writer task owns the watchers and all state; the returned
//! [`KubeRegistry`] is the read side the aggregate holds, a snapshot swapped in
//! atomically.
//!
//! - [`config`]: [`KubeRegistryConfig`], the namespace filter, [`client_from`].
//! - [`convert`]: the pure object conversions (protocol detection, health, ...).
//! - [`registry`]: the read handle and its counters ([`KubeStats`]).
//! - [`multicluster`]: the remote-cluster secret controller ([`SecretController`]),
//!   one more registry per kubeconfig Secret.
//! - [`token_review`]: Kubernetes JWT authentication through a `TokenReview`
//!   ([`review_token`]).
//! - [`ca_secret`]: the CA's key material in Secrets (`cacerts`, `istio-ca-secret`).
//! - [`secrets`]: gateway credentials (SDS): one requested Secret followed by name,
//!   and the `SubjectAccessReview` that authorizes a proxy to read them.
//! - [`root_cert`]: the root certificate published to every namespace
//!   (ConfigMap `istio-ca-root-cert`) by the leader.
//! - [`source`]: the registry as the server starts it ([`KubeKind`]: `--registries
//!   Kubernetes` and its flags; [`KubeSettings`]; [`KubeCluster`], the client it hands
//!   back).
//! - [`remote_secret`]: `meshfed create-remote-secret`, the kubeconfig Secret another
//!   control plane reads this cluster with; [`vm_bootstrap`]: what `meshfed vm
//!   bootstrap` reads; [`cli_client`]: the client of those commands; [`go_yaml`]: YAML
//!   as kubectl and istioctl print it.
//! - `fake_api` (feature `test-support`): a fake API server speaking the real wire
//!   format, for tests here and in the crates that use this one.

pub mod ca_secret;
pub mod cli_client;
pub mod config;
pub mod config_map;
pub mod convert;
pub mod duty;
#[cfg(feature = "test-support")]
pub mod fake_api;
pub mod go_yaml;
pub mod lease;
pub mod multicluster;
pub mod registry;
pub mod remote_secret;
mod resource_kind;
pub mod root_cert;
pub mod secrets;
pub mod source;
mod state;
pub mod status;
pub mod token_review;
pub mod vm_bootstrap;
pub mod webhook_config;
pub mod workload_entry_writer;
mod writer;

pub use ca_secret::{CaSecretError, CacertsPems, load_or_create_self_signed, read_cacerts};
pub use config::{
    Error, GatewayServiceRef, KubeRegistryConfig, MeshGateways, NamespaceFilter, Result,
    client_from,
};
/// The Kubernetes client type, re-exported so other crates need no kube dependency.
pub use config_map::{ConfigMapUpdate, follow_config_map};
pub use convert::{ConversionError, ExternalAddress, KubeAttributes, ServiceType, TargetPort};
pub use duty::{Duties, Duty, DutyState};
pub use kube::Client;
pub use lease::{LeaseConfig, LeaseState, run_lease};
pub use multicluster::{
    KubeconfigPolicy, MulticlusterConfig, MulticlusterStats, RemoteClusterStatus, SecretController,
};
pub use registry::{EventType, KubeRegistry, KubeStats, ResourceKind, SyncPhase};
pub use root_cert::{RootCertStats, WriteResult, run_root_cert_publisher};
pub use secrets::{SecretData, SecretUpdate, follow_secret, may_list_secrets};
pub use token_review::{ReviewedAccount, TokenReviewError, review_token};
pub mod crd;
pub use crd::{KubeConfigStats, KubeConfigStore, KubeConfigStoreConfig, run_kube_config};
pub use source::{KubeArgs, KubeCluster, KubeKind, KubeSettings, KubeSource, RemoteSecretSettings};
pub use webhook_config::{
    DryRunProbe, FailCloseProbe, WebhookConfigSettings, WebhookConfigStats,
    run_webhook_config_patcher,
};
pub use workload_entry_writer::{EntryWriteError, WorkloadEntryWriter};

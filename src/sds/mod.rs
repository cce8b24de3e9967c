//! SDS over ADS for gateway credentials (reference §2, istiod's `xds/sds.go`): type
//! `envoy.extensions.transport_sockets.tls.v3.Secret`, for the names of [`name`], to
//! proxies with a verified identity only.
//!
//! - Sources: Kubernetes Secrets, each requested one followed by name
//!   ([`meshfed_kube::follow_secret`]) in the proxy's cluster (its `CLUSTER_ID`, a
//!   remote cluster through the multicluster controller) and the config cluster, and
//!   `kind: Secret` objects of the config directory
//!   ([`meshfed_registry::config::secret`], read from the [`FileConfigStore`]).
//!   `configmap://` CAs come from ConfigMaps: in the config cluster only, each followed
//!   by name ([`meshfed_kube::follow_config_map`]), and `kind: ConfigMap` objects of
//!   the config directory; their `cacert` or `ca.crt` key is the CA, as a Secret's.
//! - Authorization: [`Sds::prepare`] runs before each SDS answer or push; it asks the
//!   API server (`SubjectAccessReview`, cached 5 min when allowed, 1 min when denied)
//!   whether the proxy's service account may list the Secrets of its namespace, and
//!   starts following what the proxy may read. Generation ([`Sds::generate`]) then
//!   works from what is known, synchronously. Denied names are dropped (one warning,
//!   no NACK).
//! - Formats: [`format`]; a Secret that is not sendable is skipped, warned about once
//!   and shown in `/debug/sdsz`.
//! - Pushes: a change of Secret `ns/name` is a push request naming it
//!   ([`ConfigKind::Secret`]; a followed CA ConfigMap's change is announced the same
//!   way, under its namespace and name); [`crate::xds::deps`] confines it to SDS and
//!   [`Sds::wants`] to the connections that requested it or its `-cacert` twin.

pub mod format;
pub mod name;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3 as tls;
use futures::StreamExt;
use meshfed_kube::{ConfigMapUpdate, SecretData, SecretUpdate};
use meshfed_registry::config::FileConfigStore;
use meshfed_registry::{ClusterId, ConfigKey, ConfigKind, PushRequest, TriggerReason, UpdateSink};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Serialize;
use serde_json::{Value, json};
use tracing::{debug, warn};

use crate::drain::Shutdown;
use crate::model::Proxy;
use crate::push::snapshot::Snapshot;
use crate::xds::deps::PushScope;
use crate::xds::{EncodedResource, Resource, TypeUrl};
use name::{Scheme, SecretName};

/// How long an allowed `SubjectAccessReview` answer is kept.
pub const ALLOWED_TTL: Duration = Duration::from_secs(5 * 60);
/// How long a denied one is kept.
pub const DENIED_TTL: Duration = Duration::from_secs(60);

/// Where a Secret came from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// A Kubernetes cluster.
    Cluster(ClusterId),
    /// The `--configDir` directory.
    ConfigDir,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Cluster(c) => write!(f, "cluster {c}"),
            Source::ConfigDir => f.write_str("configDir"),
        }
    }
}

/// Which kind of object holds a credential.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Holder {
    Secret,
    /// A CA-only ConfigMap (`configmap://`).
    ConfigMap,
}

impl Holder {
    fn of(scheme: Scheme) -> Holder {
        match scheme {
            Scheme::ConfigMap => Holder::ConfigMap,
            Scheme::Kubernetes | Scheme::KubernetesGateway => Holder::Secret,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Holder::Secret => "Secret",
            Holder::ConfigMap => "ConfigMap",
        }
    }
}

/// One Secret (or CA ConfigMap) of one source.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SecretKey {
    pub holder: Holder,
    pub source: Source,
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}/{} ({})",
            self.holder.as_str(),
            self.namespace,
            self.name,
            self.source
        )
    }
}

/// Why a requested name is not sent to a proxy (authorization; dropped without a
/// NACK, logged once).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The connection has no verified identity: the plaintext port.
    #[error("no verified identity (plaintext port)")]
    NoIdentity,
    /// `kubernetes://` names the Secret of another namespace.
    #[error("Secret namespace {secret} is not the proxy's namespace {proxy}")]
    OtherNamespace { secret: String, proxy: String },
    /// The SubjectAccessReview denied the proxy's service account.
    #[error("SubjectAccessReview: {user} may not list secrets in {namespace}")]
    Denied { user: String, namespace: String },
    /// The SubjectAccessReview could not be made (see the log).
    #[error("SubjectAccessReview failed")]
    ReviewFailed,
    /// `kubernetes-gateway://` names a credential no Gateway of the proxy references.
    #[error("no Gateway of the proxy references this credential")]
    NotReferenced,
}

/// Why an authorized name is not served (counted in
/// `pilot_sds_certificate_errors_total`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ServeError {
    /// Not a name istiod serves.
    #[error(transparent)]
    Name(#[from] name::NameError),
    /// No source has the Secret (or ConfigMap: `holder`).
    #[error("{holder} {namespace}/{names} not found")]
    NotFound {
        holder: &'static str,
        namespace: String,
        names: String,
    },
    /// The Secret's (or ConfigMap's) content cannot be served.
    #[error("{key}: {error}")]
    Format {
        key: SecretKey,
        error: format::FormatError,
    },
}

/// The Kubernetes clusters Secrets are read from.
#[derive(Clone)]
pub struct KubeSecrets {
    /// The config cluster (`--clusterID`) and its client.
    pub config_cluster: ClusterId,
    pub local: meshfed_kube::Client,
    /// Remote clusters, when multicluster is on.
    pub remote: Option<Arc<meshfed_kube::SecretController>>,
}

impl fmt::Debug for KubeSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeSecrets")
            .field("config_cluster", &self.config_cluster)
            .finish_non_exhaustive()
    }
}

impl KubeSecrets {
    fn client_for(&self, cluster: &ClusterId) -> Option<meshfed_kube::Client> {
        if *cluster == self.config_cluster {
            return Some(self.local.clone());
        }
        self.remote.as_ref()?.client_for(cluster)
    }
}

/// SDS metrics.
#[derive(Debug, Default)]
pub struct SdsMetrics {
    /// `pilot_sds_certificate_errors_total`: requested names not served because the
    /// name, the Secret or its content was wrong.
    pub errors: Counter,
    /// `meshfed_sds_expired_certificates_served_total`: certificates served past their
    /// `notAfter` (served all the same, as istiod).
    pub expired: Counter,
    /// `meshfed_wasm_pull_secrets_withheld_total{plugin}`: ECDS answers whose
    /// WasmPlugin pull Secret was sent empty (not authorized, missing or malformed).
    pub pull_withheld: Family<Vec<(String, String)>, Counter>,
}

impl SdsMetrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &mut Registry) -> Self {
        let m = SdsMetrics::default();
        registry.register(
            "pilot_sds_certificate_errors",
            "Total number of failures to fetch SDS key and certificate",
            m.errors.clone(),
        );
        registry.register(
            "meshfed_sds_expired_certificates_served",
            "Certificates served over SDS although expired",
            m.expired.clone(),
        );
        registry.register(
            "meshfed_wasm_pull_secrets_withheld",
            "WasmPlugin image pull Secrets sent empty in ECDS (not authorized, missing or not a dockerconfigjson Secret)",
            m.pull_withheld.clone(),
        );
        m
    }
}

/// What one connection asked for and got (for `/debug/sdsz`).
#[derive(Clone, Debug, Default, Serialize)]
struct ProxyStatus {
    requested: BTreeSet<String>,
    served: BTreeSet<String>,
    /// Not authorized: name -> why.
    denied: BTreeMap<String, String>,
    /// Not served for another reason: name -> why.
    errors: BTreeMap<String, String>,
}

/// One followed Kubernetes Secret.
#[derive(Debug)]
struct Followed {
    /// Whether the watch's initial list is done.
    synced: bool,
    /// Stops the watch.
    task: tokio::task::AbortHandle,
}

#[derive(Debug, Default)]
struct State {
    secrets: BTreeMap<SecretKey, Arc<SecretData>>,
    /// Followed Kubernetes Secrets.
    followed: BTreeMap<SecretKey, Followed>,
    /// What each connection's requests follow (a Secret no connection needs any more
    /// is no longer followed).
    wanted: BTreeMap<String, BTreeSet<SecretKey>>,
    /// `SubjectAccessReview` answers: (cluster, user, namespace) -> (allowed, when).
    reviews: HashMap<(ClusterId, String, String), (bool, Instant)>,
    /// Secrets that cannot be served, and why.
    errors: BTreeMap<SecretKey, String>,
    /// Warnings already written.
    warned: HashSet<String>,
    proxies: BTreeMap<String, ProxyStatus>,
}

/// The SDS server state shared by every connection.
#[derive(Debug)]
pub struct Sds {
    kube: Option<KubeSecrets>,
    /// The config directory (`--configDir`), when there is one.
    config_dir: Option<FileConfigStore>,
    /// The config cluster (`--clusterID`).
    config_cluster: ClusterId,
    sink: UpdateSink,
    shutdown: Shutdown,
    metrics: SdsMetrics,
    state: Arc<Mutex<State>>,
}

/// The namespace and service account of a verified identity.
fn identity(proxy: &Proxy) -> Option<(String, String)> {
    let id = crate::authn::parse_spiffe(proxy.verified_identity.as_deref()?)?;
    Some((id.namespace.to_string(), id.service_account.to_string()))
}

impl Sds {
    /// An SDS server reading Kubernetes through `kube` (when given) and announcing
    /// Secret changes on `sink`.
    pub fn new(
        config_cluster: ClusterId,
        kube: Option<KubeSecrets>,
        config_dir: Option<FileConfigStore>,
        sink: UpdateSink,
        shutdown: Shutdown,
        metrics: SdsMetrics,
    ) -> Self {
        Sds {
            kube,
            config_dir,
            config_cluster,
            sink,
            shutdown,
            metrics,
            state: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("sds state poisoned")
    }

    /// Whether a push of `scope` changes SDS for a proxy that requested `names`: any
    /// push touching SDS does, unless it names Secrets only and none of them is one
    /// of `names` (or a `-cacert` twin).
    pub fn wants(scope: &PushScope<'_>, proxy: &Proxy, names: &BTreeSet<String>) -> bool {
        let request = scope.request();
        let only_secrets = !request.forced
            && !request.configs_updated.is_empty()
            && request
                .configs_updated
                .iter()
                .all(|k| k.kind == ConfigKind::Secret);
        if !only_secrets {
            return true;
        }
        let Some((namespace, _)) = identity(proxy) else {
            return false;
        };
        names
            .iter()
            .filter_map(|n| SecretName::parse(n, &namespace).ok())
            .any(|n| {
                request
                    .configs_updated
                    .iter()
                    .any(|k| n.reads(&k.namespace, &k.name))
            })
    }

    /// The clusters a `scheme` name of `proxy` is looked up in, in order.
    fn clusters(&self, scheme: Scheme, proxy: &Proxy) -> Vec<ClusterId> {
        let mut out = Vec::new();
        if scheme == Scheme::Kubernetes
            && let Some(c) = &proxy.cluster_id
        {
            out.push(c.clone());
        }
        if !out.contains(&self.config_cluster) {
            out.push(self.config_cluster.clone());
        }
        out
    }

    /// The cluster whose API server reviews `proxy`'s access: its own when known.
    fn review_cluster(&self, proxy: &Proxy) -> ClusterId {
        let kube = self.kube.as_ref();
        match &proxy.cluster_id {
            Some(c) if kube.is_some_and(|k| k.client_for(c).is_some()) => c.clone(),
            _ => self.config_cluster.clone(),
        }
    }

    /// Gets ready to answer `names` for `proxy`: asks the API server what is not
    /// known of its access, and follows the Secrets it may read.
    pub async fn prepare(
        &self,
        connection: &str,
        snapshot: &Snapshot,
        proxy: &Proxy,
        names: &BTreeSet<String>,
    ) {
        let (Some((namespace, sa)), Some(kube)) = (identity(proxy), &self.kube) else {
            return;
        };
        let mut wanted = BTreeSet::new();
        let user = format!("system:serviceaccount:{namespace}:{sa}");
        let review_cluster = self.review_cluster(proxy);
        for resource in names {
            let Ok(name) = SecretName::parse(resource, &namespace) else {
                continue;
            };
            if name.scheme == Scheme::Kubernetes && name.namespace == namespace && !name.ca_only {
                self.review(kube, &review_cluster, &user, &namespace).await;
            }
            if self.allowed(snapshot, proxy, &name).is_err() {
                continue;
            }
            for cluster in self.clusters(name.scheme, proxy) {
                for candidate in name.candidates() {
                    let key = SecretKey {
                        holder: Holder::of(name.scheme),
                        source: Source::Cluster(cluster.clone()),
                        namespace: name.namespace.clone(),
                        name: candidate,
                    };
                    self.follow(kube, key.clone());
                    wanted.insert(key);
                }
            }
        }
        let mut state = self.lock();
        state.wanted.insert(connection.to_string(), wanted);
        unfollow_unwanted(&mut state);
    }

    /// Asks `cluster`'s API server whether `user` may list Secrets in `namespace`,
    /// unless a fresh answer is known.
    async fn review(&self, kube: &KubeSecrets, cluster: &ClusterId, user: &str, namespace: &str) {
        let key = (cluster.clone(), user.to_string(), namespace.to_string());
        if let Some((allowed, at)) = self.lock().reviews.get(&key)
            && fresh(*allowed, at.elapsed())
        {
            return;
        }
        let Some(client) = kube.client_for(cluster) else {
            return;
        };
        match meshfed_kube::may_list_secrets(&client, user, namespace).await {
            Ok(allowed) => {
                self.lock().reviews.insert(key, (allowed, Instant::now()));
            }
            Err(err) => {
                // Not cached (and an expired answer is not kept): the next request
                // asks again.
                self.lock().reviews.remove(&key);
                self.warn_once(
                    format!("review {cluster} {user} {err}"),
                    |_| warn!(%cluster, %user, %namespace, error = %err, "SDS: SubjectAccessReview failed; the Secrets are withheld"),
                );
            }
        }
    }

    /// Starts following `key` (a Kubernetes Secret) unless already followed.
    fn follow(&self, kube: &KubeSecrets, key: SecretKey) {
        let Source::Cluster(cluster) = &key.source else {
            return;
        };
        let Some(client) = kube.client_for(cluster) else {
            return;
        };
        let mut followed = self.lock();
        if followed.followed.contains_key(&key) {
            return;
        }
        debug!(secret = %key, "SDS: following");
        let updates = match key.holder {
            Holder::Secret => {
                meshfed_kube::follow_secret(client, &key.namespace, &key.name).boxed()
            }
            Holder::ConfigMap => meshfed_kube::follow_config_map(client, &key.namespace, &key.name)
                .map(|update| match update {
                    ConfigMapUpdate::Data(data) => SecretUpdate::Present(config_map_data(&data)),
                    ConfigMapUpdate::Absent => SecretUpdate::Absent,
                    ConfigMapUpdate::Error(error) => SecretUpdate::Error(error),
                })
                .boxed(),
        };
        let mut shutdown = self.shutdown.clone();
        let state = self.state.clone();
        let sink = self.sink.clone();
        let task_key = key.clone();
        let task = tokio::spawn(async move {
            let key = task_key;
            let stop = Box::pin(async move { shutdown.wait().await });
            let mut updates = std::pin::pin!(updates.take_until(stop));
            while let Some(update) = updates.next().await {
                let data = match update {
                    SecretUpdate::Present(data) => Some(data),
                    SecretUpdate::Absent => None,
                    SecretUpdate::Error(error) => {
                        debug!(secret = %key, %error, "SDS: watch error; retrying");
                        continue;
                    }
                };
                let changed = {
                    let mut state = state.lock().expect("sds state poisoned");
                    let Some(followed) = state.followed.get_mut(&key) else {
                        // No longer followed.
                        return;
                    };
                    let first = !std::mem::replace(&mut followed.synced, true);
                    let changed = match data {
                        Some(data) => state
                            .secrets
                            .insert(key.clone(), Arc::new(data.clone()))
                            .is_none_or(|old| *old != data),
                        None => state.secrets.remove(&key).is_some(),
                    };
                    first || changed
                };
                if changed {
                    announce(&sink, &key.namespace, &key.name);
                }
            }
        });
        followed.followed.insert(
            key,
            Followed {
                synced: false,
                task: task.abort_handle(),
            },
        );
    }

    /// Whether `proxy` may read `name` (from what [`Sds::prepare`] learnt).
    fn authorize(&self, proxy: &Proxy, name: &SecretName) -> Result<(), Refusal> {
        let Some((namespace, sa)) = identity(proxy) else {
            return Err(Refusal::NoIdentity);
        };
        match name.scheme {
            Scheme::Kubernetes => {
                if name.namespace != namespace {
                    return Err(Refusal::OtherNamespace {
                        secret: name.namespace.clone(),
                        proxy: namespace,
                    });
                }
                if name.ca_only || self.kube.is_none() {
                    return Ok(());
                }
                let user = format!("system:serviceaccount:{namespace}:{sa}");
                let key = (self.review_cluster(proxy), user, namespace);
                let answer = self.lock().reviews.get(&key).map(|(allowed, _)| *allowed);
                let (_, user, namespace) = key;
                match answer {
                    Some(true) => Ok(()),
                    Some(false) => Err(Refusal::Denied { user, namespace }),
                    None => Err(Refusal::ReviewFailed),
                }
            }
            Scheme::KubernetesGateway => Err(Refusal::NotReferenced),
            // A CA is public; the ConfigMap is the server's, in another namespace than
            // the client's as a rule (istiod allows every ConfigMap alike).
            Scheme::ConfigMap => Ok(()),
        }
    }

    /// Whether `proxy` may read `name`: [`Sds::authorize`], and for
    /// `kubernetes-gateway://` a Gateway of the proxy referencing it.
    fn allowed(
        &self,
        snapshot: &Snapshot,
        proxy: &Proxy,
        name: &SecretName,
    ) -> Result<(), Refusal> {
        match name.scheme {
            Scheme::KubernetesGateway if identity(proxy).is_some() => {
                if Self::referenced(snapshot, proxy, name) {
                    Ok(())
                } else {
                    Err(Refusal::NotReferenced)
                }
            }
            _ => self.authorize(proxy, name),
        }
    }

    /// Whether a server of the Gateways merged for `proxy` names `resource` (without
    /// `-cacert`) as its `credentialName`.
    fn referenced(snapshot: &Snapshot, proxy: &Proxy, name: &SecretName) -> bool {
        let targets = crate::generate::merged_gateway::gateway_targets(snapshot, proxy);
        let view = snapshot.proxy_view(proxy);
        let merged =
            crate::generate::merged_gateway::MergedGateway::build(snapshot, &view.labels, &targets);
        merged
            .servers
            .iter()
            .filter_map(|s| s.server().tls.as_ref())
            .filter(|tls| !tls.credential_name.is_empty())
            .filter_map(|tls| {
                SecretName::parse(&name::from_credential_name(&tls.credential_name), "").ok()
            })
            .any(|c| {
                c.scheme == name.scheme && c.namespace == name.namespace && c.name == name.name
            })
    }

    fn warn_once(&self, key: String, log: impl FnOnce(&str)) {
        let fresh = self.lock().warned.insert(key.clone());
        if fresh {
            log(&key);
        }
    }

    /// The Secret resources `connection` (of `proxy`) requested in `names`: the ones
    /// it may read and that exist and are sound.
    pub fn generate(
        &self,
        connection: &str,
        snapshot: &Snapshot,
        proxy: &Proxy,
        names: &BTreeSet<String>,
    ) -> Vec<Resource> {
        let mut status = ProxyStatus {
            requested: names.clone(),
            ..Default::default()
        };
        let Some((namespace, _)) = identity(proxy) else {
            if !names.is_empty() {
                self.warn_once(format!("plaintext {connection}"), |_| {
                    warn!(%connection, "SDS: Secrets are served on the secure port only (no verified identity); sending none")
                });
                for n in names {
                    status
                        .denied
                        .insert(n.clone(), Refusal::NoIdentity.to_string());
                }
            }
            self.lock().proxies.insert(connection.to_string(), status);
            return Vec::new();
        };
        let now = SystemTime::now();
        let mut out = Vec::new();
        for resource in names {
            let name = match SecretName::parse(resource, &namespace) {
                Ok(name) => name,
                Err(err) => {
                    self.metrics.errors.inc();
                    status
                        .errors
                        .insert(resource.clone(), ServeError::Name(err).to_string());
                    continue;
                }
            };
            if let Err(why) = self.allowed(snapshot, proxy, &name) {
                self.warn_once(format!("denied {connection} {resource}"), |_| {
                    warn!(%connection, resource = %resource, reason = %why, "SDS: proxy is not authorized for the Secret; not sent")
                });
                status.denied.insert(resource.clone(), why.to_string());
                continue;
            }
            match self.read(proxy, &name, now) {
                Ok(Some(secret)) => {
                    out.push(EncodedResource::encode(
                        TypeUrl::Secret,
                        resource.as_str(),
                        &tls::Secret {
                            name: resource.clone(),
                            r#type: Some(secret),
                        },
                    ));
                    status.served.insert(resource.clone());
                }
                Ok(None) => {
                    status
                        .errors
                        .insert(resource.clone(), "waiting for the Secret to be read".into());
                }
                Err(err) => {
                    self.metrics.errors.inc();
                    status.errors.insert(resource.clone(), err.to_string());
                }
            }
        }
        self.lock().proxies.insert(connection.to_string(), status);
        out
    }

    /// The content of `name` for `proxy`: `Ok(None)` while Kubernetes has not
    /// answered yet; an error (recorded per Secret) when it cannot be served.
    fn read(
        &self,
        proxy: &Proxy,
        name: &SecretName,
        now: SystemTime,
    ) -> Result<Option<tls::secret::Type>, ServeError> {
        let mut sources: Vec<Source> = if self.kube.is_some() {
            self.clusters(name.scheme, proxy)
                .into_iter()
                .map(Source::Cluster)
                .collect()
        } else {
            Vec::new()
        };
        sources.push(Source::ConfigDir);
        let found = {
            let state = self.lock();
            let mut found = None;
            let mut pending = false;
            'search: for source in &sources {
                for candidate in name.candidates() {
                    let key = SecretKey {
                        holder: Holder::of(name.scheme),
                        source: source.clone(),
                        namespace: name.namespace.clone(),
                        name: candidate,
                    };
                    let data = match (&key.source, key.holder) {
                        (Source::ConfigDir, Holder::Secret) => self
                            .config_dir
                            .as_ref()
                            .and_then(|d| d.secret(&key.namespace, &key.name))
                            .map(|s| Arc::new(s.content.clone())),
                        (Source::ConfigDir, Holder::ConfigMap) => self
                            .config_dir
                            .as_ref()
                            .and_then(|d| d.config_map(&key.namespace, &key.name))
                            .map(|data| Arc::new(config_map_data(&data))),
                        (Source::Cluster(_), _) => state.secrets.get(&key).cloned(),
                    };
                    // istiod never reads these types (the Kubernetes watch filters
                    // them out already).
                    let data = data.filter(|d| {
                        !meshfed_kube::secrets::SKIPPED_SECRET_TYPES
                            .contains(&d.secret_type.as_str())
                    });
                    if let Some(data) = data {
                        found = Some((key, data));
                        break 'search;
                    }
                    pending |= state.followed.get(&key).is_some_and(|f| !f.synced);
                }
            }
            match found {
                Some(found) => found,
                None if pending => return Ok(None),
                None => {
                    return Err(ServeError::NotFound {
                        holder: Holder::of(name.scheme).as_str(),
                        namespace: name.namespace.clone(),
                        names: name.candidates().join(" or "),
                    });
                }
            }
        };
        let (key, data) = found;

        let material = if name.ca_only {
            format::ca(&data.data, now).map(|ca| {
                if ca.expired {
                    self.metrics.expired.inc();
                }
                tls::secret::Type::ValidationContext(tls::CertificateValidationContext {
                    trusted_ca: Some(inline(ca.ca)),
                    crl: ca.crl.map(inline),
                    ..Default::default()
                })
            })
        } else {
            format::certificate(&data.data, now).map(|cert| {
                if cert.expired {
                    self.metrics.expired.inc();
                }
                tls::secret::Type::TlsCertificate(tls::TlsCertificate {
                    certificate_chain: Some(inline(cert.chain)),
                    private_key: Some(inline(cert.key)),
                    ocsp_staple: cert.ocsp_staple.map(inline),
                    ..Default::default()
                })
            })
        };
        let mut state = self.lock();
        match material {
            Ok(material) => {
                state.errors.remove(&key);
                Ok(Some(material))
            }
            Err(err) => {
                let reason = err.to_string();
                let fresh = state.errors.get(&key) != Some(&reason);
                state.errors.insert(key.clone(), reason.clone());
                drop(state);
                if fresh {
                    warn!(kind = key.holder.as_str(), namespace = %key.namespace, name = %key.name, source = %key.source, reason = %reason, "SDS: credential cannot be served; not sent");
                }
                Err(ServeError::Format { key, error: err })
            }
        }
    }

    /// Forgets a closed connection.
    pub fn forget(&self, connection: &str) {
        let mut state = self.lock();
        state.proxies.remove(connection);
        state.wanted.remove(connection);
        state.wanted.remove(&pull_connection(connection));
        unfollow_unwanted(&mut state);
        let prefix = format!(" {connection}");
        state.warned.retain(|w| !w.contains(&prefix));
    }

    /// `/debug/sdsz`: per connection what it requested, got, was denied and why not;
    /// per Secret the errors; the followed Kubernetes Secrets. Never any key material.
    pub fn debug(&self) -> Value {
        let state = self.lock();
        let secrets: Vec<Value> = state
            .errors
            .iter()
            .map(|(k, e)| {
                json!({"kind": k.holder.as_str(), "source": k.source.to_string(), "namespace": k.namespace, "name": k.name, "error": e})
            })
            .collect();
        let followed: Vec<Value> = state
            .followed
            .iter()
            .map(|(k, followed)| {
                json!({
                    "kind": k.holder.as_str(),
                    "source": k.source.to_string(),
                    "namespace": k.namespace,
                    "name": k.name,
                    "synced": followed.synced,
                    "present": state.secrets.contains_key(k),
                })
            })
            .collect();
        let config_dir: Vec<Value> = self
            .config_dir
            .iter()
            .flat_map(FileConfigStore::secrets)
            .map(|s| json!({"namespace": s.namespace, "name": s.name, "source": s.source}))
            .collect();
        json!({
            "proxies": state.proxies,
            "secretErrors": secrets,
            "followed": followed,
            "configDirSecrets": config_dir,
        })
    }
}

/// Whether a review answer given `age` ago still stands (5 minutes when allowed, 1
/// when denied, as istiod).
fn fresh(allowed: bool, age: Duration) -> bool {
    age < if allowed { ALLOWED_TTL } else { DENIED_TTL }
}

/// Stops following the Secrets no connection wants any more, and forgets them.
/// The key of what a connection's ECDS pull Secrets follow in [`State::wanted`].
fn pull_connection(connection: &str) -> String {
    format!("{connection} (wasm pull secrets)")
}

/// Why a WasmPlugin's image pull Secret is not sent (its variable goes out empty).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PullSecretError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("Secret {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("Secret {namespace}/{name} not read yet")]
    Pending { namespace: String, name: String },
    #[error("Secret {namespace}/{name} is of type {found:?}, not kubernetes.io/dockerconfigjson")]
    WrongType {
        namespace: String,
        name: String,
        found: String,
    },
    #[error("Secret {namespace}/{name} has no .dockerconfigjson")]
    NoDockerConfig { namespace: String, name: String },
}

/// The Secret type of image pull credentials.
pub const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// The key of a [`DOCKER_CONFIG_JSON_TYPE`] Secret that holds them.
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";

impl Sds {
    /// ECDS: gets ready to read the image pull Secrets (`namespace`, `name`) of the
    /// WasmPlugins `connection` (of `proxy`) watches: asks the API server whether the
    /// proxy's service account may list the Secrets of each namespace, and follows
    /// the Secrets of the namespaces it may read.
    pub async fn prepare_pull_secrets(
        &self,
        connection: &str,
        proxy: &Proxy,
        secrets: &BTreeSet<(String, String)>,
    ) {
        let (Some((namespace, sa)), Some(kube)) = (identity(proxy), &self.kube) else {
            return;
        };
        let user = format!("system:serviceaccount:{namespace}:{sa}");
        let review_cluster = self.review_cluster(proxy);
        let mut wanted = BTreeSet::new();
        for (secret_namespace, name) in secrets {
            self.review(kube, &review_cluster, &user, secret_namespace)
                .await;
            if self.authorize_namespace(proxy, secret_namespace).is_err() {
                continue;
            }
            for cluster in self.clusters(Scheme::Kubernetes, proxy) {
                let key = SecretKey {
                    holder: Holder::Secret,
                    source: Source::Cluster(cluster),
                    namespace: secret_namespace.clone(),
                    name: name.clone(),
                };
                self.follow(kube, key.clone());
                wanted.insert(key);
            }
        }
        let mut state = self.lock();
        state.wanted.insert(pull_connection(connection), wanted);
        unfollow_unwanted(&mut state);
    }

    /// Whether `proxy` may read the Secrets of `secret_namespace`: a verified identity
    /// and, with Kubernetes, an allowing review of its service account (learnt by
    /// [`Sds::prepare_pull_secrets`]); without Kubernetes (the config directory alone)
    /// only its own namespace.
    fn authorize_namespace(&self, proxy: &Proxy, secret_namespace: &str) -> Result<(), Refusal> {
        let Some((namespace, sa)) = identity(proxy) else {
            return Err(Refusal::NoIdentity);
        };
        if self.kube.is_none() {
            return if secret_namespace == namespace {
                Ok(())
            } else {
                Err(Refusal::OtherNamespace {
                    secret: secret_namespace.into(),
                    proxy: namespace,
                })
            };
        }
        let user = format!("system:serviceaccount:{namespace}:{sa}");
        let key = (
            self.review_cluster(proxy),
            user,
            secret_namespace.to_string(),
        );
        let answer = self.lock().reviews.get(&key).map(|(allowed, _)| *allowed);
        let (_, user, namespace) = key;
        match answer {
            Some(true) => Ok(()),
            Some(false) => Err(Refusal::Denied { user, namespace }),
            None => Err(Refusal::ReviewFailed),
        }
    }

    /// The `.dockerconfigjson` of image pull Secret `namespace/name` of WasmPlugin
    /// `plugin`, when `proxy` may read it; otherwise the reason, warned about once per
    /// connection and plugin and counted per plugin.
    pub fn pull_secret(
        &self,
        connection: &str,
        plugin: &str,
        proxy: &Proxy,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<u8>, PullSecretError> {
        let result = self.read_pull_secret(proxy, namespace, name);
        if let Err(why) = &result
            && !matches!(why, PullSecretError::Pending { .. })
        {
            self.metrics
                .pull_withheld
                .get_or_create(&vec![("plugin".to_string(), plugin.to_string())])
                .inc();
            self.warn_once(format!("pull {plugin} {why} {connection}"), |_| {
                warn!(%connection, %plugin, reason = %why, "ECDS: the WasmPlugin's imagePullSecret is not sent to the proxy")
            });
        }
        result
    }

    fn read_pull_secret(
        &self,
        proxy: &Proxy,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<u8>, PullSecretError> {
        self.authorize_namespace(proxy, namespace)?;
        let mut sources: Vec<Source> = if self.kube.is_some() {
            self.clusters(Scheme::Kubernetes, proxy)
                .into_iter()
                .map(Source::Cluster)
                .collect()
        } else {
            Vec::new()
        };
        sources.push(Source::ConfigDir);
        let state = self.lock();
        let mut pending = false;
        let found = sources.into_iter().find_map(|source| {
            let key = SecretKey {
                holder: Holder::Secret,
                source,
                namespace: namespace.to_string(),
                name: name.to_string(),
            };
            let data = match &key.source {
                Source::ConfigDir => self
                    .config_dir
                    .as_ref()
                    .and_then(|d| d.secret(namespace, name))
                    .map(|s| Arc::new(s.content.clone())),
                Source::Cluster(_) => state.secrets.get(&key).cloned(),
            };
            pending |= data.is_none() && state.followed.get(&key).is_some_and(|f| !f.synced);
            data
        });
        let (namespace, name) = (namespace.to_string(), name.to_string());
        let Some(data) = found else {
            return Err(if pending {
                PullSecretError::Pending { namespace, name }
            } else {
                PullSecretError::NotFound { namespace, name }
            });
        };
        if data.secret_type != DOCKER_CONFIG_JSON_TYPE {
            return Err(PullSecretError::WrongType {
                namespace,
                name,
                found: data.secret_type.clone(),
            });
        }
        data.data
            .get(DOCKER_CONFIG_JSON_KEY)
            .cloned()
            .ok_or(PullSecretError::NoDockerConfig { namespace, name })
    }
}

impl crate::generate::wasm::pull::PullSecretReader for Sds {
    fn pull_secret(
        &self,
        connection: &str,
        plugin: &str,
        proxy: &Proxy,
        namespace: &str,
        name: &str,
    ) -> Option<Vec<u8>> {
        Sds::pull_secret(self, connection, plugin, proxy, namespace, name).ok()
    }
}

fn unfollow_unwanted(state: &mut State) {
    let wanted: BTreeSet<&SecretKey> = state.wanted.values().flatten().collect();
    let unwanted: Vec<SecretKey> = state
        .followed
        .keys()
        .filter(|k| !wanted.contains(k))
        .cloned()
        .collect();
    for key in unwanted {
        debug!(secret = %key, "SDS: no longer following");
        if let Some(followed) = state.followed.remove(&key) {
            followed.task.abort();
        }
        state.secrets.remove(&key);
        state.errors.remove(&key);
    }
}

/// A ConfigMap's data as a Secret's (the CA keys are the same).
fn config_map_data(data: &BTreeMap<String, String>) -> SecretData {
    SecretData {
        secret_type: String::new(),
        data: data
            .iter()
            .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
            .collect(),
    }
}

fn inline(bytes: Vec<u8>) -> DataSource {
    DataSource {
        specifier: Some(data_source::Specifier::InlineBytes(bytes)),
        ..Default::default()
    }
}

/// Pushes the change of Secret `namespace/name`.
fn announce(sink: &UpdateSink, namespace: &str, name: &str) {
    sink.push(PushRequest::full(
        TriggerReason::Secret,
        [ConfigKey::new(ConfigKind::Secret, name, namespace)],
    ));
}

#[cfg(test)]
mod tests {
    use meshfed_registry::{ConfigKey, ConfigKind, PushRequest, TriggerReason};

    use super::*;
    use crate::testing::node_with;

    #[test]
    fn reviews_are_kept_five_minutes_when_allowed_and_one_when_denied() {
        let secs = Duration::from_secs;
        assert!(fresh(true, secs(299)) && !fresh(true, secs(300)));
        assert!(fresh(false, secs(59)) && !fresh(false, secs(60)));
    }

    fn gateway(identity: Option<&str>) -> Proxy {
        let node = node_with(
            "router~10.0.0.9~gw-1.gwns~gwns.svc.cluster.local",
            serde_json::json!({"SERVICE_ACCOUNT": "gw"}),
        );
        let mut proxy = Proxy::from_node(Some(&node)).unwrap();
        proxy.verified_identity = identity.map(str::to_string);
        proxy
    }

    #[test]
    fn a_secret_change_wants_the_connections_that_requested_it_or_its_twin() {
        let proxy = gateway(Some("spiffe://cluster.local/ns/gwns/sa/gw"));
        let change = |name: &str, ns: &str| {
            PushRequest::full(
                TriggerReason::Secret,
                [ConfigKey::new(ConfigKind::Secret, name, ns)],
            )
        };
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let wants = |request: &PushRequest, list: &[&str]| {
            Sds::wants(&PushScope::new(request), &proxy, &names(list))
        };
        assert!(wants(&change("a", "gwns"), &["kubernetes://a"]));
        assert!(wants(&change("a", "gwns"), &["kubernetes://gwns/a-cacert"]));
        assert!(wants(
            &change("a-cacert", "gwns"),
            &["kubernetes://a-cacert"]
        ));
        assert!(wants(&change("a-cacert", "gwns"), &["kubernetes://a"]));
        assert!(!wants(&change("b", "gwns"), &["kubernetes://a"]));
        assert!(!wants(&change("a", "other"), &["kubernetes://a"]));
        assert!(!wants(&change("a", "gwns"), &["default", "ROOTCA"]));
        // Anything else than Secrets alone: every SDS watcher.
        let gateway_change = PushRequest::full(
            TriggerReason::Config,
            [ConfigKey::new(ConfigKind::Gateway, "gw", "gwns")],
        );
        assert!(wants(&gateway_change, &["kubernetes://a"]));
        // A proxy without identity gets nothing to regenerate.
        let plain = gateway(None);
        assert!(!Sds::wants(
            &PushScope::new(&change("a", "gwns")),
            &plain,
            &names(&["kubernetes://a"])
        ));
    }
}

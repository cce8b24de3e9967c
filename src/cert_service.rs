//! `istio.v1.auth.IstioCertificateService/CreateCertificate` (reference §1.5): the
//! caller's identities, authenticated by the port it came in on, go into a certificate
//! signed by the mesh CA ([`crate::ca`]), with Istio's status codes and metrics.
//!
//! The plaintext xDS port has no authenticator, so every request there is refused
//! with `UNAUTHENTICATED`, as istiod refuses CSRs on 15010.
//!
//! A node proxy (ztunnel) asks for the certificates of the workloads on its node with
//! `ImpersonatedIdentity` metadata. Istio's node authorizer decides
//! ([`NodeAuthorizer`], `security/pkg/server/ca/node_auth.go`): the caller's service
//! account must be one of `CA_TRUSTED_NODE_ACCOUNTS` (`istio-system/ztunnel` by
//! default), its own pod must be known (by the pod its token is bound to, else by the
//! connection's address) and a workload running as the impersonated service account
//! must be on that pod's node. The workloads come through [`NodeWorkloads`].

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use meshfed_api::auth::v1::{IstioCertificateRequest, IstioCertificateResponse};
use prometheus_client::registry::Registry;
use tonic::codegen::{Body, BoxFuture, Context, Poll, Service, StdError, http};
use tonic::server::NamedService;
use tonic::{Request, Response, Status};
use tracing::{debug, warn};

use crate::ads::limit::LogLimiter;

use crate::ads::transport::XdsConnectInfo;
use crate::authn::{AuthContext, Authenticators, Caller, KubeCaller};
use crate::ca::{Ca, CaError};

/// Istio's CA server metrics (`citadel_server_*`, counters without `_total` as Istio
/// exports them: monotonic gauges here, see [`crate::metrics`]).
#[derive(Debug, Default, Clone)]
pub struct CaMetrics {
    /// `citadel_server_csr_count`: CSRs received.
    pub csr: crate::metrics::IstioCounter,
    /// `citadel_server_authentication_failure_count`.
    pub authentication_failure: crate::metrics::IstioCounter,
    /// `citadel_server_csr_parsing_err_count`: CSRs that did not parse or verify.
    pub csr_parsing_err: crate::metrics::IstioCounter,
    /// `citadel_server_csr_sign_err_count`: signing failures.
    pub csr_sign_err: crate::metrics::IstioCounter,
    /// `citadel_server_success_cert_issuance_count`.
    pub success: crate::metrics::IstioCounter,
}

impl CaMetrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &mut Registry) -> Self {
        let m = CaMetrics::default();
        for (name, help, metric) in [
            (
                "citadel_server_csr_count",
                "The number of CSRs received by Citadel server",
                &m.csr,
            ),
            (
                "citadel_server_authentication_failure_count",
                "The number of authentication failures",
                &m.authentication_failure,
            ),
            (
                "citadel_server_csr_parsing_err_count",
                "The number of errors occurred when parsing the CSR",
                &m.csr_parsing_err,
            ),
            (
                "citadel_server_csr_sign_err_count",
                "The number of errors occurred when signing the CSR",
                &m.csr_sign_err,
            ),
            (
                "citadel_server_success_cert_issuance_count",
                "The number of certificates issuances that have succeeded",
                &m.success,
            ),
        ] {
            registry.register(name, help, metric.clone());
        }
        m
    }
}

impl CaMetrics {
    /// Registers Istio's expiry gauges (seconds since the epoch; 0 until a CA is
    /// loaded): `citadel_server_root_cert_expiry_timestamp` and
    /// `citadel_server_cert_chain_expiry_timestamp`. Returns them, set by
    /// [`CaExpiry::set`] once the CA is there (it may load after start).
    pub fn register_expiry(registry: &mut Registry) -> CaExpiry {
        let expiry = CaExpiry::default();
        registry.register(
            "citadel_server_root_cert_expiry_timestamp",
            "The unix timestamp, in seconds, when the CA root certificate will expire",
            expiry.root.clone(),
        );
        registry.register(
            "citadel_server_cert_chain_expiry_timestamp",
            "The unix timestamp, in seconds, when the CA signing certificate will expire",
            expiry.chain.clone(),
        );
        expiry
    }
}

/// The CA's expiry gauges.
#[derive(Debug, Default, Clone)]
pub struct CaExpiry {
    root: prometheus_client::metrics::gauge::Gauge,
    chain: prometheus_client::metrics::gauge::Gauge,
}

impl CaExpiry {
    /// Sets the gauges from `ca`.
    pub fn set(&self, ca: &Ca) {
        self.root
            .set(ca.root_not_after().map_or(0, |t| t.unix_timestamp()));
        self.chain.set(ca.not_after().unix_timestamp());
    }
}

/// Signs `request` for `caller` (none: refused as Istio refuses it), with no node
/// authorizer: impersonation is refused.
pub fn create_certificate(
    ca: &Ca,
    caller: Result<Caller, String>,
    request: &IstioCertificateRequest,
    metrics: &CaMetrics,
    refusal_log: &LogLimiter,
) -> Result<IstioCertificateResponse, Status> {
    create_certificate_for(ca, caller, None, request, None, metrics, refusal_log)
}

/// Signs `request` for `caller`, connected from `peer_ip`; an `ImpersonatedIdentity`
/// is signed instead of the caller's identities when `node_authorizer` allows it
/// (refused `PERMISSION_DENIED` otherwise; without an authorizer refused as Istio
/// refuses it without one, `UNAUTHENTICATED`).
pub fn create_certificate_for(
    ca: &Ca,
    caller: Result<Caller, String>,
    peer_ip: Option<IpAddr>,
    request: &IstioCertificateRequest,
    node_authorizer: Option<&NodeAuthorizer>,
    metrics: &CaMetrics,
    refusal_log: &LogLimiter,
) -> Result<IstioCertificateResponse, Status> {
    metrics.csr.inc();
    let caller = match caller {
        Ok(caller) => caller,
        Err(why) => {
            metrics.authentication_failure.inc();
            if let Some(suppressed) = refusal_log.allow() {
                warn!(reason = %why, suppressed, "CreateCertificate: request authenticate failure");
            }
            return Err(Status::unauthenticated("request authenticate failure"));
        }
    };
    let impersonated = request
        .metadata
        .as_ref()
        .and_then(|m| m.fields.get("ImpersonatedIdentity"))
        .and_then(|v| match &v.kind {
            Some(pbjson_types::value::Kind::StringValue(s)) if !s.is_empty() => Some(s),
            _ => None,
        });
    let identities = match (impersonated, node_authorizer) {
        (None, _) => caller.identities.clone(),
        (Some(target), None) => {
            metrics.authentication_failure.inc();
            if let Some(suppressed) = refusal_log.allow() {
                warn!(caller = ?caller.identities, %target, suppressed, "CreateCertificate: impersonation refused (no trusted node accounts)");
            }
            return Err(Status::unauthenticated(
                "request impersonation authentication failure",
            ));
        }
        (Some(target), Some(authorizer)) => match authorizer.authorize(&caller, peer_ip, target) {
            Ok(()) => vec![target.clone()],
            Err(refusal) => {
                metrics.authentication_failure.inc();
                authorizer.log_refusal(&caller, target, &refusal);
                return Err(Status::permission_denied(format!(
                    "request impersonation authentication failure: {}",
                    refusal.reason.as_str()
                )));
            }
        },
    };
    let ttl = Duration::from_secs(u64::try_from(request.validity_duration).unwrap_or(0));
    match ca.sign(&request.csr, &identities, ttl) {
        Ok(cert_chain) => {
            metrics.success.inc();
            debug!(?identities, caller = ?caller.identities, ?ttl, "CreateCertificate: certificate issued");
            Ok(IstioCertificateResponse { cert_chain })
        }
        Err(err @ CaError::Csr(_)) => {
            metrics.csr_parsing_err.inc();
            Err(Status::invalid_argument(err.to_string()))
        }
        Err(err @ CaError::Ttl { .. }) => {
            metrics.csr_sign_err.inc();
            Err(Status::invalid_argument(err.to_string()))
        }
        Err(err) => {
            metrics.csr_sign_err.inc();
            Err(Status::internal(err.to_string()))
        }
    }
}

// === Node authorization (impersonation) ===

/// Istio's default `CA_TRUSTED_NODE_ACCOUNTS`: ztunnel's service account.
pub const DEFAULT_TRUSTED_NODE_ACCOUNTS: &str = "istio-system/ztunnel";

/// Reads `CA_TRUSTED_NODE_ACCOUNTS`: comma-separated `<namespace>/<service account>`
/// (blanks around entries ignored; an empty value trusts no one).
pub fn parse_trusted_node_accounts(value: &str) -> Result<BTreeSet<(String, String)>, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| match entry.split_once('/') {
            Some((ns, sa)) if !ns.is_empty() && !sa.is_empty() && !sa.contains('/') => {
                Ok((ns.to_string(), sa.to_string()))
            }
            _ => Err(format!(
                "CA_TRUSTED_NODE_ACCOUNTS: {entry:?} is not <namespace>/<service account>"
            )),
        })
        .collect()
}

/// What the node authorizer learns of the caller's own pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallerPodFacts {
    /// The node it runs on.
    pub node: String,
    /// Its Kubernetes object uid, when the source knows it.
    pub uid: Option<String>,
    /// Its service account, when the source knows it.
    pub service_account: Option<String>,
}

/// The workloads the node authorizer checks against (Istio's pod informer): a seam so
/// it is tested without Kubernetes.
pub trait NodeWorkloads: Send + Sync + std::fmt::Debug {
    /// The caller's own pod: `caller.namespace`/`caller.pod_name` when its token names
    /// it, else the pod of `caller.namespace` at `peer_ip`.
    fn caller_pod(&self, caller: &KubeCaller, peer_ip: Option<IpAddr>) -> Option<CallerPodFacts>;
    /// Whether a workload running as `namespace`/`service_account` is on `node` (of
    /// the caller's cluster).
    fn service_account_on_node(
        &self,
        cluster: Option<&str>,
        namespace: &str,
        service_account: &str,
        node: &str,
    ) -> bool;
}

/// Why an impersonation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// The caller was not authenticated by a Kubernetes token.
    NotKubernetesCaller,
    /// Its service account is not in `CA_TRUSTED_NODE_ACCOUNTS`.
    NotTrusted,
    /// The impersonated identity is not `spiffe://<td>/ns/<ns>/sa/<sa>`.
    BadIdentity,
    /// The caller's own pod is not known.
    CallerPodUnknown,
    /// The caller's pod has another uid or service account than its token says.
    CallerPodMismatch,
    /// No workload of the impersonated service account runs on the caller's node.
    NotOnNode,
}

impl RefusalReason {
    /// Short name, for logs and the status message.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::NotKubernetesCaller => "caller is not a Kubernetes service account",
            RefusalReason::NotTrusted => "caller is not a trusted node account",
            RefusalReason::BadIdentity => "impersonated identity is not a SPIFFE identity",
            RefusalReason::CallerPodUnknown => "caller pod not found",
            RefusalReason::CallerPodMismatch => "caller pod does not match its token",
            RefusalReason::NotOnNode => "no workload of that identity on the caller's node",
        }
    }
}

/// A refused impersonation: the reason and its details.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: RefusalReason,
    pub detail: String,
}

/// Istio's node authorizer.
#[derive(Debug)]
pub struct NodeAuthorizer {
    trusted: BTreeSet<(String, String)>,
    workloads: Arc<dyn NodeWorkloads>,
    /// One bit per [`RefusalReason`] already logged at warn.
    logged: AtomicU32,
}

impl NodeAuthorizer {
    /// Trusts the `(namespace, service account)` pairs of `trusted`.
    pub fn new(trusted: BTreeSet<(String, String)>, workloads: Arc<dyn NodeWorkloads>) -> Self {
        NodeAuthorizer {
            trusted,
            workloads,
            logged: AtomicU32::new(0),
        }
    }

    /// Whether `caller` (connected from `peer_ip`) may have a certificate for `target`.
    pub fn authorize(
        &self,
        caller: &Caller,
        peer_ip: Option<IpAddr>,
        target: &str,
    ) -> Result<(), Refusal> {
        let refuse = |reason, detail: String| Err(Refusal { reason, detail });
        let Some(kube) = caller.kube.as_ref() else {
            return refuse(
                RefusalReason::NotKubernetesCaller,
                format!("authenticated by {}", caller.source),
            );
        };
        let account = (kube.namespace.clone(), kube.service_account.clone());
        if !self.trusted.contains(&account) {
            return refuse(
                RefusalReason::NotTrusted,
                format!("{}/{}", kube.namespace, kube.service_account),
            );
        }
        let Some((namespace, service_account)) = parse_spiffe(target) else {
            return refuse(RefusalReason::BadIdentity, target.to_string());
        };
        let Some(pod) = self.workloads.caller_pod(kube, peer_ip) else {
            return refuse(
                RefusalReason::CallerPodUnknown,
                format!(
                    "{}/{} at {peer_ip:?}",
                    kube.namespace,
                    kube.pod_name.as_deref().unwrap_or("?")
                ),
            );
        };
        let uid_differs = matches!((&pod.uid, &kube.pod_uid), (Some(a), Some(b)) if a != b);
        let sa_differs = pod
            .service_account
            .as_ref()
            .is_some_and(|sa| *sa != kube.service_account);
        if uid_differs || sa_differs {
            return refuse(
                RefusalReason::CallerPodMismatch,
                format!("pod {pod:?}, token {kube:?}"),
            );
        }
        if !self.workloads.service_account_on_node(
            kube.cluster.as_deref(),
            namespace,
            service_account,
            &pod.node,
        ) {
            return refuse(
                RefusalReason::NotOnNode,
                format!(
                    "no instances of {namespace}/{service_account} on node {:?}",
                    pod.node
                ),
            );
        }
        Ok(())
    }

    /// Logs a refusal: at warn the first time its reason is seen, at debug after.
    fn log_refusal(&self, caller: &Caller, target: &str, refusal: &Refusal) {
        let bit = 1u32 << (refusal.reason as u32);
        let first = self.logged.fetch_or(bit, Ordering::Relaxed) & bit == 0;
        if first {
            warn!(caller = ?caller.identities, %target, reason = refusal.reason.as_str(), detail = %refusal.detail,
                "CreateCertificate: impersonation refused (logged once per reason; later ones at debug)");
        } else {
            debug!(caller = ?caller.identities, %target, reason = refusal.reason.as_str(), detail = %refusal.detail,
                "CreateCertificate: impersonation refused");
        }
    }
}

/// [`NodeWorkloads`] over the current snapshot: the caller's pod from the registries'
/// frozen workload views (by the connection's address, and the pod name its token is
/// bound to), the workloads by node from the endpoints' workload records (pods with a
/// node and an identity).
#[derive(Debug)]
pub struct SnapshotWorkloads {
    snapshot: Arc<arc_swap::ArcSwap<crate::push::snapshot::Snapshot>>,
    /// The cluster a caller that claims none is in.
    local_cluster: meshfed_registry::ClusterId,
}

impl SnapshotWorkloads {
    /// Reads `snapshot` (always the current one); callers that claim no cluster are
    /// in `local_cluster`.
    pub fn new(
        snapshot: Arc<arc_swap::ArcSwap<crate::push::snapshot::Snapshot>>,
        local_cluster: meshfed_registry::ClusterId,
    ) -> Self {
        SnapshotWorkloads {
            snapshot,
            local_cluster,
        }
    }
}

/// `(cluster, node, namespace, service account)` of every pod endpoint with a node
/// and an identity, per snapshot.
#[derive(Debug, Default)]
struct NodeAccounts(BTreeSet<(String, String, String, String)>);

impl NodeAccounts {
    fn build(snapshot: &crate::push::snapshot::Snapshot) -> NodeAccounts {
        let mut out = BTreeSet::new();
        for service in snapshot.services().all() {
            let Some(shards) = snapshot.shards(&service.key()) else {
                continue;
            };
            for (shard, ep) in shards.iter() {
                let (Some(meta), Some(id)) = (ep.workload.as_ref(), ep.service_account.as_deref())
                else {
                    continue;
                };
                if meta.kind != meshfed_registry::WorkloadKind::Pod || meta.node_name.is_empty() {
                    continue;
                }
                if let Some((ns, sa)) = parse_spiffe(id) {
                    out.insert((
                        shard.cluster.to_string(),
                        meta.node_name.clone(),
                        ns.to_string(),
                        sa.to_string(),
                    ));
                }
            }
        }
        NodeAccounts(out)
    }
}

impl NodeWorkloads for SnapshotWorkloads {
    fn caller_pod(&self, caller: &KubeCaller, peer_ip: Option<IpAddr>) -> Option<CallerPodFacts> {
        let ips = [peer_ip?];
        let id = caller
            .pod_name
            .as_ref()
            .map(|p| format!("{p}.{}", caller.namespace))
            .unwrap_or_default();
        let cluster = meshfed_registry::ClusterId::new(
            caller
                .cluster
                .as_deref()
                .unwrap_or(self.local_cluster.as_str()),
        );
        let found = self
            .snapshot
            .load()
            .find_workload(&meshfed_registry::WorkloadQuery {
                ips: &ips,
                id: &id,
                namespace: &caller.namespace,
                cluster: Some(&cluster),
            })?;
        if found.namespace.as_str() != caller.namespace
            || caller.pod_name.as_ref().is_some_and(|p| *p != found.name)
        {
            return None;
        }
        Some(CallerPodFacts {
            node: found.labels.get("kubernetes.io/hostname")?.clone(),
            uid: None,
            service_account: found
                .service_account
                .as_deref()
                .and_then(parse_spiffe)
                .map(|(_, sa)| sa.to_string()),
        })
    }

    fn service_account_on_node(
        &self,
        cluster: Option<&str>,
        namespace: &str,
        service_account: &str,
        node: &str,
    ) -> bool {
        let snapshot = self.snapshot.load();
        let accounts = snapshot.derived(NodeAccounts::build);
        let cluster = cluster.unwrap_or(self.local_cluster.as_str());
        accounts.0.contains(&(
            cluster.to_string(),
            node.to_string(),
            namespace.to_string(),
            service_account.to_string(),
        ))
    }
}

/// `spiffe://<trust domain>/ns/<namespace>/sa/<service account>` (Istio's
/// `spiffe.ParseIdentity`): namespace and service account.
fn parse_spiffe(id: &str) -> Option<(&str, &str)> {
    let rest = id.strip_prefix("spiffe://")?;
    match rest.split('/').collect::<Vec<_>>()[..] {
        [td, "ns", ns, "sa", sa] if !td.is_empty() && !ns.is_empty() && !sa.is_empty() => {
            Some((ns, sa))
        }
        _ => None,
    }
}

/// The gRPC service, mounted on a port with that port's authenticator (none on the
/// plaintext port).
#[derive(Clone, Debug)]
pub struct CertificateService {
    ca: Arc<Ca>,
    authenticators: Option<Authenticators>,
    metrics: CaMetrics,
    /// Limits the log lines of refused requests (callers can cause them at will).
    refusal_log: Arc<LogLimiter>,
    /// Decides `ImpersonatedIdentity` requests; none refuses them.
    node_authorizer: Option<Arc<NodeAuthorizer>>,
}

impl CertificateService {
    /// A service signing with `ca`; `authenticators` `None` refuses every request.
    pub fn new(ca: Arc<Ca>, authenticators: Option<Authenticators>, metrics: CaMetrics) -> Self {
        CertificateService {
            ca,
            authenticators,
            metrics,
            refusal_log: Arc::new(LogLimiter::new(10, Duration::from_secs(10))),
            node_authorizer: None,
        }
    }

    /// The same service, deciding impersonation with `authorizer`.
    pub fn with_node_authorizer(mut self, authorizer: Arc<NodeAuthorizer>) -> Self {
        self.node_authorizer = Some(authorizer);
        self
    }
}

impl NamedService for CertificateService {
    const NAME: &'static str = "istio.v1.auth.IstioCertificateService";
}

struct Unary(CertificateService);

impl tonic::server::UnaryService<IstioCertificateRequest> for Unary {
    type Response = IstioCertificateResponse;
    type Future = BoxFuture<Response<IstioCertificateResponse>, Status>;

    fn call(&mut self, request: Request<IstioCertificateRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            let tls = request
                .extensions()
                .get::<XdsConnectInfo>()
                .and_then(|info| info.tls.clone());
            let caller = match (&service.authenticators, &tls) {
                (Some(chain), Some(tls)) => {
                    chain
                        .authenticate(AuthContext {
                            metadata: request.metadata(),
                            tls: Some(tls),
                        })
                        .await
                }
                _ => Err("this port authenticates no caller (plaintext)".to_string()),
            };
            let peer_ip = request
                .extensions()
                .get::<XdsConnectInfo>()
                .and_then(|info| info.peer)
                .map(|a| a.ip().to_canonical());
            create_certificate_for(
                &service.ca,
                caller,
                peer_ip,
                request.get_ref(),
                service.node_authorizer.as_deref(),
                &service.metrics,
                &service.refusal_log,
            )
            .map(Response::new)
        })
    }
}

impl<B> Service<http::Request<B>> for CertificateService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let service = self.clone();
        Box::pin(async move {
            if req.uri().path() != "/istio.v1.auth.IstioCertificateService/CreateCertificate" {
                return Ok(Status::unimplemented("unknown method").into_http());
            }
            let codec = tonic_prost::ProstCodec::<IstioCertificateResponse, IstioCertificateRequest>::default();
            let mut grpc = tonic::server::Grpc::new(codec);
            Ok(grpc.unary(Unary(service), req).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> (tempfile::TempDir, Ca) {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::self_signed(dir.path(), "cluster.local").unwrap();
        (dir, ca)
    }

    fn csr() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        rcgen::CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap()
    }

    #[test]
    fn codes_and_metrics_follow_istio() {
        let (_dir, ca) = ca();
        let metrics = CaMetrics::default();
        let log = LogLimiter::new(100, Duration::from_secs(1));
        let caller = || {
            Ok(Caller {
                identities: vec!["spiffe://cluster.local/ns/a/sa/b".into()],
                source: "test",
                kube: None,
            })
        };
        let good = IstioCertificateRequest {
            csr: csr(),
            ..Default::default()
        };
        let chain = create_certificate(&ca, caller(), &good, &metrics, &log).unwrap();
        assert_eq!(chain.cert_chain.len(), 2);
        let refused = create_certificate(&ca, Err("no token".into()), &good, &metrics, &log);
        assert_eq!(refused.unwrap_err().code(), tonic::Code::Unauthenticated);
        let garbage = IstioCertificateRequest {
            csr: "garbage".into(),
            ..Default::default()
        };
        let bad = create_certificate(&ca, caller(), &garbage, &metrics, &log);
        assert_eq!(bad.unwrap_err().code(), tonic::Code::InvalidArgument);
        let long = IstioCertificateRequest {
            csr: csr(),
            validity_duration: 91 * 24 * 3600,
            ..Default::default()
        };
        let status = create_certificate(&ca, caller(), &long, &metrics, &log).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("max allowed TTL"), "{status:?}");
        let impersonating = IstioCertificateRequest {
            csr: csr(),
            metadata: Some(pbjson_types::Struct {
                fields: [(
                    "ImpersonatedIdentity".to_string(),
                    pbjson_types::Value::from("spiffe://cluster.local/ns/x/sa/y".to_string()),
                )]
                .into(),
            }),
            ..Default::default()
        };
        let status = create_certificate(&ca, caller(), &impersonating, &metrics, &log).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert_eq!(metrics.csr.get(), 5);
        assert_eq!(metrics.success.get(), 1);
        assert_eq!(metrics.authentication_failure.get(), 2);
        assert_eq!(metrics.csr_parsing_err.get(), 1);
        assert_eq!(metrics.csr_sign_err.get(), 1);
    }
}

#[cfg(test)]
mod node_auth_tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Pods by `namespace/name`: (uid, service account, node, ip).
    #[derive(Debug, Default)]
    struct FakePods(BTreeMap<String, (String, String, String, IpAddr)>);

    impl FakePods {
        fn with(mut self, ns: &str, name: &str, sa: &str, node: &str, ip: &str) -> Self {
            self.0.insert(
                format!("{ns}/{name}"),
                (
                    format!("uid-{name}"),
                    sa.into(),
                    node.into(),
                    ip.parse().unwrap(),
                ),
            );
            self
        }
    }

    impl NodeWorkloads for FakePods {
        fn caller_pod(
            &self,
            caller: &KubeCaller,
            peer_ip: Option<IpAddr>,
        ) -> Option<CallerPodFacts> {
            let found = match &caller.pod_name {
                Some(name) => self.0.get(&format!("{}/{name}", caller.namespace)),
                None => self.0.iter().find_map(|(k, v)| {
                    (k.starts_with(&format!("{}/", caller.namespace)) && Some(v.3) == peer_ip)
                        .then_some(v)
                }),
            }?;
            Some(CallerPodFacts {
                node: found.2.clone(),
                uid: Some(found.0.clone()),
                service_account: Some(found.1.clone()),
            })
        }
        fn service_account_on_node(&self, _: Option<&str>, ns: &str, sa: &str, node: &str) -> bool {
            self.0
                .iter()
                .any(|(k, v)| k.starts_with(&format!("{ns}/")) && v.1 == sa && v.2 == node)
        }
    }

    fn ztunnel(pod: Option<&str>, uid: Option<&str>) -> Result<Caller, String> {
        Ok(Caller {
            identities: vec!["spiffe://cluster.local/ns/istio-system/sa/ztunnel".into()],
            source: "kube-jwt",
            kube: Some(KubeCaller {
                cluster: None,
                namespace: "istio-system".into(),
                service_account: "ztunnel".into(),
                pod_name: pod.map(String::from),
                pod_uid: uid.map(String::from),
            }),
        })
    }

    fn impersonating(target: &str) -> IstioCertificateRequest {
        let key = rcgen::KeyPair::generate().unwrap();
        let csr = rcgen::CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap();
        IstioCertificateRequest {
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

    fn authorizer() -> NodeAuthorizer {
        let pods = FakePods::default()
            .with("istio-system", "ztunnel-a", "ztunnel", "node-a", "10.0.0.1")
            .with("istio-system", "ztunnel-b", "ztunnel", "node-b", "10.0.0.2")
            .with("istio-system", "other-agent", "agent", "node-a", "10.0.0.3")
            .with("ns1", "app-1", "app", "node-a", "10.1.0.1")
            .with("ns2", "db-1", "db", "node-b", "10.1.0.2");
        NodeAuthorizer::new(
            parse_trusted_node_accounts(DEFAULT_TRUSTED_NODE_ACCOUNTS).unwrap(),
            Arc::new(pods),
        )
    }

    #[test]
    fn impersonation_follows_the_node_authorizer() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::self_signed(dir.path(), "cluster.local").unwrap();
        let metrics = CaMetrics::default();
        let log = LogLimiter::new(100, Duration::from_secs(1));
        let authz = authorizer();
        let sign = |caller, peer: Option<&str>, target: &str| {
            create_certificate_for(
                &ca,
                caller,
                peer.map(|p| p.parse().unwrap()),
                &impersonating(target),
                Some(&authz),
                &metrics,
                &log,
            )
        };
        // A workload on the caller's node: issued, for the impersonated identity only.
        let app = "spiffe://cluster.local/ns/ns1/sa/app";
        let chain = sign(ztunnel(Some("ztunnel-a"), Some("uid-ztunnel-a")), None, app).unwrap();
        let leaf = pem::parse(&chain.cert_chain[0]).unwrap();
        assert_eq!(crate::authn::uri_sans(leaf.contents()).unwrap(), [app]);
        // Found by the connection's address when the token names no pod.
        sign(ztunnel(None, None), Some("10.0.0.1"), app).unwrap();
        // A workload on another node.
        let db = "spiffe://cluster.local/ns/ns2/sa/db";
        let status = sign(ztunnel(Some("ztunnel-a"), None), None, db).unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(status.message().contains("caller's node"), "{status:?}");
        // ... but issued to the ztunnel of that node.
        sign(ztunnel(Some("ztunnel-b"), None), None, db).unwrap();
        // A caller that is not a trusted node account, though on the same node.
        let mut other = ztunnel(Some("other-agent"), None).unwrap();
        other.kube.as_mut().unwrap().service_account = "agent".into();
        let status = sign(Ok(other), None, app).unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(
            status.message().contains("not a trusted node account"),
            "{status:?}"
        );
        // A caller authenticated otherwise than by a Kubernetes token.
        let mut by_cert = ztunnel(Some("ztunnel-a"), None).unwrap();
        by_cert.kube = None;
        let status = sign(Ok(by_cert), None, app).unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        // A stale pod (another uid), an unknown pod, a malformed identity.
        for (caller, peer, target) in [
            (ztunnel(Some("ztunnel-a"), Some("old")), None, app),
            (ztunnel(Some("gone"), None), None, app),
            (ztunnel(None, None), Some("10.9.9.9"), app),
            (ztunnel(Some("ztunnel-a"), None), None, "ns1/app"),
        ] {
            let status = sign(caller, peer, target).unwrap_err();
            assert_eq!(status.code(), tonic::Code::PermissionDenied, "{target}");
        }
        assert_eq!(metrics.success.get(), 3);
        assert_eq!(metrics.authentication_failure.get(), 7);
        assert_eq!(metrics.csr.get(), 10);
        // Each reason was logged once at warn.
        assert_eq!(authz.logged.load(Ordering::Relaxed).count_ones(), 6);
    }

    #[test]
    fn trusted_node_accounts_parse_as_istio_writes_them() {
        let parsed =
            parse_trusted_node_accounts(" istio-system/ztunnel, kube-system/agent ,").unwrap();
        assert_eq!(
            parsed.into_iter().collect::<Vec<_>>(),
            [
                ("istio-system".to_string(), "ztunnel".to_string()),
                ("kube-system".into(), "agent".into())
            ]
        );
        assert!(parse_trusted_node_accounts("").unwrap().is_empty());
        for bad in ["ztunnel", "/ztunnel", "ns/", "a/b/c"] {
            let e = parse_trusted_node_accounts(bad).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }
}

//! `istio.v1.auth.IstioCertificateService/CreateCertificate` (reference §1.5): the
//! caller's identities, authenticated by the port it came in on, go into a certificate
//! signed by the mesh CA ([`crate::ca`]), with Istio's status codes and metrics.
//!
//! The plaintext xDS port has no authenticator, so every request there is refused
//! with `UNAUTHENTICATED`, as istiod refuses CSRs on 15010.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use meshfed_api::auth::v1::{IstioCertificateRequest, IstioCertificateResponse};
use prometheus_client::registry::Registry;
use tonic::codegen::{Body, BoxFuture, Context, Poll, Service, StdError, http};
use tonic::server::NamedService;
use tonic::{Request, Response, Status};
use tracing::{debug, warn};

use crate::ads::limit::LogLimiter;

use crate::ads::transport::XdsConnectInfo;
use crate::authn::{AuthContext, Authenticators, Caller};
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

/// Signs `request` for `caller` (none: refused as Istio refuses it).
pub fn create_certificate(
    ca: &Ca,
    caller: Result<Caller, String>,
    request: &IstioCertificateRequest,
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
    // Node agents signing for the pods of their node (Istio's CA_TRUSTED_NODE_ACCOUNTS)
    // are not supported: such a request is refused as Istio refuses it when the caller
    // is not a trusted node account.
    if let Some(target) = request
        .metadata
        .as_ref()
        .and_then(|m| m.fields.get("ImpersonatedIdentity"))
        .and_then(|v| match &v.kind {
            Some(pbjson_types::value::Kind::StringValue(s)) if !s.is_empty() => Some(s),
            _ => None,
        })
    {
        metrics.authentication_failure.inc();
        if let Some(suppressed) = refusal_log.allow() {
            warn!(caller = ?caller.identities, %target, suppressed, "CreateCertificate: impersonation refused (no trusted node accounts)");
        }
        return Err(Status::unauthenticated(
            "request impersonation authentication failure",
        ));
    }
    let ttl = Duration::from_secs(u64::try_from(request.validity_duration).unwrap_or(0));
    match ca.sign(&request.csr, &caller.identities, ttl) {
        Ok(cert_chain) => {
            metrics.success.inc();
            debug!(identities = ?caller.identities, ?ttl, "CreateCertificate: certificate issued");
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

/// The gRPC service, mounted on a port with that port's authenticator (none on the
/// plaintext port).
#[derive(Clone, Debug)]
pub struct CertificateService {
    ca: Arc<Ca>,
    authenticators: Option<Authenticators>,
    metrics: CaMetrics,
    /// Limits the log lines of refused requests (callers can cause them at will).
    refusal_log: Arc<LogLimiter>,
}

impl CertificateService {
    /// A service signing with `ca`; `authenticators` `None` refuses every request.
    pub fn new(ca: Arc<Ca>, authenticators: Option<Authenticators>, metrics: CaMetrics) -> Self {
        CertificateService {
            ca,
            authenticators,
            metrics,
            refusal_log: Arc::new(LogLimiter::new(10, Duration::from_secs(10))),
        }
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
            create_certificate(
                &service.ca,
                caller,
                request.get_ref(),
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

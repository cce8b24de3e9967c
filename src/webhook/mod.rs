//! The validating admission webhook (istiod's `/validate` on 15017): Kubernetes asks
//! it, over HTTPS, whether an Istio config object may be created or updated, and gets
//! the answer `meshfed validate` would give for the same object.
//!
//! - [`review`]: one AdmissionReview in, one out (no IO);
//! - [`server`]: HTTPS on `--httpsAddr` with the control plane's serving certificate
//!   ([`crate::tls::SecureTls`]), the paths `/validate` and `/validate/...`, the body
//!   checks (empty: 400; over 6 MiB: 400; not `application/json`: 415);
//! - [`WebhookMetrics`]: istiod's `galley_validation_*` counters.

pub mod review;
pub mod server;

use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::metrics::IstioCounter;
use review::Verdict;

type Labels = Vec<(&'static str, String)>;

/// istiod's webhook metrics (`pkg/webhooks/validation/server/monitoring.go`), with its
/// names and labels.
#[derive(Clone, Debug, Default)]
pub struct WebhookMetrics {
    /// `galley_validation_passed{group,version,resource}`.
    pub passed: Family<Labels, IstioCounter>,
    /// `galley_validation_failed{group,version,resource,reason,dry_run}`.
    pub failed: Family<Labels, IstioCounter>,
    /// `galley_validation_http_error{status}`.
    pub http_error: Family<Labels, IstioCounter>,
}

impl WebhookMetrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &mut Registry) -> Self {
        let m = WebhookMetrics::default();
        registry.register(
            "galley_validation_passed",
            "Resource is valid",
            m.passed.clone(),
        );
        registry.register(
            "galley_validation_failed",
            "Resource validation failed",
            m.failed.clone(),
        );
        registry.register(
            "galley_validation_http_error",
            "Resource validation http serve errors",
            m.http_error.clone(),
        );
        m
    }

    /// Counts what a review came to.
    pub fn record(&self, verdict: &Verdict) {
        match verdict {
            Verdict::Passed { resource } => {
                self.passed
                    .get_or_create(&vec![
                        ("group", resource.group.clone()),
                        ("version", resource.version.clone()),
                        ("resource", resource.resource.clone()),
                    ])
                    .inc();
            }
            Verdict::Failed {
                resource,
                reason,
                dry_run,
            } => {
                self.failed
                    .get_or_create(&vec![
                        ("group", resource.group.clone()),
                        ("version", resource.version.clone()),
                        ("resource", resource.resource.clone()),
                        ("reason", reason.label().to_string()),
                        ("dry_run", dry_run.to_string()),
                    ])
                    .inc();
            }
            Verdict::Undecodable => {}
        }
    }

    /// Counts an HTTP error answer.
    pub fn http_error(&self, status: u16) {
        self.http_error
            .get_or_create(&vec![("status", status.to_string())])
            .inc();
    }
}

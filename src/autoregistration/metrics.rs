//! Auto-registration metrics, under Istio's names (no labels, as in Istio).

use prometheus_client::registry::Registry;

use crate::metrics::IstioCounter;

/// Counters of the WorkloadEntry controller.
#[derive(Debug, Default)]
pub struct AutoRegistrationMetrics {
    /// `auto_registration_success_total`: entries created for a connecting workload.
    pub success: IstioCounter,
    /// `auto_registration_updates_total`: existing auto-registered entries marked
    /// connected again.
    pub updates: IstioCounter,
    /// `auto_registration_unregister_total`: auto-registered entries marked
    /// disconnected.
    pub unregister: IstioCounter,
    /// `auto_registration_deletes_total`: auto-registered entries removed after the
    /// grace period (by the delayed check or the periodic sweep).
    pub deletes: IstioCounter,
    /// `auto_registration_errors_total`: failed registrations, unregistrations and
    /// deletions.
    pub errors: IstioCounter,
}

impl AutoRegistrationMetrics {
    /// Creates and registers the counters.
    pub fn new(registry: &mut Registry) -> AutoRegistrationMetrics {
        let m = AutoRegistrationMetrics::default();
        for (name, help, metric) in [
            (
                "auto_registration_success_total",
                "Total number of successful auto registrations.",
                &m.success,
            ),
            (
                "auto_registration_updates_total",
                "Total number of auto registration updates.",
                &m.updates,
            ),
            (
                "auto_registration_unregister_total",
                "Total number of unregistrations.",
                &m.unregister,
            ),
            (
                "auto_registration_deletes_total",
                "Total number of auto registration cleaned up by periodic timer.",
                &m.deletes,
            ),
            (
                "auto_registration_errors_total",
                "Total number of auto registration errors.",
                &m.errors,
            ),
        ] {
            registry.register(name, help, metric.clone());
        }
        m
    }
}

//! Shared metric building blocks.
//!
//! Metrics are declared next to the code that records them (`ads::metrics`,
//! `push::metrics`) and registered into a registry passed in at start-up. Names are
//! Istio's, so dashboards built for istiod work unchanged. Istio exports its counters
//! without the OpenMetrics `_total` suffix; prometheus-client always appends it to
//! counter types, so Istio-named counters here are monotonic gauges ([`IstioCounter`]):
//! the sample name is exactly Istio's and `rate()` works the same.

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

/// A counter exported under Istio's exact name (see the module docs). Only ever
/// incremented.
pub type IstioCounter = Gauge;

/// A label set with one `type` label (`cds`, `eds`, ... or a push reason).
pub type TypeLabel = [(&'static str, &'static str); 1];

/// A family of Istio-named counters by `type`.
pub type CounterByType = Family<TypeLabel, IstioCounter>;

/// A family of histograms by `type`.
pub type HistogramByType = Family<TypeLabel, Histogram, fn() -> Histogram>;

/// Istio's convergence/debounce buckets, in seconds.
pub fn convergence_buckets() -> Histogram {
    Histogram::new([0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0])
}

/// Buckets for short operations (push/generation/send), in seconds.
pub fn duration_buckets() -> Histogram {
    Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 3.0, 5.0, 10.0])
}

/// Size buckets in bytes (Istio's `pilot_xds_config_size_bytes`).
pub fn size_buckets() -> Histogram {
    Histogram::new([
        1.0,
        10_000.0,
        1_000_000.0,
        4_000_000.0,
        10_000_000.0,
        40_000_000.0,
    ])
}

/// The `type` label value.
pub fn type_label(value: &'static str) -> TypeLabel {
    [("type", value)]
}

//! Prometheus metrics read at scrape time.
//!
//! Every crate defines the metrics of the state it owns and registers them into the
//! [`Registry`](prometheus_client::registry::Registry) it is handed (here: the
//! aggregate's per-registry state, the mock-registry file and the config directory;
//! `meshfed-kube` and `meshfed-consul` theirs). The serving side only encodes the
//! registry; it knows nothing of what a registry counts.
//!
//! The families are gauges read from the component's live counters on each scrape
//! (a [`Collector`](prometheus_client::collector::Collector)), so a family is
//! listed, with its `# HELP` and `# TYPE`, even while it has no rows.

use std::fmt;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

/// Encodes one gauge family `name` whose rows each carry one label, `label`, with the
/// given value: `name{label="value"} gauge`, in the order given.
pub fn encode_gauges<V: AsRef<str>>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    rows: impl IntoIterator<Item = (V, i64)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (value, gauge) in rows {
        let labels = [(label, value.as_ref())];
        ConstGauge::new(gauge).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

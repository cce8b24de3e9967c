//! Per-source metrics of the `xds://` config sources, labelled by the source's
//! address.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The source a series is about.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    /// `xds://host:port`.
    pub source: String,
}

/// Why a stream to a source ended or could not start.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum ErrorKind {
    /// The connection could not be made.
    Connect,
    /// The stream failed or the server ended it.
    Stream,
}

/// [`ErrorKind`] with the source.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    pub source: String,
    pub reason: ErrorKind,
}

/// The config sources' metrics.
#[derive(Debug, Default)]
pub struct SourceMetrics {
    /// `meshfed_config_source_connected{source}`: 1 while a stream is open.
    pub connected: Family<SourceLabel, Gauge>,
    /// `meshfed_config_source_stale{source}`: 1 while the objects held are the last
    /// known good of a stream that ended.
    pub stale: Family<SourceLabel, Gauge>,
    /// `meshfed_config_source_objects{source}`: objects held.
    pub objects: Family<SourceLabel, Gauge>,
    /// `meshfed_config_source_rejected{source}`: objects of the last responses not
    /// taken (undecodable or invalid).
    pub rejected: Family<SourceLabel, Gauge>,
    /// `meshfed_config_source_last_update_seconds{source}`: when the last response
    /// was applied (seconds since the epoch).
    pub last_update: Family<SourceLabel, Gauge<f64, AtomicU64>>,
    /// `meshfed_config_source_errors_total{source,reason}`: failed connections and
    /// ended streams.
    pub errors: Family<ErrorLabel, Counter>,
    /// `meshfed_config_source_responses_total{source}`: responses applied (each
    /// acknowledged).
    pub responses: Family<SourceLabel, Counter>,
}

impl SourceMetrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &mut Registry) -> SourceMetrics {
        let m = SourceMetrics::default();
        registry.register(
            "meshfed_config_source_connected",
            "1 while a stream to the config source is open",
            m.connected.clone(),
        );
        registry.register(
            "meshfed_config_source_stale",
            "1 while the config source's objects are the last known good of a stream that ended",
            m.stale.clone(),
        );
        registry.register(
            "meshfed_config_source_objects",
            "Objects held from the config source",
            m.objects.clone(),
        );
        registry.register(
            "meshfed_config_source_rejected",
            "Objects of the config source's last responses that were rejected (undecodable or invalid)",
            m.rejected.clone(),
        );
        registry.register(
            "meshfed_config_source_last_update_seconds",
            "When the config source's last response was applied (seconds since the epoch)",
            m.last_update.clone(),
        );
        registry.register(
            "meshfed_config_source_errors",
            "Failed connections to and ended streams of the config source",
            m.errors.clone(),
        );
        registry.register(
            "meshfed_config_source_responses",
            "Responses of the config source applied and acknowledged",
            m.responses.clone(),
        );
        m
    }
}

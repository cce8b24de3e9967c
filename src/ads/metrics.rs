//! Metrics recorded by the ADS server.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::metrics::{
    CounterByType, HistogramByType, IstioCounter, convergence_buckets, duration_buckets,
    size_buckets, type_label,
};
use crate::xds::TypeUrl;

/// ADS metrics (Istio names).
#[derive(Debug)]
pub struct XdsMetrics {
    /// `pilot_xds`: connected xDS clients.
    pub connected: Gauge,
    /// `pilot_xds_pushes{type}`: responses sent, and send errors as `<type>_senderr`.
    pub pushes: CounterByType,
    /// `pilot_xds_push_time{type}`: generate + send time per response.
    pub push_time: HistogramByType,
    /// `pilot_xds_config_size_bytes{type}`: response sizes.
    pub config_size: HistogramByType,
    /// `pilot_proxy_convergence_time`: change -> pushed to this proxy.
    pub convergence: Histogram,
    /// `pilot_proxy_queue_time`: waiting for a push slot.
    pub queue_time: Histogram,
    /// `pilot_total_xds_rejects`: NACKs of any type.
    pub total_rejects: IstioCounter,
    /// `pilot_xds_{cds,eds,lds,rds}_reject`.
    pub rejects: [IstioCounter; TypeUrl::ALL.len()],
    /// `pilot_xds_expired_nonce{type}`: stale requests ignored.
    pub expired_nonce: CounterByType,
    /// `pilot_total_xds_internal_errors`: streams ended by a server-side error.
    pub internal_errors: IstioCounter,
    /// `meshfed_xds_pushes_unchanged{type}`: pushes not sent because the proxy
    /// already holds exactly that config.
    pub unchanged: CounterByType,
    /// `meshfed_xds_request_errors{reason}`: streams refused for a protocol error
    /// (`malformed`, `compressed`, `oversize`, `truncated`, `buffer_limit`, `bad_node`),
    /// or because the WorkloadEntry controller refused the proxy
    /// (`registration_failed`).
    pub request_errors: Family<ReasonLabel, Counter>,
    /// `meshfed_xds_send_timeouts`: connections closed because the peer took no
    /// response within `--xdsSendTimeout`.
    pub send_timeouts: Counter,
    /// `meshfed_xds_unknown_type_requests`: requests for a type this server does
    /// not serve, answered with no resources.
    pub unknown_types: Counter,
    /// `meshfed_xds_generator_fallbacks`: streams whose `GENERATOR` metadata is
    /// unknown, served by the default generators.
    pub generator_fallbacks: Counter,
    /// `meshfed_xds_debug_requests{type,result}`: Istio debug-type and CSDS
    /// requests, `answered` or `refused` (authorization).
    pub debug_requests: Family<DebugLabel, Counter>,
}

/// `type` and `result` labels of a debug request.
pub type DebugLabel = [(&'static str, &'static str); 2];

/// The bounded `type` label of a debug type URL.
pub fn debug_type_label(type_url: &str) -> &'static str {
    match type_url {
        super::debug::SYNCZ_TYPE => "syncz",
        super::debug::CONFIG_DUMP_TYPE => "config_dump",
        super::debug::DEBUG_TYPE => "debug",
        super::debug::CONNECTIONS_TYPE | super::debug::CONNECT_TYPE => "connections",
        _ => "other",
    }
}

/// A `reason` label.
pub type ReasonLabel = [(&'static str, &'static str); 1];

impl XdsMetrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &mut Registry) -> Self {
        let m = XdsMetrics {
            connected: Gauge::default(),
            pushes: Family::default(),
            push_time: Family::new_with_constructor(duration_buckets as fn() -> Histogram),
            config_size: Family::new_with_constructor(size_buckets as fn() -> Histogram),
            convergence: convergence_buckets(),
            queue_time: duration_buckets(),
            total_rejects: IstioCounter::default(),
            rejects: Default::default(),
            expired_nonce: Family::default(),
            internal_errors: IstioCounter::default(),
            unchanged: Family::default(),
            request_errors: Family::default(),
            send_timeouts: Counter::default(),
            unknown_types: Counter::default(),
            generator_fallbacks: Counter::default(),
            debug_requests: Family::default(),
        };
        registry.register(
            "pilot_xds",
            "Number of endpoints connected to this pilot using XDS",
            m.connected.clone(),
        );
        registry.register(
            "pilot_xds_pushes",
            "Pilot build and send errors for lds, rds, cds and eds",
            m.pushes.clone(),
        );
        registry.register(
            "pilot_xds_push_time",
            "Total time in seconds Pilot takes to push lds, rds, cds and eds",
            m.push_time.clone(),
        );
        registry.register(
            "pilot_xds_config_size_bytes",
            "Distribution of configuration sizes pushed to clients",
            m.config_size.clone(),
        );
        registry.register("pilot_proxy_convergence_time", "Delay in seconds between config change and a proxy receiving all required configuration", m.convergence.clone());
        registry.register(
            "pilot_proxy_queue_time",
            "Time in seconds a proxy is in the push queue before being dequeued",
            m.queue_time.clone(),
        );
        registry.register(
            "pilot_total_xds_rejects",
            "Total number of XDS responses from pilot rejected by proxy",
            m.total_rejects.clone(),
        );
        for (t, metric) in TypeUrl::ALL.iter().zip(&m.rejects) {
            registry.register(
                format!("pilot_xds_{}_reject", t.short()),
                format!("Pilot rejected {} configs", t.short().to_uppercase()),
                metric.clone(),
            );
        }
        registry.register(
            "pilot_xds_expired_nonce",
            "Total number of XDS requests with an expired nonce",
            m.expired_nonce.clone(),
        );
        registry.register(
            "pilot_total_xds_internal_errors",
            "Total number of internal XDS errors in pilot",
            m.internal_errors.clone(),
        );
        registry.register(
            "meshfed_xds_pushes_unchanged",
            "Pushes of a type not sent because the proxy already held exactly that config",
            m.unchanged.clone(),
        );
        registry.register(
            "meshfed_xds_request_errors",
            "xDS streams refused because the client broke the protocol, by reason",
            m.request_errors.clone(),
        );
        registry.register(
            "meshfed_xds_send_timeouts",
            "xDS connections closed because the client read no response within --xdsSendTimeout",
            m.send_timeouts.clone(),
        );
        registry.register(
            "meshfed_xds_unknown_type_requests",
            "xDS requests for a type this server does not serve, answered with no resources",
            m.unknown_types.clone(),
        );
        registry.register(
            "meshfed_xds_generator_fallbacks",
            "xDS streams whose GENERATOR node metadata is unknown, served by the default generators",
            m.generator_fallbacks.clone(),
        );
        registry.register(
            "meshfed_xds_debug_requests",
            "Istio debug-type (istio.io/debug/*) and CSDS requests, by type and result",
            m.debug_requests.clone(),
        );
        // A zero series for every type, so that `rate()` and alerts have a series
        // before the first event.
        for t in TypeUrl::ALL {
            drop(m.expired_nonce.get_or_create(&type_label(t.short())));
            drop(m.unchanged.get_or_create(&type_label(t.short())));
        }
        m
    }

    /// Records a debug-type or CSDS request.
    pub fn record_debug(&self, r#type: &'static str, result: &'static str) {
        self.debug_requests
            .get_or_create(&[("type", r#type), ("result", result)])
            .inc();
    }

    /// Records a stream refused for a protocol error.
    pub fn record_request_error(&self, reason: &'static str) {
        self.request_errors
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// Records a push skipped because nothing changed for the proxy.
    pub fn record_unchanged(&self, type_url: TypeUrl) {
        self.unchanged
            .get_or_create(&type_label(type_url.short()))
            .inc();
    }

    /// Records a NACK of `type_url` (NDS has no counter of its own, as in Istio).
    pub fn record_reject(&self, type_url: TypeUrl) {
        self.total_rejects.inc();
        if let Some(counter) = TypeUrl::ALL
            .iter()
            .position(|t| *t == type_url)
            .and_then(|i| self.rejects.get(i))
        {
            counter.inc();
        }
    }

    /// Records one response sent.
    pub fn record_push(&self, type_url: TypeUrl, bytes: usize, seconds: f64) {
        self.pushes
            .get_or_create(&type_label(type_url.short()))
            .inc();
        self.push_time
            .get_or_create(&type_label(type_url.short()))
            .observe(seconds);
        self.config_size
            .get_or_create(&type_label(type_url.short()))
            .observe(bytes as f64);
    }

    /// Records a failed send.
    pub fn record_send_error(&self, type_url: TypeUrl) {
        let label = match type_url {
            TypeUrl::Cluster => "cds_senderr",
            TypeUrl::Endpoint => "eds_senderr",
            TypeUrl::Listener => "lds_senderr",
            TypeUrl::Route => "rds_senderr",
            TypeUrl::Secret => "sds_senderr",
            TypeUrl::NameTable => "nds_senderr",
            TypeUrl::Address => "wds_senderr",
            TypeUrl::Authorization => "authorization_senderr",
            TypeUrl::ExtensionConfig => "ecds_senderr",
            TypeUrl::Mcp(_) => "mcp_senderr",
        };
        self.pushes.get_or_create(&type_label(label)).inc();
    }
}

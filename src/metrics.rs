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

/// The standard `process_*` metrics every Prometheus client exports (istiod's Go
/// collector among them), read from `/proc/self` at each scrape: CPU seconds, resident
/// and virtual memory, threads, open and maximum file descriptors, start time. Nothing
/// is exported where `/proc` cannot be read.
#[derive(Debug)]
pub struct ProcessMetrics {
    start: std::time::SystemTime,
}

/// `USER_HZ`, the unit of the CPU times in `/proc/<pid>/stat`: 100 on every Linux
/// architecture (a fixed part of the kernel's user-space ABI).
const USER_HZ: f64 = 100.0;

/// What one scrape reads from `/proc/self`.
#[derive(Debug, Default, PartialEq)]
struct ProcessSample {
    cpu_seconds: f64,
    threads: i64,
    resident_bytes: i64,
    virtual_bytes: i64,
    open_fds: i64,
}

impl ProcessMetrics {
    /// Registers the collector; the start time is taken now.
    pub fn register(registry: &mut prometheus_client::registry::Registry) {
        registry.register_collector(Box::new(ProcessMetrics {
            start: std::time::SystemTime::now(),
        }));
    }

    fn sample() -> Option<ProcessSample> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let mut sample = parse_process(&stat, &status)?;
        sample.open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as i64;
        Some(sample)
    }
}

/// Reads `/proc/self/stat` (CPU ticks, threads) and `/proc/self/status` (VmRSS,
/// VmSize in kB).
fn parse_process(stat: &str, status: &str) -> Option<ProcessSample> {
    // The command name is in parentheses and may hold spaces: fields count from after
    // the last `)`. Field 3 (state) is the first after it; utime and stime are fields
    // 14 and 15, num_threads field 20.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Option<f64> { fields.get(n - 3)?.parse().ok() };
    let kb = |key: &str| -> Option<i64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        let value: i64 = line[key.len()..].split_whitespace().next()?.parse().ok()?;
        Some(value * 1024)
    };
    Some(ProcessSample {
        cpu_seconds: (field(14)? + field(15)?) / USER_HZ,
        threads: field(20)? as i64,
        resident_bytes: kb("VmRSS:")?,
        virtual_bytes: kb("VmSize:")?,
        open_fds: 0,
    })
}

impl prometheus_client::collector::Collector for ProcessMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::MetricType;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;

        let Some(sample) = Self::sample() else {
            return Ok(());
        };
        ConstCounter::new(sample.cpu_seconds).encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            MetricType::Counter,
        )?)?;
        let gauges: [(&str, &str, f64); 5] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                sample.resident_bytes as f64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                sample.virtual_bytes as f64,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                sample.open_fds as f64,
            ),
            (
                "process_threads",
                "Number of OS threads in the process.",
                sample.threads as f64,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                self.start
                    .duration_since(std::time::SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or_default(),
            ),
        ];
        for (name, help, value) in gauges {
            ConstGauge::new(value).encode(encoder.encode_descriptor(
                name,
                help,
                None,
                MetricType::Gauge,
            )?)?;
        }
        if let Ok((_, hard)) = rlimit::getrlimit(rlimit::Resource::NOFILE) {
            ConstGauge::new(hard.min(i64::MAX as u64) as i64).encode(
                encoder.encode_descriptor(
                    "process_max_fds",
                    "Maximum number of open file descriptors.",
                    None,
                    MetricType::Gauge,
                )?,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod process_tests {
    use super::*;

    #[test]
    fn proc_stat_and_status_parse_with_a_spaced_command_name() {
        let stat = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                    250 150 0 0 20 0 7 0 12345 100000 2000 18446744073709551615";
        let status = "Name:\tmeshfed\nVmSize:\t  204800 kB\nVmRSS:\t   10240 kB\nThreads:\t7\n";
        assert_eq!(
            parse_process(stat, status),
            Some(ProcessSample {
                cpu_seconds: 4.0,
                threads: 7,
                resident_bytes: 10_485_760,
                virtual_bytes: 209_715_200,
                open_fds: 0,
            })
        );
        assert_eq!(parse_process("garbage", status), None);
    }

    #[test]
    fn this_process_is_measured() {
        let mut registry = prometheus_client::registry::Registry::default();
        ProcessMetrics::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_threads ",
            "process_start_time_seconds ",
        ] {
            let value: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap_or_else(|| panic!("{name}missing:\n{text}"))
                .parse()
                .unwrap();
            assert!(value >= 0.0, "{name}{value}");
        }
        assert!(!text.contains("process_resident_memory_bytes 0\n"));
    }
}

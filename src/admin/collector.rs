//! Metrics read at scrape time from the registries and file followers: per-registry
//! sync state, staleness and size, and file reload outcomes.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use meshfed_registry::Aggregate;
use meshfed_registry::config::ConfigDirStatus;
use meshfed_registry::mock_file::MockFileStatus;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

/// Reads registry and file-follower state on every scrape.
#[derive(Debug)]
pub struct StateCollector {
    pub aggregate: Arc<Aggregate>,
    pub mock_file: Option<MockFileStatus>,
    pub config_dir: Option<ConfigDirStatus>,
    /// The remote-cluster secret controller, when multicluster is on.
    pub multicluster: Option<Arc<meshfed_kube::SecretController>>,
    /// The Consul registry's counters, when Consul is on.
    pub consul: Option<Arc<meshfed_consul::ConsulStats>>,
    /// The Istio config store fed from the Kubernetes API server, when on.
    pub kube_config: Option<meshfed_kube::KubeConfigStore>,
}

fn gauge_family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(&'static str, String, i64)],
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (key, value, v) in rows {
        let labels = [(*key, value.clone())];
        ConstGauge::new(*v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let registries = self.aggregate.registries();
        let rows = |f: &dyn Fn(&dyn meshfed_registry::ServiceRegistry) -> i64| -> Vec<(&'static str, String, i64)> {
            registries.iter().map(|r| ("registry", r.shard_key().to_string(), f(r.as_ref()))).collect()
        };
        gauge_family(
            &mut encoder,
            "meshfed_registry_synced",
            "1 once the registry finished its initial sync",
            &rows(&|r| i64::from(r.has_synced())),
        )?;
        gauge_family(
            &mut encoder,
            "meshfed_registry_stale",
            "1 while the registry's source is unreachable and its last known view is served",
            &rows(&|r| i64::from(r.is_stale())),
        )?;
        gauge_family(
            &mut encoder,
            "meshfed_registry_services",
            "Services the registry holds (before merging)",
            &rows(&|r| r.services().len() as i64),
        )?;
        if let Some(status) = &self.mock_file {
            gauge_family(
                &mut encoder,
                "meshfed_mock_file_reloads",
                "Mock registry file loads by result (failed loads keep the last good content)",
                &[
                    (
                        "result",
                        "ok".into(),
                        status.reloads_ok.load(Ordering::Relaxed) as i64,
                    ),
                    (
                        "result",
                        "failed".into(),
                        status.reloads_failed.load(Ordering::Relaxed) as i64,
                    ),
                ],
            )?;
        }
        if let Some(status) = &self.config_dir {
            gauge_family(
                &mut encoder,
                "meshfed_config_dir_reloads",
                "Config directory reloads by result (failed = something was rejected)",
                &[
                    (
                        "result",
                        "ok".into(),
                        status.reloads_ok.load(Ordering::Relaxed) as i64,
                    ),
                    (
                        "result",
                        "failed".into(),
                        status.reloads_failed.load(Ordering::Relaxed) as i64,
                    ),
                ],
            )?;
        }
        if let Some(stats) = &self.consul {
            gauge_family(
                &mut encoder,
                "meshfed_consul_requests",
                "Consul HTTP answers and errors (errors back off; the last endpoints stay served)",
                &[
                    ("result", "ok".into(), stats.answers() as i64),
                    ("result", "error".into(), stats.errors() as i64),
                ],
            )?;
            gauge_family(
                &mut encoder,
                "meshfed_consul_skipped",
                "Malformed Consul catalog entries skipped, by kind",
                &[
                    ("kind", "entry".into(), stats.skipped_entries() as i64),
                    ("kind", "service".into(), stats.skipped_services() as i64),
                ],
            )?;
            gauge_family(
                &mut encoder,
                "meshfed_consul_index_resets",
                "Blocking-query indexes that went backwards and were reset",
                &[("registry", "consul".into(), stats.index_resets() as i64)],
            )?;
        }
        if let Some(store) = &self.kube_config {
            use meshfed_registry::config::Kind;
            let stats = store.stats();
            let per_kind = |f: &dyn Fn(Kind) -> u64| -> Vec<(&'static str, String, i64)> {
                Kind::ALL
                    .iter()
                    .map(|k| ("kind", k.as_str().to_string(), f(*k) as i64))
                    .collect()
            };
            gauge_family(
                &mut encoder,
                "meshfed_kube_config_objects",
                "Valid Istio config objects read from the Kubernetes API server, by kind",
                &per_kind(&|k| stats.objects(k)),
            )?;
            gauge_family(
                &mut encoder,
                "meshfed_kube_config_watch_errors",
                "Failed lists and watches of Istio config on the Kubernetes API server (retried with backoff), by kind",
                &per_kind(&|k| stats.watch_errors(k)),
            )?;
            gauge_family(
                &mut encoder,
                "meshfed_kube_config_relists",
                "Relists of Istio config after the API server expired a watch (410 Gone), by kind",
                &per_kind(&|k| stats.relists(k)),
            )?;
            gauge_family(
                &mut encoder,
                "meshfed_kube_config_rejections",
                "Invalid Istio config objects from the Kubernetes API server logged and rejected",
                &[("registry", "kubernetes".into(), stats.rejections() as i64)],
            )?;
        }
        if let Some(controller) = &self.multicluster {
            let stats = controller.stats();
            gauge_family(
                &mut encoder,
                "istiod_managed_clusters",
                "Clusters managed by this control plane, by type",
                &[
                    ("cluster_type", "local".into(), 1),
                    ("cluster_type", "remote".into(), stats.clusters() as i64),
                ],
            )?;
            use meshfed_kube::EventType;
            gauge_family(
                &mut encoder,
                "remote_cluster_secret_events_total",
                "Remote cluster secret events, by type",
                &[
                    (
                        "event",
                        "add".into(),
                        stats.secret_events(EventType::Add) as i64,
                    ),
                    (
                        "event",
                        "update".into(),
                        stats.secret_events(EventType::Update) as i64,
                    ),
                    (
                        "event",
                        "delete".into(),
                        stats.secret_events(EventType::Delete) as i64,
                    ),
                ],
            )?;
            let rows: Vec<(&'static str, String, i64)> = controller
                .clusters()
                .into_iter()
                .map(|c| ("cluster", c.cluster.to_string(), i64::from(c.synced)))
                .collect();
            gauge_family(
                &mut encoder,
                "istiod_remote_cluster_sync_status",
                "1 once a remote cluster's registry has synced",
                &rows,
            )?;
            gauge_family(
                &mut encoder,
                "meshfed_kubeconfig_rejected",
                "Remote cluster kubeconfigs refused (untrusted options, parse or client errors)",
                &[("reason", "any".into(), stats.kubeconfig_rejected() as i64)],
            )?;
        }
        Ok(())
    }
}

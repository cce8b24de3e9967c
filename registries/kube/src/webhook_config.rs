//! The `caBundle` and `failurePolicy` of the control plane's
//! `ValidatingWebhookConfiguration`s, kept current by the leader as Istio's validation
//! controller (`pkg/webhooks/validation/controller`) keeps them:
//!
//! - which configurations: those labelled `istio.io/rev=<revision>` (the chart labels
//!   `istio-validator-<revision>-<namespace>` and `istiod-default-validator` so);
//! - every webhook of such a configuration gets the CA's root bundle as `caBundle`;
//! - `failurePolicy` starts as the chart writes it (`Ignore`) and becomes `Fail` once
//!   the webhook is known to answer: a dry-run create of an invalid Gateway must be
//!   denied by an admission webhook ([`FailCloseProbe`], [`DryRunProbe`]). Until then
//!   only the bundle is written and the configuration is tried again with backoff.
//!
//! Every replica watches the configurations; only the leader (the Lease of
//! [`crate::lease`]) writes. A write re-reads the object and replaces it (`update`, as
//! Istio does). Failures (forbidden, conflicts, an unreachable API server) are logged
//! once per configuration and reason with what to do, counted in
//! `galley_validation_config_update_error{error}`, and retried with exponential backoff
//! (100 ms to 1 min, Istio's rate limiter); nothing here stops serving.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use meshfed_registry::read::Backoff;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::lease::LeaseState;

/// The configuration type this module keeps (re-exported for callers and tests).
pub use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;

/// The label that ties a configuration to a control-plane revision.
pub const REVISION_LABEL: &str = "istio.io/rev";
/// The first retry delay after a failed or incomplete reconcile (Istio's rate limiter).
const BACKOFF_BASE: Duration = Duration::from_millis(100);
/// The longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Whether the webhook may be made fail-closed: Istio's check that an invalid object is
/// really denied by the webhook before `failurePolicy: Fail` can lock users out.
pub trait FailCloseProbe: Send + Sync {
    /// `Ok` when invalid config is denied; `Err` says why not yet.
    fn check(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>>;
}

/// Istio's probe: a dry-run create of Gateway `invalid-gateway` (no servers, so
/// invalid) in the system namespace, labelled with the revision so that this revision's
/// webhook judges it. Needs `create` on `networking.istio.io` gateways there.
#[derive(Clone)]
pub struct DryRunProbe {
    client: kube::Client,
    namespace: String,
    revision: String,
}

impl fmt::Debug for DryRunProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DryRunProbe")
            .field("namespace", &self.namespace)
            .field("revision", &self.revision)
            .finish_non_exhaustive()
    }
}

impl DryRunProbe {
    /// The probe in the system namespace `namespace` for `revision`.
    pub fn new(client: kube::Client, namespace: &str, revision: &str) -> Self {
        DryRunProbe {
            client,
            namespace: namespace.to_string(),
            revision: revision.to_string(),
        }
    }
}

impl FailCloseProbe for DryRunProbe {
    fn check(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        Box::pin(async move {
            let gvk = GroupVersionKind::gvk("networking.istio.io", "v1alpha3", "Gateway");
            let resource = ApiResource::from_gvk_with_plural(&gvk, "gateways");
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), &self.namespace, &resource);
            let mut gateway = DynamicObject::new("invalid-gateway", &resource);
            gateway.metadata.namespace = Some(self.namespace.clone());
            gateway.metadata.labels =
                Some([(REVISION_LABEL.to_string(), self.revision.clone())].into());
            gateway.data = serde_json::json!({ "spec": {} });
            let params = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            let result = api.create(&params, &gateway).await;
            probe_verdict(result.map(|_| ()).map_err(|e| e.to_string()))
        })
    }
}

/// Istio's reading of the dry-run's outcome: denied by a webhook is ready; a missing
/// Gateway CRD or a webhook without dry-run support cannot be checked and counts as
/// ready; accepted, or refused for another reason, is not ready.
pub fn probe_verdict(result: Result<(), String>) -> Result<(), String> {
    let err = match result {
        Ok(()) => return Err("the invalid test Gateway was not rejected".to_string()),
        Err(err) => err,
    };
    if err.contains("denied the request") {
        return Ok(());
    }
    if err.contains("the server could not find the requested resource") {
        warn!(
            "no Gateway CRD: cannot check that the validating webhook denies invalid config; assuming it does"
        );
        return Ok(());
    }
    if err.contains("does not support dry run") {
        warn!(
            "a validating webhook does not support dry run: cannot check that invalid config is denied; assuming it is: {err}"
        );
        return Ok(());
    }
    Err(format!(
        "the invalid test Gateway was rejected for the wrong reason: {err}"
    ))
}

/// What the patcher did, for tests and metrics.
#[derive(Debug, Default)]
pub struct WebhookConfigStats {
    updates: AtomicU64,
    /// Failed writes or reads by reason (`Forbidden`, `Conflict`, ...).
    errors: Mutex<BTreeMap<String, u64>>,
    /// Configurations selected now.
    selected: AtomicU64,
}

impl WebhookConfigStats {
    /// Configurations written successfully.
    pub fn updates(&self) -> u64 {
        self.updates.load(Ordering::Relaxed)
    }

    /// Failed reads or writes, all reasons together.
    pub fn errors(&self) -> u64 {
        self.errors.lock().unwrap().values().sum()
    }

    /// Failed reads or writes for `reason`.
    pub fn errors_for(&self, reason: &str) -> u64 {
        self.errors
            .lock()
            .unwrap()
            .get(reason)
            .copied()
            .unwrap_or(0)
    }

    fn error(&self, reason: &str) {
        *self
            .errors
            .lock()
            .unwrap()
            .entry(reason.to_string())
            .or_default() += 1;
    }

    /// Registers Istio's `galley_validation_config_updates`,
    /// `galley_validation_config_update_error{error}` and
    /// `meshfed_validation_webhook_configs` (configurations selected by the revision
    /// label), read on every scrape.
    pub fn register_metrics(self: &Arc<Self>, registry: &mut Registry) {
        registry.register_collector(Box::new(StatsCollector(self.clone())));
    }
}

#[derive(Debug)]
struct StatsCollector(Arc<WebhookConfigStats>);

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        // Istio's sums are exported without `_total`: gauges keep the names.
        let updates = encoder.encode_descriptor(
            "galley_validation_config_updates",
            "ValidatingWebhookConfigurations written (caBundle, failurePolicy) by this replica",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(self.0.updates() as i64).encode(updates)?;
        let mut errors = encoder.encode_descriptor(
            "galley_validation_config_update_error",
            "Failed reads or writes of ValidatingWebhookConfigurations, by error reason",
            None,
            MetricType::Gauge,
        )?;
        for (reason, count) in self.0.errors.lock().unwrap().iter() {
            let labels = [("error", reason.as_str())];
            ConstGauge::new(*count as i64).encode(errors.encode_family(&labels)?)?;
        }
        let selected = encoder.encode_descriptor(
            "meshfed_validation_webhook_configs",
            "ValidatingWebhookConfigurations selected by istio.io/rev for caBundle patching",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(self.0.selected.load(Ordering::Relaxed) as i64).encode(selected)?;
        Ok(())
    }
}

/// What one configuration needs: the plain-data rule of the controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Needed {
    /// Some webhook's `caBundle` differs from the root.
    pub ca_bundle: bool,
    /// Some webhook's `failurePolicy` is not `Fail`.
    pub fail_close: bool,
}

impl Needed {
    /// What `config` needs for `root`.
    pub fn of(config: &ValidatingWebhookConfiguration, root: &[u8]) -> Needed {
        let hooks = config.webhooks.as_deref().unwrap_or_default();
        Needed {
            ca_bundle: hooks
                .iter()
                .any(|h| h.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()) != Some(root)),
            fail_close: hooks
                .iter()
                .any(|h| h.failure_policy.as_deref().is_some_and(|p| p != "Fail")),
        }
    }

    /// Nothing to write.
    pub fn is_none(self) -> bool {
        !self.ca_bundle && !self.fail_close
    }
}

/// `config` with `root` as every webhook's bundle and, when `fail_close`,
/// `failurePolicy: Fail` on every webhook.
pub fn patched(
    config: &ValidatingWebhookConfiguration,
    root: &[u8],
    fail_close: bool,
) -> ValidatingWebhookConfiguration {
    let mut updated = config.clone();
    for hook in updated.webhooks.iter_mut().flatten() {
        hook.client_config.ca_bundle = Some(ByteString(root.to_vec()));
        if fail_close {
            hook.failure_policy = Some("Fail".to_string());
        }
    }
    updated
}

/// How one reconcile of a configuration ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Up to date (or gone).
    Done,
    /// Bundle written, still fail-open: try again later.
    NotReady(String),
    /// A read or write failed, with the API server's reason.
    Failed { reason: String, message: String },
}

/// The patcher's state between events: no IO.
#[derive(Debug, Default)]
struct View {
    /// Selected configurations by name, from the watch.
    configs: BTreeMap<String, ValidatingWebhookConfiguration>,
    listing: Option<BTreeMap<String, ValidatingWebhookConfiguration>>,
    synced: bool,
    /// Retry delays per configuration that failed, from the first failure in a row.
    attempts: BTreeMap<String, Backoff>,
    /// The (configuration, reason) pairs already logged at warn.
    logged: BTreeSet<(String, String)>,
}

impl View {
    fn on_event(&mut self, event: Event<ValidatingWebhookConfiguration>) {
        let name = |c: &ValidatingWebhookConfiguration| c.metadata.name.clone().unwrap_or_default();
        match event {
            Event::Init => self.listing = Some(BTreeMap::new()),
            Event::InitApply(c) => {
                if let Some(listing) = &mut self.listing {
                    listing.insert(name(&c), c);
                }
            }
            Event::InitDone => {
                self.configs = self.listing.take().unwrap_or_default();
                self.synced = true;
            }
            Event::Apply(c) => {
                self.configs.insert(name(&c), c);
            }
            Event::Delete(c) => {
                let name = name(&c);
                self.configs.remove(&name);
                self.attempts.remove(&name);
            }
        }
    }

    fn backoff(&mut self, name: &str) -> Duration {
        self.attempts
            .entry(name.to_string())
            .or_insert_with(|| Backoff::new(BACKOFF_BASE, BACKOFF_MAX))
            .next_delay()
    }
}

/// Where the patcher runs: the revision whose configurations it keeps.
#[derive(Clone, Debug)]
pub struct WebhookConfigSettings {
    /// The control-plane revision (`default` when none).
    pub revision: String,
}

/// Keeps the `caBundle` (from `root`, PEM) and `failurePolicy` of the configurations
/// labelled `istio.io/rev=<revision>` until `shutdown`; writes only while `leader`
/// says this replica leads. `probe` decides when `Fail` may be set.
pub async fn run_webhook_config_patcher(
    client: kube::Client,
    settings: WebhookConfigSettings,
    leader: Arc<LeaseState>,
    mut root: watch::Receiver<String>,
    probe: Arc<dyn FailCloseProbe>,
    stats: Arc<WebhookConfigStats>,
    shutdown: impl Future<Output = ()>,
) {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
    let selector = format!("{REVISION_LABEL}={}", settings.revision);
    let mut configs = watcher::watcher(api.clone(), watcher::Config::default().labels(&selector))
        .default_backoff()
        .boxed();
    let mut leading = leader.subscribe();
    let mut view = View::default();
    let mut fail_close_ready = false;
    let mut dirty = true;
    let mut shutdown = std::pin::pin!(shutdown);
    let retry = tokio::time::sleep(Duration::from_secs(3600));
    tokio::pin!(retry);
    let mut retry_armed = false;
    info!(selector = %selector, "validating webhook configurations: keeping caBundle and failurePolicy (leader only)");
    loop {
        let current = root.borrow_and_update().clone();
        if dirty && leader.is_leader() && view.synced && !current.is_empty() {
            dirty = false;
            let mut next: Option<Duration> = None;
            let names: Vec<String> = view.configs.keys().cloned().collect();
            for name in names {
                let Some(config) = view.configs.get(&name) else {
                    continue;
                };
                let needed = Needed::of(config, current.as_bytes());
                if needed.is_none() {
                    view.attempts.remove(&name);
                    continue;
                }
                if needed.fail_close && !fail_close_ready {
                    match probe.check().await {
                        Ok(()) => {
                            info!(
                                "the validating webhook denied invalid config; switching failurePolicy to Fail"
                            );
                            fail_close_ready = true;
                        }
                        Err(reason) => {
                            info!(
                                "not switching the validating webhook to failurePolicy Fail yet: {reason}"
                            )
                        }
                    }
                }
                let outcome =
                    reconcile(&api, &name, current.as_bytes(), fail_close_ready, &stats).await;
                let delay = match outcome {
                    Outcome::Done => {
                        if view.attempts.remove(&name).is_some()
                            && view.logged.iter().any(|(n, _)| n == &name)
                        {
                            info!(config = %name, "validating webhook configuration written after earlier failures");
                        }
                        view.logged.retain(|(n, _)| n != &name);
                        continue;
                    }
                    Outcome::NotReady(why) => {
                        debug!(config = %name, "caBundle written; failurePolicy stays until the webhook is ready: {why}");
                        view.backoff(&name)
                    }
                    Outcome::Failed { reason, message } => {
                        stats.error(&reason);
                        if view.logged.insert((name.clone(), reason.clone())) {
                            warn!(config = %name, reason = %reason, "cannot keep the caBundle of ValidatingWebhookConfiguration {name}: {message}; {} (retrying with backoff)", advice(&reason));
                        } else {
                            debug!(config = %name, reason = %reason, "ValidatingWebhookConfiguration write failed again: {message}");
                        }
                        view.backoff(&name)
                    }
                };
                next = Some(next.map_or(delay, |n| n.min(delay)));
            }
            if let Some(delay) = next {
                retry.as_mut().reset(tokio::time::Instant::now() + delay);
                retry_armed = true;
            }
        }
        tokio::select! {
            () = &mut shutdown => break,
            Some(event) = configs.next() => match event {
                Ok(event) => {
                    view.on_event(event);
                    stats.selected.store(view.configs.len() as u64, Ordering::Relaxed);
                    dirty = true;
                }
                Err(err) => {
                    let reason = "WatchError";
                    stats.error(reason);
                    if view.logged.insert((String::new(), reason.to_string())) {
                        warn!("watching ValidatingWebhookConfigurations ({selector}) failed: {err}; grant get, list and watch on admissionregistration.k8s.io validatingwebhookconfigurations (deploy/rbac.yaml) (retrying with backoff)");
                    }
                }
            },
            Ok(()) = root.changed() => {
                info!("root cert changed; patching the validating webhook configurations");
                dirty = true;
            }
            Ok(()) = leading.changed() => {
                if *leading.borrow_and_update() {
                    dirty = true;
                }
            }
            () = &mut retry, if retry_armed => {
                retry_armed = false;
                dirty = true;
            }
        }
    }
}

/// What an operator can do about a failure, by the API server's reason.
fn advice(reason: &str) -> &'static str {
    match reason {
        "Forbidden" => {
            "grant get, list, watch and update on admissionregistration.k8s.io validatingwebhookconfigurations to meshfed's service account (deploy/rbac.yaml)"
        }
        "Conflict" => "another writer changed it meanwhile",
        _ => "check that the API server is reachable",
    }
}

/// Re-reads `name` and replaces it when it needs the bundle or the policy.
async fn reconcile(
    api: &Api<ValidatingWebhookConfiguration>,
    name: &str,
    root: &[u8],
    fail_close_ready: bool,
    stats: &WebhookConfigStats,
) -> Outcome {
    let current = match api.get_opt(name).await {
        Ok(Some(current)) => current,
        Ok(None) => {
            info!(config = %name, "skip patching the validating webhook configuration: not found");
            return Outcome::Done;
        }
        Err(err) => return failed(err),
    };
    let needed = Needed::of(&current, root);
    if needed.is_none() {
        return Outcome::Done;
    }
    let set_fail = needed.fail_close && fail_close_ready;
    if !needed.ca_bundle && !set_fail {
        return Outcome::NotReady("the webhook has not denied the test Gateway yet".into());
    }
    let updated = patched(&current, root, set_fail);
    match api.replace(name, &PostParams::default(), &updated).await {
        Ok(written) => {
            stats.updates.fetch_add(1, Ordering::Relaxed);
            let policy = if set_fail || !needed.fail_close {
                "Fail"
            } else {
                "Ignore"
            };
            info!(
                config = %name,
                failure_policy = policy,
                resource_version = written.metadata.resource_version.as_deref().unwrap_or_default(),
                "validating webhook configuration updated"
            );
            if needed.fail_close && !set_fail {
                Outcome::NotReady("the webhook has not denied the test Gateway yet".into())
            } else {
                Outcome::Done
            }
        }
        Err(err) => failed(err),
    }
}

fn failed(err: kube::Error) -> Outcome {
    match err {
        kube::Error::Api(status) => Outcome::Failed {
            reason: if status.reason.is_empty() {
                format!("{}", status.code)
            } else {
                status.reason.clone()
            },
            message: status.message.clone(),
        },
        other => Outcome::Failed {
            reason: "Unavailable".to_string(),
            message: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::admissionregistration::v1::{ValidatingWebhook, WebhookClientConfig};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn config(bundle: Option<&str>, policy: &str) -> ValidatingWebhookConfiguration {
        let hook = |name: &str| ValidatingWebhook {
            name: name.to_string(),
            client_config: WebhookClientConfig {
                ca_bundle: bundle.map(|b| ByteString(b.as_bytes().to_vec())),
                ..WebhookClientConfig::default()
            },
            failure_policy: Some(policy.to_string()),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            ..ValidatingWebhook::default()
        };
        ValidatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some("istio-validator-revision-istio-system".into()),
                ..ObjectMeta::default()
            },
            webhooks: Some(vec![hook("hook0"), hook("hook1")]),
        }
    }

    #[test]
    fn needed_and_patched_follow_istio() {
        // TestGreenfield's shapes: unpatched (no bundle, Ignore), patched Ignore,
        // patched Fail.
        let unpatched = config(None, "Ignore");
        assert_eq!(
            Needed::of(&unpatched, b"CA0"),
            Needed {
                ca_bundle: true,
                fail_close: true
            }
        );
        let ignore = patched(&unpatched, b"CA0", false);
        assert_eq!(ignore, config(Some("CA0"), "Ignore"));
        assert!(!Needed::of(&ignore, b"CA0").ca_bundle);
        let fail = patched(&unpatched, b"CA0", true);
        assert_eq!(fail, config(Some("CA0"), "Fail"));
        assert!(Needed::of(&fail, b"CA0").is_none());
        // TestCABundleChange: a new root is written again.
        assert_eq!(
            Needed::of(&fail, b"CA1"),
            Needed {
                ca_bundle: true,
                fail_close: false
            }
        );
    }

    #[test]
    fn probe_verdicts_follow_istio() {
        // TestGreenfield: accepted, an unknown error: not ready; denied: ready.
        assert!(probe_verdict(Ok(())).is_err());
        assert!(probe_verdict(Err("Internal error occurred: unknown error".into())).is_err());
        assert!(probe_verdict(Err("admission webhook \"validation.istio.io\" denied the request: configuration is invalid".into())).is_ok());
        assert!(
            probe_verdict(Err(
                "the server could not find the requested resource".into()
            ))
            .is_ok()
        );
        assert!(probe_verdict(Err("webhook x does not support dry run".into())).is_ok());
    }

    #[test]
    fn backoff_grows_to_a_minute() {
        let mut view = View::default();
        let delays: Vec<Duration> = (0..12).map(|_| view.backoff("a")).collect();
        assert_eq!(delays[0], Duration::from_millis(100));
        assert_eq!(delays[1], Duration::from_millis(200));
        assert_eq!(delays[11], Duration::from_secs(60));
    }
}

//! The control plane's JWKS resolver (Istio's `JwksResolver`,
//! `pilot/pkg/model/jwks_resolver.go`). In the default mode
//! (`PILOT_JWT_ENABLE_REMOTE_JWKS=false`) the keys of every RequestAuthentication rule
//! without inline `jwks` are fetched here and inlined into the proxies' `jwt_authn`
//! filters, so proxies never reach the issuer themselves. With `envoy` (`true`), rules
//! with `jwksUri` are left to the proxies (`remote_jwks`, see
//! [`crate::generate::jwt`]); with `hybrid`, keys are fetched here too, for the hosts
//! that are no service of the registry.
//!
//! - What to fetch: [`JwksResolver::table_for`] is called whenever the snapshot's
//!   config index is rebuilt, with the RequestAuthentications in force. Keys
//!   `(issuer, jwksUri)` seen for the first time are fetched in the background; keys no
//!   policy names any more are forgotten. It returns the documents in hand
//!   ([`JwksTable`]), which the config index carries, so generation stays synchronous.
//! - How: `GET jwksUri`, or without `jwksUri` the `jwks_uri` of the issuer's OIDC
//!   discovery document `<issuer>/.well-known/openid-configuration`; the rule's
//!   `timeout` (5 s by default) per request. A document that is not a JSON Web Key Set
//!   counts as a failure. Every request counts in Istio's
//!   `pilot_jwks_resolver_network_fetch_success_total` / `..._fail_total`.
//! - Failure: a WARN naming the RequestAuthentications and the URI; the rule keeps the
//!   keys fetched before, or has none, and then the generator inlines
//!   [`crate::generate::jwt::fake_jwks`]: tokens of that issuer are refused (fail
//!   closed) until a fetch succeeds. Keys not fetched *yet* read the same way.
//! - Refresh: every 20 minutes (Istio's `PILOT_JWT_PUB_KEY_REFRESH_INTERVAL`); after a
//!   round with failures, 1 minute, doubling while failures go on, at most 60 minutes.
//! - Pushes: a fetch that changes a rule's keys asks for a push naming the
//!   RequestAuthentications that use them, which rebuilds the config index (and with
//!   it the table) and the listeners of the proxies.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshfed_api::security::v1beta1::RequestAuthentication;
use meshfed_registry::{ConfigKey, ConfigKind, PushRequest, TriggerReason, UpdateSink};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tracing::{debug, info, warn};

use crate::drain::Shutdown;
use crate::generate::jwt::{DEFAULT_TIMEOUT, JwksFetchMode, JwksKey, JwksTable};
use crate::push::config_index::Config;

/// How often fetched keys are fetched again (Istio's default
/// `PILOT_JWT_PUB_KEY_REFRESH_INTERVAL`).
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(20 * 60);
/// The refresh interval after a round with failures (`JwtPubKeyRefreshIntervalOnFailure`).
pub const REFRESH_INTERVAL_ON_FAILURE: Duration = Duration::from_secs(60);
/// The longest interval failures back off to
/// (`JwtPubKeyRefreshIntervalOnFailureResetThreshold`).
pub const REFRESH_BACKOFF_LIMIT: Duration = Duration::from_secs(60 * 60);
/// The environment variable of Istio's JWKS fetch mode.
pub const REMOTE_JWKS_ENV: &str = "PILOT_JWT_ENABLE_REMOTE_JWKS";

/// Resolver metrics (Istio's names).
#[derive(Debug, Default)]
pub struct JwksMetrics {
    /// `pilot_jwks_resolver_network_fetch_success_total`.
    pub fetch_success: Counter,
    /// `pilot_jwks_resolver_network_fetch_fail_total`.
    pub fetch_fail: Counter,
}

impl JwksMetrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &mut Registry) -> Self {
        let m = JwksMetrics::default();
        registry.register(
            "pilot_jwks_resolver_network_fetch_success",
            "Total number of successfully network fetch by pilot jwks resolver",
            m.fetch_success.clone(),
        );
        registry.register(
            "pilot_jwks_resolver_network_fetch_fail",
            "Total number of failed network fetch by pilot jwks resolver",
            m.fetch_fail.clone(),
        );
        m
    }
}

/// One key the resolver follows.
#[derive(Debug)]
struct Entry {
    /// The last document fetched; `None` before the first success.
    document: Option<Arc<str>>,
    /// The request timeout (the rule's, or 5 s).
    timeout: Duration,
    /// The RequestAuthentications naming it, `(namespace, name)`.
    users: BTreeSet<(String, String)>,
    /// Whether a fetch of it is running.
    in_flight: bool,
}

/// The resolver: a table of fetched keys, a fetch per new key, a refresh loop.
#[derive(Clone, Debug)]
pub struct JwksResolver {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    entries: Mutex<BTreeMap<JwksKey, Entry>>,
    sink: UpdateSink,
    metrics: Arc<JwksMetrics>,
    runtime: tokio::runtime::Handle,
    /// Who fetches the keys of rules with `jwksUri` (`PILOT_JWT_ENABLE_REMOTE_JWKS`).
    mode: JwksFetchMode,
    /// Fetch results recorded so far (a sync point: [`JwksResolver::wait_fetched`]).
    fetched: tokio::sync::watch::Sender<u64>,
}

impl JwksResolver {
    /// A resolver that asks for pushes on `sink`; it must be created inside a Tokio
    /// runtime, where it starts its fetches.
    pub fn new(sink: UpdateSink, metrics: Arc<JwksMetrics>) -> JwksResolver {
        JwksResolver::with_mode(sink, metrics, JwksFetchMode::Istiod)
    }

    /// A resolver for the fetch `mode`: with `envoy`, proxies fetch the keys of rules
    /// with `jwksUri` themselves and only OIDC discovery is done here; with `hybrid`,
    /// every key is fetched here too, for the hosts that are no service of the
    /// registry (which generation decides).
    pub fn with_mode(
        sink: UpdateSink,
        metrics: Arc<JwksMetrics>,
        mode: JwksFetchMode,
    ) -> JwksResolver {
        JwksResolver {
            inner: Arc::new(Inner {
                entries: Mutex::default(),
                sink,
                metrics,
                mode,
                runtime: tokio::runtime::Handle::current(),
                fetched: tokio::sync::watch::Sender::new(0),
            }),
        }
    }

    /// The documents in hand for the rules of `policies`; starts fetching the keys
    /// seen for the first time and forgets those no policy names any more.
    pub fn table_for<'a>(
        &self,
        policies: impl IntoIterator<Item = &'a Config<RequestAuthentication>>,
    ) -> Arc<JwksTable> {
        let mut wanted = wanted(policies);
        if self.inner.mode == JwksFetchMode::Envoy {
            wanted.retain(|key, _| key.jwks_uri.is_empty());
        }
        let mut entries = self.inner.entries.lock().expect("jwks poisoned");
        entries.retain(|key, _| wanted.contains_key(key));
        let mut fetch = Vec::new();
        for (key, (timeout, users)) in wanted {
            let entry = entries.entry(key.clone()).or_insert_with(|| {
                fetch.push(key.clone());
                Entry {
                    document: None,
                    timeout,
                    users: BTreeSet::new(),
                    in_flight: true,
                }
            });
            entry.timeout = timeout;
            entry.users = users;
        }
        let table = Arc::new(
            JwksTable::new(
                entries
                    .iter()
                    .filter_map(|(k, e)| Some((k.clone(), e.document.clone()?)))
                    .collect(),
            )
            .with_mode(self.inner.mode),
        );
        drop(entries);
        for key in fetch {
            let resolver = self.clone();
            self.inner.runtime.spawn(async move {
                let timeout = resolver.timeout_of(&key).unwrap_or(DEFAULT_TIMEOUT);
                let result = fetch_keys(&key, timeout, &resolver.inner.metrics).await;
                resolver.apply(&key, result);
            });
        }
        table
    }

    /// Fetches every followed key again (those not being fetched already); true when
    /// some fetch failed.
    pub async fn refresh(&self) -> bool {
        let keys: Vec<(JwksKey, Duration)> = {
            let mut entries = self.inner.entries.lock().expect("jwks poisoned");
            entries
                .iter_mut()
                .filter(|(_, e)| !e.in_flight)
                .map(|(k, e)| {
                    e.in_flight = true;
                    (k.clone(), e.timeout)
                })
                .collect()
        };
        let metrics = &self.inner.metrics;
        let results =
            futures::future::join_all(keys.iter().map(|(key, timeout)| async move {
                (key, fetch_keys(key, *timeout, metrics).await)
            }))
            .await;
        let mut failed = false;
        for (key, result) in results {
            failed |= result.is_err();
            self.apply(key, result);
        }
        failed
    }

    /// Refreshes on [`REFRESH_INTERVAL`] (backing off after failures, see
    /// [`next_refresh`]) until `shutdown` fires.
    pub async fn run(self, mut shutdown: Shutdown) {
        let mut interval = REFRESH_INTERVAL;
        let mut failed_before = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.wait() => return,
            }
            let failed = self.refresh().await;
            interval = next_refresh(interval, failed, failed_before);
            failed_before = failed;
        }
    }

    /// Waits until at least `n` fetch results have been recorded since the resolver
    /// was created (a sync point for tests and tools).
    pub async fn wait_fetched(&self, n: u64) {
        let mut rx = self.inner.fetched.subscribe();
        let _ = rx.wait_for(|done| *done >= n).await;
    }

    fn timeout_of(&self, key: &JwksKey) -> Option<Duration> {
        let entries = self.inner.entries.lock().expect("jwks poisoned");
        entries.get(key).map(|e| e.timeout)
    }

    /// Records a fetch of `key`: new keys ask for a push of the policies using
    /// them; a failure is warned about and keeps what was fetched before.
    fn apply(&self, key: &JwksKey, result: Result<String, String>) {
        self.record(key, result);
        self.inner.fetched.send_modify(|n| *n += 1);
    }

    fn record(&self, key: &JwksKey, result: Result<String, String>) {
        let mut entries = self.inner.entries.lock().expect("jwks poisoned");
        // Forgotten meanwhile: no policy needs it any more.
        let Some(entry) = entries.get_mut(key) else {
            return;
        };
        entry.in_flight = false;
        let users = entry
            .users
            .iter()
            .map(|(ns, name)| format!("{ns}/{name}"))
            .collect::<Vec<_>>()
            .join(", ");
        match result {
            Ok(document) => {
                if entry.document.as_deref() == Some(document.as_str()) {
                    debug!(issuer = %key.issuer, uri = %key.jwks_uri, "JWKS unchanged");
                    return;
                }
                info!(
                    issuer = %key.issuer, uri = %key.jwks_uri, request_authentications = %users,
                    "fetched new JWKS; pushing"
                );
                entry.document = Some(Arc::from(document));
                let keys: Vec<ConfigKey> = entry
                    .users
                    .iter()
                    .map(|(ns, name)| ConfigKey::new(ConfigKind::RequestAuthentication, name, ns))
                    .collect();
                drop(entries);
                self.inner
                    .sink
                    .push(PushRequest::full(TriggerReason::Config, keys));
            }
            Err(error) => {
                let kept = entry.document.is_some();
                warn!(
                    issuer = %key.issuer, uri = %key.jwks_uri, request_authentications = %users,
                    %error, keeping_previous_keys = kept,
                    "cannot fetch JWKS: tokens of this issuer are refused until it is fetched \
                     (unless keys fetched before are kept)"
                );
            }
        }
    }
}

/// The keys the rules of `policies` need, with their timeout and users.
type Wanted = BTreeMap<JwksKey, (Duration, BTreeSet<(String, String)>)>;

fn wanted<'a>(policies: impl IntoIterator<Item = &'a Config<RequestAuthentication>>) -> Wanted {
    let mut out = Wanted::new();
    for p in policies {
        // Policies for Gateway API gateways (targetRef) apply to no proxy meshfed
        // serves yet: nothing to fetch for them.
        if p.spec.target_ref.is_some() || !p.spec.target_refs.is_empty() {
            continue;
        }
        for rule in &p.spec.jwt_rules {
            let Some(key) = JwksKey::of(rule) else {
                continue;
            };
            let timeout = rule
                .timeout
                .and_then(|d| Duration::try_from(d).ok())
                .filter(|d| !d.is_zero())
                .unwrap_or(DEFAULT_TIMEOUT);
            let (t, users) = out.entry(key).or_insert((timeout, BTreeSet::new()));
            *t = (*t).max(timeout);
            users.insert((p.namespace.clone(), p.name.clone()));
        }
    }
    out
}

/// The next refresh interval (Istio's `refreshCache`): the default after a round
/// without failure; after a first failing round [`REFRESH_INTERVAL_ON_FAILURE`]; then
/// doubling while rounds keep failing, up to [`REFRESH_BACKOFF_LIMIT`].
pub fn next_refresh(current: Duration, failed: bool, failed_before: bool) -> Duration {
    match (failed, failed_before) {
        (false, _) => REFRESH_INTERVAL,
        (true, false) => REFRESH_INTERVAL_ON_FAILURE,
        (true, true) => (current * 2).min(REFRESH_BACKOFF_LIMIT),
    }
}

/// Fetches the JWKS of `key`: through OIDC discovery when it has no URI.
async fn fetch_keys(
    key: &JwksKey,
    timeout: Duration,
    metrics: &JwksMetrics,
) -> Result<String, String> {
    let client = crate::authn::jwt::keys::http_client(timeout)?;
    let uri = if key.jwks_uri.is_empty() {
        discover(&client, &key.issuer, metrics).await?
    } else {
        key.jwks_uri.clone()
    };
    let body = counted_get(&client, &uri, metrics).await?;
    let document =
        String::from_utf8(body).map_err(|_| format!("{uri}: the JWKS is not UTF-8 text"))?;
    check_jwks(&document).map_err(|e| format!("{uri}: {e}"))?;
    Ok(document)
}

/// The `jwks_uri` of the issuer's OIDC discovery document.
async fn discover(
    client: &reqwest::Client,
    issuer: &str,
    metrics: &JwksMetrics,
) -> Result<String, String> {
    let url = format!("{issuer}/.well-known/openid-configuration");
    let body = counted_get(client, &url, metrics).await?;
    let document: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| format!("{url}: not an OIDC discovery document: {e}"))?;
    match document.get("jwks_uri").and_then(|u| u.as_str()) {
        Some(uri) => Ok(uri.to_string()),
        None => Err(format!(
            "{url}: invalid jwks_uri {} in the OpenID discovery configuration",
            document.get("jwks_uri").unwrap_or(&serde_json::Value::Null)
        )),
    }
}

/// A GET counted in the fetch metrics.
async fn counted_get(
    client: &reqwest::Client,
    uri: &str,
    metrics: &JwksMetrics,
) -> Result<Vec<u8>, String> {
    let result = match crate::authn::jwt::keys::http_url(uri) {
        Ok(url) => crate::authn::jwt::keys::get(client, &url).await,
        Err(e) => Err(e),
    };
    match &result {
        Ok(_) => metrics.fetch_success.inc(),
        Err(_) => metrics.fetch_fail.inc(),
    };
    result
}

/// A JSON Web Key Set: an object with a `keys` array (Envoy refuses the filter, and
/// the whole listener, for anything else).
fn check_jwks(document: &str) -> Result<(), String> {
    let value: serde_json::Value =
        serde_json::from_str(document).map_err(|e| format!("the JWKS is not JSON: {e}"))?;
    match value.get("keys") {
        Some(serde_json::Value::Array(_)) => Ok(()),
        _ => Err("the JWKS has no `keys` array".into()),
    }
}

#[cfg(test)]
mod tests;

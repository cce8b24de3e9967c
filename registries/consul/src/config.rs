//! [`ConsulConfig`]: where the Consul HTTP API is, how to authenticate, how catalog
//! services are named in the mesh, and the timings of the blocking-query loops.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use meshfed_registry::{HealthStatus, Hostname, Namespace};

/// Errors of the Consul registry's setup (running registries never fail: they retry).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is unusable.
    #[error("invalid Consul registry setting: {0}")]
    Config(String),
    /// The CA certificate file cannot be read or parsed.
    #[error("reading the Consul CA certificate {path}: {reason}")]
    CaCert {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The HTTP client cannot be built.
    #[error("building the Consul HTTP client: {0}")]
    Client(String),
    /// No datacenter was configured and Consul could not tell its own.
    #[error(
        "cannot determine the Consul datacenter ({0}); set it explicitly (--consulDatacenter) to start while Consul is unreachable"
    )]
    Datacenter(String),
}

/// `Result` with this crate's setup [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The placeholder in [`ConsulConfig::domain_suffix`] replaced by the datacenter.
pub const DATACENTER_PLACEHOLDER: &str = "{dc}";

/// Everything a [`crate::ConsulRegistry`] runs with. `Debug` never prints the token.
#[derive(Clone)]
pub struct ConsulConfig {
    /// Base URL of the Consul HTTP API (`http://127.0.0.1:8500`, `https://...`).
    pub url: String,
    /// ACL token, sent as `X-Consul-Token`.
    pub token: Option<String>,
    /// PEM file with the CA certificate(s) to trust for `https` URLs instead of the
    /// system roots.
    pub ca_cert: Option<PathBuf>,
    /// The datacenter to read (sent as `dc=`) and the registry's cluster id. `None`:
    /// the agent's own datacenter, asked at start (`/v1/agent/self`, else
    /// `/v1/catalog/datacenters`).
    pub datacenter: Option<String>,
    /// Hostname suffix: a service `web` is `web.<suffix>`. `{dc}` in it is replaced by
    /// the datacenter (`service.{dc}.consul` gives Consul DNS's `web.service.dc1.consul`).
    pub domain_suffix: String,
    /// The mesh namespace every Consul service is put in.
    pub namespace: Namespace,
    /// Health of an instance whose worst check is `warning` (Consul DNS still answers
    /// with it, so healthy by default).
    pub warning_health: HealthStatus,
    /// `wait` of the blocking queries (Consul caps it at 10 minutes and adds up to
    /// 1/16 of jitter).
    pub wait: Duration,
    /// Shortest time between two queries of one watch, so that a query answering at
    /// once with an unchanged index cannot spin.
    pub min_query_interval: Duration,
    /// First retry delay after a failed query (`--consulserverInterval`); doubled on
    /// each further failure up to [`ConsulConfig::max_retry_interval`].
    pub retry_interval: Duration,
    /// Longest retry delay.
    pub max_retry_interval: Duration,
    /// Most queries in flight at once. Consul limits concurrent HTTP connections per
    /// client address (`limits.http_max_conns_per_client`, 200 by default) and every
    /// watched service holds one blocking query, so watches beyond this wait their turn.
    pub max_concurrent_queries: usize,
    /// Connection timeout of every request.
    pub connect_timeout: Duration,
}

impl fmt::Debug for ConsulConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsulConfig")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_cert", &self.ca_cert)
            .field("datacenter", &self.datacenter)
            .field("domain_suffix", &self.domain_suffix)
            .field("namespace", &self.namespace)
            .field("warning_health", &self.warning_health)
            .field("wait", &self.wait)
            .field("min_query_interval", &self.min_query_interval)
            .field("retry_interval", &self.retry_interval)
            .field("max_retry_interval", &self.max_retry_interval)
            .field("max_concurrent_queries", &self.max_concurrent_queries)
            .finish()
    }
}

impl Default for ConsulConfig {
    fn default() -> Self {
        ConsulConfig {
            url: "http://127.0.0.1:8500".into(),
            token: None,
            ca_cert: None,
            datacenter: None,
            domain_suffix: "service.consul".into(),
            namespace: Namespace::new("default"),
            warning_health: HealthStatus::Healthy,
            wait: Duration::from_secs(300),
            min_query_interval: Duration::from_millis(100),
            retry_interval: Duration::from_secs(2),
            max_retry_interval: Duration::from_secs(30),
            max_concurrent_queries: 150,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl ConsulConfig {
    /// The defaults with `url`.
    pub fn new(url: impl Into<String>) -> Self {
        ConsulConfig {
            url: url.into(),
            ..ConsulConfig::default()
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return bad(format!(
                "the Consul URL {:?} must start with http:// or https://",
                self.url
            ));
        }
        let suffix = self.domain_suffix.replace(DATACENTER_PLACEHOLDER, "dc");
        if suffix.is_empty()
            || suffix.starts_with('.')
            || suffix.ends_with('.')
            || suffix.contains("..")
            || !suffix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        {
            return bad(format!(
                "the domain suffix {:?} is not a DNS suffix",
                self.domain_suffix
            ));
        }
        if self.namespace.is_empty() {
            return bad("the namespace must not be empty".into());
        }
        if self.datacenter.as_deref().is_some_and(str::is_empty) {
            return bad("the datacenter must not be empty".into());
        }
        if self.wait.is_zero() || self.wait > Duration::from_secs(600) {
            return bad(format!(
                "the blocking-query wait {:?} must be above 0 and at most 10 minutes",
                self.wait
            ));
        }
        if self.retry_interval.is_zero() || self.max_retry_interval < self.retry_interval {
            return bad(format!(
                "retry interval {:?} must be above 0 and at most the maximum {:?}",
                self.retry_interval, self.max_retry_interval
            ));
        }
        if self.max_concurrent_queries == 0 {
            return bad("at least one query must be allowed in flight".into());
        }
        Ok(())
    }

    /// The mesh hostname of Consul service `name` in `datacenter`:
    /// `<name>.<suffix>`, lower-cased, with `{dc}` in the suffix replaced.
    pub fn hostname(&self, name: &str, datacenter: &str) -> Hostname {
        let suffix = self
            .domain_suffix
            .replace(DATACENTER_PLACEHOLDER, datacenter);
        Hostname::new(format!("{name}.{suffix}").to_ascii_lowercase())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_follow_the_suffix() {
        let mut c = ConsulConfig::default();
        assert_eq!(c.hostname("Web", "dc1").as_str(), "web.service.consul");
        c.domain_suffix = "service.{dc}.consul".into();
        assert_eq!(c.hostname("web", "dc1").as_str(), "web.service.dc1.consul");
        c.validate().unwrap();
    }

    #[test]
    fn validation_names_the_bad_setting() {
        let mut c = ConsulConfig::new("127.0.0.1:8500");
        assert!(c.validate().unwrap_err().to_string().contains("http://"));
        c.url = "http://x".into();
        c.domain_suffix = ".consul".into();
        assert!(c.validate().unwrap_err().to_string().contains("suffix"));
        c.domain_suffix = "service.consul".into();
        c.wait = Duration::from_secs(3600);
        assert!(c.validate().unwrap_err().to_string().contains("wait"));
    }

    #[test]
    fn debug_hides_the_token() {
        let c = ConsulConfig {
            token: Some("s3cr3t".into()),
            ..ConsulConfig::default()
        };
        assert!(!format!("{c:?}").contains("s3cr3t"));
    }
}

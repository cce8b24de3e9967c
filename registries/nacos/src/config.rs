//! [`NacosConfig`]: which Nacos servers, namespaces and groups to read, how to
//! authenticate, how Nacos services are named and placed in the mesh, and the timings.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use meshfed_registry::{Hostname, Locality, Namespace};

/// Errors of the Nacos registry's setup (a running registry never fails: it retries).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is unusable.
    #[error("invalid Nacos registry setting: {0}")]
    Config(String),
    /// A credential file cannot be read.
    #[error("reading {what} {path}: {reason}")]
    File {
        /// Which setting.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The HTTP client cannot be built.
    #[error("building the Nacos HTTP client: {0}")]
    Client(String),
}

/// `Result` with this crate's setup [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How the registry talks to Nacos.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Transport {
    /// Nacos 2.x gRPC (subscription with server push) while the server answers it,
    /// else the 1.x HTTP open API, polled; gRPC is tried again at every refresh.
    #[default]
    Auto,
    /// gRPC only (a server without it is an outage).
    Grpc,
    /// The HTTP open API only, polled every refresh interval.
    Http,
}

impl Transport {
    /// Parses `auto`, `grpc` or `http`.
    pub fn parse(s: &str) -> Result<Transport, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Transport::Auto),
            "grpc" => Ok(Transport::Grpc),
            "http" => Ok(Transport::Http),
            _ => Err(format!("{s:?}: expected auto, grpc or http")),
        }
    }
}

/// Credentials sent to Nacos. `Debug` prints which are set, never their values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// Username for `/v1/auth/login` (with `password`).
    pub username: Option<String>,
    /// Password for `/v1/auth/login`.
    pub password: Option<String>,
    /// A file holding an access token issued beforehand, sent as is (re-read at every
    /// connection, so that a rotated token is picked up).
    pub token_file: Option<PathBuf>,
    /// Access key of the access-key signature (`ak`, `signature`, `data` headers).
    pub access_key: Option<String>,
    /// Secret key signing it (HmacSHA1).
    pub secret_key: Option<String>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |v: &Option<String>| v.as_ref().map(|_| "<set>");
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &set(&self.password))
            .field("token_file", &self.token_file)
            .field("access_key", &self.access_key)
            .field("secret_key", &set(&self.secret_key))
            .finish()
    }
}

/// Everything a [`crate::NacosRegistry`] runs with.
#[derive(Clone, Debug)]
pub struct NacosConfig {
    /// Base URLs of the Nacos servers' HTTP API with their context path
    /// (`http://10.0.0.1:8848/nacos`); tried in turn when one fails.
    pub servers: Vec<String>,
    /// Nacos namespace ids to read (`public` is the default namespace).
    pub namespaces: Vec<String>,
    /// Groups to read in each namespace.
    pub groups: Vec<String>,
    /// Credentials.
    pub credentials: Credentials,
    /// Hostname suffix: service `web` of group `DEFAULT_GROUP` in namespace `public` is
    /// `web.default-group.public.<suffix>`.
    pub domain_suffix: String,
    /// The mesh namespace every Nacos service is put in.
    pub mesh_namespace: Namespace,
    /// The registry's cluster id (shard `Nacos/<cluster id>`, endpoints' cluster).
    pub cluster_id: String,
    /// Nacos cluster name (`clusterName` of an instance) -> locality; `*` is the
    /// locality of instances whose cluster is not listed. Unlisted with no `*`: no
    /// locality.
    pub localities: BTreeMap<String, Locality>,
    /// How to talk to Nacos.
    pub transport: Transport,
    /// gRPC port = HTTP port + this (Nacos's `nacos.server.grpc.port.offset`).
    pub grpc_port_offset: u16,
    /// Service lists are read again this often (Nacos pushes instances, not the list
    /// of services); over HTTP, every service's instances too.
    pub refresh_interval: Duration,
    /// First retry delay after a failure, doubled up to `max_retry_interval`.
    pub retry_interval: Duration,
    /// Longest retry delay.
    pub max_retry_interval: Duration,
    /// Timeout of one request (and of connecting).
    pub request_timeout: Duration,
    /// A gRPC connection idle this long is checked with a `HealthCheckRequest`.
    pub keepalive_interval: Duration,
    /// Services per page of a service-list request.
    pub page_size: u32,
    /// Requests in flight at once (subscriptions, HTTP instance reads).
    pub max_concurrent_requests: usize,
}

impl Default for NacosConfig {
    fn default() -> Self {
        NacosConfig {
            servers: vec!["http://127.0.0.1:8848/nacos".into()],
            namespaces: vec!["public".into()],
            groups: vec!["DEFAULT_GROUP".into()],
            credentials: Credentials::default(),
            domain_suffix: "nacos".into(),
            mesh_namespace: Namespace::new("default"),
            cluster_id: "nacos".into(),
            localities: BTreeMap::new(),
            transport: Transport::Auto,
            grpc_port_offset: 1000,
            refresh_interval: Duration::from_secs(30),
            retry_interval: Duration::from_secs(2),
            max_retry_interval: Duration::from_secs(30),
            request_timeout: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(5),
            page_size: 100,
            max_concurrent_requests: 32,
        }
    }
}

/// `host:port` (or a URL without a path) -> `http://host:port/nacos`; a URL with a
/// path keeps it as the context path.
pub fn server_url(addr: &str) -> Result<String> {
    let addr = addr.trim().trim_end_matches('/');
    let with_scheme = if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let url = reqwest::Url::parse(&with_scheme)
        .map_err(|e| Error::Config(format!("Nacos server address {addr:?}: {e}")))?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err(Error::Config(format!(
            "Nacos server address {addr:?} has no host"
        )));
    }
    if url.path() == "/" || url.path().is_empty() {
        Ok(format!("{with_scheme}/nacos"))
    } else {
        Ok(with_scheme)
    }
}

/// A hostname label made of a Nacos group or namespace id: lower case, `_` -> `-`.
pub fn label_of(part: &str) -> String {
    part.replace('_', "-").to_ascii_lowercase()
}

/// Whether `label` is a DNS label (1-63 letters, digits or `-`, not at either end).
fn is_dns_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 63
        && !label.starts_with('-')
        && !label.ends_with('-')
        && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

impl NacosConfig {
    /// The defaults with these servers (`host:port` or URLs).
    pub fn new<S: AsRef<str>>(servers: impl IntoIterator<Item = S>) -> Result<Self> {
        Ok(NacosConfig {
            servers: servers
                .into_iter()
                .map(|s| server_url(s.as_ref()))
                .collect::<Result<_>>()?,
            ..NacosConfig::default()
        })
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if self.servers.is_empty() {
            return bad("no Nacos server address".into());
        }
        if self.namespaces.is_empty() || self.groups.is_empty() {
            return bad("at least one namespace id and one group are needed".into());
        }
        for ns in &self.namespaces {
            if !is_dns_label(&label_of(ns)) {
                return bad(format!(
                    "namespace id {ns:?} cannot be a hostname label (letters, digits, '-' and '_')"
                ));
            }
        }
        for group in &self.groups {
            if !is_dns_label(&label_of(group)) {
                return bad(format!(
                    "group {group:?} cannot be a hostname label (letters, digits, '-' and '_')"
                ));
            }
        }
        let suffix = &self.domain_suffix;
        if suffix.is_empty() || !suffix.split('.').all(is_dns_label) {
            return bad(format!("the domain suffix {suffix:?} is not a DNS suffix"));
        }
        if self.mesh_namespace.is_empty() || self.cluster_id.is_empty() {
            return bad("the mesh namespace and the cluster id must not be empty".into());
        }
        let c = &self.credentials;
        if c.username.is_some() != c.password.is_some() {
            return bad("a username needs a password and a password a username".into());
        }
        if c.access_key.is_some() != c.secret_key.is_some() {
            return bad("an access key needs a secret key and a secret key an access key".into());
        }
        if c.username.is_some() && c.token_file.is_some() {
            return bad("give a username and password or a token file, not both".into());
        }
        if self.refresh_interval.is_zero() || self.request_timeout.is_zero() {
            return bad("the refresh interval and request timeout must be above 0".into());
        }
        if self.retry_interval.is_zero() || self.max_retry_interval < self.retry_interval {
            return bad(format!(
                "retry interval {:?} must be above 0 and at most the maximum {:?}",
                self.retry_interval, self.max_retry_interval
            ));
        }
        if self.page_size == 0 || self.max_concurrent_requests == 0 {
            return bad("the page size and the requests in flight must be above 0".into());
        }
        Ok(())
    }

    /// The mesh hostname of Nacos service `name` of `group` in namespace `namespace`:
    /// `<name>.<group>.<namespace>.<suffix>`, lower case, `_` in the group and
    /// namespace written `-` (Higress's scheme with a configurable suffix).
    pub fn hostname(&self, namespace: &str, group: &str, name: &str) -> Hostname {
        Hostname::new(format!(
            "{}.{}.{}.{}",
            name.to_ascii_lowercase(),
            label_of(group),
            label_of(namespace),
            self.domain_suffix.to_ascii_lowercase()
        ))
    }

    /// The locality of an instance of Nacos cluster `cluster`.
    pub fn locality(&self, cluster: &str) -> Locality {
        self.localities
            .get(cluster)
            .or_else(|| self.localities.get("*"))
            .cloned()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_follow_higress_with_a_suffix() {
        let c = NacosConfig::default();
        assert_eq!(
            c.hostname("public", "DEFAULT_GROUP", "Web").as_str(),
            "web.default-group.public.nacos"
        );
        c.validate().unwrap();
    }

    #[test]
    fn server_addresses_get_scheme_and_context_path() {
        assert_eq!(
            server_url("10.0.0.1:8848").unwrap(),
            "http://10.0.0.1:8848/nacos"
        );
        assert_eq!(
            server_url("https://n.example:8848/custom/").unwrap(),
            "https://n.example:8848/custom"
        );
        assert!(server_url("http://:8848").is_err());
    }

    #[test]
    fn validation_names_the_bad_setting() {
        let mut c = NacosConfig {
            groups: vec!["a.b".into()],
            ..NacosConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("group"));
        c.groups = vec!["G".into()];
        c.credentials.username = Some("nacos".into());
        assert!(c.validate().unwrap_err().to_string().contains("password"));
        c.credentials.password = Some("pw".into());
        c.validate().unwrap();
    }

    #[test]
    fn debug_hides_secrets() {
        let c = Credentials {
            username: Some("nacos".into()),
            password: Some("s3cr3t".into()),
            secret_key: Some("k3y".into()),
            ..Credentials::default()
        };
        let text = format!("{c:?}");
        assert!(!text.contains("s3cr3t") && !text.contains("k3y"), "{text}");
    }

    #[test]
    fn localities_by_cluster_with_a_default() {
        let mut c = NacosConfig::default();
        c.localities.insert("HZ".into(), Locality::parse("cn/hz-a"));
        assert_eq!(c.locality("HZ").zone, "hz-a");
        assert!(c.locality("SH").is_empty());
        c.localities.insert("*".into(), Locality::parse("cn"));
        assert_eq!(c.locality("SH").region, "cn");
    }
}

//! [`EurekaConfig`]: which Eureka servers to read (with failover), how to authenticate,
//! how often to fetch, and how applications are named and placed in the mesh.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use meshfed_registry::{Hostname, Locality, Namespace};
use reqwest::Url;

/// Errors of the Eureka registry's setup (a running registry never fails: it retries).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is unusable.
    #[error("invalid Eureka registry setting: {0}")]
    Config(String),
    /// The HTTP client cannot be built.
    #[error("building the Eureka HTTP client: {0}")]
    Client(String),
}

/// `Result` with this crate's setup [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// HTTP basic-auth credentials. `Debug` never prints the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// One Eureka server: its service URL without credentials (what logs, errors and
/// metrics may show) and the credentials taken out of it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct EurekaServer {
    /// The service URL (`http://host:8761/eureka/`), always ending in `/`, never
    /// holding user info.
    pub url: Url,
    /// Basic-auth credentials from the URL's user info (`http://user:pass@host/...`).
    pub credentials: Option<Credentials>,
}

impl EurekaServer {
    /// Parses a service URL as Eureka clients take it (`eureka.client.serviceUrl`):
    /// `http(s)://[user:password@]host[:port]/path`. User info becomes
    /// [`EurekaServer::credentials`] (percent-decoded) and is removed from the URL.
    pub fn parse(raw: &str) -> Result<EurekaServer> {
        let bad = |why: String| Error::Config(format!("Eureka server URL: {why}"));
        let mut url = Url::parse(raw.trim())
            // The parse error never repeats the input, which may hold a password.
            .map_err(|e| bad(format!("not a URL ({e})")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad(format!(
                "{} must be http:// or https://",
                redacted(&url)
            )));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad("no host".into()));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(bad(format!(
                "{} must have no query or fragment",
                redacted(&url)
            )));
        }
        let credentials = if url.username().is_empty() && url.password().is_none() {
            None
        } else {
            let decode = |s: &str| {
                percent_decode(s).ok_or_else(|| bad("user info is not valid UTF-8".into()))
            };
            Some(Credentials {
                username: decode(url.username())?,
                password: decode(url.password().unwrap_or(""))?,
            })
        };
        let _ = url.set_username("");
        let _ = url.set_password(None);
        if !url.path().ends_with('/') {
            let path = format!("{}/", url.path());
            url.set_path(&path);
        }
        Ok(EurekaServer { url, credentials })
    }
}

/// `url` with any user info replaced by `***` (for messages about a URL as given).
pub fn redacted(url: &Url) -> String {
    let mut shown = url.clone();
    if !shown.username().is_empty() || shown.password().is_some() {
        let _ = shown.set_username("***");
        let _ = shown.set_password(None);
    }
    shown.to_string()
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// Everything a [`crate::EurekaRegistry`] runs with. `Debug` never prints a password.
#[derive(Clone, Debug)]
pub struct EurekaConfig {
    /// The servers, tried in order: a request that cannot reach one (or gets a 5xx)
    /// goes to the next, and the one that answered is asked first from then on.
    pub servers: Vec<EurekaServer>,
    /// Credentials for the servers whose URL holds none.
    pub credentials: Option<Credentials>,
    /// Time between two fetches (Eureka clients' `registryFetchIntervalSeconds`, 30s).
    pub fetch_interval: Duration,
    /// First retry delay after a failed fetch, doubled per further failure up to
    /// [`EurekaConfig::fetch_interval`].
    pub retry_interval: Duration,
    /// Hostname suffix: application `WEB` is `web.<suffix>`.
    pub domain_suffix: String,
    /// The mesh namespace of every Eureka application.
    pub namespace: Namespace,
    /// The registry's cluster id (its endpoints' cluster, its shard `Eureka/<id>`).
    pub cluster_id: String,
    /// Region of every endpoint's locality (Eureka clients' `eureka.client.region`);
    /// `None`: from an AWS availability zone (`us-east-1a` is in `us-east-1`), else
    /// empty.
    pub region: Option<String>,
    /// Eureka zone -> the locality it stands for, overriding the region rule above.
    pub zone_localities: BTreeMap<String, Locality>,
    /// Connection timeout of every request.
    pub connect_timeout: Duration,
    /// Whole-request timeout (a full fetch of a large registry included).
    pub request_timeout: Duration,
}

impl Default for EurekaConfig {
    fn default() -> Self {
        EurekaConfig {
            servers: Vec::new(),
            credentials: None,
            fetch_interval: Duration::from_secs(30),
            retry_interval: Duration::from_secs(1),
            domain_suffix: "eureka".into(),
            namespace: Namespace::new("default"),
            cluster_id: "eureka".into(),
            region: None,
            zone_localities: BTreeMap::new(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
        }
    }
}

impl EurekaConfig {
    /// The defaults with one server.
    pub fn new(url: &str) -> Result<Self> {
        Ok(EurekaConfig {
            servers: vec![EurekaServer::parse(url)?],
            ..EurekaConfig::default()
        })
    }

    /// The service URLs as logs may show them (never with credentials).
    pub fn server_urls(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.url.to_string()).collect()
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if self.servers.is_empty() {
            return bad("at least one Eureka server URL is needed".into());
        }
        let suffix = &self.domain_suffix;
        if suffix.is_empty()
            || suffix.starts_with('.')
            || suffix.ends_with('.')
            || suffix.contains("..")
            || !suffix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        {
            return bad(format!("the domain suffix {suffix:?} is not a DNS suffix"));
        }
        if self.namespace.is_empty() {
            return bad("the namespace must not be empty".into());
        }
        if self.cluster_id.is_empty() {
            return bad("the cluster id must not be empty".into());
        }
        if self.fetch_interval.is_zero() || self.retry_interval.is_zero() {
            return bad(format!(
                "the fetch interval {:?} and retry interval {:?} must be above 0",
                self.fetch_interval, self.retry_interval
            ));
        }
        Ok(())
    }

    /// The mesh hostname of Eureka application `app`: `<app>.<suffix>`, lower-cased.
    pub fn hostname(&self, app: &str) -> Hostname {
        Hostname::new(format!("{app}.{}", self.domain_suffix).to_ascii_lowercase())
    }
}

/// Parses `zone=region/zone[/subzone]` (one `--eurekaZoneLocality` entry).
pub fn parse_zone_locality(s: &str) -> std::result::Result<(String, Locality), String> {
    let (zone, locality) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected zone=region/zone[/subzone]"))?;
    let locality = Locality::parse(locality.trim());
    if zone.trim().is_empty() || locality.region.is_empty() {
        return Err(format!(
            "{s:?}: expected zone=region/zone[/subzone] with a zone and a region"
        ));
    }
    Ok((zone.trim().to_string(), locality))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_info_becomes_credentials_and_leaves_the_url() {
        let s = EurekaServer::parse("http://app:p%40ss@127.0.0.1:8761/eureka").unwrap();
        assert_eq!(s.url.as_str(), "http://127.0.0.1:8761/eureka/");
        let c = s.credentials.unwrap();
        assert_eq!((c.username.as_str(), c.password.as_str()), ("app", "p@ss"));
        assert!(!format!("{c:?}").contains("p@ss"));
        let plain = EurekaServer::parse("https://eureka.local/eureka/").unwrap();
        assert!(plain.credentials.is_none());
    }

    #[test]
    fn bad_urls_are_named_without_their_password() {
        let err = EurekaServer::parse("ftp://u:s3cr3t@h/eureka")
            .unwrap_err()
            .to_string();
        assert!(err.contains("http://"), "{err}");
        assert!(!err.contains("s3cr3t"), "{err}");
        assert!(EurekaServer::parse("127.0.0.1:8761").is_err());
        assert!(EurekaServer::parse("http://h/eureka?x=1").is_err());
    }

    #[test]
    fn hostnames_and_validation() {
        let mut c = EurekaConfig::new("http://127.0.0.1:8761/eureka").unwrap();
        assert_eq!(c.hostname("WEB-API").as_str(), "web-api.eureka");
        c.validate().unwrap();
        c.domain_suffix = "svc.eureka.local".into();
        assert_eq!(c.hostname("Web").as_str(), "web.svc.eureka.local");
        c.domain_suffix = ".eureka".into();
        assert!(c.validate().unwrap_err().to_string().contains("suffix"));
        c.domain_suffix = "eureka".into();
        c.servers.clear();
        assert!(c.validate().unwrap_err().to_string().contains("server"));
    }

    #[test]
    fn zone_localities_parse() {
        let (zone, l) = parse_zone_locality("zone1=us-east/us-east-1a").unwrap();
        assert_eq!(zone, "zone1");
        assert_eq!(
            (l.region.as_str(), l.zone.as_str()),
            ("us-east", "us-east-1a")
        );
        assert!(parse_zone_locality("zone1").is_err());
        assert!(parse_zone_locality("=r/z").is_err());
    }
}

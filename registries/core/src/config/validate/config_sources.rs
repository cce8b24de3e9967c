//! `MeshConfig.configSources`: where Istio config comes from, as istiod reads it
//! (`pilot/pkg/bootstrap/configcontroller.go`).
//!
//! Each entry's `address` names one source:
//! - `xds://host:port`: an MCP-over-xDS server (read by the server crate's
//!   `config_sources` client);
//! - `k8s://`: the Kubernetes API server's Istio CRDs (the local cluster);
//! - `fs:///absolute/path`: a config directory, as `--configDir`.
//!
//! When the list is not empty it replaces the default sources (the config directory
//! and the Kubernetes CRD store), as in istiod. Where istiod logs and skips (an
//! unknown scheme, `k8s://` naming a remote cluster), meshfed refuses the mesh config
//! naming the field; what istiod ignores (`tlsSettings`: istiod dials config sources
//! in plaintext; `subscribedResources`) is refused when it would change the meaning
//! (a TLS mode) and warned about otherwise.

use std::fmt;
use std::path::PathBuf;

use meshfed_api::mesh::v1alpha1::{ConfigSource, MeshConfig};
use meshfed_api::networking::v1alpha3::ClientTlsSettings;

use super::{FieldPath, Findings, Validation};

/// One config source, as its address names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConfigSourceAddress {
    /// `xds://host:port`: an MCP-over-xDS (ADS) server, dialed in plaintext.
    Xds {
        /// `host:port` as written (an IPv6 host in brackets).
        authority: String,
    },
    /// `k8s://`: the local Kubernetes API server's Istio CRDs.
    Kubernetes,
    /// `fs:///path`: a config directory.
    Files(PathBuf),
}

impl ConfigSourceAddress {
    /// Reads one `address`. The error says what is wrong in words an operator can act
    /// on.
    pub fn parse(address: &str) -> Result<ConfigSourceAddress, String> {
        let Some((scheme, rest)) = address.split_once("://") else {
            return Err(format!(
                "{address:?} is not a config source URL: use xds://host:port, k8s:// or fs:///path"
            ));
        };
        match scheme {
            "xds" => parse_authority(rest).map(|authority| ConfigSourceAddress::Xds { authority }),
            "k8s" => {
                if rest.is_empty() || rest == "/" {
                    Ok(ConfigSourceAddress::Kubernetes)
                } else {
                    Err(format!(
                        "{address:?}: only k8s:// (the local cluster) is supported; \
                         remote clusters are added with remote secrets"
                    ))
                }
            }
            "fs" => {
                // `fs:///path`: no host, an absolute path (istiod reads the URL's path).
                if !rest.starts_with('/') || rest == "/" {
                    return Err(format!(
                        "{address:?}: fs:// needs an absolute directory path (fs:///etc/istio/config)"
                    ));
                }
                Ok(ConfigSourceAddress::Files(PathBuf::from(rest)))
            }
            other => Err(format!(
                "{address:?}: unknown config source scheme {other:?} (use xds://, k8s:// or fs://)"
            )),
        }
    }

    /// The name the source's objects carry as their `source` (provenance), its metrics
    /// label and its log field: `xds://host:port`, `k8s://`, `fs:///path`.
    pub fn name(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for ConfigSourceAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigSourceAddress::Xds { authority } => write!(f, "xds://{authority}"),
            ConfigSourceAddress::Kubernetes => f.write_str("k8s://"),
            ConfigSourceAddress::Files(path) => write!(f, "fs://{}", path.display()),
        }
    }
}

/// `host:port` with a port in 1..=65535 and nothing after it.
fn parse_authority(rest: &str) -> Result<String, String> {
    let bad = || {
        format!(
            "xds://{rest}: an xds:// config source is xds://host:port (a host name or IP address and a port)"
        )
    };
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return Err(bad());
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(bad)?;
        host.parse::<std::net::Ipv6Addr>().map_err(|_| bad())?;
        (host, after.strip_prefix(':').ok_or_else(bad)?)
    } else {
        rest.rsplit_once(':').ok_or_else(bad)?
    };
    if host.is_empty() || host.contains(':') && !rest.starts_with('[') {
        return Err(bad());
    }
    match port.parse::<u16>() {
        Ok(p) if p != 0 => Ok(rest.to_string()),
        _ => Err(format!(
            "xds://{rest}: port {port:?} is not a port number (1..65535)"
        )),
    }
}

/// Checks `configSources`: every address parses, at most one `k8s://`, no address
/// twice, no TLS mode (config sources are dialed in plaintext, as istiod does), and a
/// warning for `subscribedResources` (not acted on). Field paths are
/// `configSources[<i>].<field>`.
pub fn validate_config_sources(config: &MeshConfig) -> Validation {
    let mut f = Findings::new();
    check_into(&mut f, &config.config_sources);
    f.finish()
}

pub(crate) fn check_into(f: &mut Findings, sources: &[ConfigSource]) {
    let mut seen = std::collections::BTreeMap::new();
    for (i, source) in sources.iter().enumerate() {
        let at = FieldPath::root().field("configSources").index(i);
        match ConfigSourceAddress::parse(&source.address) {
            Err(reason) => f.error(&at.field("address"), reason),
            Ok(address) => {
                if let Some(first) = seen.insert(address.clone(), i) {
                    let what = if address == ConfigSourceAddress::Kubernetes {
                        "a second k8s:// source (there is one local Kubernetes config store)"
                            .to_string()
                    } else {
                        format!("{address} is listed twice")
                    };
                    f.error(
                        &at.field("address"),
                        format!("{what}: see configSources[{first}]"),
                    );
                }
            }
        }
        if let Some(tls) = &source.tls_settings
            && *tls != ClientTlsSettings::default()
        {
            f.error(
                &at.field("tlsSettings"),
                "not supported: config sources are dialed in plaintext, as istiod does \
                 (an xds:// source on a secure port cannot be read); remove tlsSettings",
            );
        }
        if !source.subscribed_resources.is_empty() {
            f.warn(
                &at.field("subscribedResources"),
                "not acted on (as in istiod): every Istio config kind meshfed reads is \
                 subscribed to",
            );
        }
    }
}

/// The sources `config` lists, in order, once [`validate_config_sources`] accepts
/// them.
pub fn config_source_addresses(config: &MeshConfig) -> Result<Vec<ConfigSourceAddress>, String> {
    if let Err(errors) = validate_config_sources(config) {
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        return Err(text.join("; "));
    }
    Ok(config
        .config_sources
        .iter()
        .filter_map(|s| ConfigSourceAddress::parse(&s.address).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(address: &str) -> ConfigSource {
        ConfigSource {
            address: address.into(),
            ..Default::default()
        }
    }

    fn errors(sources: Vec<ConfigSource>) -> Vec<String> {
        let config = MeshConfig {
            config_sources: sources,
            ..Default::default()
        };
        match validate_config_sources(&config) {
            Ok(_) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn addresses_read_as_istiod_reads_them() {
        let parse = |a: &str| ConfigSourceAddress::parse(a);
        assert_eq!(
            parse("xds://127.0.0.1:15010"),
            Ok(ConfigSourceAddress::Xds {
                authority: "127.0.0.1:15010".into()
            })
        );
        assert_eq!(
            parse("xds://[::1]:15010").unwrap().to_string(),
            "xds://[::1]:15010"
        );
        assert_eq!(
            parse("xds://mcp.istio-system.svc:15010").unwrap().name(),
            "xds://mcp.istio-system.svc:15010"
        );
        assert_eq!(parse("k8s://"), Ok(ConfigSourceAddress::Kubernetes));
        assert_eq!(parse("k8s:///"), Ok(ConfigSourceAddress::Kubernetes));
        assert_eq!(
            parse("fs:///etc/istio/config"),
            Ok(ConfigSourceAddress::Files("/etc/istio/config".into()))
        );
        assert_eq!(
            parse("fs:///etc/istio/config").unwrap().to_string(),
            "fs:///etc/istio/config"
        );
        for bad in [
            "xds://host",
            "xds://host:0",
            "xds://host:99999",
            "xds://:15010",
            "xds://host:15010/path",
            "xds://::1:15010",
            "k8s://remote-cluster",
            "fs://relative/dir",
            "fs://",
            "mcp://host:15010",
            "host:15010",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(
            parse("nacos://x:1")
                .unwrap_err()
                .contains("unknown config source scheme")
        );
    }

    #[test]
    fn bad_entries_are_refused_naming_the_field() {
        assert!(
            errors(vec![
                source("xds://a:1"),
                source("k8s://"),
                source("fs:///x")
            ])
            .is_empty()
        );
        let e = errors(vec![source("k8s://"), source("k8s://")]);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("configSources[1].address: a second k8s://"),
            "{e:?}"
        );
        let e = errors(vec![source("xds://a:1"), source("xds://a:1")]);
        assert!(e[0].contains("listed twice"), "{e:?}");
        let e = errors(vec![source("ftp://a")]);
        assert!(e[0].starts_with("configSources[0].address:"), "{e:?}");
        let mut tls = source("xds://a:1");
        tls.tls_settings = Some(ClientTlsSettings {
            mode: meshfed_api::networking::v1alpha3::client_tls_settings::TlSmode::IstioMutual
                as i32,
            ..Default::default()
        });
        let e = errors(vec![tls]);
        assert!(e[0].starts_with("configSources[0].tlsSettings:"), "{e:?}");
    }

    #[test]
    fn a_disabled_tls_mode_passes_and_subscribed_resources_warn() {
        let mut s = source("xds://a:1");
        s.tls_settings = Some(ClientTlsSettings::default());
        s.subscribed_resources = vec![0];
        let config = MeshConfig {
            config_sources: vec![s],
            ..Default::default()
        };
        let warnings = validate_config_sources(&config).unwrap();
        assert_eq!(warnings.len(), 1);
        assert_eq!(
            warnings[0].field.to_string(),
            "configSources[0].subscribedResources"
        );
        assert_eq!(config_source_addresses(&config).unwrap().len(), 1);
    }
}

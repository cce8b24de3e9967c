//! How a service port is served (its protocol class) and the filter chains of an
//! outbound listener being built, with their matches.

use std::collections::BTreeSet;
use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::CidrRange;
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChainMatch};
use envoy_types::pb::google::protobuf::UInt32Value;
use meshfed_registry::{Protocol, Service};

/// How a service port is served (Istio's listener protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    Http,
    Tcp,
    Auto,
}

pub(super) fn class_of(protocol: Protocol) -> Option<Class> {
    match protocol {
        Protocol::Udp => None,
        p if p.is_http() => Some(Class::Http),
        Protocol::Unsupported => Some(Class::Auto),
        _ => Some(Class::Tcp),
    }
}

pub(super) fn is_tcp(protocol: Protocol) -> bool {
    matches!(
        protocol,
        Protocol::Tcp
            | Protocol::Https
            | Protocol::Tls
            | Protocol::Mongo
            | Protocol::Redis
            | Protocol::Mysql
    )
}

pub(super) fn is_tls(protocol: Protocol) -> bool {
    matches!(protocol, Protocol::Https | Protocol::Tls)
}

/// One filter chain before it becomes Envoy config (Istio's `filterChainOpts`).
#[derive(Clone, Debug)]
pub(super) struct ChainOpts {
    pub(super) server_names: Vec<String>,
    pub(super) cidrs: Vec<String>,
    pub(super) alpn: Vec<String>,
    pub(super) transport: &'static str,
    pub(super) filter: Filter,
}

impl ChainOpts {
    pub(super) fn tcp(cidrs: Vec<String>, filter: Filter) -> ChainOpts {
        ChainOpts {
            server_names: Vec::new(),
            cidrs,
            alpn: Vec::new(),
            transport: "",
            filter,
        }
    }

    pub(super) fn sniffed_http(filter: Filter) -> ChainOpts {
        ChainOpts {
            server_names: Vec::new(),
            cidrs: Vec::new(),
            alpn: PLAINTEXT_HTTP_ALPN.iter().map(|s| s.to_string()).collect(),
            transport: RAW_BUFFER,
            filter,
        }
    }

    /// Matches every connection: no SNI (or `*`), ALPN, transport or address.
    pub(super) fn is_match_all(&self) -> bool {
        (self.server_names.is_empty() || self.server_names.iter().any(|s| s == "*"))
            && self.alpn.is_empty()
            && self.transport.is_empty()
            && self.cidrs.is_empty()
    }

    /// Whether `other` would match the same connections (Envoy refuses duplicates).
    pub(super) fn conflicts_with(&self, other: &ChainOpts) -> bool {
        fn sni(names: &[String]) -> BTreeSet<&str> {
            names
                .iter()
                .map(String::as_str)
                .filter(|s| *s != "*")
                .collect()
        }
        fn cidrs(list: &[String]) -> BTreeSet<(IpAddr, u8)> {
            list.iter()
                .filter_map(|c| parse_cidr(c))
                .filter(|(ip, _)| !ip.is_unspecified())
                .collect()
        }
        self.transport == other.transport
            && self.alpn == other.alpn
            && sni(&self.server_names) == sni(&other.server_names)
            && cidrs(&self.cidrs) == cidrs(&other.cidrs)
    }

    pub(super) fn filter_chain_match(&self) -> Option<FilterChainMatch> {
        if self.is_match_all() {
            return None;
        }
        let mut m = FilterChainMatch {
            application_protocols: self.alpn.clone(),
            transport_protocol: self.transport.to_string(),
            ..Default::default()
        };
        if !self.server_names.iter().any(|s| s == "*") {
            m.server_names = self.server_names.clone();
            m.server_names.sort();
        }
        let mut cidrs = self.cidrs.clone();
        cidrs.sort();
        m.prefix_ranges = cidrs
            .iter()
            .filter_map(|c| parse_cidr(c))
            .filter(|(ip, _)| !ip.is_unspecified())
            .map(|(ip, len)| CidrRange {
                address_prefix: ip.to_string(),
                prefix_len: Some(UInt32Value {
                    value: u32::from(len),
                }),
            })
            .collect();
        Some(m)
    }
}

/// An address or CIDR, masked to its prefix (`10.1.2.3/8` is `10.0.0.0/8`).
pub(super) fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (ip, len) = match s.split_once('/') {
        Some((ip, len)) => (ip.parse::<IpAddr>().ok()?, len.parse::<u8>().ok()?),
        None => {
            let ip: IpAddr = s.parse().ok()?;
            (ip, if ip.is_ipv4() { 32 } else { 128 })
        }
    };
    let masked = match ip {
        IpAddr::V4(v4) if len <= 32 => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            IpAddr::from(std::net::Ipv4Addr::from(u32::from(v4) & mask))
        }
        IpAddr::V6(v6) if len <= 128 => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            IpAddr::from(std::net::Ipv6Addr::from(u128::from(v6) & mask))
        }
        _ => return None,
    };
    Some((masked, len))
}

/// The ALPN values the HTTP inspector sets for plain-text HTTP.
pub(super) const PLAINTEXT_HTTP_ALPN: [&str; 2] = ["http/1.1", "h2c"];
/// Transport protocol Envoy reports for anything that is not TLS.
pub(super) const RAW_BUFFER: &str = "raw_buffer";

/// Istio's RDS table of a sniffed (unnamed-protocol) service port: a listener bound to
/// the service's own address gets a table of that service alone, `<host>:<port>`
/// (its virtual host answers any Host), so a foreign Host header on the VIP still
/// reaches the service; the wildcard listener shares the per-port table `<port>`.
pub(super) fn sniffed_route_name(bind: &str, port: u16, service: &Service) -> String {
    let wildcard = bind
        .parse::<IpAddr>()
        .map_or(bind.is_empty(), |ip| ip.is_unspecified());
    if wildcard {
        port.to_string()
    } else {
        format!("{}:{port}", service.hostname)
    }
}

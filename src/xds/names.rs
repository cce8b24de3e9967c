//! The names resources are known by, shared by the generators, the push layer and the
//! ADS layer: Istio's cluster names and their parsing, the direction of traffic they
//! name, the host a resource name is derived from, and the special clusters.
//!
//! A leaf: nothing here imports the rest of the crate, so any layer may use it.

/// Drops traffic to unknown destinations (outboundTrafficPolicy REGISTRY_ONLY).
pub const BLACK_HOLE: &str = "BlackHoleCluster";
/// Forwards traffic to unknown destinations as addressed (ALLOW_ANY).
pub const PASSTHROUGH: &str = "PassthroughCluster";
/// Inbound traffic to ports no service claims, forwarded to the original destination.
pub const INBOUND_PASSTHROUGH: &str = "InboundPassthroughCluster";

/// Which way a cluster name points.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Direction {
    Inbound,
    Outbound,
}

/// A parsed `direction|port|subset|hostname` cluster name.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ClusterName<'a> {
    pub direction: Direction,
    pub port: u16,
    pub subset: &'a str,
    pub hostname: &'a str,
    /// The SNI form `outbound_.<port>_.<subset>_.<hostname>`: a gateway's SNI-DNAT
    /// cluster (AUTO_PASSTHROUGH), which only has Istio mTLS endpoints.
    pub sni_dnat: bool,
}

impl<'a> ClusterName<'a> {
    /// Parses `outbound|80||reviews.default.svc.cluster.local` (or `inbound|...`), and
    /// the SNI-DNAT form `outbound_.80_._.reviews.default.svc.cluster.local`.
    pub fn parse(name: &'a str) -> Option<ClusterName<'a>> {
        if let Some(rest) = name.strip_prefix("outbound_.") {
            let mut parts = rest.splitn(3, "_.");
            let port = parts.next()?.parse().ok()?;
            let subset = parts.next()?;
            let hostname = parts.next().filter(|h| !h.is_empty())?;
            return Some(ClusterName {
                direction: Direction::Outbound,
                port,
                subset,
                hostname,
                sni_dnat: true,
            });
        }
        let mut parts = name.split('|');
        let direction = match parts.next()? {
            "outbound" => Direction::Outbound,
            "inbound" => Direction::Inbound,
            _ => return None,
        };
        let port = parts.next()?.parse().ok()?;
        let subset = parts.next()?;
        let hostname = parts.next()?;
        if parts.next().is_some() {
            return None;
        }
        Some(ClusterName {
            direction,
            port,
            subset,
            hostname,
            sni_dnat: false,
        })
    }
}

/// `outbound|<port>|<subset>|<hostname>`.
pub fn outbound_name(port: u16, subset: &str, hostname: &str) -> String {
    format!("outbound|{port}|{subset}|{hostname}")
}

/// `inbound|<targetPort>||`.
pub fn inbound_name(target_port: u16) -> String {
    format!("inbound|{target_port}||")
}

/// The SNI (and DNS SRV) form `outbound_.<port>_.<subset>_.<hostname>`, sent with Istio
/// mTLS so that east-west gateways can route by it.
pub fn sni_name(port: u16, subset: &str, hostname: &str) -> String {
    format!("outbound_.{port}_.{subset}_.{hostname}")
}

/// The host a resource name is derived from: the hostname of a cluster name
/// ([`ClusterName::parse`]); else the last `|` field of the name, or the name itself.
pub fn host_of(name: &str) -> &str {
    match ClusterName::parse(name) {
        Some(cluster) => cluster.hostname,
        None => name.rsplit('|').next().unwrap_or(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_names_parse() {
        let n = ClusterName::parse("outbound|80|v1|reviews.default.svc.cluster.local").unwrap();
        assert_eq!(
            (n.direction, n.port, n.subset, n.hostname),
            (
                Direction::Outbound,
                80,
                "v1",
                "reviews.default.svc.cluster.local"
            )
        );
        assert!(ClusterName::parse("outbound|x||h").is_none());
        assert!(ClusterName::parse("BlackHoleCluster").is_none());
        assert!(ClusterName::parse("outbound|80||h|extra").is_none());
        let n = ClusterName::parse("inbound|8080||").unwrap();
        assert_eq!(
            (n.direction, n.port, n.hostname),
            (Direction::Inbound, 8080, "")
        );
        assert_eq!(
            sni_name(80, "v1", "a.b"),
            "outbound_.80_.v1_.a.b",
            "Istio's SNI form"
        );
    }

    #[test]
    fn the_host_of_a_name_is_its_cluster_hostname() {
        assert_eq!(
            host_of("outbound|80|v1|reviews.ns.svc.cluster.local"),
            "reviews.ns.svc.cluster.local"
        );
        assert_eq!(
            host_of("outbound_.80_.v1_.reviews.ns.svc.cluster.local"),
            "reviews.ns.svc.cluster.local"
        );
        assert_eq!(host_of("inbound|8080||"), "");
        assert_eq!(
            host_of("reviews.ns.svc.cluster.local:80"),
            "reviews.ns.svc.cluster.local:80"
        );
    }
}

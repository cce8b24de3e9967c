//! The mesh trust domain and its aliases, as principals in policies see them: a
//! principal `<td>/ns/<ns>/sa/<sa>` whose trust domain is ours, an alias of ours or
//! the literal `cluster.local` means the same identity in every one of them.

/// The local trust domain followed by its aliases.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TrustDomains {
    domains: Vec<String>,
}

/// The placeholder for the local trust domain in policies.
pub const CLUSTER_LOCAL: &str = "cluster.local";

impl TrustDomains {
    /// `trust_domain` and then its aliases (duplicates and empty entries dropped).
    pub fn new(trust_domain: &str, aliases: &[String]) -> TrustDomains {
        let mut domains: Vec<String> = Vec::new();
        for d in std::iter::once(trust_domain).chain(aliases.iter().map(String::as_str)) {
            if !d.is_empty() && !domains.iter().any(|x| x == d) {
                domains.push(d.to_string());
            }
        }
        TrustDomains { domains }
    }

    pub fn domains(&self) -> &[String] {
        &self.domains
    }

    /// The principals with every one in a known trust domain expanded to all of them;
    /// others (a wildcard-only or unknown trust domain, not of the `td/ns/x/sa/y` form)
    /// stay. A trust domain with a leading or trailing `*` is known when it matches one
    /// of ours; it is kept as written for the domains it matches.
    pub fn expand(&self, principals: &[String]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut add = |p: String| {
            if !out.contains(&p) {
                out.push(p);
            }
        };
        for p in principals {
            let parts: Vec<&str> = p.split('/').collect();
            let enforced = parts.len() == 5 && parts[1] == "ns" && parts[3] == "sa";
            let td = parts[0];
            if self.domains.is_empty() || !enforced || td == "*" || td.is_empty() {
                add(p.clone());
                continue;
            }
            let known = td == CLUSTER_LOCAL || self.domains.iter().any(|d| td_matches(td, d));
            if !known {
                add(p.clone());
                continue;
            }
            let rest = &p[td.len()..];
            for d in &self.domains {
                if td_matches(td, d) {
                    add(p.clone());
                } else {
                    add(format!("{d}{rest}"));
                }
            }
        }
        out
    }
}

/// Whether the trust domain of a principal (possibly `*x` or `x*`) matches `domain`.
fn td_matches(pattern: &str, domain: &str) -> bool {
    if let Some(sfx) = pattern.strip_prefix('*') {
        domain.ends_with(sfx)
    } else if let Some(pfx) = pattern.strip_suffix('*') {
        domain.starts_with(pfx)
    } else {
        pattern == domain
    }
}

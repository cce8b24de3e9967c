//! Serving MCP-over-xDS on the ADS ports: who may read it on the secure port (the
//! allow-list of `--mcpAllowedIdentities`), what is exported (`--mcpExportRegistries`,
//! `--mcpExportNamespaces`) and the MCP metrics. The resources themselves come from
//! [`crate::generate::mcp`].
//!
//! Any stream may ask for an MCP type, as in istiod (whose default generator for an
//! unknown type is the API generator); `GENERATOR=api` streams are istiods reading
//! config sources. On the plaintext port MCP is served as plainly as everything else
//! there (Istio's `xds://` config sources dial plaintext); on the secure port only to
//! an identity on the allow-list: any other stream asking for an MCP type, or
//! connecting with `GENERATOR=api`, is ended with `PERMISSION_DENIED`.

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::{info, warn};

use crate::generate::mcp::{McpExport, McpOutput};
use crate::xds::mcp::McpType;

/// One allowed identity: a SPIFFE id, or `<namespace>/<service account>` (`*` for
/// any service account of the namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Allowed {
    Spiffe(String),
    Account { namespace: String, account: String },
}

/// The identities that may read MCP on the secure port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpAllowList(Vec<Allowed>);

impl McpAllowList {
    /// The default: any identity of the system namespace (`<namespace>/*`), as
    /// istiod's API generator admits only control-plane (root namespace) identities.
    pub fn system(namespace: &str) -> Self {
        McpAllowList(vec![Allowed::Account {
            namespace: namespace.to_string(),
            account: "*".to_string(),
        }])
    }

    /// Parses `--mcpAllowedIdentities` entries: `spiffe://<trust domain>/ns/<ns>/sa/<sa>`
    /// or `<namespace>/<service account>` (`<namespace>/*`).
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut out = Vec::new();
        for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            if entry.starts_with("spiffe://") {
                if spiffe_account(entry).is_none() {
                    return Err(format!(
                        "--mcpAllowedIdentities: {entry:?} is not a workload SPIFFE id (spiffe://<trust domain>/ns/<namespace>/sa/<service account>)"
                    ));
                }
                out.push(Allowed::Spiffe(entry.to_string()));
            } else {
                match entry.split_once('/') {
                    Some((ns, sa)) if !ns.is_empty() && !sa.is_empty() && !sa.contains('/') => {
                        out.push(Allowed::Account {
                            namespace: ns.to_string(),
                            account: sa.to_string(),
                        });
                    }
                    _ => {
                        return Err(format!(
                            "--mcpAllowedIdentities: {entry:?} is neither a SPIFFE id nor <namespace>/<service account>"
                        ));
                    }
                }
            }
        }
        Ok(McpAllowList(out))
    }

    /// Whether the verified SPIFFE `identity` is allowed.
    pub fn allows(&self, identity: &str) -> bool {
        let account = spiffe_account(identity);
        self.0.iter().any(|allowed| match allowed {
            Allowed::Spiffe(id) => id == identity,
            Allowed::Account {
                namespace,
                account: sa,
            } => account.is_some_and(|(ns, a)| ns == namespace && (sa == "*" || sa == a)),
        })
    }
}

/// The namespace and service account of a workload SPIFFE id.
fn spiffe_account(id: &str) -> Option<(&str, &str)> {
    let path = id.strip_prefix("spiffe://")?.split_once('/')?.1;
    let (ns, sa) = path.strip_prefix("ns/")?.split_once("/sa/")?;
    (!ns.is_empty() && !sa.is_empty() && !sa.contains('/')).then_some((ns, sa))
}

/// MCP metrics (pushes and their sizes are `pilot_xds_pushes` and
/// `pilot_xds_config_size_bytes` with the type URL as `type`).
#[derive(Debug, Default)]
pub struct McpMetrics {
    /// `meshfed_mcp_resources{type}`: resources of each MCP type in the last answer.
    pub resources: Family<crate::metrics::TypeLabel, Gauge>,
    /// `meshfed_mcp_denied`: secure-port streams refused MCP (identity not allowed).
    pub denied: Counter,
    /// `meshfed_mcp_export_conflicts`: exported hostnames another registry also has.
    pub conflicts: Gauge,
    /// `meshfed_mcp_export_skipped`: exported services or objects left out.
    pub skipped: Gauge,
}

impl McpMetrics {
    /// Registers the metrics.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "meshfed_mcp_resources",
            "Resources of each MCP-over-xDS type in the last answer",
            self.resources.clone(),
        );
        registry.register(
            "meshfed_mcp_denied",
            "Secure-port xDS streams refused MCP because their identity is not in --mcpAllowedIdentities",
            self.denied.clone(),
        );
        registry.register(
            "meshfed_mcp_export_conflicts",
            "Exported hostnames another registry also has (the aggregate's merge policy picks the one served)",
            self.conflicts.clone(),
        );
        registry.register(
            "meshfed_mcp_export_skipped",
            "Exported services or objects left out of MCP (no ServiceEntry form, or a name taken by a config object)",
            self.skipped.clone(),
        );
    }
}

/// Everything MCP serving needs on the ADS side.
#[derive(Debug)]
pub struct McpServing {
    /// What is exported.
    pub export: Arc<McpExport>,
    /// Who may read MCP on the secure port.
    pub allowed: McpAllowList,
    /// Metrics.
    pub metrics: McpMetrics,
    /// What was last reported of the synthesized objects, so that a change is
    /// logged once.
    reported: Mutex<Reported>,
}

/// The conflicts and left-out services last reported.
#[derive(Debug, Default)]
struct Reported {
    conflicts: Arc<[String]>,
    skipped: Arc<[String]>,
}

impl McpServing {
    /// Serving with `export` and `allowed`.
    pub fn new(export: McpExport, allowed: McpAllowList) -> Self {
        McpServing {
            export: Arc::new(export),
            allowed,
            metrics: McpMetrics::default(),
            reported: Mutex::default(),
        }
    }

    /// Whether a stream of the secure port (`secure`) with `identity` may read MCP.
    pub fn admits(&self, secure: bool, identity: Option<&str>) -> bool {
        !secure || identity.is_some_and(|id| self.allowed.allows(id))
    }

    /// Records what an answer of `t` carried: its resource count, and the collisions
    /// and left-out services of the synthesized objects (logged when they change).
    pub fn record(&self, t: McpType, output: &McpOutput) {
        self.metrics
            .resources
            .get_or_create(&crate::metrics::type_label(t.as_str()))
            .set(output.resources.len() as i64);
        if t.config_kind() != Some(meshfed_registry::config::Kind::ServiceEntry) {
            return;
        }
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        if Arc::ptr_eq(&reported.conflicts, &output.conflicts)
            && Arc::ptr_eq(&reported.skipped, &output.skipped)
        {
            return;
        }
        self.metrics.conflicts.set(output.conflicts.len() as i64);
        self.metrics.skipped.set(output.skipped.len() as i64);
        if *reported.conflicts != *output.conflicts && !output.conflicts.is_empty() {
            info!(
                conflicts = %output.conflicts.join("; "),
                "MCP: exported hostnames that another registry also has (the aggregate's merge policy picked the one served; see /debug/registryz)"
            );
        }
        if *reported.skipped != *output.skipped && !output.skipped.is_empty() {
            warn!(
                skipped = %output.skipped.join("; "),
                "MCP: exported services left out of the synthesized ServiceEntries"
            );
        }
        *reported = Reported {
            conflicts: output.conflicts.clone(),
            skipped: output.skipped.clone(),
        };
    }
}

impl Default for McpServing {
    fn default() -> Self {
        McpServing::new(McpExport::default(), McpAllowList::system("istio-system"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_admits_the_system_namespace_only() {
        let list = McpAllowList::system("istio-system");
        assert!(list.allows("spiffe://cluster.local/ns/istio-system/sa/istiod"));
        assert!(list.allows("spiffe://other.td/ns/istio-system/sa/istiod-canary"));
        assert!(!list.allows("spiffe://cluster.local/ns/attacker/sa/istiod"));
        assert!(!list.allows("not-a-spiffe-id"));
        let serving = McpServing::default();
        assert!(serving.admits(false, None), "plaintext port");
        assert!(!serving.admits(true, None));
        assert!(serving.admits(
            true,
            Some("spiffe://cluster.local/ns/istio-system/sa/istiod")
        ));
    }

    #[test]
    fn entries_parse_and_bad_ones_are_refused() {
        let list = McpAllowList::parse(&[
            "spiffe://cluster.local/ns/a/sa/istiod".into(),
            "b/reader".into(),
            "c/*".into(),
        ])
        .unwrap();
        assert!(list.allows("spiffe://cluster.local/ns/a/sa/istiod"));
        assert!(
            !list.allows("spiffe://other/ns/a/sa/istiod"),
            "exact SPIFFE id"
        );
        assert!(list.allows("spiffe://x/ns/b/sa/reader"));
        assert!(!list.allows("spiffe://x/ns/b/sa/writer"));
        assert!(list.allows("spiffe://x/ns/c/sa/anything"));
        for bad in ["spiffe://x/foo", "nobody", "a/b/c", "/sa"] {
            let err = McpAllowList::parse(&[bad.to_string()]).unwrap_err();
            assert!(err.contains("--mcpAllowedIdentities"), "{err}");
        }
    }
}

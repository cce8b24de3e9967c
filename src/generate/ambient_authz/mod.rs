//! ztunnel's policies: AuthorizationPolicies and PeerAuthentications as the layer-4
//! `istio.security.Authorization` resources ztunnel enforces
//! (`type.googleapis.com/istio.security.Authorization`), and which of them a workload
//! lists in its `authorization_policies` field, as Istio's ambient index builds them
//! (`pilot/pkg/serviceregistry/kube/controller/ambient/{policies,authorization}.go`).
//!
//! The served set, each named `<namespace>/<name>`:
//! - every AuthorizationPolicy that attaches by selector (not `targetRef(s)`) with
//!   action ALLOW or DENY ([`convert`]); scope `WORKLOAD_SELECTOR` with a selector,
//!   `GLOBAL` in the root namespace, `NAMESPACE` otherwise;
//! - the converted workload PeerAuthentications with port-level modes ([`peer`]);
//! - `<root>/istio_converted_static_strict`, whenever any PeerAuthentication exists.
//!
//! ztunnel applies `GLOBAL` and `NAMESPACE` policies by their scope; a
//! `WORKLOAD_SELECTOR` policy applies only to the workloads that list it, which is what
//! [`AmbientPolicies::workload_policies`] answers for the workload builder.
//!
//! What ztunnel cannot enforce as written is a [`Finding`] (Istio's `UnsupportedValue`
//! condition on the policy): kept in [`AmbientPolicies::findings`] and logged once per
//! policy and message.

pub mod convert;
pub mod peer;

#[cfg(test)]
pub(crate) mod tests;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex};

use meshfed_api::security::Authorization;
use meshfed_api::security::v1beta1::PeerAuthentication;
use tracing::warn;

pub use convert::{Finding, UNSUPPORTED_VALUE, convert_authorization_policy};
pub use peer::{STATIC_STRICT_POLICY_NAME, convert_peer_authentication, static_strict_policy};

use crate::push::config_index::{Config, ConfigIndex};
use crate::push::snapshot::Snapshot;
use crate::xds::{EncodedResource, Resource, TypeUrl};

use super::Subscription;

/// The resource name of a policy: `<namespace>/<name>`.
pub fn resource_name(a: &Authorization) -> String {
    format!("{}/{}", a.namespace, a.name)
}

/// A policy workloads list by selector: its `matchLabels` and resource name.
type Selectable = (BTreeMap<String, String>, String);

/// Everything ztunnel gets from one config index's AuthorizationPolicies and
/// PeerAuthentications, and what a workload lists of it.
#[derive(Debug, Default)]
pub struct AmbientPolicies {
    /// Every served policy, by resource name.
    resources: BTreeMap<String, Authorization>,
    /// The same, encoded once for every ztunnel.
    encoded: BTreeMap<String, Resource>,
    /// The converted AuthorizationPolicies with a non-empty selector, by namespace.
    selectable: BTreeMap<String, Vec<Selectable>>,
    /// PeerAuthentications, oldest first (what workload selection reads).
    peer_authentications: Vec<Arc<Config<PeerAuthentication>>>,
    root_namespace: String,
    findings: Vec<Finding>,
}

impl AmbientPolicies {
    /// Converts the AuthorizationPolicies and PeerAuthentications of `index`.
    pub fn build(index: &ConfigIndex) -> AmbientPolicies {
        let root = index.root_namespace.as_str();
        let mut out = AmbientPolicies {
            root_namespace: root.to_string(),
            peer_authentications: index.peer_authentications().to_vec(),
            ..Default::default()
        };
        for ap in index.authorization_policies() {
            let (converted, finding) = convert_authorization_policy(root, ap);
            out.findings.extend(finding);
            let Some(converted) = converted else { continue };
            let name = resource_name(&converted);
            if let Some(selector) = ap.spec.selector.as_ref()
                && !selector.match_labels.is_empty()
            {
                out.selectable
                    .entry(ap.namespace.clone())
                    .or_default()
                    .push((selector.match_labels.clone(), name.clone()));
            }
            out.resources.insert(name, converted);
        }
        let pas = index.peer_authentications();
        if !pas.is_empty() {
            let root_policy = peer::namespace_policy(pas, root);
            for pa in pas {
                let ns_policy = peer::namespace_policy(pas, &pa.namespace);
                if let Some(converted) =
                    convert_peer_authentication(root, pa, ns_policy, root_policy)
                {
                    out.resources.insert(resource_name(&converted), converted);
                }
            }
            let strict = static_strict_policy(root);
            out.resources.insert(resource_name(&strict), strict);
        }
        out.findings.sort();
        log_findings(&out.findings);
        out.encoded = out
            .resources
            .iter()
            .map(|(name, a)| {
                let r = EncodedResource::encode(TypeUrl::Authorization, name.as_str(), a);
                (name.clone(), r)
            })
            .collect();
        out
    }

    /// The encoded resources `sub` asks for: every policy for a wildcard subscription,
    /// else the named ones that exist.
    pub fn select(&self, sub: Subscription<'_>) -> Vec<Resource> {
        if sub.wildcard {
            return self.encoded.values().cloned().collect();
        }
        sub.names
            .iter()
            .filter_map(|n| self.encoded.get(n).cloned())
            .collect()
    }

    /// Every served policy, by resource name (`<namespace>/<name>`), sorted.
    pub fn resources(&self) -> &BTreeMap<String, Authorization> {
        &self.resources
    }

    /// The policy named `name` (`<namespace>/<name>`).
    pub fn get(&self, name: &str) -> Option<&Authorization> {
        self.resources.get(name)
    }

    /// What ztunnel cannot enforce as written, by policy.
    pub fn findings(&self) -> &[Finding] {
        &self.findings
    }

    /// The `authorization_policies` of a workload of `namespace` with `labels` (Istio's
    /// `buildWorkloadPolicies`): the converted AuthorizationPolicies of its namespace
    /// and of the root namespace whose non-empty selector its labels satisfy (sorted
    /// names), then the PeerAuthentication-derived names that apply to it
    /// ([`peer::workload_keys`]). Namespace-wide and mesh-wide policies are not
    /// listed: ztunnel applies them by scope.
    pub fn workload_policies(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<String> {
        let selects =
            |sel: &BTreeMap<String, String>| sel.iter().all(|(k, v)| labels.get(k) == Some(v));
        let mut names: Vec<String> = [self.root_namespace.as_str(), namespace]
            .iter()
            .enumerate()
            // The root namespace once, when the workload is in it.
            .filter(|(i, ns)| *i == 0 || **ns != self.root_namespace)
            .filter_map(|(_, ns)| self.selectable.get(*ns))
            .flatten()
            .filter(|(sel, _)| selects(sel))
            .map(|(_, name)| name.clone())
            .collect();
        names.sort();
        let applicable = peer::applicable(
            &self.peer_authentications,
            &self.root_namespace,
            namespace,
            labels,
        );
        names.extend(peer::workload_keys(&self.root_namespace, applicable));
        names
    }
}

/// The policies of `snapshot`, converted once per snapshot.
pub fn ambient_policies(snapshot: &Snapshot) -> Arc<AmbientPolicies> {
    snapshot.derived(|s| AmbientPolicies::build(s.config()))
}

/// The `istio.security.Authorization` resources of `snapshot` that `sub` asks for
/// (what the Delta server sends a ztunnel; removals follow from the Delta diff).
pub fn resources(snapshot: &Snapshot, sub: Subscription<'_>) -> Vec<Resource> {
    ambient_policies(snapshot).select(sub)
}

/// The `authorization_policies` of a workload of `namespace` with `labels` in
/// `snapshot` (see [`AmbientPolicies::workload_policies`]).
pub fn workload_policies(
    snapshot: &Snapshot,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<String> {
    ambient_policies(snapshot).workload_policies(namespace, labels)
}

/// Findings already logged (a policy is converted again at every snapshot).
static LOGGED: LazyLock<Mutex<HashSet<Finding>>> = LazyLock::new(Mutex::default);

/// Logs each finding not logged before, at warn.
fn log_findings(findings: &[Finding]) {
    let mut logged = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
    if logged.len() > 4096 {
        logged.clear();
    }
    for f in findings {
        if logged.insert(f.clone()) {
            warn!(policy = %f.policy, reason = f.reason, "AuthorizationPolicy for ztunnel: {}", f.message);
        }
    }
}

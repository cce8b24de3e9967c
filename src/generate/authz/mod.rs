//! AuthorizationPolicy → Envoy RBAC filters, as Istio builds them
//! (`security/authz/builder`, `model`, `matcher`), as a pure function of the
//! policies that apply to one workload. Not yet placed on listeners.
//!
//! - [`select`]: the policies of the workload's namespace and of the root namespace
//!   whose selector matches its labels (no selector, or no labels, matches all);
//!   policies with `targetRef(s)` are for Gateway API gateways and ignored here;
//!   sorted by creation time, then name, then namespace; grouped by action.
//! - [`http_filters`] / [`network_filters`]: one RBAC filter per present action, in
//!   the order CUSTOM, AUDIT (action LOG), DENY, ALLOW. Each rule of a policy is a
//!   policy `ns[<ns>]-policy[<name>]-rule[<i>]` ([`model::rule_policy`]); a policy
//!   without rules is one policy that never matches. Policies annotated
//!   `istio.io/dry-run: "true"` go to `shadow_rules` (stat prefix
//!   `istio_dry_run_allow_` / `istio_dry_run_deny_`) and are not enforced.
//! - CUSTOM: per provider (sorted by name) an RBAC filter whose policies are shadow
//!   rules (stat prefix `istio_ext_authz_`, names prefixed
//!   `istio-ext-authz-<provider>-`) for an
//!   `ext_authz` filter to read; the `ext_authz` filter itself is not built here.

pub mod matcher;
pub mod model;
pub mod trust_domain;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod vectors;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use envoy_types::pb::envoy::config::listener::v3::{Filter, filter};
use envoy_types::pb::envoy::config::rbac::v3::{
    Permission, Policy, Principal, Rbac, permission, principal, rbac,
};
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use envoy_types::pb::google::protobuf::Any;
use meshfed_api::security::v1beta1::AuthorizationPolicy;
use meshfed_api::security::v1beta1::authorization_policy::{Action, ActionDetail};
use prost::{Message, Name};

use crate::push::config_index::Config;
use model::{Effect, Target};
use trust_domain::TrustDomains;

/// Name of the HTTP RBAC filter.
pub const HTTP_RBAC: &str = "envoy.filters.http.rbac";
/// Name of the network RBAC filter.
pub const NETWORK_RBAC: &str = "envoy.filters.network.rbac";
/// Stat prefix of the network RBAC filter.
pub const TCP_STAT_PREFIX: &str = "tcp.";
/// The annotation that makes a policy dry-run.
pub const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";
const DRY_RUN_ALLOW_PREFIX: &str = "istio_dry_run_allow_";
const DRY_RUN_DENY_PREFIX: &str = "istio_dry_run_deny_";
const EXT_AUTHZ_SHADOW_PREFIX: &str = "istio_ext_authz_";
const EXT_AUTHZ_NAME_PREFIX: &str = "istio-ext-authz";

type Ap = Arc<Config<AuthorizationPolicy>>;

/// Mesh-wide settings the translation depends on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct AuthzOptions {
    pub trust_domains: TrustDomains,
    /// JWT claim matches accept a string claim as well as a list (Envoy ≥ 1.21).
    pub extended_jwt: bool,
}

impl AuthzOptions {
    /// The options of a mesh config (trust domain and aliases).
    pub fn from_mesh(mesh: &meshfed_api::mesh::v1alpha1::MeshConfig) -> AuthzOptions {
        AuthzOptions {
            trust_domains: TrustDomains::new(&mesh.trust_domain, &mesh.trust_domain_aliases),
            extended_jwt: true,
        }
    }
}

/// The policies applying to one workload, by action, each list sorted as Istio sorts.
#[derive(Clone, Debug, Default)]
pub struct Selected {
    pub allow: Vec<Ap>,
    pub deny: Vec<Ap>,
    pub audit: Vec<Ap>,
    pub custom: Vec<Ap>,
}

impl Selected {
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty()
            && self.deny.is_empty()
            && self.audit.is_empty()
            && self.custom.is_empty()
    }
}

/// Whether a policy is dry-run (`istio.io/dry-run` parses as true).
pub fn is_dry_run(p: &Config<AuthorizationPolicy>) -> bool {
    matches!(
        p.annotations.get(DRY_RUN_ANNOTATION).map(String::as_str),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True")
    )
}

/// The policies that apply to an ordinary (sidecar) workload of `namespace` with
/// `labels`.
pub fn select(
    policies: &[Ap],
    root_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Selected {
    let mut chosen: Vec<&Ap> = policies
        .iter()
        .filter(|p| p.namespace == namespace || p.namespace == root_namespace)
        .filter(|p| p.spec.target_ref.is_none() && p.spec.target_refs.is_empty())
        .filter(|p| match &p.spec.selector {
            None => true,
            Some(s) => s.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v)),
        })
        .collect();
    chosen.sort_by(|a, b| {
        (a.creation_time, &a.name, &a.namespace).cmp(&(b.creation_time, &b.name, &b.namespace))
    });
    let mut out = Selected::default();
    for p in chosen {
        let list = match Action::try_from(p.spec.action) {
            Ok(Action::Allow) => &mut out.allow,
            Ok(Action::Deny) => &mut out.deny,
            Ok(Action::Audit) => &mut out.audit,
            Ok(Action::Custom) => &mut out.custom,
            Err(_) => continue,
        };
        list.push(Arc::clone(p));
    }
    out
}

/// The enforced and shadow rules of one group of policies.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Built {
    pub rules: Option<Rbac>,
    pub shadow: Option<Rbac>,
}

/// A policy that matches nothing (the translation of `spec: {}`).
pub fn never_matching() -> Policy {
    Policy {
        permissions: vec![Permission {
            rule: Some(permission::Rule::NotRule(Box::new(Permission {
                rule: Some(permission::Rule::Any(true)),
            }))),
        }],
        principals: vec![Principal {
            identifier: Some(principal::Identifier::NotId(Box::new(Principal {
                identifier: Some(principal::Identifier::Any(true)),
            }))),
        }],
        ..Default::default()
    }
}

fn policy_name(name_prefix: &str, ns: &str, name: &str, i: usize) -> String {
    format!("{name_prefix}ns[{ns}]-policy[{name}]-rule[{i}]")
}

/// Translates a group of policies of one action into RBAC rules. CUSTOM policies
/// (all of one provider) go to the shadow rules, named
/// `istio-ext-authz-<provider>-ns[..]-policy[..]-rule[..]`.
pub fn build(policies: &[Ap], action: Action, tcp: bool, opts: &AuthzOptions) -> Built {
    let rbac_action = match action {
        Action::Allow => rbac::Action::Allow,
        Action::Deny | Action::Custom => rbac::Action::Deny,
        Action::Audit => rbac::Action::Log,
    };
    let effect = if action == Action::Allow {
        Effect::Allow
    } else {
        Effect::DenyOrAudit
    };
    let custom = action == Action::Custom;
    let name_prefix = match (custom, policies.first().map(|p| &p.spec.action_detail)) {
        (true, Some(Some(ActionDetail::Provider(p)))) => {
            format!("{EXT_AUTHZ_NAME_PREFIX}-{}-", p.name)
        }
        (true, _) => format!("{EXT_AUTHZ_NAME_PREFIX}-"),
        (false, _) => String::new(),
    };
    let empty = || Rbac {
        action: rbac_action as i32,
        policies: HashMap::new(),
        ..Default::default()
    };
    let mut out = Built::default();
    for p in policies {
        let rbac = if is_dry_run(p) && !custom {
            out.shadow.get_or_insert_with(empty)
        } else {
            out.rules.get_or_insert_with(empty)
        };
        let target = Target {
            tcp,
            effect,
            namespace: &p.namespace,
            trust_domains: &opts.trust_domains,
            extended_jwt: opts.extended_jwt,
        };
        if p.spec.rules.is_empty() {
            rbac.policies.insert(
                policy_name(&name_prefix, &p.namespace, &p.name, 0),
                never_matching(),
            );
            continue;
        }
        for (i, rule) in p.spec.rules.iter().enumerate() {
            match model::rule_policy(rule, &target) {
                Ok(policy) => {
                    rbac.policies
                        .insert(policy_name(&name_prefix, &p.namespace, &p.name, i), policy);
                }
                Err(e) => tracing::debug!(
                    namespace = %p.namespace, name = %p.name, rule = i, tcp,
                    "authorization rule skipped: {e}"
                ),
            }
        }
    }
    if custom {
        // Every CUSTOM policy is enforced by ext_authz; RBAC only marks the requests.
        out.shadow = out.rules.take();
    }
    out
}

fn shadow_prefix(shadow: &Option<Rbac>) -> &'static str {
    // Istio names the prefix after the shadow rules' action; absent rules read as
    // ALLOW.
    match shadow.as_ref().map(|r| r.action) {
        None => DRY_RUN_ALLOW_PREFIX,
        Some(a) if a == rbac::Action::Allow as i32 => DRY_RUN_ALLOW_PREFIX,
        Some(a) if a == rbac::Action::Deny as i32 => DRY_RUN_DENY_PREFIX,
        Some(_) => "",
    }
}

fn pack<M: Message + Name>(m: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: m.encode_to_vec(),
    }
}

/// The groups in filter order: CUSTOM (one per provider, sorted), AUDIT, DENY, ALLOW.
fn groups(selected: &Selected, tcp: bool, opts: &AuthzOptions) -> Vec<(bool, Built)> {
    let mut out = Vec::new();
    let mut providers: BTreeMap<String, Vec<Ap>> = BTreeMap::new();
    for p in &selected.custom {
        let name = match &p.spec.action_detail {
            Some(ActionDetail::Provider(pr)) => pr.name.clone(),
            None => String::new(),
        };
        providers.entry(name).or_default().push(Arc::clone(p));
    }
    for list in providers.values() {
        out.push((true, build(list, Action::Custom, tcp, opts)));
    }
    for (list, action) in [
        (&selected.audit, Action::Audit),
        (&selected.deny, Action::Deny),
        (&selected.allow, Action::Allow),
    ] {
        if !list.is_empty() {
            out.push((false, build(list, action, tcp, opts)));
        }
    }
    out
}

/// The HTTP RBAC filters for the selected policies.
pub fn http_filters(selected: &Selected, opts: &AuthzOptions) -> Vec<HttpFilter> {
    groups(selected, false, opts)
        .into_iter()
        .map(|(custom, b)| {
            let config = if custom {
                HttpRbac {
                    shadow_rules: b.shadow,
                    shadow_rules_stat_prefix: EXT_AUTHZ_SHADOW_PREFIX.into(),
                    ..Default::default()
                }
            } else {
                let prefix = shadow_prefix(&b.shadow);
                HttpRbac {
                    rules: b.rules,
                    shadow_rules: b.shadow,
                    shadow_rules_stat_prefix: prefix.into(),
                    ..Default::default()
                }
            };
            HttpFilter {
                name: HTTP_RBAC.into(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack(&config))),
                ..Default::default()
            }
        })
        .collect()
}

/// The network RBAC filters for the selected policies.
pub fn network_filters(selected: &Selected, opts: &AuthzOptions) -> Vec<Filter> {
    groups(selected, true, opts)
        .into_iter()
        .map(|(custom, b)| {
            let config = if custom {
                NetworkRbac {
                    shadow_rules: b.shadow,
                    shadow_rules_stat_prefix: EXT_AUTHZ_SHADOW_PREFIX.into(),
                    stat_prefix: TCP_STAT_PREFIX.into(),
                    ..Default::default()
                }
            } else {
                let prefix = shadow_prefix(&b.shadow);
                NetworkRbac {
                    rules: b.rules,
                    shadow_rules: b.shadow,
                    shadow_rules_stat_prefix: prefix.into(),
                    stat_prefix: TCP_STAT_PREFIX.into(),
                    ..Default::default()
                }
            };
            Filter {
                name: NETWORK_RBAC.into(),
                config_type: Some(filter::ConfigType::TypedConfig(pack(&config))),
            }
        })
        .collect()
}

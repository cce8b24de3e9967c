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
//!   `istio-ext-authz-<provider>-`), followed by the provider's `ext_authz` filter
//!   ([`ext_authz`]) that checks only what they matched. An HTTP provider has no
//!   network filter: its policies are skipped on TCP chains. CUSTOM policies of an
//!   unknown or unusable provider, or of several providers at once, become one DENY
//!   filter instead (names suffixed `-deny-due-to-bad-CUSTOM-action`).

pub mod ext_authz;
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
use meshfed_api::security::v1beta1::AuthorizationPolicy;
use meshfed_api::security::v1beta1::authorization_policy::{Action, ActionDetail};

use crate::generate::proto::pack;
use crate::push::config_index::{Config, ConfigIndex};
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
pub(crate) const EXT_AUTHZ_NAME_PREFIX: &str = "istio-ext-authz";

type Ap = Arc<Config<AuthorizationPolicy>>;

/// Mesh-wide settings the translation depends on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AuthzOptions {
    pub trust_domains: TrustDomains,
    /// JWT claims and envoy filter metadata matched with one matcher per field that
    /// also accepts a string claim where a list is expected (current proxies).
    pub extended_jwt: bool,
    /// The ext_authz providers CUSTOM policies may name (the mesh config's
    /// `extensionProviders` of an ext_authz kind, resolved against the registry), with
    /// their filters or why they cannot be used. `None` accepts any name and builds
    /// the shadow RBAC filters alone (no registry to resolve providers with).
    pub custom_providers: Option<Arc<ext_authz::Resolved>>,
    /// Whether CUSTOM policies of different providers may apply to one workload
    /// (Istio's `PILOT_ENABLE_MULTIPLE_CUSTOM_AUTHZ_PROVIDERS`, off by default).
    pub multiple_custom_providers: bool,
}

impl AuthzOptions {
    /// The options of a snapshot: its mesh config's trust domains, and its ext_authz
    /// providers resolved against its services (Istio's `LookupCluster`).
    pub fn for_snapshot(snapshot: &crate::push::snapshot::Snapshot) -> AuthzOptions {
        AuthzOptions {
            custom_providers: Some(ext_authz::providers(snapshot)),
            ..AuthzOptions::from_mesh(&snapshot.mesh().config)
        }
    }

    /// The options of a mesh config alone (trust domain and aliases; CUSTOM
    /// providers unresolved: see [`AuthzOptions::for_snapshot`]).
    pub fn from_mesh(mesh: &meshfed_api::mesh::v1alpha1::MeshConfig) -> AuthzOptions {
        AuthzOptions {
            trust_domains: TrustDomains::new(&mesh.trust_domain, &mesh.trust_domain_aliases),
            extended_jwt: true,
            custom_providers: None,
            multiple_custom_providers: false,
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

/// Whether a policy (AuthorizationPolicy or RequestAuthentication) of `policy_namespace`
/// applies to an ordinary workload of `namespace` with `labels` (Istio's
/// `policyattachment.go`): it is of the workload's namespace or the root namespace, it
/// attaches by selector and not by `targetRef(s)` (those are for Gateway API gateways),
/// and its selector, if any, is a subset of the labels (an empty one selects all).
pub fn applies_to_workload(
    policy_namespace: &str,
    selector: Option<&meshfed_api::r#type::v1beta1::WorkloadSelector>,
    targeted: bool,
    root_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    (policy_namespace == namespace || policy_namespace == root_namespace)
        && !targeted
        && selector.is_none_or(|s| s.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v)))
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
        .filter(|p| {
            let targeted = p.spec.target_ref.is_some() || !p.spec.target_refs.is_empty();
            applies_to_workload(
                &p.namespace,
                p.spec.selector.as_ref(),
                targeted,
                root_namespace,
                namespace,
                labels,
            )
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

/// [`select`] over a snapshot's AuthorizationPolicies, with the root namespace of its
/// mesh config.
pub fn select_in(
    index: &ConfigIndex,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Selected {
    select(
        index.authorization_policies(),
        &index.root_namespace,
        namespace,
        labels,
    )
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

/// What a group of policies becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Group<'a> {
    /// ALLOW, DENY or AUDIT rules (dry-run policies as shadow rules).
    Enforced(Action),
    /// The policies of one CUSTOM provider: shadow rules marking what ext_authz checks.
    Custom(&'a str),
    /// CUSTOM policies that cannot be sent to their provider: denied instead.
    BadCustom,
}

/// The suffix of the policies of CUSTOM actions that cannot be applied.
const BAD_CUSTOM_SUFFIX: &str = "-deny-due-to-bad-CUSTOM-action";

/// Translates a group of policies of one action into RBAC rules. CUSTOM policies
/// (all of one provider) go to the shadow rules, named
/// `istio-ext-authz-<provider>-ns[..]-policy[..]-rule[..]`.
pub fn build(policies: &[Ap], action: Action, tcp: bool, opts: &AuthzOptions) -> Built {
    let group = match action {
        Action::Custom => Group::Custom(policies.first().map(|p| provider(p)).unwrap_or("")),
        other => Group::Enforced(other),
    };
    build_group(policies, group, tcp, opts)
}

fn provider(p: &Config<AuthorizationPolicy>) -> &str {
    match &p.spec.action_detail {
        Some(ActionDetail::Provider(pr)) => &pr.name,
        None => "",
    }
}

fn build_group(policies: &[Ap], group: Group<'_>, tcp: bool, opts: &AuthzOptions) -> Built {
    let rbac_action = match group {
        Group::Enforced(Action::Allow) => rbac::Action::Allow,
        Group::Enforced(Action::Audit) => rbac::Action::Log,
        Group::Enforced(_) | Group::Custom(_) | Group::BadCustom => rbac::Action::Deny,
    };
    // A CUSTOM rule with a condition the chain cannot check is dropped whole (as for
    // ALLOW): ext_authz is asked about fewer requests, never about more.
    let effect = match group {
        Group::Enforced(Action::Allow) | Group::Custom(_) => Effect::Allow,
        _ => Effect::DenyOrAudit,
    };
    let (name_prefix, name_suffix) = match group {
        Group::Enforced(_) => (String::new(), ""),
        Group::Custom(provider) => (format!("{EXT_AUTHZ_NAME_PREFIX}-{provider}-"), ""),
        Group::BadCustom => (format!("{EXT_AUTHZ_NAME_PREFIX}-"), BAD_CUSTOM_SUFFIX),
    };
    let name = |p: &Config<AuthorizationPolicy>, i: usize| {
        format!(
            "{name_prefix}ns[{}]-policy[{}]-rule[{i}]{name_suffix}",
            p.namespace, p.name
        )
    };
    let empty = || Rbac {
        action: rbac_action as i32,
        policies: HashMap::new(),
        ..Default::default()
    };
    let mut out = Built::default();
    for p in policies {
        let shadow = match group {
            Group::Enforced(_) => is_dry_run(p),
            Group::Custom(_) => true,
            Group::BadCustom => false,
        };
        let rbac = if shadow {
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
            rbac.policies.insert(name(p, 0), never_matching());
            continue;
        }
        for (i, rule) in p.spec.rules.iter().enumerate() {
            match model::rule_policy(rule, &target) {
                Ok(policy) => {
                    rbac.policies.insert(name(p, i), policy);
                }
                Err(e) => tracing::debug!(
                    namespace = %p.namespace, name = %p.name, rule = i, tcp,
                    "authorization rule skipped: {e}"
                ),
            }
        }
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

fn group_shadow_prefix(group: Group<'_>, shadow: &Option<Rbac>) -> &'static str {
    match group {
        Group::Enforced(_) => shadow_prefix(shadow),
        Group::Custom(_) => EXT_AUTHZ_SHADOW_PREFIX,
        Group::BadCustom => "",
    }
}

/// The groups in filter order: CUSTOM (one per provider, sorted), AUDIT, DENY, ALLOW.
fn groups<'a>(selected: &'a Selected, tcp: bool, opts: &AuthzOptions) -> Vec<(Group<'a>, Built)> {
    let mut out = Vec::new();
    let mut providers: BTreeMap<&str, Vec<Ap>> = BTreeMap::new();
    for p in &selected.custom {
        providers
            .entry(provider(p))
            .or_default()
            .push(Arc::clone(p));
    }
    let unusable = |name: &str| match &opts.custom_providers {
        None => None,
        Some(known) => match known.get(name) {
            None => Some(format!(
                "no ext_authz extension provider {name:?} in the mesh config (known: {:?})",
                known.keys().collect::<Vec<_>>()
            )),
            Some(Err(e)) => Some(e.clone()),
            Some(Ok(_)) => None,
        },
    };
    let mut bad: Vec<String> = providers.keys().filter_map(|n| unusable(n)).collect();
    if providers.len() > 1 && !opts.multiple_custom_providers {
        bad.push(format!(
            "only 1 provider can be used per workload, found multiple providers: {:?}",
            providers.keys().collect::<Vec<_>>()
        ));
    }
    if !bad.is_empty() {
        // Istio refuses the whole CUSTOM group and denies what it would have checked.
        // Said once per snapshot for broken providers (`ext_authz::providers`)
        // and per object for unknown ones (`validation::not_enforced_in`).
        for p in &selected.custom {
            tracing::debug!(
                namespace = %p.namespace, name = %p.name, provider = provider(p),
                "CUSTOM AuthorizationPolicy cannot be sent to its provider, its rules deny \
                 instead: {}", bad.join("; ")
            );
        }
        out.push((
            Group::BadCustom,
            build_group(&selected.custom, Group::BadCustom, tcp, opts),
        ));
    } else {
        for (name, list) in &providers {
            if tcp && provider_filters(opts, name).is_some_and(|e| e.tcp.is_none()) {
                // An HTTP-only provider cannot check connections: Istio skips its
                // policies on TCP chains.
                tracing::debug!(
                    provider = name,
                    "CUSTOM policies of an HTTP provider skipped on TCP"
                );
                continue;
            }
            out.push((
                Group::Custom(name),
                build_group(list, Group::Custom(name), tcp, opts),
            ));
        }
    }
    for (list, action) in [
        (&selected.audit, Action::Audit),
        (&selected.deny, Action::Deny),
        (&selected.allow, Action::Allow),
    ] {
        if !list.is_empty() {
            out.push((
                Group::Enforced(action),
                build_group(list, Group::Enforced(action), tcp, opts),
            ));
        }
    }
    out
}

/// The resolved filters of a usable provider (`None` when providers are unresolved).
fn provider_filters<'o>(opts: &'o AuthzOptions, name: &str) -> Option<&'o ext_authz::ExtAuthz> {
    match opts.custom_providers.as_ref()?.get(name)? {
        Ok(e) => Some(e),
        Err(_) => None,
    }
}

/// The HTTP authorization filters for the selected policies: RBAC filters in Istio's
/// order, each CUSTOM provider's RBAC followed by its `ext_authz` filter.
pub fn http_filters(selected: &Selected, opts: &AuthzOptions) -> Vec<HttpFilter> {
    let mut out = Vec::new();
    for (group, b) in groups(selected, false, opts) {
        let config = HttpRbac {
            shadow_rules_stat_prefix: group_shadow_prefix(group, &b.shadow).into(),
            rules: b.rules,
            shadow_rules: b.shadow,
            ..Default::default()
        };
        out.push(HttpFilter {
            name: HTTP_RBAC.into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(pack(&config))),
            ..Default::default()
        });
        if let Group::Custom(name) = group
            && let Some(ext) = provider_filters(opts, name).and_then(|e| e.http.as_ref())
        {
            if let Some(buffer) = provider_filters(opts, name).and_then(|e| e.buffer.as_ref()) {
                out.push(HttpFilter {
                    name: ext_authz::HTTP_BUFFER.into(),
                    config_type: Some(http_filter::ConfigType::TypedConfig(pack(buffer))),
                    ..Default::default()
                });
            }
            out.push(HttpFilter {
                name: ext_authz::HTTP_EXT_AUTHZ.into(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack(ext))),
                ..Default::default()
            });
        }
    }
    out
}

/// The network authorization filters for the selected policies: RBAC filters in
/// Istio's order, each gRPC CUSTOM provider's RBAC followed by its `ext_authz`.
pub fn network_filters(selected: &Selected, opts: &AuthzOptions) -> Vec<Filter> {
    let mut out = Vec::new();
    for (group, b) in groups(selected, true, opts) {
        let config = NetworkRbac {
            shadow_rules_stat_prefix: group_shadow_prefix(group, &b.shadow).into(),
            rules: b.rules,
            shadow_rules: b.shadow,
            stat_prefix: TCP_STAT_PREFIX.into(),
            ..Default::default()
        };
        out.push(Filter {
            name: NETWORK_RBAC.into(),
            config_type: Some(filter::ConfigType::TypedConfig(pack(&config))),
        });
        if let Group::Custom(name) = group
            && let Some(ext) = provider_filters(opts, name).and_then(|e| e.tcp.as_ref())
        {
            out.push(Filter {
                name: ext_authz::NETWORK_EXT_AUTHZ.into(),
                config_type: Some(filter::ConfigType::TypedConfig(pack(ext))),
            });
        }
    }
    out
}

//! Unit tests of the matchers, the translation and the TCP semantics.

#![allow(deprecated)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::config::listener::v3::filter;
use envoy_types::pb::envoy::config::rbac::v3::{
    Permission, Policy, Principal, permission, principal,
};
use envoy_types::pb::envoy::config::route::v3::header_matcher::HeaderMatchSpecifier;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter;
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use meshfed_api::security::v1beta1::{AuthorizationPolicy, Rule};
use prost::Message;

use super::matcher as m;
use super::model::{Effect, Target, rule_policy};
use super::trust_domain::TrustDomains;
use super::vectors::policies;
use super::*;

fn pattern(s: &StringMatcher) -> (&'static str, String) {
    match s.match_pattern.as_ref().expect("a pattern") {
        MatchPattern::Exact(v) => ("exact", v.clone()),
        MatchPattern::Prefix(v) => ("prefix", v.clone()),
        MatchPattern::Suffix(v) => ("suffix", v.clone()),
        MatchPattern::SafeRegex(r) => ("regex", r.regex.clone()),
        MatchPattern::Contains(v) => ("contains", v.clone()),
        MatchPattern::Custom(_) => ("custom", String::new()),
    }
}

#[test]
fn string_matchers_follow_istio_wildcards() {
    assert_eq!(pattern(&m::string("*")), ("regex", ".+".into()));
    assert_eq!(pattern(&m::string("*.com")), ("suffix", ".com".into()));
    assert_eq!(pattern(&m::string("/api/*")), ("prefix", "/api/".into()));
    assert_eq!(pattern(&m::string("/x")), ("exact", "/x".into()));
    // With the SPIFFE prefix a suffix needs a regex; `*` alone stays "anything".
    let p = "spiffe://";
    assert_eq!(
        pattern(&m::string_with_prefix("*", p)),
        ("regex", ".+".into())
    );
    assert_eq!(
        pattern(&m::string_with_prefix("*/sa/a", p)),
        ("regex", "spiffe://.*/sa/a".into())
    );
    assert_eq!(
        pattern(&m::string_with_prefix("td/*", p)),
        ("prefix", "spiffe://td/".into())
    );
    assert_eq!(
        pattern(&m::string_with_prefix("td/ns/a/sa/b", p)),
        ("exact", "spiffe://td/ns/a/sa/b".into())
    );
}

#[test]
fn header_and_host_matchers() {
    let spec = |h: envoy_types::pb::envoy::config::route::v3::HeaderMatcher| {
        h.header_match_specifier.expect("a specifier")
    };
    assert_eq!(
        spec(m::header("x", "*")),
        HeaderMatchSpecifier::PresentMatch(true)
    );
    assert_eq!(
        spec(m::header("x", "*-s")),
        HeaderMatchSpecifier::StringMatch(m::suffix("-s", false))
    );
    assert_eq!(
        spec(m::header("x", "p-*")),
        HeaderMatchSpecifier::StringMatch(m::prefix("p-", false))
    );
    assert_eq!(
        spec(m::header("x", "v")),
        HeaderMatchSpecifier::StringMatch(m::exact("v", false))
    );
    let host = m::host("Example.COM");
    assert_eq!(host.name, ":authority");
    assert_eq!(
        spec(host),
        HeaderMatchSpecifier::StringMatch(m::exact("Example.COM", true))
    );
    assert_eq!(spec(m::host("*")), HeaderMatchSpecifier::PresentMatch(true));
    assert_eq!(
        spec(m::host("*.example.com")),
        HeaderMatchSpecifier::StringMatch(m::suffix(".example.com", true))
    );
}

#[test]
fn cidr_ranges() {
    let c = m::cidr("10.1.2.3").expect("an address");
    assert_eq!(
        (c.address_prefix.as_str(), c.prefix_len.map(|l| l.value)),
        ("10.1.2.3", Some(32))
    );
    let c = m::cidr("10.1.2.3/16").expect("a range");
    assert_eq!(
        (c.address_prefix.as_str(), c.prefix_len.map(|l| l.value)),
        ("10.1.0.0", Some(16))
    );
    let c = m::cidr("2001:db8::1").expect("an IPv6 address");
    assert_eq!(c.prefix_len.map(|l| l.value), Some(128));
    let c = m::cidr("0.0.0.0/0").expect("everything");
    assert_eq!(
        (c.address_prefix.as_str(), c.prefix_len.map(|l| l.value)),
        ("0.0.0.0", Some(0))
    );
    assert!(m::cidr("10.1.2.3/33").is_err());
    assert!(m::cidr("not-an-ip").is_err());
}

#[test]
fn uri_templates() {
    assert!(m::is_uri_template("/a/{*}/b"));
    assert!(m::is_uri_template("/{**}"));
    assert!(!m::is_uri_template("/a/*"));
    assert_eq!(m::uri_template("/a/{*}/b/{**}"), "/a/*/b/**");
}

#[test]
fn trust_domain_aliases() {
    let td = TrustDomains::new("td1", &["old".into(), "td1".into()]);
    assert_eq!(td.domains(), ["td1", "old"]);
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // cluster.local and a known trust domain expand to all of ours.
    assert_eq!(
        td.expand(&s(&["cluster.local/ns/a/sa/b"])),
        s(&["td1/ns/a/sa/b", "old/ns/a/sa/b"])
    );
    assert_eq!(
        td.expand(&s(&["old/ns/a/sa/b"])),
        s(&["td1/ns/a/sa/b", "old/ns/a/sa/b"])
    );
    // Unknown trust domains, wildcards and other forms stay.
    assert_eq!(td.expand(&s(&["other/ns/a/sa/b"])), s(&["other/ns/a/sa/b"]));
    assert_eq!(
        td.expand(&s(&["*/ns/a/sa/b", "*", "x/y"])),
        s(&["*/ns/a/sa/b", "*", "x/y"])
    );
    // Without a trust domain nothing is expanded.
    assert_eq!(
        TrustDomains::default().expand(&s(&["cluster.local/ns/a/sa/b"])),
        s(&["cluster.local/ns/a/sa/b"])
    );
}

fn rule(yaml: &str) -> Rule {
    let v: serde_json::Value = serde_norway::from_str(yaml).expect("yaml");
    serde_json::from_value(v).expect("a rule")
}

fn target(tcp: bool, effect: Effect, td: &TrustDomains) -> Target<'_> {
    Target {
        tcp,
        effect,
        namespace: "foo",
        trust_domains: td,
        extended_jwt: true,
    }
}

fn any_permission() -> Permission {
    Permission {
        rule: Some(permission::Rule::AndRules(permission::Set {
            rules: vec![Permission {
                rule: Some(permission::Rule::Any(true)),
            }],
        })),
    }
}

fn any_principal() -> Principal {
    Principal {
        identifier: Some(principal::Identifier::AndIds(principal::Set {
            ids: vec![Principal {
                identifier: Some(principal::Identifier::Any(true)),
            }],
        })),
    }
}

#[test]
fn tcp_allow_drops_rules_with_http_fields() {
    let td = TrustDomains::default();
    let r = rule("to: [{operation: {methods: [GET], ports: ['80']}}]");
    assert!(rule_policy(&r, &target(true, Effect::Allow, &td)).is_err());
    // The same rule on HTTP keeps both conditions.
    let p = rule_policy(&r, &target(false, Effect::Allow, &td)).expect("HTTP rule");
    let Some(permission::Rule::AndRules(set)) = &p.permissions[0].rule else {
        panic!("an AND")
    };
    assert_eq!(set.rules.len(), 2);
    // A `when` on an HTTP attribute drops the rule too.
    let r = rule("when: [{key: 'request.headers[x]', values: [a]}]");
    assert!(rule_policy(&r, &target(true, Effect::Allow, &td)).is_err());
}

#[test]
fn tcp_deny_drops_only_http_conditions() {
    let td = TrustDomains::default();
    let r =
        rule("from: [{source: {requestPrincipals: [a/b]}}]\nto: [{operation: {methods: [GET]}}]");
    // Both conditions are HTTP only: what is left matches everything (deny all TCP).
    let p = rule_policy(&r, &target(true, Effect::DenyOrAudit, &td)).expect("a policy");
    assert_eq!(p.permissions, vec![any_permission()]);
    assert_eq!(p.principals, vec![any_principal()]);
    // A TCP condition next to an HTTP one is kept.
    let r = rule("to: [{operation: {methods: [GET], ports: ['80']}}]");
    let p = rule_policy(&r, &target(true, Effect::DenyOrAudit, &td)).expect("a policy");
    let Some(permission::Rule::AndRules(set)) = &p.permissions[0].rule else {
        panic!("an AND")
    };
    assert_eq!(set.rules.len(), 1);
    let Some(permission::Rule::OrRules(or)) = &set.rules[0].rule else {
        panic!("an OR")
    };
    assert_eq!(
        or.rules[0].rule,
        Some(permission::Rule::DestinationPort(80))
    );
}

#[test]
fn invalid_values_follow_the_same_semantics() {
    let td = TrustDomains::default();
    let r = rule("to: [{operation: {ports: ['http']}}]");
    assert!(rule_policy(&r, &target(false, Effect::Allow, &td)).is_err());
    let p = rule_policy(&r, &target(false, Effect::DenyOrAudit, &td)).expect("a policy");
    assert_eq!(p.permissions, vec![any_permission()]);
    let r = rule("when: [{key: unknown.key, values: [a]}]");
    assert!(rule_policy(&r, &target(false, Effect::DenyOrAudit, &td)).is_err());
}

fn principal_ids(p: &Policy) -> Vec<Principal> {
    let Some(principal::Identifier::AndIds(set)) = &p.principals[0].identifier else {
        panic!("an AND")
    };
    set.ids.clone()
}

fn or_ids(p: &Principal) -> Vec<Principal> {
    match &p.identifier {
        Some(principal::Identifier::OrIds(s)) => s.ids.clone(),
        Some(principal::Identifier::NotId(inner)) => or_ids(inner),
        other => panic!("not an OR: {other:?}"),
    }
}

fn authenticated(p: &Principal) -> (&'static str, String) {
    let Some(principal::Identifier::Authenticated(a)) = &p.identifier else {
        panic!("not authenticated: {p:?}")
    };
    pattern(a.principal_name.as_ref().expect("a name"))
}

#[test]
fn source_fields_and_not_fields() {
    let td = TrustDomains::new("td1", &[]);
    let r = rule(
        "from: [{source: {principals: [cluster.local/ns/a/sa/b], notNamespaces: [bar], \
         serviceAccounts: [sa1, other/sa2], ipBlocks: [10.0.0.0/8], remoteIpBlocks: [1.2.3.4]}}]",
    );
    let p = rule_policy(&r, &target(false, Effect::Allow, &td)).expect("a policy");
    let ids = principal_ids(&p);
    assert_eq!(ids.len(), 5);
    assert_eq!(
        authenticated(&or_ids(&ids[0])[0]),
        ("exact", "spiffe://td1/ns/a/sa/b".into())
    );
    assert!(matches!(
        ids[1].identifier,
        Some(principal::Identifier::NotId(_))
    ));
    assert_eq!(
        authenticated(&or_ids(&ids[1])[0]),
        ("regex", ".*/ns/bar/.*".into())
    );
    let sas = or_ids(&ids[2]);
    assert_eq!(
        authenticated(&sas[0]),
        ("regex", "spiffe://.+/ns/foo/(.+/|)sa/sa1(/.+)?".into())
    );
    assert_eq!(
        authenticated(&sas[1]),
        ("regex", "spiffe://.+/ns/other/(.+/|)sa/sa2(/.+)?".into())
    );
    assert!(matches!(
        or_ids(&ids[3])[0].identifier,
        Some(principal::Identifier::RemoteIp(_))
    ));
    assert!(matches!(
        or_ids(&ids[4])[0].identifier,
        Some(principal::Identifier::DirectRemoteIp(_))
    ));
}

fn metadata(p: &Principal) -> (String, Vec<String>) {
    let Some(principal::Identifier::Metadata(md)) = &p.identifier else {
        panic!("not metadata: {p:?}")
    };
    let path = md
        .path
        .iter()
        .map(|s| match &s.segment {
            Some(envoy_types::pb::envoy::r#type::matcher::v3::metadata_matcher::path_segment::Segment::Key(k)) => k.clone(),
            None => String::new(),
        })
        .collect();
    (md.filter.clone(), path)
}

#[test]
fn jwt_fields_read_the_jwt_payload() {
    let td = TrustDomains::default();
    let r = rule(
        "from: [{source: {requestPrincipals: ['https://issuer/sub/x', '*']}}]\nwhen:\n\
         - {key: request.auth.audiences, values: [aud]}\n\
         - {key: request.auth.presenter, values: [azp]}\n\
         - {key: 'request.auth.claims[groups][inner]', values: [g]}",
    );
    let p = rule_policy(&r, &target(false, Effect::Allow, &td)).expect("a policy");
    let ids = principal_ids(&p);
    let rp = or_ids(&ids[0]);
    // iss/sub split at the last slash.
    let Some(principal::Identifier::AndIds(both)) = &rp[0].identifier else {
        panic!("iss AND sub")
    };
    assert_eq!(
        metadata(&both.ids[0]),
        (
            model::JWT_FILTER.into(),
            vec!["payload".into(), "iss".into()]
        )
    );
    assert_eq!(metadata(&both.ids[1]).1, vec!["payload", "sub"]);
    // `*`: any issuer AND any subject.
    let Some(principal::Identifier::AndIds(any)) = &rp[1].identifier else {
        panic!("iss AND sub")
    };
    assert_eq!(metadata(&any.ids[1]).1, vec!["payload", "sub"]);
    // Claims: one matcher per field (newer proxies), not one per value.
    assert_eq!(metadata(&ids[1]).1, vec!["payload", "aud"]);
    assert_eq!(metadata(&ids[2]).1, vec!["payload", "azp"]);
    assert_eq!(metadata(&ids[3]).1, vec!["payload", "groups", "inner"]);
}

#[test]
fn when_conditions_join_every_from_and_to() {
    let td = TrustDomains::default();
    let r = rule(
        "from: [{source: {namespaces: [a]}}, {source: {namespaces: [b]}}]\n\
         to: [{operation: {paths: [/x]}}, {operation: {paths: ['/y/{*}']}}]\n\
         when: [{key: source.ip, values: [1.1.1.1]}, {key: destination.port, values: ['8080']}]",
    );
    let p = rule_policy(&r, &target(false, Effect::Allow, &td)).expect("a policy");
    assert_eq!(p.principals.len(), 2);
    assert_eq!(p.permissions.len(), 2);
    for pr in &p.principals {
        let Some(principal::Identifier::AndIds(set)) = &pr.identifier else {
            panic!()
        };
        assert_eq!(set.ids.len(), 2, "namespace AND source.ip");
    }
    for pe in &p.permissions {
        let Some(permission::Rule::AndRules(set)) = &pe.rule else {
            panic!()
        };
        assert_eq!(set.rules.len(), 2, "path AND destination.port");
    }
    let Some(permission::Rule::AndRules(set)) = &p.permissions[1].rule else {
        panic!()
    };
    let Some(permission::Rule::OrRules(or)) = &set.rules[0].rule else {
        panic!()
    };
    let Some(permission::Rule::UriTemplate(t)) = &or.rules[0].rule else {
        panic!("a URI template")
    };
    assert_eq!(t.name, "uri-template");
}

fn config(
    ns: &str,
    name: &str,
    age: u64,
    spec: AuthorizationPolicy,
) -> Arc<Config<AuthorizationPolicy>> {
    Arc::new(Config {
        name: name.into(),
        namespace: ns.into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        creation_time: SystemTime::UNIX_EPOCH + Duration::from_secs(age),
        spec,
    })
}

fn spec(yaml: &str) -> AuthorizationPolicy {
    let v: serde_json::Value = serde_norway::from_str(yaml).expect("yaml");
    serde_json::from_value(v).expect("a policy")
}

#[test]
fn selection_by_namespace_labels_root_and_target_ref() {
    let labels: BTreeMap<String, String> = [("app".to_string(), "a".to_string())].into();
    let all = vec![
        config("foo", "newer", 20, spec("{}")),
        config("foo", "older", 10, spec("{action: DENY}")),
        config(
            "foo",
            "other-app",
            1,
            spec("selector: {matchLabels: {app: b}}"),
        ),
        config(
            "foo",
            "this-app",
            30,
            spec("selector: {matchLabels: {app: a}}"),
        ),
        config("foo", "empty-selector", 5, spec("selector: {}")),
        config("bar", "other-ns", 1, spec("{}")),
        config("istio-system", "mesh", 40, spec("{action: AUDIT}")),
        config(
            "foo",
            "gateway",
            1,
            spec("targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: g}]"),
        ),
        config(
            "foo",
            "custom",
            1,
            spec("{action: CUSTOM, provider: {name: ext}}"),
        ),
    ];
    let s = select(&all, "istio-system", "foo", &labels);
    let names = |l: &[Arc<Config<AuthorizationPolicy>>]| {
        l.iter().map(|p| p.name.clone()).collect::<Vec<_>>()
    };
    assert_eq!(names(&s.allow), ["empty-selector", "newer", "this-app"]);
    assert_eq!(names(&s.deny), ["older"]);
    assert_eq!(names(&s.audit), ["mesh"]);
    assert_eq!(names(&s.custom), ["custom"]);
    assert!(
        select(&all, "istio-system", "baz", &labels)
            .allow
            .is_empty()
    );
}

fn http_config(f: &HttpFilter) -> HttpRbac {
    let Some(http_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        panic!("typed config")
    };
    HttpRbac::decode(any.value.as_slice()).expect("an HTTP RBAC")
}

#[test]
fn filter_order_actions_and_dry_run() {
    let text = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow, namespace: foo}
spec: {rules: [{}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny, namespace: foo, annotations: {istio.io/dry-run: 'true'}}
spec: {action: DENY, rules: [{}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: audit, namespace: foo}
spec: {action: AUDIT}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ext, namespace: foo}
spec: {action: CUSTOM, provider: {name: p}, rules: [{to: [{operation: {paths: [/admin]}}]}]}
";
    let s = select(&policies(text), "istio-system", "foo", &BTreeMap::new());
    let filters = http_filters(&s, &AuthzOptions::default());
    let configs: Vec<HttpRbac> = filters.iter().map(http_config).collect();
    assert_eq!(configs.len(), 4);
    assert!(filters.iter().all(|f| f.name == HTTP_RBAC));
    // CUSTOM: shadow rules only, under ext_authz names.
    let custom = &configs[0];
    assert!(custom.rules.is_none());
    assert_eq!(custom.shadow_rules_stat_prefix, "istio_ext_authz_");
    let shadow = custom.shadow_rules.as_ref().expect("shadow rules");
    assert!(
        shadow
            .policies
            .contains_key("istio-ext-authz-p-ns[foo]-policy[ext]-rule[0]")
    );
    // AUDIT logs; a policy without rules never matches.
    let audit = configs[1].rules.as_ref().expect("audit rules");
    assert_eq!(
        audit.action,
        envoy_types::pb::envoy::config::rbac::v3::rbac::Action::Log as i32
    );
    assert_eq!(
        audit.policies["ns[foo]-policy[audit]-rule[0]"],
        never_matching()
    );
    // DENY dry-run: shadow only, nothing enforced.
    assert!(configs[2].rules.is_none());
    assert_eq!(configs[2].shadow_rules_stat_prefix, "istio_dry_run_deny_");
    assert!(
        configs[2]
            .shadow_rules
            .as_ref()
            .expect("shadow")
            .policies
            .contains_key("ns[foo]-policy[deny]-rule[0]")
    );
    // ALLOW enforced; Istio prints the allow prefix even without shadow rules.
    assert!(configs[3].rules.is_some());
    assert!(configs[3].shadow_rules.is_none());
    assert_eq!(configs[3].shadow_rules_stat_prefix, "istio_dry_run_allow_");
}

#[test]
fn network_filters_carry_the_tcp_stat_prefix() {
    let text = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: only-http, namespace: foo}
spec: {rules: [{to: [{operation: {methods: [GET]}}]}]}
";
    let s = select(&policies(text), "istio-system", "foo", &BTreeMap::new());
    let filters = network_filters(&s, &AuthzOptions::default());
    assert_eq!(filters.len(), 1);
    assert_eq!(filters[0].name, NETWORK_RBAC);
    let Some(filter::ConfigType::TypedConfig(any)) = &filters[0].config_type else {
        panic!("typed config")
    };
    let rbac = NetworkRbac::decode(any.value.as_slice()).expect("a network RBAC");
    assert_eq!(rbac.stat_prefix, TCP_STAT_PREFIX);
    // The only rule is HTTP-only: an ALLOW filter without policies denies all TCP.
    let rules = rbac.rules.expect("enforced rules");
    assert!(rules.policies.is_empty());
    // Nothing selected, nothing built.
    assert!(network_filters(&Selected::default(), &AuthzOptions::default()).is_empty());
}

#[test]
fn dry_run_annotation_values() {
    let mut p = Config {
        name: "p".into(),
        namespace: "foo".into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        creation_time: SystemTime::UNIX_EPOCH,
        spec: AuthorizationPolicy::default(),
    };
    assert!(!is_dry_run(&p));
    for (v, want) in [
        ("true", true),
        ("True", true),
        ("1", true),
        ("false", false),
        ("yes", false),
    ] {
        p.annotations.insert(DRY_RUN_ANNOTATION.into(), v.into());
        assert_eq!(is_dry_run(&p), want, "{v}");
    }
}

#[test]
fn custom_with_unknown_or_several_providers_denies() {
    let text = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: a, namespace: foo}
spec: {action: CUSTOM, provider: {name: one}, rules: [{to: [{operation: {paths: [/a]}}]}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: b, namespace: foo}
spec: {action: CUSTOM, provider: {name: two}, rules: [{to: [{operation: {paths: [/b]}}]}]}
";
    let all = policies(text);
    let labels = BTreeMap::new();
    let mut opts = AuthzOptions {
        custom_providers: Some(Arc::new(known_providers(&["one", "two"]))),
        ..AuthzOptions::default()
    };
    // Two providers without the multiple-provider switch: one DENY filter.
    let s = select(&all, "istio-system", "foo", &labels);
    let configs: Vec<HttpRbac> = http_filters(&s, &opts).iter().map(http_config).collect();
    assert_eq!(configs.len(), 1);
    let rules = configs[0].rules.as_ref().expect("enforced");
    assert_eq!(
        rules.action,
        envoy_types::pb::envoy::config::rbac::v3::rbac::Action::Deny as i32
    );
    assert!(
        rules.policies.contains_key(
            "istio-ext-authz-ns[foo]-policy[b]-rule[0]-deny-due-to-bad-CUSTOM-action"
        )
    );
    assert!(configs[0].shadow_rules.is_none());
    assert_eq!(configs[0].shadow_rules_stat_prefix, "");
    // With the switch: one shadow filter per provider, sorted by provider.
    opts.multiple_custom_providers = true;
    let configs: Vec<HttpRbac> = http_filters(&s, &opts).iter().map(http_config).collect();
    assert_eq!(configs.len(), 2);
    assert!(configs.iter().all(|c| c.rules.is_none()));
    let shadow = configs[1].shadow_rules.as_ref().expect("shadow");
    assert!(
        shadow
            .policies
            .contains_key("istio-ext-authz-two-ns[foo]-policy[b]-rule[0]")
    );
    // An unknown provider is refused too.
    opts.custom_providers = Some(Arc::new(known_providers(&["one"])));
    let only_b = select(&all[1..], "istio-system", "foo", &labels);
    let configs: Vec<HttpRbac> = http_filters(&only_b, &opts)
        .iter()
        .map(http_config)
        .collect();
    assert!(configs[0].rules.is_some());
}

#[test]
fn custom_on_tcp_drops_rules_with_http_fields() {
    let td = TrustDomains::default();
    let text = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: c, namespace: foo}
spec:
  action: CUSTOM
  provider: {name: p}
  rules:
  - to: [{operation: {methods: [GET], ports: ['80']}}]
  - to: [{operation: {ports: ['81']}}]
";
    let s = select(&policies(text), "istio-system", "foo", &BTreeMap::new());
    let filters = network_filters(&s, &AuthzOptions::default());
    let Some(filter::ConfigType::TypedConfig(any)) = &filters[0].config_type else {
        panic!("typed config")
    };
    let rbac = NetworkRbac::decode(any.value.as_slice()).expect("a network RBAC");
    let shadow = rbac.shadow_rules.expect("shadow rules");
    let names: BTreeSet<&String> = shadow.policies.keys().collect();
    assert_eq!(names.len(), 1);
    assert!(
        shadow
            .policies
            .contains_key("istio-ext-authz-p-ns[foo]-policy[c]-rule[1]")
    );
    // The same rule of a DENY policy keeps the port.
    let r = rule("to: [{operation: {methods: [GET], ports: ['80']}}]");
    assert!(rule_policy(&r, &target(true, Effect::DenyOrAudit, &td)).is_ok());
}

#[test]
fn envoy_field_rules_reach_the_rbac_config() {
    // The vector test checks every built filter against Envoy's PGV rules; this
    // makes sure the check sees inside the RBAC config (an empty header name breaks
    // `HeaderMatcher.name`).
    let mut rbac = envoy_types::pb::envoy::config::rbac::v3::Rbac::default();
    let mut policy = never_matching();
    policy.permissions = vec![Permission {
        rule: Some(permission::Rule::Header(m::header("", "x"))),
    }];
    rbac.policies.insert("p".into(), policy);
    let config = HttpRbac {
        rules: Some(rbac),
        ..Default::default()
    };
    let filter = HttpFilter {
        name: HTTP_RBAC.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(
            envoy_types::pb::google::protobuf::Any {
                type_url: "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC".into(),
                value: config.encode_to_vec(),
            },
        )),
        ..Default::default()
    };
    let broken = std::panic::catch_unwind(|| crate::xds::pgv::assert_message_valid(&filter));
    assert!(broken.is_err(), "an empty header name passed the PGV check");
}

#[test]
fn options_from_the_mesh_config() {
    let mesh = meshfed_api::mesh::v1alpha1::MeshConfig {
        trust_domain: "td.example".into(),
        trust_domain_aliases: vec!["old.example".into()],
        ..Default::default()
    };
    let opts = AuthzOptions::from_mesh(&mesh);
    assert_eq!(opts.trust_domains.domains(), ["td.example", "old.example"]);
    assert!(opts.extended_jwt);
    assert!(opts.custom_providers.is_none());
}

#[test]
fn claims_for_older_proxies_are_matched_value_by_value() {
    let td = TrustDomains::default();
    let r = rule("when: [{key: request.auth.audiences, values: [a, b]}]");
    let t = Target {
        extended_jwt: false,
        ..target(false, Effect::Allow, &td)
    };
    let p = rule_policy(&r, &t).expect("a policy");
    let values = or_ids(&principal_ids(&p)[0]);
    assert_eq!(values.len(), 2);
    let Some(principal::Identifier::Metadata(md)) = &values[0].identifier else {
        panic!("metadata")
    };
    let value = md.value.as_ref().and_then(|v| v.match_pattern.as_ref());
    assert!(matches!(
        value,
        Some(
            envoy_types::pb::envoy::r#type::matcher::v3::value_matcher::MatchPattern::ListMatch(_)
        )
    ));
}

#[test]
fn selection_from_the_config_index_uses_the_mesh_root_namespace() {
    let text = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: mesh-wide, namespace: mesh-root}
spec: {action: DENY, rules: [{}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: default-root, namespace: istio-system}
spec: {action: DENY, rules: [{}]}
";
    let set = crate::push::config_index::ConfigSet {
        authorization_policies: policies(text).iter().map(|p| (**p).clone()).collect(),
        ..Default::default()
    };
    let mut config = crate::mesh::default_mesh_config();
    config.root_namespace = "mesh-root".into();
    let mesh = crate::mesh::MeshSettings {
        config,
        ..Default::default()
    };
    let index = crate::push::config_index::ConfigIndex::new(set, "cluster.local", &mesh);
    let s = select_in(&index, "app", &BTreeMap::new());
    let names: Vec<&str> = s.deny.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["mesh-wide"]);
}

/// Usable providers without filters (the RBAC side alone is under test).
fn known_providers(names: &[&str]) -> super::ext_authz::Resolved {
    names
        .iter()
        .map(|n| {
            (
                n.to_string(),
                Ok(Arc::new(super::ext_authz::ExtAuthz::default())),
            )
        })
        .collect()
}

//! The vectors of Istio's `TestJwtFilter` and `TestConvertToEnvoyJwtConfig`
//! (`pilot/pkg/security/authn/policy_applier_test.go`), keys fetched by the control
//! plane (`PILOT_JWT_ENABLE_REMOTE_JWKS=false`); the fetching itself is tested in
//! [`crate::jwks`].

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, UNIX_EPOCH};

use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source};
use envoy_types::pb::envoy::config::route::v3::{RouteMatch, route_match};
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    JwtAuthentication, JwtClaimToHeader, JwtProvider, JwtRequirement, JwtRequirementAndList,
    JwtRequirementOrList, RequirementRule, jwt_provider, jwt_requirement, requirement_rule,
};
use envoy_types::pb::google::protobuf::Empty;
use meshfed_api::security::v1beta1::{ClaimToHeader, JwtHeader, JwtRule, RequestAuthentication};
use meshfed_api::r#type::v1beta1::{PolicyTargetReference, WorkloadSelector};
use prost::{Message, Name};

use super::*;

/// The document the test JWKS server serves (Istio's `test.JwtPubKey1`).
const PUB_KEY_1: &str = r#"{"keys":[{"e":"AQAB","kid":"k1","kty":"RSA","n":"sA"}]}"#;
const FOO: &str = "https://secret.foo.com";
const BAR: &str = "https://secret.bar.com";
const GOOD_URI: &str = "http://127.0.0.1:1/oauth2/v3/certs";
const BAD_URI: &str = "http://site.not.exist";

fn fetched() -> JwksTable {
    JwksTable::new(
        [(
            JwksKey {
                issuer: FOO.into(),
                jwks_uri: GOOD_URI.into(),
            },
            Arc::from(PUB_KEY_1),
        )]
        .into(),
    )
}

fn rule(issuer: &str, uri: &str) -> JwtRule {
    JwtRule {
        issuer: issuer.into(),
        jwks_uri: uri.into(),
        ..Default::default()
    }
}

fn inline(issuer: &str, jwks: &str) -> JwtRule {
    JwtRule {
        issuer: issuer.into(),
        jwks: jwks.into(),
        ..Default::default()
    }
}

fn ra(name: &str, ns: &str, rules: Vec<JwtRule>) -> Ra {
    Arc::new(Config {
        name: name.into(),
        namespace: ns.into(),
        labels: Default::default(),
        annotations: Default::default(),
        creation_time: UNIX_EPOCH,
        spec: RequestAuthentication {
            jwt_rules: rules,
            ..Default::default()
        },
    })
}

/// A provider as Istio's expected outputs write it: inline keys, payload in
/// metadata, the default space-delimited claims.
fn expected_provider(issuer: &str, jwks: &str) -> JwtProvider {
    JwtProvider {
        issuer: issuer.into(),
        jwks_source_specifier: Some(jwt_provider::JwksSourceSpecifier::LocalJwks(DataSource {
            specifier: Some(data_source::Specifier::InlineString(jwks.into())),
            ..Default::default()
        })),
        payload_in_metadata: "payload".into(),
        normalize_payload_in_metadata: Some(jwt_provider::NormalizePayload {
            space_delimited_claims: vec!["permission".into(), "scope".into()],
        }),
        ..Default::default()
    }
}

fn name(n: &str) -> JwtRequirement {
    JwtRequirement {
        requires_type: Some(jwt_requirement::RequiresType::ProviderName(n.into())),
    }
}

fn missing() -> JwtRequirement {
    JwtRequirement {
        requires_type: Some(jwt_requirement::RequiresType::AllowMissing(Empty {})),
    }
}

fn any(reqs: Vec<JwtRequirement>) -> JwtRequirement {
    JwtRequirement {
        requires_type: Some(jwt_requirement::RequiresType::RequiresAny(
            JwtRequirementOrList { requirements: reqs },
        )),
    }
}

fn all(reqs: Vec<JwtRequirement>) -> JwtRequirement {
    JwtRequirement {
        requires_type: Some(jwt_requirement::RequiresType::RequiresAll(
            JwtRequirementAndList { requirements: reqs },
        )),
    }
}

fn config(requires: JwtRequirement, providers: Vec<JwtProvider>) -> JwtAuthentication {
    JwtAuthentication {
        rules: vec![RequirementRule {
            r#match: Some(RouteMatch {
                path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                ..Default::default()
            }),
            requirement_type: Some(requirement_rule::RequirementType::Requires(requires)),
        }],
        providers: providers
            .into_iter()
            .enumerate()
            .map(|(i, p)| (format!("origins-{i}"), p))
            .collect::<HashMap<_, _>>(),
        bypass_cors_preflight: true,
        ..Default::default()
    }
}

/// `requires_any[origins-0, allow_missing]`.
fn single(p: JwtProvider) -> JwtAuthentication {
    config(any(vec![name("origins-0"), missing()]), vec![p])
}

/// `requires_any[origins-0, origins-1, requires_all[any[origins-0, missing],
/// any[origins-1, missing]]]`.
fn double(p0: JwtProvider, p1: JwtProvider) -> JwtAuthentication {
    config(
        any(vec![
            name("origins-0"),
            name("origins-1"),
            all(vec![
                any(vec![name("origins-0"), missing()]),
                any(vec![name("origins-1"), missing()]),
            ]),
        ]),
        vec![p0, p1],
    )
}

/// `JwtFilter` of the policies, as a sidecar (Istio's test passes `false`).
fn filter_of(policies: &[Ra]) -> Option<HttpFilter> {
    jwt_authentication(&rules(policies), &fetched(), false).map(|c| http_filter(&c))
}

fn decoded(f: &HttpFilter) -> JwtAuthentication {
    assert_eq!(f.name, "envoy.filters.http.jwt_authn");
    let Some(http_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        panic!("typed config")
    };
    assert_eq!(any.type_url, JwtAuthentication::type_url());
    JwtAuthentication::decode(any.value.as_slice()).unwrap()
}

/// Istio's `TestJwtFilter`, the cases in the default fetch mode (the remote modes are
/// in [`remote_jwks_modes_follow_istio`]).
#[test]
fn jwt_filter_vectors_of_istio_pass() {
    let cases: Vec<(&str, Vec<Ra>, Option<JwtAuthentication>)> = vec![
        ("No policy", vec![], None),
        ("Empty policy", vec![ra("a", "ns", vec![])], None),
        (
            "Single JWT policy",
            vec![ra("a", "ns", vec![rule(FOO, GOOD_URI)])],
            Some(single(expected_provider(FOO, PUB_KEY_1))),
        ),
        (
            "Multi JWTs policy",
            vec![
                ra("a", "ns", vec![rule(FOO, GOOD_URI)]),
                ra("b", "ns", vec![]),
                ra("c", "ns", vec![inline(BAR, "jwks-inline-data")]),
            ],
            Some(double(
                expected_provider(BAR, "jwks-inline-data"),
                expected_provider(FOO, PUB_KEY_1),
            )),
        ),
        (
            "JWT policy with inline Jwks",
            vec![ra("a", "ns", vec![inline(FOO, "inline-jwks-data")])],
            Some(single(expected_provider(FOO, "inline-jwks-data"))),
        ),
        (
            "JWT policy with bad Jwks URI",
            vec![ra("a", "ns", vec![rule(FOO, BAD_URI)])],
            Some(single(expected_provider(FOO, &fake_jwks(BAD_URI)))),
        ),
        (
            "Forward original token",
            vec![ra(
                "a",
                "ns",
                vec![JwtRule {
                    forward_original_token: true,
                    ..rule(FOO, GOOD_URI)
                }],
            )],
            Some(single(JwtProvider {
                forward: true,
                ..expected_provider(FOO, PUB_KEY_1)
            })),
        ),
        (
            "Output payload",
            vec![ra(
                "a",
                "ns",
                vec![JwtRule {
                    forward_original_token: true,
                    output_payload_to_header: "x-foo".into(),
                    ..rule(FOO, GOOD_URI)
                }],
            )],
            Some(single(JwtProvider {
                forward: true,
                forward_payload_header: "x-foo".into(),
                ..expected_provider(FOO, PUB_KEY_1)
            })),
        ),
        (
            "Output claim to header",
            vec![ra(
                "a",
                "ns",
                vec![JwtRule {
                    forward_original_token: true,
                    output_claim_to_headers: vec![
                        ClaimToHeader {
                            header: "x-jwt-key1".into(),
                            claim: "value1".into(),
                        },
                        ClaimToHeader {
                            header: "x-jwt-key2".into(),
                            claim: "value2".into(),
                        },
                    ],
                    ..rule(FOO, GOOD_URI)
                }],
            )],
            Some(single(JwtProvider {
                forward: true,
                claim_to_headers: vec![
                    JwtClaimToHeader {
                        header_name: "x-jwt-key1".into(),
                        claim_name: "value1".into(),
                        ..Default::default()
                    },
                    JwtClaimToHeader {
                        header_name: "x-jwt-key2".into(),
                        claim_name: "value2".into(),
                        ..Default::default()
                    },
                ],
                ..expected_provider(FOO, PUB_KEY_1)
            })),
        ),
    ];
    let total = cases.len();
    for (name, policies, expected) in cases {
        let got = filter_of(&policies);
        assert_eq!(got.as_ref().map(decoded), expected, "{name}");
    }
    assert_eq!(total, 9, "ported TestJwtFilter cases");
}

/// The remote JWKS modes of Istio's `TestJwtFilter` ("JWT policy with Mesh cluster as
/// issuer and remote jwks enabled", "... non Mesh cluster ...") and the `envoy` mode's
/// stand-in cluster for a host the registry does not know.
#[test]
fn remote_jwks_modes_follow_istio() {
    const MESH_URI: &str = "http://jwt-token-issuer.mesh:7443/jwks";
    const MESH_CLUSTER: &str = "outbound|7443||jwt-token-issuer.mesh.svc.cluster.local";
    // The registry knows the issuer's host (as Istio's test registers it).
    let lookup = |host: &str, port: u32| {
        (host == "jwt-token-issuer.mesh" && port == 7443).then(|| MESH_CLUSTER.to_string())
    };
    let remote = |issuer: &str, uri: &str, cluster: &str| {
        JwtProvider {
        jwks_source_specifier: Some(jwt_provider::JwksSourceSpecifier::RemoteJwks(
            envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::RemoteJwks {
                http_uri: Some(envoy_types::pb::envoy::config::core::v3::HttpUri {
                    uri: uri.into(),
                    timeout: Some(envoy_types::pb::google::protobuf::Duration {
                        seconds: 5,
                        nanos: 0,
                    }),
                    http_upstream_type: Some(
                        envoy_types::pb::envoy::config::core::v3::http_uri::HttpUpstreamType::Cluster(
                            cluster.into(),
                        ),
                    ),
                }),
                cache_duration: Some(envoy_types::pb::google::protobuf::Duration {
                    seconds: 300,
                    nanos: 0,
                }),
                ..Default::default()
            },
        )),
        ..expected_provider(issuer, "")
    }
    };
    let mesh_rule = rule("mesh cluster", MESH_URI);
    let outside_rule = rule(FOO, GOOD_URI);
    let run = |mode: JwksFetchMode, r: &JwtRule| {
        jwt_authentication_in(&[r], &fetched().with_mode(mode), &lookup, false).unwrap()
    };
    for mode in [JwksFetchMode::Envoy, JwksFetchMode::Hybrid] {
        assert_eq!(
            run(mode, &mesh_rule),
            single(remote("mesh cluster", MESH_URI, MESH_CLUSTER)),
            "{mode:?}"
        );
    }
    // Not a service: hybrid falls back to the keys the control plane fetched...
    assert_eq!(
        run(JwksFetchMode::Hybrid, &outside_rule),
        single(expected_provider(FOO, PUB_KEY_1))
    );
    // ... envoy names the cluster a ServiceEntry would define.
    assert_eq!(
        run(JwksFetchMode::Envoy, &outside_rule),
        single(remote(FOO, GOOD_URI, "outbound|1||127.0.0.1"))
    );
    // Inline keys and the default mode stay inline.
    assert_eq!(
        run(JwksFetchMode::Envoy, &inline(BAR, "inline-jwks-data")),
        single(expected_provider(BAR, "inline-jwks-data"))
    );
    assert_eq!(
        run(JwksFetchMode::Istiod, &mesh_rule),
        single(expected_provider("mesh cluster", &fake_jwks(MESH_URI)))
    );
    assert_eq!(
        parse_jwks_uri("https://issuer.example.com/keys"),
        Ok(("issuer.example.com".to_string(), 443))
    );
}

/// Istio's `TestConvertToEnvoyJwtConfig` (rules in the order given: sorting is the
/// policy applier's), minus the `spaceDelimitedClaims` case (a JWTRule field
/// meshfed's API does not have yet).
#[test]
fn convert_to_envoy_jwt_config_vectors_of_istio_pass() {
    let cases: Vec<(&str, Vec<JwtRule>, Option<JwtAuthentication>)> = vec![
        ("No rule", vec![], None),
        (
            "Single JWT rule",
            vec![rule(FOO, GOOD_URI)],
            Some(single(expected_provider(FOO, PUB_KEY_1))),
        ),
        (
            "Multiple JWT rule",
            vec![rule(FOO, GOOD_URI), inline(BAR, "jwks-inline-data")],
            Some(double(
                expected_provider(FOO, PUB_KEY_1),
                expected_provider(BAR, "jwks-inline-data"),
            )),
        ),
        (
            // OIDC discovery of the issuer failed: nothing fetched.
            "Empty Jwks URI",
            vec![rule(FOO, "")],
            Some(single(expected_provider(FOO, &fake_jwks("")))),
        ),
        (
            "Unreachable Jwks URI",
            vec![rule(FOO, BAD_URI)],
            Some(single(expected_provider(FOO, &fake_jwks(BAD_URI)))),
        ),
    ];
    for (name, rules, expected) in cases {
        let refs: Vec<&JwtRule> = rules.iter().collect();
        assert_eq!(
            jwt_authentication(&refs, &fetched(), false),
            expected,
            "{name}"
        );
    }
}

#[test]
fn every_location_and_audience_field_reaches_the_provider() {
    let r = JwtRule {
        audiences: vec!["a1".into(), "a2".into()],
        from_headers: vec![JwtHeader {
            name: "x-jwt".into(),
            prefix: "Bearer ".into(),
        }],
        from_params: vec!["token".into()],
        from_cookies: vec!["session".into()],
        timeout: Some(Duration::from_secs(3).try_into().unwrap()),
        ..rule(FOO, GOOD_URI)
    };
    let got = jwt_authentication(&[&r], &fetched(), true).unwrap();
    let p = &got.providers["origins-0"];
    assert_eq!(p.audiences, ["a1", "a2"]);
    assert_eq!(p.from_headers.len(), 1);
    assert_eq!(
        (
            p.from_headers[0].name.as_str(),
            p.from_headers[0].value_prefix.as_str()
        ),
        ("x-jwt", "Bearer ")
    );
    assert_eq!(p.from_params, ["token"]);
    assert_eq!(p.from_cookies, ["session"]);
    // Only proxies other than sidecars clear the route cache.
    assert!(p.clear_route_cache);
    let sidecar = jwt_authentication(&[&r], &fetched(), false).unwrap();
    assert!(!sidecar.providers["origins-0"].clear_route_cache);
}

#[test]
fn the_fake_jwks_is_a_public_key_naming_the_uri() {
    let fake = fake_jwks("https://example.com/keys");
    let v: serde_json::Value = serde_json::from_str(&fake).unwrap();
    let key = &v["keys"][0];
    assert_eq!(key["kty"], "RSA");
    assert_eq!(key["e"], "AQAB");
    assert!(key.get("d").is_none(), "no private part");
    // Go's RawURLEncoding of the text.
    assert_eq!(base64_url(b"Er"), "RXI");
    assert_eq!(base64_url(b"Err"), "RXJy");
    assert_eq!(base64_url(b"Erro"), "RXJybw");
    assert_eq!(base64_url(&[0xfb, 0xff]), "-_8");
    assert_eq!(
        key["n"],
        base64_url(b"Error-IstiodFailedToFetchJwksUri-https://example.com/keys")
    );
}

#[test]
fn policies_are_selected_like_authorization_policies() {
    let labels: BTreeMap<String, String> = [("app".to_string(), "a".to_string())].into();
    let selecting = |app: &str| {
        Some(WorkloadSelector {
            match_labels: [("app".to_string(), app.to_string())].into(),
        })
    };
    let mut with_selector = (*ra("sel", "ns", vec![rule(FOO, GOOD_URI)])).clone();
    with_selector.spec.selector = selecting("a");
    let mut other_app = (*ra("other", "ns", vec![rule(BAR, GOOD_URI)])).clone();
    other_app.spec.selector = selecting("b");
    let mut targeted = (*ra("gw", "ns", vec![rule(BAR, GOOD_URI)])).clone();
    targeted.spec.target_ref = Some(PolicyTargetReference {
        kind: "Gateway".into(),
        name: "gw".into(),
        ..Default::default()
    });
    let mut older = (*ra("mesh", "istio-system", vec![rule(BAR, GOOD_URI)])).clone();
    older.creation_time = UNIX_EPOCH - Duration::from_secs(1);
    let policies = vec![
        Arc::new(with_selector),
        Arc::new(other_app),
        Arc::new(targeted),
        Arc::new(older),
        ra("elsewhere", "other-ns", vec![rule(BAR, GOOD_URI)]),
        ra("ns-wide", "ns", vec![]),
    ];
    let chosen = select(&policies, "istio-system", "ns", &labels);
    let names: Vec<&str> = chosen.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["mesh", "ns-wide", "sel"]);
}

mod inbound {
    use envoy_types::pb::envoy::config::listener::v3::{Filter, filter};
    use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    use meshfed_api::security::v1beta1 as sec;

    use super::*;
    use crate::generate::lds::tests::{default_mesh, proxy, snapshot};
    use crate::generate::lds::{InboundPort, VIRTUAL_INBOUND, sidecar_listeners};
    use crate::push::config_index::ConfigSet;

    fn policy(
        name: &str,
        action: sec::authorization_policy::Action,
    ) -> Config<sec::AuthorizationPolicy> {
        Config {
            name: name.into(),
            namespace: "default".into(),
            labels: Default::default(),
            annotations: Default::default(),
            creation_time: UNIX_EPOCH,
            spec: sec::AuthorizationPolicy {
                action: action as i32,
                action_detail: (action == sec::authorization_policy::Action::Custom).then(|| {
                    sec::authorization_policy::ActionDetail::Provider(
                        sec::authorization_policy::ExtensionProvider { name: "ext".into() },
                    )
                }),
                rules: vec![sec::Rule::default()],
                ..Default::default()
            },
        }
    }

    /// The HTTP filters of the inbound chain of port 8080 of a sidecar in `default`.
    fn http_filters(set: ConfigSet) -> Vec<HttpFilter> {
        let snap = snapshot(vec![], set, default_mesh());
        let p = proxy(
            "sidecar~10.0.0.1~a.default~default.svc.cluster.local",
            serde_json::json!({"app": "a"}),
        );
        let listeners = sidecar_listeners(
            &snap,
            &p.client_view(),
            &[
                InboundPort::captured(8080, true),
                InboundPort::captured(9000, false),
            ],
        );
        let vi = listeners
            .iter()
            .find(|l| l.name == VIRTUAL_INBOUND)
            .unwrap();
        let chain = vi
            .filter_chains
            .iter()
            .find(|c| c.name == "0.0.0.0_8080")
            .unwrap();
        let Some(filter::ConfigType::TypedConfig(any)) = &chain.filters[0].config_type else {
            panic!("typed")
        };
        HttpConnectionManager::decode(any.value.as_slice())
            .unwrap()
            .http_filters
    }

    fn tcp_filters(set: ConfigSet) -> Vec<Filter> {
        let snap = snapshot(vec![], set, default_mesh());
        let p = proxy(
            "sidecar~10.0.0.1~a.default~default.svc.cluster.local",
            serde_json::json!({"app": "a"}),
        );
        let listeners = sidecar_listeners(
            &snap,
            &p.client_view(),
            &[InboundPort::captured(9000, false)],
        );
        let vi = listeners
            .iter()
            .find(|l| l.name == VIRTUAL_INBOUND)
            .unwrap();
        vi.filter_chains
            .iter()
            .find(|c| c.name == "0.0.0.0_9000")
            .unwrap()
            .filters
            .clone()
    }

    /// Each filter's name, RBAC filters with their action (and shadow prefix).
    fn described(filters: &[HttpFilter]) -> Vec<String> {
        filters
            .iter()
            .map(|f| {
                let Some(http_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
                    return f.name.clone();
                };
                if any.type_url != HttpRbac::type_url() {
                    return f.name.clone();
                }
                let rbac = HttpRbac::decode(any.value.as_slice()).unwrap();
                match rbac.rules {
                    Some(r) => format!("rbac:{}", r.action),
                    None => format!("rbac-shadow:{}", rbac.shadow_rules_stat_prefix),
                }
            })
            .collect()
    }

    fn ra_in(ns: &str) -> Config<RequestAuthentication> {
        Config {
            name: "jwt".into(),
            namespace: ns.into(),
            labels: Default::default(),
            annotations: Default::default(),
            creation_time: UNIX_EPOCH,
            spec: RequestAuthentication {
                jwt_rules: vec![rule(FOO, GOOD_URI)],
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_request_authentication_puts_jwt_authn_between_custom_and_the_other_rbac_filters() {
        use sec::authorization_policy::Action;
        let set = ConfigSet {
            request_authentications: vec![ra_in("default")],
            authorization_policies: vec![
                policy("allow", Action::Allow),
                policy("custom", Action::Custom),
                policy("deny", Action::Deny),
            ],
            ..Default::default()
        };
        // The CUSTOM policy names no provider of the mesh config: Istio's DENY in its
        // place, still ahead of jwt_authn.
        assert_eq!(
            described(&http_filters(set.clone())),
            [
                "rbac:1",
                "envoy.filters.http.jwt_authn",
                "rbac:1",
                "rbac:0",
                "envoy.filters.http.grpc_stats",
                "envoy.filters.http.fault",
                "envoy.filters.http.cors",
                "envoy.filters.http.router"
            ]
        );
        // The filter is the workload's: its rule, keys not fetched (none in this
        // snapshot), so the fake JWKS; a sidecar keeps the route cache.
        let filters = http_filters(set.clone());
        let config = decoded(&filters[1]);
        assert_eq!(config, single(expected_provider(FOO, &fake_jwks(GOOD_URI))));
        // TCP chains have no JWT filter: RBAC only.
        let tcp: Vec<String> = tcp_filters(set).into_iter().map(|f| f.name).collect();
        assert_eq!(
            tcp,
            [
                "envoy.filters.network.rbac",
                "envoy.filters.network.rbac",
                "envoy.filters.network.rbac",
                "envoy.filters.network.tcp_proxy"
            ]
        );
    }

    #[test]
    fn a_request_authentication_alone_adds_only_jwt_authn() {
        let set = ConfigSet {
            request_authentications: vec![ra_in("istio-system")],
            ..Default::default()
        };
        assert_eq!(
            described(&http_filters(set)),
            [
                "envoy.filters.http.jwt_authn",
                "envoy.filters.http.grpc_stats",
                "envoy.filters.http.fault",
                "envoy.filters.http.cors",
                "envoy.filters.http.router"
            ]
        );
    }

    #[test]
    fn a_request_authentication_of_another_namespace_adds_nothing() {
        let set = ConfigSet {
            request_authentications: vec![ra_in("other")],
            ..Default::default()
        };
        assert_eq!(
            described(&http_filters(set)),
            [
                "envoy.filters.http.grpc_stats",
                "envoy.filters.http.fault",
                "envoy.filters.http.cors",
                "envoy.filters.http.router"
            ]
        );
    }
}

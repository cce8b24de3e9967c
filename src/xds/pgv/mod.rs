//! Envoy's own field rules, checked over encoded resources at test time.
//!
//! Envoy validates every xDS resource it receives against the protoc-gen-validate
//! (PGV) annotations of its `.proto` files (`[(validate.rules).string.min_len = 1]`,
//! `[(validate.rules).message.required = true]`, ...) and NACKs the resource when one
//! fails. The descriptors `build.rs` compiles from envoy-types' bundled `.proto`
//! sources keep those annotations, so this module reads them and applies them to a
//! decoded resource, following `Any`s (`typed_config`) whose types the descriptors
//! know. [`crate::xds::EncodedResource::encode`] calls [`assert_valid`] on every
//! resource it encodes in tests (`cfg(test)` or the `testing` feature), so "Envoy would
//! NACK this" fails the test that generated it.
//!
//! Rules checked: message `required` and `skip`; `oneof` `required`; string `const`,
//! `len`, `min_len`, `max_len`, `len_bytes`, `min_bytes`, `max_bytes`, `pattern`,
//! `prefix`, `suffix`, `contains`, `not_contains`, `in`, `not_in`, `ip`/`ipv4`/`ipv6`
//! and `well_known_regex` (HTTP header names and values, strict or not); bytes
//! lengths; every numeric type's `const`, `lt`, `lte`, `gt`, `gte`, `in` and `not_in`
//! (wrapper messages such as `UInt32Value` included); enum `defined_only`, `const`,
//! `in`, `not_in`; bool `const`; duration `required`, `const` and bounds; `Any`
//! `required`, `in`, `not_in`; repeated `min_items`, `max_items`, `unique` and `items`;
//! map `min_pairs`, `max_pairs`, `keys` and `values`; `ignore_empty` everywhere.
//! Not checked: timestamps, `hostname`/`email`/`uri`/`address`/`uuid` strings. On top
//! of PGV, the pattern of every `envoy.type.matcher.v3.RegexMatcher` is held to RE2's
//! rules ([`meshfed_registry::config::validate::regex::validate_re2`]), which Envoy
//! checks when it compiles the pattern.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use prost_reflect::{
    DescriptorPool, DynamicMessage, ExtensionDescriptor, FieldDescriptor, MessageDescriptor,
    OneofDescriptor,
};

mod walk;

use walk::Walk;

/// One broken rule: where, which rule, and the value found.
#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    /// Field path from the resource: `virtual_hosts[0].routes[1].match.headers[0].name`;
    /// an `Any`'s payload is entered as `typed_config<envoy.extensions...>`.
    pub path: String,
    /// The rule, as PGV spells it: `string.min_len = 1`.
    pub rule: String,
    /// The offending value (debug form, shortened).
    pub value: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (value {})", self.path, self.rule, self.value)
    }
}

/// Panics, naming the resource and every broken rule, when `value` (an encoded message
/// of `type_url`) breaks a rule of Envoy's. Does nothing when this build has no Envoy
/// descriptors (see `build.rs`) or the type is not among them.
pub fn assert_valid(name: &str, type_url: &str, value: &[u8]) {
    let Some(checker) = Checker::shared() else {
        return;
    };
    if let Err(violations) = checker.check(type_url, value) {
        fail(name, type_url, &violations);
    }
}

/// [`assert_valid`] for a typed resource (a generator's output before it is encoded);
/// the name in the panic is the message's `name` field when it has one.
pub fn assert_message_valid<M: prost::Message + prost::Name>(message: &M) {
    let Some(checker) = Checker::shared() else {
        return;
    };
    let bytes = message.encode_to_vec();
    let type_url = M::type_url();
    if let Err(violations) = checker.check(&type_url, &bytes) {
        let name = DynamicMessage::decode(
            checker
                .pool
                .get_message_by_name(&M::full_name())
                .expect("checked above"),
            bytes.as_slice(),
        )
        .ok()
        .and_then(|m| {
            m.get_field_by_name("name")
                .or_else(|| m.get_field_by_name("cluster_name"))
                .and_then(|v| v.as_str().map(str::to_string))
        })
        .unwrap_or_default();
        fail(&name, &type_url, &violations);
    }
}

fn fail(name: &str, type_url: &str, violations: &[Violation]) -> ! {
    let list: Vec<String> = violations.iter().map(|v| format!("  {v}")).collect();
    panic!(
        "Envoy would NACK resource {name:?} ({type_url}):\n{}",
        list.join("\n")
    );
}

/// The rule checker over the compiled-in Envoy descriptors.
pub struct Checker {
    pool: DescriptorPool,
    field_rules: ExtensionDescriptor,
    oneof_required: Option<ExtensionDescriptor>,
    message_disabled: Option<ExtensionDescriptor>,
    message_ignored: Option<ExtensionDescriptor>,
    /// Per message type: its fields with their rules. Built on first sight.
    plans: Mutex<HashMap<String, Arc<Plan>>>,
    /// `pattern` rules, compiled once.
    patterns: Mutex<HashMap<String, Arc<regex::Regex>>>,
}

impl fmt::Debug for Checker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checker").finish_non_exhaustive()
    }
}

struct Plan {
    /// `option (validate.disabled)` or `(validate.ignored)`: no rule applies.
    skip: bool,
    fields: Vec<(FieldDescriptor, Option<DynamicMessage>)>,
    required_oneofs: Vec<OneofDescriptor>,
}

impl Checker {
    /// The checker over the descriptors `build.rs` compiled, built once; `None` when
    /// the build found no Envoy `.proto` sources.
    pub fn shared() -> Option<&'static Checker> {
        static SHARED: OnceLock<Option<Checker>> = OnceLock::new();
        SHARED
            .get_or_init(|| Checker::from_descriptor_set(super::ENVOY_DESCRIPTORS).ok())
            .as_ref()
    }

    /// A checker over an encoded `FileDescriptorSet` that includes `validate.proto`.
    pub fn from_descriptor_set(bytes: &[u8]) -> Result<Checker, String> {
        if bytes.is_empty() {
            return Err("no descriptors".to_string());
        }
        let pool = DescriptorPool::decode(bytes).map_err(|e| e.to_string())?;
        let field_rules = pool
            .get_extension_by_name("validate.rules")
            .ok_or("the descriptors lack validate.proto")?;
        let named = |name: &str| pool.all_extensions().find(|e| e.full_name() == name);
        let oneof_required = named("validate.required");
        let message_disabled = named("validate.disabled");
        let message_ignored = named("validate.ignored");
        Ok(Checker {
            pool,
            field_rules,
            oneof_required,
            message_disabled,
            message_ignored,
            plans: Mutex::new(HashMap::new()),
            patterns: Mutex::new(HashMap::new()),
        })
    }

    /// Every rule `value` (an encoded `type_url`) breaks; `Ok` also when the type is
    /// unknown here.
    pub fn check(&self, type_url: &str, value: &[u8]) -> Result<(), Vec<Violation>> {
        let name = type_url.rsplit('/').next().unwrap_or(type_url);
        let Some(desc) = self.pool.get_message_by_name(name) else {
            return Ok(());
        };
        let message = match DynamicMessage::decode(desc, value) {
            Ok(m) => m,
            Err(e) => {
                return Err(vec![Violation {
                    path: String::new(),
                    rule: "decodes".to_string(),
                    value: e.to_string(),
                }]);
            }
        };
        let mut walk = Walk {
            checker: self,
            path: Vec::new(),
            out: Vec::new(),
        };
        walk.message(&message);
        if walk.out.is_empty() {
            Ok(())
        } else {
            Err(walk.out)
        }
    }

    fn plan(&self, desc: &MessageDescriptor) -> Arc<Plan> {
        if let Some(plan) = self
            .plans
            .lock()
            .expect("not poisoned")
            .get(desc.full_name())
        {
            return plan.clone();
        }
        let options = desc.options();
        let flag = |ext: &Option<ExtensionDescriptor>| {
            ext.as_ref().is_some_and(|ext| {
                options.has_extension(ext) && options.get_extension(ext).as_bool() == Some(true)
            })
        };
        let skip = flag(&self.message_disabled) || flag(&self.message_ignored);
        let fields = desc
            .fields()
            .map(|fd| {
                let options = fd.options();
                let rules = options
                    .has_extension(&self.field_rules)
                    .then(|| {
                        options
                            .get_extension(&self.field_rules)
                            .as_message()
                            .cloned()
                    })
                    .flatten();
                (fd, rules)
            })
            .collect();
        let required_oneofs = desc
            .oneofs()
            .filter(|o| !o.is_synthetic())
            .filter(|o| {
                self.oneof_required.as_ref().is_some_and(|ext| {
                    let options = o.options();
                    options.has_extension(ext) && options.get_extension(ext).as_bool() == Some(true)
                })
            })
            .collect();
        let plan = Arc::new(Plan {
            skip,
            fields,
            required_oneofs,
        });
        self.plans
            .lock()
            .expect("not poisoned")
            .insert(desc.full_name().to_string(), plan.clone());
        plan
    }

    fn pattern(&self, pattern: &str) -> Option<Arc<regex::Regex>> {
        let mut patterns = self.patterns.lock().expect("not poisoned");
        if let Some(re) = patterns.get(pattern) {
            return Some(re.clone());
        }
        let re = Arc::new(regex::Regex::new(pattern).ok()?);
        patterns.insert(pattern.to_string(), re.clone());
        Some(re)
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::core::v3::HeaderValueOption;
    use envoy_types::pb::envoy::config::route::v3::{
        DirectResponseAction, HeaderMatcher, Route, RouteConfiguration, RouteMatch, VirtualHost,
        route_match,
    };
    use envoy_types::pb::envoy::r#type::matcher::v3::RegexMatcher;
    use prost::Message;

    use super::*;

    fn checker() -> &'static Checker {
        // Fails (rather than skips) when the build found no Envoy descriptors: without
        // them every resource would pass unchecked.
        Checker::shared().expect("build.rs compiled the Envoy descriptors")
    }

    fn route_config(header: &str, regex: &str) -> RouteConfiguration {
        RouteConfiguration {
            name: "80".into(),
            virtual_hosts: vec![VirtualHost {
                name: "a".into(),
                domains: vec!["a".into()],
                routes: vec![Route {
                    r#match: Some(RouteMatch {
                        path_specifier: Some(route_match::PathSpecifier::SafeRegex(RegexMatcher {
                            regex: regex.into(),
                            ..Default::default()
                        })),
                        headers: vec![HeaderMatcher {
                            name: header.into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    action: Some(
                        envoy_types::pb::envoy::config::route::v3::route::Action::DirectResponse(
                            DirectResponseAction {
                                status: 200,
                                ..Default::default()
                            },
                        ),
                    ),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn check_route(config: &RouteConfiguration) -> Result<(), Vec<Violation>> {
        checker().check(
            "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
            &config.encode_to_vec(),
        )
    }

    #[test]
    fn a_valid_route_passes() {
        assert_eq!(check_route(&route_config("x-a", "/a.*")), Ok(()));
    }

    #[test]
    fn a_header_name_envoy_refuses_is_caught() {
        // Envoy's header-name rules are not strict (`strict: false`): they refuse NUL,
        // CR and LF only. "Bad Header:" is refused by meshfed's validation (RFC 9110),
        // not by these rules.
        assert_eq!(check_route(&route_config("Bad Header:", "/a")), Ok(()));
        let errors = check_route(&route_config("x-a\r\nx-b", "/a")).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(
            errors[0].path,
            "virtual_hosts[0].routes[0].match.headers[0].name"
        );
        assert!(
            errors[0].rule.contains("HTTP_HEADER_NAME"),
            "{}",
            errors[0].rule
        );
    }

    #[test]
    fn a_regex_re2_refuses_is_caught() {
        let errors = check_route(&route_config("x-a", "a{1001}")).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(
            errors[0].path,
            "virtual_hosts[0].routes[0].match.safe_regex.regex"
        );
    }

    #[test]
    fn required_fields_lengths_and_enums_are_checked() {
        // Cluster.name: string.min_len = 1.
        let cluster = Cluster::default();
        let errors = checker()
            .check(
                "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                &cluster.encode_to_vec(),
            )
            .unwrap_err();
        assert!(
            errors
                .iter()
                .any(|e| e.path == "name" && e.rule == "string.min_len = 1"),
            "{errors:?}"
        );
        // A route without an action: the `action` oneof is required.
        let mut config = route_config("x-a", "/a");
        config.virtual_hosts[0].routes[0].action = None;
        let errors = check_route(&config).unwrap_err();
        assert!(
            errors.iter().any(
                |e| e.path == "virtual_hosts[0].routes[0].action" && e.rule == "oneof required"
            ),
            "{errors:?}"
        );
        // A header to add without its header: message.required.
        let mut config = route_config("x-a", "/a");
        config.request_headers_to_add = vec![HeaderValueOption::default()];
        let errors = check_route(&config).unwrap_err();
        assert!(
            errors
                .iter()
                .any(|e| e.path == "request_headers_to_add[0].header"
                    && e.rule == "message.required = true"),
            "{errors:?}"
        );
        // An enum value Envoy does not define.
        let mut cluster = Cluster {
            name: "c".into(),
            ..Default::default()
        };
        cluster.lb_policy = 99;
        let errors = checker()
            .check(
                "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                &cluster.encode_to_vec(),
            )
            .unwrap_err();
        assert!(
            errors
                .iter()
                .any(|e| e.path == "lb_policy" && e.rule == "enum.defined_only = true"),
            "{errors:?}"
        );
    }

    #[test]
    #[should_panic(expected = "Envoy would NACK resource \"80\"")]
    fn assert_valid_panics_with_the_resource_name() {
        let config = route_config("x-a\nx-b", "/a");
        assert_valid(
            "80",
            "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
            &config.encode_to_vec(),
        );
    }
}

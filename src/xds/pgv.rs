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
    DescriptorPool, DynamicMessage, ExtensionDescriptor, FieldDescriptor, Kind, MessageDescriptor,
    OneofDescriptor, ReflectMessage, Value,
};

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

/// One walk over a decoded resource, collecting violations.
struct Walk<'a> {
    checker: &'a Checker,
    path: Vec<String>,
    out: Vec<Violation>,
}

/// A numeric value or bound, compared as `f64` (exact for every bound Envoy uses).
fn number(v: &Value) -> Option<f64> {
    Some(match v {
        Value::I32(n) | Value::EnumNumber(n) => f64::from(*n),
        Value::I64(n) => *n as f64,
        Value::U32(n) => f64::from(*n),
        Value::U64(n) => *n as f64,
        Value::F32(n) => f64::from(*n),
        Value::F64(n) => *n,
        _ => return None,
    })
}

fn show(v: &Value) -> String {
    let mut s = match v {
        Value::String(s) => format!("{s:?}"),
        Value::Message(m) => format!("{} {{..}}", m.descriptor().name()),
        other => format!("{other:?}"),
    };
    if s.len() > 80 {
        let mut end = 80;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// The field `name` of a proto2 rules message, when set.
fn rule<'m>(rules: &'m DynamicMessage, name: &str) -> Option<std::borrow::Cow<'m, Value>> {
    rules
        .has_field_by_name(name)
        .then(|| rules.get_field_by_name(name))
        .flatten()
}

fn rule_bool(rules: &DynamicMessage, name: &str) -> bool {
    rule(rules, name).and_then(|v| v.as_bool()) == Some(true)
}

fn duration_nanos(m: &DynamicMessage) -> i128 {
    let seconds = m
        .get_field_by_name("seconds")
        .and_then(|v| v.as_i64())
        .unwrap_or(0);
    let nanos = m
        .get_field_by_name("nanos")
        .and_then(|v| v.as_i32())
        .unwrap_or(0);
    i128::from(seconds) * 1_000_000_000 + i128::from(nanos)
}

/// The default of a scalar, to tell "empty" for `ignore_empty`.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Bytes(b) => b.is_empty(),
        Value::Bool(b) => !b,
        Value::List(l) => l.is_empty(),
        Value::Map(m) => m.is_empty(),
        Value::Message(_) => false,
        other => number(other) == Some(0.0),
    }
}

/// A length rule: does the measured length hold against the bound?
type Holds = fn(u64, u64) -> bool;

const WRAPPERS: &[&str] = &[
    "google.protobuf.DoubleValue",
    "google.protobuf.FloatValue",
    "google.protobuf.Int64Value",
    "google.protobuf.UInt64Value",
    "google.protobuf.Int32Value",
    "google.protobuf.UInt32Value",
    "google.protobuf.BoolValue",
    "google.protobuf.StringValue",
    "google.protobuf.BytesValue",
];

impl Walk<'_> {
    fn violation(&mut self, rule: impl Into<String>, value: String) {
        self.out.push(Violation {
            path: self.path.join(".").replace(".[", "["),
            rule: rule.into(),
            value,
        });
    }

    fn message(&mut self, message: &DynamicMessage) {
        let desc = message.descriptor();
        match desc.full_name() {
            "google.protobuf.Any" => return self.any(message),
            "envoy.type.matcher.v3.RegexMatcher" => {
                if let Some(Value::String(re)) = message.get_field_by_name("regex").as_deref()
                    && let Err(why) = meshfed_registry::config::validate::regex::validate_re2(re)
                {
                    self.path.push("regex".to_string());
                    self.violation(format!("RE2: {why}"), format!("{re:?}"));
                    self.path.pop();
                }
            }
            _ => {}
        }
        let plan = self.checker.plan(&desc);
        if plan.skip {
            return;
        }
        for oneof in &plan.required_oneofs {
            if !oneof.fields().any(|f| message.has_field(&f)) {
                self.path.push(oneof.name().to_string());
                self.violation("oneof required", "none set".to_string());
                self.path.pop();
            }
        }
        for (fd, rules) in &plan.fields {
            let present = message.has_field(fd);
            let in_oneof = fd.containing_oneof().is_some_and(|o| !o.is_synthetic());
            if !present
                && (in_oneof || fd.supports_presence() && !matches!(fd.kind(), Kind::Message(_)))
            {
                // An unset oneof member or an unset optional scalar: PGV skips it.
                continue;
            }
            self.path.push(fd.name().to_string());
            let value = message.get_field(fd);
            self.field(fd, present, &value, rules.as_ref());
            self.path.pop();
        }
    }

    fn any(&mut self, any: &DynamicMessage) {
        let type_url = any
            .get_field_by_number(1)
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let name = type_url.rsplit('/').next().unwrap_or_default();
        let Some(desc) = self.checker.pool.get_message_by_name(name) else {
            return;
        };
        let bytes = any
            .get_field_by_number(2)
            .and_then(|v| v.as_bytes().cloned())
            .unwrap_or_default();
        let last = self.path.pop().unwrap_or_default();
        self.path.push(format!("{last}<{name}>"));
        match DynamicMessage::decode(desc, bytes) {
            Ok(inner) => self.message(&inner),
            Err(e) => self.violation("decodes", e.to_string()),
        }
        let _ = self.path.pop();
        self.path.push(last);
    }

    fn field(
        &mut self,
        fd: &FieldDescriptor,
        present: bool,
        value: &Value,
        rules: Option<&DynamicMessage>,
    ) {
        if fd.is_list() {
            let items = value.as_list().unwrap_or_default();
            let item_rules = rules.and_then(|r| self.list_rules(r, value, items));
            for (i, item) in items.iter().enumerate() {
                self.path.push(format!("[{i}]"));
                self.single(&fd.kind(), true, item, item_rules.as_ref());
                self.path.pop();
            }
        } else if fd.is_map() {
            let Some(map) = value.as_map() else { return };
            let entry = match fd.kind() {
                Kind::Message(m) => m,
                _ => return,
            };
            let (mut key_rules, mut value_rules) = (None, None);
            if let Some(rules) = rules
                && let Some(Value::Message(m)) = rule(rules, "map").as_deref()
            {
                if !(rule_bool(m, "ignore_empty") && map.is_empty()) {
                    self.count_rules(m, map.len(), "min_pairs", "max_pairs", "map");
                }
                key_rules = rule(m, "keys").and_then(|v| v.as_message().cloned());
                value_rules = rule(m, "values").and_then(|v| v.as_message().cloned());
            }
            let key_kind = entry.map_entry_key_field().kind();
            let value_kind = entry.map_entry_value_field().kind();
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by_key(|(k, _)| format!("{k:?}"));
            for (key, val) in entries {
                let key_value: Value = key.clone().into();
                self.path.push(format!("[{}]", show(&key_value)));
                if key_rules.is_some() {
                    self.single(&key_kind, true, &key_value, key_rules.as_ref());
                }
                self.single(&value_kind, true, val, value_rules.as_ref());
                self.path.pop();
            }
        } else {
            self.single(&fd.kind(), present, value, rules);
        }
    }

    /// Repeated rules on the list; returns the rules for each item.
    fn list_rules(
        &mut self,
        rules: &DynamicMessage,
        value: &Value,
        items: &[Value],
    ) -> Option<DynamicMessage> {
        let Some(Value::Message(r)) = rule(rules, "repeated").as_deref().cloned() else {
            return None;
        };
        if rule_bool(&r, "ignore_empty") && items.is_empty() {
            return None;
        }
        self.count_rules(&r, items.len(), "min_items", "max_items", "repeated");
        if rule_bool(&r, "unique") {
            for (i, a) in items.iter().enumerate() {
                if items[..i].contains(a) {
                    self.violation("repeated.unique = true", show(value));
                    break;
                }
            }
        }
        rule(&r, "items").and_then(|v| v.as_message().cloned())
    }

    fn count_rules(&mut self, r: &DynamicMessage, n: usize, min: &str, max: &str, kind: &str) {
        let n = n as u64;
        if let Some(least) = rule(r, min).and_then(|v| v.as_u64())
            && n < least
        {
            self.violation(format!("{kind}.{min} = {least}"), format!("{n} entries"));
        }
        if let Some(most) = rule(r, max).and_then(|v| v.as_u64())
            && n > most
        {
            self.violation(format!("{kind}.{max} = {most}"), format!("{n} entries"));
        }
    }

    /// One value (a singular field, a list item or a map key or value).
    fn single(
        &mut self,
        kind: &Kind,
        present: bool,
        value: &Value,
        rules: Option<&DynamicMessage>,
    ) {
        match kind {
            Kind::Message(desc) => {
                let name = desc.full_name();
                if let Some(rules) = rules {
                    let required = match name {
                        "google.protobuf.Duration" => rule(rules, "duration")
                            .and_then(|v| v.as_message().map(|m| rule_bool(m, "required")))
                            .unwrap_or(false),
                        "google.protobuf.Any" => rule(rules, "any")
                            .and_then(|v| v.as_message().map(|m| rule_bool(m, "required")))
                            .unwrap_or(false),
                        _ => false,
                    } || rule(rules, "message")
                        .and_then(|v| v.as_message().map(|m| rule_bool(m, "required")))
                        .unwrap_or(false);
                    if !present {
                        if required {
                            self.violation("message.required = true", "unset".to_string());
                        }
                        return;
                    }
                    let Some(message) = value.as_message() else {
                        return;
                    };
                    if rule(rules, "message")
                        .and_then(|v| v.as_message().map(|m| rule_bool(m, "skip")))
                        .unwrap_or(false)
                    {
                        return;
                    }
                    if WRAPPERS.contains(&name) {
                        let inner = message.get_field_by_name("value").map(|v| v.into_owned());
                        if let Some(inner) = inner {
                            self.scalar(
                                &desc.get_field_by_name("value").expect("wrapper").kind(),
                                &inner,
                                rules,
                            );
                        }
                        return;
                    }
                    match name {
                        "google.protobuf.Duration" => self.duration(message, rules),
                        "google.protobuf.Any" => self.any_rules(message, rules),
                        _ => {}
                    }
                }
                if present && let Some(message) = value.as_message() {
                    self.message(message);
                }
            }
            scalar => {
                if let Some(rules) = rules {
                    self.scalar(scalar, value, rules);
                }
            }
        }
    }

    fn duration(&mut self, message: &DynamicMessage, rules: &DynamicMessage) {
        let Some(Value::Message(r)) = rule(rules, "duration").as_deref().cloned() else {
            return;
        };
        let v = duration_nanos(message);
        let bound = |name: &str| rule(&r, name).and_then(|b| b.as_message().map(duration_nanos));
        let shown = || format!("{}s", v as f64 / 1e9);
        if let Some(c) = bound("const")
            && v != c
        {
            self.violation(format!("duration.const = {c}ns"), shown());
        }
        self.bounds(
            v as f64,
            bound("gt").map(|b| b as f64),
            bound("gte").map(|b| b as f64),
            bound("lt").map(|b| b as f64),
            bound("lte").map(|b| b as f64),
            "duration",
            shown(),
        );
    }

    fn any_rules(&mut self, message: &DynamicMessage, rules: &DynamicMessage) {
        let Some(Value::Message(r)) = rule(rules, "any").as_deref().cloned() else {
            return;
        };
        let url = message
            .get_field_by_number(1)
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let list = |name: &str| string_list(&r, name);
        let allowed = list("in");
        if !allowed.is_empty() && !allowed.contains(&url) {
            self.violation("any.in", url.clone());
        }
        if list("not_in").contains(&url) {
            self.violation("any.not_in", url);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn bounds(
        &mut self,
        v: f64,
        gt: Option<f64>,
        gte: Option<f64>,
        lt: Option<f64>,
        lte: Option<f64>,
        kind: &str,
        shown: String,
    ) {
        let lower = gt
            .map(|b| (b, v > b, "gt"))
            .or(gte.map(|b| (b, v >= b, "gte")));
        let upper = lt
            .map(|b| (b, v < b, "lt"))
            .or(lte.map(|b| (b, v <= b, "lte")));
        let ok = match (lower, upper) {
            // PGV: an upper bound below the lower one means "outside the range".
            (Some((lo, lo_ok, _)), Some((hi, hi_ok, _))) if hi < lo => lo_ok || hi_ok,
            _ => lower.is_none_or(|l| l.1) && upper.is_none_or(|u| u.1),
        };
        if !ok {
            let rule = [lower, upper]
                .into_iter()
                .flatten()
                .map(|(b, _, name)| format!("{kind}.{name} = {b}"))
                .collect::<Vec<_>>()
                .join(", ");
            self.violation(rule, shown);
        }
    }

    fn scalar(&mut self, kind: &Kind, value: &Value, rules: &DynamicMessage) {
        let type_rules = [
            "string", "bytes", "enum", "bool", "double", "float", "int32", "int64", "uint32",
            "uint64", "sint32", "sint64", "fixed32", "fixed64", "sfixed32", "sfixed64",
        ];
        let Some((name, r)) = type_rules.iter().find_map(|name| {
            rule(rules, name).and_then(|v| v.as_message().cloned().map(|m| (*name, m)))
        }) else {
            return;
        };
        if rule_bool(&r, "ignore_empty") && is_empty(value) {
            return;
        }
        match (name, value) {
            ("string", Value::String(s)) => self.string(s, &r),
            ("bytes", Value::Bytes(b)) => {
                let n = b.len() as u64;
                let checks: [(&str, Holds); 3] = [
                    ("min_len", |n, b| n >= b),
                    ("max_len", |n, b| n <= b),
                    ("len", |n, b| n == b),
                ];
                for (rule_name, ok) in checks {
                    if let Some(bound) = rule(&r, rule_name).and_then(|v| v.as_u64())
                        && !ok(n, bound)
                    {
                        self.violation(
                            format!("bytes.{rule_name} = {bound}"),
                            format!("{n} bytes"),
                        );
                    }
                }
            }
            ("enum", Value::EnumNumber(n)) => {
                if rule_bool(&r, "defined_only")
                    && let Kind::Enum(e) = kind
                    && e.get_value(*n).is_none()
                {
                    self.violation("enum.defined_only = true", n.to_string());
                }
                self.membership(name, value, &r);
            }
            ("bool", Value::Bool(b)) => {
                if let Some(c) = rule(&r, "const").and_then(|v| v.as_bool())
                    && *b != c
                {
                    self.violation(format!("bool.const = {c}"), b.to_string());
                }
            }
            (_, v) => {
                let Some(n) = number(v) else { return };
                let bound = |b: &str| rule(&r, b).as_deref().and_then(number);
                if let Some(c) = bound("const")
                    && n != c
                {
                    self.violation(format!("{name}.const = {c}"), show(v));
                }
                self.bounds(
                    n,
                    bound("gt"),
                    bound("gte"),
                    bound("lt"),
                    bound("lte"),
                    name,
                    show(v),
                );
                self.membership(name, value, &r);
            }
        }
    }

    /// `in` / `not_in` on a numeric or enum value.
    fn membership(&mut self, name: &str, value: &Value, r: &DynamicMessage) {
        let Some(n) = number(value) else { return };
        let list = |field: &str| -> Vec<f64> {
            r.get_field_by_name(field)
                .and_then(|v| v.as_list().map(|l| l.iter().filter_map(number).collect()))
                .unwrap_or_default()
        };
        let allowed = list("in");
        if !allowed.is_empty() && !allowed.contains(&n) {
            self.violation(format!("{name}.in = {allowed:?}"), show(value));
        }
        let refused = list("not_in");
        if refused.contains(&n) {
            self.violation(format!("{name}.not_in = {refused:?}"), show(value));
        }
    }

    fn string(&mut self, s: &str, r: &DynamicMessage) {
        let shown = || show(&Value::String(s.to_string()));
        let chars = s.chars().count() as u64;
        let bytes = s.len() as u64;
        let checks: [(&str, u64, Holds); 6] = [
            ("len", chars, |n, b| n == b),
            ("min_len", chars, |n, b| n >= b),
            ("max_len", chars, |n, b| n <= b),
            ("len_bytes", bytes, |n, b| n == b),
            ("min_bytes", bytes, |n, b| n >= b),
            ("max_bytes", bytes, |n, b| n <= b),
        ];
        for (name, n, ok) in checks {
            if let Some(bound) = rule(r, name).and_then(|v| v.as_u64())
                && !ok(n, bound)
            {
                self.violation(format!("string.{name} = {bound}"), shown());
            }
        }
        let text = |name: &str| rule(r, name).and_then(|v| v.as_str().map(str::to_string));
        if let Some(c) = text("const")
            && s != c
        {
            self.violation(format!("string.const = {c:?}"), shown());
        }
        if let Some(p) = text("prefix")
            && !s.starts_with(&p)
        {
            self.violation(format!("string.prefix = {p:?}"), shown());
        }
        if let Some(p) = text("suffix")
            && !s.ends_with(&p)
        {
            self.violation(format!("string.suffix = {p:?}"), shown());
        }
        if let Some(p) = text("contains")
            && !s.contains(&p)
        {
            self.violation(format!("string.contains = {p:?}"), shown());
        }
        if let Some(p) = text("not_contains")
            && s.contains(&p)
        {
            self.violation(format!("string.not_contains = {p:?}"), shown());
        }
        let list = |name: &str| string_list(r, name);
        let allowed = list("in");
        if !allowed.is_empty() && !allowed.iter().any(|a| a == s) {
            self.violation(format!("string.in = {allowed:?}"), shown());
        }
        if list("not_in").iter().any(|a| a == s) {
            self.violation("string.not_in", shown());
        }
        if let Some(p) = text("pattern")
            && let Some(re) = self.checker.pattern(&p)
            && !re.is_match(s)
        {
            self.violation(format!("string.pattern = {p:?}"), shown());
        }
        let ip = |want: fn(&std::net::IpAddr) -> bool| {
            s.parse::<std::net::IpAddr>().is_ok_and(|a| want(&a))
        };
        for (name, ok) in [
            ("ip", ip(|_| true)),
            ("ipv4", ip(std::net::IpAddr::is_ipv4)),
            ("ipv6", ip(std::net::IpAddr::is_ipv6)),
        ] {
            if rule_bool(r, name) && !ok {
                self.violation(format!("string.{name} = true"), shown());
            }
        }
        if let Some(known) = rule(r, "well_known_regex").and_then(|v| v.as_enum_number()) {
            // `strict` defaults to true.
            let strict = rule(r, "strict").and_then(|v| v.as_bool()).unwrap_or(true);
            let ok = match (known, strict) {
                // HTTP_HEADER_NAME: `^:?[0-9a-zA-Z!#$%&'*+-.^_|~\x60]+$`.
                (1, true) => {
                    let name = s.strip_prefix(':').unwrap_or(s);
                    !name.is_empty()
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_|~`".contains(&b))
                }
                // HTTP_HEADER_VALUE: no control characters but tab.
                (2, true) => !s.chars().any(|c| (c < ' ' && c != '\t') || c == '\u{7f}'),
                // Either, not strict: no NUL, LF or CR.
                (1 | 2, false) => !s.contains(['\0', '\n', '\r']),
                _ => true,
            };
            if !ok {
                let which = if known == 1 {
                    "HTTP_HEADER_NAME"
                } else {
                    "HTTP_HEADER_VALUE"
                };
                self.violation(
                    format!("string.well_known_regex = {which} (strict: {strict})"),
                    shown(),
                );
            }
        }
    }
}

/// The repeated string field `name` of rule message `rule` (empty when unset).
fn string_list(rule: &DynamicMessage, name: &str) -> Vec<String> {
    rule.get_field_by_name(name)
        .and_then(|v| {
            v.as_list().map(|l| {
                l.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
        })
        .unwrap_or_default()
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

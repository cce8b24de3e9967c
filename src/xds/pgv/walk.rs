//! One walk over a decoded resource: every field's PGV rules applied, violations
//! collected.

use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, ReflectMessage, Value};

use super::{Checker, Violation};

/// One walk over a decoded resource, collecting violations.
pub(super) struct Walk<'a> {
    pub(super) checker: &'a Checker,
    pub(super) path: Vec<String>,
    pub(super) out: Vec<Violation>,
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

    pub(super) fn message(&mut self, message: &DynamicMessage) {
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

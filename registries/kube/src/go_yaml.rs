//! YAML as Go's `sigs.k8s.io/yaml` (go-yaml v2 under it) writes a JSON value: what
//! `kubectl` and `istioctl` print. Commands that write files or objects a user
//! compares with istioctl's output (`meshfed create-remote-secret`, `meshfed vm
//! bootstrap`'s `mesh.yaml`) render through [`to_string`], so the text matches
//! istioctl's, not only its meaning.
//!
//! The rules followed: block style; mapping keys in go-yaml's order (rune by rune,
//! a non-letter before a letter, digit runs compared as numbers); sequences inside a
//! mapping not indented; a string that would read back as something else (`"true"`,
//! `""`, `"8080"`, a date) double-quoted; one that cannot be plain (leading
//! indicator, `: `, ` #`, surrounding spaces) single-quoted, or double-quoted when it
//! holds characters single quotes cannot carry; a multi-line string as a literal
//! block (`|`, `|-` without a final newline, `|+` with several). Long plain strings
//! are not folded at 80 columns as go-yaml folds them (the value reads the same).

use std::cmp::Ordering;

use serde_json::Value;

/// `value` as one YAML document (ending with a newline).
pub fn to_string(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => write_mapping(map, 0, &mut out, false),
        Value::Array(items) if !items.is_empty() => write_sequence(items, 0, &mut out, false),
        other => write_scalar(other, 0, &mut out),
    }
    out
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

fn write_mapping(
    map: &serde_json::Map<String, Value>,
    indent: usize,
    out: &mut String,
    first_inline: bool,
) {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort_by(|a, b| key_order(a, b));
    for (i, key) in keys.into_iter().enumerate() {
        if !(i == 0 && first_inline) {
            pad(out, indent);
        }
        out.push_str(&scalar_text(key, indent));
        out.push(':');
        match &map[key] {
            Value::Object(inner) if !inner.is_empty() => {
                out.push('\n');
                write_mapping(inner, indent + 2, out, false);
            }
            Value::Array(items) if !items.is_empty() => {
                out.push('\n');
                write_sequence(items, indent, out, false);
            }
            other => {
                out.push(' ');
                write_scalar(other, indent + 2, out);
            }
        }
    }
}

fn write_sequence(items: &[Value], indent: usize, out: &mut String, first_inline: bool) {
    for (i, item) in items.iter().enumerate() {
        if !(i == 0 && first_inline) {
            pad(out, indent);
        }
        out.push_str("- ");
        match item {
            Value::Object(inner) if !inner.is_empty() => {
                write_mapping(inner, indent + 2, out, true);
            }
            Value::Array(inner) if !inner.is_empty() => {
                write_sequence(inner, indent + 2, out, true);
            }
            other => write_scalar(other, indent + 2, out),
        }
    }
}

/// A scalar (or empty collection) and its line end; a literal block's lines are
/// indented by `indent`.
fn write_scalar(value: &Value, indent: usize, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => out.push_str(&scalar_text(s, indent)),
        Value::Array(_) => out.push_str("[]"),
        Value::Object(_) => out.push_str("{}"),
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
}

/// A string as go-yaml writes it; a literal block ends with its own newline.
fn scalar_text(s: &str, indent: usize) -> String {
    if s.contains('\n') {
        return literal_block(s, indent).unwrap_or_else(|| double_quoted(s));
    }
    if resolves_to_non_string(s) {
        return double_quoted(s);
    }
    if plain_allowed(s) {
        return s.to_string();
    }
    if s.chars().all(|c| !is_special(c)) {
        return format!("'{}'", s.replace('\'', "''"));
    }
    double_quoted(s)
}

/// `|`, `|-` or `|+` and the lines, or `None` when a literal block cannot carry it
/// (a line ending in a space, a leading space, special characters).
fn literal_block(s: &str, indent: usize) -> Option<String> {
    if s.starts_with(' ')
        || s.chars().any(|c| c != '\n' && is_special(c))
        || s.split('\n')
            .any(|line| line.ends_with(' ') || line.ends_with('\t'))
    {
        return None;
    }
    let (indicator, body) = if let Some(body) = s.strip_suffix("\n\n") {
        ("|+", format!("{body}\n"))
    } else if let Some(body) = s.strip_suffix('\n') {
        ("|", body.to_string())
    } else {
        ("|-", s.to_string())
    };
    let mut out = format!("{indicator}\n");
    for line in body.split('\n') {
        if !line.is_empty() {
            pad(&mut out, indent);
            out.push_str(line);
        }
        out.push('\n');
    }
    Some(out)
}

/// Not printable for libyaml (a tab included), or a line break other than `\n`.
fn is_special(c: char) -> bool {
    let printable = matches!(c, ' '..='~' | '\u{a0}'..='\u{d7ff}' | '\u{10000}'..)
        || (('\u{e000}'..='\u{fffd}').contains(&c) && c != '\u{feff}');
    c != '\n' && (!printable || matches!(c, '\u{2028}' | '\u{2029}'))
}

/// Whether libyaml's analysis allows `s` as a plain scalar in block context.
fn plain_allowed(s: &str) -> bool {
    if s.is_empty() || s.starts_with("---") || s.starts_with("...") {
        return false;
    }
    if s.starts_with(' ') || s.ends_with(' ') || s.starts_with('\t') || s.ends_with('\t') {
        return false;
    }
    let chars: Vec<char> = s.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if is_special(c) {
            return false;
        }
        let followed_by_blank = chars.get(i + 1).is_none_or(|n| *n == ' ' || *n == '\t');
        let preceded_by_blank = i > 0 && (chars[i - 1] == ' ' || chars[i - 1] == '\t');
        if i == 0 {
            if "#,[]{}&*!|>'\"%@`".contains(c) {
                return false;
            }
            if (c == '?' || c == ':' || c == '-') && followed_by_blank {
                return false;
            }
        } else {
            if c == ':' && followed_by_blank {
                return false;
            }
            if c == '#' && preceded_by_blank {
                return false;
            }
        }
    }
    true
}

/// Whether go-yaml would read `s`, written plain, as something other than a string
/// (null, a YAML 1.1 boolean, a number, a base-60 float, a timestamp).
fn resolves_to_non_string(s: &str) -> bool {
    const WORDS: [&str; 35] = [
        "", "~", "null", "Null", "NULL", "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO",
        "true", "True", "TRUE", "false", "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF",
        ".inf", ".Inf", ".INF", "+.inf", "-.inf", ".nan", ".NaN", ".NAN",
    ];
    if WORDS.contains(&s) || matches!(s, "+.Inf" | "+.INF" | "-.Inf" | "-.INF") {
        return true;
    }
    let Some(first) = s.chars().next() else {
        return true;
    };
    if !(first.is_ascii_digit() || matches!(first, '+' | '-' | '.')) {
        return false;
    }
    let plain = s.replace('_', "");
    is_go_int(&plain) || is_go_float(&plain) || is_base60_float(s) || is_timestamp(s)
}

/// Go's `strconv.ParseInt(s, 0, 64)` / `ParseUint` accepting `s`.
fn is_go_int(s: &str) -> bool {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (radix, body) = if let Some(rest) = digits.strip_prefix("0x").or(digits.strip_prefix("0X"))
    {
        (16, rest)
    } else if let Some(rest) = digits.strip_prefix("0b").or(digits.strip_prefix("0B")) {
        (2, rest)
    } else if let Some(rest) = digits.strip_prefix("0o").or(digits.strip_prefix("0O")) {
        (8, rest)
    } else if digits.len() > 1 && digits.starts_with('0') {
        (8, &digits[1..])
    } else {
        (10, digits)
    };
    !body.is_empty() && u128::from_str_radix(body, radix).is_ok_and(|n| n <= u128::from(u64::MAX))
}

/// Go's `strconv.ParseFloat(s, 64)` accepting `s` (decimal forms).
fn is_go_float(s: &str) -> bool {
    let body = s.strip_prefix(['+', '-']).unwrap_or(s);
    let lower = body.to_ascii_lowercase();
    if matches!(lower.as_str(), "inf" | "infinity" | "nan") {
        return true;
    }
    body.chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
        && body.parse::<f64>().is_ok()
}

/// go-yaml's base-60 float (`1:20`, `-1:20:30.5`), which YAML 1.1 readers take as a number.
fn is_base60_float(s: &str) -> bool {
    let body = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (int_part, _fraction) = match body.split_once('.') {
        Some((i, f)) if f.chars().all(|c| c.is_ascii_digit() || c == '_') => (i, Some(f)),
        Some(_) => return false,
        None => (body, None),
    };
    let mut parts = int_part.split(':');
    let Some(head) = parts.next() else {
        return false;
    };
    let head_ok = head.chars().next().is_some_and(|c| c.is_ascii_digit())
        && head.chars().all(|c| c.is_ascii_digit() || c == '_');
    let rest: Vec<&str> = parts.collect();
    head_ok
        && !rest.is_empty()
        && rest.iter().all(|p| {
            (1..=2).contains(&p.len())
                && p.chars().all(|c| c.is_ascii_digit())
                && (p.len() == 1 || p.as_bytes()[0] <= b'5')
        })
}

/// A YAML timestamp as go-yaml recognises one: `YYYY-M-D`, optionally followed by a
/// time after `T`, `t` or a space.
fn is_timestamp(s: &str) -> bool {
    let (date, _time) = match s.find(['T', 't', ' ']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let parts: Vec<&str> = date.split('-').collect();
    parts.len() == 3
        && parts[0].len() == 4
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        && parts[1].len() <= 2
        && parts[2].len() <= 2
}

fn double_quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\0' => out.push_str("\\0"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{b}' => out.push_str("\\v"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            '\u{1b}' => out.push_str("\\e"),
            '\u{85}' => out.push_str("\\N"),
            '\u{a0}' => out.push_str("\\_"),
            '\u{2028}' => out.push_str("\\L"),
            '\u{2029}' => out.push_str("\\P"),
            c if is_special(c) => {
                let n = c as u32;
                if n <= 0xff {
                    out.push_str(&format!("\\x{n:02X}"));
                } else {
                    out.push_str(&format!("\\u{n:04X}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// go-yaml's order of string keys: rune by rune; of two different runes, two
/// letters compare as runes, a non-letter comes before a letter, and runs of digits
/// compare as numbers.
pub fn key_order(a: &str, b: &str) -> Ordering {
    let ar: Vec<char> = a.chars().collect();
    let br: Vec<char> = b.chars().collect();
    let mut i = 0;
    while i < ar.len() && i < br.len() {
        if ar[i] == br[i] {
            i += 1;
            continue;
        }
        let (al, bl) = (ar[i].is_alphabetic(), br[i].is_alphabetic());
        if al && bl {
            return ar[i].cmp(&br[i]);
        }
        if al || bl {
            return if bl {
                Ordering::Less
            } else {
                Ordering::Greater
            };
        }
        let number = |r: &[char], from: usize| {
            let mut end = from;
            let mut n: u128 = 0;
            while end < r.len() && r[end].is_ascii_digit() {
                n = n
                    .saturating_mul(10)
                    .saturating_add(u128::from(r[end] as u8 - b'0'));
                end += 1;
            }
            (n, end)
        };
        let (an, ai) = number(&ar, i);
        let (bn, bi) = number(&br, i);
        if an != bn {
            return an.cmp(&bn);
        }
        if ai != bi {
            return ai.cmp(&bi);
        }
        return ar[i].cmp(&br[i]);
    }
    ar.len().cmp(&br.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_sort_as_go_yaml_sorts_them() {
        let mut keys = vec![
            "ISTIO_METAJSON_LABELS",
            "ISTIO_META_WORKLOAD_NAME",
            "POD_NAMESPACE",
            "ISTIO_META_CLUSTER_ID",
            "a10",
            "a9",
            "Z",
            "a",
        ];
        keys.sort_by(|a, b| key_order(a, b));
        assert_eq!(
            keys,
            [
                "ISTIO_META_CLUSTER_ID",
                "ISTIO_META_WORKLOAD_NAME",
                "ISTIO_METAJSON_LABELS",
                "POD_NAMESPACE",
                "Z",
                "a",
                "a9",
                "a10",
            ]
        );
    }

    #[test]
    fn scalars_are_quoted_only_where_go_yaml_quotes_them() {
        let cases = [
            ("latest", "latest"),
            ("", "\"\""),
            ("true", "\"true\""),
            ("no", "\"no\""),
            ("8080", "\"8080\""),
            ("0x1F", "\"0x1F\""),
            ("1.5", "\"1.5\""),
            ("1:20", "\"1:20\""),
            ("2024-01-02", "\"2024-01-02\""),
            (
                "istiod-rev-1.istio-system.svc:15012",
                "istiod-rev-1.istio-system.svc:15012",
            ),
            (r#"{"app":"foo"}"#, r#"'{"app":"foo"}'"#),
            ("a: b", "'a: b'"),
            ("a #b", "'a #b'"),
            ("- x", "'- x'"),
            ("it's", "it's"),
            (" lead", "' lead'"),
            ("*", "'*'"),
            ("tab\tin", "\"tab\\tin\""),
            ("bell\u{7}", "\"bell\\a\""),
        ];
        for (input, want) in cases {
            assert_eq!(scalar_text(input, 0), want, "{input:?}");
        }
    }

    #[test]
    fn documents_render_like_kubectl_output() {
        let doc = json!({
            "kind": "Secret",
            "apiVersion": "v1",
            "metadata": {"labels": {"istio/multiCluster": "true"}, "name": "s"},
            "stringData": {"c1": "apiVersion: v1\nclusters:\n- name: c1\n"},
            "list": [{"b": 1, "a": [2, 3]}, "x", []],
            "empty": {},
        });
        assert_eq!(
            to_string(&doc),
            "apiVersion: v1\n\
             empty: {}\n\
             kind: Secret\n\
             list:\n\
             - a:\n  \
               - 2\n  \
               - 3\n  \
               b: 1\n\
             - x\n\
             - []\n\
             metadata:\n  \
               labels:\n    \
                 istio/multiCluster: \"true\"\n  \
               name: s\n\
             stringData:\n  \
               c1: |\n    \
                 apiVersion: v1\n    \
                 clusters:\n    \
                 - name: c1\n"
        );
        assert_eq!(to_string(&json!({"a": "x\ny"})), "a: |-\n  x\n  y\n");
        assert_eq!(to_string(&json!({"a": "x\n\n"})), "a: |+\n  x\n\n");
        assert_eq!(to_string(&json!({"a": "x \ny"})), "a: \"x \\ny\"\n");
    }
}

//! Finding the line of a field in a YAML (or JSON) document, for `file:line` messages.
//!
//! serde_norway keeps positions only in its errors, so [`line_of`] walks the document
//! to the node and fails there on purpose: the error's position is the node's. Field
//! names match loosely (`perTryTimeout` finds `per_try_timeout`), map keys exactly.
//! When the node is missing (a required field that is not there), the line of the
//! nearest enclosing node that exists is given.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::config::validate::Segment;

/// The marker planted in the error provoked at the node looked for.
const LOCATED: &str = "\u{1}meshfed-config-located\u{1}";

/// The 1-based line, within `text`, of the node at `path` (or of its nearest existing
/// ancestor). `None` when `text` is not a single parseable document.
pub(crate) fn line_of(text: &str, path: &[Segment]) -> Option<usize> {
    (0..=path.len())
        .rev()
        .find_map(|len| locate_exact(text, &path[..len]))
}

fn locate_exact(text: &str, path: &[Segment]) -> Option<usize> {
    match Walk(path).deserialize(serde_norway::Deserializer::from_str(text)) {
        Err(e) if e.to_string().contains(LOCATED) => e.location().map(|l| l.line()),
        _ => None,
    }
}

/// `perTryTimeout` and `per_try_timeout` are the same field.
fn same_field(yaml_key: &str, field: &str) -> bool {
    let norm = |s: &str| -> String {
        s.chars()
            .filter(|c| *c != '_')
            .flat_map(char::to_lowercase)
            .collect()
    };
    yaml_key == field || norm(yaml_key) == norm(field)
}

struct Walk<'a>(&'a [Segment]);

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if self.0.is_empty() {
            d.deserialize_any(Here)
        } else {
            d.deserialize_any(self)
        }
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping or sequence")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (want, rest) = match self.0.split_first() {
            Some((segment @ (Segment::Field(_) | Segment::Key(_)), rest)) => (Some(segment), rest),
            _ => (None, &[][..]),
        };
        while let Some(found) = map.next_key_seed(Key {
            want,
            last: rest.is_empty(),
        })? {
            if found {
                map.next_value_seed(Walk(rest))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (want, rest) = match self.0.split_first() {
            Some((Segment::Index(i), rest)) => (Some(*i), rest),
            _ => (None, &[][..]),
        };
        let mut i = 0;
        loop {
            let more = if want == Some(i) {
                seq.next_element_seed(Walk(rest))?.is_some()
            } else {
                seq.next_element::<IgnoredAny>()?.is_some()
            };
            if !more {
                return Ok(());
            }
            i += 1;
        }
    }
}

/// Reads a mapping key: `true` when it is the wanted one. When it is the last step of
/// the path, fails at the key instead, so the line is the key's.
struct Key<'a> {
    want: Option<&'a Segment>,
    last: bool,
}

impl Key<'_> {
    fn matches(&self, key: &str) -> bool {
        match self.want {
            Some(Segment::Field(field)) => same_field(key, field),
            Some(Segment::Key(k)) => key == k,
            _ => false,
        }
    }

    fn check<E: de::Error>(&self, key: &str) -> Result<bool, E> {
        let found = self.matches(key);
        if found && self.last {
            Err(E::custom(LOCATED))
        } else {
            Ok(found)
        }
    }
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        self.check(v)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
        self.check(&v.to_string())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<bool, E> {
        self.check(&v.to_string())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<bool, E> {
        self.check(&v.to_string())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<bool, E> {
        self.check(&v.to_string())
    }

    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }
}

/// Rejects whatever it is given, with [`LOCATED`] in the message.
struct Here;

impl Visitor<'_> for Here {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(LOCATED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(s: &str) -> Segment {
        Segment::Field(s.to_string())
    }

    const DOC: &str = "\
# a comment
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: reviews
  labels: {app: reviews}
spec:
  hosts: [reviews]
  http:
  - route:
    - destination:
        host: reviews
      weight: 20
    - destination: {host: reviews}
      weight: 120
    retries:
      per_try_timeout: 0s
";

    #[test]
    fn finds_fields_keys_and_elements() {
        let path = |segments: Vec<Segment>| line_of(DOC, &segments);
        assert_eq!(
            path(vec![]),
            Some(2),
            "the document starts at its first node"
        );
        assert_eq!(path(vec![field("kind")]), Some(3));
        assert_eq!(path(vec![field("metadata"), field("name")]), Some(5));
        assert_eq!(
            path(vec![
                field("metadata"),
                field("labels"),
                Segment::Key("app".into())
            ]),
            Some(6)
        );
        let route = vec![
            field("spec"),
            field("http"),
            Segment::Index(0),
            field("route"),
        ];
        let mut weight = route.clone();
        weight.extend([Segment::Index(1), field("weight")]);
        assert_eq!(path(weight), Some(15));
        let mut first = route.clone();
        first.push(Segment::Index(0));
        assert_eq!(path(first), Some(11));
        // camelCase finds snake_case.
        assert_eq!(
            path(vec![
                field("spec"),
                field("http"),
                Segment::Index(0),
                field("retries"),
                field("perTryTimeout")
            ]),
            Some(17)
        );
    }

    #[test]
    fn a_missing_field_points_at_its_parent() {
        assert_eq!(
            line_of(DOC, &[field("spec"), field("gateways")]),
            Some(7),
            "spec: is on line 7"
        );
        assert_eq!(
            line_of(
                DOC,
                &[
                    field("spec"),
                    field("http"),
                    Segment::Index(0),
                    field("timeout")
                ]
            ),
            Some(10)
        );
        assert_eq!(
            line_of("\n\njust a scalar\n", &[field("a")]),
            Some(3),
            "no such field: the document's line"
        );
    }
}

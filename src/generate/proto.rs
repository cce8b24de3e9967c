//! Small protobuf helpers the generators share: packing into `Any`, durations,
//! `Struct`s.

use std::collections::{BTreeMap, HashMap};
use std::hash::RandomState;
use std::sync::LazyLock;

use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration, Struct, Value, value};
use prost::{Message, Name};

// ---------------------------------------------------------------------------------
// Helpers

/// An Istio duration as a protobuf one.
pub fn pb_duration(d: meshfed_api::Duration) -> PbDuration {
    PbDuration {
        seconds: d.seconds,
        nanos: d.nanos,
    }
}

/// A map that iterates in the same order every time it is built with the same
/// entries. prost encodes a map field (`Struct.fields`, `Metadata.filter_metadata`) in
/// the `HashMap`'s iteration order, and every `HashMap::new()` gets hash keys of its
/// own: two builds of equal metadata would encode to different bytes, so a resource
/// rebuilt unchanged would look changed and be pushed again. Here every map shares one
/// hasher and gets its entries in sorted order at the same capacity.
pub fn stable_map<V>(entries: impl IntoIterator<Item = (String, V)>) -> HashMap<String, V> {
    static HASHER: LazyLock<RandomState> = LazyLock::new(RandomState::new);
    let sorted: BTreeMap<String, V> = entries.into_iter().collect();
    let mut map = HashMap::with_capacity_and_hasher(sorted.len(), HASHER.clone());
    map.extend(sorted);
    map
}

/// A `Struct` with these fields, encoding the same way every time ([`stable_map`]).
pub fn stable_struct(fields: impl IntoIterator<Item = (String, Value)>) -> Struct {
    Struct {
        fields: stable_map(fields),
    }
}

/// A `Struct` of string fields.
pub fn string_struct(fields: &[(&str, &str)]) -> Struct {
    stable_struct(fields.iter().map(|(k, v)| {
        (
            k.to_string(),
            Value {
                kind: Some(value::Kind::StringValue(v.to_string())),
            },
        )
    }))
}

/// Packs a message into an `Any`.
pub fn pack<M: Message + Name>(m: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: m.encode_to_vec(),
    }
}

#[cfg(test)]
mod stable_tests {
    use super::*;

    #[test]
    fn equal_structs_encode_to_equal_bytes() {
        let fields = || (0..12).map(|i| (format!("key-{i}"), Value::default()));
        let one = stable_struct(fields()).encode_to_vec();
        let reversed: Vec<_> = fields().collect::<Vec<_>>().into_iter().rev().collect();
        for _ in 0..20 {
            assert_eq!(stable_struct(reversed.clone()).encode_to_vec(), one);
        }
        // What this replaces: two maps of their own disagree on the order.
        let own = |()| {
            Struct {
                fields: fields().collect(),
            }
            .encode_to_vec()
        };
        assert!((0..20).any(|_| own(()) != own(())));
    }
}

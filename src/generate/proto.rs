//! Small protobuf helpers the generators share: packing into `Any`, durations,
//! `Struct`s.

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

/// A `Struct` of string fields.
pub fn string_struct(fields: &[(&str, &str)]) -> Struct {
    Struct {
        fields: fields
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    Value {
                        kind: Some(value::Kind::StringValue(v.to_string())),
                    },
                )
            })
            .collect(),
    }
}

/// Packs a message into an `Any`.
pub fn pack<M: Message + Name>(m: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: m.encode_to_vec(),
    }
}

//! Reading a spec message from its proto3 JSON form, with errors that name the failing
//! field (`spec.http[0].timeout`) and say what is wrong in words a config author reads.
//!
//! A leaf: it knows the JSON and the field-error vocabulary of [`crate::config::validate`],
//! nothing of config objects or kinds, so the kind table and the object decoder both use it.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::config::validate::{FieldError, FieldPath, Segment};

/// Reads a spec message, naming the failing field on error.
pub(crate) fn decode_spec<T: DeserializeOwned>(value: &Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let mut segments = vec![Segment::Field("spec".to_string())];
        for segment in e.path().iter() {
            match segment {
                serde_path_to_error::Segment::Seq { index } => {
                    segments.push(Segment::Index(*index));
                }
                serde_path_to_error::Segment::Map { key } => {
                    segments.push(Segment::Field(key.clone()));
                }
                serde_path_to_error::Segment::Enum { variant } => {
                    segments.push(Segment::Field(variant.clone()));
                }
                serde_path_to_error::Segment::Unknown => {}
            }
        }
        let at_value = value_at(value, &segments[1..]);
        let reason = explain(&e.inner().to_string(), at_value);
        FieldError::new(FieldPath::from_segments(segments), reason)
    })
}

/// The JSON value at a path (for error messages).
fn value_at<'a>(mut value: &'a Value, path: &[Segment]) -> Option<&'a Value> {
    for segment in path {
        value = match segment {
            Segment::Field(k) | Segment::Key(k) => value.get(k)?,
            Segment::Index(i) => value.get(i)?,
        };
    }
    Some(value)
}

/// Rewrites serde messages that say little into ones that say what is wrong.
fn explain(message: &str, value: Option<&Value>) -> String {
    let shown = value.map(ToString::to_string).unwrap_or_default();
    if message.contains("did not match any variant of untagged enum")
        || message.contains("invalid digit found in string")
        || message.contains("number too large")
        || message.contains("number too small")
    {
        return format!(
            "invalid number {shown}: not a whole number in the range of this field (e.g. a port or weight \
             cannot be negative)"
        );
    }
    if let Some(field) = message
        .strip_prefix("duplicate field `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        return format!(
            "`{field}` is set together with another field of the same one-of group (for example simple and \
             consistentHash, or exact and prefix); set only one"
        );
    }
    message.to_string()
}

/// "a string", "a list", ... for messages.
pub(crate) fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing (null)",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

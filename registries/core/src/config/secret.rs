//! `kind: Secret` (`apiVersion: v1`) objects of the config directory: gateway
//! credentials for SDS where there is no Kubernetes. Read as the API server reads
//! them: `data` values base64 (standard alphabet, padded), `stringData` values text
//! laid over `data`, keys of `[-._a-zA-Z0-9]`. A Secret that breaks these rules is
//! rejected alone, with the field, like any other config object.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::config::validate::{FieldError, FieldPath};

/// A Secret's content as SDS reads it: its type and its keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecretData {
    /// `type` (empty when not set).
    pub secret_type: String,
    /// The keys and their bytes (`data`, with `stringData` on top).
    pub data: BTreeMap<String, Vec<u8>>,
}

/// A Secret of the config directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretObject {
    pub namespace: String,
    pub name: String,
    /// `path:line`.
    pub source: String,
    pub content: SecretData,
}

/// Whether an object is a Secret (`apiVersion: v1`, `kind: Secret`).
pub fn is_secret(api_version: &str, kind: &str) -> bool {
    api_version == "v1" && kind == "Secret"
}

/// Reads the fields of a Secret other than its metadata (`namespace` and `name` are
/// read by the caller). Errors name the field.
pub fn decode_secret(map: &Map<String, Value>) -> Result<SecretData, Vec<FieldError>> {
    let root = FieldPath::root();
    let mut errors = Vec::new();
    let mut out = SecretData::default();
    match map.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) => out.secret_type = t.clone(),
        Some(_) => errors.push(FieldError::new(root.field("type"), "type must be a string")),
    }
    for (field, base64) in [("data", true), ("stringData", false)] {
        let entries = match map.get(field) {
            None | Some(Value::Null) => continue,
            Some(Value::Object(entries)) => entries,
            Some(_) => {
                errors.push(FieldError::new(
                    root.field(field),
                    format!("{field} must be a mapping of keys to strings"),
                ));
                continue;
            }
        };
        for (key, value) in entries {
            let at = root.field(field).key(key);
            if !valid_key(key) {
                errors.push(FieldError::new(
                    at,
                    format!("invalid key {key:?}: keys are made of -, ., _ and alphanumerics"),
                ));
                continue;
            }
            let Some(text) = value.as_str() else {
                errors.push(FieldError::new(at, "must be a string"));
                continue;
            };
            if base64 {
                match decode_base64(text) {
                    Some(bytes) => {
                        out.data.insert(key.clone(), bytes);
                    }
                    None => errors.push(FieldError::new(at, "not valid base64")),
                }
            } else {
                out.data.insert(key.clone(), text.as_bytes().to_vec());
            }
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

/// Standard base64 with padding (what Kubernetes writes and reads); `None` for
/// anything else.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let chunks = bytes.chunks(4).count();
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let padding = chunk.iter().rev().take_while(|c| **c == b'=').count();
        if padding > 2 || (padding > 0 && i + 1 != chunks) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - padding] {
            n = (n << 6) | value(c)?;
        }
        n <<= 6 * padding as u32;
        let decoded = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&decoded[..3 - padding]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn base64_is_standard_and_padded() {
        assert_eq!(decode_base64("").unwrap(), b"");
        assert_eq!(decode_base64("YQ==").unwrap(), b"a");
        assert_eq!(decode_base64("YWI=").unwrap(), b"ab");
        assert_eq!(decode_base64("YWJj").unwrap(), b"abc");
        assert_eq!(decode_base64("+/8=").unwrap(), [0xfb, 0xff]);
        for bad in ["YQ", "Y===", "YQ==YWJj", "YW J", "YW-j"] {
            assert_eq!(decode_base64(bad), None, "{bad}");
        }
    }

    #[test]
    fn data_and_string_data_are_read_and_bad_fields_named() {
        let map = json!({
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"},
            "stringData": {"tls.key": "text key"},
        });
        let data = decode_secret(map.as_object().unwrap()).unwrap();
        assert_eq!(data.secret_type, "kubernetes.io/tls");
        assert_eq!(data.data["tls.crt"], b"cert");
        assert_eq!(data.data["tls.key"], b"text key");
        let bad = json!({"data": {"tls.crt": "not base64!", "bad key": "YQ==", "n": 1}});
        let errors: Vec<String> = decode_secret(bad.as_object().unwrap())
            .unwrap_err()
            .iter()
            .map(|e| e.field.to_string())
            .collect();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors.iter().any(|f| f.contains("tls.crt")), "{errors:?}");
    }
}

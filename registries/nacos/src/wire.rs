//! Nacos's wire shapes as this client reads and writes them.
//!
//! gRPC: every message is a [`Payload`] whose `metadata.type` is the request or
//! response class name and whose `body.value` is its JSON (`headers` empty: the
//! headers travel in `metadata.headers`). Requests carry `requestId`, `module` and,
//! for naming, `namespace`, `groupName`, `serviceName`; responses carry
//! `resultCode` (200 or 500), `errorCode`, `message` and `requestId`.
//!
//! Both transports answer instances as a `ServiceInfo` (`name`, `groupName`,
//! `hosts`, `lastRefTime`, ...); its hosts are kept as raw JSON so that one malformed
//! instance is skipped without losing the others ([`Instance::parse`]).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};

/// The generated Payload envelope (from `proto/nacos_grpc_service.proto`).
#[allow(missing_docs, clippy::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/_.rs"));
}

pub use pb::{Metadata, Payload};

/// gRPC path of the unary call.
pub const REQUEST_PATH: &str = "/Request/request";
/// gRPC path of the bidirectional stream.
pub const BI_STREAM_PATH: &str = "/BiRequestStream/requestBiStream";

/// Error code of a request on a connection the server has not registered (yet).
pub const UN_REGISTER: i64 = 301;

/// A Payload of type `kind` with `headers` and JSON `body`.
pub fn payload(
    kind: &str,
    client_ip: &str,
    headers: BTreeMap<String, String>,
    body: &Value,
) -> Payload {
    Payload {
        metadata: Some(Metadata {
            r#type: kind.to_string(),
            client_ip: client_ip.to_string(),
            headers,
        }),
        body: Some(prost_types::Any {
            type_url: String::new(),
            value: serde_json::to_vec(body).expect("JSON values serialise"),
        }),
    }
}

/// The type and JSON body of a Payload.
pub fn open(payload: &Payload) -> Result<(String, Value), String> {
    let kind = payload
        .metadata
        .as_ref()
        .map(|m| m.r#type.clone())
        .unwrap_or_default();
    let body = payload.body.as_ref().map_or(&[][..], |b| &b.value[..]);
    let value = serde_json::from_slice(body)
        .map_err(|e| format!("the body of a {kind:?} payload is not JSON: {e}"))?;
    Ok((kind, value))
}

/// A request body: `headers` empty, `module`, and the fields given.
pub fn request(module: &str, request_id: Option<&str>, fields: Value) -> Value {
    let mut body = json!({"headers": {}, "requestId": request_id, "module": module});
    if let (Some(body), Value::Object(fields)) = (body.as_object_mut(), fields) {
        body.extend(fields);
    }
    body
}

/// A successful response body to the server's request `request_id`.
pub fn response(request_id: &str) -> Value {
    json!({
        "resultCode": 200, "errorCode": 0, "message": null,
        "requestId": request_id, "success": true,
    })
}

/// A response's failure: `resultCode` other than 200, or an `ErrorResponse`.
pub fn failure(kind: &str, body: &Value) -> Option<(i64, String)> {
    let result = body["resultCode"].as_i64().unwrap_or(200);
    if result == 200 && kind != "ErrorResponse" {
        return None;
    }
    let code = body["errorCode"].as_i64().unwrap_or(result);
    let message = body["message"].as_str().unwrap_or("").to_string();
    Some((code, message))
}

/// A service's instances as Nacos answers them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceInfo {
    /// `lastRefTime`: when the server produced it (ms); newer replaces older.
    pub last_ref_time: i64,
    /// Raw hosts.
    pub hosts: Vec<Value>,
}

impl ServiceInfo {
    /// Reads a `ServiceInfo` JSON object (`hosts` null or missing: none).
    pub fn parse(value: &Value) -> Result<ServiceInfo, String> {
        if !value.is_object() {
            return Err("the service info is not a JSON object".into());
        }
        let hosts = match &value["hosts"] {
            Value::Null => Vec::new(),
            Value::Array(hosts) => hosts.clone(),
            other => return Err(format!("hosts is not an array: {other}")),
        };
        Ok(ServiceInfo {
            last_ref_time: value["lastRefTime"].as_i64().unwrap_or(0),
            hosts,
        })
    }

    /// `(group, service)` of a `ServiceInfo`: `groupName` and `name`, where `name`
    /// may be grouped (`DEFAULT_GROUP@@web`, as the 1.x API writes it).
    pub fn names(value: &Value) -> Option<(String, String)> {
        let name = value["name"].as_str()?;
        match name.split_once("@@") {
            Some((group, service)) => Some((group.to_string(), service.to_string())),
            None => Some((value["groupName"].as_str()?.to_string(), name.to_string())),
        }
    }
}

/// One Nacos instance.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// Instance id (`ip#port#cluster#group@@service`).
    #[serde(default)]
    pub instance_id: Option<String>,
    /// Address.
    pub ip: String,
    /// Port.
    pub port: u16,
    /// Weight (0 to 10000; 0 takes it out of traffic).
    #[serde(default = "one")]
    pub weight: f64,
    /// Health as Nacos judges it.
    #[serde(default = "yes")]
    pub healthy: bool,
    /// `false`: taken out of traffic by an operator.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Ephemeral (client heartbeats) or persistent (server health checks).
    #[serde(default = "yes")]
    pub ephemeral: bool,
    /// Nacos cluster.
    #[serde(default, deserialize_with = "null_default")]
    pub cluster_name: String,
    /// Metadata.
    #[serde(default, deserialize_with = "null_default")]
    pub metadata: BTreeMap<String, String>,
}

fn one() -> f64 {
    1.0
}

fn yes() -> bool {
    true
}

fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

impl Instance {
    /// Decodes one raw host.
    pub fn parse(raw: &Value) -> Result<Instance, String> {
        Instance::deserialize(raw).map_err(|e| e.to_string())
    }

    /// A name for messages: the instance id, else `ip:port`.
    pub fn describe(raw: &Value) -> String {
        match raw["instanceId"].as_str() {
            Some(id) if !id.is_empty() => id.to_string(),
            _ => format!("{}:{}", raw["ip"], raw["port"]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_type_headers_and_json() {
        let headers = BTreeMap::from([("accessToken".to_string(), "t".to_string())]);
        let p = payload(
            "ServerCheckRequest",
            "10.0.0.9",
            headers,
            &request("internal", None, json!({})),
        );
        let (kind, body) = open(&p).unwrap();
        assert_eq!(kind, "ServerCheckRequest");
        assert_eq!(
            body,
            json!({"headers": {}, "requestId": null, "module": "internal"})
        );
        assert_eq!(p.metadata.unwrap().headers["accessToken"], "t");
    }

    #[test]
    fn failures_are_read_from_result_and_error_codes() {
        assert_eq!(failure("HealthCheckResponse", &response("1")), None);
        let denied = json!({"resultCode": 500, "errorCode": 403, "message": "token invalid!"});
        assert_eq!(
            failure("SubscribeServiceResponse", &denied),
            Some((403, "token invalid!".into()))
        );
        let error = json!({"resultCode": 500, "errorCode": 301, "message": "unregistered"});
        assert_eq!(failure("ErrorResponse", &error).unwrap().0, UN_REGISTER);
    }

    #[test]
    fn service_info_names_and_hosts() {
        let v = json!({"name": "DEFAULT_GROUP@@web", "groupName": "DEFAULT_GROUP",
                       "hosts": [{"ip": "10.0.0.1", "port": 80}], "lastRefTime": 7});
        assert_eq!(
            ServiceInfo::names(&v),
            Some(("DEFAULT_GROUP".into(), "web".into()))
        );
        let info = ServiceInfo::parse(&v).unwrap();
        assert_eq!((info.last_ref_time, info.hosts.len()), (7, 1));
        let i = Instance::parse(&info.hosts[0]).unwrap();
        assert!(i.healthy && i.enabled && i.weight == 1.0 && i.cluster_name.is_empty());
        assert!(Instance::parse(&json!({"ip": "x", "port": 70000})).is_err());
        let v = json!({"name": "web", "groupName": "G", "hosts": null});
        assert_eq!(ServiceInfo::names(&v), Some(("G".into(), "web".into())));
        assert!(ServiceInfo::parse(&v).unwrap().hosts.is_empty());
    }
}

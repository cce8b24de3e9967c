//! The HTTP side of the fake Eureka: the accept loop, routing, basic auth and
//! Eureka's JSON shapes.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{RecordedRequest, Registered, Shared, State};

/// Accepts connections until aborted; aborting drops every connection with it.
pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req| handle(shared.clone(), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, content_type: Option<&str>, body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    if let Some(ct) = content_type {
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_str(ct).expect("static content types are valid"),
        );
    }
    response
}

/// Spring Boot's error body, as Spring Security's filters answer.
fn spring_error(status: StatusCode, path: &str) -> Reply {
    let body = json!({
        "timestamp": "2026-01-01T00:00:00.000+00:00",
        "status": status.as_u16(),
        "error": status.canonical_reason().unwrap_or(""),
        "path": path,
    });
    let mut r = reply(status, Some("application/json"), body.to_string());
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"Realm\""),
        );
    }
    r
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut buffer, mut bits) = (0u32, 0u32);
    for c in s.trim().bytes().filter(|c| *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c)? as u32;
        buffer = (buffer << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    Some(out)
}

fn basic_credentials(header: Option<&str>) -> Option<(String, String)> {
    let encoded = header?.strip_prefix("Basic ")?;
    let decoded = String::from_utf8(base64_decode(encoded)?).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Reply, Infallible> {
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .map(str::to_string)
    };
    let request = RecordedRequest {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        authorization: header(AUTHORIZATION),
        accept: header(ACCEPT),
        at: Instant::now(),
    };
    let mut st = shared.lock();
    st.requests.push(request.clone());
    if req.method() != Method::GET {
        return Ok(reply(StatusCode::METHOD_NOT_ALLOWED, None, ""));
    }
    if let Some(status) = st.failing {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return Ok(spring_error(status, &request.path));
    }
    if let Some(required) = &st.credentials
        && basic_credentials(request.authorization.as_deref()).as_ref() != Some(required)
    {
        return Ok(spring_error(StatusCode::UNAUTHORIZED, &request.path));
    }
    if st.forbidden {
        return Ok(spring_error(StatusCode::FORBIDDEN, &request.path));
    }
    let delta = match request.path.trim_end_matches('/') {
        "/eureka/apps" => false,
        "/eureka/apps/delta" => true,
        _ => return Ok(reply(StatusCode::NOT_FOUND, None, "")),
    };
    // Eureka's own refusals: no body at all.
    if st.not_ready || (delta && st.delta_disabled) {
        return Ok(reply(StatusCode::FORBIDDEN, None, ""));
    }
    let body = if delta {
        delta_body(&mut st)
    } else {
        full_body(&st)
    };
    Ok(reply(
        StatusCode::OK,
        Some("application/json"),
        serde_json::to_vec(&body).expect("JSON values serialise"),
    ))
}

fn list(xstream: bool, mut items: Vec<Value>) -> Value {
    if xstream && items.len() == 1 {
        items.pop().expect("one item")
    } else {
        Value::Array(items)
    }
}

fn applications(st: &State, apps: Vec<(String, Vec<Value>)>) -> Value {
    let application: Vec<Value> = apps
        .into_iter()
        .map(|(name, instances)| json!({"name": name, "instance": list(st.xstream, instances)}))
        .collect();
    let version = if st.xstream {
        json!(st.version)
    } else {
        json!(st.version.to_string())
    };
    json!({"applications": {
        "versions__delta": version,
        "apps__hashcode": st.hash_code(),
        "application": list(st.xstream, application),
    }})
}

pub(super) fn full_body_len(st: &State) -> usize {
    serde_json::to_vec(&full_body(st))
        .expect("JSON values serialise")
        .len()
}

fn full_body(st: &State) -> Value {
    let apps = st
        .apps
        .iter()
        .map(|(name, instances)| {
            let list = instances
                .values()
                .map(|r| instance_json(st, r, "ADDED"))
                .collect();
            (name.clone(), list)
        })
        .collect();
    applications(st, apps)
}

fn delta_body(st: &mut State) -> Value {
    let now = Instant::now();
    let retention = st.retention;
    st.recent
        .retain(|(_, c)| now.saturating_duration_since(c.at) <= retention);
    let mut apps: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for ((app, _), change) in &st.recent {
        apps.entry(app.clone())
            .or_default()
            .push(instance_json(st, &change.entry, change.action));
    }
    applications(st, apps.into_iter().collect())
}

fn instance_json(st: &State, r: &Registered, action: &str) -> Value {
    let i = &r.instance;
    let port = |(number, enabled): (u16, bool)| {
        if st.xstream {
            json!({"@enabled": enabled.to_string(), "$": number.to_string()})
        } else {
            json!({"$": number, "@enabled": enabled.to_string()})
        }
    };
    let metadata = if i.metadata.is_empty() {
        json!({"@class": "java.util.Collections$EmptyMap"})
    } else {
        json!(i.metadata)
    };
    let data_center = match &i.aws_zone {
        Some(zone) => json!({
            "@class": "com.netflix.appinfo.AmazonInfo",
            "name": "Amazon",
            "metadata": {"instance-id": i.id, "availability-zone": zone, "local-ipv4": i.ip},
        }),
        None => json!({
            "@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo",
            "name": "MyOwn",
        }),
    };
    let vip = i.app.to_ascii_lowercase();
    let base = format!("http://{}:{}/", i.host_name, i.port.0);
    let mut v = json!({
        "instanceId": i.id,
        "hostName": i.host_name,
        "app": i.app,
        "ipAddr": i.ip,
        "status": i.status.as_str(),
        "port": port(i.port),
        "securePort": port(i.secure_port),
        "countryId": 1,
        "dataCenterInfo": data_center,
        "leaseInfo": {
            "renewalIntervalInSecs": 30,
            "durationInSecs": 90,
            "registrationTimestamp": r.registered_ms,
            "lastRenewalTimestamp": r.updated_ms,
            "evictionTimestamp": 0,
            "serviceUpTimestamp": r.registered_ms,
        },
        "metadata": metadata,
        "homePageUrl": base,
        "statusPageUrl": format!("{base}actuator/info"),
        "healthCheckUrl": format!("{base}actuator/health"),
        "vipAddress": vip,
        "secureVipAddress": vip,
        "isCoordinatingDiscoveryServer": "false",
        "lastUpdatedTimestamp": r.updated_ms.to_string(),
        "lastDirtyTimestamp": r.updated_ms.to_string(),
        "actionType": action,
    });
    let overridden = if st.xstream {
        "overriddenstatus"
    } else {
        "overriddenStatus"
    };
    v[overridden] = json!(i.overridden.as_str());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_decodes() {
        assert_eq!(
            basic_credentials(Some("Basic dXNlcjpwQHNzOndvcmQ=")),
            Some(("user".into(), "p@ss:word".into()))
        );
        assert_eq!(basic_credentials(Some("Bearer x")), None);
    }
}

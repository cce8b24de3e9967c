//! What the API server does for service accounts beyond storing objects: the
//! `TokenRequest` subresource (`POST .../serviceaccounts/<name>/token`) and the token
//! controller that fills a Secret of type `kubernetes.io/service-account-token`.
//!
//! Tokens are minted into the same table as [`super::FakeApiServer::issue_token`], so
//! a `TokenReview` of one and a client using one as its bearer token behave as with
//! any other. The token controller fills the Secret when it is created (the real one
//! does it moments later; clients that wait for the data find it at once).

use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::ApiState;
use super::response::{json_response, status};
use super::tokens::{API_SERVER_AUDIENCE, IssuedToken};

/// The `ca.crt` the token controller puts into service-account token Secrets: a
/// self-signed certificate (the fake serves plain HTTP, so nothing verifies against
/// it, but clients that parse the bundle get a real certificate).
pub const FAKE_CLUSTER_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBkTCCATegAwIBAgIUEwburpLgxJFLW+Lpy6Aa/JI+qYowCgYIKoZIzj0EAwIw
HTEbMBkGA1UEAwwSZmFrZS1rdWJlcm5ldGVzLWNhMCAXDTI2MTEyNzEwMjg0NVoY
DzIxMjYxMTAzMTAyODQ1WjAdMRswGQYDVQQDDBJmYWtlLWt1YmVybmV0ZXMtY2Ew
WTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAAStqklaajqz9IotvGNDd2lE0e7321KV
/Vh9zeiLa7SWmJlytlBC53gBK6Jad1CGEkvz/nuemL3fKqrlwBuqvEXco1MwUTAd
BgNVHQ4EFgQUkytD8aoUYBLjLd5s2VD4WT/YPlIwHwYDVR0jBBgwFoAUkytD8aoU
YBLjLd5s2VD4WT/YPlIwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNIADBF
AiEAs84xzQ6s6NURzl7S+14eqaSkZgUESaRJDJ/Sv9YAq5ICIF9lfkbFCDDSxcWO
6WYJPuK0K8dXsedZlfiEhjaBAp2n
-----END CERTIFICATE-----
";

/// The annotation naming a token Secret's service account.
const SERVICE_ACCOUNT_NAME: &str = "kubernetes.io/service-account.name";
/// The Secret type the token controller fills.
const TOKEN_SECRET_TYPE: &str = "kubernetes.io/service-account-token";
/// The API server's floor for `expirationSeconds` (10 minutes).
const MIN_EXPIRATION_SECONDS: i64 = 600;
/// Its default (1 hour).
const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// How long a legacy token Secret's token is valid in the fake (they never expire).
const LEGACY_TOKEN_LIFETIME: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `(namespace, service account)` when `path` is a TokenRequest:
/// `/api/v1/namespaces/<ns>/serviceaccounts/<name>/token`.
pub(super) fn token_request_target(path: &str) -> Option<(String, String)> {
    match path
        .trim_matches('/')
        .split('/')
        .collect::<Vec<_>>()
        .as_slice()
    {
        [
            "api",
            "v1",
            "namespaces",
            ns,
            "serviceaccounts",
            name,
            "token",
        ] => Some((ns.to_string(), name.to_string())),
        _ => None,
    }
}

fn service_account_exists(state: &ApiState, namespace: &str, name: &str) -> bool {
    state
        .collections
        .get("/api/v1/serviceaccounts")
        .is_some_and(|c| {
            c.objects
                .contains_key(&(namespace.to_string(), name.to_string()))
        })
}

/// `POST .../serviceaccounts/<name>/token`: a token for the account with the
/// requested audiences (the API server's own when none) and lifetime, answered
/// `201 Created` with the request and its `status`, as the API server does.
pub(super) fn token_request(
    state: &mut ApiState,
    namespace: &str,
    name: &str,
    body: &[u8],
) -> Response {
    if !service_account_exists(state, namespace, name) {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("serviceaccounts {name:?} not found"),
        );
    }
    let Ok(mut request) = serde_json::from_slice::<Value>(body) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the body is not a JSON object".into(),
        );
    };
    let seconds = request["spec"]["expirationSeconds"]
        .as_i64()
        .unwrap_or(DEFAULT_EXPIRATION_SECONDS);
    if seconds < MIN_EXPIRATION_SECONDS {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!(
                "TokenRequest.authentication.k8s.io {name:?} is invalid: spec.expirationSeconds: \
                 Invalid value: {seconds}: may not specify a duration less than 10 minutes"
            ),
        );
    }
    let mut audiences: Vec<String> = request["spec"]["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    if audiences.is_empty() {
        audiences.push(API_SERVER_AUDIENCE.to_string());
    }
    let expires = SystemTime::now() + Duration::from_secs(seconds.unsigned_abs());
    let token = state.tokens.issue(IssuedToken {
        namespace: namespace.to_string(),
        service_account: name.to_string(),
        audiences: audiences.clone(),
        expires,
        pod: None,
    });
    let expiration = k8s_openapi::jiff::Timestamp::try_from(expires)
        .map(|t| t.to_string())
        .unwrap_or_default();
    request["apiVersion"] = json!("authentication.k8s.io/v1");
    request["kind"] = json!("TokenRequest");
    request["metadata"] = json!({"name": name, "namespace": namespace, "creationTimestamp": null});
    request["spec"]["audiences"] = json!(audiences);
    request["spec"]["expirationSeconds"] = json!(seconds);
    request["status"] = json!({"token": token, "expirationTimestamp": expiration});
    json_response(StatusCode::CREATED, &request)
}

/// The token controller: a Secret of type `kubernetes.io/service-account-token` whose
/// annotation names an existing service account of its namespace gets `token`,
/// `ca.crt` and `namespace` (base64, as `data` is). Anything else is left alone.
pub(super) fn fill_token_secret(state: &mut ApiState, namespace: &str, secret: &mut Value) {
    if secret["type"] != TOKEN_SECRET_TYPE {
        return;
    }
    let Some(account) = secret["metadata"]["annotations"][SERVICE_ACCOUNT_NAME]
        .as_str()
        .map(str::to_string)
    else {
        return;
    };
    if !service_account_exists(state, namespace, &account) {
        return;
    }
    let token = state.tokens.issue(IssuedToken {
        namespace: namespace.to_string(),
        service_account: account,
        audiences: vec![API_SERVER_AUDIENCE.to_string()],
        expires: SystemTime::now() + LEGACY_TOKEN_LIFETIME,
        pod: None,
    });
    if !secret["data"].is_object() {
        secret["data"] = json!({});
    }
    secret["data"]["token"] = json!(base64(token.as_bytes()));
    secret["data"]["ca.crt"] = json!(base64(FAKE_CLUSTER_CA.as_bytes()));
    secret["data"]["namespace"] = json!(base64(namespace.as_bytes()));
}

/// Standard base64 with padding (Secret `data` values).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_request_paths_and_base64() {
        assert_eq!(
            token_request_target("/api/v1/namespaces/bar/serviceaccounts/vm/token"),
            Some(("bar".into(), "vm".into()))
        );
        assert_eq!(
            token_request_target("/api/v1/namespaces/bar/serviceaccounts/vm"),
            None
        );
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"caData"), "Y2FEYXRh");
    }
}

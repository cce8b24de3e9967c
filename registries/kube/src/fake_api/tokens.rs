//! Service-account tokens and `TokenReview` for the fake API server.
//!
//! Tests mint tokens with [`super::FakeApiServer::issue_token`] (opaque strings; the
//! fake keeps a table, as the real server keeps the signing key). A token is used two
//! ways, as on a real cluster: reviewed through
//! `POST /apis/authentication.k8s.io/v1/tokenreviews` (answered `201 Created` with the
//! review and its `status`, the way the API server's token authenticators fill it),
//! and as a client's bearer token, which names the user its requests are recorded as.

use std::collections::HashMap;
use std::time::SystemTime;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::response::{json_response, status};

/// The path a `TokenReview` is created at.
pub(super) const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";

/// The audience a token gets when minted without one, and the one a review without
/// `spec.audiences` checks against: the API server's own (its `--api-audiences`).
pub const API_SERVER_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// What a minted token stands for.
#[derive(Clone, Debug)]
pub(super) struct IssuedToken {
    pub(super) namespace: String,
    pub(super) service_account: String,
    pub(super) audiences: Vec<String>,
    pub(super) expires: SystemTime,
    /// The pod the token is bound to: (name, uid).
    pub(super) pod: Option<(String, String)>,
}

impl IssuedToken {
    /// `system:serviceaccount:<ns>:<sa>`.
    pub(super) fn username(&self) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.namespace, self.service_account
        )
    }
}

/// The minted tokens.
#[derive(Debug, Default)]
pub(super) struct TokenTable {
    tokens: HashMap<String, IssuedToken>,
    /// Mints so far, for unique token texts.
    minted: u64,
}

impl TokenTable {
    pub(super) fn issue(&mut self, token: IssuedToken) -> String {
        self.minted += 1;
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in format!("{}/{}/{nanos}", token.username(), self.minted).bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        let text = format!("fake-sa-token.{}.{hash:016x}", self.minted);
        self.tokens.insert(text.clone(), token);
        text
    }

    /// The account a request's `Authorization: Bearer <token>` authenticates as, if
    /// the token is one of ours and valid now.
    pub(super) fn user_of(&self, token: &str) -> Option<String> {
        self.tokens
            .get(token)
            .filter(|t| t.expires > SystemTime::now())
            .map(IssuedToken::username)
    }

    /// `POST .../tokenreviews`: the review as the API server answers it.
    pub(super) fn review(&self, body: &[u8]) -> Response {
        let Ok(mut review) = serde_json::from_slice::<Value>(body) else {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "the body is not a JSON object".into(),
            );
        };
        let token = review["spec"]["token"].as_str().unwrap_or_default();
        if token.is_empty() {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "token is required for TokenReview in authentication".into(),
            );
        }
        let wanted: Vec<String> = review["spec"]["audiences"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        review["status"] = self.status_for(token, &wanted);
        review["apiVersion"] = json!("authentication.k8s.io/v1");
        review["kind"] = json!("TokenReview");
        if review["metadata"].is_null() {
            review["metadata"] = json!({ "creationTimestamp": null });
        }
        json_response(StatusCode::CREATED, &review)
    }

    /// `status` of a review of `token` for `wanted` audiences (the API server's own
    /// when empty): the user on success, else `authenticated: false` and the
    /// authenticators' aggregated error.
    fn status_for(&self, token: &str, wanted: &[String]) -> Value {
        let refused = |why: String| {
            json!({
                "user": {},
                "error": format!("[invalid bearer token, {why}]"),
            })
        };
        let Some(issued) = self.tokens.get(token) else {
            return refused("token is not recognized by the API server".into());
        };
        if issued.expires <= SystemTime::now() {
            return refused("service account token has expired".into());
        }
        let targets = if wanted.is_empty() {
            vec![API_SERVER_AUDIENCE.to_string()]
        } else {
            wanted.to_vec()
        };
        let common: Vec<&String> = targets
            .iter()
            .filter(|a| issued.audiences.contains(a))
            .collect();
        if common.is_empty() {
            // Go's `%q` of a []string: ["a" "b"].
            let quoted = |list: &[String]| {
                let items: Vec<String> = list.iter().map(|a| format!("{a:?}")).collect();
                format!("[{}]", items.join(" "))
            };
            return refused(format!(
                "token audiences {} is invalid for the target audiences {}",
                quoted(&issued.audiences),
                quoted(&targets)
            ));
        }
        let mut user = json!({
            "username": issued.username(),
            "uid": format!("uid-sa-{}-{}", issued.namespace, issued.service_account),
            "groups": [
                "system:serviceaccounts",
                format!("system:serviceaccounts:{}", issued.namespace),
                "system:authenticated",
            ],
        });
        if let Some((name, uid)) = &issued.pod {
            user["extra"] = json!({
                "authentication.kubernetes.io/pod-name": [name],
                "authentication.kubernetes.io/pod-uid": [uid],
            });
        }
        let mut status = json!({ "authenticated": true, "user": user });
        if !wanted.is_empty() {
            status["audiences"] = json!(common);
        } else {
            status["audiences"] = json!([API_SERVER_AUDIENCE]);
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn table() -> (TokenTable, String) {
        let mut table = TokenTable::default();
        let token = table.issue(IssuedToken {
            namespace: "ns".into(),
            service_account: "sa".into(),
            audiences: vec!["istio-ca".into()],
            expires: SystemTime::now() + Duration::from_secs(60),
            pod: None,
        });
        (table, token)
    }

    #[test]
    fn audiences_are_intersected_and_a_miss_names_both_lists() {
        let (table, token) = table();
        let ok = table.status_for(&token, &["istio-ca".into(), "other".into()]);
        assert_eq!(ok["authenticated"], true);
        assert_eq!(ok["audiences"], json!(["istio-ca"]));
        let miss = table.status_for(&token, &["a".into(), "b".into()]);
        assert!(miss["authenticated"].is_null());
        assert_eq!(
            miss["error"],
            r#"[invalid bearer token, token audiences ["istio-ca"] is invalid for the target audiences ["a" "b"]]"#
        );
        let default = table.status_for(&token, &[]);
        assert!(
            default["error"]
                .as_str()
                .unwrap()
                .contains(API_SERVER_AUDIENCE),
            "no audiences: the API server's own, which this token lacks"
        );
    }

    #[test]
    fn tokens_are_distinct_and_name_their_user_while_valid() {
        let (mut table, token) = table();
        let expired = table.issue(IssuedToken {
            namespace: "ns".into(),
            service_account: "old".into(),
            audiences: vec![],
            expires: SystemTime::now() - Duration::from_secs(1),
            pod: None,
        });
        assert_ne!(token, expired);
        assert_eq!(
            table.user_of(&token).as_deref(),
            Some("system:serviceaccount:ns:sa")
        );
        assert_eq!(table.user_of(&expired), None);
        assert_eq!(table.user_of("nope"), None);
    }
}

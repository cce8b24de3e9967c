//! Kubernetes JWT authentication as Istio does it (reference §1.6,
//! `security/pkg/k8s/tokenreview/k8sauthn.go`): a `TokenReview` asks the API server
//! whether a workload's service-account token is valid for the given audiences, and
//! the answer is accepted only for a service account
//! (`system:serviceaccount:<ns>:<sa>` in group `system:serviceaccounts`).

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use kube::Api;
use kube::api::PostParams;

/// The group every service account is in.
const SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";
/// The user extras a pod-bound token carries.
const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";

/// The service account a reviewed token belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReviewedAccount {
    pub namespace: String,
    pub service_account: String,
    /// The pod the token is bound to (a projected token), from the user's extras.
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
}

/// Why a token was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum TokenReviewError {
    /// The review could not be made (the API server refused the request, e.g.
    /// `Forbidden` without RBAC for `tokenreviews`, or was unreachable).
    #[error("creating the TokenReview: {0}")]
    Api(#[from] kube::Error),
    /// The API server answered without a status.
    #[error("the TokenReview has no status")]
    NoStatus,
    /// The API server refused the token; its message (expired, wrong audience, ...).
    #[error("the token was refused: {0}")]
    Refused(String),
    /// The API server did not authenticate the token and gave no reason.
    #[error("the token is not authenticated")]
    NotAuthenticated,
    /// The token belongs to a user that is not a service account.
    #[error(
        "the token is not a service account's: user {user:?} is not in group {SERVICE_ACCOUNTS_GROUP:?}"
    )]
    NotServiceAccount { user: String },
    /// The username is not `system:serviceaccount:<ns>:<sa>`.
    #[error("invalid username {0:?}: not system:serviceaccount:<namespace>:<name>")]
    BadUsername(String),
}

/// Reviews `token` for `audiences` (none: the API server's own) through `client`'s
/// API server and returns the service account it authenticates, with Istio's checks:
/// no `status.error`, authenticated, in group `system:serviceaccounts`, username of
/// exactly four `:`-separated parts.
pub async fn review_token(
    client: &kube::Client,
    token: &str,
    audiences: &[String],
) -> Result<ReviewedAccount, TokenReviewError> {
    let review = TokenReview {
        metadata: Default::default(),
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: (!audiences.is_empty()).then(|| audiences.to_vec()),
        },
        status: None,
    };
    let api: Api<TokenReview> = Api::all(client.clone());
    let answer = api.create(&PostParams::default(), &review).await?;
    account_of(answer.status.ok_or(TokenReviewError::NoStatus)?)
}

/// Istio's checks on a review's status.
fn account_of(status: TokenReviewStatus) -> Result<ReviewedAccount, TokenReviewError> {
    if let Some(error) = status.error.filter(|e| !e.is_empty()) {
        return Err(TokenReviewError::Refused(error));
    }
    if status.authenticated != Some(true) {
        return Err(TokenReviewError::NotAuthenticated);
    }
    let user = status.user.unwrap_or_default();
    let username = user.username.unwrap_or_default();
    let groups = user.groups.unwrap_or_default();
    if !groups.iter().any(|g| g == SERVICE_ACCOUNTS_GROUP) {
        return Err(TokenReviewError::NotServiceAccount { user: username });
    }
    let (namespace, service_account) = match username.split(':').collect::<Vec<_>>()[..] {
        ["system", "serviceaccount", ns, sa] if !ns.is_empty() && !sa.is_empty() => {
            (ns.to_string(), sa.to_string())
        }
        _ => return Err(TokenReviewError::BadUsername(username)),
    };
    let extra = user.extra.unwrap_or_default();
    let first = |key: &str| extra.get(key).and_then(|v| v.first()).cloned();
    Ok(ReviewedAccount {
        namespace,
        service_account,
        pod_name: first(EXTRA_POD_NAME),
        pod_uid: first(EXTRA_POD_UID),
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::authentication::v1::UserInfo;

    use super::*;

    fn status(username: &str, groups: &[&str]) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(true),
            user: Some(UserInfo {
                username: Some(username.into()),
                groups: Some(groups.iter().map(|g| g.to_string()).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_service_accounts_with_four_part_names_pass() {
        let ok = account_of(status(
            "system:serviceaccount:ns:sa",
            &["system:serviceaccounts"],
        ))
        .unwrap();
        assert_eq!(
            (ok.namespace.as_str(), ok.service_account.as_str()),
            ("ns", "sa")
        );
        assert!(matches!(
            account_of(status(
                "system:serviceaccount:ns:sa",
                &["system:authenticated"]
            )),
            Err(TokenReviewError::NotServiceAccount { .. })
        ));
        for bad in [
            "system:serviceaccount:ns",
            "system:serviceaccount:ns:sa:x",
            "system:node:ns:sa",
            "system:serviceaccount::sa",
        ] {
            assert!(
                matches!(
                    account_of(status(bad, &["system:serviceaccounts"])),
                    Err(TokenReviewError::BadUsername(_))
                ),
                "{bad}"
            );
        }
        let mut unauthenticated =
            status("system:serviceaccount:ns:sa", &["system:serviceaccounts"]);
        unauthenticated.authenticated = Some(false);
        assert!(matches!(
            account_of(unauthenticated),
            Err(TokenReviewError::NotAuthenticated)
        ));
        let mut errored = status("system:serviceaccount:ns:sa", &["system:serviceaccounts"]);
        errored.error = Some("boom".into());
        assert!(matches!(account_of(errored), Err(TokenReviewError::Refused(e)) if e == "boom"));
    }
}

//! `SubjectAccessReview` for the fake API server
//! (`POST /apis/authorization.k8s.io/v1/subjectaccessreviews`, answered `201 Created`
//! with the review and its `status`, as the API server's authorizers fill it).
//!
//! Tests grant a user a verb on a resource in a namespace with
//! [`super::FakeApiServer::grant_access`]; anything not granted is denied (a real
//! cluster's RBAC denies by default). Reviews are recorded for assertions.

use std::collections::BTreeSet;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::response::{json_response, status};

/// The path a `SubjectAccessReview` is created at.
pub(super) const SUBJECT_ACCESS_REVIEWS: &str =
    "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// One grant: (user, verb, resource, namespace).
pub(super) type Grant = (String, String, String, String);

/// The grants and the reviews asked.
#[derive(Debug, Default)]
pub(super) struct AccessTable {
    pub(super) grants: BTreeSet<Grant>,
    /// Every review asked: (user, verb, resource, namespace), oldest first.
    pub(super) reviews: Vec<Grant>,
}

impl AccessTable {
    /// `POST .../subjectaccessreviews`: the review with `status.allowed`.
    pub(super) fn review(&mut self, body: &[u8]) -> Response {
        let Ok(mut review) = serde_json::from_slice::<Value>(body) else {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "the body is not a SubjectAccessReview".into(),
            );
        };
        let spec = &review["spec"];
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let attributes = &spec["resourceAttributes"];
        let user = text(&spec["user"]);
        if user.is_empty() || !attributes.is_object() {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "SubjectAccessReview: spec.user and spec.resourceAttributes are required here"
                    .into(),
            );
        }
        let asked = (
            user,
            text(&attributes["verb"]),
            text(&attributes["resource"]),
            text(&attributes["namespace"]),
        );
        let allowed = self.grants.contains(&asked);
        self.reviews.push(asked);
        review["status"] = if allowed {
            json!({"allowed": true, "reason": "granted by the test"})
        } else {
            json!({"allowed": false})
        };
        json_response(StatusCode::CREATED, &review)
    }
}

//! The fake API server's JSON responses: an object or list with its status code, and
//! the API server's `Status` failure body. Shared by the router (`http`) and the
//! handlers it dispatches to (`access`, `tokens`, `rbac`, `custom`).

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

/// A `Status` failure with `code`, its `reason` and `message`.
pub(super) fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    json_response(code, &body)
}

/// `body` as `application/json` with `code`.
pub(super) fn json_response(code: StatusCode, body: &Value) -> Response {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(
            serde_json::to_vec(body).expect("JSON values serialise"),
        ))
        .expect("static response parts are valid")
}

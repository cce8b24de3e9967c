//! The HTTP side of the fake API server: routing each request to its handler, LIST
//! and WATCH (paths are parsed in `path`, responses built in `response`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::access::SUBJECT_ACCESS_REVIEWS;
use super::custom::{CustomView, NotServed, not_found};
use super::selector::Selector;
use super::service_accounts::{fill_token_secret, token_request, token_request_target};
use super::tokens::TOKEN_REVIEWS;
use super::{ApiState, RecordedRequest, Shared, WatchMsg, WatchSub, event_line};

use super::path::{ApiPath, collection_path};
use super::response::{json_response, status};

pub(super) async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
    body: axum::body::Bytes,
) -> Response {
    let mut state = shared.state.lock().expect("fake API state poisoned");
    let user = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|token| state.tokens.user_of(token.trim()));
    let mut request = RecordedRequest {
        method: method.to_string(),
        path: uri.path().to_string(),
        query,
        denied: false,
        user,
    };
    if let Some(policy) = &state.policy {
        let attributes = request.attributes();
        if !policy.allows(&attributes) {
            let answer = policy.forbidden(&attributes);
            request.denied = true;
            state.requests.push(request);
            return answer;
        }
    }
    state.requests.push(request.clone());
    if method == Method::POST && request.path == TOKEN_REVIEWS {
        return state.tokens.review(&body);
    }
    if method == Method::POST && request.path == SUBJECT_ACCESS_REVIEWS {
        return state.access.review(&body);
    }
    if method == Method::POST
        && let Some((namespace, name)) = token_request_target(&request.path)
    {
        return token_request(&mut state, &namespace, &name, &body);
    }
    if method == Method::DELETE {
        return delete(&mut state, &request.path);
    }
    if method == Method::POST || method == Method::PUT {
        return write(&mut state, &request.path, method == Method::POST, &body);
    }
    if method != Method::GET {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("the fake API server does not serve {method}"),
        );
    }
    if let Some(document) = state.discovery(&request.path) {
        return document;
    }
    let Some(mut path) = collection_path(&request.path) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no resource at {}", request.path),
        );
    };
    let custom = match state.resolve_custom(&mut path) {
        Ok(custom) => custom,
        Err(NotServed) => return not_found(),
    };
    let selector = match Selector::parse(&request.query) {
        Ok(selector) => selector,
        Err(message) => return status(StatusCode::BAD_REQUEST, "BadRequest", message),
    };
    if let Some(name) = &path.name {
        let key = (path.namespace.clone().unwrap_or_default(), name.clone());
        return match state
            .collections
            .get(&path.collection)
            .and_then(|c| c.objects.get(&key))
        {
            Some(obj) => match &custom {
                Some(view) => json_response(StatusCode::OK, &view.present(obj)),
                None => json_response(StatusCode::OK, obj),
            },
            None => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("{} {name:?} not found", path.collection),
            ),
        };
    }
    if request.is_watch() {
        watch(&mut state, path, custom, selector, &request.query)
    } else {
        list(&state, &path, custom.as_ref(), &selector, &request.query)
    }
}

/// POST (create) on a collection or PUT (replace) on an object, as the API server
/// does them for built-in kinds: 409 `AlreadyExists` for a create of an existing name,
/// 404 for a replace of a missing one, 409 `Conflict` when a replace names a
/// `resourceVersion` that is no longer current (optimistic concurrency, which leader
/// election relies on).
///
/// Custom resources are written in any served version, under the collection every
/// version shares; their `status` is a subresource, as Istio's CRDs declare it: a
/// replace of the object keeps the stored status, and `PUT .../<name>/status`
/// replaces only the status.
fn write(state: &mut ApiState, path: &str, create: bool, body: &[u8]) -> Response {
    let Some(mut path) = collection_path(path) else {
        return not_found();
    };
    let custom = match state.resolve_custom(&mut path) {
        Ok(custom) => custom.is_some(),
        Err(NotServed) => return not_found(),
    };
    let status_only = match path.subresource.as_deref() {
        None => false,
        Some("status") if custom && !create => true,
        Some(_) => return not_found(),
    };
    let Ok(mut value) = serde_json::from_slice::<Value>(body) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the body is not a JSON object".into(),
        );
    };
    let name = match (create, &path.name) {
        (true, None) => value["metadata"]["name"].as_str().map(str::to_string),
        (false, Some(name)) => Some(name.clone()),
        _ => None,
    };
    let Some(name) = name else {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "POST goes to a collection with metadata.name, PUT to a named object".into(),
        );
    };
    let namespace = path.namespace.clone().unwrap_or_default();
    if !namespace.is_empty() {
        value["metadata"]["namespace"] = json!(namespace);
    }
    if create && path.collection == "/api/v1/secrets" {
        fill_token_secret(state, &namespace, &mut value);
    }
    if create
        && state.require_namespaces
        && !namespace.is_empty()
        && !state
            .collections
            .get("/api/v1/namespaces")
            .is_some_and(|c| c.objects.contains_key(&(String::new(), namespace.clone())))
    {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("namespaces {namespace:?} not found"),
        );
    }
    let key = (namespace, name.clone());
    let existing = state
        .collections
        .get(&path.collection)
        .and_then(|c| c.objects.get(&key))
        .cloned();
    match (create, existing) {
        (true, Some(_)) => {
            return status(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{} {name:?} already exists", path.plural),
            );
        }
        (false, None) => {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("{} {name:?} not found", path.plural),
            );
        }
        (false, Some(old)) => {
            let wanted = value["metadata"]["resourceVersion"].as_str();
            let current = old["metadata"]["resourceVersion"].as_str();
            if wanted.is_some() && wanted != current {
                return status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
                        path.plural
                    ),
                );
            }
            if status_only {
                let mut next = old.clone();
                next["status"] = value["status"].take();
                value = next;
            } else if custom {
                match old.get("status") {
                    Some(kept) => value["status"] = kept.clone(),
                    None => {
                        if let Some(map) = value.as_object_mut() {
                            map.remove("status");
                        }
                    }
                }
                // metadata.generation counts spec changes, as for CRDs with a status
                // subresource.
                let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
                value["metadata"]["generation"] = json!(if value["spec"] == old["spec"] {
                    generation
                } else {
                    generation + 1
                });
            }
        }
        (true, None) => {
            if custom && let Some(map) = value.as_object_mut() {
                map.remove("status");
                value["metadata"]["generation"] = json!(1);
            }
        }
    }
    let api_version = value["apiVersion"]
        .as_str()
        .unwrap_or(&path.api_version)
        .to_string();
    let kind = value["kind"].as_str().unwrap_or_default().to_string();
    state.store(
        path.collection.clone(),
        (api_version, kind),
        key.clone(),
        value,
    );
    let stored = state.collections[&path.collection].objects[&key].clone();
    json_response(
        if create {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        &stored,
    )
}

/// DELETE of a named object: `200` with the object's last state, or `404`.
fn delete(state: &mut ApiState, path: &str) -> Response {
    let Some(mut path) = collection_path(path) else {
        return not_found();
    };
    if state.resolve_custom(&mut path).is_err() || path.subresource.is_some() {
        return not_found();
    }
    let Some(name) = path.name.clone() else {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the fake API server deletes named objects only".into(),
        );
    };
    let key = (path.namespace.clone().unwrap_or_default(), name.clone());
    let last = state
        .collections
        .get(&path.collection)
        .and_then(|c| c.objects.get(&key))
        .cloned();
    match last {
        Some(last) => {
            state.remove(&path.collection, key);
            json_response(StatusCode::OK, &last)
        }
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} {name:?} not found", path.plural),
        ),
    }
}

fn list(
    state: &ApiState,
    path: &ApiPath,
    custom: Option<&CustomView>,
    selector: &Selector,
    query: &BTreeMap<String, String>,
) -> Response {
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let (rv, after) = match query.get("continue") {
        Some(token) => {
            let mut parts = token.splitn(3, '/');
            let rv = parts.next().and_then(|rv| rv.parse::<u64>().ok());
            match (rv, parts.next(), parts.next()) {
                (Some(rv), Some(ns), Some(name)) if rv >= state.oldest => {
                    (rv, Some((ns.to_string(), name.to_string())))
                }
                (Some(_), Some(_), Some(_)) => {
                    return status(
                        StatusCode::GONE,
                        "Expired",
                        "the provided continue parameter is too old".into(),
                    );
                }
                _ => {
                    return status(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        format!("invalid continue token {token:?}"),
                    );
                }
            }
        }
        None => (state.rv, None),
    };
    let collection = state.collections.get(&path.collection);
    let objects = collection.into_iter().flat_map(|c| c.objects.iter());
    let mut items = Vec::new();
    let mut more = None;
    for ((ns, name), obj) in objects {
        if after
            .as_ref()
            .is_some_and(|a| (ns.as_str(), name.as_str()) <= (a.0.as_str(), a.1.as_str()))
            || path.namespace.as_ref().is_some_and(|want| want != ns)
            || !selector.matches(obj)
        {
            continue;
        }
        if limit.is_some_and(|l| items.len() == l) {
            let ((last_ns, last_name), _) = items.last().expect("a full page is not empty");
            more = Some(format!("{rv}/{last_ns}/{last_name}"));
            break;
        }
        let obj = match custom {
            Some(view) => view.present(obj),
            None => obj.clone(),
        };
        items.push(((ns.clone(), name.clone()), obj));
    }
    let kind = match custom {
        Some(view) => view.kind.as_str(),
        None => collection.map(|c| c.kind.as_str()).unwrap_or(""),
    };
    let mut metadata = json!({ "resourceVersion": rv.to_string() });
    if let Some(token) = more {
        metadata["continue"] = json!(token);
    }
    let body = json!({
        "apiVersion": path.api_version,
        "kind": format!("{kind}List"),
        "metadata": metadata,
        "items": items.into_iter().map(|(_, o)| o).collect::<Vec<_>>(),
    });
    json_response(StatusCode::OK, &body)
}

fn watch(
    state: &mut ApiState,
    path: ApiPath,
    custom: Option<CustomView>,
    selector: Selector,
    query: &BTreeMap<String, String>,
) -> Response {
    let (tx, rx) = mpsc::unbounded_channel();
    let collection = state.collections.get(&path.collection);
    let (api_version, kind) = match &custom {
        Some(view) => (view.api_version.clone(), view.kind.clone()),
        None => collection
            .map(|c| (c.api_version.clone(), c.kind.clone()))
            .unwrap_or_else(|| (path.api_version.clone(), String::new())),
    };
    let sub = WatchSub {
        collection: path.collection.clone(),
        namespace: path.namespace.clone(),
        selector,
        bookmarks: query.get("allowWatchBookmarks").map(String::as_str) == Some("true"),
        api_version,
        kind,
        custom,
        tx,
    };
    let from = query
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or("");
    match from {
        // "Any version": a synthetic ADDED for every object, then live changes.
        "" | "0" => {
            for ((ns, _), obj) in collection.into_iter().flat_map(|c| c.objects.iter()) {
                if sub.namespace.as_ref().is_none_or(|want| want == ns) && sub.selector.matches(obj)
                {
                    let _ = sub.tx.send(WatchMsg::Line(sub.line("ADDED", obj)));
                }
            }
        }
        from => {
            let Ok(from) = from.parse::<u64>() else {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("invalid resourceVersion {from:?}"),
                );
            };
            if from < state.oldest {
                // What the API server does for a compacted version: 200, then one
                // ERROR event with a 410 Status, then the end of the stream.
                let gone = json!({
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": format!("too old resource version: {from} ({})", state.oldest),
                    "reason": "Expired",
                    "code": 410,
                });
                let _ = sub.tx.send(WatchMsg::Line(event_line("ERROR", &gone)));
                let _ = sub.tx.send(WatchMsg::End);
                return stream_response(rx, None);
            }
            for change in state.history.iter().filter(|c| c.rv > from) {
                if let Some(line) = sub.event_for(change) {
                    let _ = sub.tx.send(WatchMsg::Line(line));
                }
            }
        }
    }
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    state.watches.push(sub);
    stream_response(rx, timeout)
}

fn stream_response(rx: mpsc::UnboundedReceiver<WatchMsg>, timeout: Option<Duration>) -> Response {
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let lines = futures::stream::unfold(Some(rx), move |rx| async move {
        let mut rx = rx?;
        let msg = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, rx.recv())
                .await
                .unwrap_or(Some(WatchMsg::End)),
            None => rx.recv().await,
        };
        match msg {
            Some(WatchMsg::Line(line)) => Some((Ok(line), Some(rx))),
            Some(WatchMsg::Abort) => Some((Err(std::io::Error::other("watch dropped")), None)),
            Some(WatchMsg::End) | None => None,
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(lines))
        .expect("static response parts are valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_collections() {
        let p = collection_path("/api/v1/namespaces/default/pods").unwrap();
        assert_eq!(p.collection, "/api/v1/pods");
        assert_eq!(p.namespace.as_deref(), Some("default"));
        let p = collection_path("/apis/discovery.k8s.io/v1/endpointslices").unwrap();
        assert_eq!(p.collection, "/apis/discovery.k8s.io/v1/endpointslices");
        assert_eq!(p.api_version, "discovery.k8s.io/v1");
        let p = collection_path("/api/v1/namespaces/istio-system").unwrap();
        assert_eq!(p.collection, "/api/v1/namespaces");
        assert_eq!(p.name.as_deref(), Some("istio-system"));
    }
}

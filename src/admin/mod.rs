//! The admin HTTP surface: `/ready`, `/metrics`, `/version` and the debug endpoints,
//! served under connection limits ([`serve_port`]).
//!
//! Debug endpoints come from one table ([`DEBUG_ENDPOINTS`]) that also drives
//! `/debug/list` (JSON) and `/debug` (HTML index). They answer loopback callers only,
//! unless the server was started with debug access opened. Every dump is sorted so two
//! dumps can be diffed.

pub mod config_dump;
pub mod debug;
mod pprof;
mod serve;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use meshfed_registry::Aggregate;
use prometheus_client::registry::Registry;

use crate::ads::Connections;
use crate::push::Pipeline;

pub use debug::DEBUG_ENDPOINTS;
pub use serve::{AdminLimits, AdminMetrics, AdminPort, CloseReason, serve_port};

/// What the admin handlers read.
#[derive(Clone)]
pub struct AdminState {
    pub aggregate: Arc<Aggregate>,
    pub pipeline: Arc<Pipeline>,
    pub connections: Arc<Connections>,
    pub metrics: Arc<Registry>,
    /// Answer debug requests from non-loopback callers too.
    pub debug_open: bool,
    /// Log level control for `/logging` (absent in embedded use).
    pub log_control: Option<crate::logging::LogControl>,
    /// The Istio config stores (for `/debug/configz` and readiness).
    pub config_stores: Vec<Arc<dyn meshfed_registry::config::ConfigStore>>,
    /// The remote-cluster secret controller, when multicluster is on.
    pub multicluster: Option<Arc<meshfed_kube::SecretController>>,
    /// The generator settings the ADS server uses (`/debug/config_dump` regenerates
    /// with them).
    pub generator: crate::generate::GeneratorOptions,
    /// What `/ready` answers.
    pub readiness: Arc<crate::readiness::Readiness>,
    /// The mesh CA and where it came from (`/debug/ca`), when on.
    pub ca: Option<(Arc<crate::ca::Ca>, String)>,
    /// Gateway credentials (`/debug/sdsz`).
    pub sds: Option<Arc<crate::sds::Sds>>,
    /// The optional duties and what stands in their way (`/debug/duties`).
    pub duties: Arc<meshfed_kube::Duties>,
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState")
            .field("debug_open", &self.debug_open)
            .finish_non_exhaustive()
    }
}

/// Build information for `/version`.
pub fn version_info() -> serde_json::Value {
    serde_json::json!({
        "name": "meshfed",
        "version": env!("CARGO_PKG_VERSION"),
        "rustc_target": std::env::consts::ARCH,
        "os": std::env::consts::OS,
    })
}

/// The `--httpAddr` router: `/ready` and the debug endpoints.
pub fn http_router(state: AdminState) -> Router {
    Router::new()
        .route("/ready", get(ready))
        .merge(debug_router(state.clone()))
        .with_state(state)
}

/// The `--monitoringAddr` router: `/metrics`, `/version` and the debug endpoints.
pub fn monitoring_router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/version", get(|| async { axum::Json(version_info()) }))
        .merge(debug_router(state.clone()))
        .with_state(state)
}

fn debug_router(state: AdminState) -> Router<AdminState> {
    let mut router = Router::new()
        .route("/logging", get(logging).put(logging).post(logging))
        .route("/debug", get(debug_index))
        .route("/debug/list", get(|| async { axum::Json(debug::list()) }))
        .route("/debug/pprof/", get(pprof::index))
        .route("/debug/pprof/profile", get(pprof::cpu))
        .route("/debug/pprof/heap", get(pprof::heap));
    for endpoint in DEBUG_ENDPOINTS {
        router = router.route(&format!("/debug/{}", endpoint.path), get(debug::dispatch));
    }
    router.layer(middleware::from_fn_with_state(state, loopback_only))
}

async fn loopback_only(
    State(state): State<AdminState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    if state.debug_open || peer.ip().is_loopback() {
        return next.run(request).await;
    }
    (
        StatusCode::FORBIDDEN,
        "debug endpoints answer loopback callers only (see --debugAllowRemote)\n",
    )
        .into_response()
}

/// `GET /logging` shows the levels; `PUT|POST /logging?level=scope:level,...` sets them.
async fn logging(
    State(state): State<AdminState>,
    method: axum::http::Method,
    axum::extract::Query(query): axum::extract::Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    let Some(control) = &state.log_control else {
        return (
            StatusCode::NOT_FOUND,
            "log levels are managed by the embedding application\n",
        )
            .into_response();
    };
    if method != axum::http::Method::GET {
        let Some(level) = query.get("level") else {
            return (StatusCode::BAD_REQUEST, "missing ?level=scope:level,...\n").into_response();
        };
        if let Err(err) = control.set(level) {
            return (StatusCode::BAD_REQUEST, format!("{err}\n")).into_response();
        }
        tracing::info!(level = %level, "log levels changed");
    }
    let scopes: Vec<&str> = crate::logging::SCOPES.iter().map(|(s, _)| *s).collect();
    axum::Json(serde_json::json!({"level": control.current(), "scopes": scopes})).into_response()
}

async fn ready(State(state): State<AdminState>) -> Response {
    let pending = state.readiness.pending();
    if pending.is_empty() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("registries not synced: {}\n", pending.join(", ")),
        )
            .into_response()
    }
}

async fn metrics(State(state): State<AdminState>) -> Response {
    let mut body = String::new();
    if let Err(err) = prometheus_client::encoding::text::encode(&mut body, &state.metrics) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {err}"),
        )
            .into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn debug_index() -> Html<String> {
    let mut html = String::from(
        "<!DOCTYPE html><html><head><title>meshfed debug</title></head><body><h1>meshfed debug endpoints</h1><table>",
    );
    for e in DEBUG_ENDPOINTS {
        html.push_str(&format!(
            "<tr><td><a href=\"/debug/{0}\">/debug/{0}</a></td><td>{1}</td></tr>",
            e.path, e.description
        ));
    }
    html.push_str(
        "<tr><td><a href=\"/debug/pprof/\">/debug/pprof/</a></td><td>Profiles in pprof's format: \
         CPU (<code>profile?seconds=N</code>) and live heap (<code>heap</code>)</td></tr>",
    );
    html.push_str("</table></body></html>");
    Html(html)
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use axum::body::Body;
    use axum::http::Request as HttpRequest;
    use tower::ServiceExt;

    use super::*;
    use crate::push::PushMetrics;
    use crate::push::config_index::ConfigIndex;

    fn state(debug_open: bool) -> AdminState {
        let mut registry = Registry::default();
        let aggregate = Arc::new(Aggregate::new("c1"));
        let connections = Arc::new(Connections::default());
        let pipeline = Arc::new(Pipeline::new(
            aggregate.clone(),
            Arc::default(),
            connections.clone(),
            Arc::new(PushMetrics::new(&mut registry)),
            Arc::default(),
            Arc::new(|_| ConfigIndex::default()),
        ));
        AdminState {
            readiness: Arc::new(crate::readiness::Readiness::new(
                aggregate.clone(),
                Vec::new(),
                None,
                "c1".into(),
                std::time::Duration::from_secs(30),
            )),
            aggregate,
            pipeline,
            connections,
            metrics: Arc::new(registry),
            debug_open,
            log_control: None,
            config_stores: Vec::new(),
            ca: None,
            sds: None,
            duties: Arc::default(),
            multicluster: None,
            generator: Default::default(),
        }
    }

    async fn status(router: Router, peer: &str, path: &str) -> StatusCode {
        let peer: SocketAddr = peer.parse().unwrap();
        let request = HttpRequest::builder()
            .uri(path)
            .extension(ConnectInfo(peer))
            .body(Body::empty())
            .unwrap();
        router.oneshot(request).await.unwrap().status()
    }

    #[tokio::test]
    async fn debug_endpoints_answer_loopback_only_unless_opened() {
        let closed = http_router(state(false));
        assert_eq!(
            status(closed.clone(), "127.0.0.1:40000", "/debug/adsz").await,
            StatusCode::OK
        );
        assert_eq!(
            status(closed.clone(), "[::1]:40000", "/debug/list").await,
            StatusCode::OK
        );
        assert_eq!(
            status(closed.clone(), "10.1.2.3:40000", "/debug/adsz").await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            status(closed.clone(), "10.1.2.3:40000", "/debug/list").await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            status(closed, "10.1.2.3:40000", "/ready").await,
            StatusCode::OK,
            "/ready is not a debug endpoint"
        );
        let open = http_router(state(true));
        assert_eq!(
            status(open, "10.1.2.3:40000", "/debug/adsz").await,
            StatusCode::OK
        );
    }
}

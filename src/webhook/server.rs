//! HTTPS serving of the webhook: TLS with the control plane's serving certificate
//! (the configuration in force at each handshake, so reloads apply to new
//! connections), HTTP/1.1 or HTTP/2 as the API server negotiates, and istiod's answers
//! to bad requests.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use super::WebhookMetrics;
use super::review::{MAX_BODY_BYTES, Verdict, review};
use crate::ads::limit::LogLimiter;
use crate::drain::Shutdown;
use crate::tls::SecureTls;

/// Connections held at once; one more is closed at accept.
const MAX_CONNECTIONS: usize = 1024;
/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may take to send a request's headers (Go's ReadTimeout of
/// istiod's HTTPS server, 30 s).
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// The webhook's HTTP routes: `/validate` and everything under `/validate/` (istiod's
/// two patterns).
pub fn router(metrics: WebhookMetrics) -> Router {
    Router::new()
        .route("/validate", any(validate))
        .route("/validate/", any(validate))
        .route("/validate/{*rest}", any(validate))
        .with_state(Arc::new(metrics))
}

async fn validate(
    State(metrics): State<Arc<WebhookMetrics>>,
    headers: HeaderMap,
    request: Request<Body>,
) -> Response {
    let body = match axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES).await {
        Ok(body) => body,
        Err(err) => {
            metrics.http_error(400);
            let text = if std::error::Error::source(&err)
                .is_some_and(|s| s.to_string().contains("length limit"))
                || err.to_string().contains("length limit")
            {
                format!("Request entity too large: limit is {MAX_BODY_BYTES}")
            } else {
                err.to_string()
            };
            return plain_error(StatusCode::BAD_REQUEST, &text);
        }
    };
    if body.is_empty() {
        metrics.http_error(400);
        return plain_error(StatusCode::BAD_REQUEST, "no body found");
    }
    if headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        != Some("application/json")
    {
        metrics.http_error(415);
        return plain_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid Content-Type, want `application/json`",
        );
    }
    let (answer, verdict) = review(&body);
    metrics.record(&verdict);
    log_verdict(&answer.response, &verdict);
    match serde_json::to_vec(&answer) {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(err) => {
            metrics.http_error(500);
            plain_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("could encode response: {err}"),
            )
        }
    }
}

fn log_verdict(response: &super::review::AdmissionResponse, verdict: &Verdict) {
    let message = response.status.as_ref().map(|s| s.message.as_str());
    match verdict {
        Verdict::Failed {
            reason, dry_run, ..
        } => {
            let dry = if *dry_run { " (dry run)" } else { "" };
            debug!(uid = %response.uid, reason = reason.label(), "admission review not passed{dry}: {}", message.unwrap_or("allowed"));
        }
        Verdict::Undecodable => debug!("undecodable admission review: {}", message.unwrap_or("")),
        Verdict::Passed { .. } => {}
    }
}

/// Go's `http.Error`: plain text with a trailing newline.
fn plain_error(status: StatusCode, text: &str) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        format!("{text}\n"),
    )
        .into_response()
}

/// Serves `router` over TLS on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<SecureTls>,
    router: Router,
    mut shutdown: Shutdown,
) {
    let log = Arc::new(LogLimiter::new(5, Duration::from_secs(10)));
    let mut tasks = JoinSet::new();
    info!(addr = ?listener.local_addr().ok(), "validating webhook serving /validate");
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.wait() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                if let Some(suppressed) = log.allow() {
                    warn!(suppressed, "accepting a webhook connection failed: {err}");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Accept is never gated: each connection is a task with its own handshake
        // deadline, and one over the cap is closed at once.
        while tasks.try_join_next().is_some() {}
        if tasks.len() >= MAX_CONNECTIONS {
            if let Some(suppressed) = log.allow() {
                warn!(%peer, suppressed, "webhook connection closed at accept: {MAX_CONNECTIONS} connections open");
            }
            drop(tcp);
            continue;
        }
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
        let router = router.clone();
        let mut stop = shutdown.clone();
        let log = log.clone();
        let tls = tls.clone();
        tasks.spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(err)) => {
                    tls.handshake_errors.inc();
                    if let Some(suppressed) = log.allow() {
                        warn!(%peer, suppressed, "TLS handshake on the webhook port failed: {err}");
                    }
                    return;
                }
                Err(_) => {
                    tls.handshake_errors.inc();
                    return;
                }
            };
            let mut builder = Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let service = TowerToHyperService::new(router);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(err) = result {
                        debug!(%peer, "webhook connection ended: {err}");
                    }
                }
                () = stop.wait() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(5), connection).await;
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

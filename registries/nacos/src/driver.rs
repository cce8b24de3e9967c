//! The loops that read Nacos, one per namespace (Nacos pushes name a service's group
//! but not its namespace, so each namespace has a connection of its own, as Nacos's
//! clients do): a gRPC session ([`crate::grpc`]) or an HTTP polling round, chosen by
//! [`Transport`], retried with backoff across the server list. What they learn goes
//! to the writer as [`Report`]s.
//!
//! With `Transport::Auto`, every attempt starts with gRPC; when no gRPC session can be
//! set up (nothing answers `ServerCheckRequest` at the gRPC port: a 1.x server, or the
//! port not exposed), one HTTP round is run instead and gRPC is tried again after the
//! refresh interval. The writer logs each change of transport.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt, stream};
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::api::{ApiError, NacosHttp};
use crate::auth::Auth;
use crate::config::{NacosConfig, Transport};
use crate::convert::{ServiceName, check_service_name};
use crate::grpc::{self, SessionEnd};
use crate::registry::{ActiveTransport, NacosStats};
use crate::wire::ServiceInfo;

/// What the loops share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: Arc<NacosConfig>,
    pub(crate) http: NacosHttp,
    pub(crate) auth: Auth,
    pub(crate) stats: Arc<NacosStats>,
}

/// What a loop tells the writer.
#[derive(Debug)]
pub(crate) enum Report {
    /// Every service of a namespace (all its configured groups).
    Catalog(String, BTreeSet<ServiceName>),
    /// A service's instances (a subscription answer, a push or an HTTP read).
    Instances(ServiceName, ServiceInfo),
    /// A namespace's loop failed: the registry turns stale.
    Failed(String, ApiError),
    /// A namespace's loop completed a round: fresh again.
    Fresh(String),
    /// The transport a namespace's loop uses now.
    Transport(String, ActiveTransport),
}

/// A loop's handle on the writer, for one namespace.
#[derive(Clone, Debug)]
pub(crate) struct Driven {
    pub(crate) namespace: String,
    pub(crate) tx: mpsc::UnboundedSender<Report>,
    pub(crate) stats: Arc<NacosStats>,
}

impl Driven {
    fn send(&self, report: Report) {
        let _ = self.tx.send(report);
    }

    pub(crate) fn catalog(&self, names: BTreeSet<ServiceName>) {
        self.send(Report::Catalog(self.namespace.clone(), names));
    }

    pub(crate) fn instances(&self, name: ServiceName, info: ServiceInfo) {
        self.send(Report::Instances(name, info));
    }

    pub(crate) fn fresh(&self) {
        self.send(Report::Fresh(self.namespace.clone()));
    }

    pub(crate) fn transport(&self, t: ActiveTransport) {
        self.stats.set_transport(t);
        self.send(Report::Transport(self.namespace.clone(), t));
    }

    fn failed(&self, err: ApiError) {
        self.stats.count_error(&err);
        self.send(Report::Failed(self.namespace.clone(), err));
    }

    /// A `NotifySubscriberRequest` body.
    pub(crate) fn push(&self, body: &Value) {
        self.stats.count_push();
        let info = &body["serviceInfo"];
        let Some((group, name)) = ServiceInfo::names(info) else {
            debug!("nacos: a push without a service name");
            return;
        };
        match ServiceInfo::parse(info) {
            Ok(parsed) => self.instances(
                ServiceName {
                    namespace: self.namespace.clone(),
                    group,
                    name,
                },
                parsed,
            ),
            Err(e) => warn!(service = %name, "nacos: ignoring a malformed push: {e}"),
        }
    }

    /// Whether a listed service is followed (its name can be a hostname label; the
    /// writer reports the others). Dubbo's `consumers:` entries are never followed.
    pub(crate) fn wanted(&self, name: &ServiceName) -> bool {
        check_service_name(&name.name).is_ok()
    }
}

/// Every service of `namespace` in the configured groups, page by page.
pub(crate) async fn list_catalog<'a, F, Fut>(
    config: &'a NacosConfig,
    namespace: &'a str,
    mut page: F,
) -> Result<BTreeSet<ServiceName>, ApiError>
where
    F: FnMut((&'a str, &'a str), u32) -> Fut,
    Fut: Future<Output = Result<(u64, Vec<String>), ApiError>>,
{
    let mut all = BTreeSet::new();
    for group in &config.groups {
        let mut seen = 0usize;
        for page_no in 1.. {
            let (count, names) = page((namespace, group.as_str()), page_no).await?;
            let got = names.len();
            seen += got;
            all.extend(names.into_iter().map(|name| ServiceName {
                namespace: namespace.to_string(),
                group: group.clone(),
                name,
            }));
            if got < config.page_size as usize || seen as u64 >= count {
                break;
            }
        }
    }
    Ok(all)
}

/// The delay before retry number `failures` (1-based), doubled up to the cap.
pub fn backoff(config: &NacosConfig, failures: u32) -> std::time::Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    config
        .retry_interval
        .saturating_mul(factor)
        .min(config.max_retry_interval)
}

/// One HTTP round for a namespace: list, then read every service's instances.
async fn http_round(shared: &Shared, server: &str, driven: &Driven) -> Result<(), ApiError> {
    shared.auth.ensure(&shared.http, server).await?;
    let namespace = driven.namespace.as_str();
    let list_headers = shared.auth.headers(None);
    let catalog = list_catalog(&shared.config, namespace, |ns_group, page_no| {
        let list_headers = &list_headers;
        async move {
            let page = shared
                .http
                .service_list(
                    server,
                    list_headers,
                    ns_group,
                    page_no,
                    shared.config.page_size,
                )
                .await?;
            shared.stats.count_answer();
            Ok(page)
        }
    })
    .await?;
    driven.catalog(catalog.clone());
    let reads = stream::iter(catalog.into_iter().filter(|n| driven.wanted(n)).map(
        |name| async move {
            let headers = shared.auth.headers(Some((&name.group, &name.name)));
            let value = shared
                .http
                .instance_list(server, &headers, (&name.namespace, &name.group, &name.name))
                .await?;
            shared.stats.count_answer();
            let info = ServiceInfo::parse(&value)
                .map_err(|e| ApiError::Decode(format!("instances of {name}: {e}")))?;
            Ok::<_, ApiError>((name, info))
        },
    ))
    .buffer_unordered(shared.config.max_concurrent_requests);
    let mut reads = std::pin::pin!(reads);
    while let Some((name, info)) = reads.try_next().await? {
        driven.instances(name, info);
    }
    driven.fresh();
    Ok(())
}

/// Runs a namespace's loop forever (the writer stops it with the registry).
pub(crate) async fn run(shared: Arc<Shared>, driven: Driven) {
    let config = shared.config.clone();
    let mut failures = 0u32;
    let mut server = 0usize;
    loop {
        let base = &config.servers[server % config.servers.len()];
        let result = match config.transport {
            Transport::Http => {
                driven.transport(ActiveTransport::Http);
                http_round(&shared, base, &driven)
                    .await
                    .map(|()| Next::Wait)
            }
            Transport::Grpc => match grpc::session(&shared, base, &driven).await {
                SessionEnd::Unavailable(e) | SessionEnd::Failed(e) => Err(e),
                SessionEnd::Reset => Ok(Next::Reconnect),
            },
            Transport::Auto => match grpc::session(&shared, base, &driven).await {
                SessionEnd::Failed(e) => Err(e),
                SessionEnd::Reset => Ok(Next::Reconnect),
                SessionEnd::Unavailable(e) if e.is_denied() => Err(e),
                SessionEnd::Unavailable(grpc_error) => {
                    debug!(namespace = %driven.namespace, "nacos: no gRPC session ({grpc_error}); reading the HTTP API");
                    let round = http_round(&shared, base, &driven).await;
                    // Only an HTTP API that answers is a fallback (else Nacos is down).
                    if round.is_ok() {
                        driven.transport(ActiveTransport::Http);
                    }
                    round.map(|()| Next::Wait)
                }
            },
        };
        match result {
            Ok(Next::Wait) => {
                failures = 0;
                tokio::time::sleep(config.refresh_interval).await;
            }
            Ok(Next::Reconnect) => {
                failures = 0;
                server += 1;
                info!(namespace = %driven.namespace, "nacos: the server asked to reconnect; connecting again");
            }
            Err(err) => {
                if err.is_denied() {
                    shared.auth.refused();
                }
                failures = failures.saturating_add(1);
                driven.failed(err);
                server += 1;
                tokio::time::sleep(backoff(&config, failures)).await;
            }
        }
    }
}

/// What a loop does after a good round.
enum Next {
    /// Wait for the refresh interval (an HTTP round).
    Wait,
    /// Connect again at once (the server reset the gRPC connection).
    Reconnect,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let config = NacosConfig::default();
        let s = Duration::from_secs;
        assert_eq!(backoff(&config, 1), s(2));
        assert_eq!(backoff(&config, 3), s(8));
        assert_eq!(backoff(&config, 40), s(30));
    }

    #[tokio::test]
    async fn catalogs_are_read_page_by_page_per_group() {
        let config = NacosConfig {
            groups: vec!["A".into(), "B".into()],
            page_size: 2,
            ..NacosConfig::default()
        };
        let catalog = list_catalog(&config, "public", |(_, group), page| async move {
            let names: Vec<String> = match (group, page) {
                ("A", 1) => vec!["a1".into(), "a2".into()],
                ("A", 2) => vec!["a3".into()],
                ("B", 1) => vec!["b1".into()],
                _ => vec![],
            };
            Ok((if group == "A" { 3 } else { 1 }, names))
        })
        .await
        .unwrap();
        let names: Vec<String> = catalog
            .iter()
            .map(|n| format!("{}/{}", n.group, n.name))
            .collect();
        assert_eq!(names, ["A/a1", "A/a2", "A/a3", "B/b1"]);
    }
}

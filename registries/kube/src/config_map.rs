//! Following one ConfigMap (istiod's `istio` ConfigMap with the `mesh` and
//! `meshNetworks` keys): a watch on that name only, reporting its data whenever it
//! changes, its absence, and when the initial list is done.

use std::collections::BTreeMap;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

/// What happened to the followed ConfigMap.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfigMapUpdate {
    /// It exists with this data (a change, or the state at the initial list).
    Data(BTreeMap<String, String>),
    /// It does not exist (deleted, or absent at the initial list).
    Absent,
    /// The watch failed; it retries with backoff. The text is for the log.
    Error(String),
}

/// Follows the ConfigMap `namespace/name`. The first item reflects the initial list
/// (`Data` or `Absent`); later items follow changes.
pub fn follow_config_map(
    client: kube::Client,
    namespace: &str,
    name: &str,
) -> impl Stream<Item = ConfigMapUpdate> + Send + 'static {
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    let fields = format!("metadata.name={name}");
    let name = name.to_string();
    let mut listed: Option<BTreeMap<String, String>> = None;
    let mut listing = false;
    watcher::watcher(api, watcher::Config::default().fields(&fields))
        .default_backoff()
        .filter_map(move |event| {
            let update = match event {
                Err(err) => Some(ConfigMapUpdate::Error(err.to_string())),
                Ok(Event::Init) => {
                    listing = true;
                    listed = None;
                    None
                }
                Ok(Event::InitApply(cm)) => {
                    if cm.metadata.name.as_deref() == Some(name.as_str()) {
                        listed = Some(cm.data.unwrap_or_default());
                    }
                    None
                }
                Ok(Event::InitDone) => {
                    listing = false;
                    Some(match listed.take() {
                        Some(data) => ConfigMapUpdate::Data(data),
                        None => ConfigMapUpdate::Absent,
                    })
                }
                Ok(Event::Apply(cm)) if !listing => (cm.metadata.name.as_deref()
                    == Some(name.as_str()))
                .then(|| ConfigMapUpdate::Data(cm.data.unwrap_or_default())),
                Ok(Event::Delete(cm)) if !listing => (cm.metadata.name.as_deref()
                    == Some(name.as_str()))
                .then_some(ConfigMapUpdate::Absent),
                Ok(_) => None,
            };
            futures::future::ready(update)
        })
}

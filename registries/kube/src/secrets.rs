//! Gateway credentials in Secrets (SDS, reference §2): following one requested Secret
//! by name, and asking the API server whether a service account may read the Secrets
//! of its namespace (a `SubjectAccessReview`, as istiod's `credentials/kube`
//! `Authorize`).
//!
//! Only Secrets a proxy asked for are read: each is a watch on that one name, with the
//! types istiod's informer skips (Helm releases, service-account tokens) filtered out
//! by the API server.

use std::collections::BTreeMap;

use futures::{Stream, StreamExt};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

/// Secret types never served (istiod's informer skips them).
pub const SKIPPED_SECRET_TYPES: [&str; 2] =
    ["helm.sh/release.v1", "kubernetes.io/service-account-token"];

pub use meshfed_registry::config::SecretData;

/// The content of a Kubernetes Secret: `data`, with any `stringData` a writer left in
/// place on top.
pub fn secret_data(secret: &Secret) -> SecretData {
    let mut data: BTreeMap<String, Vec<u8>> = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    for (k, v) in secret.string_data.iter().flatten() {
        data.insert(k.clone(), v.clone().into_bytes());
    }
    SecretData {
        secret_type: secret.type_.clone().unwrap_or_default(),
        data,
    }
}

/// What happened to a followed Secret.
#[derive(Clone, Debug, PartialEq)]
pub enum SecretUpdate {
    /// It exists with this content (a change, or the state at the initial list).
    Present(SecretData),
    /// It does not exist, or is of a skipped type (deleted, or absent at the list).
    Absent,
    /// The watch failed; it retries with backoff. The text is for the log.
    Error(String),
}

/// Follows the Secret `namespace/name`. The first item reflects the initial list
/// (`Present` or `Absent`); later items follow changes.
pub fn follow_secret(
    client: kube::Client,
    namespace: &str,
    name: &str,
) -> impl Stream<Item = SecretUpdate> + Send + 'static {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let mut fields = format!("metadata.name={name}");
    for skipped in SKIPPED_SECRET_TYPES {
        fields.push_str(&format!(",type!={skipped}"));
    }
    let name = name.to_string();
    let mut listed: Option<SecretData> = None;
    let mut listing = false;
    let ours = move |s: &Secret| {
        s.metadata.name.as_deref() == Some(name.as_str())
            && !SKIPPED_SECRET_TYPES.contains(&s.type_.as_deref().unwrap_or_default())
    };
    watcher::watcher(api, watcher::Config::default().fields(&fields))
        .default_backoff()
        .filter_map(move |event| {
            let update = match event {
                Err(err) => Some(SecretUpdate::Error(err.to_string())),
                Ok(Event::Init) => {
                    listing = true;
                    listed = None;
                    None
                }
                Ok(Event::InitApply(s)) => {
                    if ours(&s) {
                        listed = Some(secret_data(&s));
                    }
                    None
                }
                Ok(Event::InitDone) => {
                    listing = false;
                    Some(match listed.take() {
                        Some(data) => SecretUpdate::Present(data),
                        None => SecretUpdate::Absent,
                    })
                }
                Ok(Event::Apply(s)) if !listing => {
                    ours(&s).then(|| SecretUpdate::Present(secret_data(&s)))
                }
                Ok(Event::Delete(s)) if !listing => ours(&s).then_some(SecretUpdate::Absent),
                Ok(_) => None,
            };
            futures::future::ready(update)
        })
}

/// Whether `user` may `list` `secrets` in `namespace`, by a `SubjectAccessReview`
/// through `client`'s API server.
pub async fn may_list_secrets(
    client: &kube::Client,
    user: &str,
    namespace: &str,
) -> Result<bool, kube::Error> {
    let review = SubjectAccessReview {
        metadata: Default::default(),
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_string()),
                verb: Some("list".into()),
                resource: Some("secrets".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        status: None,
    };
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let answer = api.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::*;

    #[test]
    fn string_data_lays_over_data() {
        let secret = Secret {
            data: Some(BTreeMap::from([
                ("tls.crt".to_string(), ByteString(b"a".to_vec())),
                ("tls.key".to_string(), ByteString(b"b".to_vec())),
            ])),
            string_data: Some(BTreeMap::from([("tls.key".to_string(), "c".to_string())])),
            type_: Some("kubernetes.io/tls".into()),
            ..Default::default()
        };
        let data = secret_data(&secret);
        assert_eq!(data.secret_type, "kubernetes.io/tls");
        assert_eq!(data.data["tls.crt"], b"a");
        assert_eq!(data.data["tls.key"], b"c");
    }
}

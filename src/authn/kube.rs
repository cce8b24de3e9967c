//! Kubernetes service-account tokens (Istio's `KubeJWTAuthenticator`, reference §1.6):
//! the bearer token goes to a TokenReview on the API server of the caller's cluster —
//! the local one, or the remote cluster named by the `clusterid` metadata — with
//! the configured audiences (`istio-ca` by default); the reviewed
//! `system:serviceaccount:<ns>:<sa>` becomes `spiffe://<trust domain>/ns/<ns>/sa/<sa>`.

use std::sync::Arc;

use meshfed_kube::SecretController;
use meshfed_registry::ClusterId;

use super::{
    AuthContext, AuthFuture, Authenticator, Caller, bearer_token, claimed_cluster, spiffe_identity,
};

/// Tokens checked by the caller's Kubernetes API server.
pub struct KubeJwtAuthenticator {
    local: meshfed_kube::Client,
    local_cluster: ClusterId,
    remotes: Option<Arc<SecretController>>,
    audiences: Vec<String>,
    trust_domain: String,
}

impl std::fmt::Debug for KubeJwtAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeJwtAuthenticator")
            .field("local_cluster", &self.local_cluster)
            .field("audiences", &self.audiences)
            .finish_non_exhaustive()
    }
}

impl KubeJwtAuthenticator {
    /// Reviews tokens on `local` (cluster `local_cluster`) or on the remote clusters
    /// of `remotes`.
    pub fn new(
        local: meshfed_kube::Client,
        local_cluster: ClusterId,
        remotes: Option<Arc<SecretController>>,
        audiences: Vec<String>,
        trust_domain: String,
    ) -> Self {
        KubeJwtAuthenticator {
            local,
            local_cluster,
            remotes,
            audiences,
            trust_domain,
        }
    }

    /// The API server of the cluster a caller claims (Istio: empty or our own id →
    /// the local cluster; else a remote cluster by id; else refused).
    fn client_for(&self, claimed: Option<&str>) -> Result<meshfed_kube::Client, String> {
        match claimed {
            None => Ok(self.local.clone()),
            Some(id) if id == self.local_cluster.as_str() => Ok(self.local.clone()),
            Some(id) => self
                .remotes
                .as_ref()
                .and_then(|r| r.client_for(&ClusterId::new(id)))
                .ok_or_else(|| {
                    format!("client claims to be in cluster {id:?}, which this control plane does not know")
                }),
        }
    }
}

impl Authenticator for KubeJwtAuthenticator {
    fn name(&self) -> &'static str {
        "kube-jwt"
    }

    fn authenticate<'a>(&'a self, ctx: AuthContext<'a>) -> AuthFuture<'a> {
        Box::pin(async move {
            let Some(token) = bearer_token(ctx.metadata) else {
                return Ok(None);
            };
            let claimed = claimed_cluster(ctx.metadata);
            let client = self.client_for(claimed)?;
            let account = meshfed_kube::review_token(&client, token, &self.audiences)
                .await
                .map_err(|e| e.to_string())?;
            Ok(Some(Caller {
                identities: vec![spiffe_identity(
                    &self.trust_domain,
                    &account.namespace,
                    &account.service_account,
                )],
                source: "kube-jwt",
                kube: Some(super::KubeCaller {
                    cluster: claimed
                        .filter(|c| *c != self.local_cluster.as_str())
                        .map(str::to_string),
                    namespace: account.namespace,
                    service_account: account.service_account,
                    pod_name: account.pod_name,
                    pod_uid: account.pod_uid,
                }),
            }))
        })
    }
}

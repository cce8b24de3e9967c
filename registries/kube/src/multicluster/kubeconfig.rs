//! Remote kubeconfigs: what they may use ([`KubeconfigPolicy`]), parsing and the
//! client built from one.

use super::*;

/// The kubeconfig options [`KubeconfigPolicy`] refuses unless allowed. Auth providers
/// are allowed by name (`oidc` always is).
pub const INSECURE_KUBECONFIG_OPTIONS: [&str; 5] = [
    "exec",
    "tokenFile",
    "clientCertificate",
    "clientKey",
    "certificateAuthority",
];

/// What a remote kubeconfig may use. Kubeconfigs in Secrets are untrusted input: one
/// that runs a program (an `exec` plugin) or reads files from the control plane's disk
/// (`tokenFile`, `client-certificate`, `client-key`, `certificate-authority` paths), or
/// uses an auth provider other than `oidc`, is refused unless that option is allowed
/// (Istio's `PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeconfigPolicy {
    allowed: BTreeSet<String>,
}

impl KubeconfigPolicy {
    /// Nothing insecure allowed (the default).
    pub fn strict() -> Self {
        Self::default()
    }

    /// Allows these options: names from [`INSECURE_KUBECONFIG_OPTIONS`], auth provider
    /// names, or `all`.
    pub fn allowing<S: AsRef<str>>(options: impl IntoIterator<Item = S>) -> Self {
        KubeconfigPolicy {
            allowed: options
                .into_iter()
                .map(|o| o.as_ref().trim().to_string())
                .filter(|o| !o.is_empty())
                .collect(),
        }
    }

    fn allows(&self, option: &str) -> bool {
        self.allowed.contains("all") || self.allowed.contains(option)
    }

    /// Checks every user and cluster of a kubeconfig (not only the current context's,
    /// as Istio does).
    pub fn check(&self, kubeconfig: &Kubeconfig) -> Result<(), KubeconfigError> {
        let refuse = |entry: String, option: &str, detail: String| {
            Err(KubeconfigError::Refused {
                entry,
                option: option.to_string(),
                detail,
            })
        };
        for named in &kubeconfig.auth_infos {
            let Some(user) = &named.auth_info else {
                continue;
            };
            let entry = format!("user {:?}", named.name);
            if let Some(exec) = &user.exec
                && !self.allows("exec")
            {
                let command = exec.command.as_deref().unwrap_or("");
                return refuse(entry, "exec", format!("runs the command {command:?}"));
            }
            if let Some(file) = &user.token_file
                && !self.allows("tokenFile")
            {
                return refuse(entry, "tokenFile", format!("reads the token file {file:?}"));
            }
            if let Some(file) = &user.client_certificate
                && !self.allows("clientCertificate")
            {
                return refuse(
                    entry,
                    "clientCertificate",
                    format!("reads the client certificate file {file:?}"),
                );
            }
            if let Some(file) = &user.client_key
                && !self.allows("clientKey")
            {
                return refuse(
                    entry,
                    "clientKey",
                    format!("reads the client key file {file:?}"),
                );
            }
            if let Some(provider) = &user.auth_provider
                && provider.name != "oidc"
                && !self.allows(&provider.name)
            {
                return refuse(
                    entry,
                    &provider.name,
                    format!("uses the auth provider {:?}", provider.name),
                );
            }
        }
        for named in &kubeconfig.clusters {
            let Some(cluster) = &named.cluster else {
                continue;
            };
            if let Some(file) = &cluster.certificate_authority
                && !self.allows("certificateAuthority")
            {
                return refuse(
                    format!("cluster {:?}", named.name),
                    "certificateAuthority",
                    format!("reads the CA file {file:?}"),
                );
            }
        }
        Ok(())
    }
}

/// Why a remote kubeconfig was not used.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// Not UTF-8 or not a kubeconfig document.
    #[error("not a valid kubeconfig: {0}")]
    Parse(String),
    /// An option the [`KubeconfigPolicy`] refuses.
    #[error(
        "{entry} {detail}; refused ({option} is not allowed for remote clusters; \
         allow it with --allowInsecureKubeconfig {option})"
    )]
    Refused {
        /// The kubeconfig entry (`user "admin"`, `cluster "c2"`).
        entry: String,
        /// The refused option.
        option: String,
        /// What it would have done.
        detail: String,
    },
    /// The client could not be built from it.
    #[error("building a client from it: {0}")]
    Client(String),
}

/// Parses and checks a kubeconfig from a Secret.
pub fn parse_kubeconfig(
    bytes: &[u8],
    policy: &KubeconfigPolicy,
) -> Result<Kubeconfig, KubeconfigError> {
    let text =
        std::str::from_utf8(bytes).map_err(|_| KubeconfigError::Parse("not UTF-8 text".into()))?;
    let kubeconfig =
        Kubeconfig::from_yaml(text).map_err(|e| KubeconfigError::Parse(e.to_string()))?;
    policy.check(&kubeconfig)?;
    Ok(kubeconfig)
}

/// A client from a checked kubeconfig (its current context).
pub async fn client_from_kubeconfig(
    kubeconfig: Kubeconfig,
) -> Result<kube::Client, KubeconfigError> {
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| KubeconfigError::Client(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| KubeconfigError::Client(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(user: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(&format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://remote:6443\n\
             users:\n- name: u\n  user: {user}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\n\
             current-context: c\n"
        ))
        .unwrap()
    }

    #[test]
    fn insecure_kubeconfig_options_are_refused_unless_allowed() {
        let strict = KubeconfigPolicy::strict();
        assert!(strict.check(&kubeconfig("{token: abc}")).is_ok());
        let cases = [
            (
                "{exec: {command: aws, apiVersion: client.authentication.k8s.io/v1}}",
                "exec",
            ),
            ("{tokenFile: /var/run/token}", "tokenFile"),
            ("{client-certificate: /etc/cert.pem}", "clientCertificate"),
            ("{client-key: /etc/key.pem}", "clientKey"),
            ("{auth-provider: {name: gcp}}", "gcp"),
        ];
        for (user, option) in cases {
            let err = strict.check(&kubeconfig(user)).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains(&format!("--allowInsecureKubeconfig {option}")),
                "{user}: {text}"
            );
            assert!(text.contains("user \"u\""), "{text}");
            assert!(
                KubeconfigPolicy::allowing([option])
                    .check(&kubeconfig(user))
                    .is_ok()
            );
            assert!(
                KubeconfigPolicy::allowing(["all"])
                    .check(&kubeconfig(user))
                    .is_ok()
            );
        }
        assert!(
            strict
                .check(&kubeconfig("{auth-provider: {name: oidc}}"))
                .is_ok(),
            "oidc is always allowed"
        );
        let mut ca = kubeconfig("{}");
        ca.clusters[0]
            .cluster
            .as_mut()
            .unwrap()
            .certificate_authority = Some("/ca.pem".into());
        assert!(
            strict
                .check(&ca)
                .unwrap_err()
                .to_string()
                .contains("cluster \"c\" reads the CA file")
        );
        assert!(matches!(
            parse_kubeconfig(b"clusters: 7", &strict),
            Err(KubeconfigError::Parse(_))
        ));
    }
}

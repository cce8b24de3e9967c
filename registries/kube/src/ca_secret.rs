//! The CA's key material as Istio keeps it in Kubernetes (reference §1.4), at the PEM
//! level only (parsing and signing belong to the CA):
//!
//! - a plugged CA: Secret `cacerts` in the system namespace, with either Istio's keys
//!   (`ca-cert.pem`, `ca-key.pem`, `root-cert.pem`, `cert-chain.pem`) or the
//!   `kubernetes.io/tls` layout (`tls.crt`, `tls.key`, `ca.crt`) when `tls.crt` is
//!   there ([`read_cacerts`]);
//! - the self-signed CA: Secret `istio-ca-secret`, created once by whichever replica
//!   gets there first and then shared by all ([`load_or_create_self_signed`]).
//!
//! Key material is never logged, and [`CacertsPems`]' `Debug` leaves the key out.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use tracing::info;

/// The plugged-CA Secret.
pub const CACERTS_SECRET: &str = "cacerts";
/// The self-signed CA's Secret.
pub const SELF_SIGNED_SECRET: &str = "istio-ca-secret";
/// The self-signed CA Secret's type.
pub const SELF_SIGNED_SECRET_TYPE: &str = "istio.io/ca-root";

/// Istio's plugged-CA keys, all four or none.
pub const CA_CERT: &str = "ca-cert.pem";
pub const CA_KEY: &str = "ca-key.pem";
pub const ROOT_CERT: &str = "root-cert.pem";
pub const CERT_CHAIN: &str = "cert-chain.pem";
/// Present, empty, in istiod's `istio-ca-secret` (the CA's own leaf key slot).
pub const PRIVATE_KEY: &str = "key.pem";
const ISTIO_KEYS: [&str; 4] = [CA_CERT, CA_KEY, ROOT_CERT, CERT_CHAIN];

/// The `kubernetes.io/tls` layout's keys.
pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const TLS_CA: &str = "ca.crt";
const TLS_KEYS: [&str; 3] = [TLS_CERT, TLS_KEY, TLS_CA];

/// Which layout a `cacerts` Secret used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacertsLayout {
    /// `ca-cert.pem`, `ca-key.pem`, `root-cert.pem`, `cert-chain.pem`.
    Istio,
    /// `tls.crt`, `tls.key`, `ca.crt`.
    KubernetesTls,
}

/// A plugged CA's PEMs, as Istio reads them from `cacerts`.
#[derive(Clone, PartialEq, Eq)]
pub struct CacertsPems {
    /// The signing (intermediate) CA certificate.
    pub ca_cert: String,
    /// Its private key.
    pub ca_key: String,
    /// The root(s) workloads trust.
    pub root_cert: String,
    /// The chain from the signing certificate up to (not including) the root; for
    /// the TLS layout, `tls.crt` followed by `ca.crt`, as Istio builds it.
    pub cert_chain: String,
    pub layout: CacertsLayout,
}

impl fmt::Debug for CacertsPems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacertsPems")
            .field("ca_cert", &self.ca_cert)
            .field("ca_key", &"<redacted>")
            .field("root_cert", &self.root_cert)
            .field("cert_chain", &self.cert_chain)
            .field("layout", &self.layout)
            .finish()
    }
}

/// Why the CA material could not be read or stored.
#[derive(Debug, thiserror::Error)]
pub enum CaSecretError {
    /// The API server refused or failed a read of the Secret.
    #[error("reading Secret {secret}: {source}")]
    Read {
        secret: String,
        #[source]
        source: kube::Error,
    },
    /// The API server refused or failed the create of the Secret.
    #[error("creating Secret {secret}: {source}")]
    Write {
        secret: String,
        #[source]
        source: kube::Error,
    },
    /// Some of the keys a layout needs are there, others not (Istio refuses to start).
    #[error("incomplete signing CA bundle in Secret {secret}: missing {}", missing.join(", "))]
    Incomplete {
        secret: String,
        missing: Vec<String>,
    },
    /// A key's value is not UTF-8 text (PEM is).
    #[error("Secret {secret}: key {key} is not PEM text")]
    NotText { secret: String, key: String },
    /// Generating the self-signed CA failed.
    #[error("generating the self-signed CA: {0}")]
    Generate(String),
    /// Another replica's create won the race, yet its Secret cannot be read back.
    #[error("Secret {0} already exists but cannot be read back")]
    Vanished(String),
}

/// A local `Result`.
pub type Result<T, E = CaSecretError> = std::result::Result<T, E>;

async fn get_secret(api: &Api<Secret>, namespace: &str, name: &str) -> Result<Option<Secret>> {
    api.get_opt(name)
        .await
        .map_err(|source| CaSecretError::Read {
            secret: format!("{namespace}/{name}"),
            source,
        })
}

/// The Secret's keys as text (`data`, and `stringData` where a writer left it).
fn text_data(secret: &Secret, name: &str) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (key, ByteString(bytes)) in secret.data.iter().flatten() {
        let text = String::from_utf8(bytes.clone()).map_err(|_| CaSecretError::NotText {
            secret: name.to_string(),
            key: key.clone(),
        })?;
        out.insert(key.clone(), text);
    }
    for (key, value) in secret.string_data.iter().flatten() {
        out.entry(key.clone()).or_insert_with(|| value.clone());
    }
    Ok(out)
}

/// Takes `keys` out of `data`: all there → `Some`, none → `None`, some → the
/// missing ones named.
fn all_or_none<const N: usize>(
    data: &mut BTreeMap<String, String>,
    keys: [&str; N],
    secret: &str,
) -> Result<Option<[String; N]>> {
    let missing: Vec<String> = keys
        .iter()
        .filter(|k| !data.contains_key(**k))
        .map(|k| k.to_string())
        .collect();
    if missing.len() == N {
        return Ok(None);
    }
    if !missing.is_empty() {
        return Err(CaSecretError::Incomplete {
            secret: secret.to_string(),
            missing,
        });
    }
    Ok(Some(keys.map(|k| data.remove(k).unwrap_or_default())))
}

/// Reads the plugged CA from Secret `cacerts` in `namespace`: `None` when there is no
/// such Secret or it holds none of the CA keys (then the CA is self-signed), an
/// [`CaSecretError::Incomplete`] error when it holds some but not all.
pub async fn read_cacerts(client: &kube::Client, namespace: &str) -> Result<Option<CacertsPems>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let name = format!("{namespace}/{CACERTS_SECRET}");
    let Some(secret) = get_secret(&api, namespace, CACERTS_SECRET).await? else {
        return Ok(None);
    };
    let mut data = text_data(&secret, &name)?;
    if data.contains_key(TLS_CERT) {
        let Some([cert, key, ca]) = all_or_none(&mut data, TLS_KEYS, &name)? else {
            unreachable!("tls.crt is present");
        };
        let cert_chain = join_pems(&cert, &ca);
        return Ok(Some(CacertsPems {
            ca_cert: cert,
            ca_key: key,
            root_cert: ca,
            cert_chain,
            layout: CacertsLayout::KubernetesTls,
        }));
    }
    Ok(all_or_none(&mut data, ISTIO_KEYS, &name)?.map(
        |[ca_cert, ca_key, root_cert, cert_chain]| CacertsPems {
            ca_cert,
            ca_key,
            root_cert,
            cert_chain,
            layout: CacertsLayout::Istio,
        },
    ))
}

/// Two PEM texts, one after the other, with a line break between them.
fn join_pems(first: &str, second: &str) -> String {
    let mut out = first.to_string();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(second);
    out
}

/// The self-signed CA's certificate and key (PEM) from Secret `istio-ca-secret` in
/// `namespace`. Without that Secret, `generate` makes them and they are stored (type
/// `istio.io/ca-root`, keys `ca-cert.pem`, `ca-key.pem`, `root-cert.pem` = the
/// certificate, empty `cert-chain.pem` and `key.pem`, as istiod's `BuildSecret` writes
/// it). A Secret istiod wrote is read as it is: its key is PKCS#1 RSA, which the CA
/// reads. When another replica created the Secret in
/// the meantime (`409 AlreadyExists`), its CA is read back and returned instead, so
/// every replica signs with the same root.
pub async fn load_or_create_self_signed<E: fmt::Display>(
    client: &kube::Client,
    namespace: &str,
    generate: impl FnOnce() -> std::result::Result<(String, String), E>,
) -> Result<(String, String)> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let name = format!("{namespace}/{SELF_SIGNED_SECRET}");
    if let Some(secret) = get_secret(&api, namespace, SELF_SIGNED_SECRET).await? {
        return self_signed_of(&secret, &name);
    }
    let (cert, key) = generate().map_err(|e| CaSecretError::Generate(e.to_string()))?;
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(SELF_SIGNED_SECRET.to_string()),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        },
        type_: Some(SELF_SIGNED_SECRET_TYPE.to_string()),
        data: Some(BTreeMap::from([
            (CA_CERT.to_string(), bytes(&cert)),
            (CA_KEY.to_string(), bytes(&key)),
            (ROOT_CERT.to_string(), bytes(&cert)),
            (CERT_CHAIN.to_string(), bytes("")),
            (PRIVATE_KEY.to_string(), bytes("")),
        ])),
        ..Default::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            info!(secret = %name, "self-signed CA created and stored");
            Ok((cert, key))
        }
        Err(kube::Error::Api(status)) if status.code == 409 => {
            info!(secret = %name, "another replica stored the self-signed CA first; using theirs");
            let theirs = get_secret(&api, namespace, SELF_SIGNED_SECRET)
                .await?
                .ok_or_else(|| CaSecretError::Vanished(name.clone()))?;
            self_signed_of(&theirs, &name)
        }
        Err(source) => Err(CaSecretError::Write {
            secret: name,
            source,
        }),
    }
}

/// The certificate and key of a stored self-signed CA Secret.
fn self_signed_of(secret: &Secret, name: &str) -> Result<(String, String)> {
    let mut data = text_data(secret, name)?;
    data.retain(|_, v| !v.is_empty());
    match all_or_none(&mut data, [CA_CERT, CA_KEY], name)? {
        Some([cert, key]) => Ok((cert, key)),
        None => Err(CaSecretError::Incomplete {
            secret: name.to_string(),
            missing: vec![CA_CERT.to_string(), CA_KEY.to_string()],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_leaves_the_key_out() {
        let pems = CacertsPems {
            ca_cert: "CERT".into(),
            ca_key: "SECRET-KEY".into(),
            root_cert: "ROOT".into(),
            cert_chain: "CHAIN".into(),
            layout: CacertsLayout::Istio,
        };
        let shown = format!("{pems:?}");
        assert!(!shown.contains("SECRET-KEY"), "{shown}");
        assert!(shown.contains("CERT"));
    }

    #[test]
    fn pems_join_on_a_line_break() {
        assert_eq!(join_pems("a\n", "b\n"), "a\nb\n");
        assert_eq!(join_pems("a", "b\n"), "a\nb\n");
    }
}

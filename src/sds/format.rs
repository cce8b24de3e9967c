//! Reading a Secret's keys into SDS material (reference §2, istiod's
//! `credentials/kube/secrets.go`), and checking it before it is sent.
//!
//! Key and certificate: `cert` + `key` (optional `crl`), else `tls.crt` + `tls.key`
//! (optional `tls.ocsp-staple`, `ca.crl`). CA: `cacert` (optional `crl`), else `ca.crt`
//! (optional `ca.crl`). The Secret's type is not checked. Keys present but empty and
//! keys missing are different errors.
//!
//! Beyond istiod: material Envoy would fail on is not sent. The certificates must be
//! PEM certificates, the private key a PEM private key of a supported type, and the key
//! must be the one of the leaf certificate. Expired certificates are still served
//! (as istiod), and reported as such.

use std::collections::BTreeMap;
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why a Secret cannot be served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// No key pair of either layout.
    #[error(
        "found secret, but didn't have expected keys (cert and key) or (tls.crt and tls.key); found: {found}"
    )]
    MissingKeys { found: String },
    /// The keys are there but empty.
    #[error("found keys {cert:?} and {key:?}, but they were empty")]
    EmptyKeys {
        cert: &'static str,
        key: &'static str,
    },
    /// No CA key of either layout.
    #[error("found secret, but didn't have expected keys cacert or ca.crt; found: {found}")]
    MissingCa { found: String },
    /// The CA key is there but empty.
    #[error("found key {key:?}, but it was empty")]
    EmptyCa { key: &'static str },
    /// A key's value is not what it must be.
    #[error("key {key:?}: {reason}")]
    Malformed { key: &'static str, reason: String },
    /// The private key is not the leaf certificate's.
    #[error("the private key does not match the certificate: {0}")]
    KeyMismatch(String),
}

/// A certificate chain and its key, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertMaterial {
    pub chain: Vec<u8>,
    pub key: Vec<u8>,
    pub ocsp_staple: Option<Vec<u8>>,
    /// When the leaf certificate expired, if it has.
    pub expired: bool,
}

/// A CA bundle, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaMaterial {
    pub ca: Vec<u8>,
    pub crl: Option<Vec<u8>>,
    /// Whether a certificate of the bundle has expired.
    pub expired: bool,
}

type Data = BTreeMap<String, Vec<u8>>;

fn found(data: &Data) -> String {
    data.keys().cloned().collect::<Vec<_>>().join(", ")
}

fn optional(data: &Data, key: &str) -> Option<Vec<u8>> {
    data.get(key).filter(|v| !v.is_empty()).cloned()
}

/// The certificate chain and key of a Secret's `data`, checked at `now`.
pub fn certificate(data: &Data, now: SystemTime) -> Result<CertMaterial, FormatError> {
    let layouts: [(&'static str, &'static str, Option<&str>); 2] = [
        ("cert", "key", None),
        ("tls.crt", "tls.key", Some("tls.ocsp-staple")),
    ];
    let Some((cert_key, key_key, ocsp_key)) = layouts
        .into_iter()
        .find(|(c, k, _)| data.contains_key(*c) && data.contains_key(*k))
    else {
        return Err(FormatError::MissingKeys { found: found(data) });
    };
    let (chain, key) = (&data[cert_key], &data[key_key]);
    if chain.is_empty() || key.is_empty() {
        return Err(FormatError::EmptyKeys {
            cert: cert_key,
            key: key_key,
        });
    }
    let certs = certificates(cert_key, chain)?;
    let private = PrivateKeyDer::from_pem_slice(key).map_err(|e| FormatError::Malformed {
        key: key_key,
        reason: format!("not a PEM private key ({e})"),
    })?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&private).map_err(|e| {
        FormatError::Malformed {
            key: key_key,
            reason: format!("unsupported private key ({e})"),
        }
    })?;
    rustls::sign::CertifiedKey::new(certs.clone(), signer)
        .keys_match()
        .map_err(|e| FormatError::KeyMismatch(e.to_string()))?;
    Ok(CertMaterial {
        chain: chain.clone(),
        key: key.clone(),
        ocsp_staple: ocsp_key.and_then(|k| optional(data, k)),
        expired: expired(cert_key, &certs[..1], now)?,
    })
}

/// The CA bundle of a Secret's `data`, checked at `now`.
pub fn ca(data: &Data, now: SystemTime) -> Result<CaMaterial, FormatError> {
    let layouts: [(&'static str, &'static str); 2] = [("cacert", "crl"), ("ca.crt", "ca.crl")];
    let Some((ca_key, crl_key)) = layouts.into_iter().find(|(c, _)| data.contains_key(*c)) else {
        return Err(FormatError::MissingCa { found: found(data) });
    };
    let ca = &data[ca_key];
    if ca.is_empty() {
        return Err(FormatError::EmptyCa { key: ca_key });
    }
    let certs = certificates(ca_key, ca)?;
    Ok(CaMaterial {
        ca: ca.clone(),
        crl: optional(data, crl_key),
        expired: expired(ca_key, &certs, now)?,
    })
}

/// The PEM certificates of `pem` (at least one; anything else is an error).
fn certificates(
    key: &'static str,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, FormatError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| FormatError::Malformed {
            key,
            reason: format!("not PEM certificates ({e})"),
        })?;
    if certs.is_empty() {
        return Err(FormatError::Malformed {
            key,
            reason: "no PEM certificate".into(),
        });
    }
    Ok(certs)
}

/// Whether one of `certs` is past its `notAfter` at `now`; a certificate that does
/// not parse as X.509 is an error.
fn expired(
    key: &'static str,
    certs: &[CertificateDer<'_>],
    now: SystemTime,
) -> Result<bool, FormatError> {
    let now = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut any = false;
    for der in certs {
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|e| FormatError::Malformed {
                key,
                reason: format!("not an X.509 certificate ({e})"),
            })?;
        any |= cert.validity().not_after.timestamp() < now;
    }
    Ok(any)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    struct Issued {
        cert: Vec<u8>,
        key: Vec<u8>,
    }

    fn issue(days: i64) -> Issued {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["gw.example.com".into()]).unwrap();
        params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(days);
        params.not_before = time::OffsetDateTime::now_utc() - time::Duration::days(400);
        let cert = params.self_signed(&key).unwrap();
        Issued {
            cert: cert.pem().into_bytes(),
            key: key.serialize_pem().into_bytes(),
        }
    }

    fn data(pairs: &[(&str, &[u8])]) -> Data {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect()
    }

    #[test]
    fn both_layouts_are_read_and_istio_keys_win() {
        let a = issue(30);
        let now = SystemTime::now();
        let tls = certificate(
            &data(&[
                ("tls.crt", &a.cert),
                ("tls.key", &a.key),
                ("tls.ocsp-staple", b"ocsp"),
            ]),
            now,
        )
        .unwrap();
        assert_eq!(tls.chain, a.cert);
        assert_eq!(tls.ocsp_staple.as_deref(), Some(&b"ocsp"[..]));
        assert!(!tls.expired);
        let b = issue(30);
        let both = data(&[
            ("cert", &b.cert),
            ("key", &b.key),
            ("tls.crt", &a.cert),
            ("tls.key", &a.key),
        ]);
        let istio = certificate(&both, now).unwrap();
        assert_eq!(istio.chain, b.cert);
        assert_eq!(istio.ocsp_staple, None);
    }

    #[test]
    fn missing_and_empty_keys_are_told_apart() {
        let now = SystemTime::now();
        assert!(matches!(
            certificate(&data(&[("tls.crt", b"x")]), now),
            Err(FormatError::MissingKeys { found }) if found == "tls.crt"
        ));
        assert_eq!(
            certificate(&data(&[("tls.crt", b""), ("tls.key", b"")]), now),
            Err(FormatError::EmptyKeys {
                cert: "tls.crt",
                key: "tls.key"
            })
        );
        assert!(matches!(
            ca(&data(&[("tls.crt", b"x")]), now),
            Err(FormatError::MissingCa { .. })
        ));
        assert_eq!(
            ca(&data(&[("ca.crt", b"")]), now),
            Err(FormatError::EmptyCa { key: "ca.crt" })
        );
    }

    #[test]
    fn bad_pem_and_foreign_keys_are_refused() {
        let (a, b) = (issue(30), issue(30));
        let now = SystemTime::now();
        assert!(matches!(
            certificate(&data(&[("tls.crt", b"not pem"), ("tls.key", &a.key)]), now),
            Err(FormatError::Malformed { key: "tls.crt", .. })
        ));
        assert!(matches!(
            certificate(&data(&[("tls.crt", &a.cert), ("tls.key", b"garbage")]), now),
            Err(FormatError::Malformed { key: "tls.key", .. })
        ));
        assert!(matches!(
            certificate(&data(&[("tls.crt", &a.cert), ("tls.key", &b.key)]), now),
            Err(FormatError::KeyMismatch(_))
        ));
        assert!(matches!(
            ca(
                &data(&[(
                    "cacert",
                    b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
                )]),
                now
            ),
            Err(FormatError::Malformed { key: "cacert", .. })
        ));
    }

    #[test]
    fn ca_layouts_and_expiry() {
        let a = issue(1);
        let now = SystemTime::now();
        let c = ca(&data(&[("cacert", &a.cert), ("crl", b"crl")]), now).unwrap();
        assert_eq!(
            (c.ca.as_slice(), c.crl.as_deref()),
            (&a.cert[..], Some(&b"crl"[..]))
        );
        assert!(!c.expired);
        let later = now + Duration::from_secs(3 * 86_400);
        let c = ca(&data(&[("ca.crt", &a.cert), ("ca.crl", b"r")]), later).unwrap();
        assert!(c.expired && c.crl.is_some());
        let cert = certificate(&data(&[("cert", &a.cert), ("key", &a.key)]), later).unwrap();
        assert!(cert.expired, "expired certificates are still read");
    }
}

//! The mesh CA (reference §1.4-1.5): a signing certificate and key, the chain up to the
//! root, and the signing of workload certificates from CSRs.
//!
//! The signing CA is either plugged in (a `cacerts` directory: `ca-cert.pem`,
//! `ca-key.pem`, `root-cert.pem`, `cert-chain.pem`, all four or none) or self-signed:
//! created once with the mesh trust domain as its organization and kept in a directory
//! (`ca-cert.pem`, `ca-key.pem` at mode 0600, `root-cert.pem`), read back on later
//! starts so every replica and restart signs under the same root.
//!
//! A workload certificate carries only the identities the caller authenticated as
//! (SPIFFE URIs); the CSR's own subject and SANs are ignored, as in Istio. Its chain
//! is returned in Istio's order: leaf, each certificate of `cert-chain.pem`, then the
//! root bundle as one element.
//!
//! Keys: ring cannot generate RSA keys, so a self-signed root made here is ECDSA P-256
//! (Istio makes RSA 2048). A CA key read back (istiod's `istio-ca-secret`, `cacerts`)
//! may be RSA in PKCS#1 (`RSA PRIVATE KEY`, what istiod writes) or PKCS#8, or ECDSA
//! P-256/P-384 in SEC1 (`EC PRIVATE KEY`) or PKCS#8; it signs with SHA-256 for RSA and
//! the curve's hash for ECDSA, as Go's x509 does. CSRs of either kind are accepted;
//! the CSR's extensions are ignored (the certificate carries what the CA decides), and
//! an RSA CSR key outside 2048..=8192 bits is refused naming its size.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber, SubjectPublicKeyInfo,
};
use time::OffsetDateTime;

/// Istio's default workload certificate lifetime (`DEFAULT_WORKLOAD_CERT_TTL`).
pub const DEFAULT_WORKLOAD_TTL: Duration = Duration::from_secs(24 * 3600);
/// Istio's longest workload certificate lifetime (`MAX_WORKLOAD_CERT_TTL`, 90 days).
pub const MAX_WORKLOAD_TTL: Duration = Duration::from_secs(90 * 24 * 3600);
/// Istio's self-signed root lifetime (`CITADEL_SELF_SIGNED_CA_CERT_TTL`, 10 years).
pub const SELF_SIGNED_ROOT_TTL: Duration = Duration::from_secs(3650 * 24 * 3600);

/// The files of a plugged-in CA, as Istio's `cacerts` Secret holds them.
pub const CACERTS_FILES: [&str; 4] = [
    "ca-cert.pem",
    "ca-key.pem",
    "root-cert.pem",
    "cert-chain.pem",
];

/// Why the CA could not load or sign.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// Some plugged-in CA files are present and some are not.
    #[error(
        "{}: incomplete signing CA bundle: missing {missing:?} (give all of {CACERTS_FILES:?} or none)",
        .dir.display()
    )]
    Incomplete {
        /// The directory.
        dir: PathBuf,
        /// The files not there.
        missing: Vec<&'static str>,
    },
    /// A file could not be read or written.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A certificate or key did not parse, or the signing certificate is not a CA.
    #[error("{what}: {reason}")]
    Invalid {
        /// Which file or input.
        what: String,
        /// Why.
        reason: String,
    },
    /// The CSR did not parse or its signature is wrong (`InvalidArgument`).
    #[error("bad CSR: {0}")]
    Csr(String),
    /// The requested lifetime is over the maximum (`InvalidArgument`).
    #[error("requested TTL {requested:?} is greater than the max allowed TTL {max:?}")]
    Ttl {
        /// Asked for.
        requested: Duration,
        /// Allowed.
        max: Duration,
    },
    /// The signing certificate has expired (`Internal`).
    #[error("the signing CA certificate expired at {0}")]
    Expired(OffsetDateTime),
}

/// A CA ready to sign.
pub struct Ca {
    signing_cert_pem: String,
    key: KeyPair,
    /// `cert-chain.pem`, one PEM certificate per element (empty when self-signed).
    chain: Vec<String>,
    /// The root bundle, one element.
    root: String,
    not_after: OffsetDateTime,
    default_ttl: Duration,
    max_ttl: Duration,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Ca")
            .field("not_after", &self.not_after)
            .field("chain", &self.chain.len())
            .finish_non_exhaustive()
    }
}

fn read(path: &Path) -> Result<String, CaError> {
    std::fs::read_to_string(path).map_err(|source| CaError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn invalid(what: impl Into<String>, reason: impl std::fmt::Display) -> CaError {
    CaError::Invalid {
        what: what.into(),
        reason: reason.to_string(),
    }
}

/// The PEM certificates of a bundle, each as its own string ending in a newline.
fn split_pem(bundle: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    bundle
        .split_inclusive(END)
        .filter(|part| part.contains("-----BEGIN CERTIFICATE-----"))
        .map(|part| format!("{}\n", part.trim()))
        .collect()
}

/// The notAfter of a PEM certificate, checking that it is a CA.
fn ca_not_after(what: &str, pem_text: &str) -> Result<OffsetDateTime, CaError> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem_text.as_bytes())
        .map_err(|e| invalid(what, format!("not a PEM certificate: {e}")))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| invalid(what, format!("not an X.509 certificate: {e}")))?;
    if !cert.is_ca() {
        return Err(invalid(what, "the signing certificate is not a CA"));
    }
    Ok(cert.validity().not_after.to_datetime())
}

impl Ca {
    /// The plugged-in CA of `dir`, if its files are there: `Ok(None)` when none is,
    /// an error when only some are.
    pub fn plugged(dir: &Path) -> Result<Option<Ca>, CaError> {
        let present: Vec<bool> = CACERTS_FILES
            .iter()
            .map(|f| dir.join(f).is_file())
            .collect();
        if present.iter().all(|p| !p) {
            return Ok(None);
        }
        if !present.iter().all(|p| *p) {
            return Err(CaError::Incomplete {
                dir: dir.to_path_buf(),
                missing: CACERTS_FILES
                    .iter()
                    .zip(&present)
                    .filter(|(_, p)| !**p)
                    .map(|(f, _)| *f)
                    .collect(),
            });
        }
        let key_path = dir.join("ca-key.pem");
        Ca::from_pems(
            read(&dir.join("ca-cert.pem"))?,
            &read(&key_path)?,
            &read(&dir.join("cert-chain.pem"))?,
            read(&dir.join("root-cert.pem"))?,
        )
        .map(Some)
    }

    /// A CA from its PEM material (Istio's `cacerts` keys, from files or a Secret):
    /// the signing certificate (a CA), its key, the intermediates up to the root
    /// (may be empty) and the root bundle.
    pub fn from_pems(cert: String, key: &str, chain: &str, root: String) -> Result<Ca, CaError> {
        let key = key_pair_from_pem(key).map_err(|e| invalid("ca-key.pem", e))?;
        if split_pem(&root).is_empty() {
            return Err(invalid("root-cert.pem", "no certificate in it"));
        }
        let not_after = ca_not_after("ca-cert.pem", &cert)?;
        Ok(Ca::new(cert, key, split_pem(chain), root, not_after))
    }

    /// Makes a self-signed root for `trust_domain` (Istio's: organization = the
    /// trust domain, 10 years, CertSign): its certificate and key, PEM.
    pub fn generate_root(trust_domain: &str) -> Result<(String, String), CaError> {
        let key = KeyPair::generate().map_err(|e| invalid("generating the CA key", e))?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::OrganizationName, trust_domain);
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let now = OffsetDateTime::now_utc();
        params.not_before = now;
        params.not_after = now + SELF_SIGNED_ROOT_TTL;
        params.serial_number = Some(random_serial());
        let cert = params
            .self_signed(&key)
            .map_err(|e| invalid("self-signing the CA", e))?
            .pem();
        Ok((cert, key.serialize_pem()))
    }

    /// The self-signed CA kept in `dir`: read back if there, else created for
    /// `trust_domain` and written (the key at mode 0600).
    pub fn self_signed(dir: &Path, trust_domain: &str) -> Result<Ca, CaError> {
        let cert_path = dir.join("ca-cert.pem");
        let key_path = dir.join("ca-key.pem");
        if cert_path.is_file() && key_path.is_file() {
            let cert = read(&cert_path)?;
            return Ca::from_pems(cert.clone(), &read(&key_path)?, "", cert);
        }
        let (cert, key) = Ca::generate_root(trust_domain)?;
        std::fs::create_dir_all(dir).map_err(|source| CaError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        write_private(&key_path, &key)?;
        for file in ["ca-cert.pem", "root-cert.pem"] {
            std::fs::write(dir.join(file), &cert).map_err(|source| CaError::Io {
                path: dir.join(file),
                source,
            })?;
        }
        Ca::from_pems(cert.clone(), &key, "", cert)
    }

    fn new(
        signing_cert_pem: String,
        key: KeyPair,
        chain: Vec<String>,
        root: String,
        not_after: OffsetDateTime,
    ) -> Ca {
        Ca {
            signing_cert_pem,
            key,
            chain,
            root,
            not_after,
            default_ttl: DEFAULT_WORKLOAD_TTL,
            max_ttl: MAX_WORKLOAD_TTL,
        }
    }

    /// The root bundle (PEM), as published in `istio-ca-root-cert`.
    pub fn root_pem(&self) -> &str {
        &self.root
    }

    /// When the signing certificate expires.
    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    /// When the first certificate of the root bundle expires.
    pub fn root_not_after(&self) -> Option<OffsetDateTime> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(self.root.as_bytes()).ok()?;
        Some(pem.parse_x509().ok()?.validity().not_after.to_datetime())
    }

    /// A serving certificate for the control plane itself (Istio's DNS certificate
    /// of istiod): a new ECDSA P-256 key, `dns_names` as SANs, Istio's 10-year
    /// lifetime clamped to the signer. Returns the chain (leaf, intermediates) and
    /// the key, PEM.
    pub fn issue_serving(&self, dns_names: &[String]) -> Result<(String, String), CaError> {
        let ttl = SELF_SIGNED_ROOT_TTL;
        self.issue_with_new_key(dns_names, ttl, ttl)
    }

    /// A certificate for `identities` on a new ECDSA P-256 key, for `ttl` (zero: the
    /// default workload lifetime), as a workload that sent a CSR would get it: the
    /// chain without the root (what a TLS peer presents) and the key, PEM.
    pub fn issue_key_pair(
        &self,
        identities: &[String],
        ttl: Duration,
    ) -> Result<(String, String), CaError> {
        self.issue_with_new_key(identities, ttl, self.max_ttl)
    }

    fn issue_with_new_key(
        &self,
        names: &[String],
        ttl: Duration,
        max_ttl: Duration,
    ) -> Result<(String, String), CaError> {
        let key = KeyPair::generate().map_err(|e| invalid("generating a key", e))?;
        let csr = CertificateParams::new(Vec::<String>::new())
            .and_then(|p| p.serialize_request(&key))
            .and_then(|r| r.pem())
            .map_err(|e| invalid("a certificate request", e))?;
        let mut chain = self.sign_with(&csr, names, ttl, max_ttl)?;
        // The root is not part of what a peer sends.
        chain.pop();
        Ok((chain.concat(), key.serialize_pem()))
    }

    /// Signs a workload certificate for `identities` (SPIFFE URIs, IPs or DNS names)
    /// with the CSR's public key, for `ttl` (zero: the default); returns the chain in
    /// Istio's order.
    pub fn sign(
        &self,
        csr_pem: &str,
        identities: &[String],
        ttl: Duration,
    ) -> Result<Vec<String>, CaError> {
        self.sign_with(csr_pem, identities, ttl, self.max_ttl)
    }

    fn sign_with(
        &self,
        csr_pem: &str,
        identities: &[String],
        ttl: Duration,
        max_ttl: Duration,
    ) -> Result<Vec<String>, CaError> {
        let public_key = csr_public_key(csr_pem)?;
        if ttl > max_ttl {
            return Err(CaError::Ttl {
                requested: ttl,
                max: max_ttl,
            });
        }
        let ttl = if ttl.is_zero() { self.default_ttl } else { ttl };
        let now = OffsetDateTime::now_utc();
        if self.not_after <= now {
            return Err(CaError::Expired(self.not_after));
        }
        let mut params = CertificateParams::default();
        // An empty subject: the SAN extension is then critical, as Istio writes it.
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = identities
            .iter()
            .map(|id| {
                if id.starts_with("spiffe://") {
                    id.as_str()
                        .try_into()
                        .map(SanType::URI)
                        .map_err(|e| invalid(id.clone(), e))
                } else if let Ok(ip) = id.parse() {
                    Ok(SanType::IpAddress(ip))
                } else {
                    id.as_str()
                        .try_into()
                        .map(SanType::DnsName)
                        .map_err(|e| invalid(id.clone(), e))
                }
            })
            .collect::<Result<_, _>>()?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.not_before = now - time::Duration::minutes(2);
        params.not_after = (now + ttl).min(self.not_after);
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        let issuer = Issuer::from_ca_cert_pem(&self.signing_cert_pem, &self.key)
            .map_err(|e| invalid("ca-cert.pem", e))?;
        let leaf = params
            .signed_by(&public_key, &issuer)
            .map_err(|e| invalid("signing", e))?
            .pem();
        let mut out = vec![leaf];
        out.extend(self.chain.iter().cloned());
        out.push(self.root.clone());
        Ok(out)
    }
}

/// The RSA key sizes whose CSR signatures meshfed verifies (ring's
/// `RSA_PKCS1_2048_8192_*`).
pub const CSR_RSA_BITS: std::ops::RangeInclusive<usize> = 2048..=8192;

/// The public key of a PEM CSR whose signature verifies. Its subject and extensions
/// are not read: the certificate carries what the CA decides (Istio ignores them too).
fn csr_public_key(csr_pem: &str) -> Result<SubjectPublicKeyInfo, CaError> {
    use x509_parser::prelude::FromDer;
    use x509_parser::public_key::PublicKey;
    let (_, pem) = x509_parser::pem::parse_x509_pem(csr_pem.as_bytes())
        .map_err(|e| CaError::Csr(format!("not PEM: {e}")))?;
    let (_, csr) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
            .map_err(|e| CaError::Csr(format!("not a PKCS#10 certificate request: {e}")))?;
    let spki = &csr.certification_request_info.subject_pki;
    if let Ok(PublicKey::RSA(rsa)) = spki.parsed() {
        let bits = unsigned_bits(rsa.modulus);
        if !CSR_RSA_BITS.contains(&bits) {
            return Err(CaError::Csr(format!(
                "RSA key of {bits} bits: outside the {}..={} bits meshfed verifies",
                CSR_RSA_BITS.start(),
                CSR_RSA_BITS.end()
            )));
        }
    }
    csr.verify_signature().map_err(|e| {
        CaError::Csr(format!(
            "invalid CSR signature ({}, algorithm {}): {e}",
            key_kind(spki),
            csr.signature_algorithm.algorithm
        ))
    })?;
    SubjectPublicKeyInfo::from_der(spki.raw).map_err(|e| CaError::Csr(e.to_string()))
}

/// "RSA 2048", "EC 256", ... for error messages.
fn key_kind(spki: &x509_parser::x509::SubjectPublicKeyInfo<'_>) -> String {
    use x509_parser::public_key::PublicKey;
    match spki.parsed() {
        Ok(PublicKey::RSA(rsa)) => format!("RSA {} bits", unsigned_bits(rsa.modulus)),
        Ok(PublicKey::EC(ec)) => format!("EC {} bits", ec.key_size()),
        Ok(_) => "a key of another kind".to_string(),
        Err(_) => "an unreadable key".to_string(),
    }
}

/// The bit length of a big-endian unsigned integer.
fn unsigned_bits(bytes: &[u8]) -> usize {
    let bytes = match bytes.iter().position(|b| *b != 0) {
        Some(first) => &bytes[first..],
        None => return 0,
    };
    bytes.len() * 8 - bytes[0].leading_zeros() as usize
}

/// A CA private key from PEM: PKCS#8 (`PRIVATE KEY`), PKCS#1 RSA (`RSA PRIVATE KEY`,
/// what istiod writes) or SEC1 ECDSA P-256/P-384 (`EC PRIVATE KEY`). ring reads only
/// PKCS#8, so the other two are wrapped into a PKCS#8 `PrivateKeyInfo` first.
pub fn key_pair_from_pem(text: &str) -> Result<KeyPair, String> {
    let block = pem_block(text)?;
    let unreadable = |kind: &str, e: rcgen::Error| format!("{kind} key not usable: {e}");
    match block.label.as_str() {
        "PRIVATE KEY" => {
            KeyPair::try_from(block.contents.as_slice()).map_err(|e| unreadable("PKCS#8", e))
        }
        "RSA PRIVATE KEY" => KeyPair::try_from(pkcs8_of(RSA_ALGORITHM, &block.contents))
            .map_err(|e| unreadable("PKCS#1 RSA", e) + " (RSA keys of 2048 to 4096 bits sign)"),
        "EC PRIVATE KEY" => [EC_P256_ALGORITHM, EC_P384_ALGORITHM]
            .iter()
            .find_map(|alg| KeyPair::try_from(pkcs8_of(alg, &block.contents)).ok())
            .ok_or_else(|| "SEC1 EC key not usable: only P-256 and P-384 keys sign".to_string()),
        other => Err(format!(
            "a PEM block \"{other}\" where a private key was expected (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)"
        )),
    }
}

/// The first PEM block of `text` whose label names a private key, else the first block.
fn pem_block(text: &str) -> Result<x509_parser::pem::Pem, String> {
    let blocks = x509_parser::pem::Pem::iter_from_buffer(text.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM: {e}"))?;
    let at = blocks
        .iter()
        .position(|b| b.label.ends_with("PRIVATE KEY"))
        .unwrap_or(0);
    blocks
        .into_iter()
        .nth(at)
        .ok_or_else(|| "no PEM block in it".to_string())
}

/// The DER `AlgorithmIdentifier` of rsaEncryption (1.2.840.113549.1.1.1, NULL).
const RSA_ALGORITHM: &[u8] = &[
    0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
];
/// id-ecPublicKey (1.2.840.10045.2.1) on prime256v1 (1.2.840.10045.3.1.7).
const EC_P256_ALGORITHM: &[u8] = &[
    0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48,
    0xce, 0x3d, 0x03, 0x01, 0x07,
];
/// id-ecPublicKey on secp384r1 (1.3.132.0.34).
const EC_P384_ALGORITHM: &[u8] = &[
    0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b, 0x81, 0x04,
    0x00, 0x22,
];

/// A PKCS#8 v1 `PrivateKeyInfo` (RFC 5208): version 0, `algorithm`, the key as an
/// OCTET STRING.
fn pkcs8_of(algorithm: &[u8], key: &[u8]) -> Vec<u8> {
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend_from_slice(algorithm);
    der_tlv(0x04, key, &mut body);
    let mut out = Vec::with_capacity(body.len() + 4);
    der_tlv(0x30, &body, &mut out);
    out
}

/// Appends a DER tag-length-value to `out`.
fn der_tlv(tag: u8, value: &[u8], out: &mut Vec<u8>) {
    out.push(tag);
    let len = value.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(value);
}

/// A random positive 128-bit serial number.
fn random_serial() -> SerialNumber {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system random source works");
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

/// Writes public material (the root bundle) for workloads to read: a temporary
/// file in the same directory, mode 0644, renamed over `path`.
pub fn write_public(path: &Path, text: &str) -> Result<(), CaError> {
    let io = |source| CaError::Io {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(io)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)
}

fn write_private(path: &Path, text: &str) -> Result<(), CaError> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    let io = |source| CaError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = options.open(path).map_err(io)?;
    file.write_all(text.as_bytes()).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr(key: &KeyPair, sans: &[&str]) -> String {
        let params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.serialize_request(key).unwrap().pem().unwrap()
    }

    fn parse(pem_text: &str) -> x509_parser::pem::Pem {
        x509_parser::pem::parse_x509_pem(pem_text.as_bytes())
            .unwrap()
            .1
    }

    #[test]
    fn a_self_signed_root_is_made_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::self_signed(dir.path(), "example.org").unwrap();
        let again = Ca::self_signed(dir.path(), "example.org").unwrap();
        assert_eq!(
            ca.root_pem(),
            again.root_pem(),
            "the same root after a restart"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("ca-key.pem"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let root = parse(ca.root_pem());
        let root = root.parse_x509().unwrap();
        assert!(root.is_ca());
        assert_eq!(
            root.subject()
                .iter_organization()
                .next()
                .unwrap()
                .as_str()
                .unwrap(),
            "example.org"
        );
        assert!(!format!("{ca:?}").contains("PRIVATE"), "no key in Debug");
    }

    #[test]
    fn workload_certificates_carry_only_the_callers_identity() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::self_signed(dir.path(), "cluster.local").unwrap();
        let key = KeyPair::generate().unwrap();
        let request = csr(&key, &["evil.example.com"]);
        let id = "spiffe://cluster.local/ns/default/sa/reviews".to_string();
        let chain = ca
            .sign(&request, std::slice::from_ref(&id), Duration::ZERO)
            .unwrap();
        assert_eq!(chain.len(), 2, "leaf, root");
        assert_eq!(chain[1], ca.root_pem());
        let leaf = parse(&chain[0]);
        let leaf = leaf.parse_x509().unwrap();
        let san = leaf.subject_alternative_name().unwrap().unwrap();
        assert!(san.critical, "SAN critical with an empty subject");
        let names: Vec<String> = san
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(
            names,
            [format!("URI({id})")],
            "the CSR's own SAN is ignored"
        );
        assert!(!leaf.is_ca());
        let life = leaf.validity().not_after.timestamp() - leaf.validity().not_before.timestamp();
        assert_eq!(life, 24 * 3600 + 120, "default TTL, from two minutes back");
        // Signed by the root.
        let root = parse(ca.root_pem());
        let root = root.parse_x509().unwrap();
        leaf.verify_signature(Some(root.public_key())).unwrap();
    }

    #[test]
    fn ttl_over_the_max_garbage_and_bad_signatures_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::self_signed(dir.path(), "cluster.local").unwrap();
        let key = KeyPair::generate().unwrap();
        let request = csr(&key, &[]);
        let id = ["spiffe://cluster.local/ns/a/sa/b".to_string()];
        assert!(matches!(
            ca.sign(&request, &id, MAX_WORKLOAD_TTL + Duration::from_secs(1)),
            Err(CaError::Ttl { .. })
        ));
        assert!(matches!(
            ca.sign("not a csr", &id, Duration::ZERO),
            Err(CaError::Csr(_))
        ));
        // One byte of the signature changed.
        let mut der = pem::parse(&request).unwrap().into_contents();
        let last = der.len() - 1;
        der[last] ^= 1;
        let tampered = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", der));
        assert!(matches!(
            ca.sign(&tampered, &id, Duration::ZERO),
            Err(CaError::Csr(_))
        ));
    }

    #[test]
    fn a_plugged_in_ca_returns_istios_chain_order_and_partial_bundles_are_errors() {
        // root -> intermediate (the signing CA), as `cacerts` holds them.
        let root_key = KeyPair::generate().unwrap();
        let mut root_params = CertificateParams::default();
        root_params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        root_params
            .distinguished_name
            .push(DnType::CommonName, "root");
        let root_cert = root_params.self_signed(&root_key).unwrap();
        let root_issuer = Issuer::new(root_params, &root_key);
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::default();
        ca_params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "intermediate");
        let ca_cert = ca_params.signed_by(&ca_key, &root_issuer).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca-cert.pem"), ca_cert.pem()).unwrap();
        assert!(matches!(
            Ca::plugged(dir.path()),
            Err(CaError::Incomplete { .. })
        ));
        std::fs::write(dir.path().join("ca-key.pem"), ca_key.serialize_pem()).unwrap();
        std::fs::write(dir.path().join("root-cert.pem"), root_cert.pem()).unwrap();
        std::fs::write(
            dir.path().join("cert-chain.pem"),
            format!("{}{}", ca_cert.pem(), root_cert.pem()),
        )
        .unwrap();
        let ca = Ca::plugged(dir.path()).unwrap().expect("plugged in");
        let key = KeyPair::generate().unwrap();
        let chain = ca
            .sign(
                &csr(&key, &[]),
                &["spiffe://cluster.local/ns/a/sa/b".to_string()],
                Duration::from_secs(3600),
            )
            .unwrap();
        assert_eq!(
            chain.len(),
            4,
            "leaf, each cert of cert-chain.pem, then the root bundle"
        );
        assert_eq!(chain[1], ca_cert.pem());
        assert_eq!(chain[3], root_cert.pem());
        let leaf = parse(&chain[0]);
        let leaf = leaf.parse_x509().unwrap();
        let intermediate = parse(&chain[1]);
        let intermediate = intermediate.parse_x509().unwrap();
        leaf.verify_signature(Some(intermediate.public_key()))
            .unwrap();
        assert!(
            Ca::plugged(tempfile::tempdir().unwrap().path())
                .unwrap()
                .is_none()
        );
    }

    /// istiod's self-signed CA as it writes it to `istio-ca-secret` (RSA 2048, PKCS#1),
    /// and the same key as PKCS#8.
    const ISTIOD_CERT: &str = include_str!("../tests/data/istiod-ca/ca-cert.pem");
    const ISTIOD_KEY_PKCS1: &str = include_str!("../tests/data/istiod-ca/ca-key.pem");
    const ISTIOD_KEY_PKCS8: &str = include_str!("../tests/data/istiod-ca/ca-key-pkcs8.pem");
    const EC_CERT: &str = include_str!("../tests/data/istiod-ca/ec-p256-cert.pem");
    const EC_KEY_SEC1: &str = include_str!("../tests/data/istiod-ca/ec-p256-key.pem");
    const CSR_WITH_SKI: &str = include_str!("../tests/data/istiod-ca/csr-with-ski.pem");

    fn signs_and_chains(ca: &Ca, root_pem: &str) -> String {
        let key = KeyPair::generate().unwrap();
        let chain = ca
            .sign(
                &csr(&key, &[]),
                &["spiffe://cluster.local/ns/a/sa/b".to_string()],
                Duration::ZERO,
            )
            .unwrap();
        assert_eq!(chain.last().unwrap(), root_pem);
        let leaf = parse(&chain[0]);
        let leaf = leaf.parse_x509().unwrap();
        let root = parse(root_pem);
        let root = root.parse_x509().unwrap();
        leaf.verify_signature(Some(root.public_key())).unwrap();
        assert_eq!(leaf.issuer(), root.subject());
        leaf.signature_algorithm.algorithm.to_id_string()
    }

    #[test]
    fn istiods_pkcs1_and_pkcs8_rsa_keys_sign_with_sha256_rsa() {
        assert!(ISTIOD_KEY_PKCS1.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
        for key in [ISTIOD_KEY_PKCS1, ISTIOD_KEY_PKCS8] {
            let ca = Ca::from_pems(ISTIOD_CERT.into(), key, "", ISTIOD_CERT.into()).unwrap();
            // sha256WithRSAEncryption, as Go's x509 signs with an RSA key.
            assert_eq!(signs_and_chains(&ca, ISTIOD_CERT), "1.2.840.113549.1.1.11");
        }
    }

    #[test]
    fn a_sec1_ec_key_signs_with_ecdsa_sha256() {
        assert!(EC_KEY_SEC1.starts_with("-----BEGIN EC PRIVATE KEY-----"));
        let ca = Ca::from_pems(EC_CERT.into(), EC_KEY_SEC1, "", EC_CERT.into()).unwrap();
        assert_eq!(signs_and_chains(&ca, EC_CERT), "1.2.840.10045.4.3.2");
        // A key that is not the certificate's is no CA; a wrong label is named.
        let err = key_pair_from_pem(ISTIOD_CERT).unwrap_err();
        assert!(err.contains("\"CERTIFICATE\""), "{err}");
        let err = key_pair_from_pem(
            "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n",
        )
        .unwrap_err();
        assert!(err.starts_with("PKCS#1 RSA key not usable"), "{err}");
    }

    #[test]
    fn csr_extensions_are_ignored_not_refused() {
        let ca =
            Ca::from_pems(ISTIOD_CERT.into(), ISTIOD_KEY_PKCS1, "", ISTIOD_CERT.into()).unwrap();
        let id = "spiffe://cluster.local/ns/default/sa/y".to_string();
        let chain = ca
            .sign(CSR_WITH_SKI, std::slice::from_ref(&id), Duration::ZERO)
            .expect("a subject key identifier in the CSR does not refuse it");
        let leaf = parse(&chain[0]);
        let leaf = leaf.parse_x509().unwrap();
        let names: Vec<String> = leaf
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(names, [format!("URI({id})")]);
        assert!(
            leaf.subject().iter().next().is_none(),
            "the CSR's subject is not copied"
        );
    }

    #[test]
    fn unsigned_bits_counts_from_the_top_bit() {
        assert_eq!(unsigned_bits(&[0x00, 0x80, 0x00]), 16);
        assert_eq!(unsigned_bits(&[0x01, 0xff]), 9);
        assert_eq!(unsigned_bits(&[0, 0]), 0);
    }
}

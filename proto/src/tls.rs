//! TLS material for every Cairn connection, loaded and checked in one place.
//!
//! The replica, the worker, the leader-following client and `cairnctl` all name their PEM files
//! with [`TlsFiles`] (TOML `[tls]`: `cert_file`, `key_file`, `ca_file`) and load them here, so a
//! bad file is reported the same way everywhere: which file, and what is wrong with it (missing,
//! unreadable, not PEM, no certificate, no key, a key that is not the certificate's).
//!
//! - [`ServerTls`]: a replica's identity plus the cluster CA. It serves TLS to everyone and asks
//!   for a client certificate without requiring one ([`ServerTls::server_config`]), so admin
//!   clients and workers may connect with server authentication only; the Raft service demands
//!   a verified client certificate itself. Replicas dial each other presenting their own
//!   certificate ([`ServerTls::peer_client`]): mutual TLS between replicas.
//! - [`ClientTls`]: the CA to trust, and optionally a client identity.
//! - [`endpoint`]: the one function that turns `host:port` into a tonic endpoint, `https://` with
//!   the client TLS config, or `http://` without.
//!
//! The server name checked is the host of the address dialed, so a replica's certificate must
//! carry the addresses peers and clients reach it at (`advertise`, `peers`) as subject
//! alternative names (IP or DNS).

use std::path::{Path, PathBuf};

use rustls::pki_types::pem::{PemObject, SectionKind};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// Paths of the PEM files of one process (TOML `[tls]`). `ca_file` is always needed;
/// `cert_file` and `key_file` go together (a replica needs them, a client may present them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsFiles {
    /// This process's certificate chain (PEM, leaf first).
    pub cert_file: Option<PathBuf>,
    /// The private key of `cert_file` (PEM: PKCS#8, PKCS#1 RSA or SEC1 EC).
    pub key_file: Option<PathBuf>,
    /// The cluster CA certificate(s) (PEM): servers must present, and clients may present, a
    /// certificate it signed.
    pub ca_file: Option<PathBuf>,
}

/// Why TLS material cannot be used. Every variant names the file and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("`tls.{missing}` is required {why}")]
    Incomplete { missing: &'static str, why: &'static str },
    #[error("{what} {} does not exist", path.display())]
    Missing { what: &'static str, path: PathBuf },
    #[error("cannot read {what} {}: {source}", path.display())]
    Unreadable { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{what} {} is not PEM ({reason}); expected -----BEGIN ...----- sections", path.display())]
    NotPem { what: &'static str, path: PathBuf, reason: String },
    #[error("{what} {} holds no certificate (no -----BEGIN CERTIFICATE----- section)", path.display())]
    NoCertificate { what: &'static str, path: PathBuf },
    #[error("{what} {}: certificate {index} is not a usable X.509 certificate ({reason})", path.display())]
    BadCertificate { what: &'static str, path: PathBuf, index: usize, reason: String },
    #[error(
        "key file {} holds no private key (expected -----BEGIN PRIVATE KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY)",
        path.display()
    )]
    NoKey { path: PathBuf },
    #[error("key file {}: unsupported private key ({reason}); use an RSA, ECDSA P-256/P-384 or Ed25519 key", path.display())]
    BadKey { path: PathBuf, reason: String },
    #[error("key file {} does not belong to the certificate in {}; give the key the certificate was issued for", key.display(), cert.display())]
    KeyMismatch { key: PathBuf, cert: PathBuf },
}

const CERT: &str = "certificate file";
const CA: &str = "CA file";
const KEY: &str = "key file";

impl TlsFiles {
    /// Whether no file is named at all.
    pub fn is_empty(&self) -> bool {
        self.cert_file.is_none() && self.key_file.is_none() && self.ca_file.is_none()
    }

    /// Overrides the files given (as flags or environment variables) in `base`; `None` when no
    /// file is named anywhere.
    pub fn overlay(
        base: Option<TlsFiles>,
        cert_file: Option<&Path>,
        key_file: Option<&Path>,
        ca_file: Option<&Path>,
    ) -> Option<TlsFiles> {
        let mut files = base.unwrap_or_default();
        if let Some(p) = cert_file {
            files.cert_file = Some(p.to_owned());
        }
        if let Some(p) = key_file {
            files.key_file = Some(p.to_owned());
        }
        if let Some(p) = ca_file {
            files.ca_file = Some(p.to_owned());
        }
        (!files.is_empty()).then_some(files)
    }

    /// Loads a server's material: all three files are required.
    pub fn load_server(&self) -> Result<ServerTls, TlsError> {
        let why = "to serve TLS (the replica's certificate, its key and the cluster CA)";
        let cert = self.cert_file.as_deref().ok_or(TlsError::Incomplete { missing: "cert_file", why })?;
        let key = self.key_file.as_deref().ok_or(TlsError::Incomplete { missing: "key_file", why })?;
        let ca = self.ca_file.as_deref().ok_or(TlsError::Incomplete { missing: "ca_file", why })?;
        Ok(ServerTls { identity: load_identity(cert, key)?, ca: load_ca(ca)? })
    }

    /// Loads a client's material: the CA, and the identity when both its files are named.
    pub fn load_client(&self) -> Result<ClientTls, TlsError> {
        let ca = self.ca_file.as_deref().ok_or(TlsError::Incomplete {
            missing: "ca_file",
            why: "to connect with TLS (the CA that signed the replicas' certificates)",
        })?;
        let identity = match (self.cert_file.as_deref(), self.key_file.as_deref()) {
            (Some(cert), Some(key)) => Some(load_identity(cert, key)?),
            (None, None) => None,
            (Some(_), None) => {
                return Err(TlsError::Incomplete {
                    missing: "key_file",
                    why: "with `tls.cert_file` (a client certificate needs its key)",
                });
            }
            (None, Some(_)) => {
                return Err(TlsError::Incomplete {
                    missing: "cert_file",
                    why: "with `tls.key_file` (a client key needs its certificate)",
                });
            }
        };
        Ok(ClientTls::new(load_ca(ca)?, identity))
    }
}

/// A replica's TLS material: its identity and the cluster CA.
#[derive(Debug, Clone)]
pub struct ServerTls {
    identity: Identity,
    ca: Certificate,
}

impl ServerTls {
    /// TLS for the replica's listener: its identity; client certificates are verified against
    /// the cluster CA when presented, and optional (services that need one check for it).
    pub fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(self.identity.clone())
            .client_ca_root(self.ca.clone())
            .client_auth_optional(true)
    }

    /// TLS for dialing another replica: trust the cluster CA, present this replica's identity.
    pub fn peer_client(&self) -> ClientTls {
        ClientTls::new(self.ca.clone(), Some(self.identity.clone()))
    }
}

/// What a client trusts and, optionally, presents.
#[derive(Debug, Clone)]
pub struct ClientTls {
    config: ClientTlsConfig,
}

impl ClientTls {
    fn new(ca: Certificate, identity: Option<Identity>) -> Self {
        let mut config = ClientTlsConfig::new().ca_certificate(ca);
        if let Some(identity) = identity {
            config = config.identity(identity);
        }
        Self { config }
    }

    pub fn config(&self) -> &ClientTlsConfig {
        &self.config
    }
}

/// A tonic endpoint for `host:port`: `https://` with `tls`, `http://` without. The certificate
/// is checked against the host part.
pub fn endpoint(addr: &str, tls: Option<&ClientTls>) -> Result<Endpoint, tonic::transport::Error> {
    match tls {
        Some(tls) => Endpoint::from_shared(format!("https://{addr}"))?.tls_config(tls.config.clone()),
        None => Endpoint::from_shared(format!("http://{addr}")),
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            TlsError::Missing { what, path: path.to_owned() }
        } else {
            TlsError::Unreadable { what, path: path.to_owned(), source }
        }
    })
}

/// Every PEM section of `pem`, refusing anything that is not PEM.
fn sections(what: &'static str, path: &Path, pem: &[u8]) -> Result<Vec<(SectionKind, Vec<u8>)>, TlsError> {
    let not_pem = |reason: String| TlsError::NotPem { what, path: path.to_owned(), reason };
    let all = <(SectionKind, Vec<u8>)>::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| not_pem(e.to_string()))?;
    if all.is_empty() {
        return Err(not_pem("no PEM section found".to_owned()));
    }
    Ok(all)
}

/// The certificates of a PEM file, each checked to parse as X.509.
fn certificates(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = sections(what, path, pem)?
        .into_iter()
        .filter(|(kind, _)| *kind == SectionKind::Certificate)
        .map(|(_, der)| CertificateDer::from(der))
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { what, path: path.to_owned() });
    }
    for (i, cert) in certs.iter().enumerate() {
        // Taking it as a trust anchor parses the X.509 structure without judging its validity.
        rustls::RootCertStore::empty().add(cert.clone()).map_err(|e| TlsError::BadCertificate {
            what,
            path: path.to_owned(),
            index: i + 1,
            reason: e.to_string(),
        })?;
    }
    Ok(certs)
}

fn load_ca(path: &Path) -> Result<Certificate, TlsError> {
    let pem = read(CA, path)?;
    certificates(CA, path, &pem)?;
    Ok(Certificate::from_pem(pem))
}

fn load_identity(cert_path: &Path, key_path: &Path) -> Result<Identity, TlsError> {
    let cert_pem = read(CERT, cert_path)?;
    let certs = certificates(CERT, cert_path, &cert_pem)?;
    let key_pem = read(KEY, key_path)?;
    sections(KEY, key_path, &key_pem)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey { path: key_path.to_owned() },
        e => TlsError::NotPem { what: KEY, path: key_path.to_owned(), reason: e.to_string() },
    })?;
    let signing_key = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| TlsError::BadKey { path: key_path.to_owned(), reason: e.to_string() })?;
    match rustls::sign::CertifiedKey::new(certs, signing_key).keys_match() {
        Ok(()) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            return Err(TlsError::KeyMismatch { key: key_path.to_owned(), cert: cert_path.to_owned() });
        }
        // The key type cannot report its public key: nothing to compare, the handshake will tell.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(e) => {
            return Err(TlsError::BadCertificate {
                what: CERT,
                path: cert_path.to_owned(),
                index: 1,
                reason: e.to_string(),
            });
        }
    }
    Ok(Identity::from_pem(cert_pem, key_pem))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pki {
        dir: tempfile::TempDir,
    }

    impl Pki {
        fn new() -> Self {
            Self { dir: tempfile::tempdir().unwrap() }
        }

        fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
            let p = self.dir.path().join(name);
            std::fs::write(&p, contents).unwrap();
            p
        }

        /// A CA-signed leaf: (ca.pem, cert.pem, key.pem).
        fn leaf(&self, prefix: &str) -> (PathBuf, PathBuf, PathBuf) {
            let ca_key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let ca = params.self_signed(&ca_key).unwrap();
            let issuer = rcgen::Issuer::new(params, ca_key);
            let key = rcgen::KeyPair::generate().unwrap();
            let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
            (
                self.write(&format!("{prefix}ca.pem"), ca.pem()),
                self.write(&format!("{prefix}cert.pem"), leaf.pem()),
                self.write(&format!("{prefix}key.pem"), key.serialize_pem()),
            )
        }
    }

    fn files(cert: &Path, key: &Path, ca: &Path) -> TlsFiles {
        TlsFiles {
            cert_file: Some(cert.to_owned()),
            key_file: Some(key.to_owned()),
            ca_file: Some(ca.to_owned()),
        }
    }

    #[test]
    fn a_matching_pair_and_ca_load_for_server_and_client() {
        let pki = Pki::new();
        let (ca, cert, key) = pki.leaf("");
        let f = files(&cert, &key, &ca);
        f.load_server().unwrap();
        f.load_client().unwrap();
        TlsFiles { ca_file: Some(ca), ..TlsFiles::default() }.load_client().unwrap();
    }

    #[test]
    fn missing_keys_name_what_is_needed() {
        let err = TlsFiles::default().load_server().unwrap_err().to_string();
        assert!(err.starts_with("`tls.cert_file` is required"), "{err}");
        let err = TlsFiles::default().load_client().unwrap_err().to_string();
        assert!(err.starts_with("`tls.ca_file` is required"), "{err}");
        let half = TlsFiles { cert_file: Some("c".into()), ca_file: Some("a".into()), ..TlsFiles::default() };
        let err = half.load_client().unwrap_err().to_string();
        assert!(err.starts_with("`tls.key_file` is required with `tls.cert_file`"), "{err}");
    }

    #[test]
    fn a_missing_file_is_named() {
        let pki = Pki::new();
        let (ca, cert, _) = pki.leaf("");
        let absent = pki.dir.path().join("absent.pem");
        let err = files(&cert, &absent, &ca).load_server().unwrap_err();
        assert!(matches!(err, TlsError::Missing { what: KEY, .. }), "{err}");
        assert_eq!(err.to_string(), format!("key file {} does not exist", absent.display()));
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let pki = Pki::new();
        let (ca, _, key) = pki.leaf("");
        // A directory exists but cannot be read as a file, whoever runs the test.
        let dir = pki.dir.path().to_owned();
        let err = files(&dir, &key, &ca).load_server().unwrap_err();
        assert!(matches!(err, TlsError::Unreadable { what: CERT, .. }), "{err}");
        assert!(err.to_string().starts_with(&format!("cannot read certificate file {}", dir.display())));
    }

    #[test]
    fn a_file_that_is_not_pem_is_refused() {
        let pki = Pki::new();
        let (_, cert, key) = pki.leaf("");
        let ca = pki.write("ca.der", [0x30u8, 0x82, 0x01, 0x0a, 0x02]);
        let err = files(&cert, &key, &ca).load_server().unwrap_err();
        assert!(matches!(err, TlsError::NotPem { what: CA, .. }), "{err}");
        let torn = pki.write("torn.pem", "-----BEGIN CERTIFICATE-----\nMIIB\n");
        let err = files(&torn, &key, &cert).load_server().unwrap_err();
        assert!(matches!(err, TlsError::NotPem { what: CERT, .. }), "{err}");
        assert!(err.to_string().contains(&torn.display().to_string()), "{err}");
    }

    #[test]
    fn a_certificate_file_without_a_certificate_is_refused() {
        let pki = Pki::new();
        let (ca, _, key) = pki.leaf("");
        // A key where the certificate belongs: PEM, but no certificate in it.
        let err = files(&key, &key, &ca).load_server().unwrap_err();
        assert!(matches!(err, TlsError::NoCertificate { what: CERT, .. }), "{err}");
        let junk =
            pki.write("junk.pem", "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n");
        let err = files(&junk, &key, &ca).load_server().unwrap_err();
        assert!(matches!(err, TlsError::BadCertificate { what: CERT, index: 1, .. }), "{err}");
    }

    #[test]
    fn a_key_file_without_a_key_is_refused() {
        let pki = Pki::new();
        let (ca, cert, _) = pki.leaf("");
        let err = files(&cert, &cert, &ca).load_server().unwrap_err();
        assert!(matches!(err, TlsError::NoKey { .. }), "{err}");
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let pki = Pki::new();
        let (ca, cert, _) = pki.leaf("a-");
        let (_, _, other_key) = pki.leaf("b-");
        let err = files(&cert, &other_key, &ca).load_server().unwrap_err();
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
        assert!(err.to_string().contains("does not belong to the certificate"), "{err}");
    }

    #[test]
    fn flags_overlay_the_file_and_nothing_named_is_none() {
        assert_eq!(TlsFiles::overlay(None, None, None, None), None);
        let base =
            TlsFiles { ca_file: Some("file-ca".into()), cert_file: Some("c".into()), ..TlsFiles::default() };
        let f =
            TlsFiles::overlay(Some(base), None, Some(Path::new("k")), Some(Path::new("flag-ca"))).unwrap();
        assert_eq!(f.ca_file.as_deref(), Some(Path::new("flag-ca")));
        assert_eq!(f.cert_file.as_deref(), Some(Path::new("c")));
        assert_eq!(f.key_file.as_deref(), Some(Path::new("k")));
    }

    #[test]
    fn endpoints_take_the_scheme_of_their_tls() {
        let pki = Pki::new();
        let (ca, _, _) = pki.leaf("");
        let tls = TlsFiles { ca_file: Some(ca), ..TlsFiles::default() }.load_client().unwrap();
        assert_eq!(endpoint("127.0.0.1:7400", Some(&tls)).unwrap().uri().scheme_str(), Some("https"));
        assert_eq!(endpoint("127.0.0.1:7400", None).unwrap().uri().scheme_str(), Some("http"));
        assert_eq!(crate::addr::strip_scheme(" https://h:1/ "), "h:1");
        assert_eq!(crate::addr::strip_scheme("http://h:1"), "h:1");
        assert_eq!(crate::addr::strip_scheme("h:1"), "h:1");
    }
}

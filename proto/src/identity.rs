//! Who a client certificate says its holder is.
//!
//! Every certificate of a Cairn cluster is signed by the cluster CA, so "signed by our CA" says
//! only that the holder belongs to the cluster, not what it may do. The certificate names the
//! role and the id, by one of two conventions (a subject alternative name is preferred):
//!
//! | holder | URI SAN | or subject CN |
//! | --- | --- | --- |
//! | replica (Raft member) `<id>` | `cairn://node/<id>` | `cairn-node-<id>` |
//! | worker `<id>` | `cairn://worker/<id>` | `cairn-worker-<id>` |
//!
//! Anything else (an operator's certificate, a monitoring client's) is [`PeerIdentity::Other`]:
//! it may not act as a replica nor as a worker.

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The role and id a certificate names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerIdentity {
    /// A replica, by Raft node id.
    Node(u64),
    /// A worker, by worker id.
    Worker(String),
    /// Neither: what the subject says, for messages.
    Other(String),
}

const NODE_URI: &str = "cairn://node/";
const WORKER_URI: &str = "cairn://worker/";
const NODE_CN: &str = "cairn-node-";
const WORKER_CN: &str = "cairn-worker-";

/// The identity of a DER certificate; `None` when it cannot be parsed.
pub fn identity_of(der: &[u8]) -> Option<PeerIdentity> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let sans: Vec<String> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(u) => Some((*u).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    for uri in &sans {
        if let Some(id) = uri.strip_prefix(NODE_URI) {
            return id.parse().ok().filter(|id| *id > 0).map(PeerIdentity::Node);
        }
        if let Some(id) = uri.strip_prefix(WORKER_URI) {
            return (!id.is_empty()).then(|| PeerIdentity::Worker(id.to_owned()));
        }
    }
    let cn = cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()).unwrap_or_default();
    if let Some(id) = cn.strip_prefix(NODE_CN)
        && let Ok(id) = id.parse::<u64>()
        && id > 0
    {
        return Some(PeerIdentity::Node(id));
    }
    if let Some(id) = cn.strip_prefix(WORKER_CN)
        && !id.is_empty()
    {
        return Some(PeerIdentity::Worker(id.to_owned()));
    }
    Some(PeerIdentity::Other(cert.subject().to_string()))
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};

    use super::*;

    fn cert(cn: &str, uri: Option<&str>) -> Vec<u8> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        if let Some(u) = uri {
            params.subject_alt_names.push(SanType::URI(u.try_into().unwrap()));
        }
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn roles_come_from_the_uri_san_or_the_common_name() {
        assert_eq!(identity_of(&cert("x", Some("cairn://node/3"))), Some(PeerIdentity::Node(3)));
        assert_eq!(identity_of(&cert("cairn-node-2", None)), Some(PeerIdentity::Node(2)));
        assert_eq!(
            identity_of(&cert("x", Some("cairn://worker/w-1"))),
            Some(PeerIdentity::Worker("w-1".into()))
        );
        assert_eq!(identity_of(&cert("cairn-worker-w2", None)), Some(PeerIdentity::Worker("w2".into())));
        assert!(
            matches!(identity_of(&cert("operator", None)), Some(PeerIdentity::Other(s)) if s.contains("operator"))
        );
        // The SAN wins over the CN; a node id must be a positive number.
        assert_eq!(
            identity_of(&cert("cairn-node-1", Some("cairn://worker/w"))),
            Some(PeerIdentity::Worker("w".into()))
        );
        assert_eq!(identity_of(&cert("x", Some("cairn://node/0"))), None);
        assert!(matches!(identity_of(&cert("cairn-node-abc", None)), Some(PeerIdentity::Other(_))));
        assert_eq!(identity_of(b"not a certificate"), None);
    }
}

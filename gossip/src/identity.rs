//! The cluster's public-key identity, derived deterministically from the [`ClusterSecret`].
//!
//! Every node derives the same Ed25519 CA key (HKDF → seed) and so the same CA certificate, then
//! issues itself a fresh node certificate on each start. TLS on every QUIC connection requires the
//! peer's certificate to chain to that CA: possession of the secret is the only way in.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ED25519, SerialNumber,
};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::secret::ClusterSecret;

/// The DNS name every node certificate carries and every node dials: identity is "signed by the
/// cluster CA", not a host name.
pub(crate) const NODE_SERVER_NAME: &str = "node.shoal.internal";
/// A node certificate also names its node: `<node id>` + this suffix, as a DNS name, so every
/// message can be attributed to the certificate that carried it, not to what it claims.
const NODE_ID_SUFFIX: &str = ".id.node.shoal.internal";

/// The node id a node certificate (DER) names, if it names exactly one.
pub fn node_id_of(cert_der: &[u8]) -> Option<String> {
    let der = CertificateDer::from(cert_der);
    let cert = webpki::EndEntityCert::try_from(&der).ok()?;
    let mut ids = cert
        .valid_dns_names()
        .filter_map(|name| name.strip_suffix(NODE_ID_SUFFIX))
        .filter(|id| !id.is_empty() && !id.contains('.'));
    let id = ids.next()?;
    ids.next().is_none().then(|| id.to_owned())
}
/// ALPN of Shoal's node-to-node protocol; the frame header carries the finer-grained version.
pub(crate) const ALPN: &[u8] = b"shoal/1";

/// PKCS#8 v1 wrapping of a raw Ed25519 seed (RFC 8410): SEQUENCE { 0, AlgorithmIdentifier
/// { id-Ed25519 }, OCTET STRING { OCTET STRING seed } }.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot build the cluster CA: {0}")]
    Ca(rcgen::Error),
    #[error("cannot issue a certificate for node {node_id}: {source}")]
    NodeCertificate {
        node_id: String,
        source: rcgen::Error,
    },
    #[error("cannot build the TLS configuration: {0}")]
    Tls(String),
}

/// The CA and derived identifiers shared by every node holding the same secret.
pub struct ClusterIdentity {
    cluster_id: String,
    api_token: String,
    ca_cert: CertificateDer<'static>,
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
    provider: Arc<CryptoProvider>,
}

/// A node's own certificate and private key, signed by the cluster CA.
pub struct NodeCertificate {
    pub cert: CertificateDer<'static>,
    key_pkcs8: Vec<u8>,
}

impl NodeCertificate {
    pub fn private_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_pkcs8.clone()))
    }
}

impl ClusterIdentity {
    pub fn derive(secret: &ClusterSecret) -> Result<Self, IdentityError> {
        let mut id_bytes = [0u8; 8];
        secret.derive("cluster-id", &mut id_bytes);
        let cluster_id = format!("shoal-{}", hex::encode(id_bytes));
        let mut token = [0u8; 32];
        secret.derive("api-bearer-token", &mut token);

        let mut seed = [0u8; 32];
        secret.derive("cluster-ca-ed25519", &mut seed);
        let mut pkcs8 = ED25519_PKCS8_PREFIX.to_vec();
        pkcs8.extend_from_slice(&seed);
        let ca_key =
            KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(pkcs8), &PKCS_ED25519)
                .map_err(IdentityError::Ca)?;

        // Every field is fixed so that all nodes produce the byte-identical CA certificate
        // (Ed25519 signatures are deterministic).
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("Shoal cluster CA {cluster_id}"));
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.serial_number = Some(SerialNumber::from_slice(&id_bytes));
        params.not_before = rcgen::date_time_ymd(2024, 1, 1);
        params.not_after = rcgen::date_time_ymd(4000, 1, 1);
        let ca_cert = params.self_signed(&ca_key).map_err(IdentityError::Ca)?;
        Ok(Self {
            cluster_id,
            api_token: hex::encode(token),
            ca_cert: ca_cert.der().clone(),
            ca_pem: ca_cert.pem(),
            issuer: Issuer::new(params, ca_key),
            provider: Arc::new(rustls::crypto::ring::default_provider()),
        })
    }

    /// A short public name of the cluster (also chitchat's cluster id).
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The bearer token every agent of this cluster accepts on its API.
    pub fn api_token(&self) -> &str {
        &self.api_token
    }

    pub fn ca_certificate(&self) -> &CertificateDer<'static> {
        &self.ca_cert
    }

    /// Issues a certificate for `node_id` with a fresh Ed25519 key. `extra_names` (IP addresses
    /// or DNS names) are added as subject alternative names, e.g. for the API server.
    pub fn issue_node_certificate(
        &self,
        node_id: &str,
        extra_names: &[String],
    ) -> Result<NodeCertificate, IdentityError> {
        let wrap = |source| IdentityError::NodeCertificate {
            node_id: node_id.to_owned(),
            source,
        };
        let key = KeyPair::generate_for(&PKCS_ED25519).map_err(wrap)?;
        let mut names = vec![
            NODE_SERVER_NAME.to_owned(),
            format!("{node_id}{NODE_ID_SUFFIX}"),
        ];
        names.extend(extra_names.iter().cloned());
        let mut params = CertificateParams::new(names).map_err(wrap)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, node_id);
        params.distinguished_name = dn;
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer).map_err(wrap)?;
        Ok(NodeCertificate {
            cert: cert.der().clone(),
            key_pkcs8: key.serialize_der(),
        })
    }

    fn roots(&self) -> Arc<RootCertStore> {
        let mut roots = RootCertStore::empty();
        roots
            .add(self.ca_cert.clone())
            .expect("the CA certificate we just built parses");
        Arc::new(roots)
    }

    /// TLS server side of a node connection: TLS 1.3 only, client certificate required and
    /// verified against the cluster CA.
    pub fn node_server_config(
        &self,
        node: &NodeCertificate,
    ) -> Result<rustls::ServerConfig, IdentityError> {
        let tls = |e: rustls::Error| IdentityError::Tls(e.to_string());
        let verifier =
            WebPkiClientVerifier::builder_with_provider(self.roots(), self.provider.clone())
                .build()
                .map_err(|e| IdentityError::Tls(e.to_string()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![node.cert.clone()], node.private_key())
            .map_err(tls)?;
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(config)
    }

    /// TLS for the API server: server authentication only (clients present a bearer token),
    /// HTTP/1.1.
    pub fn api_server_config(
        &self,
        cert: &NodeCertificate,
    ) -> Result<rustls::ServerConfig, IdentityError> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| IdentityError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.clone()], cert.private_key())
            .map_err(|e| IdentityError::Tls(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// A verifier of servers whose certificate chains to the cluster CA.
    fn server_verifier(&self) -> Result<Arc<rustls::client::WebPkiServerVerifier>, IdentityError> {
        rustls::client::WebPkiServerVerifier::builder_with_provider(
            self.roots(),
            self.provider.clone(),
        )
        .build()
        .map_err(|e| IdentityError::Tls(e.to_string()))
    }

    /// TLS for a client of the API server (what a kubeconfig gives kubectl): the server must
    /// chain to the cluster CA; the client presents no certificate (it sends the bearer token).
    pub fn api_client_config(&self) -> Result<rustls::ClientConfig, IdentityError> {
        let tls = |e: rustls::Error| IdentityError::Tls(e.to_string());
        let verifier = self.server_verifier()?;
        let mut config = rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(tls)?
            .with_webpki_verifier(verifier)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// The CA certificate in PEM, for kubeconfigs.
    pub fn ca_certificate_pem(&self) -> &str {
        &self.ca_pem
    }

    /// TLS client side of a node connection: the server must chain to the cluster CA, and we
    /// present our node certificate.
    pub fn node_client_config(
        &self,
        node: &NodeCertificate,
    ) -> Result<rustls::ClientConfig, IdentityError> {
        let tls = |e: rustls::Error| IdentityError::Tls(e.to_string());
        let verifier = self.server_verifier()?;
        let mut config = rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls)?
            .with_webpki_verifier(verifier)
            .with_client_auth_cert(vec![node.cert.clone()], node.private_key())
            .map_err(tls)?;
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_secret_gives_identical_ca_and_ids() {
        let a = ClusterIdentity::derive(&ClusterSecret::from_bytes([1; 32])).unwrap();
        let b = ClusterIdentity::derive(&ClusterSecret::from_bytes([1; 32])).unwrap();
        let c = ClusterIdentity::derive(&ClusterSecret::from_bytes([2; 32])).unwrap();
        assert_eq!(a.ca_certificate(), b.ca_certificate());
        assert_eq!(a.cluster_id(), b.cluster_id());
        assert_eq!(a.api_token(), b.api_token());
        assert_ne!(a.ca_certificate(), c.ca_certificate());
        assert_ne!(a.cluster_id(), c.cluster_id());
    }

    #[test]
    fn a_node_certificate_names_its_node() {
        let id = ClusterIdentity::derive(&ClusterSecret::from_bytes([1; 32])).unwrap();
        let cert = id
            .issue_node_certificate("0123abcd4567ef89", &["127.0.0.1".into()])
            .unwrap();
        assert_eq!(
            node_id_of(cert.cert.as_ref()).as_deref(),
            Some("0123abcd4567ef89")
        );
        assert_eq!(node_id_of(id.ca_certificate().as_ref()), None);
        assert_eq!(node_id_of(b"not a certificate"), None);
    }

    #[test]
    fn node_certificates_build_tls_configs() {
        let id = ClusterIdentity::derive(&ClusterSecret::from_bytes([3; 32])).unwrap();
        let node = id
            .issue_node_certificate("0123abcd", &["127.0.0.1".into()])
            .unwrap();
        id.node_server_config(&node).unwrap();
        id.node_client_config(&node).unwrap();
    }
}

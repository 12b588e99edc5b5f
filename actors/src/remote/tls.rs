//! TLS for cluster connections, when certificates are configured: the node presents
//! its certificate, the front checks it against a CA (the cookie still authenticates
//! the front). PEM files, read once at start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The node's side: its certificate chain and private key.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeTls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The front's side: the CA that signed the nodes' certificates, and optionally the
/// name to check them against (default: the node address's host).
#[derive(Debug, Clone, PartialEq)]
pub struct FrontTls {
    pub ca: PathBuf,
    pub server_name: Option<String>,
}

pub(crate) fn acceptor(tls: &NodeTls) -> Result<TlsAcceptor, String> {
    let certs = CertificateDer::pem_file_iter(&tls.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("TLS certificate {}: {e}", tls.cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(&tls.key).map_err(|e| format!("TLS key {}: {e}", tls.key.display()))?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS certificate and key: {e}"))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Named explicitly: the process-wide default panics when several providers are built in.
fn provider() -> Arc<tokio_rustls::rustls::crypto::CryptoProvider> {
    Arc::new(tokio_rustls::rustls::crypto::aws_lc_rs::default_provider())
}

pub(crate) struct Client {
    pub connector: TlsConnector,
    pub server_name: ServerName<'static>,
}

pub(crate) fn connector(tls: &FrontTls, address: &str, target: SocketAddr) -> Result<Client, String> {
    let mut roots = RootCertStore::empty();
    let cas = CertificateDer::pem_file_iter(&tls.ca)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("TLS CA {}: {e}", tls.ca.display()))?;
    for ca in cas {
        roots.add(ca).map_err(|e| format!("TLS CA {}: {e}", tls.ca.display()))?;
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let host = match &tls.server_name {
        Some(name) => name.clone(),
        None => address.rsplit_once(':').map_or(address, |(host, _)| host).trim_matches(['[', ']']).to_string(),
    };
    let server_name = ServerName::try_from(host.clone())
        .or_else(|_| Ok::<_, String>(ServerName::IpAddress(target.ip().into())))
        .map_err(|e| format!("TLS server name {host}: {e}"))?;
    Ok(Client { connector: TlsConnector::from(Arc::new(config)), server_name })
}

//! TLS for cluster connections, when certificates are configured: the node presents
//! its certificate, the front checks it against a CA (the cookie still authenticates
//! the front). PEM files, read once at start ([`crate::tls`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use crate::tls::{provider, read_certificates};

/// The node's side: its certificate chain and private key.
pub type NodeTls = crate::tls::CertificateFiles;

/// The front's side: the CA that signed the nodes' certificates, and optionally the
/// name to check them against (default: the node address's host).
#[derive(Debug, Clone, PartialEq)]
pub struct FrontTls {
    pub ca: PathBuf,
    pub server_name: Option<String>,
}

pub(crate) struct Client {
    pub connector: TlsConnector,
    pub server_name: ServerName<'static>,
}

pub(crate) fn connector(tls: &FrontTls, address: &str, target: SocketAddr) -> Result<Client, String> {
    let mut roots = RootCertStore::empty();
    for ca in read_certificates(&tls.ca, "CA")? {
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

//! TLS from PEM files, for every listener that serves it: cluster nodes (`remote`) and
//! the HTTP server (`server.tls`). The files are read once, at start, so a bad path or
//! a key that does not match its certificate stops the start with the file named.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;
pub use tokio_rustls::TlsAcceptor;

/// A server's certificate chain (leaf first) and its private key, as PEM files.
#[derive(Debug, Clone, PartialEq)]
pub struct CertificateFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What accepts TLS connections with the certificate in `files` (no client certificates).
pub fn acceptor(files: &CertificateFiles) -> Result<TlsAcceptor, String> {
    let certs = read_certificates(&files.cert, "certificate")?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| format!("TLS key {}: {e}", files.key.display()))?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS certificate {} and key {}: {e}", files.cert.display(), files.key.display()))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Every certificate in a PEM file; `what` names the file's role in errors.
pub(crate) fn read_certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("TLS {what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("TLS {what} {}: no PEM certificate in the file", path.display()));
    }
    Ok(certs)
}

/// Named explicitly: the process-wide default panics when several providers are built in.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(tokio_rustls::rustls::crypto::aws_lc_rs::default_provider())
}

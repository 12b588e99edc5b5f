//! Certificates for TLS tests (made with `openssl`), and a minimal HTTPS client that
//! trusts only their CA.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// A CA and a certificate for 127.0.0.1 signed by it (made with `openssl`), or why not.
pub struct TestCerts {
    pub dir: TempDir,
}

impl TestCerts {
    pub fn make() -> Result<TestCerts, String> {
        let dir = TempDir::new().unwrap();
        let at = |f: &str| dir.path().join(f).to_string_lossy().into_owned();
        std::fs::write(at("ext.cnf"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n").unwrap();
        let steps: Vec<Vec<String>> = vec![
            "req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=tokenrouter-test-ca"
                .split(' ')
                .map(String::from)
                .chain(["-keyout".into(), at("ca.key"), "-out".into(), at("ca.pem")])
                .collect(),
            "req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1"
                .split(' ')
                .map(String::from)
                .chain(["-keyout".into(), at("node.key"), "-out".into(), at("node.csr")])
                .collect(),
            "x509 -req -days 1 -CAcreateserial"
                .split(' ')
                .map(String::from)
                .chain(["-in".into(), at("node.csr"), "-CA".into(), at("ca.pem"), "-CAkey".into(), at("ca.key")])
                .chain(["-extfile".into(), at("ext.cnf"), "-out".into(), at("node.pem")])
                .collect(),
        ];
        for step in steps {
            let out = Command::new("openssl").args(&step).output().map_err(|e| format!("openssl: {e}"))?;
            if !out.status.success() {
                return Err(format!("openssl {}: {}", step[0], String::from_utf8_lossy(&out.stderr).trim()));
            }
        }
        Ok(TestCerts { dir })
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.path().join(file).to_string_lossy().into_owned()
    }

    /// One HTTP/1.1 request over TLS to `addr`, trusting only this CA and checking the
    /// certificate is for 127.0.0.1: (status, body). Blocking; for tests.
    pub fn https_request(
        &self,
        addr: SocketAddr,
        method: &str,
        path: &str,
        json: &str,
    ) -> Result<(u16, String), String> {
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(self.path("ca.pem")).unwrap() {
            roots.add(ca.unwrap()).unwrap();
        }
        let provider = Arc::new(tokio_rustls::rustls::crypto::aws_lc_rs::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::IpAddress(addr.ip().into());
        let connection = ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
        let socket = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        socket.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut tls = StreamOwned::new(connection, socket);
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{json}",
            json.len()
        );
        tls.write_all(request.as_bytes()).map_err(|e| format!("TLS write: {e}"))?;
        let mut response = Vec::new();
        // The server closes after the response (`Connection: close`); rustls reports a
        // close without close_notify as an error, after the bytes it did receive.
        if let Err(e) = tls.read_to_end(&mut response) {
            if response.is_empty() {
                return Err(format!("TLS read: {e}"));
            }
        }
        let text = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("no HTTP response: {text:?}"))?;
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| format!("status: {head:?}"))?;
        Ok((status, body.to_string()))
    }
}

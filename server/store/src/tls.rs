//! TLS to PostgreSQL over rustls. The URL's `sslmode` decides whether it is used
//! (`disable`, `prefer`, `require`; the driver asks the server first). With a CA file the
//! server's certificate chain and host name are verified; without one the connection is
//! encrypted but the server is not authenticated — libpq's meaning of `require` when it has
//! no root certificate.

use std::{path::Path, sync::Arc};

use anyhow::Context as _;
use rustls::{
    DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::WebPkiSupportedAlgorithms,
    pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject as _},
};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The connector for every connection of a store.
pub(crate) fn connector(ca_file: Option<&Path>) -> anyhow::Result<MakeRustlsConnect> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let config = match ca_file {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(path)
                .with_context(|| format!("reading BERTH_DB_CA_FILE {}", path.display()))?;
            for cert in certs {
                let cert = cert.with_context(|| format!("parsing BERTH_DB_CA_FILE {}", path.display()))?;
                roots
                    .add(cert)
                    .with_context(|| format!("BERTH_DB_CA_FILE {}", path.display()))?;
            }
            anyhow::ensure!(
                !roots.is_empty(),
                "BERTH_DB_CA_FILE {} holds no certificate",
                path.display()
            );
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider.signature_verification_algorithms)))
            .with_no_client_auth(),
    };
    Ok(MakeRustlsConnect::new(config))
}

/// Accepts any server certificate, but still checks that the server holds its key (the
/// handshake signatures), so the session keys are the server's and not a passive
/// eavesdropper's.
#[derive(Debug)]
struct EncryptOnly(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

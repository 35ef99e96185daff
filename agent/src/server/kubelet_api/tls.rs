//! The kubelet API's TLS: the serving certificate (`--tls-cert-file`/`--tls-private-key-file`,
//! else a self-signed one kept under `<root-dir>/pki` as kubelet does) and the rustls server
//! configuration that asks for — but does not require — a client certificate signed by
//! `--client-ca-file` (a request without one may still carry a bearer token). Handshakes take
//! the certificate from a [`CurrentCert`], which `--rotate-server-certificates` (the
//! `rotation` module) replaces while the server runs.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};

/// kubelet's file names for its self-signed pair under `--cert-dir` (`<root-dir>/pki`).
pub const SELF_SIGNED_CERT: &str = "kubelet.crt";
pub const SELF_SIGNED_KEY: &str = "kubelet.key";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no PEM {what}")]
    Pem { path: PathBuf, what: &'static str },
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("generating the self-signed serving certificate")]
    Generate(#[from] rcgen::Error),
    #[error("no usable CA certificate in {path}")]
    ClientCa { path: PathBuf },
    #[error("building the TLS configuration")]
    Config(#[from] rustls::Error),
    #[error("building the client certificate verifier")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("--tls-cert-file and --tls-private-key-file go together")]
    HalfPair,
}

/// A certificate chain and its key.
#[derive(Debug)]
pub struct ServingCert {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

/// The given pair, or the self-signed one under `pki_dir` (made on first use, files 0600).
pub fn serving_cert(
    cert_file: Option<&Path>,
    key_file: Option<&Path>,
    pki_dir: &Path,
    node_name: &str,
) -> Result<ServingCert, TlsError> {
    match (cert_file, key_file) {
        (Some(cert), Some(key)) => load_pair(cert, key),
        (None, None) => {
            let (cert, key) = (
                pki_dir.join(SELF_SIGNED_CERT),
                pki_dir.join(SELF_SIGNED_KEY),
            );
            if !cert.exists() || !key.exists() {
                write_self_signed(pki_dir, &cert, &key, node_name)?;
            }
            load_pair(&cert, &key)
        }
        _ => Err(TlsError::HalfPair),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

pub(super) fn load_pair(cert: &Path, key: &Path) -> Result<ServingCert, TlsError> {
    let chain: Vec<_> = CertificateDer::pem_slice_iter(&read(cert)?)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(TlsError::Pem {
            path: cert.to_owned(),
            what: "certificate",
        });
    }
    let key = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|_| TlsError::Pem {
        path: key.to_owned(),
        what: "private key",
    })?;
    Ok(ServingCert { chain, key })
}

/// kubelet's `GenerateSelfSignedCertKey`: names the host, `localhost` and loopback.
fn write_self_signed(dir: &Path, cert: &Path, key: &Path, node: &str) -> Result<(), TlsError> {
    let names = vec![
        node.to_owned(),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
    ];
    let certified = rcgen::generate_simple_self_signed(names)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| TlsError::Write {
            path: dir.to_owned(),
            source,
        })?;
    write_private(key, certified.signing_key.serialize_pem().as_bytes())?;
    write_private(cert, certified.cert.pem().as_bytes())
}

/// Writes a new owner-only file (write, then rename, so a crash leaves no half file).
pub(super) fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    let err = |source| TlsError::Write {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(err)?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// The serving certificate handshakes use; [`CurrentCert::set`] replaces it for the
/// connections that follow.
#[derive(Debug)]
pub struct CurrentCert(RwLock<Arc<CertifiedKey>>);

impl CurrentCert {
    pub fn new(cert: ServingCert) -> Result<Arc<Self>, TlsError> {
        Ok(Arc::new(Self(RwLock::new(certified_key(cert)?))))
    }

    /// Serves `cert` from now on.
    pub fn set(&self, cert: ServingCert) -> Result<(), TlsError> {
        let key = certified_key(cert)?;
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = key;
        Ok(())
    }

    /// The chain served now (leaf first).
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.current().cert.clone()
    }

    fn current(&self) -> Arc<CertifiedKey> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn certified_key(cert: ServingCert) -> Result<Arc<CertifiedKey>, TlsError> {
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider.key_provider.load_private_key(cert.key)?;
    Ok(Arc::new(CertifiedKey::new(cert.chain, signing)))
}

/// The server configuration: HTTP/1.1 only, the certificate of `cert` at each handshake;
/// with a client CA, client certificates are verified against it (and optional, as bearer
/// tokens are the other way in).
pub fn server_config(
    cert: Arc<CurrentCert>,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&read(path)?).filter_map(Result::ok) {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(TlsError::ClientCa {
                    path: path.to_owned(),
                });
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(cert);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_self_signed_pair_is_made_once_owner_only_and_reused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = dir.path().join("pki");
        let first = serving_cert(None, None, &pki, "node-a").expect("generated");
        for name in [SELF_SIGNED_CERT, SELF_SIGNED_KEY] {
            let mode = std::fs::metadata(pki.join(name))
                .expect("file")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{name}");
        }
        let again = serving_cert(None, None, &pki, "node-a").expect("loaded");
        assert_eq!(first.chain, again.chain);
        assert!(server_config(CurrentCert::new(again).expect("key"), None).is_ok());
    }

    #[test]
    fn bad_files_and_half_pairs_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not pem").expect("write");
        assert!(matches!(
            serving_cert(Some(&junk), Some(&junk), dir.path(), "n"),
            Err(TlsError::Pem { .. })
        ));
        assert!(matches!(
            serving_cert(Some(&junk), None, dir.path(), "n"),
            Err(TlsError::HalfPair)
        ));
        let cert = serving_cert(None, None, dir.path(), "n").expect("generated");
        let cert = CurrentCert::new(cert).expect("key");
        assert!(matches!(
            server_config(cert, Some(&junk)),
            Err(TlsError::ClientCa { .. })
        ));
    }
}

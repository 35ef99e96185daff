//! `--rotate-server-certificates` (KubeletConfiguration `serverTLSBootstrap`): the kubelet
//! API's serving certificate issued by the cluster, as kubelet's certificate manager does.
//!
//! ```text
//!  start ──► <cert-dir>/kubelet-server-current.pem still valid? ── yes ─► serve it
//!                 │ no (the file or self-signed certificate keeps being served)
//!                 ▼
//!  renew: new ECDSA P-256 key ─► CSR (CN=system:node:<name>, O=system:nodes, SANs: the
//!         node's hostname and addresses) ─► CertificateSigningRequest, signer
//!         kubernetes.io/kubelet-serving ─► wait for status.certificate (someone approves,
//!         the controller-manager's signer signs; Denied/Failed or 15 min: a new request)
//!         ─► kubelet-server-<time>.pem (certificate + key, 0600), the -current.pem link
//!            moved to it ─► served from the next handshake
//!  sleep until 70–90 % (random) of the certificate's lifetime ─► renew again
//! ```
//!
//! Failures are logged and retried with a doubling delay (2 s to 5 min); whatever is being
//! served keeps being served meanwhile.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::tls::{CurrentCert, ServingCert, TlsError};
use super::x509;

/// kubelet's names: the signer, and the link to the certificate in use under `--cert-dir`.
pub const SIGNER: &str = "kubernetes.io/kubelet-serving";
pub const CURRENT_PEM: &str = "kubelet-server-current.pem";
/// How long one request is awaited before a new one is made (kubelet: 15 minutes).
const WAIT_FOR_SIGNING: Duration = Duration::from_secs(15 * 60);
const POLL: Duration = Duration::from_secs(1);
const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_MAX: Duration = Duration::from_secs(5 * 60);

#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    #[error("making the key or the certificate request")]
    Generate(#[from] rcgen::Error),
    #[error("the certificate signing request API")]
    Api(#[from] kube::Error),
    #[error("certificate signing request {name} was {condition}: {message}")]
    Refused {
        name: String,
        condition: String,
        message: String,
    },
    #[error(
        "certificate signing request {name} was not signed within {0:?}",
        WAIT_FOR_SIGNING
    )]
    Timeout { name: String },
    #[error("certificate signing request {name} carries no usable certificate")]
    BadCertificate { name: String },
    #[error("the signed certificate")]
    Tls(#[from] TlsError),
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What the requests ask for and where the result goes.
pub struct Rotation {
    pub client: kube::Client,
    pub node_name: String,
    /// SANs: the node's hostname(s) and addresses (kubelet: its Node's `status.addresses`).
    pub hostnames: Vec<String>,
    pub ips: Vec<IpAddr>,
    /// `<root-dir>/pki` (kubelet's `--cert-dir`).
    pub cert_dir: PathBuf,
    /// What the server presents; replaced by each new certificate.
    pub current: Arc<CurrentCert>,
}

impl Rotation {
    /// Renews forever (see the module docs); run it as a task and abort it to stop.
    pub async fn run(self) {
        let mut next = match load_current(&self.cert_dir) {
            Some((cert, (from, to))) if to > SystemTime::now() => match self.current.set(cert) {
                Ok(()) => {
                    tracing::info!(path = %self.cert_dir.join(CURRENT_PEM).display(), "Loaded the rotated serving certificate");
                    rotation_deadline(from, to, jitter())
                }
                Err(err) => {
                    tracing::warn!(%err, "the rotated serving certificate on disk is unusable");
                    SystemTime::now()
                }
            },
            _ => SystemTime::now(),
        };
        loop {
            if let Ok(wait) = next.duration_since(SystemTime::now()) {
                tracing::info!(?wait, "Waiting for the next serving certificate rotation");
                tokio::time::sleep(wait).await;
            }
            let mut retry = RETRY_FIRST;
            next = loop {
                tracing::info!("Rotating certificates");
                match self.renew().await {
                    Ok((from, to)) => break rotation_deadline(from, to, jitter()),
                    Err(err) => {
                        tracing::warn!(err = %error_chain(&err), ?retry, "Failed while requesting a signed certificate from the control plane");
                        tokio::time::sleep(retry).await;
                        retry = (retry * 2).min(RETRY_MAX);
                    }
                }
            };
        }
    }

    /// One request, awaited, written and served; the new certificate's validity.
    async fn renew(&self) -> Result<(SystemTime, SystemTime), RotationError> {
        let key = rcgen::KeyPair::generate()?;
        let request = csr_pem(&self.node_name, &self.hostnames, &self.ips, &key)?;
        let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        let created = api
            .create(&PostParams::default(), &csr_object(request))
            .await?;
        let name = created.metadata.name.unwrap_or_default();
        tracing::info!(csr = %name, "Certificate signing request created; waiting for it to be approved and signed");
        let pem = wait_signed(&api, &name).await?;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
            .filter_map(Result::ok)
            .collect();
        let validity = chain
            .first()
            .and_then(|leaf| x509::validity(leaf))
            .ok_or_else(|| RotationError::BadCertificate { name: name.clone() })?;
        let key_pem = key.serialize_pem();
        self.current.set(ServingCert {
            chain,
            key: PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        })?;
        let path = store(&self.cert_dir, &pem, key_pem.as_bytes())?;
        tracing::info!(csr = %name, path = %path.display(), not_after = ?validity.1, "Serving the certificate the cluster signed");
        Ok(validity)
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The PEM request kubelet makes: subject `O=system:nodes, CN=system:node:<name>`, the
/// hostnames as DNS and the addresses as IP SANs.
pub fn csr_pem(
    node_name: &str,
    hostnames: &[String],
    ips: &[IpAddr],
    key: &rcgen::KeyPair,
) -> Result<String, rcgen::Error> {
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("system:node:{node_name}"),
    );
    let mut sans = Vec::new();
    for name in hostnames {
        let san = rcgen::SanType::DnsName(name.clone().try_into()?);
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    for ip in ips {
        let san = rcgen::SanType::IpAddress(*ip);
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    params.subject_alt_names = sans;
    params.serialize_request(key)?.pem()
}

fn csr_object(request: String) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("csr-".to_owned()),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.into_bytes()),
            signer_name: SIGNER.to_owned(),
            // kubelet's for an ECDSA key (key encipherment is for RSA only).
            usages: Some(vec![
                "digital signature".to_owned(),
                "server auth".to_owned(),
            ]),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    }
}

/// Polls the request until it carries a certificate (its PEM), is denied or failed, or
/// [`WAIT_FOR_SIGNING`] passed.
async fn wait_signed(
    api: &Api<CertificateSigningRequest>,
    name: &str,
) -> Result<Vec<u8>, RotationError> {
    let deadline = tokio::time::Instant::now() + WAIT_FOR_SIGNING;
    loop {
        let status = api.get(name).await?.status.unwrap_or_default();
        if let Some(refused) = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Denied" || c.type_ == "Failed")
        {
            return Err(RotationError::Refused {
                name: name.to_owned(),
                condition: refused.type_,
                message: refused.message.unwrap_or_default(),
            });
        }
        if let Some(ByteString(pem)) = status.certificate.filter(|c| !c.0.is_empty()) {
            return Ok(pem);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(RotationError::Timeout {
                name: name.to_owned(),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Writes `kubelet-server-<time>.pem` (certificate, then key; 0600) and points
/// [`CURRENT_PEM`] at it (a new link renamed over the old one).
fn store(dir: &Path, cert_pem: &[u8], key_pem: &[u8]) -> Result<PathBuf, RotationError> {
    let write_err = |path: &Path| {
        let path = path.to_owned();
        move |source| RotationError::Write { path, source }
    };
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(dir)
        .map_err(write_err(dir))?;
    let stamp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let file = format!(
        "kubelet-server-{}.{:09}.pem",
        stamp.as_secs(),
        stamp.subsec_nanos()
    );
    let path = dir.join(&file);
    let mut bytes = cert_pem.to_vec();
    if !bytes.ends_with(b"\n") {
        bytes.push(b'\n');
    }
    bytes.extend_from_slice(key_pem);
    super::tls::write_private(&path, &bytes)?;
    let link = dir.join(CURRENT_PEM);
    let tmp = dir.join(format!("{CURRENT_PEM}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&file, &tmp).map_err(write_err(&tmp))?;
    std::fs::rename(&tmp, &link).map_err(write_err(&link))?;
    Ok(path)
}

/// The certificate and key behind [`CURRENT_PEM`] and the certificate's validity, if any.
pub fn load_current(dir: &Path) -> Option<(ServingCert, (SystemTime, SystemTime))> {
    let bytes = std::fs::read(dir.join(CURRENT_PEM)).ok()?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
        .filter_map(Result::ok)
        .collect();
    let validity = x509::validity(chain.first()?)?;
    let key = PrivateKeyDer::from_pem_slice(&bytes).ok()?;
    Some((ServingCert { chain, key }, validity))
}

/// When to renew a certificate valid from `from` to `to`: after `fraction` (kubelet: a
/// random 0.7–0.9) of its lifetime.
pub fn rotation_deadline(from: SystemTime, to: SystemTime, fraction: f64) -> SystemTime {
    let lifetime = to.duration_since(from).unwrap_or_default();
    from + lifetime.mul_f64(fraction.clamp(0.0, 1.0))
}

/// A fraction in [0.7, 0.9), from the clock's nanoseconds (spreads nodes' renewals).
fn jitter() -> f64 {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    0.7 + 0.2 * f64::from(nanos % 1_000_000) / 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_is_at_the_fraction_of_the_lifetime() {
        let from = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let to = from + Duration::from_secs(1000);
        assert_eq!(
            rotation_deadline(from, to, 0.7),
            from + Duration::from_secs(700)
        );
        assert_eq!(
            rotation_deadline(from, to, 0.9),
            from + Duration::from_secs(900)
        );
        // An inverted validity renews at once.
        assert_eq!(rotation_deadline(to, from, 0.8), to);
        for _ in 0..100 {
            let j = jitter();
            assert!((0.7..0.9).contains(&j), "{j}");
        }
    }

    #[test]
    fn the_request_names_the_node_and_its_addresses() {
        let key = rcgen::KeyPair::generate().expect("key");
        let pem = csr_pem(
            "n1",
            &["n1".to_owned(), "n1".to_owned()],
            &["10.1.2.3".parse().expect("ip")],
            &key,
        )
        .expect("csr");
        assert!(
            pem.starts_with("-----BEGIN CERTIFICATE REQUEST-----"),
            "{pem}"
        );
        let der = rustls::pki_types::CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
            .expect("der");
        let der = der.as_ref();
        let has = |needle: &[u8]| der.windows(needle.len()).any(|w| w == needle);
        assert!(has(b"system:node:n1"));
        assert!(has(b"system:nodes"));
        // The IP SAN ([7] 4 bytes) and one DNS SAN ([2] "n1"), not two.
        assert!(has(&[0x87, 4, 10, 1, 2, 3]));
        assert_eq!(
            der.windows(4)
                .filter(|w| *w == [0x82, 2, b'n', b'1'])
                .count(),
            1
        );
    }

    #[test]
    fn a_stored_pair_is_loaded_back_through_the_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = rcgen::KeyPair::generate().expect("key");
        let params = rcgen::CertificateParams::new(vec!["n1".to_owned()]).expect("params");
        let cert = params.self_signed(&key).expect("cert");
        assert!(load_current(dir.path()).is_none());
        let path = store(
            dir.path(),
            cert.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
        )
        .expect("stored");
        let (loaded, (from, to)) = load_current(dir.path()).expect("loaded");
        assert_eq!(loaded.chain, vec![cert.der().clone()]);
        assert!(from < to);
        assert_eq!(
            std::fs::read_link(dir.path().join(CURRENT_PEM)).expect("link"),
            PathBuf::from(path.file_name().expect("name"))
        );
        // A second one replaces the link.
        let again = store(
            dir.path(),
            cert.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
        )
        .expect("stored");
        assert_ne!(again, path);
        assert_eq!(
            std::fs::read_link(dir.path().join(CURRENT_PEM)).expect("link"),
            PathBuf::from(again.file_name().expect("name"))
        );
    }
}

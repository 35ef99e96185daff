//! A real registry for pull tests: Debian's `docker-registry` (distribution) on a free
//! loopback port, in a temp dir, with TLS from a throw-away CA (openssl) and, optionally,
//! htpasswd basic auth. Images are pushed with Debian's `skopeo` from the OCI layouts that
//! `images/build` makes, so the registry content comes from an independent client.
//!
//! ```text
//!  TestRegistry::start ── openssl: ca.crt, server.crt (SAN 127.0.0.1, localhost)
//!                      ── htpasswd -B (when auth is on)
//!                      ── client.cert/.key signed by the CA (mutual TLS, when asked)
//!                      ── docker-registry serve config.yml  (storage in the temp dir)
//!  push(layout, "busybox:1") ── skopeo copy oci:<layout> docker://127.0.0.1:<port>/busybox:1
//!  drop ── kill + wait the registry, remove the temp dir: nothing left behind
//! ```

use std::io::Read as _;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

/// A step of starting or filling the test registry failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("running {program}: {source} (is it installed? see scripts/install-deps)")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed: {stderr}")]
    Failed { command: String, stderr: String },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the registry did not listen on {addr} within 10 s: {log}")]
    NotReady { addr: String, log: String },
    #[error("{path}: {message}")]
    Layout { path: PathBuf, message: String },
}

type Result<T, E = RegistryError> = std::result::Result<T, E>;

/// How the registry is set up.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Basic auth (htpasswd) with this user and password.
    pub basic_auth: Option<(String, String)>,
    /// distribution's `token` auth instead: clients get Bearer tokens from `realm`.
    pub token_auth: Option<TokenAuth>,
    /// Mutual TLS: the registry requires a client certificate signed by the test CA
    /// (`http.tls.clientcas`); one is made ([`TestRegistry::client_cert_file`]).
    pub client_auth: bool,
}

/// distribution's `auth: token` settings: tokens are JWTs from `issuer` for `service`,
/// signed by a key whose certificate chains to `root_cert_bundle`.
#[derive(Debug, Clone)]
pub struct TokenAuth {
    /// The token endpoint clients are sent to (`WWW-Authenticate: Bearer realm=…`).
    pub realm: String,
    pub service: String,
    pub issuer: String,
    pub root_cert_bundle: PathBuf,
    /// What `push` gives skopeo (a user the issuer lets push).
    pub push_creds: (String, String),
}

/// A running registry; stopped and removed on drop.
#[derive(Debug)]
pub struct TestRegistry {
    dir: tempfile::TempDir,
    child: Option<Child>,
    port: u16,
    options: RegistryOptions,
}

impl TestRegistry {
    /// Starts a registry on a free loopback port.
    pub fn start(options: RegistryOptions) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("ironlet-registry-")
            .tempdir()
            .map_err(|source| io("creating", std::env::temp_dir(), source))?;
        make_certs(dir.path())?;
        if options.client_auth {
            make_client_cert(dir.path())?;
        }
        if let Some((user, pass)) = &options.basic_auth {
            let out = run(Command::new("htpasswd").args(["-Bbn", user, pass]))?;
            write(&dir.path().join("htpasswd"), &out)?;
        }
        let mut registry = Self {
            dir,
            child: None,
            port: 0,
            options,
        };
        registry.spawn()?;
        Ok(registry)
    }

    fn spawn(&mut self) -> Result<()> {
        // A restart keeps the port, so references made before it stay valid.
        let port = if self.port == 0 {
            free_port()?
        } else {
            self.port
        };
        let d = self.dir.path();
        let auth = if let Some(t) = &self.options.token_auth {
            format!(
                "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    rootcertbundle: {}\n",
                t.realm,
                t.service,
                t.issuer,
                t.root_cert_bundle.display()
            )
        } else if self.options.basic_auth.is_some() {
            format!(
                "auth:\n  htpasswd:\n    realm: ironlet-test\n    path: {}\n",
                d.join("htpasswd").display()
            )
        } else {
            String::new()
        };
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n\
             http:\n  addr: 127.0.0.1:{port}\n  tls:\n    certificate: {crt}\n    key: {key}\n{clientcas}{auth}",
            clientcas = if self.options.client_auth {
                format!("    clientcas:\n      - {}\n", self.ca_file().display())
            } else {
                String::new()
            },
            storage = d.join("storage").display(),
            crt = d.join("server.crt").display(),
            key = d.join("server.key").display(),
        );
        write(&d.join("config.yml"), config.as_bytes())?;
        let log_path = d.join("registry.log");
        let log = std::fs::File::create(&log_path).map_err(|e| io("creating", &log_path, e))?;
        let log2 = log.try_clone().map_err(|e| io("cloning", &log_path, e))?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(d.join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|source| RegistryError::Spawn {
                program: "docker-registry".into(),
                source,
            })?;
        self.child = Some(child);
        self.port = port;
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(&addr).is_err() {
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_some());
            if exited || Instant::now() > deadline {
                self.kill();
                return Err(RegistryError::NotReady {
                    addr,
                    log: std::fs::read_to_string(&log_path).unwrap_or_default(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// `127.0.0.1:<port>`, the registry part of image references.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Pull settings that trust this registry's CA at `host` (its own, or a relay's in
    /// front of it): `configs: {host: {tls: {ca_file}}}`, with the client certificate
    /// (`cert_file`, `key_file`) when the registry requires one.
    pub fn pull_config(
        &self,
        host: &str,
    ) -> std::result::Result<crate::image::PullConfig, crate::image::ImageError> {
        let mut yaml = format!(
            "configs:\n  \"{host}\":\n    tls:\n      ca_file: {}\n",
            self.ca_file().display()
        );
        if self.options.client_auth {
            yaml += &format!(
                "      cert_file: {}\n      key_file: {}\n",
                self.client_cert_file().display(),
                self.client_key_file().display()
            );
        }
        Ok(crate::image::PullConfig {
            registries: crate::image::RegistriesConfig::parse(&yaml, Path::new("testkit"))?,
            ..Default::default()
        })
    }

    /// The PEM file of the CA that signed the registry's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("certs").join("ca.crt")
    }

    /// The client certificate (PEM) a registry with `client_auth` accepts; also in the
    /// certs dir skopeo pushes with (`client.cert`, containers-certs.d's name).
    pub fn client_cert_file(&self) -> PathBuf {
        self.dir.path().join("certs").join("client.cert")
    }

    /// The client certificate's private key (PEM).
    pub fn client_key_file(&self) -> PathBuf {
        self.dir.path().join("certs").join("client.key")
    }

    /// The registry's storage root (`docker/registry/v2/blobs/sha256/<ab>/<hex>/data`).
    pub fn storage_dir(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// The file holding blob `hex` in the registry's storage.
    pub fn blob_file(&self, hex: &str) -> PathBuf {
        self.storage_dir()
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2.min(hex.len())])
            .join(hex)
            .join("data")
    }

    /// Pushes the image of an OCI layout (`images/out/busybox`, or one made by
    /// [`make_multi_arch_layout`]) as `repo:tag`, with skopeo. `extra` are more skopeo
    /// flags (`--dest-compress-format zstd`, `--all`).
    pub fn push(&self, layout: &Path, repo_tag: &str, extra: &[&str]) -> Result<()> {
        let mut cmd = Command::new("skopeo");
        cmd.args(["--insecure-policy", "copy", "-q", "--dest-cert-dir"])
            .arg(self.dir.path().join("certs"));
        let creds = match &self.options.token_auth {
            Some(t) => Some(&t.push_creds),
            None => self.options.basic_auth.as_ref(),
        };
        if let Some((u, p)) = creds {
            cmd.arg("--dest-creds").arg(format!("{u}:{p}"));
        }
        cmd.args(extra)
            .arg(format!("oci:{}", layout.display()))
            .arg(format!("docker://{}/{repo_tag}", self.host()));
        run(&mut cmd).map(drop)
    }

    /// Stops the registry (pulls then fail to connect); [`Self::restart`] brings it back on
    /// the same port with the same content.
    pub fn stop(&mut self) {
        self.kill();
    }

    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Writes into `out` an OCI layout whose `index.json` names one image index (tag
/// `multi`) of two platforms: `linux/<host arch>` is `layout`'s image unchanged, and a
/// second platform (`linux/arm64/v8`, or `linux/amd64` on an arm64 host) has the same
/// layers under a config with that architecture, so its image id differs. Returns the
/// config digests `(host, other)` and the other platform as `os/arch[/variant]`.
pub fn make_multi_arch_layout(layout: &Path, out: &Path) -> Result<MultiArch> {
    let blobs = out.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).map_err(|e| io("creating", &blobs, e))?;
    copy_dir(&layout.join("blobs/sha256"), &blobs)?;
    let index: serde_json::Value = read_json(&layout.join("index.json"))?;
    let host_desc = index["manifests"][0].clone();
    let manifest_hex = hex_of(&host_desc, layout)?;
    let manifest: serde_json::Value = read_json(&blobs.join(&manifest_hex))?;
    let config_hex = hex_of(&manifest["config"], layout)?;
    let mut config: serde_json::Value = read_json(&blobs.join(&config_hex))?;
    let host_arch = config["architecture"]
        .as_str()
        .unwrap_or("amd64")
        .to_owned();
    let (other_arch, other_variant) = if host_arch == "arm64" {
        ("amd64", None)
    } else {
        ("arm64", Some("v8"))
    };
    config["architecture"] = other_arch.into();
    if let Some(v) = other_variant {
        config["variant"] = v.into();
    }
    let other_config = put_json(&blobs, &config)?;
    let mut other_manifest = manifest.clone();
    other_manifest["config"]["digest"] = other_config.0.clone().into();
    other_manifest["config"]["size"] = other_config.1.into();
    let other_manifest = put_json(&blobs, &other_manifest)?;
    let manifest_size = std::fs::metadata(blobs.join(&manifest_hex))
        .map_err(|e| io("reading", blobs.join(&manifest_hex), e))?
        .len();
    let mut other_platform = serde_json::json!({"os": "linux", "architecture": other_arch});
    if let Some(v) = other_variant {
        other_platform["variant"] = v.into();
    }
    let image_index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json",
             "digest": format!("sha256:{manifest_hex}"), "size": manifest_size,
             "platform": {"os": "linux", "architecture": host_arch}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json",
             "digest": other_manifest.0, "size": other_manifest.1,
             "platform": other_platform},
        ]
    });
    let image_index = put_json(&blobs, &image_index)?;
    write_layout_top(
        out,
        "application/vnd.oci.image.index.v1+json",
        &image_index,
        "multi",
    )?;
    let platform = match other_variant {
        Some(v) => format!("linux/{other_arch}/{v}"),
        None => format!("linux/{other_arch}"),
    };
    Ok(MultiArch {
        host_config: format!("sha256:{config_hex}"),
        other_config: other_config.0,
        other_platform: platform,
        index_digest: image_index.0,
    })
}

/// Writes into `out` an OCI layout of one image (`big:latest`) whose single layer is an
/// uncompressed tar of one file of `size` pseudo-random (incompressible) bytes from
/// `seed`: a pull of it takes long enough to be interrupted in the middle of the layer.
pub fn make_large_layout(out: &Path, size: u64, seed: u64) -> Result<LargeImage> {
    single_layer_layout(out, |builder| {
        let mut header = tar_header(tar::EntryType::Regular, 0o644, size);
        builder.append_data(&mut header, "big", Noise(seed | 1).take(size))
    })
}

/// Like [`make_large_layout`], but the layer is `count` empty files (`d/<n>`): its blob
/// is 512 bytes a file while unpacked it takes no data blocks, so on a small file system
/// the blob runs out of space before the unpacked layer does.
pub fn make_empty_files_layout(out: &Path, count: u64) -> Result<LargeImage> {
    single_layer_layout(out, |builder| {
        let mut dir = tar_header(tar::EntryType::Directory, 0o755, 0);
        builder.append_data(&mut dir, "d/", std::io::empty())?;
        for n in 0..count {
            let mut header = tar_header(tar::EntryType::Regular, 0o644, 0);
            builder.append_data(&mut header, format!("d/{n}"), std::io::empty())?;
        }
        Ok(())
    })
}

/// A GNU tar header of `kind`, `mode` and `size`, mtime 0.
fn tar_header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_size(size);
    header.set_mode(mode);
    header.set_mtime(0);
    header.set_entry_type(kind);
    header.set_cksum();
    header
}

/// An OCI layout of one image (`big:latest`) whose single uncompressed layer is the tar
/// `fill` writes.
fn single_layer_layout(
    out: &Path,
    fill: impl FnOnce(&mut tar::Builder<std::io::BufWriter<std::fs::File>>) -> std::io::Result<()>,
) -> Result<LargeImage> {
    let blobs = out.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).map_err(|e| io("creating", &blobs, e))?;
    let staging = out.join("layer.tar");
    let file = std::fs::File::create(&staging).map_err(|e| io("creating", &staging, e))?;
    let mut builder = tar::Builder::new(std::io::BufWriter::new(file));
    fill(&mut builder).map_err(|e| io("writing", &staging, e))?;
    builder
        .into_inner()
        .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
        .map_err(|e| io("writing", &staging, e))?;
    let mut hasher = Sha256::new();
    let mut f = std::fs::File::open(&staging).map_err(|e| io("reading", &staging, e))?;
    let layer_size = std::io::copy(&mut f, &mut hasher).map_err(|e| io("reading", &staging, e))?;
    let layer_hex = hex::encode(hasher.finalize());
    let layer_path = blobs.join(&layer_hex);
    std::fs::rename(&staging, &layer_path).map_err(|e| io("renaming", &staging, e))?;
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = serde_json::json!({
        "architecture": arch, "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_hex}")]},
    });
    let config = put_json(&blobs, &config)?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config.0, "size": config.1},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": format!("sha256:{layer_hex}"), "size": layer_size}],
    });
    let manifest = put_json(&blobs, &manifest)?;
    write_layout_top(
        out,
        "application/vnd.oci.image.manifest.v1+json",
        &manifest,
        "big:latest",
    )?;
    Ok(LargeImage {
        manifest: manifest.0,
        config: config.0,
        layer: format!("sha256:{layer_hex}"),
        layer_size,
    })
}

/// The entries directly in `dir` with their sizes (none when it is missing): what staging
/// (`ingest/`, `snapshots/tmp-*`) a pull left.
pub fn dir_sizes(dir: &Path) -> Vec<(PathBuf, u64)> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| (e.path(), e.metadata().map(|m| m.len()).unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}

/// What [`make_large_layout`] or [`make_empty_files_layout`] made (digests as
/// `sha256:<hex>`).
#[derive(Debug, Clone)]
pub struct LargeImage {
    pub manifest: String,
    pub config: String,
    pub layer: String,
    pub layer_size: u64,
}

/// xorshift64 bytes: fast, deterministic, incompressible enough.
struct Noise(u64);

impl std::io::Read for Noise {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            chunk.copy_from_slice(&self.0.to_le_bytes()[..chunk.len()]);
        }
        Ok(buf.len())
    }
}

/// What [`make_multi_arch_layout`] made.
#[derive(Debug, Clone)]
pub struct MultiArch {
    pub host_config: String,
    pub other_config: String,
    pub other_platform: String,
    pub index_digest: String,
}

/// The layout's `index.json`, naming one blob (`(digest, size)`) as `ref_name`, and its
/// `oci-layout` marker.
fn write_layout_top(
    out: &Path,
    media_type: &str,
    desc: &(String, u64),
    ref_name: &str,
) -> Result<()> {
    let top = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": media_type, "digest": desc.0, "size": desc.1,
            "annotations": {"org.opencontainers.image.ref.name": ref_name}
        }]
    });
    write(
        &out.join("index.json"),
        &serde_json::to_vec(&top).unwrap_or_default(),
    )?;
    write(
        &out.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
}

fn hex_of(desc: &serde_json::Value, layout: &Path) -> Result<String> {
    desc["digest"]
        .as_str()
        .and_then(|d| d.strip_prefix("sha256:"))
        .map(str::to_owned)
        .ok_or_else(|| RegistryError::Layout {
            path: layout.to_path_buf(),
            message: format!("descriptor without a sha256 digest: {desc}"),
        })
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let bytes = std::fs::read(path).map_err(|e| io("reading", path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| RegistryError::Layout {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Stores a JSON blob; returns its digest and size.
fn put_json(blobs: &Path, value: &serde_json::Value) -> Result<(String, u64)> {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let hex = hex::encode(Sha256::digest(&bytes));
    write(&blobs.join(&hex), &bytes)?;
    Ok((format!("sha256:{hex}"), bytes.len() as u64))
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    let rd = std::fs::read_dir(from).map_err(|e| io("listing", from, e))?;
    for entry in rd.flatten() {
        let dest = to.join(entry.file_name());
        std::fs::copy(entry.path(), &dest).map_err(|e| io("copying to", &dest, e))?;
    }
    Ok(())
}

/// A CA and a server certificate for 127.0.0.1 and localhost, in `dir/certs/ca.crt`
/// (also skopeo's `--dest-cert-dir`) and `dir/server.{crt,key}`.
fn make_certs(dir: &Path) -> Result<()> {
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).map_err(|e| io("creating", &certs, e))?;
    let ext = dir.join("server.ext");
    write(
        &ext,
        b"basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n\
          extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )?;
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=ironlet test CA",
        ])
        .args(ec)
        .arg("-keyout")
        .arg(dir.join("ca.key"))
        .arg("-out")
        .arg(certs.join("ca.crt")))?;
    issue(
        dir,
        "/CN=127.0.0.1",
        &ext,
        &dir.join("server.key"),
        &dir.join("server.crt"),
    )
}

/// A client certificate (CN ironlet-test-client, extendedKeyUsage clientAuth) signed by
/// the test CA, in `dir/certs/client.{cert,key}`.
fn make_client_cert(dir: &Path) -> Result<()> {
    let certs = dir.join("certs");
    let ext = dir.join("client.ext");
    write(
        &ext,
        b"basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
    )?;
    issue(
        dir,
        "/CN=ironlet-test-client",
        &ext,
        &certs.join("client.key"),
        &certs.join("client.cert"),
    )
}

/// A P-256 key in `key` and its certificate for `subject` with the extensions of file
/// `ext`, signed by the test CA (`dir/ca.key`, `dir/certs/ca.crt`), in `cert`.
fn issue(dir: &Path, subject: &str, ext: &Path, key: &Path, cert: &Path) -> Result<()> {
    let csr = cert.with_extension("csr");
    run(Command::new("openssl")
        .args(["req", "-nodes", "-subj", subject])
        .args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
        .arg("-keyout")
        .arg(key)
        .arg("-out")
        .arg(&csr))?;
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-CAcreateserial"])
        .arg("-in")
        .arg(&csr)
        .arg("-CA")
        .arg(dir.join("certs").join("ca.crt"))
        .arg("-CAkey")
        .arg(dir.join("ca.key"))
        .arg("-extfile")
        .arg(ext)
        .arg("-out")
        .arg(cert))?;
    let _ = std::fs::remove_file(&csr);
    Ok(())
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| io("binding", "127.0.0.1:0", e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| io("reading the address of", "127.0.0.1:0", e))
}

fn run(cmd: &mut Command) -> Result<Vec<u8>> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| RegistryError::Spawn {
            program: program.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(RegistryError::Failed {
            command: format!("{cmd:?}"),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(out.stdout)
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| io("writing", path, e))
}

fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> RegistryError {
    RegistryError::Io {
        op,
        path: path.into(),
        source,
    }
}

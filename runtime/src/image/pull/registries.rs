//! [`RegistriesConfig`]: `--registry-config FILE`, k3s' `registries.yaml` schema.
//!
//! ```yaml
//! mirrors:
//!   docker.io:                       # or "*" for every registry
//!     endpoint: ["https://mirror.local:5000", "http://10.0.0.2:5000"]
//!     rewrite: {"^library/(.*)": "mirrored/$1"}     # repository rewrites, mirrors only
//! configs:
//!   "mirror.local:5000":
//!     auth: {username: u, password: p}               # or auth: <base64 user:pass>
//!     tls: {ca_file: /etc/ca.pem, cert_file: /etc/client.crt, key_file: /etc/client.key,
//!           insecure_skip_verify: false}
//! ```
//!
//! A pull tries the mirror endpoints in order, then the registry itself (k3s' default
//! endpoint fallback). `http://` endpoints are spoken to in plain HTTP. A client certificate
//! (`tls: {cert_file: client.crt, key_file: client.key}`, PEM, both or neither) is presented
//! to a registry that asks for one (mutual TLS; oci-client carries a patch for it, see
//! vendor/oci-client/PATCHES.md). Every file named is read when the config is loaded, so a
//! typo or an unreadable key fails there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::credentials::{Credentials, Keyring};
use crate::image::error::ImageError;
use crate::image::reference::Reference;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistriesConfig {
    #[serde(default)]
    pub mirrors: BTreeMap<String, Mirror>,
    #[serde(default)]
    pub configs: BTreeMap<String, RegistryHostConfig>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mirror {
    #[serde(default)]
    pub endpoint: Vec<String>,
    #[serde(default)]
    pub rewrite: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryHostConfig {
    #[serde(default)]
    pub auth: Option<AuthConfig>,
    #[serde(default)]
    pub tls: Option<TlsConfig>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    pub auth: Option<String>,
    #[serde(default)]
    pub identitytoken: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

/// One place a pull may fetch a repository from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `host[:port]` as the registry client addresses it.
    pub host: String,
    /// The repository path at this endpoint (after rewrites).
    pub repository: String,
    pub plain_http: bool,
    /// PEM CA bundle to trust in addition to the system roots.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate (chain) followed by its private key, for registries that
    /// require mutual TLS.
    pub client_identity_pem: Option<Vec<u8>>,
    pub insecure_skip_verify: bool,
    /// `true` for the registry itself (the last resort after its mirrors).
    pub upstream: bool,
}

impl RegistriesConfig {
    /// Reads and checks a `registries.yaml`, or a containerd host directory
    /// (`<dir>/<host>/hosts.toml`, see `hosts_dir.rs`) when `path` is a directory. The files
    /// it names are opened now, so a typo fails here.
    pub fn load(path: &Path) -> Result<Self, ImageError> {
        if path.is_dir() {
            let cfg = super::hosts_dir::load(path)?;
            cfg.check(path)?;
            return Ok(cfg);
        }
        let text = std::fs::read_to_string(path).map_err(|e| ImageError::io("reading", path, e))?;
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self, ImageError> {
        let cfg: Self = serde_yaml::from_str(text).map_err(|e| ImageError::RegistryConfig {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        cfg.check(path)?;
        Ok(cfg)
    }

    /// Client certificates come with their keys, named files open, rewrites compile and
    /// endpoints are URLs.
    fn check(&self, path: &Path) -> Result<(), ImageError> {
        let bad = |message: String| ImageError::RegistryConfig {
            path: path.to_path_buf(),
            message,
        };
        let cfg = self;
        for (host, c) in &cfg.configs {
            if let Some(tls) = &c.tls {
                if tls.cert_file.is_some() != tls.key_file.is_some() {
                    return Err(bad(format!(
                        "configs.{host}.tls: a client certificate needs both cert_file and key_file"
                    )));
                }
                for (key, file) in [
                    ("ca_file", &tls.ca_file),
                    ("cert_file", &tls.cert_file),
                    ("key_file", &tls.key_file),
                ] {
                    if let Some(file) = file {
                        std::fs::File::open(file)
                            .map_err(|e| bad(format!("configs.{host}.tls.{key} {file:?}: {e}")))?;
                    }
                }
            }
        }
        for (host, m) in &cfg.mirrors {
            for pattern in m.rewrite.keys() {
                regex::Regex::new(pattern)
                    .map_err(|e| bad(format!("mirrors.{host}.rewrite {pattern:?}: {e}")))?;
            }
            for ep in &m.endpoint {
                split_url(ep)
                    .ok_or_else(|| bad(format!("mirrors.{host}.endpoint {ep:?} is not a URL")))?;
            }
        }
        Ok(())
    }

    /// The endpoints to try for `reference`, mirrors first, the registry itself last.
    pub fn endpoints(&self, reference: &Reference) -> Result<Vec<Endpoint>, ImageError> {
        let domain = reference.domain();
        let mirror = self.mirrors.get(domain).or_else(|| self.mirrors.get("*"));
        let mut out = Vec::new();
        if let Some(m) = mirror {
            for url in &m.endpoint {
                let Some((plain_http, host)) = split_url(url) else {
                    continue;
                };
                let repository = rewrite(&m.rewrite, reference.path());
                out.push(self.endpoint(host, repository, plain_http, false)?);
            }
        }
        if !out.iter().any(|e| e.host == domain) {
            out.push(self.endpoint(domain.to_owned(), reference.path().to_owned(), false, true)?);
        } else if let Some(e) = out.iter_mut().find(|e| e.host == domain) {
            e.upstream = true;
        }
        Ok(out)
    }

    fn endpoint(
        &self,
        host: String,
        repository: String,
        plain_http: bool,
        upstream: bool,
    ) -> Result<Endpoint, ImageError> {
        let tls = self.configs.get(&host).and_then(|c| c.tls.as_ref());
        let read =
            |path: &PathBuf| std::fs::read(path).map_err(|e| ImageError::io("reading", path, e));
        let ca_pem = tls.and_then(|t| t.ca_file.as_ref()).map(read).transpose()?;
        let client_identity_pem = match tls.map(|t| (&t.cert_file, &t.key_file)) {
            // One PEM file holding both (containerd's `client = "client.pem"`).
            Some((Some(cert), Some(key))) if cert == key => Some(read(cert)?),
            Some((Some(cert), Some(key))) => {
                let mut pem = read(cert)?;
                if !pem.ends_with(b"\n") {
                    pem.push(b'\n');
                }
                pem.extend(read(key)?);
                Some(pem)
            }
            _ => None,
        };
        Ok(Endpoint {
            host,
            repository,
            plain_http,
            ca_pem,
            client_identity_pem,
            insecure_skip_verify: tls.is_some_and(|t| t.insecure_skip_verify),
            upstream,
        })
    }

    /// The credentials `configs:` gives, keyed by host, for the keyring.
    pub fn keyring(&self) -> Result<Keyring, ImageError> {
        let mut ring = Keyring::default();
        for (host, c) in &self.configs {
            let Some(a) = &c.auth else { continue };
            let creds = match (&a.username, &a.password, &a.auth) {
                (Some(u), Some(p), _) => Credentials {
                    username: u.clone(),
                    password: p.clone(),
                },
                (_, _, Some(b64)) => {
                    let json = serde_json::json!({ "auths": { host: { "auth": b64 } } });
                    ring.extend(Keyring::from_config_json(
                        json.to_string().as_bytes(),
                        "registries.yaml",
                    )?);
                    continue;
                }
                _ => continue,
            };
            ring.add(host, creds);
        }
        Ok(ring)
    }
}

/// `https://host:port/path` → (plain_http, `host:port`); a bare host is https.
pub(super) fn split_url(url: &str) -> Option<(bool, String)> {
    let (plain, rest) = if let Some(r) = url.strip_prefix("http://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (false, r)
    } else if url.contains("://") {
        return None;
    } else {
        (false, url)
    };
    let host = rest.split('/').next().unwrap_or("");
    (!host.is_empty()).then(|| (plain, host.to_owned()))
}

fn rewrite(rules: &BTreeMap<String, String>, path: &str) -> String {
    for (pattern, replacement) in rules {
        // Validated at load; a pattern that fails here is skipped like a non-match.
        if let Ok(re) = regex::Regex::new(pattern) {
            if re.is_match(path) {
                return re.replace(path, replacement.as_str()).into_owned();
            }
        }
    }
    path.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = r#"
mirrors:
  docker.io:
    endpoint: ["http://10.0.0.2:5000", "https://mirror.local"]
    rewrite: {"^library/(.*)": "hub/$1"}
  "*":
    endpoint: ["https://catch.all"]
configs:
  mirror.local:
    auth: {username: u, password: p}
    tls: {insecure_skip_verify: true}
"#;

    #[test]
    fn mirrors_come_first_rewritten_then_the_registry_itself() {
        let cfg = RegistriesConfig::parse(YAML, Path::new("r.yaml")).unwrap();
        let r = Reference::parse("busybox:1").unwrap();
        let eps = cfg.endpoints(&r).unwrap();
        let got: Vec<_> = eps
            .iter()
            .map(|e| {
                (
                    e.host.as_str(),
                    e.repository.as_str(),
                    e.plain_http,
                    e.upstream,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("10.0.0.2:5000", "hub/busybox", true, false),
                ("mirror.local", "hub/busybox", false, false),
                ("docker.io", "library/busybox", false, true),
            ]
        );
        assert!(eps[1].insecure_skip_verify);
        let other = cfg
            .endpoints(&Reference::parse("quay.io/a/b:1").unwrap())
            .unwrap();
        assert_eq!(other[0].host, "catch.all");
        assert_eq!(other[0].repository, "a/b");
        assert_eq!(
            cfg.keyring().unwrap().lookup("mirror.local")[0].username,
            "u"
        );
    }

    #[test]
    fn half_a_client_certificate_missing_files_and_unknown_keys_are_refused_with_the_file_named() {
        let e = RegistriesConfig::parse(
            "configs:\n  h:\n    tls: {cert_file: /c}\n",
            Path::new("/etc/r.yaml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/etc/r.yaml"), "{e}");
        assert!(e.to_string().contains("both cert_file and key_file"), "{e}");
        let e = RegistriesConfig::parse(
            "configs:\n  h:\n    tls: {cert_file: /nonexistent/c, key_file: /nonexistent/k}\n",
            Path::new("/etc/r.yaml"),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("cert_file \"/nonexistent/c\""),
            "{e}"
        );
        let e = RegistriesConfig::parse("mirror: {}\n", Path::new("r.yaml")).unwrap_err();
        assert!(e.to_string().contains("mirror"), "{e}");
    }

    #[test]
    fn a_client_certificate_and_its_key_go_to_the_endpoint_as_one_pem() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&cert, "CERT").unwrap();
        std::fs::write(&key, "KEY\n").unwrap();
        let yaml = format!(
            "configs:\n  \"r:5000\":\n    tls: {{cert_file: {}, key_file: {}}}\n",
            cert.display(),
            key.display()
        );
        let cfg = RegistriesConfig::parse(&yaml, Path::new("r.yaml")).unwrap();
        let eps = cfg
            .endpoints(&Reference::parse("r:5000/a:1").unwrap())
            .unwrap();
        assert_eq!(
            eps[0].client_identity_pem.as_deref(),
            Some(&b"CERT\nKEY\n"[..])
        );
        let other = cfg
            .endpoints(&Reference::parse("s:5000/a:1").unwrap())
            .unwrap();
        assert_eq!(other[0].client_identity_pem, None);
    }
}

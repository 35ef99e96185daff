//! [`Keyring`]: registry credentials from docker config files, as the kubelet reads them.
//!
//! Sources, in the order a pull tries them: the pod's `imagePullSecrets`
//! (`kubernetes.io/dockerconfigjson` → `{"auths": {...}}`, `kubernetes.io/dockercfg` → the
//! bare map), then the node's files (`<root-dir>/config.json`, `~/.docker/config.json`).
//! An entry's key is a registry host, optionally with a scheme and path
//! (`https://index.docker.io/v1/`) and a leading `*.` wildcard label; `docker.io`,
//! `index.docker.io` and `registry-1.docker.io` are one registry. An entry has `auth`
//! (base64 of `user:password`) or `username` and `password`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use crate::image::error::ImageError;

/// A user name and password for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// `USER:PASS`, as `ironlet images pull --creds` takes it.
    pub fn parse_user_pass(s: &str) -> Option<Self> {
        let (u, p) = s.split_once(':')?;
        Some(Self {
            username: u.to_owned(),
            password: p.to_owned(),
        })
    }
}

/// Credentials keyed by registry host pattern, tried in insertion order.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    entries: Vec<(String, Credentials)>,
}

#[derive(Deserialize)]
struct ConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize, Default)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

impl Keyring {
    /// Adds credentials for a registry host pattern.
    pub fn add(&mut self, pattern: &str, creds: Credentials) {
        self.entries.push((normalize_key(pattern), creds));
    }

    /// Appends every entry of `other` after ours.
    pub fn extend(&mut self, other: Keyring) {
        self.entries.extend(other.entries);
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A digest of every entry: pulls share a download only when their credentials are
    /// the same, so a pod with wrong or no credentials never gets an image by joining the
    /// pull of a pod that has the right ones.
    pub(crate) fn fingerprint(&self) -> String {
        use sha2::{Digest as _, Sha256};
        let mut h = Sha256::new();
        for (pattern, c) in &self.entries {
            for part in [pattern, &c.username, &c.password] {
                h.update(part.len().to_le_bytes());
                h.update(part.as_bytes());
            }
        }
        hex::encode(h.finalize())
    }

    /// A `config.json` (`kubernetes.io/dockerconfigjson`): `{"auths": {host: entry}}`.
    pub fn from_config_json(bytes: &[u8], origin: &str) -> Result<Self, ImageError> {
        let cfg: ConfigJson = serde_json::from_slice(bytes).map_err(|e| bad(origin, &e))?;
        Self::from_entries(cfg.auths, origin)
    }

    /// A legacy `.dockercfg` (`kubernetes.io/dockercfg`): `{host: entry}`.
    pub fn from_dockercfg(bytes: &[u8], origin: &str) -> Result<Self, ImageError> {
        let map: BTreeMap<String, AuthEntry> =
            serde_json::from_slice(bytes).map_err(|e| bad(origin, &e))?;
        Self::from_entries(map, origin)
    }

    fn from_entries(map: BTreeMap<String, AuthEntry>, origin: &str) -> Result<Self, ImageError> {
        let mut ring = Self::default();
        for (key, entry) in map {
            let creds = match (entry.auth, entry.username, entry.password) {
                (Some(auth), _, _) if !auth.is_empty() => {
                    let raw = base64::engine::general_purpose::STANDARD
                        .decode(auth.trim())
                        .map_err(|e| bad(origin, &format!("{key}: auth is not base64: {e}")))?;
                    let text = String::from_utf8(raw)
                        .map_err(|_| bad(origin, &format!("{key}: auth is not UTF-8")))?;
                    Credentials::parse_user_pass(&text)
                        .ok_or_else(|| bad(origin, &format!("{key}: auth is not user:password")))?
                }
                (_, Some(username), Some(password)) => Credentials { username, password },
                _ => continue,
            };
            ring.add(&key, creds);
        }
        Ok(ring)
    }

    /// The node's docker config files that exist, in the kubelet's order:
    /// `<root_dir>/config.json`, then `$HOME/.docker/config.json`. A file that cannot be
    /// parsed is an error naming it (a node misconfiguration must not pass silently).
    pub fn node_files(root_dir: &Path) -> Result<Self, ImageError> {
        let mut ring = Self::default();
        let mut paths = vec![root_dir.join("config.json")];
        if let Some(home) = std::env::var_os("HOME") {
            paths.push(PathBuf::from(home).join(".docker/config.json"));
        }
        for path in paths {
            match std::fs::read(&path) {
                Ok(bytes) => {
                    ring.extend(Self::from_config_json(&bytes, &path.display().to_string())?)
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(ImageError::io("reading", &path, e)),
            }
        }
        Ok(ring)
    }

    /// Every credential whose pattern matches `host` (`127.0.0.1:5000`, `docker.io`).
    pub fn lookup(&self, host: &str) -> Vec<&Credentials> {
        let host = normalize_key(host);
        self.entries
            .iter()
            .filter(|(pattern, _)| host_matches(pattern, &host))
            .map(|(_, c)| c)
            .collect()
    }
}

/// `https://index.docker.io/v1/` → `docker.io`; `http://host:5000/x` → `host:5000`.
fn normalize_key(key: &str) -> String {
    let key = key
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = key.split('/').next().unwrap_or(key).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".to_owned(),
        _ => host,
    }
}

fn host_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => host.split_once('.').is_some_and(|(_, rest)| rest == suffix),
        None => pattern == host,
    }
}

fn bad(origin: &str, err: &dyn std::fmt::Display) -> ImageError {
    ImageError::invalid(origin, "docker config", err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerconfigjson_auth_and_username_password_both_work() {
        // base64("alice:s3cret") and a username/password entry.
        let json = br#"{"auths":{"https://index.docker.io/v1/":{"auth":"YWxpY2U6czNjcmV0"},
            "reg.example:5000":{"username":"bob","password":"pw:with:colons"}}}"#;
        let ring = Keyring::from_config_json(json, "test").unwrap();
        assert_eq!(ring.lookup("docker.io")[0].username, "alice");
        assert_eq!(ring.lookup("docker.io")[0].password, "s3cret");
        assert_eq!(
            ring.lookup("reg.example:5000")[0].password,
            "pw:with:colons"
        );
        assert!(ring.lookup("reg.example").is_empty());
    }

    #[test]
    fn legacy_dockercfg_is_a_bare_map_and_wildcards_match_one_label() {
        let ring = Keyring::from_dockercfg(br#"{"*.corp.example":{"auth":"dTpw"}}"#, "t").unwrap();
        assert_eq!(ring.lookup("r.corp.example")[0].username, "u");
        assert!(ring.lookup("corp.example").is_empty());
        assert!(ring.lookup("a.b.corp.example").is_empty());
    }

    #[test]
    fn bad_base64_is_an_error_naming_the_entry() {
        let err =
            Keyring::from_config_json(br#"{"auths":{"h":{"auth":"!!"}}}"#, "secret x").unwrap_err();
        assert!(err.to_string().contains("secret x"), "{err}");
        assert!(err.to_string().contains("h: auth is not base64"), "{err}");
    }
}

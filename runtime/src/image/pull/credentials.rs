//! [`Keyring`]: registry credentials from docker config files, as the kubelet reads them.
//!
//! Sources, in the order a pull tries them: the pod's `imagePullSecrets`
//! (`kubernetes.io/dockerconfigjson` → `{"auths": {...}}`, `kubernetes.io/dockercfg` → the
//! bare map), then the node's files (`<root-dir>/config.json`, `~/.docker/config.json`)
//! together with what the credential provider plugins return (`provider.rs`).
//! An entry's key is a registry host, optionally with a scheme and path
//! (`https://index.docker.io/v1/`, `reg.example/team`) and glob labels (`*.example.com`);
//! `docker.io`, `index.docker.io` and `registry-1.docker.io` are one registry. An entry has
//! `auth` (base64 of `user:password`) or `username` and `password`.
//!
//! Matching is kubelet's `URLsMatch`: same number of host labels, each label a glob
//! (`filepath.Match`), the same port, and the key's path a prefix of the image's. One
//! keyring (kubelet's `BasicDockerKeyring`) answers with every matching entry, the most
//! specific key first (keys sorted in reverse); a pull tries them in turn.

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

    /// Every credential whose key matches `image` (`127.0.0.1:5000/busybox`,
    /// `docker.io/library/busybox`, or a bare host), the most specific key first; entries
    /// of one key keep the order they were added in.
    pub fn lookup(&self, image: &str) -> Vec<&Credentials> {
        let image = normalize_key(image);
        let mut found: Vec<&(String, Credentials)> = self
            .entries
            .iter()
            .filter(|(pattern, _)| urls_match(pattern, &image))
            .collect();
        // Stable: equal keys stay in insertion order, as kubelet appends them.
        found.sort_by(|a, b| b.0.cmp(&a.0));
        found.into_iter().map(|(_, c)| c).collect()
    }
}

/// kubelet's key normalization (`BasicDockerKeyring.Add`): the scheme goes, a `/v1/` or
/// `/v2/` path is the host alone, and Docker Hub's names are `docker.io`:
/// `https://index.docker.io/v1/` → `docker.io`; `http://host:5000/team` → `host:5000/team`.
fn normalize_key(key: &str) -> String {
    let key = key
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let (host, path) = match key.find('/') {
        Some(i) => key.split_at(i),
        None => (key, ""),
    };
    let path = match path.get(..4) {
        Some("/v1/" | "/v2/") => &path[3..],
        _ => path,
    };
    let path = if path == "/" { "" } else { path };
    let host = match host.to_ascii_lowercase().as_str() {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".to_owned(),
        other => other.to_owned(),
    };
    format!("{host}{path}")
}

/// kubelet's `URLsMatchStr(glob, target)` on schemeless URLs: the port must be equal, the
/// host have as many labels as the glob, each matching its glob label, and the glob's
/// path be a (string) prefix of the target's.
pub(crate) fn urls_match(glob: &str, target: &str) -> bool {
    let split = |s: &str| -> (String, String) {
        match s.find('/') {
            Some(i) => (s[..i].to_owned(), s[i..].to_owned()),
            None => (s.to_owned(), String::new()),
        }
    };
    let (glob_host, glob_path) = split(glob);
    let (target_host, target_path) = split(target);
    let (glob_labels, glob_port) = split_host_port(&glob_host);
    let (target_labels, target_port) = split_host_port(&target_host);
    glob_port == target_port
        && glob_labels.len() == target_labels.len()
        && target_path.starts_with(&glob_path)
        && glob_labels
            .iter()
            .zip(&target_labels)
            .all(|(g, t)| glob_match(g, t))
}

/// Host labels and port (Go's `net.SplitHostPort`, falling back to no port).
fn split_host_port(host: &str) -> (Vec<String>, String) {
    let (name, port) = match host.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') && !h.is_empty() => (h, p),
        _ => (host, ""),
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    (
        name.split('.').map(str::to_owned).collect(),
        port.to_owned(),
    )
}

/// Go's `filepath.Match` on one host label: `*` any run, `?` one character, `[...]` a
/// class (ranges, leading `^` negates), `\` escapes. A malformed pattern matches nothing
/// (kubelet ignores the error and treats it as no match).
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    glob_at(&p, &t).unwrap_or(false)
}

fn glob_at(p: &[char], t: &[char]) -> Option<bool> {
    match p.first() {
        None => Some(t.is_empty()),
        Some('*') => {
            for skip in 0..=t.len() {
                if glob_at(&p[1..], &t[skip..])? {
                    return Some(true);
                }
            }
            Some(false)
        }
        Some('?') => match t.first() {
            Some(_) => glob_at(&p[1..], &t[1..]),
            None => Some(false),
        },
        Some('[') => {
            let (matched, len) = class_match(&p[1..], t.first().copied())?;
            match t.first() {
                Some(_) if matched => glob_at(&p[1 + len..], &t[1..]),
                _ => Some(false),
            }
        }
        Some('\\') => {
            let c = *p.get(1)?;
            match t.first() {
                Some(&x) if x == c => glob_at(&p[2..], &t[1..]),
                _ => Some(false),
            }
        }
        Some(&c) => match t.first() {
            Some(&x) if x == c => glob_at(&p[1..], &t[1..]),
            _ => Some(false),
        },
    }
}

/// A `[...]` class (after the `[`): whether `c` is in it, and the pattern length it used
/// (up to and including `]`); `None` when malformed.
fn class_match(p: &[char], c: Option<char>) -> Option<(bool, usize)> {
    let mut i = 0;
    let negate = p.first() == Some(&'^');
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let lo = match p.get(i)? {
            ']' if !first => break,
            '\\' => {
                i += 1;
                *p.get(i)?
            }
            &x => x,
        };
        first = false;
        i += 1;
        let hi = if p.get(i) == Some(&'-') && p.get(i + 1).is_some_and(|&x| x != ']') {
            i += 1;
            let hi = match p.get(i)? {
                '\\' => {
                    i += 1;
                    *p.get(i)?
                }
                &x => x,
            };
            i += 1;
            hi
        } else {
            lo
        };
        if c.is_some_and(|c| lo <= c && c <= hi) {
            matched = true;
        }
    }
    Some((matched != negate, i + 1))
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
    fn keys_match_as_kubelet_urls_match_most_specific_first() {
        let u = |n: &str| Credentials {
            username: n.into(),
            password: "p".into(),
        };
        let mut ring = Keyring::default();
        ring.add("reg.example:5000", u("host"));
        ring.add("https://reg.example:5000/v2/", u("v2"));
        ring.add("reg.example:5000/team", u("team"));
        ring.add("reg.example:5000/team/app", u("app"));
        ring.add("reg.example", u("no-port"));
        ring.add("*.example:5000", u("glob"));
        ring.add("r?g.ex[a-c]mple:5000/team", u("classes"));
        let names = |image: &str| -> Vec<String> {
            ring.lookup(image)
                .iter()
                .map(|c| c.username.clone())
                .collect()
        };
        // Reverse-sorted keys: the longest path first, then the host (both host entries
        // keep their order), then the globs ("*" sorts before letters).
        assert_eq!(
            names("reg.example:5000/team/app"),
            ["app", "team", "host", "v2", "classes", "glob"]
        );
        assert_eq!(names("reg.example:5000/other"), ["host", "v2", "glob"]);
        assert_eq!(names("reg.example/team"), ["no-port"]);
        assert!(names("reg.example:5001/team").is_empty());
        assert!(names("a.reg.example:5000/team").is_empty());
    }

    #[test]
    fn glob_labels_follow_go_filepath_match() {
        assert!(glob_match("*", "anything"));
        assert!(glob_match("ecr-*", "ecr-eu"));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "ac"));
        assert!(glob_match("[a-c]x", "bx"));
        assert!(!glob_match("[^a-c]x", "bx"));
        assert!(glob_match("[^a-c]x", "dx"));
        assert!(
            !glob_match("[a-c", "a"),
            "a malformed class matches nothing"
        );
        assert!(urls_match(
            "*.dkr.ecr.*.amazonaws.com",
            "123.dkr.ecr.eu-west-1.amazonaws.com/app"
        ));
        assert!(!urls_match(
            "*.dkr.ecr.*.amazonaws.com",
            "dkr.ecr.eu-west-1.amazonaws.com/app"
        ));
    }

    #[test]
    fn bad_base64_is_an_error_naming_the_entry() {
        let err =
            Keyring::from_config_json(br#"{"auths":{"h":{"auth":"!!"}}}"#, "secret x").unwrap_err();
        assert!(err.to_string().contains("secret x"), "{err}");
        assert!(err.to_string().contains("h: auth is not base64"), "{err}");
    }
}

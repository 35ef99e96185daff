//! containerd's registry host directory (`config_path`, `/etc/containerd/certs.d`) as the
//! alternative to `registries.yaml`: `--registry-config DIR` reads `DIR/<host>/hosts.toml`
//! into the same [`RegistriesConfig`] (mirrors and per-host TLS).
//!
//! ```toml
//! # DIR/docker.io/hosts.toml  (DIR/_default/hosts.toml: every registry without its own)
//! server = "https://registry-1.docker.io"   # default: https://<dir name>
//! ca = "/etc/ca.pem"                         # TLS of `server`: ca (string or [one]),
//! client = ["/etc/c.cert", "/etc/c.key"]     # client (one PEM holding both, or [cert, key]
//! skip_verify = false                        # or [[cert, key]]), skip_verify
//!
//! [host."https://mirror.local:5000"]         # tried first, in file order
//!   capabilities = ["pull", "resolve"]
//!   ca = "ca.crt"                            # relative paths: from the host's directory
//! ```
//!
//! The `[host]` entries become the mirror endpoints in file order, then `server` when it is
//! another host than the directory's, then the registry itself. A host without the
//! `resolve` capability is left out (a pull resolves tags at each endpoint); keys ironlet
//! does not implement (`header`, `override_path`, …) are refused rather than ignored.

use std::path::{Path, PathBuf};

use toml_edit::{Item, TableLike};

use super::registries::{split_url, Mirror, RegistriesConfig, TlsConfig};
use crate::image::error::ImageError;

const HOSTS_FILE: &str = "hosts.toml";

/// Reads every `<dir>/<host>/hosts.toml` (directories without one are skipped).
pub(super) fn load(dir: &Path) -> Result<RegistriesConfig, ImageError> {
    let mut cfg = RegistriesConfig::default();
    let entries = std::fs::read_dir(dir).map_err(|e| ImageError::io("listing", dir, e))?;
    let mut hosts: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join(HOSTS_FILE).is_file())
        .collect();
    hosts.sort();
    for host_dir in hosts {
        let name = host_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let file = host_dir.join(HOSTS_FILE);
        let text =
            std::fs::read_to_string(&file).map_err(|e| ImageError::io("reading", &file, e))?;
        let doc = toml_edit::Document::parse(text).map_err(|e| bad(&file, e.to_string()))?;
        let top = doc
            .as_item()
            .as_table_like()
            .ok_or_else(|| bad(&file, "not a table".into()))?;
        read_host_file(&mut cfg, &name, &host_dir, &file, top)?;
    }
    Ok(cfg)
}

fn read_host_file(
    cfg: &mut RegistriesConfig,
    name: &str,
    host_dir: &Path,
    file: &Path,
    top: &dyn TableLike,
) -> Result<(), ImageError> {
    let registry = if name == "_default" { "*" } else { name };
    let mut mirror = Mirror::default();
    for (key, item) in top.iter() {
        match key {
            "server" | "ca" | "client" | "skip_verify" | "host" | "capabilities" => {}
            other => {
                return Err(bad(file, format!("{other:?} is not supported by ironlet")));
            }
        }
        if key == "host" {
            let hosts = item
                .as_table_like()
                .ok_or_else(|| bad(file, "host must be a table of hosts".into()))?;
            for (url, entry) in hosts.iter() {
                let entry = entry
                    .as_table_like()
                    .ok_or_else(|| bad(file, format!("host.{url:?} must be a table")))?;
                for (k, _) in entry.iter() {
                    if !matches!(k, "capabilities" | "ca" | "client" | "skip_verify") {
                        return Err(bad(
                            file,
                            format!("host.{url:?}.{k} is not supported by ironlet"),
                        ));
                    }
                }
                let host = endpoint_host(url, file)?;
                if let Some(tls) = tls_of(entry, host_dir, file, &format!("host.{url:?}"))? {
                    insert_tls(cfg, &host, tls);
                }
                if can_resolve(entry, file, url)? {
                    mirror.endpoint.push(url.to_owned());
                }
            }
        }
    }
    let server = match top.get("server") {
        Some(item) => item
            .as_str()
            .ok_or_else(|| bad(file, "server must be a URL string".into()))?
            .to_owned(),
        None if registry == "*" => String::new(),
        None => format!("https://{name}"),
    };
    if !server.is_empty() {
        let host = endpoint_host(&server, file)?;
        if let Some(tls) = tls_of(top, host_dir, file, "server")? {
            insert_tls(cfg, &host, tls);
        }
        if host != registry {
            mirror.endpoint.push(server);
        }
    }
    // Even without endpoints of its own: a registry with a directory is not `_default`'s.
    cfg.mirrors.insert(registry.to_owned(), mirror);
    Ok(())
}

/// `host[:port]` of an endpoint URL.
fn endpoint_host(url: &str, file: &Path) -> Result<String, ImageError> {
    split_url(url)
        .map(|(_, host)| host)
        .ok_or_else(|| bad(file, format!("{url:?} is not a URL")))
}

/// `capabilities` includes `resolve` (the default is every capability).
fn can_resolve(entry: &dyn TableLike, file: &Path, url: &str) -> Result<bool, ImageError> {
    let Some(item) = entry.get("capabilities") else {
        return Ok(true);
    };
    let list = strings(item).ok_or_else(|| {
        bad(
            file,
            format!("host.{url:?}.capabilities must be a list of strings"),
        )
    })?;
    Ok(list.iter().any(|c| c == "resolve"))
}

/// The `ca`, `client` and `skip_verify` of a table, paths made absolute from `host_dir`.
fn tls_of(
    table: &dyn TableLike,
    host_dir: &Path,
    file: &Path,
    at: &str,
) -> Result<Option<TlsConfig>, ImageError> {
    let path = |p: &str| {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            host_dir.join(p)
        }
    };
    let mut tls = TlsConfig::default();
    let mut any = false;
    if let Some(item) = table.get("ca") {
        let cas = strings(item)
            .ok_or_else(|| bad(file, format!("{at}.ca must be a path or a list of paths")))?;
        match cas.as_slice() {
            [] => {}
            [one] => tls.ca_file = Some(path(one)),
            _ => return Err(bad(file, format!("{at}.ca: ironlet takes one CA file"))),
        }
        any = true;
    }
    if let Some(item) = table.get("client") {
        let (cert, key) = client_pair(item).ok_or_else(|| {
            bad(
                file,
                format!("{at}.client must be a PEM path or [cert, key]"),
            )
        })?;
        tls.cert_file = Some(path(&cert));
        tls.key_file = Some(path(key.as_deref().unwrap_or(&cert)));
        any = true;
    }
    if let Some(item) = table.get("skip_verify") {
        tls.insecure_skip_verify = item
            .as_bool()
            .ok_or_else(|| bad(file, format!("{at}.skip_verify must be true or false")))?;
        any = true;
    }
    Ok(any.then_some(tls))
}

/// `client = "both.pem"`, `["cert", "key"]` or `[["cert", "key"]]` (one pair).
fn client_pair(item: &Item) -> Option<(String, Option<String>)> {
    if let Some(s) = item.as_str() {
        return Some((s.to_owned(), None));
    }
    let array = item.as_array()?;
    if let Some(inner) = array.get(0).and_then(|v| v.as_array()) {
        if array.len() != 1 {
            return None;
        }
        let pair: Vec<&str> = inner.iter().filter_map(|v| v.as_str()).collect();
        return match pair.as_slice() {
            [cert] => Some(((*cert).to_owned(), None)),
            [cert, key] => Some(((*cert).to_owned(), Some((*key).to_owned()))),
            _ => None,
        };
    }
    let pair: Vec<&str> = array.iter().filter_map(|v| v.as_str()).collect();
    match pair.as_slice() {
        [cert] => Some(((*cert).to_owned(), None)),
        [cert, key] => Some(((*cert).to_owned(), Some((*key).to_owned()))),
        _ => None,
    }
}

/// A string, or an array of strings.
fn strings(item: &Item) -> Option<Vec<String>> {
    if let Some(s) = item.as_str() {
        return Some(vec![s.to_owned()]);
    }
    item.as_array()?
        .iter()
        .map(|v| v.as_str().map(str::to_owned))
        .collect()
}

fn insert_tls(cfg: &mut RegistriesConfig, host: &str, tls: TlsConfig) {
    cfg.configs.entry(host.to_owned()).or_default().tls = Some(tls);
}

fn bad(file: &Path, message: String) -> ImageError {
    ImageError::RegistryConfig {
        path: file.to_path_buf(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::reference::Reference;

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (host, text) in files {
            std::fs::create_dir_all(dir.path().join(host)).unwrap();
            std::fs::write(dir.path().join(host).join(HOSTS_FILE), text).unwrap();
            std::fs::write(dir.path().join(host).join("ca.crt"), "pem").unwrap();
        }
        dir
    }

    fn hosts(cfg: &RegistriesConfig, reference: &str) -> Vec<(String, bool)> {
        cfg.endpoints(&Reference::parse(reference).unwrap())
            .unwrap()
            .into_iter()
            .map(|e| (e.host, e.plain_http))
            .collect()
    }

    #[test]
    fn hosts_come_in_file_order_then_the_server_then_the_registry() {
        let dir = dir_with(&[(
            "docker.io",
            "server = \"https://registry-1.docker.io\"\n\
             [host.\"http://10.0.0.2:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n\
             [host.\"https://blobs.local\"]\n  capabilities = [\"pull\"]\n\
             [host.\"https://a.local\"]\n  ca = \"ca.crt\"\n  skip_verify = true\n",
        )]);
        let cfg = RegistriesConfig::load(dir.path()).unwrap();
        assert_eq!(
            hosts(&cfg, "busybox:1"),
            [
                ("10.0.0.2:5000".to_owned(), true),
                ("a.local".to_owned(), false),
                ("registry-1.docker.io".to_owned(), false),
                ("docker.io".to_owned(), false),
            ]
        );
        let tls = cfg.configs["a.local"].tls.clone().unwrap();
        assert_eq!(tls.ca_file, Some(dir.path().join("docker.io/ca.crt")));
        assert!(tls.insecure_skip_verify);
    }

    #[test]
    fn the_default_directory_covers_registries_without_their_own() {
        let dir = dir_with(&[
            ("_default", "[host.\"https://catch.all\"]\n"),
            ("quay.io", "ca = \"ca.crt\"\nclient = \"ca.crt\"\n"),
        ]);
        let cfg = RegistriesConfig::load(dir.path()).unwrap();
        assert_eq!(
            hosts(&cfg, "ghcr.io/a/b:1"),
            [
                ("catch.all".to_owned(), false),
                ("ghcr.io".to_owned(), false)
            ]
        );
        assert_eq!(
            hosts(&cfg, "quay.io/a/b:1"),
            [("quay.io".to_owned(), false)]
        );
        let tls = cfg.configs["quay.io"].tls.clone().unwrap();
        let both = dir.path().join("quay.io/ca.crt");
        assert_eq!(tls.ca_file.as_ref(), Some(&both));
        assert_eq!(
            (tls.cert_file.as_ref(), tls.key_file.as_ref()),
            (Some(&both), Some(&both))
        );
    }

    #[test]
    fn unsupported_keys_and_missing_files_are_refused() {
        for (text, needle) in [
            (
                "[host.\"https://m\"]\n  override_path = true\n",
                "override_path",
            ),
            ("[host.\"https://m\"]\n  header = {a = \"b\"}\n", "header"),
            ("ca = \"nope.crt\"\n", "nope.crt"),
            ("ca = [\"ca.crt\", \"ca.crt\"]\n", "one CA file"),
            ("server = 5\n", "server"),
            ("[host\n", "hosts.toml"),
        ] {
            let dir = dir_with(&[("r.local", text)]);
            let err = RegistriesConfig::load(dir.path()).unwrap_err().to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }
}

//! The kubelet-managed files of a pod — `/etc/hosts` (kubelet's `makeHostsMount`,
//! `managedHostsFileContent`, `nodeHostsFileContent`), `/etc/hostname` and
//! `/etc/resolv.conf` (written by the CRI runtime from the sandbox's hostname and DNS
//! config) — written in the pod directory and bind-mounted into each container that does
//! not mount its own file there.

use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ironlet_runtime::types::{ContainerId, Mount};
use k8s_openapi::api::core::v1::{HostAlias, Pod};

/// kubelet's hostname limit (`hostnameMaxLen`).
const HOSTNAME_MAX_LEN: usize = 63;
/// kubelet's mode for the pod's hosts file.
const FILE_MODE: u32 = 0o644;
const HOSTS_HEADER: &str = "# Kubernetes-managed hosts file.\n";
const HOSTS_HEADER_HOST_NETWORK: &str = "# Kubernetes-managed hosts file (host network).\n";
/// The node's hosts file, copied for host-network pods (kubelet's `etcHostsPath`).
pub const NODE_HOSTS_PATH: &str = "/etc/hosts";

/// Names in the pod directory (kubelet's `etc-hosts`; containerd's sandbox file names).
const HOSTS_FILE: &str = "etc-hosts";
const HOSTNAME_FILE: &str = "hostname";
const RESOLV_FILE: &str = "resolv.conf";

/// Errors preparing a pod's managed files.
#[derive(Debug, thiserror::Error)]
pub enum EtcFilesError {
    #[error("hostname for pod {pod:?} was invalid: {hostname:?}")]
    InvalidHostname { pod: String, hostname: String },
    #[error("pod HostnameOverride {hostname:?} is not a valid DNS subdomain: {reason}")]
    InvalidHostnameOverride {
        hostname: String,
        reason: &'static str,
    },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

/// kubelet's `GeneratePodHostNameAndDomain`: `spec.hostnameOverride` (a DNS-1123 subdomain;
/// then no domain, whatever `hostname` and `subdomain` say), else `spec.hostname` or the pod
/// name, truncated to 63 characters without a trailing `-` or `.`; the domain
/// `<subdomain>.<namespace>.svc.<cluster domain>` when `spec.subdomain` is set.
pub fn pod_hostname_and_domain(
    pod: &Pod,
    cluster_domain: &str,
) -> Result<(String, Option<String>), EtcFilesError> {
    let spec = pod.spec.as_ref();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if let Some(hostname) = spec.and_then(|s| s.hostname_override.as_deref()) {
        crate::config::check_dns1123_subdomain(hostname).map_err(|reason| {
            EtcFilesError::InvalidHostnameOverride {
                hostname: hostname.to_owned(),
                reason,
            }
        })?;
        return Ok((truncate_hostname(name, hostname)?, None));
    }
    let hostname = spec
        .and_then(|s| s.hostname.as_deref())
        .filter(|h| !h.is_empty())
        .unwrap_or(name);
    let truncated = truncate_hostname(name, hostname)?;
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let domain = spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|s| !s.is_empty())
        .map(|sub| format!("{sub}.{namespace}.svc.{cluster_domain}"));
    Ok((truncated, domain))
}

/// kubelet's `truncatePodHostnameIfNeeded`.
fn truncate_hostname(name: &str, hostname: &str) -> Result<String, EtcFilesError> {
    let truncated = if hostname.len() > HOSTNAME_MAX_LEN {
        let cut = hostname.get(..HOSTNAME_MAX_LEN).unwrap_or_default();
        tracing::warn!(
            pod = name,
            hostname,
            "hostname for pod was too long, truncated it"
        );
        cut.trim_end_matches(['-', '.'])
    } else {
        hostname
    };
    if truncated.is_empty() {
        return Err(EtcFilesError::InvalidHostname {
            pod: name.to_owned(),
            hostname: hostname.to_owned(),
        });
    }
    Ok(truncated.to_owned())
}

/// kubelet's `hostsEntriesFromHostAliases`.
fn host_alias_entries(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for alias in aliases {
        let names = alias.hostnames.as_deref().unwrap_or_default().join("\t");
        out.push_str(&format!("{}\t{names}\n", alias.ip));
    }
    out
}

/// kubelet's `managedHostsFileContent`.
pub fn managed_hosts_content(
    pod_ips: &[String],
    hostname: &str,
    domain: Option<&str>,
    aliases: &[HostAlias],
) -> String {
    let mut out = String::from(HOSTS_HEADER);
    out.push_str("127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    out.push_str("fe00::0\tip6-localnet\n");
    out.push_str("fe00::0\tip6-mcastprefix\n");
    out.push_str("fe00::1\tip6-allnodes\n");
    out.push_str("fe00::2\tip6-allrouters\n");
    for ip in pod_ips {
        match domain {
            Some(domain) => out.push_str(&format!("{ip}\t{hostname}.{domain}\t{hostname}\n")),
            None => out.push_str(&format!("{ip}\t{hostname}\n")),
        }
    }
    out.push_str(&host_alias_entries(aliases));
    out
}

/// kubelet's `nodeHostsFileContent`: the node's file plus the pod's aliases.
pub fn node_hosts_content(node_hosts: &str, aliases: &[HostAlias]) -> String {
    format!(
        "{HOSTS_HEADER_HOST_NETWORK}{node_hosts}{}",
        host_alias_entries(aliases)
    )
}

/// The three files of one pod, ready to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcFiles {
    pub hosts: String,
    pub hostname: String,
    pub resolv_conf: String,
}

impl EtcFiles {
    /// Writes the files into `pod_dir` (mode 0644, atomically, without following
    /// symlinks) and adds their mounts for `container_mounts`' container, except where
    /// the container mounts its own file. True when `resolv.conf` was (re)written, i.e. its
    /// DNS configuration is new for the pod.
    pub fn write_and_mount(
        &self,
        pod_dir: &Path,
        read_only_rootfs: bool,
        container_mounts: &mut Vec<Mount>,
    ) -> Result<bool, EtcFilesError> {
        let mut resolv_conf_written = false;
        let files = [
            ("/etc/hosts", HOSTS_FILE, &self.hosts, false),
            (
                "/etc/hostname",
                HOSTNAME_FILE,
                &self.hostname,
                read_only_rootfs,
            ),
            (
                "/etc/resolv.conf",
                RESOLV_FILE,
                &self.resolv_conf,
                read_only_rootfs,
            ),
        ];
        for (container_path, name, content, read_only) in files {
            let host_path = pod_dir.join(name);
            let written = write_file(&host_path, content.as_bytes()).map_err(|source| {
                EtcFilesError::Write {
                    path: host_path.clone(),
                    source,
                }
            })?;
            resolv_conf_written |= written && name == RESOLV_FILE;
            if !container_mounts
                .iter()
                .any(|m| m.container_path.trim_end_matches('/') == container_path)
            {
                container_mounts.push(Mount {
                    container_path: container_path.to_owned(),
                    host_path,
                    read_only,
                });
            }
        }
        Ok(resolv_conf_written)
    }
}

/// Rewrites the pod's managed `/etc/hosts` in `pod_dir` with `content`, in place (same
/// inode, never through a symlink): for a container created before the pod's IP was known
/// (a rootless pod's network comes up while its first container is created), whose bind
/// mount holds the file's inode. False when there is no such file (the pod's containers
/// mount their own) or it already holds `content`.
pub fn rewrite_hosts_in_place(pod_dir: &Path, content: &str) -> io::Result<bool> {
    let path = pod_dir.join(HOSTS_FILE);
    match read_nofollow(&path) {
        Ok(old) if old == content.as_bytes() => return Ok(false),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)?;
    file.write_all(content.as_bytes())?;
    Ok(true)
}

/// Replaces `path` with `content` unless it already holds it: a temporary file created
/// exclusively (never through a symlink), then renamed over `path`. True when written.
fn write_file(path: &Path, content: &[u8]) -> io::Result<bool> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no parent directory"))?;
    std::fs::create_dir_all(dir)?;
    if read_nofollow(path).ok().as_deref() == Some(content) {
        return Ok(false);
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}", ContainerId::random().short()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        // The umask may have narrowed the mode.
        file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
        file.write_all(content)?;
        // A play's pods go with it (see `fsutil::set_state_throwaway`).
        if !ironlet_runtime::fsutil::state_is_throwaway() {
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map(|()| true)
}

fn read_nofollow(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let mut out = Vec::new();
    file.read_to_end(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).expect("test pod")
    }

    #[test]
    fn hostname_is_the_spec_hostname_or_the_name_truncated_as_kubelet_does() {
        let long = format!("{}-{}", "a".repeat(62), "b".repeat(6));
        let p = pod(&format!(
            "metadata: {{name: {long}}}\nspec: {{containers: []}}"
        ));
        // 63 characters end with '-', which is trimmed.
        assert_eq!(
            pod_hostname_and_domain(&p, "cluster.local").unwrap().0,
            "a".repeat(62)
        );
        let p = pod(
            "metadata: {name: n, namespace: ns}\nspec: {hostname: h, subdomain: s, containers: []}",
        );
        assert_eq!(
            pod_hostname_and_domain(&p, "cluster.local").unwrap(),
            ("h".to_owned(), Some("s.ns.svc.cluster.local".to_owned()))
        );
    }

    #[test]
    fn a_hostname_override_replaces_hostname_and_subdomain() {
        let p = pod("metadata: {name: n, namespace: ns}\nspec: {hostname: h, subdomain: s, hostnameOverride: override.example.host, containers: []}");
        assert_eq!(
            pod_hostname_and_domain(&p, "cluster.local").unwrap(),
            ("override.example.host".to_owned(), None)
        );
        let long = format!("{}.{}", "a".repeat(62), "b".repeat(6));
        let p = pod(&format!(
            "metadata: {{name: n}}\nspec: {{hostnameOverride: {long}, containers: []}}"
        ));
        assert_eq!(
            pod_hostname_and_domain(&p, "cluster.local").unwrap().0,
            "a".repeat(62)
        );
        let p = pod("metadata: {name: n}\nspec: {hostnameOverride: Not_Valid, containers: []}");
        assert!(matches!(
            pod_hostname_and_domain(&p, "cluster.local"),
            Err(EtcFilesError::InvalidHostnameOverride { .. })
        ));
    }

    #[test]
    fn hosts_content_has_the_header_pod_ips_and_aliases() {
        let aliases = vec![HostAlias {
            ip: "10.1.2.3".into(),
            hostnames: Some(vec!["foo.remote".into(), "bar.remote".into()]),
        }];
        let content = managed_hosts_content(&["10.85.0.4".into()], "web", None, &aliases);
        assert_eq!(
            content,
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n10.85.0.4\tweb\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo.remote\tbar.remote\n"
        );
        let with_domain =
            managed_hosts_content(&["10.85.0.4".into()], "h", Some("s.ns.svc.c"), &[]);
        assert!(with_domain.ends_with("10.85.0.4\th.s.ns.svc.c\th\n"));
        assert_eq!(
            node_hosts_content("127.0.0.1 localhost\n", &[]),
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n"
        );
    }

    #[test]
    fn files_are_written_0644_never_through_a_symlink_and_not_over_own_mounts() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join(HOSTS_FILE)).unwrap();
        let files = EtcFiles {
            hosts: "h\n".into(),
            hostname: "n\n".into(),
            resolv_conf: "r\n".into(),
        };
        let mut mounts = vec![Mount {
            container_path: "/etc/resolv.conf".into(),
            host_path: "/own".into(),
            read_only: true,
        }];
        assert!(files
            .write_and_mount(dir.path(), true, &mut mounts)
            .unwrap());
        let unchanged = files.write_and_mount(dir.path(), true, &mut Vec::new());
        assert!(!unchanged.unwrap(), "the same resolv.conf is not new");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        let hosts = dir.path().join(HOSTS_FILE);
        assert!(!hosts.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&hosts).unwrap(), "h\n");
        let mode = std::fs::metadata(&hosts).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        let paths: Vec<_> = mounts.iter().map(|m| m.container_path.as_str()).collect();
        assert_eq!(paths, ["/etc/resolv.conf", "/etc/hosts", "/etc/hostname"]);
        assert_eq!(mounts[0].host_path, Path::new("/own"));
        assert!(!mounts[1].read_only && mounts[2].read_only);
    }
}

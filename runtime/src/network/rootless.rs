//! Rootless pod networking with pasta (Debian's `passt`), as podman 5 does by default.
//!
//! An unprivileged user can create network namespaces (in a user namespace of their own)
//! but not connect them to the host: no veth into the host's namespace, no bridge, no NAT
//! rule. A user-mode helper does it, on a tap device in the pod's namespace, translating
//! the pod's packets to ordinary sockets of the user on the host. Two are packaged:
//! `slirp4netns` (a full TCP/IP stack, libslirp) and `pasta` (a layer-4 translation without
//! a TCP stack of its own, and a splice path for host loopback traffic). Measured on this
//! machine (docs/BENCHMARKS.md, "Rootless networking"): pasta moves 355–457 MiB/s from a
//! pod to a host loopback server against slirp4netns' 168–191 MiB/s, and starts in ~0.12 s
//! against ~0.03 s. pasta is chosen: twice the throughput, published ports are plain
//! arguments (`-t 8080:80`; slirp4netns needs an API socket and a request per port), the
//! pod's address is the host's own (so a pod reaches what the host reaches, and no
//! address range can clash), and it is what podman uses, so a pod behaves as under
//! `podman kube play`. Its start-up cost is paid once per pod (measured in
//! docs/BENCHMARKS.md); pods with `hostNetwork` do not pay it.
//!
//! What a pod gets: `eth0` with the address and routes of the host's default interface,
//! the host's gateway as its gateway; connections to the gateway address reach the host's
//! loopback (pasta's default mapping), so a server the developer runs on `127.0.0.1`
//! answers the pod at the gateway's address. Published ports (`hostPort`, `ctr run -p`)
//! are pasta's `-t`/`-u` forwards; nothing else of the host is forwarded into the pod
//! (`-T none -U none`, and no automatic forwarding of the pod's listening ports).
//!
//! Life cycle: `zygote/holder.rs` runs pasta under a keeper, the child of the process
//! holding the pod's namespaces; the sandbox record keeps the holder's pid and start time.
//! A pasta that dies is restarted by the keeper with the same arguments, with a warning.
//! Sandbox removal stops the holder (which stops the keeper, which stops and reaps pasta);
//! an agent restart finds the holder still watched by the supervisor (or adopts it by pid
//! and start time).
//!
//! Requirements, checked before each sandbox with a warning when unmet (the pod then gets
//! a loopback-only namespace, as before): `pasta` on `PATH`, `/dev/net/tun` usable by the
//! user (udev makes it 0666; `scripts/install-deps` does where udev is absent), and a user
//! namespace the worker makes (the containers join the holder's): the subordinate ranges, or
//! without a range the user's own ids, both mapped by `newuidmap`/`newgidmap` (Debian's
//! `uidmap`).

use std::path::{Path, PathBuf};

use crate::spec::IdMapping;
use crate::types::{PortMapping, Protocol};

/// The interface name inside the pod, as with CNI.
const IFNAME: &str = super::POD_IFNAME;

/// What the zygote is asked to start for one sandbox.
#[derive(Debug, Clone)]
pub struct HolderRequest {
    pub id: String,
    pub dir: PathBuf,
    pub hostname: String,
    pub uids: Vec<IdMapping>,
    pub gids: Vec<IdMapping>,
    pub ipc: bool,
    pub pasta: Vec<String>,
}

/// Why rootless networking is unavailable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error("pasta is not installed (Debian package passt)")]
    NoPasta,
    #[error("/dev/net/tun cannot be opened: {0} (udev makes it mode 0666)")]
    NoTun(String),
    #[error(
        "newuidmap/newgidmap are missing (Debian package uidmap): the containers cannot \
         join the namespace pasta connects"
    )]
    NoHelpers,
}

/// pasta's path, if it is installed and the user may open `/dev/net/tun`.
pub fn pasta_binary() -> Result<PathBuf, Unavailable> {
    let found = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("pasta"))
        .find(|p| p.is_file())
        .ok_or(Unavailable::NoPasta)?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(|e| Unavailable::NoTun(e.to_string()))?;
    Ok(found)
}

/// pasta, when rootless networking can work for this process (`worker_made`: the worker makes
/// the user namespace, with the subordinate ranges or the user's own ids). Resolved once per process; the first call that finds it unusable
/// warns, naming why, and pods keep a loopback-only network.
pub fn usable(worker_made: bool) -> Option<PathBuf> {
    static RESOLVED: std::sync::OnceLock<Result<PathBuf, Unavailable>> = std::sync::OnceLock::new();
    let resolved = RESOLVED.get_or_init(|| {
        let found = if worker_made {
            pasta_binary()
        } else {
            Err(Unavailable::NoHelpers)
        };
        if let Err(why) = &found {
            tracing::warn!(reason = %why,
                "rootless networking unavailable: pods get a loopback-only network and \
                 ports cannot be published");
        }
        found
    });
    resolved.as_ref().ok().cloned()
}

/// pasta's command line for a pod whose sandbox directory is `dir` (without the target
/// pid, which the holder appends).
pub fn pasta_args(pasta: &Path, dir: &Path, ports: &[PortMapping]) -> Vec<String> {
    let mut args = vec![
        pasta.to_string_lossy().into_owned(),
        "--config-net".into(),
        "--foreground".into(),
        "--quiet".into(),
        "--ns-ifname".into(),
        IFNAME.into(),
        "--pid".into(),
        dir.join("pasta.pid").to_string_lossy().into_owned(),
        "-T".into(),
        "none".into(),
        "-U".into(),
        "none".into(),
    ];
    for (flag, protocol) in [("-t", Protocol::Tcp), ("-u", Protocol::Udp)] {
        args.push(flag.into());
        args.push(forward_spec(ports, protocol));
    }
    args
}

/// pasta's `-t`/`-u` value: `none`, or `[ADDR/]HOST:CTR,…`.
fn forward_spec(ports: &[PortMapping], protocol: Protocol) -> String {
    let specs: Vec<String> = ports
        .iter()
        .filter(|p| p.protocol == protocol)
        .map(|p| {
            let address = match p.host_ip.as_str() {
                "" | "0.0.0.0" | "::" => String::new(),
                ip => format!("{ip}/"),
            };
            format!("{address}{}:{}", p.host_port, p.container_port)
        })
        .collect();
    if specs.is_empty() {
        "none".into()
    } else {
        specs.join(",")
    }
}

/// The pod's address the holder wrote, if any.
pub fn read_pod_ip(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("pod-ip")).ok()?;
    let ip: std::net::IpAddr = text.trim().parse().ok()?;
    Some(ip.to_string())
}

/// In a sandbox directory: one line per pasta restart, appended by the keeper
/// (`zygote/holder.rs`).
pub const RESTARTS_FILE: &str = "pasta-restarts";
/// In a sandbox directory: how many lines of [`RESTARTS_FILE`] have been reported (written
/// by the runtime that reports them, so that an agent restart does not report them again).
const REPORTED_FILE: &str = "pasta-restarts.reported";

/// Appends one restart (`what`: how pasta ended and what replaced it) to `dir`'s
/// [`RESTARTS_FILE`]. One `write` of a whole line on an `O_APPEND` descriptor: a reader
/// sees complete lines.
pub fn record_restart(dir: &Path, what: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut line = what.replace('\n', " ");
    line.push('\n');
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(RESTARTS_FILE))?
        .write_all(line.as_bytes())
}

/// The restarts recorded in `dir` since the last call (across processes: the count
/// reported is kept beside them); empty when there are none or the file is unreadable.
pub fn take_new_restarts(dir: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(dir.join(RESTARTS_FILE)) else {
        return Vec::new();
    };
    let lines: Vec<&str> = text.lines().collect();
    let reported = std::fs::read_to_string(dir.join(REPORTED_FILE))
        .ok()
        .and_then(|t| t.trim().parse::<usize>().ok())
        .unwrap_or(0);
    if lines.len() <= reported {
        return Vec::new();
    }
    if let Err(err) = std::fs::write(dir.join(REPORTED_FILE), lines.len().to_string()) {
        tracing::warn!(dir = %dir.display(), %err, "recording the reported pasta restarts failed");
    }
    lines[reported..].iter().map(|l| (*l).to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_are_taken_once_each_even_by_a_new_reader() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert!(take_new_restarts(dir.path()).is_empty(), "no file yet");
        record_restart(dir.path(), "ended (signal SIGKILL); restarted as pid 7").expect("record");
        assert_eq!(
            take_new_restarts(dir.path()),
            ["ended (signal SIGKILL); restarted as pid 7"]
        );
        assert!(take_new_restarts(dir.path()).is_empty(), "taken once");
        record_restart(dir.path(), "two\nlines").expect("record");
        record_restart(dir.path(), "three").expect("record");
        // The count is on disk: what a restarted agent reads.
        assert_eq!(take_new_restarts(dir.path()), ["two lines", "three"]);
        assert!(take_new_restarts(dir.path()).is_empty());
    }

    fn port(protocol: Protocol, host_ip: &str, host: u16, ctr: u16) -> PortMapping {
        PortMapping {
            protocol,
            container_port: ctr,
            host_port: host,
            host_ip: host_ip.into(),
        }
    }

    #[test]
    fn ports_become_pasta_forwards_per_protocol_and_nothing_else_is_forwarded() {
        let args = pasta_args(
            Path::new("/usr/bin/pasta"),
            Path::new("/s"),
            &[
                port(Protocol::Tcp, "", 8080, 80),
                port(Protocol::Tcp, "127.0.0.1", 8443, 443),
                port(Protocol::Udp, "0.0.0.0", 5353, 53),
            ],
        );
        let joined = args.join(" ");
        assert!(joined.starts_with("/usr/bin/pasta --config-net --foreground"));
        assert!(joined.contains("--pid /s/pasta.pid"), "{joined}");
        assert!(joined.contains("-T none -U none"), "{joined}");
        assert!(
            joined.ends_with("-t 8080:80,127.0.0.1/8443:443 -u 5353:53"),
            "{joined}"
        );
        let none = pasta_args(Path::new("pasta"), Path::new("/s"), &[]).join(" ");
        assert!(none.ends_with("-t none -u none"), "{none}");
    }
}

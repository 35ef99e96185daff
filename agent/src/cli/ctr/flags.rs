//! docker/podman flag values of `ironlet ctr run`, turned into the runtime's types:
//! `-v HOST:CTR[:ro|rw]`, `-u UID[:GID]`, `-e KEY[=VALUE]`,
//! `--cpus 1.5` and sizes (`--memory 64m`), `-p [IP:]HOST:CTR[/tcp|udp]`.
//!
//! Each parser refuses what docker refuses, with a message naming the flag, before any
//! sandbox is made: a bad flag never leaves anything behind.

use ironlet_runtime::types::{Mount, PortMapping, Protocol};

/// The CFS period `--cpus` uses, as docker: 100 ms.
pub const CPU_PERIOD_US: u64 = 100_000;

/// The smallest CFS quota the kernel accepts (1 ms), so `--cpus` ≥ 0.01.
const MIN_CPU_QUOTA_US: i64 = 1_000;

/// `-p [IP:]HOST:CTR[/tcp|udp]` (docker's syntax; an IPv6 address in brackets). The host
/// port is required: docker's random host port (`-p CTR`, `-p IP::CTR`) is refused.
pub fn parse_publish(s: &str) -> Result<PortMapping, String> {
    let (spec, protocol) = match s.rsplit_once('/') {
        Some((spec, "tcp")) => (spec, Protocol::Tcp),
        Some((spec, "udp")) => (spec, Protocol::Udp),
        Some((_, other)) => return Err(format!("{s:?}: unknown protocol {other:?} (tcp or udp)")),
        None => (s, Protocol::Tcp),
    };
    let (host_ip, ports) = match spec.strip_prefix('[') {
        Some(rest) => {
            let (ip, ports) = rest
                .split_once("]:")
                .ok_or_else(|| format!("{s:?}: expected [IPv6]:HOST:CTR"))?;
            (ip.to_owned(), ports)
        }
        None => match spec.matches(':').count() {
            1 => (String::new(), spec),
            2 => {
                let (ip, ports) = spec.split_once(':').unwrap_or_default();
                (ip.to_owned(), ports)
            }
            _ => return Err(format!("{s:?}: expected [IP:]HOST:CTR[/tcp|udp]")),
        },
    };
    if !host_ip.is_empty() && host_ip.parse::<std::net::IpAddr>().is_err() {
        return Err(format!("{s:?}: {host_ip:?} is not an IP address"));
    }
    let (host, ctr) = ports
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: a host port is required (HOST:CTR)"))?;
    let port = |p: &str, what: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{s:?}: {what} port {p:?} is not a port number (1-65535)"))
    };
    Ok(PortMapping {
        protocol,
        host_port: port(host, "host")?,
        container_port: port(ctr, "container")?,
        host_ip,
    })
}

/// `--memory` and friends: bytes, or a number with a k, m or g suffix (binary units).
pub fn parse_bytes(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (s, 1i64),
        Some((i, _)) => {
            let mult = match s[i..].to_ascii_lowercase().as_str() {
                "b" => 1,
                "k" | "kb" | "ki" | "kib" => 1 << 10,
                "m" | "mb" | "mi" | "mib" => 1 << 20,
                "g" | "gb" | "gi" | "gib" => 1 << 30,
                other => return Err(format!("unknown unit {other:?} (use k, m or g)")),
            };
            (&s[..i], mult)
        }
    };
    let n: i64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 64m)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s} is too large"))
}

/// `--cpus 1.5`: the CFS quota in µs for [`CPU_PERIOD_US`], as docker computes it.
pub fn parse_cpus(s: &str) -> Result<i64, String> {
    let cpus: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of CPUs (e.g. 1.5)"))?;
    if !cpus.is_finite() || cpus <= 0.0 {
        return Err(format!("{s:?}: the number of CPUs must be positive"));
    }
    let quota = (cpus * CPU_PERIOD_US as f64).round();
    if quota < MIN_CPU_QUOTA_US as f64 {
        return Err(format!("{s:?}: the smallest CPU limit is 0.01"));
    }
    if quota > i64::MAX as f64 {
        return Err(format!("{s:?} is too large"));
    }
    Ok(quota as i64)
}

/// `-u UID[:GID]`: numeric ids (`run_as_user`, `run_as_group`). User names would need the
/// image's `/etc/passwd` before the container exists; they are refused with a clear message.
pub fn parse_user(s: &str) -> Result<(u32, Option<u32>), String> {
    let (user, group) = match s.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (s, None),
    };
    let numeric = |v: &str| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit());
    if !numeric(user) || group.is_some_and(|g| !numeric(g)) {
        return Err(format!(
            "--user {s:?}: use numeric UID[:GID] (user and group names are not supported)"
        ));
    }
    let uid = user
        .parse()
        .map_err(|_| format!("--user {s:?}: uid does not fit in 32 bits"))?;
    let gid = group
        .map(str::parse)
        .transpose()
        .map_err(|_| format!("--user {s:?}: gid does not fit in 32 bits"))?;
    Ok((uid, gid))
}

/// `-v HOST:CTR[:ro|rw]`: a bind mount of an existing host path (made absolute and
/// resolved, relative paths against the current directory, as podman does).
pub fn parse_volume(s: &str) -> Result<Mount, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let (host, ctr, read_only) = match parts.as_slice() {
        [host, ctr] => (*host, *ctr, false),
        [host, ctr, "ro"] => (*host, *ctr, true),
        [host, ctr, "rw"] => (*host, *ctr, false),
        [_, _, mode] => {
            return Err(format!(
                "--volume {s:?}: unknown mode {mode:?} (use ro or rw)"
            ))
        }
        _ => return Err(format!("--volume {s:?}: use HOST:CONTAINER[:ro|rw]")),
    };
    if host.is_empty() {
        return Err(format!("--volume {s:?}: the host path is empty"));
    }
    if !ctr.starts_with('/') {
        return Err(format!(
            "--volume {s:?}: the container path {ctr:?} must be absolute"
        ));
    }
    let host_path = std::fs::canonicalize(host).map_err(|err| match err.kind() {
        std::io::ErrorKind::NotFound => {
            format!("--volume {s:?}: the host path {host} does not exist")
        }
        _ => format!("--volume {s:?}: the host path {host}: {err}"),
    })?;
    Ok(Mount {
        container_path: ctr.to_owned(),
        host_path,
        read_only,
    })
}

/// `-e KEY=VALUE`, or `-e KEY`: the value of `KEY` in ironlet's own environment, and no
/// variable at all when it has none (as docker).
pub fn parse_env(
    s: &str,
    host: impl Fn(&str) -> Option<String>,
) -> Result<Option<(String, String)>, String> {
    let (key, value) = match s.split_once('=') {
        Some((k, v)) => (k, Some(v.to_owned())),
        None => (s, None),
    };
    if key.is_empty() {
        return Err(format!("--env {s:?}: the variable name is empty"));
    }
    Ok(value.or_else(|| host(key)).map(|v| (key.to_owned(), v)))
}

/// `-w DIR`: must be absolute, as docker says.
pub fn parse_workdir(s: &str) -> Result<String, String> {
    if s.starts_with('/') {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "--workdir {s:?}: the working directory must be absolute"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units_like_docker() {
        assert_eq!(parse_bytes("64m"), Ok(64 << 20));
        assert_eq!(parse_bytes("1g"), Ok(1 << 30));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("12x").is_err());
        assert!(parse_bytes("m").is_err());
    }

    #[test]
    fn cpus_become_a_quota_of_a_100ms_period() {
        assert_eq!(parse_cpus("1.5"), Ok(150_000));
        assert_eq!(parse_cpus("0.5"), Ok(50_000));
        assert_eq!(parse_cpus("2"), Ok(200_000));
        assert_eq!(parse_cpus("0.01"), Ok(1_000));
        for bad in ["0", "-1", "0.001", "abc", "NaN", "inf"] {
            assert!(parse_cpus(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn users_are_numeric_ids() {
        assert_eq!(parse_user("1000:1000"), Ok((1000, Some(1000))));
        assert_eq!(parse_user("7"), Ok((7, None)));
        for bad in [
            "",
            ":1",
            "1:",
            "1:2:3",
            "99999999999",
            "nobody",
            "1000:users",
        ] {
            assert!(parse_user(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn volumes_need_an_existing_host_path_and_an_absolute_container_path() {
        let dir = tempfile::tempdir().expect("temp dir");
        let host = dir.path().to_string_lossy().into_owned();
        let m = parse_volume(&format!("{host}:/data:ro")).expect("valid");
        assert_eq!(m.container_path, "/data");
        assert!(m.read_only);
        assert_eq!(
            m.host_path,
            std::fs::canonicalize(dir.path()).expect("path")
        );
        assert!(
            !parse_volume(&format!("{host}:/data"))
                .expect("valid")
                .read_only
        );
        let missing = parse_volume("/no/such/dir:/data").expect_err("missing host path");
        assert!(missing.contains("/no/such/dir does not exist"), "{missing}");
        let relative = parse_volume(&format!("{host}:data")).expect_err("relative");
        assert!(relative.contains("must be absolute"), "{relative}");
        assert!(parse_volume(&format!("{host}:/data:rx")).is_err());
        assert!(parse_volume(&host).is_err());
    }

    #[test]
    fn env_without_a_value_takes_the_hosts_or_nothing() {
        let host = |k: &str| (k == "HOSTVAR").then(|| "from-host".to_owned());
        assert_eq!(
            parse_env("A=b=c", host),
            Ok(Some(("A".into(), "b=c".into())))
        );
        assert_eq!(
            parse_env("HOSTVAR", host),
            Ok(Some(("HOSTVAR".into(), "from-host".into())))
        );
        assert_eq!(parse_env("UNSET", host), Ok(None));
        assert_eq!(parse_env("E=", host), Ok(Some(("E".into(), String::new()))));
        assert!(parse_env("=x", host).is_err());
    }

    #[test]
    fn publish_takes_dockers_forms_and_refuses_a_missing_host_port() {
        let p = parse_publish("8080:80").unwrap();
        assert_eq!(
            (
                p.host_ip.as_str(),
                p.host_port,
                p.container_port,
                p.protocol
            ),
            ("", 8080, 80, Protocol::Tcp)
        );
        let p = parse_publish("127.0.0.1:5353:53/udp").unwrap();
        assert_eq!(
            (
                p.host_ip.as_str(),
                p.host_port,
                p.container_port,
                p.protocol
            ),
            ("127.0.0.1", 5353, 53, Protocol::Udp)
        );
        let p = parse_publish("[::1]:8443:443/tcp").unwrap();
        assert_eq!((p.host_ip.as_str(), p.host_port), ("::1", 8443));
        for bad in [
            "80",
            "1.2.3.4::80",
            "x:80:80",
            "8080:0",
            "8080:80/sctp",
            "70000:80",
        ] {
            assert!(parse_publish(bad).is_err(), "{bad} accepted");
        }
    }
}

//! Pod networking with Debian's CNI plugins, as root, with real containers: addresses,
//! reachability from the host and between pods, release of everything at removal, a
//! failing plugin, and the loopback-only fallback. Every runtime here has its own temp
//! root, CNI conf dir, network name, bridge (`irlt<pid>`) and subnet (`10.86.<pid%256>.0/24`),
//! so a running ironlet (10.85.0.0/16 on `ironlet0`) is not disturbed; the bridge is deleted
//! and `net.ipv4.ip_forward` restored at the end, and the run fails if NAT rules are left.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ironlet_runtime::local::record::SandboxRecord;
use ironlet_runtime::network::{
    CniConfig, DefaultNetwork, Masquerade, Network, NetworkError, PodRef,
};
use ironlet_runtime::types::{ContainerConfig, ContainerId, PodSandboxConfig, SandboxId};
use ironlet_runtime::zygote::ZygoteHandle;
use ironlet_runtime::{LocalRuntime, LocalRuntimeConfig, Runtime, RuntimeError};
use libtest_mimic::{Arguments, Failed, Trial};

type TestFn = fn(&Env) -> Result<()>;

struct Env {
    rt: tokio::runtime::Runtime,
    /// CNI with Debian's plugins.
    net: LocalRuntime,
    /// CNI whose `bridge` plugin fails ADD.
    failing: LocalRuntime,
    /// CNI configured, but no plugin binaries: loopback only.
    bare: LocalRuntime,
    root: PathBuf,
    cni: CniConfig,
}

const DEBIAN_CNI: &str = "/usr/lib/cni";

use ironlet_runtime::testkit::{busybox_sh, busybox_store};

fn main() {
    let args = Arguments::from_args();
    if !nix::unistd::geteuid().is_root() {
        println!("network: skipped, needs root");
        return;
    }
    if !Path::new(DEBIAN_CNI).join("bridge").exists() {
        println!("network: skipped, no CNI plugins in {DEBIAN_CNI} (run scripts/install-deps)");
        return;
    }
    // Before any thread: each runtime needs its own zygote, forked single-threaded.
    let zygotes = (0..3)
        .map(|_| ironlet_runtime::zygote::spawn())
        .collect::<Result<Vec<_>, _>>();
    let zygotes = match zygotes {
        Ok(z) => z,
        Err(e) => {
            eprintln!("cannot spawn a zygote: {e}");
            std::process::exit(1);
        }
    };
    let ip_forward = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").ok();
    let env = match setup(zygotes) {
        Ok(env) => Arc::new(env),
        Err(e) => {
            eprintln!("test setup failed: {e:#}");
            std::process::exit(1);
        }
    };
    let tests: Vec<(&str, TestFn)> = vec![
        (
            "a_sandbox_gets_an_ip_in_the_subnet_and_serves_http_to_the_host",
            served_to_the_host,
        ),
        (
            "two_sandboxes_get_different_ips_and_reach_each_other",
            two_pods_talk,
        ),
        (
            "removing_a_sandbox_releases_its_ip_its_veth_and_its_nat_rules",
            removal_releases_everything,
        ),
        (
            "a_failing_plugin_fails_the_sandbox_with_its_message_and_leaves_nothing",
            failing_plugin,
        ),
        (
            "without_plugins_a_sandbox_still_gets_a_loopback_only_network",
            loopback_only,
        ),
        ("cni_add_adds_little_to_sandbox_creation", add_cost),
        (
            "a_pod_of_an_ipv4_network_has_no_ipv6_on_eth0_and_keeps_it_on_lo",
            ipv4_pod_without_ipv6_links,
        ),
        (
            "an_address_named_for_a_pod_is_never_one_host_local_holds_for_another",
            named_address_skips_taken,
        ),
    ];
    let trials = tests
        .into_iter()
        .map(|(name, f)| {
            let env = env.clone();
            Trial::test(name, move || {
                f(&env).map_err(|e| Failed::from(format!("{e:#}")))
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    let leftovers = teardown(&env, ip_forward.as_deref());
    let root = env.root.clone();
    drop(env);
    let _ = std::fs::remove_dir_all(root);
    ironlet_runtime::testkit::remove_cgroup_parent(&format!(
        "ironlet-net-test-{}",
        std::process::id()
    ));
    if let Err(e) = leftovers {
        eprintln!("network tests left state behind: {e:#}");
        std::process::exit(1);
    }
    conclusion.exit();
}

fn test_network() -> DefaultNetwork {
    let pid = std::process::id();
    DefaultNetwork {
        name: format!("ironlet-test-{pid}"),
        bridge: format!("irlt{pid}"),
        subnet: format!("10.86.{}.0/24", pid % 256),
        ip_masq: true,
    }
}

/// A plugin directory whose `bridge` refuses ADD (and logs every call) and whose
/// `portmap` accepts everything.
fn fake_plugins(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let log = dir.join("calls.log");
    let scripts = [
        (
            "bridge",
            format!(
                "echo bridge-$CNI_COMMAND >> {}\n\
                 if [ \"$CNI_COMMAND\" = ADD ]; then\n\
                 echo 'fake bridge log line' >&2\n\
                 echo '{{\"cniVersion\":\"1.0.0\",\"code\":7,\"msg\":\"fake bridge refuses\"}}'\n\
                 exit 1\nfi",
                log.display()
            ),
        ),
        (
            "portmap",
            format!("echo portmap-$CNI_COMMAND >> {}", log.display()),
        ),
    ];
    for (name, body) in scripts {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n"))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

fn setup(zygotes: Vec<ZygoteHandle>) -> Result<Env> {
    let root = std::env::temp_dir().join(format!("ironlet-net-test-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    fake_plugins(&root.join("fake-bin"))?;
    let cni = CniConfig {
        conf_dir: root.join("net/net.d"),
        bin_dirs: vec![PathBuf::from(DEBIAN_CNI)],
        default_network: test_network(),
        ..CniConfig::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (net, failing, bare) = rt.block_on(async {
        let store = busybox_store(&root).await?;
        let mut runtimes = Vec::new();
        let variants = [
            ("net", cni.clone()),
            (
                "failing",
                CniConfig {
                    conf_dir: root.join("failing/net.d"),
                    bin_dirs: vec![root.join("fake-bin")],
                    ..cni.clone()
                },
            ),
            (
                "bare",
                CniConfig {
                    conf_dir: root.join("bare/net.d"),
                    bin_dirs: vec![root.join("no-such-bin")],
                    ..cni.clone()
                },
            ),
        ];
        for ((name, cni), zygote) in variants.into_iter().zip(zygotes) {
            let config = LocalRuntimeConfig {
                root_dir: root.join(name),
                rootless: false,
                // Without a parent, libcontainer would put each container in a cgroup of
                // its own naming (`:youki:<id>`) that nobody removes.
                default_cgroup_parent: Some(format!("/ironlet-net-test-{}", std::process::id())),
                cni: Some(cni),
                log_rotation: Default::default(),
            };
            runtimes.push(LocalRuntime::new(config, zygote, store.clone()).await?);
        }
        let [net, failing, bare]: [LocalRuntime; 3] = runtimes
            .try_into()
            .map_err(|_| anyhow::anyhow!("three runtimes"))?;
        anyhow::Ok((net, failing, bare))
    })?;
    Ok(Env {
        rt,
        net,
        failing,
        bare,
        root,
        cni,
    })
}

/// Deletes the test bridge, restores ip_forward, and fails if NAT rules are left.
fn teardown(env: &Env, ip_forward: Option<&str>) -> Result<()> {
    // A failed test returns before its own clean-up: remove what is left through the
    // runtime, so DEL still runs while the namespaces are pinned.
    env.rt.block_on(async {
        for rt in [&env.net, &env.failing, &env.bare] {
            for sandbox in rt.list_pod_sandboxes().await? {
                cleanup(rt, &sandbox.id).await?;
            }
        }
        anyhow::Ok(())
    })?;
    let bridge = &env.cni.default_network.bridge;
    if Path::new("/sys/class/net").join(bridge).exists() {
        let status = std::process::Command::new("ip")
            .args(["link", "del", bridge])
            .status()?;
        ensure!(status.success(), "ip link del {bridge} failed");
    }
    if let Some(value) = ip_forward {
        std::fs::write("/proc/sys/net/ipv4/ip_forward", value)?;
    }
    env.rt
        .block_on(ironlet_runtime::network::remove_masquerade(
            &env.cni.default_network,
        ))?;
    let nat = nat_rules()?;
    ensure!(
        !nat.contains(&env.cni.default_network.name),
        "iptables NAT rules of the test network are left:\n{nat}"
    );
    Ok(())
}

fn nat_rules() -> Result<String> {
    let out = std::process::Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .context("running iptables-save")?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn sandbox_config(env: &Env, name: &str) -> PodSandboxConfig {
    let uid = ContainerId::random().to_string();
    PodSandboxConfig {
        pod_uid: uid.clone(),
        name: name.to_owned(),
        namespace: "nettest".into(),
        hostname: name.to_owned(),
        log_directory: env.root.join("logs").join(format!("nettest_{name}_{uid}")),
        ..PodSandboxConfig::default()
    }
}

/// A web server answering `body` on port 8080.
fn web_server(body: &str) -> ContainerConfig {
    busybox_sh(
        "web",
        &format!(
            "mkdir -p /tmp/www && echo {body} > /tmp/www/index.html && \
             exec httpd -f -p 8080 -h /tmp/www"
        ),
    )
}

async fn start_in(
    runtime: &LocalRuntime,
    sandbox: &SandboxId,
    c: &ContainerConfig,
) -> Result<ContainerId> {
    let id = runtime.create_container(sandbox, c).await?;
    runtime.start_container(&id).await?;
    Ok(id)
}

async fn pod_ip(runtime: &LocalRuntime, sandbox: &SandboxId) -> Result<Ipv4Addr> {
    let status = runtime.pod_sandbox_status(sandbox).await?;
    let ip = status.ip.context("the sandbox has no IP")?;
    ip.parse().with_context(|| format!("pod IP {ip:?}"))
}

fn in_test_subnet(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    (o[0], o[1], o[2]) == (10, 86, (std::process::id() % 256) as u8) && o[3] != 0 && o[3] != 255
}

/// GETs `/` from `ip:8080`, retrying until the server listens (up to 10 s).
fn http_get(ip: Ipv4Addr) -> Result<String> {
    let addr = SocketAddr::from((ip, 8080));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let attempt = (|| -> std::io::Result<String> {
            let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            stream.set_read_timeout(Some(Duration::from_secs(5)))?;
            stream.write_all(b"GET / HTTP/1.0\r\nHost: pod\r\n\r\n")?;
            let mut response = String::new();
            stream.read_to_string(&mut response)?;
            Ok(response)
        })();
        match attempt {
            Ok(response) => return Ok(response),
            Err(e) if Instant::now() > deadline => bail!("GET http://{addr}/: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// A shell line GETting `/` from `host:8080` with busybox nc (Debian's static busybox
/// `wget` crashes), retrying for a few seconds until the server listens.
fn get_script(host: &str) -> String {
    format!(
        "ok=; for i in $(seq 25); do \
         out=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {host} 8080) && [ -n \"$out\" ] \
         && ok=1 && break; sleep 0.2; done; echo \"$out\"; [ -n \"$ok\" ]"
    )
}

async fn exec(runtime: &LocalRuntime, id: &ContainerId, script: &str) -> Result<(i32, String)> {
    let cmd: Vec<String> = ["sh", "-c", script].map(String::from).to_vec();
    let out = runtime
        .exec_sync(id, &cmd, Some(Duration::from_secs(20)))
        .await?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.exit_code, text))
}

async fn cleanup(runtime: &LocalRuntime, sandbox: &SandboxId) -> Result<()> {
    runtime.stop_pod_sandbox(sandbox).await?;
    runtime.remove_pod_sandbox(sandbox).await?;
    Ok(())
}

fn read_record(env: &Env, sandbox: &SandboxId) -> Result<SandboxRecord> {
    let path = env
        .root
        .join("net/sandboxes")
        .join(sandbox.as_str())
        .join("record.json");
    Ok(serde_json::from_slice(&std::fs::read(&path)?)?)
}

fn served_to_the_host(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let rt = &env.net;
        let sandbox = rt.run_pod_sandbox(&sandbox_config(env, "web")).await?;
        let ip = pod_ip(rt, &sandbox).await?;
        ensure!(in_test_subnet(ip), "pod IP {ip} outside the test subnet");
        let status = rt.pod_sandbox_status(&sandbox).await?;
        ensure!(status.netns_path.is_some(), "no netns path");
        let web = start_in(rt, &sandbox, &web_server("hello-from-pod")).await?;
        let response = tokio::task::spawn_blocking(move || http_get(ip)).await??;
        ensure!(
            response.starts_with("HTTP/1.") && response.contains("hello-from-pod"),
            "response: {response}"
        );
        // Loopback works inside the pod too, and the pod sees its own address on eth0.
        let (code, out) = exec(
            rt,
            &web,
            &format!("{} && ip -4 addr show eth0", get_script("127.0.0.1")),
        )
        .await?;
        ensure!(
            code == 0 && out.contains("hello-from-pod"),
            "loopback: {out}"
        );
        ensure!(out.contains(&format!("inet {ip}/")), "eth0: {out}");
        // CHECK with real plugins agrees the pod is attached as ADD left it.
        let record = read_record(env, &sandbox)?;
        let attachment = record.network.as_ref().context("no attachment recorded")?;
        let netns = status.netns_path.clone().context("netns")?;
        let network = Network::new(env.cni.clone(), &env.root.join("net"));
        let pod = PodRef {
            sandbox_id: sandbox.as_str(),
            namespace: &record.config.namespace,
            name: &record.config.name,
            uid: &record.config.pod_uid,
            ports: &record.config.port_mappings,
        };
        network.check(&pod, &netns, attachment).await?;
        cleanup(rt, &sandbox).await
    })
}

fn two_pods_talk(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let rt = &env.net;
        let a = rt.run_pod_sandbox(&sandbox_config(env, "server")).await?;
        let b = rt.run_pod_sandbox(&sandbox_config(env, "client")).await?;
        let (ip_a, ip_b) = (pod_ip(rt, &a).await?, pod_ip(rt, &b).await?);
        ensure!(ip_a != ip_b, "both pods got {ip_a}");
        ensure!(
            in_test_subnet(ip_a) && in_test_subnet(ip_b),
            "{ip_a} {ip_b}"
        );
        start_in(rt, &a, &web_server("served-by-a")).await?;
        let web_b = start_in(rt, &b, &web_server("served-by-b")).await?;
        let client = start_in(rt, &b, &busybox_sh("client", "sleep 60")).await?;
        // Wait for both servers from the host, then talk pod to pod.
        tokio::task::spawn_blocking(move || http_get(ip_a)).await??;
        tokio::task::spawn_blocking(move || http_get(ip_b)).await??;
        let (code, out) = exec(rt, &client, &get_script(&ip_a.to_string())).await?;
        ensure!(code == 0 && out.contains("served-by-a"), "b -> a: {out}");
        // And back: a container of a reaches b.
        let probe = start_in(rt, &a, &busybox_sh("probe", "sleep 60")).await?;
        let (code, out) = exec(rt, &probe, &get_script(&ip_b.to_string())).await?;
        ensure!(code == 0 && out.contains("served-by-b"), "a -> b: {out}");
        let _ = web_b;
        cleanup(rt, &a).await?;
        cleanup(rt, &b).await
    })
}

/// The test network is IPv4 only: the pod's `eth0` is made without IPv6 (no DAD, router
/// solicitation or MLD flooded over the bridge), while `lo` keeps `::1`.
fn ipv4_pod_without_ipv6_links(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let rt = &env.net;
        let sandbox = rt.run_pod_sandbox(&sandbox_config(env, "v4only")).await?;
        let probe = start_in(rt, &sandbox, &busybox_sh("probe", "sleep 60")).await?;
        let (code, out) = exec(
            rt,
            &probe,
            "cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6 /proc/sys/net/ipv6/conf/lo/disable_ipv6; \
             echo ---; cat /proc/net/if_inet6",
        )
        .await?;
        ensure!(code == 0, "probe failed: {out}");
        let (flags, addresses) = out.split_once("---").context("no separator")?;
        let flags: Vec<&str> = flags.split_whitespace().collect();
        ensure!(flags == ["1", "0"], "disable_ipv6 of eth0, lo: {flags:?}");
        let interfaces: Vec<&str> = addresses
            .lines()
            .filter_map(|l| l.split_whitespace().last())
            .collect();
        ensure!(interfaces == ["lo"], "IPv6 addresses on {interfaces:?}: {addresses}");
        // IPv4 still works both ways.
        let ip = pod_ip(rt, &sandbox).await?;
        ensure!(in_test_subnet(ip), "{ip}");
        cleanup(rt, &sandbox).await
    })
}

fn removal_releases_everything(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let rt = &env.net;
        let sandbox = rt.run_pod_sandbox(&sandbox_config(env, "tidy")).await?;
        let ip = pod_ip(rt, &sandbox).await?;
        let reservations = env
            .root
            .join("net/cni/networks")
            .join(&env.cni.default_network.name);
        ensure!(
            reservations.join(ip.to_string()).exists(),
            "host-local has no reservation for {ip} in {reservations:?}"
        );
        let record = read_record(env, &sandbox)?;
        let attachment = record.network.context("no attachment recorded")?;
        let veth = attachment.result["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i["sandbox"].as_str().unwrap_or("").is_empty())
            .filter_map(|i| i["name"].as_str())
            .find(|name| *name != env.cni.default_network.bridge)
            .context("no host-side veth in the result")?
            .to_owned();
        let bridge_ports = Path::new("/sys/class/net")
            .join(&env.cni.default_network.bridge)
            .join("brif");
        ensure!(
            bridge_ports.join(&veth).exists(),
            "{veth} is not on the bridge"
        );
        // Masquerade is one node-wide rule for the subnet, not a chain per pod.
        let masq = Masquerade::new(
            &env.cni.default_network.name,
            &env.cni.default_network.subnet,
        );
        let nat = nat_rules()?;
        ensure!(
            nat.contains(&format!("-A {} -j MASQUERADE", masq.chain()))
                && nat.contains(&format!(
                    "-A POSTROUTING -s {} ",
                    env.cni.default_network.subnet
                )),
            "no masquerade rule for the pod subnet:\n{nat}"
        );
        ensure!(
            !nat.contains(sandbox.as_str()),
            "the bridge plugin made a per-pod NAT chain:\n{nat}"
        );

        rt.stop_pod_sandbox(&sandbox).await?;
        ensure!(
            rt.pod_sandbox_status(&sandbox).await?.ip.is_none(),
            "a stopped sandbox still reports its released IP"
        );
        ensure!(
            !reservations.join(ip.to_string()).exists(),
            "{ip} still reserved after stop"
        );
        ensure!(
            !Path::new("/sys/class/net").join(&veth).exists(),
            "{veth} left after stop"
        );
        ensure!(
            !nat_rules()?.contains(sandbox.as_str()),
            "NAT rules left after stop"
        );
        // Remove runs no second DEL (stop's went through) and leaves nothing.
        rt.remove_pod_sandbox(&sandbox).await?;
        ensure!(!env
            .root
            .join("net/sandboxes")
            .join(sandbox.as_str())
            .exists());
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
        ensure!(
            !mounts.contains(sandbox.as_str()),
            "a namespace mount is left"
        );
        Ok(())
    })
}

fn failing_plugin(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let config = sandbox_config(env, "doomed");
        let err = match env.failing.run_pod_sandbox(&config).await {
            Ok(id) => bail!("sandbox {id} created despite a failing bridge plugin"),
            Err(e) => e,
        };
        let RuntimeError::Network { source, .. } = &err else {
            bail!("not a network error: {err:?}")
        };
        let NetworkError::Plugin {
            plugin,
            code,
            msg,
            stderr,
            ..
        } = &**source
        else {
            bail!("not a plugin error: {source:?}")
        };
        ensure!(plugin == "bridge" && *code == Some(7), "{source:?}");
        ensure!(msg == "fake bridge refuses", "msg {msg:?}");
        ensure!(stderr.contains("fake bridge log line"), "stderr {stderr:?}");
        ensure!(err.to_string().contains("fake bridge refuses"), "{err}");
        // The failed ADD was rolled back with DEL, in reverse order.
        let calls = std::fs::read_to_string(env.root.join("fake-bin/calls.log"))?;
        ensure!(
            calls.ends_with("bridge-ADD\nportmap-DEL\nbridge-DEL\n"),
            "plugin calls: {calls}"
        );
        let sandboxes = env.root.join("failing/sandboxes");
        let left: Vec<_> = std::fs::read_dir(&sandboxes)?
            .flatten()
            .map(|e| e.path())
            .collect();
        ensure!(left.is_empty(), "sandbox directories left: {left:?}");
        ensure!(env.failing.list_pod_sandboxes().await?.is_empty());
        ensure!(
            !config.log_directory.exists(),
            "the pod log directory {} is left",
            config.log_directory.display()
        );
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
        ensure!(
            !mounts.contains(&sandboxes.to_string_lossy().into_owned()),
            "a namespace mount is left"
        );
        Ok(())
    })
}

fn loopback_only(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let rt = &env.bare;
        let sandbox = rt.run_pod_sandbox(&sandbox_config(env, "alone")).await?;
        ensure!(
            rt.pod_sandbox_status(&sandbox).await?.ip.is_none(),
            "an IP without plugins"
        );
        let web = start_in(rt, &sandbox, &web_server("local-only")).await?;
        let (code, out) = exec(
            rt,
            &web,
            &format!("{}; ls /sys/class/net", get_script("127.0.0.1")),
        )
        .await?;
        ensure!(code == 0 && out.contains("local-only"), "loopback: {out}");
        ensure!(
            out.trim_end().ends_with("lo") && !out.contains("eth0"),
            "interfaces: {out}"
        );
        cleanup(rt, &sandbox).await
    })
}

/// ironlet names each pod's address to host-local (the default network declares `ips`):
/// an address whose reservation file another holder wrote is skipped, its file untouched,
/// and the pod's own address is reserved under its sandbox id.
fn named_address_skips_taken(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let rt = &env.net;
        let reservations = env
            .root
            .join("net/cni/networks")
            .join(&env.cni.default_network.name);
        let first = rt.run_pod_sandbox(&sandbox_config(env, "named-a")).await?;
        let ip_a = pod_ip(rt, &first).await?;
        // The next address in the round belongs to someone else (another tool sharing the
        // data dir): its reservation file exists before the next ADD.
        let taken = Ipv4Addr::from(u32::from(ip_a) + 1);
        let foreign = reservations.join(taken.to_string());
        std::fs::write(&foreign, "someone-else\r\neth0")?;
        let second = rt.run_pod_sandbox(&sandbox_config(env, "named-b")).await;
        let checked = async {
            let second = second?;
            let ip_b = pod_ip(rt, &second).await?;
            let held = std::fs::read_to_string(reservations.join(ip_b.to_string()))?;
            cleanup(rt, &second).await?;
            ensure!(ip_b != taken && in_test_subnet(ip_b), "the pod got {ip_b}");
            ensure!(
                held.starts_with(second.as_str()),
                "{ip_b} is reserved for {held:?}, not {second}"
            );
            Ok(())
        }
        .await;
        let kept = std::fs::read_to_string(&foreign);
        std::fs::remove_file(&foreign)?;
        cleanup(rt, &first).await?;
        checked?;
        ensure!(
            kept.ok().as_deref() == Some("someone-else\r\neth0"),
            "the foreign reservation of {taken} was changed"
        );
        Ok(())
    })
}

fn add_cost(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        const N: u32 = 5;
        let mut report = Vec::new();
        for (label, rt) in [("loopback only", &env.bare), ("with CNI ADD", &env.net)] {
            let mut total = Duration::ZERO;
            for i in 0..N {
                let config = sandbox_config(env, &format!("timed{i}"));
                let started = Instant::now();
                let sandbox = rt.run_pod_sandbox(&config).await?;
                total += started.elapsed();
                cleanup(rt, &sandbox).await?;
            }
            let mean = total / N;
            report.push(format!("{label}: {:.1} ms", mean.as_secs_f64() * 1000.0));
            ensure!(
                mean < Duration::from_secs(3),
                "{label}: sandbox creation took {mean:?}"
            );
        }
        eprintln!("run_pod_sandbox mean of {N}: {}", report.join(", "));
        Ok(())
    })
}

//! Rootless networking end to end (issue 16, "Rootless networking"), as an unprivileged user
//! with a subordinate range made by the test: a rootless container gets the host's address
//! on `eth0` (pasta), reaches a server the test runs on the host's loopback through the
//! gateway address, and `ctr run -p` publishes a port the test connects to; a static pod's
//! `hostPort` is published, its IP is reported, and both survive an agent crash (the pasta
//! process is the same after it) and pasta's death (it is restarted, with a warning).
//! A user without a subordinate range gets the same network (own id only, mapped by the
//! helpers). Removal leaves no process of the user, no sandbox and no
//! listening port. Real containers through `ironlet ctr run` and `ironlet run`; needs root to
//! create the user (CI runs as root), skips otherwise.

mod support;

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use support::rootless::{text, TestUser};
use support::{answer_at, free_port, host_address, serve_once_on_loopback};

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A subordinate range distinct from rootless_ids' (which uses 400000 + pid % 512 * 65536).
fn range_start(slot: u32) -> u32 {
    40_000_000 + ((std::process::id() % 256) * 4 + slot) * 65536
}

/// Connects to `127.0.0.1:port` until it answers, or `timeout` passes.
fn answer_of(port: u16, timeout: Duration) -> Option<String> {
    answer_at("127.0.0.1", port, timeout)
}

/// The user's processes (`ps -u`), one `pid args` per line.
fn processes_of(uid: u32) -> String {
    let out = Command::new("ps")
        .args(["-o", "pid=,args=", "-u", &uid.to_string()])
        .output()
        .expect("ps");
    text(&out.stdout)
        .lines()
        .filter(|l| !l.contains("<defunct>"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn sandboxes_left(user: &TestUser) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(user.root_dir().join("sandboxes"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .collect()
}

#[test]
fn a_rootless_container_has_an_address_reaches_the_host_and_publishes_a_port() {
    if !is_root() {
        return;
    }
    let user = TestUser::new("net", Some((range_start(0), 65536)));
    user.import("busybox");

    // Outbound: a server on the host's loopback, reached at the pod's gateway address. The
    // container does not half-close first: pasta 2023-03 then loses the host's FIN (the
    // connection stays in FIN_WAIT2 in the pod), hence `sleep | nc`, bounded by `timeout`.
    let (port, serving) = serve_once_on_loopback("pong from the host\n");
    let run = user.sh(
        "busybox",
        &[],
        &format!(
            "ip -4 -o addr show eth0; gw=$(ip route | awk '/^default/ {{print $3}}'); \
             echo gateway=$gw; sleep 2 | timeout 20 nc $gw {port}"
        ),
    );
    let out = text(&run.stdout);
    assert!(run.status.success(), "{out}{}", text(&run.stderr));
    assert!(
        out.contains(&format!("inet {}/", host_address())),
        "eth0 has the host's address: {out}"
    );
    assert!(out.contains("pong from the host"), "outbound: {out}");
    assert!(
        serving.join().expect("server thread"),
        "the host server was reached"
    );
    assert!(
        !text(&run.stderr).contains("WARN"),
        "no warning: {}",
        text(&run.stderr)
    );
    user.assert_no_containers();
    assert_eq!(sandboxes_left(&user), Vec::<std::ffi::OsString>::new());

    // Published: -p 127.0.0.1:HOST:8080 reaches the container's server.
    let (host_port, _) = serve_detached(
        &user,
        "while true; do echo answer from the container | nc -l -p 8080; done",
    );
    let got = answer_of(host_port, Duration::from_secs(20));
    assert_eq!(
        got.as_deref(),
        Some("answer from the container\n"),
        "published port; processes: {}",
        processes_of(user.uid)
    );
    assert!(
        processes_of(user.uid).contains("pasta"),
        "pasta runs for the container"
    );
    remove_web_and_check_nothing_is_left(&user, host_port);
}

/// `ctr run -d --name web -p 127.0.0.1:<free port>:8080 busybox -- sh -c SCRIPT` as `user`;
/// returns the host port and what the command wrote on stderr.
fn serve_detached(user: &TestUser, script: &str) -> (u16, String) {
    let host_port = free_port();
    let publish = format!("127.0.0.1:{host_port}:8080");
    let run = user.run(&[
        "ctr", "run", "-d", "--name", "web", "-p", &publish, "busybox", "--", "sh", "-c", script,
    ]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    (host_port, text(&run.stderr))
}

/// `ctr rm -f web`; then no process of the user (pasta, the holder), no sandbox, no
/// container and no listener on `host_port` is left.
fn remove_web_and_check_nothing_is_left(user: &TestUser, host_port: u16) {
    let rm = user.run(&["ctr", "rm", "-f", "web"]);
    assert!(rm.status.success(), "rm -f: {}", text(&rm.stderr));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_of(user.uid).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(processes_of(user.uid), "", "processes left behind");
    assert_eq!(sandboxes_left(user), Vec::<std::ffi::OsString>::new());
    assert!(
        TcpStream::connect(("127.0.0.1", host_port)).is_err(),
        "the published port is closed"
    );
    user.assert_no_containers();
}

/// The supervisor's child: the agent process.
fn agent_pid(supervisor: u32) -> Option<i32> {
    let children =
        std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .find(|pid| {
            // The agent alone has the supervisor's socket in its environment: the pasta
            // holder, also the supervisor's child, has the same command line.
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|b| *b == 0)
                    .any(|var| var.starts_with(b"IRONLET_SUPERVISOR_FD="))
            })
        })
}

/// The pid of the user's pasta, if one runs.
fn pasta_pid(uid: u32) -> Option<String> {
    processes_of(uid)
        .lines()
        .find(|l| l.contains("pasta --config-net"))
        .and_then(|l| l.split_whitespace().next())
        .map(str::to_owned)
}

#[test]
fn a_rootless_pods_host_port_and_ip_survive_an_agent_crash_and_go_with_the_pod() {
    if !is_root() {
        return;
    }
    let user = TestUser::new("netpod", Some((range_start(1), 65536)));
    user.import("busybox");
    let (agent, log_path) = user.start_agent("rootless-net");
    let manifests = agent.manifests.clone();
    let supervisor = agent.agent.id();
    let agent_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let host_port = free_port();
    let manifest = manifests.join("web.yaml");
    std::fs::write(
        &manifest,
        format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: web}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: busybox
    command: [sh, -c, "while true; do echo pod answers | nc -l -p 8080; done"]
    ports: [{{containerPort: 8080, hostPort: {host_port}}}]
"#
        ),
    )
    .expect("manifest");
    let got = answer_of(host_port, Duration::from_secs(40));
    assert_eq!(
        got.as_deref(),
        Some("pod answers\n"),
        "hostPort; agent log:\n{}",
        agent_log()
    );
    let pods = user.run(&["pods"]);
    let listing = text(&pods.stdout);
    let row = listing
        .lines()
        .find(|l| l.starts_with("web-rootless-net"))
        .unwrap_or_default()
        .to_owned();
    assert!(
        row.split_whitespace().last() == Some(host_address().as_str()),
        "the pod's IP is reported: {listing}{}",
        text(&pods.stderr)
    );
    let pasta = pasta_pid(user.uid).expect("pasta runs");

    // An agent crash: the supervisor restarts it; the pod's network is the same.
    let pid = agent_pid(supervisor).expect("the agent process");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the agent");
    let deadline = Instant::now() + Duration::from_secs(30);
    while agent_pid(supervisor).is_none_or(|p| p == pid) {
        assert!(
            Instant::now() < deadline,
            "no new agent; log:\n{}",
            agent_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        answer_of(host_port, Duration::from_secs(20)).as_deref(),
        Some("pod answers\n"),
        "after the agent restart; log:\n{}",
        agent_log()
    );
    assert_eq!(
        pasta_pid(user.uid).as_deref(),
        Some(pasta.as_str()),
        "the same pasta after the restart"
    );

    // pasta dies (killed, crashed): the keeper starts it again for the same namespace with
    // the same forwards, and the agent's log says so.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pasta.parse().expect("pasta's pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill pasta");
    let killed = Instant::now();
    assert_eq!(
        answer_of(host_port, Duration::from_secs(5)).as_deref(),
        Some("pod answers\n"),
        "the published port answers again within 5 s of pasta's death; processes:\n{}\nlog:\n{}",
        processes_of(user.uid),
        agent_log()
    );
    eprintln!(
        "published port back {:?} after pasta was killed",
        killed.elapsed()
    );
    let restarted = pasta_pid(user.uid).expect("a new pasta runs");
    assert_ne!(restarted, pasta, "pasta was restarted");
    let log = agent_log();
    assert!(
        log.contains("pasta of a rootless pod ended") && log.contains("pasta restarted"),
        "the restart is logged as a warning:\n{log}"
    );
    // …and reported as the pod's event, once.
    let deadline = Instant::now() + Duration::from_secs(10);
    let events = loop {
        let events: Vec<String> = agent_log()
            .lines()
            .filter(|l| l.contains("PodNetworkRestarted"))
            .map(str::to_owned)
            .collect();
        if !events.is_empty() || Instant::now() > deadline {
            break events;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(events.len(), 1, "one event:\n{}", agent_log());
    assert!(
        events[0].contains("web-rootless-net_default")
            && events[0].contains(&format!("pasta (pid {pasta}) ended (signal SIGKILL)")),
        "{}",
        events[0]
    );

    // The pod goes: its network with it.
    std::fs::remove_file(&manifest).expect("remove manifest");
    let deadline = Instant::now() + Duration::from_secs(30);
    while pasta_pid(user.uid).is_some() || !sandboxes_left(&user).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the pod's network stayed: {}\nlog:\n{}",
            processes_of(user.uid),
            agent_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        TcpStream::connect(("127.0.0.1", host_port)).is_err(),
        "the host port is closed"
    );
    drop(agent);
    assert_eq!(processes_of(user.uid), "", "processes left behind");
}

#[test]
fn without_a_subordinate_range_a_rootless_container_still_gets_the_network_and_a_port() {
    if !is_root() {
        return;
    }
    let user = TestUser::new("netsingle", None);
    user.import("busybox");
    let (host_port, err) = serve_detached(
        &user,
        "cat /proc/self/uid_map; ip -4 -o addr show eth0; \
         while true; do echo single id answers | nc -l -p 8080; done",
    );
    assert!(
        !err.contains("rootless networking unavailable"),
        "no network warning: {err}"
    );
    let got = answer_of(host_port, Duration::from_secs(20));
    let logs = user.run(&["ctr", "logs", "web"]);
    let logs = text(&logs.stdout);
    assert_eq!(
        got.as_deref(),
        Some("single id answers\n"),
        "published port; log: {logs}; processes: {}",
        processes_of(user.uid)
    );
    assert!(
        logs.contains(&format!("inet {}/", host_address())),
        "eth0 has the host's address: {logs}"
    );
    let map: Vec<String> = logs
        .lines()
        .take(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        map,
        [format!("0 {} 1", user.uid)],
        "only the own id: {logs}"
    );
    remove_web_and_check_nothing_is_left(&user, host_port);
}

//! Crash safety end to end with real containers (issue 5): the agent is killed with
//! SIGKILL — once under 50 pods, many times during a storm of pod changes — and upgraded in
//! place with SIGHUP; containers never restart, exits keep their codes, logs lose no line,
//! and nothing is left behind. Needs root (CI runs as root); skips otherwise. The tests run
//! one at a time: their timings are part of what they check.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use support::{container_status, phase, restart_count, Agent, AgentOptions};

/// One heavy test at a time (2 cores; the re-adoption time is measured).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A container that prints a counter every ~10 ms without forking (the `read -t` on a FIFO
/// nobody writes is the sleep). With `exit_code`, SIGUSR1 makes it print `bye` and exit.
fn counter_pod(name: &str, exit_code: Option<i32>) -> String {
    let trap = exit_code
        .map(|c| format!("trap 'echo bye; exit {c}' USR1; "))
        .unwrap_or_default();
    let policy = if exit_code.is_some() {
        "Never"
    } else {
        "Always"
    };
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  restartPolicy: {policy}
  terminationGracePeriodSeconds: 1
  containers:
  - name: counter
    image: busybox
    command: [sh, -c, "mkfifo /tick; exec 3<>/tick; i=0; {trap}while :; do echo $i; i=$((i+1)); read -t 0.01 -u 3 x; done"]
"#
    )
}

/// A pod of `containers` sleeping containers.
fn sleeper_pod(name: &str, containers: usize) -> String {
    let mut yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n"
    );
    for i in 0..containers {
        yaml.push_str(&format!(
            "  - {{name: c{i}, image: busybox, command: [sleep, '3600']}}\n"
        ));
    }
    yaml
}

fn container_id(pod: &Pod, name: &str) -> Option<String> {
    container_status(pod, name)
        .and_then(|c| c.container_id.clone())
        .and_then(|id| id.strip_prefix("ironlet://").map(str::to_owned))
}

fn is_running(pod: &Pod, name: &str) -> bool {
    container_status(pod, name)
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}

fn exit_code_of(pod: &Pod, name: &str) -> Option<i32> {
    container_status(pod, name)
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code)
}

fn full_name(agent: &Agent, name: &str) -> String {
    format!("{name}-{}", agent.node_name)
}

/// Pods by their short name.
fn pods_by_name(agent: &Agent) -> BTreeMap<String, Pod> {
    let suffix = format!("-{}", agent.node_name);
    agent
        .pods()
        .into_iter()
        .filter_map(|p| {
            let name = p.metadata.name.clone()?;
            Some((name.strip_suffix(&suffix)?.to_owned(), p))
        })
        .collect()
}

/// The init pid (pid 1 in its namespace) of every container, by container id.
fn init_pids(agent: &Agent) -> HashMap<String, i32> {
    agent
        .container_processes()
        .into_iter()
        .filter_map(|(id, procs)| {
            let init = procs.iter().find(|(_, ns)| *ns == 1)?.0;
            Some((id, init))
        })
        .collect()
}

/// Checks a counter log: 0, 1, 2, … with nothing missing or repeated; returns the count.
fn assert_counter_log(lines: &[String], what: &str) -> usize {
    let numbers: Vec<&String> = lines.iter().filter(|l| l.as_str() != "bye").collect();
    for (i, line) in numbers.iter().enumerate() {
        assert_eq!(
            line.parse::<usize>().ok(),
            Some(i),
            "{what}: line {i} is {line:?} (lines around it: {:?})",
            &numbers[i.saturating_sub(3)..(i + 3).min(numbers.len())]
        );
    }
    numbers.len()
}

#[test]
fn fifty_pods_survive_a_killed_agent_with_exit_codes_and_every_log_line() {
    if !support::is_root() {
        return;
    }
    let _serial = serial();
    let agent = Agent::start();
    const PODS: usize = 50;
    const EXITERS: usize = 10;
    let name = |i: usize| format!("count{i:02}");
    let code = |i: usize| 10 + i as i32; // distinct exit codes for the first ten pods
    for i in 0..PODS {
        let exit = (i < EXITERS).then(|| code(i));
        agent.write_manifest(&format!("{}.yaml", name(i)), &counter_pod(&name(i), exit));
    }
    agent.wait_until("50 pods running", Duration::from_secs(180), |a| {
        let pods = pods_by_name(a);
        (0..PODS).all(|i| pods.get(&name(i)).is_some_and(|p| is_running(p, "counter")))
    });
    // Let them write a little, then take the picture the restart must not change.
    std::thread::sleep(Duration::from_millis(500));
    let before = pods_by_name(&agent);
    let inits = init_pids(&agent);
    let ids: Vec<String> = (0..PODS)
        .map(|i| container_id(&before[&name(i)], "counter").expect("container id"))
        .collect();
    let pids: Vec<i32> = ids
        .iter()
        .map(|id| *inits.get(id).expect("every container has an init process"))
        .collect();
    let old_agent = agent.version().expect("version").pid;

    // Kill the agent; while it is down, ten containers exit with their own codes.
    let killed_at = agent.kill_agent();
    for (i, pid) in pids.iter().enumerate().take(EXITERS) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGUSR1,
        )
        .unwrap_or_else(|e| panic!("signal {}: {e}", name(i)));
    }
    let mut answering = None;
    let mut recovered = None;
    while killed_at.elapsed() < Duration::from_secs(30) && recovered.is_none() {
        if answering.is_none() && agent.version().is_some_and(|v| v.pid != old_agent) {
            answering = Some(killed_at.elapsed());
        }
        if answering.is_some() {
            let pods = pods_by_name(&agent);
            let done = (0..PODS).all(|i| {
                pods.get(&name(i)).is_some_and(|p| {
                    if i < EXITERS {
                        exit_code_of(p, "counter") == Some(code(i))
                    } else {
                        is_running(p, "counter")
                    }
                })
            });
            if done {
                recovered = Some(killed_at.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let answering = answering.expect("a new agent answers within 30 s");
    let recovered = recovered.unwrap_or_else(|| {
        panic!(
            "pods not recovered within 30 s\n{}",
            support::tail(&agent.log(), 60)
        )
    });
    let report = agent
        .log()
        .lines()
        .rev()
        .find(|l| l.contains("containers re-adopted"))
        .map(str::to_owned)
        .unwrap_or_default();
    println!(
        "re-adoption: agent answering {answering:?} after kill -9, {PODS} pods recovered \
         ({} running, {EXITERS} exited while down) {recovered:?} after kill -9\n  {}",
        PODS - EXITERS,
        strip_ansi(report.split("INFO").last().unwrap_or_default()).trim()
    );

    let after = pods_by_name(&agent);
    let inits_after = init_pids(&agent);
    for i in 0..PODS {
        let pod = &after[&name(i)];
        assert_eq!(
            container_id(pod, "counter").as_deref(),
            Some(ids[i].as_str()),
            "{}: same container",
            name(i)
        );
        assert_eq!(restart_count(pod, "counter"), 0, "{}: no restart", name(i));
        if i < EXITERS {
            assert_eq!(exit_code_of(pod, "counter"), Some(code(i)), "{}", name(i));
            assert_eq!(phase(pod), "Failed", "{}", name(i));
        } else {
            assert_eq!(
                inits_after.get(&ids[i]),
                Some(&pids[i]),
                "{}: same process",
                name(i)
            );
        }
    }
    assert!(
        recovered < Duration::from_secs(2),
        "the agent took {recovered:?} to be ready again"
    );

    // Logs: let the running counters write on, then check every file is 0, 1, 2, … with
    // nothing lost or doubled across the downtime, and the exiters' last words are there.
    std::thread::sleep(Duration::from_millis(500));
    let mut total = 0;
    for i in 0..PODS {
        let pod = &after[&name(i)];
        let lines = agent.log_lines(pod, "counter");
        let count = assert_counter_log(&lines, &name(i));
        total += count;
        if i < EXITERS {
            assert_eq!(
                lines.last().map(String::as_str),
                Some("bye"),
                "{}: the last line before the exit is in the log",
                name(i)
            );
        } else {
            // Written on past the downtime: ~100 lines a second.
            assert!(
                count > 50,
                "{}: only {count} lines; the log stopped",
                name(i)
            );
        }
    }
    println!("logs: {total} counter lines in {PODS} files, none missing or repeated");
}

#[test]
fn an_agent_killed_at_random_points_of_a_pod_storm_converges_without_duplicates_or_orphans() {
    if !support::is_root() {
        return;
    }
    let _serial = serial();
    let agent = Agent::start_with(AgentOptions {
        // Kills come faster than the default back-off grows.
        extra_args: vec![
            "--agent-restart-backoff=50ms".into(),
            "--agent-restart-backoff-max=200ms".into(),
        ],
        ..AgentOptions::default()
    });
    const POOL: usize = 10;
    const ITERATIONS: usize = 24;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    println!("storm seed {seed}");
    let mut rng = Lcg(seed | 1);
    let containers_of = |i: usize| 1 + i % 2;
    let mut desired: BTreeSet<usize> = BTreeSet::new();
    let started = Instant::now();
    let toggle = |desired: &mut BTreeSet<usize>, rng: &mut Lcg| {
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(POOL);
            let file = format!("storm{i}.yaml");
            if desired.remove(&i) {
                agent.remove_manifest(&file);
            } else {
                agent.write_manifest(&file, &sleeper_pod(&format!("storm{i}"), containers_of(i)));
                desired.insert(i);
            }
        }
    };
    for iteration in 0..ITERATIONS {
        toggle(&mut desired, &mut rng);
        // Creating a pod takes ~100 ms: most kills land in the middle of something.
        std::thread::sleep(Duration::from_millis(rng.below(300) as u64));
        let before = agent.version().map(|v| v.pid);
        agent.kill_agent();
        // Every other time the manifests also change while no agent runs.
        if rng.below(2) == 0 {
            toggle(&mut desired, &mut rng);
        }
        agent.wait_until(
            &format!("the agent back after kill {iteration}"),
            Duration::from_secs(20),
            |a| a.version().is_some_and(|v| Some(v.pid) != before),
        );
    }
    println!(
        "storm: {ITERATIONS} kills in {:?}; desired pods {desired:?}",
        started.elapsed()
    );

    let converge = Instant::now();
    let want: BTreeSet<String> = desired.iter().map(|i| format!("storm{i}")).collect();
    let settled = |a: &Agent| {
        storm_converged(a, &want, &desired, containers_of).and_then(|()| no_orphans(a, &want))
    };
    let summary = loop {
        match settled(&agent) {
            Ok(summary) => break summary,
            Err(why) if converge.elapsed() > Duration::from_secs(120) => {
                let keys = [
                    "agent started",
                    "re-adopted",
                    "rolling back",
                    "torn",
                    "Sandbox",
                    "same UID",
                    "removed",
                    "not desired",
                    "WARN",
                    "ERROR",
                ];
                let events: Vec<String> = strip_ansi(&agent.log())
                    .lines()
                    .filter(|l| keys.iter().any(|k| l.contains(k)))
                    .map(str::to_owned)
                    .collect();
                panic!(
                    "not converged 120 s after the last kill (seed {seed}): {why}\n{}",
                    events.join("\n")
                )
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    println!(
        "storm: converged {:?} after the last kill; no orphans ({summary})",
        converge.elapsed()
    );
    // What the restarts found: interrupted creates rolled back, torn state removed.
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    for line in agent
        .log()
        .lines()
        .filter(|l| l.contains("containers re-adopted"))
    {
        for field in strip_ansi(line).split_whitespace() {
            if let Some((key, value)) = field.split_once('=') {
                if let Ok(n) = value.parse::<u64>() {
                    *totals.entry(key.to_owned()).or_default() += n;
                }
            }
        }
    }
    totals.remove("took_ms");
    println!("storm: over all restarts {totals:?}");
}

/// Ok when exactly the desired pods run, each container exactly once.
fn storm_converged(
    agent: &Agent,
    want: &BTreeSet<String>,
    desired: &BTreeSet<usize>,
    containers_of: impl Fn(usize) -> usize,
) -> Result<(), String> {
    let pods = pods_by_name(agent);
    let names: BTreeSet<String> = pods.keys().cloned().collect();
    if &names != want {
        return Err(format!("pods {names:?}, want {want:?}"));
    }
    let processes = agent.container_processes();
    let mut expected_ids = BTreeSet::new();
    for i in desired {
        let pod = &pods[&format!("storm{i}")];
        for c in 0..containers_of(*i) {
            let name = format!("c{c}");
            if !is_running(pod, &name) {
                return Err(format!("storm{i}/{name} not running"));
            }
            let id = container_id(pod, &name).ok_or("no container id")?;
            expected_ids.insert(id);
        }
    }
    let running: BTreeSet<String> = processes.keys().cloned().collect();
    if running != expected_ids {
        return Err(format!(
            "containers with processes {running:?}, want {expected_ids:?}"
        ));
    }
    if let Some((id, procs)) = processes.iter().find(|(_, p)| p.len() != 1) {
        return Err(format!("container {id} has processes {procs:?}"));
    }
    Ok(())
}

/// Nothing is left of pods that are gone: no pod cgroup, mount, sandbox or container
/// directory, libcontainer state or exit record. Returns a summary.
fn no_orphans(agent: &Agent, want: &BTreeSet<String>) -> Result<String, String> {
    let pods = pods_by_name(agent);
    let uids: BTreeSet<String> = want
        .iter()
        .filter_map(|n| pods.get(n)?.metadata.uid.clone())
        .collect();
    let root = agent.root.path();
    let read_names = |dir: &Path| -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    // Records say which pod each container and sandbox belongs to.
    let record_uid = |path: &Path, pointer: &str| -> Option<String> {
        let text = std::fs::read_to_string(path.join("record.json")).ok()?;
        let json: serde_json::Value = serde_json::from_str(&text).ok()?;
        json.pointer(pointer)?.as_str().map(str::to_owned)
    };
    let check = |ok: bool, what: String| if ok { Ok(()) } else { Err(what) };
    let containers = read_names(&root.join("containers"));
    for id in &containers {
        let uid = record_uid(&root.join("containers").join(id), "/pod_uid");
        check(
            uid.as_ref().is_some_and(|u| uids.contains(u)),
            format!("container directory {id} belongs to {uid:?}, not a desired pod"),
        )?;
    }
    let sandboxes = read_names(&root.join("sandboxes"));
    let mut sandboxes_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for id in &sandboxes {
        let dir = root.join("sandboxes").join(id);
        let uid = record_uid(&dir, "/config/pod_uid");
        check(
            uid.as_ref().is_some_and(|u| uids.contains(u)),
            format!("sandbox directory {id} belongs to {uid:?}, not a desired pod"),
        )?;
        let state = record_uid(&dir, "/state").unwrap_or_default();
        sandboxes_of
            .entry(uid.unwrap_or_default())
            .or_default()
            .push(format!("{id} ({state})"));
    }
    // A pod deleted and added again (same static UID) keeps its stopped sandbox, as with
    // kubelet, until garbage collection; two ready sandboxes would be a duplicate.
    if let Some((uid, ids)) = sandboxes_of
        .iter()
        .find(|(_, ids)| ids.iter().filter(|s| s.ends_with("(ready)")).count() != 1)
    {
        return Err(format!("pod {uid} has sandboxes {ids:?}"));
    }
    for id in read_names(&root.join("libcontainer")) {
        check(
            containers.contains(&id),
            format!("libcontainer state {id} has no container"),
        )?;
    }
    for file in read_names(&root.join("exits")) {
        let id = file.trim_end_matches(".json");
        check(
            containers.contains(id),
            format!("exit record {file} has no container"),
        )?;
    }
    let mounts = agent.mounts_under_root();
    for mount in &mounts {
        let owned = containers
            .iter()
            .chain(sandboxes.iter())
            .any(|id| mount.contains(&format!("/{id}/")));
        check(owned, format!("mount {mount} belongs to no desired pod"))?;
    }
    let cgroups = agent.pod_cgroups();
    for cgroup in &cgroups {
        let name = cgroup
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        check(
            uids.contains(name.trim_start_matches("pod")),
            format!("pod cgroup {} belongs to no desired pod", cgroup.display()),
        )?;
    }
    Ok(format!(
        "{} containers, {} sandboxes, {} mounts, {} pod cgroup directories",
        containers.len(),
        sandboxes.len(),
        mounts.len(),
        cgroups.len()
    ))
}

/// The text without terminal colour sequences (the agent's log is coloured).
fn strip_ansi(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A tiny deterministic generator (the seed is printed to replay a failure).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

#[test]
fn sighup_upgrades_the_agent_to_the_binary_on_disk_without_restarting_a_container() {
    if !support::is_root() {
        return;
    }
    let _serial = serial();
    use std::os::unix::fs::MetadataExt;
    let bin_dir = tempfile::Builder::new()
        .prefix("ironlet-upgrade")
        .tempdir()
        .expect("temp dir");
    let binary = bin_dir.path().join("ironlet");
    std::fs::copy(env!("CARGO_BIN_EXE_ironlet"), &binary).expect("copy the binary");
    let agent = Agent::start_with(AgentOptions {
        binary: Some(binary.clone()),
        ..AgentOptions::default()
    });
    const PODS: usize = 20;
    let name = |i: usize| format!("up{i:02}");
    for i in 0..PODS {
        agent.write_manifest(&format!("{}.yaml", name(i)), &counter_pod(&name(i), None));
    }
    agent.wait_until("20 pods running", Duration::from_secs(120), |a| {
        let pods = pods_by_name(a);
        (0..PODS).all(|i| pods.get(&name(i)).is_some_and(|p| is_running(p, "counter")))
    });
    let old = agent.version().expect("version");
    let before = pods_by_name(&agent);
    let inits = init_pids(&agent);
    assert_eq!(
        old.binary_inode,
        std::fs::metadata(&binary).expect("binary").ino()
    );

    // The new version: another file at the same path (write beside it, then rename, as
    // package managers do; writing into a running binary fails with ETXTBSY).
    let staged = bin_dir.path().join(".ironlet.new");
    std::fs::copy(env!("CARGO_BIN_EXE_ironlet"), &staged).expect("stage the new binary");
    std::fs::rename(&staged, &binary).expect("replace the binary");
    let new_inode = std::fs::metadata(&binary).expect("binary").ino();
    assert_ne!(new_inode, old.binary_inode);

    let hup = Instant::now();
    agent.signal_supervisor(nix::sys::signal::Signal::SIGHUP);
    agent.wait_until(
        "the agent runs the new binary",
        Duration::from_secs(30),
        |a| a.version().is_some_and(|v| v.binary_inode == new_inode),
    );
    let answering = hup.elapsed();
    let new = agent.version().expect("version");
    assert_ne!(new.pid, old.pid, "a new agent process");
    assert_eq!(
        new.supervisor_pid, old.supervisor_pid,
        "the same supervisor"
    );
    assert_eq!(new.supervisor_pid, agent.supervisor_pid());
    agent.wait_until("20 pods reported again", Duration::from_secs(10), |a| {
        let pods = pods_by_name(a);
        (0..PODS).all(|i| pods.get(&name(i)).is_some_and(|p| is_running(p, "counter")))
    });
    println!(
        "upgrade: new agent (inode {} → {new_inode}) answering {answering:?} after SIGHUP, \
         all {PODS} pods reported running {:?} after SIGHUP",
        old.binary_inode,
        hup.elapsed()
    );
    let after = pods_by_name(&agent);
    let inits_after = init_pids(&agent);
    for i in 0..PODS {
        let id = container_id(&before[&name(i)], "counter").expect("id");
        let pod = &after[&name(i)];
        assert_eq!(container_id(pod, "counter").as_deref(), Some(id.as_str()));
        assert_eq!(restart_count(pod, "counter"), 0);
        assert_eq!(
            inits_after.get(&id),
            inits.get(&id),
            "{}: same process",
            name(i)
        );
        assert!(inits.contains_key(&id));
        assert_eq!(
            pod.metadata.name.as_deref(),
            Some(full_name(&agent, &name(i)).as_str())
        );
    }
    // The logs went on across the upgrade without a gap.
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..PODS {
        assert_counter_log(&agent.log_lines(&after[&name(i)], "counter"), &name(i));
    }
}

#[test]
fn torn_state_of_every_kind_is_removed_when_the_agent_starts_again() {
    if !support::is_root() {
        return;
    }
    let _serial = serial();
    let mut agent = Agent::start();
    let root = agent.root.path().to_owned();
    let fake = "0123456789abcdef0123456789abcdef";
    let pod_uid = "feedfacefeedfacefeedfacefeedface";
    // A create interrupted before its first record: a container directory with a rootfs
    // directory, libcontainer state without state.json, an exit record nobody owns.
    std::fs::create_dir_all(root.join("containers").join(fake).join("rootfs/etc"))
        .expect("container dir");
    std::fs::create_dir_all(root.join("libcontainer").join(fake)).expect("libcontainer dir");
    std::fs::write(root.join("exits").join(format!("{fake}.json")), "{}").expect("exit");
    // A sandbox interrupted after pinning its network namespace, before its record.
    let ns = root.join("sandboxes").join(fake).join("ns");
    std::fs::create_dir_all(&ns).expect("sandbox dir");
    std::fs::write(ns.join("net"), "").expect("ns file");
    nix::mount::mount(
        Some("/proc/self/ns/net"),
        &ns.join("net"),
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .expect("pin a network namespace");
    // A pod deleted while the agent was down, after its cgroup and directory were made.
    let pod_dir = root
        .join("pods")
        .join(pod_uid)
        .join("volumes/kubernetes.io~empty-dir/scratch");
    std::fs::create_dir_all(&pod_dir).expect("pod dir");
    let mut cgroups = Vec::new();
    for controller in ["memory", "pids", "unified"] {
        // Only where the agent made its tree: /sys/fs/cgroup itself is a tmpfs.
        let qos = Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(agent.cgroup_root.trim_start_matches('/'))
            .join("kubepods/besteffort");
        let dir = qos.join(format!("pod{pod_uid}"));
        if qos.is_dir() && std::fs::create_dir(&dir).is_ok() {
            cgroups.push(dir);
        }
    }
    assert!(!cgroups.is_empty(), "made a pod cgroup");

    agent.restart();
    let leftovers = |a: &Agent| {
        let mut left: Vec<String> = [
            root.join("containers").join(fake),
            root.join("libcontainer").join(fake),
            root.join("exits").join(format!("{fake}.json")),
            root.join("sandboxes").join(fake),
            root.join("pods").join(pod_uid),
        ]
        .iter()
        .chain(cgroups.iter())
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect();
        left.extend(a.mounts_under_root());
        left
    };
    let start = Instant::now();
    while !leftovers(&agent).is_empty() && start.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(leftovers(&agent), Vec::<String>::new(), "torn state left");
    println!("torn state removed {:?} after the restart", start.elapsed());
}

#[test]
fn output_beyond_the_pipe_buffer_blocks_the_container_until_the_agent_is_back_and_none_is_lost() {
    if !support::is_root() {
        return;
    }
    let _serial = serial();
    // The agent stays down 2 s: long enough to fill the 1 MiB pipe.
    let agent = Agent::start_with(AgentOptions {
        extra_args: vec!["--agent-restart-backoff=2s".into()],
        ..AgentOptions::default()
    });
    const LINES: usize = 200_000; // ~1.3 MB of output
    agent.write_manifest(
        "flood.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: flood}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: counter
    image: busybox
    command: [sh, -c, "mkfifo /tick; exec 3<>/tick; trap 'seq 1 {LINES}; echo end' USR1; while :; do read -t 0.05 -u 3 x; done"]
"#
        ),
    );
    let pod = agent.wait_pod("flood", "running", Duration::from_secs(30), |p| {
        is_running(p, "counter")
    });
    let id = container_id(&pod, "counter").expect("container id");
    let init = init_pids(&agent)[&id];
    agent.kill_agent();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init),
        nix::sys::signal::Signal::SIGUSR1,
    )
    .expect("start the flood");
    std::thread::sleep(Duration::from_secs(1));
    // Nobody reads: `seq` filled the pipe and waits in pipe_write.
    let procs = agent.container_processes().remove(&id).unwrap_or_default();
    let blocked: Vec<String> = procs
        .iter()
        .filter(|(pid, _)| *pid != init)
        .map(|(pid, _)| std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default())
        .collect();
    assert!(
        blocked.iter().any(|w| w.contains("pipe")),
        "the writer should block on the full pipe, waits in {blocked:?}"
    );
    agent.wait_until("the whole flood in the log", Duration::from_secs(60), |a| {
        a.log_lines(&pod, "counter").last().map(String::as_str) == Some("end")
    });
    let lines = agent.log_lines(&pod, "counter");
    assert_eq!(lines.len(), LINES + 1, "every line once");
    for (i, line) in lines.iter().take(LINES).enumerate() {
        assert_eq!(
            line.parse::<usize>().ok(),
            Some(i + 1),
            "line {i}: {line:?}"
        );
    }
    println!("flood: {LINES} lines written through a full pipe while the agent was down");
}

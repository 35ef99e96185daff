//! Helpers of the crash-safety tests (`tests/crash_safety.rs`): pod manifests that count
//! or sleep, views of pods and container processes, the log and orphan checks.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;

use super::{container_status, Agent};

/// A container that prints a counter every ~10 ms without forking (the `read -t` on a FIFO
/// nobody writes is the sleep). With `exit_code`, SIGUSR1 makes it print `bye` and exit.
pub fn counter_pod(name: &str, exit_code: Option<i32>) -> String {
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
pub fn sleeper_pod(name: &str, containers: usize) -> String {
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

pub fn container_id(pod: &Pod, name: &str) -> Option<String> {
    container_status(pod, name)
        .and_then(|c| c.container_id.clone())
        .and_then(|id| id.strip_prefix("ironlet://").map(str::to_owned))
}

pub fn is_running(pod: &Pod, name: &str) -> bool {
    container_status(pod, name)
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}

pub fn exit_code_of(pod: &Pod, name: &str) -> Option<i32> {
    container_status(pod, name)
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code)
}

pub fn full_name(agent: &Agent, name: &str) -> String {
    format!("{name}-{}", agent.node_name)
}

/// Pods by their short name.
pub fn pods_by_name(agent: &Agent) -> BTreeMap<String, Pod> {
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
pub fn init_pids(agent: &Agent) -> HashMap<String, i32> {
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
pub fn assert_counter_log(lines: &[String], what: &str) -> usize {
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

/// Ok when exactly the desired pods run, each container exactly once.
pub fn storm_converged(
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
pub fn no_orphans(agent: &Agent, want: &BTreeSet<String>) -> Result<String, String> {
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
    let root = agent.root.path().to_string_lossy().into_owned();
    // The root's own bind onto itself is the runtime's while pods exist (`pod_mounts.rs`).
    for mount in mounts.iter().filter(|m| **m != root) {
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
pub fn strip_ansi(text: &str) -> String {
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
pub struct Lcg(pub u64);

impl Lcg {
    pub fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

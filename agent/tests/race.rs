//! The pod workers under a storm, with real containers: randomised container exits and
//! kills, manifest edits and deletions across many pods, for at least 10 000 events.
//!
//! Asserts, while the storm runs, that no pod ever has two live instances of one container
//! (sampled from the cgroups of live processes, mapped to pod and container through the
//! runtime's records), and at the end that every exit was observed: each container's
//! restart count equals the number of times it actually started, minus one (every start
//! appends a line to a file on a hostPath volume). Needs root; skips otherwise.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{container_status, phase, Agent, AgentOptions};

const PODS: usize = 24;
const TARGET_EVENTS: usize = 10_000;
const MAX_STORM: Duration = Duration::from_secs(420);

fn manifest(index: usize, generation: usize, marks: &Path) -> String {
    // Each start appends a line to <marks>/<pod uid>-<container>; the container then lives
    // a random fraction of a second and exits with a random code, until /m/stop exists.
    let script = "echo start >> /m/${POD_UID}-${C}; \
                  if [ -e /m/stop ]; then exec sleep 3600; fi; \
                  sleep 0.$((RANDOM % 6)); exit $((RANDOM % 3))";
    let container = |name: &str| {
        format!(
            "  - name: {name}\n    image: busybox\n    command: [sh, -c, '{script}']\n    env:\n    - {{name: C, value: {name}}}\n    - name: POD_UID\n      valueFrom: {{fieldRef: {{fieldPath: metadata.uid}}}}\n    volumeMounts: [{{name: m, mountPath: /m}}]\n"
        )
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: storm-{index}\n  labels: {{generation: \"g{generation}\"}}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n{}{}  volumes:\n  - name: m\n    hostPath: {{path: {}, type: Directory}}\n",
        container("a"),
        container("b"),
        marks.display()
    )
}

/// A tiny deterministic generator (xorshift), so a failing run can be replayed by seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// (pod uid, container name) of a container id, from the runtime's record.
fn owner(
    root: &Path,
    id: &str,
    cache: &mut HashMap<String, (String, String)>,
) -> Option<(String, String)> {
    if let Some(found) = cache.get(id) {
        return Some(found.clone());
    }
    let text =
        std::fs::read_to_string(root.join("containers").join(id).join("record.json")).ok()?;
    let record: serde_json::Value = serde_json::from_str(&text).ok()?;
    let uid = record.get("pod_uid")?.as_str()?.to_owned();
    let name = record.get("config")?.get("name")?.as_str()?.to_owned();
    cache.insert(id.to_owned(), (uid.clone(), name.clone()));
    Some((uid, name))
}

/// Live container ids: the last path component of the cgroup of every process whose cgroup
/// lies in the agent's tree, below a `pod<uid>` directory.
fn live_containers(cgroup_root: &str) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cgroup) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        let Some(line) = cgroup
            .lines()
            .find(|l| l.contains(":memory:") || l.starts_with("0::"))
        else {
            continue;
        };
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        if !path.starts_with(cgroup_root) {
            continue;
        }
        let mut parts = path.rsplit('/');
        if let (Some(id), Some(parent)) = (parts.next(), parts.next()) {
            if parent.starts_with("pod") && !id.is_empty() {
                out.push((pid, id.to_owned()));
            }
        }
    }
    out
}

fn count_lines(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .map(|t| t.lines().count())
        .sum()
}

#[test]
fn no_container_ever_runs_twice_and_every_exit_is_observed_under_a_storm() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start_with(AgentOptions {
        extra_args: vec!["--max-container-restart-period".into(), "1s".into()],
        ..AgentOptions::default()
    });
    let marks: PathBuf = agent.root.path().join("marks");
    std::fs::create_dir_all(&marks).expect("marks dir");
    let seed = std::env::var("IRONLET_RACE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 | 1)
        });
    println!("race seed: {seed} (replay with IRONLET_RACE_SEED={seed})");
    let mut rng = Rng(seed);

    let mut generation = [0usize; PODS];
    let mut present = [true; PODS];
    for i in 0..PODS {
        agent.write_manifest(&format!("storm-{i}.yaml"), &manifest(i, 0, &marks));
    }

    // The checker samples live containers until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let violations: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let samples = Arc::new(Mutex::new(0usize));
    let checker = {
        let (stop, violations, samples) = (stop.clone(), violations.clone(), samples.clone());
        let root = agent.root.path().to_owned();
        let cgroup_root = agent.cgroup_root.clone();
        std::thread::spawn(move || {
            let mut owners = HashMap::new();
            while !stop.load(Ordering::SeqCst) {
                let mut by_owner: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
                for (_, id) in live_containers(&cgroup_root) {
                    if let Some(o) = owner(&root, &id, &mut owners) {
                        let ids = by_owner.entry(o).or_default();
                        if !ids.contains(&id) {
                            ids.push(id);
                        }
                    }
                }
                for ((uid, name), ids) in by_owner {
                    if ids.len() > 1 {
                        if let Ok(mut v) = violations.lock() {
                            v.push(format!(
                                "pod {uid} container {name}: live instances {ids:?}"
                            ));
                        }
                    }
                }
                if let Ok(mut n) = samples.lock() {
                    *n += 1;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };

    let start = Instant::now();
    let (mut edits, mut deletions, mut kills) = (0usize, 0usize, 0usize);
    // Kills per (pod uid, container): a container killed before its first command ran
    // started without writing its line.
    let mut killed: HashMap<(String, String), usize> = HashMap::new();
    let mut kill_owners = HashMap::new();
    let events = |edits: usize, deletions: usize, kills: usize| {
        // Each start line is a start event and (but for the last of each container) an
        // exit event.
        2 * count_lines(&marks) + edits + deletions + kills
    };
    while events(edits, deletions, kills) < TARGET_EVENTS && start.elapsed() < MAX_STORM {
        let i = rng.below(PODS);
        match rng.below(10) {
            0 if present[i] => {
                agent.remove_manifest(&format!("storm-{i}.yaml"));
                present[i] = false;
                deletions += 1;
            }
            0 | 1 => {
                generation[i] += 1;
                agent.write_manifest(
                    &format!("storm-{i}.yaml"),
                    &manifest(i, generation[i], &marks),
                );
                present[i] = true;
                edits += 1;
            }
            2..=4 => {
                let live = live_containers(&agent.cgroup_root);
                if !live.is_empty() {
                    let (pid, id) = &live[rng.below(live.len())];
                    let pid = *pid;
                    if let Some(o) = owner(agent.root.path(), id, &mut kill_owners) {
                        *killed.entry(o).or_insert(0usize) += 1;
                    }
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    kills += 1;
                }
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(40 + rng.below(80) as u64));
    }
    let total = events(edits, deletions, kills);
    println!(
        "storm: {total} events in {:.0?} ({edits} edits, {deletions} deletions, {kills} kills, {} checker samples)",
        start.elapsed(),
        samples.lock().map(|n| *n).unwrap_or(0)
    );

    // Calm down: every pod present, containers stop exiting.
    // A re-added pod gets a new generation: the same content would bring back its old UID,
    // whose marker file already counts the starts of its earlier life.
    for i in 0..PODS {
        if !present[i] {
            generation[i] += 1;
            agent.write_manifest(
                &format!("storm-{i}.yaml"),
                &manifest(i, generation[i], &marks),
            );
        }
    }
    std::fs::write(marks.join("stop"), b"").expect("stop file");
    agent.wait_until(
        "every pod Running with both containers up",
        Duration::from_secs(120),
        |a| {
            let pods = a.pods();
            pods.len() == PODS
                && pods.iter().all(|p| {
                    phase(p) == "Running"
                        && ["a", "b"].iter().all(|c| {
                            container_status(p, c)
                                .and_then(|s| s.state.as_ref())
                                .is_some_and(|s| s.running.is_some())
                        })
                })
        },
    );
    // Let the last exits settle into stable restart counts.
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::SeqCst);
    let _ = checker.join();

    let violations = violations.lock().map(|v| v.clone()).unwrap_or_default();
    assert!(
        violations.is_empty(),
        "duplicate live containers: {:#?}",
        &violations[..violations.len().min(20)]
    );
    assert!(
        total >= TARGET_EVENTS,
        "only {total} events in {MAX_STORM:?}"
    );

    let mut mismatches = Vec::new();
    for pod in agent.pods() {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        for c in ["a", "b"] {
            let starts = std::fs::read_to_string(marks.join(format!("{uid}-{c}")))
                .map(|t| t.lines().count())
                .unwrap_or(0);
            let restarts = container_status(&pod, c).map_or(-1, |s| s.restart_count);
            let kills = killed
                .get(&(uid.clone(), (*c).to_owned()))
                .copied()
                .unwrap_or(0);
            // Every start that wrote its line was counted as a restart; a start without a
            // line needs a kill to explain it.
            let unexplained = i64::from(restarts) + 1 - starts as i64;
            if unexplained < 0 || unexplained > kills as i64 {
                mismatches.push(format!(
                    "{uid}/{c}: {starts} starts, restartCount {restarts}, {kills} kills"
                ));
            }
        }
    }
    assert!(mismatches.is_empty(), "exits not observed: {mismatches:#?}");
}

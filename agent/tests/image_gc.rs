//! Image garbage collection with a real image store, real containers and the real agent:
//! thresholds set so that the collection always wants space (high 1 %, low 0 %: this
//! disk's usage is far above), a 1 s period, and the test images imported with the CLI.
//! The image a running container uses, and pinned images, survive; an unused image goes
//! once it is older than the minimum age, with the blobs only it referenced; an image
//! unused for longer than the maximum age goes whatever the usage. Needs root (CI runs as
//! root); skips otherwise.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::{Agent, AgentOptions};

const SLEEPER: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: user, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: sleep
    image: busybox
    command: [sleep, "3600"]
"#;

fn ironlet(agent: &Agent, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ironlet"))
        .arg("--root-dir")
        .arg(agent.root.path())
        .args(args)
        .output()
        .expect("ironlet runs");
    assert!(
        out.status.success(),
        "ironlet {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The repositories `ironlet images ls` lists (last path segment).
fn repos(agent: &Agent) -> BTreeSet<String> {
    ironlet(agent, &["images", "ls"])
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .map(|r| r.rsplit('/').next().unwrap_or(r).to_owned())
        .collect()
}

fn blobs(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir.join("blobs/sha256"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Blobs of the test image `name` that busybox does not share.
fn own_blobs(name: &str) -> BTreeSet<String> {
    let out = support::images_out();
    let busybox = blobs(&out.join("busybox"));
    blobs(&out.join(name))
        .into_iter()
        .filter(|b| !busybox.contains(b))
        .collect()
}

fn store_blobs(agent: &Agent) -> BTreeSet<String> {
    blobs(&agent.root.path().join("images"))
}

fn layered_dir() -> PathBuf {
    support::images_out().join("layered")
}

/// Starts the agent with `gc_args`, and a pod using busybox (pinned until the pod runs, so
/// the collection cannot take it before its container exists).
fn agent_with_user(gc_args: &[&str]) -> Agent {
    let mut extra: Vec<String> = gc_args.iter().map(|s| (*s).to_owned()).collect();
    extra.extend(["--image-gc-period".to_owned(), "1s".to_owned()]);
    let agent = Agent::start_with(AgentOptions {
        extra_args: extra,
        ..AgentOptions::default()
    });
    ironlet(&agent, &["images", "pin", "busybox"]);
    agent.write_manifest("user.yaml", SLEEPER);
    agent.wait_pod("user", "running", Duration::from_secs(60), |p| {
        support::phase(p) == "Running"
    });
    ironlet(&agent, &["images", "unpin", "busybox"]);
    agent
}

#[test]
fn unused_images_go_above_the_threshold_but_used_young_and_pinned_ones_stay() {
    if !support::is_root() {
        return;
    }
    let agent = agent_with_user(&[
        "--image-gc-high-threshold=1",
        "--image-gc-low-threshold=0",
        "--image-minimum-gc-age=8s",
    ]);
    let layered_only = own_blobs("layered");
    assert!(!layered_only.is_empty());

    // An unused image younger than the minimum age stays.
    ironlet(
        &agent,
        &["images", "import", &layered_dir().display().to_string()],
    );
    let imported = Instant::now();
    assert!(
        layered_only.is_subset(&store_blobs(&agent)),
        "import stores the image's blobs"
    );
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        repos(&agent).contains("layered"),
        "removed before the minimum age: {}",
        support::tail(&agent.log(), 30)
    );
    // Once old enough it goes, with the blobs only it referenced.
    agent.wait_until(
        "the unused image is collected",
        Duration::from_secs(30),
        |a| !repos(a).contains("layered"),
    );
    assert!(
        imported.elapsed() >= Duration::from_millis(7900),
        "collected {:?} after the import, before the minimum age",
        imported.elapsed()
    );
    // Its names go first, then its blobs.
    agent.wait_until(
        "the blobs only the removed image referenced are gone",
        Duration::from_secs(10),
        |a| layered_only.is_disjoint(&store_blobs(a)),
    );
    // The image a running container uses stays, and so does the pod.
    assert!(repos(&agent).contains("busybox"));
    // The times survive restarts: saved, busybox's last use included.
    let ids: BTreeSet<String> = ironlet(&agent, &["images", "ls", "-q"])
        .lines()
        .map(str::to_owned)
        .collect();
    // The collection saves its records after its removals: the image can be gone from the
    // store a moment before its record is from the file.
    let read_state = || -> serde_json::Value {
        serde_json::from_slice(
            &std::fs::read(agent.root.path().join("image-gc-state.json")).expect("state saved"),
        )
        .expect("state is JSON")
    };
    let recorded = |state: &serde_json::Value| -> BTreeSet<String> {
        state["records"]
            .as_object()
            .map(|r| r.keys().cloned().collect())
            .unwrap_or_default()
    };
    let saved_at = Instant::now();
    let mut state = read_state();
    while recorded(&state) != ids && saved_at.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        state = read_state();
    }
    assert_eq!(recorded(&state), ids, "{state}");
    let records = state["records"].as_object().cloned().unwrap_or_default();
    assert!(
        records.values().all(|r| !r["last_used"].is_null()),
        "busybox is in use: {state}"
    );
    let pod = agent.pod("user").expect("pod listed");
    assert_eq!(support::phase(&pod), "Running");

    // A pinned image stays, however old.
    ironlet(
        &agent,
        &["images", "import", &layered_dir().display().to_string()],
    );
    ironlet(&agent, &["images", "pin", "layered"]);
    std::thread::sleep(Duration::from_secs(12));
    assert!(
        repos(&agent).contains("layered"),
        "a pinned image was collected: {}",
        support::tail(&agent.log(), 30)
    );

    // Not enough could be freed (everything left is used or pinned): kubelet's message
    // and events, ImageGCFailed once two runs in a row failed.
    let log = agent.log();
    assert!(
        log.contains("Failed to garbage collect required amount of images. Attempted to free"),
        "{}",
        support::tail(&log, 30)
    );
    assert!(
        log.contains("FreeDiskSpaceFailed"),
        "{}",
        support::tail(&log, 30)
    );
    assert!(log.contains("ImageGCFailed"), "{}", support::tail(&log, 30));
}

#[test]
fn images_unused_for_longer_than_the_maximum_age_go_whatever_the_usage() {
    if !support::is_root() {
        return;
    }
    // High threshold 100: no collection for space; only the maximum age applies.
    let agent = agent_with_user(&[
        "--image-gc-high-threshold=100",
        "--image-gc-low-threshold=99",
        "--image-maximum-gc-age=4s",
    ]);
    ironlet(
        &agent,
        &["images", "import", &layered_dir().display().to_string()],
    );
    let imported = Instant::now();
    agent.wait_until(
        "the image unused for 4s is collected",
        Duration::from_secs(30),
        |a| !repos(a).contains("layered"),
    );
    assert!(
        imported.elapsed() >= Duration::from_millis(3900),
        "collected after {:?}, before the maximum age",
        imported.elapsed()
    );
    let layered_only = own_blobs("layered");
    agent.wait_until(
        "the collected image's blobs are gone",
        Duration::from_secs(10),
        |a| layered_only.is_disjoint(&store_blobs(a)),
    );
    // Used all along: stays.
    std::thread::sleep(Duration::from_secs(5));
    assert!(repos(&agent).contains("busybox"));
    assert!(
        !agent.log().contains("FreeDiskSpaceFailed"),
        "no collection for space above 100 %"
    );
}

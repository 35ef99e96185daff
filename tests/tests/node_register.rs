//! The node controller against a real control plane (`scripts/controlplane`): registration
//! with the machine's capacity, labels and nodeInfo; Ready; the Lease heartbeat and its
//! health gate; others' conditions surviving our status updates; Ready=False at shutdown;
//! adoption of an existing Node.
//!
//! One control plane serves every test of this binary; each test registers its own node
//! (its own `system:node:<name>` certificate), so they run in parallel. The control plane is
//! only started when at least one test is selected.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use ironlet::node::{
    MachineConfig, MachineStatus, NodeConfig, NodeController, READY, SHUTTING_DOWN_MESSAGE,
};
use ironlet::qos::Quantity;
use ironlet_e2e::{eventually, is_selected, ControlPlane};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::api::{Api, Patch, PatchParams};
use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::json;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

type TestFn = fn(&ControlPlane) -> Result<()>;

const TESTS: &[(&str, TestFn)] = &[
    (
        "the_node_registers_and_turns_ready_with_the_machines_capacity_labels_and_node_info",
        registers_ready_with_machine_facts,
    ),
    (
        "the_lease_renew_time_advances_every_renew_interval",
        lease_renew_time_advances,
    ),
    (
        "an_unhealthy_agent_stops_renewing_the_lease_until_healthy_again",
        unhealthy_agent_pauses_lease,
    ),
    (
        "a_condition_written_by_someone_else_survives_our_status_updates",
        foreign_condition_survives,
    ),
    (
        "shutdown_marks_the_node_not_ready",
        shutdown_marks_not_ready,
    ),
    (
        "a_restarted_agent_adopts_its_node_and_turns_ready_again",
        restart_adopts_node,
    ),
];

/// How long a node has to turn Ready (registration is one POST; the first tick is at once).
const READY_TIMEOUT: Duration = Duration::from_secs(30);

fn main() {
    let args = Arguments::from_args();
    let selected = TESTS.iter().any(|(name, _)| is_selected(&args, name));
    if args.list || !selected {
        let trials = TESTS
            .iter()
            .map(|(name, _)| Trial::test(*name, || Ok(())))
            .collect();
        libtest_mimic::run(&args, trials).exit();
    }
    // The controllers' warnings (failed registrations, renewals) explain timeouts.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let plane = match ControlPlane::up() {
        Ok(plane) => Arc::new(plane),
        Err(err) => {
            eprintln!("node_register: cannot start the control plane: {err:#}");
            std::process::exit(1);
        }
    };
    let trials = TESTS
        .iter()
        .map(|&(name, test)| {
            let plane = Arc::clone(&plane);
            Trial::test(name, move || {
                test(&plane).map_err(|e| Failed::from(format!("{e:#}")))
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    if conclusion.has_failed() {
        eprintln!("control plane logs:\n{}", plane.log_tails(20));
    }
    // `exit` skips destructors: stop the control plane first.
    drop(plane);
    conclusion.exit();
}

/// A node controller running on its own task, stopped by `stop`.
struct Agent {
    name: String,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<ironlet::node::Result<()>>,
}

impl Agent {
    /// Starts a controller for node `name` with `config` (its `node_name` is set here).
    async fn start(
        plane: &ControlPlane,
        name: &str,
        config: NodeConfig,
        health: Option<watch::Receiver<bool>>,
    ) -> Result<Self> {
        let client = plane.node_client(name).await?;
        let machine = MachineStatus::new(MachineConfig {
            node_name: name.to_owned(),
            root_dir: std::env::temp_dir().join("ironlet-e2e-root"),
            ..MachineConfig::default()
        })?;
        let mut controller = NodeController::new(
            client,
            NodeConfig {
                node_name: name.to_owned(),
                ..config
            },
            machine,
        );
        if let Some(health) = health {
            controller = controller.with_health(health);
        }
        let (shutdown, stopped) = oneshot::channel();
        let task = tokio::spawn(controller.run(async {
            let _ = stopped.await;
        }));
        Ok(Self {
            name: name.to_owned(),
            shutdown: Some(shutdown),
            task,
        })
    }

    /// Signals shutdown and waits for `run` to return.
    async fn stop(mut self) -> Result<()> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let result = tokio::time::timeout(Duration::from_secs(15), &mut self.task)
            .await
            .context("the node controller did not stop within 15 s")?
            .context("the node controller task panicked")?;
        result.with_context(|| format!("node controller {} ended with an error", self.name))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the tokio runtime")
}

/// A node name unique to the test (node names are DNS subdomains).
fn node_name(test: &str) -> String {
    format!("e2e-{test}-{}", std::process::id())
}

fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

async fn wait_ready(nodes: &Api<Node>, name: &str, ready: bool) -> Result<Node> {
    let want = if ready { "True" } else { "False" };
    eventually(
        &format!("node {name} Ready={want}"),
        READY_TIMEOUT,
        || async {
            let node = nodes.get_opt(name).await?;
            Ok(node.filter(|n| condition(n, READY).is_some_and(|c| c.status == want)))
        },
    )
    .await
}

async fn lease_renew_time(leases: &Api<Lease>, name: &str) -> Result<Option<i64>> {
    let lease = leases.get_opt(name).await?;
    Ok(lease
        .and_then(|l| l.spec?.renew_time)
        .map(|t| t.0.as_microsecond()))
}

fn quantity(node: &Node, field: &str, resource: &str) -> Result<Quantity> {
    let status = node.status.as_ref().context("node has no status")?;
    let map = match field {
        "capacity" => status.capacity.as_ref(),
        _ => status.allocatable.as_ref(),
    };
    let text = map
        .and_then(|m| m.get(resource))
        .with_context(|| format!("no {field}.{resource} in {status:?}"))?;
    Ok(Quantity::parse(&text.0)?)
}

fn mem_total_bytes() -> Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next())
        .context("no MemTotal in /proc/meminfo")?
        .parse()?;
    Ok(kib * 1024)
}

fn os_release_pretty_name() -> Result<String> {
    let text = std::fs::read_to_string("/etc/os-release")?;
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .context("no PRETTY_NAME in /etc/os-release")?;
    Ok(value.trim_matches('"').to_owned())
}

fn registers_ready_with_machine_facts(plane: &ControlPlane) -> Result<()> {
    runtime()?.block_on(async {
        let name = node_name("register");
        let agent = Agent::start(plane, &name, NodeConfig::default(), None).await?;
        let nodes: Api<Node> = Api::all(plane.admin_client().await?);
        let node = wait_ready(&nodes, &name, true).await?;

        let cpus = std::thread::available_parallelism()?.get() as u64;
        ensure!(quantity(&node, "capacity", "cpu")?.milli_amount()? == cpus * 1000);
        let memory = quantity(&node, "capacity", "memory")?.amount()?;
        ensure!(
            memory == mem_total_bytes()?,
            "capacity.memory {memory} is not MemTotal"
        );
        let allocatable_memory = quantity(&node, "allocatable", "memory")?.amount()?;
        ensure!(
            allocatable_memory == memory - (100 << 20),
            "allocatable.memory {allocatable_memory}"
        );
        ensure!(quantity(&node, "capacity", "pods")?.amount()? == 110);
        ensure!(quantity(&node, "capacity", "ephemeral-storage")?.amount()? > 1 << 30);

        let labels = node.metadata.labels.clone().unwrap_or_default();
        let arch = ironlet::node::go_arch();
        for (key, value) in [
            ("kubernetes.io/hostname", name.as_str()),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", arch),
            ("beta.kubernetes.io/os", "linux"),
            ("beta.kubernetes.io/arch", arch),
        ] {
            ensure!(
                labels.get(key).map(String::as_str) == Some(value),
                "label {key}: {labels:?}"
            );
        }

        let status = node.status.clone().unwrap_or_default();
        let info = status.node_info.unwrap_or_default();
        let version = env!("CARGO_PKG_VERSION");
        ensure!(
            info.kubelet_version == format!("ironlet/{version}"),
            "{info:?}"
        );
        ensure!(
            info.container_runtime_version == format!("ironlet://{version}"),
            "{info:?}"
        );
        ensure!(
            info.operating_system == "linux" && info.architecture == arch,
            "{info:?}"
        );
        let release = nix::sys::utsname::uname()?;
        ensure!(
            Some(info.kernel_version.as_str()) == release.release().to_str(),
            "{info:?}"
        );
        ensure!(info.os_image == os_release_pretty_name()?, "{info:?}");

        let addresses = status.addresses.unwrap_or_default();
        ensure!(
            addresses
                .iter()
                .any(|a| a.type_ == "Hostname" && a.address == name),
            "{addresses:?}"
        );
        ensure!(
            addresses.iter().any(|a| a.type_ == "InternalIP"),
            "{addresses:?}"
        );
        let ready = condition(&node, READY).context("no Ready condition")?;
        ensure!(ready.reason.as_deref() == Some("KubeletReady"), "{ready:?}");
        for (type_, reason) in [
            ("MemoryPressure", "KubeletHasSufficientMemory"),
            ("DiskPressure", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "KubeletHasSufficientPID"),
        ] {
            let c = condition(&node, type_).with_context(|| format!("no {type_}"))?;
            ensure!(
                c.status == "False" && c.reason.as_deref() == Some(reason),
                "{c:?}"
            );
        }

        // kubectl reads our version strings and conditions as it would a kubelet's.
        let row = plane.kubectl(&["get", "node", &name, "--no-headers"])?;
        ensure!(
            row.split_whitespace().nth(1) == Some("Ready"),
            "kubectl get node: {row}"
        );
        ensure!(
            row.contains(&format!("ironlet/{version}")),
            "kubectl get node: {row}"
        );
        agent.stop().await
    })
}

fn lease_renew_time_advances(plane: &ControlPlane) -> Result<()> {
    runtime()?.block_on(async {
        let name = node_name("lease");
        let config = NodeConfig {
            lease_renew_interval: Duration::from_secs(1),
            ..NodeConfig::default()
        };
        let agent = Agent::start(plane, &name, config, None).await?;
        let admin = plane.admin_client().await?;
        let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
        let first = eventually("the node lease", READY_TIMEOUT, || {
            lease_renew_time(&leases, &name)
        })
        .await?;
        let later = eventually("a later renewTime", Duration::from_secs(10), || async {
            Ok(lease_renew_time(&leases, &name)
                .await?
                .filter(|t| *t > first))
        })
        .await?;
        let interval = Duration::from_micros(u64::try_from(later - first)?);
        // About the 1 s interval (plus request latency on a busy machine), far below the
        // 10 s default.
        ensure!(
            interval >= Duration::from_millis(800) && interval <= Duration::from_secs(5),
            "renewTime moved by {interval:?}, expected about 1 s"
        );

        let lease = leases.get(&name).await?;
        let spec = lease.spec.context("lease without spec")?;
        ensure!(
            spec.holder_identity.as_deref() == Some(name.as_str()),
            "{spec:?}"
        );
        ensure!(spec.lease_duration_seconds == Some(40), "{spec:?}");
        let node = Api::<Node>::all(admin).get(&name).await?;
        let owners = lease.metadata.owner_references.unwrap_or_default();
        ensure!(
            owners.len() == 1
                && owners[0].kind == "Node"
                && owners[0].name == name
                && Some(&owners[0].uid) == node.metadata.uid.as_ref(),
            "lease owners {owners:?}"
        );
        agent.stop().await
    })
}

fn unhealthy_agent_pauses_lease(plane: &ControlPlane) -> Result<()> {
    runtime()?.block_on(async {
        let name = node_name("health");
        let config = NodeConfig {
            lease_renew_interval: Duration::from_millis(500),
            ..NodeConfig::default()
        };
        let (health, health_rx) = watch::channel(true);
        let agent = Agent::start(plane, &name, config, Some(health_rx)).await?;
        let leases: Api<Lease> = Api::namespaced(plane.admin_client().await?, "kube-node-lease");
        eventually("the node lease", READY_TIMEOUT, || {
            lease_renew_time(&leases, &name)
        })
        .await?;

        health.send(false)?;
        // A renewal already in flight may still land; after that renewTime must stay put for
        // three renew intervals (while healthy it moves every 500 ms).
        let paused = eventually(
            "renewals to stop while unhealthy",
            Duration::from_secs(10),
            || async {
                let before = lease_renew_time(&leases, &name).await?;
                tokio::time::sleep(Duration::from_millis(1500)).await;
                let after = lease_renew_time(&leases, &name).await?;
                Ok((before == after).then_some(after))
            },
        )
        .await?;

        health.send(true)?;
        eventually(
            "renewal after health returns",
            Duration::from_secs(5),
            || async {
                Ok(lease_renew_time(&leases, &name)
                    .await?
                    .filter(|t| Some(*t) > paused))
            },
        )
        .await?;
        agent.stop().await
    })
}

fn foreign_condition_survives(plane: &ControlPlane) -> Result<()> {
    runtime()?.block_on(async {
        let name = node_name("foreign");
        // Every tick patches, so the test sees several of our updates quickly.
        let config = NodeConfig {
            node_status_update_frequency: Duration::from_millis(500),
            node_status_report_frequency: Duration::from_millis(500),
            ..NodeConfig::default()
        };
        let agent = Agent::start(plane, &name, config, None).await?;
        let nodes: Api<Node> = Api::all(plane.admin_client().await?);
        wait_ready(&nodes, &name, true).await?;

        let foreign = json!({ "status": { "conditions": [{
            "type": "ExampleProblem", "status": "True", "reason": "Detected",
            "message": "written by a node problem detector",
        }]}});
        nodes
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(foreign))
            .await?;
        let written = nodes.get(&name).await?;
        let heartbeat =
            |node: &Node| condition(node, READY).and_then(|c| c.last_heartbeat_time.clone());
        let before = heartbeat(&written);
        // Two of our updates after the foreign write (heartbeats have second precision).
        let after = eventually(
            "two more status updates",
            Duration::from_secs(10),
            || async {
                let node = nodes.get(&name).await?;
                let moved = match (heartbeat(&node), &before) {
                    (Some(now), Some(then)) => now.0.as_second() >= then.0.as_second() + 2,
                    _ => false,
                };
                Ok(moved.then_some(node))
            },
        )
        .await?;
        let survived = condition(&after, "ExampleProblem")
            .context("the ExampleProblem condition was removed by our status update")?;
        ensure!(survived.status == "True" && survived.reason.as_deref() == Some("Detected"));
        let ours = condition(&after, READY).context("no Ready")?;
        ensure!(ours.status == "True", "{ours:?}");
        agent.stop().await
    })
}

fn shutdown_marks_not_ready(plane: &ControlPlane) -> Result<()> {
    runtime()?.block_on(async {
        let name = node_name("shutdown");
        let agent = Agent::start(plane, &name, NodeConfig::default(), None).await?;
        let nodes: Api<Node> = Api::all(plane.admin_client().await?);
        wait_ready(&nodes, &name, true).await?;
        agent.stop().await?;
        let node = nodes.get(&name).await?;
        let ready = condition(&node, READY).context("no Ready")?;
        if ready.status != "False" {
            bail!("Ready is not False after shutdown: {ready:?}");
        }
        ensure!(
            ready.reason.as_deref() == Some("KubeletNotReady"),
            "{ready:?}"
        );
        ensure!(
            ready.message.as_deref() == Some(SHUTTING_DOWN_MESSAGE),
            "{ready:?}"
        );
        Ok(())
    })
}

fn restart_adopts_node(plane: &ControlPlane) -> Result<()> {
    runtime()?.block_on(async {
        let name = node_name("restart");
        let nodes: Api<Node> = Api::all(plane.admin_client().await?);
        let agent = Agent::start(plane, &name, NodeConfig::default(), None).await?;
        let first = wait_ready(&nodes, &name, true).await?;
        agent.stop().await?;
        wait_ready(&nodes, &name, false).await?;

        let agent = Agent::start(plane, &name, NodeConfig::default(), None).await?;
        let again = wait_ready(&nodes, &name, true).await?;
        ensure!(
            again.metadata.uid == first.metadata.uid,
            "the node was recreated instead of adopted"
        );
        agent.stop().await
    })
}

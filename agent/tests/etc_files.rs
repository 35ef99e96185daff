//! The kubelet-managed `/etc/hosts`, `/etc/hostname` and `/etc/resolv.conf` as real
//! containers of static pods read them, per `dnsPolicy` and with `hostNetwork`. Needs root
//! (CI runs as root); skips otherwise.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use support::{phase, Agent, AgentOptions};

/// Prints the three files, separated by `===`, then `done`.
const PRINT: &str = r#"[sh, -c, "cat /etc/hosts; echo ===; cat /etc/hostname; echo ===; cat /etc/resolv.conf; echo done; exec sleep 3600"]"#;

const NODE_RESOLV_CONF: &str = "nameserver 192.0.2.53\nsearch example.org\noptions timeout:2\n";

fn manifest(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n{spec}  containers:\n  - name: c\n    image: busybox\n    command: {PRINT}\n"
    )
}

/// The files as the container printed them: (hosts, hostname, resolv.conf).
fn printed(agent: &Agent, name: &str) -> (Pod, [String; 3]) {
    let pod = agent.wait_pod(name, "printed its files", Duration::from_secs(60), |p| {
        phase(p) == "Running" && agent.log_lines(p, "c").last().map(String::as_str) == Some("done")
    });
    let lines = agent.log_lines(&pod, "c");
    let text = lines[..lines.len() - 1].join("\n") + "\n";
    let parts: Vec<String> = text.split("===\n").map(str::to_owned).collect();
    let files: [String; 3] = parts
        .try_into()
        .unwrap_or_else(|p| panic!("three files from {name}: {p:?}"));
    (pod, files)
}

fn pod_ip(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("the pod has an IP")
}

/// An agent whose `--resolv-conf` is a file holding [`NODE_RESOLV_CONF`], with `flags`.
fn agent_with_node_resolver(flags: &[&str]) -> (tempfile::TempDir, Agent) {
    let dir = tempfile::tempdir().expect("temp dir");
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(&resolv, NODE_RESOLV_CONF).expect("node resolv.conf");
    let mut extra_args: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
    extra_args.push(format!("--resolv-conf={}", resolv.display()));
    let agent = Agent::start_with(AgentOptions {
        extra_args,
        ..AgentOptions::default()
    });
    (dir, agent)
}

#[test]
fn containers_read_the_managed_files_per_dns_policy() {
    if !support::is_root() {
        return;
    }
    let (_dir, agent) = agent_with_node_resolver(&[
        "--cluster-dns",
        "10.96.0.10,10.96.0.11",
        "--cluster-dns=10.96.0.12",
        "--cluster-domain=cluster.local",
    ]);
    agent.write_manifest(
        "cluster.yaml",
        &manifest(
            "cluster",
            "  hostname: web\n  subdomain: sub\n  hostAliases:\n  - {ip: 10.1.2.3, hostnames: [foo.remote, bar.remote]}\n",
        ),
    );
    agent.write_manifest("default.yaml", &manifest("dflt", "  dnsPolicy: Default\n"));
    agent.write_manifest(
        "none.yaml",
        &manifest(
            "none",
            "  dnsPolicy: None\n  dnsConfig:\n    nameservers: [1.2.3.4]\n    searches: [my.dns.search.suffix]\n    options: [{name: ndots, value: '2'}, {name: edns0}]\n",
        ),
    );
    agent.write_manifest("host.yaml", &manifest("hostnet", "  hostNetwork: true\n"));

    let (pod, [hosts, hostname, resolv_conf]) = printed(&agent, "cluster");
    let ip = pod_ip(&pod);
    assert!(
        hosts.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"),
        "{hosts}"
    );
    assert!(
        hosts.contains(&format!("\n{ip}\tweb.sub.default.svc.cluster.local\tweb\n")),
        "{hosts}"
    );
    assert!(
        hosts.ends_with("\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo.remote\tbar.remote\n"),
        "{hosts}"
    );
    assert_eq!(hostname, "web\n");
    assert_eq!(
        resolv_conf,
        "search default.svc.cluster.local svc.cluster.local cluster.local example.org\nnameserver 10.96.0.10\nnameserver 10.96.0.11\nnameserver 10.96.0.12\noptions ndots:5\n"
    );

    let (pod, [hosts, hostname, resolv_conf]) = printed(&agent, "dflt");
    // A static pod's name carries the node's.
    let name = pod.metadata.name.clone().unwrap_or_default();
    assert!(
        hosts.ends_with(&format!("\n{}\t{name}\n", pod_ip(&pod))),
        "{hosts}"
    );
    assert_eq!(hostname, format!("{name}\n"));
    assert_eq!(
        resolv_conf,
        "search example.org\nnameserver 192.0.2.53\noptions timeout:2\n"
    );

    let (_, [_, _, resolv_conf]) = printed(&agent, "none");
    assert_eq!(
        resolv_conf,
        "search my.dns.search.suffix\nnameserver 1.2.3.4\noptions ndots:2 edns0\n"
    );

    // hostNetwork: the node's hosts file and name; ClusterFirst falls back to Default.
    let (_, [hosts, hostname, resolv_conf]) = printed(&agent, "hostnet");
    let node_hosts = std::fs::read_to_string("/etc/hosts").expect("node /etc/hosts");
    assert_eq!(
        hosts,
        format!("# Kubernetes-managed hosts file (host network).\n{node_hosts}")
    );
    let node_name = nix::unistd::gethostname().expect("host name");
    assert_eq!(hostname, format!("{}\n", node_name.to_string_lossy()));
    assert_eq!(
        resolv_conf,
        "search example.org\nnameserver 192.0.2.53\noptions timeout:2\n"
    );
}

#[test]
fn cluster_first_without_cluster_dns_falls_back_to_the_nodes_resolver() {
    if !support::is_root() {
        return;
    }
    let (_dir, agent) = agent_with_node_resolver(&[]);
    // A read-only root filesystem still gets its files.
    let read_only = "    securityContext: {readOnlyRootFilesystem: true}\n";
    agent.write_manifest("fallback.yaml", &(manifest("fallback", "") + read_only));
    let (_, [_, _, resolv_conf]) = printed(&agent, "fallback");
    assert_eq!(
        resolv_conf,
        "search example.org\nnameserver 192.0.2.53\noptions timeout:2\n"
    );
    assert_eq!(
        agent.log().matches("\"MissingClusterDNS\" pod:").count(),
        1,
        "the fallback is reported: {}",
        support::tail(&agent.log(), 20)
    );
}

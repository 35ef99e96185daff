//! Image pulls end to end: a real `ironlet run --kubeconfig` joined to a real control plane
//! pulls from a real registry (Debian's docker-registry on loopback, TLS from a test CA
//! given with `--registry-config`, htpasswd auth) filled by skopeo. A pod whose image is
//! only in the registry runs with the credentials of a `kubectl create secret
//! docker-registry` secret, with `Pulling`/`Pulled` events; a secret with a wrong password
//! leaves the container in `ErrImagePull`/`ImagePullBackOff` with the registry's error.
//!
//! The agent runs with `--serialize-image-pulls` and `--node-status-max-images=1`: two pods
//! of two images pull one after the other (the agent's pull log shows intervals that do not
//! overlap), and the Node's `status.images` lists the largest image only, the pulled one,
//! with its size. A pod whose service account names the pull secret pulls with it (the API
//! server's ServiceAccount admission copies `imagePullSecrets` into the pod, as for kubelet).
//! Image GC thresholds of 1 %/0 % make its first run (at start) fail to free enough — every
//! image is younger than the 2 min minimum age, so nothing is removed while the tests run —
//! and the Node gets kubelet's `FreeDiskSpaceFailed` warning.
//!
//! A kubelet credential provider plugin with `tokenAttributes` (KEP-4412) serves
//! `<registry>/tokened/*`: a shell script that submits the service-account token it is sent
//! to the API server's TokenReview (audience `e2e-registry`) and answers the registry's
//! credentials only for service account `default/tokened` with annotation
//! `e2e.ironlet.dev/registry-role: puller`. A pod of that account runs (its token was bound
//! to it); a second pod of the account is served from the plugin cache (no new exec); a pod
//! of the `default` account (no annotation: the plugin is not run) gets the registry's
//! refusal. The node may request that audience only through an RBAC rule
//! (`request-serviceaccounts-token-audience`), as an admin grants it to kubelets: without
//! it, the pull fails with the API server's refusal of the token in its message.
//!
//! A pod's pull `kill -9`ed with the agent in the middle of a large layer (served slowly by
//! a relay in front of the registry) completes after the supervisor restarts the agent: the
//! partial blob and snapshot are gone, the image is stored with the registry's digests.
//!
//! One control plane, one registry and one agent (node `e2e-pull-<pid>`) serve every test
//! of this binary. Needs root (containers, cgroups, CNI).

use std::time::Duration;

use anyhow::Context as _;
use anyhow::Result;
use ironlet_e2e::{
    block_on, eventually, images_out, run_suite, ClusterAgent, ControlPlane, SuiteTest,
};
use ironlet_runtime::testkit::proxy::{ProxySettings, TcpProxy};
use ironlet_runtime::testkit::registry::{
    dir_sizes, make_large_layout, LargeImage, RegistryOptions, TestRegistry,
};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

const USER: &str = "e2e-puller";
const PASS: &str = "e2e-right-password";
/// The credential provider plugin's token audience.
const AUDIENCE: &str = "e2e-registry";
/// The service-account annotation the plugin requires.
const ROLE_KEY: &str = "e2e.ironlet.dev/registry-role";

mod local;
use local::agent_pid;

struct Env {
    plane: ControlPlane,
    agent: ClusterAgent,
    registry: TestRegistry,
    /// Relays to `registry`, slowly when a test asks (its host has the credentials in
    /// registries.yaml).
    proxy: TcpProxy,
    /// `big/kill:1` in the registry.
    big: LargeImage,
    /// The token plugin's directory: `calls` (its requests), `reviewed` (the pods whose
    /// tokens it accepted).
    plugin: std::path::PathBuf,
    _work: tempfile::TempDir,
}

const TESTS: &[SuiteTest<Env>] = &[
    (
        "a_pod_whose_image_is_only_in_the_registry_runs_with_its_docker_registry_secret",
        pulls_with_secret,
    ),
    (
        "a_wrong_password_leaves_the_container_in_image_pull_back_off_with_the_registrys_error",
        wrong_password_backs_off,
    ),
    (
        "the_node_status_lists_the_pulled_image_with_its_size_up_to_the_limit",
        node_status_images,
    ),
    (
        "serialized_pulls_of_two_pods_run_one_after_the_other",
        serialized_pulls,
    ),
    (
        "a_pod_pulls_with_the_pull_secret_of_its_service_account",
        service_account_secret,
    ),
    (
        "a_credential_provider_gets_the_pods_service_account_token_and_only_that_account_pulls",
        service_account_token_provider,
    ),
    (
        "image_gc_that_cannot_free_enough_warns_on_the_node_with_kubelets_message",
        image_gc_warning,
    ),
    (
        "a_pull_killed_with_the_agent_mid_layer_completes_after_the_restart_with_the_same_digests",
        pull_survives_agent_kill,
    ),
];

/// Serialises the agent kill of [`pull_survives_agent_kill`] against the other tests: a
/// restart in the middle of theirs drops what the agent keeps in memory (the credential
/// provider's cache) and its log, which they check.
static AGENT_KILL: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared_agent() -> std::sync::RwLockReadGuard<'static, ()> {
    AGENT_KILL.read().unwrap_or_else(|p| p.into_inner())
}

fn main() {
    run_suite("cluster_pull", TESTS, start, |env| {
        eprintln!("agent log tail:\n{}", env.agent.log_tail(60));
    })
}

fn start() -> Result<Env> {
    let registry = TestRegistry::start(RegistryOptions {
        basic_auth: Some((USER.into(), PASS.into())),
        ..RegistryOptions::default()
    })?;
    // layered: three of its four layers are nowhere on the node (the agent imports busybox).
    registry.push(&images_out()?.join("layered"), "pulled/layered:1", &[])?;
    registry.push(&images_out()?.join("busybox"), "serial/a:1", &[])?;
    registry.push(&images_out()?.join("layered"), "serial/b:1", &[])?;
    let work = tempfile::tempdir()?;
    let big = make_large_layout(&work.path().join("big"), 24 << 20, 11)?;
    registry.push(
        &work.path().join("big"),
        "big/kill:1",
        &["--preserve-digests"],
    )?;
    let proxy = TcpProxy::start(&registry.host(), ProxySettings::default())?;
    let config = work.path().join("registries.yaml");
    std::fs::write(
        &config,
        format!(
            "configs:\n  \"{host}\":\n    tls:\n      ca_file: {ca}\n  \"{proxy}\":\n    \
             tls:\n      ca_file: {ca}\n    auth: {{username: {USER}, password: {PASS}}}\n",
            host = registry.host(),
            proxy = proxy.host(),
            ca = registry.ca_file().display()
        ),
    )?;
    registry.push(&images_out()?.join("layered"), "tokened/layered:1", &[])?;
    let plane = ControlPlane::up()?;
    let plugin = work.path().join("plugin");
    let provider_config = token_plugin(&plane, &registry, &plugin)?;
    let node = format!("e2e-pull-{}", std::process::id());
    let kubeconfig = plane.node_kubeconfig(&node)?;
    let agent = ClusterAgent::start_with_args(
        &kubeconfig,
        &node,
        (std::process::id() + 97) % 250,
        &[
            "--registry-config".as_ref(),
            config.as_os_str(),
            "--serialize-image-pulls".as_ref(),
            "--node-status-max-images=1".as_ref(),
            "--image-gc-high-threshold=1".as_ref(),
            "--image-gc-low-threshold=0".as_ref(),
            "--image-credential-provider-config".as_ref(),
            provider_config.as_os_str(),
            "--image-credential-provider-bin-dir".as_ref(),
            plugin.join("bin").as_os_str(),
        ],
    )?;
    Ok(Env {
        plane,
        agent,
        registry,
        proxy,
        big,
        plugin,
        _work: work,
    })
}

/// Writes the token plugin (`dir/bin/sa-token`) and its CredentialProviderConfig, and lets
/// nodes request tokens for [`AUDIENCE`]; returns the config's path.
fn token_plugin(
    plane: &ControlPlane,
    registry: &TestRegistry,
    dir: &std::path::Path,
) -> Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    let kubectl = plane.kubectl_command();
    let kubectl = format!(
        "{} {}",
        kubectl.get_program().to_string_lossy(),
        kubectl
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let host = registry.host();
    let script = format!(
        r#"#!/bin/sh
# Credentials for {host}/tokened only for a token of default/tokened that the API server
# accepts for audience {AUDIENCE}, with annotation {ROLE_KEY}=puller.
req=$(cat)
printf '%s\n' "$req" >> {dir}/calls
token=$(printf '%s' "$req" | jq -r '.serviceAccountToken // empty')
role=$(printf '%s' "$req" | jq -r '.serviceAccountAnnotations["{ROLE_KEY}"] // empty')
[ -n "$token" ] || {{ echo "no serviceAccountToken" >&2; exit 1; }}
review=$(jq -n --arg t "$token" '{{apiVersion:"authentication.k8s.io/v1",kind:"TokenReview",spec:{{token:$t,audiences:["{AUDIENCE}"]}}}}'   | {kubectl} create -f - -o json) || exit 1
user=$(printf '%s' "$review" | jq -r 'select(.status.authenticated == true) | .status.user.username')
[ "$user" = system:serviceaccount:default:tokened ] || {{ echo "token of '$user' refused" >&2; exit 1; }}
[ "$role" = puller ] || {{ echo "role '$role' refused" >&2; exit 1; }}
printf '%s' "$review" | jq -r '.status.user.extra["authentication.kubernetes.io/pod-name"][0]' >> {dir}/reviewed
printf '{{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Image","cacheDuration":"5m","auth":{{"{host}/tokened":{{"username":"{USER}","password":"{PASS}"}}}}}}'
"#,
        dir = dir.display()
    );
    let path = bin.join("sa-token");
    std::fs::write(&path, script)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
             - name: sa-token\n  matchImages: [\"{host}/tokened\"]\n  defaultCacheDuration: 1m\n  \
             apiVersion: credentialprovider.kubelet.k8s.io/v1\n  tokenAttributes:\n    \
             serviceAccountTokenAudience: {AUDIENCE}\n    cacheType: ServiceAccount\n    \
             requireServiceAccount: true\n    requiredServiceAccountAnnotationKeys: [{ROLE_KEY}]\n"
        ),
    )?;
    grant_audience(plane, dir)?;
    Ok(config)
}

/// What an admin grants kubelets for a credential provider's audience (`dir/rbac.yaml`).
fn grant_audience(plane: &ControlPlane, dir: &std::path::Path) -> Result<()> {
    let rbac = dir.join("rbac.yaml");
    std::fs::write(
        &rbac,
        format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: e2e-registry-audience}}\n\
             rules:\n- apiGroups: [\"\"]\n  resources: [\"{AUDIENCE}\"]\n  verbs: [request-serviceaccounts-token-audience]\n\
             ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: e2e-registry-audience}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: e2e-registry-audience}}\n\
             subjects:\n- {{apiGroup: rbac.authorization.k8s.io, kind: Group, name: \"system:nodes\"}}\n"
        ),
    )?;
    plane.kubectl(&["apply", "-f", &rbac.to_string_lossy()])?;
    Ok(())
}

/// A pod of the registry's image with pull secret `secret`; `Always` pulls even when the
/// image is present (so a wrong password is always checked).
fn registry_pod(env: &Env, name: &str, secret: &str, policy: &str) -> Result<Pod> {
    image_pod(env, name, "pulled/layered:1", Some(secret), policy)
}

/// A pod of the registry's `repo_tag`, with pull secret `secret` if any.
fn image_pod(
    env: &Env,
    name: &str,
    repo_tag: &str,
    secret: Option<&str>,
    policy: &str,
) -> Result<Pod> {
    let secrets: Vec<serde_json::Value> =
        secret.into_iter().map(|s| json!({ "name": s })).collect();
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "nodeName": env.agent.node_name,
            "terminationGracePeriodSeconds": 1,
            "imagePullSecrets": secrets,
            "containers": [{
                "name": "main",
                "image": format!("{}/{repo_tag}", env.registry.host()),
                "imagePullPolicy": policy,
                "command": ["sleep", "3603"],
            }],
        },
    }))?)
}

fn docker_registry_secret(env: &Env, name: &str, password: &str) -> Result<()> {
    let _ = env
        .plane
        .kubectl(&["delete", "secret", name, "--ignore-not-found"]);
    env.plane
        .kubectl(&[
            "create",
            "secret",
            "docker-registry",
            name,
            &format!("--docker-server={}", env.registry.host()),
            &format!("--docker-username={USER}"),
            &format!("--docker-password={password}"),
        ])
        .map(drop)
}

async fn create_pod(pods: &Api<Pod>, pod: &Pod) -> Result<()> {
    eventually("the pod is created", Duration::from_secs(30), || async {
        pods.create(&PostParams::default(), pod).await?;
        Ok(Some(()))
    })
    .await
}

async fn delete_pod(pods: &Api<Pod>, name: &str) -> Result<()> {
    pods.delete(name, &DeleteParams::default()).await?;
    eventually(
        &format!("pod {name} gone"),
        Duration::from_secs(60),
        || async { Ok(pods.get_opt(name).await?.is_none().then_some(())) },
    )
    .await
}

async fn event_messages(env: &Env, pod: &str) -> Result<Vec<(String, String)>> {
    let events: Api<Event> = Api::namespaced(env.plane.admin_client().await?, "default");
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect())
}

fn pulls_with_secret(env: &Env) -> Result<()> {
    let _shared = shared_agent();
    block_on(async {
        docker_registry_secret(env, "pullcred", PASS)?;
        let pods: Api<Pod> = Api::namespaced(env.plane.admin_client().await?, "default");
        create_pod(
            &pods,
            &registry_pod(env, "pulled", "pullcred", "IfNotPresent")?,
        )
        .await?;
        let result = eventually("pulled Running", Duration::from_secs(90), || async {
            let pod = pods.get("pulled").await?;
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
            Ok((phase.as_deref() == Some("Running")).then_some(pod))
        })
        .await;
        let events = event_messages(env, "pulled").await?;
        let cleanup = delete_pod(&pods, "pulled").await;
        let pod = result?;
        cleanup?;
        let image_id = pod
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.into_iter().next())
            .map(|c| c.image_id)
            .unwrap_or_default();
        anyhow::ensure!(
            image_id.contains("pulled/layered@sha256:"),
            "imageID {image_id:?}"
        );
        let image = format!("{}/pulled/layered:1", env.registry.host());
        anyhow::ensure!(
            events
                .iter()
                .any(|(r, m)| r == "Pulling" && m == &format!("Pulling image \"{image}\"")),
            "no Pulling event: {events:?}"
        );
        anyhow::ensure!(
            events.iter().any(|(r, m)| r == "Pulled"
                && m.starts_with(&format!("Successfully pulled image \"{image}\" in "))
                && m.contains("s including waiting). Image size: ")),
            "no Pulled event: {events:?}"
        );
        Ok(())
    })
}

fn wrong_password_backs_off(env: &Env) -> Result<()> {
    let _shared = shared_agent();
    block_on(async {
        docker_registry_secret(env, "badcred", "wrong-password")?;
        let pods: Api<Pod> = Api::namespaced(env.plane.admin_client().await?, "default");
        create_pod(&pods, &registry_pod(env, "badpull", "badcred", "Always")?).await?;
        let waiting = |reason: &'static str| {
            let pods = pods.clone();
            async move {
                eventually(
                    &format!("badpull waiting in {reason}"),
                    Duration::from_secs(60),
                    || async {
                        let pod = pods.get("badpull").await?;
                        let w = pod
                            .status
                            .and_then(|s| s.container_statuses)
                            .and_then(|c| c.into_iter().next())
                            .and_then(|c| c.state)
                            .and_then(|s| s.waiting);
                        Ok(w.filter(|w| w.reason.as_deref() == Some(reason))
                            .map(|w| w.message.unwrap_or_default()))
                    },
                )
                .await
            }
        };
        let pull_err = waiting("ErrImagePull").await;
        let back_off = waiting("ImagePullBackOff").await;
        let events = event_messages(env, "badpull").await?;
        let cleanup = delete_pod(&pods, "badpull").await;
        let (pull_err, back_off) = (pull_err?, back_off?);
        cleanup?;
        for message in [&pull_err, &back_off] {
            anyhow::ensure!(
                message.contains("authorization failed") && message.contains(&env.registry.host()),
                "waiting message without the registry's error: {message:?}"
            );
        }
        anyhow::ensure!(
            back_off.starts_with("Back-off pulling image"),
            "{back_off:?}"
        );
        anyhow::ensure!(
            events
                .iter()
                .any(|(r, m)| r == "Failed" && m.starts_with("Failed to pull image")),
            "no Failed event: {events:?}"
        );
        anyhow::ensure!(
            events.iter().any(|(r, _)| r == "BackOff"),
            "no BackOff event: {events:?}"
        );
        Ok(())
    })
}

async fn wait_running(pods: &Api<Pod>, name: &str) -> Result<Pod> {
    eventually(
        &format!("{name} Running"),
        Duration::from_secs(90),
        || async {
            let pod = pods.get(name).await?;
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
            Ok((phase.as_deref() == Some("Running")).then_some(pod))
        },
    )
    .await
}

/// Size of a test image as the store counts it: config plus layer blobs, from its OCI
/// layout's manifest.
fn layout_image_size(name: &str) -> Result<i64> {
    let dir = images_out()?.join(name);
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("index.json"))?)?;
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .unwrap_or_default()
        .trim_start_matches("sha256:")
        .to_owned();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("blobs/sha256").join(digest))?)?;
    let layers: i64 = manifest["layers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["size"].as_i64())
        .sum();
    Ok(layers + manifest["config"]["size"].as_i64().unwrap_or_default())
}

fn node_status_images(env: &Env) -> Result<()> {
    let _shared = shared_agent();
    block_on(async {
        docker_registry_secret(env, "listcred", PASS)?;
        let client = env.plane.admin_client().await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        create_pod(
            &pods,
            &registry_pod(env, "listed", "listcred", "IfNotPresent")?,
        )
        .await?;
        let running = wait_running(&pods, "listed").await;
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
        let tag = format!("{}/pulled/layered:1", env.registry.host());
        let digest = format!("{}/pulled/layered@sha256:", env.registry.host());
        // The limit is 1 and busybox (imported) is smaller: only the pulled image.
        let listed = eventually(
            "status.images lists the pulled image",
            Duration::from_secs(60),
            || async {
                let node = nodes.get(&env.agent.node_name).await?;
                let images = node.status.and_then(|s| s.images).unwrap_or_default();
                let found = images.len() == 1
                    && images[0].names.as_ref().is_some_and(|n| {
                        n.contains(&tag) && n.iter().any(|x| x.starts_with(&digest))
                    });
                Ok(found.then_some(images))
            },
        )
        .await;
        let cleanup = delete_pod(&pods, "listed").await;
        running?;
        let images = listed?;
        cleanup?;
        let names = images[0].names.clone().unwrap_or_default();
        anyhow::ensure!(
            names.len() <= 5 && names[0].starts_with(&digest),
            "repo digests first, five names at most: {names:?}"
        );
        anyhow::ensure!(
            images[0].size_bytes == Some(layout_image_size("layered")?),
            "size {:?}, the image is {} bytes",
            images[0].size_bytes,
            layout_image_size("layered")?
        );
        Ok(())
    })
}

/// One pull in the agent's log ("image pull started" / "image pull finished" lines).
#[derive(Debug, Clone, Copy)]
struct LoggedPull {
    start: jiff_ts::Timestamp,
    end: jiff_ts::Timestamp,
    /// How long the pod waited for its turn (the start line's `waited=`), seconds.
    waited: f64,
}

fn pull_intervals(log: &str, image: &str) -> Vec<LoggedPull> {
    let mut out = Vec::new();
    let mut started = None;
    for line in log.lines() {
        if !line.contains(&format!("image={image} ")) && !line.ends_with(&format!("image={image}"))
        {
            continue;
        }
        let Some(at) = line
            .split_whitespace()
            .next()
            .and_then(|t| t.parse::<jiff_ts::Timestamp>().ok())
        else {
            continue;
        };
        if line.contains("image pull started") {
            let waited = line
                .split_whitespace()
                .find_map(|t| t.strip_prefix("waited="))
                .and_then(debug_duration_secs)
                .unwrap_or(f64::NAN);
            started = Some((at, waited));
        } else if line.contains("image pull finished") {
            if let Some((start, waited)) = started.take() {
                out.push(LoggedPull {
                    start,
                    end: at,
                    waited,
                });
            }
        }
    }
    out
}

/// Seconds of a Rust `Duration` as `{:?}` prints it (`1.5s`, `85.1ms`, `12µs`, `950ns`).
fn debug_duration_secs(text: &str) -> Option<f64> {
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let scale = match unit {
        "s" => 1.0,
        "ms" => 1e-3,
        "µs" => 1e-6,
        "ns" => 1e-9,
        _ => return None,
    };
    Some(value * scale)
}

/// `(pull, including waiting)` seconds of a `Pulled` event's message.
fn pulled_times(message: &str) -> Option<(f64, f64)> {
    let rest = message.split("\" in ").nth(1)?;
    let (pull, rest) = rest.split_once("s (")?;
    let (total, _) = rest.split_once("s including waiting)")?;
    Some((pull.parse().ok()?, total.parse().ok()?))
}

use k8s_openapi::jiff as jiff_ts;

fn serialized_pulls(env: &Env) -> Result<()> {
    let _shared = shared_agent();
    block_on(async {
        docker_registry_secret(env, "serialcred", PASS)?;
        let pods: Api<Pod> = Api::namespaced(env.plane.admin_client().await?, "default");
        let images = ["serial/a:1", "serial/b:1"];
        for (name, image) in [("serial-a", images[0]), ("serial-b", images[1])] {
            create_pod(
                &pods,
                &image_pod(env, name, image, Some("serialcred"), "Always")?,
            )
            .await?;
        }
        let a = wait_running(&pods, "serial-a").await;
        let b = wait_running(&pods, "serial-b").await;
        let events = [
            event_messages(env, "serial-a").await?,
            event_messages(env, "serial-b").await?,
        ];
        let cleanup = (
            delete_pod(&pods, "serial-a").await,
            delete_pod(&pods, "serial-b").await,
        );
        a?;
        b?;
        cleanup.0?;
        cleanup.1?;
        let log = env.agent.plain_log();
        let mut pulls = Vec::new();
        for (image, events) in images.iter().zip(&events) {
            let full = format!("{}/{image}", env.registry.host());
            let found = pull_intervals(&log, &full);
            anyhow::ensure!(found.len() == 1, "pulls of {full}: {found:?}");
            let times = events
                .iter()
                .find(|(r, _)| r == "Pulled")
                .and_then(|(_, m)| pulled_times(m));
            let Some(times) = times else {
                anyhow::bail!("no Pulled event with times: {events:?}");
            };
            pulls.push((found[0], times));
        }
        pulls.sort_by_key(|(p, _)| p.start);
        let (first, (second, (pull, total))) = (pulls[0].0, pulls[1]);
        anyhow::ensure!(
            second.start >= first.end,
            "the second pull started at {} before the first ended at {}",
            second.start,
            first.end
        );
        // The wait for the turn shows in "including waiting" (3 decimals in the message).
        anyhow::ensure!(
            total - pull >= second.waited - 0.005,
            "Pulled {pull}s ({total}s including waiting) hides a {}s wait",
            second.waited
        );
        Ok(())
    })
}

fn service_account_secret(env: &Env) -> Result<()> {
    let _shared = shared_agent();
    block_on(async {
        docker_registry_secret(env, "sacred", PASS)?;
        let _ = env
            .plane
            .kubectl(&["delete", "serviceaccount", "puller", "--ignore-not-found"]);
        env.plane.kubectl(&["create", "serviceaccount", "puller"])?;
        env.plane.kubectl(&[
            "patch",
            "serviceaccount",
            "puller",
            "-p",
            r#"{"imagePullSecrets":[{"name":"sacred"}]}"#,
        ])?;
        let pods: Api<Pod> = Api::namespaced(env.plane.admin_client().await?, "default");
        // No pod-level secret; Always: the registry is asked (with credentials) every time.
        let mut pod = image_pod(env, "sa-pull", "pulled/layered:1", None, "Always")?;
        if let Some(spec) = pod.spec.as_mut() {
            spec.service_account_name = Some("puller".into());
        }
        create_pod(&pods, &pod).await?;
        let running = wait_running(&pods, "sa-pull").await;
        let events = event_messages(env, "sa-pull").await?;
        let cleanup = delete_pod(&pods, "sa-pull").await;
        let _ = env
            .plane
            .kubectl(&["delete", "serviceaccount", "puller", "--ignore-not-found"]);
        let pod = running?;
        cleanup?;
        let secrets: Vec<String> = pod
            .spec
            .and_then(|s| s.image_pull_secrets)
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.name)
            .collect();
        anyhow::ensure!(
            secrets == ["sacred"],
            "the API server copied the service account's secrets: {secrets:?}"
        );
        anyhow::ensure!(
            events
                .iter()
                .any(|(r, m)| r == "Pulled" && m.starts_with("Successfully pulled image")),
            "pulled from the registry with the service account's secret: {events:?}"
        );
        Ok(())
    })
}

/// The plugin's requests so far.
fn plugin_calls(env: &Env) -> Vec<serde_json::Value> {
    std::fs::read_to_string(env.plugin.join("calls"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn service_account_token_provider(env: &Env) -> Result<()> {
    let _shared = shared_agent();
    block_on(async {
        let _ = env
            .plane
            .kubectl(&["delete", "serviceaccount", "tokened", "--ignore-not-found"]);
        env.plane
            .kubectl(&["create", "serviceaccount", "tokened"])?;
        env.plane.kubectl(&[
            "annotate",
            "serviceaccount",
            "tokened",
            &format!("{ROLE_KEY}=puller"),
        ])?;
        let pods: Api<Pod> = Api::namespaced(env.plane.admin_client().await?, "default");
        let pod_of = |name: &str, account: &str| -> Result<Pod> {
            let mut pod = image_pod(env, name, "tokened/layered:1", None, "Always")?;
            if let Some(spec) = pod.spec.as_mut() {
                spec.service_account_name = Some(account.into());
            }
            Ok(pod)
        };
        let image = format!("{}/tokened/layered", env.registry.host());
        let waiting_message = |name: &'static str| {
            let pods = pods.clone();
            async move {
                eventually(
                    &format!("{name} fails to pull"),
                    Duration::from_secs(60),
                    || async {
                        let pod = pods.get(name).await?;
                        Ok(pod
                            .status
                            .and_then(|s| s.container_statuses)
                            .and_then(|c| c.into_iter().next())
                            .and_then(|c| c.state)
                            .and_then(|s| s.waiting)
                            .filter(|w| {
                                matches!(
                                    w.reason.as_deref(),
                                    Some("ErrImagePull" | "ImagePullBackOff")
                                )
                            })
                            .map(|w| w.message.unwrap_or_default()))
                    },
                )
                .await
            }
        };
        let outcome = async {
            // The node audience restriction: without the RBAC grant the API server refuses
            // the token, and the pull's error says so.
            env.plane
                .kubectl(&["delete", "clusterrolebinding", "e2e-registry-audience"])?;
            create_pod(&pods, &pod_of("tokened-0", "tokened")?).await?;
            let refused = waiting_message("tokened-0").await;
            grant_audience(&env.plane, &env.plugin)?;
            let refused = refused?;
            anyhow::ensure!(
                refused.contains("not authorized to request tokens for audience")
                    && refused.contains("Error getting service account token default/tokened"),
                "the API server's refusal in the pull error: {refused:?}"
            );
            anyhow::ensure!(plugin_calls(env).is_empty(), "no token, no plugin run");
            delete_pod(&pods, "tokened-0").await?;
            create_pod(&pods, &pod_of("tokened-1", "tokened")?).await?;
            wait_running(&pods, "tokened-1").await?;
            let calls = plugin_calls(env);
            anyhow::ensure!(calls.len() == 1, "one plugin run: {calls:?}");
            anyhow::ensure!(
                calls[0]["image"] == image.as_str()
                    && calls[0]["serviceAccountAnnotations"] == json!({ ROLE_KEY: "puller" }),
                "the request names the image and the required annotation: {}",
                calls[0]
            );
            let reviewed = std::fs::read_to_string(env.plugin.join("reviewed"))?;
            anyhow::ensure!(
                reviewed.trim() == "tokened-1",
                "the token was bound to the pod: {reviewed:?}"
            );
            // Another pod of the account: credentials from the plugin's cache.
            create_pod(&pods, &pod_of("tokened-2", "tokened")?).await?;
            wait_running(&pods, "tokened-2").await?;
            anyhow::ensure!(plugin_calls(env).len() == 1, "served from the cache");
            // The default account lacks the annotation: no plugin run, no credentials.
            create_pod(&pods, &pod_of("untokened", "default")?).await?;
            let message = waiting_message("untokened").await?;
            anyhow::ensure!(
                message.contains("401") || message.to_lowercase().contains("unauthorized"),
                "the registry's refusal: {message:?}"
            );
            anyhow::ensure!(plugin_calls(env).len() == 1, "the plugin was not run");
            Ok(())
        }
        .await;
        for name in ["tokened-0", "tokened-1", "tokened-2", "untokened"] {
            if pods.get_opt(name).await?.is_some() {
                delete_pod(&pods, name).await?;
            }
        }
        let _ = env
            .plane
            .kubectl(&["delete", "serviceaccount", "tokened", "--ignore-not-found"]);
        outcome
    })
}

fn image_gc_warning(env: &Env) -> Result<()> {
    let _shared = shared_agent();
    block_on(async {
        let events: Api<Event> = Api::namespaced(env.plane.admin_client().await?, "default");
        let selector = format!(
            "involvedObject.kind=Node,involvedObject.name={}",
            env.agent.node_name
        );
        let event = eventually(
            "a FreeDiskSpaceFailed event on the node",
            Duration::from_secs(60),
            || async {
                let list = events
                    .list(&ListParams::default().fields(&selector))
                    .await?;
                Ok(list
                    .items
                    .into_iter()
                    .find(|e| e.reason.as_deref() == Some("FreeDiskSpaceFailed")))
            },
        )
        .await?;
        let message = event.message.unwrap_or_default();
        anyhow::ensure!(
            message.starts_with(
                "Failed to garbage collect required amount of images. Attempted to free "
            ) && message.ends_with(" bytes eligible to free."),
            "{message:?}"
        );
        anyhow::ensure!(event.type_.as_deref() == Some("Warning"));
        anyhow::ensure!(
            event.source.and_then(|s| s.component).as_deref() == Some("kubelet"),
            "from the kubelet"
        );
        Ok(())
    })
}

fn pull_survives_agent_kill(env: &Env) -> Result<()> {
    let _alone = AGENT_KILL.write().unwrap_or_else(|p| p.into_inner());
    // 4 MiB/s: the 24 MiB layer takes 6 s.
    env.proxy.set(ProxySettings {
        bytes_per_sec: Some(4 << 20),
        ..ProxySettings::default()
    });
    let result = block_on(killed_pull(env));
    env.proxy.set(ProxySettings::default());
    result
}

async fn killed_pull(env: &Env) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(env.plane.admin_client().await?, "default");
    let image = format!("{}/big/kill:1", env.proxy.host());
    let mut pod = image_pod(env, "killed-pull", "big/kill:1", None, "IfNotPresent")?;
    if let Some(c) = pod.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.image = Some(image.clone());
    }
    create_pod(&pods, &pod).await?;
    let images = env.agent.root.join("images");
    let partial = eventually("2 MiB of the layer", Duration::from_secs(90), || async {
        let f = dir_sizes(&images.join("ingest"));
        Ok(f.iter().any(|(_, n)| *n >= 2 << 20).then_some(f))
    })
    .await;
    let killed = match partial {
        Ok(partial) => {
            let old = agent_pid(&env.agent).context("the agent does not answer /version")?;
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(old),
                nix::sys::signal::Signal::SIGKILL,
            )
            .context("kill -9 the agent")?;
            env.proxy.set(ProxySettings::default());
            Ok((partial, old))
        }
        Err(e) => Err(e),
    };
    // The image has no program to run (one file, `big`): the pull's end is its event.
    let pulled = match &killed {
        Ok(_) => {
            eventually("the Pulled event", Duration::from_secs(120), || async {
                let events = event_messages(env, "killed-pull").await?;
                Ok(events
                    .iter()
                    .any(|(r, m)| {
                        r == "Pulled"
                            && m.starts_with(&format!("Successfully pulled image \"{image}\""))
                    })
                    .then_some(()))
            })
            .await
        }
        Err(_) => Err(anyhow::anyhow!("not killed")),
    };
    let cleanup = delete_pod(&pods, "killed-pull").await;
    let (partial, old) = killed?;
    pulled?;
    cleanup?;
    anyhow::ensure!(
        agent_pid(&env.agent).is_some_and(|p| p != old),
        "the agent was not restarted"
    );
    // The registry's digests: its manifest, config and layer are the store's blobs.
    for digest in [&env.big.manifest, &env.big.config] {
        let path = images.join("blobs/sha256").join(&digest["sha256:".len()..]);
        anyhow::ensure!(path.exists(), "{digest} not stored");
    }
    let blob = images
        .join("blobs/sha256")
        .join(&env.big.layer["sha256:".len()..]);
    anyhow::ensure!(
        std::fs::metadata(&blob).map(|m| m.len()).ok() == Some(env.big.layer_size),
        "layer blob {blob:?} missing or of the wrong size"
    );
    for (p, _) in &partial {
        anyhow::ensure!(!p.exists(), "{p:?} outlived the restart");
    }
    anyhow::ensure!(
        dir_sizes(&images.join("ingest")).is_empty(),
        "ingest leftovers"
    );
    let tmp: Vec<_> = dir_sizes(&images.join("snapshots"))
        .into_iter()
        .filter(|(p, _)| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("tmp-"))
        })
        .collect();
    anyhow::ensure!(tmp.is_empty(), "snapshot leftovers: {tmp:?}");
    Ok(())
}

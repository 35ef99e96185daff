//! `--rotate-server-certificates` on a real `ironlet run --kubeconfig` joined to a real
//! control plane (`scripts/controlplane`, whose controller-manager signs with the cluster CA,
//! `--cluster-signing-*`, but approves no kubelet-serving request: the test approves as an
//! administrator would). Each test has its own control plane and agent:
//! - the node asks for its serving certificate: one `kubernetes.io/kubelet-serving`
//!   CertificateSigningRequest by `system:node:<name>`, pending, while the node goes on
//!   serving its file certificate (the fallback);
//! - once approved and signed, the node serves exactly the signed certificate (verified
//!   against the cluster CA, subject and SANs as kubelet asks), and `kubectl logs` works with
//!   the API server verifying it (`--kubelet-certificate-authority`);
//! - after an agent restart (SIGHUP) the stored certificate is served again without a new
//!   request;
//! - renewal, for real: the controller-manager signs for [`SHORT_LIFE`]
//!   (`--cluster-signing-duration`; a request's own `expirationSeconds` cannot go below
//!   10 minutes), so the running agent makes a second request between 70 and 90 % of the
//!   first certificate's life, keeps serving the first one while it is pending, and once it
//!   is signed serves the new one from the next TLS handshakes on, never the old one again,
//!   the same agent process, the API server verifying it through the node proxy.
//!
//! Needs root (containers, cgroups, CNI).

mod local;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{bail, ensure, Context, Result};
use base64::Engine as _;
use ironlet_e2e::{
    block_on, create_pod, eventually, routable_host_ip, run_suite, ClusterAgent, ControlPlane,
    SuiteTest,
};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use local::agent_pid;
use serde_json::json;

struct Env {
    plane: ControlPlane,
    agent: ClusterAgent,
    node_ip: std::net::IpAddr,
    scratch: PathBuf,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

const TESTS: &[SuiteTest<()>] = &[
    (
        "the_serving_certificate_is_requested_signed_served_and_kept_across_a_restart",
        |()| with_env(0, None, rotation),
    ),
    (
        "the_serving_certificate_is_renewed_at_70_to_90_percent_of_its_life_and_served_without_a_restart",
        |()| with_env(1, Some(SHORT_LIFE), renewal),
    ),
];

const TIMEOUT: Duration = Duration::from_secs(60);
/// The signer's `--cluster-signing-duration` in the renewal test. The signer also backdates
/// `NotBefore` by [`BACKDATE`], so the certificate's life is 7 minutes of which 5 are past
/// when it is issued: 70–90 % of it falls 0–80 s after the issuance.
const SHORT_LIFE: Duration = Duration::from_secs(120);
const BACKDATE: Duration = Duration::from_secs(300);

fn main() {
    run_suite("kubelet_serving_cert", TESTS, || Ok(()), |()| {});
}

/// Runs `test` against a control plane (signing for `signing`, if given) and an agent of
/// its own; prints their logs when it fails.
fn with_env(index: u32, signing: Option<Duration>, test: fn(&Env) -> Result<()>) -> Result<()> {
    let env = start(index, signing)?;
    let result = test(&env);
    if result.is_err() {
        eprintln!("agent log tail:\n{}", env.agent.log_tail(60));
        eprintln!("control plane logs:\n{}", env.plane.log_tails(20));
    }
    result
}

fn start(index: u32, signing: Option<Duration>) -> Result<Env> {
    let duration = signing.map(|d| format!("{}s", d.as_secs()));
    let plane_env: Vec<(&str, &str)> = duration
        .iter()
        .map(|d| ("IRONLET_CP_SIGNING_DURATION", d.as_str()))
        .collect();
    let plane = ControlPlane::up_with(&plane_env)?;
    let node = format!("e2e-kcert{index}-{}", std::process::id());
    let kubeconfig = plane.node_kubeconfig(&node)?;
    let node_ip = routable_host_ip().context("no routable host address for the node")?;
    let slot = 100 + (std::process::id() + 31 + index) % 150;
    let scratch = std::env::temp_dir().join(format!("kcert-{}-{index}", std::process::id()));
    std::fs::create_dir_all(&scratch).context("creating the scratch dir")?;
    let agent = ClusterAgent::start_on(
        &kubeconfig,
        &node,
        slot,
        &["--rotate-server-certificates".as_ref()],
        node_ip,
    )?;
    Ok(Env {
        plane,
        agent,
        node_ip,
        scratch,
    })
}

/// The node's kubelet port from its status.
async fn node_port(env: &Env) -> Result<u16> {
    let nodes: Api<Node> = Api::all(env.plane.admin_client().await?);
    eventually("the node reports its kubelet port", TIMEOUT, || async {
        let node = nodes.get_opt(&env.agent.node_name).await?;
        let port = node
            .and_then(|n| n.status?.daemon_endpoints?.kubelet_endpoint)
            .map(|e| e.port)
            .filter(|p| *p > 0);
        Ok(port.and_then(|p| u16::try_from(p).ok()))
    })
    .await
}

/// The leaf certificate the node presents, as PEM (`openssl s_client`).
fn served_pem(env: &Env, port: u16) -> Result<String> {
    let out = Command::new("openssl")
        .args(["s_client", "-connect"])
        .arg(format!("{}:{port}", env.node_ip))
        .stdin(std::process::Stdio::null())
        .output()
        .context("running openssl s_client")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let begin = text
        .find("-----BEGIN CERTIFICATE-----")
        .with_context(|| format!("no certificate from the node: {text}"))?;
    let end = text[begin..]
        .find("-----END CERTIFICATE-----")
        .context("a truncated certificate")?;
    Ok(format!(
        "{}\n",
        &text[begin..begin + end + "-----END CERTIFICATE-----".len()]
    ))
}

/// The first PEM certificate of `pem`, normalised (line ends trimmed).
fn first_cert(pem: &str) -> Option<String> {
    let begin = pem.find("-----BEGIN CERTIFICATE-----")?;
    let end = pem[begin..].find("-----END CERTIFICATE-----")?;
    Some(
        pem[begin..begin + end]
            .lines()
            .map(str::trim)
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

fn openssl(args: &[&str], file: &Path) -> Result<String> {
    let out = Command::new("openssl")
        .args(args)
        .arg(file)
        .output()
        .context("running openssl")?;
    ensure!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The node's kubelet-serving requests.
async fn node_csrs(env: &Env) -> Result<Vec<CertificateSigningRequest>> {
    let csrs: Api<CertificateSigningRequest> = Api::all(env.plane.admin_client().await?);
    let user = format!("system:node:{}", env.agent.node_name);
    Ok(csrs
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|c| {
            c.spec.signer_name == "kubernetes.io/kubelet-serving"
                && c.spec.username.as_deref() == Some(user.as_str())
        })
        .collect())
}

fn rotation(env: &Env) -> Result<()> {
    block_on(async {
        let port = node_port(env).await?;
        let csr = eventually("the node's kubelet-serving request", TIMEOUT, || async {
            Ok(node_csrs(env).await?.into_iter().next())
        })
        .await?;
        let name = csr.metadata.name.clone().context("a CSR without name")?;
        let status = csr.status.clone().unwrap_or_default();
        ensure!(
            status.certificate.is_none() && status.conditions.unwrap_or_default().is_empty(),
            "the request is pending: {:?}",
            csr.status
        );
        let usages = csr.spec.usages.clone().unwrap_or_default();
        ensure!(
            usages.iter().any(|u| u == "server auth")
                && usages
                    .iter()
                    .all(|u| ["digital signature", "key encipherment", "server auth"]
                        .contains(&u.as_str())),
            "usages {usages:?}"
        );
        // Pending: the file certificate `scripts/controlplane node` issued is served.
        let file_cert = std::fs::read_to_string(
            env.plane
                .dir()
                .join(format!("pki/node-{}-serving.crt", env.agent.node_name)),
        )
        .context("reading the node's file certificate")?;
        ensure!(
            first_cert(&served_pem(env, port)?) == first_cert(&file_cert),
            "while the request is pending the file certificate is served"
        );

        let want = approve_and_await_served(env, port, &name).await?;

        // Issued by the cluster CA, for the node, naming its address.
        let served = verify_served(env, port)?;
        let text = openssl(&["x509", "-noout", "-text", "-in"], &served)?;
        let cn = format!("CN = system:node:{}", env.agent.node_name);
        ensure!(
            text.contains(&cn) && text.contains("O = system:nodes"),
            "subject: {text}"
        );
        ensure!(
            text.contains(&format!("IP Address:{}", env.node_ip))
                && text.contains(&format!("DNS:{}", env.agent.node_name)),
            "SANs: {text}"
        );

        // The API server verifies it (--kubelet-certificate-authority) for kubectl logs.
        logs_through_the_api(env).await?;

        // Restarted, the agent serves the stored certificate and asks for no other.
        env.agent
            .signal_supervisor(nix::sys::signal::Signal::SIGHUP)?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        eventually(
            "the restarted node serves the signed certificate",
            TIMEOUT,
            || async {
                // (--port 0: the restarted agent's port may differ.)
                let port = node_port(env).await?;
                Ok(served_pem(env, port)
                    .ok()
                    .and_then(|pem| first_cert(&pem))
                    .filter(|c| *c == want)
                    .map(|_| ()))
            },
        )
        .await?;
        let count = node_csrs(env).await?.len();
        ensure!(count == 1, "{count} requests after the restart, not 1");
        Ok(())
    })
}

/// Approves the request `name` as an administrator, awaits its certificate and then the
/// node serving it; the certificate (see [`first_cert`]).
async fn approve_and_await_served(env: &Env, port: u16, name: &str) -> Result<String> {
    env.plane.kubectl(&["certificate", "approve", name])?;
    let csrs: Api<CertificateSigningRequest> = Api::all(env.plane.admin_client().await?);
    let signed = eventually("the request is signed", TIMEOUT, || async {
        let csr = csrs.get(name).await?;
        Ok(csr
            .status
            .and_then(|s| s.certificate)
            .filter(|c| !c.0.is_empty())
            .map(|c| String::from_utf8_lossy(&c.0).into_owned()))
    })
    .await?;
    let want = first_cert(&signed).context("no PEM in the signed request")?;
    // The agent polls its request every second and serves the certificate as soon as it
    // reads it.
    eventually(
        "the node serves the signed certificate",
        Duration::from_secs(10),
        || async {
            Ok((first_cert(&served_pem(env, port)?).as_ref() == Some(&want)).then_some(()))
        },
    )
    .await?;
    Ok(want)
}

/// The served certificate, verified as a server certificate against the cluster CA; the
/// file holding it.
fn verify_served(env: &Env, port: u16) -> Result<PathBuf> {
    let served = env.scratch.join("served.pem");
    std::fs::write(&served, served_pem(env, port)?)?;
    let ca = env.plane.dir().join("pki/ca.crt");
    let ca = ca.to_str().context("CA path")?;
    openssl(&["verify", "-purpose", "sslserver", "-CAfile", ca], &served)?;
    Ok(served)
}

/// `notBefore` and `notAfter` of a certificate from [`first_cert`].
fn validity(cert: &str) -> Result<(SystemTime, SystemTime)> {
    let body: String = cert.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .context("the certificate's base64")?;
    ironlet::server::kubelet_api::x509::validity(&der).context("no validity in the certificate")
}

fn renewal(env: &Env) -> Result<()> {
    block_on(async {
        let port = node_port(env).await?;
        let pid = agent_pid(&env.agent).context("the agent does not answer /version")?;
        let first = eventually("the node's kubelet-serving request", TIMEOUT, || async {
            Ok(node_csrs(env).await?.into_iter().next())
        })
        .await?;
        let first_name = first.metadata.name.clone().context("a CSR without name")?;
        let old = approve_and_await_served(env, port, &first_name).await?;
        let (from, to) = validity(&old)?;
        let life = to.duration_since(from)?;
        ensure!(
            life <= SHORT_LIFE + BACKDATE + Duration::from_secs(1),
            "the signer ignored --cluster-signing-duration: the certificate lives {life:?}"
        );

        // The renewal: a second request, made by the running agent between 70 and 90 % of
        // the first certificate's life (the API's timestamps have whole seconds).
        let earliest = from + life.mul_f64(0.7) - Duration::from_secs(1);
        let latest = from + life.mul_f64(0.9) + Duration::from_secs(5);
        let wait =
            latest.duration_since(SystemTime::now()).unwrap_or_default() + Duration::from_secs(10);
        let second = eventually("the renewal request", wait, || async {
            Ok(node_csrs(env)
                .await?
                .into_iter()
                .find(|c| c.metadata.name.as_deref() != Some(first_name.as_str())))
        })
        .await?;
        let second_name = second.metadata.name.clone().context("a CSR without name")?;
        let created: SystemTime = second
            .metadata
            .creation_timestamp
            .clone()
            .context("a CSR without creation time")?
            .0
            .into();
        ensure!(
            (earliest..=latest).contains(&created),
            "renewal requested at {created:?}, outside 70–90 % of {from:?}..{to:?}"
        );
        ensure!(
            second
                .status
                .clone()
                .unwrap_or_default()
                .certificate
                .is_none(),
            "the renewal request is pending"
        );
        // Pending: the first certificate is still served.
        ensure!(
            first_cert(&served_pem(env, port)?).as_ref() == Some(&old),
            "while the renewal is pending the current certificate is served"
        );

        let new = approve_and_await_served(env, port, &second_name).await?;
        ensure!(new != old, "the renewal returned the same certificate");
        let (new_from, new_to) = validity(&new)?;
        ensure!(
            new_from > from && new_to > to,
            "the new certificate ({new_from:?}..{new_to:?}) is not newer than the old one"
        );
        // From then on, every handshake gets the new certificate, verified by the CA.
        for _ in 0..5 {
            let served = served_pem(env, port)?;
            ensure!(
                first_cert(&served).as_ref() == Some(&new),
                "a handshake after the renewal got {}",
                if first_cert(&served).as_ref() == Some(&old) {
                    "the old certificate"
                } else {
                    "an unknown certificate"
                }
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        verify_served(env, port)?;
        // The API server verifies it too (--kubelet-certificate-authority), through the node
        // proxy.
        let healthz = env.plane.kubectl(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{}/proxy/healthz", env.agent.node_name),
        ])?;
        ensure!(
            healthz.trim() == "ok",
            "healthz through the API server: {healthz}"
        );
        // Stored for a restart, and the same process all along.
        let stored = std::fs::read_to_string(env.agent.root.join("pki/kubelet-server-current.pem"))
            .context("reading the stored certificate")?;
        ensure!(
            first_cert(&stored).as_ref() == Some(&new),
            "the stored certificate is not the new one"
        );
        ensure!(
            agent_pid(&env.agent) == Some(pid),
            "the agent was restarted"
        );
        Ok(())
    })
}

/// A pod printing a line; `kubectl logs` returns it.
async fn logs_through_the_api(env: &Env) -> Result<()> {
    let name = "kcert-logs";
    let pods: Api<Pod> = Api::namespaced(env.plane.admin_client().await?, "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "nodeName": env.agent.node_name,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "busybox",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo served-by-a-rotated-cert; exec sleep 3600"],
            }],
        },
    }))?;
    create_pod(&pods, &pod).await?;
    let result = eventually("kubectl logs through the API server", TIMEOUT, || async {
        match env.plane.kubectl(&["logs", name]) {
            Ok(out) if out.contains("served-by-a-rotated-cert") => Ok(Some(())),
            Ok(_) => Ok(None),
            Err(err) if format!("{err:#}").contains("x509") => bail!("{err:#}"),
            Err(_) => Ok(None),
        }
    })
    .await;
    pods.delete(name, &DeleteParams::default().grace_period(0))
        .await?;
    eventually("the pod is gone", TIMEOUT, || async {
        Ok(pods.get_opt(name).await?.is_none().then_some(()))
    })
    .await?;
    result
}

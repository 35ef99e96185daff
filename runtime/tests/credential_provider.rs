//! kubelet credential provider plugins against a real registry (Debian's docker-registry on
//! loopback, TLS, htpasswd auth): the plugin is a shell script that records each
//! `CredentialProviderRequest` it reads and prints a `CredentialProviderResponse`. A pull
//! refused without the plugin succeeds with it; the response's cache key and duration
//! decide how often the script runs; a plugin that fails or hangs makes the refusal say so;
//! a pod's wrong secret is tried first and the plugin's credentials after it.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ironlet_runtime::image::{
    CredentialProviders, Credentials, ImageError, ImageStore, Keyring, LocalImageService,
    PullConfig, PullRequest,
};
use ironlet_runtime::testkit::registry::{RegistryOptions, TestRegistry};
use ironlet_runtime::testkit::test_images;
use ironlet_runtime::ImageService;

const USER: &str = "plugin-user";
const PASS: &str = "plugin-pass";

/// A registry with busybox and layered pushed (auth on), as `<repo>:1`.
fn registry() -> TestRegistry {
    let reg = TestRegistry::start(RegistryOptions {
        basic_auth: Some((USER.into(), PASS.into())),
        ..RegistryOptions::default()
    })
    .expect("start docker-registry (scripts/install-deps installs it)");
    let images = test_images().unwrap();
    for name in ["busybox", "layered"] {
        reg.push(&images.join(name), &format!("{name}:1"), &[])
            .unwrap();
    }
    reg
}

/// A plugin script in `dir/bin/<name>` and its config: every run appends its request
/// (one line) and its arguments and `$GREETING` to `dir/calls`, then prints `response`
/// (after `pre`, shell run first).
struct Plugin {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Plugin {
    fn new(match_images: &[&str], default_cache: &str, pre: &str, response: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("pull2-plugin-")
            .tempdir()
            .unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let calls = dir.path().join("calls");
        let script = format!(
            "#!/bin/sh\nreq=$(cat)\necho \"$req args=$* greeting=$GREETING\" >> {calls}\n{pre}\n\
             cat <<'EOF'\n{response}\nEOF\n",
            calls = calls.display()
        );
        let path = bin.join("test-plugin");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let config = dir.path().join("config.yaml");
        let matches: Vec<String> = match_images.iter().map(|m| format!("\"{m}\"")).collect();
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
                 - name: test-plugin\n  matchImages: [{}]\n  defaultCacheDuration: {default_cache}\n  \
                 apiVersion: credentialprovider.kubelet.k8s.io/v1\n  args: [get-credentials, --verbose]\n  \
                 env: [{{name: GREETING, value: hello}}]\n",
                matches.join(", ")
            ),
        )
        .unwrap();
        Self { dir, config }
    }

    fn providers(&self, timeout: Duration) -> Arc<CredentialProviders> {
        Arc::new(
            CredentialProviders::load(&self.config, &self.dir.path().join("bin"))
                .unwrap()
                .with_exec_timeout(timeout),
        )
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// A v1 response giving the registry's credentials (`password`) under `auth_key`.
fn response(cache_key: &str, duration: Option<&str>, auth_key: &str, password: &str) -> String {
    let mut r = serde_json::json!({
        "kind": "CredentialProviderResponse",
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "cacheKeyType": cache_key,
        "auth": {auth_key: {"username": USER, "password": password}},
    });
    if let Some(d) = duration {
        r["cacheDuration"] = d.into();
    }
    r.to_string()
}

fn service(
    reg: &TestRegistry,
    root: &Path,
    providers: Option<Arc<CredentialProviders>>,
    node_keyring: Keyring,
) -> LocalImageService {
    LocalImageService::with_pull_config(
        Arc::new(ImageStore::open(root).unwrap()),
        PullConfig {
            credential_providers: providers,
            node_keyring,
            ..reg.pull_config(&reg.host()).unwrap()
        },
    )
}

async fn pull(svc: &LocalImageService, reg: &TestRegistry, repo: &str) -> Result<(), ImageError> {
    svc.pull_image(&format!("{}/{repo}:1", reg.host()), PullRequest::default())
        .await
        .map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_refused_without_credentials_succeeds_with_the_plugin_and_its_registry_cache_holds()
{
    let reg = registry();
    let host = reg.host();
    let tmp = tempfile::tempdir().unwrap();
    let without = service(&reg, tmp.path(), None, Keyring::default());
    let err = pull(&without, &reg, "busybox").await.unwrap_err();
    assert!(matches!(err, ImageError::Unauthorized { .. }), "{err:?}");

    // Registry key, 5 minutes: one run serves every repository of the registry.
    let port = host.rsplit_once(':').unwrap().1;
    let plugin = Plugin::new(
        &[&format!("127.0.0.*:{port}"), "other.example"],
        "0s",
        "",
        &response("Registry", Some("5m"), &host, PASS),
    );
    let svc = service(
        &reg,
        tmp.path(),
        Some(plugin.providers(Duration::from_secs(30))),
        Keyring::default(),
    );
    pull(&svc, &reg, "busybox").await.unwrap();
    pull(&svc, &reg, "layered").await.unwrap();
    let calls = plugin.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let (request, rest) = calls[0].split_once(" args=").unwrap();
    let request: serde_json::Value = serde_json::from_str(request).unwrap();
    assert_eq!(
        request,
        serde_json::json!({"kind": "CredentialProviderRequest",
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
            "image": format!("{host}/busybox")})
    );
    assert_eq!(rest, "get-credentials --verbose greeting=hello");
    assert!(svc
        .get_image(&format!("{host}/layered:1"))
        .await
        .unwrap()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_keys_zero_durations_and_expiry_decide_how_often_the_plugin_runs() {
    let reg = registry();
    let host = reg.host();
    let runs = |key: &str, duration: Option<&str>, default: &str| {
        Plugin::new(&[&host], default, "", &response(key, duration, &host, PASS))
    };
    // (cacheKeyType, cacheDuration, defaultCacheDuration, runs for busybox, busybox, layered)
    let cases = [
        ("Image", None, "10m", 2),
        ("Image", Some("0s"), "10m", 3),
        ("Global", None, "0s", 3),
        ("Global", None, "10m", 1),
        ("Registry", Some("1h"), "0s", 1),
    ];
    for (key, duration, default, want) in cases {
        let plugin = runs(key, duration, default);
        let tmp = tempfile::tempdir().unwrap();
        let svc = service(
            &reg,
            tmp.path(),
            Some(plugin.providers(Duration::from_secs(30))),
            Keyring::default(),
        );
        for repo in ["busybox", "busybox", "layered"] {
            pull(&svc, &reg, repo).await.unwrap();
        }
        assert_eq!(
            plugin.calls().len(),
            want,
            "{key} {duration:?} default {default}"
        );
    }
    // An entry expires: 4 s later the plugin runs again (4 s: a loaded machine's pull
    // must not outlast it).
    let plugin = runs("Registry", Some("4s"), "0s");
    let tmp = tempfile::tempdir().unwrap();
    let svc = service(
        &reg,
        tmp.path(),
        Some(plugin.providers(Duration::from_secs(30))),
        Keyring::default(),
    );
    let started = Instant::now();
    pull(&svc, &reg, "busybox").await.unwrap();
    pull(&svc, &reg, "busybox").await.unwrap();
    assert_eq!(plugin.calls().len(), 1);
    let expired = Duration::from_millis(4200).saturating_sub(started.elapsed());
    tokio::time::sleep(expired).await;
    pull(&svc, &reg, "busybox").await.unwrap();
    assert_eq!(plugin.calls().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_pod_secret_and_a_wrong_node_config_are_tried_before_the_plugins_answer() {
    let reg = registry();
    let host = reg.host();
    let plugin = Plugin::new(&[&host], "1m", "", &response("Image", None, &host, PASS));
    let wrong = |name: &str| {
        let mut ring = Keyring::default();
        ring.add(
            &host,
            Credentials {
                username: name.into(),
                password: "wrong".into(),
            },
        );
        ring
    };
    let tmp = tempfile::tempdir().unwrap();
    // The node's config.json and the plugin make one keyring (kubelet's default keyring).
    let svc = service(
        &reg,
        tmp.path(),
        Some(plugin.providers(Duration::from_secs(30))),
        wrong("node"),
    );
    let report = svc
        .pull_image(
            &format!("{host}/busybox:1"),
            PullRequest {
                keyring: wrong("pod"),
                ..PullRequest::default()
            },
        )
        .await
        .unwrap();
    assert!(report.led);
    // The plugin is not asked about images it does not match.
    let other = Plugin::new(
        &["*.example.com"],
        "1m",
        "",
        &response("Image", None, &host, PASS),
    );
    let svc = service(
        &reg,
        tmp.path(),
        Some(other.providers(Duration::from_secs(30))),
        Keyring::default(),
    );
    let err = pull(&svc, &reg, "layered").await.unwrap_err();
    assert!(matches!(err, ImageError::Unauthorized { .. }), "{err:?}");
    assert!(other.calls().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_hanging_or_confused_plugin_gives_no_credentials_and_the_refusal_says_why() {
    let reg = registry();
    let host = reg.host();
    let good = response("Image", None, &host, PASS);
    let pidfile = tempfile::NamedTempFile::new().unwrap();
    let cases = [
        (
            "echo 'no token for you' >&2; exit 3".to_owned(),
            good.clone(),
            "error execing credential provider plugin test-plugin for image",
            "exit status: 3, stderr: no token for you",
        ),
        (
            // A child of the script holds stdout: the whole process group must go.
            format!("sleep 30 & echo $! > {}; wait", pidfile.path().display()),
            good.clone(),
            "test-plugin",
            "timed out after 1s",
        ),
        (
            String::new(),
            good.replace(
                "credentialprovider.kubelet.k8s.io/v1",
                "credentialprovider.kubelet.k8s.io/v1beta1",
            ),
            "did not match expected apiVersion:credentialprovider.kubelet.k8s.io/v1",
            "actual apiVersion:credentialprovider.kubelet.k8s.io/v1beta1",
        ),
        (
            String::new(),
            good.replace("Image", "Pod"),
            "did not return a valid cacheKeyType",
            "\"Pod\"",
        ),
        (
            String::new(),
            "not json".to_owned(),
            "error decoding the response of credential provider plugin test-plugin",
            "expected ident",
        ),
    ];
    for (pre, response, want1, want2) in cases {
        let plugin = Plugin::new(&[&host], "1m", &pre, &response);
        let tmp = tempfile::tempdir().unwrap();
        let svc = service(
            &reg,
            tmp.path(),
            Some(plugin.providers(Duration::from_secs(1))),
            Keyring::default(),
        );
        let started = Instant::now();
        let err = pull(&svc, &reg, "busybox").await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10), "{pre}");
        assert!(matches!(err, ImageError::Unauthorized { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(want1) && text.contains(want2), "{text}");
        // Errors are not cached: the plugin runs again.
        let _ = pull(&svc, &reg, "busybox").await;
        assert_eq!(plugin.calls().len(), 2, "{pre}");
    }
    // The hanging plugin's child was killed with it.
    let pid = std::fs::read_to_string(pidfile.path()).unwrap();
    let pid = pid.trim();
    assert!(!pid.is_empty());
    let deadline = Instant::now() + Duration::from_secs(5);
    while Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    {
        assert!(Instant::now() < deadline, "sleep {pid} outlived the plugin");
        std::thread::sleep(Duration::from_millis(50));
    }
}

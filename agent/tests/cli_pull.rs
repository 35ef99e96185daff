//! `ironlet images pull` end to end against a real registry (Debian's docker-registry on
//! loopback, TLS from a test CA given with `--registry-config`, htpasswd auth): plain
//! progress lines and the pulled image in `images ls`; a wrong password fails with the
//! registry's refusal and a non-zero exit. Credentials from a kubelet credential provider
//! plugin (a shell script) through `--image-credential-provider-config`/`-bin-dir`, and
//! a bad plugin config refused by `images pull` and `run` before anything starts. A pull
//! `kill -9`ed in the middle of a large layer (a throttling relay in front of the registry)
//! registers nothing, and the next pull removes its staging and gets the same digests. A
//! pull into a data root on a small, full tmpfs fails with "no space left on device",
//! leaves nothing, and succeeds once space is freed.

use std::process::{Command, Output};

use ironlet_runtime::testkit::registry::{dir_sizes, RegistryOptions, TestRegistry};

fn ironlet(root: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ironlet"))
        .arg("--root-dir")
        .arg(root)
        .args(args)
        .output()
        .expect("ironlet runs")
}

/// `dir/registries.yaml` trusting `reg`'s CA at `host` (the registry's, or a relay's).
fn registries_yaml(dir: &std::path::Path, host: &str, reg: &TestRegistry) -> std::path::PathBuf {
    let path = dir.join("registries.yaml");
    std::fs::write(
        &path,
        format!(
            "configs:\n  \"{host}\":\n    tls:\n      ca_file: {}\n",
            reg.ca_file().display()
        ),
    )
    .unwrap();
    path
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn images_pull_prints_progress_lines_and_the_image_is_listed_and_a_wrong_password_fails() {
    let reg = TestRegistry::start(RegistryOptions {
        basic_auth: Some(("cli".into(), "cli-pass".into())),
        ..RegistryOptions::default()
    })
    .expect("start docker-registry");
    let images = ironlet_runtime::testkit::test_images().expect("test images");
    reg.push(&images.join("layered"), "cli/layered:2", &[])
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let config = registries_yaml(root.path(), &reg.host(), &reg);
    let reference = format!("{}/cli/layered:2", reg.host());
    let config = config.to_string_lossy().into_owned();
    let pull = |creds: &str| {
        ironlet(
            root.path(),
            &[
                "images",
                "pull",
                "--registry-config",
                &config,
                "--creds",
                creds,
                &reference,
            ],
        )
    };
    let bad = pull("cli:wrong");
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("authorization failed"),
        "{}",
        text(&bad.stderr)
    );
    let out = pull("cli:cli-pass");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].contains("4 layers"), "{stdout}");
    assert_eq!(
        lines.iter().filter(|l| l.contains(": pulled ")).count(),
        4,
        "{stdout}"
    );
    assert!(
        lines
            .last()
            .unwrap()
            .starts_with(&format!("pulled {reference} sha256:")),
        "{stdout}"
    );
    let ls = ironlet(root.path(), &["images", "ls"]);
    let listed = text(&ls.stdout);
    let row: Vec<&str> = listed
        .lines()
        .find(|l| l.contains("cli/layered"))
        .unwrap_or_else(|| panic!("not listed: {listed}"))
        .split_whitespace()
        .collect();
    // REPOSITORY TAG IMAGE-ID SIZE, the size in human units.
    assert_eq!(row.len(), 4, "{row:?}");
    assert_eq!(row[1], "2");
    assert!(row[3].ends_with('B') && row[3] != "0B", "{row:?}");
}

/// A plugin script answering with `password` for the registry, counting its runs in
/// `dir/calls`, and its CredentialProviderConfig in `dir/config.yaml`.
fn credential_plugin(dir: &std::path::Path, host: &str, user: &str, password: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let response = serde_json::json!({
        "kind": "CredentialProviderResponse",
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "cacheKeyType": "Registry",
        "auth": {host: {"username": user, "password": password}},
    });
    let script = format!(
        "#!/bin/sh\ncat >> {calls}\necho >> {calls}\ncat <<'EOF'\n{response}\nEOF\n",
        calls = dir.join("calls").display()
    );
    std::fs::write(bin.join("loopback-creds"), script).unwrap();
    std::fs::set_permissions(
        bin.join("loopback-creds"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(
        dir.join("config.yaml"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
             - name: loopback-creds\n  matchImages: [\"{host}\"]\n  defaultCacheDuration: 1m\n  \
             apiVersion: credentialprovider.kubelet.k8s.io/v1\n"
        ),
    )
    .unwrap();
}

#[test]
fn images_pull_gets_credentials_from_a_credential_provider_plugin_and_a_bad_config_is_named() {
    let reg = TestRegistry::start(RegistryOptions {
        basic_auth: Some(("cli".into(), "plugin-pass".into())),
        ..RegistryOptions::default()
    })
    .expect("start docker-registry");
    let images = ironlet_runtime::testkit::test_images().expect("test images");
    reg.push(&images.join("busybox"), "cli/busybox:1", &[])
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let registries = registries_yaml(root.path(), &reg.host(), &reg);
    let plugin = tempfile::Builder::new()
        .prefix("pull2-cli-plugin-")
        .tempdir()
        .unwrap();
    credential_plugin(plugin.path(), &reg.host(), "cli", "plugin-pass");
    let reference = format!("{}/cli/busybox:1", reg.host());
    let registries = registries.to_string_lossy().into_owned();
    let pull = |extra: &[&str]| {
        let mut args = vec!["images", "pull", "--registry-config", &registries];
        args.extend_from_slice(extra);
        args.push(&reference);
        ironlet(root.path(), &args)
    };
    let refused = pull(&[]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("authorization failed"),
        "{}",
        text(&refused.stderr)
    );
    let config = plugin.path().join("config.yaml");
    let bin = plugin.path().join("bin");
    let (config_s, bin_s) = (config.to_string_lossy(), bin.to_string_lossy());
    let out = pull(&[
        "--image-credential-provider-config",
        &config_s,
        "--image-credential-provider-bin-dir",
        &bin_s,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let calls = std::fs::read_to_string(plugin.path().join("calls")).unwrap();
    assert!(
        calls.contains(&format!("\"image\":\"{}/cli/busybox\"", reg.host())),
        "{calls}"
    );
    // A missing binary, or the config without the bin dir: refused before any pull.
    let missing = pull(&[
        "--image-credential-provider-config",
        &config_s,
        "--image-credential-provider-bin-dir",
        "/nonexistent",
    ]);
    assert!(!missing.status.success());
    let err = text(&missing.stderr);
    assert!(
        err.contains("failed to register credential provider plugins")
            && err.contains("/nonexistent/loopback-creds"),
        "{err}"
    );
    let alone = pull(&["--image-credential-provider-config", &config_s]);
    assert!(!alone.status.success());
    assert!(
        text(&alone.stderr).contains("--image-credential-provider-bin-dir"),
        "{}",
        text(&alone.stderr)
    );
}

#[test]
fn run_with_a_bad_credential_provider_config_exits_before_starting() {
    let dir = tempfile::Builder::new()
        .prefix("pull2-cli-run-")
        .tempdir()
        .unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders: []\n",
    )
    .unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let root = dir.path().join("root");
    let out = Command::new(env!("CARGO_BIN_EXE_ironlet"))
        .arg("--root-dir")
        .arg(&root)
        .arg("run")
        .arg("--pod-manifest-path")
        .arg(&manifests)
        .arg("--image-credential-provider-config")
        .arg(&config)
        .arg("--image-credential-provider-bin-dir")
        .arg(dir.path())
        .output()
        .expect("ironlet runs");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("at least 1 item in plugins is required") && err.contains("config.yaml"),
        "{err}"
    );
    assert!(!root.exists(), "nothing started: no data root made");
}

fn tmp_snapshots(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    dir_sizes(&root.join("images/snapshots"))
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("tmp-"))
        })
        .collect()
}

#[test]
fn a_pull_killed_in_the_middle_of_a_layer_registers_nothing_and_the_next_one_cleans_up_and_completes(
) {
    use ironlet_runtime::testkit::proxy::{ProxySettings, TcpProxy};
    use std::time::{Duration, Instant};
    let reg = TestRegistry::start(RegistryOptions::default()).expect("start docker-registry");
    let work = tempfile::Builder::new()
        .prefix("pull2-kill-")
        .tempdir()
        .unwrap();
    let big = ironlet_runtime::testkit::registry::make_large_layout(
        &work.path().join("big"),
        24 << 20,
        3,
    )
    .unwrap();
    reg.push(&work.path().join("big"), "big:1", &["--preserve-digests"])
        .unwrap();
    // 4 MiB/s: the layer takes 6 s, time enough to kill the pull in its middle.
    let proxy = TcpProxy::start(
        &reg.host(),
        ProxySettings {
            bytes_per_sec: Some(4 << 20),
            ..ProxySettings::default()
        },
    )
    .unwrap();
    let root = work.path().join("root");
    let config = registries_yaml(work.path(), &proxy.host(), &reg);
    let reference = format!("{}/big:1", proxy.host());
    let pull_cmd = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ironlet"));
        c.arg("--root-dir")
            .arg(&root)
            .args(["images", "pull", "--registry-config"])
            .arg(&config)
            .arg(&reference);
        c
    };
    let mut child = pull_cmd()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ingest = root.join("images/ingest");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if dir_sizes(&ingest).iter().any(|(_, n)| *n >= 2 << 20) {
            break;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the pull ended before it could be killed: {status}");
        }
        assert!(Instant::now() < deadline, "no layer bytes arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // In the middle of the layer: a partial blob and an unfinished snapshot are left…
    let partial = dir_sizes(&ingest);
    assert!(
        partial.iter().any(|(_, n)| *n > 0 && *n < big.layer_size),
        "{partial:?}"
    );
    let unfinished = tmp_snapshots(&root);
    assert!(!unfinished.is_empty(), "no snapshot was being unpacked");
    // …but nothing is registered.
    let layer_blob = root
        .join("images/blobs/sha256")
        .join(&big.layer["sha256:".len()..]);
    assert!(!layer_blob.exists());
    let ls = ironlet(&root, &["images", "ls", "-q"]);
    assert_eq!(text(&ls.stdout), "", "no image after the killed pull");

    proxy.set(ProxySettings::default());
    let out = pull_cmd().output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!("manifest {}", big.manifest)),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .last()
            .is_some_and(|l| l.starts_with(&format!("pulled {reference} {}", big.config))),
        "{stdout}"
    );
    assert_eq!(
        std::fs::metadata(&layer_blob).map(|m| m.len()).ok(),
        Some(big.layer_size)
    );
    // The killed pull's staging went at the next start; the new pull left none.
    assert_eq!(dir_sizes(&ingest), []);
    assert_eq!(tmp_snapshots(&root), Vec::<std::path::PathBuf>::new());
    for (p, _) in partial {
        assert!(!p.exists(), "{p:?} outlived the next pull");
    }
    let ls = ironlet(&root, &["images", "ls", "-q"]);
    assert_eq!(text(&ls.stdout).trim(), big.config);
}

#[test]
fn a_pull_into_a_full_data_root_fails_with_no_space_left_and_succeeds_once_space_is_freed() {
    use ironlet_runtime::testkit::smallfs::SmallFs;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipping: needs root to mount a small tmpfs");
        return;
    }
    let reg = TestRegistry::start(RegistryOptions::default()).expect("start docker-registry");
    let work = tempfile::tempdir().unwrap();
    let big =
        ironlet_runtime::testkit::registry::make_large_layout(&work.path().join("big"), 6 << 20, 5)
            .unwrap();
    reg.push(&work.path().join("big"), "big:1", &["--preserve-digests"])
        .unwrap();
    let config = registries_yaml(work.path(), &reg.host(), &reg);
    let fs = SmallFs::mount(20 << 20).unwrap();
    let root = fs.path().join("root");
    let reference = format!("{}/big:1", reg.host());
    let config = config.to_string_lossy().into_owned();
    let pull = || {
        ironlet(
            &root,
            &["images", "pull", "--registry-config", &config, &reference],
        )
    };
    // The blob and the unpacked layer need 12 MiB.
    fs.fill_leaving(8 << 20).unwrap();
    let out = pull();
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("pulling {reference}"))
            && stderr.contains("no space left on device"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let ls = ironlet(&root, &["images", "ls", "-q"]);
    assert_eq!(text(&ls.stdout), "", "no image after the failed pull");
    assert_eq!(dir_sizes(&root.join("images/ingest")), []);
    assert_eq!(dir_sizes(&root.join("images/snapshots")), []);
    assert_eq!(
        dir_sizes(&root.join("images/blobs/sha256")),
        [],
        "no blob: not the layer's, not the config or manifest"
    );
    fs.free_filler().unwrap();
    let out = pull();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ls = ironlet(&root, &["images", "ls", "-q"]);
    assert_eq!(text(&ls.stdout).trim(), big.config);
    let layer_blob = root
        .join("images/blobs/sha256")
        .join(&big.layer["sha256:".len()..]);
    assert_eq!(
        std::fs::metadata(&layer_blob).map(|m| m.len()).ok(),
        Some(big.layer_size)
    );
}

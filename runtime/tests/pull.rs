//! Pulls against a real registry (Debian's docker-registry on loopback, TLS from a test CA,
//! htpasswd basic auth), filled with skopeo from the test images: single- and multi-arch,
//! gzip/zstd/uncompressed layers, wrong passwords, tampered and truncated blobs, shared
//! layers and concurrent pulls; a connection cut in the middle of a blob (a relay in front
//! of the registry) resumed with a Range request, the digest checked over the whole blob; a store on a small full tmpfs (the blob, or the unpacked layer, runs
//! out of space); a registry requiring a client certificate (mutual TLS); containerd's
//! `certs.d/<host>/hosts.toml` as the registry config; a registry that comes up late or
//! drops the first connections (the first request retried).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ironlet_runtime::image::{
    Credentials, ImageError, ImageStore, Keyring, LocalImageService, PlatformSpec, PullConfig,
    PullRequest, RegistriesConfig,
};
use ironlet_runtime::testkit::proxy::{ProxySettings, TcpProxy};
use ironlet_runtime::testkit::registry::{
    make_empty_files_layout, make_large_layout, make_multi_arch_layout, LargeImage,
    RegistryOptions, TestRegistry,
};
use ironlet_runtime::testkit::smallfs::SmallFs;
use ironlet_runtime::testkit::test_images;
use ironlet_runtime::ImageService;

const USER: &str = "puller";
const PASS: &str = "right-password";

fn registry(auth: bool) -> TestRegistry {
    TestRegistry::start(RegistryOptions {
        basic_auth: auth.then(|| (USER.to_owned(), PASS.to_owned())),
        ..RegistryOptions::default()
    })
    .expect("start docker-registry (scripts/install-deps installs it)")
}

fn service(reg: &TestRegistry, root: &Path) -> LocalImageService {
    let yaml = format!(
        "configs:\n  \"{}\":\n    tls:\n      ca_file: {}\n",
        reg.host(),
        reg.ca_file().display()
    );
    let registries = RegistriesConfig::parse(&yaml, Path::new("test.yaml")).unwrap();
    let store = Arc::new(ImageStore::open(root).unwrap());
    LocalImageService::with_pull_config(
        store,
        PullConfig {
            registries,
            ..PullConfig::default()
        },
    )
}

/// A registry holding `image` (a test image) as `name:1`, an empty store and its service,
/// and the reference to pull.
fn pushed(auth: bool, image: &str) -> (TestRegistry, tempfile::TempDir, LocalImageService, String) {
    let reg = registry(auth);
    reg.push(
        &test_images().unwrap().join(image),
        &format!("{image}:1"),
        &[],
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let svc = service(&reg, tmp.path());
    let reference = format!("{}/{image}:1", reg.host());
    (reg, tmp, svc, reference)
}

/// A relay with `settings` in front of `reg`, an empty store whose service pulls through
/// it, and the reference of `repo_tag` through the relay.
fn proxied(
    reg: &TestRegistry,
    settings: ProxySettings,
    repo_tag: &str,
) -> (TcpProxy, tempfile::TempDir, LocalImageService, String) {
    let proxy = TcpProxy::start(&reg.host(), settings).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let svc = LocalImageService::with_pull_config(
        Arc::new(ImageStore::open(tmp.path()).unwrap()),
        reg.pull_config(&proxy.host()).unwrap(),
    );
    let reference = format!("{}/{repo_tag}", proxy.host());
    (proxy, tmp, svc, reference)
}

/// A registry that requires a client certificate, holding busybox as `busybox:1`, and
/// busybox's layout.
fn mutual_tls_busybox() -> (TestRegistry, std::path::PathBuf) {
    let reg = TestRegistry::start(RegistryOptions {
        client_auth: true,
        ..RegistryOptions::default()
    })
    .expect("start docker-registry with client certificates required");
    let layout = test_images().unwrap().join("busybox");
    reg.push(&layout, "busybox:1", &[]).unwrap();
    (reg, layout)
}

fn creds(reg: &TestRegistry, password: &str) -> PullRequest {
    let mut keyring = Keyring::default();
    keyring.add(
        &reg.host(),
        Credentials {
            username: USER.into(),
            password: password.into(),
        },
    );
    PullRequest {
        keyring,
        ..PullRequest::default()
    }
}

/// The image id the same layout gets when imported (the reference result).
fn imported_id(layout: &Path) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let store = ImageStore::open(tmp.path()).unwrap();
    store.import(layout).unwrap()[0].id.clone()
}

/// No staging leftovers and no snapshot or blob beyond what the index references.
fn assert_clean_staging(root: &Path) {
    let ingest: Vec<_> = std::fs::read_dir(root.join("ingest"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(ingest.is_empty(), "ingest leftovers: {ingest:?}");
    let tmp: Vec<_> = std::fs::read_dir(root.join("snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tmp-"))
        .collect();
    assert!(tmp.is_empty(), "snapshot leftovers: {tmp:?}");
}

/// After a failed busybox pull: no image, no layer blob, no staging leftovers.
async fn assert_busybox_not_registered(svc: &LocalImageService, root: &Path) {
    assert!(svc.list_images().await.unwrap().is_empty());
    let blob = root.join("blobs/sha256").join(busybox_layer_hex());
    assert!(!blob.exists(), "{blob:?} was stored");
    assert_clean_staging(root);
}

fn blob_count(root: &Path) -> usize {
    std::fs::read_dir(root.join("blobs/sha256"))
        .unwrap()
        .count()
}

/// The (only) layer digest of busybox's manifest in the registry.
fn busybox_layer_hex() -> String {
    let layout = test_images().unwrap().join("busybox");
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let m = index["manifests"][0]["digest"].as_str().unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("blobs/sha256").join(&m[7..])).unwrap())
            .unwrap();
    manifest["layers"][0]["digest"].as_str().unwrap()[7..].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_arch_image_is_pulled_over_tls_with_basic_auth_and_matches_the_import() {
    let reg = registry(true);
    let layout = test_images().unwrap().join("busybox");
    reg.push(&layout, "busybox:1", &[]).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let svc = service(&reg, tmp.path());
    let reference = format!("{}/busybox:1", reg.host());
    let report = svc.pull_image(&reference, creds(&reg, PASS)).await.unwrap();
    assert_eq!(report.image.id, imported_id(&layout));
    assert_eq!(report.layers_fetched, 1);
    let got = svc
        .get_image(&reference)
        .await
        .unwrap()
        .expect("pulled image is listed");
    assert_eq!(got.id, report.image.id);
    assert!(got
        .repo_digests
        .iter()
        .any(|d| d.ends_with(&report.manifest)));
    // The layer really is unpacked: busybox is in a snapshot.
    let snaps: Vec<_> = std::fs::read_dir(tmp.path().join("snapshots"))
        .unwrap()
        .flatten()
        .collect();
    assert!(snaps
        .iter()
        .any(|s| s.path().join("fs/bin/busybox").is_file()));
    // Its content is synced after the pull (one syncfs), then marked durable: a snapshot of
    // an earlier boot without that mark is unpacked again (unit tests of `snapshot.rs`).
    let snapshot = snaps
        .iter()
        .find(|s| s.path().join("fs/bin/busybox").is_file())
        .unwrap()
        .path();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !snapshot.join("durable").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{snapshot:?} not marked durable 30 s after the pull"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_clean_staging(tmp.path());
    // Pulled, so an Always policy re-pulls it; an import of the same name is local again.
    assert!(svc.is_pulled(&reference).await.unwrap());
    svc.import(&layout).await.unwrap();
    assert!(!svc.is_pulled("busybox:latest").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_fails_with_an_authorization_error_and_stores_nothing() {
    let (reg, tmp, svc, reference) = pushed(true, "busybox");
    let err = svc
        .pull_image(&reference, creds(&reg, "wrong"))
        .await
        .unwrap_err();
    assert!(matches!(err, ImageError::Unauthorized { .. }), "{err:?}");
    assert_eq!(err.kubelet_reason(), "ErrImagePull");
    assert!(err.to_string().contains(&reg.host()), "{err}");
    let anonymous = svc
        .pull_image(&reference, PullRequest::default())
        .await
        .unwrap_err();
    assert!(
        matches!(anonymous, ImageError::Unauthorized { .. }),
        "{anonymous:?}"
    );
    assert!(svc.list_images().await.unwrap().is_empty());
    assert_eq!(blob_count(tmp.path()), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_arch_index_yields_the_nodes_platform_or_the_one_asked_for() {
    let reg = registry(false);
    let work = tempfile::tempdir().unwrap();
    let multi = make_multi_arch_layout(
        &test_images().unwrap().join("busybox"),
        &work.path().join("multi"),
    )
    .unwrap();
    reg.push(&work.path().join("multi"), "multi:1", &["--all"])
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let svc = service(&reg, tmp.path());
    let reference = format!("{}/multi:1", reg.host());
    let host = svc
        .pull_image(&reference, PullRequest::default())
        .await
        .unwrap();
    assert_eq!(host.image.id, multi.host_config);
    let other = svc
        .pull_image(
            &reference,
            PullRequest {
                platform: Some(PlatformSpec::parse(&multi.other_platform).unwrap()),
                ..PullRequest::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(other.image.id, multi.other_config);
    // Same layers: the second platform fetched nothing.
    assert_eq!(other.layers_fetched, 0);
    let none = svc
        .pull_image(
            &reference,
            PullRequest {
                platform: Some(PlatformSpec::parse("linux/s390x").unwrap()),
                ..PullRequest::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(none, ImageError::NoMatchingPlatform { .. }),
        "{none:?}"
    );
    // By index digest too.
    let by_digest = format!("{}/multi@{}", reg.host(), multi.index_digest);
    let r = svc
        .pull_image(&by_digest, PullRequest::default())
        .await
        .unwrap();
    assert_eq!(r.image.id, multi.host_config);
    assert!(svc.get_image(&by_digest).await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_and_uncompressed_layers_unpack_to_the_same_image() {
    let reg = registry(false);
    let layout = test_images().unwrap().join("layered");
    let want = imported_id(&layout);
    reg.push(
        &layout,
        "zstd:1",
        &["--dest-compress-format", "zstd", "--dest-compress"],
    )
    .unwrap();
    reg.push(&layout, "plain:1", &["--dest-decompress"])
        .unwrap();
    for (tag, media) in [("zstd:1", "zstd"), ("plain:1", ".tar")] {
        let tmp = tempfile::tempdir().unwrap();
        let svc = service(&reg, tmp.path());
        let report = svc
            .pull_image(&format!("{}/{tag}", reg.host()), PullRequest::default())
            .await
            .unwrap();
        assert_eq!(report.image.id, want, "{tag}");
        assert_eq!(report.layers_fetched, 4, "{tag}");
        let manifest = std::fs::read_to_string(
            tmp.path()
                .join("blobs/sha256")
                .join(&report.manifest["sha256:".len()..]),
        )
        .unwrap();
        assert!(manifest.contains(media), "{tag}: {manifest}");
        assert_clean_staging(tmp.path());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_layers_are_not_fetched_again() {
    let reg = registry(false);
    let images = test_images().unwrap();
    reg.push(&images.join("busybox"), "busybox:1", &[]).unwrap();
    reg.push(&images.join("layered"), "layered:1", &[]).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let svc = service(&reg, tmp.path());
    svc.pull_image(&format!("{}/busybox:1", reg.host()), PullRequest::default())
        .await
        .unwrap();
    let layered = svc
        .pull_image(&format!("{}/layered:1", reg.host()), PullRequest::default())
        .await
        .unwrap();
    assert_eq!((layered.layers_fetched, layered.layers_reused), (3, 1));
    // Pulling again fetches no layer at all.
    let again = svc
        .pull_image(&format!("{}/layered:1", reg.host()), PullRequest::default())
        .await
        .unwrap();
    assert_eq!((again.layers_fetched, again.bytes_fetched), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pulls_of_one_image_share_one_download() {
    let (_reg, _tmp, svc, reference) = pushed(false, "layered");
    let pulls: Vec<_> = (0..4)
        .map(|_| {
            let svc = svc.clone();
            let reference = reference.clone();
            tokio::spawn(async move { svc.pull_image(&reference, PullRequest::default()).await })
        })
        .collect();
    let mut reports = Vec::new();
    for p in pulls {
        reports.push(p.await.unwrap().unwrap());
    }
    let leaders = reports.iter().filter(|r| r.led).count();
    let fetched: usize = reports
        .iter()
        .filter(|r| r.led)
        .map(|r| r.layers_fetched)
        .sum();
    assert_eq!(leaders, 1, "exactly one pull downloads");
    assert_eq!(fetched, 4);
    assert!(reports.iter().all(|r| r.image.id == reports[0].image.id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_blob_is_refused_and_nothing_is_registered() {
    let (reg, tmp, svc, reference) = pushed(false, "busybox");
    let data = reg.blob_file(&busybox_layer_hex());
    let whole = std::fs::read(&data).unwrap();
    // Near the start the decompressor or the tar reader fails long before the last byte
    // arrives; in the middle, often too; the digest is the error reported either way.
    for at in [64, whole.len() / 16, whole.len() / 2] {
        let mut bytes = whole.clone();
        bytes[at] ^= 0xff;
        std::fs::write(&data, &bytes).unwrap();
        let err = svc
            .pull_image(&reference, PullRequest::default())
            .await
            .unwrap_err();
        assert!(
            matches!(err, ImageError::DigestMismatch { .. }),
            "byte {at}: {err:?}"
        );
        assert!(err.to_string().contains(&busybox_layer_hex()), "{err}");
        assert_busybox_not_registered(&svc, tmp.path()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_download_registers_nothing_and_a_repull_gets_identical_digests() {
    let (reg, tmp, svc, reference) = pushed(false, "busybox");
    let data = reg.blob_file(&busybox_layer_hex());
    let whole = std::fs::read(&data).unwrap();
    // The registry serves half the blob and ends the response: a dropped connection.
    std::fs::write(&data, &whole[..whole.len() / 2]).unwrap();
    let err = svc
        .pull_image(&reference, PullRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.kubelet_reason(), "ErrImagePull", "{err}");
    assert_busybox_not_registered(&svc, tmp.path()).await;
    std::fs::write(&data, &whole).unwrap();
    let report = svc
        .pull_image(&reference, PullRequest::default())
        .await
        .unwrap();
    assert_eq!(
        report.image.id,
        imported_id(&test_images().unwrap().join("busybox"))
    );
    assert!(tmp
        .path()
        .join("blobs/sha256")
        .join(busybox_layer_hex())
        .exists());
}

/// The back-off of a pull's first request (remote.rs `CONNECT_RETRIES`): 0.25 + 0.5 + 1 + 2 s.
const CONNECT_BACKOFF: Duration = Duration::from_millis(3750);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_registry_fails_the_pull_with_its_endpoint_named() {
    let (mut reg, _tmp, svc, reference) = pushed(false, "busybox");
    reg.stop();
    let started = Instant::now();
    let err = svc
        .pull_image(&reference, PullRequest::default())
        .await
        .unwrap_err();
    // Tried again through the whole back-off before giving up.
    assert!(
        started.elapsed() >= CONNECT_BACKOFF,
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, ImageError::Registry { .. }), "{err:?}");
    assert!(err.to_string().contains(&reg.host()), "{err}");
    assert!(err.to_string().contains("Connection refused"), "{err}");
    reg.restart().unwrap();
    svc.pull_image(&reference, PullRequest::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_comes_up_late_is_waited_for_within_the_same_pull() {
    let (mut reg, tmp, svc, reference) = pushed(false, "busybox");
    reg.stop();
    // Back 0.5 s after the pull starts: its first tries are refused, a later one connects.
    let restarted = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        reg.restart().map(|()| reg)
    });
    let report = svc
        .pull_image(&reference, PullRequest::default())
        .await
        .unwrap();
    let _reg = restarted.join().unwrap().unwrap();
    assert_eq!(report.layers_fetched, 1);
    assert!(svc.is_pulled(&reference).await.unwrap());
    assert_clean_staging(tmp.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_dropped_before_any_byte_are_retried_within_the_same_pull() {
    let reg = registry(false);
    reg.push(&test_images().unwrap().join("busybox"), "busybox:1", &[])
        .unwrap();
    // The registry's port accepts and closes the first two connections (a TLS handshake
    // that gets EOF): the pull's first request fails twice, then goes through.
    let settings = ProxySettings {
        drop_first: 2,
        ..ProxySettings::default()
    };
    let (proxy, _tmp, svc, reference) = proxied(&reg, settings, "busybox:1");
    let report = svc
        .pull_image(&reference, PullRequest::default())
        .await
        .unwrap();
    assert_eq!(proxy.dropped(), 2);
    assert_eq!(report.layers_fetched, 1);
    assert_eq!(
        report.image.id,
        imported_id(&test_images().unwrap().join("busybox"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pull_reuses_the_registry_connection_of_the_previous_pull() {
    let reg = registry(false);
    reg.push(&test_images().unwrap().join("layered"), "layered:1", &[])
        .unwrap();
    let (proxy, _tmp, svc, reference) = proxied(&reg, ProxySettings::default(), "layered:1");
    let cold = svc
        .pull_image(&reference, PullRequest::default())
        .await
        .unwrap();
    assert!(cold.layers_fetched > 0);
    let opened = proxy.connections();
    assert!(opened > 0);
    // The `Always` pulls that follow (manifest unchanged) go over the kept connection: no
    // new TCP connection, no new TLS handshake.
    for _ in 0..3 {
        let warm = svc
            .pull_image(&reference, PullRequest::default())
            .await
            .unwrap();
        assert_eq!(warm.layers_fetched, 0);
        assert_eq!(warm.image.id, cold.image.id);
    }
    assert_eq!(
        proxy.connections(),
        opened,
        "a warm pull opened a connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_with_wrong_credentials_never_joins_one_with_the_right_ones() {
    let (reg, _tmp, svc, reference) = pushed(true, "layered");
    let right = {
        let (svc, reference, req) = (svc.clone(), reference.clone(), creds(&reg, PASS));
        tokio::spawn(async move { svc.pull_image(&reference, req).await })
    };
    let wrong = {
        let (svc, reference, req) = (svc.clone(), reference.clone(), creds(&reg, "wrong"));
        tokio::spawn(async move { svc.pull_image(&reference, req).await })
    };
    assert!(right.await.unwrap().is_ok());
    let err = wrong.await.unwrap().unwrap_err();
    assert!(matches!(err, ImageError::Unauthorized { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_that_is_down_falls_back_and_a_rewrite_maps_the_repository() {
    let reg = registry(false);
    let layout = test_images().unwrap().join("busybox");
    reg.push(&layout, "hub/busybox:1", &[]).unwrap();
    // Port 1 on loopback refuses connections: the first mirror is down.
    let yaml = format!(
        "mirrors:\n  example.invalid:\n    endpoint: [\"https://127.0.0.1:1\", \"https://{host}\"]\n    \
         rewrite: {{\"^library/(.*)\": \"hub/$1\"}}\n\
         configs:\n  \"{host}\":\n    tls:\n      ca_file: {ca}\n",
        host = reg.host(),
        ca = reg.ca_file().display()
    );
    let registries = RegistriesConfig::parse(&yaml, Path::new("test.yaml")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let svc = LocalImageService::with_pull_config(
        Arc::new(ImageStore::open(tmp.path()).unwrap()),
        PullConfig {
            registries,
            ..PullConfig::default()
        },
    );
    let reference = "example.invalid/library/busybox:1";
    let started = Instant::now();
    let report = svc
        .pull_image(reference, PullRequest::default())
        .await
        .unwrap();
    // A mirror that refuses is left at once (no back-off: the next endpoint is the retry).
    assert!(
        started.elapsed() < CONNECT_BACKOFF,
        "{:?}",
        started.elapsed()
    );
    assert_eq!(report.image.id, imported_id(&layout));
    assert!(svc.get_image(reference).await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_in_the_middle_of_a_blob_is_resumed_and_the_whole_blob_verified() {
    let reg = registry(false);
    let work = tempfile::tempdir().unwrap();
    let big = make_large_layout(&work.path().join("big"), 8 << 20, 7).unwrap();
    reg.push(&work.path().join("big"), "big:1", &["--preserve-digests"])
        .unwrap();
    // The first connection to carry 2 MiB is cut: the manifest and config are small, so
    // the cut lands in the layer blob.
    let cut = ProxySettings {
        cut_once_after: Some(2 << 20),
        ..ProxySettings::default()
    };
    let proxy = TcpProxy::start(&reg.host(), cut).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let svc = LocalImageService::with_pull_config(
        Arc::new(ImageStore::open(tmp.path()).unwrap()),
        reg.pull_config(&proxy.host()).unwrap(),
    );
    let reference = format!("{}/big:1", proxy.host());
    let hex = &big.layer["sha256:".len()..];
    // A byte of the registry's blob past the cut is flipped: only the resumed response
    // carries it, and the digest over the whole blob catches it.
    let data = reg.blob_file(hex);
    let whole = std::fs::read(&data).unwrap();
    let mut tampered = whole.clone();
    tampered[6 << 20] ^= 0xff;
    std::fs::write(&data, &tampered).unwrap();
    let err = svc
        .pull_image(&reference, PullRequest::default())
        .await
        .unwrap_err();
    assert_eq!(proxy.cuts(), 1);
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err:?}");
    assert!(err.to_string().contains(hex), "{err}");
    assert!(svc.list_images().await.unwrap().is_empty());
    assert!(!tmp.path().join("blobs/sha256").join(hex).exists());
    assert_clean_staging(tmp.path());

    // The registry's blob as pushed, cut once again: one pull, resumed, not restarted.
    std::fs::write(&data, &whole).unwrap();
    proxy.set(cut);
    let relayed_before = proxy.bytes_down();
    let report = svc
        .pull_image(&reference, PullRequest::default())
        .await
        .unwrap();
    assert_eq!(proxy.cuts(), 2, "the connection was cut in this pull too");
    let relayed = proxy.bytes_down() - relayed_before;
    assert!(
        relayed < big.layer_size + (1 << 20),
        "{relayed} bytes relayed for a {} byte blob: the download restarted",
        big.layer_size
    );
    assert_eq!(report.image.id, big.config);
    assert_eq!(report.manifest, big.manifest);
    assert_eq!(report.bytes_fetched, big.layer_size);
    let blob = tmp.path().join("blobs/sha256").join(hex);
    assert_eq!(sha256_file(&blob), hex, "the stored blob is the registry's");
    assert_clean_staging(tmp.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_containerd_hosts_dir_gives_the_mirror_its_ca_and_client_certificate() {
    let (reg, layout) = mutual_tls_busybox();
    // containerd's layout: certs.d/<registry>/hosts.toml. example.invalid is served by the
    // test registry as its mirror, whose CA (relative to the host's directory) and client
    // certificate the file names; the registry itself would not resolve.
    let certs_d = tempfile::tempdir().unwrap();
    let host_dir = certs_d.path().join("example.invalid");
    std::fs::create_dir_all(&host_dir).unwrap();
    std::fs::copy(reg.ca_file(), host_dir.join("mirror-ca.crt")).unwrap();
    let write_hosts = |client: bool| {
        let client = if client {
            format!(
                "  client = [\"{}\", \"{}\"]\n",
                reg.client_cert_file().display(),
                reg.client_key_file().display()
            )
        } else {
            String::new()
        };
        std::fs::write(
            host_dir.join("hosts.toml"),
            format!(
                "server = \"https://example.invalid\"\n\n[host.\"https://{}\"]\n  \
                 capabilities = [\"pull\", \"resolve\"]\n  ca = \"mirror-ca.crt\"\n{client}",
                reg.host()
            ),
        )
        .unwrap();
    };
    let pull = |root: &Path| {
        let registries = RegistriesConfig::load(certs_d.path()).unwrap();
        let svc = LocalImageService::with_pull_config(
            Arc::new(ImageStore::open(root).unwrap()),
            PullConfig {
                registries,
                ..PullConfig::default()
            },
        );
        async move {
            svc.pull_image("example.invalid/busybox:1", PullRequest::default())
                .await
        }
    };
    // Without `client` the mirror refuses the handshake (and the registry itself does not
    // exist): the hosts file is what was read.
    write_hosts(false);
    let tmp = tempfile::tempdir().unwrap();
    let err = pull(tmp.path()).await.unwrap_err();
    assert!(matches!(err, ImageError::Registry { .. }), "{err:?}");
    write_hosts(true);
    let report = pull(tmp.path()).await.unwrap();
    assert_eq!(report.image.id, imported_id(&layout));
    assert_eq!(report.layers_fetched, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_requiring_a_client_certificate_is_pulled_from_with_cert_file_and_key_file() {
    let (reg, layout) = mutual_tls_busybox();
    let reference = format!("{}/busybox:1", reg.host());
    // Trusting the registry's CA is not enough: the TLS handshake fails without a
    // client certificate.
    let tmp = tempfile::tempdir().unwrap();
    let svc = service(&reg, tmp.path());
    let err = svc
        .pull_image(&reference, PullRequest::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ImageError::Registry { .. }), "{err:?}");
    assert!(err.to_string().contains(&reg.host()), "{err}");
    assert_eq!(blob_count(tmp.path()), 0);
    // registries.yaml's configs.<host>.tls.cert_file/key_file.
    let tmp = tempfile::tempdir().unwrap();
    let svc = LocalImageService::with_pull_config(
        Arc::new(ImageStore::open(tmp.path()).unwrap()),
        reg.pull_config(&reg.host()).unwrap(),
    );
    let report = svc
        .pull_image(&reference, PullRequest::default())
        .await
        .unwrap();
    assert_eq!(report.image.id, imported_id(&layout));
    assert_eq!(report.layers_fetched, 1);
    assert_clean_staging(tmp.path());
}

/// Pulls `reference` (one layer, `image`) into `svc`'s store on `fs` with `free` bytes
/// left: it must fail with a disk-full error naming a path under `expect_under`, leave
/// no image, blob, snapshot or staging and give all the space back; with the filler gone
/// the same pull must succeed and store the registry's blob.
async fn full_then_freed(
    fs: &SmallFs,
    svc: &LocalImageService,
    reference: &str,
    image: &LargeImage,
    free: u64,
    expect_under: &Path,
) {
    let root = fs.path().join("store");
    let blobs_before = blob_count(&root);
    let snapshots_before = std::fs::read_dir(root.join("snapshots")).unwrap().count();
    fs.fill_leaving(free).unwrap();
    let before = fs.available().unwrap();
    let err = svc
        .pull_image(reference, PullRequest::default())
        .await
        .unwrap_err();
    let ImageError::DiskFull { path } = &err else {
        panic!("{reference}: not a disk-full error: {err:?}");
    };
    assert!(path.starts_with(expect_under), "{reference}: {err}");
    assert!(err.to_string().contains("no space left on device"), "{err}");
    assert_eq!(err.kubelet_reason(), "ErrImagePull");
    // Nothing registered, no new blob (layer, config, manifest) or snapshot, no staging,
    // and all the space given back.
    assert!(svc.get_image(reference).await.unwrap().is_none());
    assert_eq!(blob_count(&root), blobs_before, "{reference}");
    let snapshots = std::fs::read_dir(root.join("snapshots")).unwrap().count();
    assert_eq!(snapshots, snapshots_before, "{reference}");
    assert_clean_staging(&root);
    let after = fs.available().unwrap();
    assert!(
        after + (64 << 10) >= before,
        "{reference}: the failed pull kept {} bytes",
        before - after
    );
    fs.free_filler().unwrap();
    let report = svc
        .pull_image(reference, PullRequest::default())
        .await
        .unwrap();
    assert_eq!(report.image.id, image.config);
    assert_eq!(report.manifest, image.manifest);
    let blob = root
        .join("blobs/sha256")
        .join(&image.layer["sha256:".len()..]);
    assert_eq!(
        format!("sha256:{}", sha256_file(&blob)),
        image.layer,
        "the stored blob is the registry's"
    );
    assert_clean_staging(&root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_into_a_full_disk_fails_naming_it_leaves_nothing_and_succeeds_once_space_is_freed() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipping: needs root to mount a small tmpfs");
        return;
    }
    let reg = registry(false);
    let work = tempfile::tempdir().unwrap();
    // 8 MiB of data: the store needs the blob and the unpacked file, 16 MiB; the unpacked
    // file runs out first (the unpacker writes bigger pieces).
    let big = make_large_layout(&work.path().join("big"), 8 << 20, 11).unwrap();
    reg.push(&work.path().join("big"), "big:1", &["--preserve-digests"])
        .unwrap();
    // 6144 empty files: a 3 MiB blob, nothing to store unpacked but inodes: the blob
    // download runs out.
    let empty = make_empty_files_layout(&work.path().join("empty"), 6144).unwrap();
    reg.push(
        &work.path().join("empty"),
        "empty:1",
        &["--preserve-digests"],
    )
    .unwrap();
    let fs = SmallFs::mount(24 << 20).unwrap();
    let root = fs.path().join("store");
    let svc = LocalImageService::with_pull_config(
        Arc::new(ImageStore::open(&root).unwrap()),
        reg.pull_config(&reg.host()).unwrap(),
    );
    let host = reg.host();
    full_then_freed(
        &fs,
        &svc,
        &format!("{host}/empty:1"),
        &empty,
        2 << 20,
        &root.join("ingest"),
    )
    .await;
    full_then_freed(&fs, &svc, &format!("{host}/big:1"), &big, 12 << 20, &root).await;
}

fn sha256_file(path: &Path) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut std::fs::File::open(path).unwrap(), &mut h).unwrap();
    hex::encode(h.finalize())
}

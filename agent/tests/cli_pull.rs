//! `ironlet images pull` end to end against a real registry (Debian's docker-registry on
//! loopback, TLS from a test CA given with `--registry-config`, htpasswd auth): plain
//! progress lines and the pulled image in `images ls`; a wrong password fails with the
//! registry's refusal and a non-zero exit.

use std::process::{Command, Output};

use ironlet_runtime::testkit::registry::{RegistryOptions, TestRegistry};

fn ironlet(root: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ironlet"))
        .arg("--root-dir")
        .arg(root)
        .args(args)
        .output()
        .expect("ironlet runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn images_pull_prints_progress_lines_and_the_image_is_listed_and_a_wrong_password_fails() {
    let reg = TestRegistry::start(RegistryOptions {
        basic_auth: Some(("cli".into(), "cli-pass".into())),
    })
    .expect("start docker-registry");
    let images = ironlet_runtime::testkit::test_images().expect("test images");
    reg.push(&images.join("layered"), "cli/layered:2", &[])
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("registries.yaml");
    std::fs::write(
        &config,
        format!(
            "configs:\n  \"{}\":\n    tls:\n      ca_file: {}\n",
            reg.host(),
            reg.ca_file().display()
        ),
    )
    .unwrap();
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

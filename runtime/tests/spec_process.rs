//! Generated specs, process part: the Kubernetes command/args table, the environment merge,
//! the working directory, rlimits, and user resolution against the rootfs's `/etc/passwd` and
//! `/etc/group` (including one symlinked out of the rootfs). No container runs here; see
//! `spec_runc.rs` for that.

mod spec_support;

use anyhow::{Context, Result};
use ironlet_runtime::spec::{build_spec, SandboxNamespaces, SpecError};
use ironlet_runtime::types::ImageConfig;
use spec_support::*;

// ---- process args: the Kubernetes command/args table ----

#[test]
fn image_entrypoint_and_cmd_run_when_neither_command_nor_args_is_set() -> Result<()> {
    let spec = build(&container("c"), &image())?;
    assert_eq!(
        args_of(&spec),
        strings(&["/bin/sh", "-c", "echo image-cmd"])
    );
    Ok(())
}

#[test]
fn command_replaces_the_entrypoint_and_the_image_cmd_is_not_used() -> Result<()> {
    let mut c = container("c");
    c.command = strings(&["/bin/echo", "hi"]);
    let spec = build(&c, &image())?;
    assert_eq!(args_of(&spec), strings(&["/bin/echo", "hi"]));
    Ok(())
}

#[test]
fn args_replace_the_image_cmd_and_keep_the_entrypoint() -> Result<()> {
    let mut c = container("c");
    c.args = strings(&["echo from-args"]);
    let spec = build(&c, &image())?;
    assert_eq!(
        args_of(&spec),
        strings(&["/bin/sh", "-c", "echo from-args"])
    );
    Ok(())
}

#[test]
fn command_and_args_together_ignore_the_image() -> Result<()> {
    let mut c = container("c");
    c.command = strings(&["/bin/echo"]);
    c.args = strings(&["a", "b"]);
    let spec = build(&c, &image())?;
    assert_eq!(args_of(&spec), strings(&["/bin/echo", "a", "b"]));
    Ok(())
}

#[test]
fn no_command_anywhere_is_an_error_naming_the_container() {
    let img = ImageConfig::default();
    let err = build(&container("lonely"), &img).expect_err("no command");
    assert!(
        matches!(err, SpecError::NoCommand { ref container } if container == "lonely"),
        "{err}"
    );
}

// ---- env and cwd ----

#[test]
fn container_env_overrides_image_env_in_place_and_new_keys_come_last() -> Result<()> {
    let mut c = container("c");
    c.env = vec![
        ("SHARED".into(), "container".into()),
        ("NEW".into(), "1".into()),
        ("NEW".into(), "2".into()),
    ];
    let spec = build(&c, &image())?;
    assert_eq!(
        env_of(&spec),
        strings(&[
            "PATH=/usr/local/bin:/usr/bin:/bin",
            "HOSTNAME=pod-a",
            "IMAGE_ONLY=1",
            "SHARED=container",
            "NEW=2",
        ])
    );
    Ok(())
}

#[test]
fn a_default_path_is_set_when_neither_image_nor_container_sets_one() -> Result<()> {
    let img = ImageConfig {
        cmd: strings(&["/bin/true"]),
        ..Default::default()
    };
    let spec = build(&container("c"), &img)?;
    assert_eq!(
        env_of(&spec)[0],
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    );
    Ok(())
}

#[test]
fn an_env_name_with_an_equals_sign_is_rejected() {
    let mut c = container("c");
    c.env = vec![("A=B".into(), "x".into())];
    let err = build(&c, &image()).expect_err("bad env");
    assert!(
        matches!(err, SpecError::InvalidValue { field: "env", .. }),
        "{err}"
    );
}

#[test]
fn working_dir_comes_from_the_container_then_the_image_then_root() -> Result<()> {
    let mut img = image();
    assert_eq!(
        build(&container("c"), &img)?
            .process()
            .as_ref()
            .map(|p| p.cwd().clone()),
        Some("/".into())
    );
    img.working_dir = Some("/srv".into());
    assert_eq!(
        build(&container("c"), &img)?
            .process()
            .as_ref()
            .map(|p| p.cwd().clone()),
        Some("/srv".into())
    );
    let mut c = container("c");
    c.working_dir = Some("/work".into());
    assert_eq!(
        build(&c, &img)?.process().as_ref().map(|p| p.cwd().clone()),
        Some("/work".into())
    );
    Ok(())
}

#[test]
fn process_has_containerd_rlimit_no_terminal_and_the_oom_score() -> Result<()> {
    let mut c = container("c");
    c.resources.oom_score_adj = Some(999);
    let spec = build(&c, &image())?;
    let process = spec.process().as_ref().context("process")?;
    assert_eq!(process.terminal(), Some(false));
    assert_eq!(process.oom_score_adj(), Some(999));
    assert_eq!(process.no_new_privileges(), Some(true));
    let rlimits = process.rlimits().clone().unwrap_or_default();
    assert_eq!(rlimits.len(), 1);
    assert_eq!(rlimits[0].soft(), rlimits[0].hard());
    // 1048576 like containerd, unless this host's agent cannot raise its own limit (see the
    // unit tests of build.rs for both cases).
    assert!(
        rlimits[0].hard() <= 1_048_576 && rlimits[0].hard() >= 1024,
        "{rlimits:?}"
    );
    Ok(())
}

#[test]
fn allow_privilege_escalation_leaves_no_new_privileges_out() -> Result<()> {
    let mut c = container("c");
    c.security.no_new_privs = false;
    let spec = build(&c, &image())?;
    // Absent, not false: libcontainer loads seccomp while still privileged only then.
    assert_eq!(
        spec.process().as_ref().and_then(|p| p.no_new_privileges()),
        None
    );
    Ok(())
}

// ---- user resolution ----

#[test]
fn no_user_anywhere_runs_as_root_with_roots_groups() -> Result<()> {
    let spec = build(&container("c"), &image())?;
    // root's own group 0 plus video (44), which lists root.
    assert_eq!(user_of(&spec), (0, 0, vec![0, 44]));
    Ok(())
}

#[test]
fn run_as_user_takes_the_gid_and_groups_of_its_passwd_entry() -> Result<()> {
    let mut c = container("c");
    c.security.run_as_user = Some(1000);
    let spec = build(&c, &image())?;
    // app's primary 1000 and audio (29); the group named "app" that lists app is its primary.
    assert_eq!(user_of(&spec), (1000, 1000, vec![29, 1000]));
    Ok(())
}

#[test]
fn run_as_user_and_group_are_taken_as_given_and_supplemental_groups_merge_sorted() -> Result<()> {
    let mut c = container("c");
    c.security.run_as_user = Some(1000);
    c.security.run_as_group = Some(3000);
    c.security.supplemental_groups = vec![5000, 29, 4000];
    let spec = build(&c, &image())?;
    assert_eq!(user_of(&spec), (1000, 3000, vec![29, 3000, 4000, 5000]));
    Ok(())
}

#[test]
fn image_user_by_name_resolves_uid_and_gid_from_the_rootfs() -> Result<()> {
    let mut img = image();
    img.user = Some("app".into());
    let spec = build(&container("c"), &img)?;
    assert_eq!(user_of(&spec), (1000, 1000, vec![29, 1000]));
    Ok(())
}

#[test]
fn image_user_uid_colon_gid_is_taken_literally() -> Result<()> {
    let mut img = image();
    img.user = Some("1234:5678".into());
    let spec = build(&container("c"), &img)?;
    assert_eq!(user_of(&spec), (1234, 5678, vec![5678]));
    Ok(())
}

#[test]
fn image_user_name_colon_group_resolves_both_names() -> Result<()> {
    let mut img = image();
    img.user = Some("app:audio".into());
    let spec = build(&container("c"), &img)?;
    assert_eq!(user_of(&spec), (1000, 29, vec![29]));
    Ok(())
}

#[test]
fn an_unknown_numeric_uid_gets_gid_zero() -> Result<()> {
    let mut img = image();
    img.user = Some("4242".into());
    let spec = build(&container("c"), &img)?;
    assert_eq!(user_of(&spec), (4242, 0, vec![0]));
    Ok(())
}

#[test]
fn an_unknown_user_name_is_an_error_naming_the_image_user() {
    let mut img = image();
    img.user = Some("nobody-here".into());
    let err = build(&container("c"), &img).expect_err("unknown user");
    assert!(
        matches!(err, SpecError::UnknownUser { field: "image USER", ref name } if name == "nobody-here"),
        "{err}"
    );
}

#[test]
fn an_unknown_group_name_is_an_error() {
    let mut img = image();
    img.user = Some("app:wheel".into());
    let err = build(&container("c"), &img).expect_err("unknown group");
    assert!(
        matches!(err, SpecError::UnknownGroup { ref name, .. } if name == "wheel"),
        "{err}"
    );
}

#[test]
fn run_as_group_without_run_as_user_is_rejected_as_containerd_does() {
    let mut c = container("c");
    c.security.run_as_group = Some(10);
    let err = build(&c, &image()).expect_err("group only");
    assert!(
        matches!(
            err,
            SpecError::InvalidUser {
                field: "security.run_as_group",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_malformed_image_user_is_rejected() {
    for user in ["a:b:c", ":1", "1:"] {
        let mut img = image();
        img.user = Some(user.into());
        let err = build(&container("c"), &img).expect_err(user);
        assert!(
            matches!(err, SpecError::InvalidUser { .. }),
            "{user}: {err}"
        );
    }
}

#[test]
fn an_etc_passwd_symlinked_outside_the_rootfs_is_not_followed() -> Result<()> {
    let outside = tempfile::tempdir()?;
    let host_passwd = spec_support::outside_file(
        outside.path(),
        "passwd",
        "evil:x:0:0::/:/bin/sh\napp:x:7777:7777::/:/bin/sh\n",
    )?;
    let rootfs = Rootfs::minimal()?;
    let etc_passwd = rootfs.path().join("etc/passwd");
    std::fs::remove_file(&etc_passwd)?;
    std::os::unix::fs::symlink(&host_passwd, &etc_passwd)?;
    let ns = SandboxNamespaces::default();

    let mut img = image();
    img.user = Some("evil".into());
    let c = container("c");
    let err =
        build_spec(&inputs(&c, &img, rootfs.path(), &ns)).expect_err("host user must not resolve");
    assert!(matches!(err, SpecError::UnknownUser { .. }), "{err}");

    img.user = Some("7777".into());
    let spec = build_spec(&inputs(&c, &img, rootfs.path(), &ns))?;
    assert_eq!(user_of(&spec).1, 0, "gid must not come from the host file");
    Ok(())
}

//! The conformance harness's stand-ins for upstream's test images
//! (`tests/conformance/images.py`) behave as upstream's where the suite depends on it.
//!
//! Their busybox shell keeps environment variables whose names are not shell names
//! (`data-1`, `p-data-1`: ConfigMap and Secret keys through `envFrom`), as upstream's busybox
//! image does; Debian's busybox drops them, and the ConfigMap and Secret "should be consumable
//! via the environment" specs failed. The test runs the images' very busybox binary on the
//! host (`images.py --busybox`), with no container: cheap, and it fails if the stand-ins lose
//! such variables again. Needs python3 and Debian's busybox-static (`scripts/install-deps`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};

fn standin_busybox(dir: &Path) -> Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the workspace root")?;
    // busybox picks its applet from its own name: the file must be called busybox.
    let busybox = dir.join("busybox");
    let out = Command::new("python3")
        .arg(root.join("tests/conformance/images.py"))
        .arg("--busybox")
        .arg(&busybox)
        .output()
        .context("running tests/conformance/images.py --busybox")?;
    ensure!(
        out.status.success(),
        "images.py --busybox failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(busybox)
}

/// What `busybox sh -c SCRIPT` prints with only `vars` in its environment.
fn shell_output(busybox: &Path, script: &str, vars: &[(&str, &str)]) -> Result<String> {
    let out = Command::new(busybox)
        .args(["sh", "-c", script])
        .env_clear()
        .envs(vars.iter().copied())
        .output()
        .with_context(|| format!("running {} sh -c {script:?}", busybox.display()))?;
    ensure!(
        out.status.success(),
        "sh -c {script:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn the_standin_busybox_shell_passes_on_variables_whose_names_are_not_shell_names() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let busybox = standin_busybox(dir.path())?;
    let vars = [
        ("data-1", "value-1"),
        ("p-data-1", "value-1"),
        ("a.b", "dotted"),
        ("DATA_2", "value-2"),
    ];
    // `sh -c env` (the specs' command: ash execs env), `env` as the shell's own applet
    // while the shell goes on, and a shell started by a shell.
    for script in ["env", "env; true", "sh -c env"] {
        let printed = shell_output(&busybox, script, &vars)?;
        let lines: Vec<&str> = printed.lines().collect();
        for (name, value) in vars {
            let line = format!("{name}={value}");
            ensure!(
                lines.contains(&line.as_str()),
                "sh -c {script:?} lost {line}; it printed:\n{printed}"
            );
        }
    }
    Ok(())
}

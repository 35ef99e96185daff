//! The process's argv, environment and working directory, with Kubernetes semantics:
//!
//! | command | args | runs |
//! |---|---|---|
//! | — | — | image entrypoint + image cmd |
//! | set | — | command (image cmd is *not* used) |
//! | — | set | image entrypoint + args |
//! | set | set | command + args |
//!
//! An image entrypoint of `[""]` counts as none (Docker's way to reset it). The environment is
//! containerd's: a default `PATH`, then `HOSTNAME`, then the image's, then the container's; a later
//! value replaces an earlier one in place (so a key keeps the position of its first appearance),
//! and an image entry without `=` unsets the key.

use crate::types::{ContainerConfig, ImageConfig};

use super::SpecError;

/// The `PATH` a container gets when neither the image nor the container sets one
/// (containerd's `defaultUnixEnv`).
pub(crate) const DEFAULT_PATH_ENV: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// argv of the container's process.
pub(crate) fn args(
    container: &ContainerConfig,
    image: &ImageConfig,
) -> Result<Vec<String>, SpecError> {
    let mut command = container.command.clone();
    let mut args = container.args.clone();
    if command.is_empty() {
        if args.is_empty() {
            args = image.cmd.clone();
        }
        let entrypoint_reset = image.entrypoint.len() == 1 && image.entrypoint[0].is_empty();
        if !entrypoint_reset {
            command = image.entrypoint.clone();
        }
    }
    command.extend(args);
    if command.is_empty() || command[0].is_empty() {
        return Err(SpecError::NoCommand {
            container: container.name.clone(),
        });
    }
    for arg in &command {
        if arg.contains('\0') {
            return Err(SpecError::invalid(
                "command/args",
                arg.clone(),
                "contains a NUL byte",
            ));
        }
    }
    Ok(command)
}

/// The merged environment, as `KEY=VALUE` strings.
pub(crate) fn env(
    container: &ContainerConfig,
    image: &ImageConfig,
    hostname: &str,
) -> Result<Vec<String>, SpecError> {
    let mut env = Env::default();
    env.apply(DEFAULT_PATH_ENV);
    env.apply(&format!("HOSTNAME={hostname}"));
    if container.tty {
        // As containerd does for a container with a terminal; the image or pod may override it.
        env.apply("TERM=xterm");
    }
    for entry in &image.env {
        if entry.contains('\0') || entry.starts_with('=') || entry.is_empty() {
            return Err(SpecError::invalid(
                "image env",
                entry.clone(),
                "is not KEY=VALUE",
            ));
        }
        env.apply(entry);
    }
    for (key, value) in &container.env {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            return Err(SpecError::invalid(
                "env",
                key.clone(),
                "is not a valid variable name",
            ));
        }
        if value.contains('\0') {
            return Err(SpecError::invalid(
                "env",
                key.clone(),
                "value contains a NUL byte",
            ));
        }
        env.apply(&format!("{key}={value}"));
    }
    Ok(env.entries)
}

/// An ordered environment where a later value replaces an earlier one in place.
#[derive(Default)]
struct Env {
    entries: Vec<String>,
}

impl Env {
    fn apply(&mut self, entry: &str) {
        let key = entry.split_once('=').map_or(entry, |(k, _)| k);
        let position = self
            .entries
            .iter()
            .position(|e| e.split_once('=').map_or(e.as_str(), |(k, _)| k) == key);
        match (position, entry.contains('=')) {
            (Some(i), true) => self.entries[i] = entry.to_owned(),
            (Some(i), false) => {
                self.entries.remove(i);
            }
            (None, true) => self.entries.push(entry.to_owned()),
            (None, false) => {}
        }
    }
}

/// The working directory: the container's, else the image's, else `/`.
pub(crate) fn cwd(container: &ContainerConfig, image: &ImageConfig) -> Result<String, SpecError> {
    let (field, dir) = match (&container.working_dir, &image.working_dir) {
        (Some(dir), _) if !dir.is_empty() => ("working_dir", dir.as_str()),
        (_, Some(dir)) if !dir.is_empty() => ("image WorkingDir", dir.as_str()),
        _ => return Ok("/".to_owned()),
    };
    if !dir.starts_with('/') {
        return Err(SpecError::invalid(field, dir, "must be an absolute path"));
    }
    if dir.contains('\0') {
        return Err(SpecError::invalid(field, dir, "contains a NUL byte"));
    }
    Ok(dir.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn an_empty_entrypoint_string_counts_as_no_entrypoint() {
        let image = ImageConfig {
            entrypoint: strings(&[""]),
            cmd: strings(&["sh"]),
            ..Default::default()
        };
        let got = args(&ContainerConfig::default(), &image).expect("args");
        assert_eq!(got, strings(&["sh"]));
    }

    #[test]
    fn a_nul_byte_in_an_argument_is_rejected() {
        let container = ContainerConfig {
            command: strings(&["echo", "a\0b"]),
            ..Default::default()
        };
        assert!(matches!(
            args(&container, &ImageConfig::default()),
            Err(SpecError::InvalidValue {
                field: "command/args",
                ..
            })
        ));
    }

    #[test]
    fn an_image_env_entry_without_a_value_unsets_the_key() {
        let image = ImageConfig {
            env: strings(&["A=1", "B=2", "A"]),
            ..Default::default()
        };
        let got = env(&ContainerConfig::default(), &image, "h").expect("env");
        assert_eq!(got, strings(&[DEFAULT_PATH_ENV, "HOSTNAME=h", "B=2"]));
    }

    #[test]
    fn a_relative_working_dir_is_rejected_naming_the_field() {
        let container = ContainerConfig {
            working_dir: Some("app".into()),
            ..Default::default()
        };
        let err = cwd(&container, &ImageConfig::default()).expect_err("relative");
        assert!(err.to_string().contains("working_dir"), "{err}");
    }
}

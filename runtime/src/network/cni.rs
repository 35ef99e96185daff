//! Running CNI plugins per the CNI 1.0 spec, without libcni: one process per plugin and
//! command, parameters in `CNI_*` environment variables, the plugin's configuration on
//! stdin, its result (or a JSON error `{"code","msg","details"}`) on stdout.
//!
//! A network list runs as the spec says:
//! - ADD: plugins in order; each gets the previous plugin's result as `prevResult`; the
//!   last result is the list's result.
//! - CHECK (CNI ≥ 0.4.0): plugins in order, each with the ADD result as `prevResult`.
//! - DEL: plugins in reverse order, each with the ADD result (if known) as `prevResult`.
//!   Unlike libcni, DEL goes on after a failing plugin so that the others still release
//!   what they hold (an address, NAT rules); the first error is returned.
//!
//! Each plugin gets `runtimeConfig` entries only for the capabilities it declares
//! (`"capabilities": {"portMappings": true}`). Every invocation is bounded by a timeout
//! after which the plugin is killed; its environment is cleared but for `PATH` (plugins
//! run `iptables`) and the `CNI_*` variables.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::io::AsyncWriteExt;

use super::config::{plugin_type, NetworkList};
use super::error::{NetworkError, Result};

/// A CNI operation (`CNI_COMMAND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
        })
    }
}

/// What identifies one attachment of a container to a network; the same for ADD, CHECK
/// and DEL.
#[derive(Debug, Clone)]
pub struct Attachment<'a> {
    pub container_id: &'a str,
    /// The pinned network namespace; `None` for a DEL after the namespace is gone.
    pub netns: Option<&'a Path>,
    pub ifname: &'a str,
    /// `CNI_ARGS` pairs, e.g. `K8S_POD_NAME`; `IgnoreUnknown=1` is always sent first.
    pub args: &'a [(String, String)],
    /// Capability arguments (`portMappings`, …) offered to plugins that declare them.
    pub capabilities: &'a Map<String, Value>,
}

/// Finds plugin binaries and runs them.
#[derive(Debug, Clone)]
pub struct Invoker {
    pub bin_dirs: Vec<PathBuf>,
    pub timeout: Duration,
}

/// A plugin's JSON error on stdout.
#[derive(Debug, Default, Deserialize)]
struct PluginErrorJson {
    #[serde(default)]
    code: Option<u32>,
    #[serde(default)]
    msg: String,
    #[serde(default)]
    details: String,
}

/// Longest stderr kept in an error.
const STDERR_LIMIT: usize = 4096;
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Invoker {
    /// The executable for plugin `ty`: the first bin dir that has it.
    pub fn find(&self, ty: &str) -> Result<PathBuf> {
        self.bin_dirs
            .iter()
            .map(|dir| dir.join(ty))
            .find(|path| is_executable(path))
            .ok_or_else(|| NetworkError::PluginNotFound {
                plugin: ty.to_owned(),
                dirs: self.bin_dirs.clone(),
            })
    }

    /// Checks that every plugin of the list can be found.
    pub fn find_all(&self, list: &NetworkList) -> Result<()> {
        for plugin in &list.plugins {
            self.find(plugin_type(plugin).unwrap_or_default())?;
        }
        Ok(())
    }

    /// ADD: returns the last plugin's result.
    pub async fn add(&self, list: &NetworkList, at: &Attachment<'_>) -> Result<Value> {
        let mut prev: Option<Value> = None;
        for plugin in &list.plugins {
            let stdin = plugin_stdin(list, plugin, prev.as_ref(), at.capabilities);
            let out = self.exec(plugin, Command::Add, at, &stdin).await?;
            let result =
                serde_json::from_slice(&out).map_err(|source| NetworkError::BadResult {
                    plugin: plugin_type(plugin).unwrap_or_default().to_owned(),
                    command: Command::Add,
                    source,
                })?;
            prev = Some(result);
        }
        Ok(prev.unwrap_or(Value::Null))
    }

    /// CHECK, if the list's version has it; `prev` is the ADD result.
    pub async fn check(&self, list: &NetworkList, at: &Attachment<'_>, prev: &Value) -> Result<()> {
        if !list.supports_check() {
            return Ok(());
        }
        for plugin in &list.plugins {
            let stdin = plugin_stdin(list, plugin, Some(prev), at.capabilities);
            self.exec(plugin, Command::Check, at, &stdin).await?;
        }
        Ok(())
    }

    /// DEL, in reverse order; every plugin runs, the first error is returned.
    pub async fn del(
        &self,
        list: &NetworkList,
        at: &Attachment<'_>,
        prev: Option<&Value>,
    ) -> Result<()> {
        let mut first_err = None;
        for plugin in list.plugins.iter().rev() {
            let stdin = plugin_stdin(list, plugin, prev, at.capabilities);
            if let Err(err) = self.exec(plugin, Command::Del, at, &stdin).await {
                tracing::debug!(container_id = at.container_id, %err, "CNI DEL failed");
                first_err.get_or_insert(err);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Runs one plugin; returns its stdout on success.
    async fn exec(
        &self,
        plugin: &Map<String, Value>,
        command: Command,
        at: &Attachment<'_>,
        stdin: &Value,
    ) -> Result<Vec<u8>> {
        let ty = plugin_type(plugin).unwrap_or_default();
        let path = self.find(ty)?;
        let input = serde_json::to_vec(stdin).unwrap_or_default();
        let mut cmd = tokio::process::Command::new(&path);
        cmd.env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into()),
            )
            .envs(self.cni_env(command, at))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child =
            spawn_retrying_busy(&mut cmd)
                .await
                .map_err(|source| NetworkError::Spawn {
                    plugin: ty.to_owned(),
                    command,
                    source,
                })?;
        let stdin_pipe = child.stdin.take();
        let write = async move {
            if let Some(mut pipe) = stdin_pipe {
                // A plugin that exits without reading stdin closes the pipe: its exit
                // status and output tell what happened, not this write.
                let _ = pipe.write_all(&input).await;
            }
        };
        let run = async { tokio::join!(write, child.wait_with_output()).1 };
        let output = tokio::time::timeout(self.timeout, run)
            .await
            .map_err(|_| NetworkError::Timeout {
                plugin: ty.to_owned(),
                command,
                after: self.timeout,
            })?
            .map_err(|source| NetworkError::Spawn {
                plugin: ty.to_owned(),
                command,
                source,
            })?;
        if output.status.success() {
            return Ok(output.stdout);
        }
        Err(plugin_error(ty, command, &output))
    }

    fn cni_env(&self, command: Command, at: &Attachment<'_>) -> Vec<(&'static str, String)> {
        let mut args = String::from("IgnoreUnknown=1");
        for (k, v) in at.args {
            args.push_str(&format!(";{k}={v}"));
        }
        let cni_path = std::env::join_paths(&self.bin_dirs)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        vec![
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", at.container_id.to_owned()),
            (
                "CNI_NETNS",
                at.netns
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
            ("CNI_IFNAME", at.ifname.to_owned()),
            ("CNI_ARGS", args),
            ("CNI_PATH", cni_path),
        ]
    }
}

/// The configuration one plugin reads on stdin: its own object plus the list's `name` and
/// `cniVersion`, `prevResult` if any, and `runtimeConfig` for its declared capabilities.
pub fn plugin_stdin(
    list: &NetworkList,
    plugin: &Map<String, Value>,
    prev: Option<&Value>,
    capabilities: &Map<String, Value>,
) -> Value {
    let mut conf = plugin.clone();
    conf.insert("name".into(), Value::String(list.name.clone()));
    conf.insert("cniVersion".into(), Value::String(list.cni_version.clone()));
    if let Some(prev) = prev {
        conf.insert("prevResult".into(), prev.clone());
    }
    let declared = plugin.get("capabilities").and_then(Value::as_object);
    let runtime_config: Map<String, Value> = capabilities
        .iter()
        .filter(|(k, _)| {
            declared
                .and_then(|d| d.get(*k))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !runtime_config.is_empty() {
        conf.insert("runtimeConfig".into(), Value::Object(runtime_config));
    }
    Value::Object(conf)
}

fn plugin_error(ty: &str, command: Command, output: &std::process::Output) -> NetworkError {
    let stderr = truncate(String::from_utf8_lossy(&output.stderr).trim());
    let parsed: Option<PluginErrorJson> = serde_json::from_slice(&output.stdout).ok();
    let (code, msg, details) = match parsed {
        Some(e) if !e.msg.is_empty() || e.code.is_some() => (e.code, e.msg, e.details),
        _ => {
            let stdout = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            let msg = if stdout.is_empty() {
                format!("exited with {}", output.status)
            } else {
                truncate(&stdout)
            };
            (None, msg, String::new())
        }
    };
    NetworkError::Plugin {
        plugin: ty.to_owned(),
        command,
        code,
        msg,
        details,
        stderr,
    }
}

/// Spawns, retrying briefly on ETXTBSY: a plugin binary just installed may still be open
/// for writing in a child forked meanwhile by another thread.
pub(crate) async fn spawn_retrying_busy(
    cmd: &mut tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    let mut attempts = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempts < 5 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(10 * attempts)).await;
            }
            other => return other,
        }
    }
}

fn truncate(s: &str) -> String {
    if s.len() <= STDERR_LIMIT {
        return s.to_owned();
    }
    let mut end = STDERR_LIMIT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::os::unix::fs::PermissionsExt;

    fn list(plugins: Value) -> NetworkList {
        NetworkList {
            name: "testnet".into(),
            cni_version: "1.0.0".into(),
            disable_check: false,
            masquerade: None,
            plugins: serde_json::from_value(plugins).unwrap(),
        }
    }

    /// A plugin script in `dir` named `ty`.
    fn script(dir: &Path, ty: &str, body: &str) {
        let path = dir.join(ty);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn invoker(dir: &Path) -> Invoker {
        Invoker {
            bin_dirs: vec![dir.to_owned()],
            timeout: Duration::from_secs(10),
        }
    }

    fn attachment<'a>(
        args: &'a [(String, String)],
        caps: &'a Map<String, Value>,
    ) -> Attachment<'a> {
        Attachment {
            container_id: "abc",
            netns: Some(Path::new("/run/netns/x")),
            ifname: "eth0",
            args,
            capabilities: caps,
        }
    }

    #[test]
    fn stdin_carries_name_version_prev_result_and_only_declared_capabilities() {
        let l = list(json!([{"type": "portmap", "capabilities": {"portMappings": true}}]));
        let caps: Map<String, Value> = serde_json::from_value(json!({
            "portMappings": [{"hostPort": 80, "containerPort": 8080, "protocol": "tcp"}],
            "bandwidth": {"ingressRate": 1}
        }))
        .unwrap();
        let prev = json!({"cniVersion": "1.0.0", "ips": []});
        let conf = plugin_stdin(&l, &l.plugins[0], Some(&prev), &caps);
        assert_eq!(conf["name"], "testnet");
        assert_eq!(conf["cniVersion"], "1.0.0");
        assert_eq!(conf["prevResult"], prev);
        assert_eq!(conf["runtimeConfig"]["portMappings"][0]["hostPort"], 80);
        assert!(conf["runtimeConfig"].get("bandwidth").is_none());
        let plain = list(json!([{"type": "bridge"}]));
        let conf = plugin_stdin(&plain, &plain.plugins[0], None, &caps);
        assert!(conf.get("runtimeConfig").is_none() && conf.get("prevResult").is_none());
    }

    #[tokio::test]
    async fn add_chains_results_and_passes_the_cni_environment() {
        let dir = tempfile::tempdir().unwrap();
        // `first` prints a result; `second` echoes what it was given so the test sees
        // its stdin and environment.
        script(
            dir.path(),
            "first",
            r#"echo '{"cniVersion":"1.0.0","ips":[{"address":"10.1.2.3/24"}]}'"#,
        );
        script(
            dir.path(),
            "second",
            r#"in=$(cat); printf '{"stdin":%s,"env":"%s|%s|%s|%s|%s"}' "$in" "$CNI_COMMAND" "$CNI_CONTAINERID" "$CNI_NETNS" "$CNI_IFNAME" "$CNI_ARGS""#,
        );
        let l = list(json!([{"type": "first"}, {"type": "second", "x": 1}]));
        let args = vec![("K8S_POD_NAME".to_owned(), "web".to_owned())];
        let caps = Map::new();
        let out = invoker(dir.path())
            .add(&l, &attachment(&args, &caps))
            .await
            .unwrap();
        assert_eq!(
            out["env"],
            "ADD|abc|/run/netns/x|eth0|IgnoreUnknown=1;K8S_POD_NAME=web"
        );
        assert_eq!(out["stdin"]["x"], 1);
        assert_eq!(
            out["stdin"]["prevResult"]["ips"][0]["address"],
            "10.1.2.3/24"
        );
    }

    #[tokio::test]
    async fn a_plugin_json_error_becomes_a_typed_error_with_its_message_and_stderr() {
        let dir = tempfile::tempdir().unwrap();
        script(
            dir.path(),
            "bad",
            r#"echo 'oh no' >&2; echo '{"cniVersion":"1.0.0","code":11,"msg":"no addresses left","details":"pool 10.0.0.0/30"}'; exit 1"#,
        );
        let l = list(json!([{"type": "bad"}]));
        let caps = Map::new();
        let err = invoker(dir.path())
            .add(&l, &attachment(&[], &caps))
            .await
            .unwrap_err();
        let NetworkError::Plugin {
            plugin,
            command,
            code,
            msg,
            details,
            stderr,
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!(
            (plugin.as_str(), *command, *code),
            ("bad", Command::Add, Some(11))
        );
        assert_eq!(msg, "no addresses left");
        assert_eq!(details, "pool 10.0.0.0/30");
        assert_eq!(stderr, "oh no");
        assert!(err.to_string().contains("no addresses left"), "{err}");
    }

    #[tokio::test]
    async fn a_plugin_failing_without_json_reports_its_output_and_status() {
        let dir = tempfile::tempdir().unwrap();
        script(dir.path(), "crash", "exit 3");
        let l = list(json!([{"type": "crash"}]));
        let caps = Map::new();
        let err = invoker(dir.path())
            .add(&l, &attachment(&[], &caps))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, NetworkError::Plugin { code: None, msg, .. } if msg.contains('3')),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_hanging_plugin_is_killed_after_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        script(dir.path(), "hang", "exec sleep 30");
        let l = list(json!([{"type": "hang"}]));
        let caps = Map::new();
        let inv = Invoker {
            timeout: Duration::from_millis(300),
            ..invoker(dir.path())
        };
        let started = std::time::Instant::now();
        let err = inv.add(&l, &attachment(&[], &caps)).await.unwrap_err();
        assert!(matches!(err, NetworkError::Timeout { .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn del_runs_every_plugin_in_reverse_and_returns_the_first_error() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let logp = log.display();
        script(dir.path(), "a", &format!("echo a-$CNI_COMMAND >> {logp}"));
        script(
            dir.path(),
            "b",
            &format!(
                r#"echo b-$CNI_COMMAND >> {logp}; echo '{{"code":7,"msg":"b broke"}}'; exit 1"#
            ),
        );
        script(dir.path(), "c", &format!("echo c-$CNI_COMMAND >> {logp}"));
        let l = list(json!([{"type": "a"}, {"type": "b"}, {"type": "c"}]));
        let caps = Map::new();
        let err = invoker(dir.path())
            .del(&l, &attachment(&[], &caps), None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("b broke"), "{err}");
        let order = std::fs::read_to_string(&log).unwrap();
        assert_eq!(order, "c-DEL\nb-DEL\na-DEL\n");
    }

    #[test]
    fn a_missing_plugin_names_the_plugin_and_the_directories_searched() {
        let dir = tempfile::tempdir().unwrap();
        let l = list(json!([{"type": "bridge"}]));
        let err = invoker(dir.path()).find_all(&l).unwrap_err();
        assert!(
            matches!(&err, NetworkError::PluginNotFound { plugin, dirs } if plugin == "bridge" && dirs[0] == dir.path()),
            "{err:?}"
        );
    }
}

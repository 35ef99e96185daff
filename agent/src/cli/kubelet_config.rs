//! `ironlet run --config FILE`: kubelet's `KubeletConfiguration`
//! (`kubelet.config.k8s.io/v1beta1`, YAML or JSON) mapped onto `ironlet run`'s flags.
//!
//! As with kubelet, a flag given on the command line wins over the file (clap tells where a
//! value came from). Fields ironlet does not implement are named in a warning at start, or
//! fail the start with `--fail-on-unsupported-config`. [`effective`] renders the resulting
//! settings back in the same schema for `/configz`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::parser::ValueSource;
use clap::ArgMatches;
use serde::Deserialize;
use serde_json::{json, Value};

use super::run::{parse_duration, parse_reserved, Reserved, RunArgs};
use ironlet::kubelet::eviction::thresholds::{SignalMap, ThresholdMap};

pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub const KIND: &str = "KubeletConfiguration";

/// The fields ironlet maps, with the Kubernetes names; everything else lands in `extra`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KubeletConfiguration {
    api_version: Option<String>,
    kind: Option<String>,
    static_pod_path: Option<PathBuf>,
    #[serde(rename = "staticPodURL")]
    static_pod_url: Option<String>,
    sync_frequency: Option<String>,
    file_check_frequency: Option<String>,
    http_check_frequency: Option<String>,
    address: Option<IpAddr>,
    port: Option<u16>,
    read_only_port: Option<u16>,
    healthz_port: Option<u16>,
    healthz_bind_address: Option<IpAddr>,
    streaming_connection_idle_timeout: Option<String>,
    tls_cert_file: Option<PathBuf>,
    tls_private_key_file: Option<PathBuf>,
    #[serde(rename = "serverTLSBootstrap")]
    server_tls_bootstrap: Option<bool>,
    authentication: Option<Authentication>,
    authorization: Option<Authorization>,
    #[serde(rename = "clusterDNS")]
    cluster_dns: Option<Vec<IpAddr>>,
    cluster_domain: Option<String>,
    resolv_conf: Option<PathBuf>,
    max_pods: Option<u64>,
    allowed_unsafe_sysctls: Option<Vec<String>>,
    system_reserved: Option<BTreeMap<String, String>>,
    kube_reserved: Option<BTreeMap<String, String>>,
    cgroup_root: Option<String>,
    cgroup_driver: Option<String>,
    seccomp_default: Option<bool>,
    pod_logs_dir: Option<PathBuf>,
    #[serde(rename = "podCIDR")]
    pod_cidr: Option<String>,
    crash_loop_back_off: Option<CrashLoopBackOff>,
    container_log_max_size: Option<String>,
    container_log_max_files: Option<i64>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    image_gc_high_threshold_percent: Option<i64>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    image_gc_low_threshold_percent: Option<i64>,
    #[serde(rename = "imageMinimumGCAge")]
    image_minimum_gc_age: Option<String>,
    #[serde(rename = "imageMaximumGCAge")]
    image_maximum_gc_age: Option<String>,
    node_status_max_images: Option<i32>,
    serialize_image_pulls: Option<bool>,
    max_parallel_image_pulls: Option<i32>,
    eviction_hard: Option<BTreeMap<String, String>>,
    eviction_soft: Option<BTreeMap<String, String>>,
    eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    eviction_max_pod_grace_period: Option<i64>,
    eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    eviction_pressure_transition_period: Option<String>,
    shutdown_grace_period: Option<String>,
    shutdown_grace_period_critical_pods: Option<String>,
    shutdown_grace_period_by_pod_priority:
        Option<Vec<ironlet::kubelet::node_shutdown::PriorityGrace>>,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Authentication {
    x509: Option<X509>,
    anonymous: Option<Enabled>,
    webhook: Option<Enabled>,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct X509 {
    #[serde(rename = "clientCAFile")]
    client_ca_file: Option<PathBuf>,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
struct Enabled {
    enabled: Option<bool>,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
struct Authorization {
    mode: Option<String>,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CrashLoopBackOff {
    max_container_restart_period: Option<String>,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

impl KubeletConfiguration {
    fn parse(text: &str) -> anyhow::Result<Self> {
        // YAML is a superset of JSON: one parser reads both.
        let value: Value = serde_yaml::from_str(text).context("malformed YAML or JSON")?;
        if !value.is_object() {
            bail!("not a KubeletConfiguration object");
        }
        let config: Self = serde_json::from_value(value)?;
        if config.api_version.as_deref() != Some(API_VERSION)
            || config.kind.as_deref() != Some(KIND)
        {
            bail!(
                "apiVersion {:?} kind {:?}: expected apiVersion {API_VERSION} kind {KIND}",
                config.api_version.as_deref().unwrap_or(""),
                config.kind.as_deref().unwrap_or("")
            );
        }
        Ok(config)
    }

    /// The dotted names of the fields set in the file that ironlet does not implement
    /// (or, for the authentication and authorization modes, not with that value).
    fn unsupported(&self) -> Vec<String> {
        fn names(out: &mut Vec<String>, prefix: &str, extra: &BTreeMap<String, Value>) {
            out.extend(extra.keys().map(|k| format!("{prefix}{k}")));
        }
        let mut out = Vec::new();
        names(&mut out, "", &self.extra);
        if let Some(authn) = &self.authentication {
            names(&mut out, "authentication.", &authn.extra);
            if let Some(x509) = &authn.x509 {
                names(&mut out, "authentication.x509.", &x509.extra);
            }
            // ironlet never serves anonymous requests and always asks the API server.
            for (name, part, wanted) in [
                ("anonymous", &authn.anonymous, false),
                ("webhook", &authn.webhook, true),
            ] {
                if let Some(part) = part {
                    names(&mut out, &format!("authentication.{name}."), &part.extra);
                    if part.enabled.is_some_and(|e| e != wanted) {
                        out.push(format!("authentication.{name}.enabled={}", !wanted));
                    }
                }
            }
        }
        if let Some(authz) = &self.authorization {
            names(&mut out, "authorization.", &authz.extra);
            if let Some(mode) = authz.mode.as_deref().filter(|m| *m != "Webhook") {
                out.push(format!("authorization.mode={mode}"));
            }
        }
        if let Some(driver) = self.cgroup_driver.as_deref().filter(|d| *d != "cgroupfs") {
            out.push(format!("cgroupDriver={driver}"));
        }
        if let Some(backoff) = &self.crash_loop_back_off {
            names(&mut out, "crashLoopBackOff.", &backoff.extra);
        }
        out
    }

    /// Sets the flags' values from the file, except those given on the command line.
    /// Relative paths are taken from `base` (the file's directory), as kubelet does for
    /// its path fields.
    fn apply(self, args: &mut RunArgs, matches: &ArgMatches, base: &Path) -> anyhow::Result<()> {
        let resolve = |p: PathBuf| {
            if p.as_os_str().is_empty() || p.is_absolute() {
                p
            } else {
                base.join(p)
            }
        };
        let from_file = |id: &str| matches.value_source(id) != Some(ValueSource::CommandLine);
        macro_rules! set {
            ($field:ident, $value:expr) => {
                if let Some(value) = $value {
                    if from_file(stringify!($field)) {
                        args.$field = value;
                    }
                }
            };
        }
        let duration = |name: &str, text: Option<String>| -> anyhow::Result<Option<Duration>> {
            text.map(|t| parse_duration(&t).map_err(|e| anyhow::anyhow!("{name}: {e}")))
                .transpose()
        };
        let reserved = |name: &str, map: Option<BTreeMap<String, String>>| {
            map.map(|m| {
                let text: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
                parse_reserved(&text.join(","))
                    .map(Some)
                    .map_err(|e| anyhow::anyhow!("{name}: {e}"))
            })
            .transpose()
        };
        let client_ca = self
            .authentication
            .and_then(|a| a.x509)
            .and_then(|x| x.client_ca_file)
            .map(resolve);
        let restart = self
            .crash_loop_back_off
            .and_then(|c| c.max_container_restart_period);
        set!(
            pod_manifest_path,
            self.static_pod_path.map(resolve).map(Some)
        );
        set!(manifest_url, self.static_pod_url.map(Some));
        set!(
            sync_frequency,
            duration("syncFrequency", self.sync_frequency)?
        );
        set!(
            file_check_frequency,
            duration("fileCheckFrequency", self.file_check_frequency)?
        );
        set!(
            http_check_frequency,
            duration("httpCheckFrequency", self.http_check_frequency)?
        );
        set!(
            streaming_connection_idle_timeout,
            duration(
                "streamingConnectionIdleTimeout",
                self.streaming_connection_idle_timeout
            )?
        );
        set!(address, self.address);
        set!(port, self.port);
        set!(read_only_port, self.read_only_port);
        set!(healthz_port, self.healthz_port);
        set!(healthz_bind_address, self.healthz_bind_address);
        set!(tls_cert_file, self.tls_cert_file.map(resolve).map(Some));
        set!(
            tls_private_key_file,
            self.tls_private_key_file.map(resolve).map(Some)
        );
        set!(client_ca_file, client_ca.map(Some));
        set!(rotate_server_certificates, self.server_tls_bootstrap);
        set!(cluster_dns, self.cluster_dns);
        set!(cluster_domain, self.cluster_domain);
        set!(resolv_conf, self.resolv_conf.map(resolve));
        set!(max_pods, self.max_pods);
        set!(allowed_unsafe_sysctls, self.allowed_unsafe_sysctls);
        set!(
            system_reserved,
            reserved("systemReserved", self.system_reserved)?
        );
        set!(kube_reserved, reserved("kubeReserved", self.kube_reserved)?);
        set!(cgroup_root, self.cgroup_root);
        set!(seccomp_default, self.seccomp_default);
        set!(pod_logs_dir, self.pod_logs_dir.map(resolve).map(Some));
        set!(pod_cidr, self.pod_cidr);
        set!(
            container_log_max_size,
            self.container_log_max_size
                .map(|s| super::run::parse_log_max_size(&s))
                .transpose()
                .map_err(|e| anyhow::anyhow!("containerLogMaxSize: {e}"))?
        );
        set!(
            container_log_max_files,
            self.container_log_max_files
                .map(|n| super::run::parse_log_max_files(&n.to_string()))
                .transpose()
                .map_err(|e| anyhow::anyhow!("containerLogMaxFiles: {e}"))?
        );
        set!(
            max_container_restart_period,
            duration("crashLoopBackOff.maxContainerRestartPeriod", restart)?
        );
        let percent = |name: &str, value: Option<i64>| -> anyhow::Result<Option<u8>> {
            value
                .map(|v| {
                    u8::try_from(v).ok().filter(|p| *p <= 100).ok_or_else(|| {
                        anyhow::anyhow!("{name}: {v} must be between 0 and 100, inclusive")
                    })
                })
                .transpose()
        };
        set!(
            image_gc_high_threshold,
            percent(
                "imageGCHighThresholdPercent",
                self.image_gc_high_threshold_percent
            )?
        );
        set!(
            image_gc_low_threshold,
            percent(
                "imageGCLowThresholdPercent",
                self.image_gc_low_threshold_percent
            )?
        );
        set!(
            image_minimum_gc_age,
            duration("imageMinimumGCAge", self.image_minimum_gc_age)?
        );
        set!(
            image_maximum_gc_age,
            duration("imageMaximumGCAge", self.image_maximum_gc_age)?
        );
        set!(node_status_max_images, self.node_status_max_images);
        set!(serialize_image_pulls, self.serialize_image_pulls);
        set!(
            max_parallel_image_pulls,
            self.max_parallel_image_pulls.map(Some)
        );
        let thresholds = |name: &str, map: Option<BTreeMap<String, String>>| {
            map.map(|m| ThresholdMap::from_config(&m).map_err(|e| anyhow::anyhow!("{name}: {e}")))
                .transpose()
        };
        let signals = |name: &str, map: Option<BTreeMap<String, String>>| {
            map.map(|m| {
                let text: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
                SignalMap::parse_flag(&text.join(",")).map_err(|e| anyhow::anyhow!("{name}: {e}"))
            })
            .transpose()
        };
        set!(
            eviction_hard,
            thresholds("evictionHard", self.eviction_hard)?
        );
        set!(
            eviction_soft,
            thresholds("evictionSoft", self.eviction_soft)?
        );
        set!(
            eviction_soft_grace_period,
            signals("evictionSoftGracePeriod", self.eviction_soft_grace_period)?
        );
        set!(
            eviction_minimum_reclaim,
            signals("evictionMinimumReclaim", self.eviction_minimum_reclaim)?
        );
        set!(
            eviction_max_pod_grace_period,
            self.eviction_max_pod_grace_period
        );
        set!(
            eviction_pressure_transition_period,
            duration(
                "evictionPressureTransitionPeriod",
                self.eviction_pressure_transition_period
            )?
        );
        set!(
            shutdown_grace_period,
            duration("shutdownGracePeriod", self.shutdown_grace_period)?
        );
        set!(
            shutdown_grace_period_critical_pods,
            duration(
                "shutdownGracePeriodCriticalPods",
                self.shutdown_grace_period_critical_pods
            )?
        );
        // A file-only field: no flag can win over it.
        if let Some(groups) = self.shutdown_grace_period_by_pod_priority {
            args.shutdown_grace_period_by_pod_priority = groups;
        }
        Ok(())
    }
}

/// Reads `--config` (when given) into `args`; flags on the command line win.
pub fn apply_file(args: &mut RunArgs, matches: &ArgMatches) -> anyhow::Result<()> {
    let Some(path) = args.config.clone() else {
        return Ok(());
    };
    let unsupported = load(&path)
        .and_then(|config| {
            let unsupported = config.unsupported();
            config.apply(args, matches, path.parent().unwrap_or(Path::new("")))?;
            Ok(unsupported)
        })
        .with_context(|| format!("--config {}", path.display()))?;
    if !unsupported.is_empty() {
        let names = unsupported.join(", ");
        if args.fail_on_unsupported_config {
            bail!(
                "--config {}: fields not supported by ironlet: {names}",
                path.display()
            );
        }
        // Said once, by the supervisor; the agent it starts reads the same file again.
        if std::env::var_os(ironlet_runtime::supervisor::SUPERVISOR_FD_ENV).is_none() {
            tracing::warn!(file = %path.display(), fields = %names, "KubeletConfiguration fields not supported by ironlet are ignored");
        }
    }
    Ok(())
}

fn load(path: &Path) -> anyhow::Result<KubeletConfiguration> {
    let text = std::fs::read_to_string(path).context("reading the file")?;
    KubeletConfiguration::parse(&text)
}

/// The effective settings as a `KubeletConfiguration`, as kubelet's `/configz` shows them.
pub fn effective(args: &RunArgs, config: &ironlet::kubelet::KubeletConfig) -> Value {
    let reserved = |r: Option<Reserved>| {
        r.map(|r| {
            json!({
                "cpu": format!("{}m", r.cpu_milli),
                "memory": r.memory_bytes.to_string(),
            })
        })
    };
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
    let mut config = json!({
        "kind": KIND,
        "apiVersion": API_VERSION,
        "staticPodPath": path(&args.pod_manifest_path),
        "staticPodURL": args.manifest_url,
        "syncFrequency": go_duration(args.sync_frequency),
        "fileCheckFrequency": go_duration(args.file_check_frequency),
        "httpCheckFrequency": go_duration(args.http_check_frequency),
        "address": args.address.to_string(),
        "port": args.port,
        "readOnlyPort": args.read_only_port,
        "healthzPort": args.healthz_port,
        "streamingConnectionIdleTimeout": go_duration(args.streaming_connection_idle_timeout),
        "healthzBindAddress": args.healthz_bind_address.to_string(),
        "tlsCertFile": path(&args.tls_cert_file),
        "tlsPrivateKeyFile": path(&args.tls_private_key_file),
        "serverTLSBootstrap": args.rotate_server_certificates,
        "authentication": {
            "x509": {"clientCAFile": path(&args.client_ca_file)},
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDNS": args.cluster_dns.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
        "clusterDomain": args.cluster_domain,
        "resolvConf": args.resolv_conf.display().to_string(),
        "maxPods": args.max_pods,
        "allowedUnsafeSysctls": args.allowed_unsafe_sysctls,
        "systemReserved": reserved(args.system_reserved),
        "kubeReserved": reserved(args.kube_reserved),
        "cgroupRoot": args.cgroup_root,
        "cgroupDriver": "cgroupfs",
        "seccompDefault": args.seccomp_default,
        "podLogsDir": config.pod_log_dir.display().to_string(),
        "podCIDR": args.pod_cidr,
        "containerLogMaxSize": ironlet::node::memory_quantity(args.container_log_max_size).0,
        "containerLogMaxFiles": args.container_log_max_files,
        "crashLoopBackOff": {
            "maxContainerRestartPeriod": go_duration(args.max_container_restart_period),
        },
        "imageGCHighThresholdPercent": args.image_gc_high_threshold,
        "imageGCLowThresholdPercent": args.image_gc_low_threshold,
        "imageMinimumGCAge": go_duration(args.image_minimum_gc_age),
        "imageMaximumGCAge": go_duration(args.image_maximum_gc_age),
        "nodeStatusMaxImages": args.node_status_max_images,
        "serializeImagePulls": args.serialize_image_pulls,
        "maxParallelImagePulls": args.max_parallel_image_pulls,
        "evictionHard": args.eviction_hard.to_config(),
        "evictionSoft": args.eviction_soft.to_config(),
        "evictionSoftGracePeriod": args.eviction_soft_grace_period.0,
        "evictionMaxPodGracePeriod": args.eviction_max_pod_grace_period,
        "evictionMinimumReclaim": args.eviction_minimum_reclaim.0,
        "evictionPressureTransitionPeriod": go_duration(args.eviction_pressure_transition_period),
        "shutdownGracePeriod": go_duration(args.shutdown_grace_period),
        "shutdownGracePeriodCriticalPods": go_duration(args.shutdown_grace_period_critical_pods),
        "shutdownGracePeriodByPodPriority": (!args.shutdown_grace_period_by_pod_priority.is_empty())
            .then_some(&args.shutdown_grace_period_by_pod_priority),
    });
    drop_nulls(&mut config);
    config
}

/// Omits unset fields (Go's `omitempty`).
fn drop_nulls(value: &mut Value) {
    if let Value::Object(map) = value {
        map.retain(|_, v| !v.is_null());
        map.values_mut().for_each(drop_nulls);
    }
}

/// A duration as Go's `time.Duration.String` writes it (`1m0s`, `500ms`).
fn go_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let secs = d.as_secs();
    let (h, m) = (secs / 3600, secs / 60 % 60);
    let mut s = format!("{}", secs % 60);
    let millis = d.subsec_millis();
    if millis != 0 {
        s = format!("{s}.{millis:03}").trim_end_matches('0').to_owned();
    }
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s}s"),
        (h, m) => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    #[derive(clap::Parser)]
    struct Wrapper {
        #[command(flatten)]
        run: RunArgs,
    }

    /// `ironlet run <flags>` with `text` as the config file.
    fn run_with(text: &str, flags: &[&str]) -> anyhow::Result<RunArgs> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, text)?;
        let file = file.display().to_string();
        let argv = ["ironlet", "--config", &file]
            .into_iter()
            .chain(flags.iter().copied());
        let matches = Wrapper::command().try_get_matches_from(argv)?;
        let mut args = Wrapper::from_arg_matches(&matches)?.run;
        apply_file(&mut args, &matches)?;
        Ok(args)
    }

    const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    #[test]
    fn file_values_apply_and_command_line_flags_win() -> anyhow::Result<()> {
        let text = format!(
            "{HEAD}staticPodPath: /etc/kubernetes/manifests\nport: 10350\nmaxPods: 42\n\
             syncFrequency: 1m30s\nclusterDNS: [10.96.0.10]\nclusterDomain: cluster.local\n\
             streamingConnectionIdleTimeout: 30m\n\
             systemReserved: {{cpu: 200m, memory: 100Mi}}\n\
             authentication: {{x509: {{clientCAFile: /etc/ca.crt}}, anonymous: {{enabled: false}}}}\n\
             crashLoopBackOff: {{maxContainerRestartPeriod: 10s}}\n\
             allowedUnsafeSysctls: [kernel.msg*, net.core.somaxconn]\n"
        );
        let args = run_with(&text, &["--max-pods", "7", "--cluster-domain=example.org"])?;
        assert_eq!(
            args.allowed_unsafe_sysctls,
            ["kernel.msg*", "net.core.somaxconn"],
            "allowedUnsafeSysctls from the file"
        );
        assert_eq!(
            args.pod_manifest_path.as_deref(),
            Some(Path::new("/etc/kubernetes/manifests"))
        );
        assert_eq!(args.port, 10350);
        assert_eq!(
            args.streaming_connection_idle_timeout,
            Duration::from_secs(1800)
        );
        assert_eq!(args.max_pods, 7, "the flag wins over maxPods");
        assert_eq!(args.cluster_domain, "example.org", "the flag wins");
        assert_eq!(args.sync_frequency, Duration::from_secs(90));
        assert_eq!(args.cluster_dns, vec!["10.96.0.10".parse::<IpAddr>()?]);
        assert_eq!(
            args.client_ca_file.as_deref(),
            Some(Path::new("/etc/ca.crt"))
        );
        assert!(matches!(
            args.system_reserved,
            Some(Reserved {
                cpu_milli: 200,
                memory_bytes: 104857600
            })
        ));
        assert_eq!(args.max_container_restart_period, Duration::from_secs(10));
        // A default not overridden by the file stays.
        assert_eq!(args.healthz_port, 10248);
        let node = ironlet::kubelet::KubeletConfig::new("n", "/tmp/r");
        let configz = effective(&args, &node);
        assert_eq!(configz["kind"], KIND);
        assert_eq!(configz["apiVersion"], API_VERSION);
        assert_eq!(configz["maxPods"], 7);
        assert_eq!(configz["port"], 10350);
        assert_eq!(configz["syncFrequency"], "1m30s");
        assert_eq!(configz["clusterDomain"], "example.org");
        assert_eq!(configz["containerLogMaxSize"], "10Mi");
        assert!(
            configz.get("staticPodURL").is_none(),
            "unset fields are omitted"
        );
        Ok(())
    }

    #[test]
    fn relative_paths_are_taken_from_the_file_s_directory_as_kubelet_does() -> anyhow::Result<()> {
        let text = format!(
            "{HEAD}staticPodPath: manifests\ntlsCertFile: /abs/cert.pem\nresolvConf: \"\"\n"
        );
        let args = run_with(&text, &[])?;
        let manifests = args.pod_manifest_path.unwrap_or_default();
        assert!(
            manifests.is_absolute() && manifests.ends_with("manifests"),
            "{manifests:?}"
        );
        let dir = args.config.as_deref().and_then(Path::parent);
        assert_eq!(manifests.parent(), dir);
        assert_eq!(
            args.tls_cert_file.as_deref(),
            Some(Path::new("/abs/cert.pem"))
        );
        assert_eq!(args.resolv_conf, PathBuf::new(), "empty stays empty (none)");
        Ok(())
    }

    #[test]
    fn container_log_rotation_comes_from_the_file_or_the_flags() -> anyhow::Result<()> {
        let args = run_with(HEAD, &[])?;
        assert_eq!(
            (args.container_log_max_size, args.container_log_max_files),
            (10 * 1024 * 1024, 5),
            "kubelet's defaults"
        );
        let text = format!("{HEAD}containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\n");
        let args = run_with(&text, &[])?;
        assert_eq!(
            (args.container_log_max_size, args.container_log_max_files),
            (1024 * 1024, 3)
        );
        let args = run_with(&text, &["--container-log-max-files", "2"])?;
        assert_eq!(args.container_log_max_files, 2, "the flag wins");
        assert!(run_with(&format!("{HEAD}containerLogMaxFiles: 1\n"), &[]).is_err());
        assert!(run_with(&format!("{HEAD}containerLogMaxSize: lots\n"), &[]).is_err());
        Ok(())
    }

    #[test]
    fn image_gc_and_pull_fields_come_from_the_file() -> anyhow::Result<()> {
        let text = format!(
            "{HEAD}imageGCHighThresholdPercent: 90\nimageGCLowThresholdPercent: 70\n\
             imageMinimumGCAge: 5m\nimageMaximumGCAge: 24h\nnodeStatusMaxImages: -1\n\
             serializeImagePulls: false\nmaxParallelImagePulls: 4\n"
        );
        let config = KubeletConfiguration::parse(&text)?;
        assert!(
            config.unsupported().is_empty(),
            "{:?}",
            config.unsupported()
        );
        let args = run_with(&text, &["--image-gc-low-threshold=75"])?;
        assert_eq!(args.image_gc_high_threshold, 90);
        assert_eq!(args.image_gc_low_threshold, 75, "the flag wins");
        assert_eq!(args.image_minimum_gc_age, Duration::from_secs(300));
        assert_eq!(args.image_maximum_gc_age, Duration::from_secs(86400));
        assert_eq!(args.node_status_max_images, -1);
        assert!(!args.serialize_image_pulls);
        assert_eq!(args.max_parallel_image_pulls, Some(4));
        let configz = effective(&args, &ironlet::kubelet::KubeletConfig::new("n", "/tmp/r"));
        assert_eq!(configz["imageGCHighThresholdPercent"], 90);
        assert_eq!(configz["imageMaximumGCAge"], "24h0m0s");
        assert_eq!(configz["maxParallelImagePulls"], 4);
        assert!(run_with(&format!("{HEAD}imageGCHighThresholdPercent: 101\n"), &[]).is_err());
        Ok(())
    }

    #[test]
    fn json_files_are_read_too() -> anyhow::Result<()> {
        let text = format!(
            r#"{{"apiVersion":"{API_VERSION}","kind":"{KIND}","healthzPort":0,"seccompDefault":true}}"#
        );
        let args = run_with(&text, &[])?;
        assert_eq!(args.healthz_port, 0);
        assert!(args.seccomp_default);
        Ok(())
    }

    #[test]
    fn eviction_fields_come_from_the_file_and_flags_win() -> anyhow::Result<()> {
        let text = format!(
            "{HEAD}evictionHard: {{memory.available: 200Mi, pid.available: 10%}}\n\
             evictionSoft: {{nodefs.available: 20%}}\n\
             evictionSoftGracePeriod: {{nodefs.available: 1m30s}}\n\
             evictionMaxPodGracePeriod: 60\nevictionPressureTransitionPeriod: 30s\n\
             evictionMinimumReclaim: {{memory.available: 50Mi}}\n"
        );
        assert!(KubeletConfiguration::parse(&text)?.unsupported().is_empty());
        let args = run_with(&text, &["--eviction-max-pod-grace-period=5"])?;
        assert_eq!(args.eviction_hard.to_config()["memory.available"], "200Mi");
        assert_eq!(args.eviction_hard.to_config()["pid.available"], "10%");
        assert_eq!(args.eviction_soft.to_config()["nodefs.available"], "20%");
        assert_eq!(
            args.eviction_soft_grace_period.0["nodefs.available"],
            "1m30s"
        );
        assert_eq!(args.eviction_minimum_reclaim.0["memory.available"], "50Mi");
        assert_eq!(args.eviction_max_pod_grace_period, 5, "the flag wins");
        assert_eq!(
            args.eviction_pressure_transition_period,
            Duration::from_secs(30)
        );
        let configz = effective(&args, &ironlet::kubelet::KubeletConfig::new("n", "/tmp/r"));
        assert_eq!(configz["evictionHard"]["memory.available"], "200Mi");
        assert_eq!(configz["evictionPressureTransitionPeriod"], "30s");
        let defaults = run_with(HEAD, &[])?;
        assert_eq!(
            defaults.eviction_hard.to_config()["nodefs.inodesFree"],
            "5%",
            "kubelet's default --eviction-hard"
        );
        let bad = format!("{HEAD}evictionHard: {{memory.available: -1Mi}}\n");
        let err = run_with(&bad, &[])
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(
            err.contains("evictionHard: eviction threshold memory.available"),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn shutdown_fields_come_from_the_file_and_flags_win() -> anyhow::Result<()> {
        let text =
            format!("{HEAD}shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n");
        assert!(KubeletConfiguration::parse(&text)?.unsupported().is_empty());
        let args = run_with(&text, &["--shutdown-grace-period-critical-pods=5s"])?;
        assert_eq!(args.shutdown_grace_period, Duration::from_secs(30));
        assert_eq!(
            args.shutdown_grace_period_critical_pods,
            Duration::from_secs(5),
            "the flag wins"
        );
        let configz = effective(&args, &ironlet::kubelet::KubeletConfig::new("n", "/tmp/r"));
        assert_eq!(configz["shutdownGracePeriod"], "30s");
        assert_eq!(configz["shutdownGracePeriodCriticalPods"], "5s");
        assert!(configz.get("shutdownGracePeriodByPodPriority").is_none());
        let defaults = run_with(HEAD, &[])?;
        assert_eq!(
            (
                defaults.shutdown_grace_period,
                defaults.shutdown_grace_period_critical_pods
            ),
            (Duration::ZERO, Duration::ZERO),
            "kubelet's default: off"
        );
        let by_priority = format!(
            "{HEAD}shutdownGracePeriodByPodPriority:\n             - {{priority: 0, shutdownGracePeriodSeconds: 20}}\n             - {{priority: 2000000000, shutdownGracePeriodSeconds: 5}}\n"
        );
        let args = run_with(&by_priority, &[])?;
        let settings = super::super::run::shutdown_settings(&args)?;
        assert_eq!(settings.total(), Duration::from_secs(25));
        let configz = effective(&args, &ironlet::kubelet::KubeletConfig::new("n", "/tmp/r"));
        assert_eq!(
            configz["shutdownGracePeriodByPodPriority"][1]["shutdownGracePeriodSeconds"],
            5
        );
        let critical_too_long = run_with(
            &format!("{HEAD}shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n"),
            &[],
        )?;
        assert!(super::super::run::shutdown_settings(&critical_too_long).is_err());
        Ok(())
    }

    #[test]
    fn server_tls_bootstrap_turns_on_the_serving_certificate_rotation() -> anyhow::Result<()> {
        let args = run_with(&format!("{HEAD}serverTLSBootstrap: true\n"), &[])?;
        assert!(args.rotate_server_certificates);
        let configz = effective(&args, &ironlet::kubelet::KubeletConfig::new("n", "/tmp/r"));
        assert_eq!(configz["serverTLSBootstrap"], true);
        assert!(!run_with(HEAD, &[])?.rotate_server_certificates);
        assert!(run_with(HEAD, &["--rotate-server-certificates"])?.rotate_server_certificates);
        Ok(())
    }

    #[test]
    fn unsupported_fields_are_named() -> anyhow::Result<()> {
        let text = format!(
            "{HEAD}maxPods: 20\nfailSwapOn: false\nimageGCHighThresholdPercent: 85\n\
             authentication: {{webhook: {{enabled: true, cacheTTL: 2m}}}}\n\
             authorization: {{mode: AlwaysAllow}}\ncgroupDriver: systemd\n"
        );
        let config = KubeletConfiguration::parse(&text)?;
        assert_eq!(
            config.unsupported(),
            vec![
                "failSwapOn",
                "authentication.webhook.cacheTTL",
                "authorization.mode=AlwaysAllow",
                "cgroupDriver=systemd",
            ]
        );
        // A warning by default: the supported fields still apply.
        assert_eq!(run_with(&text, &[])?.max_pods, 20);
        let err = run_with(&text, &["--fail-on-unsupported-config"])
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(err.contains("failSwapOn"), "{err}");
        assert!(err.contains("cgroupDriver=systemd"), "{err}");
        assert!(err.contains("config.yaml"), "names the file: {err}");
        Ok(())
    }

    #[test]
    fn a_wrong_kind_or_a_malformed_file_is_an_error_naming_the_file() {
        for text in [
            "apiVersion: v1\nkind: Pod\n".to_owned(),
            format!("{HEAD}port: [not a number\n"),
            format!("{HEAD}port: 99999\n"),
            format!("{HEAD}syncFrequency: soon\n"),
            "- a list\n".to_owned(),
        ] {
            let err = run_with(&text, &[])
                .err()
                .map(|e| format!("{e:#}"))
                .unwrap_or_default();
            assert!(
                err.contains("--config") && err.contains("config.yaml"),
                "{text}: {err:?}"
            );
        }
    }

    #[test]
    fn durations_print_as_go_does() {
        assert_eq!(go_duration(Duration::from_secs(60)), "1m0s");
        assert_eq!(go_duration(Duration::from_secs(20)), "20s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_millis(100)), "100ms");
        assert_eq!(go_duration(Duration::from_secs(3600 + 61)), "1h1m1s");
    }
}

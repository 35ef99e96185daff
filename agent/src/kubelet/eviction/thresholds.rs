//! Eviction signals and thresholds as kubelet spells them (`pkg/kubelet/eviction/api`,
//! `pkg/kubelet/eviction/helpers.go` `ParseThresholdConfig`): `--eviction-hard`,
//! `--eviction-soft` (`signal<quantity|percent%`, comma-separated), `--eviction-soft-grace-period`
//! and `--eviction-minimum-reclaim` (`signal=value`), and the matching `KubeletConfiguration`
//! maps.
//!
//! | signal                        | measured as                                             | resource             | condition        |
//! |-------------------------------|---------------------------------------------------------|----------------------|------------------|
//! | `memory.available`            | MemTotal − node working set (usage − inactive_file)     | `memory`             | `MemoryPressure` |
//! | `allocatableMemory.available` | allocatable − working set of the `kubepods` cgroup      | `memory`             | `MemoryPressure` |
//! | `nodefs.available`            | `statvfs` of `--root-dir`: available blocks             | `ephemeral-storage`  | `DiskPressure`   |
//! | `nodefs.inodesFree`           | `statvfs` of `--root-dir`: free inodes                  | `inodes`             | `DiskPressure`   |
//! | `imagefs.available`           | `statvfs` of the image store                            | `ephemeral-storage`  | `DiskPressure`   |
//! | `imagefs.inodesFree`          | `statvfs` of the image store: free inodes               | `inodes`             | `DiskPressure`   |
//! | `pid.available`               | `kernel.pid_max` − tasks (`sysinfo` procs)              | `pids`               | `PIDPressure`    |
//!
//! As in kubelet, `0%` and `100%` disable a threshold, quantities must be positive, a soft
//! threshold needs a grace period, and every `memory.available` threshold is copied to
//! `allocatableMemory.available` (kubelet does so when `enforceNodeAllocatable` holds
//! `pods`, its default).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::qos::Quantity;

/// The default of `--eviction-hard` (kubelet's `DefaultEvictionHard` on Linux).
pub const DEFAULT_EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%";

/// What eviction observes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    MemoryAvailable,
    AllocatableMemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    PidAvailable,
}

/// The node condition a signal drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PressureKind {
    Memory,
    Disk,
    Pid,
}

impl PressureKind {
    /// The node condition type (`MemoryPressure`, …).
    pub fn condition(self) -> &'static str {
        match self {
            Self::Memory => crate::node::MEMORY_PRESSURE,
            Self::Disk => crate::node::DISK_PRESSURE,
            Self::Pid => crate::node::PID_PRESSURE,
        }
    }
}

impl Signal {
    /// Every signal, in kubelet's reclaim order (memory first).
    pub const ALL: [Signal; 7] = [
        Self::MemoryAvailable,
        Self::AllocatableMemoryAvailable,
        Self::NodeFsAvailable,
        Self::NodeFsInodesFree,
        Self::ImageFsAvailable,
        Self::ImageFsInodesFree,
        Self::PidAvailable,
    ];

    /// kubelet's name of the signal.
    pub fn name(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::AllocatableMemoryAvailable => "allocatableMemory.available",
            Self::NodeFsAvailable => "nodefs.available",
            Self::NodeFsInodesFree => "nodefs.inodesFree",
            Self::ImageFsAvailable => "imagefs.available",
            Self::ImageFsInodesFree => "imagefs.inodesFree",
            Self::PidAvailable => "pid.available",
        }
    }

    /// The resource the signal starves (kubelet's `signalToResource`), as named in messages.
    pub fn resource(self) -> &'static str {
        match self {
            Self::MemoryAvailable | Self::AllocatableMemoryAvailable => "memory",
            Self::NodeFsAvailable | Self::ImageFsAvailable => "ephemeral-storage",
            Self::NodeFsInodesFree | Self::ImageFsInodesFree => "inodes",
            Self::PidAvailable => "pids",
        }
    }

    /// The node condition it drives (kubelet's `signalToNodeCondition`).
    pub fn pressure(self) -> PressureKind {
        match self {
            Self::MemoryAvailable | Self::AllocatableMemoryAvailable => PressureKind::Memory,
            Self::PidAvailable => PressureKind::Pid,
            _ => PressureKind::Disk,
        }
    }

    fn parse(name: &str) -> Result<Self, ThresholdError> {
        Self::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| ThresholdError::UnsupportedSignal(name.to_owned()))
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A threshold's value: an absolute amount or a fraction of the capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    /// Bytes, inodes or pids.
    Quantity(u64),
    /// A fraction in (0, 1).
    Percentage(f64),
}

impl ThresholdValue {
    /// The amount for a resource of `capacity` (kubelet's `GetThresholdQuantity`: the
    /// percentage of the capacity, truncated).
    pub fn amount(self, capacity: u64) -> u64 {
        match self {
            Self::Quantity(q) => q,
            Self::Percentage(p) => (capacity as f64 * p) as u64,
        }
    }
}

/// One threshold: below `value`, the signal is under pressure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: ThresholdValue,
    /// Zero for a hard threshold; for a soft one, how long it must be met before eviction.
    pub grace_period: Duration,
    /// `--eviction-minimum-reclaim`: once met, the signal must recover this much beyond the
    /// threshold before the threshold counts as resolved.
    pub min_reclaim: Option<ThresholdValue>,
}

impl Threshold {
    /// Hard thresholds evict at once, with a 1 s grace period.
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }
}

/// Why the eviction flags or fields are wrong (kubelet's messages where it has one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThresholdError {
    #[error("unsupported eviction signal {0}")]
    UnsupportedSignal(String),
    #[error("invalid eviction threshold {0:?}: expected SIGNAL<QUANTITY or SIGNAL<PERCENT%")]
    Syntax(String),
    #[error("invalid eviction setting {0:?}: expected SIGNAL=VALUE")]
    PairSyntax(String),
    #[error("found duplicate eviction threshold for signal {0}")]
    Duplicate(String),
    #[error("eviction percentage threshold {signal} must be >= 0% and <= 100%: {value}")]
    Percentage { signal: String, value: String },
    #[error("eviction threshold {signal} must be positive: {value}")]
    NotPositive { signal: String, value: String },
    #[error("eviction threshold {signal}: {reason}")]
    Quantity { signal: String, reason: String },
    #[error("no grace period specified for soft eviction threshold {0}")]
    NoGracePeriod(String),
    #[error("eviction soft grace period {signal}: {reason}")]
    GracePeriod { signal: String, reason: String },
}

/// A parsed `signal<value` list (`None` value: disabled by `0%` or `100%`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThresholdMap(pub BTreeMap<Signal, Option<ThresholdValue>>);

impl ThresholdMap {
    /// Parses the flag form `memory.available<100Mi,nodefs.available<10%`.
    pub fn parse_flag(text: &str) -> Result<Self, ThresholdError> {
        let mut out = BTreeMap::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) = item
                .split_once('<')
                .ok_or_else(|| ThresholdError::Syntax(item.to_owned()))?;
            insert(&mut out, name.trim(), value.trim())?;
        }
        Ok(Self(out))
    }

    /// From a `KubeletConfiguration` map (`{"memory.available": "100Mi"}`).
    pub fn from_config(map: &BTreeMap<String, String>) -> Result<Self, ThresholdError> {
        let mut out = BTreeMap::new();
        for (name, value) in map {
            insert(&mut out, name.trim(), value.trim())?;
        }
        Ok(Self(out))
    }

    /// The flag form again (for `/configz`).
    pub fn to_config(&self) -> BTreeMap<String, String> {
        self.0
            .iter()
            .map(|(signal, value)| (signal.name().to_owned(), value_text(*value)))
            .collect()
    }
}

fn value_text(value: Option<ThresholdValue>) -> String {
    match value {
        None => "0%".to_owned(),
        Some(ThresholdValue::Quantity(q)) => crate::node::memory_quantity(q).0,
        Some(ThresholdValue::Percentage(p)) => {
            format!("{}%", (p * 100.0 * 1000.0).round() / 1000.0)
        }
    }
}

fn insert(
    out: &mut BTreeMap<Signal, Option<ThresholdValue>>,
    name: &str,
    value: &str,
) -> Result<(), ThresholdError> {
    let signal = Signal::parse(name)?;
    if out.contains_key(&signal) {
        return Err(ThresholdError::Duplicate(name.to_owned()));
    }
    out.insert(signal, parse_value(signal, value)?);
    Ok(())
}

/// kubelet's `parseThresholdStatement` value: `N%` (0% and 100% disable) or a positive
/// quantity.
fn parse_value(signal: Signal, value: &str) -> Result<Option<ThresholdValue>, ThresholdError> {
    if let Some(number) = value.strip_suffix('%') {
        if value == "0%" || value == "100%" {
            return Ok(None);
        }
        let bad = || ThresholdError::Percentage {
            signal: signal.name().to_owned(),
            value: value.to_owned(),
        };
        let percent: f64 = number.trim().parse().map_err(|_| bad())?;
        if !(0.0..=100.0).contains(&percent) || percent.is_nan() {
            return Err(bad());
        }
        return Ok(Some(ThresholdValue::Percentage(percent / 100.0)));
    }
    let quantity = Quantity::parse(value).map_err(|e| ThresholdError::Quantity {
        signal: signal.name().to_owned(),
        reason: e.to_string(),
    })?;
    let amount = quantity.value().map_err(|e| ThresholdError::Quantity {
        signal: signal.name().to_owned(),
        reason: e.to_string(),
    })?;
    if amount <= 0 {
        return Err(ThresholdError::NotPositive {
            signal: signal.name().to_owned(),
            value: value.to_owned(),
        });
    }
    Ok(Some(ThresholdValue::Quantity(amount as u64)))
}

/// A parsed `signal=value` list: `--eviction-soft-grace-period` (durations) or
/// `--eviction-minimum-reclaim` (quantities or percentages).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SignalMap(pub BTreeMap<String, String>);

impl SignalMap {
    /// Parses `memory.available=1m30s,nodefs.available=2m`; values are checked by
    /// [`EvictionSettings::build`].
    pub fn parse_flag(text: &str) -> Result<Self, ThresholdError> {
        let mut out = BTreeMap::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| ThresholdError::PairSyntax(item.to_owned()))?;
            let signal = Signal::parse(name.trim())?;
            if out
                .insert(signal.name().to_owned(), value.trim().to_owned())
                .is_some()
            {
                return Err(ThresholdError::Duplicate(name.to_owned()));
            }
        }
        Ok(Self(out))
    }
}

/// Everything that configures node-pressure eviction.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionSettings {
    /// Hard then soft thresholds (with `allocatableMemory.available` copies).
    pub thresholds: Vec<Threshold>,
    /// `--eviction-max-pod-grace-period`: the grace period of soft evictions (kubelet
    /// default 0; a pod's own shorter period wins).
    pub max_pod_grace_period_seconds: i64,
    /// `--eviction-pressure-transition-period` (kubelet default 5m): how long a pressure
    /// condition stays True after its thresholds stopped being met.
    pub pressure_transition_period: Duration,
}

impl Default for EvictionSettings {
    fn default() -> Self {
        let hard = ThresholdMap::parse_flag(DEFAULT_EVICTION_HARD).unwrap_or_default();
        Self::build(
            &hard,
            &ThresholdMap::default(),
            &SignalMap::default(),
            &SignalMap::default(),
            0,
            Duration::from_secs(300),
        )
        .unwrap_or(Self {
            thresholds: Vec::new(),
            max_pod_grace_period_seconds: 0,
            pressure_transition_period: Duration::from_secs(300),
        })
    }
}

impl EvictionSettings {
    /// kubelet's `ParseThresholdConfig` over the parsed flags.
    pub fn build(
        hard: &ThresholdMap,
        soft: &ThresholdMap,
        soft_grace_period: &SignalMap,
        minimum_reclaim: &SignalMap,
        max_pod_grace_period_seconds: i64,
        pressure_transition_period: Duration,
    ) -> Result<Self, ThresholdError> {
        let mut reclaim = BTreeMap::new();
        for (name, text) in &minimum_reclaim.0 {
            let signal = Signal::parse(name)?;
            if let Some(value) = parse_value(signal, text)? {
                reclaim.insert(signal, value);
            }
        }
        let mut grace = BTreeMap::new();
        for (name, text) in &soft_grace_period.0 {
            let signal = Signal::parse(name)?;
            let period = crate::kubelet::config::parse_duration(text).map_err(|reason| {
                ThresholdError::GracePeriod {
                    signal: name.clone(),
                    reason,
                }
            })?;
            grace.insert(signal, period);
        }
        let mut thresholds = Vec::new();
        let mut push = |signal: Signal, value: ThresholdValue, grace_period: Duration| {
            thresholds.push(Threshold {
                signal,
                value,
                grace_period,
                min_reclaim: reclaim.get(&signal).copied(),
            });
        };
        for (soft_map, is_soft) in [(hard, false), (soft, true)] {
            for (signal, value) in &soft_map.0 {
                let Some(value) = value else { continue };
                let grace_period = if is_soft {
                    match grace.get(signal) {
                        Some(g) if !g.is_zero() => *g,
                        _ => return Err(ThresholdError::NoGracePeriod(signal.name().to_owned())),
                    }
                } else {
                    Duration::ZERO
                };
                push(*signal, *value, grace_period);
                if *signal == Signal::MemoryAvailable {
                    push(Signal::AllocatableMemoryAvailable, *value, grace_period);
                }
            }
        }
        Ok(Self {
            thresholds,
            max_pod_grace_period_seconds,
            pressure_transition_period,
        })
    }

    /// The hard `memory.available` threshold in bytes for a node of `capacity` bytes (what
    /// allocatable subtracts).
    pub fn hard_amount(&self, signal: Signal, capacity: u64) -> u64 {
        self.thresholds
            .iter()
            .find(|t| t.signal == signal && t.is_hard())
            .map_or(0, |t| t.value.amount(capacity))
    }

    /// The hard percentage of `signal`, when set as one.
    pub fn hard_percent(&self, signal: Signal) -> Option<f64> {
        self.thresholds
            .iter()
            .find(|t| t.signal == signal && t.is_hard())
            .and_then(|t| match t.value {
                ThresholdValue::Percentage(p) => Some(p),
                ThresholdValue::Quantity(_) => None,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_kubelets() {
        let settings = EvictionSettings::default();
        let summary: Vec<_> = settings
            .thresholds
            .iter()
            .map(|t| (t.signal.name(), t.value, t.is_hard()))
            .collect();
        assert_eq!(
            summary,
            [
                (
                    "memory.available",
                    ThresholdValue::Quantity(100 << 20),
                    true
                ),
                (
                    "allocatableMemory.available",
                    ThresholdValue::Quantity(100 << 20),
                    true
                ),
                ("nodefs.available", ThresholdValue::Percentage(0.1), true),
                ("nodefs.inodesFree", ThresholdValue::Percentage(0.05), true),
                ("imagefs.available", ThresholdValue::Percentage(0.15), true),
            ]
        );
        assert_eq!(
            settings.pressure_transition_period,
            Duration::from_secs(300)
        );
    }

    #[test]
    fn thresholds_parse_quantities_and_percentages_with_kubelets_errors() {
        let map = ThresholdMap::parse_flag("memory.available<1.5Gi, pid.available<10%").unwrap();
        assert_eq!(
            map.0[&Signal::MemoryAvailable],
            Some(ThresholdValue::Quantity(3 << 29))
        );
        assert_eq!(
            map.0[&Signal::PidAvailable],
            Some(ThresholdValue::Percentage(0.1))
        );
        assert_eq!(
            ThresholdMap::parse_flag("nodefs.available<0%").unwrap().0[&Signal::NodeFsAvailable],
            None
        );
        let err = |text| ThresholdMap::parse_flag(text).unwrap_err().to_string();
        assert_eq!(
            err("cpu.available<1"),
            "unsupported eviction signal cpu.available"
        );
        assert_eq!(
            err("memory.available<0"),
            "eviction threshold memory.available must be positive: 0"
        );
        assert_eq!(
            err("nodefs.available<150%"),
            "eviction percentage threshold nodefs.available must be >= 0% and <= 100%: 150%"
        );
        assert!(err("memory.available=1Gi").contains("expected SIGNAL<QUANTITY"));
        assert!(err("memory.available<lots").starts_with("eviction threshold memory.available:"));
        assert_eq!(
            err("memory.available<1Gi,memory.available<2Gi"),
            "found duplicate eviction threshold for signal memory.available"
        );
    }

    #[test]
    fn soft_thresholds_need_a_grace_period_and_min_reclaim_attaches() {
        let hard = ThresholdMap::parse_flag("memory.available<100Mi").unwrap();
        let soft = ThresholdMap::parse_flag("nodefs.available<20%").unwrap();
        let none = SignalMap::default();
        let err =
            EvictionSettings::build(&hard, &soft, &none, &none, 30, Duration::ZERO).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no grace period specified for soft eviction threshold nodefs.available"
        );
        let grace = SignalMap::parse_flag("nodefs.available=1m30s").unwrap();
        let reclaim = SignalMap::parse_flag("memory.available=50Mi").unwrap();
        let settings =
            EvictionSettings::build(&hard, &soft, &grace, &reclaim, 30, Duration::ZERO).unwrap();
        assert_eq!(settings.thresholds.len(), 3);
        assert_eq!(
            settings.thresholds[0].min_reclaim,
            Some(ThresholdValue::Quantity(50 << 20))
        );
        let soft_one = settings.thresholds[2];
        assert_eq!(soft_one.signal, Signal::NodeFsAvailable);
        assert_eq!(soft_one.grace_period, Duration::from_secs(90));
        assert!(!soft_one.is_hard());
        assert!(SignalMap::parse_flag("memory.available").is_err());
        let bad_grace = SignalMap::parse_flag("nodefs.available=soon").unwrap();
        assert!(
            EvictionSettings::build(&hard, &soft, &bad_grace, &none, 0, Duration::ZERO).is_err()
        );
    }

    #[test]
    fn percentages_are_of_the_capacity_and_round_trip_for_configz() {
        assert_eq!(ThresholdValue::Percentage(0.1).amount(1000), 100);
        assert_eq!(ThresholdValue::Quantity(7).amount(1000), 7);
        let map = ThresholdMap::parse_flag(DEFAULT_EVICTION_HARD).unwrap();
        let config = map.to_config();
        assert_eq!(config["memory.available"], "100Mi");
        assert_eq!(config["imagefs.available"], "15%");
        assert_eq!(ThresholdMap::from_config(&config).unwrap(), map);
    }
}

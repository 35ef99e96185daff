//! kubelet's active deadline handler (`pkg/kubelet/active_deadline.go`, v1.37).
//!
//! A pod whose `spec.activeDeadlineSeconds` is set and whose `status.startTime` lies at least
//! that long in the past is failed by the node: phase `Failed`, reason `DeadlineExceeded`,
//! message `Pod was active on the node longer than the specified deadline`, a `Normal`
//! event with that reason and message, and its containers killed with the pod's grace
//! period. The syncer checks it at every sync of a running pod ([`check`]); a pod with a
//! deadline still ahead is synced again when it expires (kubelet's work-queue enqueue at
//! the deadline), and an update of the spec (the deadline may be shortened on a running
//! API pod) triggers a sync, hence a new check.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// kubelet's `reason` (also the event's reason).
pub const REASON: &str = "DeadlineExceeded";
/// kubelet's `message`.
pub const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// Where a pod stands against its active deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// No `activeDeadlineSeconds`, or no start time yet.
    Unset,
    /// The deadline is this far ahead.
    In(Duration),
    /// The pod has been active at least as long as its deadline (kubelet's
    /// `pastActiveDeadline`: `now - startTime >= activeDeadlineSeconds`).
    Exceeded,
}

/// Where `pod`, started at `start`, stands at `now`.
pub fn check(pod: &Pod, start: Option<&Time>, now: SystemTime) -> Deadline {
    let Some(seconds) = pod.spec.as_ref().and_then(|s| s.active_deadline_seconds) else {
        return Deadline::Unset;
    };
    let Some(start) = start else {
        return Deadline::Unset;
    };
    // The API server requires a positive value; a static pod's zero or negative one ends at once.
    let allowed = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    let started = SystemTime::from(start.0);
    let active = now.duration_since(started).unwrap_or_default();
    match allowed.checked_sub(active) {
        Some(left) if !left.is_zero() => Deadline::In(left),
        _ => Deadline::Exceeded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(deadline: Option<i64>) -> Pod {
        let mut pod: Pod = serde_yaml::from_str(
            "metadata: {name: p, uid: u1}\nspec: {containers: [{name: c, image: i}]}\n",
        )
        .unwrap();
        pod.spec.as_mut().unwrap().active_deadline_seconds = deadline;
        pod
    }

    fn start_at(seconds: u64) -> Time {
        Time(at(seconds).try_into().unwrap())
    }

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn a_pod_without_deadline_or_start_time_has_none() {
        let start = start_at(1000);
        assert_eq!(check(&pod(None), Some(&start), at(5000)), Deadline::Unset);
        assert_eq!(check(&pod(Some(3)), None, at(5000)), Deadline::Unset);
    }

    #[test]
    fn the_deadline_counts_from_the_start_time_and_is_reached_at_equality() {
        let start = start_at(1000);
        let p = pod(Some(30));
        assert_eq!(
            check(&p, Some(&start), at(1000)),
            Deadline::In(Duration::from_secs(30))
        );
        assert_eq!(
            check(&p, Some(&start), at(1029) + Duration::from_millis(500)),
            Deadline::In(Duration::from_millis(500))
        );
        assert_eq!(check(&p, Some(&start), at(1030)), Deadline::Exceeded);
        assert_eq!(check(&p, Some(&start), at(9000)), Deadline::Exceeded);
    }

    #[test]
    fn a_shortened_deadline_already_past_is_exceeded_and_a_clock_step_back_is_not() {
        let start = start_at(1000);
        assert_eq!(
            check(&pod(Some(300)), Some(&start), at(1010)),
            Deadline::In(Duration::from_secs(290))
        );
        assert_eq!(
            check(&pod(Some(2)), Some(&start), at(1010)),
            Deadline::Exceeded
        );
        assert_eq!(
            check(&pod(Some(2)), Some(&start), at(900)),
            Deadline::In(Duration::from_secs(2))
        );
        assert_eq!(
            check(&pod(Some(0)), Some(&start), at(1000)),
            Deadline::Exceeded
        );
    }
}

//! The agent's heap with glibc's malloc: two arenas, and free memory handed back to the
//! kernel now and then.
//!
//! The agent's memory is mostly small allocations made by whichever runtime thread ran a
//! pod's task. glibc gives each thread its own arena (up to eight per core) and returns free
//! memory to the kernel only from the top of an arena, so a burst of pod starts leaves
//! freed chunks resident in several arenas: at 250 static pods (release build), ~6 MiB for
//! the extra arenas and ~7 MiB more free but not returned, against ~30 MiB in use. Two
//! arenas (the two workers rarely contend) and a `malloc_trim` every [`TRIM_PERIOD`] keep
//! the resident set close to what is in use. `MALLOC_ARENA_MAX` in the environment still
//! wins over the limit here. Other C libraries: nothing is done.

use std::time::Duration;

/// How often free heap memory is returned to the kernel.
pub const TRIM_PERIOD: Duration = Duration::from_secs(10);

/// Arenas the agent's threads share.
#[cfg(target_env = "gnu")]
const ARENAS: libc::c_int = 2;

/// Limits malloc to [`ARENAS`] arenas, unless `MALLOC_ARENA_MAX` chose a number; call it
/// before the async runtime starts its threads.
pub fn limit_arenas() {
    #[cfg(target_env = "gnu")]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt sets a malloc parameter; it takes malloc's own lock.
        if unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENAS) } == 0 {
            tracing::debug!("mallopt(M_ARENA_MAX) refused; malloc keeps its default arenas");
        }
    }
}

/// Returns free heap memory to the kernel every `period`, forever (glibc's `malloc_trim`,
/// which releases free pages anywhere in every arena, not only at the top).
pub async fn trim_every(period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        #[cfg(target_env = "gnu")]
        // It walks every arena under its lock: off the async workers.
        // SAFETY: malloc_trim only releases memory malloc holds free.
        let _ = tokio::task::spawn_blocking(|| unsafe { libc::malloc_trim(0) }).await;
    }
}

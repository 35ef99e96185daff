//! [`run_suite`]: the `main` of an end-to-end test binary (libtest-mimic, `harness = false`):
//! one environment shared by all its tests (control plane, agent, registry), started only
//! when a selected test will run and we are root (otherwise every test is listed as
//! ignored); on failure the environment's report (agent and control plane logs) is printed;
//! it is dropped before exiting.

use std::sync::Arc;

use anyhow::Result;
use libtest_mimic::{Arguments, Failed, Trial};

/// A named test of an environment `E`.
pub type SuiteTest<E> = (&'static str, fn(&E) -> Result<()>);

/// Whether libtest's filter arguments select the test `name`.
pub fn is_selected(args: &Arguments, name: &str) -> bool {
    let matches = |pattern: &str| {
        if args.exact {
            name == pattern
        } else {
            name.contains(pattern)
        }
    };
    args.filter.as_deref().is_none_or(matches) && !args.skip.iter().any(|s| matches(s))
}

/// Runs `tests` against the environment `start` makes; `report` prints diagnostics (log
/// tails) when a test failed. Exits the process.
pub fn run_suite<E: Send + Sync + 'static>(
    binary: &str,
    tests: &'static [SuiteTest<E>],
    start: impl FnOnce() -> Result<E>,
    report: impl FnOnce(&E),
) -> ! {
    let args = Arguments::from_args();
    let selected = tests.iter().any(|(name, _)| is_selected(&args, name));
    if args.list || !selected || !nix::unistd::geteuid().is_root() {
        let trials = tests
            .iter()
            .map(|(name, _)| Trial::test(*name, || Ok(())).with_ignored_flag(!args.list))
            .collect();
        libtest_mimic::run(&args, trials).exit();
    }
    let env = match start() {
        Ok(env) => Arc::new(env),
        Err(err) => {
            eprintln!("{binary}: cannot start: {err:#}");
            std::process::exit(1);
        }
    };
    let trials = tests
        .iter()
        .map(|&(name, test)| {
            let env = Arc::clone(&env);
            Trial::test(name, move || {
                test(&env).map_err(|e| Failed::from(format!("{e:#}")))
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    if conclusion.has_failed() {
        report(&env);
    }
    // `exit` skips destructors: stop the agent and the control plane first.
    drop(env);
    conclusion.exit();
}

/// Runs `f` on a fresh current-thread tokio runtime.
pub fn block_on<T, F: std::future::Future<Output = Result<T>>>(f: F) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

//! [`run_suite`]: the `main` of an end-to-end test binary whose tests share one expensive
//! environment (control plane, agent, registry) started once, only when a selected test
//! will run, as root.

use std::sync::Arc;

use anyhow::Result;
use libtest_mimic::{Arguments, Failed, Trial};

/// A test of a suite over the shared environment `E`.
pub type SuiteTest<E> = (&'static str, fn(&E) -> Result<()>);

/// Runs `tests` (libtest arguments from the command line) over the environment `start`
/// builds; without root or with `--list`, lists them as ignored. `on_failure` prints
/// diagnostics (log tails) when a test failed. Exits the process.
pub fn run_suite<E: Send + Sync + 'static>(
    name: &str,
    tests: &'static [SuiteTest<E>],
    start: impl FnOnce() -> Result<E>,
    on_failure: impl FnOnce(&E),
) -> ! {
    let args = Arguments::from_args();
    if args.list || !nix::unistd::geteuid().is_root() {
        let trials = tests
            .iter()
            .map(|(name, _)| Trial::test(*name, || Ok(())).with_ignored_flag(!args.list))
            .collect();
        libtest_mimic::run(&args, trials).exit();
    }
    let env = match start() {
        Ok(env) => Arc::new(env),
        Err(err) => {
            eprintln!("{name}: cannot start: {err:#}");
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
        on_failure(&env);
    }
    drop(env);
    conclusion.exit()
}

/// Runs `f` on a fresh current-thread tokio runtime.
pub fn block_on<F: std::future::Future<Output = Result<()>>>(f: F) -> Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

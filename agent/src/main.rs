//! The `ironlet` binary: argument parsing, logging, and the process start-up order that the
//! runtime depends on: the zygote is forked *before* tokio starts any thread.

// `/configz` writes the whole KubeletConfiguration in one `json!` literal.
#![recursion_limit = "256"]

mod cli;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

fn main() -> ExitCode {
    let matches = cli::Cli::command().get_matches();
    let args = cli::Cli::from_arg_matches(&matches).unwrap_or_else(|err| err.exit());
    init_logging(args.verbose);
    match cli::run(args, &matches) {
        Ok(code) => code,
        // A reader that stops early (`| head -1`) is normal: see cli::output.
        Err(err) if cli::output::is_stdout_closed(&err) => ExitCode::SUCCESS,
        Err(err) => {
            // Not `eprintln!`: with stderr's reader gone it would panic (status 101).
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "ironlet: {}", error_chain(&err));
            ExitCode::from(1)
        }
    }
}

/// The error and its causes joined by ": ", skipping a cause whose text the message
/// before it already includes (typed errors often print their source inline).
fn error_chain(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("IRONLET_LOG")
        // libcontainer warns about every v1 controller this kernel lacks, and its errors
        // reach the user inside ironlet's own messages; show them only when asked (-vv).
        .unwrap_or_else(|_| {
            let lib = if verbose >= 2 { default } else { "off" };
            tracing_subscriber::EnvFilter::new(format!(
                "{default},libcgroups={lib},libcontainer={lib}"
            ))
        });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A failed log write (stderr's reader gone: `ironlet -v ctr run … 2>&1 | head`) is
        // dropped; reporting it would `eprintln!` into the same closed pipe and panic, which
        // killed `ctr run` before its `--rm` clean-up.
        .log_internal_errors(false)
        .init();
}

//! The `ironlet` binary: argument parsing, logging, and the process start-up order that the
//! runtime depends on: the zygote is forked *before* tokio starts any thread.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    init_logging(args.verbose);
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("ironlet: {err:#}");
            ExitCode::from(1)
        }
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("IRONLET_LOG")
        // libcontainer warns about every v1 controller this kernel lacks; keep that quiet.
        .unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new(format!(
                "{default},libcgroups=error,libcontainer=error"
            ))
        });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

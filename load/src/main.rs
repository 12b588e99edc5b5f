//! `tokenrouter-load`: see `tokenrouter-load --help` and docs/load-generator.md.

use std::process::ExitCode;

use clap::Parser;
use tokenrouter_load::{execute, LoadArgs};

fn main() -> ExitCode {
    let args = LoadArgs::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return fail(&anyhow::anyhow!("starting the async runtime: {e}")),
    };
    // Ctrl-C ends the run early; what finished is still summarized and written.
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match runtime.block_on(execute(&args, interrupt)) {
        Ok(report) => {
            print!("{}", report.render());
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

fn fail(e: &anyhow::Error) -> ExitCode {
    eprintln!("tokenrouter-load: {e:#}");
    ExitCode::FAILURE
}

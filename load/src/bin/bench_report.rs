//! `tokenrouter-bench-report --dir load/reports/DATE`: turns the runs that
//! `load/run-bench` recorded there (`matrix.tsv`, `runs/*.json`, `context.md`,
//! `commands.txt`, and `notes.md` if someone wrote observations) into `report.md`, `throughput.png` and `latency_cdf.png`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tokenrouter_load::bench::{charts, markdown, Matrix};

#[derive(Parser, Debug)]
#[command(name = "tokenrouter-bench-report", version)]
struct Args {
    /// The report folder run-bench filled.
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, default_value = "tokenrouter benchmark")]
    title: String,
}

fn main() -> ExitCode {
    match write_report(&Args::parse()) {
        Ok(path) => {
            println!("{}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tokenrouter-bench-report: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn write_report(args: &Args) -> anyhow::Result<PathBuf> {
    let matrix = Matrix::load(&args.dir)?;
    charts::write_throughput(&matrix, &args.dir.join("throughput.png"))?;
    charts::write_latency_cdfs(&matrix, &args.dir.join("latency_cdf.png"))?;
    let read = |name: &str| std::fs::read_to_string(args.dir.join(name)).unwrap_or_default();
    let (preamble, commands, notes) = (read("context.md"), read("commands.txt"), read("notes.md"));
    let charts = [
        ("throughput.png".to_string(), "Throughput vs concurrency".to_string()),
        ("latency_cdf.png".to_string(), "Latency CDFs by concurrency".to_string()),
    ];
    let context = markdown::Context {
        title: &args.title,
        preamble: &preamble,
        commands: &commands,
        notes: &notes,
        charts: &charts,
    };
    let path = args.dir.join("report.md");
    std::fs::write(&path, markdown::render(&matrix, &context))?;
    Ok(path)
}

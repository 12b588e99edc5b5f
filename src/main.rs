use clap::Parser;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = tokenrouter::cli::Cli::parse();
    if let Err(e) = tokenrouter::cli::run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

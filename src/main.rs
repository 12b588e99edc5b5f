use clap::Parser;

fn main() {
    let cli = tokenrouter::cli::Cli::parse();
    // A chat's terminal is the conversation: an in-process server's log stays quiet there.
    let default_level = match cli.command {
        tokenrouter::cli::Command::Chat(_) => "warn",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_level.into()))
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = tokenrouter::cli::run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

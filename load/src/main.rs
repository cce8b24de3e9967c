//! `meshfed-load`: the load tool's command line (also run as `meshfed load ...`).

use clap::Parser;

/// Load a meshfed server with simulated proxies and registry churn (see the README's
/// "Load testing").
#[derive(Parser, Debug)]
#[command(name = "meshfed-load", version, about)]
struct Cli {
    #[command(flatten)]
    args: meshfed_load::LoadArgs,
}

fn main() -> anyhow::Result<()> {
    meshfed_load::run(Cli::parse().args)
}

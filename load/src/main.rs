//! `meshfed-load`: the load tool's command line (also run as `meshfed load ...`).
//! `meshfed-load csr ...` is the CreateCertificate throughput mode.

use clap::Parser;

/// jemalloc, as the server: every proxy receives a few ~1 MB responses while
/// thousands of small long-lived allocations are made between them, and glibc's heap
/// keeps the freed responses' memory (with 300 sidecars of a 1,000-service mesh: 480
/// KiB of RSS per proxy, 150 KiB with a fixed mmap threshold). Freed pages are purged
/// by jemalloc's background threads.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Load a meshfed server with simulated proxies and registry churn (see the README's
/// "Load testing"). `meshfed-load csr --help`: CreateCertificate throughput.
#[derive(Parser, Debug)]
#[command(
    name = "meshfed-load",
    version,
    about,
    after_help = "CreateCertificate throughput: meshfed-load csr --help"
)]
struct Cli {
    #[command(flatten)]
    args: meshfed_load::LoadArgs,
}

/// CreateCertificate throughput over TLS with client certificates.
#[derive(Parser, Debug)]
#[command(
    name = "meshfed-load csr",
    bin_name = "meshfed-load csr",
    version,
    about = "CreateCertificate throughput: concurrent TLS clients with client certificates \
             against the secure port (see the README's \"Load testing\")"
)]
struct CsrCli {
    #[command(flatten)]
    args: meshfed_load::csr::CsrArgs,
}

fn main() -> anyhow::Result<()> {
    meshfed_load::stop_heap_sampling();
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "csr") {
        args.remove(1);
        return meshfed_load::csr::run(CsrCli::parse_from(args).args);
    }
    meshfed_load::run(Cli::parse().args)
}

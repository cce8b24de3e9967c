//! Bridge a Consul catalog into the mesh and watch a proxy receive it.
//!
//! ```text
//! cargo run --example consul                                   # a bundled fake Consul
//! cargo run --example consul -- --consul-url http://127.0.0.1:8500   # a real agent
//! ```
//!
//! meshfed runs in-process with the Consul registry pointed at the agent; an ADS test
//! client (what Envoy or a proxyless gRPC client would do) subscribes to every cluster
//! and to the endpoints of the Consul ones: `outbound|<port>||<name>.service.consul`.
//! With the fake, a health check then fails and an instance joins, and the EDS
//! updates that follow are printed. See README.md beside this file.

use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use envoy_types::pb::envoy::config::core::v3::address::Address;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use meshfed::ads::TypeUrl;
use meshfed::app::ConsulSettings;
use meshfed::testing::{AdsClient, FakeServer, node};
use meshfed_consul::fake::{CheckStatus, FakeConsul, Instance};

#[derive(Parser, Debug)]
#[command(about = "Bridge a Consul catalog into the mesh and show what a proxy receives")]
struct Args {
    /// A real Consul HTTP API (e.g. `consul agent -dev` on http://127.0.0.1:8500).
    /// Without it a bundled fake Consul with a few services is used.
    #[arg(long = "consul-url")]
    consul_url: Option<String>,
    /// ACL token for the real agent (else CONSUL_HTTP_TOKEN).
    #[arg(long = "consul-token")]
    consul_token: Option<String>,
    /// With a real agent: keep printing endpoint updates until Ctrl-C.
    #[arg(long)]
    follow: bool,
}

const PROXY: &str = "sidecar~10.2.0.1~app.default~default.svc.cluster.local";

/// A few services: `web` (HTTP, two instances), `api` (gRPC), `db` (TCP).
fn populate(consul: &FakeConsul) {
    consul.register(
        Instance::new("web", "web-1", "10.0.0.1", 8080)
            .with_meta("protocol", "http")
            .with_tags(&["version|v1"]),
    );
    consul.register(
        Instance::new("web", "web-2", "10.0.0.2", 8080)
            .with_meta("protocol", "http")
            .with_tags(&["version|v2"]),
    );
    consul.register(Instance::new("api", "api-1", "10.0.1.1", 9090).with_tags(&["grpc"]));
    consul.register(Instance::new("db", "db-1", "10.0.2.1", 5432));
}

fn endpoints(cla: &ClusterLoadAssignment) -> Vec<String> {
    cla.endpoints
        .iter()
        .flat_map(|locality| {
            let region = locality
                .locality
                .as_ref()
                .map(|l| l.region.clone())
                .unwrap_or_default();
            locality.lb_endpoints.iter().filter_map(move |e| {
                let Some(HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                    return None;
                };
                let Some(Address::SocketAddress(s)) = ep.address.as_ref()?.address.as_ref() else {
                    return None;
                };
                let port = match s.port_specifier {
                    Some(
                        envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p),
                    ) => p,
                    _ => 0,
                };
                Some(format!("{}:{port} (locality {region})", s.address))
            })
        })
        .collect()
}

fn print_assignments(title: &str, assignments: &[ClusterLoadAssignment]) {
    println!("{title}");
    for cla in assignments {
        let eps = endpoints(cla);
        println!("  {}: {} endpoint(s)", cla.cluster_name, eps.len());
        for e in eps {
            println!("    {e}");
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();

    // The bundled fake Consul, unless a real one is given.
    let fake = match &args.consul_url {
        Some(_) => None,
        None => {
            let consul = FakeConsul::start()
                .await
                .context("starting the fake Consul")?;
            populate(&consul);
            println!("fake Consul at {} (datacenter dc1)", consul.url());
            Some(consul)
        }
    };
    let url = match (&args.consul_url, &fake) {
        (Some(url), _) => url.clone(),
        (None, Some(fake)) => fake.url(),
        (None, None) => unreachable!("one of the two is set"),
    };
    let settings = ConsulSettings {
        token: args
            .consul_token
            .clone()
            .or_else(|| std::env::var("CONSUL_HTTP_TOKEN").ok()),
        ..ConsulSettings::new(&url)
    };
    let suffix = format!(".{}", settings.domain_suffix);

    let server = FakeServer::builder()
        .configure(move |c| c.consul = Some(settings))
        .start()
        .await
        .with_context(|| format!("starting meshfed with the Consul registry at {url}"))?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !server.server().aggregate().has_synced() {
        if tokio::time::Instant::now() > deadline {
            bail!("the Consul registry did not sync within 30 s: is Consul reachable at {url}?");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.sync().await;
    println!("meshfed serving ADS at {}", server.grpc_addr());

    let mut client = AdsClient::connect(server.grpc_addr(), node(PROXY)).await?;
    client.subscribe(TypeUrl::Cluster, &[]).await?;
    let clusters = client.recv_clusters().await?;
    let consul_clusters: Vec<String> = clusters
        .iter()
        .map(|c| c.name.clone())
        .filter(|n| n.starts_with("outbound|") && n.ends_with(&suffix))
        .collect();
    println!("CDS: {} cluster(s), from Consul:", clusters.len());
    for name in &consul_clusters {
        println!("  {name}");
    }
    if consul_clusters.is_empty() {
        println!("  (none: register a service in Consul, see README.md)");
        server.shutdown().await;
        return Ok(());
    }
    let names: Vec<&str> = consul_clusters.iter().map(String::as_str).collect();
    client.subscribe(TypeUrl::Endpoint, &names).await?;
    print_assignments("EDS:", &client.recv_load_assignments().await?);

    if let Some(consul) = &fake {
        println!("\nweb-2's health check turns critical");
        consul.set_health("web-2", CheckStatus::Critical);
        print_assignments("EDS update:", &client.recv_load_assignments().await?);
        println!("\nweb-3 registers");
        consul.register(
            Instance::new("web", "web-3", "10.0.0.3", 8080)
                .with_meta("protocol", "http")
                .with_tags(&["version|v2"]),
        );
        print_assignments("EDS update:", &client.recv_load_assignments().await?);
    } else if args.follow {
        println!("\nfollowing endpoint updates (Ctrl-C to stop)");
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                response = client.recv() => {
                    let response = match response {
                        Ok(r) => r,
                        // Quiet for a while: keep waiting.
                        Err(e) if e.downcast_ref::<tokio::time::error::Elapsed>().is_some() => continue,
                        Err(e) => return Err(e),
                    };
                    client.ack(&response).await?;
                    if response.type_url == TypeUrl::Endpoint.as_str() {
                        let cla = meshfed::testing::decode_all::<ClusterLoadAssignment>(&response)?;
                        print_assignments("EDS update:", &cla);
                    } else {
                        println!("{} update ({} resources)", TypeUrl::parse(&response.type_url).map_or("?", |t| t.short()), response.resources.len());
                    }
                }
            }
        }
    }
    server.shutdown().await;
    Ok(())
}

//! Measures what silent connections cost a healthy client: holds N TCP connections
//! that never send a byte on the secure xDS port or on an admin port (re-opening each
//! one the server closes), then times a healthy proxy's connect + first CDS response
//! on the secure port, or `GET /ready` on a fresh connection to the HTTP port.
//!
//! Run against a release server started with a CA, e.g.
//! `meshfed discovery --caDir /tmp/ca --grpcAddr 127.0.0.1:15010 ...`, then
//! `cargo run --release --example silent_connections -- secure 127.0.0.1:15012 /tmp/ca 2000 20`
//! or `... -- ready 127.0.0.1:8080 - 2000 20`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use meshfed::testing::{AdsClient, ClientTls, node_with, tls_channel};
use meshfed::xds::TypeUrl;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::metadata::MetadataMap;

/// Holds one silent connection for ever, re-opening it whenever the server closes it.
async fn hold_silent(addr: SocketAddr, open: Arc<AtomicUsize>, reopened: Arc<AtomicUsize>) {
    let mut first = true;
    loop {
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if first {
            open.fetch_add(1, Ordering::Relaxed);
            first = false;
        } else {
            reopened.fetch_add(1, Ordering::Relaxed);
        }
        let mut buf = [0u8; 64];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    }
}

async fn secure_cds(addr: SocketAddr, tls: &ClientTls) -> anyhow::Result<usize> {
    let channel = tls_channel(addr, tls).await?;
    let node = node_with(
        "sidecar~10.0.0.1~bench-1.default~default.svc.cluster.local",
        serde_json::json!({"SERVICE_ACCOUNT": "bench"}),
    );
    let mut client = AdsClient::over(channel, MetadataMap::new(), node).await?;
    client.subscribe(TypeUrl::Cluster, &[]).await?;
    Ok(client.recv_clusters().await?.len())
}

async fn ready(addr: SocketAddr) -> anyhow::Result<usize> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET /ready HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    anyhow::ensure!(
        raw.starts_with(b"HTTP/1.1 200"),
        "not ready: {}",
        String::from_utf8_lossy(&raw)
    );
    Ok(raw.len())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mode, addr, ca_dir, silent, samples] = args.as_slice() else {
        anyhow::bail!("usage: silent_connections secure|ready ADDR CA_DIR|- SILENT SAMPLES");
    };
    let addr: SocketAddr = addr.parse()?;
    let silent: usize = silent.parse()?;
    let samples: usize = samples.parse()?;
    let tls = (mode == "secure").then(|| {
        let ca_dir = PathBuf::from(ca_dir);
        let identity = "spiffe://cluster.local/ns/default/sa/bench".to_string();
        let ca = meshfed::ca::Ca::self_signed(&ca_dir, "cluster.local").expect("the CA");
        ClientTls {
            roots_pem: std::fs::read_to_string(ca_dir.join("root-cert.pem")).expect("root"),
            identity: Some(
                ca.issue_key_pair(&[identity], Duration::ZERO)
                    .expect("issue"),
            ),
            server_name: "istiod.istio-system.svc".into(),
        }
    });

    let (open, reopened) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    for _ in 0..silent {
        tokio::spawn(hold_silent(addr, open.clone(), reopened.clone()));
    }
    let start = Instant::now();
    while open.load(Ordering::Relaxed) < silent {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("{silent} silent connections open in {:?}", start.elapsed());

    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        let size = match &tls {
            Some(tls) => secure_cds(addr, tls).await?,
            None => ready(addr).await?,
        };
        times.push(t.elapsed());
        anyhow::ensure!(size > 0, "an empty answer");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{mode} with {silent} silent connections ({} re-opened after a server close): {samples} samples, p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        reopened.load(Ordering::Relaxed),
        ms(times[samples / 2]),
        ms(times[samples * 9 / 10]),
        ms(times[samples - 1]),
    );
    Ok(())
}

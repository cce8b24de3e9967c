//! `/debug/pprof/`: CPU and heap profiles a `pprof` tool reads.

use std::io::Read;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cli::Killed;
use crate::support::{discovery_args, embedded_server, http_get, wait_for_ready_file};

// The parts of pprof's `perftools.profiles.Profile` the tests read.
#[derive(Clone, PartialEq, Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "10")]
    duration_nanos: i64,
    #[prost(int64, tag = "12")]
    period: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
}

impl Profile {
    fn types(&self) -> Vec<(&str, &str)> {
        self.sample_type
            .iter()
            .map(|t| (self.text(t.r#type), self.text(t.unit)))
            .collect()
    }

    fn text(&self, index: i64) -> &str {
        &self.string_table[index as usize]
    }

    fn function_names(&self) -> impl Iterator<Item = &str> {
        self.function.iter().map(|f| self.text(f.name))
    }
}

/// GET with a binary body: (status, body). The admin server answers
/// `Connection: close` requests with a plain body.
async fn get_bytes(addr: SocketAddr, path: &str) -> (u16, Vec<u8>) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a whole response");
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    assert!(
        !head.contains("transfer-encoding: chunked"),
        "a body of known length: {head}"
    );
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, raw[end + 4..].to_vec())
}

fn decode(gzipped: &[u8]) -> Profile {
    assert_eq!(&gzipped[..2], [0x1f, 0x8b], "gzipped as Go serves profiles");
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(gzipped)
        .read_to_end(&mut bytes)
        .unwrap();
    Profile::decode(bytes.as_slice()).expect("a pprof Profile")
}

/// Burns CPU on this thread until `stop` is set; its name is what the profile must
/// show.
#[inline(never)]
fn spin_for_the_profiler(stop: &AtomicBool) -> u64 {
    let mut x = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
    }
    x
}

#[tokio::test]
async fn a_cpu_profile_samples_the_busy_code_by_name() {
    let server = embedded_server().await;
    let http = server.bound().http;

    for bad in ["0", "601", "ten"] {
        let (status, body) = http_get(http, &format!("/debug/pprof/profile?seconds={bad}")).await;
        assert_eq!(status, 400, "seconds={bad}: {body}");
        assert!(body.contains("seconds"), "{body}");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let busy = std::thread::spawn({
        let stop = stop.clone();
        move || spin_for_the_profiler(&stop)
    });
    let (status, body) = get_bytes(http, "/debug/pprof/profile?seconds=2").await;
    stop.store(true, Ordering::Relaxed);
    busy.join().unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let profile = decode(&body);
    assert_eq!(
        profile.types(),
        [("samples", "count"), ("cpu", "nanoseconds")]
    );
    assert_eq!(profile.period, 10_000_000, "100 Hz");
    assert!(
        (1_900_000_000..6_000_000_000).contains(&profile.duration_nanos),
        "about two seconds: {}",
        profile.duration_nanos
    );
    assert!(!profile.sample.is_empty(), "a busy second has samples");
    assert!(
        profile
            .function_names()
            .any(|name| name.contains("spin_for_the_profiler")),
        "the busy function is named: {:?}",
        profile.function_names().take(40).collect::<Vec<_>>()
    );
    for sample in &profile.sample {
        assert_eq!(sample.value.len(), 2);
        assert_eq!(sample.value[1], sample.value[0] * profile.period);
    }
}

#[tokio::test]
async fn the_server_binary_serves_its_live_heap() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready.json");
    let mut child = Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
            .args(discovery_args(&ready, &[]))
            .env_remove("_RJEM_MALLOC_CONF")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let json = wait_for_ready_file(&mut child.0, &ready).await;
    let http: SocketAddr = json["httpAddr"].as_str().unwrap().parse().unwrap();

    let (status, index) = http_get(http, "/debug/pprof/").await;
    assert_eq!(status, 200);
    assert!(
        index.contains("profile?seconds") && index.contains("heap"),
        "{index}"
    );

    let (status, body) = get_bytes(http, "/debug/pprof/heap").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let profile = decode(&body);
    assert_eq!(profile.types(), [("inuse_space", "bytes")]);
    assert!(!profile.sample.is_empty(), "a running server holds memory");
    assert!(
        profile.sample.iter().all(|s| s.value[0] > 0),
        "sizes are positive"
    );
    assert!(
        profile
            .function_names()
            .any(|name| name == "std::rt::lang_start_internal"),
        "symbolized in process, demangled: {:?}",
        profile.function_names().take(40).collect::<Vec<_>>()
    );
}

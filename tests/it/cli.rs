//! The `meshfed` binary itself: `discovery --readyFile` and `load` running the separate
//! `meshfed-load` binary.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::support::{discovery_args, eventually, http_get, wait_for_ready_file};

/// Kills the child when the test ends, passed or not.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn ready_file_names_the_bound_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready.json");
    std::fs::write(&ready, "left by an earlier run").unwrap();
    let mut child = Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
            .args(discovery_args(&ready, &[]))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );

    // The server removes a stale file at start and writes its own, whole, once it
    // listens.
    let json = wait_for_ready_file(&mut child.0, &ready).await;
    let fields: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        fields,
        [
            "grpcAddr",
            "httpAddr",
            "monitoringAddr",
            "pid",
            "secureGrpcAddr"
        ],
        "{json}"
    );
    assert!(
        json["secureGrpcAddr"].is_null(),
        "no CA, no secure port: {json}"
    );
    assert_eq!(json["pid"], child.0.id(), "{json}");
    let addr = |key: &str| -> SocketAddr {
        let a: SocketAddr = json[key].as_str().unwrap().parse().unwrap();
        assert!(a.ip().is_loopback() && a.port() != 0, "{key}: {a}");
        a
    };
    let (grpc, http, monitoring) = (addr("grpcAddr"), addr("httpAddr"), addr("monitoringAddr"));
    assert!(grpc != http && http != monitoring && grpc != monitoring);
    let no_temporary_left = std::fs::read_dir(dir.path()).unwrap().count() == 1;
    assert!(no_temporary_left, "only the ready file in its directory");

    eventually("/ready on httpAddr answers 200", || async {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
    let (status, metrics) = http_get(monitoring, "/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("pilot_xds"), "{metrics}");
    tokio::net::TcpStream::connect(grpc)
        .await
        .expect("the ADS port accepts connections");
}

#[tokio::test]
async fn the_secure_port_alone_with_the_ca_and_the_root_written_for_vms() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready.json");
    let ca_dir = dir.path().join("ca");
    let root = dir.path().join("root-cert.pem");
    let mut args = discovery_args(&ready, &[]);
    let grpc = args.iter().position(|a| a == "--grpcAddr").unwrap();
    args[grpc + 1] = "".into();
    let mut child = Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
            .args(args)
            .arg("--caDir")
            .arg(&ca_dir)
            .arg("--rootCertFile")
            .arg(&root)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let json = wait_for_ready_file(&mut child.0, &ready).await;
    assert!(json["grpcAddr"].is_null(), "plaintext port off: {json}");
    let secure: SocketAddr = json["secureGrpcAddr"].as_str().unwrap().parse().unwrap();
    tokio::net::TcpStream::connect(secure)
        .await
        .expect("the secure port accepts connections");
    let written = std::fs::read_to_string(&root).unwrap();
    assert_eq!(
        written,
        std::fs::read_to_string(ca_dir.join("ca-cert.pem")).unwrap()
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&root), 0o644, "the root is public");
    assert_eq!(mode(&ca_dir.join("ca-key.pem")), 0o600, "the key is not");
}

#[test]
fn serving_files_go_together() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .args(discovery_args(&dir.path().join("ready.json"), &[]))
        .args(["--tlsCertFile", "/nonexistent/tls.crt"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--tlsCertFile, --tlsKeyFile and --caCertFile go together"),
        "{stderr}"
    );
}

/// A directory holding (a hard link to, else a copy of) the `meshfed` binary, so the
/// test chooses what lies next to it.
fn meshfed_alone() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let exe = dir.path().join("meshfed");
    let original = Path::new(env!("CARGO_BIN_EXE_meshfed"));
    if std::fs::hard_link(original, &exe).is_err() {
        std::fs::copy(original, &exe).unwrap();
    }
    (dir, exe)
}

#[test]
fn load_without_the_load_tool_says_how_to_build_it() {
    let (_dir, exe) = meshfed_alone();
    let out = std::process::Command::new(&exe)
        .args(["load", "--scenario", "s.yaml"])
        .env("PATH", "")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("meshfed-load") && stderr.contains("cargo build --release -p meshfed-load"),
        "{stderr}"
    );
}

#[cfg(unix)]
#[test]
fn load_runs_the_load_tool_with_every_argument_and_its_exit_status() {
    use std::os::unix::fs::PermissionsExt as _;
    let (dir, exe) = meshfed_alone();
    // A stand-in for meshfed-load: prints what it was given and fails with 3.
    let tool = dir.path().join("meshfed-load");
    std::fs::write(
        &tool,
        "#!/bin/sh\nprintf '%s\\n' \"$@\"\necho \"MESHFED_BINARY=$MESHFED_BINARY\"\nexit 3\n",
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = || {
        std::process::Command::new(&exe)
            .args(["load", "--help", "--scenario", "a b.yaml", "-q"])
            .env("PATH", "")
            .output()
            .unwrap()
    };
    let mut out = run();
    // Another test's fork may still hold the script open for writing for an instant
    // (ETXTBSY); that is the test harness, not meshfed.
    for _ in 0..5 {
        if !String::from_utf8_lossy(&out.stderr).contains("Text file busy") {
            break;
        }
        out = run();
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stdout}{stderr}");
    assert_eq!(
        stdout,
        format!(
            "--help\n--scenario\na b.yaml\n-q\nMESHFED_BINARY={}\n",
            exe.canonicalize().unwrap().display()
        )
    );
}

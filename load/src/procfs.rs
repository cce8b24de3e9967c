//! What `/proc` tells about a local process and the machine: resident memory and CPU
//! seconds of the server, the open-files limit, CPUs and memory. Linux only; elsewhere
//! these read as unavailable.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;

/// A process's resource use at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ProcessSample {
    /// Resident set size (`VmRSS`).
    pub rss_bytes: u64,
    /// Peak resident set size (`VmHWM`).
    pub peak_rss_bytes: u64,
    /// User + system CPU time.
    pub cpu_seconds: f64,
}

fn proc_path(pid: Option<u32>, file: &str) -> PathBuf {
    match pid {
        Some(pid) => PathBuf::from(format!("/proc/{pid}/{file}")),
        None => PathBuf::from(format!("/proc/self/{file}")),
    }
}

/// Samples process `pid` (`None`: this process).
pub fn sample(pid: Option<u32>) -> anyhow::Result<ProcessSample> {
    let status = std::fs::read_to_string(proc_path(pid, "status"))
        .with_context(|| format!("reading {}", proc_path(pid, "status").display()))?;
    let stat = std::fs::read_to_string(proc_path(pid, "stat"))
        .with_context(|| format!("reading {}", proc_path(pid, "stat").display()))?;
    Ok(ProcessSample {
        rss_bytes: status_kib(&status, "VmRSS:").unwrap_or(0) * 1024,
        peak_rss_bytes: status_kib(&status, "VmHWM:").unwrap_or(0) * 1024,
        cpu_seconds: stat_cpu_ticks(&stat).context("parsing /proc/<pid>/stat")? as f64
            / clock_ticks() as f64,
    })
}

/// A `Key:   123 kB` line of `/proc/<pid>/status`, in KiB.
fn status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `utime + stime` (fields 14 and 15) of `/proc/<pid>/stat`, in clock ticks. The
/// command name (field 2) may hold spaces and parentheses, so fields are counted from
/// the last `)`.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100, Linux's USER_HZ, if that fails).
fn clock_ticks() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .filter(|t| *t > 0)
            .unwrap_or(100)
    })
}

/// The open-files limit (soft, hard) of process `pid` (`None`: this process);
/// `u64::MAX` stands for unlimited.
pub fn open_files_limit(pid: Option<u32>) -> anyhow::Result<(u64, u64)> {
    let path = proc_path(pid, "limits");
    let limits =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    parse_open_files(&limits).with_context(|| format!("{}: no Max open files line", path.display()))
}

fn parse_open_files(limits: &str) -> Option<(u64, u64)> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut values = line["Max open files".len()..].split_whitespace().map(|v| {
        if v == "unlimited" {
            Some(u64::MAX)
        } else {
            v.parse().ok()
        }
    });
    Some((values.next()??, values.next()??))
}

/// Makes sure this process may open `needed` files: raises the soft limit up to the
/// hard limit when it is lower (with util-linux `prlimit`, since the workspace has no
/// unsafe code for `setrlimit`), or explains how to raise it.
pub fn ensure_open_files(needed: u64) -> anyhow::Result<u64> {
    let (soft, hard) = open_files_limit(None)?;
    if soft >= needed {
        return Ok(soft);
    }
    let advice = format!(
        "the run needs about {needed} open files (one connection per proxy, here and in a \
         spawned server) but the limit is {soft} (hard limit {hard})"
    );
    if hard < needed {
        bail!(
            "{advice}: raise the hard limit (as root: `ulimit -Hn {needed}`, LimitNOFILE= in a \
             systemd unit, or /etc/security/limits.conf), then `ulimit -n {needed}`; or run \
             fewer proxies, or share connections (`connections:` in the scenario)"
        );
    }
    let target = if hard == u64::MAX {
        needed.max(1 << 20).to_string()
    } else {
        hard.to_string()
    };
    let raised = Command::new("prlimit")
        .arg(format!("--pid={}", std::process::id()))
        .arg(format!("--nofile={target}:{target}"))
        .status();
    let (soft, _) = open_files_limit(None)?;
    if soft >= needed {
        return Ok(soft);
    }
    let why = match raised {
        Ok(status) => format!("prlimit exited with {status}"),
        Err(err) => format!("prlimit could not run: {err}"),
    };
    bail!("{advice}, and raising it failed ({why}): run `ulimit -n {needed}` first")
}

/// The machine the run is on.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Machine {
    /// CPUs this process may use.
    pub cpus: usize,
    /// `MemTotal` of `/proc/meminfo`.
    pub memory_bytes: u64,
    /// The first `model name` of `/proc/cpuinfo`.
    pub cpu_model: String,
    /// `uname -r`-like kernel release (`/proc/sys/kernel/osrelease`).
    pub kernel: String,
    /// The 1, 5 and 15-minute load averages (`/proc/loadavg`) when detected: the
    /// machine may be shared.
    pub load_average: Option<[f64; 3]>,
}

/// The 1, 5 and 15-minute load averages.
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut fields = text.split_whitespace().map(|f| f.parse::<f64>().ok());
    Some([fields.next()??, fields.next()??, fields.next()??])
}

impl Machine {
    /// Reads what is available.
    pub fn detect() -> Machine {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_bytes: status_kib(&meminfo, "MemTotal:").unwrap_or(0) * 1024,
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
                .unwrap_or_default(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            load_average: load_average(),
        }
    }
}

/// CPU use between two samples, as a fraction of one CPU.
pub fn cpu_share(from: &ProcessSample, to: &ProcessSample, elapsed: Duration) -> f64 {
    if elapsed.is_zero() {
        return 0.0;
    }
    (to.cpu_seconds - from.cpu_seconds).max(0.0) / elapsed.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let stat = "4242 (meshfed (x) y) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 9 0 100 200 300";
        assert_eq!(stat_cpu_ticks(stat), Some(300));
        let status = "Name:\tmeshfed\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(102_400));
        assert_eq!(status_kib(status, "VmHWM:"), Some(204_800));
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 unlimited            files\n";
        assert_eq!(parse_open_files(limits), Some((1024, u64::MAX)));
    }

    #[test]
    fn samples_this_process() {
        let s = sample(None).unwrap();
        assert!(s.rss_bytes > 0 && s.peak_rss_bytes >= s.rss_bytes);
        let (soft, hard) = open_files_limit(None).unwrap();
        assert!(soft <= hard);
        assert!(ensure_open_files(16).is_ok());
    }
}

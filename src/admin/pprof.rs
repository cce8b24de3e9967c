//! Profiles in pprof's format, served where Go's `net/http/pprof` serves istiod's:
//! `/debug/pprof/profile?seconds=N` samples the CPU for N seconds (SIGPROF at 100 Hz,
//! every thread), `/debug/pprof/heap` is jemalloc's sampled heap profile (what is
//! allocated and still live, one sample per 512 KiB allocated). Both answer a
//! gzipped `perftools.profiles.Profile`, symbolized in process, so `pprof` and
//! `go tool pprof` read them without the binary.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use axum::extract::Query;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use prost::Message;

/// The CPU profile's length when `seconds` is not given (Go's default).
const DEFAULT_SECONDS: u64 = 30;
/// The longest CPU profile served.
const MAX_SECONDS: u64 = 600;
/// Samples per second (Go's rate).
const FREQUENCY: i32 = 100;

/// One CPU profile at a time: the profiler's timer is process-wide.
static CPU_PROFILE_RUNNING: AtomicBool = AtomicBool::new(false);

/// `/debug/pprof/`: the profiles there are.
pub(super) async fn index() -> Html<&'static str> {
    Html(
        "<html><head><title>/debug/pprof/</title></head><body>\n\
         <p>Profiles in pprof's format (gzipped protobuf):</p>\n<ul>\n\
         <li><a href=\"profile?seconds=30\">profile</a>: CPU, sampled at 100 Hz for \
         <code>?seconds=N</code> (default 30)</li>\n\
         <li><a href=\"heap\">heap</a>: live heap allocations (jemalloc, one sample per \
         512 KiB allocated)</li>\n</ul>\n</body></html>\n",
    )
}

/// `/debug/pprof/profile?seconds=N`.
pub(super) async fn cpu(Query(query): Query<BTreeMap<String, String>>) -> Response {
    let seconds = match query.get("seconds").map(|s| s.parse::<u64>()) {
        None => DEFAULT_SECONDS,
        Some(Ok(n)) if (1..=MAX_SECONDS).contains(&n) => n,
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("seconds: expected a whole number from 1 to {MAX_SECONDS}"),
            );
        }
    };
    if CPU_PROFILE_RUNNING.swap(true, Ordering::AcqRel) {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Could not enable CPU profiling: cpu profiling already in use".to_string(),
        );
    }
    // The profiler is not Send, and resolving symbols is CPU work: both belong on a
    // blocking thread, which holds the flag until the profile is written.
    let profile = tokio::task::spawn_blocking(move || {
        let result = cpu_profile(Duration::from_secs(seconds));
        CPU_PROFILE_RUNNING.store(false, Ordering::Release);
        result
    })
    .await;
    match profile {
        Ok(Ok(bytes)) => profile_response(bytes, "profile"),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("CPU profile task failed: {e}"),
        ),
    }
}

/// `/debug/pprof/heap`.
pub(super) async fn heap() -> Response {
    let Some(ctl) = jemalloc_pprof::PROF_CTL.as_ref() else {
        return error(
            StatusCode::NOT_IMPLEMENTED,
            "heap profiling is off: jemalloc was started without prof:true (the server \
             binary has it unless _RJEM_MALLOC_CONF turns it off)"
                .to_string(),
        );
    };
    let ctl = ctl.clone();
    let dump = tokio::task::spawn_blocking(move || {
        let mut ctl = ctl.blocking_lock();
        if !ctl.activated() {
            return Err(
                "heap profiling is inactive (prof_active:false); nothing is sampled".to_string(),
            );
        }
        ctl.dump_pprof().map_err(|e| format!("heap profile: {e:#}"))
    })
    .await;
    match dump {
        Ok(Ok(bytes)) => profile_response(bytes, "heap"),
        Ok(Err(e)) => error(StatusCode::NOT_IMPLEMENTED, e),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("heap profile task failed: {e}"),
        ),
    }
}

fn profile_response(bytes: Vec<u8>, name: &str) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        bytes,
    )
        .into_response()
}

fn error(status: StatusCode, message: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain")],
        message + "\n",
    )
        .into_response()
}

/// Samples every thread for `length`, then writes the gzipped profile.
fn cpu_profile(length: Duration) -> Result<Vec<u8>, String> {
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
        .map_err(|e| format!("Could not enable CPU profiling: {e}"))?;
    std::thread::sleep(length);
    let report = guard
        .report()
        .build()
        .map_err(|e| format!("CPU profile: {e}"))?;
    let samples = report.data.iter().map(|(frames, count)| CpuSample {
        stack: frames
            .frames
            .iter()
            .map(|inlined| {
                inlined
                    .iter()
                    .map(|symbol| Frame {
                        name: symbol.name(),
                        system_name: symbol.sys_name().into_owned(),
                        file: symbol.filename().into_owned(),
                        line: i64::from(symbol.lineno()),
                    })
                    .collect()
            })
            .collect(),
        thread: frames.thread_name_or_id(),
        count: *count as i64,
    });
    let profile = encode_cpu(
        samples,
        report.timing.start_time,
        report.timing.duration,
        report.timing.frequency,
    );
    gzip(&profile.encode_to_vec())
}

/// One function in a stack: the innermost frame of an address comes first among
/// the frames inlined at it.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Frame {
    name: String,
    system_name: String,
    file: String,
    line: i64,
}

/// One distinct stack (leaf first) and how often it was seen.
struct CpuSample {
    /// Per address, the functions inlined there (innermost first).
    stack: Vec<Vec<Frame>>,
    thread: String,
    count: i64,
}

/// The `Profile` of a CPU profile as Go writes one: `samples/count` and
/// `cpu/nanoseconds` per sample, period in nanoseconds, a `thread` label.
fn encode_cpu(
    samples: impl Iterator<Item = CpuSample>,
    start: SystemTime,
    duration: Duration,
    frequency: i32,
) -> Profile {
    let period = 1_000_000_000 / i64::from(frequency.max(1));
    let mut table = Table::default();
    let samples_count = table.value_type("samples", "count");
    let cpu_nanos = table.value_type("cpu", "nanoseconds");
    let thread_key = table.string("thread");
    let mut sample = Vec::new();
    for s in samples {
        let location_id = s
            .stack
            .iter()
            .map(|inlined| table.location(inlined))
            .collect();
        sample.push(Sample {
            location_id,
            value: vec![s.count, s.count * period],
            label: vec![Label {
                key: thread_key,
                str: table.string(&s.thread),
                num: 0,
            }],
        });
    }
    Profile {
        sample_type: vec![samples_count, cpu_nanos],
        sample,
        location: table.locations,
        function: table.functions,
        time_nanos: start
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as i64,
        duration_nanos: duration.as_nanos() as i64,
        period_type: Some(cpu_nanos),
        period,
        string_table: table.strings,
    }
}

/// The string, function and location tables of a profile, each entry once.
struct Table {
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    functions: Vec<Function>,
    function_ids: HashMap<(String, String, String), u64>,
    locations: Vec<Location>,
    location_ids: HashMap<Vec<Frame>, u64>,
}

impl Default for Table {
    fn default() -> Self {
        // Index 0 of the string table is the empty string.
        Table {
            strings: vec![String::new()],
            string_ids: HashMap::from([(String::new(), 0)]),
            functions: Vec::new(),
            function_ids: HashMap::new(),
            locations: Vec::new(),
            location_ids: HashMap::new(),
        }
    }
}

impl Table {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = self.strings.len() as i64;
        self.strings.push(s.to_string());
        self.string_ids.insert(s.to_string(), id);
        id
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> ValueType {
        ValueType {
            r#type: self.string(kind),
            unit: self.string(unit),
        }
    }

    fn function(&mut self, frame: &Frame) -> u64 {
        let key = (
            frame.name.clone(),
            frame.system_name.clone(),
            frame.file.clone(),
        );
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        let function = Function {
            id,
            name: self.string(&frame.name),
            system_name: self.string(&frame.system_name),
            filename: self.string(&frame.file),
            start_line: 0,
        };
        self.functions.push(function);
        self.function_ids.insert(key, id);
        id
    }

    /// The location of one address: its lines, innermost inlined function first
    /// (pprof's order).
    fn location(&mut self, inlined: &[Frame]) -> u64 {
        if let Some(&id) = self.location_ids.get(inlined) {
            return id;
        }
        let line = inlined
            .iter()
            .map(|frame| Line {
                function_id: self.function(frame),
                line: frame.line,
            })
            .collect();
        let id = self.locations.len() as u64 + 1;
        self.locations.push(Location {
            id,
            mapping_id: 0,
            address: 0,
            line,
            is_folded: false,
        });
        self.location_ids.insert(inlined.to_vec(), id);
        id
    }
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder
        .write_all(bytes)
        .and_then(|()| encoder.finish())
        .map_err(|e| format!("gzip: {e}"))
}

// pprof's `perftools.profiles` messages (profile.proto), the fields a CPU profile
// uses, with their numbers.

#[derive(Clone, PartialEq, Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "4")]
    location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    time_nanos: i64,
    #[prost(int64, tag = "10")]
    duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    period: i64,
}

#[derive(Clone, Copy, PartialEq, Message)]
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
    #[prost(message, repeated, tag = "3")]
    label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
struct Label {
    #[prost(int64, tag = "1")]
    key: i64,
    #[prost(int64, tag = "2")]
    str: i64,
    #[prost(int64, tag = "3")]
    num: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(uint64, tag = "2")]
    mapping_id: u64,
    #[prost(uint64, tag = "3")]
    address: u64,
    #[prost(message, repeated, tag = "4")]
    line: Vec<Line>,
    #[prost(bool, tag = "5")]
    is_folded: bool,
}

#[derive(Clone, PartialEq, Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    function_id: u64,
    #[prost(int64, tag = "2")]
    line: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
    #[prost(int64, tag = "3")]
    system_name: i64,
    #[prost(int64, tag = "4")]
    filename: i64,
    #[prost(int64, tag = "5")]
    start_line: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str, line: i64) -> Frame {
        Frame {
            name: name.to_string(),
            system_name: format!("_ZN{name}E"),
            file: "src/x.rs".to_string(),
            line,
        }
    }

    #[test]
    fn a_cpu_profile_shares_functions_locations_and_strings() {
        let samples = vec![
            CpuSample {
                stack: vec![
                    vec![frame("leaf", 3), frame("inlined_into", 9)],
                    vec![frame("main", 1)],
                ],
                thread: "worker".to_string(),
                count: 4,
            },
            CpuSample {
                stack: vec![vec![frame("other", 5)], vec![frame("main", 1)]],
                thread: "worker".to_string(),
                count: 1,
            },
        ];
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let p = encode_cpu(samples.into_iter(), start, Duration::from_secs(2), 100);
        let decoded = Profile::decode(p.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded, p);
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(p.string_table[0], "");
        let types: Vec<_> = p
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        assert_eq!(p.period, 10_000_000);
        assert_eq!(p.duration_nanos, 2_000_000_000);
        assert_eq!(p.time_nanos, 1_000_000_000_000);
        // `main` at line 1 is one location and one function, shared by both stacks.
        assert_eq!(p.location.len(), 3);
        assert_eq!(p.function.len(), 4);
        assert_eq!(p.sample[0].location_id[1], p.sample[1].location_id[1]);
        assert_eq!(p.sample[0].value, [4, 40_000_000]);
        // The first location holds the leaf then the function it was inlined into.
        let first = &p.location[(p.sample[0].location_id[0] - 1) as usize];
        let names: Vec<_> = first
            .line
            .iter()
            .map(|l| s(p.function[(l.function_id - 1) as usize].name))
            .collect();
        assert_eq!(names, ["leaf", "inlined_into"]);
        assert_eq!(s(p.sample[0].label[0].key), "thread");
        assert_eq!(s(p.sample[0].label[0].str), "worker");
        let unique: std::collections::HashSet<_> = p.string_table.iter().collect();
        assert_eq!(unique.len(), p.string_table.len(), "each string once");
    }

    #[test]
    fn gzip_round_trips() {
        use std::io::Read;
        let bytes = gzip(b"profile").unwrap();
        assert_eq!(&bytes[..2], [0x1f, 0x8b]);
        let mut out = String::new();
        flate2::read::GzDecoder::new(bytes.as_slice())
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, "profile");
    }
}

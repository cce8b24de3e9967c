//! Logging set-up: Istio's `--log_output_level scope:level,...` form, optional JSON
//! output, and a handle that changes levels at run time (`/logging`).
//!
//! Log lines carry values proxies and registries control (node ids, NACK details,
//! Consul names), so neither format lets a value forge a line or reach a terminal:
//! - text: [`SafeFields`] formats the message and every field value with control
//!   characters (CR, LF, ESC and the rest of C0, DEL, C1, U+2028/U+2029) written as
//!   escapes (`\n`, `\x1b`, `\u{85}`), so one event is one line; colours are only
//!   used when stdout is a terminal and `NO_COLOR` is unset;
//! - JSON: serde_json escapes every control character in strings already.
//!
//! Long untrusted values are cut with [`clip`] before they are logged or shown on
//! debug pages ([`NODE_ID_LOG_MAX`], [`ERROR_DETAIL_LOG_MAX`]).

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::io::IsTerminal;
use std::sync::{Arc, LazyLock};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FormatFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

/// Longest node id written to a log line or debug page, in bytes.
pub const NODE_ID_LOG_MAX: usize = 256;

/// Longest NACK `error_detail` message written to a log line or debug page, in bytes.
pub const ERROR_DETAIL_LOG_MAX: usize = 1024;

/// `s` cut to at most `max` bytes (at a char boundary) followed by `…(N bytes)`, N
/// being the length of the whole of `s`; `s` itself, borrowed, when it fits. For
/// untrusted strings (node ids, NACK details, names from registries) in logs and
/// debug output, so that one request cannot write megabytes. Does not escape: the
/// text log format and JSON do that.
pub fn clip(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…({} bytes)", &s[..end], s.len()))
}

/// `s` with every control character written as an escape (see the module docs);
/// borrowed when there is none.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 && needs_escape(c) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// C0, DEL and C1 controls, and the Unicode line and paragraph separators (some
/// viewers break lines at them).
fn needs_escape(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

/// The text format's field formatter: `message` first as is, then `name=value`
/// separated by spaces, like tracing's default, but with every value escaped by
/// [`escape_controls`]. Also used for span fields.
#[derive(Clone, Copy, Debug, Default)]
pub struct SafeFields;

impl<'writer> FormatFields<'writer> for SafeFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut visitor = SafeVisitor {
            writer: &mut writer,
            first: true,
            result: Ok(()),
            scratch: String::new(),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct SafeVisitor<'a, 'w> {
    writer: &'a mut Writer<'w>,
    first: bool,
    result: fmt::Result,
    scratch: String,
}

impl SafeVisitor<'_, '_> {
    /// Writes one field whose value `scratch` holds, unescaped.
    fn emit(&mut self, field: &Field) {
        if self.result.is_err() {
            return;
        }
        let sep = if self.first { "" } else { " " };
        self.first = false;
        let value = escape_controls(&self.scratch);
        self.result = match field.name() {
            "message" => write!(self.writer, "{sep}{value}"),
            // `r#type` and the like: the name without the raw prefix, as tracing does.
            name => write!(
                self.writer,
                "{sep}{}={value}",
                name.strip_prefix("r#").unwrap_or(name)
            ),
        };
    }
}

impl Visit for SafeVisitor<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.scratch.clear();
        // Like tracing: the message as is, other string values quoted.
        if field.name() == "message" {
            self.scratch.push_str(value);
        } else {
            let _ = write!(self.scratch, "{value:?}");
        }
        self.emit(field);
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.scratch.clear();
        let _ = write!(self.scratch, "{value}");
        let mut source = value.source();
        while let Some(s) = source {
            let _ = write!(self.scratch, ": {s}");
            source = s.source();
        }
        self.emit(field);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.scratch.clear();
        let _ = write!(self.scratch, "{value:?}");
        self.emit(field);
    }
}

/// The text-format layer [`init`] installs, writing to `writer`; `ansi` turns
/// colours on.
pub fn text_layer<S, W>(writer: W, ansi: bool) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt::layer()
        .fmt_fields(SafeFields)
        .with_ansi(ansi)
        .with_writer(writer)
}

/// The JSON layer [`init`] installs, writing to `writer`.
pub fn json_layer<S, W>(writer: W) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt::layer()
        .json()
        .with_current_span(false)
        .with_writer(writer)
}

/// Colours only for a person at a terminal who did not ask for none.
fn use_colours() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Istio scope names and the modules they cover: the server's, `meshfed-registry`'s,
/// and every registry kind's ([`crate::registries::KINDS`]).
pub static SCOPES: LazyLock<Vec<(&'static str, &'static str)>> = LazyLock::new(|| {
    let mut scopes = vec![("ads", "meshfed::ads"), ("push", "meshfed::push")];
    scopes.extend(meshfed_registry::LOG_SCOPES);
    for kind in crate::registries::KINDS {
        scopes.extend(kind.log_scopes());
    }
    scopes.extend([
        ("mesh", "meshfed::mesh"),
        ("admin", "meshfed::admin"),
        ("app", "meshfed::app"),
    ]);
    scopes
});

/// The crates whose logs `default:<level>` sets: this one, `meshfed-registry` and
/// every registry kind's; everything else stays at `warn`.
fn own_crates() -> Vec<&'static str> {
    let mut crates = vec!["meshfed"];
    for (_, target) in SCOPES.iter() {
        let krate = target.split("::").next().unwrap_or(target);
        if !crates.contains(&krate) {
            crates.push(krate);
        }
    }
    crates
}

const LEVELS: &[&str] = &["none", "error", "warn", "info", "debug", "trace"];

/// Translates Istio's `scope:level,...` (e.g. `default:info,ads:debug`) into a tracing
/// filter directive. A bare level (`debug`) sets the default.
pub fn translate(spec: &str) -> Result<String, String> {
    let mut default = "info".to_string();
    let mut directives = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (scope, level) = part.split_once(':').unwrap_or(("default", part));
        let level = level.to_ascii_lowercase();
        if !LEVELS.contains(&level.as_str()) {
            return Err(format!(
                "{part:?}: unknown level {level:?} (known: {})",
                LEVELS.join(", ")
            ));
        }
        let level = if level == "none" {
            "off".to_string()
        } else {
            level
        };
        if scope == "default" || scope == "all" {
            default = level;
            continue;
        }
        let targets: Vec<&str> = SCOPES
            .iter()
            .filter(|(s, _)| *s == scope)
            .map(|(_, t)| *t)
            .collect();
        if targets.is_empty() {
            let known: Vec<&str> = SCOPES.iter().map(|(s, _)| *s).collect();
            return Err(format!(
                "{part:?}: unknown scope {scope:?} (known: default, {})",
                known.join(", ")
            ));
        }
        directives.extend(targets.iter().map(|t| format!("{t}={level}")));
    }
    // Dependencies stay at warn unless asked for: their info logs are noise here.
    let mut first = "warn".to_string();
    for krate in own_crates() {
        let _ = write!(first, ",{krate}={default}");
    }
    let mut all = vec![first];
    all.extend(directives);
    Ok(all.join(","))
}

/// Changes the log filter at run time.
#[derive(Clone)]
pub struct LogControl {
    handle: reload::Handle<EnvFilter, Registry>,
    current: Arc<std::sync::Mutex<String>>,
}

impl std::fmt::Debug for LogControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogControl")
            .field("current", &self.current())
            .finish()
    }
}

impl LogControl {
    /// The spec in force (Istio form).
    pub fn current(&self) -> String {
        self.current.lock().expect("log spec poisoned").clone()
    }

    /// Applies a new Istio-form spec.
    pub fn set(&self, spec: &str) -> Result<(), String> {
        let filter = EnvFilter::try_new(translate(spec)?).map_err(|e| e.to_string())?;
        self.handle.reload(filter).map_err(|e| e.to_string())?;
        *self.current.lock().expect("log spec poisoned") = spec.to_string();
        Ok(())
    }
}

/// Installs the global subscriber. `RUST_LOG`, when set, replaces the spec.
pub fn init(spec: &str, json: bool) -> Result<LogControl, String> {
    let directives = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => v,
        _ => translate(spec)?,
    };
    let filter = EnvFilter::try_new(&directives).map_err(|e| e.to_string())?;
    let (filter, handle) = reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    if json {
        registry.with(json_layer(std::io::stdout)).init();
    } else {
        registry
            .with(text_layer(std::io::stdout, use_colours()))
            .init();
    }
    Ok(LogControl {
        handle,
        current: Arc::new(std::sync::Mutex::new(spec.to_string())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collects everything a layer writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    const FORGED: &str =
        "evil\n2026-01-01T00:00:00Z  INFO meshfed::ads: forged\x1b[31m red\r\u{9b}2J\x07\x7f";

    /// Logs one event carrying `FORGED` every way a value reaches a line: the message,
    /// a `%` (Display) field, a `?` (Debug) field, a string field, an error, a span.
    fn log_forged() {
        let span = tracing::info_span!("conn", node = %FORGED);
        let _entered = span.enter();
        let err = std::io::Error::other(FORGED);
        tracing::warn!(
            node = %FORGED,
            debug = ?FORGED,
            plain = FORGED,
            error = &err as &(dyn std::error::Error + 'static),
            "NACK from {FORGED}"
        );
    }

    #[test]
    fn text_lines_escape_control_characters_everywhere() {
        let out = Captured::default();
        let subscriber = tracing_subscriber::registry().with(text_layer(out.clone(), false));
        tracing::subscriber::with_default(subscriber, log_forged);
        let text = out.text();
        assert_eq!(
            text.matches('\n').count(),
            1,
            "one event, one line: {text:?}"
        );
        assert!(text.ends_with('\n'));
        for c in text.trim_end_matches('\n').chars() {
            assert!(!needs_escape(c), "{c:?} got through: {text:?}");
        }
        // Every way in is escaped the same way, and nothing is lost.
        let escaped =
            r"evil\n2026-01-01T00:00:00Z  INFO meshfed::ads: forged\x1b[31m red\r\u{9b}2J\x07\x7f";
        assert!(text.contains(&format!("NACK from {escaped}")), "{text}");
        assert!(text.contains(&format!(" node={escaped}")), "{text}");
        assert!(text.contains(&format!("conn{{node={escaped}}}")), "{text}");
        assert!(text.contains(&format!("error={escaped}")), "{text}");
        // `?` and plain strings are quoted by Debug, which escapes in its own way.
        assert!(text.contains(r#"debug="evil\n2026"#), "{text}");
        assert!(text.contains(r#"plain="evil\n2026"#), "{text}");
    }

    #[test]
    fn json_lines_stay_valid_json_with_the_value_intact() {
        let out = Captured::default();
        let subscriber = tracing_subscriber::registry().with(json_layer(out.clone()));
        tracing::subscriber::with_default(subscriber, log_forged);
        let text = out.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text:?}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).expect("valid JSON");
        assert_eq!(v["fields"]["node"], FORGED);
        assert_eq!(v["fields"]["message"], format!("NACK from {FORGED}"));
        assert!(!lines[0].contains('\x1b'), "ESC is escaped in JSON too");
    }

    #[test]
    fn clip_cuts_at_a_char_boundary_and_names_the_length() {
        assert!(matches!(clip("short", 5), Cow::Borrowed("short")));
        assert_eq!(clip("abcdef", 3), "abc…(6 bytes)");
        // 'é' is two bytes: a cut inside it moves back to before it.
        assert_eq!(clip("aé", 2), "a…(3 bytes)");
        let big = "x".repeat(4_000_000);
        let clipped = clip(&big, NODE_ID_LOG_MAX);
        assert_eq!(clipped.len(), NODE_ID_LOG_MAX + "…(4000000 bytes)".len());
        assert_eq!(clip("日本", 0), "…(6 bytes)");
    }

    #[test]
    fn escape_controls_leaves_clean_text_borrowed() {
        assert!(matches!(escape_controls("café ok"), Cow::Borrowed(_)));
        assert_eq!(escape_controls("a\u{2028}b\0"), r"a\u{2028}b\x00");
    }

    #[test]
    fn istio_scopes_translate() {
        let t = translate("default:debug,ads:warn").unwrap();
        assert!(t.starts_with("warn,meshfed=debug"), "{t}");
        assert!(t.ends_with("meshfed::ads=warn"), "{t}");
        assert!(translate("info").unwrap().contains("meshfed=info"));
        assert!(translate("ads:none").unwrap().contains("meshfed::ads=off"));
        let err = translate("pilot:debug").unwrap_err();
        assert!(err.contains("unknown scope \"pilot\""), "{err}");
        assert!(translate("ads:loud").unwrap_err().contains("unknown level"));
    }

    #[test]
    fn registry_crates_bring_their_scopes() {
        let scopes: Vec<&str> = SCOPES.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            scopes,
            [
                "ads", "push", "model", "registry", "kube", "consul", "nacos", "eureka", "mesh",
                "admin", "app"
            ]
        );
        assert!(translate("default:debug").unwrap().starts_with(
            "warn,meshfed=debug,meshfed_registry=debug,meshfed_kube=debug,meshfed_consul=debug"
        ));
        assert!(
            translate("consul:warn")
                .unwrap()
                .ends_with("meshfed_consul=warn")
        );
    }
}

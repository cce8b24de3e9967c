//! Logging set-up: Istio's `--log_output_level scope:level,...` form, optional JSON
//! output, and a handle that changes levels at run time (`/logging`).

use std::sync::Arc;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

/// Istio scope names and the modules they cover.
pub const SCOPES: &[(&str, &str)] = &[
    ("ads", "meshfed::ads"),
    ("push", "meshfed::push"),
    ("model", "meshfed_registry"),
    ("registry", "meshfed_registry"),
    ("kube", "meshfed_kube"),
    ("consul", "meshfed_consul"),
    ("mesh", "meshfed::mesh"),
    ("admin", "meshfed::admin"),
    ("app", "meshfed::app"),
];

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
    let mut all = vec![format!(
        "warn,meshfed={default},meshfed_registry={default},meshfed_kube={default},meshfed_consul={default}"
    )];
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
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(false),
            )
            .init();
    } else {
        registry.with(tracing_subscriber::fmt::layer()).init();
    }
    Ok(LogControl {
        handle,
        current: Arc::new(std::sync::Mutex::new(spec.to_string())),
    })
}

/// `s` cut to at most `max` bytes (at a character boundary) with the length of the
/// whole appended, for untrusted text in logs and debug output.
pub fn clip(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…({} bytes)", &s[..end], s.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

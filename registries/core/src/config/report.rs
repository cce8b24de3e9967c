//! `meshfed validate -f FILE...`: checking config files offline, the way the config
//! directory store reads them, with every problem located (`file:line`, object, field,
//! reason).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::assembly::assemble;
use crate::config::model::ObjectId;
use crate::config::source::{Diagnostic, Entry, ParsedFile, config_files, parse_bytes, parse_text};

/// The outcome of checking one file with [`validate_files`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The file.
    pub file: PathBuf,
    /// The valid objects found in it (kind, namespace, name), in file order.
    pub objects: Vec<ObjectId>,
    /// Everything rejected: syntax errors, unreadable objects, validation errors,
    /// duplicates.
    pub errors: Vec<Diagnostic>,
    /// Warnings about valid objects.
    pub warnings: Vec<Diagnostic>,
    /// Documents skipped because they are not a kind meshfed reads.
    pub skipped: Vec<Diagnostic>,
    /// The valid Secrets found in it (namespace, name), in file order.
    pub secrets: Vec<(String, String)>,
}

impl Report {
    /// True when nothing was rejected.
    pub fn is_ok(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Checks config files offline, as the config directory store would read them: every
/// error with file:line, kind, namespace/name, field and reason. Directories are
/// walked like `--configDir` (recursive, sorted, `*.yaml`, `*.yml`, `*.json`, hidden
/// entries skipped); files are read whatever their extension (`.json` is JSON, the
/// rest YAML). Objects defined twice across the files are errors (the first one
/// wins). One report per file; the caller decides the exit code (non-zero when any
/// report is not [`Report::is_ok`]).
pub fn validate_files(paths: &[PathBuf]) -> Vec<Report> {
    validate_files_in(paths, None)
}

/// [`validate_files`], knowing the mesh config the objects are served with: a
/// Telemetry naming a provider that is not one of its extension providers (or one
/// that cannot do what it is named for) is warned about, as Istio's analyzers do.
pub fn validate_files_in(
    paths: &[PathBuf],
    mesh: Option<&meshfed_api::mesh::v1alpha1::MeshConfig>,
) -> Vec<Report> {
    let mut files = Vec::new();
    let mut problems = Vec::new();
    for path in paths {
        if path.is_dir() {
            match config_files(path) {
                Ok(found) => files.extend(found),
                Err(e) => problems.push(ParsedFile::unusable(
                    path,
                    format!("cannot read the directory: {e}"),
                )),
            }
        } else {
            files.push(path.clone());
        }
    }
    // A file named twice (or found again in a named directory) is read once.
    let mut seen = std::collections::BTreeSet::new();
    files.retain(|f| seen.insert(f.clone()));
    let mut parsed: Vec<ParsedFile> = problems;
    for file in files {
        match std::fs::read(&file) {
            Ok(bytes) => parsed.push(parse_bytes(&file, &bytes)),
            Err(e) => parsed.push(ParsedFile::unusable(
                &file,
                format!("cannot read the file: {e}"),
            )),
        }
    }
    reports(&parsed, mesh)
}

/// Checks the text of one file (e.g. read from stdin); `path` names it in messages and
/// decides JSON (`.json`) or YAML.
pub fn validate_text(path: &Path, text: &str) -> Report {
    let parsed = [parse_text(path, text)];
    reports(&parsed, None).remove(0)
}

/// [`validate_text`] for one object already parsed, reported as read from `path`.
pub fn validate_value(path: &Path, value: serde_json::Value) -> Report {
    let parsed = [crate::config::source::parse_value(path, value)];
    reports(&parsed, None).remove(0)
}

fn reports(
    parsed: &[ParsedFile],
    mesh: Option<&meshfed_api::mesh::v1alpha1::MeshConfig>,
) -> Vec<Report> {
    let mut assembly = assemble(parsed, &BTreeMap::new());
    if let Some(mesh) = mesh {
        let found = assembly.objects.values().flat_map(|p| {
            let crate::config::model::Spec::Telemetry(t) = &p.obj.spec else {
                return Vec::new();
            };
            crate::config::validate::unknown_providers(t, mesh)
                .into_iter()
                .map(|(field, message)| Diagnostic {
                    severity: crate::config::source::Severity::Warning,
                    file: p.file.clone(),
                    line: p
                        .obj
                        .source
                        .rsplit_once(':')
                        .and_then(|(_, l)| l.parse().ok()),
                    kind: p.obj.kind.to_string(),
                    namespace: p.obj.namespace.clone(),
                    name: p.obj.name.clone(),
                    field,
                    message,
                })
                .collect()
        });
        let found: Vec<Diagnostic> = found.collect();
        assembly.warnings.extend(found);
    }
    let across = crate::config::references::cross_object_warnings(
        assembly
            .objects
            .values()
            .map(|p| (&*p.obj, p.file.as_path())),
    );
    assembly.warnings.extend(across);
    let gateway_api = gateway_api_findings(&assembly);
    assembly.warnings.extend(gateway_api);
    parsed
        .iter()
        .map(|file| {
            let mine = |d: &&Diagnostic| d.file == file.path;
            let mut errors: Vec<Diagnostic> = assembly
                .rejected
                .iter()
                .flat_map(|r| &r.diagnostics)
                .filter(mine)
                .cloned()
                .collect();
            errors.sort_by_key(|d| d.line);
            Report {
                file: file.path.clone(),
                objects: file
                    .entries
                    .iter()
                    .filter_map(|e| match e {
                        Entry::Object { obj, .. } => Some(obj.id()),
                        _ => None,
                    })
                    .filter(|id| {
                        assembly
                            .objects
                            .get(id)
                            .is_some_and(|p| p.file == file.path)
                    })
                    .collect(),
                errors,
                warnings: assembly.warnings.iter().filter(mine).cloned().collect(),
                skipped: assembly.skipped.iter().filter(mine).cloned().collect(),
                secrets: file
                    .entries
                    .iter()
                    .filter_map(|e| match e {
                        Entry::Secret(secret) => {
                            Some((secret.namespace.clone(), secret.name.clone()))
                        }
                        _ => None,
                    })
                    .filter(|key| {
                        assembly.secrets.get(key).is_some_and(|s| {
                            s.source.starts_with(&format!("{}:", file.path.display()))
                        })
                    })
                    .collect(),
            }
        })
        .collect()
}

/// What the Gateway API translation reports about the objects (routes that attach to
/// nothing, refs not permitted, listeners that cannot be served), as warnings naming
/// the object and field. Offline, every backend Service is taken to exist; namespace
/// labels are those of the `kind: Namespace` objects among the files, ConfigMaps the
/// `kind: ConfigMap` objects (when there are none, every ConfigMap is taken to exist).
fn gateway_api_findings(assembly: &crate::config::assembly::Assembly) -> Vec<Diagnostic> {
    use crate::config::gateway_api::convert;
    let objects: Vec<std::sync::Arc<crate::config::ConfigObject>> = assembly
        .objects
        .values()
        .filter(|p| p.obj.kind.is_gateway_api())
        .map(|p| p.obj.clone())
        .collect();
    if objects.is_empty() {
        return Vec::new();
    }
    let output = convert::convert(&convert::Inputs {
        objects: &objects,
        domain: "cluster.local",
        controller: crate::config::gateway_api::DEFAULT_CONTROLLER,
        service_exists: &|_| true,
        namespaces: Some(&assembly.namespaces).filter(|n| !n.is_empty()),
        service_addresses: &|_| Vec::new(),
        service_ports: &|_| None,
        config_maps: Some(&assembly.config_maps).filter(|m| !m.is_empty()),
    });
    let mut out = Vec::new();
    for status in &output.status {
        let Some(placed) = assembly.objects.values().find(|p| {
            p.obj.kind == status.kind
                && p.obj.namespace == status.namespace
                && p.obj.name == status.name
        }) else {
            continue;
        };
        for (field, message) in status.findings() {
            out.push(Diagnostic {
                severity: crate::config::source::Severity::Warning,
                file: placed.file.clone(),
                line: placed
                    .obj
                    .source
                    .rsplit_once(':')
                    .and_then(|(_, l)| l.parse().ok()),
                kind: placed.obj.kind.as_str().to_string(),
                namespace: placed.obj.namespace.clone(),
                name: placed.obj.name.clone(),
                field,
                message,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::source::tests::VALID_VS;

    #[test]
    fn validate_files_reports_per_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("a.yaml"), VALID_VS).unwrap();
        std::fs::write(
            dir.path().join("sub/b.yml"),
            format!(
                "{VALID_VS}---\n{}",
                VALID_VS
                    .replace("name: reviews", "name: r2")
                    .replace("[reviews]", "[\"*\"]")
            ),
        )
        .unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not config").unwrap();
        std::fs::write(dir.path().join(".hidden.yaml"), "kind: [").unwrap();
        let reports = validate_files(&[
            dir.path().to_path_buf(),
            dir.path().join("a.yaml"),
            dir.path().join("missing.yaml"),
        ]);
        let names: Vec<String> = reports
            .iter()
            .map(|r| {
                r.file
                    .strip_prefix(dir.path())
                    .unwrap_or(&r.file)
                    .display()
                    .to_string()
            })
            .collect();
        assert_eq!(names, ["a.yaml", "sub/b.yml", "missing.yaml"]);
        assert!(reports[0].is_ok());
        assert_eq!(reports[0].objects.len(), 1);
        let b = &reports[1];
        assert!(!b.is_ok());
        assert!(b.objects.is_empty());
        let messages: Vec<String> = b
            .errors
            .iter()
            .map(|d| format!("{}:{}", d.line.unwrap(), d.message))
            .collect();
        assert!(
            messages[0]
                .starts_with("1:duplicate: VirtualService bookinfo/reviews is already defined at"),
            "{messages:?}"
        );
        assert!(
            messages[1].starts_with("14:wildcard host * is not allowed"),
            "{messages:?}"
        );
        assert_eq!(b.errors[1].field, "spec.hosts[0]");
        assert!(
            reports[2].errors[0]
                .message
                .contains("cannot read the file")
        );

        let report = validate_text(Path::new("stdin.yaml"), VALID_VS);
        assert!(report.is_ok());
    }
}

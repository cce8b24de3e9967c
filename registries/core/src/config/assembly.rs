//! Putting the files of a directory together: the first definition of an object wins,
//! and what a read cannot replace (objects of a broken file, the last valid version of
//! a rejected object) is kept from the previous read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::ignored::IgnoredConfig;
use crate::config::model::{ConfigObject, ObjectId};
use crate::config::secret::SecretObject;
use crate::config::source::{Diagnostic, Entry, ParsedFile, Rejection, Severity};

/// An object in force and the file it came from.
#[derive(Clone, Debug)]
pub(crate) struct Placed {
    pub(crate) obj: Arc<ConfigObject>,
    pub(crate) file: PathBuf,
}

/// The objects of a set of files, and everything rejected on the way.
#[derive(Debug, Default)]
pub(crate) struct Assembly {
    pub(crate) objects: BTreeMap<ObjectId, Placed>,
    pub(crate) rejected: Vec<Rejection>,
    /// Objects kept from `previous` although this read did not give them (their file
    /// or document is broken, or their new version is invalid).
    pub(crate) retained: BTreeSet<ObjectId>,
    pub(crate) warnings: Vec<Diagnostic>,
    pub(crate) skipped: Vec<Diagnostic>,
    /// The objects behind `skipped`: kinds meshfed does not read.
    pub(crate) ignored: Vec<IgnoredConfig>,
    /// The Secrets, by (namespace, name); the first definition wins.
    pub(crate) secrets: BTreeMap<(String, String), Arc<SecretObject>>,
    /// The `v1` Namespaces' labels, by name; the first definition wins.
    pub(crate) namespaces: crate::config::NamespaceLabels,
    /// The `v1` ConfigMaps' data, by `<namespace>/<name>`; the first definition wins.
    pub(crate) config_maps: crate::config::ConfigMaps,
}

/// Puts files (in order; the first definition of an object wins) together, keeping
/// from `previous` what this read cannot replace:
/// - objects of an unusable file, or of a file with a broken document, that the read
///   did not give again (they may be in the part that could not be read);
/// - the last valid version of an object whose new version is rejected.
pub(crate) fn assemble(files: &[ParsedFile], previous: &BTreeMap<ObjectId, Placed>) -> Assembly {
    let mut out = Assembly::default();
    for file in files {
        if let Some(problem) = &file.unusable {
            out.rejected.push(Rejection {
                id: None,
                file: file.path.clone(),
                line: problem.line,
                kind: String::new(),
                namespace: String::new(),
                name: String::new(),
                diagnostics: vec![problem.clone()],
            });
            continue;
        }
        for entry in &file.entries {
            match entry {
                Entry::Object { obj, warnings } => {
                    let id = obj.id();
                    if let Some(first) = out.objects.get(&id) {
                        let first_at = first.obj.source.clone();
                        out.rejected.push(duplicate(file, obj, &first_at));
                        continue;
                    }
                    out.warnings.extend(warnings.iter().cloned());
                    out.objects.insert(
                        id,
                        Placed {
                            obj: Arc::new(obj.clone()),
                            file: file.path.clone(),
                        },
                    );
                }
                Entry::Rejected(rejection) => out.rejected.push(rejection.clone()),
                Entry::Skipped(note, ignored) => {
                    out.skipped.push(note.clone());
                    out.ignored.push(ignored.clone());
                }
                Entry::Namespace(name, labels) => {
                    out.namespaces
                        .entry(name.clone())
                        .or_insert_with(|| labels.clone());
                }
                Entry::ConfigMap(name, data) => {
                    out.config_maps
                        .entry(name.clone())
                        .or_insert_with(|| data.clone());
                }
                Entry::Secret(secret) => {
                    let key = (secret.namespace.clone(), secret.name.clone());
                    if let Some(first) = out.secrets.get(&key) {
                        out.rejected
                            .push(duplicate_secret(file, secret, &first.source));
                        continue;
                    }
                    out.secrets.insert(key, Arc::new(secret.clone()));
                }
            }
        }
    }
    // What this read could not replace stays as it was.
    let partial: BTreeSet<&Path> = files
        .iter()
        .filter(|f| f.unusable.is_some() || f.broken_documents)
        .map(|f| f.path.as_path())
        .collect();
    for (id, placed) in previous {
        if out.objects.contains_key(id) {
            continue;
        }
        let rejected_now = out.rejected.iter().any(|r| r.id.as_ref() == Some(id));
        if partial.contains(placed.file.as_path()) || rejected_now {
            out.objects.insert(id.clone(), placed.clone());
            out.retained.insert(id.clone());
        }
    }
    out
}

/// Keeps, from the `previous` read's Secrets, what this read could not replace, as
/// [`assemble`] does for objects: the Secrets of an unusable file or of a file with a
/// broken document, and the last valid version of a Secret whose new version is
/// rejected (a gateway keeps its certificate while its file is being fixed).
pub(crate) fn retain_secrets(
    out: &mut Assembly,
    files: &[ParsedFile],
    previous: &BTreeMap<(String, String), Arc<SecretObject>>,
) {
    let partial: BTreeSet<String> = files
        .iter()
        .filter(|f| f.unusable.is_some() || f.broken_documents)
        .map(|f| f.path.display().to_string())
        .collect();
    for (key, secret) in previous {
        if out.secrets.contains_key(key) {
            continue;
        }
        let file = secret
            .source
            .rsplit_once(':')
            .map_or(secret.source.as_str(), |(f, _)| f);
        let rejected_now = out
            .rejected
            .iter()
            .any(|r| r.kind == "Secret" && r.namespace == key.0 && r.name == key.1);
        if partial.contains(file) || rejected_now {
            out.secrets.insert(key.clone(), secret.clone());
        }
    }
}

fn duplicate(file: &ParsedFile, obj: &ConfigObject, first_at: &str) -> Rejection {
    let kind = obj.kind.to_string();
    duplicate_of(
        file,
        &kind,
        &obj.namespace,
        &obj.name,
        &obj.source,
        first_at,
    )
}

fn duplicate_secret(file: &ParsedFile, secret: &SecretObject, first_at: &str) -> Rejection {
    duplicate_of(
        file,
        "Secret",
        &secret.namespace,
        &secret.name,
        &secret.source,
        first_at,
    )
}

/// The rejection of a second definition of `kind namespace/name` (at `source`).
fn duplicate_of(
    file: &ParsedFile,
    kind: &str,
    namespace: &str,
    name: &str,
    source: &str,
    first_at: &str,
) -> Rejection {
    let line = source.rsplit_once(':').and_then(|(_, l)| l.parse().ok());
    Rejection {
        id: None,
        file: file.path.clone(),
        line,
        kind: kind.to_string(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        diagnostics: vec![Diagnostic {
            severity: Severity::Error,
            file: file.path.clone(),
            line,
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            field: String::new(),
            message: format!(
                "duplicate: {kind} {namespace}/{name} is already defined at {first_at}; the first definition (by sorted file path) \
                 is used and this one is ignored"
            ),
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::source::tests::{VALID_VS, parse};

    const SECRET: &str = "apiVersion: v1\nkind: Secret\nmetadata: {name: s, namespace: ns}\nstringData: {tls.crt: x}\n";

    fn secrets_after(
        text: &str,
        previous: &BTreeMap<(String, String), Arc<SecretObject>>,
    ) -> BTreeMap<(String, String), Arc<SecretObject>> {
        let files = [parse("a.yaml", text)];
        let mut out = assemble(&files, &BTreeMap::new());
        retain_secrets(&mut out, &files, previous);
        out.secrets
    }

    #[test]
    fn secrets_of_a_broken_file_and_last_valid_versions_are_kept() {
        let previous = secrets_after(SECRET, &BTreeMap::new());
        assert_eq!(previous.len(), 1);
        assert_eq!(previous.values().next().unwrap().source, "a.yaml:1");
        // A syntax error keeps it; so does an invalid new version.
        assert_eq!(secrets_after("kind: [\n", &previous).len(), 1);
        let invalid = SECRET.replace("stringData: {tls.crt: x}", "data: {tls.crt: '%%'}");
        assert_eq!(secrets_after(&invalid, &previous).len(), 1);
        // A clean deletion does not.
        assert!(secrets_after("", &previous).is_empty());
        // A second definition is a duplicate.
        let files = [parse("a.yaml", SECRET), parse("b.yaml", SECRET)];
        let out = assemble(&files, &BTreeMap::new());
        assert_eq!(out.secrets.len(), 1);
        assert!(
            out.rejected[0].diagnostics[0]
                .message
                .starts_with("duplicate: Secret ns/s")
        );
    }

    #[test]
    fn assemble_keeps_the_first_duplicate_and_what_cannot_be_replaced() {
        let a = parse("a.yaml", VALID_VS);
        let b = parse(
            "b.yaml",
            &VALID_VS.replace("destination: {host: reviews}", "destination: {host: other}"),
        );
        let assembly = assemble(&[a.clone(), b], &BTreeMap::new());
        assert_eq!(assembly.objects.len(), 1);
        let placed = assembly.objects.values().next().unwrap();
        assert_eq!(placed.file, Path::new("a.yaml"));
        let dup = &assembly.rejected[0].diagnostics[0];
        assert_eq!(
            dup.to_string(),
            "b.yaml:1: VirtualService bookinfo/reviews: duplicate: VirtualService bookinfo/reviews is already defined at a.yaml:1; the first definition (by sorted file path) is used and this one is ignored"
        );

        // Now a.yaml breaks: a syntax error in its (only) document keeps the object.
        let previous = assembly.objects;
        let broken = parse("a.yaml", "kind: [\n");
        let again = assemble(&[broken], &previous);
        assert_eq!(again.objects.len(), 1);
        assert_eq!(again.retained.len(), 1);

        // An invalid new version keeps the last valid one; a clean deletion does not.
        let invalid = parse(
            "a.yaml",
            &VALID_VS.replace("hosts: [reviews]", "hosts: [\"*\"]"),
        );
        let again = assemble(&[invalid], &previous);
        assert_eq!(again.objects.len(), 1, "last valid version kept");
        assert_eq!(again.rejected.len(), 1);
        let gone = assemble(&[parse("a.yaml", "")], &previous);
        assert!(gone.objects.is_empty());
    }
}

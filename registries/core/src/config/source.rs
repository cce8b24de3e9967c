//! Reading config files: multi-document YAML (`---`), JSON (one or more objects),
//! Kubernetes-style objects and `kind: List`, with `file:line` for every problem.
//!
//! Each document is read on its own, so a broken document (a YAML syntax error) is
//! rejected alone and the other documents of the file still count. A file that cannot
//! be read or split at all (unreadable, not UTF-8, a JSON syntax error) counts as
//! *unusable*: nothing in it applies and a store keeps what it had from it.
//!
//! Every object is decoded ([`decode`]) and validated ([`validate()`]); problems come
//! back as [`Diagnostic`]s that name the file, the line of the field at fault (or of
//! the object), the object and the field:
//!
//! ```text
//! config/reviews.yaml:14: VirtualService default/reviews: spec.http[0].route[1].weight: weight 120 is not in the range 0..100
//! ```
//!
//! [`crate::config::report`] turns this into `meshfed validate -f FILE...`;
//! [`crate::config::file_store`] into the live store.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::decode::{Decoded, decode};
use crate::config::ignored::IgnoredConfig;
use crate::config::locate::line_of;
use crate::config::model::{ConfigObject, Kind, ObjectId};
use crate::config::secret::SecretObject;
use crate::config::store::RejectedConfig;
use crate::config::validate::{FieldError, FieldPath, Segment, Warning};
use crate::config::validation::validate;
/// How serious a [`Diagnostic`] is.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize)]
pub enum Severity {
    /// The object (or document, or file) is rejected.
    Error,
    /// The object is used, but something looks unintended.
    Warning,
    /// A document was skipped: not a kind meshfed reads.
    Info,
}

/// One problem (or note) about a config file, located as precisely as possible.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    /// Error, warning or note.
    pub severity: Severity,
    /// The file.
    pub file: PathBuf,
    /// 1-based line of the field at fault, else of the object or document.
    pub line: Option<usize>,
    /// The object's kind as written (empty when unknown).
    pub kind: String,
    /// The object's namespace (empty when unknown).
    pub namespace: String,
    /// The object's name (empty when unknown).
    pub name: String,
    /// The field path (`spec.http[0].timeout`), empty when the problem is not a
    /// field's.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl Diagnostic {
    /// `file:line` (or `file`).
    pub fn location(&self) -> String {
        match self.line {
            Some(line) => format!("{}:{line}", self.file.display()),
            None => self.file.display().to_string(),
        }
    }

    /// `file:line: field: message`, without the object (for lists that already name
    /// it).
    pub fn short(&self) -> String {
        if self.field.is_empty() {
            format!("{}: {}", self.location(), self.message)
        } else {
            format!("{}: {}: {}", self.location(), self.field, self.message)
        }
    }
}

impl fmt::Display for Diagnostic {
    /// `file:line: Kind namespace/name: field: message`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.location())?;
        if !self.kind.is_empty() || !self.name.is_empty() {
            let kind = if self.kind.is_empty() {
                "object"
            } else {
                &self.kind
            };
            match (self.namespace.is_empty(), self.name.is_empty()) {
                (_, true) => write!(f, "{kind}: ")?,
                (true, false) => write!(f, "{kind} {}: ", self.name)?,
                (false, false) => write!(f, "{kind} {}/{}: ", self.namespace, self.name)?,
            }
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}
// ----------------------------------------------------------------------------------
// Finding files.

/// The config files below `dir`: `*.yaml`, `*.yml`, `*.json` (any case), recursively,
/// sorted by path. Hidden entries (name starting with `.`) are skipped, which also
/// skips the `..data` and `..<timestamp>` entries of a Kubernetes ConfigMap volume
/// (its files are read through the top-level symlinks). Symlinks are followed;
/// directory loops are cut.
pub(crate) fn config_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut visited = BTreeSet::new();
    walk(dir, &mut out, &mut visited, true)?;
    out.sort();
    Ok(out)
}

fn walk(
    dir: &Path,
    out: &mut Vec<PathBuf>,
    visited: &mut BTreeSet<PathBuf>,
    top: bool,
) -> std::io::Result<()> {
    let canonical = std::fs::canonicalize(dir)?;
    if !visited.insert(canonical) {
        return Ok(());
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        // A subdirectory that vanished mid-walk is simply gone.
        Err(e) if !top && e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        // `metadata` follows symlinks; a dangling link is skipped.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            walk(&path, out, visited, false)?;
        } else if meta.is_file() && is_config_file(&path) {
            out.push(path);
        }
    }
    Ok(())
}

fn is_config_file(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()).is_some_and(|e| {
        ["yaml", "yml", "json"]
            .iter()
            .any(|x| e.eq_ignore_ascii_case(x))
    })
}

fn is_json(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}
// ----------------------------------------------------------------------------------
// Reading one file.

/// What one file holds.
#[derive(Clone, Debug)]
pub(crate) struct ParsedFile {
    pub(crate) path: PathBuf,
    pub(crate) entries: Vec<Entry>,
    /// Set when the file could not be read or split: nothing in it applies.
    pub(crate) unusable: Option<Diagnostic>,
    /// Some document could not be parsed: objects previously read from the file may
    /// be in it, so a store does not delete them.
    pub(crate) broken_documents: bool,
}

impl ParsedFile {
    /// A file that could not be read at all.
    pub(crate) fn unusable(path: &Path, message: String) -> ParsedFile {
        ParsedFile::unusable_at(path, None, message)
    }

    fn unusable_at(path: &Path, line: Option<usize>, message: String) -> ParsedFile {
        ParsedFile {
            path: path.to_path_buf(),
            entries: Vec::new(),
            unusable: Some(file_diagnostic(path, line, message)),
            broken_documents: false,
        }
    }
}

/// One document or list item of a file.
// Most entries are objects; boxing them would only add an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub(crate) enum Entry {
    /// A valid object, with its warnings.
    Object {
        obj: ConfigObject,
        warnings: Vec<Diagnostic>,
    },
    /// An object (or something meant to be one) that is rejected.
    Rejected(Rejection),
    /// Not a kind meshfed reads: the note for `meshfed validate` and the object for
    /// the store's list of ignored objects.
    Skipped(Diagnostic, IgnoredConfig),
    /// A valid Secret (SDS credentials).
    Secret(SecretObject),
    /// A `v1` Namespace: its name and labels (the Gateway API's
    /// `allowedRoutes.namespaces.from: Selector` reads them).
    Namespace(String, BTreeMap<String, String>),
    /// A `v1` ConfigMap: `<namespace>/<name>` and its data (the Gateway API's
    /// `parametersRef` and BackendTLSPolicy CA references look them up).
    ConfigMap(String, BTreeMap<String, String>),
}

/// A rejected object, document or file.
#[derive(Clone, Debug)]
pub(crate) struct Rejection {
    /// The object's identity, when kind and name could be read.
    pub(crate) id: Option<ObjectId>,
    pub(crate) file: PathBuf,
    /// The object's (or document's) first line.
    pub(crate) line: Option<usize>,
    pub(crate) kind: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) diagnostics: Vec<Diagnostic>,
}

impl Rejection {
    pub(crate) fn to_rejected_config(&self) -> RejectedConfig {
        RejectedConfig {
            source: match self.line {
                Some(line) => format!("{}:{line}", self.file.display()),
                None => self.file.display().to_string(),
            },
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            errors: self.diagnostics.iter().map(Diagnostic::short).collect(),
        }
    }
}

fn file_diagnostic(path: &Path, line: Option<usize>, message: String) -> Diagnostic {
    Diagnostic {
        severity: Severity::Error,
        file: path.to_path_buf(),
        line,
        kind: String::new(),
        namespace: String::new(),
        name: String::new(),
        field: String::new(),
        message,
    }
}

/// Parses file bytes; invalid UTF-8 makes the file unusable.
pub(crate) fn parse_bytes(path: &Path, bytes: &[u8]) -> ParsedFile {
    match std::str::from_utf8(bytes) {
        Ok(text) => parse_text(path, text),
        Err(e) => {
            let line = bytes[..e.valid_up_to()]
                .iter()
                .filter(|b| **b == b'\n')
                .count()
                + 1;
            ParsedFile::unusable_at(path, Some(line), "the file is not valid UTF-8".to_string())
        }
    }
}

/// Parses a file's text: JSON for `.json`, YAML otherwise.
pub(crate) fn parse_text(path: &Path, text: &str) -> ParsedFile {
    let mut file = ParsedFile {
        path: path.to_path_buf(),
        entries: Vec::new(),
        unusable: None,
        broken_documents: false,
    };
    if is_json(path) {
        parse_json(&mut file, text);
    } else {
        for chunk in split_yaml(text) {
            parse_yaml_chunk(&mut file, &chunk);
        }
    }
    file
}

/// One object already parsed (an admission request's object): read as a document of
/// `path` would be, without lines to point at.
pub(crate) fn parse_value(path: &Path, value: Value) -> ParsedFile {
    let mut file = ParsedFile {
        path: path.to_path_buf(),
        entries: Vec::new(),
        unusable: None,
        broken_documents: false,
    };
    process_document(&mut file, value, "", 1, 1);
    file
}

/// The text of one YAML document and where it starts.
struct Chunk<'a> {
    text: &'a str,
    /// 1-based line of the chunk's first line in the file.
    first_line: usize,
}

/// Splits a YAML stream at its document markers (`---` and `...` at the start of a
/// line), so that every document can be parsed on its own. Comments and directives
/// before the first `---` stay with the first document.
fn split_yaml(text: &str) -> Vec<Chunk<'_>> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut first_line = 1;
    let mut has_content = false;
    let mut has_marker = false;
    let mut offset = 0;
    for (line_no, line) in (1..).zip(text.split_inclusive('\n')) {
        let bare = line.trim_end_matches(['\n', '\r']);
        let is_start =
            bare.starts_with("---") && bare[3..].chars().next().is_none_or(char::is_whitespace);
        let is_end =
            bare.starts_with("...") && bare[3..].chars().next().is_none_or(char::is_whitespace);
        if is_start && (has_content || has_marker) {
            chunks.push(Chunk {
                text: &text[start..offset],
                first_line,
            });
            start = offset;
            first_line = line_no;
            has_content = false;
        }
        if is_start {
            has_marker = true;
            has_content |= !bare[3..].trim().is_empty() && !bare[3..].trim().starts_with('#');
        } else if is_end {
            // The end marker closes the document; what follows is a new one.
            chunks.push(Chunk {
                text: &text[start..offset + line.len()],
                first_line,
            });
            start = offset + line.len();
            first_line = line_no + 1;
            has_content = false;
            has_marker = false;
        } else {
            let trimmed = bare.trim_start();
            if !trimmed.is_empty() && !trimmed.starts_with('#') && !bare.starts_with('%') {
                has_content = true;
            }
        }
        offset += line.len();
    }
    if start < text.len() {
        chunks.push(Chunk {
            text: &text[start..],
            first_line,
        });
    }
    chunks
}

/// The line of the first node of a document: its first line that is not blank, a
/// comment, a marker or a directive.
fn content_line(text: &str, first_line: usize) -> usize {
    text.lines()
        .position(|l| {
            let t = l.trim();
            !t.is_empty() && !t.starts_with('#') && !t.starts_with('%') && t != "---"
        })
        .map_or(first_line, |i| first_line + i)
}

/// A YAML document that does not parse: the line of the error (or of the document)
/// and the parser's message without its position.
pub(crate) struct YamlError {
    pub(crate) line: usize,
    pub(crate) message: String,
}

/// The documents of one chunk as JSON values (merge keys applied), each with the
/// line of its first node; parsing stops at the first document that does not parse.
fn chunk_documents(chunk: &Chunk<'_>) -> Vec<(usize, Result<Value, YamlError>)> {
    let line = content_line(chunk.text, chunk.first_line);
    let mut out = Vec::new();
    for document in serde_norway::Deserializer::from_str(chunk.text) {
        let parsed = serde_norway::Value::deserialize(document).and_then(|mut v| {
            v.apply_merge()?;
            Ok(v)
        });
        match parsed {
            Ok(value) => out.push((line, Ok(yaml_to_json(value)))),
            Err(e) => {
                let at = e
                    .location()
                    .map_or(line, |l| l.line() + chunk.first_line - 1);
                out.push((
                    line,
                    Err(YamlError {
                        line: at,
                        message: strip_position(&e.to_string()),
                    }),
                ));
                // The parser cannot resume after an error.
                break;
            }
        }
    }
    out
}

/// Every document of a YAML stream, as [`parse_text`] reads them: split at document
/// markers, each with the line of its first node.
pub(crate) fn yaml_documents(text: &str) -> Vec<(usize, Result<Value, YamlError>)> {
    split_yaml(text).iter().flat_map(chunk_documents).collect()
}

fn parse_yaml_chunk(file: &mut ParsedFile, chunk: &Chunk<'_>) {
    for (line, parsed) in chunk_documents(chunk) {
        match parsed {
            Ok(value) => {
                process_document(file, value, chunk.text, chunk.first_line, line);
            }
            Err(YamlError { line: at, message }) => {
                file.broken_documents = true;
                file.entries.push(Entry::Rejected(Rejection {
                    id: None,
                    file: file.path.clone(),
                    line: Some(line),
                    kind: String::new(),
                    namespace: String::new(),
                    name: String::new(),
                    diagnostics: vec![file_diagnostic(
                        &file.path,
                        Some(at),
                        format!("YAML syntax error, the document is ignored: {message}"),
                    )],
                }));
            }
        }
    }
}

fn parse_json(file: &mut ParsedFile, text: &str) {
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    loop {
        let start = stream.byte_offset();
        match stream.next() {
            None => break,
            Some(Ok(value)) => {
                let end = stream.byte_offset();
                let slice = &text[start..end];
                let first_line = text[..start].matches('\n').count() + 1;
                let lead = slice.len() - slice.trim_start().len();
                let line = first_line + slice[..lead].matches('\n').count();
                process_document(file, value, slice, first_line, line);
            }
            Some(Err(e)) => {
                *file = ParsedFile::unusable_at(
                    &file.path,
                    Some(e.line()).filter(|l| *l > 0),
                    format!(
                        "JSON syntax error, the file is ignored: {}",
                        strip_position(&e.to_string())
                    ),
                );
                return;
            }
        }
    }
}

/// Drops the " at line L column C" serde appends (the position goes up front).
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) if message[i..].contains(" column ") => message[..i].to_string(),
        _ => message.to_string(),
    }
}

/// YAML to JSON as Kubernetes does it: tags dropped, non-string keys written as
/// strings, NaN and infinities as null.
fn yaml_to_json(value: serde_norway::Value) -> Value {
    use serde_norway::Value as Y;
    match value {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                n.as_f64()
                    .and_then(serde_json::Number::from_f64)
                    .map_or(Value::Null, Value::Number)
            }
        }
        Y::String(s) => Value::String(s),
        Y::Sequence(items) => Value::Array(items.into_iter().map(yaml_to_json).collect()),
        Y::Mapping(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (yaml_key(k), yaml_to_json(v)))
                .collect(),
        ),
        Y::Tagged(tagged) => yaml_to_json(tagged.value),
    }
}

fn yaml_key(key: serde_norway::Value) -> String {
    use serde_norway::Value as Y;
    match key {
        Y::String(s) => s,
        Y::Number(n) => n.to_string(),
        Y::Bool(b) => b.to_string(),
        Y::Null => "null".to_string(),
        Y::Tagged(tagged) => yaml_key(tagged.value),
        other => serde_json::to_string(&yaml_to_json(other)).unwrap_or_default(),
    }
}

/// A parsed document: one object, a `kind: List` of objects, or nothing.
fn process_document(
    file: &mut ParsedFile,
    value: Value,
    text: &str,
    first_line: usize,
    line: usize,
) {
    if value.is_null() {
        return;
    }
    if value.get("kind").and_then(Value::as_str) == Some("List") {
        let items = match value.get("items") {
            None | Some(Value::Null) => return,
            Some(Value::Array(items)) => items,
            Some(_) => {
                let at = line_of(text, &[Segment::Field("items".into())]);
                file.entries.push(Entry::Rejected(Rejection {
                    id: None,
                    file: file.path.clone(),
                    line: Some(line),
                    kind: "List".to_string(),
                    namespace: String::new(),
                    name: String::new(),
                    diagnostics: vec![file_diagnostic(
                        &file.path,
                        at.map(|l| l + first_line - 1).or(Some(line)),
                        "items of a List must be a list of objects".to_string(),
                    )],
                }));
                return;
            }
        };
        for (i, item) in items.iter().enumerate() {
            let prefix = vec![Segment::Field("items".into()), Segment::Index(i)];
            let item_line = line_of(text, &prefix).map_or(line, |l| l + first_line - 1);
            let locator = Locator {
                text,
                prefix,
                first_line,
                line: item_line,
            };
            process_object(file, item, &locator);
        }
        return;
    }
    let locator = Locator {
        text,
        prefix: Vec::new(),
        first_line,
        line,
    };
    process_object(file, &value, &locator);
}

/// Turns field paths of one object into file lines.
struct Locator<'a> {
    /// The document's text.
    text: &'a str,
    /// Where the object is in the document (`items[3]` in a List).
    prefix: Vec<Segment>,
    /// The file line of the text's first line.
    first_line: usize,
    /// The object's own first line.
    line: usize,
}

impl Locator<'_> {
    fn line_of(&self, field: &[Segment]) -> usize {
        let mut path = self.prefix.clone();
        path.extend_from_slice(field);
        line_of(self.text, &path).map_or(self.line, |l| l + self.first_line - 1)
    }
}

/// The object a diagnostic is about, and how to locate its fields.
struct Subject<'a> {
    file: &'a Path,
    kind: &'a str,
    namespace: &'a str,
    name: &'a str,
    locator: &'a Locator<'a>,
}

impl Subject<'_> {
    fn diagnostic(&self, severity: Severity, field: &FieldPath, message: &str) -> Diagnostic {
        Diagnostic {
            severity,
            file: self.file.to_path_buf(),
            line: Some(self.locator.line_of(field.segments())),
            kind: self.kind.to_string(),
            namespace: self.namespace.to_string(),
            name: self.name.to_string(),
            field: field.to_string(),
            message: message.to_string(),
        }
    }

    fn error(&self, e: &FieldError) -> Diagnostic {
        self.diagnostic(Severity::Error, &e.field, &e.reason)
    }

    fn warning(&self, w: &Warning) -> Diagnostic {
        self.diagnostic(Severity::Warning, &w.field, &w.message)
    }

    fn rejection(&self, id: Option<ObjectId>, errors: &[FieldError]) -> Rejection {
        Rejection {
            id,
            file: self.file.to_path_buf(),
            line: Some(self.locator.line),
            kind: self.kind.to_string(),
            namespace: self.namespace.to_string(),
            name: self.name.to_string(),
            diagnostics: errors.iter().map(|e| self.error(e)).collect(),
        }
    }
}

/// Decodes and validates one object.
fn process_object(file: &mut ParsedFile, value: &Value, locator: &Locator<'_>) {
    let source = format!("{}:{}", file.path.display(), locator.line);
    let entry = match decode(value, &source) {
        Decoded::Object(obj) => {
            let subject = Subject {
                file: &file.path,
                kind: obj.kind.as_str(),
                namespace: &obj.namespace,
                name: &obj.name,
                locator,
            };
            match validate(&obj) {
                Ok(warnings) => {
                    let warnings = warnings.iter().map(|w| subject.warning(w)).collect();
                    Entry::Object { obj, warnings }
                }
                Err(errors) => Entry::Rejected(subject.rejection(Some(obj.id()), &errors)),
            }
        }
        Decoded::Secret(secret) => Entry::Secret(secret),
        Decoded::Skipped(skipped) if skipped.api_version == "v1" && skipped.kind == "Namespace" => {
            Entry::Namespace(skipped.name, skipped.labels)
        }
        Decoded::Skipped(skipped) if skipped.api_version == "v1" && skipped.kind == "ConfigMap" => {
            let ns = if skipped.namespace.is_empty() {
                "default"
            } else {
                skipped.namespace.as_str()
            };
            Entry::ConfigMap(format!("{ns}/{}", skipped.name), skipped.data)
        }
        Decoded::Skipped(skipped) => Entry::Skipped(
            Diagnostic {
                severity: Severity::Info,
                file: file.path.clone(),
                line: Some(locator.line),
                kind: skipped.kind.clone(),
                namespace: skipped.namespace.clone(),
                name: skipped.name.clone(),
                field: String::new(),
                message: format!(
                    "skipped: {} {} is not a kind meshfed reads",
                    skipped.api_version, skipped.kind
                ),
            },
            IgnoredConfig {
                kind: skipped.kind,
                api_version: skipped.api_version,
                namespace: skipped.namespace,
                name: skipped.name,
                source: source.clone(),
            },
        ),
        Decoded::Invalid(invalid) => {
            let id = Kind::from_name(&invalid.kind)
                .filter(|_| !invalid.name.is_empty())
                .map(|kind| ObjectId::new(kind, &invalid.namespace, &invalid.name));
            let subject = Subject {
                file: &file.path,
                kind: &invalid.kind,
                namespace: &invalid.namespace,
                name: &invalid.name,
                locator,
            };
            Entry::Rejected(subject.rejection(id, &invalid.errors))
        }
    };
    file.entries.push(entry);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn parse(name: &str, text: &str) -> ParsedFile {
        parse_text(Path::new(name), text)
    }

    fn objects(file: &ParsedFile) -> Vec<String> {
        file.entries
            .iter()
            .filter_map(|e| match e {
                Entry::Object { obj, .. } => {
                    Some(format!("{} {}/{}", obj.kind, obj.namespace, obj.name))
                }
                _ => None,
            })
            .collect()
    }

    fn errors(file: &ParsedFile) -> Vec<String> {
        file.entries
            .iter()
            .filter_map(|e| match e {
                Entry::Rejected(r) => Some(r.diagnostics.iter().map(ToString::to_string)),
                _ => None,
            })
            .flatten()
            .collect()
    }

    pub(crate) const VALID_VS: &str = "\
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews}
";
    #[test]
    fn splits_yaml_documents_and_keeps_line_numbers() {
        let text = "# leading comment\n---\na: 1\n---\n---\nb: 2\n...\nc: 3\n--- {d: 4}\n--- # only a comment\n";
        let chunks = split_yaml(text);
        let got: Vec<(usize, &str)> = chunks.iter().map(|c| (c.first_line, c.text)).collect();
        assert_eq!(
            got,
            [
                (1, "# leading comment\n---\na: 1\n"),
                (4, "---\n"),
                (5, "---\nb: 2\n...\n"),
                (8, "c: 3\n"),
                (9, "--- {d: 4}\n"),
                (10, "--- # only a comment\n"),
            ]
        );
        // A `---` inside a value is not a marker.
        assert_eq!(split_yaml("a: |\n  ---\n  x\n").len(), 1);
        assert_eq!(split_yaml("a: b\n----\n").len(), 1);
    }

    #[test]
    fn one_invalid_object_does_not_spoil_the_file() {
        let text = format!(
            "{VALID_VS}---\n# the bad one\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: bad\nspec:\n  hosts: [bad]\n  http:\n  - route:\n    - destination: {{host: a}}\n      weight: 20\n    - destination: {{host: b}}\n      weight: 120\n"
        );
        let file = parse("vs.yaml", &text);
        assert_eq!(objects(&file), ["VirtualService bookinfo/reviews"]);
        let errs = errors(&file);
        assert!(
            errs.contains(&"vs.yaml:22: VirtualService default/bad: spec.http[0].route[1].weight: weight 120 is not in the range 0..100".to_string()),
            "{errs:#?}"
        );
        assert!(errs.iter().any(|e| e.starts_with("vs.yaml:18: VirtualService default/bad: spec.http[0].route: total destination weight 140")), "{errs:#?}");
        let Entry::Rejected(r) = &file.entries[1] else {
            panic!()
        };
        assert_eq!(r.line, Some(11), "the object starts after its comment");
        assert_eq!(r.to_rejected_config().source, "vs.yaml:11");
        assert!(!file.broken_documents);
    }

    #[test]
    fn a_yaml_syntax_error_rejects_only_its_document() {
        let text = format!(
            "{VALID_VS}---\nkind: [unclosed\n---\n{}",
            VALID_VS.replace("reviews", "ratings")
        );
        let file = parse("mixed.yaml", &text);
        assert_eq!(
            objects(&file),
            [
                "VirtualService bookinfo/reviews",
                "VirtualService bookinfo/ratings"
            ]
        );
        assert!(file.broken_documents);
        let errs = errors(&file);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("mixed.yaml:11: YAML syntax error"),
            "{errs:?}"
        );
    }

    #[test]
    fn decode_errors_point_at_the_field_line() {
        let text = "apiVersion: networking.istio.io/v1beta1\nkind: DestinationRule\nmetadata: {name: dr}\nspec:\n  host: a\n  trafficPolicy:\n    loadBalancer:\n      simple: RR\n";
        let errs = errors(&parse("dr.yaml", text));
        assert_eq!(
            errs,
            [
                "dr.yaml:8: DestinationRule default/dr: spec.trafficPolicy.loadBalancer.simple: unknown variant `RR`, expected one of `UNSPECIFIED`, `LEAST_CONN`, `RANDOM`, `PASSTHROUGH`, `ROUND_ROBIN`, `LEAST_REQUEST`"
            ]
        );
        let text = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: dr}\nspec:\n  host: a\n  trafficPolicy:\n    loadBalancer:\n      simple: ROUND_ROBIN\n      consistentHash: {useSourceIp: true}\n";
        let errs = errors(&parse("dr.yaml", text));
        assert!(
            errs[0].starts_with("dr.yaml:7: DestinationRule default/dr: spec.trafficPolicy.loadBalancer: `simple` is set together with another field of the same one-of group"),
            "{errs:?}"
        );
        let text = "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: we}\nspec:\n  address: 10.0.0.1\n  weight: -3\n";
        let errs = errors(&parse("we.yaml", text));
        assert!(
            errs[0]
                .starts_with("we.yaml:6: WorkloadEntry default/we: spec.weight: invalid number -3"),
            "{errs:?}"
        );
    }

    #[test]
    fn lists_anchors_and_skipped_kinds() {
        let text = "\
apiVersion: v1
kind: List
items:
- apiVersion: networking.istio.io/v1
  kind: Gateway
  metadata: &meta {name: gw, namespace: istio-system}
  spec:
    servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: [\"*\"]}]
- apiVersion: networking.istio.io/v1
  kind: Sidecar
  metadata: {name: default, namespace: istio-system}
  spec: {}
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: web}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata:
  <<: {namespace: ns1}
  name: merged
spec: {outboundTrafficPolicy: {mode: REGISTRY_ONLY}}
";
        let file = parse("list.yaml", text);
        assert_eq!(
            objects(&file),
            ["Gateway istio-system/gw", "Sidecar ns1/merged"]
        );
        let errs = errors(&file);
        assert_eq!(
            errs,
            [
                "list.yaml:12: Sidecar istio-system/default: spec: sidecar: empty configuration provided (set egress, ingress, outboundTrafficPolicy or inboundConnectionPool)"
            ]
        );
        let skipped: Vec<_> = file
            .entries
            .iter()
            .filter_map(|e| match e {
                Entry::Skipped(d, _) => Some(d.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(
            skipped,
            [
                "list.yaml:13: Deployment web: skipped: apps/v1 Deployment is not a kind meshfed reads"
            ]
        );
        let Entry::Object { obj, .. } = &file.entries[0] else {
            panic!()
        };
        assert_eq!(obj.source, "list.yaml:4");
    }

    #[test]
    fn json_files() {
        let text = r#"{"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
 "metadata": {"name": "ext"},
 "spec": {"hosts": ["api.example.com"], "resolution": "DNS", "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}]}}
{"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
 "metadata": {"name": "bad"},
 "spec": {"hosts": [],
   "resolution": "DNS"}}
"#;
        let file = parse("se.json", text);
        assert_eq!(objects(&file), ["ServiceEntry default/ext"]);
        let errs = errors(&file);
        assert_eq!(
            errs,
            [
                "se.json:6: ServiceEntry default/bad: spec.hosts: service entry must have at least one host"
            ]
        );

        let broken = parse(
            "broken.json",
            "{\"apiVersion\": \"networking.istio.io/v1\",\n\"kind\": }",
        );
        let problem = broken.unusable.as_ref().expect("unusable");
        assert_eq!(problem.line, Some(2));
        assert!(
            problem.message.starts_with("JSON syntax error"),
            "{problem}"
        );
    }

    #[test]
    fn unreadable_bytes_make_the_file_unusable() {
        let file = parse_bytes(Path::new("bin.yaml"), b"a: 1\nb: \xff\n");
        assert_eq!(file.unusable.as_ref().and_then(|d| d.line), Some(2));
    }
}

//! The check that no folder of any crate has an import circle among its modules.
//!
//! For every crate of the workspace, each source file is a module (`a/b.rs` and
//! `a/b/mod.rs` are `a::b`). An import from module `a::x::...` of a path into
//! `a::y::...` (`use crate::a::y::Z`, a `crate::a::y::` path in the code, `super::y`
//! from a module of `a`, `self::` paths, each `use` tree expanded) is an edge `x -> y`
//! in folder `a`: the two siblings under the same parent. Imports of a module's own
//! ancestors or descendants are not edges (a parent's items are not a sibling). Test
//! modules (`#[cfg(test)] mod ...` to the end of the file) are left out: only the
//! production code must import one way.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates checked: name and source folder, relative to the workspace root.
const CRATES: &[(&str, &str)] = &[
    ("meshfed", "src"),
    ("meshfed_registry", "registries/core/src"),
    ("meshfed_kube", "registries/kube/src"),
    ("meshfed_consul", "registries/consul/src"),
    ("meshfed_eureka", "registries/eureka/src"),
    ("meshfed_api", "proto/src"),
    ("meshfed_load", "load/src"),
];

/// One crate's modules: module path -> source text.
type Modules = BTreeMap<Vec<String>, String>;

/// The modules of the crate whose library root is in `dir` (the binary's `main.rs`
/// and `src/bin` are other crates and left out).
fn read_crate(dir: &Path) -> Modules {
    let mut files = Vec::new();
    collect(dir, &mut files);
    let mut modules = Modules::new();
    for file in files {
        let rel = file.strip_prefix(dir).expect("under the crate folder");
        let mut parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        // The binary's root and `src/bin` are other crates; `tests.rs` files and
        // `tests/` folders are test modules.
        if parts.first().is_some_and(|p| p == "bin")
            || rel == Path::new("main.rs")
            || parts.iter().any(|p| p == "tests" || p == "tests.rs")
        {
            continue;
        }
        let last = parts.pop().expect("a file name");
        match last.as_str() {
            "lib.rs" if parts.is_empty() => {}
            "mod.rs" => {}
            name => parts.push(name.trim_end_matches(".rs").to_string()),
        }
        let text = std::fs::read_to_string(&file).expect("readable source");
        modules.insert(parts, text);
    }
    modules
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `text` without comments, string and char literals, and test modules.
fn production_code(text: &str) -> String {
    let cut = ["mod ", "pub mod ", "pub(crate) mod ", "pub(super) mod "]
        .iter()
        .filter_map(|m| text.find(&format!("#[cfg(test)]\n{m}")))
        .min()
        .unwrap_or(text.len());
    let chars: Vec<char> = text[..cut].chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let mut out = String::with_capacity(chars.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && at(i + 1) == '/') {
                i += 1;
            }
            i += 2;
        } else if c == 'r'
            && (at(i + 1) == '"' || at(i + 1) == '#')
            && !at(i.wrapping_sub(1)).is_alphanumeric()
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            if at(j) != '"' {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            while j < chars.len() && !(chars[j] == '"' && (1..=hashes).all(|k| at(j + k) == '#')) {
                j += 1;
            }
            out.push_str("\"\"");
            i = j + 1 + hashes;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == '\'' && at(i + 1) == '\\' {
            // An escaped char literal ('\n', '\'', '\u{..}').
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
        } else if c == '\'' && at(i + 2) == '\'' {
            i += 3; // a char literal; a lifetime has no closing quote
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Every path a `use` tree names (`a::{b, c::{d as e, *}}` -> `a::b`, `a::c::d`,
/// `a::c`).
fn expand_use(tree: &str) -> Vec<String> {
    fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
        let tree = tree.trim();
        if let Some(open) = tree.find('{') {
            let head = tree[..open].trim().trim_end_matches("::");
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let prefix = join(prefix, head);
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&prefix, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            expand(&prefix, &inner[start..], out);
        } else {
            let path = tree.split(" as ").next().unwrap_or("").trim();
            let path = path.trim_end_matches("::*");
            if path == "self" || path == "*" {
                out.push(prefix.to_string());
            } else if !path.is_empty() {
                out.push(join(prefix, path));
            }
        }
    }
    fn join(prefix: &str, path: &str) -> String {
        match (prefix.is_empty(), path.is_empty()) {
            (true, _) => path.to_string(),
            (_, true) => prefix.to_string(),
            _ => format!("{prefix}::{path}"),
        }
    }
    let mut out = Vec::new();
    expand("", tree, &mut out);
    out
}

/// The paths module `module` refers to, absolute within its crate (each still ending
/// in the item it names).
fn references(module: &[String], code: &str) -> Vec<Vec<String>> {
    let uses = regex::Regex::new(r"\buse\s+([^;]+);").expect("valid regex");
    let inline = regex::Regex::new(r"\b(?:crate|super|self)(?:::\w+)+").expect("valid regex");
    let mut paths: Vec<String> = Vec::new();
    for cap in uses.captures_iter(code) {
        paths.extend(expand_use(&cap[1]));
    }
    paths.extend(inline.find_iter(code).map(|m| m.as_str().to_string()));
    paths
        .iter()
        .filter_map(|path| resolve(module, path))
        .collect()
}

/// `path` as seen from `module`, absolute; `None` for another crate's path.
fn resolve(module: &[String], path: &str) -> Option<Vec<String>> {
    let mut segments = path.split("::").map(str::trim);
    let mut base: Vec<String> = match segments.next()? {
        "crate" => Vec::new(),
        "self" => module.to_vec(),
        "super" => module[..module.len().checked_sub(1)?].to_vec(),
        _ => return None,
    };
    for segment in segments {
        match segment {
            "super" => {
                base.pop()?;
            }
            "self" => {}
            "" => {}
            s => base.push(s.to_string()),
        }
    }
    Some(base)
}

/// The sibling-import graph of each folder: folder -> (module -> modules it imports).
type Graphs = BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>>;

fn graphs(modules: &Modules) -> Graphs {
    let mut graphs = Graphs::new();
    for (module, text) in modules {
        for target in references(module, &production_code(text)) {
            // The module the path leads into: its longest prefix that is a module.
            let Some(len) = (0..=target.len())
                .rev()
                .find(|&n| modules.contains_key(&target[..n]))
            else {
                continue;
            };
            let target = &target[..len];
            let common = module
                .iter()
                .zip(target)
                .take_while(|(a, b)| a == b)
                .count();
            if common == module.len() || common == target.len() {
                continue; // an ancestor or a descendant, not a sibling
            }
            graphs
                .entry(module[..common].to_vec())
                .or_default()
                .entry(module[common].clone())
                .or_default()
                .insert(target[common].clone());
        }
    }
    graphs
}

/// A circle in `graph`, as the modules along it (the first repeated at the end).
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_string());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// Every circle of the crate: `(folder, circle)`.
fn circles(modules: &Modules) -> Vec<(String, Vec<String>)> {
    graphs(modules)
        .iter()
        .filter_map(|(folder, graph)| {
            let circle = find_circle(graph)?;
            Some((folder.join("::"), circle))
        })
        .collect()
}

fn modules_of(files: &[(&str, &str)]) -> Modules {
    files
        .iter()
        .map(|(path, text)| {
            let module: Vec<String> = if path.is_empty() {
                Vec::new()
            } else {
                path.split("::").map(String::from).collect()
            };
            (module, text.to_string())
        })
        .collect()
}

#[test]
fn a_circle_between_siblings_is_found() {
    let modules = modules_of(&[
        ("", "mod a; mod b;"),
        ("a", "mod x; mod y;"),
        ("a::x", "use super::y::Thing; // crate::a::z::Nope\n"),
        ("a::y", "pub struct Thing; fn f() { crate::a::x::g(); }"),
        ("b", "use crate::a::{x, y::Thing};"),
    ]);
    assert_eq!(
        circles(&modules),
        vec![("a".to_string(), vec!["x".into(), "y".into(), "x".into()])]
    );
}

#[test]
fn imports_one_way_parents_and_children_are_no_circle() {
    let modules = modules_of(&[
        ("", "pub mod a; pub mod b; pub struct Root;"),
        ("a", "mod x; mod y; pub use self::x::X; use crate::Root;"),
        ("a::x", "use super::{y::Y, Parent as P}; pub struct X;"),
        ("a::y", "pub struct Y; use crate::b::B;"),
        (
            "b",
            "pub struct B; /* use crate::a::x::X; */ const S: &str = \"crate::a::X\"; \
             const Q: char = '\"'; fn f<'a>(s: &'a str) {} const R: &str = r#\"crate::a\"#;",
        ),
        (
            "c",
            "use crate::b::B;\n#[cfg(test)]\nmod tests { use crate::c::C; use super::super::a::X; }",
        ),
    ]);
    assert_eq!(circles(&modules), Vec::<(String, Vec<String>)>::new());
    let graphs = graphs(&modules);
    assert_eq!(
        graphs[&vec!["a".to_string()]]["x"],
        BTreeSet::from(["y".to_string()])
    );
    assert_eq!(graphs[&Vec::new()]["a"], BTreeSet::from(["b".to_string()]));
}

#[test]
fn use_trees_expand_to_every_path() {
    assert_eq!(
        expand_use("crate::a::{self, b::{C as D, *}, e}"),
        ["crate::a", "crate::a::b::C", "crate::a::b", "crate::a::e"]
    );
}

#[test]
fn no_folder_of_any_crate_has_an_import_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for (krate, dir) in CRATES {
        let modules = read_crate(&root.join(dir));
        for (folder, circle) in circles(&modules) {
            found.push(format!(
                "{krate}: in `{}`: {}",
                if folder.is_empty() {
                    "crate root"
                } else {
                    &folder
                },
                circle.join(" -> ")
            ));
        }
    }
    assert!(
        found.is_empty(),
        "module import circles:\n{}",
        found.join("\n")
    );
}

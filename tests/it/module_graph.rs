//! No crate of the workspace has a cycle among its top-level modules: each module builds
//! only on the ones below it. Read from the sources: an edge is a `crate::module` path,
//! a module named inside `use crate::{…}`, or a name the crate root re-exports from a
//! module; comments (doc links included) and test code do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Every package of the workspace with a library.
const CRATES: &[&str] = &[
    ".",
    "collectives",
    "transports",
    "rendezvous",
    "nccl",
    "ddp",
    "observe",
    "tools",
];

type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// The production code of a source file, without comments.
fn code(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers in `text`.
fn words(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect()
}

/// The top-level modules of the crate whose sources are in `src`, and which of them each
/// one uses.
fn module_graph(src: &Path) -> Graph {
    let mut modules = BTreeSet::new();
    for entry in fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let is_module = path.is_dir() && stem != "bin" && stem != "tests"
            || path.extension().is_some_and(|e| e == "rs") && stem != "lib" && stem != "main";
        if is_module {
            modules.insert(stem);
        }
    }
    // `pub use module::{Name, …};` at the crate root: `crate::Name` is that module's.
    let root = code(&src.join("lib.rs"));
    let mut exported = BTreeMap::new();
    for statement in root.split(';') {
        let Some(rest) = statement.trim().strip_prefix("pub use ") else {
            continue;
        };
        let mut names = words(rest).into_iter();
        if let Some(module) = names.next().filter(|m| modules.contains(*m)) {
            for name in names {
                exported.insert(name.to_string(), module.to_string());
            }
        }
    }
    let mut graph = Graph::new();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let first = relative.iter().next().unwrap().to_string_lossy();
        let from = first.trim_end_matches(".rs").to_string();
        if !modules.contains(&from) {
            continue;
        }
        let text = code(&file);
        let mut used = BTreeSet::new();
        for (at, _) in text.match_indices("crate::") {
            let after = &text[at + "crate::".len()..];
            let named: Vec<&str> = if let Some(group) = after.strip_prefix('{') {
                words(&group[..group.find('}').unwrap_or(group.len())])
            } else {
                words(after).into_iter().take(1).collect()
            };
            for name in named {
                if modules.contains(name) {
                    used.insert(name.to_string());
                } else if let Some(module) = exported.get(name) {
                    used.insert(module.clone());
                }
            }
        }
        used.remove(&from);
        graph.entry(from).or_default().extend(used);
    }
    graph
}

/// A cycle of `graph`, if it has one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
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

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let graph: Graph = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .into_iter()
        .map(|(from, to)| (from.to_string(), BTreeSet::from([to.to_string()])))
        .collect();
    assert_eq!(find_cycle(&graph).map(|c| c.len()), Some(4));
    let mut acyclic = graph;
    acyclic.insert("c".into(), BTreeSet::new());
    assert_eq!(find_cycle(&acyclic), None);
}

#[test]
fn no_crate_has_a_cycle_among_its_modules() {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut edges = 0;
    for package in CRATES {
        let src = workspace.join(package).join("src");
        let graph = module_graph(&src);
        assert!(!graph.is_empty(), "{package}: read no modules from {src:?}");
        edges += graph.values().map(BTreeSet::len).sum::<usize>();
        if let Some(cycle) = find_cycle(&graph) {
            panic!(
                "{package}: modules use each other in a cycle: {}; move what they share \
                 into a module below both",
                cycle.join(" -> ")
            );
        }
    }
    assert!(edges > 100, "read only {edges} uses between modules");
}

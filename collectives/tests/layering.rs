//! The core's layering rules, checked on its own sources: it depends on a short list of
//! crates, and names nothing of what observes it (observers attach through
//! `hooks::CallHooks`, from `ringccl-observe` or elsewhere).

use std::fs;
use std::path::{Path, PathBuf};

/// The only crates the core may depend on (outside tests).
const ALLOWED: &[&str] = &["bytes", "half", "bytemuck", "thiserror", "tracing", "libc"];

/// Names of the observability layer that the core must not use.
const OBSERVABILITY: &[&str] = &[
    "FlightRecorder",
    "FlightConfig",
    "FlightDump",
    "CollectiveTrace",
    "TraceFile",
    "ringccl_observe",
    "flight::",
    "timeline::",
    "serde",
];

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The names of the `[dependencies]` table of a Cargo manifest.
fn dependencies(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut inside = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
            continue;
        }
        if !inside || line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.split(['=', '.']).next() {
            names.push(name.trim().to_string());
        }
    }
    names
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_core_depends_only_on_the_allowed_crates() {
    let manifest = fs::read_to_string(manifest_dir().join("Cargo.toml")).unwrap();
    let names = dependencies(&manifest);
    assert!(names.contains(&"bytes".to_string()), "parsed {names:?}");
    let extra: Vec<&String> = names
        .iter()
        .filter(|n| !ALLOWED.contains(&n.as_str()))
        .collect();
    assert!(
        extra.is_empty(),
        "ringccl-collectives depends on {extra:?}, outside {ALLOWED:?}: move the code that needs \
         them to a crate above the core"
    );
}

#[test]
fn the_core_names_nothing_of_what_observes_it() {
    let mut files = Vec::new();
    rust_files(&manifest_dir().join("src"), &mut files);
    assert!(files.len() > 20, "found {} files", files.len());
    let mut found = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).unwrap();
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for name in OBSERVABILITY {
                if code.contains(name) {
                    found.push(format!("{}:{}: {name}", file.display(), number + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the core names the observability layer (attach it through hooks instead):\n{}",
        found.join("\n")
    );
}

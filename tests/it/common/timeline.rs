//! Reading the timelines (Chrome traces) that ranks write: one JSON document per file.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// A fresh directory for one test's traces.
pub fn trace_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ringccl-trace-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The file parsed as one JSON document: it must be valid JSON as written.
pub fn events(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}\n{text}", path.display()))
}

/// The thread id of the row called `name` in process `pid`.
pub fn row(events: &[Value], pid: u64, name: &str) -> Option<u64> {
    events
        .iter()
        .find(|e| e["name"] == "thread_name" && e["pid"] == pid && e["args"]["name"] == name)
        .and_then(|e| e["tid"].as_u64())
}

/// The complete events of process `pid`'s row `tid`, in time order.
pub fn spans(events: &[Value], pid: u64, tid: u64) -> Vec<&Value> {
    let mut spans: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == pid && e["tid"] == tid)
        .collect();
    spans.sort_by(|a, b| a["ts"].as_f64().partial_cmp(&b["ts"].as_f64()).unwrap());
    spans
}

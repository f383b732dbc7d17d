//! `ringrun --trace DIR`: every rank writes its Chrome trace to `DIR/rank-<r>.json`
//! (through `RINGCCL_TRACE`), and when the job ends ringrun merges them into
//! `DIR/trace.json`, one process row per rank (`rank r`), which Perfetto and
//! chrome://tracing open.
//!
//! The merge reads the files line by line (each line is one event, see the library's
//! `timeline` module), so the file of a rank that was killed, which lacks its closing `]`
//! and perhaps half of its last line, still contributes every complete event.
//!
//! A call that runs long is written by its rank as an *unfinished* span (`"status":
//! "unfinished"`), extended every second while it runs. The merge keeps the longest copy
//! of each such call that never finished (a call that hung until its rank was stopped
//! shows up to about that moment), and drops the copies of calls that did finish.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

/// The merged file's name in the trace directory.
pub(crate) const MERGED: &str = "trace.json";

/// Makes the directory and removes what an earlier job left there for `ranks` (this
/// node's: on a directory shared by several nodes, another node's ranks may already be
/// writing theirs) and the merged trace, so the merge shows this job only. Returns the
/// absolute directory, for the ranks' environment.
pub(crate) fn prepare(dir: &Path, ranks: std::ops::Range<usize>) -> io::Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let dir = fs::canonicalize(dir)?;
    for (path, rank) in rank_files(&dir)? {
        if ranks.contains(&rank) {
            fs::remove_file(&path)?;
        }
    }
    match fs::remove_file(dir.join(MERGED)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    Ok(dir)
}

/// What the merge found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Merged {
    /// The ranks whose files were merged, in order.
    pub(crate) ranks: Vec<usize>,
    /// Complete events (`"ph":"X"`) in all.
    pub(crate) spans: usize,
    /// Ranks whose file was not finished (the rank did not end cleanly).
    pub(crate) unfinished: Vec<usize>,
    /// Lines that were not an event (a last line cut short), skipped.
    pub(crate) skipped: usize,
    /// Calls that never finished, kept as spans marked unfinished.
    pub(crate) unfinished_calls: usize,
}

/// What identifies one span across its copies: process, row, start, name.
type SpanKey = (u64, u64, u64, String);

/// The event on one line of a rank file, or why there is none.
enum Line {
    /// Not an event: blank, the opening `[`.
    Nothing,
    /// The closing `]`.
    End,
    /// Not JSON, or not an object (a line cut short).
    Broken,
    /// An event, and its text.
    Event(serde_json::Value, String),
}

fn parse_line(line: &str) -> Line {
    let event = line.trim().trim_start_matches(',');
    match event {
        "" | "[" => Line::Nothing,
        "]" => Line::End,
        _ => match serde_json::from_str::<serde_json::Value>(event) {
            Ok(value) if value.is_object() => Line::Event(value, event.to_string()),
            _ => Line::Broken,
        },
    }
}

/// For a complete event: its key, and whether it is an unfinished copy.
fn span_key(event: &serde_json::Value) -> Option<(SpanKey, bool)> {
    if event["ph"] != "X" {
        return None;
    }
    let number = |field: &str| event[field].as_u64().unwrap_or(u64::MAX);
    let key = (
        number("pid"),
        number("tid"),
        event["ts"].as_f64().map_or(u64::MAX, f64::to_bits),
        event["name"].as_str().unwrap_or_default().to_string(),
    );
    Some((key, event["args"]["status"] == "unfinished"))
}

/// The lines (by number) of `path` to keep among its unfinished copies: for each span
/// with no finished copy, its longest one.
fn unfinished_to_keep(path: &Path) -> io::Result<HashSet<usize>> {
    let mut finished: HashSet<SpanKey> = HashSet::new();
    let mut longest: HashMap<SpanKey, (f64, usize)> = HashMap::new();
    for (number, line) in BufReader::new(File::open(path)?).lines().enumerate() {
        let Line::Event(event, _) = parse_line(&line?) else {
            continue;
        };
        match span_key(&event) {
            Some((key, false)) => {
                finished.insert(key);
            }
            Some((key, true)) => {
                let dur = event["dur"].as_f64().unwrap_or(0.0);
                let slot = longest.entry(key).or_insert((dur, number));
                if dur >= slot.0 {
                    *slot = (dur, number);
                }
            }
            None => {}
        }
    }
    Ok(longest
        .into_iter()
        .filter(|(key, _)| !finished.contains(key))
        .map(|(_, (_, number))| number)
        .collect())
}

/// The `rank-<r>.json` and `rank-<r>.<n>.json` files of `dir`, by rank.
fn rank_files(dir: &Path) -> io::Result<Vec<(PathBuf, usize)>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(stem) = name
            .strip_prefix("rank-")
            .and_then(|rest| rest.strip_suffix(".json"))
        else {
            continue;
        };
        let rank = stem.split('.').next().and_then(|r| r.parse().ok());
        if let Some(rank) = rank {
            files.push((path, rank));
        }
    }
    files.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    Ok(files)
}

/// Merges every rank file of `dir` into `dir/trace.json` (written to a temporary file
/// and renamed, so a reader never sees half of it).
pub(crate) fn merge(dir: &Path) -> io::Result<Merged> {
    let files = rank_files(dir)?;
    let temporary = dir.join(format!(".{MERGED}.{}", std::process::id()));
    let mut out = BufWriter::new(File::create(&temporary)?);
    let mut merged = Merged::default();
    out.write_all(b"[\n")?;
    let mut first = true;
    for (path, rank) in &files {
        let mut finished = false;
        let keep = unfinished_to_keep(path)?;
        for (number, line) in BufReader::new(File::open(path)?).lines().enumerate() {
            let (value, event) = match parse_line(&line?) {
                Line::Nothing => continue,
                Line::End => {
                    finished = true;
                    continue;
                }
                Line::Broken => {
                    merged.skipped += 1;
                    continue;
                }
                Line::Event(value, event) => (value, event),
            };
            if let Some((_, true)) = span_key(&value) {
                if !keep.contains(&number) {
                    continue;
                }
                merged.unfinished_calls += 1;
            }
            merged.spans += usize::from(value["ph"] == "X");
            out.write_all(if first { b"" } else { b"," })?;
            out.write_all(event.as_bytes())?;
            out.write_all(b"\n")?;
            first = false;
        }
        if !finished {
            merged.unfinished.push(*rank);
        }
        if merged.ranks.last() != Some(rank) {
            merged.ranks.push(*rank);
        }
    }
    out.write_all(b"]\n")?;
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    fs::rename(&temporary, dir.join(MERGED))?;
    Ok(merged)
}

/// Merges and says what came of it on stderr.
pub(crate) fn merge_and_report(dir: &Path) {
    match merge(dir) {
        Ok(merged) if merged.ranks.is_empty() => crate::say!(
            "--trace: no rank wrote a trace to {} (ringccl ranks write one when they start a \
             process group)",
            dir.display()
        ),
        Ok(merged) => {
            crate::say!(
                "--trace: merged the timelines of {} rank(s) into {} ({} spans); open it in \
                 https://ui.perfetto.dev or chrome://tracing",
                merged.ranks.len(),
                dir.join(MERGED).display(),
                merged.spans
            );
            if merged.unfinished_calls > 0 {
                crate::say!(
                    "--trace: {} call(s) never finished; they show as spans marked unfinished \
                     (\"status\": \"unfinished\"), up to the last moment their rank wrote",
                    merged.unfinished_calls
                );
            }
            if !merged.unfinished.is_empty() {
                crate::say!(
                    "--trace: the files of rank(s) {:?} were not finished (the rank was killed or \
                     crashed): their last ~100 ms may be missing{}",
                    merged.unfinished,
                    if merged.skipped > 0 {
                        format!(", and {} cut-off line(s) were skipped", merged.skipped)
                    } else {
                        String::new()
                    }
                );
            }
        }
        Err(e) => crate::say!(
            "--trace: could not merge the rank files of {} into {MERGED}: {e}",
            dir.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfinished_and_cut_files_still_merge_into_one_array() {
        let dir = std::env::temp_dir().join(format!("ringrun-merge-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let event = |pid: usize, name: &str| {
            format!(
                r#"{{"name":"{name}","ph":"X","ts":1,"dur":2,"pid":{pid},"tid":1,"args":{{}}}}"#
            )
        };
        let meta = |pid: usize| {
            format!(
                r#"{{"name":"process_name","ph":"M","pid":{pid},"args":{{"name":"rank {pid}"}}}}"#
            )
        };
        fs::write(
            dir.join("rank-0.json"),
            format!("[\n{}\n,{}\n]\n", meta(0), event(0, "a")),
        )
        .unwrap();
        // Killed mid-line: no closing bracket, the last line cut.
        fs::write(
            dir.join("rank-1.json"),
            format!("[\n{}\n,{}\n,{{\"name\":\"cu", meta(1), event(1, "b")),
        )
        .unwrap();
        fs::write(dir.join("notes.json"), "not a rank file").unwrap();
        let merged = merge(&dir).unwrap();
        assert_eq!(merged.ranks, vec![0, 1]);
        assert_eq!(merged.spans, 2);
        assert_eq!(merged.unfinished, vec![1]);
        assert_eq!(merged.skipped, 1);
        let text = fs::read_to_string(dir.join(MERGED)).unwrap();
        let events: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
        assert_eq!(events.len(), 4);
        assert!(events
            .iter()
            .any(|e| e["name"] == "process_name" && e["args"]["name"] == "rank 1"));

        // The next job starts from a clean directory, for the ranks of this node.
        let prepared = prepare(&dir, 1..2).unwrap();
        assert_eq!(rank_files(&prepared).unwrap().len(), 1);
        let prepared = prepare(&dir, 0..2).unwrap();
        assert!(rank_files(&prepared).unwrap().is_empty());
        assert!(!prepared.join(MERGED).exists());
        assert!(prepared.join("notes.json").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A call that hung shows once, as its longest unfinished copy; a call that was
    /// written unfinished and then finished shows once, finished.
    #[test]
    fn the_longest_copy_of_a_call_that_never_finished_is_kept() {
        let dir = std::env::temp_dir().join(format!("ringrun-unfinished-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let span = |ts: u64, dur: u64, status: &str| {
            format!(
                r#"{{"name":"all_reduce","cat":"collective","ph":"X","ts":{ts}.5,"dur":{dur},"pid":0,"tid":1,"args":{{"op":{ts},"status":"{status}"}}}}"#
            )
        };
        let lines = [
            span(10, 1_000_000, "unfinished"),
            span(10, 1_500_000, "ok"),
            span(20, 1_000_000, "unfinished"),
            span(20, 2_000_000, "unfinished"),
            span(20, 3_000_000, "unfinished"),
        ];
        fs::write(
            dir.join("rank-0.json"),
            format!("[\n{}\n", lines.join("\n,")),
        )
        .unwrap();
        let merged = merge(&dir).unwrap();
        assert_eq!(merged.spans, 2);
        assert_eq!(merged.unfinished_calls, 1);
        let text = fs::read_to_string(dir.join(MERGED)).unwrap();
        let events: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
        let spans: Vec<(f64, f64, &str)> = events
            .iter()
            .map(|e| {
                (
                    e["ts"].as_f64().unwrap(),
                    e["dur"].as_f64().unwrap(),
                    e["args"]["status"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            spans,
            [(10.5, 1_500_000.0, "ok"), (20.5, 3_000_000.0, "unfinished")]
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}

//! `ringrun --trace DIR`: every rank writes its Chrome trace to `DIR/rank-<r>.json`
//! (through `RINGCCL_TRACE`), and when the job ends ringrun merges them into
//! `DIR/trace.json`, one process row per rank (`rank r`), which Perfetto and
//! chrome://tracing open.
//!
//! The merge reads the files line by line (each line is one event, see the library's
//! `timeline` module), so the file of a rank that was killed, which lacks its closing `]`
//! and perhaps half of its last line, still contributes every complete event.

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
        for line in BufReader::new(File::open(path)?).lines() {
            let line = line?;
            let event = line.trim().trim_start_matches(',');
            match event {
                "" | "[" => continue,
                "]" => {
                    finished = true;
                    continue;
                }
                _ => {}
            }
            let Ok(value) = serde_json::from_str::<serde_json::Value>(event) else {
                merged.skipped += 1;
                continue;
            };
            if !value.is_object() {
                merged.skipped += 1;
                continue;
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
}

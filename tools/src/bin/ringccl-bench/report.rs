//! What rank 0 prints: the nccl-tests table and its footer, and the `--json` rows.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use serde::{Serialize, Serializer};

use super::bench_op::BenchOp;
use super::progress::Progress;

/// One row of the table; also one line (a JSON object) of the `--json` file.
#[derive(Serialize)]
pub(crate) struct Row<'a> {
    pub(crate) coll: &'static str,
    pub(crate) backend: &'a str,
    pub(crate) nranks: usize,
    pub(crate) size: usize,
    pub(crate) count: usize,
    #[serde(rename = "type")]
    pub(crate) dtype: &'static str,
    pub(crate) redop: &'static str,
    pub(crate) root: i64,
    #[serde(serialize_with = "three_decimals")]
    pub(crate) time_us: f64,
    #[serde(serialize_with = "six_decimals")]
    pub(crate) algbw_gbps: f64,
    #[serde(serialize_with = "six_decimals")]
    pub(crate) busbw_gbps: f64,
    pub(crate) wrong: i64,
    #[serde(serialize_with = "three_decimals")]
    pub(crate) loop_us: f64,
    pub(crate) iters: usize,
}

/// Rounds for the JSON file to the precision it has always had (µs to ns, GB/s to KB/s).
fn rounded<S: Serializer>(value: f64, decimals: i32, out: S) -> Result<S::Ok, S::Error> {
    let scale = 10f64.powi(decimals);
    out.serialize_f64((value * scale).round() / scale)
}

fn three_decimals<S: Serializer>(value: &f64, out: S) -> Result<S::Ok, S::Error> {
    rounded(*value, 3, out)
}

fn six_decimals<S: Serializer>(value: &f64, out: S) -> Result<S::Ok, S::Error> {
    rounded(*value, 6, out)
}

/// What one rank prints and records.
pub(crate) struct Report {
    rank0: bool,
    json: Option<File>,
    busbw_sum: f64,
    rows: usize,
    wrong: i64,
    /// Rank 0's "which size now" line, cleared before every row.
    progress: Progress,
}

impl Report {
    /// Rank 0's report creates the `--json` file, if one is asked for.
    pub(crate) fn create(
        rank0: bool,
        launched: bool,
        json: Option<&Path>,
    ) -> Result<Report, String> {
        let json = match (json, rank0) {
            (Some(path), true) => {
                Some(File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?)
            }
            _ => None,
        };
        Ok(Report {
            rank0,
            json,
            busbw_sum: 0.0,
            rows: 0,
            wrong: 0,
            progress: Progress::for_rank(launched),
        })
    }

    /// The comment lines and column names above the rows.
    pub(crate) fn print_header(&self, coll: BenchOp, tensors: usize) {
        if !self.rank0 {
            return;
        }
        if matches!(coll, BenchOp::Bucketed | BenchOp::Separate) {
            println!("# {tensors} tensors per call, size = all tensors together");
        }
        println!("# time = median over iterations of the slowest rank; loop = slowest rank's loop time / iterations");
        println!(
            "#{:>11} {:>12} {:>8} {:>6} {:>5} {:>10} {:>10} {:>10} {:>7} {:>10} {:>7}",
            "size(B)",
            "count",
            "type",
            "redop",
            "root",
            "time(us)",
            "algbw(GB/s)",
            "busbw(GB/s)",
            "#wrong",
            "loop(us)",
            "iters"
        );
    }

    /// A row: printed by rank 0 (and written to the JSON file), counted by every rank.
    pub(crate) fn row(&mut self, row: &Row<'_>) -> Result<(), String> {
        self.busbw_sum += row.busbw_gbps;
        self.rows += 1;
        self.wrong += row.wrong;
        if !self.rank0 {
            return Ok(());
        }
        self.progress.clear();
        println!(
            "{:>12} {:>12} {:>8} {:>6} {:>5} {:>10.1} {:>10.3} {:>10.3} {:>7} {:>10.1} {:>7}",
            row.size,
            row.count,
            row.dtype,
            row.redop,
            row.root,
            row.time_us,
            row.algbw_gbps,
            row.busbw_gbps,
            row.wrong,
            row.loop_us,
            row.iters
        );
        let _ = std::io::stdout().flush();
        if let Some(file) = &mut self.json {
            let line =
                serde_json::to_string(row).map_err(|e| format!("encoding a JSON row: {e}"))?;
            writeln!(file, "{line}").map_err(|e| format!("writing the JSON file: {e}"))?;
        }
        Ok(())
    }

    /// Shows rank 0's progress (a terminal line, or a message to the launcher).
    pub(crate) fn progress(&mut self, text: &str) {
        if self.rank0 {
            self.progress.show(text);
        }
    }

    /// The lines below the rows: the wrong elements and the mean bus bandwidth.
    pub(crate) fn print_footer(&mut self) {
        if !self.rank0 {
            return;
        }
        self.progress.clear();
        println!(
            "# Out of bounds values : {} {}",
            self.wrong,
            if self.wrong == 0 { "OK" } else { "FAILED" }
        );
        println!(
            "# Avg bus bandwidth    : {:.4}",
            self.busbw_sum / self.rows.max(1) as f64
        );
    }

    /// Wrong elements over every row so far.
    pub(crate) fn wrong(&self) -> i64 {
        self.wrong
    }
}

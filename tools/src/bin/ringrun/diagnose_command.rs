//! `ringrun diagnose DIR`: the diagnosis of a directory of flight dumps, offline.

use std::process::ExitCode;
use std::time::SystemTime;

use clap::Parser;
use ringccl_tools::diagnose::{diagnose, load_dir};

use crate::args::DiagnoseArgs;
use crate::diagnosis::micros;

/// The word that selects this command (`ringrun diagnose DIR`).
pub(crate) const COMMAND: &str = "diagnose";

/// Runs `ringrun diagnose` with the arguments after the command word. Prints the diagnosis
/// on stdout; exits 0 if it names a cause, 1 if not, 2 if DIR cannot be read.
pub(crate) fn run(args: impl Iterator<Item = std::ffi::OsString>) -> ExitCode {
    let args = DiagnoseArgs::parse_from(std::iter::once("ringrun diagnose".into()).chain(args));
    let now_us = micros(SystemTime::now());
    let mut evidence = match load_dir(&args.dir, now_us, 0) {
        Ok(evidence) => evidence,
        Err(e) => {
            crate::say!("cannot read {}: {e}", args.dir.display());
            return ExitCode::from(2);
        }
    };
    // "Last seen 3.2 s ago" counts from when the dumps were taken, not from today.
    if let Some(newest) = evidence.dumps.iter().map(|d| d.dumped_at_us).max() {
        evidence.now_us = newest;
        evidence.notes.push(format!(
            "times are as of the newest dump, written {:.1} s before this diagnosis",
            now_us.saturating_sub(newest) as f64 / 1e6
        ));
    }
    let diagnosis = diagnose(&evidence);
    {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        for line in diagnosis.lines() {
            let _ = writeln!(out, "{line}");
        }
    }
    if diagnosis.found_cause() {
        ExitCode::SUCCESS
    } else {
        crate::say!(
            "the files in {} show no cause (no rank holding others up, no mismatch, no \
             failure)",
            args.dir.display()
        );
        ExitCode::FAILURE
    }
}

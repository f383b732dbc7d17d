//! Running out of file descriptors: recognising `EMFILE`/`ENFILE`, and saying which limit
//! was reached (`RLIMIT_NOFILE` and its values) and how to raise it.

// getrlimit(2) is an FFI call: one block, reading this process's limit into a local.
#![allow(unsafe_code)]

use std::io;

use crate::SetupError;

/// Whether `error` means "no descriptor left" (this process's `EMFILE`, or the system's
/// `ENFILE`), which waiting cannot fix.
pub(crate) fn is_exhaustion(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// `error` as a [`SetupError::DescriptorsExhausted`] when it is one, else `other(error)`.
pub(crate) fn or_else(
    rank: usize,
    during: impl FnOnce() -> String,
    error: io::Error,
    other: impl FnOnce(io::Error) -> SetupError,
) -> SetupError {
    if is_exhaustion(&error) {
        exhausted(rank, during(), &error)
    } else {
        other(error)
    }
}

/// The error for `rank` having run out of descriptors while `during`.
pub(crate) fn exhausted(rank: usize, during: String, error: &io::Error) -> SetupError {
    SetupError::DescriptorsExhausted {
        rank,
        during,
        detail: explain(error),
    }
}

/// Which limit `error` hit, the current values of `RLIMIT_NOFILE`, and what to do.
pub(crate) fn explain(error: &io::Error) -> String {
    let (soft, hard) = nofile_limits();
    if error.raw_os_error() == Some(libc::ENFILE) {
        format!(
            "the system-wide table of open files is full (ENFILE: see /proc/sys/fs/file-nr and fs.file-max); \
             this process's own RLIMIT_NOFILE is soft {soft}, hard {hard}; close files elsewhere on this host or raise fs.file-max"
        )
    } else {
        format!(
            "this process reached its RLIMIT_NOFILE (soft limit {soft}, hard limit {hard}; EMFILE); raise it before starting \
             the job, e.g. `ulimit -n {hard}` in the launching shell (LimitNOFILE= under systemd, `--ulimit nofile=` under \
             docker), and check the program for a descriptor leak"
        )
    }
}

/// The soft and hard `RLIMIT_NOFILE` of this process. Asked of the kernel directly:
/// reading `/proc/self/limits` would need the very descriptor that is missing.
fn nofile_limits() -> (String, String) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the `rlimit` it is given, a valid local.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if rc != 0 {
        return ("unknown".into(), "unknown".into());
    }
    let show = |value: libc::rlim_t| {
        if value == libc::RLIM_INFINITY {
            "unlimited".to_string()
        } else {
            value.to_string()
        }
    };
    (show(limit.rlim_cur), show(limit.rlim_max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_limit_and_the_remedy() {
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        assert!(is_exhaustion(&emfile));
        let text = explain(&emfile);
        assert!(
            text.contains("RLIMIT_NOFILE") && text.contains("ulimit -n"),
            "{text}"
        );
        let enfile = io::Error::from_raw_os_error(libc::ENFILE);
        assert!(is_exhaustion(&enfile));
        assert!(explain(&enfile).contains("fs.file-max"));
        assert!(!is_exhaustion(&io::Error::from_raw_os_error(
            libc::ECONNREFUSED
        )));
        // The live values, as /proc shows them too.
        let (soft, hard) = nofile_limits();
        let proc_line = std::fs::read_to_string("/proc/self/limits")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .map(|l| {
                l.split_whitespace()
                    .skip(3)
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" ")
            });
        if let Some(proc_line) = proc_line {
            assert_eq!(proc_line, format!("{soft} {hard}"));
        }
    }
}

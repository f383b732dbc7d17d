//! Running out of file descriptors: recognising `EMFILE`/`ENFILE`, and saying which limit
//! was reached (`RLIMIT_NOFILE`, read from `/proc/self/limits`) and how to raise it.

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

/// The soft and hard `RLIMIT_NOFILE` of this process, as `/proc/self/limits` shows them
/// ("unknown" where it cannot be read).
fn nofile_limits() -> (String, String) {
    let text = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    parse_nofile(&text).unwrap_or_else(|| ("unknown".into(), "unknown".into()))
}

fn parse_nofile(limits: &str) -> Option<(String, String)> {
    let line = limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))?;
    let mut words = line.split_whitespace();
    Some((words.next()?.to_string(), words.next()?.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_limits_line() {
        let text = "Limit                     Soft Limit           Hard Limit           Units\n\
                    Max processes             63432                63432                processes\n\
                    Max open files            1024                 1048576              files\n";
        assert_eq!(
            parse_nofile(text),
            Some(("1024".to_string(), "1048576".to_string()))
        );
        assert_eq!(parse_nofile("garbage"), None);
    }

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
        // The live values, read from /proc on Linux.
        let (soft, _) = nofile_limits();
        assert!(soft.parse::<u64>().is_ok() || soft == "unlimited", "{soft}");
    }
}

//! ringccl's diagnostics: the library reports through [`tracing`] (rejected connections,
//! strangers on its ports, rendezvous progress).
//!
//! - With `RINGCCL_DEBUG` set ([`DEBUG_VAR`]) and no global subscriber installed by the
//!   application, [`init_process_group`](crate::init_process_group) and
//!   [`local_groups`](crate::local_groups) install ringccl's stderr formatter at that
//!   level, as `NCCL_DEBUG` works in any program. Call [`init_from_env`] to install it
//!   earlier.
//! - An application with its own global subscriber is left alone: ringccl's events go
//!   to that subscriber. Install it before the first process group: a global subscriber
//!   can be set only once per process.
//! - Without either, ringccl prints nothing, except a rank still waiting at start-up,
//!   which says whom it waits for on stderr (first after 30 s).

use std::io::IsTerminal;

use tracing_subscriber::filter::LevelFilter;

/// The variable that picks the level, like `NCCL_DEBUG`: `error`, `warn`, `info`,
/// `debug` or `trace`, in any case.
pub const DEBUG_VAR: &str = "RINGCCL_DEBUG";

/// The level when [`DEBUG_VAR`] is unset, empty or unrecognised.
const DEFAULT_LEVEL: LevelFilter = LevelFilter::WARN;

/// Prints this process's `tracing` events to stderr, at the level [`DEBUG_VAR`]
/// (`RINGCCL_DEBUG`) names; `warn` by default. An unrecognised value is reported as one
/// warning and the default is used. Does nothing when a global subscriber is already
/// installed, so calling it twice is harmless. `ringrun` and `ringccl-bench` call it at
/// start-up.
///
/// ```
/// // RINGCCL_DEBUG=info shows each rank's rendezvous; debug shows every connection.
/// ringccl::logging::init_from_env();
/// ringccl::logging::init_from_env(); // no effect, no panic
/// ```
pub fn init_from_env() {
    let value = std::env::var_os(DEBUG_VAR).map(|v| v.to_string_lossy().into_owned());
    let wanted = value.as_deref().map(str::trim).filter(|v| !v.is_empty());
    let level = wanted.and_then(parse_level);
    let installed = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_max_level(level.unwrap_or(DEFAULT_LEVEL))
        .try_init()
        .is_ok();
    if let (true, Some(value), None) = (installed, wanted, level) {
        tracing::warn!(
            "{DEBUG_VAR}={value:?} is not one of error, warn, info, debug, trace; using {}",
            DEFAULT_LEVEL
        );
    }
}

/// [`init_from_env`] when `RINGCCL_DEBUG` is set and the application has installed no
/// global subscriber; nothing otherwise.
pub(crate) fn init_if_asked() {
    let asked = std::env::var_os(DEBUG_VAR).is_some_and(|v| !v.is_empty());
    if asked && !tracing::dispatcher::has_been_set() {
        init_from_env();
    }
}

/// The level a `RINGCCL_DEBUG` value names, in any case; `None` when it names none.
fn parse_level(value: &str) -> Option<LevelFilter> {
    Some(match value.to_ascii_lowercase().as_str() {
        "error" => LevelFilter::ERROR,
        "warn" => LevelFilter::WARN,
        "info" => LevelFilter::INFO,
        "debug" => LevelFilter::DEBUG,
        "trace" => LevelFilter::TRACE,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_in_any_case() {
        assert_eq!(parse_level("error"), Some(LevelFilter::ERROR));
        assert_eq!(parse_level("WARN"), Some(LevelFilter::WARN));
        assert_eq!(parse_level("Info"), Some(LevelFilter::INFO));
        assert_eq!(parse_level("debug"), Some(LevelFilter::DEBUG));
        assert_eq!(parse_level("TRACE"), Some(LevelFilter::TRACE));
    }

    #[test]
    fn unknown_levels_are_refused() {
        for value in ["", "verbose", "warning", "1", "debug,info"] {
            assert_eq!(parse_level(value), None, "{value:?}");
        }
    }
}

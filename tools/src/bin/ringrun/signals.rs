//! SIGINT, SIGTERM and SIGHUP: remembered by an async-signal-safe handler, forwarded to the
//! ranks by the supervision loop.

// signal(2) is an FFI call, and the handler it installs must be an `extern "C" fn`.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicI32, Ordering};

/// The signals ringrun forwards to every rank (torchrun stops its workers on the same three).
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The last forwarded signal received and not yet handled; 0 for none.
static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn remember(signal: libc::c_int) {
    PENDING.store(signal, Ordering::SeqCst);
}

/// Installs the handler that remembers SIGINT, SIGTERM and SIGHUP for [`take_pending`].
/// A signal that ringrun was started with ignored stays ignored, for ringrun and its
/// ranks: `nohup ringrun ...` survives a hang-up, and a job started in the background by
/// a script ignores Ctrl-C, as any program would.
pub(crate) fn install() {
    for signal in FORWARDED {
        if is_ignored(signal) {
            continue;
        }
        // SAFETY: `remember` only stores to an atomic, which is async-signal-safe, and has
        // the `extern "C" fn(c_int)` signature that `signal` expects.
        unsafe {
            libc::signal(signal, remember as *const () as libc::sighandler_t);
        }
    }
}

/// Whether `signal`'s disposition is SIG_IGN (inherited from whoever started ringrun).
fn is_ignored(signal: libc::c_int) -> bool {
    // SAFETY: an all-zero sigaction is a valid value to be overwritten.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only queries; `current` is a valid place for the answer.
    let queried = unsafe { libc::sigaction(signal, std::ptr::null(), &mut current) } == 0;
    queried && current.sa_sigaction == libc::SIG_IGN
}

/// Makes this process deaf to SIGINT, SIGTERM and SIGHUP (the watchdog acts only on
/// ringrun's death, never on a signal meant for the job).
pub(crate) fn ignore_forwarded() {
    for signal in FORWARDED {
        // SAFETY: SIG_IGN is a valid disposition for these signals; no handler code runs.
        unsafe {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
}

/// The signal received since the last call, if any.
pub(crate) fn take_pending() -> Option<i32> {
    match PENDING.swap(0, Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// The conventional name of a signal ringrun talks about.
pub(crate) fn name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGABRT => "SIGABRT".into(),
        libc::SIGBUS => "SIGBUS".into(),
        libc::SIGFPE => "SIGFPE".into(),
        libc::SIGILL => "SIGILL".into(),
        libc::SIGPIPE => "SIGPIPE".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        libc::SIGUSR1 => "SIGUSR1".into(),
        libc::SIGUSR2 => "SIGUSR2".into(),
        other => format!("signal {other}"),
    }
}

//! A rank's process group: every rank is started as the leader of its own group, so one
//! `kill(-pgid)` reaches the rank and whatever it started (unless those moved themselves to
//! another group or session).

// kill(2) and getpgid(2) are FFI calls.
#![allow(unsafe_code)]

use std::fs;

/// A process id or process-group id, as the kernel types it.
pub(crate) type Pid = libc::pid_t;

/// Sends `signal` to every process in group `pgid`. Returns whether the kernel found any.
pub(crate) fn signal_group(pgid: Pid, signal: i32) -> bool {
    if pgid <= 1 {
        return false; // never signal "every process" (-1) or our own group (0)
    }
    // SAFETY: kill(2) has no memory-safety preconditions; a negative pid names a group.
    unsafe { libc::kill(-pgid, signal) == 0 }
}

/// Sends `signal` to process `pid` alone. Returns whether the kernel found it.
pub(crate) fn signal_process(pid: Pid, signal: i32) -> bool {
    if pid <= 1 {
        return false;
    }
    // SAFETY: kill(2) has no memory-safety preconditions; a stale pid is an error we report.
    unsafe { libc::kill(pid, signal) == 0 }
}

/// The process group of `pid`, or `None` when it no longer exists.
pub(crate) fn group_of(pid: Pid) -> Option<Pid> {
    // SAFETY: getpgid(2) has no memory-safety preconditions.
    let pgid = unsafe { libc::getpgid(pid) };
    (pgid > 0).then_some(pgid)
}

/// Whether group `pgid` still has a member that is not a zombie. Zombies are left out:
/// they have exited and only wait to be reaped (possibly by a PID 1 that never reaps).
pub(crate) fn has_live_members(pgid: Pid) -> bool {
    !live_groups(&[pgid]).is_empty()
}

/// Those of `groups` that still have a member that is not a zombie, reading `/proc` at
/// most once whatever the number of groups.
pub(crate) fn live_groups(groups: &[Pid]) -> Vec<Pid> {
    // The kernel answers "no such group" cheaply; only groups it still knows need /proc.
    let known: Vec<Pid> = groups
        .iter()
        .copied()
        .filter(|&pgid| pgid > 1 && group_exists(pgid))
        .collect();
    if known.is_empty() {
        return known;
    }
    let Ok(entries) = fs::read_dir("/proc") else {
        return known; // no /proc: the kernel's answer is all we have
    };
    let mut live: Vec<Pid> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<Pid>().ok())
        .filter_map(process_state)
        .filter(|&(state, group)| state != 'Z' && state != 'X' && known.contains(&group))
        .map(|(_, group)| group)
        .collect();
    live.sort_unstable();
    live.dedup();
    live
}

/// Whether the kernel still knows group `pgid` (members alive or zombie, or not ours to
/// signal).
fn group_exists(pgid: Pid) -> bool {
    // SAFETY: signal 0 only checks that the group exists; nothing is delivered.
    let found = unsafe { libc::kill(-pgid, 0) == 0 };
    found || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// The state letter and process group of `pid`, from `/proc/PID/stat`.
pub(crate) fn process_state(pid: Pid) -> Option<(char, Pid)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "PID (COMM) STATE PPID PGRP ...": COMM may hold spaces and parentheses, so parse
    // from the last ')'.
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    Some((state, group))
}

/// Whether process `pid` has a handler for `signal` (its `SigCgt` mask in
/// `/proc/PID/status`): sending it then cannot kill the process by the default action.
pub(crate) fn catches(pid: Pid, signal: i32) -> bool {
    let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let Some(bit) = u32::try_from(signal).ok().and_then(|s| s.checked_sub(1)) else {
        return false;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| bit < 64 && mask & (1u64 << bit) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_in_its_group() {
        let pid = Pid::try_from(std::process::id()).expect("pid fits pid_t");
        let group = group_of(pid).expect("own group");
        assert_eq!(process_state(pid).map(|(_, g)| g), Some(group));
        assert!(has_live_members(group));
        assert_eq!(live_groups(&[0, group, -1, 1]), [group]);
        assert!(!signal_group(1, 0) && !signal_group(0, 0) && !signal_group(-5, 0));
    }

    #[test]
    fn caught_signals_are_read_from_proc() {
        let pid = Pid::try_from(std::process::id()).expect("pid fits pid_t");
        // The test harness handles none of these; a missing process catches nothing.
        assert!(!catches(pid, libc::SIGUSR2));
        assert!(!catches(Pid::MAX, libc::SIGUSR1));
        assert!(!catches(pid, 0) && !catches(pid, 99));
    }
}

//! A rank blocked on a late peer does not burn a core: once the short spin window has
//! passed it sleeps, over shared memory and over TCP. Each rank is a real process, so
//! its CPU time (every thread: caller, worker, control) is its own.

use crate::common;

use std::time::{Duration, Instant};

use common::{child_group, heavy_lock, run_processes_with_env};

/// How late rank 1 comes to the barrier rank 0 waits in.
const LATE: Duration = Duration::from_secs(2);
/// The most of one core the waiting rank may use while it waits.
const MAX_SHARE: f64 = 0.10;

/// This process's CPU time so far (user and system, all threads), from /proc/self/stat
/// in clock ticks of 1/100 s (USER_HZ, fixed by the kernel's ABI).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    // The command name may hold spaces; the fields that follow it are plain.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("comm") + 2..]
        .split(' ')
        .collect();
    let ticks = |i: usize| fields[i].parse::<u64>().expect("a tick count");
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// Rank 0 enters a barrier at once, rank 1 after [`LATE`]; rank 0 prints the CPU time it
/// used while it waited, and the wall time. Returns (cpu, wall) in the parent.
fn waiting_rank_cpu(test: &str, transport: &str) -> Option<(Duration, Duration)> {
    waiting_rank_cpu_of(test, transport, 2)
}

/// [`waiting_rank_cpu`] with `ranks` ranks (every rank but rank 1 waits).
fn waiting_rank_cpu_of(test: &str, transport: &str, ranks: usize) -> Option<(Duration, Duration)> {
    if let Some(pg) = child_group(test) {
        pg.barrier().expect("first barrier");
        if pg.rank() == 1 {
            std::thread::sleep(LATE);
            pg.barrier().expect("late barrier");
        } else if pg.rank() > 1 {
            pg.barrier().expect("waiting barrier");
        } else {
            let (cpu, wall) = (cpu_time(), Instant::now());
            pg.barrier().expect("waiting barrier");
            let (cpu, wall) = (cpu_time() - cpu, wall.elapsed());
            println!(
                "{}{} {}",
                common::RESULT_PREFIX,
                cpu.as_secs_f64(),
                wall.as_secs_f64()
            );
        }
        return None;
    }
    let _guard = heavy_lock();
    let results = run_processes_with_env(test, ranks, &[("RINGCCL_TRANSPORT", transport)]);
    let line = results[0].first().expect("rank 0's figures");
    let mut figures = line
        .split(' ')
        .map(|f| Duration::from_secs_f64(f.parse().expect("seconds")));
    Some((figures.next()?, figures.next()?))
}

fn assert_idle(transport: &str, cpu: Duration, wall: Duration) {
    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    eprintln!(
        "{transport}: waited {wall:?} using {cpu:?} of CPU ({:.1}% of a core)",
        share * 100.0
    );
    assert!(
        wall >= LATE - Duration::from_millis(500),
        "{transport}: rank 0 waited only {wall:?}, so it did not wait for the late rank"
    );
    assert!(
        wall < LATE + Duration::from_secs(20),
        "{transport}: rank 0 waited {wall:?}"
    );
    assert!(
        share < MAX_SHARE,
        "{transport}: a waiting rank used {:.1}% of a core ({cpu:?} in {wall:?})",
        share * 100.0
    );
}

#[test]
fn a_rank_waiting_over_shared_memory_sleeps() {
    if !std::path::Path::new("/dev/shm").is_dir() {
        eprintln!("skipped: no /dev/shm on this machine");
        return;
    }
    if let Some((cpu, wall)) = waiting_rank_cpu("a_rank_waiting_over_shared_memory_sleeps", "shm") {
        assert_idle("shm", cpu, wall);
    }
}

#[test]
fn a_rank_waiting_over_tcp_sleeps() {
    if let Some((cpu, wall)) = waiting_rank_cpu("a_rank_waiting_over_tcp_sleeps", "tcp") {
        assert_idle("tcp", cpu, wall);
    }
}

/// More ranks than cores: the waits yield their core between looks for the spin window
/// instead of spinning, and then sleep all the same.
#[test]
fn ranks_that_outnumber_the_cores_sleep_too() {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let ranks = cores + 1;
    if ranks > 5 {
        eprintln!(
            "skipped: this host has {cores} cores; oversubscribing it takes {ranks} ranks, more \
             than this test starts on a shared machine"
        );
        return;
    }
    for transport in ["tcp", "shm"] {
        if transport == "shm" && !std::path::Path::new("/dev/shm").is_dir() {
            eprintln!("skipped shm: no /dev/shm on this machine");
            continue;
        }
        let test = "ranks_that_outnumber_the_cores_sleep_too";
        let Some((cpu, wall)) = waiting_rank_cpu_of(test, transport, ranks) else {
            return;
        };
        assert_idle(transport, cpu, wall);
    }
}

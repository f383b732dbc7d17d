//! What the flight recorder costs per call, and how long a dump takes.
//!
//! `cargo bench --bench flight_cost` runs, on one thread, what the library does to
//! observe a blocking 8 B all-reduce over 4 ranks (recursive doubling: issued, its turn
//! at once, numbered and started, described, two frames out and two in, one wait, ended,
//! finished), with the flight recorder attached through the group's hooks and the call's
//! progress in the group's probe, a million times, with and without a flight directory
//! (with one, the beacon's words are updated through its shared mapping too). Then it fills a
//! 2000-entry ring and times a dump: the copy under the lock (what a running call may
//! wait for) and the whole dump (JSON, written and renamed into place).
//!
//! `cargo bench --bench flight_cost -- hooks` times the hooks without a directory only.
//!
//! The 8 B all-reduce with and without the recorder: `scripts/bench-before-after.sh`
//! with a `ringccl-bench` built before and after it (docs/debugging.md).

#![deny(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringccl_collectives::control::GroupControl;
use ringccl_collectives::hooks::{CallHooks, CallScope, Running};
use ringccl_collectives::wire::Algorithm;
use ringccl_collectives::{DType, Deadline, OpDesc, ReduceOp, Sequence};
use ringccl_observe::flight::{FlightConfig, FlightRecorder, DEFAULT_FLIGHT_ENTRIES};
use ringccl_observe::Observers;

const CALLS: u64 = 1_000_000;
const ROUNDS: usize = 5;

/// A group's observed side: its control state (with the probe) and its hooks.
struct Watched {
    recorder: Arc<FlightRecorder>,
    control: Arc<GroupControl>,
    hooks: Observers,
}

impl Watched {
    fn new(recorder: Arc<FlightRecorder>) -> Watched {
        let control = GroupControl::new(0);
        control.probe().size_for(4);
        let hooks = Observers::new(Some(Arc::clone(&recorder)), None);
        hooks.attached(&control);
        Watched {
            recorder,
            control,
            hooks,
        }
    }
}

/// One 8 B all-reduce's observation, numbered `seq`, issued at `issued` (the library
/// takes that instant from the call's deadline, which it fixes anyway).
fn one_call(group: &Watched, seq: u64, issued: Instant, deadline: Deadline) {
    let (recorder, probe, hooks) = (&group.recorder, group.control.probe(), &group.hooks);
    let call = recorder.issued_at("all_reduce", issued);
    recorder.turn(call, false);
    probe.numbered(Sequence::Collective, seq);
    hooks.started(Sequence::Collective, seq);
    let running = Running {
        op: OpDesc::all_reduce(seq, DType::F32, 2, ReduceOp::Sum),
        algorithm: Algorithm::RecursiveDoubling,
        rank: 0,
        world_size: 4,
        deadline,
    };
    let scope = CallScope::begin(Some(&group.control), hooks, running);
    probe.sent(1, 40);
    probe.blocked_on(1, 40);
    hooks.blocked_on(1);
    probe.received(1, 40);
    probe.sent(2, 40);
    probe.received(2, 40);
    scope.end(None, &Ok(()));
    hooks.finished(None);
}

/// Median nanoseconds per call over [`ROUNDS`] rounds of [`CALLS`].
fn per_call_ns(group: &Watched) -> f64 {
    let deadline = Deadline::after(Duration::from_secs(3600));
    let mut seq = 0;
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..CALLS {
                seq += 1;
                one_call(group, seq, started, deadline);
            }
            started.elapsed().as_nanos() as f64 / CALLS as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}

fn main() {
    let dir = std::env::temp_dir().join(format!("ringccl-flight-cost-{}", std::process::id()));
    let config = |dir: Option<PathBuf>| FlightConfig {
        dir,
        transport: "tcp",
        ..FlightConfig::default()
    };
    println!("# flight recorder: hooks of one 8 B all-reduce (N=4, recursive doubling), {CALLS} calls x {ROUNDS} rounds, median");
    let plain = Watched::new(FlightRecorder::new(0, 4, "gloo", config(None)));
    println!(
        "without a flight directory: {:6.1} ns per call",
        per_call_ns(&plain)
    );
    // `-- hooks`: that line only, for a profiler (`perf stat -e instructions`).
    if std::env::args().any(|a| a == "hooks") {
        return;
    }
    let watched = Watched::new(FlightRecorder::new(0, 4, "gloo", config(Some(dir.clone()))));
    let filed = &watched.recorder;
    println!(
        "with a beacon (flight dir):  {:6.1} ns per call",
        per_call_ns(&watched)
    );

    // `filed` holds a full ring now: time its dumps.
    let started = Instant::now();
    let dump = filed.snapshot("requested");
    let snapshot = started.elapsed();
    let started = Instant::now();
    let written = filed.dump("requested");
    let whole = started.elapsed();
    let size = written
        .as_ref()
        .and_then(|p| std::fs::metadata(p).ok())
        .map_or(0, |m| m.len());
    println!(
        "dump of {} entries (ring of {DEFAULT_FLIGHT_ENTRIES}): snapshot {snapshot:?}, written {whole:?}, {size} bytes",
        dump.entries.len()
    );
    let started = Instant::now();
    for _ in 0..100 {
        std::hint::black_box(filed.snapshot("requested"));
    }
    println!(
        "snapshot alone (copy under the lock + entries): {:?} each",
        started.elapsed() / 100
    );

    // What a dump costs a call that runs meanwhile: one thread dumps without pause while
    // this one times each call; the slowest ones waited for the ring's copy.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (mut times, dumps) = std::thread::scope(|s| {
        let dumper = s.spawn(|| {
            let mut dumps = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::black_box(filed.snapshot("requested"));
                dumps += 1;
            }
            dumps
        });
        let mut times = Vec::with_capacity(1 << 20);
        let mut seq = 1 << 40;
        let until = Instant::now() + std::time::Duration::from_secs(2);
        while Instant::now() < until {
            seq += 1;
            let t = Instant::now();
            one_call(&watched, seq, t, Deadline::after(Duration::from_secs(3600)));
            times.push(t.elapsed().as_nanos() as u64);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (times, dumper.join().unwrap_or(0))
    });
    times.sort_unstable();
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    let waited = times.iter().filter(|&&t| t > 20_000).count();
    println!(
        "{} calls during {dumps} back-to-back dumps: median {} ns, p99.9 {} ns, p99.99 {} us, \
         max {} us; {waited} took over 20 us",
        times.len(),
        at(0.5),
        at(0.999),
        at(0.9999) / 1000,
        at(1.0) / 1000
    );
    drop(watched);
    let _ = std::fs::remove_dir_all(&dir);
}

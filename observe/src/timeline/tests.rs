//! The timeline's promises: bounded memory whatever the writer's speed, a valid JSON
//! array when closed, and a readable file before it is closed (what a crash leaves).

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::*;

/// A writer whose writes block while its gate is shut, into a shared byte vector.
#[derive(Clone, Default)]
struct Gated {
    bytes: Arc<Mutex<Vec<u8>>>,
    gate: Arc<(Mutex<bool>, Condvar)>,
}

impl Gated {
    fn set_shut(&self, shut: bool) {
        *self.gate.0.lock().unwrap() = shut;
        self.gate.1.notify_all();
    }

    fn text(&self) -> String {
        String::from_utf8(self.bytes.lock().unwrap().clone()).unwrap()
    }
}

impl Write for Gated {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut shut = self.gate.0.lock().unwrap();
        while *shut {
            shut = self.gate.1.wait(shut).unwrap();
        }
        self.bytes.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn tick(row: &Timeline, i: u64) {
    let now = Instant::now();
    row.record(Span::new(
        "tick",
        now,
        now + Duration::from_nanos(i),
        SpanArgs::Numbers(vec![("i".into(), i)]),
    ));
}

#[test]
fn a_stalled_writer_never_blocks_recording_and_memory_stays_capped() {
    const SPANS: u64 = 100_000;
    let out = Gated::default();
    let file = TraceFile::to_writer(out.clone(), 0).unwrap();
    let row = file.row("ticks");
    // The disk "hangs": the writer blocks on its first write.
    out.set_shut(true);
    let started = Instant::now();
    let mut most_pending = 0;
    for i in 0..SPANS {
        tick(&row, i);
        if i % 1000 == 0 {
            most_pending = most_pending.max(file.pending());
        }
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "recording {SPANS} spans took {took:?}: recording must never wait for the writer"
    );
    assert_eq!(file.capacity(), BUFFER_CAPACITY);
    assert!(
        most_pending <= BUFFER_CAPACITY + 1 && file.pending() <= BUFFER_CAPACITY + 1,
        "{most_pending} records buffered, cap {BUFFER_CAPACITY}"
    );
    // The writer holds at most one batch (a buffer's worth) while it is blocked.
    let dropped = file.dropped();
    assert!(
        dropped >= SPANS - 2 * BUFFER_CAPACITY as u64,
        "only {dropped} of {SPANS} dropped behind a stalled writer"
    );

    // The disk recovers: everything kept is written, and the count of the rest too.
    out.set_shut(false);
    assert!(file.close());
    let events: Vec<serde_json::Value> = serde_json::from_str(&out.text()).unwrap();
    let spans = events.iter().filter(|e| e["ph"] == "X").count() as u64;
    assert_eq!(spans + dropped, SPANS, "every span is written or counted");
    let summary = events
        .iter()
        .find(|e| e["name"] == "ringccl_trace_summary")
        .expect("summary event");
    assert_eq!(summary["args"]["dropped"], dropped);
    assert_eq!(summary["args"]["spans"], spans);
}

#[test]
fn an_unfinished_file_is_an_array_missing_only_its_closing_bracket() {
    let dir = std::env::temp_dir().join(format!(
        "ringccl-timeline-unfinished-{}",
        std::process::id()
    ));
    let file = TraceFile::create(&dir, 7).unwrap();
    let path = file.path().unwrap().to_path_buf();
    let row = file.row("ticks");
    for i in 0..10 {
        tick(&row, i);
    }
    // Without a close, the writer still writes each batch within its interval.
    let until = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = std::fs::read_to_string(&path).unwrap();
        if text.matches("\"ph\":\"X\"").count() == 10 || Instant::now() > until {
            break text;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!text.trim_end().ends_with(']'), "{text}");
    let repaired = format!("{text}]");
    let events: Vec<serde_json::Value> = serde_json::from_str(&repaired).unwrap();
    assert_eq!(events.iter().filter(|e| e["ph"] == "X").count(), 10);
    // Every line but the first is one event, after its separating comma.
    for line in text.lines().skip(1) {
        let event: serde_json::Value = serde_json::from_str(line.trim_start_matches(',')).unwrap();
        assert!(event.is_object());
    }
    assert!(file.close());
    let events: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(events.iter().filter(|e| e["ph"] == "X").count(), 10);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_last_hold_finishes_the_file_and_later_spans_are_counted_not_written() {
    let out = Gated::default();
    let file = TraceFile::to_writer(out.clone(), 1).unwrap();
    let row = file.row("r");
    let (a, b) = (file.hold(), file.hold());
    tick(&row, 1);
    drop(a);
    assert!(file.is_open());
    drop(b);
    assert!(!file.is_open());
    tick(&row, 2);
    assert_eq!(file.dropped(), 1);
    let events: Vec<serde_json::Value> = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(events.iter().filter(|e| e["ph"] == "X").count(), 1);
    assert!(events
        .iter()
        .any(|e| e["name"] == "thread_name" && e["args"]["name"] == "r"));
}

#[test]
fn a_second_file_of_the_same_rank_in_one_process_gets_its_own_name() {
    let dir = std::env::temp_dir().join(format!("ringccl-timeline-names-{}", std::process::id()));
    let first = TraceFile::create(&dir, 2).unwrap();
    let second = TraceFile::create(&dir, 2).unwrap();
    assert!(first.path().unwrap().ends_with("rank-2.json"));
    assert!(second.path().unwrap().ends_with("rank-2.2.json"));
    assert!(first.close() && second.close());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_device_library_call_is_a_span_with_its_outcome_and_no_bytes_per_peer() {
    use ringccl_collectives::{DType, Deadline, Error, OpDesc, ReduceOp};
    let out = Gated::default();
    let file = TraceFile::to_writer(out.clone(), 0).unwrap();
    let hold = file.hold();
    let trace = CollectiveTrace::new(file.new_row("collectives"), "nccl");
    let deadline = Deadline::after(Duration::from_secs(5));
    let op = OpDesc::all_reduce(1, DType::F32, 1024, ReduceOp::Sum);
    trace.record_device_call(&op, 1, 2, deadline, Instant::now(), &Ok(()));
    let failed = Err(Error::InvalidArgument("the device failed".into()));
    trace.record_device_call(&OpDesc::barrier(2), 1, 2, deadline, Instant::now(), &failed);
    drop(hold);
    let events: Vec<serde_json::Value> = serde_json::from_str(&out.text()).unwrap();
    let spans: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(spans.len(), 2, "{events:#?}");
    assert_eq!(spans[0]["name"], "all_reduce");
    let args = &spans[0]["args"];
    assert_eq!(
        (&args["algorithm"], &args["transport"]),
        (&"device library".into(), &"nccl".into())
    );
    assert!(args.get("error").is_none(), "{args}");
    assert_eq!(spans[1]["name"], "barrier");
    assert!(
        spans[1]["args"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("the device failed")),
        "{}",
        spans[1]["args"]
    );
}

/// A call that never ends (it hangs until the process is killed) still shows in the
/// file: written as an unfinished span once it has run for a second, extended while it
/// runs; a call that ends leaves its own span, and its opening writes nothing more.
#[test]
fn a_call_that_never_ends_is_written_as_unfinished() {
    use ringccl_collectives::{DType, Deadline, OpDesc, ReduceOp};
    let out = Gated::default();
    let file = TraceFile::to_writer(out.clone(), 3).unwrap();
    let trace = CollectiveTrace::new(file.new_row("collectives"), "tcp");
    let deadline = Deadline::after(Duration::from_secs(60));
    let op = |seq| OpDesc::all_reduce(seq, DType::F32, 8, ReduceOp::Sum);
    // A quick call: opened and ended well within a second.
    let quick = trace.start(&op(1), None, (3, 4), deadline, Instant::now());
    drop(quick);
    let _hung = trace.start(&op(2), None, (3, 4), deadline, Instant::now());
    let unfinished = |text: &str| {
        text.lines()
            .filter(|l| l.contains(r#""status":"unfinished""#))
            .map(|l| {
                let event: serde_json::Value =
                    serde_json::from_str(l.trim_start_matches(',')).unwrap();
                (
                    event["args"]["op"].as_u64().unwrap(),
                    event["dur"].as_f64().unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    let waited = Instant::now();
    while unfinished(&out.text()).len() < 2 && waited.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let copies = unfinished(&out.text());
    assert!(copies.len() >= 2, "{}", out.text());
    assert!(copies.iter().all(|(op, _)| *op == 2), "{copies:?}");
    assert!(
        copies[1].1 > copies[0].1 && copies[0].1 >= 1e6,
        "each copy reaches further: {copies:?}"
    );
    // Closing the file writes it once more, up to the close.
    assert!(file.close());
    assert!(unfinished(&out.text()).len() > copies.len());
    let events: Vec<serde_json::Value> = serde_json::from_str(&out.text()).unwrap();
    assert!(!events.is_empty());
}

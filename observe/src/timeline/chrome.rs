//! The Trace Event Format (the JSON that chrome://tracing and Perfetto open): the
//! encoding of spans, rows and processes, one event per line.
//!
//! A file is a JSON array in which every element sits on a line of its own, the
//! separating comma at the start of the line:
//!
//! ```text
//! [
//! {"name":"process_name","ph":"M","pid":0,"args":{"name":"rank 0"}}
//! ,{"name":"all_reduce","cat":"collective","ph":"X","ts":…,"dur":…,"pid":0,"tid":1,"args":{…}}
//! ]
//! ```
//!
//! So a file cut short after any line is a valid array once `]` is appended (the format
//! allows the closing bracket to be missing, for writers that die), and tools can read it
//! line by line.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde::Serialize;

use super::clock::unix_micros;
use super::span::{PeerBytes, Span, SpanArgs};

/// An event of the file, as queued for the writer thread.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Record {
    /// A span on row `tid`.
    Span {
        /// The row.
        tid: u32,
        /// The span.
        span: Span,
    },
    /// A span still open, written from its start to now: `"status":"unfinished"` in
    /// its arguments (a call that may never end; see the `buffer` module).
    Unfinished {
        /// The row.
        tid: u32,
        /// The span, ending now.
        span: Span,
    },
    /// A row's name and position.
    Row {
        /// The row.
        tid: u32,
        /// Its name.
        name: String,
    },
}

#[derive(Serialize)]
struct Complete<'a, A: Serialize> {
    name: &'a str,
    cat: &'static str,
    ph: &'static str,
    ts: f64,
    dur: f64,
    pid: usize,
    tid: u32,
    args: A,
}

#[derive(Serialize)]
struct Metadata<'a, A: Serialize> {
    name: &'static str,
    ph: &'static str,
    pid: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    tid: Option<u32>,
    args: &'a A,
}

#[derive(Serialize)]
struct Name<'a> {
    name: &'a str,
}

#[derive(Serialize)]
struct SortIndex {
    sort_index: u64,
}

#[derive(Serialize)]
struct Labels<'a> {
    labels: &'a str,
}

#[derive(Serialize)]
struct Empty {}

/// `{"<peer>": bytes, …}` for the peers with a non-zero count, written without
/// building a map.
struct PeerMap<'a>(&'a [PeerBytes], fn(&PeerBytes) -> u64);

impl PeerMap<'_> {
    fn is_empty(&self) -> bool {
        self.0.iter().all(|p| (self.1)(p) == 0)
    }
}

impl Serialize for PeerMap<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let pick = self.1;
        serializer.collect_map(
            self.0
                .iter()
                .filter(|p| pick(p) > 0)
                .map(|p| (p.peer, pick(p))),
        )
    }
}

#[derive(Serialize)]
struct CollectiveJson<'a> {
    op: u64,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    dtype: Option<&'static str>,
    count: u64,
    bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    redop: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    root: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    algorithm: Option<&'static str>,
    transport: &'static str,
    rank: usize,
    world_size: usize,
    queued_us: f64,
    #[serde(skip_serializing_if = "PeerMap::is_empty")]
    sent_to: PeerMap<'a>,
    #[serde(skip_serializing_if = "PeerMap::is_empty")]
    received_from: PeerMap<'a>,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Serialize)]
struct BucketJson {
    bucket: usize,
    step: u64,
    count: usize,
    bytes: u64,
    waited_us: f64,
}

/// The category of a span, by its arguments (Perfetto can filter on it).
fn category(args: &SpanArgs) -> &'static str {
    match args {
        SpanArgs::Collective(_) => "collective",
        SpanArgs::Bucket(_) => "ddp",
        _ => "user",
    }
}

/// Writes one event as a single line (no newline), a JSON object.
pub(crate) fn write_record(out: &mut impl Write, pid: usize, record: &Record) -> io::Result<()> {
    match record {
        Record::Row { tid, name } => {
            metadata(out, "thread_name", pid, Some(*tid), &Name { name })?;
            out.write_all(b"\n,")?;
            let sort = SortIndex {
                sort_index: u64::from(*tid),
            };
            metadata(out, "thread_sort_index", pid, Some(*tid), &sort)
        }
        Record::Span { tid, span } => write_span(out, pid, *tid, span, false),
        Record::Unfinished { tid, span } => write_span(out, pid, *tid, span, true),
    }
}

/// One complete event for `span` on row `tid`; an `unfinished` one says so.
fn write_span(
    out: &mut impl Write,
    pid: usize,
    tid: u32,
    span: &Span,
    unfinished: bool,
) -> io::Result<()> {
    let head = Head {
        name: &span.name,
        cat: category(&span.args),
        ts: unix_micros(span.start),
        dur: span.end.saturating_duration_since(span.start).as_nanos() as f64 / 1000.0,
        pid,
        tid,
    };
    match &span.args {
        SpanArgs::Collective(c) => {
            let peers = c.peers.per_peer();
            let args = CollectiveJson {
                op: c.op.seq,
                kind: c.op.kind.name(),
                dtype: c.op.dtype.map(|d| d.name()),
                count: c.op.count,
                bytes: c.bytes,
                redop: c.op.op.map(|o| o.name()),
                root: c.op.root,
                algorithm: c.algorithm.map(|a| a.name()),
                transport: c.transport,
                rank: c.rank,
                world_size: c.world_size,
                queued_us: c.queued.as_nanos() as f64 / 1000.0,
                sent_to: PeerMap(&peers, |p| p.sent),
                received_from: PeerMap(&peers, |p| p.received),
                status: match (unfinished, &c.error) {
                    (true, _) => "unfinished",
                    (false, Some(_)) => "failed",
                    (false, None) => "ok",
                },
                error: c.error.clone(),
            };
            complete(out, &head, args)
        }
        SpanArgs::Bucket(b) => {
            let args = BucketJson {
                bucket: b.bucket,
                step: b.step,
                count: b.count,
                bytes: b.bytes,
                waited_us: b.waited.as_nanos() as f64 / 1000.0,
            };
            complete(out, &head, args)
        }
        SpanArgs::Numbers(numbers) => {
            let args: BTreeMap<&str, u64> = numbers.iter().map(|(k, v)| (&**k, *v)).collect();
            complete(out, &head, args)
        }
        SpanArgs::None => complete(out, &head, Empty {}),
    }
}

/// The fields every complete event has.
struct Head<'a> {
    name: &'a str,
    cat: &'static str,
    ts: f64,
    dur: f64,
    pid: usize,
    tid: u32,
}

fn complete<A: Serialize>(out: &mut impl Write, head: &Head<'_>, args: A) -> io::Result<()> {
    let event = Complete {
        name: head.name,
        cat: head.cat,
        ph: "X",
        ts: head.ts,
        dur: head.dur,
        pid: head.pid,
        tid: head.tid,
        args,
    };
    serde_json::to_writer(&mut *out, &event)?;
    Ok(())
}

/// The lines that open a file: `[`, then the process's name (`rank <pid>`), its place
/// among processes, and `labels` (host and process id).
pub(crate) fn write_header(out: &mut impl Write, pid: usize, labels: &str) -> io::Result<()> {
    out.write_all(b"[\n")?;
    let name = format!("rank {pid}");
    metadata(out, "process_name", pid, None, &Name { name: &name })?;
    out.write_all(b"\n,")?;
    let sort = SortIndex {
        sort_index: pid as u64,
    };
    metadata(out, "process_sort_index", pid, None, &sort)?;
    out.write_all(b"\n,")?;
    metadata(out, "process_labels", pid, None, &Labels { labels })?;
    out.write_all(b"\n")
}

/// The lines that close a file: a summary (spans written, spans dropped because the
/// writer fell behind) and `]`.
pub(crate) fn write_footer(
    out: &mut impl Write,
    pid: usize,
    written: u64,
    dropped: u64,
) -> io::Result<()> {
    #[derive(Serialize)]
    struct Summary {
        spans: u64,
        dropped: u64,
    }
    out.write_all(b",")?;
    let summary = Summary {
        spans: written,
        dropped,
    };
    metadata(out, "ringccl_trace_summary", pid, None, &summary)?;
    out.write_all(b"\n]\n")
}

fn metadata<A: Serialize>(
    out: &mut impl Write,
    name: &'static str,
    pid: usize,
    tid: Option<u32>,
    args: &A,
) -> io::Result<()> {
    let event = Metadata {
        name,
        ph: "M",
        pid,
        tid,
        args,
    };
    serde_json::to_writer(&mut *out, &event)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::timeline::{CollectiveArgs, PeerTraffic};
    use ringccl_collectives::{DType, OpDesc, ReduceOp};

    #[test]
    fn a_collective_span_carries_its_description() {
        let start = Instant::now();
        let span = Span::new(
            "all_reduce",
            start,
            start + Duration::from_micros(250),
            SpanArgs::Collective(Box::new(CollectiveArgs {
                op: OpDesc::all_reduce(7, DType::F32, 1024, ReduceOp::Sum),
                bytes: 4096,
                algorithm: Some(ringccl_collectives::wire::Algorithm::Ring),
                transport: "tcp",
                rank: 1,
                world_size: 4,
                queued: Duration::from_micros(3),
                peers: PeerTraffic::counted(vec![
                    PeerBytes {
                        peer: 2,
                        sent: 3072,
                        received: 0,
                    },
                    PeerBytes {
                        peer: 0,
                        sent: 0,
                        received: 3072,
                    },
                ]),
                error: None,
            })),
        );
        let mut line = Vec::new();
        write_record(&mut line, 1, &Record::Span { tid: 1, span }).unwrap();
        let event: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(event["ph"], "X");
        assert_eq!(event["name"], "all_reduce");
        assert_eq!(event["pid"], 1);
        assert!((event["dur"].as_f64().unwrap() - 250.0).abs() < 1e-6);
        let args = &event["args"];
        assert_eq!(args["op"], 7);
        assert_eq!(args["dtype"], "f32");
        assert_eq!(args["bytes"], 4096);
        assert_eq!(args["redop"], "sum");
        assert_eq!(args["algorithm"], "ring");
        assert_eq!(args["transport"], "tcp");
        assert_eq!(args["sent_to"]["2"], 3072);
        assert_eq!(args["received_from"]["0"], 3072);
        assert_eq!(args["status"], "ok");
        assert!(args.get("root").is_none() && args.get("error").is_none());
        assert!(!line.contains(&b'\n'));
    }

    #[test]
    fn header_records_and_footer_make_one_json_array() {
        let mut file = Vec::new();
        write_header(&mut file, 3, "host h, pid 1").unwrap();
        file.push(b',');
        write_record(
            &mut file,
            3,
            &Record::Row {
                tid: 2,
                name: "ddp \"rows\"".into(),
            },
        )
        .unwrap();
        file.extend_from_slice(b"\n");
        write_footer(&mut file, 3, 0, 5).unwrap();
        let events: Vec<serde_json::Value> = serde_json::from_slice(&file).unwrap();
        assert_eq!(events[0]["args"]["name"], "rank 3");
        assert!(events
            .iter()
            .any(|e| e["name"] == "thread_name" && e["args"]["name"] == "ddp \"rows\""));
        assert_eq!(events.last().unwrap()["args"]["dropped"], 5);
    }
}

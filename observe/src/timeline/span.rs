//! What one span on the timeline says: a name, a start and an end, and the arguments a
//! viewer shows when the span is selected. Plain data, built on the recording thread and
//! turned into JSON on the writer thread.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringccl_collectives::schedule::Schedule;
use ringccl_collectives::wire::Algorithm;
use ringccl_collectives::OpDesc;

/// One complete span (a Chrome trace `"ph":"X"` event) on one row of the timeline.
///
/// ```
/// use std::time::Instant;
/// use ringccl_observe::timeline::{Span, SpanArgs};
///
/// let start = Instant::now();
/// let span = Span::new("backward", start, Instant::now(), SpanArgs::None);
/// assert_eq!(span.name, "backward");
/// assert!(span.end >= span.start);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// What the span is called on the timeline (viewers colour spans by name).
    pub name: Cow<'static, str>,
    /// When it began.
    pub start: Instant,
    /// When it ended (a span that ends before it starts is drawn with no width).
    pub end: Instant,
    /// Its arguments.
    pub args: SpanArgs,
}

impl Span {
    /// A span called `name` from `start` to `end`.
    ///
    /// ```
    /// # use std::time::Instant;
    /// # use ringccl_observe::timeline::{Span, SpanArgs};
    /// let now = Instant::now();
    /// assert_eq!(Span::new("x", now, now, SpanArgs::None).args, SpanArgs::None);
    /// ```
    pub fn new(
        name: impl Into<Cow<'static, str>>,
        start: Instant,
        end: Instant,
        args: SpanArgs,
    ) -> Span {
        Span {
            name: name.into(),
            start,
            end,
            args,
        }
    }
}

/// The arguments of a span, by the kind of span.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum SpanArgs {
    /// None.
    None,
    /// One collective call, as the engine ran it.
    Collective(Box<CollectiveArgs>),
    /// One DDP bucket's all-reduce.
    Bucket(BucketArgs),
    /// Named numbers, for spans a trainer marks itself.
    Numbers(Vec<(Cow<'static, str>, u64)>),
}

/// What the timeline says about one collective call.
#[derive(Clone, Debug, PartialEq)]
pub struct CollectiveArgs {
    /// The call: sequence number, kind, element type, count, operator, root.
    pub op: OpDesc,
    /// Bytes of the caller's buffer (count × element size).
    pub bytes: u64,
    /// The schedule the engine ran, when the engine says.
    pub algorithm: Option<Algorithm>,
    /// `"tcp"`, `"shm"`, … : what carried the bytes.
    pub transport: &'static str,
    /// This rank in the call's group, and the group's size.
    pub rank: usize,
    /// The number of ranks in the call's group.
    pub world_size: usize,
    /// Time from the call's issue (when its deadline was fixed) to its start: time spent
    /// behind earlier calls of the group.
    pub queued: Duration,
    /// Payload bytes exchanged with each peer (frame headers not counted), for calls
    /// that completed; none when the call failed or the engine cannot say.
    pub peers: PeerTraffic,
    /// The error, if the call failed.
    pub error: Option<String>,
}

/// Payload bytes one call exchanged with each peer: counted by whoever recorded the
/// span, or still to be counted from the schedule the call ran. The host engine hands
/// over its schedule, so the totals are made on the writer thread, not in the call.
///
/// ```
/// use ringccl_observe::timeline::{PeerBytes, PeerTraffic};
///
/// let one = PeerBytes { peer: 1, sent: 8, received: 8 };
/// assert_eq!(PeerTraffic::counted(vec![one]).per_peer(), vec![one]);
/// assert!(PeerTraffic::default().per_peer().is_empty());
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PeerTraffic(Traffic);

#[derive(Clone, Debug, Default, PartialEq)]
enum Traffic {
    #[default]
    Unknown,
    Counted(Vec<PeerBytes>),
    Planned {
        schedule: Arc<Schedule>,
        elem_size: usize,
    },
}

impl PeerTraffic {
    /// Bytes already counted, one entry per peer.
    ///
    /// ```
    /// # use ringccl_observe::timeline::{PeerBytes, PeerTraffic};
    /// let traffic = PeerTraffic::counted(vec![PeerBytes { peer: 2, sent: 4, received: 0 }]);
    /// assert_eq!(traffic.per_peer()[0].peer, 2);
    /// ```
    pub fn counted(peers: Vec<PeerBytes>) -> PeerTraffic {
        PeerTraffic(Traffic::Counted(peers))
    }

    /// The bytes of `schedule`, run on elements of `elem_size` bytes, counted later.
    pub(crate) fn planned(schedule: Arc<Schedule>, elem_size: usize) -> PeerTraffic {
        PeerTraffic(Traffic::Planned {
            schedule,
            elem_size,
        })
    }

    /// The bytes exchanged with each peer, in order of first appearance; empty when
    /// unknown.
    ///
    /// ```
    /// # use ringccl_observe::timeline::PeerTraffic;
    /// assert_eq!(PeerTraffic::default().per_peer(), vec![]);
    /// ```
    pub fn per_peer(&self) -> Vec<PeerBytes> {
        match &self.0 {
            Traffic::Unknown => Vec::new(),
            Traffic::Counted(peers) => peers.clone(),
            Traffic::Planned {
                schedule,
                elem_size,
            } => super::collective::peer_bytes(schedule, *elem_size),
        }
    }
}

/// Payload bytes one call exchanged with one peer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerBytes {
    /// The peer's rank in the call's group.
    pub peer: usize,
    /// Bytes sent to it.
    pub sent: u64,
    /// Bytes received from it.
    pub received: u64,
}

/// What the timeline says about one DDP bucket's all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketArgs {
    /// The bucket's index (buckets are all-reduced in index order).
    pub bucket: usize,
    /// The training step (counted by DDP from 0).
    pub step: u64,
    /// Number of elements.
    pub count: usize,
    /// Bytes on the wire.
    pub bytes: u64,
    /// Time from the bucket being ready (queued) to its all-reduce starting.
    pub waited: Duration,
}

//! The flight recorder and the timeline as one group's hooks.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use ringccl_collectives::control::GroupControl;
use ringccl_collectives::hooks::{Broke, CallHooks, Deferred, Ran, Running};
use ringccl_collectives::wire::Algorithm;
use ringccl_collectives::{Error, OpDesc, Sequence};

use crate::flight::{break_reason, FlightRecorder};
use crate::timeline::{Call, CollectiveTrace, PeerTraffic, Started};

/// What watches one group: its flight recorder, and its row of the timeline when the
/// rank writes one. Attached to the group at start-up
/// ([`GroupRunner::attach_hooks`](ringccl_collectives::GroupRunner::attach_hooks)).
///
/// ```
/// use std::sync::Arc;
/// use ringccl_collectives::hooks::CallHooks;
/// use ringccl_collectives::Sequence;
/// use ringccl_observe::flight::{CallState, FlightConfig, FlightRecorder};
/// use ringccl_observe::Observers;
///
/// let recorder = FlightRecorder::new(0, 2, "gloo", FlightConfig::default());
/// let hooks = Observers::new(Some(Arc::clone(&recorder)), None);
/// hooks.started(Sequence::Collective, 1);
/// hooks.finished(None);
/// assert_eq!(recorder.snapshot("requested").entries[0].state, CallState::Done);
/// ```
#[derive(Debug)]
pub struct Observers {
    recorder: Option<Arc<FlightRecorder>>,
    trace: Option<CollectiveTrace>,
    /// The running call, while it is on the timeline: when it started, and its opening
    /// (none for a device call, whose library chose the schedule).
    open: Mutex<Option<(Instant, Option<Started>)>>,
}

impl Observers {
    /// Hooks that tell `recorder` and `trace`, where given.
    ///
    /// ```
    /// use ringccl_collectives::hooks::CallHooks;
    /// use ringccl_observe::Observers;
    /// assert!(Observers::new(None, None).handed_to_device().is_none());
    /// ```
    pub fn new(recorder: Option<Arc<FlightRecorder>>, trace: Option<CollectiveTrace>) -> Observers {
        Observers {
            recorder,
            trace,
            open: Mutex::new(None),
        }
    }

    /// The group's flight recorder, if it keeps one.
    ///
    /// ```
    /// use ringccl_observe::flight::{FlightConfig, FlightRecorder};
    /// use ringccl_observe::Observers;
    /// let recorder = FlightRecorder::new(0, 1, "gloo", FlightConfig::default());
    /// assert!(Observers::new(Some(recorder), None).recorder().is_some());
    /// ```
    pub fn recorder(&self) -> Option<&Arc<FlightRecorder>> {
        self.recorder.as_ref()
    }

    fn open(&self) -> MutexGuard<'_, Option<(Instant, Option<Started>)>> {
        // Only the thread running the group's calls takes it: never contended, and a
        // panic leaves at worst a span unrecorded.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl CallHooks for Observers {
    fn attached(&self, control: &Arc<GroupControl>) {
        if let Some(recorder) = &self.recorder {
            recorder.watch(control);
        }
    }

    fn refused(&self, sequence: Sequence, would_be: Option<(u64, Option<OpDesc>)>, error: &Error) {
        if let Some(recorder) = &self.recorder {
            match would_be {
                Some((seq, op)) => recorder.refused_as(sequence, seq, op, error),
                None => recorder.refused(sequence, error),
            }
        }
    }

    fn started(&self, sequence: Sequence, seq: u64) {
        if let Some(recorder) = &self.recorder {
            recorder.start(sequence, seq);
        }
    }

    fn running(&self, call: &Running) {
        if let Some(trace) = &self.trace {
            let now = Instant::now();
            let opened = (call.algorithm != Algorithm::Device).then(|| {
                let ranks = (call.rank, call.world_size);
                trace.start(&call.op, Some(call.algorithm), ranks, call.deadline, now)
            });
            *self.open() = Some((now, opened));
        }
    }

    #[inline]
    fn blocked_on(&self, peer: usize) {
        if let Some(recorder) = &self.recorder {
            recorder.blocked_on(peer);
        }
    }

    fn handed_to_device(&self) -> Option<u64> {
        self.recorder.as_ref()?.handed_to_device()
    }

    fn device_finished(&self, token: u64, error: Option<&Error>) {
        if let Some(recorder) = &self.recorder {
            recorder.device_finished(token, error);
        }
    }

    fn ran(&self, ran: &Ran<'_>) {
        let Some(trace) = &self.trace else {
            return;
        };
        let Some((started, opened)) = self.open().take() else {
            return;
        };
        let call = ran.call;
        // The schedule moves into the span: its bytes per peer are totalled on the
        // writer thread, not here.
        let traffic = match (ran.result, ran.schedule) {
            (Ok(()), Some((schedule, elem_size))) => {
                PeerTraffic::planned(Arc::clone(schedule), elem_size)
            }
            _ => PeerTraffic::default(),
        };
        trace.record(Call {
            op: &call.op,
            algorithm: Some(call.algorithm),
            rank: call.rank,
            world_size: call.world_size,
            traffic,
            deadline: call.deadline,
            started,
            result: ran.result,
            opened,
        });
    }

    fn finished(&self, error: Option<&Error>) {
        if let Some(recorder) = &self.recorder {
            recorder.finish(error);
        }
    }

    fn broke(&self, how: Broke<'_>) -> Option<Deferred> {
        let recorder = self.recorder.as_ref()?;
        let reason = match how {
            Broke::By(error) => break_reason(error),
            Broke::Aborted(cause) => format!("group broken: {cause}"),
        };
        let dump = recorder.break_snapshot(&reason)?;
        let recorder = Arc::clone(recorder);
        Some(Box::new(move || recorder.write_break(Some(dump))))
    }
}

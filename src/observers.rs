//! The observers the facade attaches to each group it makes: its flight recorder and,
//! when this rank writes a trace, its row of the timeline.

use std::sync::Arc;

use ringccl_observe::flight::{FlightConfig, FlightRecorder};
use ringccl_observe::timeline::{CollectiveTrace, TraceFile};
use ringccl_observe::Observers;

/// What watches rank `rank` of a group of `world_size` on `backend`: a flight recorder
/// set up by `flight` and, given this rank's trace file and a row name, that row of the
/// timeline (its calls labelled with `flight.transport`).
pub(crate) fn observers(
    (rank, world_size): (usize, usize),
    backend: &'static str,
    flight: FlightConfig,
    trace: Option<(&Arc<TraceFile>, &str)>,
) -> Arc<Observers> {
    let transport = flight.transport;
    let trace = trace.map(|(file, row)| CollectiveTrace::new(file.new_row(row), transport));
    let recorder = FlightRecorder::new(rank, world_size, backend, flight);
    Arc::new(Observers::new(Some(recorder), trace))
}

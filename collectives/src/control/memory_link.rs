//! The control thread of a rank whose peers live in the same process: the I/O driver
//! of its [`Sentinel`], with channels where the TCP driver has connections. Ranks
//! formed together by [`MemoryControlLink::mesh`] get the same abort notices and the
//! same questions between blocked ranks as ranks in separate processes.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Instant;

use tracing::warn;

use super::{ControlMessage, GroupControl, SentinelDriver};

/// What reaches a rank's control thread.
enum Event {
    /// A message from a peer.
    Message {
        from: usize,
        message: ControlMessage,
    },
    /// Something changed on this rank (a call, an abort, a fingerprint, the end).
    Wake,
}

/// One rank's running control thread; dropping it says goodbye to the peers (unless the
/// group was aborted) and stops the thread.
pub struct MemoryControlLink {
    rank: usize,
    stop: Arc<AtomicBool>,
    wake: Sender<Event>,
    thread: Option<JoinHandle<()>>,
}

impl MemoryControlLink {
    /// Starts a control thread for each rank of `controls` (`controls[r]`: rank `r`'s
    /// control state), connected to each other by channels.
    ///
    /// ```
    /// use ringccl_collectives::control::{GroupControl, MemoryControlLink};
    ///
    /// let controls: Vec<_> = (0..3).map(GroupControl::new).collect();
    /// let links = MemoryControlLink::mesh(&controls)?;
    /// controls[1].abort(1, "rank 1 gave up".into(), None);
    /// // Rank 1's thread tells the others.
    /// let told = controls[2].wait_for_abort(std::time::Duration::from_secs(10));
    /// assert_eq!(told.map(|r| r.origin), Some(1));
    /// drop(links);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn mesh(controls: &[Arc<GroupControl>]) -> std::io::Result<Vec<MemoryControlLink>> {
        let n = controls.len();
        let (senders, receivers): (Vec<Sender<Event>>, Vec<Receiver<Event>>) =
            (0..n).map(|_| mpsc::channel()).unzip();
        let mut links = Vec::with_capacity(n);
        for (rank, (control, inbox)) in controls.iter().zip(receivers).enumerate() {
            let stop = Arc::new(AtomicBool::new(false));
            let own = senders[rank].clone();
            let waker = own.clone();
            control.attach_link(Arc::new(move || {
                // A send fails only once the thread has ended: nothing left to wake.
                let _ = waker.send(Event::Wake);
            }));
            let driver = Driver {
                rank,
                stop: Arc::clone(&stop),
                inbox,
                peers: senders.clone(),
                sentinel: SentinelDriver::new(rank, n, Arc::clone(control)),
            };
            let thread = thread::Builder::new()
                .name(format!("ringccl-control-{rank}"))
                .spawn(move || driver.run())?;
            links.push(MemoryControlLink {
                rank,
                stop,
                wake: own,
                thread: Some(thread),
            });
        }
        Ok(links)
    }
}

impl Drop for MemoryControlLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.wake.send(Event::Wake);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                warn!(rank = self.rank, "the control thread panicked");
            }
        }
    }
}

impl fmt::Debug for MemoryControlLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryControlLink")
            .field("rank", &self.rank)
            .finish_non_exhaustive()
    }
}

struct Driver {
    rank: usize,
    stop: Arc<AtomicBool>,
    inbox: Receiver<Event>,
    peers: Vec<Sender<Event>>,
    sentinel: SentinelDriver,
}

impl Driver {
    fn run(mut self) {
        loop {
            let now = Instant::now();
            let stopping = self.stop.load(Ordering::Acquire);
            self.sentinel.turn(now, stopping);
            self.send_pending();
            if stopping {
                return;
            }
            if self.sentinel.is_aborted() {
                // Channels deliver at once: the notices are already with the peers.
                self.sentinel.control().close_connections();
                return;
            }
            let wait = self.sentinel.next_tick().saturating_duration_since(now);
            match self.inbox.recv_timeout(wait) {
                Ok(event) => {
                    self.handle(event);
                    while let Ok(event) = self.inbox.try_recv() {
                        self.handle(event);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                // Not while this thread holds its own sender; ending is the safe answer.
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn handle(&mut self, event: Event) {
        if let Event::Message { from, message } = event {
            self.sentinel.handle_message(Instant::now(), from, message);
        }
    }

    fn send_pending(&mut self) {
        while let Some((to, message)) = self.sentinel.poll_transmit() {
            if let Some(peer) = self.peers.get(to) {
                // A peer whose thread has ended reads nothing more.
                let _ = peer.send(Event::Message {
                    from: self.rank,
                    message,
                });
            }
        }
    }
}

//! Groups formed from a group: [`ProcessGroup::new_group`] (the ranks listed) and
//! [`ProcessGroup::split`] (the ranks of one colour). Each new group has its own
//! connections, its own sequence numbers and its own job id in every hello, so its
//! traffic can never be paired with another group's: the way to give each thread, or
//! each kind of traffic, a stream of its own.
//!
//! Forming one is a collective on the parent: every rank of the parent calls it, in the
//! same order as its other collectives. The ranks first exchange what they asked for
//! (one all-gather on the parent, so every rank sees the same table and reaches the same
//! verdict), then the members connect through the parent's rendezvous store, under a
//! namespace of their own.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringccl_collectives::Deadline;
use tracing::info;

use crate::init::gloo_over_mesh;
use crate::origin::Origin;
use crate::{Error, ProcessGroup};

/// What one rank asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Request {
    /// `new_group`: a hash of the sorted rank list, and whether it was valid here.
    Ranks { hash: u64 },
    /// `split`: this rank's colour, if any.
    Colour(Option<u32>),
}

/// Number of `i64`s in one rank's entry of the exchanged table.
const ENTRY: usize = 3;

impl Request {
    fn encode(self, serial: u64) -> [i64; ENTRY] {
        let serial = serial as i64;
        match self {
            Request::Ranks { hash } => [serial, 0, hash as i64],
            Request::Colour(None) => [serial, 1, -1],
            Request::Colour(Some(colour)) => [serial, 1, i64::from(colour)],
        }
    }

    fn decode(entry: &[i64]) -> Option<(u64, Request)> {
        let serial = u64::try_from(*entry.first()?).ok()?;
        let request = match (*entry.get(1)?, *entry.get(2)?) {
            (0, hash) => Request::Ranks { hash: hash as u64 },
            (1, -1) => Request::Colour(None),
            (1, colour) => Request::Colour(Some(u32::try_from(colour).ok()?)),
            _ => return None,
        };
        Some((serial, request))
    }

    fn describe(self) -> String {
        match self {
            Request::Ranks { .. } => "new_group".into(),
            Request::Colour(None) => "split(no colour)".into(),
            Request::Colour(Some(c)) => format!("split(colour {c})"),
        }
    }
}

/// FNV-1a over the ranks: the same list gives the same hash in every process.
fn hash_ranks(ranks: &[usize]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &rank in ranks {
        for byte in (rank as u64).to_le_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

impl ProcessGroup {
    /// Forms a new group of the listed ranks of this one (in any order; numbered in
    /// ascending order of their rank here). Every rank of this group must call it with
    /// the same list, in the same place among its collectives; members get the new
    /// group, the other ranks `None`.
    ///
    /// The new group has connections and sequence numbers of its own: its calls can
    /// never be paired with this group's or another group's. Give each thread that
    /// issues collectives its own group this way (see [`Error::ConcurrentUse`]). It uses
    /// the transport and settings this group was started with.
    ///
    /// Ranks that pass different lists all get [`Error::InvalidArgument`] naming one
    /// that differs; so do ranks out of range or listed twice. Only groups started by
    /// [`init_process_group`](crate::init_process_group) under `"gloo"` can form groups.
    ///
    /// ```
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mine = pg.new_group(&[0])?.expect("rank 0 is a member");
    /// let mut x = [2.0f32];
    /// mine.all_reduce(&mut x, ringccl::ReduceOp::Sum)?;
    /// assert_eq!((mine.rank(), mine.world_size(), x), (0, 1, [2.0]));
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn new_group(&self, ranks: &[usize]) -> Result<Option<ProcessGroup>, Error> {
        let issued = Instant::now();
        let mut sorted = ranks.to_vec();
        sorted.sort_unstable();
        let request = Request::Ranks {
            hash: hash_ranks(&sorted),
        };
        let (serial, _) = self.exchange(request)?;
        let n = self.world_size();
        if sorted.is_empty() {
            return Err(Error::InvalidArgument(
                "new_group needs at least one rank".into(),
            ));
        }
        if let Some(&bad) = sorted.iter().find(|&&r| r >= n) {
            return Err(Error::InvalidArgument(format!(
                "new_group lists rank {bad}, but the group has ranks 0..{n}"
            )));
        }
        if let Some(twice) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::InvalidArgument(format!(
                "new_group lists rank {} twice",
                twice[0]
            )));
        }
        let Ok(sub_rank) = sorted.binary_search(&self.rank()) else {
            return Ok(None);
        };
        self.form(issued, serial, 0, sorted, sub_rank).map(Some)
    }

    /// Splits this group by colour, like `MPI_Comm_split`: the ranks that pass the same
    /// `Some(colour)` form one new group (numbered in ascending order of their rank
    /// here); a rank that passes `None` joins none and gets `None`. Every rank of this
    /// group must call it, in the same place among its collectives.
    ///
    /// Each new group has connections and sequence numbers of its own, as with
    /// [`ProcessGroup::new_group`]. Only groups started by
    /// [`init_process_group`](crate::init_process_group) under `"gloo"` can split.
    ///
    /// ```
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let evens = pg.split(Some(pg.rank() as u32 % 2))?.expect("every rank has a colour");
    /// assert_eq!(evens.world_size(), 1);
    /// assert!(pg.split(None)?.is_none());
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn split(&self, colour: Option<u32>) -> Result<Option<ProcessGroup>, Error> {
        let issued = Instant::now();
        let (serial, table) = self.exchange(Request::Colour(colour))?;
        let Some(colour) = colour else {
            return Ok(None);
        };
        let members: Vec<usize> = table
            .iter()
            .enumerate()
            .filter(|(_, r)| **r == Request::Colour(Some(colour)))
            .map(|(rank, _)| rank)
            .collect();
        let sub_rank = members
            .iter()
            .position(|&r| r == self.rank())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "rank {} is missing from the ranks of its own colour {colour}",
                    self.rank()
                ))
            })?;
        self.form(issued, serial, colour, members, sub_rank)
            .map(Some)
    }

    /// What this group was made with, which forming a group needs; an error saying why
    /// not for groups that have none.
    fn origin(&self) -> Result<&Origin, Error> {
        self.shared()
            .origin
            .as_ref()
            .ok_or_else(|| match self.backend() {
                "nccl" => Error::BackendUnavailable {
                    backend: "nccl",
                    reason: "new_group and split are not available under nccl yet; form the \
                         groups with separate init_process_group calls"
                        .into(),
                },
                other => Error::InvalidArgument(format!(
                    "this {other:?} group was not started by init_process_group, so it has no \
                 rendezvous store to form groups through"
                )),
            })
    }

    /// The collective part of forming groups: every rank's request, checked to be the
    /// same call on every rank (same serial number, same kind, and for `new_group` the
    /// same list). Fails alike on every rank. Returns the new group's serial number and
    /// every rank's request.
    fn exchange(&self, request: Request) -> Result<(u64, Vec<Request>), Error> {
        let origin = self.origin()?;
        let serial = origin.formed.fetch_add(1, Ordering::Relaxed);
        let n = self.world_size();
        let mut all = vec![0i64; ENTRY * n];
        self.all_gather(&request.encode(serial), &mut all)?;
        let table: Vec<(u64, Request)> = all
            .chunks(ENTRY)
            .enumerate()
            .map(|(rank, entry)| {
                Request::decode(entry).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "rank {rank} sent an unreadable request while forming a group: {entry:?}"
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        let (first_serial, first) = table[0];
        for (rank, &(their_serial, theirs)) in table.iter().enumerate() {
            let same_kind = matches!((first, theirs), (Request::Colour(_), Request::Colour(_)))
                || first == theirs;
            if their_serial != first_serial || !same_kind {
                return Err(Error::InvalidArgument(format!(
                    "ranks disagree on forming a group: rank 0 called {} (its group #{first_serial}) \
                     while rank {rank} called {} (its group #{their_serial}){}; every rank must \
                     make the same new_group/split calls, in the same order, with the same ranks",
                    first.describe(),
                    theirs.describe(),
                    if matches!(first, Request::Ranks { .. }) && first != theirs {
                        " with a different list of ranks"
                    } else {
                        ""
                    }
                )));
            }
        }
        Ok((serial, table.into_iter().map(|(_, r)| r).collect()))
    }

    /// Connects this rank, `sub_rank` of `members`, into group `colour` of formation
    /// `serial`, through the rendezvous store, within the start-up timeout counted from
    /// `issued`.
    fn form(
        &self,
        issued: Instant,
        serial: u64,
        colour: u32,
        members: Vec<usize>,
        sub_rank: usize,
    ) -> Result<ProcessGroup, Error> {
        let origin = self.origin()?;
        let recipe = Arc::clone(&origin.recipe);
        let left = recipe.mesh.timeout.saturating_sub(issued.elapsed());
        let deadline = Deadline::after(left).at();
        let namespace = format!("group/{serial}/{colour}/");
        let mut config = recipe.mesh_config(sub_rank, members.len());
        config.timeout = left.max(Duration::from_millis(1));
        let mesh = origin.store.connect_sub_mesh(&namespace, config)?;
        let row = format!(
            "collectives {namespace} (rank {sub_rank} of {})",
            members.len()
        );
        let group = gloo_over_mesh(mesh, recipe, deadline, &row, &namespace)?;
        info!(
            rank = self.rank(),
            sub_rank,
            world_size = members.len(),
            members = ?members,
            %namespace,
            "formed a group"
        );
        Ok(group)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        for request in [
            Request::Ranks { hash: u64::MAX },
            Request::Ranks { hash: 7 },
            Request::Colour(None),
            Request::Colour(Some(0)),
            Request::Colour(Some(u32::MAX)),
        ] {
            assert_eq!(Request::decode(&request.encode(5)), Some((5, request)));
        }
        assert_eq!(Request::decode(&[0, 2, 0]), None);
        assert_eq!(Request::decode(&[-1, 0, 0]), None);
        assert_eq!(Request::decode(&[0, 1, -2]), None);
    }

    #[test]
    fn the_rank_hash_depends_on_every_rank() {
        assert_eq!(hash_ranks(&[0, 1, 3]), hash_ranks(&[0, 1, 3]));
        assert_ne!(hash_ranks(&[0, 1, 3]), hash_ranks(&[0, 1, 2]));
        assert_ne!(hash_ranks(&[0, 1]), hash_ranks(&[0, 1, 0]));
    }
}

//! Choosing the all-reduce and barrier algorithms.

use std::fmt;
use std::str::FromStr;

use crate::wire::Algorithm;
use crate::Error;

/// Which all-reduce algorithm the CPU backend runs.
///
/// Every rank must use the same setting; a rank that picked another algorithm for the
/// same call gets a `Protocol` error naming both, not garbage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllReduceAlgo {
    /// Recursive doubling up to `HostConfig::small_all_reduce_max_bytes`, halving-doubling
    /// up to `HostConfig::mid_all_reduce_max_bytes` (with four ranks or more), ring above.
    /// Between ranks of one process, from `HostConfig::peer_memory_min_bytes` on, the
    /// ranks read each other's buffers instead (the host engine decides that, as only it
    /// knows the transport).
    #[default]
    Auto,
    /// Always the pipelined ring (bandwidth-optimal).
    Ring,
    /// Always recursive doubling (latency-optimal: ⌈log2 N⌉ steps).
    RecursiveDoubling,
    /// Always Rabenseifner's halving-doubling: the ring's bytes in 2·log2 N steps.
    HalvingDoubling,
    /// The hierarchical all-reduce whenever the group spans hosts with several ranks on
    /// one (inside each host, across, inside again); the ring otherwise.
    Hierarchical,
    /// Ranks read each other's buffers, at every size: threads of one process
    /// (`ringccl::local_groups`) directly, and processes of one host sharing memory
    /// through the kernel (cross-memory attach, when every rank may read every other's
    /// memory, as set-up finds); elsewhere the same as `Auto`.
    PeerMemory,
}

impl AllReduceAlgo {
    /// The names accepted by [`FromStr`] (and the `RINGCCL_ALGO` variable).
    pub const NAMES: &'static str =
        "auto, ring, recursive_doubling (or rd), halving_doubling (or hd), hierarchical (or hier), peer_memory (or pm)";

    /// The schedule to run for a buffer of `bytes` bytes over `ranks` ranks: under
    /// `Auto`, recursive doubling up to `small_max_bytes`, then halving-doubling up to
    /// `mid_max_bytes` where it takes fewer steps than the ring (four ranks or more),
    /// then the ring.
    ///
    /// ```
    /// use ringccl_collectives::{wire::Algorithm, AllReduceAlgo};
    /// let auto = AllReduceAlgo::Auto;
    /// assert_eq!(auto.pick(8, 4, 100, 1000), Algorithm::RecursiveDoubling);
    /// assert_eq!(auto.pick(500, 4, 100, 1000), Algorithm::HalvingDoubling);
    /// assert_eq!(auto.pick(500, 2, 100, 1000), Algorithm::Ring);
    /// assert_eq!(auto.pick(5000, 4, 100, 1000), Algorithm::Ring);
    /// ```
    pub fn pick(
        self,
        bytes: usize,
        ranks: usize,
        small_max_bytes: usize,
        mid_max_bytes: usize,
    ) -> Algorithm {
        match self {
            AllReduceAlgo::Ring | AllReduceAlgo::Hierarchical => Algorithm::Ring,
            AllReduceAlgo::PeerMemory => {
                AllReduceAlgo::Auto.pick(bytes, ranks, small_max_bytes, mid_max_bytes)
            }
            AllReduceAlgo::RecursiveDoubling => Algorithm::RecursiveDoubling,
            AllReduceAlgo::HalvingDoubling => Algorithm::HalvingDoubling,
            AllReduceAlgo::Auto if bytes <= small_max_bytes => Algorithm::RecursiveDoubling,
            AllReduceAlgo::Auto if bytes <= mid_max_bytes && ranks >= 4 => {
                Algorithm::HalvingDoubling
            }
            AllReduceAlgo::Auto => Algorithm::Ring,
        }
    }
}

/// Across hosts, the largest buffer recursive doubling keeps (when
/// `small_all_reduce_max_bytes` is not lower): above it the hierarchical all-reduce was
/// faster at 2 hosts x 2 ranks on 1 Gbit/s links (`SWEEP=1 scripts/netns-hosts-bench.sh`,
/// docs/benchmarks.md): even at 4 KiB, 1.3x faster at 16 KiB, 2x from 32 KiB.
pub const ACROSS_HOSTS_SMALL_MAX_BYTES: usize = 8 << 10;

impl AllReduceAlgo {
    /// [`AllReduceAlgo::pick`] for a group whose ranks sit on several hosts with several
    /// ranks on at least one (`spans_hosts`): there `Auto` takes the hierarchical
    /// all-reduce above `small_max_bytes` or [`ACROSS_HOSTS_SMALL_MAX_BYTES`], whichever
    /// is lower (recursive doubling's latency still wins below), and `Hierarchical` takes
    /// it at every size. Without `spans_hosts`, `pick`.
    ///
    /// ```
    /// use ringccl_collectives::{wire::Algorithm, AllReduceAlgo};
    /// let auto = AllReduceAlgo::Auto;
    /// assert_eq!(auto.pick_on_hosts(8, 4, 100, 1000, true), Algorithm::RecursiveDoubling);
    /// assert_eq!(auto.pick_on_hosts(500, 4, 100, 1000, true), Algorithm::Hierarchical);
    /// assert_eq!(auto.pick_on_hosts(500, 4, 100, 1000, false), Algorithm::HalvingDoubling);
    /// assert_eq!(auto.pick_on_hosts(16 << 10, 4, 32 << 10, 1 << 22, true), Algorithm::Hierarchical);
    /// let pm = AllReduceAlgo::PeerMemory; // across hosts: what Auto picks
    /// assert_eq!(pm.pick_on_hosts(500, 4, 100, 1000, true), Algorithm::Hierarchical);
    /// ```
    pub fn pick_on_hosts(
        self,
        bytes: usize,
        ranks: usize,
        small_max_bytes: usize,
        mid_max_bytes: usize,
        spans_hosts: bool,
    ) -> Algorithm {
        // Peer memory needs ranks that read each other's memory; anywhere else it is Auto.
        let this = match self {
            AllReduceAlgo::PeerMemory => AllReduceAlgo::Auto,
            other => other,
        };
        match this {
            AllReduceAlgo::Hierarchical if spans_hosts => Algorithm::Hierarchical,
            AllReduceAlgo::Auto
                if spans_hosts && bytes > small_max_bytes.min(ACROSS_HOSTS_SMALL_MAX_BYTES) =>
            {
                Algorithm::Hierarchical
            }
            _ => this.pick(bytes, ranks, small_max_bytes, mid_max_bytes),
        }
    }
}

/// The most ranks the gather-release barrier serves: rank 0 handles every signal in
/// turn, so beyond this the dissemination barrier's `⌈log2 N⌉` rounds are kept (eight
/// is the largest group measured, `docs/benchmarks.md`).
pub const GATHER_RELEASE_MAX_RANKS: usize = 8;

/// The barrier for `ranks` ranks that all run on one machine or not (`one_machine`,
/// which every rank of a group answers alike): gather-release for 3 to
/// [`GATHER_RELEASE_MAX_RANKS`] ranks of one machine, where its two hops and single
/// message per rank beat dissemination's rounds both over shared memory with the ranks
/// taking turns on the cores and over TCP; dissemination otherwise (two ranks exchange
/// one signal each way at once, and across hosts each round is one network hop).
///
/// ```
/// use ringccl_collectives::{barrier_algorithm, wire::Algorithm};
/// assert_eq!(barrier_algorithm(4, true), Algorithm::GatherRelease);
/// assert_eq!(barrier_algorithm(2, true), Algorithm::Dissemination);
/// assert_eq!(barrier_algorithm(4, false), Algorithm::Dissemination);
/// assert_eq!(barrier_algorithm(64, true), Algorithm::Dissemination);
/// ```
pub fn barrier_algorithm(ranks: usize, one_machine: bool) -> Algorithm {
    if one_machine && (3..=GATHER_RELEASE_MAX_RANKS).contains(&ranks) {
        Algorithm::GatherRelease
    } else {
        Algorithm::Dissemination
    }
}

impl FromStr for AllReduceAlgo {
    type Err = Error;

    fn from_str(s: &str) -> Result<AllReduceAlgo, Error> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "auto" => Ok(AllReduceAlgo::Auto),
            "ring" => Ok(AllReduceAlgo::Ring),
            "recursive_doubling" | "rd" => Ok(AllReduceAlgo::RecursiveDoubling),
            "halving_doubling" | "hd" | "rabenseifner" => Ok(AllReduceAlgo::HalvingDoubling),
            "hierarchical" | "hier" => Ok(AllReduceAlgo::Hierarchical),
            "peer_memory" | "pm" => Ok(AllReduceAlgo::PeerMemory),
            _ => Err(Error::InvalidArgument(format!(
                "unknown all-reduce algorithm {s:?}: valid names are {}",
                AllReduceAlgo::NAMES
            ))),
        }
    }
}

impl fmt::Display for AllReduceAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AllReduceAlgo::Auto => "auto",
            AllReduceAlgo::Ring => "ring",
            AllReduceAlgo::RecursiveDoubling => "recursive_doubling",
            AllReduceAlgo::HalvingDoubling => "halving_doubling",
            AllReduceAlgo::Hierarchical => "hierarchical",
            AllReduceAlgo::PeerMemory => "peer_memory",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_picks_by_size() {
        assert_eq!(
            "RD".parse::<AllReduceAlgo>().unwrap(),
            AllReduceAlgo::RecursiveDoubling
        );
        assert_eq!(
            "recursive-doubling".parse::<AllReduceAlgo>().unwrap(),
            AllReduceAlgo::RecursiveDoubling
        );
        assert_eq!(
            " Ring ".parse::<AllReduceAlgo>().unwrap(),
            AllReduceAlgo::Ring
        );
        let err = "tree".parse::<AllReduceAlgo>().unwrap_err();
        assert!(err.to_string().contains("auto, ring"), "{err}");
        assert_eq!(
            AllReduceAlgo::Auto.pick(100, 4, 100, 200),
            Algorithm::RecursiveDoubling
        );
        assert_eq!(
            AllReduceAlgo::Auto.pick(101, 4, 100, 200),
            Algorithm::HalvingDoubling
        );
        assert_eq!(AllReduceAlgo::Auto.pick(101, 3, 100, 200), Algorithm::Ring);
        assert_eq!(AllReduceAlgo::Auto.pick(201, 4, 100, 200), Algorithm::Ring);
        assert_eq!(AllReduceAlgo::Ring.pick(1, 4, 100, 200), Algorithm::Ring);
        assert_eq!(
            "HD".parse::<AllReduceAlgo>().unwrap(),
            AllReduceAlgo::HalvingDoubling
        );
        for algo in [
            AllReduceAlgo::Auto,
            AllReduceAlgo::Ring,
            AllReduceAlgo::RecursiveDoubling,
            AllReduceAlgo::HalvingDoubling,
            AllReduceAlgo::Hierarchical,
        ] {
            assert_eq!(algo.to_string().parse::<AllReduceAlgo>().unwrap(), algo);
        }
    }
}

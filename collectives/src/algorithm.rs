//! Choosing the all-reduce algorithm.

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
    /// Recursive doubling up to `HostConfig::small_all_reduce_max_bytes`, ring above.
    #[default]
    Auto,
    /// Always the pipelined ring (bandwidth-optimal).
    Ring,
    /// Always recursive doubling (latency-optimal: ⌈log2 N⌉ steps).
    RecursiveDoubling,
}

impl AllReduceAlgo {
    /// The names accepted by [`FromStr`] (and the `RINGCCL_ALGO` variable).
    pub const NAMES: &'static str = "auto, ring, recursive_doubling (or rd)";

    /// The schedule to run for a buffer of `bytes` bytes.
    pub fn pick(self, bytes: usize, small_max_bytes: usize) -> Algorithm {
        match self {
            AllReduceAlgo::Ring => Algorithm::Ring,
            AllReduceAlgo::RecursiveDoubling => Algorithm::RecursiveDoubling,
            AllReduceAlgo::Auto if bytes <= small_max_bytes => Algorithm::RecursiveDoubling,
            AllReduceAlgo::Auto => Algorithm::Ring,
        }
    }
}

impl FromStr for AllReduceAlgo {
    type Err = Error;

    fn from_str(s: &str) -> Result<AllReduceAlgo, Error> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "auto" => Ok(AllReduceAlgo::Auto),
            "ring" => Ok(AllReduceAlgo::Ring),
            "recursive_doubling" | "rd" => Ok(AllReduceAlgo::RecursiveDoubling),
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
            AllReduceAlgo::Auto.pick(100, 100),
            Algorithm::RecursiveDoubling
        );
        assert_eq!(AllReduceAlgo::Auto.pick(101, 100), Algorithm::Ring);
        assert_eq!(AllReduceAlgo::Ring.pick(1, 100), Algorithm::Ring);
        for algo in [
            AllReduceAlgo::Auto,
            AllReduceAlgo::Ring,
            AllReduceAlgo::RecursiveDoubling,
        ] {
            assert_eq!(algo.to_string().parse::<AllReduceAlgo>().unwrap(), algo);
        }
    }
}

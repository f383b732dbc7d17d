//! Every environment variable ringccl reads, parsed in one place: the launcher's
//! (torchrun, Slurm, OpenMPI) and ringccl's own `RINGCCL_*` settings. (`RINGCCL_DEBUG`
//! belongs to logging and is read by [`crate::logging`].)

use std::path::PathBuf;
use std::time::Duration;

use ringccl_collectives::AllReduceAlgo;
use ringccl_observe::flight::MAX_FLIGHT_ENTRIES;
use ringccl_rendezvous::{AuthToken, InterfaceSpec};
use ringccl_transports::shm::MAX_SPIN;

use super::slurm::first_slurm_host;
use super::{InitOptions, TransportKind};
use crate::Error;

const TORCHRUN_HINT: &str = "launch under `ringrun`, `torchrun`, Slurm's `srun` or OpenMPI's `mpirun`, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT";

/// Whether the variables `lookup` reads make this process one rank of a launched group
/// (see [`InitOptions::launched_as_rank`]).
pub(super) fn launched_as_rank(lookup: impl Fn(&str) -> Option<String>) -> bool {
    let set = |var: &str| lookup(var).is_some_and(|v| !v.trim().is_empty());
    set("RANK")
        || set("OMPI_COMM_WORLD_RANK")
        || (set("SLURM_PROCID") && set("SLURM_NTASKS") && set("SLURM_STEP_ID"))
}

/// Builds options from the launcher's variables, read through `lookup`.
pub(super) fn options_from(lookup: impl Fn(&str) -> Option<String>) -> Result<InitOptions, Error> {
    let set = |var: &str| lookup(var).filter(|v| !v.trim().is_empty());
    // The torchrun name first, then what Slurm's srun and OpenMPI's mpirun set.
    let first_of = |names: &[&'static str]| {
        names
            .iter()
            .find_map(|&var| set(var).map(|value| (var, value)))
    };
    let required = |names: &[&'static str]| {
        first_of(names).ok_or(Error::MissingEnv {
            var: names[0],
            hint: TORCHRUN_HINT,
        })
    };
    let number = |(var, value): (&'static str, String)| {
        value
            .trim()
            .parse::<usize>()
            .map_err(|e| Error::InvalidEnv {
                var,
                value: value.clone(),
                reason: format!("expected a non-negative integer ({e})"),
            })
    };
    let rank_var = required(&["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"])?;
    let rank_name = rank_var.0;
    let rank = number(rank_var)?;
    let world_var = required(&["WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"])?;
    let world_name = world_var.0;
    let world_size = number(world_var)?;
    if world_size == 0 {
        return Err(Error::InvalidEnv {
            var: world_name,
            value: "0".into(),
            reason: "a group needs at least one rank".into(),
        });
    }
    if rank >= world_size {
        return Err(Error::InvalidEnv {
            var: rank_name,
            value: rank.to_string(),
            reason: format!("must be less than {world_name}={world_size}"),
        });
    }
    let addr = match set("MASTER_ADDR") {
        Some(addr) => addr.trim().to_string(),
        None => match set("SLURM_JOB_NODELIST").map(|list| first_slurm_host(&list)) {
            Some(Some(host)) => host,
            Some(None) => {
                return Err(Error::InvalidEnv {
                    var: "SLURM_JOB_NODELIST",
                    value: set("SLURM_JOB_NODELIST").unwrap_or_default(),
                    reason: "cannot read a first host from it; set MASTER_ADDR".into(),
                })
            }
            None => required(&["MASTER_ADDR"])?.1,
        },
    };
    let port_text = required(&["MASTER_PORT"])?.1;
    let port = port_text
        .trim()
        .parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| Error::InvalidEnv {
            var: "MASTER_PORT",
            value: port_text.clone(),
            reason: "expected a TCP port number from 1 to 65535".into(),
        })?;
    let host = if addr.contains(':') && !addr.starts_with('[') {
        format!("[{addr}]")
    } else {
        addr
    };
    let mut opts = InitOptions::new(rank, world_size, &format!("{host}:{port}"));
    if let Some(local) = first_of(&["LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"]) {
        opts.local_rank = Some(number(local)?);
    }
    if let Some(value) = set("TORCHELASTIC_RESTART_COUNT") {
        opts.attempt = value.trim().parse::<u32>().map_err(|e| Error::InvalidEnv {
            var: "TORCHELASTIC_RESTART_COUNT",
            value: value.clone(),
            reason: format!("expected the restart count, a non-negative integer ({e})"),
        })?;
    }
    if let Some(value) = lookup("RINGCCL_TIMEOUT") {
        opts.timeout = seconds("RINGCCL_TIMEOUT", &value, 0.0, false)?;
    }
    if let Some(value) = lookup("RINGCCL_DEAD_PEER_TIMEOUT") {
        opts.dead_peer_timeout = seconds("RINGCCL_DEAD_PEER_TIMEOUT", &value, 1.0, true)?;
    }
    if let Some(value) = lookup("RINGCCL_STARTUP_REPORT") {
        opts.startup_report = seconds("RINGCCL_STARTUP_REPORT", &value, 0.0, false)?;
    }
    if let Some(secret) = lookup("RINGCCL_AUTH_TOKEN") {
        opts.auth_token = Some(AuthToken::new(&secret).ok_or(Error::InvalidEnv {
            var: "RINGCCL_AUTH_TOKEN",
            value: String::new(),
            reason: "an empty token would authenticate nothing; set a secret, or unset it".into(),
        })?);
    }
    Ok(opts)
}

/// The largest number of seconds a `Duration` holds (about 585 billion years): every
/// duration setting accepts values up to this, and any value near it means "never".
const MAX_SECONDS: f64 = u64::MAX as f64;

/// Parses `value` of `var` as a number of seconds above `min` (or equal to it, when
/// `min_included`) that a `Duration` can hold. Negative, NaN, infinite and out-of-range
/// values are [`Error::InvalidEnv`] naming the variable, the value and the allowed range.
fn seconds(
    var: &'static str,
    value: &str,
    min: f64,
    min_included: bool,
) -> Result<Duration, Error> {
    let invalid = |why: &str| Error::InvalidEnv {
        var,
        value: value.to_string(),
        reason: format!(
            "{why}; expected a number of seconds {} {min} and at most {MAX_SECONDS:e} \
             (a value that large already means no deadline)",
            if min_included {
                "of at least"
            } else {
                "greater than"
            }
        ),
    };
    let secs: f64 = value.trim().parse().map_err(|_| invalid("not a number"))?;
    let in_range = if min_included {
        secs >= min
    } else {
        secs > min
    };
    if !in_range || !secs.is_finite() {
        return Err(invalid("out of range"));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| invalid("out of range"))
}

/// `RINGCCL_ALGO`, if set: the all-reduce algorithm when the code chose none.
pub(crate) fn all_reduce_algo(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<AllReduceAlgo>, Error> {
    lookup("RINGCCL_ALGO")
        .map(|value| {
            value.parse().map_err(|_| Error::InvalidEnv {
                var: "RINGCCL_ALGO",
                value: value.clone(),
                reason: format!("expected one of {}", AllReduceAlgo::NAMES),
            })
        })
        .transpose()
}

/// `RINGCCL_TRANSPORT`, if set: the transport when the code chose none.
pub(crate) fn transport(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<TransportKind>, Error> {
    lookup("RINGCCL_TRANSPORT")
        .map(|value| {
            value.parse().map_err(|_| Error::InvalidEnv {
                var: "RINGCCL_TRANSPORT",
                value: value.clone(),
                reason: "expected auto, tcp or shm".into(),
            })
        })
        .transpose()
}

/// `RINGCCL_FLIGHT_DIR`, if set and not empty: where the flight recorder writes.
pub(crate) fn flight_dir(lookup: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    lookup("RINGCCL_FLIGHT_DIR")
        .filter(|dir| !dir.trim().is_empty())
        .map(PathBuf::from)
}

/// `RINGCCL_FLIGHT_ENTRIES`, if set: how many calls the flight recorder keeps.
pub(crate) fn flight_entries(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<usize>, Error> {
    lookup("RINGCCL_FLIGHT_ENTRIES")
        .map(|value| {
            value
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_FLIGHT_ENTRIES).contains(n))
                .ok_or_else(|| Error::InvalidEnv {
                    var: "RINGCCL_FLIGHT_ENTRIES",
                    value: value.clone(),
                    reason: format!(
                        "expected how many calls the flight recorder keeps, from 1 to \
                         {MAX_FLIGHT_ENTRIES} (about 400 bytes each)"
                    ),
                })
        })
        .transpose()
}

/// `RINGCCL_SPIN_US`, if set: how long a wait spins before it sleeps,
/// in microseconds (0 to 10000).
pub(crate) fn spin(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Duration>, Error> {
    lookup("RINGCCL_SPIN_US")
        .filter(|value| !value.trim().is_empty())
        .map(|value| {
            value
                .trim()
                .parse::<u64>()
                .ok()
                .map(Duration::from_micros)
                .filter(|window| *window <= MAX_SPIN)
                .ok_or_else(|| Error::InvalidEnv {
                    var: "RINGCCL_SPIN_US",
                    value: value.clone(),
                    reason: format!(
                        "expected how many microseconds a shared-memory wait spins before \
                         it sleeps, from 0 to {}",
                        MAX_SPIN.as_micros()
                    ),
                })
        })
        .transpose()
}

/// `RINGCCL_TRACE`, if set to a directory: where every rank writes its Chrome trace.
/// Unset, empty or blank means no trace; a value with leading or trailing blanks is
/// refused (almost certainly a quoting mistake in a launch script).
pub(crate) fn trace_dir(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<PathBuf>, Error> {
    let Some(value) = lookup("RINGCCL_TRACE") else {
        return Ok(None);
    };
    if value.trim().is_empty() {
        return Ok(None);
    }
    if value.trim() != value {
        return Err(Error::InvalidEnv {
            var: "RINGCCL_TRACE",
            value,
            reason: "the directory name starts or ends with blanks; remove them (or set an \
                     empty value to turn tracing off)"
                .into(),
        });
    }
    Ok(Some(PathBuf::from(value)))
}

/// `RINGCCL_SOCKET_IFNAME`, if set and not blank, as given: which network interfaces
/// the ranks listen on (checked by [`socket_ifname`], and again by the rendezvous).
pub(crate) fn socket_ifname_raw(lookup: impl Fn(&str) -> Option<String>) -> Option<String> {
    lookup("RINGCCL_SOCKET_IFNAME").filter(|value| !value.trim().is_empty())
}

/// `RINGCCL_SOCKET_IFNAME`, if set and not blank, checked: a value that is no interface
/// list in NCCL's syntax is [`Error::InvalidEnv`] saying what is wrong.
pub(crate) fn socket_ifname(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<String>, Error> {
    let Some(value) = socket_ifname_raw(lookup) else {
        return Ok(None);
    };
    match value.parse::<InterfaceSpec>() {
        Ok(_) => Ok(Some(value)),
        Err(e) => Err(Error::InvalidEnv {
            var: "RINGCCL_SOCKET_IFNAME",
            value,
            reason: e.to_string(),
        }),
    }
}

/// Reads the process environment.
pub(crate) fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::DEFAULT_TIMEOUT;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
    }

    const GOOD: [(&str, &str); 4] = [
        ("RANK", "2"),
        ("WORLD_SIZE", "4"),
        ("MASTER_ADDR", "node0"),
        ("MASTER_PORT", "29500"),
    ];

    #[test]
    fn reads_torchrun_variables() {
        let opts = InitOptions::from_vars(vars(&GOOD)).unwrap();
        assert_eq!((opts.rank, opts.world_size), (2, 4));
        assert_eq!(opts.master, "node0:29500");
        assert_eq!(opts.local_rank, None);
        assert_eq!(opts.timeout, DEFAULT_TIMEOUT);
        let mut with_local = GOOD.to_vec();
        with_local.push(("LOCAL_RANK", "1"));
        with_local.push(("RINGCCL_TIMEOUT", "2.5"));
        with_local.push(("RINGCCL_STARTUP_REPORT", "0.5"));
        let opts = InitOptions::from_vars(vars(&with_local)).unwrap();
        assert_eq!(opts.local_rank, Some(1));
        assert_eq!(opts.timeout, Duration::from_millis(2500));
        assert_eq!(opts.startup_report, Duration::from_millis(500));
        assert_eq!(opts.attempt, 0);
    }

    #[test]
    fn the_restart_count_is_the_attempt() {
        let mut restarted = GOOD.to_vec();
        restarted.push(("TORCHELASTIC_RESTART_COUNT", "3"));
        let mut opts = InitOptions::from_vars(vars(&restarted)).unwrap();
        assert_eq!(opts.attempt, 3);
        assert_eq!(opts.mesh_config().attempt, 3);
        restarted.push(("TORCHELASTIC_RESTART_COUNT", "-1"));
        restarted.swap_remove(4);
        let err = InitOptions::from_vars(vars(&restarted)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidEnv {
                    var: "TORCHELASTIC_RESTART_COUNT",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn each_missing_variable_is_named() {
        for missing in ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"] {
            let rest: Vec<_> = GOOD.iter().copied().filter(|p| p.0 != missing).collect();
            let err = InitOptions::from_vars(vars(&rest)).unwrap_err();
            assert!(matches!(err, Error::MissingEnv { var, .. } if var == missing));
            assert!(err.to_string().contains(missing), "{err}");
        }
    }

    #[test]
    fn malformed_variables_are_named() {
        for (var, bad) in [
            ("RANK", "two"),
            ("RANK", "4"),
            ("WORLD_SIZE", "-1"),
            ("WORLD_SIZE", "0"),
            ("MASTER_PORT", "99999"),
            ("MASTER_PORT", "0"),
            ("LOCAL_RANK", "x"),
            ("RINGCCL_TIMEOUT", "-3"),
            ("RINGCCL_TIMEOUT", "0"),
            ("RINGCCL_TIMEOUT", "1e20"),
            ("RINGCCL_TIMEOUT", "NaN"),
            ("RINGCCL_TIMEOUT", "inf"),
            ("RINGCCL_STARTUP_REPORT", "0"),
            ("RINGCCL_STARTUP_REPORT", "-1"),
            ("RINGCCL_DEAD_PEER_TIMEOUT", "1e300"),
            ("RINGCCL_DEAD_PEER_TIMEOUT", "-inf"),
        ] {
            let mut set: Vec<_> = GOOD.iter().copied().filter(|p| p.0 != var).collect();
            set.push((var, bad));
            let err = InitOptions::from_vars(vars(&set)).unwrap_err();
            match &err {
                Error::InvalidEnv { var: named, .. } => assert_eq!(*named, var, "{err}"),
                other => panic!("{var}={bad}: unexpected {other}"),
            }
        }
    }

    #[test]
    fn cluster_launcher_variables_are_understood_and_torchrun_names_win() {
        let slurm = [
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_NODELIST", "gpu[007-010,12],cpu1"),
            ("MASTER_PORT", "29500"),
        ];
        let opts = InitOptions::from_vars(vars(&slurm)).unwrap();
        assert_eq!((opts.rank, opts.world_size), (5, 8));
        assert_eq!(opts.local_rank, Some(1));
        assert_eq!(opts.master, "gpu007:29500");

        let ompi = [
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "1234"),
        ];
        let opts = InitOptions::from_vars(vars(&ompi)).unwrap();
        assert_eq!(
            (opts.rank, opts.world_size, opts.local_rank),
            (2, 3, Some(0))
        );
        assert_eq!(opts.master, "10.1.2.3:1234");

        let mut both = slurm.to_vec();
        both.extend([
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("MASTER_ADDR", "h0"),
        ]);
        let opts = InitOptions::from_vars(vars(&both)).unwrap();
        assert_eq!(
            (opts.rank, opts.world_size, opts.local_rank),
            (1, 2, Some(0))
        );
        assert_eq!(opts.master, "h0:29500");

        let bad = [
            ("SLURM_PROCID", "9"),
            ("SLURM_NTASKS", "8"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ];
        let err = InitOptions::from_vars(vars(&bad)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidEnv {
                    var: "SLURM_PROCID",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn flight_recorder_variables_are_read_and_checked() {
        assert_eq!(
            flight_dir(vars(&[("RINGCCL_FLIGHT_DIR", "/tmp/f")])),
            Some("/tmp/f".into())
        );
        assert_eq!(flight_dir(vars(&[("RINGCCL_FLIGHT_DIR", " ")])), None);
        assert_eq!(flight_dir(vars(&[])), None);
        let entries = |v: &str| flight_entries(vars(&[("RINGCCL_FLIGHT_ENTRIES", v)]));
        assert_eq!(entries("500").ok(), Some(Some(500)));
        assert_eq!(flight_entries(vars(&[])).ok(), Some(None));
        for bad in ["0", "-1", "many", "100001"] {
            match entries(bad) {
                Err(Error::InvalidEnv { var, reason, .. }) => {
                    assert_eq!(var, "RINGCCL_FLIGHT_ENTRIES");
                    assert!(reason.contains("100000"), "{reason}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_flight_recorder_and_the_trace_cannot_share_a_directory() {
        let opts = InitOptions::new(0, 1, "h:1")
            .flight_dir("/tmp/same")
            .trace_dir("/tmp/same");
        let err = opts.resolved_flight_dir().unwrap_err();
        assert!(err.to_string().contains("different directories"), "{err}");
        let opts = InitOptions::new(0, 1, "h:1")
            .flight_dir("/tmp/f")
            .trace_dir("/tmp/t");
        assert_eq!(opts.resolved_flight_dir().unwrap(), Some("/tmp/f".into()));
    }

    #[test]
    fn the_trace_directory_is_optional_and_checked() {
        assert_eq!(trace_dir(vars(&[])).unwrap(), None);
        assert_eq!(trace_dir(vars(&[("RINGCCL_TRACE", "  ")])).unwrap(), None);
        assert_eq!(
            trace_dir(vars(&[("RINGCCL_TRACE", "/tmp/t r")])).unwrap(),
            Some(PathBuf::from("/tmp/t r"))
        );
        let err = trace_dir(vars(&[("RINGCCL_TRACE", "/tmp/t ")])).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidEnv {
                    var: "RINGCCL_TRACE",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("blanks"), "{err}");
    }

    #[test]
    fn the_spin_window_is_microseconds_and_range_checked() {
        assert_eq!(spin(vars(&[])).unwrap(), None);
        assert_eq!(spin(vars(&[("RINGCCL_SPIN_US", " ")])).unwrap(), None);
        assert_eq!(
            spin(vars(&[("RINGCCL_SPIN_US", "0")])).unwrap(),
            Some(Duration::ZERO)
        );
        assert_eq!(
            spin(vars(&[("RINGCCL_SPIN_US", " 10000 ")])).unwrap(),
            Some(Duration::from_millis(10))
        );
        for bad in ["10001", "-1", "5us", "1e3", "18446744073709551616"] {
            let err = spin(vars(&[("RINGCCL_SPIN_US", bad)])).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::InvalidEnv {
                        var: "RINGCCL_SPIN_US",
                        ..
                    }
                ),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains("from 0 to 10000"), "{err}");
        }
        let opts = InitOptions::new(0, 1, "h:1").spin(Duration::from_micros(7));
        assert_eq!(opts.resolved_spin().unwrap(), Duration::from_micros(7));
        assert!(opts.validate().is_ok());
        let too_long = InitOptions::new(0, 1, "h:1").spin(Duration::from_millis(11));
        assert!(too_long.validate().is_err());
    }

    #[test]
    fn the_socket_interface_is_read_checked_and_passed_to_the_rendezvous() {
        assert_eq!(socket_ifname(vars(&[])).unwrap(), None);
        assert_eq!(
            socket_ifname(vars(&[("RINGCCL_SOCKET_IFNAME", " ")])).unwrap(),
            None
        );
        for good in ["eth0", "ib0,eth1", "^lo,docker", "=eth0", "^=lo"] {
            assert_eq!(
                socket_ifname(vars(&[("RINGCCL_SOCKET_IFNAME", good)])).unwrap(),
                Some(good.to_string())
            );
        }
        for bad in ["^", "eth0,^lo", "eth0:1", "=eth 0"] {
            let err = socket_ifname(vars(&[("RINGCCL_SOCKET_IFNAME", bad)])).unwrap_err();
            assert!(
                matches!(
                    &err,
                    Error::InvalidEnv {
                        var: "RINGCCL_SOCKET_IFNAME",
                        value,
                        ..
                    } if value == bad
                ),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains("NCCL's syntax"), "{err}");
        }
        // The setting in code reaches the rendezvous, and is checked there too.
        let mut opts = InitOptions::new(1, 2, "h:1").socket_ifname("=eth1");
        assert_eq!(opts.mesh_config().socket_ifname.as_deref(), Some("=eth1"));
        let for_local = opts.for_local_rank(0, 2, "h:2");
        assert_eq!(for_local.socket_ifname.as_deref(), Some("=eth1"));
        let err = InitOptions::new(1, 2, "h:1")
            .socket_ifname("^")
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("RINGCCL_SOCKET_IFNAME"), "{err}");
    }

    #[test]
    fn validate_rejects_out_of_range_rank() {
        assert!(InitOptions::new(4, 4, "h:1").validate().is_err());
        assert!(InitOptions::new(0, 0, "h:1").validate().is_err());
        assert!(InitOptions::new(3, 4, "h:1").validate().is_ok());
    }
}

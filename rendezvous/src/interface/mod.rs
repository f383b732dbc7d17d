//! Which address a rank listens on for its peers (and publishes in the store).
//!
//! By default, the one it reaches the store through: the interface its peers can most
//! likely reach it on too. With `socket_ifname` (`RINGCCL_SOCKET_IFNAME`, NCCL's
//! syntax, see [`InterfaceSpec`]), the first matching interface's address of the store
//! connection's family (IPv4 or IPv6), else of the other family with a warning. A
//! setting that matches none of the host's interfaces is an error naming them, raised
//! before the rank waits for anything ([`check_host`]).
//!
//! - `spec`: parsing the setting and matching a name (pure).
//! - `list`: choosing among the host's addresses, describing them (pure).
//! - `os`: listing the host's addresses (getifaddrs).

mod list;
mod os;
mod spec;

use std::net::{IpAddr, Ipv4Addr};

use tracing::{info, warn};

use crate::SetupError;
use list::Interface;
pub use spec::{InterfaceSpec, InterfaceSpecError};

/// Checks, before start-up waits for anything, that `socket_ifname` (if set) names an
/// interface of this host with an address its peers could reach.
pub(crate) fn check_host(rank: usize, socket_ifname: Option<&str>) -> Result<(), SetupError> {
    let Some(text) = socket_ifname else {
        return Ok(());
    };
    let (spec, interfaces) = host_and_spec(rank, text)?;
    // Either family will do here: the choice of family waits for the store connection.
    let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
    match list::choose(&spec, &interfaces, any) {
        Some(_) => Ok(()),
        None => Err(no_match(rank, text, &interfaces)),
    }
}

/// The address rank `rank` listens on, given the setting `socket_ifname` and the local
/// address of its store connection.
pub(crate) fn listen_ip(
    rank: usize,
    socket_ifname: Option<&str>,
    store_ip: IpAddr,
) -> Result<IpAddr, SetupError> {
    let Some(text) = socket_ifname else {
        return Ok(store_ip);
    };
    let (spec, interfaces) = host_and_spec(rank, text)?;
    let Some(choice) = list::choose(&spec, &interfaces, store_ip) else {
        return Err(no_match(rank, text, &interfaces));
    };
    let (name, addr) = (&choice.interface.name, choice.interface.addr);
    if choice.same_family {
        info!(rank, interface = %name, %addr, spec = text, "listening for peers on the interface RINGCCL_SOCKET_IFNAME names");
    } else {
        warn!(
            rank,
            interface = %name,
            %addr,
            spec = text,
            %store_ip,
            "RINGCCL_SOCKET_IFNAME matches no interface with an address of the rendezvous \
             store connection's family; listening on one of the other family: every peer \
             needs a route to it"
        );
    }
    Ok(addr)
}

/// `text` parsed, and this host's interfaces.
fn host_and_spec(rank: usize, text: &str) -> Result<(InterfaceSpec, Vec<Interface>), SetupError> {
    let spec: InterfaceSpec = text.parse().map_err(|e: InterfaceSpecError| {
        SetupError::InvalidArgument(format!("rank {rank}: RINGCCL_SOCKET_IFNAME={text:?}: {e}"))
    })?;
    let interfaces = os::host_interfaces().map_err(|source| SetupError::Io {
        rank,
        context: format!(
            "listing this host's network interfaces to apply RINGCCL_SOCKET_IFNAME={text:?} \
             (unset it to listen where the rendezvous store is reached)"
        ),
        source,
    })?;
    Ok((spec, interfaces))
}

/// The error of a setting `text` that matches none of `interfaces`.
fn no_match(rank: usize, text: &str, interfaces: &[Interface]) -> SetupError {
    SetupError::NoMatchingInterface {
        rank,
        spec: text.to_string(),
        found: list::describe(interfaces),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_listens_where_the_store_is_reached() {
        let store = IpAddr::V4(Ipv4Addr::new(10, 9, 8, 7));
        assert_eq!(listen_ip(0, None, store).ok(), Some(store));
        assert!(check_host(0, None).is_ok());
    }

    #[test]
    fn a_spec_matching_nothing_names_the_interfaces_found() {
        let store = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let names = os::host_interfaces().expect("getifaddrs");
        for err in [
            listen_ip(2, Some("=no-such-nic"), store).expect_err("matches nothing"),
            check_host(2, Some("=no-such-nic")).expect_err("matches nothing"),
        ] {
            let message = err.to_string();
            assert!(
                matches!(&err, SetupError::NoMatchingInterface { rank: 2, spec, .. } if spec == "=no-such-nic"),
                "{message}"
            );
            assert!(
                message.starts_with(
                    "rank 2: RINGCCL_SOCKET_IFNAME=\"=no-such-nic\" matches no usable network interface; this host has "
                ),
                "{message}"
            );
            if let Some(first) = names.first() {
                assert!(message.contains(&format!("{} (", first.name)), "{message}");
            }
        }
        let err = listen_ip(1, Some("eth0,^lo"), store).expect_err("malformed");
        assert!(matches!(err, SetupError::InvalidArgument(_)), "{err}");
        let err = check_host(1, Some("eth0,^lo")).expect_err("malformed");
        assert!(matches!(err, SetupError::InvalidArgument(_)), "{err}");
    }

    #[test]
    fn the_loopback_interface_can_be_named() {
        let interfaces = os::host_interfaces().expect("getifaddrs");
        let Some(lo) = interfaces
            .iter()
            .find(|i| i.up && i.addr == IpAddr::V4(Ipv4Addr::LOCALHOST))
        else {
            println!("skipped: this host has no loopback interface up at 127.0.0.1");
            return;
        };
        let store = IpAddr::V4(Ipv4Addr::new(10, 9, 8, 7));
        let spec = format!("={}", lo.name);
        assert!(check_host(0, Some(&spec)).is_ok());
        assert_eq!(
            listen_ip(0, Some(&spec), store).ok(),
            Some(IpAddr::V4(Ipv4Addr::LOCALHOST))
        );
    }
}

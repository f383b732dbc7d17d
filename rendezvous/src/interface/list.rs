//! Choosing the address a rank listens on among its host's network interfaces, and
//! describing those interfaces in an error. Pure: the list comes from [`super::os`].

use std::net::IpAddr;

use super::spec::InterfaceSpec;

/// One address of one network interface, in the order the host lists them (for Linux,
/// interface by interface, IPv4 before IPv6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interface {
    /// The interface's name (`eth0`).
    pub(crate) name: String,
    /// One of its addresses.
    pub(crate) addr: IpAddr,
    /// Whether the interface is up (`IFF_UP`).
    pub(crate) up: bool,
}

/// The interface address a rank listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Choice<'a> {
    /// The chosen interface and address.
    pub(crate) interface: &'a Interface,
    /// Whether it is of the store connection's family (IPv4 or IPv6); when it is not,
    /// no matching interface had an address of that family.
    pub(crate) same_family: bool,
}

/// Whether `ip` is IPv4 (an IPv4-mapped IPv6 address counts as IPv4).
fn is_v4(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
    }
}

/// Whether other hosts can reach a listener on this address: the interface is up and
/// the address is a plain unicast one. IPv6 link-local addresses (`fe80::/10`) are
/// left out: another host can only reach them through its own scope id, which a
/// published `address:port` cannot carry.
fn usable(interface: &Interface) -> bool {
    let unicast = !interface.addr.is_unspecified() && !interface.addr.is_multicast();
    let link_local_v6 = match interface.addr {
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
        IpAddr::V4(_) => false,
    };
    interface.up && unicast && !link_local_v6
}

/// The address to listen on among `interfaces`: the first usable one `spec` matches
/// whose family (IPv4 or IPv6) is the store connection's (`store_ip`'s), else the first
/// usable one it matches of the other family; `None` when it matches none. "First" is
/// the host's order, as NCCL takes it: the order of the names in `spec` plays no part.
pub(crate) fn choose<'a>(
    spec: &InterfaceSpec,
    interfaces: &'a [Interface],
    store_ip: IpAddr,
) -> Option<Choice<'a>> {
    let mut candidates = interfaces
        .iter()
        .filter(|i| usable(i) && spec.matches(&i.name));
    let family = is_v4(store_ip);
    let first = candidates.clone().next()?;
    match candidates.find(|i| is_v4(i.addr) == family) {
        Some(interface) => Some(Choice {
            interface,
            same_family: true,
        }),
        None => Some(Choice {
            interface: first,
            same_family: false,
        }),
    }
}

/// The interfaces for a message, each once with its usable addresses:
/// `lo (127.0.0.1, ::1), eth0 (10.0.0.2), eth1 (down)`.
pub(crate) fn describe(interfaces: &[Interface]) -> String {
    let mut names: Vec<&str> = Vec::new();
    for interface in interfaces {
        if !names.contains(&interface.name.as_str()) {
            names.push(&interface.name);
        }
    }
    if names.is_empty() {
        return "no network interface with an IPv4 or IPv6 address".into();
    }
    names
        .iter()
        .map(|&name| {
            let own: Vec<&Interface> = interfaces.iter().filter(|i| i.name == name).collect();
            let addrs: Vec<String> = own
                .iter()
                .filter(|i| usable(i))
                .map(|i| i.addr.to_string())
                .collect();
            let what = if !addrs.is_empty() {
                addrs.join(", ")
            } else if own.iter().any(|i| !i.up) {
                "down".to_string()
            } else {
                "no address other hosts can reach".to_string()
            };
            format!("{name} ({what})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(name: &str, addr: &str) -> Interface {
        Interface {
            name: name.into(),
            addr: addr.parse().expect("test address"),
            up: true,
        }
    }

    fn host() -> Vec<Interface> {
        vec![
            at("lo", "127.0.0.1"),
            at("eth0", "10.0.0.2"),
            at("eth1", "10.1.0.2"),
            at("lo", "::1"),
            at("eth0", "fe80::1"),
            at("eth1", "fd00::2"),
            at("ib0", "fe80::5"),
            at("v6only", "fd00::9"),
        ]
    }

    fn chosen(spec: &str, interfaces: &[Interface], store: &str) -> Option<(String, bool)> {
        let spec: InterfaceSpec = spec.parse().expect("test spec");
        choose(&spec, interfaces, store.parse().expect("store ip"))
            .map(|c| (c.interface.addr.to_string(), c.same_family))
    }

    fn some(addr: &str, same_family: bool) -> Option<(String, bool)> {
        Some((addr.to_string(), same_family))
    }

    #[test]
    fn the_first_match_of_the_store_family_wins() {
        let host = host();
        assert_eq!(chosen("eth", &host, "10.0.0.1"), some("10.0.0.2", true));
        assert_eq!(chosen("eth1", &host, "10.0.0.1"), some("10.1.0.2", true));
        assert_eq!(chosen("eth", &host, "fd00::1"), some("fd00::2", true));
        // The host's order, not the spec's, decides among several matches.
        assert_eq!(
            chosen("eth1,eth0", &host, "10.0.0.1"),
            some("10.0.0.2", true)
        );
        assert_eq!(
            chosen("^lo,eth0", &host, "10.0.0.1"),
            some("10.1.0.2", true)
        );
        assert_eq!(chosen("=lo", &host, "::1"), some("::1", true));
        // An IPv4-mapped store address counts as IPv4.
        assert_eq!(
            chosen("eth", &host, "::ffff:10.0.0.1"),
            some("10.0.0.2", true)
        );
    }

    #[test]
    fn another_family_is_taken_only_when_the_store_family_has_no_match() {
        let host = host();
        assert_eq!(chosen("v6only", &host, "10.0.0.1"), some("fd00::9", false));
        let v4_only = vec![at("eth0", "10.0.0.2")];
        assert_eq!(chosen("eth", &v4_only, "fd00::1"), some("10.0.0.2", false));
    }

    #[test]
    fn unusable_addresses_and_down_interfaces_are_skipped() {
        let mut host = host();
        // ib0 has only a link-local IPv6 address: unreachable by its peers.
        assert_eq!(chosen("ib", &host, "10.0.0.1"), None);
        for i in host.iter_mut().filter(|i| i.name == "eth1") {
            i.up = false;
        }
        assert_eq!(chosen("eth1", &host, "10.0.0.1"), None);
        assert_eq!(chosen("eth", &host, "fd00::1"), some("10.0.0.2", false));
        assert_eq!(chosen("^lo,eth,v6", &host, "10.0.0.1"), None);
    }

    #[test]
    fn nothing_matches_nothing() {
        assert_eq!(chosen("eth", &[], "10.0.0.1"), None);
        assert_eq!(chosen("=eth", &host(), "10.0.0.1"), None);
    }

    #[test]
    fn the_description_names_each_interface_once_with_its_addresses() {
        let mut host = host();
        host.push(Interface {
            up: false,
            ..at("eth2", "10.2.0.2")
        });
        assert_eq!(
            describe(&host),
            "lo (127.0.0.1, ::1), eth0 (10.0.0.2), eth1 (10.1.0.2, fd00::2), \
             ib0 (no address other hosts can reach), v6only (fd00::9), eth2 (down)"
        );
        assert_eq!(
            describe(&[]),
            "no network interface with an IPv4 or IPv6 address"
        );
    }
}

//! The host's network interfaces and their IPv4 and IPv6 addresses, from getifaddrs(3).

// getifaddrs(3) is an FFI call returning a C linked list: the blocks below walk it and
// copy out the names and addresses; the list is freed once, by `IfAddrs`'s drop.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::list::Interface;

/// The list getifaddrs(3) allocated, freed with freeifaddrs(3) when dropped (on every
/// path out, early returns and panics included).
struct IfAddrs(*mut libc::ifaddrs);

impl Drop for IfAddrs {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the pointer came from a successful getifaddrs call and is freed
            // only here, once; nothing borrowed from the list outlives `self`.
            unsafe { libc::freeifaddrs(self.0) };
        }
    }
}

/// Every IPv4 and IPv6 address of every interface of this host, in the host's order.
pub(crate) fn host_interfaces() -> io::Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs only writes the head of a list it allocates into `head`, a
    // valid local; on success the list is owned by `list` below, which frees it.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let list = IfAddrs(head);
    let mut found = Vec::new();
    let mut cursor = list.0;
    while !cursor.is_null() {
        // SAFETY: `cursor` is a non-null node of the list getifaddrs returned, which
        // stays allocated until `list` is dropped after this loop; it is only read.
        let entry = unsafe { &*cursor };
        if let Some(interface) = read_entry(entry) {
            found.push(interface);
        }
        cursor = entry.ifa_next;
    }
    drop(list);
    Ok(found)
}

/// The name and address of one node of the list, if it carries an IPv4 or IPv6 address.
fn read_entry(entry: &libc::ifaddrs) -> Option<Interface> {
    if entry.ifa_name.is_null() || entry.ifa_addr.is_null() {
        return None;
    }
    // SAFETY: ifa_name is non-null and points at the NUL-terminated name getifaddrs
    // stored in the list, alive while `entry` is borrowed.
    let name = unsafe { CStr::from_ptr(entry.ifa_name) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: ifa_addr is non-null and points at a socket address in the list, whose
    // first field is the family; read unaligned (a copy), so no alignment is assumed.
    let family =
        unsafe { std::ptr::read_unaligned(std::ptr::addr_of!((*entry.ifa_addr).sa_family)) };
    let addr = match i32::from(family) {
        libc::AF_INET => {
            // SAFETY: an address of family AF_INET is a whole `sockaddr_in`; read
            // unaligned (a copy), so the pointer's alignment does not matter.
            let v4 =
                unsafe { std::ptr::read_unaligned(entry.ifa_addr.cast::<libc::sockaddr_in>()) };
            IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr)))
        }
        libc::AF_INET6 => {
            // SAFETY: an address of family AF_INET6 is a whole `sockaddr_in6`; read
            // unaligned (a copy), so the pointer's alignment does not matter.
            let v6 =
                unsafe { std::ptr::read_unaligned(entry.ifa_addr.cast::<libc::sockaddr_in6>()) };
            IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr))
        }
        _ => return None,
    };
    Some(Interface {
        name,
        addr,
        up: entry.ifa_flags & (libc::IFF_UP as libc::c_uint) != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_this_hosts_addresses() {
        let interfaces = host_interfaces().expect("getifaddrs");
        assert!(
            interfaces.iter().all(|i| !i.name.is_empty()),
            "{interfaces:?}"
        );
        // Every address listed on an interface that is up is one this process can
        // listen on (IPv6 link-local ones need a scope id, and are never chosen).
        for interface in interfaces.iter().filter(|i| i.up) {
            if let IpAddr::V6(v6) = interface.addr {
                if (v6.segments()[0] & 0xffc0) == 0xfe80 {
                    continue;
                }
            }
            let bound = std::net::TcpListener::bind((interface.addr, 0));
            assert!(bound.is_ok(), "{interface:?}: {bound:?}");
        }
        // The kernel's own list of IPv6 addresses (per network namespace) agrees.
        let proc = std::fs::read_to_string("/proc/net/if_inet6").unwrap_or_default();
        for line in proc.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(hex), Some(name)) = (fields.first(), fields.last()) else {
                continue;
            };
            let Ok(bits) = u128::from_str_radix(hex, 16) else {
                continue;
            };
            let addr = IpAddr::V6(Ipv6Addr::from(bits));
            assert!(
                interfaces.iter().any(|i| i.addr == addr && i.name == *name),
                "{name} {addr} is missing from {interfaces:?}"
            );
        }
    }
}

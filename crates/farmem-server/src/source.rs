//! Where a connection comes from, as the limits per address see it: an IPv4 address, or the
//! /64 prefix of an IPv6 address (a host usually owns a whole /64, so a limit per IPv6
//! address would limit nothing).

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Source(IpAddr);

impl Source {
    pub(crate) fn of(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(v4) => Source(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                // A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d.
                Some(v4) => Source(IpAddr::V4(v4)),
                None => {
                    let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                    Source(IpAddr::V6(Ipv6Addr::from(prefix)))
                }
            },
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(a) => write!(f, "{a}"),
            IpAddr::V6(a) => write!(f, "{a}/64"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_hosts_count_by_their_64_bit_prefix() {
        let a = Source::of("2001:db8:1:2:aaaa::1".parse().unwrap());
        let b = Source::of("2001:db8:1:2:bbbb::9".parse().unwrap());
        let c = Source::of("2001:db8:1:3::1".parse().unwrap());
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.to_string(), "2001:db8:1:2::/64");
        let v4 = Source::of("10.1.2.3".parse().unwrap());
        assert_eq!(Source::of("::ffff:10.1.2.3".parse().unwrap()), v4);
        assert_eq!(v4.to_string(), "10.1.2.3");
        assert_ne!(v4, Source::of("10.1.2.4".parse().unwrap()));
    }
}

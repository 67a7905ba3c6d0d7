//! Which addresses the proxy connects to: public unicast ones; internal ones (loopback,
//! private, link-local, shared, documentation, the host's own, ...) only for a name an operator
//! opted in, or through a range an operator named that lies within their block; multicast,
//! broadcast and unspecified ones never.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// What kind of address it is, for the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Global unicast.
    Public,
    /// Reachable on purpose only: loopback, private, link-local, ... (the words say which).
    Internal(&'static str),
    /// Never a destination: unspecified, multicast, broadcast.
    Never(&'static str),
}

/// An address's class and the special-purpose block it lies in (the address itself for a
/// public one, for one of the host's own, or for an unallocated IPv6 one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classified {
    pub class: Class,
    pub block: IpNet,
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8, class: Class) -> (Ipv4Addr, u8, Class) {
    (Ipv4Addr::new(a, b, c, d), len, class)
}

/// IANA's IPv4 special-purpose registry, as the proxy treats it.
#[rustfmt::skip]
const V4_BLOCKS: [(Ipv4Addr, u8, Class); 16] = [
    v4(0, 0, 0, 0, 8, Class::Never("unspecified (\"this network\")")),
    v4(10, 0, 0, 0, 8, Class::Internal("private")),
    v4(100, 64, 0, 0, 10, Class::Internal("shared (carrier-grade NAT)")),
    v4(127, 0, 0, 0, 8, Class::Internal("loopback")),
    v4(169, 254, 0, 0, 16, Class::Internal("link-local")),
    v4(172, 16, 0, 0, 12, Class::Internal("private")),
    v4(192, 0, 0, 0, 24, Class::Internal("reserved for protocols")),
    v4(192, 0, 2, 0, 24, Class::Internal("documentation")),
    v4(192, 88, 99, 0, 24, Class::Internal("6to4 relay")),
    v4(192, 168, 0, 0, 16, Class::Internal("private")),
    v4(198, 18, 0, 0, 15, Class::Internal("benchmarking")),
    v4(198, 51, 100, 0, 24, Class::Internal("documentation")),
    v4(203, 0, 113, 0, 24, Class::Internal("documentation")),
    v4(224, 0, 0, 0, 4, Class::Never("multicast")),
    v4(240, 0, 0, 0, 4, Class::Internal("reserved")),
    v4(255, 255, 255, 255, 32, Class::Never("broadcast")),
];

const fn v6(segments: [u16; 8], len: u8, class: Class) -> (Ipv6Addr, u8, Class) {
    let [a, b, c, d, e, f, g, h] = segments;
    (Ipv6Addr::new(a, b, c, d, e, f, g, h), len, class)
}

/// IANA's IPv6 special-purpose registry, as the proxy treats it; the forms that embed an IPv4
/// address (mapped, NAT64, 6to4) are classified by that address instead.
#[rustfmt::skip]
const V6_BLOCKS: [(Ipv6Addr, u8, Class); 13] = [
    v6([0; 8], 128, Class::Never("unspecified")),
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128, Class::Internal("loopback")),
    v6([0; 8], 96, Class::Internal("IPv4-compatible")),
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, Class::Internal("local NAT64")),
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64, Class::Internal("discard")),
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, Class::Internal("reserved for protocols")),
    v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, Class::Internal("documentation")),
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, Class::Internal("documentation")),
    v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16, Class::Internal("segment routing")),
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, Class::Internal("unique local (private)")),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, Class::Internal("link-local")),
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, Class::Internal("site-local")),
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, Class::Never("multicast")),
];

/// The most specific block of `blocks` that holds `ip`.
fn most_specific<A: Copy, N: Copy>(
    blocks: &[(A, u8, Class)],
    make: impl Fn(A, u8) -> N,
    holds: impl Fn(&N) -> bool,
) -> Option<(N, u8, Class)> {
    blocks
        .iter()
        .map(|&(addr, len, class)| (make(addr, len), len, class))
        .filter(|(net, _, _)| holds(net))
        .max_by_key(|&(_, len, _)| len)
}

fn classify_v4(ip: Ipv4Addr) -> (Class, Ipv4Net) {
    let net = |a, l| Ipv4Net::new(a, l).expect("valid prefix");
    match most_specific(&V4_BLOCKS, net, |n| n.contains(&ip)) {
        Some((block, _, class)) => (class, block),
        None => (Class::Public, Ipv4Net::from(ip)),
    }
}

/// An IPv6 block that embeds the IPv4 block `inner` at bit `offset` of `prefix`.
fn embedded(prefix: Ipv6Net, offset: u8, inner: Ipv4Net) -> Ipv6Net {
    let bits = u128::from(u32::from(inner.network())) << (128 - offset - 32);
    let addr = Ipv6Addr::from(u128::from(prefix.network()) | bits);
    Ipv6Net::new(addr, offset + inner.prefix_len()).expect("valid prefix")
}

fn classify_v6(ip: Ipv6Addr) -> (Class, Ipv6Net) {
    let bits = u128::from(ip);
    let net = |a, l| Ipv6Net::new(a, l).expect("valid prefix");
    // Forms that carry an IPv4 address: where they lead is where that address leads.
    let forms = [
        // ::ffff:a.b.c.d (mapped): the socket connects to a.b.c.d.
        (net(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96), 96),
        // 64:ff9b::a.b.c.d (NAT64): a translator connects to a.b.c.d.
        (net(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96), 96),
        // 2002:AABB:CCDD::/48 (6to4): a relay sends to a.b.c.d.
        (net(Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16), 16),
    ];
    for (prefix, offset) in forms {
        if prefix.contains(&ip) {
            let inner = Ipv4Addr::from((bits >> (128 - offset - 32)) as u32);
            let (class, block) = classify_v4(inner);
            return match class {
                Class::Public => (Class::Public, Ipv6Net::from(ip)),
                other => (other, embedded(prefix, offset, block)),
            };
        }
    }
    match most_specific(&V6_BLOCKS, net, |n| n.contains(&ip)) {
        Some((block, _, class)) => (class, block),
        // Outside 2000::/3 nothing is allocated for unicast; those addresses are no one
        // block, so each is its own.
        None if bits >> 125 != 0b001 => (Class::Internal("not global unicast"), Ipv6Net::from(ip)),
        None => (Class::Public, Ipv6Net::from(ip)),
    }
}

fn with_net<N>((class, block): (Class, N), net: impl Fn(N) -> IpNet) -> (Class, IpNet) {
    (class, net(block))
}

/// The class of `ip` and its block; an address of the host itself (`own`) is internal.
pub fn classify(ip: IpAddr, own: &[IpAddr]) -> Classified {
    let (class, block) = match ip {
        IpAddr::V4(a) => with_net(classify_v4(a), IpNet::V4),
        IpAddr::V6(a) => with_net(classify_v6(a), IpNet::V6),
    };
    if class == Class::Public && own.iter().any(|o| same_address(*o, ip)) {
        return Classified {
            class: Class::Internal("one of the host's own addresses"),
            block: IpNet::from(ip),
        };
    }
    Classified { class, block }
}

/// Whether two addresses name the same host address (an IPv4-mapped IPv6 address is its IPv4
/// address).
fn same_address(a: IpAddr, b: IpAddr) -> bool {
    canonical(a) == canonical(b)
}

/// `ip` with an IPv4-mapped IPv6 address turned into its IPv4 address.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// The addresses of the host's interfaces, now (they can change while a sandbox runs).
pub fn host_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|a| {
            let sa = a.address?;
            if let Some(v4) = sa.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                sa.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect()
}

/// Why an address is not connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused(pub &'static str);

/// A public address is connected to; an internal one when `internal_ok`; the others never.
fn admit(class: Class, internal_ok: bool) -> Result<(), Refused> {
    match class {
        Class::Public => Ok(()),
        Class::Internal(_) if internal_ok => Ok(()),
        Class::Internal(what) | Class::Never(what) => Err(Refused(what)),
    }
}

/// Whether the proxy connects to `ip`, resolved from a name: public addresses; internal ones
/// when the name is opted in (`allow_internal`); never the others.
pub fn vet_resolved(ip: IpAddr, allow_internal: bool, own: &[IpAddr]) -> Result<(), Refused> {
    admit(classify(ip, own).class, allow_internal)
}

/// Whether the range `net` names internal addresses on purpose: it lies within one internal
/// block (`127.0.0.1/32`, `10.0.0.0/8`, `[fd00::/8]`; not `0.0.0.0/0`, nor `::/0`), or it is one
/// address alone (which may be one of the host's own, a set that changes while a sandbox runs).
pub fn names_internal_addresses(net: &IpNet) -> bool {
    let c = classify(net.network(), &[]);
    net.prefix_len() == net.max_prefix_len()
        || matches!(c.class, Class::Internal(_)) && c.block.contains(net)
}

/// Whether the proxy connects to the address literal `ip` that the CIDR rule `rule` holds,
/// given the ranges its operator opted in to (`opted_in`): a public address; an internal one
/// only when the rule lies within its block AND an opted-in range that lies within its block
/// holds it (the operator named that range; a client's rule never widens that, and
/// `0.0.0.0/0` holds no internal address); one of the host's own only when both name that
/// address alone; the others never.
pub fn vet_literal(
    ip: IpAddr,
    rule: &IpNet,
    opted_in: &[IpNet],
    own: &[IpAddr],
) -> Result<(), Refused> {
    let c = classify(ip, own);
    let named = |net: &IpNet| c.block.contains(net) && net.contains(&ip);
    admit(c.class, named(rule) && opted_in.iter().any(named))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn class(s: &str) -> Class {
        classify(s.parse().unwrap(), &[]).class
    }

    #[test]
    fn special_addresses_are_internal_or_never() {
        for public in ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "64:ff9b::808:808"] {
            assert_eq!(class(public), Class::Public, "{public}");
        }
        for (ip, want) in [
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "shared (carrier-grade NAT)"),
            ("169.254.169.254", "link-local"),
            ("203.0.113.80", "documentation"),
            ("198.18.0.1", "benchmarking"),
            ("240.0.0.1", "reserved"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("64:ff9b::a00:1", "private"),
            ("64:ff9b::7f00:1", "loopback"),
            ("2002:7f00:1::", "loopback"),
            ("2002:a9fe:a9fe::1", "link-local"),
            ("::127.0.0.1", "IPv4-compatible"),
            ("fd00::1", "unique local (private)"),
            ("fe80::1", "link-local"),
            ("2001:db8::1", "documentation"),
            ("2001::1", "reserved for protocols"),
            ("::2", "IPv4-compatible"),
            ("4000::1", "not global unicast"),
        ] {
            assert_eq!(class(ip), Class::Internal(want), "{ip}");
        }
        for (ip, want) in [
            ("0.0.0.0", "unspecified (\"this network\")"),
            ("0.1.2.3", "unspecified (\"this network\")"),
            ("255.255.255.255", "broadcast"),
            ("224.0.0.1", "multicast"),
            ("::", "unspecified"),
            ("ff02::1", "multicast"),
            ("::ffff:0.0.0.0", "unspecified (\"this network\")"),
            ("::ffff:255.255.255.255", "broadcast"),
        ] {
            assert_eq!(class(ip), Class::Never(want), "{ip}");
        }
        let own: IpAddr = "8.8.4.4".parse().unwrap();
        assert_eq!(
            classify("::ffff:8.8.4.4".parse().unwrap(), &[own]).class,
            Class::Internal("one of the host's own addresses")
        );
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    /// `vet_literal` with these opted-in ranges.
    fn vet(addr: &str, rule: &str, opted_in: &[&str], own: &[IpAddr]) -> Result<(), Refused> {
        let opted_in: Vec<IpNet> = opted_in.iter().map(|o| net(o)).collect();
        vet_literal(ip(addr), &net(rule), &opted_in, own)
    }

    #[test]
    fn literals_pass_only_rules_that_name_their_block_within_an_operators_opt_in() {
        // The rule and an opt-in of the operator must both lie within the block.
        assert!(vet("10.1.2.3", "10.1.0.0/16", &["10.0.0.0/8"], &[]).is_ok());
        assert!(vet("10.1.2.3", "10.1.0.0/16", &["10.1.2.0/24"], &[]).is_ok());
        assert!(vet("10.1.2.3", "10.1.0.0/16", &["10.2.0.0/16"], &[]).is_err());
        assert!(vet("10.1.2.3", "10.1.0.0/16", &["0.0.0.0/0"], &[]).is_err());
        assert!(vet("10.1.2.3", "10.1.0.0/16", &[], &[]).is_err());
        assert!(vet("10.1.2.3", "0.0.0.0/0", &["10.0.0.0/8"], &[]).is_err());
        assert!(vet("127.0.0.1", "0.0.0.0/0", &["0.0.0.0/0"], &[]).is_err());
        assert!(vet("127.0.0.1", "127.0.0.1/32", &["127.0.0.1/32"], &[]).is_ok());
        assert!(vet("127.0.0.1", "127.0.0.1/32", &[], &[]).is_err());
        assert!(vet("169.254.169.254", "169.254.169.254/32", &["0.0.0.0/0"], &[]).is_err());
        assert!(vet("8.8.8.8", "0.0.0.0/0", &[], &[]).is_ok());
        assert!(vet("224.0.0.1", "224.0.0.0/4", &["224.0.0.0/4"], &[]).is_err());
        // IPv6, and the forms that embed an IPv4 address.
        assert!(vet("::1", "::1/128", &["::/0"], &[]).is_err());
        assert!(vet("::1", "::1/128", &["::1/128"], &[]).is_ok());
        assert!(vet("fd00::1", "fd00::/16", &["fc00::/7"], &[]).is_ok());
        assert!(vet("::ffff:10.0.0.1", "::ffff:10.0.0.0/104", &["::/0"], &[]).is_err());
        assert!(vet(
            "::ffff:10.0.0.1",
            "::ffff:10.0.0.0/104",
            &["::ffff:10.0.0.0/104"],
            &[]
        )
        .is_ok());
        assert!(vet("::ffff:10.0.0.1", "::/0", &["::ffff:10.0.0.0/104"], &[]).is_err());
        assert!(vet("64:ff9b::7f00:1", "64:ff9b::7f00:0/104", &["::/0"], &[]).is_err());
        // The host's own address only when both name it alone.
        let own = [ip("8.8.4.4")];
        assert!(vet("8.8.4.4", "8.8.0.0/16", &["8.8.0.0/16"], &own).is_err());
        assert!(vet("8.8.4.4", "8.8.4.4/32", &["8.8.0.0/16"], &own).is_err());
        assert!(vet("8.8.4.4", "8.8.4.4/32", &["8.8.4.4/32"], &own).is_ok());
        assert!(vet_resolved(ip("10.0.0.1"), false, &[]).is_err());
        assert!(vet_resolved(ip("10.0.0.1"), true, &[]).is_ok());
        assert!(vet_resolved(ip("0.0.0.0"), true, &[]).is_err());
        assert!(vet_resolved(ip("8.8.8.8"), false, &[]).is_ok());
    }

    /// Nothing outside 2000::/3 is allocated for unicast, and those addresses form no block
    /// of their own: each is reported as itself (a /128), never as `::/0`, so only a range
    /// of that address alone names it on purpose.
    #[test]
    fn an_unallocated_v6_address_is_its_own_block() {
        let got = classify(ip("4000::1"), &[]);
        assert_eq!(got.class, Class::Internal("not global unicast"));
        assert_eq!(got.block, net("4000::1/128"));
        assert!(!names_internal_addresses(&net("4000::/2")));
        assert!(!names_internal_addresses(&net("c000::/2")));
        assert!(vet_literal(ip("4000::1"), &net("4000::/2"), &[net("4000::/2")], &[]).is_err());
        assert!(vet_literal(
            ip("4000::1"),
            &net("4000::1/128"),
            &[net("4000::1/128")],
            &[]
        )
        .is_ok());
    }

    #[test]
    fn ranges_name_internal_addresses_within_one_block_or_alone() {
        for named in [
            "10.0.0.0/8",
            "10.1.0.0/16",
            "127.0.0.1/32",
            "169.254.169.254/32",
            "100.64.0.0/10",
            "::1/128",
            "fd00::/8",
            "::ffff:127.0.0.0/104",
            "8.8.4.4/32",
        ] {
            assert!(names_internal_addresses(&net(named)), "{named}");
        }
        for not in [
            "0.0.0.0/0",
            "::/0",
            "8.0.0.0/8",
            "0.0.0.0/1",
            "2000::/3",
            "::/1",
        ] {
            assert!(!names_internal_addresses(&net(not)), "{not}");
        }
    }

    #[test]
    fn the_host_has_addresses() {
        assert!(host_addresses().iter().any(IpAddr::is_loopback));
    }

    proptest! {
        /// An IPv4 address and its mapped, NAT64 and 6to4 forms are one class, and an internal
        /// one's block holds the address.
        #[test]
        fn embedded_forms_take_the_class_of_their_ipv4_address(raw: u32) {
            let a = Ipv4Addr::from(raw);
            let want = classify(IpAddr::V4(a), &[]);
            let o = a.octets();
            let nat64 = Ipv6Addr::from((0x64_u128 << 112) | (0xff9b_u128 << 96) | u128::from(raw));
            let sixtofour = Ipv6Addr::from((0x2002_u128 << 112) | (u128::from(raw) << 80));
            for form in [IpAddr::V6(a.to_ipv6_mapped()), IpAddr::V6(nat64), IpAddr::V6(sixtofour)] {
                let got = classify(form, &[]);
                prop_assert_eq!(got.class, want.class, "{} {:?}", form, o);
                prop_assert!(got.block.contains(&form));
            }
            prop_assert!(want.block.contains(&IpAddr::V4(a)));
        }

        /// What std calls private, loopback, link-local, multicast, broadcast, documentation
        /// or unspecified is never public here.
        #[test]
        fn std_special_addresses_are_not_public(raw: u32) {
            let a = Ipv4Addr::from(raw);
            let special = a.is_private() || a.is_loopback() || a.is_link_local()
                || a.is_multicast() || a.is_broadcast() || a.is_documentation()
                || a.is_unspecified();
            if special {
                prop_assert_ne!(classify(IpAddr::V4(a), &[]).class, Class::Public);
            }
        }

        #[test]
        fn ipv6_special_addresses_are_not_public(raw: u128) {
            let a = Ipv6Addr::from(raw);
            let special = a.is_loopback() || a.is_unspecified() || a.is_multicast()
                || a.is_unique_local() || a.is_unicast_link_local();
            if special {
                prop_assert_ne!(classify(IpAddr::V6(a), &[]).class, Class::Public);
            }
        }
    }
}

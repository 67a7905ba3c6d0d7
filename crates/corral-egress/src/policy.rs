//! What a sandbox may reach through its egress proxy ([`NetworkPolicy`]), the one validator of
//! it, and the decision on a name or an address literal (docs/network.md).
//!
//! A policy is built from items in one syntax wherever it comes from (`corral run --net
//! allow:ITEM,ITEM`, a policy file, the API's `network` object, the server's `[network]`
//! settings): `NAME[:PORT]`, `*.SUFFIX[:PORT]`, `CIDR[:PORT]` (`[IPv6-CIDR]:PORT` with a port).
//! Without a port an item allows 80 and 443; the same name given with several ports allows
//! each of them.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::address::names_internal_addresses;

/// The ports an item allows when it names none.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];
/// Most host rules and CIDR rules in one policy (the proxy matches them one by one).
pub const MAX_HOST_RULES: usize = 256;
pub const MAX_CIDR_RULES: usize = 64;
/// Longest host name (RFC 1035, without the trailing dot) and label.
const MAX_NAME: usize = 253;
const MAX_LABEL: usize = 63;

/// What a sandbox's code may reach besides its own loopback.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NetworkPolicy {
    /// Its own loopback and nothing else: no proxy endpoint, no resolver.
    #[default]
    None,
    /// Connections through the host's proxy to these names and address ranges, and nothing
    /// else.
    Allow {
        hosts: Vec<HostRule>,
        cidrs: Vec<CidrRule>,
        /// Names whose addresses may be internal ones (loopback, private, link-local, the
        /// host's own, ...): an operator's opt-in, never a client's.
        private_hosts: Vec<HostPattern>,
        /// Address ranges whose internal addresses may be reached, on their ports: those of its
        /// operator's range rules that lie within one internal block, or name one address alone
        /// (which may be the host's own). An operator's opt-in, never a client's: a client's
        /// rule reaches an internal address only when one of these holds it, on that port, too
        /// ([`crate::address::vet_literal`]).
        private_ranges: Vec<CidrRule>,
    },
}

/// A host name, or every name below a suffix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Exactly this name (lowercase ASCII, no trailing dot).
    Exact(String),
    /// `*.SUFFIX`: any name ending in `.SUFFIX`, not `SUFFIX` itself.
    Suffix(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRule {
    pub pattern: HostPattern,
    /// Sorted, without duplicates, never empty.
    pub ports: Vec<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidrRule {
    /// Its host bits are zero.
    pub net: IpNet,
    /// Sorted, without duplicates, never empty.
    pub ports: Vec<u16>,
}

/// A policy item that is not valid; the message names the item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("{item:?} is not a valid host name ({why})")]
    InvalidName { item: String, why: &'static str },
    #[error("{item:?} has an invalid port (ports are 1 to 65535)")]
    InvalidPort { item: String },
    #[error("{item:?} is not a valid address range ({why})")]
    InvalidCidr { item: String, why: String },
    #[error("{item:?} is an address: list it as a CIDR rule ({item}/32 or {item}/128)")]
    AddressAsName { item: String },
    #[error("{item:?} is a host name, not an address range")]
    NameAsCidr { item: String },
    #[error("too many {what} (at most {max})")]
    TooMany { what: &'static str, max: usize },
    #[error("{name:?} may resolve to internal addresses but is not on the allow-list")]
    PrivateNotAllowed { name: String },
}

/// One item as written: a name rule or an address rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Host(HostRule),
    Cidr(CidrRule),
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(name) => f.write_str(name),
            HostPattern::Suffix(suffix) => write!(f, "*.{suffix}"),
        }
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.pattern, show_ports(&self.ports))
    }
}

impl fmt::Display for CidrRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.net {
            IpNet::V6(_) => write!(f, "[{}]:{}", self.net, show_ports(&self.ports)),
            IpNet::V4(_) => write!(f, "{}:{}", self.net, show_ports(&self.ports)),
        }
    }
}

fn show_ports(ports: &[u16]) -> String {
    ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join("+")
}

/// A host name as the proxy compares it: ASCII only (IDNA names in their `xn--` form), one
/// trailing dot dropped, lowercased; labels of letters, digits, `-` and `_`, 1 to 63 long, not
/// starting or ending with `-`; at most 253 long. A name whose last label starts with a digit
/// is an address in some notation (`127.1`, `0x7f.1`, `2130706433`): never a name.
pub fn normalize_name(name: &str) -> Result<String, &'static str> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return Err("empty");
    }
    if !name.is_ascii() {
        return Err("not ASCII: write an internationalized name in its xn-- form");
    }
    if name.len() > MAX_NAME {
        return Err("longer than 253 characters");
    }
    let name = name.to_ascii_lowercase();
    for label in name.split('.') {
        if label.is_empty() || label.len() > MAX_LABEL {
            return Err("a label is empty or longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("only letters, digits, '-' and '_' may appear in a label");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label starts or ends with '-'");
        }
    }
    let last = name.rsplit('.').next().unwrap_or_default();
    if last.as_bytes()[0].is_ascii_digit() {
        return Err("it is an address, or its last label starts with a digit");
    }
    Ok(name)
}

impl HostPattern {
    /// `NAME` or `*.SUFFIX`.
    pub fn parse(text: &str) -> Result<HostPattern, PolicyError> {
        let invalid = |why| PolicyError::InvalidName {
            item: text.to_string(),
            why,
        };
        if let Some(suffix) = text.strip_prefix("*.") {
            return normalize_name(suffix)
                .map(HostPattern::Suffix)
                .map_err(invalid);
        }
        if text.contains('*') {
            return Err(invalid(
                "a wildcard is only allowed as a whole first label, `*.`",
            ));
        }
        if text.parse::<IpAddr>().is_ok() {
            return Err(PolicyError::AddressAsName {
                item: text.to_string(),
            });
        }
        normalize_name(text)
            .map(HostPattern::Exact)
            .map_err(invalid)
    }

    /// Whether `name` (normalized) matches.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            HostPattern::Exact(exact) => name == exact,
            HostPattern::Suffix(suffix) => name
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        }
    }

    /// Whether every name `other` matches, this matches too.
    pub fn covers(&self, other: &HostPattern) -> bool {
        match (self, other) {
            (_, HostPattern::Exact(name)) => self.matches(name),
            (HostPattern::Suffix(mine), HostPattern::Suffix(theirs)) => {
                mine == theirs || HostPattern::Suffix(mine.clone()).matches(theirs)
            }
            (HostPattern::Exact(_), HostPattern::Suffix(_)) => false,
        }
    }
}

/// Parses `PORT` of an item.
fn parse_port(item: &str, port: &str) -> Result<u16, PolicyError> {
    match port.parse::<u16>() {
        Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(PolicyError::InvalidPort {
            item: item.to_string(),
        }),
    }
}

/// An address or a CIDR range (an address is its own /32 or /128), host bits cleared.
fn parse_net(item: &str, text: &str) -> Result<Option<IpNet>, PolicyError> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(Some(IpNet::from(ip)));
    }
    match text.parse::<IpNet>() {
        Ok(net) => Ok(Some(net.trunc())),
        Err(e) if text.contains('/') => Err(PolicyError::InvalidCidr {
            item: item.to_string(),
            why: e.to_string(),
        }),
        Err(_) => Ok(None),
    }
}

impl Item {
    /// One item: `NAME[:PORT]`, `*.SUFFIX[:PORT]`, `CIDR[:PORT]`, `[IPv6-CIDR][:PORT]`.
    pub fn parse(item: &str) -> Result<Item, PolicyError> {
        let item = item.trim();
        let ports = |port: Option<&str>| -> Result<Vec<u16>, PolicyError> {
            match port {
                None => Ok(DEFAULT_PORTS.to_vec()),
                Some(p) => Ok(vec![parse_port(item, p)?]),
            }
        };
        // [IPv6 or IPv6 CIDR], optionally followed by :PORT.
        if let Some(rest) = item.strip_prefix('[') {
            let (inside, after) = rest.split_once(']').ok_or(PolicyError::InvalidCidr {
                item: item.to_string(),
                why: "no closing ']'".into(),
            })?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or(PolicyError::InvalidCidr {
                    item: item.to_string(),
                    why: "expected :PORT after ']'".into(),
                })?),
            };
            let net = parse_net(item, inside)?.ok_or(PolicyError::InvalidCidr {
                item: item.to_string(),
                why: "not an IPv6 address".into(),
            })?;
            return Ok(Item::Cidr(CidrRule {
                net,
                ports: ports(port)?,
            }));
        }
        // A whole IPv6 address or range, which has colons of its own.
        if item.matches(':').count() > 1 {
            return match parse_net(item, item)? {
                Some(net) => Ok(Item::Cidr(CidrRule {
                    net,
                    ports: ports(None)?,
                })),
                None => Err(PolicyError::InvalidCidr {
                    item: item.to_string(),
                    why: "write an IPv6 range with a port as [RANGE]:PORT".into(),
                }),
            };
        }
        let (host, port) = match item.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (item, None),
        };
        let ports = ports(port)?;
        if let Some(net) = parse_net(item, host)? {
            return Ok(Item::Cidr(CidrRule { net, ports }));
        }
        Ok(Item::Host(HostRule {
            pattern: HostPattern::parse(host)?,
            ports,
        }))
    }
}

/// Adds `ports` to the rule with `key` in `rules`, or appends a new one.
fn merge<K: PartialEq, R>(
    rules: &mut Vec<R>,
    key: K,
    ports: Vec<u16>,
    key_of: impl Fn(&R) -> &K,
    ports_of: impl Fn(&mut R) -> &mut Vec<u16>,
    make: impl FnOnce(K, Vec<u16>) -> R,
) {
    match rules.iter_mut().find(|r| key_of(r) == &key) {
        Some(rule) => {
            let all = ports_of(rule);
            all.extend(ports);
            all.sort_unstable();
            all.dedup();
        }
        None => {
            let mut ports = ports;
            ports.sort_unstable();
            ports.dedup();
            rules.push(make(key, ports));
        }
    }
}

impl NetworkPolicy {
    /// The policy of these items (names, address ranges) and of `private_hosts`, the names an
    /// operator lets resolve to internal addresses: the one validator of every policy. Each
    /// `private_hosts` pattern must be covered by a name rule. An empty list of items is
    /// [`NetworkPolicy::None`].
    pub fn from_items<S: AsRef<str>>(
        items: &[S],
        private_hosts: &[S],
    ) -> Result<NetworkPolicy, PolicyError> {
        let mut hosts: Vec<HostRule> = Vec::new();
        let mut cidrs: Vec<CidrRule> = Vec::new();
        for item in items {
            match Item::parse(item.as_ref())? {
                Item::Host(rule) => merge(
                    &mut hosts,
                    rule.pattern,
                    rule.ports,
                    |r| &r.pattern,
                    |r| &mut r.ports,
                    |pattern, ports| HostRule { pattern, ports },
                ),
                Item::Cidr(rule) => merge(
                    &mut cidrs,
                    rule.net,
                    rule.ports,
                    |r| &r.net,
                    |r| &mut r.ports,
                    |net, ports| CidrRule { net, ports },
                ),
            }
        }
        if hosts.len() > MAX_HOST_RULES {
            return Err(PolicyError::TooMany {
                what: "host names",
                max: MAX_HOST_RULES,
            });
        }
        if cidrs.len() > MAX_CIDR_RULES {
            return Err(PolicyError::TooMany {
                what: "address ranges",
                max: MAX_CIDR_RULES,
            });
        }
        let mut private = Vec::new();
        for name in private_hosts {
            let pattern = HostPattern::parse(name.as_ref())?;
            if !hosts.iter().any(|rule| rule.pattern.covers(&pattern)) {
                return Err(PolicyError::PrivateNotAllowed {
                    name: name.as_ref().to_string(),
                });
            }
            if !private.contains(&pattern) {
                private.push(pattern);
            }
        }
        if hosts.is_empty() && cidrs.is_empty() {
            return Ok(NetworkPolicy::None);
        }
        Ok(NetworkPolicy::Allow {
            hosts,
            cidrs,
            private_hosts: private,
            private_ranges: Vec::new(),
        })
    }

    /// A policy given as two lists, host names (`NAME[:PORT]`, `*.SUFFIX[:PORT]`) and address
    /// ranges (`CIDR[:PORT]`), with the names an operator opts in to internal addresses: a
    /// policy file's or a request's `allow` and `cidrs`. Checked by [`Self::from_items`], and
    /// each item must be of its list's kind.
    pub fn from_lists<S: AsRef<str>>(
        names: &[S],
        cidrs: &[S],
        private_hosts: &[S],
    ) -> Result<NetworkPolicy, PolicyError> {
        for name in names {
            if let Item::Cidr(_) = Item::parse(name.as_ref())? {
                return Err(PolicyError::AddressAsName {
                    item: name.as_ref().to_string(),
                });
            }
        }
        for cidr in cidrs {
            if let Item::Host(_) = Item::parse(cidr.as_ref())? {
                return Err(PolicyError::NameAsCidr {
                    item: cidr.as_ref().to_string(),
                });
            }
        }
        let items: Vec<&str> = names.iter().chain(cidrs).map(AsRef::as_ref).collect();
        let private: Vec<&str> = private_hosts.iter().map(AsRef::as_ref).collect();
        NetworkPolicy::from_items(&items, &private)
    }

    pub fn is_none(&self) -> bool {
        matches!(self, NetworkPolicy::None)
    }

    /// The policy's items, in the syntax they are written in.
    pub fn items(&self) -> Vec<String> {
        match self {
            NetworkPolicy::None => Vec::new(),
            NetworkPolicy::Allow { hosts, cidrs, .. } => hosts
                .iter()
                .map(HostRule::to_string)
                .chain(cidrs.iter().map(CidrRule::to_string))
                .collect(),
        }
    }

    /// Whether a connection to the name `name` (normalized), port `port` is allowed; when it
    /// is, whether the name may resolve to internal addresses.
    pub fn check_name(&self, name: &str, port: u16) -> Result<bool, NameRefusal> {
        let NetworkPolicy::Allow {
            hosts,
            private_hosts,
            ..
        } = self
        else {
            return Err(NameRefusal::NotListed);
        };
        let mut listed = false;
        for rule in hosts.iter().filter(|r| r.pattern.matches(name)) {
            listed = true;
            if rule.ports.contains(&port) {
                return Ok(private_hosts.iter().any(|p| p.matches(name)));
            }
        }
        Err(if listed {
            NameRefusal::Port
        } else {
            NameRefusal::NotListed
        })
    }

    /// The CIDR rules that allow `ip` on `port`.
    pub fn cidr_rules_for(&self, ip: IpAddr, port: u16) -> Vec<&CidrRule> {
        match self {
            NetworkPolicy::None => Vec::new(),
            NetworkPolicy::Allow { cidrs, .. } => cidrs
                .iter()
                .filter(|r| r.net.contains(&ip) && r.ports.contains(&port))
                .collect(),
        }
    }

    /// Whether every connection `self` allows, `bound` allows too (a client's request against
    /// the operator's allow-list): `Err` names the first item outside it.
    pub fn within(&self, bound: &NetworkPolicy) -> Result<(), String> {
        let NetworkPolicy::Allow { hosts, cidrs, .. } = self else {
            return Ok(());
        };
        let (bound_hosts, bound_cidrs): (&[HostRule], &[CidrRule]) = match bound {
            NetworkPolicy::None => (&[], &[]),
            NetworkPolicy::Allow { hosts, cidrs, .. } => (hosts, cidrs),
        };
        for rule in hosts {
            for &port in &rule.ports {
                let ok = bound_hosts
                    .iter()
                    .any(|b| b.pattern.covers(&rule.pattern) && b.ports.contains(&port));
                if !ok {
                    return Err(format!("{}:{port}", rule.pattern));
                }
            }
        }
        for rule in cidrs {
            for &port in &rule.ports {
                let ok = bound_cidrs
                    .iter()
                    .any(|b| b.net.contains(&rule.net) && b.ports.contains(&port));
                if !ok {
                    return Err(CidrRule {
                        net: rule.net,
                        ports: vec![port],
                    }
                    .to_string());
                }
            }
        }
        Ok(())
    }

    /// This policy as its operator's: those of its ranges that name internal addresses on
    /// purpose (they lie within one internal block, or name one address alone) are opted in
    /// to them. The server's `[network]` bound and `corral run`'s policy (its user is the
    /// operator of their own run) are made so where they are built; a client's request never
    /// is, and gets its opt-ins only from its bound ([`Self::with_opt_ins_of`]).
    pub fn with_own_opt_ins(mut self) -> NetworkPolicy {
        if let NetworkPolicy::Allow {
            cidrs,
            private_ranges,
            ..
        } = &mut self
        {
            *private_ranges = cidrs
                .iter()
                .filter(|rule| names_internal_addresses(&rule.net))
                .cloned()
                .collect();
        }
        self
    }

    /// This policy with the opt-ins of `bound`, the operator's policy, in place of its own: a
    /// client's request. A requested name is opted in when an opted-in pattern of the
    /// operator covers it; the operator's opted-in ranges that overlap a requested range are
    /// carried, so that the requested range reaches the internal addresses they hold and no
    /// others.
    pub fn with_opt_ins_of(mut self, bound: &NetworkPolicy) -> NetworkPolicy {
        let (operator_hosts, operator_ranges): (&[HostPattern], &[CidrRule]) = match bound {
            NetworkPolicy::None => (&[], &[]),
            NetworkPolicy::Allow {
                private_hosts,
                private_ranges,
                ..
            } => (private_hosts, private_ranges),
        };
        if let NetworkPolicy::Allow {
            hosts,
            cidrs,
            private_hosts,
            private_ranges,
        } = &mut self
        {
            *private_hosts = hosts
                .iter()
                .filter(|rule| operator_hosts.iter().any(|p| p.covers(&rule.pattern)))
                .map(|rule| rule.pattern.clone())
                .collect();
            *private_ranges = operator_ranges
                .iter()
                .filter(|o| {
                    cidrs
                        .iter()
                        .any(|r| r.net.contains(&o.net) || o.net.contains(&r.net))
                })
                .cloned()
                .collect();
        }
        self
    }

    /// The ranges whose internal addresses its operator opted in to on `port` (an operator who
    /// named `10.0.0.0/8:5432` opted 10.0.0.0/8 in on 5432 alone).
    pub fn private_ranges(&self, port: u16) -> Vec<IpNet> {
        match self {
            NetworkPolicy::None => Vec::new(),
            NetworkPolicy::Allow { private_ranges, .. } => private_ranges
                .iter()
                .filter(|rule| rule.ports.contains(&port))
                .map(|rule| rule.net)
                .collect(),
        }
    }
}

/// Why [`NetworkPolicy::check_name`] refused a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRefusal {
    /// No rule names it.
    NotListed,
    /// Rules name it, for other ports.
    Port,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::{canonical, classify, vet_literal, Class};
    use proptest::prelude::*;

    /// Addresses of every internal kind, in every form.
    const INTERNAL: [&str; 14] = [
        "127.0.0.1",
        "10.1.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "192.168.1.1",
        "172.16.0.1",
        "::1",
        "fe80::1",
        "fd00::1",
        "::ffff:127.0.0.1",
        "64:ff9b::a00:1",
        "2002:7f00:1::",
        "8.8.4.4",
        "2606:4700::1",
    ];

    /// Any range, with internal blocks and their neighbours likely.
    fn any_range() -> impl Strategy<Value = IpNet> {
        let base = prop_oneof![
            (0..INTERNAL.len()).prop_map(|i| INTERNAL[i].parse::<IpAddr>().unwrap()),
            any::<u32>().prop_map(|a| IpAddr::V4(a.into())),
            any::<u128>().prop_map(|a| IpAddr::V6(a.into())),
        ];
        (base, 0u8..=128).prop_map(|(addr, len)| {
            let max = if addr.is_ipv4() { 32 } else { 128 };
            IpNet::new(addr, len.min(max)).unwrap().trunc()
        })
    }

    fn request_nets(p: &NetworkPolicy) -> Vec<IpNet> {
        match p {
            NetworkPolicy::None => Vec::new(),
            NetworkPolicy::Allow { cidrs, .. } => cidrs.iter().map(|r| r.net).collect(),
        }
    }

    fn policy(items: &[&str]) -> NetworkPolicy {
        NetworkPolicy::from_items(items, &[]).unwrap()
    }

    #[test]
    fn items_parse_into_rules_with_default_ports() {
        let p = policy(&[
            "Index.Example.org.",
            "*.example.net:443",
            "index.example.org:8443",
            "10.1.2.0/24:5432",
            "[2001:db8::/32]:443",
            "2001:db8:1::5",
            "192.0.2.7",
        ]);
        assert_eq!(
            p.items(),
            [
                "index.example.org:80+443+8443",
                "*.example.net:443",
                "10.1.2.0/24:5432",
                "[2001:db8::/32]:443",
                "[2001:db8:1::5/128]:80+443",
                "192.0.2.7/32:80+443",
            ]
        );
        assert_eq!(
            NetworkPolicy::from_items::<&str>(&[], &[]),
            Ok(NetworkPolicy::None)
        );
    }

    #[test]
    fn bad_items_are_named() {
        for bad in [
            "",
            "*",
            "*.",
            "a.*.com",
            "exa mple.com",
            "-a.com",
            "a-.com",
            "ex\u{e4}mple.com",
            "index.example.org:0",
            "index.example.org:65536",
            "index.example.org:+1",
            "index.example.org:",
            "10.0.0.0/33",
            "[::1",
            "[::1]443",
            "2001:db8::/129",
            "127.1",
            "0x7f.0.0.1",
            "2130706433",
            "a..b",
        ] {
            let e = NetworkPolicy::from_items(&[bad], &[]).unwrap_err();
            assert!(
                e.to_string().contains(&format!("{:?}", bad.trim())),
                "{bad}: {e}"
            );
        }
        assert!(matches!(
            Item::parse("10.0.0.1/8"),
            Ok(Item::Cidr(CidrRule { net, .. })) if net.to_string() == "10.0.0.0/8"
        ));
        let long = format!("{}.com", "a".repeat(64));
        assert!(NetworkPolicy::from_items(&[long.as_str()], &[]).is_err());
        let many: Vec<String> = (0..=MAX_HOST_RULES).map(|i| format!("h{i}.com")).collect();
        assert!(matches!(
            NetworkPolicy::from_items(&many, &[]),
            Err(PolicyError::TooMany { .. })
        ));
    }

    #[test]
    fn lists_hold_items_of_their_kind() {
        let p = NetworkPolicy::from_lists(&["a.com"], &["10.0.0.0/8:5432"], &["a.com"]).unwrap();
        assert_eq!(p.items(), ["a.com:80+443", "10.0.0.0/8:5432"]);
        assert!(matches!(
            NetworkPolicy::from_lists(&["10.0.0.1"], &[], &[]),
            Err(PolicyError::AddressAsName { .. })
        ));
        assert!(matches!(
            NetworkPolicy::from_lists(&[], &["a.com"], &[]),
            Err(PolicyError::NameAsCidr { .. })
        ));
    }

    #[test]
    fn suffixes_match_names_below_them_only() {
        let p = HostPattern::parse("*.example.com").unwrap();
        assert!(p.matches("a.example.com"));
        assert!(p.matches("a.b.example.com"));
        assert!(!p.matches("example.com"));
        assert!(!p.matches("badexample.com"));
        assert!(!p.matches(".example.com"));
        assert!(p.covers(&HostPattern::parse("*.a.example.com").unwrap()));
        assert!(p.covers(&HostPattern::parse("*.example.com").unwrap()));
        assert!(!p.covers(&HostPattern::parse("*.com").unwrap()));
        assert!(!HostPattern::parse("a.com")
            .unwrap()
            .covers(&HostPattern::parse("*.a.com").unwrap()));
    }

    #[test]
    fn a_request_must_lie_within_the_operators_list() {
        let operator = NetworkPolicy::from_items(
            &["*.example.net:443", "index.example.org", "10.0.0.0/8:5432"],
            &["index.example.org"],
        )
        .unwrap();
        let ok = policy(&[
            "files.example.net:443",
            "index.example.org:80",
            "10.1.0.0/16:5432",
        ]);
        assert_eq!(ok.within(&operator), Ok(()));
        assert_eq!(
            policy(&["files.example.net"]).within(&operator),
            Err("files.example.net:80".into())
        );
        assert_eq!(
            policy(&["evil.com"]).within(&operator),
            Err("evil.com:80".into())
        );
        assert_eq!(
            policy(&["10.0.0.0/7:5432"]).within(&operator),
            Err("10.0.0.0/7:5432".into())
        );
        assert!(policy(&["a.com"]).within(&NetworkPolicy::None).is_err());
        assert_eq!(NetworkPolicy::None.within(&NetworkPolicy::None), Ok(()));
        let marked = ok.with_opt_ins_of(&operator);
        assert_eq!(marked.check_name("index.example.org", 80), Ok(true));
        assert_eq!(marked.check_name("files.example.net", 443), Ok(false));
    }

    /// Whether the proxy connects to the literal `ip` on `port` under `p`, as its `vet` decides
    /// (a rule of `p` holds it, and [`vet_literal`] admits it through one such rule).
    fn reaches(p: &NetworkPolicy, ip: IpAddr, port: u16, own: &[IpAddr]) -> bool {
        let ip = canonical(ip);
        p.cidr_rules_for(ip, port)
            .iter()
            .any(|r| vet_literal(ip, &r.net, &p.private_ranges(port), own).is_ok())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A server's `[network]` bound of these ranges, as it is built.
    fn operator(cidrs: &[&str]) -> NetworkPolicy {
        NetworkPolicy::from_lists(&[], cidrs, &[])
            .unwrap()
            .with_own_opt_ins()
    }

    /// A client's request for these ranges within `bound`, as the server makes it.
    fn client(cidrs: &[&str], bound: &NetworkPolicy) -> NetworkPolicy {
        let asked = NetworkPolicy::from_lists(&[], cidrs, &[]).unwrap();
        assert_eq!(asked.within(bound), Ok(()), "{cidrs:?}");
        asked.with_opt_ins_of(bound)
    }

    #[test]
    fn a_clients_narrower_range_within_everything_reaches_no_internal_address() {
        let bound = operator(&["0.0.0.0/0", "::/0"]);
        assert_eq!(bound.private_ranges(80), []);
        for (range, addr) in [
            ("127.0.0.0/8", "127.0.0.1"),
            ("::1/128", "::1"),
            ("169.254.169.254/32", "169.254.169.254"),
            ("10.0.0.0/8", "10.1.1.1"),
            ("100.64.0.0/10", "100.64.0.1"),
            ("[fe80::/10]", "fe80::1"),
            ("[::ffff:127.0.0.0/104]", "::ffff:127.0.0.1"),
            ("[64:ff9b::7f00:0/104]", "64:ff9b::7f00:1"),
            ("[2002:7f00::/24]", "2002:7f00:1::"),
        ] {
            let asked = client(&[range], &bound);
            assert_eq!(asked.private_ranges(80), [], "{range}");
            assert!(
                !reaches(&asked, ip(addr), 80, &[]),
                "{range} reached {addr}"
            );
        }
        // Public addresses stay reachable, and so does the operator's own 0.0.0.0/0 for them.
        assert!(reaches(
            &client(&["8.8.8.0/24"], &bound),
            ip("8.8.8.8"),
            443,
            &[]
        ));
        assert!(!reaches(&bound, ip("127.0.0.1"), 80, &[]));
        assert!(!reaches(&bound, ip("::1"), 80, &[]));
    }

    #[test]
    fn an_operators_named_range_lets_a_clients_range_within_it_reach_its_addresses() {
        let bound = operator(&["0.0.0.0/0", "10.0.0.0/8", "[::1]:8080"]);
        let asked = client(&["10.1.0.0/16"], &bound);
        assert!(reaches(&asked, ip("10.1.1.1"), 443, &[]));
        assert!(!reaches(&asked, ip("10.2.1.1"), 443, &[]));
        // A client's 0.0.0.0/0 holds no internal address, whatever the operator opted in.
        assert!(!reaches(
            &client(&["0.0.0.0/0"], &bound),
            ip("10.1.1.1"),
            443,
            &[]
        ));
        // Another internal block than the operator's stays out of reach.
        assert!(!reaches(
            &client(&["127.0.0.0/8"], &bound),
            ip("127.0.0.1"),
            80,
            &[]
        ));
        let v6 = client(&["[::1]:8080"], &bound);
        assert!(reaches(&v6, ip("::1"), 8080, &[]));
        assert!(!reaches(&v6, ip("::1"), 80, &[]));
        // An opted-in range without its own rule of the client's gives nothing either.
        assert!(!reaches(
            &NetworkPolicy::from_items(&["8.8.8.8/32"], &[])
                .unwrap()
                .with_opt_ins_of(&bound),
            ip("10.1.1.1"),
            443,
            &[]
        ));
        // The CLI user names their own ranges.
        let run = NetworkPolicy::from_items(&["127.0.0.1/32:8080"], &[])
            .unwrap()
            .with_own_opt_ins();
        assert!(reaches(&run, ip("127.0.0.1"), 8080, &[]));
        let run = NetworkPolicy::from_items(&["0.0.0.0/0"], &[])
            .unwrap()
            .with_own_opt_ins();
        assert!(!reaches(&run, ip("127.0.0.1"), 80, &[]));
        assert!(reaches(&run, ip("1.1.1.1"), 80, &[]));
    }

    #[test]
    fn an_operators_range_is_opted_in_on_its_own_ports_alone() {
        // 10.0.0.0/8 and fd00::/8 on 5432, everything on 80 and 443: a client's 10.0.0.0/8 on 80 lies
        // within 0.0.0.0/0, but the operator never named 10.0.0.0/8 on 80.
        let bound = operator(&["0.0.0.0/0", "::/0", "10.0.0.0/8:5432", "[fd00::/8]:5432"]);
        let asked = client(&["10.0.0.0/8", "10.0.0.0/8:5432", "[fd00::/8]"], &bound);
        assert!(reaches(&asked, ip("10.1.1.1"), 5432, &[]));
        assert!(!reaches(&asked, ip("10.1.1.1"), 80, &[]));
        assert!(!reaches(&asked, ip("10.1.1.1"), 443, &[]));
        assert!(!reaches(&asked, ip("fd00::1"), 443, &[]));
        assert_eq!(asked.private_ranges(443), []);
    }

    #[test]
    fn the_hosts_own_address_only_when_the_operator_named_it_alone() {
        let own = [ip("8.8.4.4"), ip("2606:4700::1")];
        let wide = operator(&["8.8.0.0/16", "[2606:4700::/32]"]);
        assert!(!reaches(&client(&["8.8.4.4/32"], &wide), own[0], 80, &own));
        assert!(!reaches(
            &client(&["[2606:4700::1]"], &wide),
            own[1],
            80,
            &own
        ));
        assert!(!reaches(&wide, own[0], 80, &own));
        let alone = operator(&["8.8.0.0/16", "8.8.4.4/32", "[2606:4700::1]"]);
        assert!(reaches(&client(&["8.8.4.4/32"], &alone), own[0], 80, &own));
        assert!(reaches(
            &client(&["[2606:4700::1]"], &alone),
            own[1],
            80,
            &own
        ));
        assert!(reaches(
            &client(&["8.8.4.4/32"], &alone),
            ip("::ffff:8.8.4.4"),
            80,
            &own
        ));
        // The client's wider range does not reach it, even so.
        assert!(!reaches(&client(&["8.8.0.0/16"], &alone), own[0], 80, &own));
    }

    proptest! {
        /// A normalized name is stable, ASCII, lowercase and never an address.
        #[test]
        fn normalizing_is_idempotent_and_never_yields_an_address(name in "[a-zA-Z0-9._\\-]{0,80}") {
            if let Ok(n) = normalize_name(&name) {
                prop_assert_eq!(normalize_name(&n), Ok(n.clone()));
                prop_assert!(n.parse::<IpAddr>().is_err());
                prop_assert_eq!(n.to_ascii_lowercase(), n.clone());
            }
        }

        /// A suffix rule matches exactly the names that end in `.suffix` with a label before.
        #[test]
        fn suffix_matching_is_label_aligned(
            head in "[a-z]{1,5}(\\.[a-z]{1,5}){0,2}",
            suffix in "[a-z]{1,5}\\.[a-z]{2,4}",
            other in "[a-z]{1,8}",
        ) {
            let p = HostPattern::Suffix(suffix.clone());
            let below = format!("{head}.{suffix}");
            let glued = format!("{other}{suffix}");
            prop_assert!(p.matches(&below));
            prop_assert!(!p.matches(&suffix));
            prop_assert!(!p.matches(&glued));
        }

        /// A client's request within a bound that opts no range in never reaches an internal
        /// address (nor an unspecified, multicast or broadcast one), whatever it names.
        #[test]
        fn no_request_within_a_bound_without_opt_ins_reaches_an_internal_address(
            bound in proptest::collection::vec(any_range(), 0..4),
            asked in proptest::collection::vec(any_range(), 1..4),
            picks in proptest::collection::vec((any::<u128>(), any::<bool>()), 1..8),
        ) {
            let mut items: Vec<String> = bound
                .iter()
                .filter(|n| !names_internal_addresses(n))
                .map(|n| format!("[{n}]:80"))
                .collect();
            items.extend(["0.0.0.0/0:80".to_string(), "[::/0]:80".to_string()]);
            let bound = NetworkPolicy::from_items(&items, &[]).unwrap().with_own_opt_ins();
            prop_assert_eq!(bound.private_ranges(80), Vec::<IpNet>::new());
            let asked: Vec<String> = asked.iter().map(|n| format!("[{n}]:80")).collect();
            let request = NetworkPolicy::from_items(&asked, &[]).unwrap();
            prop_assert_eq!(request.within(&bound), Ok(()));
            let request = request.with_opt_ins_of(&bound);
            let own = [ip("8.8.4.4"), ip("2606:4700::1")];
            for (rule, (raw, sample)) in request_nets(&request).iter().cycle().zip(&picks) {
                // An address in the rule, or one of the well-known internal ones.
                let addr = match (sample, rule) {
                    (true, _) => INTERNAL[(*raw % INTERNAL.len() as u128) as usize].parse().unwrap(),
                    (false, IpNet::V4(n)) => IpAddr::V4((u32::from(n.network()) | (*raw as u32 & u32::from(n.hostmask()))).into()),
                    (false, IpNet::V6(n)) => IpAddr::V6((u128::from(n.network()) | (raw & u128::from(n.hostmask()))).into()),
                };
                if classify(canonical(addr), &own).class != Class::Public {
                    prop_assert!(!reaches(&request, addr, 80, &own), "{:?} reached {}", asked, addr);
                }
            }
        }

        /// Whatever a parsed item allows, its own policy allows, and `within` agrees.
        #[test]
        fn a_policy_is_within_itself(
            names in proptest::collection::vec("(\\*\\.)?[a-z]{1,6}\\.[a-z]{2,3}(:[1-9][0-9]{0,3})?", 1..6)
        ) {
            let p = NetworkPolicy::from_items(&names, &[]).unwrap();
            prop_assert_eq!(p.within(&p), Ok(()));
        }
    }
}

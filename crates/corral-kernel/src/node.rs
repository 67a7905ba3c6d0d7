//! Sandbox ids and the node that owns them. A server configured with a node name (a member
//! of a cluster behind `corral route`, docs/scale-out.md) makes ids that end in that name:
//! `sbx-<hex>-<node>`. Any router can then tell from an id alone which node holds the sandbox,
//! without shared state. A server without a node name makes the single-node ids `sbx-<hex>`,
//! as before.

use std::fmt;
use std::str::FromStr;

/// The longest node name: an id, with E2B's `<port>-` in front, must still fit one DNS label
/// (63 bytes) of the `<port>-<id>.<domain>` host names E2B clients may use.
pub const MAX_NODE_NAME: usize = 32;

const ID_PREFIX: &str = "sbx-";

/// A node's name: 1 to [`MAX_NODE_NAME`] lowercase letters, digits and `-`, starting and
/// ending with a letter or digit (a DNS label, as a StatefulSet pod's name is).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeName(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "node name {0:?}: 1 to {MAX_NODE_NAME} lowercase letters, digits and '-', starting and \
     ending with a letter or digit"
)]
pub struct BadNodeName(pub String);

impl FromStr for NodeName {
    type Err = BadNodeName;

    fn from_str(s: &str) -> Result<NodeName, BadNodeName> {
        let ok_char = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-';
        let bytes = s.as_bytes();
        let ok = !bytes.is_empty()
            && bytes.len() <= MAX_NODE_NAME
            && bytes.iter().all(|&c| ok_char(c))
            && bytes[0] != b'-'
            && bytes[bytes.len() - 1] != b'-';
        if ok {
            Ok(NodeName(s.to_string()))
        } else {
            Err(BadNodeName(s.to_string()))
        }
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl NodeName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> serde::Deserialize<'de> for NodeName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<NodeName, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The id of a new sandbox: `sbx-<stamp in hex><random, 8 hex digits>`, followed by
/// `-<node>` when the server has a node name. The stamp (time and a counter) keeps ids
/// unique; the 32 random bits keep them from being guessed from ids made just before and
/// after (hostile `multitenant::ports`: with public host-routed ports an id is all it takes
/// to reach a sandbox's servers). `<port>-<id>` stays within one DNS label:
/// 6 + 4 + 12 + 8 + 1 + [`MAX_NODE_NAME`] = 63 bytes.
pub fn sandbox_id(stamp: u64, random: u32, node: Option<&NodeName>) -> String {
    let stamp = stamp & 0xffff_ffff_ffff;
    match node {
        Some(node) => format!("{ID_PREFIX}{stamp:x}{random:08x}-{node}"),
        None => format!("{ID_PREFIX}{stamp:x}{random:08x}"),
    }
}

/// The node that owns sandbox `id`, if the id names one; `None` for single-node ids and for
/// strings that are not sandbox ids at all.
pub fn node_of(id: &str) -> Option<NodeName> {
    let rest = id.strip_prefix(ID_PREFIX)?;
    let (stamp, node) = rest.split_once('-')?;
    if stamp.is_empty() || !stamp.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    node.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_dns_labels() {
        for good in ["corral-node-0", "a", "n1", &"x".repeat(MAX_NODE_NAME)] {
            assert_eq!(good.parse::<NodeName>().unwrap().as_str(), good);
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a.b",
            "a_b",
            "a b",
            "é",
            &"x".repeat(MAX_NODE_NAME + 1),
        ] {
            assert!(bad.parse::<NodeName>().is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn an_id_names_its_node_and_single_node_ids_name_none() {
        let node: NodeName = "corral-node-2".parse().unwrap();
        let id = sandbox_id(0x1234_abcd_0001, 0x5eed, Some(&node));
        assert_eq!(id, "sbx-1234abcd000100005eed-corral-node-2");
        assert_eq!(node_of(&id), Some(node));
        let single = sandbox_id(0x1234_abcd_0001, 0x5eed, None);
        assert_eq!(single, "sbx-1234abcd000100005eed");
        assert_eq!(node_of(&single), None);
        // Not sandbox ids, or ids whose node part is no node name: no node.
        for other in [
            "",
            "sbx-",
            "sbx--n",
            "sbx-zz-n",
            "key-12-n",
            "sbx-12-N",
            "sbx-12-n.evil",
            "sbx-12-",
        ] {
            assert_eq!(node_of(other), None, "{other:?}");
        }
    }

    #[test]
    fn the_longest_id_with_a_port_is_one_dns_label() {
        let node: NodeName = "n".repeat(MAX_NODE_NAME).parse().unwrap();
        let id = sandbox_id(u64::MAX, u32::MAX, Some(&node));
        assert_eq!(format!("65535-{id}").len(), 63, "{id}");
    }
}

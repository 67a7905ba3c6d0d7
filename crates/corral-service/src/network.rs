//! Which network policies each key may ask for (docs/network.md#the-servers-settings): the
//! operator's `[network]` bound and default for every key, and a `[key_network.NAME]` table
//! instead of them for the keys named NAME. A key's table can only narrow `[network]`: an item
//! of it outside `[network]`'s `allow` and `cidrs` is a configuration error, so that the
//! server-wide bound stays the one place that says what any sandbox may reach.

use std::collections::{BTreeMap, HashMap};

use corral_sandbox::NetworkPolicy;
use serde::Deserialize;

use crate::config::NetworkConfig;
use crate::service::{NetworkRequest, ServiceError};

/// What the keys named NAME may ask for (a `[key_network.NAME]` table), instead of
/// `[network]`'s `allow`, `cidrs` and `default`. Every item must lie within `[network]`'s
/// `allow` and `cidrs`; which names may resolve to internal addresses stays `[network]
/// allow_private`'s to say.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeyNetworkConfig {
    /// Host names (`NAME[:PORT]`, `*.SUFFIX[:PORT]`) these keys' requests may allow.
    pub allow: Vec<String>,
    /// Address ranges (`CIDR[:PORT]`) these keys' requests may allow.
    pub cidrs: Vec<String>,
    /// The policy these keys get when they ask for the default (`{"default": true}`, E2B
    /// `allow_internet_access`, the MCP tools): items within this table's `allow` and
    /// `cidrs`; empty: none.
    pub default: Vec<String>,
}

/// What one key may ask for, and what it gets when it asks for the default.
#[derive(Debug, Clone, Default)]
struct Bound {
    allow: NetworkPolicy,
    default: NetworkPolicy,
    /// Where the bound comes from, as the 403 names it.
    source: String,
}

/// The network bounds of the server's settings: `[network]`'s for every key, and each
/// `[key_network.NAME]`'s instead of it for the keys named NAME.
#[derive(Debug, Clone, Default)]
pub struct NetworkBounds {
    server: Bound,
    by_key_name: HashMap<String, Bound>,
}

impl NetworkBounds {
    /// The bounds of `[network]` and of the `[key_network.NAME]` tables, checked: each key's
    /// table within `[network]`, each default within its bound.
    pub fn of(
        network: &NetworkConfig,
        keys: &BTreeMap<String, KeyNetworkConfig>,
    ) -> anyhow::Result<NetworkBounds> {
        let (bound, default) = network.policies()?;
        let mut by_key_name = HashMap::new();
        for (name, key) in keys {
            let table = format!("[key_network.{name}]");
            let allow = NetworkPolicy::from_lists(&key.allow, &key.cidrs, &[])
                .map_err(|e| anyhow::anyhow!("{table}: {e}"))?;
            allow.within(&bound).map_err(|item| {
                anyhow::anyhow!(
                    "{table}: {item} is not within [network] allow and cidrs (a key's table \
                     can only narrow them)"
                )
            })?;
            let key_default = NetworkPolicy::from_items(&key.default, &[])
                .map_err(|e| anyhow::anyhow!("{table} default: {e}"))?;
            key_default.within(&allow).map_err(|item| {
                anyhow::anyhow!("{table} default: {item} is not within {table} allow and cidrs")
            })?;
            by_key_name.insert(
                name.clone(),
                Bound {
                    allow: allow.with_opt_ins_of(&bound),
                    default: key_default.with_opt_ins_of(&bound),
                    source: table,
                },
            );
        }
        Ok(NetworkBounds {
            server: Bound {
                allow: bound,
                default,
                source: "[network]".into(),
            },
            by_key_name,
        })
    }

    fn of_key(&self, key_name: Option<&str>) -> &Bound {
        key_name
            .and_then(|name| self.by_key_name.get(name))
            .unwrap_or(&self.server)
    }

    /// Whether the keys named `key_name` (`None`: keyless local use) have a default policy.
    pub fn has_default(&self, key_name: Option<&str>) -> bool {
        !self.of_key(key_name).default.is_none()
    }

    /// The policy `req` asks for, from a key named `key_name`: its key's default, or its own
    /// items, each within its key's bound (403 `network_not_allowed` naming the first item
    /// outside it). It gets its opt-ins to internal addresses from `[network]` alone: the names of
    /// `allow_private` and the ranges of `cidrs` that lie within an internal block.
    pub fn policy(
        &self,
        key_name: Option<&str>,
        req: &NetworkRequest,
    ) -> Result<NetworkPolicy, ServiceError> {
        let bound = self.of_key(key_name);
        if req.default {
            if !req.allow.is_empty() || !req.cidrs.is_empty() {
                return Err(ServiceError::BadRequest(
                    "network: give either default or allow and cidrs".into(),
                ));
            }
            return Ok(bound.default.clone());
        }
        let asked = NetworkPolicy::from_lists(&req.allow, &req.cidrs, &[])
            .map_err(|e| ServiceError::BadRequest(format!("network: {e}")))?;
        asked.within(&bound.allow).map_err(|item| {
            ServiceError::NetworkNotAllowed(format!(
                "network: {item} is not on this server's network allow-list for this key (its \
                 operator's {} allow and cidrs)",
                bound.source
            ))
        })?;
        Ok(asked.with_opt_ins_of(&self.server.allow))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn bounds(toml_text: &str) -> anyhow::Result<NetworkBounds> {
        let c: Config = toml::from_str(toml_text)?;
        c.check()?;
        NetworkBounds::of(&c.network, &c.key_network)
    }

    fn ask(allow: &[&str]) -> NetworkRequest {
        NetworkRequest {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    const SERVER: &str = "[network]\nallow = [\"pypi.org\", \"*.example.com\", \"mirror.corp\"]\n\
                          cidrs = [\"10.0.0.0/8:443\"]\nallow_private = [\"mirror.corp\"]\n\
                          default = [\"pypi.org:443\"]\n";

    #[test]
    fn a_keys_table_narrows_the_server_bound_for_that_key_only() {
        let b = bounds(&format!(
            "{SERVER}[key_network.ci]\nallow = [\"a.example.com:443\", \"mirror.corp\"]\n\
             default = [\"mirror.corp:443\"]\n"
        ))
        .unwrap();
        // The key named ci may reach its own items, and nothing else of [network]'s.
        let p = b.policy(Some("ci"), &ask(&["a.example.com:443"])).unwrap();
        assert_eq!(p.items(), ["a.example.com:443"]);
        for outside in ["pypi.org", "b.example.com", "a.example.com:80"] {
            let err = b.policy(Some("ci"), &ask(&[outside])).unwrap_err();
            let ServiceError::NetworkNotAllowed(message) = err else {
                panic!("{outside}: {err:?}")
            };
            let host = outside.split(':').next().unwrap();
            assert!(message.contains(host), "{message}");
            assert!(message.contains("[key_network.ci]"), "{message}");
        }
        // Every other key, and keyless use, keeps [network]'s bound and default.
        for key in [Some("other"), None] {
            assert!(b.policy(key, &ask(&["pypi.org"])).is_ok());
            assert!(b.policy(key, &ask(&["b.example.com:443"])).is_ok());
            let default = NetworkRequest {
                default: true,
                ..Default::default()
            };
            assert_eq!(b.policy(key, &default).unwrap().items(), ["pypi.org:443"]);
        }
        let default = NetworkRequest {
            default: true,
            ..Default::default()
        };
        let p = b.policy(Some("ci"), &default).unwrap();
        assert_eq!(p.items(), ["mirror.corp:443"]);
        // The operator's opt-in to internal addresses still holds within a key's table.
        assert_eq!(p.check_name("mirror.corp", 443), Ok(true));
        let p = b.policy(Some("ci"), &ask(&["mirror.corp:80"])).unwrap();
        assert_eq!(p.check_name("mirror.corp", 80), Ok(true));
        assert!(b.has_default(Some("ci")) && b.has_default(None));
    }

    #[test]
    fn a_keys_table_without_a_default_gives_that_key_none() {
        let b = bounds(&format!(
            "{SERVER}[key_network.ci]\nallow = [\"pypi.org\"]\n"
        ))
        .unwrap();
        assert!(!b.has_default(Some("ci")));
        let default = NetworkRequest {
            default: true,
            ..Default::default()
        };
        assert!(b.policy(Some("ci"), &default).unwrap().is_none());
        // An empty table: the key may ask for nothing.
        let b = bounds(&format!("{SERVER}[key_network.ci]\n")).unwrap();
        assert!(matches!(
            b.policy(Some("ci"), &ask(&["pypi.org"])),
            Err(ServiceError::NetworkNotAllowed(_))
        ));
    }

    #[test]
    fn a_keys_table_that_would_widen_the_server_bound_is_a_configuration_error() {
        for (table, names) in [
            ("allow = [\"evil.com\"]", "evil.com:80"),
            ("allow = [\"*.com\"]", "*.com:80"),
            ("allow = [\"pypi.org:8443\"]", "pypi.org:8443"),
            ("cidrs = [\"10.0.0.0/8:80\"]", "10.0.0.0/8:80"),
            ("cidrs = [\"0.0.0.0/0:443\"]", "0.0.0.0/0:443"),
        ] {
            let err = bounds(&format!("{SERVER}[key_network.ci]\n{table}\n"))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("[key_network.ci]") && err.contains(names),
                "{table}: {err}"
            );
        }
        for bad in [
            // A default outside the key's own table.
            "[key_network.ci]\nallow = [\"pypi.org:443\"]\ndefault = [\"pypi.org:80\"]",
            // Internal addresses are the operator's [network] allow_private alone to grant.
            "[key_network.ci]\nallow = [\"mirror.corp\"]\nallow_private = [\"mirror.corp\"]",
            "[key_network.ci]\nallow = [\"not a name\"]",
            "[key_network.ci]\nallow = [\"10.0.0.1\"]",
        ] {
            assert!(bounds(&format!("{SERVER}{bad}\n")).is_err(), "{bad}");
        }
        // Without [network], a key's table can allow nothing.
        assert!(bounds("[key_network.ci]\nallow = [\"pypi.org\"]\n").is_err());
        assert!(bounds("[key_network.ci]\n").is_ok());
    }
}

//! E2B's network options of a sandbox creation, `allow_internet_access` and `network`
//! (`SandboxNetworkConfig`), carried out as Corral's egress allow-list (docs/e2b.md#network):
//! exactly where Corral can express them, and refused (400) where it cannot, never ignored.
//!
//! E2B's rules (its SDKs' `SandboxNetworkOpts` and its documentation): every sandbox may reach
//! everything unless told otherwise; `denyOut` lists addresses and ranges (no names) to deny,
//! `"0.0.0.0/0"` (the SDKs' `ALL_TRAFFIC`) being all of it; `allowOut` lists addresses, ranges
//! and names (`NAME`, `*.SUFFIX`) to allow, and always wins over `denyOut`;
//! `allow_internet_access: false` is `denyOut: ["0.0.0.0/0"]`. Corral's sandboxes reach only
//! what an allow-list names, so the one E2B policy it expresses exactly is "deny all traffic
//! but `allowOut`". Anything that denies less than all traffic asks for more than an
//! allow-list can give, and is refused, saying how to ask.

use std::collections::BTreeMap;

use corral_egress::policy::Item;
use serde::Deserialize;
use serde_json::Value;

use crate::service::{NetworkRequest, ServiceError};

/// E2B's `ALL_TRAFFIC`: the range that denies all traffic in `denyOut`.
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// E2B's `SandboxNetworkConfig` as its SDKs send it (camelCase keys). Every key is read; one
/// Corral does not know is refused, so that a rule added to E2B's API is never dropped.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct E2bNetwork {
    /// Addresses, ranges and names to allow (each Corral's item syntax: `NAME[:PORT]`,
    /// `*.SUFFIX[:PORT]`, `CIDR[:PORT]`; without a port, 80 and 443).
    allow_out: Option<Vec<String>>,
    /// Addresses and ranges to deny; `0.0.0.0/0` is all traffic.
    deny_out: Option<Vec<String>>,
    /// Name servers to let the sandbox reach: Corral's sandboxes have no resolver (names are
    /// resolved by the host's proxy), so only an empty list can be honoured.
    dns_servers: Option<Vec<String>>,
    /// A SOCKS5 proxy to send the sandbox's traffic through (`null`: none).
    egress_proxy: Option<Value>,
    /// Per-host rewrites of HTTPS requests, which would need the proxy to open TLS.
    rules: Option<BTreeMap<String, Value>>,
    /// Whether the sandbox's public URLs need its token; Corral gives sandboxes no public
    /// URL, so only `false` (or absent) holds.
    allow_public_traffic: Option<bool>,
    /// The host mask of the sandbox's public URLs (which Corral does not give).
    mask_request_host: Option<String>,
    /// Ports of the sandbox served over HTTPS through its public URLs (likewise).
    https_ports: Option<Vec<u16>>,
}

fn refused(why: String) -> ServiceError {
    ServiceError::BadRequest(why)
}

impl E2bNetwork {
    /// Refuses the options Corral cannot carry out (those about egress through other means
    /// than its proxy, and those about public URLs), naming each.
    fn refuse_unsupported(&self) -> Result<(), ServiceError> {
        if self.dns_servers.as_ref().is_some_and(|d| !d.is_empty()) {
            return Err(refused(
                "network.dnsServers: Corral's sandboxes have no resolver and reach no name \
                 server; names are resolved by the host's egress proxy. Leave dnsServers out \
                 (or empty) and list the names in allowOut"
                    .into(),
            ));
        }
        if self.egress_proxy.is_some() {
            return Err(refused(
                "network.egressProxy: Corral does not send a sandbox's traffic through another \
                 proxy; its own proxy connects to the allowed hosts directly"
                    .into(),
            ));
        }
        if self.rules.as_ref().is_some_and(|r| !r.is_empty()) {
            return Err(refused(
                "network.rules: Corral's egress proxy does not open or rewrite TLS, so \
                 per-host transform rules cannot be applied"
                    .into(),
            ));
        }
        if self.allow_public_traffic == Some(true)
            || self.mask_request_host.is_some()
            || self.https_ports.as_ref().is_some_and(|p| !p.is_empty())
        {
            return Err(refused(
                "network.allowPublicTraffic, maskRequestHost and httpsPorts are about a \
                 sandbox's public URLs, which Corral does not give"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// Whether `denyOut` denies all traffic (holds `0.0.0.0/0`); each entry must be an address or
/// a range, as in E2B.
fn denies_all(deny_out: &[String]) -> Result<bool, ServiceError> {
    let mut all = false;
    for entry in deny_out {
        let net = match entry.parse::<std::net::IpAddr>() {
            Ok(ip) => ipnet::IpNet::from(ip),
            Err(_) => entry.parse::<ipnet::IpNet>().map_err(|_| {
                refused(format!(
                    "network.denyOut: {entry:?} is not an address or a range (E2B's deny rules \
                     take no names)"
                ))
            })?,
        };
        all |= matches!(net, ipnet::IpNet::V4(v4) if v4.prefix_len() == 0);
    }
    Ok(all)
}

/// The egress of an E2B creation: `None` for no network; the key's default policy for
/// `allow_internet_access: true` alone (403 `network_not_allowed` when its key has none);
/// `allowOut` as the allow-list when all other traffic is denied (`denyOut` holds
/// `0.0.0.0/0`, or `allow_internet_access` is `false`). Anything else is a 400 saying why.
/// Absent options mean no network: Corral's default, where E2B's is all traffic.
pub fn network_of(
    allow_internet_access: Option<bool>,
    network: Option<&E2bNetwork>,
    has_default: bool,
) -> Result<Option<NetworkRequest>, ServiceError> {
    let empty = E2bNetwork::default();
    let network = network.unwrap_or(&empty);
    network.refuse_unsupported()?;
    let deny_out = network.deny_out.as_deref().unwrap_or_default();
    let allow_out = network.allow_out.as_deref().unwrap_or_default();
    let deny_all = denies_all(deny_out)? || allow_internet_access == Some(false);
    if deny_all {
        if allow_out.is_empty() {
            return Ok(None);
        }
        let mut request = NetworkRequest::default();
        for item in allow_out {
            match Item::parse(item) {
                Ok(Item::Host(_)) => request.allow.push(item.clone()),
                Ok(Item::Cidr(_)) => request.cidrs.push(item.clone()),
                Err(e) => return Err(refused(format!("network.allowOut: {e}"))),
            }
        }
        return Ok(Some(request));
    }
    if let Some(first) = deny_out.first() {
        return Err(refused(format!(
            "network.denyOut without {ALL_TRAFFIC:?} (ALL_TRAFFIC) denies {first} and allows \
             all other traffic; Corral's sandboxes reach only what an allow-list names: deny \
             {ALL_TRAFFIC:?} and list what to reach in allowOut"
        )));
    }
    if !allow_out.is_empty() {
        return Err(refused(format!(
            "network.allowOut without denyOut [{ALL_TRAFFIC:?}] (ALL_TRAFFIC) leaves all \
             other traffic allowed on E2B; Corral's sandboxes reach only what an allow-list \
             names: add denyOut [{ALL_TRAFFIC:?}] (or allow_internet_access=False) to make \
             allowOut the allow-list"
        )));
    }
    match allow_internet_access {
        Some(true) if !has_default => Err(ServiceError::NetworkNotAllowed(
            "allow_internet_access: this server offers this key no default network policy (its \
             operator's [network] default); name the hosts in network.allowOut with denyOut \
             [\"0.0.0.0/0\"]"
                .into(),
        )),
        Some(true) => Ok(Some(NetworkRequest {
            default: true,
            ..Default::default()
        })),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(body: Value, has_default: bool) -> Result<Option<NetworkRequest>, ServiceError> {
        let access = body.get("allow_internet_access").and_then(Value::as_bool);
        let network: Option<E2bNetwork> = body
            .get("network")
            .map(|n| serde_json::from_value(n.clone()).expect("parses"));
        network_of(access, network.as_ref(), has_default)
    }

    fn bad_request(body: Value) -> String {
        match map(body.clone(), true) {
            Err(ServiceError::BadRequest(message)) => message,
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn allow_out_under_deny_all_is_the_allow_list() {
        for body in [
            json!({"network": {"allowOut": ["pypi.org", "*.example.com", "1.1.1.1", "8.8.8.0/24"],
                               "denyOut": ["0.0.0.0/0"]}}),
            json!({"allow_internet_access": false,
                   "network": {"allowOut": ["pypi.org", "*.example.com", "1.1.1.1", "8.8.8.0/24"]}}),
            // More deny entries change nothing: allowOut wins, the rest is denied anyway.
            json!({"allow_internet_access": true,
                   "network": {"allowOut": ["pypi.org", "*.example.com", "1.1.1.1", "8.8.8.0/24"],
                               "denyOut": ["8.8.8.8", "0.0.0.0/0"], "dnsServers": [],
                               "egressProxy": null, "rules": {}, "allowPublicTraffic": false}}),
        ] {
            let r = map(body.clone(), false).unwrap().expect("a policy");
            assert_eq!(r.allow, ["pypi.org", "*.example.com"], "{body}");
            assert_eq!(r.cidrs, ["1.1.1.1", "8.8.8.0/24"], "{body}");
            assert!(!r.default);
        }
    }

    #[test]
    fn denying_all_traffic_without_allow_out_is_no_network() {
        for body in [
            json!({"allow_internet_access": false}),
            json!({"network": {"denyOut": ["0.0.0.0/0"]}}),
            json!({"network": {"denyOut": ["0.0.0.0/0"], "allowOut": []}}),
            json!({}),
            json!({"network": {}}),
            json!({"allow_internet_access": false, "network": {"denyOut": ["10.0.0.0/8"]}}),
        ] {
            assert!(map(body.clone(), true).unwrap().is_none(), "{body}");
        }
    }

    #[test]
    fn allow_internet_access_alone_is_the_keys_default_or_403() {
        let r = map(json!({"allow_internet_access": true}), true).unwrap();
        assert!(r.expect("the default").default);
        let err = map(json!({"allow_internet_access": true}), false).unwrap_err();
        assert!(
            matches!(&err, ServiceError::NetworkNotAllowed(m) if m.contains("no default")),
            "{err:?}"
        );
    }

    #[test]
    fn what_denies_less_than_all_traffic_is_refused_with_how_to_ask() {
        // E2B would allow all traffic but these: more than an allow-list can give.
        let m = bad_request(json!({"network": {"denyOut": ["8.8.8.8"]}}));
        assert!(m.contains("denyOut") && m.contains("8.8.8.8"), "{m}");
        let m = bad_request(json!({"allow_internet_access": true,
                                   "network": {"denyOut": ["::/0"]}}));
        assert!(m.contains("0.0.0.0/0"), "{m}");
        // allowOut alone leaves everything else allowed on E2B.
        let m = bad_request(json!({"network": {"allowOut": ["pypi.org"]}}));
        assert!(m.contains("allowOut") && m.contains("denyOut"), "{m}");
        let m = bad_request(json!({"allow_internet_access": true,
                                   "network": {"allowOut": ["pypi.org"], "denyOut": ["1.2.3.4"]}}));
        assert!(m.contains("1.2.3.4"), "{m}");
    }

    #[test]
    fn options_corral_cannot_carry_out_are_refused_never_ignored() {
        let deny_all = json!(["0.0.0.0/0"]);
        for (key, value, named) in [
            ("dnsServers", json!(["8.8.8.8"]), "dnsServers"),
            (
                "egressProxy",
                json!({"address": "socks5://p:1080"}),
                "egressProxy",
            ),
            (
                "rules",
                json!({"api.example.com": [{"transform": {}}]}),
                "rules",
            ),
            ("allowPublicTraffic", json!(true), "allowPublicTraffic"),
            ("maskRequestHost", json!("x-${PORT}"), "maskRequestHost"),
            ("httpsPorts", json!([8443]), "httpsPorts"),
        ] {
            let body = json!({"network": {"denyOut": deny_all, key: value}});
            let m = bad_request(body);
            assert!(m.contains(named), "{key}: {m}");
        }
        // Names cannot be denied, as in E2B; malformed entries are refused.
        let m = bad_request(json!({"network": {"denyOut": ["evil.com", "0.0.0.0/0"]}}));
        assert!(m.contains("evil.com"), "{m}");
        let m = bad_request(json!({"network": {"denyOut": ["0.0.0.0/0"], "allowOut": ["a b"]}}));
        assert!(m.contains("allowOut"), "{m}");
        // An unknown key is refused when parsed (the handler answers 400 naming it).
        let err = serde_json::from_value::<E2bNetwork>(json!({"allowOutV2": []})).unwrap_err();
        assert!(err.to_string().contains("allowOutV2"), "{err}");
    }
}

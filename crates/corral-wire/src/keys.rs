//! How a request presents its API key, and when a keyless request counts as a local
//! program's: the rules every HTTP face (`corral serve`, `corral mcp --listen`) reads keys by.

use axum::http::header::{self, HeaderName};
use axum::http::HeaderMap;

use crate::error::ApiError;

/// The API key of a request: `Authorization: Bearer KEY`, or `X-API-KEY: KEY` (E2B's control
/// plane). `None` when it carries neither header. Any other `Authorization` (another scheme, no
/// key, bytes that are not text, the header twice) is refused with 401, never read as "no key".
pub fn presented_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let refused = || {
        ApiError::unauthorized(
            "the Authorization header must be `Bearer KEY` (make a key with `corral key create`)",
        )
    };
    let mut authorization = headers.get_all(header::AUTHORIZATION).iter();
    if let Some(value) = authorization.next() {
        if authorization.next().is_some() {
            return Err(refused());
        }
        let value = value.to_str().map_err(|_| refused())?;
        let (scheme, key) = value.trim().split_once(' ').ok_or_else(refused)?;
        let key = key.trim();
        if !scheme.eq_ignore_ascii_case("bearer") || key.is_empty() || key.contains(' ') {
            return Err(refused());
        }
        return Ok(Some(key.to_string()));
    }
    let mut api_key = headers.get_all("x-api-key").iter();
    match (api_key.next(), api_key.next()) {
        (None, _) => Ok(None),
        (Some(value), None) => value
            .to_str()
            .map(|v| Some(v.trim().to_string()))
            .map_err(|_| ApiError::unauthorized("the X-API-KEY header is not a key")),
        (Some(_), Some(_)) => Err(ApiError::unauthorized("more than one X-API-KEY header")),
    }
}

/// Whether `authority` (`host[:port]`, as in `Host` or in an origin) names loopback:
/// `localhost`, an address of 127.0.0.0/8 or `[::1]`, with or without a port. Anything that
/// does not parse as exactly that is not loopback.
fn loopback_authority(authority: &str) -> bool {
    let (host, port) = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, "")) => (Ok(v6), None),
            Some((v6, after)) => match after.strip_prefix(':') {
                Some(port) => (Ok(v6), Some(port)),
                None => return false,
            },
            None => return false,
        },
        None => match authority.split_once(':') {
            Some((host, port)) => (Err(host), Some(port)),
            None => (Err(authority), None),
        },
    };
    let port_ok = port.is_none_or(|p| {
        !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok()
    });
    let host_ok = match host {
        Ok(v6) => v6
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|ip| ip.is_loopback()),
        Err(name) => {
            name.eq_ignore_ascii_case("localhost")
                || name
                    .parse::<std::net::Ipv4Addr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
    };
    port_ok && host_ok
}

/// Whether `origin` is this server's own, whose `Host` is `host` (a loopback authority):
/// `http` (Corral serves no TLS itself), `://`, the same authority, and nothing else (no
/// path, no user information). `https://` with the same authority is another origin: a
/// page served there (by a proxy in front, or another program) is not this server's.
fn own_origin(origin: &str, host: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    scheme.eq_ignore_ascii_case("http")
        && loopback_authority(authority)
        && authority.eq_ignore_ascii_case(host)
}

/// Whether a keyless request can only have come from a local program or from the console. It
/// fails closed: the request must carry exactly one `Host`, which parses to a loopback name or
/// address (a DNS-rebound name does not); at most one `Origin`, which must be this server's
/// own origin (the console's: `http` and the same loopback authority as `Host`), never another loopback
/// page's (a dev server on another port, a sandbox's preview on its own origin, an opaque
/// `null` origin of a sandboxed page); and a `Sec-Fetch-Site`, where a browser sends one, of
/// `same-origin` or `none` (typed by the user). A missing `Host`, or a `Host` or `Origin`
/// that cannot be parsed, is not local. A web page the user visits, and a page a sandbox
/// serves, can neither read from nor post to a keyless server (docs/console.md#origins).
pub fn from_local_program(headers: &HeaderMap) -> bool {
    /// The header's only value as text; `Err` when it appears twice or is not text.
    fn single(headers: &HeaderMap, name: header::HeaderName) -> Result<Option<&str>, ()> {
        let mut values = headers.get_all(name).iter();
        match (values.next(), values.next()) {
            (None, _) => Ok(None),
            (Some(v), None) => v.to_str().map(Some).map_err(|_| ()),
            (Some(_), Some(_)) => Err(()),
        }
    }
    let host = match single(headers, header::HOST) {
        Ok(Some(h)) if loopback_authority(h) => h,
        _ => return false,
    };
    let origin_ok = match single(headers, header::ORIGIN) {
        Ok(None) => true,
        Ok(Some(o)) => own_origin(o, host),
        Err(()) => false,
    };
    let fetch_site_ok = match single(headers, HeaderName::from_static("sec-fetch-site")) {
        Ok(None) => true,
        Ok(Some(site)) => site == "same-origin" || site == "none",
        Err(()) => false,
    };
    origin_ok && fetch_site_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn keyless_requests_must_come_from_local_programs() {
        let headers = |pairs: &[(header::HeaderName, &[u8])]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(k, header::HeaderValue::from_bytes(v).unwrap());
            }
            h
        };
        let (host, origin) = (header::HOST, header::ORIGIN);
        let fetch_site = HeaderName::from_static("sec-fetch-site");
        for ok in [
            headers(&[(host.clone(), b"127.0.0.1:8420")]),
            headers(&[(host.clone(), b"127.0.0.1")]),
            headers(&[(host.clone(), b"127.255.0.9:1")]),
            headers(&[(host.clone(), b"LOCALHOST")]),
            // The console: its own origin.
            headers(&[
                (host.clone(), b"localhost:8420"),
                (origin.clone(), b"http://localhost:8420"),
            ]),
            headers(&[
                (host.clone(), b"[::1]:8420"),
                (origin.clone(), b"HTTP://[::1]:8420"),
            ]),
            headers(&[(host.clone(), b"[::1]")]),
            headers(&[
                (host.clone(), b"127.0.0.1:8420"),
                (fetch_site.clone(), b"same-origin"),
            ]),
            headers(&[
                (host.clone(), b"127.0.0.1:8420"),
                (fetch_site.clone(), b"none"),
            ]),
        ] {
            assert!(from_local_program(&ok), "{ok:?}");
        }
        for bad in [
            headers(&[]),
            headers(&[(origin.clone(), b"http://localhost")]),
            headers(&[(host.clone(), b"")]),
            headers(&[(host.clone(), b"evil.example:8420")]),
            headers(&[(host.clone(), b"127.0.0.1.evil.example")]),
            headers(&[(host.clone(), b"localhost.")]),
            headers(&[(host.clone(), b"127.1")]),
            headers(&[(host.clone(), b"0x7f.0.0.1")]),
            headers(&[(host.clone(), b"[::ffff:127.0.0.1]")]),
            headers(&[(host.clone(), b"::1")]),
            headers(&[(host.clone(), b"[::1")]),
            headers(&[(host.clone(), b"[::1]x")]),
            headers(&[(host.clone(), b"[::1]:")]),
            headers(&[(host.clone(), b"localhost:")]),
            headers(&[(host.clone(), b"localhost:+80")]),
            headers(&[(host.clone(), b"localhost:65536")]),
            headers(&[(host.clone(), b"localhost:80:80")]),
            headers(&[(host.clone(), b"localhost/x")]),
            headers(&[(host.clone(), b"localhost:80/x")]),
            headers(&[(host.clone(), b"user@localhost")]),
            headers(&[(host.clone(), b"127.0.0.1\xff")]),
            headers(&[
                (host.clone(), b"127.0.0.1"),
                (host.clone(), b"evil.example"),
            ]),
            headers(&[
                (host.clone(), b"127.0.0.1:8420"),
                (origin.clone(), b"https://evil.example"),
            ]),
            headers(&[(host.clone(), b"127.0.0.1:8420"), (origin.clone(), b"null")]),
            // Another page of this machine (issue 31: a dev server, a sandbox's preview on its
            // own origin) is not the console: it may not drive a keyless server.
            headers(&[
                (host.clone(), b"localhost:8420"),
                (origin.clone(), b"http://localhost:3000"),
            ]),
            headers(&[
                (host.clone(), b"localhost:8420"),
                (origin.clone(), b"http://8000-sbx-1.localhost:8420"),
            ]),
            headers(&[
                (host.clone(), b"127.0.0.1:8420"),
                (origin.clone(), b"http://localhost:8420"),
            ]),
            // The same authority in a scheme this server does not serve.
            headers(&[
                (host.clone(), b"127.0.0.1:8420"),
                (origin.clone(), b"https://127.0.0.1:8420"),
            ]),
            headers(&[
                (host.clone(), b"127.0.0.1:8420"),
                (fetch_site.clone(), b"cross-site"),
            ]),
            headers(&[
                (host.clone(), b"127.0.0.1:8420"),
                (fetch_site.clone(), b"same-site"),
            ]),
            headers(&[
                (host.clone(), b"127.0.0.1:8420"),
                (origin.clone(), b"http://127.0.0.1:8420"),
                (fetch_site.clone(), b"cross-site"),
            ]),
            headers(&[(host.clone(), b"127.0.0.1"), (origin.clone(), b"")]),
            headers(&[(host.clone(), b"127.0.0.1"), (origin.clone(), b"localhost")]),
            headers(&[
                (host.clone(), b"127.0.0.1"),
                (origin.clone(), b"file://localhost"),
            ]),
            headers(&[
                (host.clone(), b"127.0.0.1"),
                (origin.clone(), b"http://localhost/"),
            ]),
            headers(&[
                (host.clone(), b"127.0.0.1"),
                (origin.clone(), b"http://localhost:3000@evil.example"),
            ]),
            headers(&[
                (host.clone(), b"127.0.0.1"),
                (origin.clone(), b"http://localhost\xff"),
            ]),
            headers(&[
                (host.clone(), b"127.0.0.1"),
                (origin.clone(), b"http://localhost"),
                (origin.clone(), b"http://evil.example"),
            ]),
        ] {
            assert!(!from_local_program(&bad), "{bad:?}");
        }
    }

    #[test]
    fn keys_come_from_bearer_or_x_api_key() {
        let with = |name: &str, value: &[u8]| {
            let mut h = HeaderMap::new();
            h.append(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                header::HeaderValue::from_bytes(value).unwrap(),
            );
            h
        };
        let key = |h: &HeaderMap| presented_key(h).map_err(|e| e.status);
        assert_eq!(key(&HeaderMap::new()), Ok(None));
        assert_eq!(
            key(&with("authorization", b"Bearer  k1 ")),
            Ok(Some("k1".into()))
        );
        assert_eq!(
            key(&with("authorization", b"bearer k1")),
            Ok(Some("k1".into()))
        );
        assert_eq!(key(&with("x-api-key", b"k2")), Ok(Some("k2".into())));
        for refused in [
            &b"Basic dXNlcjo="[..],
            b"Bearer",
            b"Bearer ",
            b"Token k1",
            b"Bearer k1 k2",
            b"Bearer \xff",
            b"",
        ] {
            assert_eq!(
                key(&with("authorization", refused)),
                Err(StatusCode::UNAUTHORIZED),
                "{refused:?}"
            );
        }
        let mut twice = with("authorization", b"Bearer k1");
        twice.append(header::AUTHORIZATION, "Bearer k2".parse().unwrap());
        assert_eq!(key(&twice), Err(StatusCode::UNAUTHORIZED));
        // A Basic header beside a good X-API-KEY is still refused.
        let mut both = with("x-api-key", b"k2");
        both.append(header::AUTHORIZATION, "Basic dXNlcjo=".parse().unwrap());
        assert_eq!(key(&both), Err(StatusCode::UNAUTHORIZED));
    }
}

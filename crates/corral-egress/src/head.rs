//! The request head a program sends its proxy (untrusted bytes): `CONNECT host:port` or a
//! plain-HTTP request in absolute form, parsed by httparse within fixed bounds. A plain request
//! is rewritten for the origin server: origin-form target, its `Host` checked, the hop-by-hop
//! and `Proxy-*` headers dropped, `Connection: close` (one request per connection).

use std::net::IpAddr;

use crate::policy::normalize_name;

/// Longest request head and most header lines read.
pub const MAX_HEAD: usize = 16 << 10;
pub const MAX_HEADERS: usize = 64;

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A host name, normalized ([`normalize_name`]).
    Name(String),
    /// An address literal.
    Address(IpAddr),
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Address(IpAddr::V6(a)) => write!(f, "[{a}]"),
            Host::Address(a) => write!(f, "{a}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// A tunnel (`CONNECT host:port`).
    Connect { host: Host, port: u16 },
    /// One plain-HTTP request: its head as the origin server gets it, and how many body bytes
    /// follow it (`Content-Length`).
    Http {
        host: Host,
        port: u16,
        head: Vec<u8>,
        body: u64,
    },
}

impl Request {
    pub fn target(&self) -> (&Host, u16) {
        match self {
            Request::Connect { host, port } | Request::Http { host, port, .. } => (host, *port),
        }
    }
}

/// Why a head is refused, with the status the client is answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("the request head is longer than {MAX_HEAD} bytes or has more than {MAX_HEADERS} header lines")]
    TooLarge,
    #[error("malformed request: {0}")]
    Malformed(String),
    /// A name that cannot be one: an address in another notation, bad characters.
    #[error("{host:?} is not a valid host name ({why})")]
    InvalidHost { host: String, why: &'static str },
    #[error("{0}")]
    Unsupported(String),
}

impl HeadError {
    /// The HTTP status it is answered with.
    pub fn status(&self) -> u16 {
        match self {
            HeadError::TooLarge => 431,
            HeadError::Unsupported(_) => 501,
            HeadError::Malformed(_) | HeadError::InvalidHost { .. } => 400,
        }
    }
}

/// Headers that concern one connection only, dropped from a forwarded request.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// Parses the host of an authority (`name`, `a.b.c.d`, `[v6]`).
fn parse_host(text: &str) -> Result<Host, HeadError> {
    let invalid = |why| HeadError::InvalidHost {
        host: text.to_string(),
        why,
    };
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        return inner
            .parse::<std::net::Ipv6Addr>()
            .map(|a| Host::Address(IpAddr::V6(a)))
            .map_err(|_| invalid("not an IPv6 address"));
    }
    if let Ok(a) = text.parse::<std::net::Ipv4Addr>() {
        return Ok(Host::Address(IpAddr::V4(a)));
    }
    normalize_name(text).map(Host::Name).map_err(invalid)
}

/// Host and port of an authority; `default` when it has no port (`None`: a port is required).
fn parse_authority(text: &str, default: Option<u16>) -> Result<(Host, u16), HeadError> {
    let authority: http::uri::Authority = text
        .parse()
        .map_err(|e| HeadError::Malformed(format!("target {text:?}: {e}")))?;
    if authority.as_str().contains('@') {
        return Err(HeadError::Malformed(format!(
            "target {text:?} carries user information"
        )));
    }
    let port = match (authority.port_u16(), default) {
        (Some(0), _) => return Err(HeadError::Malformed(format!("target {text:?}: port 0"))),
        (Some(p), _) | (None, Some(p)) => p,
        (None, None) => {
            return Err(HeadError::Malformed(format!(
                "CONNECT target {text:?} has no port"
            )))
        }
    };
    Ok((parse_host(authority.host())?, port))
}

/// Parses `buf`, the first bytes a client sent: `Ok(None)` while the head is incomplete (and
/// shorter than [`MAX_HEAD`]); else the request and the length of its head (what follows is
/// body, or the start of a tunnel's stream).
pub fn parse(buf: &[u8]) -> Result<Option<(Request, usize)>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(&buf[..buf.len().min(MAX_HEAD)]) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => return Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(e) => return Err(HeadError::Malformed(e.to_string())),
    };
    let method = req.method.expect("complete");
    let target = req.path.expect("complete");
    if method == "CONNECT" {
        let (host, port) = parse_authority(target, None)?;
        return Ok(Some((Request::Connect { host, port }, len)));
    }
    if target.starts_with('/') || target == "*" {
        return Err(HeadError::Malformed(format!(
            "{method} {target}: this is a proxy; send the absolute URL (http://host/path), or \
             CONNECT for https"
        )));
    }
    let uri: http::Uri = target
        .parse()
        .map_err(|e| HeadError::Malformed(format!("target {target:?}: {e}")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(HeadError::Unsupported(format!(
                "{target}: for https, tunnel with CONNECT (the proxy does not speak TLS for you)"
            )))
        }
        _ => {
            return Err(HeadError::Unsupported(format!(
                "{target}: only http:// URLs (and CONNECT) are proxied"
            )))
        }
    }
    let authority = uri
        .authority()
        .ok_or_else(|| HeadError::Malformed(format!("{target:?} has no host")))?;
    let (host, port) = parse_authority(authority.as_str(), Some(80))?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let path = if path.is_empty() { "/" } else { path };

    let mut out = format!("{method} {path} HTTP/1.1\r\n").into_bytes();
    let mut body = None;
    let mut host_seen = false;
    // Headers the client's Connection header names are hop-by-hop too.
    let named: Vec<String> = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| {
            String::from_utf8_lossy(h.value)
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .collect();
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        if HOP_BY_HOP.contains(&name.as_str()) || named.contains(&name) {
            continue;
        }
        match name.as_str() {
            "transfer-encoding" => {
                return Err(HeadError::Unsupported(
                    "a request body with Transfer-Encoding: the proxy forwards bodies with a \
                     Content-Length only"
                        .into(),
                ))
            }
            "content-length" => {
                let value = std::str::from_utf8(h.value).unwrap_or("");
                let n = value
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|_| value.trim().bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| HeadError::Malformed(format!("Content-Length {value:?}")))?;
                if body.replace(n).is_some() {
                    return Err(HeadError::Malformed("two Content-Length headers".into()));
                }
            }
            "host" => {
                if host_seen {
                    return Err(HeadError::Malformed("two Host headers".into()));
                }
                host_seen = true;
                let value = std::str::from_utf8(h.value)
                    .map_err(|_| HeadError::Malformed("Host is not ASCII".into()))?;
                if parse_authority(value.trim(), Some(80))? != (host.clone(), port) {
                    return Err(HeadError::Malformed(format!(
                        "the Host header {value:?} is not the request's target {}",
                        authority.as_str()
                    )));
                }
            }
            _ => {}
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    if !host_seen {
        out.extend_from_slice(format!("Host: {}\r\n", authority.as_str()).as_bytes());
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Some((
        Request::Http {
            host,
            port,
            head: out,
            body: body.unwrap_or(0),
        },
        len,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parsed(text: &str) -> Result<Option<(Request, usize)>, HeadError> {
        parse(text.as_bytes())
    }

    /// The endpoint speaks HTTP only (docs/network.md): a SOCKS client's greeting, whole or in
    /// part, is refused at once as a malformed request (400), never waited on.
    #[test]
    fn a_socks_greeting_is_refused_at_once() {
        for greeting in [&[5u8, 1, 0][..], &[5], &[4, 1, 0, 80, 127, 0, 0, 1, 0]] {
            let err = parse(greeting).unwrap_err();
            assert_eq!(err.status(), 400, "{greeting:?}: {err}");
        }
    }

    #[test]
    fn connect_names_a_host_and_a_port() {
        let text = "CONNECT Index.Example.org.:443 HTTP/1.1\r\nHost: index.example.org:443\r\n\r\n\x16\x03";
        let (req, len) = parsed(text).unwrap().unwrap();
        assert_eq!(
            req,
            Request::Connect {
                host: Host::Name("index.example.org".into()),
                port: 443
            }
        );
        assert_eq!(len, text.len() - 2);
        assert_eq!(
            parsed("CONNECT [::1]:22 HTTP/1.1\r\n\r\n")
                .unwrap()
                .unwrap()
                .0,
            Request::Connect {
                host: Host::Address("::1".parse().unwrap()),
                port: 22
            }
        );
        assert_eq!(
            parsed("CONNECT 10.0.0.1:5432 HTTP/1.1\r\n\r\n")
                .unwrap()
                .unwrap()
                .0
                .target()
                .0,
            &Host::Address("10.0.0.1".parse().unwrap())
        );
        assert_eq!(
            parsed("CONNECT index.example.org:443 HTTP/1.1\r\n"),
            Ok(None)
        );
        for bad in [
            "CONNECT index.example.org HTTP/1.1\r\n\r\n",
            "CONNECT index.example.org:0 HTTP/1.1\r\n\r\n",
            "CONNECT user@index.example.org:443 HTTP/1.1\r\n\r\n",
            "CONNECT 127.1:443 HTTP/1.1\r\n\r\n",
            "CONNECT 2130706433:443 HTTP/1.1\r\n\r\n",
            "CONNECT [::1:443 HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            "NOT A REQUEST\r\n\r\n",
        ] {
            let e = parsed(bad).unwrap_err();
            assert_eq!(e.status(), 400, "{bad}: {e}");
        }
    }

    #[test]
    fn plain_requests_are_rewritten_for_the_origin() {
        let text = "GET http://example.com/simple/six/?x=1 HTTP/1.1\r\nHost: example.com\r\n\
             Proxy-Authorization: secret\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n\
             Upgrade: websocket\r\nAccept: */*\r\n\r\nrest";
        let (req, len) = parsed(text).unwrap().unwrap();
        let Request::Http {
            host,
            port,
            head,
            body,
        } = req
        else {
            panic!()
        };
        assert_eq!(
            (host, port, body),
            (Host::Name("example.com".into()), 80, 0)
        );
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /simple/six/?x=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\
             Connection: close\r\n\r\n"
        );
        assert_eq!(len, text.len() - 4);
        let (req, _) = parsed("POST http://a.com:8080 HTTP/1.0\r\nContent-Length: 5\r\n\r\n")
            .unwrap()
            .unwrap();
        let Request::Http {
            port, head, body, ..
        } = req
        else {
            panic!()
        };
        assert_eq!((port, body), (8080, 5));
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nHost: a.com:8080\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn smuggling_and_mismatches_are_refused() {
        for (bad, status) in [
            ("GET http://a.com/ HTTP/1.1\r\nHost: b.com\r\n\r\n", 400),
            ("GET http://a.com/ HTTP/1.1\r\nHost: a.com:81\r\n\r\n", 400),
            (
                "GET http://a.com/ HTTP/1.1\r\nHost: a.com\r\nHost: a.com\r\n\r\n",
                400,
            ),
            (
                "POST http://a.com/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
                400,
            ),
            (
                "POST http://a.com/ HTTP/1.1\r\nContent-Length: +1\r\n\r\n",
                400,
            ),
            (
                "POST http://a.com/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                501,
            ),
            ("GET https://a.com/ HTTP/1.1\r\n\r\n", 501),
            ("GET ftp://a.com/ HTTP/1.1\r\n\r\n", 501),
            ("GET http://u:p@a.com/ HTTP/1.1\r\n\r\n", 400),
            ("GET http://10.1/ HTTP/1.1\r\n\r\n", 400),
        ] {
            let e = parsed(bad).unwrap_err();
            assert_eq!(e.status(), status, "{bad}: {e}");
        }
        let huge = format!(
            "GET http://a.com/ HTTP/1.1\r\nX: {}\r\n",
            "a".repeat(MAX_HEAD)
        );
        assert_eq!(parsed(&huge), Err(HeadError::TooLarge));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X{i}: 1\r\n")).collect();
        let many = format!("GET http://a.com/ HTTP/1.1\r\n{many}\r\n");
        assert_eq!(parsed(&many), Err(HeadError::TooLarge));
    }

    proptest! {
        /// Any bytes: no panic, an incomplete head only below the bound, and a rewritten plain
        /// request is itself a complete head that names its target in `Host` and asks for
        /// `Connection: close`.
        #[test]
        fn any_bytes_parse_within_bounds(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            match parse(&bytes) {
                Ok(None) => prop_assert!(bytes.len() < MAX_HEAD),
                Ok(Some((Request::Http { head, .. }, len))) => {
                    prop_assert!(len <= bytes.len());
                    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS + 2];
                    let mut r = httparse::Request::new(&mut headers);
                    prop_assert!(matches!(r.parse(&head), Ok(httparse::Status::Complete(n)) if n == head.len()));
                    prop_assert!(head.ends_with(b"Connection: close\r\n\r\n"));
                }
                Ok(Some((Request::Connect { .. }, len))) => prop_assert!(len <= bytes.len()),
                Err(_) => {}
            }
        }

        #[test]
        fn connect_heads_split_anywhere_parse_alike(split in 0usize..60) {
            let head = b"CONNECT files.example.org:443 HTTP/1.1\r\nHost: x\r\n\r\n";
            let split = split.min(head.len());
            if split < head.len() {
                prop_assert_eq!(parse(&head[..split]), Ok(None));
            }
            prop_assert!(parse(head).unwrap().is_some());
        }
    }
}

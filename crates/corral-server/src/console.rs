//! The web console at `/` (docs/console.md): a page and its scripts and styles, embedded in
//! the binary, served with a strict Content-Security-Policy; and the headers that make every
//! other answer of the server inert should a browser be led to open it as a page.
//!
//! The console is plain HTML, CSS and JavaScript modules (crates/corral-server/console/),
//! written by hand: no build step, nothing fetched from elsewhere. It talks to the API with
//! the key the user types (kept in the tab's sessionStorage, sent as a header; never a
//! cookie), or with none on a loopback server.

use axum::extract::Request;
use axum::http::{header, HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::http::AppState;

/// The console's own policy: its scripts and styles only, from this server; images from it
/// or inline (`data:` PNGs of results); no plugins, no forms, no base URL, never framed.
/// Results' HTML is shown in `<iframe sandbox srcdoc>` frames, which inherit this policy and
/// are sandboxed without scripts and without the console's origin.
pub const CONSOLE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data: blob:; connect-src 'self'; frame-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Every other answer (JSON, files, events, `/docs`): no script, no frame, a unique origin,
/// whatever it holds and however a browser comes to open it.
pub const API_CSP: &str =
    "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; sandbox";

/// A sandbox's page through the path-based port route (`/v1/sandboxes/{id}/ports/{port}/…`),
/// which shares the API's origin: its scripts may run (a preview of an app still works), but
/// in an opaque origin of their own (no `allow-same-origin`), so they cannot read or post to
/// the API, read the console's storage, set its cookies or register a service worker over it.
/// It replaces any policy the sandbox sent.
pub const PATH_PREVIEW_CSP: &str =
    "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads; \
     frame-ancestors 'none'";

/// Headers by which an answer could act on the origin it is served from beyond its own body
/// (cookies, site data, service workers' scope, reports, redirects, preloads, relaxed
/// isolation or cross-origin reads): removed from the API's own answers, should one ever
/// carry one. A sandbox's page through the path route keeps only [`PREVIEW_HEADERS`].
const ORIGIN_HEADERS: &[&str] = &[
    "set-cookie",
    "set-cookie2",
    "clear-site-data",
    "service-worker-allowed",
    "refresh",
    "link",
    "origin-agent-cluster",
    "content-security-policy-report-only",
    "report-to",
    "reporting-endpoints",
    "nel",
    "access-control-allow-origin",
    "access-control-allow-credentials",
    "access-control-allow-methods",
    "access-control-allow-headers",
    "access-control-expose-headers",
    "access-control-max-age",
    "cross-origin-embedder-policy",
    "cross-origin-resource-policy",
    "timing-allow-origin",
    "x-dns-prefetch-control",
    "permissions-policy",
    "feature-policy",
    "document-policy",
    "supports-loading-mode",
];

/// The headers a sandbox's page through the path route keeps, all others dropped (the page
/// shares the API's origin, and a header a browser learns later must not act on it):
/// - `content-type`, `content-length`, `content-encoding`, `content-language`: what the body
///   is (typed, as `nosniff` requires; compressed bodies pass as they are);
/// - `content-disposition`: a download (the page's sandbox allows downloads);
/// - `cache-control`, `expires`, `etag`, `last-modified`, `vary`, `date`: caching and
///   conditional requests, of this page only;
/// - `accept-ranges`, `content-range`: ranges, for media;
/// - `retry-after`: when a busy app asks to be retried;
/// - `location`: only a relative reference on this origin ([`same_origin_location`]), so a
///   preview's redirect works and is never an open redirect from Corral's origin.
///
/// And a WebSocket's switch (101) keeps its handshake: `upgrade`, `connection`,
/// `sec-websocket-accept`, `sec-websocket-protocol`, `sec-websocket-extensions`.
const PREVIEW_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "content-encoding",
    "content-language",
    "content-disposition",
    "cache-control",
    "expires",
    "etag",
    "last-modified",
    "vary",
    "date",
    "accept-ranges",
    "content-range",
    "retry-after",
];

const SWITCH_HEADERS: &[&str] = &[
    "upgrade",
    "connection",
    "sec-websocket-accept",
    "sec-websocket-protocol",
    "sec-websocket-extensions",
];

/// Drops from `response` (a sandbox's page through the path route) every header but
/// [`PREVIEW_HEADERS`] (and [`SWITCH_HEADERS`] on a 101).
fn keep_preview_headers(response: &mut Response) {
    let switching = response.status() == axum::http::StatusCode::SWITCHING_PROTOCOLS;
    let sent = std::mem::take(response.headers_mut());
    let mut name = None;
    for (next, value) in sent {
        // Repeated values of one header come with no name after the first.
        name = next.or(name);
        let Some(name) = &name else { continue };
        let kept = PREVIEW_HEADERS.contains(&name.as_str())
            || (switching && SWITCH_HEADERS.contains(&name.as_str()))
            || (name == header::LOCATION && same_origin_location(&value));
        if kept {
            response.headers_mut().append(name.clone(), value);
        }
    }
}

/// Whether a `Location` is a relative reference that stays on this origin: no scheme, and
/// not `//host`. A browser drops tabs and newlines from a URL, trims other controls and
/// spaces, and reads `\` as `/` (`/\t/host` and `/\host` are `//host` to it): a value with
/// any control character, space or backslash is not judged, it is dropped.
fn same_origin_location(value: &HeaderValue) -> bool {
    let Ok(text) = value.to_str() else {
        return false;
    };
    if text
        .bytes()
        .any(|b| b.is_ascii_control() || b == b' ' || b == b'\\')
    {
        return false;
    }
    let before_path = text.split(['/', '?', '#']).next().unwrap_or("");
    !text.starts_with("//") && !before_path.contains(':')
}

/// Drops from `response` (a sandbox's page on its own origin) what would reach beyond its
/// host: `Clear-Site-Data` (it clears the whole site's data, the API's host's included) and
/// every cookie with a `Domain` attribute (sent to the API's host and to other sandboxes'
/// hosts under the domain); a cookie that is not text cannot be read, and goes too.
fn keep_host_preview_headers(response: &mut Response) {
    let headers = response.headers_mut();
    headers.remove("clear-site-data");
    let cookies: Vec<HeaderValue> = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter(|cookie| cookie.to_str().is_ok_and(|c| !sets_a_domain(c)))
        .cloned()
        .collect();
    headers.remove(header::SET_COOKIE);
    for cookie in cookies {
        headers.append(header::SET_COOKIE, cookie);
    }
}

/// Whether a `Set-Cookie` value has a `Domain` attribute.
fn sets_a_domain(cookie: &str) -> bool {
    cookie.split(';').skip(1).any(|attribute| {
        let name = attribute.split('=').next().unwrap_or("");
        name.trim().eq_ignore_ascii_case("domain")
    })
}

/// Which origin an answer belongs to, set by the route that made it (a response extension,
/// which nothing a sandbox sends can set); an answer without one is the API's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// One of the console's own files, with [`CONSOLE_CSP`].
    Console,
    /// A sandbox's page through the path-based port route, in the API's origin.
    PathPreview,
    /// A sandbox's page on its own origin (`{port}-{id}.{domain}`): its own headers stand, but
    /// for what reaches beyond its host ([`keep_host_preview_headers`]).
    HostPreview,
}

/// One embedded file of the console.
struct Asset {
    route: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const ASSETS: &[Asset] = &[
    Asset {
        route: "/",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("../console/index.html"),
    },
    Asset {
        route: "/console/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../console/app.js"),
    },
    Asset {
        route: "/console/api.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../console/api.js"),
    },
    Asset {
        route: "/console/render.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../console/render.js"),
    },
    Asset {
        route: "/console/console.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../console/console.css"),
    },
    Asset {
        route: "/console/favicon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../console/favicon.svg"),
    },
];

/// The console's routes: each embedded file at its own path.
pub fn router() -> Router<AppState> {
    ASSETS.iter().fold(Router::new(), |router, asset| {
        router.route(
            asset.route,
            get(move || async move {
                let mut response = (
                    [
                        (header::CONTENT_TYPE, asset.content_type),
                        (header::CONTENT_SECURITY_POLICY, CONSOLE_CSP),
                        (header::CACHE_CONTROL, "no-cache"),
                    ],
                    asset.body,
                )
                    .into_response();
                response.extensions_mut().insert(Served::Console);
                response
            }),
        )
    })
}

/// Adds to every answer of the server: `nosniff`, no referrer, never framed. A sandbox's page
/// through the path route keeps only the [`PREVIEW_HEADERS`] and gets [`PATH_PREVIEW_CSP`];
/// the API's own answers lose the [`ORIGIN_HEADERS`] and get [`API_CSP`]. A sandbox's page on
/// its own origin keeps its headers but those that reach beyond its host (and gets
/// [`API_CSP`] when it sends no policy).
pub async fn security_headers(req: Request, next: Next) -> Response {
    let mut response = next.run(req).await;
    let served = response.extensions().get::<Served>().copied();
    let headers = response.headers_mut();
    match served {
        Some(Served::Console) => {}
        Some(Served::HostPreview) => {
            headers
                .entry(header::CONTENT_SECURITY_POLICY)
                .or_insert(HeaderValue::from_static(API_CSP));
            keep_host_preview_headers(&mut response);
        }
        Some(Served::PathPreview) => {
            keep_preview_headers(&mut response);
            response.headers_mut().insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(PATH_PREVIEW_CSP),
            );
        }
        None => {
            for name in ORIGIN_HEADERS {
                headers.remove(*name);
            }
            headers.insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(API_CSP),
            );
        }
    }
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_console_is_small_and_loads_nothing_from_elsewhere() {
        let total: usize = ASSETS.iter().map(|a| a.body.len()).sum();
        assert!(
            total < 256 * 1024,
            "the console's files weigh {total} bytes"
        );
        for asset in ASSETS {
            let text = std::str::from_utf8(asset.body).unwrap();
            for remote in ["http://", "https://", "//cdn", "@import"] {
                // The SVG's namespace is the one URL allowed.
                let found = text
                    .match_indices(remote)
                    .any(|(i, _)| !text[i..].starts_with("http://www.w3.org/2000/svg"));
                assert!(!found, "{} mentions {remote}", asset.route);
            }
        }
    }

    /// Whether `html` has an event handler attribute (` onclick=`, ` onload =`...).
    fn has_handler(html: &str) -> bool {
        html.match_indices(" on").any(|(i, _)| {
            let rest = &html[i + 3..];
            let name = rest
                .find(|c: char| !c.is_ascii_alphabetic())
                .unwrap_or(rest.len());
            name > 0 && rest[name..].trim_start().starts_with('=')
        })
    }

    #[test]
    fn the_page_has_no_inline_script_or_style() {
        let page = std::str::from_utf8(ASSETS[0].body)
            .unwrap()
            .to_ascii_lowercase();
        for forbidden in ["<script>", "style=", "<style", "javascript:"] {
            assert!(!page.contains(forbidden), "index.html has {forbidden:?}");
        }
        assert!(
            !has_handler(&page),
            "index.html has an event handler attribute"
        );
        assert!(has_handler("<img src=x onerror =alert(1)>"));
        assert!(page.contains("<script type=\"module\" src=\"/console/app.js\"></script>"));
    }

    /// What a sandbox's page through the path route may send: what makes a page, a download,
    /// a cache or a WebSocket work, and nothing that acts on the API's origin.
    #[test]
    fn a_path_preview_keeps_only_what_a_page_needs() {
        use axum::http::StatusCode;
        let mut sent = axum::http::HeaderMap::new();
        for (name, value) in [
            ("content-type", "text/html"),
            ("content-length", "12"),
            ("cache-control", "no-store"),
            ("etag", "\"x\""),
            ("location", "next/page?x=1"),
            ("alt-svc", "h3=\":443\""),
            (
                "strict-transport-security",
                "max-age=63072000; includeSubDomains",
            ),
            ("accept-ch", "Sec-CH-UA-Model"),
            ("critical-ch", "Sec-CH-UA-Model"),
            ("set-login", "logged-in"),
            ("speculation-rules", "/rules.json"),
            ("www-authenticate", "Basic realm=\"corral\""),
            ("clear-site-data", "\"*\""),
            ("origin-agent-cluster", "?0"),
            ("permissions-policy", "camera=*"),
            ("set-cookie", "planted=1; Path=/"),
            ("service-worker-allowed", "/"),
            ("content-security-policy", "script-src 'unsafe-inline'"),
            ("x-made-up", "1"),
        ] {
            sent.append(name, value.parse().unwrap());
        }
        let kept = |status, sent: &axum::http::HeaderMap| {
            let mut response = Response::new(axum::body::Body::empty());
            *response.status_mut() = status;
            *response.headers_mut() = sent.clone();
            keep_preview_headers(&mut response);
            response.headers().clone()
        };
        let page = kept(StatusCode::OK, &sent);
        let mut names: Vec<&str> = page.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "cache-control",
                "content-length",
                "content-type",
                "etag",
                "location"
            ]
        );
        // A redirect stays on this origin, under the preview's path: elsewhere it is dropped.
        for away in [
            "https://elsewhere.example/",
            "//elsewhere.example/",
            "/\\elsewhere",
            "javascript:alert(1)",
        ] {
            let mut redirect = axum::http::HeaderMap::new();
            redirect.insert("location", away.parse().unwrap());
            assert!(kept(StatusCode::FOUND, &redirect).is_empty(), "{away}");
        }
        // A WebSocket's switch keeps its handshake; an ordinary answer does not.
        let mut switch = axum::http::HeaderMap::new();
        switch.insert("upgrade", "websocket".parse().unwrap());
        switch.insert("connection", "Upgrade".parse().unwrap());
        switch.insert(
            "sec-websocket-accept",
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=".parse().unwrap(),
        );
        assert_eq!(kept(StatusCode::SWITCHING_PROTOCOLS, &switch).len(), 3);
        assert!(kept(StatusCode::OK, &switch).is_empty());
    }

    /// A sandbox's page on its own origin keeps its headers, but none that reaches beyond its
    /// host: a cookie with a `Domain` (sent to the API's host and to other sandboxes' hosts
    /// under the same domain) and `Clear-Site-Data` (which clears the whole site's).
    #[test]
    fn a_host_preview_reaches_no_other_host() {
        let mut response = Response::new(axum::body::Body::empty());
        for (name, value) in [
            ("set-cookie", &b"a=1; Path=/"[..]),
            ("set-cookie", b"b=2; Domain=localhost"),
            ("set-cookie", b"c=3;domain"),
            ("set-cookie", b"d=4; Path=/; DOMAIN = .corral.example"),
            ("set-cookie", b"domain=5; Secure"),
            ("set-cookie", b"e=6; \xff"),
            ("clear-site-data", b"\"cookies\""),
            ("content-security-policy", b"script-src 'self'"),
            ("x-app", b"1"),
        ] {
            response
                .headers_mut()
                .append(name, HeaderValue::from_bytes(value).unwrap());
        }
        keep_host_preview_headers(&mut response);
        let headers = response.headers();
        let cookies: Vec<String> = headers
            .get_all(header::SET_COOKIE)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        assert_eq!(cookies, ["a=1; Path=/", "domain=5; Secure"]);
        assert!(!headers.contains_key("clear-site-data"));
        assert_eq!(headers["content-security-policy"], "script-src 'self'");
        assert_eq!(headers["x-app"], "1");
    }

    #[test]
    fn a_location_is_kept_only_as_a_plain_relative_reference_on_this_origin() {
        for kept in ["/", "/a/b?c#d", "a/b", "?x", "#y", "../up"] {
            assert!(
                same_origin_location(&HeaderValue::from_static(kept)),
                "{kept}"
            );
        }
        for dropped in [
            "//evil.example/",
            "/\\evil.example/",
            "\\evil.example",
            "/\t/evil.example/",
            "/\t\\evil.example/",
            "\t//evil.example",
            "https://evil.example/",
            "javascript:alert(1)",
            " //evil.example",
            "/a b",
        ] {
            let value = HeaderValue::from_str(dropped).unwrap();
            assert!(!same_origin_location(&value), "{dropped:?}");
        }
    }
}

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
/// isolation or cross-origin reads). An answer of the API's origin never carries one that
/// Corral did not set: they are removed from whatever a sandbox's server sent.
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

/// Which origin an answer belongs to, set by the route that made it (a response extension,
/// which nothing a sandbox sends can set); an answer without one is the API's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// One of the console's own files, with [`CONSOLE_CSP`].
    Console,
    /// A sandbox's page through the path-based port route, in the API's origin.
    PathPreview,
    /// A sandbox's page on its own origin (`{port}-{id}.{domain}`): its own headers stand.
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

/// Adds to every answer of the server: `nosniff`, no referrer, never framed. Every answer of
/// the API's origin but the console's files loses the [`ORIGIN_HEADERS`] and gets Corral's
/// policy in place of any other: [`PATH_PREVIEW_CSP`] for a sandbox's page through the path
/// route, [`API_CSP`] for the rest. A sandbox's page on its own origin keeps its headers (and
/// gets [`API_CSP`] when it sends no policy).
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
        }
        Some(Served::PathPreview) | None => {
            for name in ORIGIN_HEADERS {
                headers.remove(*name);
            }
            let policy = if served == Some(Served::PathPreview) {
                PATH_PREVIEW_CSP
            } else {
                API_CSP
            };
            headers.insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(policy),
            );
        }
    }
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
}

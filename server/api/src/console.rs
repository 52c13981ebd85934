//! The web console: static HTML, CSS and JavaScript modules embedded in the binary and
//! served at `/` (`/console/<file>` for the assets). The console is a client like any
//! other: it signs in with `POST /v1/auth/login` or a credential and talks to `/v1/rpc`.
//!
//! Every answer carries a strict Content-Security-Policy (scripts, styles and connections
//! from this origin only; no inline script or style; no framing), so a string that reaches
//! the page from history can never run as code.

use axum::{
    extract::Path,
    http::{HeaderName, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};

/// `connect-src 'self'` covers `ws:`/`wss:` to this origin (CSP Level 3).
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// The embedded files: name, content type, body.
const ASSETS: &[(&str, &str, &str)] = &[
    ("style.css", CSS, include_str!("../console/style.css")),
    ("icon.svg", "image/svg+xml", include_str!("../console/icon.svg")),
    ("app.js", JS, include_str!("../console/app.js")),
    ("rpc.js", JS, include_str!("../console/rpc.js")),
    ("dom.js", JS, include_str!("../console/dom.js")),
    ("admin.js", JS, include_str!("../console/admin.js")),
    ("sessions.js", JS, include_str!("../console/sessions.js")),
    ("session.js", JS, include_str!("../console/session.js")),
    ("markdown.js", JS, include_str!("../console/markdown.js")),
];

const INDEX: &str = include_str!("../console/index.html");

fn respond(content_type: &'static str, body: &'static str) -> Response {
    let mut res = body.into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    secure(h);
    res
}

/// The headers every console answer carries.
fn secure(h: &mut axum::http::HeaderMap) {
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // Assets change with the binary; a revalidation is cheap.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
}

/// `GET /`: the console's page.
pub async fn index() -> Response {
    respond("text/html; charset=utf-8", INDEX)
}

/// `GET /console/{file}`: one embedded asset.
pub async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, ty, body)) => respond(ty, body),
        None => {
            let mut res = StatusCode::NOT_FOUND.into_response();
            secure(res.headers_mut());
            res
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_embedded_modules_and_no_inline_code() {
        // Every script and stylesheet the page names is embedded; none is inline (the CSP
        // would refuse it).
        for (tag, attr) in [("<script", "src=\"/console/"), ("<link", "href=\"/console/")] {
            for piece in INDEX.split(tag).skip(1) {
                let end = piece.find('>').expect("tag ends");
                let t = &piece[..end];
                let start = t
                    .find(attr)
                    .unwrap_or_else(|| panic!("{tag} without an embedded {attr}: {t}"));
                let name = t[start + attr.len()..].split('"').next().unwrap();
                assert!(ASSETS.iter().any(|(n, _, _)| *n == name), "{name} is not embedded");
            }
        }
        assert!(!INDEX.contains("<style"), "inline style");
        assert!(!INDEX.contains(" style="), "inline style attribute");
        assert!(!INDEX.contains("onclick"), "inline handler");
        // Modules import each other by relative path; each import names an embedded file.
        for (_, _, body) in ASSETS {
            for line in body.lines().filter(|l| l.starts_with("import ")) {
                let name = line.rsplit("'./").next().unwrap().trim_end_matches("';");
                assert!(
                    ASSETS.iter().any(|(n, _, _)| *n == name),
                    "import of {name} is not embedded"
                );
            }
        }
    }
}

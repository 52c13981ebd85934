//! `view_image`: an image of the workspace (a screenshot, a diagram, a rendered page) shown
//! to the model as image input, as Codex's `view_image` does and opencode's `read` does for
//! images. A tool result is text only, so the image goes in a user message right after the
//! step's results (`model/messages.rs`); the result row in history says what was shown,
//! and a later turn views the image again to see it.

use serde::Deserialize;

use super::Outcome;
use crate::workspace::Workspace;

pub(crate) const VIEW_IMAGE: &str = "view_image";

/// The largest image shown (as the largest image attachment of a prompt).
pub(crate) const MAX: u64 = 2 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    path: String,
}

/// An image a call showed: its path as the model named it, its type and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Image {
    pub path: String,
    pub mime: &'static str,
    pub data: Vec<u8>,
}

/// The image type of `data` by its first bytes: PNG, JPEG, GIF or WebP (what models take,
/// and what clients show a `files.read` of as an image).
pub(crate) fn mime_of(data: &[u8]) -> Option<&'static str> {
    if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if data.starts_with(b"\xff\xd8\xff") {
        Some("image/jpeg")
    } else if data.starts_with(b"GIF87a") || data.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if data.len() >= 12 && data.starts_with(b"RIFF") && &data[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

pub(crate) fn view(ws: &Workspace, a: Args) -> Outcome {
    let data = match ws.read_bounded(&a.path, MAX) {
        Ok(Some(data)) => data,
        Ok(None) => {
            return Outcome::error(format!(
                "{}: larger than the {} MiB an image may have to be viewed",
                a.path,
                MAX >> 20
            ));
        }
        Err(e) => return Outcome::error(e.0),
    };
    let Some(mime) = mime_of(&data) else {
        return Outcome::error(format!(
            "{}: not a PNG, JPEG, GIF or WebP image (read_file reads text files)",
            a.path
        ));
    };
    Outcome {
        ok: true,
        output: format!(
            "{}: {mime}, {} bytes, shown to you below as image input (in this turn only: view it again \
in a later turn to see it).",
            a.path,
            data.len()
        ),
        image: Some(Image {
            path: a.path,
            mime,
            data,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(path: &str) -> Args {
        Args { path: path.into() }
    }

    #[test]
    fn images_are_shown_by_their_bytes_and_other_files_are_not() {
        let t = tempfile::tempdir().unwrap();
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        std::fs::write(t.path().join("shot.png"), &png).unwrap();
        // The name does not decide: a JPEG named .png is a JPEG, text named .png is text.
        std::fs::write(t.path().join("photo.png"), b"\xff\xd8\xff\xe0JFIF").unwrap();
        std::fs::write(t.path().join("notes.png"), b"just text").unwrap();
        std::fs::write(t.path().join("anim.gif"), b"GIF89a....").unwrap();
        std::fs::write(t.path().join("pic.webp"), b"RIFF\0\0\0\0WEBPVP8 ").unwrap();
        std::fs::write(t.path().join("big.png"), vec![0u8; MAX as usize + 1]).unwrap();
        std::fs::create_dir_all(t.path().join(".git")).unwrap();
        std::fs::write(t.path().join(".git/logo.png"), &png).unwrap();
        let ws = Workspace::open(t.path()).unwrap();

        let shown = view(&ws, args("shot.png"));
        assert!(shown.ok, "{}", shown.output);
        assert!(
            shown
                .output
                .starts_with("shot.png: image/png, 16 bytes, shown to you below")
        );
        assert_eq!(
            shown.image,
            Some(Image {
                path: "shot.png".into(),
                mime: "image/png",
                data: png
            })
        );
        assert_eq!(view(&ws, args("photo.png")).image.unwrap().mime, "image/jpeg");
        assert_eq!(view(&ws, args("anim.gif")).image.unwrap().mime, "image/gif");
        assert_eq!(view(&ws, args("pic.webp")).image.unwrap().mime, "image/webp");
        for (path, says) in [
            ("notes.png", "not a PNG, JPEG, GIF or WebP image"),
            ("big.png", "larger than the 2 MiB"),
            ("missing.png", "missing.png"),
            (".git/logo.png", "repository internals"),
            ("../outside.png", "outside the workspace"),
        ] {
            let o = view(&ws, args(path));
            assert!(!o.ok && o.image.is_none(), "{path}");
            assert!(o.output.contains(says), "{path}: {}", o.output);
        }
    }
}

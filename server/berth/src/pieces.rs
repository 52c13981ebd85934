//! Streamed model text, printed once: live deltas carry the byte offset of their piece in
//! the step's text, and the completed step's row carries the whole text, so a client that
//! remembers how many bytes of each step it has shown can print every byte exactly once —
//! across reconnects (deltas from offset 0 again), resyncs and the final row.

use std::collections::HashMap;

#[derive(Default)]
pub struct Pieces {
    /// (turn, step) → bytes shown.
    shown: HashMap<(String, i64), usize>,
}

impl Pieces {
    /// The part of `text` (which starts at byte `offset` of the step's text) not shown yet;
    /// empty when it is all shown, or when it starts beyond what was shown (a gap: the
    /// completed row fills it in).
    pub fn piece(&mut self, turn: &str, step: i64, offset: usize, text: &str) -> String {
        let done = self.shown.entry((turn.to_string(), step)).or_default();
        let end = offset + text.len();
        if offset > *done || end <= *done || !text.is_char_boundary(*done - offset) {
            return String::new();
        }
        let out = text[*done - offset..].to_string();
        *done = end;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_pieces_print_every_byte_once() {
        let mut p = Pieces::default();
        assert_eq!(p.piece("t", 0, 0, "Hel"), "Hel");
        // A repeat after a reconnect (from offset 0) prints only what is new.
        assert_eq!(p.piece("t", 0, 0, "Hello"), "lo");
        assert_eq!(p.piece("t", 0, 3, "lo"), "");
        // A piece beyond what was printed (a gap) waits for the completed row.
        assert_eq!(p.piece("t", 0, 9, "x"), "");
        assert_eq!(p.piece("t", 0, 0, "Hello world"), " world");
        assert_eq!(p.piece("t", 1, 0, "next"), "next");
    }
}

//! Cutting text on UTF-8 character boundaries: pages, continuation reads and streamed
//! chunks never split a character.

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub fn prefix(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `s` in consecutive pieces of at most `max` bytes (`max` ≥ 4), each ending on a
/// character boundary.
pub fn chunks(s: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let piece = prefix(rest, max.max(4));
        out.push(piece);
        rest = &rest[piece.len()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_never_split_a_character() {
        assert_eq!(prefix("héllo", 2), "h");
        assert_eq!(prefix("héllo", 3), "hé");
        assert_eq!(prefix("ok", 10), "ok");
        let s = "Grüße 🚢 漢字";
        let pieces = chunks(s, 5);
        assert!(pieces.iter().all(|p| p.len() <= 5 && !p.is_empty()));
        assert_eq!(pieces.concat(), s);
        assert!(chunks("", 5).is_empty());
    }
}

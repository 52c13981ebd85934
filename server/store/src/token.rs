//! Credential format: `berth_` + 64 hex chars of 32 random bytes + 8 hex chars of checksum.
//!
//! The prefix lets secret scanners find leaked tokens; the checksum (first four bytes of
//! SHA-256 over the prefix and random part) rejects mistyped or made-up tokens without a
//! database read. Only the SHA-256 of the whole token is stored.

use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::migrate::hex;

pub const PREFIX: &str = "berth_";
const RANDOM_HEX: usize = 64;
const CHECK_HEX: usize = 8;

/// A new credential's plaintext.
pub fn generate() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let body = format!("{PREFIX}{}", hex(&bytes));
    let check = hex(&Sha256::digest(body.as_bytes())[..4]);
    format!("{body}{check}")
}

/// Whether `token` has the shape and a valid checksum.
pub fn well_formed(token: &str) -> bool {
    let Some(rest) = token.strip_prefix(PREFIX) else {
        return false;
    };
    if rest.len() != RANDOM_HEX + CHECK_HEX || !rest.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
        return false;
    }
    let (body, check) = token.split_at(PREFIX.len() + RANDOM_HEX);
    hex(&Sha256::digest(body.as_bytes())[..4]) == check
}

/// What is stored: SHA-256 of the whole token.
pub fn digest(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// A new opaque id with a readable prefix, e.g. `ses_3f…`.
pub fn new_id(prefix: &str) -> String {
    let mut bytes = [0u8; 12];
    rand::rng().fill_bytes(&mut bytes);
    format!("{prefix}_{}", hex(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_are_well_formed_and_distinct() {
        let a = generate();
        let b = generate();
        assert!(a.starts_with("berth_") && a.len() == 6 + 64 + 8);
        assert!(well_formed(&a) && well_formed(&b));
        assert_ne!(a, b);
    }

    #[test]
    fn a_flipped_character_fails_the_checksum() {
        let t = generate();
        let mut chars: Vec<char> = t.chars().collect();
        chars[10] = if chars[10] == '0' { '1' } else { '0' };
        let bad: String = chars.into_iter().collect();
        assert!(!well_formed(&bad));
        assert!(!well_formed("berth_short"));
        assert!(!well_formed(&t.to_uppercase()));
        assert!(!well_formed(""));
    }
}

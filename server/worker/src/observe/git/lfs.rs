//! Git LFS's clean filter, done in process: what `git-lfs clean` would store for a file
//! that `.gitattributes` gives `filter=lfs`, when git-lfs is the configured driver. The file
//! is never handed to git-lfs (no configured command ever runs); its pointer is computed
//! here, as git-lfs computes it, so a repository using LFS is compared as git compares it.

use sha2::{Digest, Sha256};

/// The pointer format's versions git-lfs reads (the second is its earliest name).
const VERSIONS: [&str; 2] = [
    "https://git-lfs.github.com/spec/v1",
    "https://hawser.github.com/spec/v1",
];

/// Bytes under which content that parses as a pointer is stored as it is (git-lfs's
/// `clean` passes such a file through rather than storing a pointer to a pointer).
const POINTER_MAX: usize = 512;

/// What git-lfs's clean filter stores for `data`.
pub(super) fn clean(data: Vec<u8>) -> Vec<u8> {
    if is_pointer(&data) {
        return data;
    }
    let sha = Sha256::digest(&data);
    pointer(&format!("{sha:x}"), data.len() as u64)
}

/// The pointer to content of `size` bytes whose SHA-256 is `sha256_hex`; empty content's
/// pointer is empty, as git-lfs writes it.
pub(super) fn pointer(sha256_hex: &str, size: u64) -> Vec<u8> {
    if size == 0 {
        return Vec::new();
    }
    format!("version {}\noid sha256:{sha256_hex}\nsize {size}\n", VERSIONS[0]).into_bytes()
}

/// Whether `data` is already a pointer, as git-lfs parses one: a known `version` first,
/// then an `oid sha256:` of 64 hex digits and a `size`, one `key value` a line.
fn is_pointer(data: &[u8]) -> bool {
    if data.is_empty() || data.len() >= POINTER_MAX {
        return false;
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    let mut lines = text.trim().lines();
    let version_ok = lines
        .next()
        .and_then(|l| l.strip_prefix("version "))
        .is_some_and(|v| VERSIONS.contains(&v));
    if !version_ok {
        return false;
    }
    let (mut oid, mut size) = (false, false);
    for line in lines {
        let Some((key, value)) = line.split_once(' ') else {
            return false;
        };
        match key {
            "oid" => {
                oid = value
                    .strip_prefix("sha256:")
                    .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
            }
            "size" => size = value.parse::<u64>().is_ok(),
            _ if key.starts_with("ext-") => {}
            _ => return false,
        }
    }
    oid && size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_becomes_its_pointer_and_a_pointer_stays_one() {
        let stored = clean(b"hello\n".to_vec());
        assert_eq!(
            String::from_utf8(stored.clone()).unwrap(),
            "version https://git-lfs.github.com/spec/v1\n\
             oid sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03\nsize 6\n"
        );
        assert_eq!(clean(stored.clone()), stored, "a pointer is stored as it is");
        assert_eq!(clean(Vec::new()), Vec::<u8>::new());
        let not_quite = b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 6\n".to_vec();
        assert_ne!(clean(not_quite.clone()), not_quite);
    }
}

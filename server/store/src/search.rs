//! `session.search`: literal text over a session's rows, under a fixed fence, in pages
//! bounded in work.
//!
//! Matching is the `regex` crate's on an escaped literal: case-insensitive matching there is
//! Unicode *simple* case folding (CaseFolding.txt statuses C and S, no normalization), which
//! is exactly the contract, so no folding table is kept here. Whole-word matching checks
//! the characters next to a match against the contract's word characters.

use std::sync::LazyLock;

use berth_protocol::{
    ErrorCode, Position, RowField, SearchCursor, SearchHit, SessionSearchParams, SessionSearchResult,
};
use regex::{Regex, RegexBuilder};

use crate::{Cached, Result, Store, StoreError};

/// Rows read per page, at most.
const PAGE_ROWS: i64 = 500;
/// Text bytes read per page, at most (one larger row is still read whole, alone).
const PAGE_BYTES: i64 = 4 << 20;
/// Hits per page, at most (a page may stop inside a row and resume there).
const PAGE_HITS: usize = 200;
/// The longest query accepted.
pub const QUERY_MAX_BYTES: usize = 1024;
/// Bytes of text one page may examine in all, counted as the matcher reads them: a
/// whole-word query whose candidates are not whole words (`aaaa` in a run of `a`) is tried
/// again one character on, each try reading up to the query's length, so without this a
/// page of 4 MiB could cost billions of comparisons. Past it the page ends with a cursor
/// where the matcher stopped.
#[cfg(not(test))]
const PAGE_WORK: usize = 64 << 20;
#[cfg(test)]
const PAGE_WORK: usize = 1 << 20;

/// What [`Matcher::find_within`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// A hit, as a byte range.
    Hit(usize, usize),
    /// No hit in the rest of the text.
    End,
    /// The page's work is spent: resume at this byte.
    Spent(usize),
}

/// Letters, marks, decimal digits, connector punctuation and join controls.
static WORD: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[\p{L}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]$").expect("word class compiles"));

/// Whether `c` is a word character for `wholeWord`.
pub fn is_word(c: char) -> bool {
    let mut buf = [0u8; 4];
    WORD.is_match(c.encode_utf8(&mut buf))
}

/// A compiled literal query.
#[derive(Debug, Clone)]
pub struct Matcher {
    re: Regex,
    whole_word: bool,
}

impl Matcher {
    /// `None` for an empty or oversized query.
    pub fn new(query: &str, case_sensitive: bool, whole_word: bool) -> Option<Matcher> {
        if query.is_empty() || query.len() > QUERY_MAX_BYTES {
            return None;
        }
        let re = RegexBuilder::new(&regex::escape(query))
            .case_insensitive(!case_sensitive)
            .unicode(true)
            .build()
            .ok()?;
        Some(Matcher { re, whole_word })
    }

    /// The first hit that starts at or after byte `from` (rounded up to a character
    /// boundary). Hits do not overlap: continue from the previous end. `work` counts the
    /// bytes examined on the page so far; once it reaches [`PAGE_WORK`] the search stops
    /// where it is ([`Found::Spent`]), though never before trying once.
    pub fn find_within(&self, text: &str, from: usize, work: &mut usize) -> Found {
        let mut at = from.min(text.len());
        while !text.is_char_boundary(at) {
            at += 1;
        }
        let mut tried = false;
        loop {
            if tried && *work >= PAGE_WORK {
                return Found::Spent(at);
            }
            tried = true;
            let Some(m) = self.re.find_at(text, at) else {
                *work += text.len() - at;
                return Found::End;
            };
            *work += m.end() - at;
            if !self.whole_word || self.bounded(text, m.start(), m.end()) {
                return Found::Hit(m.start(), m.end());
            }
            // A candidate that is not a whole word may hide one that starts inside it.
            at = m.start() + text[m.start()..].chars().next().map_or(1, char::len_utf8);
            if at > text.len() {
                return Found::End;
            }
        }
    }

    fn bounded(&self, text: &str, start: usize, end: usize) -> bool {
        let before = text[..start].chars().next_back();
        let after = text[end..].chars().next();
        !before.is_some_and(is_word) && !after.is_some_and(is_word)
    }
}

impl Store {
    /// One page of `session.search`. Each page reads at most [`PAGE_ROWS`] rows and about
    /// [`PAGE_BYTES`] of text, so a long stretch without hits still advances page by page;
    /// rows published after `through` are never read.
    pub async fn search(&self, tenant_id: &str, p: &SessionSearchParams) -> Result<SessionSearchResult> {
        let matcher =
            Matcher::new(&p.query, p.case_sensitive, p.whole_word).ok_or(StoreError::Code(ErrorCode::BadParams))?;
        let mut client = self.pool.get().await?;
        let client = crate::tenant_tx_in_order(&mut client, tenant_id).await?;
        let session_id = p.session_id.as_str();
        let (last, cleared) = self.fence(&client, tenant_id, session_id).await?;
        let after = p.after.as_ref().map(|a| a.position.source_sequence);
        let through = crate::history::read_fence(p.through, after, last, cleared)?;
        // Resume inside the cursor's row when it names a field; otherwise after it.
        let (lo, inclusive) = match &p.after {
            None => (
                Position {
                    source_sequence: 0,
                    item_index: -1,
                },
                false,
            ),
            Some(c) => (c.position, c.field.is_some()),
        };
        // Sizes first, to bound the page's work by rows and bytes before reading bodies.
        // A row-value comparison the primary key serves as a range scan (an OR would not).
        let from = if inclusive { ">=" } else { ">" };
        let sizes = client
            .qa(
                &format!(
                    "SELECT source_sequence, item_index,
                            octet_length(body)::bigint + coalesce(octet_length(thinking), 0)::bigint
                       FROM rows WHERE session_id = $1 AND tenant_id = $2 AND NOT hidden AND source_sequence <= $3
                        AND (source_sequence, item_index) {from} ($4, $5)
                      ORDER BY source_sequence, item_index LIMIT $6"
                ),
                &[
                    &session_id,
                    &tenant_id,
                    &through,
                    &lo.source_sequence,
                    &lo.item_index,
                    &(PAGE_ROWS + 1),
                ],
            )
            .await?;
        let mut take = 0usize;
        let mut used = 0i64;
        for s in sizes.iter().take(PAGE_ROWS as usize) {
            let size: i64 = s.get(2);
            if take > 0 && used + size > PAGE_BYTES {
                break;
            }
            used += size;
            take += 1;
        }
        if take == 0 {
            return Ok(SessionSearchResult {
                through,
                hits: Vec::new(),
                next_after: None,
            });
        }
        let more = take < sizes.len();
        let hi = Position {
            source_sequence: sizes[take - 1].get(0),
            item_index: sizes[take - 1].get(1),
        };
        let rows = client
            .qa(
                &format!(
                    "SELECT source_sequence, item_index, body, thinking
                       FROM rows WHERE session_id = $1 AND tenant_id = $2 AND NOT hidden
                        AND (source_sequence, item_index) {from} ($3, $4)
                        AND (source_sequence, item_index) <= ($5, $6)
                      ORDER BY source_sequence, item_index"
                ),
                &[
                    &session_id,
                    &tenant_id,
                    &lo.source_sequence,
                    &lo.item_index,
                    &hi.source_sequence,
                    &hi.item_index,
                ],
            )
            .await?;
        let mut hits = Vec::new();
        let mut work = 0;
        for r in &rows {
            let position = Position {
                source_sequence: r.get(0),
                item_index: r.get(1),
            };
            let body: &str = r.get(2);
            let thinking: Option<&str> = r.get(3);
            // Where to start in this row: the cursor's field and offset for the resumed row.
            let (start_field, start_offset) = match &p.after {
                Some(c) if inclusive && c.position == position => {
                    (c.field.unwrap_or(RowField::Body), c.offset.unwrap_or(0) as usize)
                }
                _ => (RowField::Body, 0),
            };
            for (field, text) in [(RowField::Body, Some(body)), (RowField::Thinking, thinking)] {
                let Some(text) = text else { continue };
                if field < start_field {
                    continue;
                }
                let mut at = if field == start_field { start_offset } else { 0 };
                loop {
                    // Where the page stops in this field, if it does: at a hit past the
                    // page's (the next page resumes at it), or where its work ran out.
                    let stop = match matcher.find_within(text, at, &mut work) {
                        Found::End => break,
                        Found::Spent(at) => at,
                        Found::Hit(s, _) if hits.len() == PAGE_HITS => s,
                        Found::Hit(s, e) => {
                            hits.push(SearchHit {
                                position,
                                field,
                                start: s as u64,
                                end: e as u64,
                            });
                            at = e.max(s + 1);
                            if at > text.len() {
                                break;
                            }
                            continue;
                        }
                    };
                    return Ok(SessionSearchResult {
                        through,
                        hits,
                        next_after: Some(SearchCursor {
                            position,
                            field: Some(field),
                            offset: Some(stop as u64),
                        }),
                    });
                }
            }
        }
        Ok(SessionSearchResult {
            through,
            hits,
            next_after: more.then_some(SearchCursor {
                position: hi,
                field: None,
                offset: None,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(hex: &str) -> char {
        char::from_u32(u32::from_str_radix(hex.trim(), 16).expect("hex")).expect("scalar")
    }

    /// (code, status, mapping) lines of the Unicode Character Database's CaseFolding.txt.
    fn folding() -> Vec<(char, char, String)> {
        include_str!("../testdata/CaseFolding.txt")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                let f: Vec<&str> = l.split(';').collect();
                let mapping = f[2].split_whitespace().map(ch).collect();
                (ch(f[0]), f[1].trim().chars().next().expect("status"), mapping)
            })
            .collect()
    }

    impl Matcher {
        /// [`Matcher::find_within`] without a budget.
        fn find(&self, text: &str, from: usize) -> Option<(usize, usize)> {
            match self.find_within(text, from, &mut 0) {
                Found::Hit(s, e) => Some((s, e)),
                _ => None,
            }
        }
    }

    fn hits(query: &str, text: &str, case_sensitive: bool, whole_word: bool) -> Vec<(usize, usize)> {
        let m = Matcher::new(query, case_sensitive, whole_word).expect("query");
        let mut out = Vec::new();
        let mut at = 0;
        while let Some((s, e)) = m.find(text, at) {
            out.push((s, e));
            at = e;
        }
        out
    }

    /// A whole-word query of 1 KiB of `a` over a long run of `a` (every position a
    /// candidate, none a whole word) is bounded per page: the page stops with its work spent
    /// where the matcher stopped, each page moves on, and the search ends with no hit.
    #[test]
    fn a_page_stops_when_its_work_is_spent_and_the_next_goes_on() {
        let query = "a".repeat(QUERY_MAX_BYTES);
        let run = 16 << 10;
        let text = format!("{} {query}", "a".repeat(run));
        let m = Matcher::new(&query, true, true).expect("query");
        let (mut at, mut pages) = (0, 0);
        let hit = loop {
            pages += 1;
            let mut work = 0;
            match m.find_within(&text, at, &mut work) {
                Found::Spent(next) => {
                    assert!(next > at, "page {pages} moved on");
                    assert!(work < PAGE_WORK + 2 * QUERY_MAX_BYTES, "{work}");
                    at = next;
                }
                Found::Hit(s, e) => break (s, e),
                Found::End => panic!("the whole word at the end was missed"),
            }
        };
        assert_eq!(hit, (text.len() - QUERY_MAX_BYTES, text.len()));
        let bound = run * QUERY_MAX_BYTES / PAGE_WORK + 2;
        assert!((2..=bound).contains(&pages), "{pages} pages");
    }

    /// Every simple folding (statuses C and S) matches both ways, among them letters whose
    /// folding is not their lowercase (Cherokee, final sigma, long s, Kelvin sign, …).
    #[test]
    fn simple_case_folding_matches_every_c_and_s_mapping() {
        let mut differs_from_lowercase = 0;
        for (code, status, mapping) in folding() {
            if status != 'C' && status != 'S' {
                continue;
            }
            let folded = mapping.chars().next().expect("one char");
            if code.to_lowercase().ne(std::iter::once(folded)) {
                differs_from_lowercase += 1;
            }
            let (a, b) = (code.to_string(), folded.to_string());
            assert_eq!(
                hits(&a, &format!("#{b}%"), false, false),
                vec![(1, 1 + b.len())],
                "{code:?} → {folded:?}"
            );
            assert_eq!(
                hits(&b, &format!("#{a}%"), false, false),
                vec![(1, 1 + a.len())],
                "{folded:?} → {code:?}"
            );
            assert!(
                hits(&a, &b, true, false).is_empty(),
                "case-sensitive {code:?} matched {folded:?}"
            );
        }
        assert!(
            differs_from_lowercase > 50,
            "the table must include foldings unlike lowercasing"
        );
    }

    /// Full foldings that expand (status F) are not simple foldings: `ß` does not match
    /// `ss`, `İ` does not match `i̇`, and so on for every one without an S mapping.
    #[test]
    fn full_folding_expansions_do_not_match() {
        let table = folding();
        let simple: std::collections::HashSet<char> = table
            .iter()
            .filter(|(_, s, _)| *s == 'C' || *s == 'S')
            .map(|(c, _, _)| *c)
            .collect();
        let mut checked = 0;
        for (code, status, mapping) in &table {
            if *status != 'F' || simple.contains(code) {
                continue;
            }
            checked += 1;
            assert!(
                hits(&code.to_string(), mapping, false, false).is_empty(),
                "{code:?} matched its full folding {mapping:?}"
            );
            let upper: String = mapping.to_uppercase();
            assert!(
                hits(mapping, &code.to_string(), false, false).is_empty(),
                "{mapping:?} matched {code:?}"
            );
            assert!(
                hits(&upper, &code.to_string(), false, false).is_empty(),
                "{upper:?} matched {code:?}"
            );
        }
        assert!(checked > 50);
    }

    #[test]
    fn word_characters_follow_the_unicode_categories() {
        for line in include_str!("../testdata/word-chars.txt").lines() {
            if line.starts_with('#') {
                continue;
            }
            let f: Vec<&str> = line.split(';').collect();
            let c = ch(f[0]);
            assert_eq!(is_word(c), f[2] == "1", "U+{} ({})", f[0], f[1]);
        }
    }

    #[test]
    fn whole_words_need_non_word_neighbours() {
        assert_eq!(
            hits("cat", "cat catalog bobcat cat_x (cat)", true, true),
            vec![(0, 3), (26, 29)]
        );
        // Join controls and marks are word characters; other punctuation is not.
        assert!(hits("ab", "ab\u{200D}", true, true).is_empty());
        assert!(hits("e", "e\u{301}", true, true).is_empty());
        assert_eq!(hits("ab", "-ab-", true, true), vec![(1, 3)]);
        // A candidate that is not a whole word does not hide one starting inside it.
        assert_eq!(hits("a a", "xa a a", true, true), vec![(3, 6)]);
        // Digits from other scripts are decimal digits.
        assert!(hits("x", "x\u{0663}", true, true).is_empty());
        // Case-insensitive and whole word together.
        assert_eq!(hits("straße", "STRASSE Straße", false, true), vec![(8, 15)]);
    }

    #[test]
    fn resumes_from_an_offset_on_a_character_boundary() {
        let m = Matcher::new("é", false, false).expect("query");
        let text = "éxÉ";
        assert_eq!(m.find(text, 0), Some((0, 2)));
        assert_eq!(m.find(text, 1), Some((3, 5)));
        assert_eq!(m.find(text, 5), None);
    }

    #[test]
    fn empty_and_oversized_queries_are_refused() {
        assert!(Matcher::new("", false, false).is_none());
        assert!(Matcher::new(&"x".repeat(QUERY_MAX_BYTES + 1), false, false).is_none());
        // Pattern syntax is literal text.
        assert_eq!(hits("a.c", "abc a.c", true, false), vec![(4, 7)]);
    }
}

//! `.gitattributes`: the filter drivers this module refuses, Git LFS's (done in process, see
//! [`super::lfs`]), and the end-of-line conversion (`text`, `eol`, `crlf`, with
//! `core.autocrlf` and `core.eol`) git applies to a worktree file before comparing it or
//! storing it. The conversion is gix-filter's pure Rust one; no filter driver is ever run
//! (any other configured one is refused before anything is compared).

use std::{
    ffi::OsStr,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

use berth_protocol::RpcError;
use gix::bstr::ByteSlice;
use gix_attributes::{
    Search, StateRef,
    search::{MetadataCollection, Outcome},
};
use gix_filter::eol::{self, AttributesDigest, Stats};

use super::{broken, contents, unsupported};
use crate::workspace::Workspace;

/// The attributes this module reads, in this order.
const SELECTED: [&str; 5] = ["text", "eol", "crlf", "diff", "filter"];

/// The attribute rules in force, and the configuration that completes them.
pub(super) struct Attributes {
    search: Search,
    collection: MetadataCollection,
    config: eol::Configuration,
    /// git-lfs is the configured `lfs` filter driver.
    lfs: bool,
}

/// What the attributes say about one path.
pub(super) struct PathAttributes {
    /// How its line endings are converted on the way into git.
    pub(super) digest: AttributesDigest,
    /// `-diff` (or `binary`): git diffs it as binary whatever its content.
    pub(super) no_diff: bool,
    /// `filter=lfs`, with git-lfs configured: git stores its LFS pointer.
    pub(super) lfs: bool,
}

impl Attributes {
    /// The rules of the worktree's attribute files `files` (relative paths, read as regular
    /// files through the workspace, never through a symlink, as git reads them) and the
    /// repository's `info/attributes`, after refusing any filter driver with a configured
    /// command (comparing without running it would be wrong, and running it is never allowed).
    pub(super) fn load(repo: &gix::Repository, ws: &Workspace, files: &[Vec<u8>]) -> Result<Attributes, RpcError> {
        let mut collection = MetadataCollection::default();
        let mut search = Search::default();
        let add = |search: &mut Search, collection: &mut MetadataCollection, text: &[u8], source: PathBuf, root| {
            search
                .add_patterns_buffer(text, source, root, collection, true)
                .map_err(broken)
        };
        add(
            &mut search,
            &mut collection,
            b"[attr]binary -diff -merge -text",
            "[builtin]".into(),
            None,
        )?;
        // Later lists win: shallower files first, then deeper ones, then `info/attributes`.
        let mut files: Vec<&Vec<u8>> = files.iter().collect();
        files.sort_by_key(|rel| (rel.iter().filter(|b| **b == b'/').count(), rel.as_slice()));
        let root = ws.root();
        let config = repo.config_snapshot();
        let lfs = git_lfs(&config);
        for rel in files {
            let Some(text) = ws
                .open_regular(Path::new(OsStr::from_bytes(rel)))
                .ok()
                .and_then(|f| contents(f).ok())
            else {
                continue;
            };
            refuse_drivers(&config, lfs, &text)?;
            add(
                &mut search,
                &mut collection,
                &text,
                root.join(OsStr::from_bytes(rel)),
                Some(root),
            )?;
        }
        // `info/attributes` is the repository's, shared by its linked worktrees.
        let info = repo.common_dir().join("info/attributes");
        if let Ok(text) = std::fs::read(&info) {
            refuse_drivers(&config, lfs, &text)?;
            add(&mut search, &mut collection, &text, info, None)?;
        }
        let auto_crlf = match config.string("core.autocrlf") {
            Some(v) if v.eq_ignore_ascii_case(b"input") => eol::AutoCrlf::Input,
            Some(_) if config.boolean("core.autocrlf") == Some(true) => eol::AutoCrlf::Enabled,
            _ => eol::AutoCrlf::Disabled,
        };
        let eol = match config.string("core.eol") {
            Some(v) if v.eq_ignore_ascii_case(b"lf") => Some(eol::Mode::Lf),
            Some(v) if v.eq_ignore_ascii_case(b"crlf") => Some(eol::Mode::CrLf),
            _ => None,
        };
        Ok(Attributes {
            search,
            collection,
            config: eol::Configuration { auto_crlf, eol },
            lfs,
        })
    }

    /// The rules that can apply to `path`: the attribute files of its directory and of each
    /// directory above it.
    pub(super) fn for_path(repo: &gix::Repository, ws: &Workspace, path: &[u8]) -> Result<Attributes, RpcError> {
        let mut files = vec![b".gitattributes".to_vec()];
        for (at, _) in path.iter().enumerate().filter(|(_, b)| **b == b'/') {
            files.push([&path[..=at], b".gitattributes"].concat());
        }
        Attributes::load(repo, ws, &files)
    }

    /// What the attributes (and `core.autocrlf`, `core.eol`) say about `path`, as git's
    /// `convert.c` combines them.
    pub(super) fn at(&self, path: &[u8]) -> PathAttributes {
        let mut out = Outcome::default();
        out.initialize_with_selection(&self.collection, SELECTED);
        self.search.pattern_matching_relative_path(
            path.as_bstr(),
            gix_attributes::glob::pattern::Case::Sensitive,
            Some(false),
            &mut out,
        );
        let states: Vec<StateRef<'_>> = out.iter_selected().map(|m| m.assignment.state).collect();
        let [text, eol_attr, crlf, diff, filter] = states[..] else {
            unreachable!("one state per selected attribute")
        };
        let text_digest = |s: StateRef<'_>| match s {
            StateRef::Set => Some(AttributesDigest::Text),
            StateRef::Unset => Some(AttributesDigest::Binary),
            StateRef::Value(v) if v.as_bstr() == "input" => Some(AttributesDigest::TextInput),
            StateRef::Value(v) if v.as_bstr() == "auto" => Some(AttributesDigest::TextAuto),
            _ => None,
        };
        let mut digest = text_digest(text).or_else(|| text_digest(crlf));
        if digest != Some(AttributesDigest::Binary) {
            let mode = match eol_attr {
                StateRef::Value(v) if v.as_bstr() == "lf" => Some(eol::Mode::Lf),
                StateRef::Value(v) if v.as_bstr() == "crlf" => Some(eol::Mode::CrLf),
                _ => None,
            };
            digest = match (digest, mode) {
                (Some(AttributesDigest::TextAuto), Some(eol::Mode::Lf)) => Some(AttributesDigest::TextAutoInput),
                (Some(AttributesDigest::TextAuto), Some(eol::Mode::CrLf)) => Some(AttributesDigest::TextAutoCrlf),
                (_, Some(eol::Mode::CrLf)) => Some(AttributesDigest::TextCrlf),
                (_, Some(eol::Mode::Lf)) => Some(AttributesDigest::TextInput),
                (d, None) => d,
            };
        }
        let digest = match digest {
            None => self.config.auto_crlf.into(),
            Some(AttributesDigest::Text) => self.config.to_eol().into(),
            Some(d) => d,
        };
        PathAttributes {
            digest,
            no_diff: matches!(diff, StateRef::Unset),
            lfs: self.lfs && matches!(filter, StateRef::Value(v) if v.as_bstr() == "lfs"),
        }
    }

    /// Whether git stores the file at `path` as its LFS pointer.
    pub(super) fn lfs(&self, path: &[u8]) -> bool {
        self.lfs && self.at(path).lfs
    }

    /// Whether git converts the CRLFs of a file at `path` whose content has `stats` on its
    /// way in (as `convert_to_git` decides it; `index_has_crlf` tells whether the index's
    /// blob holds CRLFs, which `text=auto` leaves alone).
    pub(super) fn converts(&self, path: &[u8], stats: &Stats, index_has_crlf: impl FnOnce() -> bool) -> bool {
        if stats.crlf == 0 {
            return false;
        }
        let digest = self.at(path).digest;
        if digest == AttributesDigest::Binary {
            return false;
        }
        !(digest.is_auto_text() && (stats.is_binary() || index_has_crlf()))
    }

    /// The content git stores for the worktree file `data` at `path`: its LFS pointer, or
    /// its line endings converted as the attributes say. `indexed` gives the index's blob at
    /// `path`, which `text=auto` consults (a CRLF already in the index is left alone, as git
    /// does).
    pub(super) fn clean(
        &self,
        path: &[u8],
        data: Vec<u8>,
        indexed: &mut dyn FnMut() -> Option<Vec<u8>>,
    ) -> Result<Vec<u8>, RpcError> {
        // Only LFS or a CR changes anything: without either, nothing to look up.
        let cr = data.contains(&b'\r');
        if !self.lfs && !cr {
            return Ok(data);
        }
        let attributes = self.at(path);
        if attributes.lfs {
            return Ok(super::lfs::clean(data));
        }
        let digest = attributes.digest;
        if !cr || digest == AttributesDigest::Binary {
            return Ok(data);
        }
        let mut buf = Vec::new();
        let options = eol::convert_to_git::Options {
            round_trip_check: None,
            config: self.config,
        };
        let converted = eol::convert_to_git(
            &data,
            digest,
            &mut buf,
            &mut |out: &mut Vec<u8>| {
                Ok(indexed().map(|blob| {
                    out.clear();
                    out.extend_from_slice(&blob);
                }))
            },
            options,
        )
        .map_err(|e| broken(format!("{e:?}")))?;
        Ok(if converted { buf } else { data })
    }
}

/// Whether the `lfs` filter driver is git-lfs (`git lfs install` configures it so): its
/// clean filter is then done in process.
fn git_lfs(config: &gix::config::Snapshot<'_>) -> bool {
    let commands: Vec<_> = ["clean", "smudge", "process"]
        .iter()
        .filter_map(|k| config.string(format!("filter.lfs.{k}").as_str()))
        .collect();
    !commands.is_empty() && commands.iter().all(|c| c.trim_start().starts_with(b"git-lfs "))
}

/// `unsupported {feature: "external-filter"}` when `text` (an attribute file) selects a
/// filter driver that has a command configured (other than git-lfs, when `lfs` says it is
/// the `lfs` driver).
fn refuse_drivers(config: &gix::config::Snapshot<'_>, lfs: bool, text: &[u8]) -> Result<(), RpcError> {
    for token in text.split(|b| b.is_ascii_whitespace()) {
        let Some(name) = token.strip_prefix(b"filter=") else {
            continue;
        };
        if lfs && name == b"lfs" {
            continue;
        }
        let name = String::from_utf8_lossy(name);
        let configured = ["clean", "smudge", "process"]
            .iter()
            .any(|k| config.string(format!("filter.{name}.{k}").as_str()).is_some());
        if configured {
            return Err(unsupported("external-filter"));
        }
    }
    Ok(())
}

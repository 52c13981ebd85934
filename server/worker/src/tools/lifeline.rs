//! The worker's lifeline: what a command it starts (a shell call, a stdio MCP server) needs
//! to die with it, however the worker ends — SIGKILL and crashes included, when no code of
//! the worker runs to clean up.
//!
//! A pipe whose write end the worker holds for as long as it lives (close-on-exec, so no
//! child inherits it). Each command starts under `sh -c GUARD sh …`, given a copy of the
//! read end: the script moves it to fd 3, starts a guard (a background subshell, in the
//! command's process group) that reads fd 3 and, once the read ends, kills the whole group
//! (itself included), then replaces itself with the command, fd 3 closed. A background list
//! reads `/dev/null` unless redirected, hence the explicit `<&3`.
//!
//! Every guard shares the one pipe, so a guard acts on its end only, never on what is read
//! from it: a command can reopen a guard's fd 3 for writing (`/proc/<pid>/fd/3`), and a
//! line it wrote there would otherwise wake some guard (another session's, say) into
//! killing its command. Lines are read and dropped until the read finds the end.

use std::io::{PipeReader, PipeWriter};
use std::sync::OnceLock;

/// [`reader`] given as standard input; runs `"$2" -c "$1"` (the shell `$2` on the command
/// `$1`) with no input.
pub(crate) const GUARD_ON_STDIN: &str =
    r#"exec 3<&0 </dev/null; (while read -r x <&3; do :; done; kill -9 0) >/dev/null 2>&1 & exec "$2" -c "$1" 3<&-"#;

/// [`reader`] given as standard error; runs `"$@"` (a program and its arguments) with
/// standard input and output as given, and no standard error.
pub(crate) const GUARD_ON_STDERR: &str = r#"exec 3<&2 2>/dev/null; (while read -r x <&3; do :; done; kill -9 0) </dev/null >/dev/null 2>&1 & exec "$@" 3<&-"#;

/// A copy of the lifeline's read end for one command's guard; None when no pipe could be
/// made (the command then runs without a guard).
pub(crate) fn reader() -> Option<PipeReader> {
    static LIFELINE: OnceLock<Option<(PipeReader, PipeWriter)>> = OnceLock::new();
    LIFELINE
        .get_or_init(|| std::io::pipe().ok())
        .as_ref()
        .and_then(|(r, _)| r.try_clone().ok())
}

//! Turns: admission, the queue, dispatch to workers, steps, settling, stop.
//!
//! One file per concern: `admission.rs`, `queue.rs`, `claim.rs` (dispatch to workers),
//! `steps.rs`, `end.rs` (settling, stop), `connections.rs`, `titles.rs`, `diagnostics.rs`.
//! `sql.rs`, declared first, holds the macros and statements several of them share.

#[macro_use]
mod sql;

mod admission;
mod claim;
mod connections;
mod diagnostics;
mod end;
mod queue;
mod steps;
mod titles;

pub(crate) use admission::admit;
pub use admission::{Admission, Admitted};
pub use claim::ClaimedTurn;
pub use end::Ended;
pub(crate) use end::{KeepText, cancel_turn, lock_running_turn, lock_running_turn_then, notify_dispatch};
pub use steps::{Metered, Partial};
pub use titles::TitleSource;

/// What the model proxy holds a turn's calls to.
#[derive(Debug, Clone)]
pub struct ProxyTurn {
    pub model: Option<String>,
    pub provider: Option<String>,
    /// A client-chosen endpoint (only stored for a profile that allows one).
    pub base_url: Option<String>,
    pub session_id: String,
}

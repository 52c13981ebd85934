//! Parameter, result, event and row types of the client-facing methods.
//!
//! One file per concern, all re-exported here (and from the crate root), so a type's path
//! is `crate::types::X` wherever it is declared.

mod admin;
mod connection;
mod content;
mod context;
mod diagnostics;
mod history;
mod interaction;
mod queue;
mod receipt;
mod session;
mod turn;
mod workspace;

pub use admin::*;
pub use connection::*;
pub use content::*;
pub use context::*;
pub use diagnostics::*;
pub use history::*;
pub use interaction::*;
pub use queue::*;
pub use receipt::*;
pub use session::*;
pub use turn::*;
pub use workspace::*;

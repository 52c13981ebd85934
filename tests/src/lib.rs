//! End-to-end test support: a private PostgreSQL cluster per test run with one fresh
//! database per test (cloned from a migrated template), `berth serve` and `berth worker`
//! as child processes, a WebSocket JSON-RPC client, and a scripted model provider.

pub mod client;
pub mod cut_proxy;
pub mod harness;
pub mod mock_provider;
pub mod nginx;
pub mod procstat;
pub mod s3;
pub mod stack;

pub use berth_client;
pub use client::Client;
pub use harness::{TestServer, TestWorker, fresh_database};
pub use mock_provider::{Format, MockProvider, Part, Reply, SUMMARY_REQUEST};
pub use stack::Stack;

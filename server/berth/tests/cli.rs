//! The binary's command line. (Also makes `cargo test --workspace` build the `berth`
//! binary that the end-to-end tests in `tests/` run as a child process.)

use std::process::Command;

fn berth(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .output()
        .expect("run berth")
}

#[test]
fn help_lists_every_subcommand() {
    let out = berth(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for sub in ["serve", "dev", "worker", "migrate", "admin"] {
        assert!(text.contains(sub), "{sub} missing from --help:\n{text}");
    }
}

#[test]
fn admin_token_create_needs_a_user_or_worker() {
    let out = berth(&["admin", "token", "create", "--tenant", "default"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--user"));
}

#[test]
fn a_bad_setting_names_the_variable() {
    let dir = std::env::temp_dir().join(format!("berth-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["serve"])
        .env("DATABASE_URL", "host=/nonexistent dbname=x")
        .env("BERTH_DATA_DIR", &dir)
        .env("BERTH_DB_POOL_SIZE", "lots")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("BERTH_DB_POOL_SIZE"));
}

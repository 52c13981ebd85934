//! The alert rules and the Grafana dashboard in `ops/` (and their copies in the chart) use
//! only what Berth exports: every `berth_*` metric they name is registered by the API tier
//! (the worker exports no metrics; the API tier counts what its workers do), every method a
//! filter names is a protocol method, every turn state a filter names is a turn state, and
//! the dashboard's variables read a metric that is there before the first request.

use std::path::PathBuf;

use berth_api::metrics::Metrics;

fn repo_file(path: &str) -> String {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// Every `berth_…` identifier in `text`.
fn metric_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("berth_") {
        let preceded_by_ident = text.len() - rest.len() + at > 0
            && rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if !preceded_by_ident {
            out.push(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// The string literals of every `label op "…"` matcher (op one of `=`, `!=`, `=~`, `!~`), as
/// PromQL reads them (`\\` is one backslash).
fn matchers(text: &str, label: &str) -> Vec<String> {
    let mut out = Vec::new();
    for op in ["!~\"", "=~\"", "!=\"", "=\""] {
        let needle = format!("{label}{op}");
        let mut rest = text;
        while let Some(at) = rest.find(&needle) {
            let before = rest[..at].chars().next_back();
            let tail = &rest[at + needle.len()..];
            let end = tail.find('"').expect("closed string");
            if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                out.push(tail[..end].replace("\\\\", "\\"));
            }
            rest = &tail[end..];
        }
    }
    out
}

/// The alternatives of a matcher's value: `a\.b|c` → `a.b`, `c`.
fn alternatives(value: &str) -> Vec<String> {
    value.split('|').map(|m| m.replace("\\.", ".")).collect()
}

/// Each PromQL expression of the dashboard (panel targets and variable queries).
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dashboard];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr" | "definition" | "query", serde_json::Value::String(s)) => out.push(s.clone()),
                        _ => stack.push(v),
                    }
                }
            }
            serde_json::Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    out
}

struct Sources {
    name: &'static str,
    text: String,
}

fn sources() -> Vec<Sources> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&repo_file("ops/grafana/berth-dashboard.json")).expect("dashboard JSON");
    let mut out = vec![
        Sources {
            name: "ops/prometheus/alerts.yaml",
            text: repo_file("ops/prometheus/alerts.yaml"),
        },
        Sources {
            name: "charts/berth/files/alerts.yaml",
            text: repo_file("charts/berth/files/alerts.yaml"),
        },
        Sources {
            name: "ops/grafana/berth-dashboard.json",
            text: dashboard_queries(&dashboard).join("\n"),
        },
    ];
    let chart_dashboard: serde_json::Value =
        serde_json::from_str(&repo_file("charts/berth/files/berth-dashboard.json")).expect("dashboard JSON");
    out.push(Sources {
        name: "charts/berth/files/berth-dashboard.json",
        text: dashboard_queries(&chart_dashboard).join("\n"),
    });
    out
}

#[test]
fn every_metric_the_rules_and_dashboard_use_is_exported() {
    let exported = Metrics::new().names();
    for source in sources() {
        let used = metric_names(&source.text);
        assert!(!used.is_empty(), "{} names no berth metric", source.name);
        for name in used {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|base| exported.iter().any(|e| e == base)))
                .unwrap_or(&name);
            assert!(
                exported.iter().any(|e| e == family),
                "{} uses {name}, which Berth does not export (exported: {exported:?})",
                source.name
            );
        }
    }
}

#[test]
fn method_and_state_filters_name_what_exists() {
    for source in sources() {
        for value in matchers(&source.text, "method") {
            for method in alternatives(&value) {
                assert!(
                    berth_protocol::METHOD_NAMES.contains(&method.as_str()),
                    "{} filters on method {method:?}, which is no protocol method",
                    source.name
                );
            }
        }
        for value in matchers(&source.text, "state") {
            for state in alternatives(&value) {
                assert!(
                    serde_json::from_value::<berth_protocol::types::TurnState>(serde_json::json!(state)).is_ok(),
                    "{} filters on turn state {state:?}, which is no turn state",
                    source.name
                );
            }
        }
    }
}

#[test]
fn dashboard_variables_read_a_metric_present_before_any_request() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&repo_file("ops/grafana/berth-dashboard.json")).expect("dashboard JSON");
    let fresh = Metrics::new().render();
    let variables = dashboard["templating"]["list"].as_array().expect("templating list");
    let mut checked = 0;
    for var in variables.iter().filter(|v| v["type"] == "query") {
        let query = var["definition"].as_str().expect("variable query");
        let metric = query
            .strip_prefix("label_values(")
            .and_then(|q| q.split(['{', ',', ')']).next())
            .unwrap_or_else(|| panic!("variable {} is not label_values(…): {query}", var["name"]));
        assert!(
            fresh
                .lines()
                .any(|l| l.strip_prefix(metric).is_some_and(|r| r.starts_with([' ', '{']))),
            "variable {} reads {metric}, which a fresh replica does not export yet",
            var["name"]
        );
        checked += 1;
    }
    assert!(checked >= 2, "the job and instance variables");
}

#[test]
fn the_cross_check_catches_a_missing_metric_and_method() {
    // The matchers above are what the checks rely on: they see through PromQL escapes.
    let rule = r#"rate(berth_rpc_duration_seconds_bucket{method!~"session\\.watch|files\\.nope"}[5m])"#;
    assert_eq!(metric_names(rule), ["berth_rpc_duration_seconds_bucket"]);
    assert_eq!(
        alternatives(&matchers(rule, "method")[0]),
        ["session.watch", "files.nope"]
    );
    assert!(!berth_protocol::METHOD_NAMES.contains(&"files.nope"));
    assert!(!Metrics::new().names().contains(&"berth_object_store_bytes".to_string()));
}

//! The protocol schema: it covers every method, event and error code, and the checked-in
//! TypeScript declarations are exactly what the schema generates (and compile with
//! `tsc --strict`, together with a tiny client that uses them).

use std::path::PathBuf;

use berth_protocol::{ErrorCode, EventPayload, METHOD_NAMES, schema};

fn ts_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../clients/typescript")
}

#[test]
fn the_schema_covers_every_method_event_and_error_code() {
    let doc = schema::document();
    let methods = doc["methods"].as_object().expect("methods");
    let mut in_schema: Vec<&str> = methods.keys().map(String::as_str).collect();
    let mut declared = METHOD_NAMES.to_vec();
    in_schema.sort();
    declared.sort();
    assert_eq!(in_schema, declared, "schema methods vs methods!");
    for (name, m) in methods {
        assert!(m.get("params").is_some() && m.get("result").is_some(), "{name}");
    }

    let mut events = schema::event_types(&doc);
    let mut expected: Vec<&str> = EventPayload::samples().iter().map(EventPayload::type_name).collect();
    events.sort();
    expected.sort();
    assert_eq!(events, expected, "schema events vs EventPayload");

    // The exhaustive match makes a new error code a compile error here until it is listed.
    let codes = schema::error_codes(&doc);
    let all = [
        ErrorCode::ParseError,
        ErrorCode::InvalidRequest,
        ErrorCode::MethodNotFound,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::NotFound,
        ErrorCode::Conflict,
        ErrorCode::BadParams,
        ErrorCode::UnsupportedProtocol,
        ErrorCode::StaleRevision,
        ErrorCode::TurnBusy,
        ErrorCode::TurnNotRunning,
        ErrorCode::WorkspaceOffline,
        ErrorCode::OperationConflict,
        ErrorCode::OperationInProgress,
        ErrorCode::RateLimited,
        ErrorCode::PayloadTooLarge,
        ErrorCode::QueueFull,
        ErrorCode::HistoryCleared,
        ErrorCode::Unsupported,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
        ErrorCode::UnknownProvider,
        ErrorCode::UnknownModel,
        ErrorCode::BaseUrlNotAllowed,
        ErrorCode::InteractionClosed,
        ErrorCode::DepthExceeded,
        ErrorCode::ChildLimit,
    ];
    for code in all {
        match code {
            ErrorCode::ParseError
            | ErrorCode::InvalidRequest
            | ErrorCode::MethodNotFound
            | ErrorCode::Unauthorized
            | ErrorCode::Forbidden
            | ErrorCode::NotFound
            | ErrorCode::Conflict
            | ErrorCode::BadParams
            | ErrorCode::UnsupportedProtocol
            | ErrorCode::StaleRevision
            | ErrorCode::TurnBusy
            | ErrorCode::TurnNotRunning
            | ErrorCode::WorkspaceOffline
            | ErrorCode::OperationConflict
            | ErrorCode::OperationInProgress
            | ErrorCode::RateLimited
            | ErrorCode::PayloadTooLarge
            | ErrorCode::QueueFull
            | ErrorCode::HistoryCleared
            | ErrorCode::Unsupported
            | ErrorCode::Unavailable
            | ErrorCode::Internal
            | ErrorCode::UnknownProvider
            | ErrorCode::UnknownModel
            | ErrorCode::BaseUrlNotAllowed
            | ErrorCode::InteractionClosed
            | ErrorCode::DepthExceeded
            | ErrorCode::ChildLimit => {}
        }
        assert!(codes.iter().any(|c| c == code.as_str()), "{} missing", code.as_str());
    }
    assert_eq!(codes.len(), all.len(), "{codes:?}");

    // Every reference resolves.
    let text = doc.to_string();
    for piece in text.split("\"$ref\":\"#/$defs/").skip(1) {
        let name = &piece[..piece.find('"').unwrap()];
        assert!(doc["$defs"].get(name).is_some(), "dangling $ref {name}");
    }
}

/// Every `type` an item schema admits (the `const`s and `enum`s of `type` properties
/// reachable through `$ref`, `oneOf`, `anyOf` and `allOf`).
fn item_types(doc: &serde_json::Value, schema: &serde_json::Value, seen: &mut Vec<String>, out: &mut Vec<String>) {
    if let Some(r) = schema.get("$ref").and_then(|r| r.as_str()) {
        let name = r.trim_start_matches("#/$defs/").to_string();
        if !seen.contains(&name) {
            seen.push(name.clone());
            item_types(doc, &doc["$defs"][&name], seen, out);
        }
    }
    let ty = &schema["properties"]["type"];
    out.extend(ty["const"].as_str().map(String::from));
    out.extend(
        ty["enum"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(String::from)),
    );
    for key in ["oneOf", "anyOf", "allOf"] {
        for alt in schema[key].as_array().into_iter().flatten() {
            item_types(doc, alt, seen, out);
        }
    }
}

/// Issue 51: every subscription's items are in the schema (and so in the TypeScript
/// declarations), as declared with its method; the server treats exactly these methods as
/// subscriptions. Leaving any subscription's items out fails here.
#[test]
fn the_schema_covers_every_subscriptions_items() {
    let doc = schema::document();
    let subs = doc["subscriptions"].as_object().expect("subscriptions");
    let mut in_schema: Vec<&str> = subs.keys().map(String::as_str).collect();
    in_schema.sort();
    let mut declared = berth_protocol::SUBSCRIPTION_NAMES.to_vec();
    declared.sort();
    assert_eq!(in_schema, declared, "schema subscriptions vs methods!");
    assert_eq!(
        declared,
        ["files.read", "files.watch", "session.watch", "session.watchDiagnostics"],
        "the protocol's four subscriptions"
    );
    let types = |name: &str| {
        let mut out = Vec::new();
        item_types(&doc, &subs[name]["item"], &mut Vec::new(), &mut out);
        out.sort();
        out.dedup();
        out
    };
    assert_eq!(
        types("files.read"),
        ["absent", "begin", "binary", "changed", "chunk", "end", "unsupported"]
    );
    assert_eq!(types("files.watch"), ["changed", "ready"]);
    // The watch's end: `unavailable` (or null when closed) is the method's result.
    let mut end = Vec::new();
    item_types(
        &doc,
        &doc["methods"]["files.watch"]["result"],
        &mut Vec::new(),
        &mut end,
    );
    assert_eq!(end, ["unavailable"], "files.watch ends with unavailable");
    let watch = types("session.watch");
    let mut expected: Vec<String> = EventPayload::samples()
        .iter()
        .map(|p| p.type_name().to_string())
        .chain(["model.delta", "phase", "state", "resync"].map(String::from))
        .collect();
    expected.sort();
    assert_eq!(watch, expected, "every event and live item of session.watch");
    let diagnostics = &subs["session.watchDiagnostics"]["item"];
    let def = &doc["$defs"][diagnostics["$ref"]
        .as_str()
        .expect("a named item")
        .trim_start_matches("#/$defs/")];
    assert_eq!(
        def["required"],
        serde_json::json!(["diagnosticRevision"]),
        "the diagnostics revision item"
    );
    // The TypeScript declarations name every subscription's items.
    let ts = schema::typescript(&doc);
    let block = &ts[ts.find("export interface Subscriptions {").expect("Subscriptions")..];
    let block = &block[..block.find("\n}").unwrap()];
    for (name, item) in [
        ("files.read", "FilesReadItem"),
        ("files.watch", "FilesWatchItem"),
        ("session.watch", "WatchItem"),
        ("session.watchDiagnostics", "DiagnosticsRevision"),
    ] {
        assert!(block.contains(&format!("\"{name}\": {item};")), "{name} in {block}");
    }
}

#[test]
fn the_checked_in_typescript_is_what_the_schema_generates() {
    let generated = schema::typescript(&schema::document());
    let path = ts_dir().join("berth-protocol.d.ts");
    if std::env::var_os("BERTH_REGENERATE").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{} is stale: regenerate with `BERTH_REGENERATE=1 cargo test -p berth-client --test schema` \
         or `berth schema --typescript`",
        path.display()
    );
}

/// `tsc`: `BERTH_TSC`, else the one `.ci/run` installs. Absent outside CI → the check is
/// skipped with a note; in CI it must be there.
fn tsc() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("BERTH_TSC").map(PathBuf::from),
        Some(PathBuf::from("/var/tmp/berth-ts/node_modules/.bin/tsc")),
    ];
    let found = candidates.into_iter().flatten().find(|p| p.exists());
    if found.is_none() && std::env::var_os("CI").is_some() {
        panic!("tsc not found (set BERTH_TSC or install typescript as .ci/run does)");
    }
    found
}

#[test]
fn the_typescript_compiles_strictly_with_a_tiny_client() {
    let Some(tsc) = tsc() else {
        eprintln!("tsc not installed: skipping the TypeScript compile check");
        return;
    };
    let dir = ts_dir();
    // The project file checked in next to them (strict, the declarations and the example).
    let out = std::process::Command::new(tsc)
        .arg("-p")
        .arg(dir.join("tsconfig.json"))
        .output()
        .expect("run tsc");
    assert!(
        out.status.success(),
        "tsc failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_client_gives_an_operation_id_to_exactly_the_methods_that_take_one() {
    let doc = schema::document();
    let mut takes: Vec<&str> = Vec::new();
    for (name, m) in doc["methods"].as_object().unwrap() {
        let params = &m["params"];
        let def = match params["$ref"].as_str() {
            Some(r) => &doc["$defs"][r.trim_start_matches("#/$defs/")],
            None => params,
        };
        // A mutation's id is optional; `operation.receipt` requires one (it looks one up).
        let required = def["required"]
            .as_array()
            .is_some_and(|r| r.iter().any(|f| f == "operationId"));
        if def["properties"].get("operationId").is_some() && !required {
            takes.push(name);
        }
    }
    let mut listed = berth_client::TAKES_OPERATION_ID.to_vec();
    takes.sort();
    listed.sort();
    assert_eq!(listed, takes, "berth_client::TAKES_OPERATION_ID vs the schema");
}

/// Issue 51: the stated conventions hold for every method's params, as the schema (generated
/// from the types) declares them: unknown fields are never refused, and every parameter that
/// may be left out may as well be `null`.
#[test]
fn every_method_takes_unknown_fields_and_null_for_what_may_be_absent() {
    let doc = schema::document();
    let defs = doc["$defs"].as_object().expect("$defs");
    fn follow<'a>(
        defs: &'a serde_json::Map<String, serde_json::Value>,
        mut s: &'a serde_json::Value,
    ) -> &'a serde_json::Value {
        while let Some(r) = s.get("$ref").and_then(|r| r.as_str()) {
            s = &defs[r.rsplit('/').next().unwrap()];
        }
        s
    }
    let resolve = |s: &serde_json::Value| follow(defs, s).clone();
    let admits_null = |s: &serde_json::Value| {
        let has_null =
            |t: &serde_json::Value| t == "null" || t.as_array().is_some_and(|a| a.iter().any(|x| x == "null"));
        let s = resolve(s);
        has_null(&s["type"])
            || ["anyOf", "oneOf"].iter().any(|k| {
                s[k].as_array()
                    .is_some_and(|alts| alts.iter().any(|a| has_null(&resolve(a)["type"])))
            })
    };
    let mut checked = 0;
    for (method, m) in doc["methods"].as_object().unwrap() {
        let params = resolve(&m["params"]);
        assert_ne!(
            params.get("additionalProperties"),
            Some(&serde_json::Value::Bool(false)),
            "{method} refuses unknown fields"
        );
        let required: Vec<&str> = params["required"]
            .as_array()
            .map(|r| r.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        for (name, prop) in params["properties"].as_object().into_iter().flatten() {
            if !required.contains(&name.as_str()) {
                assert!(admits_null(prop), "{method}: {name} may be absent but not null: {prop}");
                checked += 1;
            }
        }
    }
    assert!(checked > 50, "{checked} optional parameters checked");

    // And the types read them so (the schema is generated from them, the reading is serde's).
    use berth_protocol::{
        AdminCredentialCreateParams, InteractionRef, SessionSendParams, SessionWatchParams, search::SessionSearchParams,
    };
    let watch: SessionWatchParams =
        serde_json::from_value(serde_json::json!({"sessionId": "s", "after": null})).unwrap();
    assert_eq!(watch.after, 0);
    let send: SessionSendParams =
        serde_json::from_value(serde_json::json!({"sessionId": "s", "prompt": "p", "attachments": null})).unwrap();
    assert!(send.attachments.is_empty());
    let search: SessionSearchParams = serde_json::from_value(serde_json::json!(
        {"sessionId": "s", "query": "q", "caseSensitive": null, "wholeWord": null}
    ))
    .unwrap();
    assert!(!search.case_sensitive && !search.whole_word);
    let cred: AdminCredentialCreateParams =
        serde_json::from_value(serde_json::json!({"worker": null, "note": null, "future": 1})).unwrap();
    assert!(!cred.worker && cred.note.is_empty());
    serde_json::from_value::<InteractionRef>(serde_json::json!({"interactionId": "i", "future": true})).unwrap();
}

/// Issue 51: the codes clients branch on are enumerated in the schema (their wire values).
#[test]
fn codes_are_enumerated_in_the_schema() {
    let doc = schema::document();
    let defs = &doc["$defs"];
    // The values a field's schema admits, through `$ref`s and `anyOf`s.
    fn values(doc: &serde_json::Value, s: &serde_json::Value, out: &mut Vec<String>) {
        if let Some(r) = s["$ref"].as_str() {
            values(doc, &doc["$defs"][r.trim_start_matches("#/$defs/")], out);
        }
        out.extend(
            s["enum"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(String::from)),
        );
        out.extend(s["const"].as_str().map(String::from));
        for key in ["oneOf", "anyOf"] {
            for alt in s[key].as_array().into_iter().flatten() {
                values(doc, alt, out);
            }
        }
    }
    let field = |def: &str, name: &str| {
        let mut out = Vec::new();
        values(&doc, &defs[def]["properties"][name], &mut out);
        out
    };
    let mut levels = field("Notice", "level");
    levels.sort();
    assert_eq!(levels, ["error", "info", "warning"]);
    assert!(field("Notice", "code").contains(&"step-limit".to_string()));
    assert!(field("Diagnostic", "kind").contains(&"model-step".to_string()));
    assert!(field("Cause", "code").contains(&"provider-status".to_string()));
    assert!(field("ToolInfo", "status").contains(&"denied".to_string()));
    let mut kinds = field("Interaction", "kind");
    kinds.sort();
    assert_eq!(kinds, ["approval", "choice", "confirm", "text"]);
    for (def, name, all) in [
        (
            "Notice",
            "code",
            berth_protocol::NoticeCode::ALL
                .iter()
                .map(|c| c.as_str())
                .collect::<Vec<_>>(),
        ),
        (
            "Diagnostic",
            "kind",
            berth_protocol::DiagnosticKind::ALL.iter().map(|c| c.as_str()).collect(),
        ),
        (
            "Cause",
            "code",
            berth_protocol::CauseCode::ALL.iter().map(|c| c.as_str()).collect(),
        ),
    ] {
        let (mut got, mut all) = (field(def, name), all);
        got.sort();
        all.sort();
        assert_eq!(got, all, "{def}.{name}");
    }
}

//! Issue 51: the protocol's stated conventions hold for every method, on a live server. The
//! method list and the shape of each method's params come from the server's own
//! `/v1/schema`, so a method added later is walked too.
//!
//! For every method (subscriptions included) the walk sends the required params with a
//! placeholder value, once alone and once with every optional or defaulted param as `null`
//! and one field no server knows. Both must come to the same answer (most answer
//! `not-found`: the ids are placeholders, so nothing is changed): never a refusal of the
//! `null`s or of the unknown field.

use berth_e2e::{Client, MockProvider, Stack};
use serde_json::{Map, Value, json};

/// The schema a `$ref` points to, followed to the end.
fn resolve<'a>(defs: &'a Map<String, Value>, mut s: &'a Value) -> &'a Value {
    while let Some(r) = s.get("$ref").and_then(Value::as_str) {
        s = &defs[r.rsplit('/').next().unwrap()];
    }
    s
}

/// A value the schema admits, as small as it can be: the first enum value, the minimum,
/// empty arrays, objects with their required properties only. Strings are `x` (ids name
/// nothing that exists).
fn placeholder(defs: &Map<String, Value>, schema: &Value) -> Value {
    let s = resolve(defs, schema);
    if let Some(c) = s.get("const") {
        return c.clone();
    }
    if let Some(first) = s.get("enum").and_then(Value::as_array).and_then(|e| e.first()) {
        return first.clone();
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(alts) = s.get(key).and_then(Value::as_array) {
            let alt = alts
                .iter()
                .find(|a| resolve(defs, a).get("type") != Some(&json!("null")))
                .unwrap_or(&alts[0]);
            return placeholder(defs, alt);
        }
    }
    let ty = match s.get("type") {
        Some(Value::Array(types)) => types.iter().find(|t| *t != "null").cloned().unwrap_or(Value::Null),
        Some(t) => t.clone(),
        None if s.get("properties").is_some() => json!("object"),
        None => return json!("x"),
    };
    match ty.as_str() {
        Some("string") => json!("x"),
        Some("integer") | Some("number") => s.get("minimum").cloned().unwrap_or(json!(0)),
        Some("boolean") => json!(false),
        Some("array") => json!([]),
        Some("object") => {
            let mut out = Map::new();
            let required: Vec<&str> = s["required"]
                .as_array()
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for (name, prop) in s["properties"].as_object().into_iter().flatten() {
                if required.contains(&name.as_str()) {
                    out.insert(name.clone(), placeholder(defs, prop));
                }
            }
            Value::Object(out)
        }
        _ => Value::Null,
    }
}

/// A method's params for the walk: required ones with placeholders, the rest `null`, plus
/// a field from the future. Also the names set to `null`.
fn walk_params(defs: &Map<String, Value>, params: &Value) -> (Value, Vec<String>) {
    let s = resolve(defs, params);
    let Value::Object(mut out) = placeholder(defs, s) else {
        return (json!({"futureField": {"a": 1}}), Vec::new());
    };
    let mut nulled = Vec::new();
    for name in s["properties"].as_object().into_iter().flatten().map(|(n, _)| n) {
        if !out.contains_key(name) {
            out.insert(name.clone(), Value::Null);
            nulled.push(name.clone());
        }
    }
    out.insert("futureField".into(), json!({"a": 1}));
    (Value::Object(out), nulled)
}

/// What a call comes to: `ok`, or its error's code and the field it names.
async fn outcome(client: &mut Client, stack: &Stack, subscription: bool, method: &str, params: Value) -> String {
    let answer = if subscription {
        let sub = client.subscribe(method, params);
        let (mut items, mut done) = (sub.items, sub.done);
        // It starts (an item comes) or it is refused (its response comes first).
        let refused = tokio::select! {
            _ = items.recv() => None,
            done = &mut done => done.ok().and_then(|r| r.error),
        };
        refused.map_or(Ok(Value::Null), Err)
    } else if method == "content.upload" {
        // Its bytes follow in a binary message.
        client.upload(params, b"", None).await
    } else {
        match client.call_or_closed(method, params).await {
            Some(answer) => answer,
            None => {
                // A method that ends the connection (signing out) answered by doing so.
                *client = stack.client(0).await;
                Ok(Value::Null)
            }
        }
    };
    match answer {
        Ok(_) => "ok".into(),
        Err(e) => format!("{} {}", e.message, e.data.get("field").unwrap_or(&Value::Null)),
    }
}

#[tokio::test]
async fn every_method_takes_null_for_what_may_be_absent_and_ignores_unknown_fields() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let base = format!("http://{}", stack.servers[0].addr);
    let doc: Value = reqwest::get(format!("{base}/v1/schema"))
        .await
        .expect("GET /v1/schema")
        .json()
        .await
        .expect("the schema is JSON");
    let defs = doc["$defs"].as_object().expect("$defs");
    let subscriptions = doc["subscriptions"].as_object().expect("subscriptions");
    let mut client: Client = stack.client(0).await;
    let (mut walked, mut nulls, mut operations) = (0, 0, 0);
    for (method, m) in doc["methods"].as_object().expect("methods") {
        let (params, nulled) = walk_params(defs, &m["params"]);
        nulls += nulled.len();
        // The same call as a client following the conventions strictly would make: the
        // nulls and the unknown field left out.
        let mut plain = params.clone();
        if let Value::Object(p) = &mut plain {
            p.retain(|k, v| !v.is_null() && k != "futureField");
        }
        // Other placeholder strings the second time, so that what the first call made (an
        // agent or a skill named `x`) is no conflict for the second.
        let mut params = params;
        if let Value::Object(p) = &mut params {
            p.values_mut().filter(|v| *v == "x").for_each(|v| *v = json!("y"));
        }
        let mut answers = Vec::new();
        for mut params in [plain, params] {
            // A required operation id names a new operation each time.
            if let Some(op) = params.get_mut("operationId").filter(|o| o.is_string()) {
                operations += 1;
                *op = json!(format!("op-walk-{operations}"));
            }
            answers.push(outcome(&mut client, &stack, subscriptions.contains_key(method), method, params).await);
        }
        assert_eq!(
            answers[1], answers[0],
            "{method}: with {nulled:?} null and an unknown field it answers otherwise than without them"
        );
        walked += 1;
    }
    assert!(walked > 60, "{walked} methods walked");
    assert!(nulls > 50, "{nulls} optional params sent as null");
    // The server is still there, and the placeholders made nothing.
    let sessions = client.ok("session.list", json!({})).await;
    assert!(
        sessions["entries"].as_array().is_some_and(|s| s.is_empty()),
        "{sessions}"
    );
}

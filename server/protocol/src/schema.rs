//! The machine-readable protocol description (feature `schema`): one JSON Schema document
//! generated from the wire types, and TypeScript declarations generated from that document.
//!
//! The document is `{$schema, title, protocol, methods: {name: {params, result}},
//! subscriptions: {name: {item}}, event, watchItem, error, errorCodes, $defs}`; every
//! `$ref` points into its `$defs`. Methods and subscriptions both come from the one method
//! declaration (`methods!`): a subscription's items are declared with the method. It is
//! served at `GET /v1/schema` and printed by `berth schema`.

use schemars::{Schema, generate::SchemaSettings};
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::{ErrorCode, Event, EventPayload, RpcError, WatchItem, jsonrpc};

/// One method's schemas (see `methods!`).
pub struct MethodSchema {
    pub name: &'static str,
    pub params: Schema,
    pub result: Schema,
}

/// The whole protocol as one JSON Schema document.
pub fn document() -> Value {
    let mut generator = SchemaSettings::draft2020_12().into_generator();
    let mut methods = Map::new();
    for m in crate::method_schemas(&mut generator) {
        methods.insert(m.name.into(), json!({"params": m.params, "result": m.result}));
    }
    let mut subscriptions = Map::new();
    for (name, item) in crate::subscription_schemas(&mut generator) {
        subscriptions.insert(name.into(), json!({"item": item}));
    }
    let event = generator.subschema_for::<Event>();
    let payload = generator.subschema_for::<EventPayload>();
    let watch_item = generator.subschema_for::<WatchItem>();
    let error = generator.subschema_for::<RpcError>();
    let error_codes = generator.subschema_for::<ErrorCode>();
    let notification = generator.subschema_for::<jsonrpc::SubscriptionItem<WatchItem>>();
    let defs: Map<String, Value> = generator.take_definitions(true);
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Berth protocol",
        "protocol": crate::PROTOCOL_VERSION,
        "methods": methods,
        "subscriptions": subscriptions,
        "event": event,
        "eventPayload": payload,
        "watchItem": watch_item,
        "subscriptionItem": notification,
        "error": error,
        "errorCode": error_codes,
        "$defs": defs,
    })
}

/// The `type` names of every event the document declares (the `const`s of the event
/// payload union's variants).
pub fn event_types(doc: &Value) -> Vec<String> {
    let Some(def) = resolve(doc, &doc["eventPayload"]) else {
        return Vec::new();
    };
    def["oneOf"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["properties"]["type"]["const"].as_str().map(String::from))
        .collect()
}

/// The error codes the document declares.
pub fn error_codes(doc: &Value) -> Vec<String> {
    let Some(def) = resolve(doc, &doc["errorCode"]) else {
        return Vec::new();
    };
    // Variants with doc comments come out as `oneOf: [{enum: […]}, {const, description}, …]`.
    let alternatives = def["oneOf"].as_array().cloned().unwrap_or_else(|| vec![def.clone()]);
    let mut codes = Vec::new();
    for alt in &alternatives {
        codes.extend(
            alt["enum"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(String::from)),
        );
        codes.extend(alt["const"].as_str().map(String::from));
    }
    codes
}

/// Follow a local `$ref` (one level) into the document's `$defs`.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> Option<&'a Value> {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => doc["$defs"].get(r.strip_prefix("#/$defs/")?),
        None => Some(schema),
    }
}

/// TypeScript declarations for the document: one exported type per definition, the
/// method map `Methods` (`params`/`result` per wire name), `Subscriptions` and the error
/// codes. Deterministic: the same document always gives the same text.
pub fn typescript(doc: &Value) -> String {
    let mut out = String::from(
        "// Berth protocol types, generated from the JSON Schema (`berth schema --typescript`).\n\
         // Do not edit: regenerate instead.\n\n",
    );
    out.push_str(&format!(
        "/** The protocol version these types describe. */\nexport const PROTOCOL_VERSION = {};\n\n",
        doc["protocol"]
    ));
    let none = BTreeSet::new();
    let top = Ctx { sent: &none };
    if let Some(defs) = doc["$defs"].as_object() {
        let mut names: Vec<&String> = defs.keys().collect();
        names.sort();
        let sent = always_sent();
        for name in names {
            let def = &defs[name];
            doc_comment(&mut out, def, "");
            let ctx = Ctx {
                sent: sent.get(name.as_str()).unwrap_or(&none),
            };
            out.push_str(&format!(
                "export type {} = {};\n\n",
                ts_ident(name),
                ts_type(def, 0, ctx)
            ));
        }
    }
    out.push_str("/** Every method: its params and its result. */\nexport interface Methods {\n");
    if let Some(methods) = doc["methods"].as_object() {
        for (name, m) in methods {
            out.push_str(&format!(
                "  {}: {{ params: {}; result: {} }};\n",
                json!(name),
                ts_type(&m["params"], 1, top),
                ts_type(&m["result"], 1, top)
            ));
        }
    }
    out.push_str("}\n\nexport type MethodName = keyof Methods;\n\n");
    out.push_str("/** Subscription methods and the items they deliver. */\nexport interface Subscriptions {\n");
    if let Some(subs) = doc["subscriptions"].as_object() {
        for (name, s) in subs {
            out.push_str(&format!("  {}: {};\n", json!(name), ts_type(&s["item"], 1, top)));
        }
    }
    out.push_str("}\n\n");
    for (alias, key) in [
        ("WireEvent", "event"),
        ("WireWatchItem", "watchItem"),
        ("WireError", "error"),
        ("WireErrorCode", "errorCode"),
    ] {
        out.push_str(&format!("export type {alias} = {};\n", ts_type(&doc[key], 0, top)));
    }
    out
}

/// The properties the server always sends, per definition: those its serialization never
/// omits (required in the serialize contract; an `Option` without `skip_serializing_if` is
/// sent as null). Every other optional property is absent rather than null, so its
/// TypeScript type leaves `null` out.
fn always_sent() -> BTreeMap<String, BTreeSet<String>> {
    let mut generator = SchemaSettings::draft2020_12().for_serialize().into_generator();
    crate::method_schemas(&mut generator);
    crate::subscription_schemas(&mut generator);
    generator.subschema_for::<Event>();
    generator.subschema_for::<WatchItem>();
    generator.subschema_for::<RpcError>();
    generator.subschema_for::<jsonrpc::SubscriptionItem<WatchItem>>();
    fn required(schema: &Value, into: &mut BTreeSet<String>) {
        match schema {
            Value::Object(map) => {
                if let Some(Value::Array(names)) = map.get("required") {
                    into.extend(names.iter().filter_map(Value::as_str).map(String::from));
                }
                for v in map.values() {
                    required(v, into);
                }
            }
            Value::Array(items) => items.iter().for_each(|v| required(v, into)),
            _ => {}
        }
    }
    generator
        .take_definitions(true)
        .into_iter()
        .map(|(name, def)| {
            let mut names = BTreeSet::new();
            required(&def, &mut names);
            (name, names)
        })
        .collect()
}

/// What the generation of one definition knows: the properties the server always sends.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    sent: &'a BTreeSet<String>,
}

/// A schema with its `null` alternative removed (`type: [T, "null"]`, `anyOf: [X, {type:
/// "null"}]`).
fn without_null(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(map) = schema.as_object_mut() {
        if let Some(Value::Array(types)) = map.get("type") {
            let kept: Vec<Value> = types.iter().filter(|t| t.as_str() != Some("null")).cloned().collect();
            let kept = match kept.as_slice() {
                [one] => one.clone(),
                _ => Value::Array(kept),
            };
            map.insert("type".into(), kept);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(alts)) = map.get(key) {
                let kept: Vec<Value> = alts
                    .iter()
                    .filter(|a| a.get("type").and_then(Value::as_str) != Some("null"))
                    .cloned()
                    .collect();
                map.insert(key.into(), Value::Array(kept));
            }
        }
    }
    schema
}

fn doc_comment(out: &mut String, schema: &Value, indent: &str) {
    if let Some(d) = schema.get("description").and_then(Value::as_str) {
        out.push_str(&format!("{indent}/**\n"));
        for line in d.lines() {
            out.push_str(&format!("{indent} * {}\n", line.replace("*/", "*\\/")).replace(" \n", "\n"));
        }
        out.push_str(&format!("{indent} */\n"));
    }
}

fn ts_ident(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_alphanumeric() { c } else { '_' })
        .collect()
}

/// A TypeScript type for a schema (the subset schemars generates).
fn ts_type(schema: &Value, depth: usize, ctx: Ctx<'_>) -> String {
    match schema {
        Value::Bool(true) => return "unknown".into(),
        Value::Bool(false) => return "never".into(),
        Value::Object(_) => {}
        _ => return "unknown".into(),
    }
    if let Some(c) = schema.get("const") {
        return c.to_string();
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values.iter().map(Value::to_string).collect::<Vec<_>>().join(" | ");
    }
    let mut parts = Vec::new();
    // A `$ref` may have siblings (a tagged variant: the payload's type plus its `type`).
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        parts.push(ts_ident(r.rsplit('/').next().unwrap_or(r)));
    }
    let has_shape = schema.get("type").is_some() || schema.get("properties").is_some();
    if has_shape {
        parts.push(shape(schema, depth, ctx));
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(alts) = schema.get(key).and_then(Value::as_array) {
            let union: Vec<String> = alts.iter().map(|a| ts_type(a, depth, ctx)).collect();
            parts.push(format!("({})", union.join(" | ")));
        }
    }
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        parts.extend(all.iter().map(|a| ts_type(a, depth, ctx)));
    }
    match parts.len() {
        0 => "unknown".into(),
        1 => parts.pop().unwrap_or_default(),
        _ => parts.join(" & "),
    }
}

/// The `type`-driven part of a schema (objects, arrays, scalars, nullable forms).
fn shape(schema: &Value, depth: usize, ctx: Ctx<'_>) -> String {
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec!["object"],
    };
    let alts: Vec<String> = types
        .iter()
        .map(|t| match *t {
            "string" => "string".into(),
            "integer" | "number" => "number".into(),
            "boolean" => "boolean".into(),
            "null" => "null".into(),
            "array" => match schema.get("items") {
                Some(items) => format!("Array<{}>", ts_type(items, depth, ctx)),
                None => "unknown[]".into(),
            },
            _ => object(schema, depth, ctx),
        })
        .collect();
    alts.join(" | ")
}

fn object(schema: &Value, depth: usize, ctx: Ctx<'_>) -> String {
    let props = schema.get("properties").and_then(Value::as_object);
    let extra = schema.get("additionalProperties");
    let Some(props) = props.filter(|p| !p.is_empty()) else {
        return match extra {
            Some(Value::Bool(false)) => "Record<string, never>".into(),
            Some(Value::Object(_)) => {
                let value = ts_type(extra.unwrap_or(&Value::Bool(true)), depth, ctx);
                match schema.get("propertyNames") {
                    Some(names) if names.get("$ref").is_some() || names.get("enum").is_some() => {
                        format!("{{ [K in {}]?: {} }}", ts_type(names, depth, ctx), value)
                    }
                    _ => format!("Record<string, {value}>"),
                }
            }
            _ => "Record<string, unknown>".into(),
        };
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let pad = "  ".repeat(depth + 1);
    let mut out = String::from("{\n");
    for (name, prop) in props {
        let mut comment = String::new();
        doc_comment(&mut comment, prop, &pad);
        out.push_str(&comment);
        let is_required = required.contains(&name.as_str());
        let optional = if is_required { "" } else { "?" };
        // Absent rather than null, unless the server always sends it.
        let prop = if is_required || ctx.sent.contains(name) {
            prop.clone()
        } else {
            without_null(prop)
        };
        out.push_str(&format!(
            "{pad}{}{optional}: {};\n",
            json!(name),
            ts_type(&prop, depth + 1, ctx)
        ));
    }
    out.push_str(&format!("{}}}", "  ".repeat(depth)));
    out
}

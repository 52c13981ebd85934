//! JSON-RPC 2.0 envelopes. One WebSocket text message is exactly one of these.

use serde::{Deserialize, Serialize};

use crate::RpcError;

/// A request (with `id`) or notification (without).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    pub jsonrpc: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    pub method: String,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub params: serde_json::Value,
}

impl Request {
    pub fn new(id: u32, method: &str, params: serde_json::Value) -> Request {
        Request {
            jsonrpc: "2.0".into(),
            id: Some(id),
            method: method.into(),
            params,
        }
    }

    pub fn notification(method: &str, params: serde_json::Value) -> Request {
        Request {
            jsonrpc: "2.0".into(),
            id: None,
            method: method.into(),
            params,
        }
    }
}

/// A response to a request: exactly one of `result` or `error`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    pub jsonrpc: String,
    pub id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RpcError>,
}

impl Response {
    pub fn ok(id: Option<u32>, result: serde_json::Value) -> Response {
        Response {
            jsonrpc: "2.0".into(),
            id,
            result: Some(result),
            error: None,
        }
    }

    pub fn err(id: Option<u32>, error: RpcError) -> Response {
        Response {
            jsonrpc: "2.0".into(),
            id,
            result: None,
            error: Some(error),
        }
    }
}

/// Any message on the wire, told apart by its fields.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Message {
    Request(Request),
    Response(Response),
}

/// The notification that carries subscription items.
pub const SUBSCRIPTION_ITEM: &str = "subscription.item";

/// A notification to write in one pass, borrowing its params (an item may be large, e.g. a
/// file chunk's base64: no `Value` copy of it on the way out).
#[derive(Debug, Serialize)]
pub struct NotificationRef<'a, P> {
    jsonrpc: &'static str,
    method: &'a str,
    params: P,
}

impl<'a, P: Serialize> NotificationRef<'a, P> {
    pub fn new(method: &'a str, params: P) -> Self {
        NotificationRef {
            jsonrpc: "2.0",
            method,
            params,
        }
    }
}

/// The params of a `subscription.item` notification: the subscribing request's id and one
/// item (for `session.watch`, a [`crate::WatchItem`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SubscriptionItem<T> {
    pub id: u32,
    pub item: T,
}

//! What a request handler gets ([`Ctx`]): its connection and principal, worker calls for a
//! session, and the subscription items it sends, written straight into their text.

use std::sync::Arc;

use axum::extract::ws::Message;
use berth_protocol::{
    ErrorCode,
    jsonrpc::{NotificationRef, SUBSCRIPTION_ITEM},
};
use berth_store::Principal;

use super::Conn;
use crate::{
    AppState,
    error::{ApiError, ApiResult},
    workers::calls::{self, CallStream},
};

/// What a request handler gets.
#[derive(Clone)]
pub struct Ctx {
    pub state: AppState,
    pub conn: Arc<Conn>,
    /// The request's id.
    pub id: Option<u32>,
    /// The operation receipt this call owns (mutations called with an `operationId`).
    pub op: Option<berth_store::Receipt>,
}

impl Ctx {
    /// Start `method` on the worker holding session `session_id`'s workspace, with `params`
    /// passed on as they came (`workers::calls`).
    pub async fn session_call(
        &self,
        session_id: &str,
        method: &str,
        params: &impl serde::Serialize,
    ) -> ApiResult<CallStream> {
        let me = self.principal()?;
        let params = serde_json::to_value(params).unwrap_or_default();
        calls::call(
            &self.state,
            &me.tenant_id,
            calls::To::Session(session_id),
            method,
            params,
        )
        .await
    }

    /// [`Ctx::session_call`] of a unary method: its answer, decoded.
    pub async fn session_unary<T: serde::de::DeserializeOwned>(
        &self,
        session_id: &str,
        method: &str,
        params: &impl serde::Serialize,
    ) -> ApiResult<T> {
        calls::decoded(self.session_call(session_id, method, params).await?, method).await
    }

    pub fn principal(&self) -> ApiResult<Principal> {
        self.conn
            .principal
            .lock()
            .expect("conn lock")
            .clone()
            .ok_or(ApiError::code(ErrorCode::Unauthorized))
    }

    /// Send one subscription item; waits when the outbound queue is full.
    pub async fn item(&self, item: &impl serde::Serialize) -> bool {
        // Written in one pass: an item may be a worker's raw JSON (a file chunk), which a
        // `Value` in between would parse again.
        #[derive(serde::Serialize)]
        struct Params<'a, T> {
            id: Option<u32>,
            item: &'a T,
        }
        let note = NotificationRef::new(SUBSCRIPTION_ITEM, Params { id: self.id, item });
        self.conn.out.send(text(&note)).await
    }

    /// Send one subscription item that is already JSON text (a worker's file chunk, ~44 KiB):
    /// copied once into a message sized for it, not grown through a serializer.
    pub async fn item_raw(&self, item: &serde_json::value::RawValue) -> bool {
        self.conn.out.send(Message::Text(item_text(self.id, item).into())).await
    }

    /// Send one `files.read` chunk item from its raw bytes: base64-encoded straight into a
    /// message sized for it (the one place a chunk is encoded).
    pub async fn item_chunk(&self, offset: u64, data: &[u8]) -> bool {
        let mut text = item_prefix(self.id, calls::chunk_json_len(data.len()));
        calls::write_chunk_json(&mut text, offset, data);
        text.push_str("}}");
        self.conn.out.send(Message::Text(text.into())).await
    }

    /// Send a run's chunk items (each ≤ 32 KiB, see [`calls::Item::chunks`]).
    pub async fn item_chunks(&self, chunks: &[(u64, bytes::Bytes)]) -> bool {
        for (offset, data) in chunks {
            if !self.item_chunk(*offset, data).await {
                return false;
            }
        }
        true
    }
}

/// A `subscription.item` notification around `item`, as [`Ctx::item`] writes it.
fn item_text(id: Option<u32>, item: &serde_json::value::RawValue) -> String {
    let mut text = item_prefix(id, item.get().len());
    text.push_str(item.get());
    text.push_str("}}");
    text
}

/// A `subscription.item` notification up to its item, in a buffer with room for `len` more.
fn item_prefix(id: Option<u32>, len: usize) -> String {
    use std::fmt::Write;
    let mut text = String::with_capacity(len + 80);
    let _ = write!(
        text,
        r#"{{"jsonrpc":"2.0","method":"{SUBSCRIPTION_ITEM}","params":{{"id":"#
    );
    match id {
        Some(id) => {
            let _ = write!(text, "{id}");
        }
        None => text.push_str("null"),
    }
    text.push_str(r#","item":"#);
    text
}

pub(super) fn text<T: serde::Serialize>(v: &T) -> Message {
    Message::Text(serde_json::to_string(v).unwrap_or_default().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_item_is_written_as_the_serialized_notification() {
        let item =
            serde_json::value::RawValue::from_string(r#"{"type":"chunk","offset":0,"dataBase64":"aGk="}"#.into())
                .unwrap();
        for id in [Some(7), None] {
            #[derive(serde::Serialize)]
            struct Params<'a> {
                id: Option<u32>,
                item: &'a serde_json::value::RawValue,
            }
            let serialized =
                serde_json::to_value(NotificationRef::new(SUBSCRIPTION_ITEM, Params { id, item: &item })).unwrap();
            let written: serde_json::Value = serde_json::from_str(&item_text(id, &item)).unwrap();
            assert_eq!(written, serialized);
        }
    }
}

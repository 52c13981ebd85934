//! The Rust client library (`berth-client`) against real replicas: typed calls, watches as
//! streams, and reconnect + resume through a connection that is cut mid-turn.

use std::time::Duration;

use berth_client::{
    Client, Error,
    method::{SessionCreate, SessionGet, SessionHistory, SessionSend, WorkspaceList},
    protocol::{
        EventPayload, LiveItem, RowKind, SessionCreateParams, SessionHistoryParams, SessionRef, SessionSendParams,
        TurnState, WatchItem,
    },
};
use berth_e2e::{MockProvider, Part, Reply, Stack, cut_proxy::CutProxy};

async fn create_session(client: &Client, workspace_id: &str) -> String {
    client
        .call::<SessionCreate>(SessionCreateParams {
            workspace_id: workspace_id.into(),
            ..Default::default()
        })
        .await
        .expect("session.create")
        .session_id
}

fn send(session_id: &str, prompt: &str, operation_id: Option<&str>) -> SessionSendParams {
    SessionSendParams {
        session_id: session_id.into(),
        prompt: prompt.into(),
        attachments: Vec::new(),
        operation_id: operation_id.map(String::from),
    }
}

/// Items until the turn ends (inclusive).
async fn until_turn_ended(watch: &mut berth_client::Watch) -> Vec<WatchItem> {
    let mut seen = Vec::new();
    loop {
        let item = tokio::time::timeout(Duration::from_secs(30), watch.next_item())
            .await
            .expect("watch stalled")
            .expect("watch ended")
            .expect("watch item");
        let end = matches!(&item, WatchItem::Event(e) if matches!(e.payload, EventPayload::TurnEnded(_)));
        seen.push(item);
        if end {
            return seen;
        }
    }
}

fn sequences(items: &[WatchItem]) -> Vec<i64> {
    items
        .iter()
        .filter_map(|i| match i {
            WatchItem::Event(e) => Some(e.sequence),
            WatchItem::Live(_) => None,
        })
        .collect()
}

#[tokio::test]
async fn typed_calls_and_a_watch_stream() {
    let mock = MockProvider::start().await;
    mock.push(Reply::text(&["Hello ", "there"]));
    let stack = Stack::start(&mock, 1).await;
    let client = Client::connect(&stack.servers[0].addr, &stack.token)
        .await
        .expect("connect");

    let workspaces = client.call::<WorkspaceList>(Default::default()).await.unwrap();
    assert!(
        workspaces
            .iter()
            .any(|w| w.workspace_id == stack.workspace_id && w.online)
    );
    let session = create_session(&client, &stack.workspace_id).await;
    let mut watch = client.watch(&session, 0);
    let sent = client.call::<SessionSend>(send(&session, "hi", None)).await.unwrap();
    let items = until_turn_ended(&mut watch).await;
    let seqs = sequences(&items);
    assert_eq!(seqs, (1..=*seqs.last().unwrap()).collect::<Vec<_>>(), "gapless from 1");
    let Some(WatchItem::Event(end)) = items.last() else {
        unreachable!()
    };
    assert_eq!(end.turn_id.as_deref(), Some(sent.turn_id.as_str()));
    assert!(matches!(&end.payload, EventPayload::TurnEnded(t) if t.state == TurnState::Completed));

    let history = client
        .call::<SessionHistory>(SessionHistoryParams {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let answer = history
        .rows
        .iter()
        .find(|r| r.kind == RowKind::Assistant)
        .expect("assistant row");
    assert_eq!(answer.body, "Hello there");

    // A typed error carries its code.
    let err = client
        .call::<SessionGet>(SessionRef {
            session_id: "ses_nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("not-found"));

    // A wrong credential fails before the upgrade, without retrying.
    assert!(matches!(
        Client::connect(&stack.servers[0].addr, "berth_wrong").await,
        Err(Error::Unauthorized)
    ));
}

#[tokio::test]
async fn a_watch_resumes_after_the_connection_is_cut_mid_turn_without_gap_or_duplicate() {
    let mock = MockProvider::start().await;
    let mut parts = Vec::new();
    for i in 0..12 {
        parts.push(Part::Text(format!("w{i} ")));
        parts.push(Part::Delay(150));
    }
    mock.push(Reply::Stream(parts));
    let stack = Stack::start(&mock, 1).await;
    let proxy = CutProxy::start(&stack.servers[0].addr).await;
    let client = Client::connect(&proxy.server(), &stack.token).await.expect("connect");
    let session = create_session(&client, &stack.workspace_id).await;
    let mut watch = client.watch(&session, 0);
    client.call::<SessionSend>(send(&session, "count", None)).await.unwrap();

    // Cut once the answer is streaming.
    let mut items = Vec::new();
    loop {
        let item = watch.next_item().await.expect("open").expect("item");
        let delta = matches!(&item, WatchItem::Live(LiveItem::ModelDelta(_)));
        items.push(item);
        if delta {
            break;
        }
    }
    proxy.cut();
    items.extend(until_turn_ended(&mut watch).await);

    let seqs = sequences(&items);
    assert_eq!(
        seqs,
        (1..=*seqs.last().unwrap()).collect::<Vec<_>>(),
        "no gap, no duplicate: {seqs:?}"
    );
    assert_eq!(watch.last_sequence(), *seqs.last().unwrap());
    let answer: String = items
        .iter()
        .filter_map(|i| match i {
            WatchItem::Event(e) => e
                .rows
                .iter()
                .find(|r| r.kind == RowKind::Assistant)
                .map(|r| r.body.clone()),
            _ => None,
        })
        .collect();
    let expected: String = (0..12).map(|i| format!("w{i} ")).collect();
    assert_eq!(answer, expected);
}

#[tokio::test]
async fn a_send_whose_answer_was_lost_is_retried_with_its_operation_id_and_runs_once() {
    let mock = MockProvider::start().await;
    mock.push(Reply::text(&["once"]));
    let stack = Stack::start(&mock, 1).await;
    let proxy = CutProxy::start(&stack.servers[0].addr).await;
    let client = Client::connect(&proxy.server(), &stack.token).await.expect("connect");
    let direct = Client::connect(&stack.servers[0].addr, &stack.token)
        .await
        .expect("direct");
    let session = create_session(&client, &stack.workspace_id).await;
    let mut watch = direct.watch(&session, 0);

    // The request reaches the server; its answer is swallowed, then the connection is cut.
    proxy.swallow_answers();
    let call = {
        let client = client.clone();
        let session = session.clone();
        tokio::spawn(async move { client.call::<SessionSend>(send(&session, "do it", None)).await })
    };
    let items = until_turn_ended(&mut watch).await;
    let started = items
        .iter()
        .find_map(|i| match i {
            WatchItem::Event(e) if matches!(e.payload, EventPayload::TurnStarted(_)) => e.turn_id.clone(),
            _ => None,
        })
        .expect("turn.started");
    proxy.cut();
    let sent = call
        .await
        .unwrap()
        .expect("the retry answers with the original outcome");
    assert_eq!(sent.turn_id, started, "the same turn, not a second one");

    let history = direct
        .call::<SessionHistory>(SessionHistoryParams {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let users = history.rows.iter().filter(|r| r.kind == RowKind::User).count();
    assert_eq!(users, 1, "the prompt ran once");
    assert_eq!(mock.requests().len(), 1, "one model call");
}

/// `Client::upload` sends `content.upload` and its binary message; the attachment it names
/// reaches the turn's prompt row with the bytes' digest, and a refused upload is a typed
/// error after which the client goes on working.
#[tokio::test]
async fn an_upload_through_the_client_reaches_the_turn() {
    use berth_client::protocol::ContentUploadParams;
    use sha2::{Digest, Sha256};

    let mock = MockProvider::start().await;
    mock.push(Reply::text(&["read it"]));
    let stack = Stack::start(&mock, 1).await;
    let client = Client::connect(&stack.servers[0].addr, &stack.token)
        .await
        .expect("connect");
    let session = create_session(&client, &stack.workspace_id).await;
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    let digest: String = Sha256::digest(&data).iter().map(|b| format!("{b:02x}")).collect();
    let params = |session_id: &str| ContentUploadParams {
        session_id: session_id.into(),
        mime: "application/octet-stream".into(),
        filename: "data.bin".into(),
        bytes: None,
    };
    let uploaded = client.upload(params(&session), &data).await.expect("upload");
    assert_eq!(uploaded.bytes, data.len() as u64);
    assert_eq!(uploaded.sha256, digest);

    let err = client.upload(params("ses_nope"), b"x").await.unwrap_err();
    assert_eq!(err.code(), Some("not-found"));

    let mut watch = client.watch(&session, 0);
    let mut params = send(&session, "look", None);
    params.attachments = vec![uploaded.attachment_id.clone()];
    client.call::<SessionSend>(params).await.expect("send");
    until_turn_ended(&mut watch).await;
    let history = client
        .call::<SessionHistory>(SessionHistoryParams {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let prompt = history
        .rows
        .iter()
        .find(|r| r.kind == RowKind::User)
        .expect("prompt row");
    let named = serde_json::to_value(&prompt.attachments).expect("json");
    assert_eq!(named[0]["attachmentId"], uploaded.attachment_id.as_str());
    assert_eq!(named[0]["sha256"], digest.as_str());
}

//! The model's questions (issue 51): its `ask_user` tool becomes a typed question
//! interaction (`choice`, `text`, `confirm`) that clients answer through the protocol; the
//! answer, a skip, or the fallback on expiry reaches the model's next request as the call's
//! result.

use berth_e2e::{MockProvider, Reply, Stack, client::code};
use serde_json::{Value, json};

/// The tool result the model was sent for call `id`, from the provider's requests.
fn tool_result(mock: &MockProvider, id: &str) -> Option<Value> {
    mock.requests().iter().find_map(|r| {
        r["messages"].as_array()?.iter().find_map(|m| {
            (m["role"] == "tool" && m["tool_call_id"] == id)
                .then(|| serde_json::from_str(m["content"].as_str()?).ok())
                .flatten()
        })
    })
}

/// The model asks a choice; the watcher sees the question (kind, options, allowSkip) and
/// answers it through `session.respond`; the model's next request carries the answer. A
/// choice outside the options, and a skip of a question that does not allow one, are
/// refused.
#[tokio::test(flavor = "multi_thread")]
async fn the_model_asks_and_the_answer_reaches_its_next_request() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    w.until(10, |i| i["type"] == "state").await.expect("caught up");
    let ask = json!({"kind": "choice", "question": "Which branch?", "options": ["main", "dev"], "allow_skip": false});
    mock.push(Reply::tools(&[("q1", "ask_user", ask)], 16));
    mock.push(Reply::text(&["Going with dev."]));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "merge it"}))
        .await;
    let items = w
        .until(30, |i| i["type"] == "interaction.requested")
        .await
        .expect("the question is asked");
    let q = &items.last().unwrap()["interaction"];
    assert_eq!(q["kind"], "choice");
    assert_eq!(q["input"], json!({"question": "Which branch?"}));
    assert_eq!(q["options"], json!(["main", "dev"]));
    assert_eq!(q["params"], json!({"allowSkip": false}));
    assert_eq!(q["fallback"], json!({"choice": null}));
    let id = q["interactionId"].clone();

    let outside = c
        .call(
            "session.respond",
            json!({"interactionId": id, "answer": {"choice": "prod"}}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&outside), "bad-params");
    let skip = c
        .call(
            "session.respond",
            json!({"interactionId": id, "answer": {"choice": null}}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&skip), "bad-params", "allowSkip: false");
    let answered = c
        .ok(
            "session.respond",
            json!({"interactionId": id, "answer": {"choice": "dev"}}),
        )
        .await;
    assert_eq!(answered["state"], "answered");
    w.until(30, |i| i["type"] == "turn.ended").await.expect("the turn ends");
    assert_eq!(tool_result(&mock, "q1"), Some(json!({"answer": "dev"})));
}

/// Nobody answers in time: the question expires with its fallback (`{choice: null}`), and
/// the model is told nobody answered, so it goes on.
#[tokio::test(flavor = "multi_thread")]
async fn an_unanswered_question_expires_to_its_fallback() {
    let mock = MockProvider::start().await;
    let stack = Stack::start_with(&mock, 1, &[("BERTH_INTERACTION_TIMEOUT_SECS", "2")]).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    w.until(10, |i| i["type"] == "state").await.expect("caught up");
    let ask = json!({"kind": "confirm", "question": "Delete the build directory?"});
    mock.push(Reply::tools(&[("q1", "ask_user", ask)], 16));
    mock.push(Reply::text(&["I left it."]));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "clean up"}))
        .await;
    let items = w.until(30, |i| i["type"] == "turn.ended").await.expect("the turn ends");
    let asked = items
        .iter()
        .find(|i| i["type"] == "interaction.requested")
        .expect("asked");
    assert_eq!(asked["interaction"]["kind"], "confirm");
    assert_eq!(asked["interaction"]["options"], json!(["yes", "no"]));
    let resolved = items
        .iter()
        .find(|i| i["type"] == "interaction.resolved")
        .expect("resolved");
    assert_eq!(resolved["state"], "expired");
    assert_eq!(resolved["outcome"], json!({"choice": null}));
    let result = tool_result(&mock, "q1").expect("the model reads the result");
    assert_eq!(result["answered"], false);
    assert_eq!(result["reason"], "nobody answered in time");
}

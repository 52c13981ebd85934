//! The agent at work (issue 9): the worker's loop runs tools in the workspace, publishes
//! every status change as an event, sends earlier calls and results back to the model,
//! confines paths, honours the step limit, and kills running tools on stop.

use std::{path::Path, time::Duration};

use berth_e2e::{Client, MockProvider, Part, Reply, Stack, client::Subscription};
use serde_json::{Value, json};

fn is_turn_end(e: &Value) -> bool {
    e["type"] == "turn.ended"
}

async fn auto_session(stack: &Stack, c: &mut Client) -> String {
    let s = c
        .ok(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "autoApprove": true}),
        )
        .await;
    s["sessionId"].as_str().unwrap().to_string()
}

/// Send `prompt` and collect the watched events until the turn ends.
async fn turn(c: &mut Client, watch: &mut Subscription, sid: &str, prompt: &str) -> Vec<Value> {
    c.ok("session.send", json!({"sessionId": sid, "prompt": prompt})).await;
    watch.until(60, is_turn_end).await.expect("the turn ends")
}

/// The rows a watcher knows from the events it saw: published rows, with tool-call
/// statuses moved by `tool.status` and `tool.ended`.
fn rows_from_events(events: &[Value]) -> Vec<Value> {
    let mut rows: Vec<Value> = Vec::new();
    for e in events.iter().filter(|e| e.get("sequence").is_some()) {
        if let Some(published) = e["rows"].as_array() {
            rows.extend(published.iter().cloned());
        }
        if e["type"] == "tool.status" || e["type"] == "tool.ended" {
            let call = rows
                .iter_mut()
                .find(|r| r["position"] == e["position"])
                .expect("the call row was published first");
            assert_eq!(call["tool"]["callId"], e["callId"]);
            call["tool"]["status"] = e["status"].clone();
        }
    }
    rows
}

fn kinds(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .map(|r| match r["tool"]["status"].as_str() {
            Some(s) => format!(
                "{}:{}:{s}",
                r["kind"].as_str().unwrap(),
                r["tool"]["name"].as_str().unwrap()
            ),
            None => r["kind"].as_str().unwrap().to_string(),
        })
        .collect()
}

/// The messages of provider request `i`.
fn messages(mock: &MockProvider, i: usize) -> Vec<Value> {
    mock.requests()[i]["messages"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_turn_writes_a_file_runs_a_command_that_reads_it_and_answers() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));

    let write = json!({"path": "notes/hello.txt", "content": "hello from the agent\n"});
    mock.push(Reply::tools(&[("call_w", "write_file", write.clone())], 7));
    let shell = json!({"command": "cat notes/hello.txt"});
    mock.push(Reply::tools(&[("call_s", "shell", shell.clone())], 5));
    mock.push(Reply::text(&["The file ", "says hello."]));
    let events = turn(&mut c, &mut watch, &sid, "Write a note and show it").await;
    let end = events.last().unwrap();
    assert_eq!(end["state"], "completed", "{end}");
    assert_eq!(
        std::fs::read_to_string(stack.workspace_dir.join("notes/hello.txt")).unwrap(),
        "hello from the agent\n"
    );

    // Every status change is an event, in order.
    let types: Vec<&str> = events
        .iter()
        .filter(|e| e.get("sequence").is_some())
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "session.created",
            "turn.started",
            "model.completed",
            "tool.status",
            "tool.ended",
            "model.completed",
            "tool.status",
            "tool.ended",
            "model.completed",
            "turn.ended"
        ]
    );

    // The provider's second and third requests carry the earlier calls and results.
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 3);
    let names: Vec<&str> = reqs[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "shell",
            "shell_output",
            "read_file",
            "view_image",
            "write_file",
            "edit_file",
            "apply_patch",
            "list_directory",
            "glob",
            "search_files",
            "update_plan",
            "ask_user",
            "delegate"
        ]
    );
    let m1 = messages(&mock, 1);
    assert_eq!(m1[0]["role"], "system");
    assert_eq!(m1[1], json!({"role": "user", "content": "Write a note and show it"}));
    assert_eq!(
        m1[2],
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_w", "type": "function", "function": {"name": "write_file", "arguments": write.to_string()}}
        ]})
    );
    assert_eq!(
        m1[3],
        json!({"role": "tool", "tool_call_id": "call_w", "content": "wrote notes/hello.txt (21 bytes, 1 lines)"})
    );
    assert_eq!(m1.len(), 4);
    let m2 = messages(&mock, 2);
    assert_eq!(m2[..4], m1[..]);
    assert_eq!(m2[4]["tool_calls"][0]["function"]["arguments"], shell.to_string());
    assert_eq!(
        m2[5],
        json!({"role": "tool", "tool_call_id": "call_s", "content": "hello from the agent\n[exit code 0]"})
    );

    // History holds every row in order with its final status; a fresh client reading it
    // sees what the live watcher saw.
    let mut fresh = stack.client(0).await;
    let rows = fresh.history(&sid).await;
    assert_eq!(
        kinds(&rows),
        [
            "user",
            "toolCall:write_file:completed",
            "toolResult:write_file:completed",
            "toolCall:shell:completed",
            "toolResult:shell:completed",
            "assistant"
        ]
    );
    assert_eq!(rows[4]["body"], "hello from the agent\n[exit code 0]");
    assert_eq!(rows[5]["body"], "The file says hello.");
    assert_eq!(rows_from_events(&events), rows);

    // A later turn sends the whole conversation, tool calls and results included, in the
    // provider's shape (history → request).
    mock.push(Reply::text(&["Again."]));
    let events = turn(&mut c, &mut watch, &sid, "And now?").await;
    assert_eq!(events.last().unwrap()["state"], "completed");
    let m3 = messages(&mock, 3);
    assert_eq!(m3[..6], m2[..]);
    assert_eq!(m3[6], json!({"role": "assistant", "content": "The file says hello."}));
    assert_eq!(m3[7], json!({"role": "user", "content": "And now?"}));
    assert_eq!(m3.len(), 8);
}

#[tokio::test]
async fn two_calls_in_one_step_with_arguments_in_many_chunks_run_in_order() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));

    // The second call reads what the first wrote: order matters.
    let first = json!({"path": "order.txt", "content": "written by the first call"});
    let second = json!({"command": "cat order.txt && echo ' then the second'"});
    mock.push(Reply::tools(&[("c1", "write_file", first), ("c2", "shell", second)], 2));
    mock.push(Reply::text(&["Both ran."]));
    let events = turn(&mut c, &mut watch, &sid, "Two things").await;
    assert_eq!(events.last().unwrap()["state"], "completed");

    let m = messages(&mock, 1);
    let calls: Vec<&str> = m[2]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(calls, ["c1", "c2"]);
    assert_eq!(m[3]["tool_call_id"], "c1");
    assert_eq!(m[3]["content"], "wrote order.txt (25 bytes, 1 lines)");
    assert_eq!(m[4]["tool_call_id"], "c2");
    assert_eq!(
        m[4]["content"],
        "written by the first call then the second\n[exit code 0]"
    );

    let ended: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "tool.ended")
        .map(|e| e["callId"].as_str().unwrap())
        .collect();
    assert_eq!(ended, ["c1", "c2"]);
}

/// Reads in a row of one step run together (all announced running before the first ends),
/// after what came before them and before what comes after; their results are published
/// and given to the model in the calls' order.
#[tokio::test]
async fn reads_in_a_row_run_together_and_in_order_with_the_rest() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(Reply::tools(
        &[
            ("w1", "write_file", json!({"path": "x.txt", "content": "v1\n"})),
            ("r1", "read_file", json!({"path": "x.txt"})),
            ("r2", "search_files", json!({"pattern": "v1"})),
            ("r3", "glob", json!({"pattern": "*.txt"})),
            ("s1", "shell", json!({"command": "echo v2 > x.txt"})),
            ("r4", "read_file", json!({"path": "x.txt"})),
        ],
        4,
    ));
    mock.push(Reply::text(&["Read."]));
    let events = turn(&mut c, &mut watch, &sid, "Read it all").await;
    assert_eq!(events.last().unwrap()["state"], "completed");
    let r = results(&mock, 1);
    assert_eq!(r["r1"], "     1\tv1\n");
    assert_eq!(r["r2"], "x.txt:1:v1\n");
    assert_eq!(r["r3"], "x.txt\n");
    assert_eq!(r["r4"], "     1\tv2\n");
    let sent = messages(&mock, 1);
    let order: Vec<&str> = sent
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["w1", "r1", "r2", "r3", "s1", "r4"]);
    let tool_events: Vec<(String, &str)> = events
        .iter()
        .filter(|e| e["type"] == "tool.status" || e["type"] == "tool.ended")
        .map(|e| (e["type"].as_str().unwrap().to_string(), e["callId"].as_str().unwrap()))
        .collect();
    let at = |kind: &str, id: &str| {
        tool_events
            .iter()
            .position(|(k, i)| k == kind && *i == id)
            .unwrap_or_else(|| panic!("{kind} {id} in {tool_events:?}"))
    };
    for id in ["r1", "r2", "r3"] {
        assert!(at("tool.status", id) < at("tool.ended", "r1"), "{tool_events:?}");
        assert!(at("tool.ended", "w1") < at("tool.status", id), "{tool_events:?}");
    }
    let ended: Vec<&str> = tool_events
        .iter()
        .filter(|(k, _)| k == "tool.ended")
        .map(|(_, i)| *i)
        .collect();
    assert_eq!(ended, ["w1", "r1", "r2", "r3", "s1", "r4"]);
}

/// Processes whose process group is `pgid` (zombies excepted).
fn group_members(pgid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp …; comm may contain spaces, so split after the ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() != Some(&"Z") && fields.get(2).and_then(|g| g.parse().ok()) == Some(pgid) {
            out.push(pid);
        }
    }
    out
}

/// Run `command` as a shell call, stop the turn once `pidfile` holds `pids` lines, and
/// check that nothing of the command's process group is left 2 s later.
async fn stop_during(command: &str, pidfile: &str, pids: usize) {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(Reply::tools(&[("c1", "shell", json!({"command": command}))], 8));
    let sent = c
        .ok("session.send", json!({"sessionId": sid, "prompt": "run it"}))
        .await;
    let path = stack.workspace_dir.join(pidfile);
    let read = |p: &Path| -> Vec<i32> {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    let recorded = berth_e2e::harness::eventually(30, || {
        let got = read(&path);
        async move { (got.len() >= pids).then_some(got) }
    })
    .await
    .expect("the command started");
    let pgid = recorded[0];
    assert!(!group_members(pgid).is_empty());
    c.ok("session.stop", json!({"sessionId": sid, "turnId": sent["turnId"]}))
        .await;
    let events = watch.until(30, is_turn_end).await.expect("turn ends");
    assert_eq!(events.last().unwrap()["state"], "cancelled");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(group_members(pgid), Vec::<i32>::new(), "the tool's processes remain");
    for pid in recorded {
        assert!(!Path::new(&format!("/proc/{pid}")).exists() || group_members(pgid).is_empty());
    }
    // Nothing was written after the stop.
    let rows = c.history(&sid).await;
    assert!(rows.iter().all(|r| r["kind"] != "toolResult"), "{rows:?}");
}

#[tokio::test]
async fn stop_during_sleep_kills_the_command() {
    stop_during("echo $$ > pid; sleep 600", "pid", 1).await;
}

#[tokio::test]
async fn stop_kills_a_shell_that_ignores_sigterm_and_its_child() {
    let script =
        "echo $$ > pids; trap '' TERM; (trap '' TERM; sleep 600; echo never) & echo $! >> pids; wait; sleep 600";
    stop_during(script, "pids", 2).await;
}

#[tokio::test]
async fn paths_outside_the_workspace_are_tool_errors_and_nothing_outside_is_touched() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));

    let ws = &stack.workspace_dir;
    let outside = berth_e2e::harness::scratch_dir("outside");
    std::fs::write(outside.join("secret"), "SECRET").unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), ws.join("link")).unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("outdir")).unwrap();
    let parent_x = ws.parent().unwrap().join("x");
    let existed = parent_x.exists();

    let calls = [
        ("r1", "read_file", json!({"path": "../x"})),
        ("r2", "read_file", json!({"path": "/etc/passwd"})),
        ("r3", "read_file", json!({"path": "link"})),
        ("r4", "read_file", json!({"path": "outdir/secret"})),
        ("w1", "write_file", json!({"path": "../x", "content": "escaped"})),
        ("w2", "write_file", json!({"path": "link", "content": "overwritten"})),
        ("w3", "write_file", json!({"path": "outdir/new", "content": "escaped"})),
        (
            "e1",
            "edit_file",
            json!({"path": "link", "old_string": "SECRET", "new_string": "x"}),
        ),
        ("l1", "list_directory", json!({"path": "outdir"})),
        ("s1", "search_files", json!({"pattern": "SECRET", "path": "outdir"})),
    ];
    mock.push(Reply::tools(&calls, 16));
    mock.push(Reply::text(&["Refused, as expected."]));
    let events = turn(&mut c, &mut watch, &sid, "Try to escape").await;
    assert_eq!(events.last().unwrap()["state"], "completed");
    let results: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool.ended")
        .map(|e| &e["rows"][0])
        .collect();
    assert_eq!(results.len(), calls.len());
    for (r, (id, ..)) in results.iter().zip(&calls) {
        assert_eq!(r["tool"]["callId"], *id);
        assert_eq!(r["tool"]["status"], "failed", "{id}: {r}");
        let body = r["body"].as_str().unwrap();
        assert!(body.contains("outside the workspace"), "{id}: {body}");
        assert!(!body.contains("SECRET") && !body.contains("root:"), "{id}: {body}");
    }
    assert_eq!(std::fs::read_to_string(outside.join("secret")).unwrap(), "SECRET");
    assert!(!outside.join("new").exists());
    assert_eq!(parent_x.exists(), existed);

    // A symlink swapped in and out while the model reads: never the outside's content.
    std::fs::write(ws.join("plain"), "inside").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (stop, ws, secret) = (stop.clone(), ws.clone(), outside.join("secret"));
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::fs::copy(ws.join("plain"), ws.join("tmp-file")).ok();
                std::fs::rename(ws.join("tmp-file"), ws.join("target")).ok();
                std::os::unix::fs::symlink(&secret, ws.join("tmp-link")).ok();
                std::fs::rename(ws.join("tmp-link"), ws.join("target")).ok();
            }
        })
    };
    let reads: Vec<(String, &str, Value)> = (0..40)
        .map(|i| (format!("t{i}"), "read_file", json!({"path": "target"})))
        .collect();
    let reads: Vec<(&str, &str, Value)> = reads.iter().map(|(i, n, a)| (i.as_str(), *n, a.clone())).collect();
    mock.push(Reply::tools(&reads, 64));
    mock.push(Reply::text(&["Read."]));
    let events = turn(&mut c, &mut watch, &sid, "Read while it changes").await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    swapper.join().unwrap();
    assert_eq!(events.last().unwrap()["state"], "completed");
    let bodies: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "tool.ended")
        .map(|e| e["rows"][0]["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies.len(), 40);
    for b in bodies {
        assert!(
            b == "     1\tinside\n" || b.contains("outside the workspace") || b.contains("no such file"),
            "{b}"
        );
    }
}

/// Issue 48: at the step limit the model gets one last step to summarise — tools declared
/// but none to be called, and told why — whose calls, if it makes any, do not run; the turn
/// completes with a `step-limit` notice instead of failing.
#[tokio::test]
async fn the_step_limit_ends_with_a_summary_step_and_a_notice() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    stack.kill_worker().await;
    stack.start_worker_with_args(0, &["--max-steps", "2"]).await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    for i in 0..3 {
        mock.push(Reply::tools(&[(&format!("c{i}"), "list_directory", json!({}))], 4));
    }
    let events = turn(&mut c, &mut watch, &sid, "Loop forever").await;
    let end = events.last().unwrap();
    assert_eq!(end["state"], "completed", "{end}");
    let notice = events
        .iter()
        .find(|e| e["type"] == "session.notice")
        .expect("a step-limit notice");
    assert_eq!(notice["code"], "step-limit", "{notice}");
    assert_eq!(notice["params"]["maxSteps"], 2);
    let requests = mock.requests();
    assert_eq!(requests.len(), 3);
    let last = &requests[2];
    assert_eq!(last["tool_choice"], "none", "no tool is to be called");
    assert!(last["tools"].as_array().is_some_and(|t| !t.is_empty()));
    let note = last["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(note["role"], "user");
    assert!(
        note["content"].as_str().unwrap().contains("used all 2 of its steps"),
        "{note}"
    );
    // Both steps' calls ran; the last step's call did not.
    let rows = c.history(&sid).await;
    assert_eq!(
        kinds(&rows),
        [
            "user",
            "toolCall:list_directory:completed",
            "toolResult:list_directory:completed",
            "toolCall:list_directory:completed",
            "toolResult:list_directory:completed",
            "assistant"
        ]
    );
}

/// A stack whose session's turn runs `command` (which writes its shell's pid, its process
/// group's id, to `pid` in the workspace) through the shell tool, once it runs: the stack, the
/// client, the session, its watch and the group.
async fn running_shell(mock: &MockProvider, command: &str) -> (Stack, Client, String, Subscription, i32) {
    let stack = Stack::start(mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(Reply::tools(&[("c1", "shell", json!({"command": command}))], 8));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "long job"}))
        .await;
    watch
        .until(30, |e| e["type"] == "tool.status" && e["status"] == "running")
        .await
        .expect("the command runs");
    let pgid = berth_e2e::harness::pid_written(&stack.workspace_dir.join("pid"))
        .await
        .expect("pid recorded");
    (stack, c, sid, watch, pgid)
}

/// Send SIGTERM to the process `child`, without waiting for it.
fn sigterm(child: &tokio::process::Child) {
    let pid = child.id().expect("running").to_string();
    let sent = std::process::Command::new("kill").args(["-TERM", &pid]).status();
    assert!(sent.is_ok_and(|s| s.success()));
}

/// A worker stopped at once mid-command (a second SIGTERM while it drains, or the drain's
/// timeout): the turn ends `interrupted`, its command goes with it, and the session goes on
/// once a worker is back.
#[tokio::test]
async fn a_worker_restarted_mid_tool_leaves_the_turn_interrupted_and_the_session_continues() {
    let mock = MockProvider::start().await;
    let (mut stack, mut c, sid, mut watch, pgid) = running_shell(&mock, "echo $$ > pid; sleep 600").await;
    let mut worker = stack.worker.take().unwrap();
    sigterm(&worker.child);
    tokio::time::sleep(Duration::from_millis(300)).await;
    berth_e2e::harness::terminate(&mut worker.child).await;
    let end = watch.until(60, is_turn_end).await.expect("turn ends");
    assert_eq!(end.last().unwrap()["state"], "interrupted");
    assert_eq!(group_members(pgid), Vec::<i32>::new());
    stack.start_worker(0).await;

    // The call never ended: history keeps it `running`, and the next request answers it
    // for the provider, so the session goes on where it left off.
    mock.push(Reply::text(&["Back."]));
    let events = turn(&mut c, &mut watch, &sid, "Where were we?").await;
    assert_eq!(events.last().unwrap()["state"], "completed");
    let m = messages(&mock, 1);
    assert_eq!(m[1]["content"], "long job");
    assert_eq!(m[2]["tool_calls"][0]["id"], "c1");
    assert_eq!(m[3]["tool_call_id"], "c1");
    assert!(m[3]["content"].as_str().unwrap().contains("no result"));
    assert_eq!(m[4], json!({"role": "user", "content": "Where were we?"}));
    let rows = c.history(&sid).await;
    assert_eq!(rows[1]["tool"]["status"], "running");
}

/// A worker shutting down (its first SIGTERM: an upgrade, a restart) finishes the turn it
/// runs instead of interrupting it, is handed no new turn meanwhile (a turn sent then waits
/// in its queue), and exits by itself once its turn has ended; the waiting turn runs on the
/// worker's next process.
#[tokio::test]
async fn a_worker_shutting_down_finishes_its_turn_and_takes_no_new_one() {
    let mock = MockProvider::start().await;
    let (mut stack, mut c, _sid, mut watch, _pgid) = running_shell(&mock, "echo $$ > pid; sleep 2; echo slept").await;
    // After the command, a sub-agent: refused at once while the worker drains (its turn would
    // not be handed to this worker any more).
    mock.push(Reply::tools(&[("d1", "delegate", json!({"prompt": "help"}))], 2));
    mock.push(Reply::text(&["Finished."]));
    let mut worker = stack.worker.take().unwrap();
    sigterm(&worker.child);
    let log = worker.log.clone();
    berth_e2e::harness::eventually(30, || {
        let told =
            std::fs::read_to_string(&log).is_ok_and(|l| l.contains("the server hands this worker no more turns"));
        async move { told.then_some(()) }
    })
    .await
    .expect("the worker tells the server it drains");
    // A turn sent while the worker drains is not handed to it.
    let other = auto_session(&stack, &mut c).await;
    let mut other_watch = c.subscribe("session.watch", json!({"sessionId": other, "after": 0}));
    c.ok(
        "session.send",
        json!({"sessionId": other, "prompt": "after the restart"}),
    )
    .await;
    let end = watch.until(60, is_turn_end).await.expect("the turn ends");
    assert_eq!(end.last().unwrap()["state"], "completed", "{end:?}");
    let result = end
        .iter()
        .find(|e| e["type"] == "tool.ended")
        .expect("the command ended");
    assert_eq!(result["rows"][0]["body"], "slept\n[exit code 0]");
    let refused = end
        .iter()
        .filter(|e| e["type"] == "tool.ended")
        .nth(1)
        .expect("the delegate call ended");
    assert!(
        refused["rows"][0]["body"]
            .as_str()
            .unwrap()
            .contains("the worker is shutting down"),
        "{refused}"
    );
    let status = tokio::time::timeout(Duration::from_secs(30), worker.child.wait())
        .await
        .expect("the worker exits once its turn has ended")
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(mock.requests().len(), 3, "the waiting turn asked the model nothing yet");
    let log = std::fs::read_to_string(&worker.log).unwrap();
    assert_eq!(
        log.matches("turn started").count(),
        1,
        "only the first turn ran there: {log}"
    );
    // The next process runs it.
    mock.push(Reply::text(&["Ran after the restart."]));
    stack.start_worker(0).await;
    let events = other_watch.until(60, is_turn_end).await.expect("the waiting turn runs");
    assert_eq!(events.last().unwrap()["state"], "completed");
    let m = messages(&mock, 3);
    assert_eq!(m.last().unwrap()["content"], "after the restart");
}

/// A worker killed outright (SIGKILL: no chance to clean up) mid-command: the command and
/// what it started in its group go with it, killed by the guard waiting on the worker's
/// lifeline, not left running on the workspace machine.
#[tokio::test]
async fn a_worker_killed_mid_tool_takes_its_command_with_it() {
    let mock = MockProvider::start().await;
    let (mut stack, _c, _sid, mut watch, pgid) = running_shell(&mock, "sleep 600 & echo $$ > pid; wait").await;
    assert!(group_members(pgid).len() >= 2, "the command and its child run");
    stack.kill_worker().await;
    let end = watch.until(60, is_turn_end).await.expect("turn ends");
    assert_eq!(end.last().unwrap()["state"], "interrupted");
    let left = berth_e2e::harness::eventually(30, || {
        let members = group_members(pgid);
        async move { members.is_empty().then_some(()) }
    })
    .await;
    assert!(left.is_some(), "left running: {:?}", group_members(pgid));
}

#[tokio::test]
async fn a_session_without_tools_sends_no_tools() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let s = c
        .ok(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "noTools": true}),
        )
        .await;
    let sid = s["sessionId"].as_str().unwrap().to_string();
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(Reply::Stream(vec![Part::Text("Plain answer.".into())]));
    let events = turn(&mut c, &mut watch, &sid, "hi").await;
    assert_eq!(events.last().unwrap()["state"], "completed");
    let req = &mock.requests()[0];
    assert!(req.get("tools").is_none(), "{req}");
}

#[tokio::test]
async fn a_large_output_is_cut_for_the_model_and_whole_in_history() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let command = "head -c 200000 /dev/zero | tr '\\0' a; echo; echo END";
    mock.push(Reply::tools(&[("c1", "shell", json!({"command": command}))], 16));
    mock.push(Reply::text(&["Long."]));
    let events = turn(&mut c, &mut watch, &sid, "Print a lot").await;
    assert_eq!(events.last().unwrap()["state"], "completed");
    let expected = format!("{}\nEND\n[exit code 0]", "a".repeat(200_000));

    // The model saw a marked cut, with the head and the tail.
    let shown = messages(&mock, 1)[3]["content"].as_str().unwrap().to_string();
    assert!(shown.len() < 40_000, "{}", shown.len());
    assert_eq!(shown.matches("left out here").count(), 1, "one note");
    assert!(shown.contains("bytes in all"));
    assert!(shown.starts_with("aaaa") && shown.ends_with("END\n[exit code 0]"));

    // History keeps all of it: a small page cuts and marks the field, source reads it whole.
    let result = events.iter().find(|e| e["type"] == "tool.ended").unwrap()["rows"][0].clone();
    let page = c
        .ok(
            "session.history",
            json!({"sessionId": sid, "target": {"kind": "row", "position": result["position"], "field": "body"}, "maxBytes": 4096}),
        )
        .await;
    assert_eq!(page["rows"][0]["truncated"]["body"]["bytes"], expected.len());
    let mut whole = String::new();
    let mut offset = 0u64;
    loop {
        let r = c
            .ok(
                "session.source",
                json!({"sessionId": sid, "position": result["position"], "field": "body", "offset": offset, "limit": 65536}),
            )
            .await;
        whole.push_str(r["data"].as_str().unwrap());
        match r["nextOffset"].as_u64() {
            Some(n) => offset = n,
            None => break,
        }
    }
    assert_eq!(whole, expected);
}

/// `view_image` shows a workspace image to the model: the call's result says what was shown,
/// and the next request carries the image as input in a user message after the step's
/// results (a tool result is text only); a later turn's request carries only the text.
#[tokio::test]
async fn an_image_the_model_views_reaches_it_as_image_input() {
    use base64::Engine as _;
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89";
    std::fs::write(stack.workspace_dir.join("shot.png"), png).unwrap();
    std::fs::write(stack.workspace_dir.join("notes.txt"), "words").unwrap();
    mock.push(Reply::tools(
        &[
            ("v1", "view_image", json!({"path": "shot.png"})),
            ("v2", "view_image", json!({"path": "notes.txt"})),
        ],
        8,
    ));
    mock.push(Reply::text(&["A one-pixel image."]));
    let events = turn(&mut c, &mut watch, &sid, "Look at the screenshot").await;
    assert_eq!(events.last().unwrap()["state"], "completed");
    assert!(offered(&mock, 0).contains(&"view_image".to_string()));
    let sent = messages(&mock, 1);
    let roles: Vec<&str> = sent.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "tool", "user"],
        "{sent:?}"
    );
    let shown = sent[3]["content"].as_str().unwrap();
    assert!(
        shown.starts_with(&format!("shot.png: image/png, {} bytes, shown to you", png.len())),
        "{shown}"
    );
    assert!(
        sent[4]["content"]
            .as_str()
            .unwrap()
            .contains("not a PNG, JPEG, GIF or WebP image")
    );
    let b64 = base64::engine::general_purpose::STANDARD.encode(png);
    assert_eq!(
        sent[5]["content"][0]["text"],
        "[Berth: the images view_image showed, in order: shot.png]"
    );
    assert_eq!(sent[5]["content"][1]["type"], "image_url");
    assert_eq!(
        sent[5]["content"][1]["image_url"]["url"],
        format!("data:image/png;base64,{b64}")
    );
    // History keeps what the model read; the next turn is not sent the image again.
    let rows = c.history(&sid).await;
    let result = rows
        .iter()
        .find(|r| r["kind"] == "toolResult" && r["tool"]["callId"] == "v1")
        .expect("the call's result");
    assert_eq!(result["tool"]["status"], "completed");
    assert_eq!(result["body"].as_str(), Some(shown));
    mock.push(Reply::text(&["ok"]));
    let events = turn(&mut c, &mut watch, &sid, "Thanks").await;
    assert_eq!(events.last().unwrap()["state"], "completed");
    let later = serde_json::to_string(&messages(&mock, 2)).unwrap();
    assert!(
        later.contains("shown to you") && !later.contains("image_url"),
        "{later}"
    );
}

/// The tool names offered in provider request `i`.
fn offered(mock: &MockProvider, i: usize) -> Vec<String> {
    mock.requests()[i]["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The sessions `sid` started (`session.list {parent}`).
async fn children(c: &mut Client, sid: &str) -> Vec<String> {
    let list = c.ok("session.list", json!({"parent": sid})).await;
    list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["sessionId"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_sub_agent_runs_and_its_answer_returns_to_the_parent_within_the_depth_bound() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));

    // Parent, child (three steps, the second one past the depth bound), parent again.
    mock.push(Reply::tools(
        &[("d1", "delegate", json!({"prompt": "Write child.txt and report"}))],
        9,
    ));
    mock.push(Reply::tools(
        &[(
            "w1",
            "write_file",
            json!({"path": "child.txt", "content": "from the child"}),
        )],
        9,
    ));
    mock.push(Reply::tools(&[("d2", "delegate", json!({"prompt": "deeper"}))], 9));
    mock.push(Reply::text(&["child done: wrote child.txt"]));
    mock.push(Reply::text(&["The sub-agent wrote it."]));
    let events = turn(&mut c, &mut watch, &sid, "Get it done by a sub-agent").await;
    assert_eq!(events.last().unwrap()["state"], "completed", "{:?}", events.last());

    // The parent's call returned the child's final answer.
    let ended = events.iter().find(|e| e["type"] == "tool.ended").unwrap();
    assert_eq!(ended["status"], "completed");
    assert_eq!(ended["rows"][0]["body"], "child done: wrote child.txt");
    let m = messages(&mock, 4);
    assert_eq!(m[3]["tool_call_id"], "d1");
    assert_eq!(m[3]["content"], "child done: wrote child.txt");
    assert!(offered(&mock, 0).contains(&"delegate".to_string()));
    assert!(
        !offered(&mock, 1).contains(&"delegate".to_string()),
        "the child has no depth left"
    );
    assert_eq!(
        std::fs::read_to_string(stack.workspace_dir.join("child.txt")).unwrap(),
        "from the child"
    );

    // The child is an ordinary session naming its parent; its own delegate call failed.
    let kids = children(&mut c, &sid).await;
    assert_eq!(kids.len(), 1);
    let rows = c.history(&kids[0]).await;
    assert_eq!(
        kinds(&rows),
        [
            "user",
            "toolCall:write_file:completed",
            "toolResult:write_file:completed",
            "toolCall:delegate:failed",
            "toolResult:delegate:failed",
            "assistant"
        ]
    );
    assert_eq!(rows[0]["body"], "Write child.txt and report");
    assert!(rows[4]["body"].as_str().unwrap().contains("delegation depth"));
    assert!(children(&mut c, &kids[0]).await.is_empty());
}

#[tokio::test]
async fn stopping_the_parent_stops_the_sub_agent() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(Reply::tools(
        &[("d1", "delegate", json!({"prompt": "wait a long time"}))],
        9,
    ));
    mock.push(Reply::tools(
        &[("s1", "shell", json!({"command": "echo $$ > child.pid; sleep 600"}))],
        9,
    ));
    let sent = c
        .ok("session.send", json!({"sessionId": sid, "prompt": "delegate"}))
        .await;
    let pidfile = stack.workspace_dir.join("child.pid");
    let pgid: i32 = berth_e2e::harness::pid_written(&pidfile)
        .await
        .expect("the child runs its command");
    let kid = children(&mut c, &sid).await.remove(0);
    let mut child_watch = c.subscribe("session.watch", json!({"sessionId": kid, "after": 0}));
    c.ok("session.stop", json!({"sessionId": sid, "turnId": sent["turnId"]}))
        .await;
    let parent_end = watch.until(30, is_turn_end).await.expect("parent ends");
    assert_eq!(parent_end.last().unwrap()["state"], "cancelled");
    let child_end = child_watch.until(30, is_turn_end).await.expect("child ends");
    assert_eq!(child_end.last().unwrap()["state"], "cancelled");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(group_members(pgid), Vec::<i32>::new(), "the child's command remains");
}

/// The child of a delegate call and its first turn go in together, in the transaction that
/// holds the parent session's lock (so that a stop of the parent, which waits for that lock,
/// always finds the child's turn): when the turn cannot be admitted, no child is left
/// behind, and the parent's call fails.
#[tokio::test]
async fn a_sub_agent_whose_turn_cannot_start_leaves_no_child() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let db = berth_e2e::harness::db(&stack.database_url).await;
    berth_e2e::harness::refuse_inserts(&db, "refuse_child", "turns", "NEW.prompt = 'refused child'").await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(Reply::tools(
        &[("d1", "delegate", json!({"prompt": "refused child"}))],
        9,
    ));
    mock.push(Reply::text(&["no sub-agent then"]));
    let events = turn(&mut c, &mut watch, &sid, "delegate").await;
    assert_eq!(events.last().unwrap()["state"], "completed", "{:?}", events.last());
    let ended = events.iter().find(|e| e["type"] == "tool.ended").unwrap();
    assert_eq!(ended["status"], "failed", "{ended}");
    assert!(children(&mut c, &sid).await.is_empty(), "a child without its turn");
    let orphans = db
        .query_one("SELECT count(*) FROM sessions WHERE parent_id = $1", &[&sid])
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(orphans, 0);
}

/// A delegate call is checked as a coordinator's child start is: a prompt past
/// `MAX_PROMPT_BYTES` is refused (`payload-too-large`), and one turn starts at most
/// `BERTH_COORDINATOR_MAX_CHILDREN` sub-agents (`child-limit`); a refused call is the
/// model's tool error and leaves no child.
#[tokio::test]
async fn delegate_calls_are_bounded_in_prompt_size_and_in_number() {
    let mock = MockProvider::start().await;
    let stack = Stack::start_with(&mock, 1, &[("BERTH_COORDINATOR_MAX_CHILDREN", "1")]).await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let huge = "p".repeat(berth_protocol::MAX_PROMPT_BYTES + 1);
    mock.push(Reply::tools(
        &[
            ("d1", "delegate", json!({"prompt": "first child"})),
            ("d2", "delegate", json!({"prompt": huge})),
            ("d3", "delegate", json!({"prompt": "second child"})),
        ],
        9,
    ));
    mock.push(Reply::text(&["first child done"]));
    mock.push(Reply::text(&["parent done"]));
    let events = turn(&mut c, &mut watch, &sid, "three sub-agents").await;
    assert_eq!(events.last().unwrap()["state"], "completed", "{:?}", events.last());
    let ended = |call: &str| {
        events
            .iter()
            .find(|e| e["type"] == "tool.ended" && e["callId"] == call)
            .unwrap_or_else(|| panic!("{call} ended"))
            .clone()
    };
    let first = ended("d1");
    assert_eq!(first["status"], "completed", "{first}");
    assert_eq!(first["rows"][0]["body"], "first child done");
    for (call, said) in [("d2", "payload-too-large"), ("d3", "sub-agent limit")] {
        let refused = ended(call);
        assert_eq!(refused["status"], "failed", "{refused}");
        assert!(refused["rows"][0]["body"].as_str().unwrap().contains(said), "{refused}");
    }
    assert_eq!(
        children(&mut c, &sid).await.len(),
        1,
        "only the first call started a child"
    );
    assert_eq!(mock.requests().len(), 3, "the parent's two steps and the one child's");
}

/// A session created while its workspace is being removed (after the removal listed the
/// workspace's sessions, before it locked the workspace) is removed like the others: its
/// running turn is stopped (the worker kills its command), not deleted unseen with the
/// workspace while the worker runs on.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_created_during_its_workspaces_removal_has_its_turn_stopped() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut a = stack.client(0).await;
    let mut b = stack.client(0).await;
    let first = auto_session(&stack, &mut a).await;
    // The first session's removal is held: the workspace's removal waits there.
    let lock = berth_e2e::harness::db(&stack.database_url).await;
    lock.batch_execute("BEGIN").await.unwrap();
    lock.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", &[&first])
        .await
        .unwrap();
    let remove = b.ok("workspace.remove", json!({"workspaceId": stack.workspace_id}));
    let meanwhile = async {
        assert!(
            berth_e2e::harness::statements_wait_on_locks(&stack.database_url, 1)
                .await
                .is_some(),
            "the removal waits for the first session"
        );
        let late = auto_session(&stack, &mut a).await;
        mock.push(Reply::tools(
            &[("s1", "shell", json!({"command": "echo $$ > late.pid; sleep 600"}))],
            9,
        ));
        a.ok("session.send", json!({"sessionId": late, "prompt": "run"})).await;
        let pgid = berth_e2e::harness::pid_written(&stack.workspace_dir.join("late.pid"))
            .await
            .expect("the late session's command runs");
        lock.batch_execute("ROLLBACK").await.unwrap();
        pgid
    };
    let (removed, pgid) = tokio::join!(remove, meanwhile);
    assert_eq!(removed, json!({"removed": true}));
    let stopped = berth_e2e::harness::eventually(30, || async { group_members(pgid).is_empty().then_some(()) }).await;
    assert!(stopped.is_some(), "the late session's command still runs");
}

#[tokio::test]
async fn a_shell_command_sees_none_of_berths_secrets() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    stack.kill_worker().await;
    let token = stack.worker_token.clone();
    stack
        .start_worker_with_env(
            0,
            &[],
            &[
                ("BERTH_WORKER_TOKEN", &token),
                ("DATABASE_URL", "postgres://berth:hunter2@db/berth"),
                ("PGPASSWORD", "hunter2"),
                ("HARMLESS_SETTING", "kept"),
            ],
        )
        .await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(Reply::tools(&[("c1", "shell", json!({"command": "env"}))], 8));
    mock.push(Reply::text(&["ok"]));
    let events = turn(&mut c, &mut watch, &sid, "show the environment").await;
    assert_eq!(events.last().unwrap()["state"], "completed");
    let out = events.iter().find(|e| e["type"] == "tool.ended").unwrap()["rows"][0]["body"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(out.contains("HARMLESS_SETTING=kept"), "{out}");
    for secret in [token.as_str(), "hunter2", "BERTH_", "DATABASE_URL"] {
        assert!(!out.contains(secret), "{secret} reached the command");
    }
}

/// A worker serving a home directory keeps Berth's own credentials and settings there out of
/// reach: `berth login`'s credential and a data directory's files are neither read, found,
/// searched nor listed by the agent's tools (which ask no approval), nor read by a client's
/// `files.read`; the rest of the workspace is as before.
#[tokio::test]
async fn berths_own_secrets_in_a_served_home_directory_are_out_of_the_tools_reach() {
    use base64::Engine as _;
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    stack.kill_worker().await;
    let home = stack.workspace_dir.clone();
    let write = |rel: &str, text: &str| {
        let path = home.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(".config/berth/credentials.json", "{\"token\":\"berth_SECRET-CRED\"}");
    write(".local/share/berth/dev/proj-1/run/jwt-secret", "SECRET-JWT");
    write("notes.txt", "SECRET-free notes\n");
    write("sub/x.txt", "x\n");
    let (config, data) = (home.join(".config"), home.join(".local/share"));
    stack
        .start_worker_with_env(
            0,
            &[],
            &[
                ("HOME", home.to_str().unwrap()),
                ("XDG_CONFIG_HOME", config.to_str().unwrap()),
                ("XDG_DATA_HOME", data.to_str().unwrap()),
            ],
        )
        .await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(Reply::tools(
        &[
            ("r1", "read_file", json!({"path": ".config/berth/credentials.json"})),
            (
                "r2",
                "read_file",
                json!({"path": ".local/share/berth/dev/proj-1/run/jwt-secret"}),
            ),
            ("s1", "search_files", json!({"pattern": "SECRET-"})),
            ("g1", "glob", json!({"pattern": "**/*secret*"})),
            ("l1", "list_directory", json!({"path": ".local", "depth": 6})),
            ("l2", "list_directory", json!({"path": ".config/berth"})),
            ("l3", "list_directory", json!({"path": "sub/..", "depth": 4})),
        ],
        8,
    ));
    mock.push(Reply::text(&["ok"]));
    let events = turn(&mut c, &mut watch, &sid, "look around").await;
    assert_eq!(events.last().unwrap()["state"], "completed");
    let r = results(&mock, 1);
    for id in ["r1", "r2", "l2"] {
        assert!(
            r[id].contains("holds Berth's own credentials or settings"),
            "{id}: {}",
            r[id]
        );
    }
    assert_eq!(r["s1"], "notes.txt:1:SECRET-free notes\n");
    assert!(r["g1"].starts_with("no files match"), "{}", r["g1"]);
    assert!(!r["l1"].contains("berth"), "{}", r["l1"]);
    assert!(
        r["l3"].contains("notes.txt") && !r["l3"].contains("credentials"),
        "{}",
        r["l3"]
    );
    for (id, out) in &r {
        assert!(
            !out.contains("SECRET-CRED") && !out.contains("SECRET-JWT"),
            "{id}: {out}"
        );
    }
    let read = c.subscribe(
        "files.read",
        json!({"sessionId": sid, "path": {"bytesBase64": base64::engine::general_purpose::STANDARD.encode(".config/berth/credentials.json")}}),
    );
    let done = read.done.await.unwrap();
    assert!(done.error.is_some(), "{:?}", done.result);
}

#[tokio::test]
async fn a_row_larger_than_a_history_page_reaches_a_later_turn_whole() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    // Past the shell's 1 MiB output cap, so the stored result is just over a history page.
    let command = "head -c 1100000 /dev/zero | tr '\\0' b; echo";
    mock.push(Reply::tools(&[("c1", "shell", json!({"command": command}))], 16));
    mock.push(Reply::text(&["Big."]));
    let events = turn(&mut c, &mut watch, &sid, "Print more than a page").await;
    assert_eq!(events.last().unwrap()["state"], "completed");
    let stored = events.iter().find(|e| e["type"] == "tool.ended").unwrap()["rows"][0]["body"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(stored.len() > 1 << 20, "{}", stored.len());
    assert!(
        stored.contains("bytes of output left out here; 1100001 bytes in all") && stored.ends_with("b\n[exit code 0]"),
        "{}",
        &stored[stored.len() - 80..]
    );

    // The next turn reads history in pages: the cut row is read on to its end, so the
    // model sees the real tail (and the same view as in the turn that ran the command).
    mock.push(Reply::text(&["Again."]));
    let events = turn(&mut c, &mut watch, &sid, "And?").await;
    assert_eq!(events.last().unwrap()["state"], "completed");
    let in_turn = messages(&mock, 1)[3].clone();
    let later = messages(&mock, 2)[3].clone();
    assert_eq!(later["tool_call_id"], "c1");
    assert!(
        later == in_turn,
        "a later turn sees the result as the turn that ran it did"
    );
    assert!(later["content"].as_str().unwrap().ends_with("[exit code 0]"));
}

/// Issue 47: a command the model runs cannot read the worker's secrets through the
/// worker's own process: its `/proc/$PPID/environ` (the environment the worker was started
/// with) holds neither the worker token given as `BERTH_WORKER_TOKEN` nor any other Berth
/// secret, and what Berth reads there still works (the worker is online and runs the turn).
#[tokio::test(flavor = "multi_thread")]
async fn a_command_cannot_read_the_workers_secrets_from_its_process() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    stack.kill_worker().await;
    let token = stack.worker_token.clone();
    let env = [
        ("BERTH_WORKER_TOKEN", token.as_str()),
        ("BERTH_MODEL_API_KEY", "sk-worker-env-secret"),
    ];
    stack.start_worker_with_env(0, &[], &env).await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let read = "tr '\\0' '\\n' < /proc/$PPID/environ; echo; env";
    mock.push(Reply::tools(&[("c1", "shell", json!({"command": read}))], 9));
    mock.push(Reply::text(&["read it"]));
    let events = turn(&mut c, &mut watch, &sid, "Read your parent's environment").await;
    assert_eq!(events.last().unwrap()["state"], "completed", "{:?}", events.last());
    // What the model was given back: the command's output.
    let m = messages(&mock, 1);
    let output = m.last().unwrap()["content"].as_str().unwrap().to_string();
    // Read (as root, whom non-dumpable does not stop) or refused (anyone else); either way
    // without the secrets, which left the environment when the worker started.
    assert!(
        output.contains("BERTH_SEALED_ENV=1") || output.contains("Permission denied"),
        "the command tried its parent's environment: {output}"
    );
    assert!(!output.contains(&token), "the worker token leaked: {output}");
    assert!(!output.contains("sk-worker-env-secret"), "a key leaked: {output}");
}

/// The tool results of provider request `i`, by call id.
fn results(mock: &MockProvider, i: usize) -> std::collections::HashMap<String, String> {
    messages(mock, i)
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_string(),
                m["content"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Issue 48: what the model is given by each tool, as the next request carries it — numbered
/// reads that say where to go on (a minified one-line file included), edits that show what
/// changed or the nearest text, a multi-file patch, a shell that keeps a long output's end
/// and runs bash in a workdir, glob, a tree, a search of hidden files and of one file,
/// stale-file warnings, nested AGENTS.md, unknown arguments refused — and a system prompt
/// that tells the model where it is.
#[tokio::test(flavor = "multi_thread")]
async fn the_tools_give_the_model_what_it_needs() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let dir = stack.workspace_dir.clone();
    let big: String = (1..=5000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(dir.join("big.txt"), &big).unwrap();
    std::fs::write(dir.join("min.js"), "x".repeat(100_000)).unwrap();
    std::fs::write(dir.join("a.py"), "def f():\n    return 1\n\ndef g():\n    return 1\n").unwrap();
    std::fs::write(dir.join("AGENTS.md"), "ROOT-RULE: run the tests before you finish.\n").unwrap();
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/AGENTS.md"), "NESTED-RULE: no tabs here.\n").unwrap();
    std::fs::write(dir.join("sub/x.txt"), "inside sub\n").unwrap();
    std::fs::create_dir_all(dir.join(".github/workflows")).unwrap();
    std::fs::write(
        dir.join(".github/workflows/ci.yml"),
        "run: cargo test # HIDDEN-NEEDLE\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("src/deep")).unwrap();
    std::fs::write(dir.join("src/deep/m.rs"), "fn m() {}\n").unwrap();
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let patch = "*** Begin Patch\n*** Add File: notes/new.md\n+# New\n*** Update File: a.py\n@@ def g():\n-    return 1\n+    return 2\n*** End Patch\n";
    let long = "echo FIRST; for i in $(seq 1 20000); do echo line $i; done; echo 'test result: SUMMARY'";
    mock.push(Reply::tools(
        &[
            ("r1", "read_file", json!({"path": "big.txt"})),
            ("r2", "read_file", json!({"path": "min.js"})),
            ("r3", "read_file", json!({"path": "min.js", "offset": 2})),
            ("r4", "read_file", json!({"path": "sub/x.txt"})),
            (
                "e1",
                "edit_file",
                json!({"path": "a.py", "old_string": "def f():\n    return  1", "new_string": "x"}),
            ),
            (
                "e2",
                "edit_file",
                json!({"path": "a.py", "old_string": "same", "new_string": "same"}),
            ),
            (
                "e3",
                "edit_file",
                json!({"path": "a.py", "old_string": "return 1", "new_string": "return 0", "replaceAll": true}),
            ),
            ("p1", "apply_patch", json!({"input": patch})),
            ("s1", "shell", json!({"command": long})),
            (
                "s2",
                "shell",
                json!({"command": "[[ -d deep ]] && echo in-{a,b}", "workdir": "src"}),
            ),
            ("g1", "glob", json!({"pattern": "**/*.rs"})),
            ("l1", "list_directory", json!({"path": "src", "depth": 3})),
            ("f1", "search_files", json!({"pattern": "HIDDEN-NEEDLE"})),
            ("f2", "search_files", json!({"pattern": "return", "path": "a.py"})),
        ],
        64,
    ));
    // Then: a read, a change behind the model's back, an edit of every occurrence.
    mock.push(Reply::tools(
        &[
            ("r5", "read_file", json!({"path": "a.py"})),
            ("s3", "shell", json!({"command": "echo '# touched' >> a.py"})),
            (
                "e4",
                "edit_file",
                json!({"path": "a.py", "old_string": "return", "new_string": "yield", "replace_all": true}),
            ),
        ],
        64,
    ));
    mock.push(Reply::text(&["done"]));
    let events = turn(&mut c, &mut watch, &sid, "Work on the files").await;
    assert_eq!(events.last().unwrap()["state"], "completed", "{:?}", events.last());

    // The system prompt: where, what, when, git, how, and the workspace's AGENTS.md.
    let system = messages(&mock, 0)[0]["content"].as_str().unwrap().to_string();
    for part in [
        "Working directory: ",
        "OS: linux",
        "shell: ",
        "Today: ",
        "Git: ",
        "<tool_guidance>",
        "ROOT-RULE",
    ] {
        assert!(
            system.contains(part),
            "{part} missing from the system prompt:\n{system}"
        );
    }
    assert!(
        !system.contains("NESTED-RULE"),
        "nested AGENTS.md files come with the files under them"
    );
    let offered = offered(&mock, 0);
    for tool in ["apply_patch", "glob", "edit_file", "shell"] {
        assert!(offered.contains(&tool.to_string()), "{offered:?}");
    }

    let r = results(&mock, 1);
    let read = &r["r1"];
    assert!(read.starts_with("     1\tline 1\n     2\tline 2\n"), "{}", &read[..60]);
    assert!(
        read.contains("more follow: read on with offset="),
        "{}",
        &read[read.len() - 200..]
    );
    assert!(
        read.len() <= 32 << 10 && !read.contains("left out"),
        "a read fits what the model is shown"
    );
    let next: usize = read
        .rsplit("offset=")
        .next()
        .unwrap()
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .unwrap();
    assert!(
        read.contains(&format!("{}\tline {}\n", next - 1, next - 1)),
        "continues right after the last line shown"
    );
    assert!(
        r["r2"].starts_with("     1\txxxx") && r["r2"].contains("[… line cut: 100000 bytes in all]"),
        "{}",
        &r["r2"][r["r2"].len() - 100..]
    );
    assert!(r["r3"].contains("offset 2 is past the end"), "{}", r["r3"]);
    assert!(
        r["r4"].contains("inside sub") && r["r4"].contains("NESTED-RULE"),
        "{}",
        r["r4"]
    );
    assert!(
        r["e1"].contains("not found") && r["e1"].contains("apart from whitespace") && r["e1"].contains("at line 1"),
        "{}",
        r["e1"]
    );
    assert!(r["e2"].contains("the same"), "{}", r["e2"]);
    assert!(
        r["e3"].contains("invalid arguments") && r["e3"].contains("replaceAll"),
        "{}",
        r["e3"]
    );
    assert!(
        r["p1"].starts_with("Success.") && r["p1"].contains("A notes/new.md") && r["p1"].contains("M a.py"),
        "{}",
        r["p1"]
    );
    let s1 = &r["s1"];
    assert!(
        s1.starts_with("FIRST\n") && s1.ends_with("test result: SUMMARY\n[exit code 0]"),
        "{}",
        &s1[s1.len() - 200..]
    );
    assert_eq!(s1.matches("left out").count(), 1, "one truncation note");
    assert!(s1.len() < (32 << 10) + 200);
    assert_eq!(r["s2"], "in-a in-b\n[exit code 0]");
    assert_eq!(r["g1"], "src/deep/m.rs\n");
    assert!(r["l1"].starts_with("deep/\n  m.rs\t"), "{}", r["l1"]);
    assert_eq!(r["f1"], ".github/workflows/ci.yml:1:run: cargo test # HIDDEN-NEEDLE\n");
    assert_eq!(r["f2"], "a.py:2:    return 1\na.py:5:    return 2\n");

    let r = results(&mock, 2);
    assert!(r["r5"].starts_with("     1\tdef f():\n"), "{}", r["r5"]);
    let e4 = &r["e4"];
    assert!(e4.contains("changed on disk since you last read it"), "{e4}");
    assert!(e4.contains("2 replacements") && e4.contains("\tdef f():"), "{e4}");
    assert_eq!(
        std::fs::read_to_string(dir.join("a.py")).unwrap(),
        "def f():\n    yield 1\n\ndef g():\n    yield 2\n# touched\n"
    );
    assert_eq!(std::fs::read_to_string(dir.join("notes/new.md")).unwrap(), "# New\n");
}

/// Issue 48: a call denied because nobody was there to ask says so, not "the user denied".
#[tokio::test]
async fn a_call_nobody_could_approve_says_so() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    mock.push(Reply::tools(&[("s1", "shell", json!({"command": "echo hi"}))], 9));
    mock.push(Reply::text(&["ok"]));
    // Nobody watches: the fallback answers at once.
    c.ok("session.send", json!({"sessionId": sid, "prompt": "Run it"}))
        .await;
    berth_e2e::harness::eventually(30, || async { (mock.requests().len() == 2).then_some(()) })
        .await
        .expect("the model is asked again");
    let r = results(&mock, 1);
    assert!(r["s1"].contains("Nobody was watching this session"), "{}", r["s1"]);
    assert!(!r["s1"].contains("The user denied"), "{}", r["s1"]);
}

/// Issue 48: the model's plan is a typed event clients draw (`plan.updated`, whole each
/// time), and the model reads back what it set; a plan with two steps in progress is an
/// error it reads, and records nothing.
#[tokio::test]
async fn the_plan_is_a_typed_event_and_the_model_reads_it_back() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = auto_session(&stack, &mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let plan = json!({"explanation": "Small fix", "plan": [
        {"step": "Reproduce", "status": "completed"},
        {"step": "Fix the parser", "status": "in_progress"},
        {"step": "Run the tests", "status": "pending"},
    ]});
    let bad = json!({"plan": [
        {"step": "One", "status": "in_progress"},
        {"step": "Two", "status": "in_progress"},
    ]});
    mock.push(Reply::tools(
        &[("p1", "update_plan", plan), ("p2", "update_plan", bad)],
        16,
    ));
    mock.push(Reply::text(&["planned"]));
    let events = turn(&mut c, &mut watch, &sid, "Plan the fix").await;
    assert_eq!(events.last().unwrap()["state"], "completed");
    assert!(offered(&mock, 0).contains(&"update_plan".to_string()));
    let plans: Vec<&Value> = events.iter().filter(|e| e["type"] == "plan.updated").collect();
    assert_eq!(plans.len(), 1, "the refused plan recorded nothing");
    assert_eq!(
        plans[0]["plan"],
        json!([
            {"step": "Reproduce", "status": "completed"},
            {"step": "Fix the parser", "status": "inProgress"},
            {"step": "Run the tests", "status": "pending"},
        ])
    );
    assert_eq!(plans[0]["explanation"], "Small fix");
    let r = results(&mock, 1);
    assert_eq!(r["p1"], "Plan updated: 3 steps, 1 completed, 1 in progress, 1 pending.");
    assert!(r["p2"].contains("at most one step can be in_progress"), "{}", r["p2"]);
}

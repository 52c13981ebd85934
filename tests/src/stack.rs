//! A whole Berth for one test: API replicas on one fresh database, optionally a worker,
//! and authenticated clients.

use std::path::PathBuf;

use serde_json::json;

use crate::{
    Client, MockProvider, TestServer, TestWorker, fresh_database,
    harness::{eventually, scratch_dir},
};

pub struct Stack {
    /// API replicas (`berth serve` processes) sharing one database.
    pub servers: Vec<TestServer>,
    pub worker: Option<TestWorker>,
    /// The bootstrap admin credential.
    pub token: String,
    /// A worker credential of the default tenant.
    pub worker_token: String,
    /// The worker's workspace directory.
    pub workspace_dir: PathBuf,
    /// The workspace's id (registered by the first worker start).
    pub workspace_id: String,
    pub database_url: String,
}

impl Stack {
    /// A member of the default tenant, and a client on replica 0 signed in with their own
    /// credential (made by `admin`).
    pub async fn member(&self, admin: &mut Client, email: &str) -> Client {
        let user = admin.ok("admin.user.create", json!({"email": email})).await;
        let cred = admin
            .ok(
                "admin.credential.create",
                json!({"userId": user["userId"], "note": email}),
            )
            .await;
        Client::authed(&self.servers[0].ws_url(), cred["token"].as_str().unwrap())
            .await
            .unwrap()
    }

    /// `replicas` API replicas and a worker (on replica 0) whose workspace is online.
    pub async fn start(mock: &MockProvider, replicas: usize) -> Stack {
        Self::start_with(mock, replicas, &[]).await
    }

    /// The same, with extra environment for every replica.
    pub async fn start_with(mock: &MockProvider, replicas: usize, env: &[(&str, &str)]) -> Stack {
        Self::start_with_model(&mock.base_url(), replicas, env).await
    }

    /// The same, with the model provider at `model_base_url` (e.g. one that refuses).
    pub async fn start_with_model(model_base_url: &str, replicas: usize, env: &[(&str, &str)]) -> Stack {
        Self::start_on(fresh_database().await, model_base_url, replicas, env).await
    }

    /// The same, on the database at `db` (e.g. on a cluster the test restarts).
    pub async fn start_on(db: String, model_base_url: &str, replicas: usize, env: &[(&str, &str)]) -> Stack {
        let mut servers = Vec::new();
        for _ in 0..replicas.max(1) {
            servers.push(TestServer::start_with(&db, model_base_url, env).await.expect("server"));
        }
        let token = servers[0].admin_token();
        let worker_token = servers[0].worker_token().await;
        let workspace_dir = scratch_dir("workspace");
        let mut stack = Stack {
            servers,
            worker: None,
            token,
            worker_token,
            workspace_dir,
            workspace_id: String::new(),
            database_url: db,
        };
        stack.start_worker(0).await;
        stack
    }

    /// (Re)start the worker against replica `replica` and wait until its workspace is online.
    pub async fn start_worker(&mut self, replica: usize) {
        self.start_worker_with_args(replica, &[]).await;
    }

    /// The same, with extra `berth worker` arguments.
    pub async fn start_worker_with_args(&mut self, replica: usize, extra: &[&str]) {
        self.start_worker_with_env(replica, extra, &[]).await;
    }

    /// The same, with extra environment for the worker process.
    pub async fn start_worker_with_env(&mut self, replica: usize, extra: &[&str], env: &[(&str, &str)]) {
        let worker = TestWorker::start_with_env(
            &self.servers[replica],
            &self.worker_token,
            "proj",
            &self.workspace_dir,
            extra,
            env,
        )
        .await
        .expect("worker");
        self.worker = Some(worker);
        let id = self.wait_online(true).await;
        self.workspace_id = id;
    }

    /// (Re)start the worker against `addr` (e.g. nginx in front of the replicas) and wait
    /// until its workspace is online.
    pub async fn start_worker_at(&mut self, addr: &str) {
        let worker = TestWorker::start_at(
            addr,
            &self.worker_token,
            "test-host",
            "proj",
            &self.workspace_dir,
            &[],
            &[],
        )
        .await
        .expect("worker");
        self.worker = Some(worker);
        self.workspace_id = self.wait_online(true).await;
    }

    /// Another worker, on machine `host` with a credential of its own, serving workspace
    /// `name` in a new directory, connected to replica `replica`; returns it once the
    /// workspace is online, with the workspace's id and directory.
    pub async fn start_other_worker(&self, replica: usize, host: &str, name: &str) -> (TestWorker, String, PathBuf) {
        let token = self.servers[0].worker_token().await;
        let dir = scratch_dir(name);
        let worker = TestWorker::start_on_host(&self.servers[replica], &token, host, name, &dir, &[], &[])
            .await
            .expect("worker");
        let id = self.wait_workspace(name, true).await;
        (worker, id, dir)
    }

    /// Wait (up to 30 s) until the workspace titled `title` shows `online`; returns its id.
    pub async fn wait_workspace(&self, title: &str, online: bool) -> String {
        let (url, token) = (self.servers[0].ws_url(), self.token.clone());
        eventually(30, || {
            let (url, token) = (url.clone(), token.clone());
            async move {
                let mut c = Client::authed(&url, &token).await.ok()?;
                let list = c.ok("workspace.list", json!({})).await;
                let w = list
                    .as_array()?
                    .iter()
                    .find(|w| w["title"] == title && w["online"] == online)?
                    .clone();
                Some(w["workspaceId"].as_str()?.to_string())
            }
        })
        .await
        .unwrap_or_else(|| panic!("workspace {title} never became online={online}"))
    }

    /// Kill the worker process and wait until its workspace shows offline.
    pub async fn kill_worker(&mut self) {
        if let Some(mut w) = self.worker.take() {
            w.child.kill().await.ok();
            w.child.wait().await.ok();
        }
        self.wait_online(false).await;
    }

    /// Wait (up to 30 s) until the workspace shows `online`; returns its id.
    pub async fn wait_online(&self, online: bool) -> String {
        let (url, token) = (self.servers[0].ws_url(), self.token.clone());
        eventually(30, || {
            let (url, token) = (url.clone(), token.clone());
            async move {
                let mut c = Client::authed(&url, &token).await.ok()?;
                let list = c.ok("workspace.list", json!({})).await;
                let w = list.as_array()?.iter().find(|w| w["online"] == online)?.clone();
                let id = w["workspaceId"].as_str()?.to_string();
                // Online is the presence the hello records; the replica holding the
                // connection registers it just after. A call answered through it says it
                // has (a turn admitted before could only be claimed, not handed out).
                if online {
                    c.call("workspace.files", json!({"workspaceId": id})).await.ok()?;
                }
                Some(id)
            }
        })
        .await
        .unwrap_or_else(|| panic!("workspace never became online={online}"))
    }

    /// An authenticated client on replica `replica`.
    pub async fn client(&self, replica: usize) -> Client {
        Client::authed(&self.servers[replica].ws_url(), &self.token)
            .await
            .expect("client")
    }

    /// A new session in the workspace; returns its id.
    pub async fn session(&self, client: &mut Client) -> String {
        let s = client
            .ok("session.create", json!({"workspaceId": self.workspace_id}))
            .await;
        s["sessionId"].as_str().expect("sessionId").to_string()
    }

    /// Run SQL against the stack's database (for checks the API cannot make).
    pub async fn sql_i64(&self, sql: &str, session_id: &str) -> i64 {
        let client = crate::harness::db(&self.database_url).await;
        client.query_one(sql, &[&session_id]).await.expect("query").get(0)
    }
}

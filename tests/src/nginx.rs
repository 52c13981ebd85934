//! A real nginx in front of several API replicas (scale-out tests), configured like
//! `ops/nginx/berth.conf` minus TLS: WebSocket upgrade, no buffering, long timeouts.

use std::{path::PathBuf, process::Stdio};

use anyhow::{Context, bail};
use tokio::process::Command;

use crate::harness::{Proc, Stop, eventually, scratch_dir};

/// nginx stops gracefully on SIGQUIT: its workers finish (open WebSockets are closed after
/// `worker_shutdown_timeout`), then the master exits. Past the grace the whole process group
/// (master and workers) is killed.
const STOP: Stop = Stop {
    signal: libc::SIGQUIT,
    grace: std::time::Duration::from_secs(15),
    group: true,
};

pub struct Nginx {
    /// Stopped (gracefully) when the `Nginx` is dropped.
    _child: Proc,
    /// `127.0.0.1:PORT`
    pub addr: String,
    pub dir: PathBuf,
}

/// The nginx binary, if installed (`.ci/run` installs it).
pub fn nginx_bin() -> Option<PathBuf> {
    ["/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

impl Nginx {
    /// Start nginx balancing round-robin over `upstreams` (`host:port` each).
    pub async fn start(upstreams: &[&str]) -> anyhow::Result<Nginx> {
        let bin = nginx_bin().context("nginx is not installed (Debian: apt-get install nginx)")?;
        let dir = scratch_dir("nginx");
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let servers: String = upstreams.iter().map(|u| format!("        server {u};\n")).collect();
        let d = dir.display();
        let conf = format!(
            "worker_processes 1;
worker_shutdown_timeout 2s;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ''      '';
    }}
    upstream berth_api {{
{servers}    }}
    server {{
        listen 127.0.0.1:{port};
        proxy_http_version 1.1;
        proxy_set_header Upgrade $http_upgrade;
        proxy_set_header Connection $connection_upgrade;
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        location / {{
            proxy_pass http://berth_api;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf)?;
        let child = Command::new(bin)
            .arg("-c")
            .arg(&conf_path)
            .arg("-p")
            .arg(&dir)
            .args(["-g", "daemon off;"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.log"))?)
            // Master and workers in a group of their own, which a last-resort kill takes whole.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let child = Proc::new(child, STOP);
        let addr = format!("127.0.0.1:{port}");
        let up = eventually(20, || {
            let addr = addr.clone();
            async move { tokio::net::TcpStream::connect(&addr).await.ok().map(|_| ()) }
        })
        .await;
        if up.is_none() {
            bail!(
                "nginx did not start: {}",
                std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default()
            );
        }
        Ok(Nginx {
            _child: child,
            addr,
            dir,
        })
    }

    pub fn ws_url(&self) -> String {
        format!("ws://{}/v1/rpc", self.addr)
    }
}

//! A TCP forwarder in front of a replica that a test can cut: every connection through it
//! is closed at once (the server's side of the client's connection goes away), or the
//! server's answers are swallowed first (a response lost in flight).

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
};

pub struct CutProxy {
    pub addr: SocketAddr,
    cut: watch::Sender<u64>,
    swallow: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    /// Forward to `target` (`host:port`).
    pub async fn start(target: &str) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (cut, cut_rx) = watch::channel(0u64);
        let swallow = Arc::new(AtomicBool::new(false));
        let (target, sw) = (target.to_string(), swallow.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&target).await else {
                    continue;
                };
                let (mut cut_rx, sw) = (cut_rx.clone(), sw.clone());
                cut_rx.mark_unchanged();
                tokio::spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw_) = server.into_split();
                    let up = async {
                        let mut buf = vec![0u8; 16 << 10];
                        while let Ok(n) = cr.read(&mut buf).await {
                            if n == 0 || sw_.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    let down = async {
                        let mut buf = vec![0u8; 16 << 10];
                        while let Ok(n) = sr.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            if sw.load(Ordering::SeqCst) {
                                continue;
                            }
                            if cw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    tokio::select! {
                        _ = up => {}
                        _ = down => {}
                        _ = cut_rx.changed() => {}
                    }
                });
            }
        });
        CutProxy {
            addr,
            cut,
            swallow,
            task,
        }
    }

    /// `ws://` URL of the proxied replica's RPC endpoint.
    pub fn server(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Close every connection through the proxy now (new ones are forwarded again).
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
        self.swallow.store(false, Ordering::SeqCst);
    }

    /// From now until the next `cut`, drop everything the server sends.
    pub fn swallow_answers(&self) {
        self.swallow.store(true, Ordering::SeqCst);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

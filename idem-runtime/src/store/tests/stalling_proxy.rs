//! A TCP proxy in front of the test's PostgreSQL server that can stop passing bytes on while
//! its connections stay open: what a client sees of a database process that is stopped
//! (SIGSTOP, a paused container) while its host's kernel still answers TCP.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

pub struct StallingProxy {
    /// The database's URL, through the proxy.
    pub url: String,
    /// Whether a new connection starts stalled.
    stall_new: Arc<AtomicBool>,
    /// Each connection's own flag.
    connections: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
}

impl StallingProxy {
    /// A proxy to the server of `url` (`postgres://user@host:port/database`).
    pub async fn start(url: &str) -> Self {
        let (user, rest) = url.split_once('@').expect("a URL with a user");
        let (upstream, database) = rest.split_once('/').expect("a URL that names a database");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stall_new = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let upstream = upstream.to_owned();
        let (new, all) = (stall_new.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let flag = Arc::new(AtomicBool::new(new.load(Ordering::SeqCst)));
                all.lock().unwrap().push(flag.clone());
                let ((client_reads, client_writes), (server_reads, server_writes)) =
                    (client.into_split(), server.into_split());
                tokio::spawn(pass(client_reads, server_writes, flag.clone()));
                tokio::spawn(pass(server_reads, client_writes, flag));
            }
        });
        Self {
            url: format!("{user}@127.0.0.1:{port}/{database}"),
            stall_new,
            connections,
        }
    }

    /// Holds every byte from now on (the sender's writes still succeed), or passes them on.
    pub fn stall(&self, stalled: bool) {
        self.stall_new.store(stalled, Ordering::SeqCst);
        for flag in self.connections.lock().unwrap().iter() {
            flag.store(stalled, Ordering::SeqCst);
        }
    }

    /// Passes the bytes of connections opened from now on, while those open now stay as
    /// they are: a database that answers again, except on the sessions it left hanging.
    pub fn pass_new_connections(&self) {
        self.stall_new.store(false, Ordering::SeqCst);
    }
}

async fn pass(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, stalled: Arc<AtomicBool>) {
    let mut buffer = vec![0; 16 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buffer).await {
        while stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

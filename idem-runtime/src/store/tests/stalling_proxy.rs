//! A TCP proxy in front of the test's PostgreSQL server that can stop passing bytes on while
//! its connections stay open: what a client sees of a database process that is stopped
//! (SIGSTOP, a paused container) while its host's kernel still answers TCP.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

pub struct StallingProxy {
    /// The database's URL, through the proxy.
    pub url: String,
    links: Arc<Mutex<Links>>,
}

/// The proxy's connections, and whether a new one starts held.
#[derive(Default)]
struct Links {
    stall_new: bool,
    /// New connections are closed as they come (a server at `max_connections`).
    refuse_new: bool,
    all: Vec<Arc<Link>>,
    /// Cut the next link that sends `COMMIT`, once it has passed it on.
    cut_at_commit: Arc<AtomicBool>,
}

/// One proxied connection.
#[derive(Default)]
struct Link {
    stalled: AtomicBool,
    /// The server's answers are dropped and the client's socket closed.
    cut: AtomicBool,
    /// The client sent something while the link was held.
    asked_while_stalled: AtomicBool,
    /// Bytes the server has answered.
    answered: AtomicUsize,
}

impl StallingProxy {
    /// A proxy to the server of `url` (`postgres://user@host:port/database`).
    pub async fn start(url: &str) -> Self {
        let (user, rest) = url.split_once('@').expect("a URL with a user");
        let (upstream, database) = rest.split_once('/').expect("a URL that names a database");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let links = Arc::new(Mutex::new(Links::default()));
        let (upstream, accepted) = (upstream.to_owned(), links.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if accepted.lock().unwrap().refuse_new {
                    continue; // dropped: closed
                }
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let link = Arc::new(Link::default());
                {
                    // Under the lock that `stall` takes: a link is never left out of it.
                    let mut links = accepted.lock().unwrap();
                    link.stalled.store(links.stall_new, Ordering::SeqCst);
                    links.all.push(link.clone());
                }
                let cut_at_commit = accepted.lock().unwrap().cut_at_commit.clone();
                let ((client_reads, client_writes), (server_reads, server_writes)) =
                    (client.into_split(), server.into_split());
                tokio::spawn(pass(
                    client_reads,
                    server_writes,
                    link.clone(),
                    false,
                    cut_at_commit,
                ));
                tokio::spawn(pass(
                    server_reads,
                    client_writes,
                    link,
                    true,
                    Arc::default(),
                ));
            }
        });
        Self {
            url: format!("{user}@127.0.0.1:{port}/{database}"),
            links,
        }
    }

    /// Holds every byte from now on (the sender's writes still succeed), or passes them on.
    pub fn stall(&self, stalled: bool) {
        let mut links = self.links.lock().unwrap();
        links.stall_new = stalled;
        for link in &links.all {
            link.stalled.store(stalled, Ordering::SeqCst);
        }
    }

    /// The next `COMMIT` a client sends reaches the server, and its answer never comes
    /// back: the client's side of the link is closed as soon as it is passed on, whether
    /// the server has committed yet or not.
    pub fn cut_at_next_commit(&self) {
        self.links
            .lock()
            .unwrap()
            .cut_at_commit
            .store(true, Ordering::SeqCst);
    }

    /// Closes every connection opened from now on, while those open now still pass: a
    /// server whose every slot other clients hold.
    pub fn refuse_new_connections(&self) {
        self.links.lock().unwrap().refuse_new = true;
    }

    /// Passes the bytes of connections opened from now on, while those open now stay as
    /// they are: a database that answers again, except on the sessions it left hanging.
    pub fn pass_new_connections(&self) {
        self.links.lock().unwrap().stall_new = false;
    }

    /// Passes everything on again, and returns once the server has answered each connection
    /// that sent something while held: what those had sent has run.
    pub async fn resume_until_answered(&self) {
        let asked: Vec<(Arc<Link>, usize)> = {
            let links = self.links.lock().unwrap();
            let asked = links
                .all
                .iter()
                .filter(|link| link.asked_while_stalled.load(Ordering::SeqCst));
            asked
                .map(|link| (link.clone(), link.answered.load(Ordering::SeqCst)))
                .collect()
        };
        self.stall(false);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        for (link, before) in asked {
            while link.answered.load(Ordering::SeqCst) == before {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the server never answered what was held"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// Passes bytes from one side to the other while the link is not held; `answers`: from the
/// server, whose bytes are counted.
async fn pass(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    link: Arc<Link>,
    answers: bool,
    cut_at_commit: Arc<AtomicBool>,
) {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            () = cut(&link), if answers => return, // the answer is lost, the client's socket closed
        };
        let Ok(n @ 1..) = read else { return };
        if answers && link.cut.load(Ordering::SeqCst) {
            return; // an answer that came in first is lost all the same
        }
        const COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";
        if !answers
            && buffer[..n].windows(COMMIT.len()).any(|w| w == COMMIT)
            && cut_at_commit.swap(false, Ordering::SeqCst)
        {
            link.cut.store(true, Ordering::SeqCst);
            let _ = to.write_all(&buffer[..n]).await;
            // Keep the server's side open: its answer comes, and is dropped.
            std::future::pending::<()>().await;
        }
        if answers {
            link.answered.fetch_add(n, Ordering::SeqCst);
        } else if link.stalled.load(Ordering::SeqCst) {
            link.asked_while_stalled.store(true, Ordering::SeqCst);
        }
        while link.stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// Returns once `link` is cut.
async fn cut(link: &Link) {
    while !link.cut.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

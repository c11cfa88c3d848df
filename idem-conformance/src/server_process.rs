//! The example A2A server (`examples/a2a_server`) as a real child process on a temporary SQLite
//! file (or a database a test names, a PostgreSQL one say), for the tests: started on `127.0.0.1:0` with the flags a test chooses, its address read
//! from the one `listening on` line, stopped with SIGTERM when a test asks, killed with SIGKILL
//! on restart and on drop (also when a test panics).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A cold start on a loaded CI machine is slow, but not this slow.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
const LISTENING_PREFIX: &str = "listening on ";
const STDERR_KEPT: usize = 64 * 1024;

/// A TTL short enough for AC-3 to wait past it (the harness reads it from the AgentCard).
pub const SHORT_TTL: &[(&str, &str)] = &[("AIWG_IDEMPOTENCY_TTL", "2")];

pub struct ServerProcess {
    child: Child,
    /// `http://127.0.0.1:PORT` of the running process.
    pub url: String,
    launch: Launch,
    // Dropped after `child` is killed (see `Drop`), so the database outlives the process.
    _dir: tempfile::TempDir,
}

/// How to start (and restart) the process, and what it printed.
struct Launch {
    /// The `--db` argument: a file path or a database URL.
    db: String,
    /// A shell command run before the server, which `sh -c` then execs.
    setup: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// The tail of what the server wrote to stderr, for failure messages.
    stderr: Arc<Mutex<String>>,
    /// Every stdout line after the `listening on` one (the server should print none).
    more_stdout: Arc<Mutex<Vec<String>>>,
}

impl ServerProcess {
    /// Starts the example server on a fresh database with these extra environment variables.
    pub fn start(env: &[(&str, &str)]) -> Self {
        Self::start_with(&[], env)
    }

    /// Like [`start`](Self::start), with extra command-line flags (kept for restarts).
    pub fn start_with(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_on(None, args, env)
    }

    /// Like [`start_with`](Self::start_with), on the database `db` (`--db`) if one is given.
    pub fn start_on(db: Option<&str>, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::launch(db, None, args, env)
    }

    /// Like [`start_with`](Self::start_with), started by `sh -c` after the shell command
    /// `setup` (a `ulimit`, say), which each restart runs too.
    pub fn start_after(setup: &str, args: &[&str]) -> Self {
        Self::launch(None, Some(setup), args, &[])
    }

    fn launch(db: Option<&str>, setup: Option<&str>, args: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = dir.path().join("a2a.db");
        let launch = Launch {
            db: db.map_or_else(|| file.display().to_string(), str::to_owned),
            setup: setup.map(str::to_owned),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            stderr: Arc::default(),
            more_stdout: Arc::default(),
        };
        let (child, url) = launch.spawn();
        Self {
            child,
            url,
            launch,
            _dir: dir,
        }
    }

    /// The running process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The SQLite file (of a server started without a database URL).
    pub fn db(&self) -> &Path {
        Path::new(&self.launch.db)
    }

    /// The database, as the harness reads its side effects.
    pub fn side_effects_db(&self) -> crate::Db {
        crate::Db::parse(&self.launch.db)
    }

    /// The last lines the server (each process of it) wrote to stderr, for failure messages.
    pub fn stderr(&self) -> String {
        self.launch.stderr.lock().unwrap().clone()
    }

    /// SIGKILL (no graceful shutdown: the cache must survive a crash), then start again on the
    /// same database. The new process listens on a new port: returns its URL.
    pub fn restart(&mut self) -> String {
        self.kill();
        let (child, url) = self.launch.spawn();
        (self.child, self.url) = (child, url.clone());
        url
    }

    /// SIGTERM, the operator's stop, then waits for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        let kill = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(kill.expect("run kill").success());
        let deadline = std::time::Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no exit after SIGTERM:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the server printed on stdout after its `listening on` line.
    pub fn more_stdout(&self) -> Vec<String> {
        self.launch.more_stdout.lock().unwrap().clone()
    }

    /// How the process ended, if it has.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("wait")
    }

    /// SIGKILL: the process dies at once, mid-call if it is in one.
    pub fn kill(&mut self) {
        // `Child::kill` is SIGKILL on Unix; an already exited child is not an error here.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `<target>/debug/deps/integration-HASH` → `<target>/debug/examples/NAME`; cargo builds the
/// examples before it runs the integration tests.
pub fn example_binary(name: &str) -> PathBuf {
    let test_binary = std::env::current_exe().expect("the test binary's path");
    let profile_dir = test_binary
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in <target>/<profile>/deps");
    let binary = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.exists(),
        "{} is missing: `cargo test` builds it where no target is named (`cargo test \
         --workspace --profile ci`), or `cargo build --example {name}` in the test's profile",
        binary.display()
    );
    binary
}

impl Launch {
    fn spawn(&self) -> (Child, String) {
        let binary = example_binary("a2a_server");
        let mut command = match &self.setup {
            None => Command::new(binary),
            Some(setup) => {
                let mut shell = Command::new("sh");
                shell
                    .arg("-c")
                    .arg(format!("{setup} && exec \"$0\" \"$@\""));
                shell.arg(binary);
                shell
            }
        };
        let mut child = command
            .args(["--listen", "127.0.0.1:0", "--db"])
            .arg(&self.db)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the example server");
        let stderr = &self.stderr;
        let stderr_done = drain(child.stderr.take().expect("piped stderr"), stderr.clone());
        let stdout = child.stdout.take().expect("piped stdout");
        let listening = read_listening_line(stdout, self.more_stdout.clone());
        match listening.recv_timeout(STARTUP_TIMEOUT) {
            Ok(url) => (child, url),
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().ok();
                let _ = stderr_done.join(); // the pipe closed with the process: all of it is read
                panic!(
                "the example server did not print `{LISTENING_PREFIX}http://…` within {STARTUP_TIMEOUT:?} \
                 (exit status {status:?}); its stderr:\n{}",
                stderr.lock().unwrap()
            );
            }
        }
    }
}

/// Sends the URL of the `listening on` line, then keeps reading (a closed pipe would make the
/// server's next `println!` fail) and keeps any further line in `more`.
fn read_listening_line(
    stdout: impl Read + Send + 'static,
    more: Arc<Mutex<Vec<String>>>,
) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            match line.strip_prefix(LISTENING_PREFIX) {
                Some(url) => drop(tx.send(url.trim().to_owned())),
                None => more.lock().unwrap().push(line),
            }
        }
    });
    rx
}

/// Collects stderr in the background so that a failing start can show it; keeps the last
/// `STDERR_KEPT` bytes so that a chatty server cannot grow it without bound.
fn drain(stderr: impl Read + Send + 'static, into: Arc<Mutex<String>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut all = into.lock().unwrap();
            all.push_str(&line);
            all.push('\n');
            if all.len() > 2 * STDERR_KEPT {
                let mut cut = all.len() - STDERR_KEPT;
                while !all.is_char_boundary(cut) {
                    cut += 1;
                }
                all.drain(..cut);
            }
        }
    })
}

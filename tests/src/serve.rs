//! A real `tollgate serve` process on the embedded store, on a free loopback port, for
//! tests that need the product as it runs (its signal handling, its configuration from
//! the environment). It runs the workspace's `target/debug/tollgate` (`cargo build -p
//! tollgate` first; `make test` does) and is killed when dropped.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use crate::TEST_SECRET;

/// The `tollgate` binary the workspace built.
pub fn tollgate_bin() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let bin = target.join("debug").join("tollgate");
    assert!(
        bin.is_file(),
        "{} is missing: build it first (`cargo build -p tollgate`)",
        bin.display()
    );
    bin
}

/// One `tollgate serve` (embedded store) signing with [`TEST_SECRET`].
pub struct ServeProcess {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its stdout lines so far, and the rest as they come.
    seen: Vec<String>,
    lines: Mutex<mpsc::Receiver<String>>,
}

/// How to start one process ([`ServeProcess::start_with`]); `Default` is the embedded
/// store, signing with nothing set (it makes a secret up), logging at `info`, echoed.
#[derive(Debug, Clone, Default)]
pub struct Start<'a> {
    /// Arguments after `serve --port 0 --host 127.0.0.1` (`--backend aws`, …).
    pub args: Vec<&'a str>,
    /// Variables set for it.
    pub env: Vec<(&'a str, String)>,
    /// Variables taken out of what it inherits (besides the usual ones).
    pub remove: Vec<&'a str>,
    /// `TOLLGATE_SECRET`; `None`: unset.
    pub secret: Option<&'a str>,
    /// `RUST_LOG` (default `info`).
    pub log: Option<&'a str>,
    /// Echo its output to this test's stderr, each line after this label (`None`:
    /// drained, not shown).
    pub echo: Option<String>,
    /// How long to wait for its URL (default 60 s).
    pub wait: Option<Duration>,
}

impl ServeProcess {
    /// Starts it with `env` added and waits (at most 60 s) for the URL it prints.
    pub fn start(env: &[(&str, &str)]) -> Self {
        Self::start_signing(Some(TEST_SECRET), env)
    }

    /// Starts it signing with `secret`, or with `None` without `TOLLGATE_SECRET` (it
    /// makes one up).
    pub fn start_signing(secret: Option<&str>, env: &[(&str, &str)]) -> Self {
        Self::start_with(Start {
            secret,
            env: env.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
            echo: Some("[serve]".into()),
            ..Start::default()
        })
    }

    /// Starts it as `how` says and waits for the URL it prints.
    pub fn start_with(how: Start<'_>) -> Self {
        let mut cmd = Command::new(tollgate_bin());
        cmd.args(["serve", "--port", "0", "--host", "127.0.0.1"])
            .args(&how.args)
            .env_remove("TOLLGATE_SECRET")
            .env_remove("TOLLGATE_MAX_TOKEN_LIFETIME_SECONDS")
            .env("RUST_LOG", how.log.unwrap_or("info"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for var in [
            "TOLLGATE_BACKEND",
            "TOLLGATE_PORT",
            "TOLLGATE_TIMER_QUEUE_URL",
            "TOLLGATE_CREATE_TABLES",
            "TOLLGATE_SSE_WINDOW_SECONDS",
            "TOLLGATE_ALLOW_LOOPBACK_ORIGINS",
        ]
        .iter()
        .chain(&how.remove)
        {
            cmd.env_remove(var);
        }
        if let Some(secret) = how.secret {
            cmd.env("TOLLGATE_SECRET", secret);
        }
        for (k, v) in &how.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("tollgate serve starts");
        let (tx, rx) = mpsc::channel::<String>();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        // Drain both pipes for the life of the process (a full pipe would block it).
        let echo = how.echo.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(label) = &echo {
                    eprintln!("{label} {line}");
                }
                let _ = tx.send(line);
            }
        });
        let echo = how.echo.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(label) = &echo {
                    eprintln!("{label} stderr: {line}");
                }
            }
        });
        let deadline = Instant::now() + how.wait.unwrap_or(Duration::from_secs(60));
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    seen.push(line.clone());
                    if let Some(url) = line.strip_prefix("export TOLLGATE_URL=") {
                        return Self {
                            child,
                            base: url.trim().to_owned(),
                            seen,
                            lines: Mutex::new(rx),
                        };
                    }
                }
                Err(e) => {
                    let _ = child.kill();
                    let status = child.wait();
                    panic!("tollgate serve printed no URL ({e}; {status:?}); it printed {seen:#?}");
                }
            }
        }
    }

    /// What it printed up to its URL.
    pub fn seen(&self) -> &[String] {
        &self.seen
    }

    /// The SQS timer queue its banner names (`… SQS queue <url>, consumed …`), if any.
    pub fn queue_url(&self) -> Option<String> {
        self.seen.iter().find_map(|line| {
            let rest = line.split_once("SQS queue ")?.1;
            rest.split(", consumed").next().map(str::to_owned)
        })
    }

    /// Kills it with SIGKILL (whatever it was doing) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Everything it printed up to the blank line that ends its start-up banner (the
    /// line after the URL's block), waiting at most 10 s for the rest.
    /// The process id (to read its resident memory, say).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn banner(&mut self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.seen.last().is_none_or(|l| !l.is_empty()) {
            let left = deadline.saturating_duration_since(Instant::now());
            let next = self.lines.lock().unwrap().recv_timeout(left);
            match next {
                Ok(line) => self.seen.push(line),
                Err(e) => panic!("the banner did not end: {e}; so far {:#?}", self.seen),
            }
        }
        self.seen.clone()
    }

    /// Sends SIGTERM (a process manager's stop).
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -TERM {}", self.child.id());
    }

    /// Waits up to `bound` for the process to exit; its exit status, or `None`.
    pub fn wait_exit(&mut self, bound: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + bound;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

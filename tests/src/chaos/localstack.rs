//! A LocalStack of its own (SQS only), so that it can be killed with SIGKILL in the
//! middle of a workload and started again on the same port: its queues are gone (it keeps
//! nothing), so the timer queue is created again under the same name, and so the same
//! URL. Timer messages in it are lost, as a real outage would lose none but a restart of
//! an emulator does: the sweepers expire the cards and settle the attempts whose timers
//! were lost. The LocalStack is the one `tests/harness/emulators.sh install` put in the
//! cache directory, started as that script starts it (host mode, every directory inside
//! the cache dir).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct LocalStack {
    cache: PathBuf,
    fs: PathBuf,
    pub port: u16,
    child: Option<Child>,
    /// How many times it was killed and restarted.
    pub crashes: u64,
}

/// The cache dir's LocalStack interpreter, if installed.
pub fn installed(cache: &Path) -> bool {
    cache
        .join("localstack")
        .join("bin")
        .join("python")
        .is_file()
}

impl LocalStack {
    /// Starts it on a free port with its file system under `fs` (created), and waits (at
    /// most 120 s) until SQS answers.
    pub async fn start(cache: &Path, fs: &Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut me = Self {
            cache: cache.to_owned(),
            fs: fs.to_owned(),
            port,
            child: None,
            crashes: 0,
        };
        me.spawn().await;
        me
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let _ = std::fs::remove_dir_all(&self.fs);
        let lib = self.fs.join("var/lib/localstack");
        std::fs::create_dir_all(&lib).expect("LocalStack's file system");
        let shared = self.cache.join("localstack-cache");
        std::fs::create_dir_all(shared.join("xdg")).expect("LocalStack's cache");
        let _ = std::os::unix::fs::symlink(&shared, lib.join("cache"));
        let listen = format!("127.0.0.1:{}", self.port);
        let mut cmd = Command::new(self.cache.join("localstack/bin/python"));
        cmd.args(["-m", "localstack.runtime.main"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env(
                "HOME",
                std::env::var_os("HOME").unwrap_or(self.cache.clone().into()),
            )
            .env("LANG", "C.UTF-8")
            .env("PYTHONUNBUFFERED", "1")
            .env("XDG_CACHE_HOME", shared.join("xdg"))
            .env("CONFIG_DIR", self.fs.join("config"))
            .env("OVERRIDE_IN_DOCKER", "0")
            .env("FILESYSTEM_ROOT", &self.fs)
            .env("GATEWAY_SERVER", "twisted")
            .env("GATEWAY_LISTEN", &listen)
            .env("LOCALSTACK_HOST", &listen)
            .env("SERVICES", "sqs")
            .env("EAGER_SERVICE_LOADING", "1")
            .env("SQS_ENDPOINT_STRATEGY", "path")
            .env("DNS_ADDRESS", "0")
            .env("DISABLE_EVENTS", "1")
            .env("SKIP_SSL_CERT_DOWNLOAD", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Its own process group, so that a kill reaches every process it starts.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        self.child = Some(cmd.spawn().expect("LocalStack starts"));
        let deadline = Instant::now() + Duration::from_secs(120);
        while !ready(self.port).await {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("LocalStack exited during startup: {status}");
            }
            assert!(Instant::now() < deadline, "LocalStack not ready in 120 s");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILL to its process group, then a start on the same port.
    pub async fn crash_and_restart(&mut self) {
        self.kill();
        self.crashes += 1;
        self.spawn().await;
    }
}

impl Drop for LocalStack {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.fs);
    }
}

async fn ready(port: u16) -> bool {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let health = http
        .get(format!("http://127.0.0.1:{port}/_localstack/health"))
        .send()
        .await;
    let Ok(health) = health else { return false };
    let text = health.text().await.unwrap_or_default();
    if !(text.contains("\"sqs\": \"available\"")
        || text.contains("\"sqs\": \"running\"")
        || text.contains("\"sqs\":\"available\"")
        || text.contains("\"sqs\":\"running\""))
    {
        return false;
    }
    http.post(format!("http://127.0.0.1:{port}/"))
        .header("x-amz-target", "AmazonSQS.ListQueues")
        .header("content-type", "application/x-amz-json-1.0")
        .header(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=test/20200101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0",
        )
        .body("{}")
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

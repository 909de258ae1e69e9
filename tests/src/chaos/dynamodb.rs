//! A DynamoDB Local of its own, on disk (`-dbPath`), so that it can be killed with
//! SIGKILL in the middle of a workload and restarted on the same database and port.
//! The jar is the one `tests/harness/emulators.sh install` put in the cache directory
//! (`$TOLLGATE_CACHE`, default `<repo>/.cache`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct DynamoDbLocal {
    jar_dir: PathBuf,
    db_dir: PathBuf,
    pub port: u16,
    child: Option<Child>,
    /// How many times it was killed and restarted.
    pub crashes: u64,
}

/// The directory holding `DynamoDBLocal.jar` in the cache, if installed.
pub fn jar_dir() -> Option<PathBuf> {
    let cache = std::env::var_os("TOLLGATE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache"));
    let lib = cache.join("dynamodb-local").join("lib");
    std::fs::read_dir(lib)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.join("DynamoDBLocal.jar").is_file())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl DynamoDbLocal {
    /// Starts it on a free port with its database in `db_dir` (created), and waits until
    /// it answers.
    pub async fn start(jar_dir: &Path, db_dir: &Path) -> Self {
        std::fs::create_dir_all(db_dir).expect("database directory");
        let mut me = Self {
            jar_dir: jar_dir.to_owned(),
            db_dir: db_dir.to_owned(),
            port: free_port(),
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
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut cmd = Command::new("java");
            cmd.current_dir(&self.jar_dir)
                .args([
                    "-Djava.library.path=./DynamoDBLocal_lib",
                    "-jar",
                    "DynamoDBLocal.jar",
                    "-sharedDb",
                    "-disableTelemetry",
                    "-port",
                    &self.port.to_string(),
                    "-dbPath",
                ])
                .arg(&self.db_dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let child = cmd.spawn().expect("java starts DynamoDB Local");
            self.child = Some(child);
            while Instant::now() < deadline {
                if ready(self.port).await {
                    return;
                }
                if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                    break; // exited (the port not yet free after a kill): start again
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            assert!(
                Instant::now() < deadline,
                "DynamoDB Local did not start on port {}",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// `kill -9`, then a start on the same database and port; when the kill was sent
    /// (Unix millis).
    pub async fn crash_and_restart(&mut self) -> i64 {
        let mut killed_at = chrono::Utc::now().timestamp_millis();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill(); // SIGKILL
            killed_at = chrono::Utc::now().timestamp_millis();
            let _ = child.wait();
        }
        self.crashes += 1;
        self.spawn().await;
        killed_at
    }
}

impl Drop for DynamoDbLocal {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether DynamoDB Local on `port` answers a `ListTables`.
async fn ready(port: u16) -> bool {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let resp = http
        .post(format!("http://127.0.0.1:{port}/"))
        .header("x-amz-target", "DynamoDB_20120810.ListTables")
        .header("content-type", "application/x-amz-json-1.0")
        .header(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=test/20200101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0",
        )
        .body("{}")
        .send()
        .await;
    match resp {
        Ok(r) => r.text().await.is_ok_and(|t| t.contains("TableNames")),
        Err(_) => false,
    }
}

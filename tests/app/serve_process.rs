//! The `ds4-chat serve` process the serve tests run (the real binary on a free port, on the CPU),
//! the runner of the Python client scripts that drive it (tests/support/serve_*_client.py), and a
//! plain HTTP/1.1 client for requests the `openai` package cannot make (streamed reads with a
//! stopwatch, hang-ups at a chosen point, malformed bodies).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_ds4-chat");

/// A running server, killed on drop.
pub struct Server {
    pub child: Child,
    /// `http://HOST:PORT`.
    pub base: String,
}

impl Server {
    /// `HOST:PORT`, for a raw socket.
    pub fn addr(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the server (SIGKILL: what a crash or an OOM kill does) and waits for it.
    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh directory for a server's data (`DS4_DATA_DIR`), removed on drop, a failed test's too.
pub struct DataDir(pub PathBuf);

impl DataDir {
    /// `ds4-chat-NAME-PID` under the system's temporary directory, empty.
    pub fn new(name: &str) -> DataDir {
        let dir = std::env::temp_dir().join(format!("ds4-chat-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        DataDir(dir)
    }

    /// The directory as a `DS4_DATA_DIR` value.
    pub fn env(&self) -> String {
        self.0.to_str().expect("a UTF-8 temporary directory").to_string()
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Start `serve` on port 0 over `model` (CPU, 2 threads, a context of `ctx`) with `extra` flags and
/// `env`; Ok(server) once it listens, Err(stderr) when it exits first. Its stderr is echoed with a
/// `[serve]` prefix.
pub fn start(model: &Path, ctx: &str, extra: &[&str], env: &[(&str, &str)]) -> Result<Server, String> {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .arg(model)
        .args(["--port", "0", "--backend", "cpu", "--threads", "2", "--ctx", ctx])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    // Owned by the guard from here on, so every path kills and reaps it.
    let mut server = Server {
        child: cmd.spawn().expect("start ds4-chat serve"),
        base: String::new(),
    };
    let stderr = server.child.stderr.take().expect("piped stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[serve] {line}");
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => {
                if let Some(addr) = line.split("listening on ").nth(1) {
                    server.base = addr.trim().to_string();
                    return Ok(server);
                }
                seen.push(line);
            }
            Err(_) => {
                if let Ok(Some(status)) = server.child.try_wait() {
                    // The reader thread may still hold the last lines.
                    while let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
                        seen.push(line);
                    }
                    return Err(format!("exited with {status}: {}", seen.join(" | ")));
                }
            }
        }
    }
    panic!("serve did not start listening within 120 s: {}", seen.join(" | "));
}

/// tests/support/`script`.
pub fn python_client(script: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support").join(script)
}

/// Whether python3 can import every package of `packages`; else the skip (or CI failure) is
/// reported.
pub fn have_python_packages(packages: &[&str]) -> bool {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {}", packages.join(", "))])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        crate::support::skip_or_fail(&format!(
            "python3 with {} is needed (pip install {})",
            packages.join(" and "),
            packages.join(" ")
        ));
    }
    ok
}

/// Runs the client `script` (`python_client`) with `args`, the first its mode; panics with its
/// output when a check failed. The number of checks passed, from its last line.
pub fn run_python_client(script: &str, args: &[&str]) -> usize {
    let out = Command::new("python3")
        .arg(python_client(script))
        .args(args)
        .output()
        .expect("run python3");
    let text = String::from_utf8_lossy(&[out.stdout, out.stderr].concat()).into_owned();
    println!("{text}");
    assert!(out.status.success(), "{script} {}:\n{text}", args[0]);
    text.lines()
        .find_map(|l| l.strip_suffix(" passed, 0 failed"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{script} {}: no summary line:\n{text}", args[0]))
}

/// A whole HTTP response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// The head of an HTTP POST of `body` (`content_length` overrides its length, for lying clients).
pub fn post_head(addr: &str, path: &str, body_len: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {body_len}\r\n\r\n"
    )
}

pub fn connect(addr: &str, timeout: Duration) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// Splits a response into status and body (de-chunked when the server chunked it).
pub fn parse_reply(raw: &[u8]) -> Result<Reply, String> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no end of head in {} bytes", raw.len()))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    let body = if chunked { dechunk(body) } else { body.to_string() };
    Ok(Reply { status, body })
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// POSTs `body` to `path` and reads the whole response.
pub fn post(addr: &str, path: &str, body: &str, timeout: Duration) -> Result<Reply, String> {
    let mut s = connect(addr, timeout).map_err(|e| format!("connect: {e}"))?;
    s.write_all(format!("{}{body}", post_head(addr, path, body.len())).as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    parse_reply(&raw)
}

/// GETs `path`.
pub fn get(addr: &str, path: &str, timeout: Duration) -> Result<Reply, String> {
    let mut s = connect(addr, timeout).map_err(|e| format!("connect: {e}"))?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    parse_reply(&raw)
}

/// The server process's peak resident set (VmHWM) and current one (VmRSS), in KiB.
pub fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// Open file descriptors of the server process.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

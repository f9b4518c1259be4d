//! Helpers for tests that need a real memory server: `farmem server` started as a separate
//! process on an ephemeral loopback port, and a TCP proxy that can cut every connection.
#![allow(dead_code)]

pub mod raw;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use farmem_proto::auth::Secret;
use farmem_runtime::TcpSpec;
use farmem_runtime::{BackendSpec, Config, Runtime};

pub fn farmem_bin() -> &'static str {
    env!("CARGO_BIN_EXE_farmem")
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A scratch path unique to this test process.
pub fn temp_path(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "farmem-test-{}-{}-{what}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A `farmem server` process. Killed when dropped.
pub struct Server {
    child: Option<Child>,
    pub addr: String,
    pub metrics: Option<String>,
    pub token_file: PathBuf,
    log: PathBuf,
    args: Vec<String>,
}

impl Server {
    /// Start a server with this token file content and extra arguments.
    pub fn start(tokens: &str, extra: &[&str]) -> Server {
        let token_file = temp_path("tokens");
        std::fs::write(&token_file, tokens).unwrap();
        let mut s = Server {
            child: None,
            addr: String::new(),
            metrics: None,
            token_file,
            log: temp_path("server.log"),
            args: extra.iter().map(|a| a.to_string()).collect(),
        };
        s.spawn("127.0.0.1:0");
        s
    }

    /// A server whose one shared secret is `secret`.
    pub fn shared(secret: &str) -> Server {
        Server::start(&format!("{secret}\n"), &["--metrics", "127.0.0.1:0"])
    }

    fn spawn(&mut self, listen: &str) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = Command::new(farmem_bin());
        cmd.args(["server", "--listen", listen, "--token-file"])
            .arg(&self.token_file)
            .args(&self.args);
        if !self.args.iter().any(|a| a == "--capacity") {
            cmd.args(["--capacity", "2G"]);
        }
        let mut child = cmd
            .env("FARMEM_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("starting farmem server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(
            line.contains("listening on"),
            "server did not start: {line:?}\n{}",
            self.log()
        );
        self.addr = line
            .split_whitespace()
            .nth(4)
            .expect("address after 'listening on'")
            .to_string();
        self.metrics = line
            .split("http://")
            .nth(1)
            .and_then(|r| r.split([')', ';', ' ', '\n']).next())
            .map(|r| r.trim_end_matches("/metrics").to_string());
        self.child = Some(child);
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Kill the process (SIGKILL: it loses every page it held).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again on the same port (empty, as a restarted server is).
    pub fn restart(&mut self) {
        self.kill();
        let addr = self.addr.clone();
        self.spawn(&addr);
        assert_eq!(self.addr, addr);
    }

    /// Send a signal and wait for the exit status.
    pub fn signal_and_wait(&mut self, sig: i32) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(c.id() as i32, sig) };
        c.wait().unwrap()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A TCP backend spec for `tenant` with `secret`.
    pub fn spec(&self, tenant: &str, secret: &str) -> TcpSpec {
        TcpSpec {
            addr: self.addr.clone(),
            tenant: tenant.to_string(),
            token: Secret::from_text(secret),
            reconnect_window: Duration::from_secs(20),
        }
    }

    /// A runtime with `budget` bytes of local memory on this server.
    pub fn runtime(&self, tenant: &str, secret: &str, budget: u64) -> Runtime {
        Runtime::new(Config {
            local_mem: budget,
            backend: BackendSpec::Tcp(self.spec(tenant, secret)),
            ..Config::default()
        })
        .expect("runtime on the tcp backend")
    }

    /// Scrape the metrics endpoint: (name with labels, value) per line.
    pub fn metrics(&self) -> Vec<(String, f64)> {
        let addr = self
            .metrics
            .as_ref()
            .expect("server started with --metrics");
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("HTTP") && l.contains(' '))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    }

    pub fn metric(&self, name: &str) -> f64 {
        self.metrics()
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| *v)
            .sum()
    }

    /// The sum of a metric over all its labels.
    pub fn metric_all(&self, name: &str) -> f64 {
        self.metrics()
            .iter()
            .filter(|(k, _)| k == name || k.starts_with(&format!("{name}{{")))
            .map(|(_, v)| *v)
            .sum()
    }

    /// Resident memory of the server process, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- server log ---\n{}", self.log());
        }
        let _ = std::fs::remove_file(&self.token_file);
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Poll `cond` until it holds (bounded): for waiting on progress another process reports.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A TCP proxy in front of a server: forwards both ways until told to cut every connection
/// (the server keeps running and keeps its pages; clients must reconnect).
pub struct Proxy {
    pub addr: String,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
    pub cuts: AtomicU64,
}

impl Proxy {
    pub fn start(target: &str) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (target, c2, s2) = (target.to_string(), conns.clone(), stop.clone());
        l.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            while !s2.load(Ordering::Relaxed) {
                let Ok((client, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                {
                    let mut g = c2.lock().unwrap();
                    g.push(client.try_clone().unwrap());
                    g.push(server.try_clone().unwrap());
                }
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 256 << 10];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if to.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = from.shutdown(Shutdown::Both);
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Proxy {
            addr,
            conns,
            stop,
            cuts: AtomicU64::new(0),
        }
    }

    /// Cut every connection open now, mid-stream.
    pub fn cut(&self) {
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.cuts.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.cut();
    }
}

/// Run `work` on two servers by turns (`rounds` times each; neither always runs right after
/// the other) and compare: the median time on `a`, on `b`, and their ratio `b / a`, all
/// from the same run. The runs themselves are printed by the callers.
pub struct Alternated {
    pub a: Vec<Duration>,
    pub b: Vec<Duration>,
}

impl Alternated {
    pub fn run(a: &Server, b: &Server, rounds: u8, work: impl Fn(&Server, u8) -> Duration) -> Self {
        let (mut ra, mut rb) = (Vec::new(), Vec::new());
        for r in 0..rounds {
            if r % 2 == 0 {
                ra.push(work(a, r));
                rb.push(work(b, r));
            } else {
                rb.push(work(b, r));
                ra.push(work(a, r));
            }
        }
        Alternated { a: ra, b: rb }
    }

    pub fn medians(&self) -> (Duration, Duration) {
        let median = |v: &[Duration]| {
            let mut v = v.to_vec();
            v.sort();
            v[v.len() / 2]
        };
        (median(&self.a), median(&self.b))
    }

    pub fn ratio(&self) -> f64 {
        let (ma, mb) = self.medians();
        mb.as_secs_f64() / ma.as_secs_f64()
    }
}

//! Real `redis-server` processes on free loopback ports, for tests.
//!
//! * [`RedisServer::start`] starts one server (`--save '' --appendonly no
//!   --enable-debug-command local`, listening on 127.0.0.1 only) and waits
//!   until it answers `PING`.
//! * [`cluster`] starts a 3-node Redis Cluster once per test binary.
//! * [`TlsFiles`] makes certificates for a server with a TLS port.
//! * Every server is stopped when its handle is dropped (also when a test
//!   panics), and, through a watchdog shell holding a pipe to the test
//!   process, when the test process ends in any way (the cluster lives in a
//!   `static` that is never dropped).
//!
//! Skip rule: when `redis-server` or `redis-cli` is missing, a test outside
//! CI prints a loud message to stderr and returns early (`start` gives
//! `None`); with the `CI` environment variable set, it panics.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod tls;
pub use tls::TlsFiles;

/// Whether `redis-server` and `redis-cli` can be run. Outside CI a missing
/// binary prints a loud skip message and gives `false`; in CI (env `CI` set)
/// it panics.
pub fn redis_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    let available = *AVAILABLE.get_or_init(|| runs("redis-server") && runs("redis-cli"));
    if !available {
        if std::env::var_os("CI").is_some() {
            panic!("redis-server/redis-cli not found, and CI is set: the Redis tests must run in CI");
        }
        // Straight to the process's stderr: the test harness captures
        // `eprintln!` of passing tests, and this must be seen.
        let bang = "!".repeat(74);
        let _ = writeln!(
            std::io::stderr(),
            "\n{bang}\n!! SKIPPED: redis-server / redis-cli not found on PATH: this Redis test\n\
             !! did NOT run. Install them (apt-get install redis-server redis-tools)\n\
             !! to run it; with CI set, a missing binary fails the test instead.\n{bang}\n"
        );
    }
    available
}

fn runs(binary: &str) -> bool {
    Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A free TCP port on 127.0.0.1 (free when asked; servers retry on a clash).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// One `redis-server` process on 127.0.0.1.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    extra: Vec<String>,
    dir: PathBuf,
    process: Option<Process>,
}

#[derive(Debug)]
struct Process {
    pid: u32,
    watchdog: Child,
    /// Held open: when it closes (drop, or the test process ends), the
    /// watchdog kills the server.
    stdin: Option<ChildStdin>,
}

impl RedisServer {
    /// Starts a server on a free port, or gives `None` (after a loud message)
    /// when Redis is not installed outside CI.
    pub fn start() -> Option<RedisServer> {
        Self::start_with(&[])
    }

    /// [`RedisServer::start`] with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> Option<RedisServer> {
        if !redis_available() {
            return None;
        }
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!("trt-redis-{}-{port}", std::process::id()));
            let mut server = RedisServer {
                port,
                extra: extra.clone(),
                dir,
                process: None,
            };
            match server.spawn() {
                Ok(()) => return Some(server),
                Err(e) => last_error = e,
            }
        }
        panic!("could not start redis-server: {last_error}");
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.pid)
    }

    fn spawn(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("temp dir: {e}"))?;
        let log = self.dir.join("redis.log");
        let mut args: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
            "--enable-debug-command".into(),
            "local".into(),
            "--dir".into(),
            self.dir.display().to_string(),
            "--daemonize".into(),
            "no".into(),
        ];
        args.extend(self.extra.iter().cloned());
        // The watchdog: starts the server in the background, prints its pid,
        // and kills it once its standard input closes.
        let script = r#"log="$1"; shift; redis-server "$@" >"$log" 2>&1 & pid=$!; echo "$pid"; read _; kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "${log%/*}"; exit 0"#;
        let mut watchdog = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(&log)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn sh: {e}"))?;
        let stdin = watchdog.stdin.take();
        let mut line = String::new();
        if let Some(out) = watchdog.stdout.take() {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        let pid: u32 = line
            .trim()
            .parse()
            .map_err(|_| "no pid from the watchdog".to_owned())?;
        self.process = Some(Process { pid, watchdog, stdin });
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if ping(self.port) {
                return Ok(());
            }
            if !alive(pid) {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                self.stop();
                return Err(format!("redis-server exited: {log}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop();
        Err("redis-server did not answer PING within 10 s".into())
    }

    /// `kill -9` the server and wait until its port refuses connections.
    pub fn kill(&mut self) {
        if let Some(pid) = self.pid() {
            signal(pid, "KILL");
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop();
    }

    /// Starts the server again on the same port with the same arguments
    /// (after [`RedisServer::kill`], or after stopping it first).
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("restart failed: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Stops (`SIGSTOP`) or continues (`SIGCONT`) the server process.
    pub fn pause(&self, paused: bool) {
        if let Some(pid) = self.pid() {
            signal(pid, if paused { "STOP" } else { "CONT" });
        }
    }

    fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            signal(p.pid, "KILL");
            drop(p.stdin.take());
            let _ = p.watchdog.wait();
        }
    }

    /// Runs `redis-cli -p <port> <args>` and returns its output (trimmed).
    /// Panics when redis-cli fails.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, false, args)
    }

    /// The `calls` of one command in `INFO commandstats` (0 when absent).
    pub fn command_calls(&self, command: &str) -> u64 {
        command_calls(&self.cli(&["INFO", "commandstats"]), command)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `calls` of `command` in an `INFO commandstats` text.
pub fn command_calls(info: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{}:", command.to_ascii_lowercase());
    info.lines()
        .find_map(|line| line.trim().strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn cli(port: u16, cluster: bool, args: &[&str]) -> String {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if cluster {
        cmd.arg("-c");
    }
    let out = cmd
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli");
    assert!(
        out.status.success(),
        "redis-cli {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

fn alive(pid: u32) -> bool {
    // A zombie (killed, not yet reaped by the watchdog) counts as dead.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        .unwrap_or(false)
}

fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// A 3-node Redis Cluster (3 primaries, no replicas).
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes, to kill one.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// `redis-cli -c` against the first node (follows redirections).
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.nodes[0].port, true, args)
    }

    /// The sum over all nodes of the `calls` of `command`.
    pub fn command_calls(&self, command: &str) -> u64 {
        self.nodes.iter().map(|n| n.command_calls(command)).sum()
    }
}

/// The test binary's cluster, started on first use; `None` when Redis is not
/// installed outside CI (after a loud message).
pub fn cluster() -> Option<&'static RedisCluster> {
    static CLUSTER: OnceLock<Option<RedisCluster>> = OnceLock::new();
    if !redis_available() {
        return None;
    }
    CLUSTER.get_or_init(|| Some(start_cluster())).as_ref()
}

/// A cluster of the caller's own (for tests that kill nodes); `None` when
/// Redis is not installed outside CI (after a loud message).
pub fn own_cluster() -> Option<RedisCluster> {
    redis_available().then(start_cluster)
}

/// A cluster of the caller's own with a replica per primary (3 primaries,
/// 3 replicas, for tests of a failover); `None` when Redis is not
/// installed outside CI (after a loud message).
pub fn own_replicated_cluster() -> Option<RedisCluster> {
    redis_available().then(|| start_cluster_of(1))
}

fn start_cluster() -> RedisCluster {
    start_cluster_of(0)
}

/// 3 primaries with `replicas` replicas each, every replica in sync.
fn start_cluster_of(replicas: usize) -> RedisCluster {
    let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
        .map(|_| {
            let bus = free_port().to_string();
            RedisServer::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-port",
                &bus,
                "--cluster-node-timeout",
                "5000",
            ])
            .expect("redis is available")
        })
        .collect();
    let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
    let out = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(&addrs)
        .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli --cluster create");
    assert!(
        out.status.success(),
        "redis-cli --cluster create failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ok = nodes
            .iter()
            .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"));
        let synced = nodes.iter().all(|n| {
            let info = n.cli(&["INFO", "replication"]);
            info.contains("role:master") || info.contains("master_link_status:up")
        });
        if ok && synced {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cluster did not become ready within 20 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    RedisCluster { nodes }
}

//! A throwaway `redis-server` for tests: a fresh server per test on a free loopback port, no
//! persistence, killed on drop (and restartable empty on the same port, as a crash and a
//! restart would leave it).
//!
//! Invariant: without `redis-server` on the PATH, [`TestRedis::start_if_available`] says so
//! on stderr and returns `None` (the test is skipped), except under `CI=true`, where it panics:
//! CI installs Redis from Debian's packages, so a missing server there is a broken setup.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server` on `127.0.0.1:port`.
pub struct TestRedis {
    pub port: u16,
    child: Option<Child>,
    args: Vec<String>,
}

/// Whether `redis-server` is installed; panics under `CI=true` when it is not.
pub fn redis_available() -> bool {
    let ok = Command::new("redis-server").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if !ok {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "redis-server is not installed (CI installs it: .ci/run)");
        eprintln!("skipped: redis-server is not installed");
    }
    ok
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("a loopback port").local_addr().expect("its address").port()
}

impl TestRedis {
    /// A fresh server if `redis-server` is installed (see the module doc).
    pub fn start_if_available() -> Option<TestRedis> {
        redis_available().then(|| TestRedis::start(&[]))
    }

    /// A fresh server with extra `args` (`--maxmemory 1mb`, …).
    pub fn start(args: &[&str]) -> TestRedis {
        TestRedis::start_on(free_port(), args)
    }

    /// A fresh server on `port`.
    pub fn start_on(port: u16, args: &[&str]) -> TestRedis {
        let mut r = TestRedis { port, child: None, args: args.iter().map(|s| s.to_string()).collect() };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let t = Instant::now();
        while self.client().get_connection_with_timeout(Duration::from_millis(200)).is_err() {
            assert!(t.elapsed() < Duration::from_secs(10), "redis-server did not start on port {}", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its URL (database 0).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A client of it.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a loopback URL")
    }

    /// A command on an admin connection.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        let mut c = self.client().get_connection()?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut c)
    }

    /// `redis-cli` with `args` against it; its standard output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli").args(["-p", &self.port.to_string()]).args(args).output().expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Every key.
    pub fn keys(&self) -> Vec<String> {
        self.cmd(&["KEYS", "*"]).expect("KEYS")
    }

    /// Kills the server (as a crash would).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

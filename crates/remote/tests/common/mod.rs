//! A real `redis-server` per test, on a free loopback port, killed on drop; and KV to store.
//!
//! Without `redis-server` on the PATH a test is skipped (a line on stderr), except under
//! `CI=true`, where it fails: CI installs Redis from Debian's packages.

#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::KvCache;

pub const LAYOUT: KvLayout = KvLayout { num_layers: 2, num_kv_heads: 2, head_dim: 64 };
pub const VOCAB: usize = 1000;
pub const FP: &str = "0123456789abcdef-f16";

/// A running `redis-server`.
pub struct Redis {
    pub port: u16,
    child: Option<Child>,
    args: Vec<String>,
}

/// Whether Redis is here; panics under CI=true when it is not.
pub fn redis_available() -> bool {
    let ok = Command::new("redis-server").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if !ok {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "redis-server is not installed (CI installs it: .ci/run)");
        eprintln!("skipped: redis-server is not installed");
    }
    ok
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Redis {
    /// A fresh server (no persistence) with extra `args` (`--maxmemory 1mb`, …).
    pub fn start(args: &[&str]) -> Redis {
        Redis::start_on(free_port(), args)
    }

    /// A fresh server on `port`.
    pub fn start_on(port: u16, args: &[&str]) -> Redis {
        let mut r = Redis { port, child: None, args: args.iter().map(|s| s.to_string()).collect() };
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

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).unwrap()
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

    /// Every key.
    pub fn keys(&self) -> Vec<String> {
        self.cmd(&["KEYS", "*"]).unwrap()
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

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn pool(format: KvFormat) -> KvPool {
    KvPool::new(LAYOUT, format, 256 << 20)
}

/// `n` tokens of deterministic pseudo-random keys and values.
pub fn make_kv(pool: &KvPool, n: usize, seed: u64) -> SeqKv {
    let mut kv = SeqKv::new(pool);
    let w = LAYOUT.num_kv_heads * LAYOUT.head_dim;
    kv.reserve(n).unwrap();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    };
    for layer in 0..LAYOUT.num_layers {
        let k: Vec<f32> = (0..n * w).map(|_| next()).collect();
        let v: Vec<f32> = (0..n * w).map(|_| next()).collect();
        kv.write(layer, 0, &k, &v, n);
    }
    kv
}

/// `head` followed by `tail`'s rows: the KV of a conversation that shares `head` and then goes
/// its own way (`head` shares its blocks, the rest is written anew).
pub fn extended(head: &SeqKv, tail: &SeqKv) -> SeqKv {
    let (at, n) = (head.len(), tail.len());
    let mut kv = head.fork(at);
    kv.reserve(n).unwrap();
    for l in 0..LAYOUT.num_layers {
        let (k, v) = tail.read_rows(l, 0..n);
        kv.write(l, at, &k, &v, n);
    }
    kv
}

/// Every layer's key and value rows of tokens `0..n`, and the recent window.
pub fn rows(kv: &SeqKv, n: usize) -> (Vec<(Vec<f32>, Vec<f32>)>, Option<Vec<u8>>) {
    ((0..LAYOUT.num_layers).map(|l| kv.read_rows(l, 0..n)).collect(), kv.window().map(<[u8]>::to_vec))
}

/// Token ids and a text of one word per token, with each token's byte end.
pub fn conversation(n: usize, seed: u32) -> (Vec<u32>, String, Vec<usize>) {
    let mut text = String::new();
    let mut ends = Vec::new();
    let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 37 + seed) % VOCAB as u32).collect();
    for t in &tokens {
        text.push_str(&format!("w{t} "));
        ends.push(text.len());
    }
    (tokens, text, ends)
}

//! Saves of long conversations written by the layer's writer thread, off the engine thread:
//! a save still being written when the conversation's next turn arrives is skipped safely
//! (the turn extends the cache kept in RAM; the newer save replaces the held one, which is
//! never written) or awaited (a turn whose session is no longer in RAM waits for its save,
//! then resumes from it); either way the answers equal those of a run whose saves were never
//! held, and a restart resumes from what was written last.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engram_engine::Job;
use engram_kv::{DiskStore, EvictionPolicy, KvFormat, KvPool};
use engram_model::Model;
use engram_policy::OwnerKey;
use engram_sparse::{LongContext, LongContextConfig, Method, SaveMonitor, SparseConfig};

use crate::long::{params, pool, sessions, tiny, Engine, Turn};

/// The long-context layer over the session store, conversations past 64 tokens sparse (8 keys
/// retrieved), `max_sessions` kept in RAM, saves in the disk store at `store_dir`.
fn layer(model: &Model, pool: &KvPool, live: &Path, store_dir: &Path, max_sessions: usize) -> (LongContext, SaveMonitor) {
    let cfg = LongContextConfig {
        sparse: SparseConfig { budget: 8, sinks: 4, recent: 16, ..SparseConfig::new(Method::DYNAKV) },
        ram_budget: 8 << 10,
        cache_bytes: 4 << 10,
        max_sessions,
        ..LongContextConfig::new(64, live.to_path_buf())
    };
    let store = Arc::new(Mutex::new(DiskStore::open(store_dir, 256 << 20, EvictionPolicy::Lru).unwrap()));
    let fp = engram_kv::cache_fingerprint(model.fingerprint, KvFormat::F16);
    let layer = LongContext::new(sessions(model, pool), cfg, model.config.clone(), model.fingerprint.0, pool.clone()).with_disk(store, &fp);
    let monitor = layer.save_monitor().expect("a disk store");
    (layer, monitor)
}

/// A conversation by token ids: 300 tokens, then each turn the previous prompt, its answer
/// and 20 new tokens (`salt` varies the text between owners).
struct Conversation {
    owner: OwnerKey,
    tokens: Vec<u32>,
}

impl Conversation {
    fn new(owner: &str, salt: u32) -> Conversation {
        let tokens = (0..300u32).map(|i| 5 + (i * 7919 + i * i * 31 + salt) % 200).collect();
        Conversation { owner: OwnerKey::tenant_own(owner), tokens }
    }

    /// The next turn's job (the answer of the last turn appended first, then 20 tokens).
    fn job(&self) -> Job {
        Job::from_tokens(self.owner.clone(), self.tokens.clone(), params())
    }

    /// Records `turn`'s answer and the next message.
    fn answered(&mut self, turn: &Turn) {
        self.tokens.extend(&turn.generated);
        let n = self.tokens.len() as u32;
        self.tokens.extend((0..20u32).map(|i| 7 + (i * 13 + n) % 150));
    }
}

/// Polls `done` every 5 ms for up to 5 minutes (a wait for the engine, never a timing).
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < Duration::from_secs(300), "waited 5 minutes for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_save_still_held_when_the_next_turn_arrives_is_skipped_and_the_newer_one_resumes() {
    let (_d, model) = tiny();
    // The reference: three turns, saves never held.
    let want: Vec<Turn> = {
        let (live, store) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let p = pool(&model);
        let (layer, monitor) = layer(&model, &p, live.path(), store.path(), 4);
        let engine = Engine::start(&model, &p, Box::new(layer));
        let mut c = Conversation::new("t", 0);
        let mut turns = Vec::new();
        for _ in 0..3 {
            let t = engine.turn(c.job());
            c.answered(&t);
            turns.push(t);
        }
        monitor.settle();
        assert_eq!(monitor.counters().failed, 0);
        turns
    };

    let (live, store) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut c = Conversation::new("t", 0);
    {
        let p = pool(&model);
        let (layer, monitor) = layer(&model, &p, live.path(), store.path(), 4);
        let engine = Engine::start(&model, &p, Box::new(layer));
        let hold = monitor.hold();
        let first = engine.turn(c.job());
        c.answered(&first);
        assert_eq!(first, want[0]);
        // Turn 1's save is queued or taken by the writer (the turn's end comes just after its
        // last token), not written.
        wait_until("turn 1's save to be asked for", || monitor.counters().asked == 1);
        assert_eq!(monitor.counters().saved, 0);
        assert!(monitor.pending() > 0);
        let second = engine.turn(c.job());
        c.answered(&second);
        assert_eq!(second, want[1], "the next turn extends the cache kept in RAM while its save is held");
        assert!(second.cached_tokens > 0);
        wait_until("turn 2's save to be asked for", || monitor.counters().asked == 2);
        drop(hold);
        monitor.settle();
        let n = monitor.counters();
        assert_eq!((n.saved, n.skipped, n.failed), (1, 1, 0), "turn 1's save was replaced by turn 2's, never written: {n:?}");
    }
    // A restart resumes turn 3 from turn 2's save.
    let p = pool(&model);
    let (layer, monitor) = layer(&model, &p, live.path(), store.path(), 4);
    let engine = Engine::start(&model, &p, Box::new(layer));
    let third = engine.turn(c.job());
    assert_eq!(third.generated, want[2].generated, "resumed from the save written: the never-held run's answer");
    assert_eq!(third.cached_tokens, want[2].cached_tokens, "the whole history came from the save");
    assert_eq!(third.computed as usize, third.prompt_tokens - third.cached_tokens);
    drop(engine);
    assert_eq!(monitor.counters().failed, 0);
}

#[test]
fn a_turn_whose_session_left_ram_waits_for_its_save_then_resumes_from_it() {
    let (_d, model) = tiny();
    // The reference: a's two turns, kept in RAM between them.
    let want: Vec<Turn> = {
        let (live, store) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let p = pool(&model);
        let (layer, _monitor) = layer(&model, &p, live.path(), store.path(), 4);
        let engine = Engine::start(&model, &p, Box::new(layer));
        let mut a = Conversation::new("a", 0);
        let first = engine.turn(a.job());
        a.answered(&first);
        vec![first, engine.turn(a.job())]
    };

    let (live, store) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let p = pool(&model);
    // One session kept in RAM: b's turn drops a's.
    let (layer, monitor) = layer(&model, &p, live.path(), store.path(), 1);
    let engine = Engine::start(&model, &p, Box::new(layer));
    let hold = monitor.hold();
    let (mut a, mut b) = (Conversation::new("a", 0), Conversation::new("b", 17));
    let first = engine.turn(a.job());
    a.answered(&first);
    assert_eq!(first, want[0]);
    let other = engine.turn(b.job());
    b.answered(&other);
    wait_until("both saves to be asked for", || monitor.counters().asked == 2);
    assert_eq!(monitor.counters().saved, 0, "both saves held");
    let second = std::thread::scope(|s| {
        let turn = s.spawn(|| engine.turn(a.job()));
        // a's turn finds its session only on disk, its save not written: it waits.
        wait_until("a's turn to wait for its save", || monitor.counters().waits == 1);
        drop(hold);
        turn.join().unwrap()
    });
    assert_eq!(second.generated, want[1].generated, "resumed from the awaited save: the answer of the cache kept in RAM");
    assert_eq!(second.cached_tokens, want[1].cached_tokens, "the whole history came from the save");
    assert_eq!(second.computed as usize, second.prompt_tokens - second.cached_tokens);
    monitor.settle();
    let n = monitor.counters();
    assert_eq!((n.skipped, n.failed, n.waits), (0, 0, 1), "{n:?}");
}

//! The state machine of `main.rs`: random operations applied to a session store and its KV
//! pool, with the census of live blocks checked after each.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use engram_context::{MatchKind, PersistedSessions, SessionStore};
use engram_kv::{Block, EvictionPolicy, KvFormat, KvLayout, KvPool, KvView, SeqKv, BLOCK_TOKENS};
use engram_tokenizer::StreamDecoder;

use crate::common::model;
use crate::support::*;

/// Distinct live blocks and recent windows, as counted from outside the store.
pub(crate) struct Census {
    pub(crate) blocks: usize,
    /// Prefix index entries no sequence shares (what `make_room` may drop first).
    pub(crate) idle_index: usize,
    pub(crate) windows: usize,
}

pub(crate) struct Machine {
    pub(crate) pool: KvPool,
    pub(crate) format: KvFormat,
    pub(crate) store: SessionStore,
    pub(crate) disk: Option<tempfile::TempDir>,
    pub(crate) held: Vec<Held>,
    /// Each owner's last checked-in text ("" before the first).
    pub(crate) texts: [String; 3],
    pub(crate) stats: Stats,
}

impl Machine {
    pub(crate) fn new(format: KvFormat, budget_blocks: usize, disk: bool) -> Machine {
        let m = model();
        let layout = KvLayout::of(&m.config);
        let bb = KvPool::new(layout, format, 0).block_bytes();
        let pool = KvPool::new(layout, format, budget_blocks * bb);
        let disk = disk.then(|| tempfile::tempdir().unwrap());
        let store = Self::open(&pool, format, disk.as_ref());
        Machine { pool, format, store, disk, held: Vec::new(), texts: Default::default(), stats: Stats::default() }
    }

    pub(crate) fn open(pool: &KvPool, format: KvFormat, disk: Option<&tempfile::TempDir>) -> SessionStore {
        let m = model();
        let store = SessionStore::new(pool.clone(), m.fingerprint);
        match disk {
            None => store,
            Some(dir) => {
                let fp = engram_kv::cache_fingerprint(m.fingerprint, format);
                let d = PersistedSessions::open(dir.path(), 64 << 20, EvictionPolicy::Lru, fp).unwrap();
                store.with_disk(d, m.config.vocab)
            }
        }
    }

    pub(crate) fn exact(&self) -> bool {
        self.format == KvFormat::F32
    }

    pub(crate) fn sessions(&self) -> Vec<&engram_context::Session> {
        let mut v: Vec<_> = OWNERS.iter().flat_map(|o| self.store.sessions_of(o)).collect();
        v.sort_by(|a, b| (&a.owner, &a.id).cmp(&(&b.owner, &b.id)));
        v
    }

    pub(crate) fn census(&self, extra: &[&SeqKv]) -> Census {
        self.store.flush();
        let sessions = self.sessions();
        assert_eq!(sessions.len(), self.store.len(), "every session belongs to a known owner");
        let seqs = sessions.iter().map(|s| &s.kv).chain(self.held.iter().map(|h| &h.kv)).chain(extra.iter().copied());
        // Block address -> (references the test knows of, strong count).
        let mut seen: HashMap<*const Block, (usize, usize)> = HashMap::new();
        let mut windows: HashSet<*const u8> = HashSet::new();
        for kv in seqs {
            for b in kv.blocks() {
                seen.entry(Arc::as_ptr(b)).or_insert((0, Arc::strong_count(b))).0 += 1;
            }
            if let Some(w) = kv.window() {
                windows.insert(w.as_ptr());
            }
        }
        let mut in_index = 0;
        for (known, strong) in seen.values() {
            assert!(strong >= known);
            let hidden = strong - known;
            assert!(
                hidden <= 1,
                "a block has {hidden} holders besides the sessions and the held sequences (the prefix index holds a block once)"
            );
            in_index += hidden;
        }
        let index = self.store.index().len();
        assert!(in_index <= index, "{in_index} blocks held by something other than the index's {index} entries");
        Census { blocks: seen.len() + index - in_index, idle_index: index - in_index, windows: windows.len() }
    }

    /// Invariants (1) and (2), and the shape of every sequence.
    pub(crate) fn check(&mut self, extra: &[&SeqKv]) {
        let c = self.census(extra);
        let want = c.blocks * self.pool.block_bytes() + c.windows * self.pool.window_bytes();
        assert_eq!(
            self.pool.used(),
            want,
            "pool.used() vs {} distinct blocks and {} windows ({} sessions, {} index entries, {} held)",
            c.blocks,
            c.windows,
            self.store.len(),
            self.store.index().len(),
            self.held.len()
        );
        assert!(self.pool.used() <= self.pool.budget());
        self.stats.max_used_blocks = self.stats.max_used_blocks.max(c.blocks);
        for h in &self.held {
            assert_eq!(h.kv.len(), h.tokens.len());
            assert_eq!(h.positions.len(), h.tokens.len());
            for (s, &p) in h.positions.iter().enumerate() {
                assert_eq!(h.kv.position(s), p as usize, "slot {s}'s position");
            }
        }
        for s in self.sessions() {
            assert_eq!(s.kv.len(), s.tokens.len(), "a session's cache holds exactly its tokens");
            assert_eq!(s.token_ends.len(), s.tokens.len());
            assert!(!s.kv.has_moved_positions());
        }
    }

    /// `make_room` with every property it documents checked; `extra`: sequences alive besides
    /// the sessions and the held ones (the request being admitted).
    pub(crate) fn make_room(&mut self, bytes: usize, extra: &[&SeqKv]) -> bool {
        let bb = self.pool.block_bytes();
        let before = self.census(extra);
        let used0 = self.pool.used();
        let index0 = self.store.index().len();
        let on_disk0 = self.store.on_disk_count();
        let sessions0: Vec<(String, String, u64)> = self.sessions().iter().map(|s| (s.owner.clone(), s.id.clone(), s.last_used)).collect();
        let ok = self.store.make_room(bytes);
        self.stats.make_room_calls += 1;
        let after = self.census(extra);
        let used1 = self.pool.used();
        let index1 = self.store.index().len();
        let kept: HashSet<(String, String)> = self.sessions().iter().map(|s| (s.owner.clone(), s.id.clone())).collect();
        let (gone, stayed): (Vec<_>, Vec<_>) = sessions0.iter().partition(|(o, i, _)| !kept.contains(&(o.clone(), i.clone())));
        let missing = (used0 + bytes).saturating_sub(self.pool.budget());
        assert!(index1 <= index0 && used1 <= used0, "make_room only frees");
        if ok {
            assert!(used1 + bytes <= self.pool.budget(), "make_room said {bytes} bytes fit: used {used1} of {}", self.pool.budget());
        } else {
            assert!(
                self.store.is_empty() && after.idle_index == 0,
                "make_room gave up with {} sessions and {} idle prefix blocks left",
                self.store.len(),
                after.idle_index
            );
        }
        if missing == 0 {
            assert!(gone.is_empty() && index1 == index0 && used1 == used0, "nothing is evicted when the bytes already fit");
        } else if before.idle_index * bb >= missing {
            // Idle prefix blocks suffice: exactly as many as needed go, and no session.
            assert!(gone.is_empty(), "a session was evicted while idle prefix blocks covered the need");
            assert_eq!(index0 - index1, missing.div_ceil(bb), "idle prefix blocks evicted for {missing} missing bytes");
            assert_eq!(used0 - used1, (index0 - index1) * bb);
        }
        if let (Some(newest_gone), Some(oldest_kept)) = (gone.iter().map(|s| s.2).max(), stayed.iter().map(|s| s.2).min()) {
            assert!(newest_gone <= oldest_kept, "sessions are evicted least recently used first");
        }
        if self.disk.is_some() {
            assert_eq!(self.store.on_disk_count(), on_disk0 + gone.len(), "evicted sessions are offloaded to disk, not forgotten");
        }
        self.stats.sessions_evicted += gone.len();
        self.stats.index_evicted += index0 - index1;
        self.stats.used_dropped += (used1 < used0) as usize;
        self.check(extra);
        ok
    }

    pub(crate) fn apply(&mut self, op: &Op) {
        self.stats.ops += 1;
        match *op {
            Op::Turn { owner, how, word, gen } => self.turn(owner as usize % OWNERS.len(), how, word as usize, gen as usize),
            Op::ForkSession { owner, pick, frac } => {
                let name = OWNERS[owner as usize % OWNERS.len()];
                let mut ss: Vec<_> = self.store.sessions_of(name).collect();
                if ss.is_empty() {
                    return;
                }
                ss.sort_by(|a, b| a.id.cmp(&b.id));
                let s = ss[pick as usize % ss.len()];
                let n = s.kv.len() * frac as usize / 255;
                let h = Held {
                    kv: s.kv.fork(n),
                    tokens: s.tokens[..n].to_vec(),
                    positions: (0..n as u32).collect(),
                    stale_from: None,
                    rotated: false,
                };
                self.hold(h);
            }
            Op::ForkHeld { idx, frac } => {
                let Some(i) = self.pick(idx) else { return };
                let h = &self.held[i];
                let n = h.kv.len() * frac as usize / 255;
                let f = Held {
                    kv: h.kv.fork(n),
                    tokens: h.tokens[..n].to_vec(),
                    positions: h.positions[..n].to_vec(),
                    stale_from: h.stale_from.filter(|&s| s < n),
                    rotated: h.rotated,
                };
                self.hold(f);
            }
            Op::Truncate { idx, frac } => {
                let Some(i) = self.pick(idx) else { return };
                let h = &mut self.held[i];
                let n = h.kv.len() * frac as usize / 255;
                h.kv.truncate(n);
                h.tokens.truncate(n);
                h.positions.truncate(n);
                h.stale_from = h.stale_from.filter(|&s| s < n);
            }
            Op::ExtendHeld { idx, word } => {
                if let Some(i) = self.pick(idx) {
                    self.extend_held(i, word as usize);
                }
            }
            Op::Move { idx, start, len, shift, whole } => {
                if let Some(i) = self.pick(idx) {
                    self.move_slots(i, start, len, shift, whole);
                }
            }
            Op::View { idx, word } => {
                if let Some(i) = self.pick(idx) {
                    self.view(i, word as usize);
                }
            }
            Op::DropHeld { idx } => {
                if let Some(i) = self.pick(idx) {
                    self.held.remove(i);
                }
            }
            Op::MakeRoom { blocks } => {
                self.make_room(blocks as usize * self.pool.block_bytes(), &[]);
            }
            Op::Restart => {
                if self.disk.is_none() {
                    return;
                }
                self.store.flush();
                // Drop the old store (and its writer) before the new one opens the directory.
                let old = std::mem::replace(&mut self.store, SessionStore::new(self.pool.clone(), model().fingerprint));
                drop(old);
                self.store = Self::open(&self.pool, self.format, self.disk.as_ref());
                self.stats.restarts += 1;
            }
        }
        self.check(&[]);
    }

    pub(crate) fn pick(&self, idx: u8) -> Option<usize> {
        (!self.held.is_empty()).then(|| idx as usize % self.held.len())
    }

    pub(crate) fn hold(&mut self, h: Held) {
        if self.held.len() >= MAX_HELD {
            self.held.remove(0);
        }
        self.held.push(h);
    }

    /// Compares hot logits and greedy tokens with the cold run; `tol` relative.
    pub(crate) fn compare(&mut self, what: &str, hot: &[f32], hot_gen: &[u32], tokens: &[u32], positions: Option<&[u32]>, rotated: bool) {
        if !self.exact() {
            assert!(hot.iter().all(|x| x.is_finite()), "{what}: logits are finite");
            return;
        }
        let (cold_logits, cold_gen) = cold(self.format, tokens, positions, hot_gen.len());
        let err = rel(hot, &cold_logits);
        let tol = if rotated { ROTATED_TOL } else { EXACT_TOL };
        assert!(
            err <= tol,
            "{what}: logits differ from a cold run over the same {} tokens by {err:e} (rotated keys: {rotated})",
            tokens.len()
        );
        assert_eq!(hot_gen, &cold_gen[..], "{what}: greedy tokens differ from a cold run's");
        self.stats.cold_compared += 1;
        if rotated {
            self.stats.max_rotated_err = self.stats.max_rotated_err.max(err);
        } else {
            self.stats.max_err = self.stats.max_err.max(err);
            self.stats.bitwise_equal += (hot.iter().zip(&cold_logits).all(|(a, b)| a.to_bits() == b.to_bits())) as usize;
        }
    }

    pub(crate) fn turn(&mut self, owner: usize, how: How, word: usize, gen: usize) {
        let m = model();
        let name = OWNERS[owner];
        let w = WORDS[word % WORDS.len()];
        let last = self.texts[owner].clone();
        let text = match how {
            _ if last.is_empty() || last.len() > MAX_TEXT => format!("{SYSTEM}{name}: {w}"),
            How::New => format!("{SYSTEM}{name}: {w}"),
            How::Extend => format!("{last}{w}"),
            How::Exact => last.clone(),
            How::Diverge(f) => {
                let starts: Vec<usize> = last.char_indices().map(|(i, _)| i).collect();
                let cut = starts[starts.len() * f as usize / 256];
                format!("{}{w}", &last[..cut])
            }
        };
        // EXACT is certain when a session has this text and none extends it (a longer one would
        // tie on common characters, and the more recently used of the two wins).
        let exact_in_ram = self.store.sessions_of(name).any(|s| s.text == text)
            && !self.store.sessions_of(name).any(|s| s.text != text && s.text.starts_with(&text));
        let (on_disk0, restored0) = (self.store.on_disk_count(), self.store.restored_count());
        let mut co = self.store.checkout(name, None, &text, true, &m.tokenizer).unwrap();
        if let Some(p) = co.restore.take() {
            assert!(self.store.verify_restore(p), "a sound session file failed its checksum");
        }
        let restored = self.store.restored_count() > restored0;
        self.stats.restores += restored as usize;
        if self.store.on_disk_count() < on_disk0 && !restored {
            // The catalog entry went but nothing was restored: the file was gone (a save still
            // queued when the session was offloaded) or unusable. A budget refusal keeps the entry
            // (`a_restore_refused_by_the_ram_budget_leaves_the_session_restorable`).
            self.stats.lost_restores += 1;
        }
        *self.stats.kinds.entry(co.kind.name()).or_default() += 1;
        if exact_in_ram {
            assert_eq!(co.kind, MatchKind::Exact, "the same text as a session in RAM");
        }
        assert_eq!(co.kv.len(), co.reused, "a checkout's cache holds tokens[..reused]");
        assert!(co.reused <= co.tokens.len() && !co.tokens.is_empty());
        assert_eq!(co.token_ends.len(), co.tokens.len());
        self.check(&[&co.kv]);

        // As the scheduler does: the last prompt token is always recomputed.
        let tokens = co.tokens;
        let n = tokens.len();
        let keep = co.reused.min(n - 1);
        let mut kv = co.kv;
        kv.truncate(keep);
        let total = n - keep + gen;
        let need = need_for(&self.pool, &kv, total);
        let fits = self.make_room(need, &[&kv]);
        let used0 = self.pool.used();
        if kv.reserve(total).is_err() {
            assert!(!fits, "make_room said {need} bytes fit, then reserve refused them");
            assert_eq!(self.pool.used(), used0, "a refused reservation charges nothing");
            self.stats.refused += 1;
            return;
        }
        self.stats.turns += 1;
        let hot = step(&mut kv, keep, &tokens[keep..], None);
        let hot_gen = greedy(&mut kv, n, hot.clone(), gen, None);
        self.compare(&format!("{:?} turn of {name} reusing {}", co.kind, co.reused), &hot, &hot_gen, &tokens, None, false);

        // Check in prompt + generated tokens, each generated token's text end as streamed.
        let mut dec = StreamDecoder::new(&m.tokenizer, &tokens);
        let mut out = text.clone();
        let mut ends = co.token_ends;
        for &t in &hot_gen {
            out.push_str(&dec.push(t).unwrap());
            ends.push(out.len());
        }
        let mut all = tokens;
        all.extend(&hot_gen);
        assert_eq!(kv.len(), all.len());
        self.store.checkin(name, &co.session_id, out.clone(), all, ends, kv);
        self.texts[owner] = out;
    }

    pub(crate) fn extend_held(&mut self, i: usize, word: usize) {
        let m = model();
        let w = m.tokenizer.encode(WORDS[word % WORDS.len()], false).unwrap().ids;
        let need = need_for(&self.pool, &self.held[i].kv, w.len());
        let fits = self.make_room(need, &[]);
        let h = &mut self.held[i];
        let used0 = self.pool.used();
        if h.kv.reserve(w.len()).is_err() {
            assert!(!fits, "make_room said {need} bytes fit, then reserve refused them");
            assert_eq!(self.pool.used(), used0, "a refused reservation charges nothing");
            self.stats.refused += 1;
            return;
        }
        let first = h.positions.last().map_or(0, |&p| p + 1);
        let pos: Vec<u32> = (first..first + w.len() as u32).collect();
        let slot = h.kv.len();
        let moved = h.positions.iter().enumerate().any(|(s, &p)| p as usize != s);
        let logits = step(&mut h.kv, slot, &w, moved.then_some(&pos[..]));
        h.tokens.extend(&w);
        h.positions.extend(&pos);
        if h.cold_comparable() {
            let (tokens, positions, rotated) = (h.tokens.clone(), h.positions.clone(), h.rotated);
            self.compare("a held sequence extended", &logits, &[], &tokens, Some(&positions), rotated);
        }
    }

    pub(crate) fn move_slots(&mut self, i: usize, start: u8, len: u8, shift: u8, whole: bool) {
        let n = self.held[i].kv.len();
        if n == 0 {
            return;
        }
        let (a, b) = if whole {
            (0, n)
        } else {
            let a = n * start as usize / 256;
            (a, a + 1 + len as usize % (n - a))
        };
        let old: Vec<u32> = self.held[i].positions.clone();
        // Forward by up to 191 or back by up to 64 positions (never below 0).
        let new_first = (old[a] as i64 + shift as i64 - 64).max(0) as usize;
        let bb = self.pool.block_bytes();
        let blocks = (b - 1) / BLOCK_TOKENS - a / BLOCK_TOKENS + 1;
        let window = if self.pool.has_window() { self.pool.window_bytes() } else { 0 };
        let fits = self.make_room(blocks * bb + window, &[]);
        // Every other sequence, to show the move changes none of them.
        let others: Vec<(String, Vec<u32>)> = self
            .sessions()
            .iter()
            .map(|s| (format!("session {}/{}", s.owner, s.id), digest(&s.kv)))
            .chain(self.held.iter().enumerate().filter(|&(j, _)| j != i).map(|(j, h)| (format!("held {j}"), digest(&h.kv))))
            .collect();
        let used0 = self.pool.used();
        let rope = &model().config.rope;
        let h = &mut self.held[i];
        if h.kv.move_slots(a..b, new_first, rope).is_err() {
            assert!(!fits, "make_room said the copies fit, then move_slots refused");
            assert_eq!(self.pool.used(), used0, "a refused move charges nothing");
            for (s, &p) in old.iter().enumerate() {
                assert_eq!(h.kv.position(s), p as usize, "a refused move moves nothing");
            }
            self.stats.moves_refused += 1;
            return;
        }
        self.stats.moves += 1;
        for (k, s) in (a..b).enumerate() {
            h.positions[s] = (new_first + k) as u32;
        }
        h.rotated = true;
        // Tokens keep their relative distances where the moved run starts the sequence and was
        // contiguous before: only tokens after it (which attended to it) go stale.
        let contiguous = (a..b).all(|s| old[s] == old[a] + (s - a) as u32);
        let stale = if a == 0 && contiguous { b } else { a };
        h.stale_from = h.stale_from.map_or(Some(stale), |s| Some(s.min(stale))).filter(|&s| s < n);
        let others_now: Vec<Vec<u32>> = self
            .sessions()
            .iter()
            .map(|s| digest(&s.kv))
            .chain(self.held.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, h)| digest(&h.kv)))
            .collect();
        assert_eq!(others.len(), others_now.len());
        for ((what, d0), d1) in others.iter().zip(&others_now) {
            assert!(d0 == d1, "moving slots of held {i} changed {what}, which shares its blocks");
        }
        self.check(&[]);
        // A whole, uniformly shifted sequence still answers as a cold run at its new positions.
        if self.held[i].cold_comparable() {
            self.extend_held(i, 0);
        }
    }

    /// A view of held sequence `i`'s spans (at their positions) followed by a new sequence
    /// holding a few more tokens: equal to a cold run over all of them at those positions.
    pub(crate) fn view(&mut self, i: usize, word: usize) {
        let m = model();
        let w = m.tokenizer.encode(WORDS[word % WORDS.len()], false).unwrap().ids;
        let mut own = SeqKv::new(&self.pool);
        // Room first: while the view lives, its spans are references the census cannot see.
        let fits = self.make_room(need_for(&self.pool, &own, w.len()), &[]);
        if own.reserve(w.len()).is_err() {
            assert!(!fits, "make_room said the view's block fits, then reserve refused it");
            self.stats.refused += 1;
            return;
        }
        let h = &self.held[i];
        let n = h.kv.len();
        let first = h.positions.last().map_or(0, |&p| p + 1);
        let pos: Vec<u32> = (first..first + w.len() as u32).collect();
        let mut view = KvView::new(h.kv.spans(0..n), own);
        assert_eq!(view.span_keys(), n);
        let used0 = self.pool.used();
        let logits = step(&mut view, 0, &w, Some(&pos));
        assert_eq!(self.pool.used(), used0, "writing into reserved room charges nothing");
        assert_eq!(view.num_keys(), n + w.len());
        drop(view);
        self.stats.views += 1;
        if h.cold_comparable() {
            let tokens: Vec<u32> = h.tokens.iter().chain(&w).copied().collect();
            let positions: Vec<u32> = h.positions.iter().chain(&pos).copied().collect();
            let rotated = h.rotated;
            self.compare("a view of a held sequence's spans", &logits, &[], &tokens, Some(&positions), rotated);
        }
    }
}

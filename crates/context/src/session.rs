//! Sessions matched by characters (per-agent caches).
//!
//! ```text
//!  session text:  <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!
//!  new text:      <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n...
//!                 |------------------- common characters -------------------|  -> EXTEND: tokenize only the rest
//! ```
//! A token is reusable when its text ends inside the common characters; the
//! new text is tokenized from the end of the last reused token.
//!
//! Invariant: a checkout's cache holds exactly `tokens[..reused]`, and
//! `tokens` is what the model will have seen once the rest is prefilled —
//! generated tokens are kept as generated, never re-tokenized.

use std::collections::{HashMap, HashSet};

use engram_kv::{KvPool, SeqKv, SlidingLayers};
use engram_model::Fingerprint;
use engram_tokenizer::{Tokenizer, TokenizerError};

use engram_policy::{Checkout, MatchKind, PendingRestore};

use crate::pending::SessionRestore;
use crate::prefix::PrefixIndex;
use crate::session_files::{CatalogEntry, PersistedSessions, PrefixCatalogEntry};
use crate::tenant::account;
use engram_remote::RemoteKv;

/// A conversation kept across requests.
pub struct Session {
    pub id: String,
    pub owner: String,
    /// The text the tokens came from (rendered prompt + generated text). Empty for a
    /// session whose prompt came as token ids: their text is unknown, so a text request
    /// never reuses its tokens (see [`SessionStore::checkout`]); token requests still do.
    pub text: String,
    pub tokens: Vec<u32>,
    /// Byte end of each token's text in `text` (non-decreasing; specials that
    /// render no text end where the previous token ends).
    pub token_ends: Vec<usize>,
    pub kv: SeqKv,
    pub last_used: u64,
}

/// Sessions of every owner plus the shared prefix index (chains salted per owner
/// unless shared across tenants), for one model and pool.
pub struct SessionStore {
    pool: KvPool,
    sessions: HashMap<(String, String), Session>,
    index: PrefixIndex,
    clock: u64,
    next_id: u64,
    max_sessions: usize,
    /// The disk tier: sessions are saved after each turn and restored on demand.
    disk: Option<PersistedSessions>,
    /// Persisted sessions not in RAM, by (owner, id).
    on_disk: HashMap<(String, String), CatalogEntry>,
    vocab: usize,
    restored: u64,
    /// Shared prefix chains on disk, written or known.
    prefixes_on_disk: Vec<PrefixCatalogEntry>,
    /// Whether prefix chains are shared by every owner (unsalted) instead of salted per owner.
    share_prefixes_across_tenants: bool,
    /// Owners whose sessions are pinned on disk when saved (named agents).
    pinned_owners: HashSet<String>,
    /// The remote tier a fleet shares: sessions saved there behind the disk, looked up there
    /// on a local miss.
    remote: Option<RemoteKv>,
    /// The model's sliding layers: caches release those layers' rows outside the window
    /// (`engram_kv::SlidingLayers`), keeping the window before each resume point.
    sliding: Option<SlidingLayers>,
    /// Most prompt tokens the engine writes in one step (sizing a sliding model's prompts).
    prefill_step: usize,
    /// Whether caches of a sliding model keep the windows before the spaced points too.
    spaced_windows: bool,
}

/// Bytes of a request's text that the local tiers must leave uncovered before the remote tier
/// is asked for more: a few characters are cheaper to prefill than a round trip.
const REMOTE_MIN_GAIN: usize = 64;

/// The longest common prefix of `a` and `b`, in bytes, on a char boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !a.is_char_boundary(n) || !b.is_char_boundary(n) {
        n -= 1;
    }
    n
}

impl SessionStore {
    /// A store whose caches are charged to `pool`, for the model with
    /// `fingerprint` (combined here with the KV format: a format change is a miss).
    pub fn new(pool: KvPool, fingerprint: Fingerprint) -> SessionStore {
        let fp = engram_kv::cache_key(fingerprint, pool.format());
        SessionStore {
            pool,
            sessions: HashMap::new(),
            index: PrefixIndex::new(fp),
            clock: 0,
            next_id: 0,
            max_sessions: usize::MAX,
            disk: None,
            on_disk: HashMap::new(),
            vocab: usize::MAX,
            restored: 0,
            prefixes_on_disk: Vec::new(),
            share_prefixes_across_tenants: false,
            pinned_owners: HashSet::new(),
            remote: None,
            sliding: None,
            prefill_step: crate::DEFAULT_PREFILL_STEP,
            spaced_windows: true,
        }
    }

    /// Caches of a model with sliding layers `sliding` hold only the window of those layers
    /// (plus the window before every turn's start, where a later request may resume), instead
    /// of their whole history; `None` (every layer global) changes nothing. Reuse stays exact:
    /// a request resumes only where the window before it is whole ([`SeqKv::resumable`]).
    pub fn with_sliding(mut self, sliding: Option<SlidingLayers>) -> SessionStore {
        self.sliding = sliding;
        self
    }

    /// `true` (the default): caches of a sliding model also keep the windows before spaced
    /// block boundaries ([`SeqKv::keep_spaced_windows`]), so a request that edits an earlier
    /// turn resumes near the edit, for at most `3·log2(len / spacing)` more windows of those
    /// layers' rows; `false`: only the windows before the last turns' points (an edit before
    /// them recomputes from further back, at worst from the start).
    pub fn with_spaced_windows(mut self, on: bool) -> SessionStore {
        self.spaced_windows = on;
        self
    }

    /// The engine writes at most `tokens` prompt tokens a step (its prefill chunk): what
    /// [`SessionStore::bytes_for`] sizes a prompt of a sliding model by. Default
    /// [`crate::DEFAULT_PREFILL_STEP`].
    pub fn with_prefill_step(mut self, tokens: usize) -> SessionStore {
        self.prefill_step = tokens.max(1);
        self
    }

    /// The most pool bytes a cache of this store with `tokens` tokens takes while its last
    /// `step` of them are written (0: at rest): every layer of every token
    /// ([`KvPool::bytes_for`]), or with sliding layers what a checkout keeps
    /// ([`SlidingLayers::bytes_held`] with the spaced windows, plus a resume window for each of
    /// the [`engram_kv::MAX_RESUME_POINTS`] turn points, whose positions are not known here).
    /// What admission, remote restores and budgets ask room for.
    pub fn bytes_for(&self, tokens: usize, step: usize) -> usize {
        match &self.sliding {
            None => self.pool.bytes_for(tokens),
            Some(g) => {
                let turn_points = engram_kv::MAX_RESUME_POINTS * g.resume_window_bytes(&self.pool);
                let held = g.bytes_held(&self.pool, tokens, step, &[], self.spaced_windows) + turn_points;
                held.min(self.pool.bytes_for(tokens))
            }
        }
    }

    /// The most pool bytes admitting a prompt of `tokens` tokens takes, prefilled in the
    /// engine's steps ([`SessionStore::with_prefill_step`]); `None` where that is the pool's
    /// [`KvPool::bytes_for`] (every layer global).
    pub fn admission_bytes(&self, tokens: usize) -> Option<usize> {
        self.sliding.as_ref().map(|_| self.bytes_for(tokens, self.prefill_step))
    }

    /// A checkout's cache made ready for a request of `prompt_len` tokens: cut back to where it
    /// can resume exactly (the window before that point whole), releasing by the sliding
    /// geometry, with the windows before its start and before the prompt's end kept (resume
    /// points: the next request may edit this message, or render this answer otherwise than
    /// it was sampled — templates often do — and diverge right after the prompt).
    fn resume(&self, mut kv: SeqKv, prompt_len: usize) -> SeqKv {
        let Some(g) = &self.sliding else { return kv };
        let n = kv.resumable(kv.len());
        kv.truncate(n);
        kv.release_sliding(g.clone());
        if self.spaced_windows {
            kv.keep_spaced_windows();
        }
        kv.keep_window_at(n);
        kv.keep_window_at(prompt_len.max(n));
        kv
    }

    /// `true`: every owner's lookups reuse every owner's prefix blocks (one unsalted chain
    /// space, as earlier versions did). Default `false`: chains are salted per owner, so an owner
    /// never reuses blocks another computed — reuse would reveal, through `cached_tokens` and
    /// time to first token, that another tenant sent the same text. Persisted chains keep
    /// their salt, so a restart changes neither.
    pub fn with_shared_prefixes_across_tenants(mut self, share: bool) -> SessionStore {
        self.share_prefixes_across_tenants = share;
        self
    }

    /// The salt `owner`'s prefix chains are hashed under (`None`: shared by all).
    fn salt<'a>(&self, owner: &'a str) -> Option<&'a str> {
        (!self.share_prefixes_across_tenants).then_some(owner)
    }

    /// Adds the disk tier: every checked-in session is saved in the
    /// background, sessions evicted from RAM stay findable, and sessions a
    /// previous process saved are restored when a request matches them.
    /// `vocab` bounds token ids read back from files.
    pub fn with_disk(mut self, disk: PersistedSessions, vocab: usize) -> SessionStore {
        for e in disk.catalog() {
            self.on_disk.insert((e.owner.clone(), e.session_id.clone()), e);
        }
        self.prefixes_on_disk = disk.prefix_catalog();
        self.disk = Some(disk);
        self.vocab = vocab;
        self
    }

    /// Adds the remote tier: every checked-in session is also saved there (behind the caller,
    /// after the disk), and a request whose owner has no session here that it continues, or
    /// whose prompt starts with a chain the RAM index and disk lack, looks there before
    /// recomputing. Token-id requests use the local tiers only.
    pub fn with_remote(mut self, remote: RemoteKv) -> SessionStore {
        self.remote = Some(remote);
        self
    }

    /// Sessions restored from disk (or the remote tier) so far.
    pub fn restored_count(&self) -> u64 {
        self.restored
    }

    /// Sessions known on disk but not loaded.
    pub fn on_disk_count(&self) -> usize {
        self.on_disk.len()
    }

    /// Saves the disk tier dropped unwritten to free RAM (0 without one).
    pub fn saves_shed(&self) -> u64 {
        self.disk.as_ref().map_or(0, |d| d.saves_shed())
    }

    /// The disk tier's store, shared with policies that keep their own files in it under the
    /// same budget and tenant shares (`None`: no disk tier).
    pub fn disk_store(&self) -> Option<std::sync::Arc<std::sync::Mutex<engram_kv::DiskStore>>> {
        self.disk.as_ref().map(PersistedSessions::shared_store)
    }

    /// Bytes the disk tier holds (0 without one).
    pub fn disk_used_bytes(&self) -> u64 {
        self.disk.as_ref().map_or(0, |d| d.used_bytes())
    }

    /// Waits until every session checked in so far is on disk (and has been tried on the
    /// remote tier).
    pub fn flush(&self) {
        if let Some(d) = &self.disk {
            d.flush();
        }
        if let Some(r) = &self.remote {
            r.tier().flush();
        }
    }

    /// Loads the persisted session that matches `text` best for `owner` if it
    /// beats every session in RAM; its checksum is still running.
    fn restore_best(&mut self, owner: &str, session_id: Option<&str>, text: &str) -> Option<PendingRestore> {
        if self.disk.is_none() || self.on_disk.is_empty() {
            return None;
        }
        let in_ram = self.sessions.values().filter(|s| s.owner == owner).map(|s| common_prefix(&s.text, text)).max().unwrap_or(0);
        let pick = match session_id {
            Some(id) if !self.sessions.contains_key(&(owner.to_string(), id.to_string())) => {
                self.on_disk.get(&(owner.to_string(), id.to_string())).cloned()
            }
            Some(_) => None,
            None => self
                .on_disk
                .values()
                .filter(|e| e.owner == owner && common_prefix(&e.text, text) > in_ram)
                .max_by_key(|e| common_prefix(&e.text, text))
                .cloned(),
        }?;
        // Room first: idle prefix blocks and sessions go (offloaded) before a
        // restore is refused by the budget. What stays short is a refusal below, kept restorable.
        // What the entry holds, as its file says: a released block counts its global layers only.
        self.make_room(pick.ram_bytes);
        let _span = tracing::debug_span!("restore", owner = %pick.owner, session = %pick.session_id, tokens = pick.tokens).entered();
        let disk = self.disk.as_ref().expect("checked above");
        let key = (pick.owner.clone(), pick.session_id.clone());
        let (meta, mut kv, check) = match disk.load_unverified(&pick.owner, &pick.session_id, &self.pool, self.vocab) {
            Ok(Some(found)) => found,
            // The RAM budget refused it for now: the file is sound and stays restorable.
            Err(engram_kv::DiskError::Persist(engram_kv::PersistError::Kv { .. })) => return None,
            // Gone, damaged or foreign: forget it.
            Ok(None) | Err(_) => {
                self.on_disk.remove(&key);
                return None;
            }
        };
        self.on_disk.remove(&key);
        let n = kv.len().min(meta.tokens.len());
        kv.truncate(n);
        let mut tokens = meta.tokens;
        tokens.truncate(n);
        let mut token_ends: Vec<usize> = meta.offsets.iter().map(|o| o.1).collect();
        token_ends.resize(n, meta.text.len());
        let session = Session { id: pick.session_id, owner: pick.owner, text: meta.text, tokens, token_ends, kv, last_used: self.clock };
        Some(SessionRestore::pending(session, check))
    }

    /// When the local tiers cover less of `text` than the remote tier may, loads `owner`'s
    /// session from there into RAM (verified as it is read), replacing an older copy here: the
    /// named one, else (no name) the owner's session sharing the most text with `text`. Asked
    /// only when more than [`REMOTE_MIN_GAIN`] bytes of `text` are not covered by a session here
    /// (another replica may have continued the conversation since), and used only if it covers
    /// more. Only the tokens whose text is shared are fetched. Nothing happens without a tier.
    fn restore_remote(&mut self, owner: &str, session_id: Option<&str>, text: &str) {
        let Some(remote) = self.remote.clone() else { return };
        let key = |id: &str| (owner.to_string(), id.to_string());
        let covered = |t: &str| if t.is_empty() { 0 } else { common_prefix(t, text) };
        let local = match session_id {
            Some(id) => {
                let k = key(id);
                self.sessions.get(&k).map(|s| covered(&s.text)).max(self.on_disk.get(&k).map(|e| covered(&e.text))).unwrap_or(0)
            }
            None => self.sessions.values().filter(|s| s.owner == owner).map(|s| covered(&s.text)).max().unwrap_or(0),
        };
        if text.len() <= local + REMOTE_MIN_GAIN {
            return;
        }
        let tenant = Some(account(owner));
        let Some(m) = remote.find_manifest(tenant, owner, session_id, text) else { return };
        let c = common_prefix(&m.text, text);
        if c <= local {
            return; // Nothing there beyond what is here.
        }
        let upto = m.token_ends.iter().take_while(|&&e| e <= c).count();
        if upto == 0 {
            return;
        }
        self.make_room(self.bytes_for(upto, 0));
        let _span = tracing::debug_span!("restore_remote", owner, session = %m.session_id, tokens = upto).entered();
        let Some(kv) = remote.fetch_kv(tenant, m.salt.as_deref(), &m.tokens, upto, &self.pool, self.vocab) else { return };
        let n = kv.len();
        let mut m = m;
        if n < m.tokens.len() {
            // Fewer tokens than the manifest's: the session's text ends where its last one does
            // (token ends lie on char boundaries: the manifest was checked).
            m.text.truncate(m.token_ends[n - 1]);
        }
        m.tokens.truncate(n);
        m.token_ends.truncate(n);
        self.restored += 1;
        let s = Session {
            id: m.session_id.clone(),
            owner: owner.to_string(),
            text: m.text,
            tokens: m.tokens,
            token_ends: m.token_ends,
            kv,
            last_used: self.clock,
        };
        self.sessions.insert(key(&s.id), s);
        while self.sessions.len() > self.max_sessions && self.evict_session() {}
    }

    /// Loads the longest chain of whole runs `ids` starts with from the remote tier into the
    /// prefix index, if it beats the `reused` tokens the local tiers gave; true if one was loaded.
    fn restore_remote_prefix(&mut self, owner: &str, ids: &[u32], reused: usize) -> bool {
        let Some(remote) = self.remote.clone() else { return false };
        let salt = self.salt(owner);
        let run = remote.tier().config().run_tokens;
        if ids.len() / run * run <= reused {
            return false;
        }
        self.make_room(self.bytes_for(ids.len() / run * run, 0));
        match remote.fetch_prefix(Some(account(owner)), salt, ids, reused, &self.pool, self.vocab) {
            Some(kv) => {
                self.index.insert(salt, &ids[..kv.len()], &kv);
                true
            }
            None => false,
        }
    }

    /// Waits for a restored session's checksum. True: the file was sound, the
    /// session joins the store (unless the request already replaced it) and
    /// what was computed from its cache stands. False: the file was corrupt
    /// and is deleted; the caller discards what it computed from the cache.
    pub fn verify_restore(&mut self, p: PendingRestore) -> bool {
        // Another policy's restore is not the store's to keep, delete or vouch for.
        let Ok(SessionRestore { session, check }) = p.into_inner::<SessionRestore>() else { return false };
        match check.wait() {
            Ok(()) => {
                self.restored += 1;
                let key = (session.owner.clone(), session.id.clone());
                self.sessions.entry(key).or_insert(*session);
                true
            }
            Err(e) => {
                if let Some(d) = &self.disk {
                    d.drop_corrupt(&session.owner, &session.id, &e);
                }
                false
            }
        }
    }

    /// Keeps at most `n` sessions (least recently used dropped first).
    pub fn with_max_sessions(mut self, n: usize) -> SessionStore {
        self.max_sessions = n.max(1);
        self
    }

    /// Number of sessions held.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }
    /// True when no session is held.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// A new session id: `sess-` and 24 random hex digits. Random, not from a counter or
    /// the store's clock, which would tell a tenant how much other tenants did.
    fn fresh_id(&mut self) -> String {
        let mut b = [0u8; 12];
        if getrandom::fill(&mut b).is_err() {
            // No OS randomness: unique still (a counter mixed into the clock), not secret.
            self.next_id += 1;
            b[..8].copy_from_slice(&blake3::hash(&[self.clock.to_le_bytes(), self.next_id.to_le_bytes()].concat()).as_bytes()[..8]);
        }
        format!("sess-{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>())
    }

    /// Drops the least recently used session from RAM; false if there was none. With a disk
    /// tier it is offloaded, not forgotten (restorable on a later match). Its blocks return
    /// to the pool once nothing else shares them.
    fn evict_session(&mut self) -> bool {
        let Some(key) = self.sessions.iter().min_by_key(|(_, s)| s.last_used).map(|(k, _)| k.clone()) else {
            return false;
        };
        let s = self.sessions.remove(&key).expect("key from the map");
        if self.disk.is_some() {
            let disk_id = crate::disk_id::session_disk_id(&s.owner, &s.id);
            let (tokens, ram_bytes) = (s.kv.len(), s.kv.num_bytes());
            self.on_disk.insert(key, CatalogEntry { owner: s.owner, session_id: s.id, disk_id, text: s.text, tokens, ram_bytes });
        }
        true
    }

    /// Pins `owner`'s sessions on disk from their next save on (a named
    /// agent's: never evicted by the disk policy, only by deleting the owner
    /// through [`SessionStore::forget_owner`], which also unpins). A pinned
    /// save that would take pinned entries past the disk budget is not
    /// written (a warning in the log; the RAM copy is unaffected).
    pub fn pin_owner(&mut self, owner: &str) {
        if !self.pinned_owners.contains(owner) {
            self.pinned_owners.insert(owner.to_string());
        }
    }

    /// Drops every session of `owner`, in RAM and on disk (the files are
    /// deleted by the writer thread, after any save of them already queued).
    /// Blocks they share with the prefix index stay there until evicted (under
    /// the owner's salt, unreachable by other owners unless prefixes are shared
    /// across tenants).
    pub fn forget_owner(&mut self, owner: &str) {
        self.pinned_owners.remove(owner);
        let mine = |(o, _): &(String, String)| o == owner;
        let ids: Vec<String> = self.sessions.keys().chain(self.on_disk.keys()).filter(|k| mine(k)).map(|(_, id)| id.clone()).collect();
        self.sessions.retain(|k, _| !mine(k));
        self.on_disk.retain(|k, _| !mine(k));
        if let Some(d) = &self.disk {
            for id in ids {
                d.remove(owner, &id);
            }
        }
        if let Some(r) = &self.remote {
            r.forget_owner(Some(account(owner)), owner);
        }
    }

    /// Like [`SessionStore::checkout`] for a request that arrives as token
    /// ids (no text): matched by the longest common token prefix.
    pub fn checkout_tokens(&mut self, owner: &str, session_id: Option<&str>, prompt: &[u32]) -> Checkout {
        self.clock += 1;
        let common = |s: &Session| s.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(s.kv.len());
        let candidate = match session_id {
            Some(id) => self.sessions.get(&(owner.to_string(), id.to_string())),
            None => self.sessions.values().filter(|s| s.owner == owner).max_by_key(|s| (common(s), s.last_used)),
        };
        let found = candidate.map(|s| (s.id.clone(), common(s), s.tokens.len(), s.kv.fork(common(s))));
        let found = found.map(|(id, c, len, kv)| {
            let kv = self.resume(kv, prompt.len());
            (id, c, len, kv)
        });
        let (kind, id, k, kv) = match found {
            Some((id, c, len, kv)) if kv.len() > 0 => {
                // How the tokens relate (which session the request continues), then what the
                // reuse is once a resume point cut it back.
                let kind = if c == prompt.len() && c == len {
                    MatchKind::Exact
                } else if c == len {
                    MatchKind::Extend
                } else {
                    MatchKind::Diverge
                };
                let id = if session_id.is_none() && kind == MatchKind::Diverge { self.fresh_id() } else { id };
                (cut_kind(kind, c, kv.len()), id, kv.len(), kv)
            }
            _ => {
                let salt = self.salt(owner);
                let kv = self.index.lookup(&self.pool, salt, prompt);
                let kv = self.resume(kv, prompt.len());
                let k = kv.len();
                let id = session_id.map(str::to_string).unwrap_or_else(|| self.fresh_id());
                (if k > 0 { MatchKind::Prefix } else { MatchKind::Miss }, id, k, kv)
            }
        };
        Checkout::own(id, kind, prompt.to_vec(), vec![0; prompt.len()], k, kv)
    }

    /// The pool caches are charged to.
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }
    /// The shared prefix index.
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }
    /// Sessions of `owner`.
    pub fn sessions_of<'a>(&'a self, owner: &'a str) -> impl Iterator<Item = &'a Session> + 'a {
        self.sessions.values().filter(move |s| s.owner == owner)
    }
    /// Removes a session; true if it existed.
    pub fn remove(&mut self, owner: &str, id: &str) -> bool {
        self.sessions.remove(&(owner.to_string(), id.to_string())).is_some()
    }

    /// Finds what `owner` can reuse for `text`: the named session if given,
    /// else the owner's session sharing the most characters, else the prefix
    /// index. `add_special` is how a cold request would tokenize `text`
    /// (true for raw prompts, false for rendered chat templates).
    ///
    /// A session without text (its prompt came as token ids) vouches for none of
    /// its tokens: matched by characters, its empty text would make every token
    /// "end inside the common part" and the request would EXTEND tokens the text
    /// never produced. It is not reused (the prefix index still is, by token ids).
    /// NOTE: detokenizing the ids would not be exact either: `encode(decode(ids))`
    /// need not be `ids` (specials, BOS, non-canonical splits, byte fallback).
    pub fn checkout(
        &mut self,
        owner: &str,
        session_id: Option<&str>,
        text: &str,
        add_special: bool,
        tok: &Tokenizer,
    ) -> Result<Checkout, TokenizerError> {
        self.clock += 1;
        // The text's own tokenization: what a cold request computes, and what any reuse must
        // agree with (see below).
        let enc = tok.encode(text, add_special)?;
        let mut token_ends: Vec<usize> = enc.offsets.iter().map(|o| o.1).collect();
        fix_ends(&mut token_ends, 0);
        let mut restore = self.restore_best(owner, session_id, text);
        if restore.is_none() {
            self.restore_remote(owner, session_id, text);
        }
        let candidate = match (&restore, session_id) {
            (Some(p), _) => SessionRestore::session_of(p),
            (None, Some(id)) => self.sessions.get(&(owner.to_string(), id.to_string())),
            (None, None) => self
                .sessions
                .values()
                .filter(|s| s.owner == owner && !s.text.is_empty())
                .max_by_key(|s| (common_prefix(&s.text, text), s.last_used)),
        };
        // Only a session with text vouches for its tokens' text (see the doc above).
        let candidate = candidate.filter(|s| !s.text.is_empty());
        // An unnamed request continues a session only if it extends it; one that
        // diverges forks a new session, leaving the original to its owner.
        let continues = |s: &Session| common_prefix(&s.text, text) == s.text.len();
        let matched_id = candidate.filter(|s| session_id.is_some() || continues(s)).map(|s| s.id.clone());
        let candidate = candidate.map(|s| (s.text.clone(), s.token_ends.clone(), s.tokens.clone(), s.kv.fork(s.kv.len())));
        let session_id = match (session_id, matched_id) {
            (Some(id), _) => id.to_string(),
            (None, Some(id)) => id,
            _ => self.fresh_id(),
        };
        if let Some((s_text, s_ends, s_tokens, s_kv)) = candidate {
            let s = Session {
                id: String::new(),
                owner: String::new(),
                text: s_text,
                tokens: s_tokens,
                token_ends: s_ends,
                kv: s_kv,
                last_used: 0,
            };
            let c = common_prefix(&s.text, text);
            // Tokens whose text ends inside the common part, then of those the run that the
            // text's own tokenization starts with: what a cold request computes. (Tokenizing
            // only the text after the boundary is not the same: a merge may cross it, as
            // " 1" + "0" into " 10" does, and the answer would differ from a cold one.)
            let by_text = s.token_ends.iter().take_while(|&&e| e <= c).count();
            let k = s.tokens[..by_text].iter().zip(&enc.ids).take_while(|(a, b)| a == b).count();
            if k > 0 {
                let kind = if s.text == text {
                    MatchKind::Exact
                } else if c == s.text.len() {
                    MatchKind::Extend
                } else {
                    MatchKind::Diverge
                };
                let kv = self.resume(s.kv.fork(k), enc.ids.len());
                let kind = cut_kind(kind, k, kv.len());
                let k = kv.len();
                return Ok(Checkout { restore, ..Checkout::own(session_id, kind, enc.ids, token_ends, k, kv) });
            }
        }
        if let Some(p) = restore.take() {
            // Restored but not reusable for this text: keep it if it is sound.
            self.verify_restore(p);
        }
        let salt = self.salt(owner);
        let mut kv = self.index.lookup(&self.pool, salt, &enc.ids);
        if self.restore_prefix(salt, &enc.ids, kv.len()) {
            kv = self.index.lookup(&self.pool, salt, &enc.ids);
        }
        if self.restore_remote_prefix(owner, &enc.ids, kv.len()) {
            kv = self.index.lookup(&self.pool, salt, &enc.ids);
        }
        let kv = self.resume(kv, enc.ids.len());
        let reused = kv.len();
        self.persist_prefix(salt, &enc.ids, &kv);
        let kind = if reused > 0 { MatchKind::Prefix } else { MatchKind::Miss };
        Ok(Checkout::own(session_id, kind, enc.ids, token_ends, reused, kv))
    }

    /// Loads the longest persisted prefix chain under `salt` that `ids` starts
    /// with, if it beats the `reused` tokens the RAM index gave; true if one was loaded.
    fn restore_prefix(&mut self, salt: Option<&str>, ids: &[u32], reused: usize) -> bool {
        let Some(disk) = &self.disk else { return false };
        let best = self
            .prefixes_on_disk
            .iter()
            .filter(|e| e.salt.as_deref() == salt && e.tokens.len() > reused && ids.starts_with(&e.tokens))
            .max_by_key(|e| e.tokens.len())
            .map(|e| e.disk_id.clone());
        let Some(id) = best else { return false };
        match disk.load_prefix(&id, salt, &self.pool, self.vocab) {
            Some((meta, kv)) => {
                self.index.insert(salt, &meta.tokens[..kv.len()], &kv);
                true
            }
            None => {
                self.prefixes_on_disk.retain(|e| e.disk_id != id);
                false
            }
        }
    }

    /// A chain the index just shared is evidently common (a system prompt):
    /// persist it as a shared prefix entry under its `salt`, once (the id hashes the
    /// salt with the tokens, so each salt has its own entry).
    fn persist_prefix(&mut self, salt: Option<&str>, ids: &[u32], kv: &SeqKv) {
        let n = kv.len();
        let Some(disk) = &self.disk else { return };
        if n == 0 {
            return;
        }
        let id = disk.prefix_id(salt, &ids[..n]);
        if self.prefixes_on_disk.iter().any(|e| e.disk_id == id) {
            return;
        }
        disk.save_prefix(salt, &ids[..n], kv.fork(n));
        let salt = salt.map(str::to_string);
        self.prefixes_on_disk.push(PrefixCatalogEntry { disk_id: id, salt, tokens: ids[..n].to_vec() });
    }

    /// Stores (or replaces) a session after a request, and indexes its full
    /// blocks for sharing. `tokens`/`token_ends` describe `text`; tokens whose
    /// text ends past `text` (cut by a stop string) are dropped from the cache, and
    /// so are tokens from the first one at a moved position on (`SeqKv::move_slots`).
    pub fn checkin(
        &mut self,
        owner: &str,
        session_id: &str,
        text: String,
        mut tokens: Vec<u32>,
        mut token_ends: Vec<usize>,
        mut kv: SeqKv,
    ) {
        self.clock += 1;
        // Tokens past a moved one are not what a prefill of the text computes: not kept.
        let keep = token_ends.iter().take_while(|&&e| e <= text.len()).count().min(kv.linear_prefix());
        tokens.truncate(keep);
        token_ends.truncate(keep);
        kv.truncate(keep);
        // The session's previous version lets go of its blocks first, so the index can swap
        // whole blocks for the released copies this one holds.
        self.sessions.remove(&(owner.to_string(), session_id.to_string()));
        kv.release_outside_window();
        let salt = self.salt(owner);
        self.index.insert(salt, &tokens, &kv);
        if tokens.is_empty() {
            self.sessions.remove(&(owner.to_string(), session_id.to_string()));
            return;
        }
        if let Some(d) = &self.disk {
            d.save(owner, session_id, &text, &tokens, &token_ends, kv.fork(kv.len()), self.pinned_owners.contains(owner));
        }
        if let Some(r) = &self.remote {
            r.save_session(Some(account(owner)), owner, session_id, salt, &text, &tokens, &token_ends, kv.fork(kv.len()));
        }
        self.on_disk.remove(&(owner.to_string(), session_id.to_string()));
        let s = Session { id: session_id.to_string(), owner: owner.to_string(), text, tokens, token_ends, kv, last_used: self.clock };
        self.sessions.insert((owner.to_string(), session_id.to_string()), s);
        while self.sessions.len() > self.max_sessions && self.evict_session() {}
    }

    /// Frees RAM until `bytes` more fit the pool's budget — the one RAM eviction path (the
    /// scheduler's reservations and tests alike): first idle prefix-index blocks (nobody
    /// shares them; a later request recomputes or restores them), least recently used first,
    /// then least recently used sessions (offloaded to the disk tier where there is one), each
    /// step only as much as still missing; last, saves the disk writer has not started yet
    /// (they hold their caches' blocks; shed, those sessions are recomputed if asked for
    /// again). Returns whether `bytes` now fit.
    pub fn make_room(&mut self, bytes: usize) -> bool {
        let missing = |p: &KvPool| (p.used() + bytes).saturating_sub(p.budget());
        let bb = self.pool.block_bytes();
        loop {
            let need = missing(&self.pool);
            if need == 0 {
                return true;
            }
            if self.index.evict(need, bb) >= need {
                continue;
            }
            if !self.evict_session() {
                if self.disk.as_ref().is_some_and(|d| d.shed_queued() > 0) {
                    continue;
                }
                if self.remote.as_ref().is_some_and(|r| r.tier().shed_queued() > 0) {
                    continue;
                }
                return missing(&self.pool) == 0;
            }
        }
    }
}

/// The kind of a match of `matched` tokens whose reuse a resume point cut back to `reused`
/// (`SeqKv::resumable`: a sliding layer's window before the match's end was released): the
/// same when nothing was cut; otherwise only part of the session is reused and the rest
/// recomputed, which is a DIVERGE (a MISS when nothing is left; a PREFIX stays one).
fn cut_kind(kind: MatchKind, matched: usize, reused: usize) -> MatchKind {
    match kind {
        _ if reused >= matched => kind,
        _ if reused == 0 => MatchKind::Miss,
        MatchKind::Prefix => MatchKind::Prefix,
        _ => MatchKind::Diverge,
    }
}

/// Token ends must be non-decreasing and at least `floor` (specials report (0, 0)).
fn fix_ends(ends: &mut [usize], floor: usize) {
    let mut m = floor;
    for e in ends.iter_mut() {
        m = m.max(*e);
        *e = m;
    }
}

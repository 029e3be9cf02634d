//! A long conversation's sparse state saved to a folder, so that a later process resumes the
//! next turn without re-prefilling: [`SparseKv::save_state`] and [`SparseKv::resume_state`].
//!
//! ```text
//!  DIR/state      envelope `engram-dynakv-state` v1 (`engram_kv::envelope`: length and BLAKE3
//!                 of the body), binary body, little-endian (`codec.rs`):
//!                   identity   model+format fingerprint, owner, the tokens stored
//!                   shape      layers, KV heads, head dim; method, budget, sinks, recent
//!                   per layer  tokens stored, first position in RAM, RAM tail (f16 K and V)
//!                   offloaded  sinks (f16 K and V), position → file row tables, the KV file's
//!                              name, its rows and the BLAKE3 of those rows
//!                   per head   the index's whole state and its last selection
//!  DIR/kv-<id>    the offload file (its own checked header: shape and the fingerprint of
//!                 model, sparse configuration and layout), a hard link of the live file
//!                 (a copy where the folder is on another file system)
//! ```
//!
//! A save is two steps (`save.rs`): [`SparseKv::snapshot_state`] takes the RAM part on the
//! caller's thread, [`StateSnapshot::write`] does the I/O wherever it runs.
//! A save writes the KV file first, under a new name, then replaces `state` atomically
//! (`engram_kv::persist::atomic_write`: temp file, fsync, rename, fsync of the folder), then
//! removes the older KV files: a crash leaves the old pair or the new one. The live file is
//! append-only after the prefill (the append layout: rows are never rewritten), so a linked file
//! that the running sequence keeps appending to still holds the saved rows unchanged; a resume
//! copies the saved file to a new live file of its own (the cache's drop removes only that),
//! cuts it back to the saved rows and checks their BLAKE3.
//!
//! Invariant: a resumed cache holds the same keys, values, index and file rows as the saved
//! one, so its next steps' logits equal the saved cache's bit for bit; a folder that is
//! missing, truncated, damaged, of another format version, another model, shape, sparse
//! configuration or owner is a [`StateError`] naming the file and what failed, never a panic
//! (the caller recomputes).

pub(crate) mod codec;
mod save;

pub use save::StateSnapshot;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use engram_kv::envelope::{self, EnvelopeError};
use engram_model::ModelConfig;
use half::f16;

use crate::offload::{self, FileSpec, Layout, OffloadConfig, OffloadFile, Offloaded};
use crate::shared::SharedIndex;
use crate::{Method, SparseConfig, SparseKv};
use codec::{Dec, Enc, Short};

/// The state file's envelope magic.
pub const MAGIC: &str = "engram-dynakv-state";
/// The state format this build writes and reads.
pub const VERSION: u32 = 1;
/// The state file's name in its folder.
pub const STATE_FILE: &str = "state";

/// Who a saved state belongs to and what it holds, besides the KV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateMeta {
    /// The model and KV format that made the KV (`engram_kv::persist::cache_fingerprint`).
    pub fingerprint: String,
    /// The session, agent or tenant the conversation belongs to.
    pub owner: String,
    /// One token id per stored position (what the next turn must extend).
    pub tokens: Vec<u32>,
}

/// Why a state could not be saved or resumed. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// No saved state at the path.
    #[error("{}: no saved sparse state", path.display())]
    NotFound { path: PathBuf },
    /// The file system failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Truncated, damaged or not a sparse state at all: drop it and recompute.
    #[error("{}: invalid sparse state: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    /// A sound state made by another model, shape, configuration, owner or format version.
    #[error("{}: sparse state has {what} {found}, expected {expected}", path.display())]
    Mismatch { path: PathBuf, what: &'static str, found: String, expected: String },
    /// This cache cannot be saved as it is (no index yet, a prefill under way, a failed read,
    /// the dual-head layout).
    #[error("{}: cannot save sparse state: {reason}", path.display())]
    Unsavable { path: PathBuf, reason: String },
}

impl StateError {
    /// True when the saved files themselves are bad (delete them and recompute).
    pub fn is_corrupt(&self) -> bool {
        matches!(self, StateError::Invalid { .. })
    }

    fn io(path: &Path, source: io::Error) -> StateError {
        match source.kind() {
            io::ErrorKind::NotFound => StateError::NotFound { path: path.to_path_buf() },
            io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => {
                StateError::Invalid { path: path.to_path_buf(), reason: source.to_string() }
            }
            _ => StateError::Io { path: path.to_path_buf(), source },
        }
    }
}

fn short(path: &Path) -> impl Fn(Short) -> StateError + '_ {
    move |s| StateError::Invalid { path: path.to_path_buf(), reason: format!("truncated or malformed body: {}", s.0) }
}

fn mismatch(path: &Path, what: &'static str, found: impl ToString, expected: impl ToString) -> StateError {
    StateError::Mismatch { path: path.to_path_buf(), what, found: found.to_string(), expected: expected.to_string() }
}

/// BLAKE3 of rows `0..rows` of `f`, read 4 MiB at a time.
fn rows_hash(f: &OffloadFile, rows: u64) -> io::Result<[u8; 32]> {
    rows_hash_with(f.spec().row_bytes(), rows, |at, buf| f.read_rows(at, buf))
}

/// BLAKE3 of rows `0..rows` of `row_bytes` bytes each, read through `read` (first row, buffer)
/// 4 MiB at a time.
fn rows_hash_with(row_bytes: usize, rows: u64, read: impl Fn(u64, &mut [u8]) -> io::Result<()>) -> io::Result<[u8; 32]> {
    let rb = row_bytes as u64;
    let per = ((4 << 20) / rb).max(1);
    let mut h = blake3::Hasher::new();
    let mut buf = Vec::new();
    let mut at = 0;
    while at < rows {
        let n = per.min(rows - at);
        buf.resize((n * rb) as usize, 0);
        read(at, &mut buf)?;
        h.update(&buf);
        at += n;
    }
    Ok(*h.finalize().as_bytes())
}

fn save_method(e: &mut Enc<'_>, m: Method) {
    e.str(m.name());
    let (a, b) = match m {
        Method::DynaKv { b_max, .. } => (b_max, 0),
        Method::Local { window, k } => (window, k),
        Method::Quest { page } => (page, 0),
        Method::Oracle | Method::Tokens | Method::Static | Method::Streaming => (0, 0),
    };
    e.len(a);
    e.len(b);
}

fn load_method(d: &mut Dec<'_>) -> Result<Method, Short> {
    let name = d.str("method")?;
    let (a, b) = (d.len("method parameter")?, d.len("method parameter")?);
    Ok(match Method::parse(&name).map_err(Short)? {
        Method::DynaKv { eager, .. } => Method::DynaKv { b_max: a, eager },
        Method::Local { .. } => Method::Local { window: a, k: b },
        Method::Quest { .. } => Method::Quest { page: a.max(1) },
        m => m,
    })
}

impl SparseKv {
    /// Resumes the state saved in `dir` for `model` under `cfg`, checked against `expect`'s
    /// fingerprint and owner (its tokens are not compared: the saved ones come back). An
    /// offloaded state needs `off` (its `dir` holds the live file, its `model_fingerprint`
    /// must be the saving one's; cache size, reader and prefetch may differ). Errors name what
    /// failed (module doc); on error nothing is left in `off.dir`.
    pub fn resume_state(
        dir: &Path,
        model: &ModelConfig,
        cfg: SparseConfig,
        expect: &StateMeta,
        off: Option<OffloadConfig>,
    ) -> Result<(SparseKv, StateMeta), StateError> {
        let state = dir.join(STATE_FILE);
        let bytes = std::fs::read(&state).map_err(|e| StateError::io(&state, e))?;
        let body = envelope::open(&bytes, MAGIC, VERSION).map_err(|e| match e {
            EnvelopeError::Version { found, reads } => mismatch(&state, "format version", found, format!("v{reads}")),
            EnvelopeError::NoHeader | EnvelopeError::Foreign { .. } => {
                StateError::Invalid { path: state.clone(), reason: format!("not a DynaKV state file ({e})") }
            }
            e => StateError::Invalid { path: state.clone(), reason: e.to_string() },
        })?;
        let bad = short(&state);
        let mut d = Dec::new(body);
        let meta = StateMeta { fingerprint: d.str("fingerprint").map_err(&bad)?, owner: d.str("owner").map_err(&bad)?, tokens: Vec::new() };
        if meta.fingerprint != expect.fingerprint {
            return Err(mismatch(&state, "model fingerprint", &meta.fingerprint, &expect.fingerprint));
        }
        if meta.owner != expect.owner {
            return Err(mismatch(&state, "owner", format!("{:?}", meta.owner), format!("{:?}", expect.owner)));
        }
        let mut kv = SparseKv::decode(&mut d, &state, model, cfg, off)?;
        kv.1.fingerprint = meta.fingerprint;
        kv.1.owner = meta.owner;
        Ok(kv)
    }

    /// The rest of [`SparseKv::resume_state`]: the body after the identity.
    fn decode(
        d: &mut Dec<'_>,
        state: &Path,
        model: &ModelConfig,
        cfg: SparseConfig,
        off: Option<OffloadConfig>,
    ) -> Result<(SparseKv, StateMeta), StateError> {
        let bad = short(state);
        let invalid = |reason: &str| StateError::Invalid { path: state.to_path_buf(), reason: reason.to_string() };
        let tokens = d.u32s("tokens").map_err(&bad)?;
        let shape = [d.len("layers").map_err(&bad)?, d.len("KV heads").map_err(&bad)?, d.len("head dim").map_err(&bad)?];
        let want = [model.num_layers, model.num_kv_heads, model.head_dim];
        if shape != want {
            return Err(mismatch(state, "shape (layers, KV heads, head dim)", format!("{shape:?}"), format!("{want:?}")));
        }
        let method = load_method(d).map_err(&bad)?;
        let saved = SparseConfig {
            method,
            budget: d.len("budget").map_err(&bad)?,
            sinks: d.len("sinks").map_err(&bad)?,
            recent: d.len("recent").map_err(&bad)?,
        };
        if saved != cfg {
            return Err(mismatch(state, "sparse configuration", format!("{saved:?}"), format!("{cfg:?}")));
        }
        let [layers, heads, dim] = shape;
        let mut kv = SparseKv::with_shape(layers, heads, dim, Some(cfg));
        kv.lens = d.lens("lengths").map_err(&bad)?;
        kv.origin = d.lens("origins").map_err(&bad)?;
        if kv.lens.len() != layers || kv.origin.len() != layers || (0..layers).any(|l| kv.origin[l] > kv.lens[l]) {
            return Err(invalid("per-layer lengths do not match the shape"));
        }
        if kv.len() != tokens.len() || kv.lens.iter().any(|&n| n != tokens.len()) {
            return Err(invalid("the layers' lengths differ from the tokens stored"));
        }
        let cap = (0..layers).map(|l| kv.lens[l] - kv.origin[l]).max().unwrap_or(0).max(1);
        kv.cap = cap;
        for l in 0..layers {
            let held = kv.lens[l] - kv.origin[l];
            let (mut k, mut v) = (vec![f16::ZERO; heads * cap * dim], vec![f16::ZERO; heads * cap * dim]);
            for h in 0..heads {
                for (buf, what) in [(&mut k, "tail keys"), (&mut v, "tail values")] {
                    let rows = d.f16s(what).map_err(&bad)?;
                    if rows.len() != held * dim {
                        return Err(invalid("a RAM tail of the wrong length"));
                    }
                    buf[h * cap * dim..(h * cap + held) * dim].copy_from_slice(&rows);
                }
            }
            kv.keys[l] = k;
            kv.values[l] = v;
        }
        let offloaded = d.bool("offloaded").map_err(&bad)?;
        if !offloaded && kv.origin.iter().any(|&o| o > 0) {
            return Err(invalid("positions outside RAM without an offload file"));
        }
        let mut live = None;
        let result = (|| -> Result<(), StateError> {
            if offloaded {
                let off = off.ok_or_else(|| invalid("the state is offloaded: resuming it needs an offload directory"))?;
                let o = kv.attach_saved(d, state, off)?;
                live = Some(o.file.path().to_path_buf());
                kv.off = Some(o);
            }
            let mut index = Vec::with_capacity(layers * heads);
            for i in 0..layers * heads {
                let blob = d.bytes("index").map_err(&bad)?;
                let mut bd = Dec::new(blob);
                let idx = method.load_index(dim, kv.lens[i / heads], &mut bd).and_then(|x| bd.finish().map(|()| x)).map_err(&bad)?;
                let sel = d.u32s("last selection").map_err(&bad)?;
                index.push(Mutex::new((SharedIndex::new(idx), sel)));
            }
            d.finish().map_err(&bad)?;
            kv.index = index;
            kv.built = true;
            Ok(())
        })();
        if let Err(e) = result {
            drop(kv);
            if let Some(p) = live {
                let _ = std::fs::remove_file(p);
            }
            return Err(e);
        }
        kv.peak_ram = kv.ram_kv_bytes();
        Ok((kv, StateMeta { fingerprint: String::new(), owner: String::new(), tokens }))
    }

    /// The offloaded part of a saved state: sinks and row tables from `d`, the saved KV file
    /// linked under a new live name in `cfg.dir`, checked, cut back to the saved rows.
    fn attach_saved(&self, d: &mut Dec<'_>, state: &Path, cfg: OffloadConfig) -> Result<Box<Offloaded>, StateError> {
        let bad = short(state);
        let invalid = |reason: String| StateError::Invalid { path: state.to_path_buf(), reason };
        let (layers, heads, dim) = (self.layers, self.heads, self.dim);
        let scfg = self.cfg.expect("a sparse cache");
        let sinks = d.len("sinks").map_err(&bad)?;
        if sinks != scfg.sinks {
            return Err(invalid(format!("{sinks} sinks offloaded under a configuration of {}", scfg.sinks)));
        }
        let (mut sink_k, mut sink_v) = (Vec::with_capacity(layers), Vec::with_capacity(layers));
        for _ in 0..layers {
            for (buf, what) in [(&mut sink_k, "sink keys"), (&mut sink_v, "sink values")] {
                let s = d.f16s(what).map_err(&bad)?;
                if s.len() != heads * sinks * dim {
                    return Err(invalid("sinks of the wrong length".into()));
                }
                buf.push(s);
            }
        }
        let slots = (0..layers * heads).map(|_| d.u32s("row table")).collect::<Result<Vec<_>, _>>().map_err(&bad)?;
        let written = d.u64("bytes written").map_err(&bad)?;
        let model_fp = d.u64("model fingerprint").map_err(&bad)?;
        if model_fp != cfg.model_fingerprint {
            return Err(mismatch(
                state,
                "offload model fingerprint",
                format!("{model_fp:016x}"),
                format!("{:016x}", cfg.model_fingerprint),
            ));
        }
        let name = d.str("KV file name").map_err(&bad)?;
        if !name.starts_with("kv-") || name.contains(['/', '\\']) {
            return Err(invalid(format!("KV file name {name:?}")));
        }
        let rows = d.u64("KV rows").map_err(&bad)?;
        let sum: [u8; 32] = d.bytes("KV checksum").map_err(&bad)?.try_into().map_err(|_| invalid("KV checksum length".into()))?;
        for (hx, s) in slots.iter().enumerate() {
            let o = self.origin[hx / heads];
            if o > sinks && (s.len() < o || s[sinks..o].iter().any(|&r| r as u64 >= rows)) {
                return Err(invalid(format!("row table of head {hx} does not cover its offloaded positions")));
            }
        }
        let saved = state.with_file_name(&name);
        let spec = FileSpec {
            layers: layers as u32,
            heads: heads as u32,
            dim: dim as u32,
            fingerprint: offload::fingerprint(cfg.model_fingerprint, &scfg, layers, heads, dim, Layout::Append),
        };
        // A copy (`copy_file_range`: in the kernel, a reflink where the file system has them),
        // not a link: the resumed cache appends to its own file, whatever else still holds the
        // saved one (the saving sequence, a second resume).
        let live = offload::live_path(&cfg);
        let opened = (|| -> Result<Box<Offloaded>, StateError> {
            std::fs::metadata(&saved).map_err(|e| StateError::io(&saved, e))?;
            // Any failure now is the live side's (a missing offload directory, a full disk).
            std::fs::copy(&saved, &live).map_err(|e| StateError::Io { path: live.clone(), source: e })?;
            let mut f = OffloadFile::open_writable(&live, spec).map_err(|e| StateError::io(&saved, e))?;
            if f.rows() < rows {
                return Err(StateError::Invalid {
                    path: saved.clone(),
                    reason: format!("truncated: {} rows, the state names {rows}", f.rows()),
                });
            }
            f.truncate_rows(rows).map_err(|e| StateError::io(&live, e))?;
            if rows_hash(&f, rows).map_err(|e| StateError::io(&saved, e))? != sum {
                return Err(StateError::Invalid { path: saved.clone(), reason: "KV rows checksum mismatch (damaged)".into() });
            }
            let (shared, reader, prefetcher) = offload::readers(&cfg, &f).map_err(|e| StateError::io(&live, e))?;
            Ok(Box::new(Offloaded {
                shared,
                staging: (0..layers * heads).map(|_| Mutex::default()).collect(),
                prefetcher,
                reads_done: (0..layers).map(|_| AtomicUsize::new(0)).collect(),
                file: f,
                reader,
                row_bytes: spec.row_bytes(),
                sinks,
                sink_k,
                sink_v,
                slots: slots.into_iter().map(Arc::new).collect(),
                written,
                flush_failures: 0,
                regions: vec![Default::default(); layers * heads],
                in_place_rows: 0,
                elsewhere_rows: 0,
                slack_rows: 0,
                failed: Default::default(),
                failure: Mutex::new(None),
                stream: None,
                cfg,
            }))
        })();
        if opened.is_err() {
            let _ = std::fs::remove_file(&live);
        }
        opened
    }
}

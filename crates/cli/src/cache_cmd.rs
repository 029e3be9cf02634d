//! `engram cache`: list, inspect, pin, remove and garbage-collect the
//! persisted KV entries in `<data-dir>/kv` (an `engram_kv::DiskStore`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use engram_kv::{DiskStore, EntryStats, EvictionPolicy};
use serde_json::json;

/// Default disk budget of the KV store, in MiB.
pub const DEFAULT_DISK_BUDGET_MIB: u64 = 4096;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: CacheCommand,
    /// Where caches live (default: $ENGRAM_DATA_DIR or ~/.local/share/engram); the store is <data-dir>/kv.
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// Disk budget of the store in MiB.
    #[arg(long, global = true, default_value_t = DEFAULT_DISK_BUDGET_MIB)]
    disk_budget_mib: u64,
    /// Eviction policy used by gc: lru, lfu or weighted.
    #[arg(long, global = true, default_value = "weighted")]
    eviction: String,
}

#[derive(clap::Subcommand, Debug)]
enum CacheCommand {
    /// List entries: id, kind, owner, tokens, size, hits, age, pinned; totals against the budget.
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one entry's metadata, fingerprint, format and the start of its text.
    Inspect {
        id: String,
        /// Print JSON (with the whole text) instead of a summary.
        #[arg(long)]
        json: bool,
    },
    /// Delete one entry.
    Rm { id: String },
    /// Pin an entry so eviction never removes it.
    Pin { id: String },
    /// Unpin an entry.
    Unpin { id: String },
    /// Drop unreadable entries (checksums verified) and evict by policy until the store fits the budget.
    Gc,
}

/// The store directory for `--data-dir` (`<data>/kv`).
pub use crate::common::store_dir;

pub fn run(args: Args) -> Result<()> {
    // Even listing opens the store, which deletes interrupted writes: one process at a time.
    let _lock = crate::data_lock::lock_data_dir(&crate::common::data_dir(&args.data_dir), "cache")?;
    let dir = store_dir(&args.data_dir);
    let policy: EvictionPolicy = args.eviction.parse().map_err(anyhow::Error::msg)?;
    let budget = args.disk_budget_mib.checked_mul(1 << 20).context("--disk-budget-mib is too large")?;
    let mut store = DiskStore::open(&dir, budget, policy).with_context(|| format!("opening the KV store {}", dir.display()))?;
    if let CacheCommand::Inspect { id, .. } | CacheCommand::Rm { id } | CacheCommand::Pin { id } | CacheCommand::Unpin { id } =
        &args.command
    {
        engram_kv::disk::validate_id(id)?;
    }
    let unknown = |id: &str| anyhow::anyhow!("no cache entry with id {id:?} in {} (see `engram cache ls`)", dir.display());
    match args.command {
        CacheCommand::Ls { json } => ls(&store, json),
        CacheCommand::Inspect { id, json } => {
            if store.stats(&id).is_none() {
                return Err(unknown(&id));
            }
            inspect(&store, &id, json)
        }
        CacheCommand::Rm { id } => {
            if !store.remove_any(&id)? {
                return Err(unknown(&id));
            }
            println!("removed {id}");
            Ok(())
        }
        CacheCommand::Pin { id } | CacheCommand::Unpin { id } if store.stats(&id).is_none() => Err(unknown(&id)),
        CacheCommand::Pin { id } => Ok(store.pin(&id, true)?),
        CacheCommand::Unpin { id } => Ok(store.pin(&id, false)?),
        CacheCommand::Gc => {
            let r = store.gc()?;
            for id in &r.dropped {
                println!("dropped unreadable {id}");
            }
            for id in &r.evicted {
                println!("evicted {id} ({policy})");
            }
            println!(
                "freed {}; {} of {} budget in use",
                human_bytes(r.freed_bytes),
                human_bytes(r.used_bytes),
                human_bytes(r.budget_bytes)
            );
            Ok(())
        }
    }
}

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn ls(store: &DiskStore, as_json: bool) -> Result<()> {
    let entries = store.list();
    let (used, budget) = (store.used_bytes(), store.budget_bytes());
    if as_json {
        let list: Vec<_> = entries.iter().map(stats_json).collect();
        let out = json!({"dir": store.dir(), "used_bytes": used, "budget_bytes": budget, "entries": list});
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let now = now_unix();
    let owner_w = entries.iter().map(|e| e.owner.chars().count()).max().unwrap_or(0).clamp(5, 24);
    let id_w = entries.iter().map(|e| e.id.chars().count()).max().unwrap_or(0).clamp(2, 40);
    println!("{:<id_w$}  {:<7}  {:<owner_w$}  {:>8}  {:>10}  {:>6}  {:>6}  PINNED", "ID", "KIND", "OWNER", "TOKENS", "SIZE", "HITS", "AGE");
    for e in &entries {
        println!(
            "{:<id_w$}  {:<7}  {:<owner_w$}  {:>8}  {:>10}  {:>6}  {:>6}  {}",
            e.id,
            e.kind.name(),
            e.owner,
            e.num_tokens,
            human_bytes(e.bytes),
            e.hits,
            human_age(now.saturating_sub(e.created_unix)),
            if e.pinned { "yes" } else { "" }
        );
    }
    println!(
        "{} entries, {} of {} budget ({:.1}%) in {}",
        entries.len(),
        human_bytes(used),
        human_bytes(budget),
        if budget == 0 { 0.0 } else { used as f64 * 100.0 / budget as f64 },
        store.dir().display()
    );
    Ok(())
}

fn stats_json(e: &EntryStats) -> serde_json::Value {
    json!({
        "id": e.id, "kind": e.kind.name(), "owner": e.owner, "num_tokens": e.num_tokens, "bytes": e.bytes,
        "hits": e.hits, "created_unix": e.created_unix, "last_used_unix": e.last_used_unix, "pinned": e.pinned,
    })
}

fn inspect(store: &DiskStore, id: &str, as_json: bool) -> Result<()> {
    let info = store.inspect(id)?;
    let stats = store.stats(id).expect("checked by the caller");
    let m = &info.meta;
    if as_json {
        let mut v = stats_json(stats);
        let o = v.as_object_mut().expect("an object");
        o.insert("fingerprint".into(), json!(m.fingerprint));
        o.insert("kv_format".into(), json!(info.format.name()));
        o.insert("num_layers".into(), json!(info.layout.num_layers));
        o.insert("num_kv_heads".into(), json!(info.layout.num_kv_heads));
        o.insert("head_dim".into(), json!(info.layout.head_dim));
        o.insert("num_blocks".into(), json!(info.num_blocks));
        o.insert("block_bytes".into(), json!(info.block_bytes));
        o.insert("checksum".into(), json!(format!("{:016x}", info.checksum)));
        o.insert("tokens".into(), json!(m.tokens));
        o.insert("text".into(), json!(m.text));
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let now = now_unix();
    let head: String = m.text.chars().take(80).collect();
    let more = if m.text.chars().count() > 80 { "..." } else { "" };
    println!("id           {id}");
    println!("file         {}", store.entry_path(id)?.display());
    println!("kind         {}", m.kind);
    println!("owner        {}", if m.owner.is_empty() { "(shared)" } else { &m.owner });
    println!("fingerprint  {}", m.fingerprint);
    println!("kv format    {}", info.format);
    println!("layout       {} layers x {} KV heads x head_dim {}", info.layout.num_layers, info.layout.num_kv_heads, info.layout.head_dim);
    println!("tokens       {} in {} blocks of {}", info.num_tokens, info.num_blocks, human_bytes(info.block_bytes as u64));
    println!("size         {} ({} bytes)", human_bytes(info.file_bytes), info.file_bytes);
    println!("created      {} ago", human_age(now.saturating_sub(m.created_unix)));
    println!("last used    {} ago", human_age(now.saturating_sub(stats.last_used_unix)));
    println!("hits         {}", stats.hits);
    println!("pinned       {}", if stats.pinned { "yes" } else { "no" });
    println!("checksum     {:016x} (xxh3-64)", info.checksum);
    println!("text         \"{}\"{more}", head.escape_debug());
    Ok(())
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn human_age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engram_kv::{EntryKind, EntryMeta, KvFormat, KvLayout, KvPool, SeqKv};
    use engram_model::KvCache;

    fn args(data_dir: &std::path::Path, command: CacheCommand) -> Args {
        Args { command, data_dir: Some(data_dir.to_path_buf()), disk_budget_mib: 1, eviction: "lru".into() }
    }

    #[test]
    fn subcommands_on_a_real_store() {
        let data = std::env::temp_dir().join(format!("engram-cache-cmd-{}", std::process::id()));
        let pool = KvPool::new(KvLayout { num_layers: 2, num_kv_heads: 2, head_dim: 32 }, KvFormat::F16, 64 << 20);
        let mut store = DiskStore::open(store_dir(&Some(data.clone())), 1 << 30, EvictionPolicy::Lru).unwrap();
        for (i, n) in [40usize, 2500].into_iter().enumerate() {
            let mut kv = SeqKv::new(&pool);
            kv.reserve(n).unwrap();
            let x = vec![0.5f32; n * 64];
            for layer in 0..2 {
                kv.write(layer, 0, &x, &x, n);
            }
            let meta = EntryMeta {
                fingerprint: "0123456789abcdef-f16".into(),
                kind: EntryKind::Session,
                owner: format!("agent-{i}"),
                tokens: vec![1; n],
                text: "Hello, world!\n".repeat(n / 4),
                offsets: Vec::new(),
                created_unix: now_unix() - 3600,
            };
            store.put(&format!("s{i}"), &meta, &kv).unwrap();
        }
        drop(store);
        run(args(&data, CacheCommand::Ls { json: false })).unwrap();
        run(args(&data, CacheCommand::Ls { json: true })).unwrap();
        run(args(&data, CacheCommand::Inspect { id: "s1".into(), json: false })).unwrap();
        run(args(&data, CacheCommand::Pin { id: "s0".into() })).unwrap();
        assert!(run(args(&data, CacheCommand::Inspect { id: "nope".into(), json: false })).is_err());
        assert!(run(args(&data, CacheCommand::Rm { id: "../x".into() })).unwrap_err().to_string().contains("invalid"));
        // The 1 MiB budget keeps the pinned entry and evicts the other.
        run(args(&data, CacheCommand::Gc)).unwrap();
        let store = DiskStore::open(store_dir(&Some(data.clone())), 1 << 30, EvictionPolicy::Lru).unwrap();
        assert_eq!(store.list().iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["s0"]);
        run(args(&data, CacheCommand::Rm { id: "s0".into() })).unwrap();
        assert!(run(args(&data, CacheCommand::Rm { id: "s0".into() })).is_err());
        std::fs::remove_dir_all(&data).unwrap();
    }

    /// `engram cache ls` (and `gc`) leave an entry of another format
    /// version alone: a miss for this build, never deleted as corrupt.
    #[test]
    fn ls_and_gc_keep_an_entry_of_another_version() {
        let data = tempfile::tempdir().unwrap();
        let pool = KvPool::new(KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 32 }, KvFormat::F16, 64 << 20);
        let mut kv = SeqKv::new(&pool);
        kv.reserve(8).unwrap();
        kv.write(0, 0, &[0.25; 8 * 32], &[0.5; 8 * 32], 8);
        let meta = EntryMeta {
            fingerprint: "0123456789abcdef-f16".into(),
            kind: EntryKind::Session,
            owner: "a/s".into(),
            tokens: vec![1; 8],
            text: String::new(),
            offsets: Vec::new(),
            created_unix: now_unix(),
        };
        let dir = store_dir(&Some(data.path().to_path_buf()));
        DiskStore::open(&dir, 1 << 30, EvictionPolicy::Lru).unwrap().put("v3", &meta, &kv).unwrap();
        let path = dir.join("v3.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let at = bytes.windows(13).position(|w| w == br#""version":"2""#).unwrap();
        let mut newer = bytes.clone();
        newer[at + 11] = b'3';
        std::fs::write(&path, &newer).unwrap();
        run(args(data.path(), CacheCommand::Ls { json: false })).unwrap();
        run(args(data.path(), CacheCommand::Gc)).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), newer, "an entry of another version was deleted or changed");
    }

    #[test]
    fn sizes_and_ages_read_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
        assert_eq!(human_age(59), "59s");
        assert_eq!(human_age(3 * 3600), "3h");
        assert_eq!(human_age(10 * 86_400), "10d");
    }
}

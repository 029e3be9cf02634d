//! `engram serve`'s API keys: `KEY=TENANT` pairs from `--api-key` (visible to other
//! users in `/proc/<pid>/cmdline`, so for local use), `--api-key-file PATH` and the
//! `ENGRAM_API_KEYS` environment variable (neither shows in the process list).
//!
//! Invariant: a malformed entry is an error naming where it is (flag, file line,
//! variable entry), never the key itself, so no key reaches a log or a terminal.

use std::path::Path;

use anyhow::{bail, Context, Result};

/// The environment variable of keys: `KEY=TENANT` entries separated by commas or newlines.
pub const ENV_VAR: &str = "ENGRAM_API_KEYS";

/// One `KEY=TENANT` entry (`what` says where it came from, for errors).
fn pair(entry: &str, what: &str) -> Result<(String, String)> {
    match entry.trim().split_once('=') {
        Some((k, t)) if !k.trim().is_empty() && !t.trim().is_empty() => Ok((k.trim().to_string(), t.trim().to_string())),
        _ => bail!("{what}: expected KEY=TENANT"),
    }
}

/// `KEY=TENANT` lines of a key file's text; blank lines and `#` comments are skipped.
pub fn parse_file(text: &str, path: &Path) -> Result<Vec<(String, String)>> {
    let entries = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
    entries.map(|(i, l)| pair(l, &format!("{} line {}", path.display(), i + 1))).collect()
}

/// `KEY=TENANT` entries of [`ENV_VAR`]'s value, separated by commas or newlines.
pub fn parse_env(value: &str) -> Result<Vec<(String, String)>> {
    let entries = value.split([',', '\n']).filter(|e| !e.trim().is_empty()).enumerate();
    entries.map(|(i, e)| pair(e, &format!("{ENV_VAR} entry {}", i + 1))).collect()
}

/// Every key from the flags, the file and the environment. A key given twice for
/// different tenants is an error (which tenant it means would be ambiguous).
pub fn collect(flags: &[String], file: Option<&Path>) -> Result<Vec<(String, String)>> {
    let mut keys = Vec::new();
    for (i, f) in flags.iter().enumerate() {
        keys.push(pair(f, &format!("--api-key #{}", i + 1))?);
    }
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading the API key file {}", path.display()))?;
        keys.extend(parse_file(&text, path)?);
    }
    if let Ok(v) = std::env::var(ENV_VAR) {
        keys.extend(parse_env(&v)?);
    }
    for (i, (k, t)) in keys.iter().enumerate() {
        if keys[..i].iter().any(|(k2, t2)| k2 == k && t2 != t) {
            bail!("an API key is given for two tenants ({t:?} and another)");
        }
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_from_flags_files_and_the_environment_and_errors_never_echo_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys");
        std::fs::write(&file, "# team keys\nsecret-a = alice\n\n  secret-b=bob\n").unwrap();
        let keys = collect(&["secret-c=carol".into()], Some(&file)).unwrap();
        assert_eq!(keys, [("secret-c", "carol"), ("secret-a", "alice"), ("secret-b", "bob")].map(|(k, t)| (k.to_string(), t.to_string())));
        assert_eq!(parse_env("k1=t1,k2=t2\nk3=t3,").unwrap().len(), 3);
        let e = parse_file("ok=t\nsecret-without-tenant\n", &file).unwrap_err().to_string();
        assert!(e.contains("line 2") && !e.contains("secret"), "{e}");
        let e = parse_env("k1=t1,secret-x=").unwrap_err().to_string();
        assert!(e.contains("entry 2") && !e.contains("secret"), "{e}");
        let e = collect(&["secret-a=mallory".into()], Some(&file)).unwrap_err().to_string();
        assert!(e.contains("two tenants") && !e.contains("secret"), "{e}");
        assert!(collect(&[], Some(&dir.path().join("missing"))).is_err());
    }
}

//! The offload file of one sequence: a checked header, then fixed-size rows (one token of one
//! (layer, KV head): its f16 key then its f16 value), appended and never rewritten.
//!
//! Header (one 4 KiB page, so rows start page-aligned): magic `ENGRAM-DYNAKV\0\0\0`, version,
//! header length, layers, KV heads, head dim, row bytes, a 32-byte fingerprint of the model
//! and sparse configuration, and a BLAKE3 of everything before it.
//!
//! Invariant: a file opens only if its header is intact and names the same shape and
//! fingerprint (a cache made one way is never read by another); a row read returns exactly
//! the bytes appended for it, or an error naming the file if the file is shorter.

use std::fs::File;
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The header's magic bytes.
pub const MAGIC: &[u8; 16] = b"ENGRAM-DYNAKV\0\0\0";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Header bytes (rows start here).
pub const HEADER: u64 = 4096;

/// What a file must hold to be read by a cache: its shape and the fingerprint of the model
/// and configuration. Invariant: two specs are compatible only if equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileSpec {
    pub layers: u32,
    pub heads: u32,
    pub dim: u32,
    pub fingerprint: [u8; 32],
}

impl FileSpec {
    /// Bytes of one row: key and value, f16.
    pub fn row_bytes(&self) -> usize {
        self.dim as usize * 4
    }

    fn header(&self) -> Vec<u8> {
        let mut h = Vec::with_capacity(HEADER as usize);
        h.extend_from_slice(MAGIC);
        for v in [VERSION, HEADER as u32, self.layers, self.heads, self.dim, self.row_bytes() as u32] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        h.extend_from_slice(&self.fingerprint);
        let sum = blake3::hash(&h);
        h.extend_from_slice(sum.as_bytes());
        h.resize(HEADER as usize, 0);
        h
    }
}

fn bad(path: &Path, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, format!("{}: not a usable DynaKV offload file: {what}", path.display()))
}

/// One open offload file (module doc). Positioned reads and writes, so several threads may
/// read at once.
pub struct OffloadFile {
    file: File,
    path: PathBuf,
    spec: FileSpec,
    /// Rows appended so far.
    rows: u64,
}

impl OffloadFile {
    /// Creates a new file at `path` (an existing file is an error, never overwritten) and
    /// writes its header.
    pub fn create(path: &Path, spec: FileSpec) -> io::Result<OffloadFile> {
        let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(path)?;
        file.write_all_at(&spec.header(), 0)?;
        Ok(OffloadFile { file, path: path.to_path_buf(), spec, rows: 0 })
    }

    /// Opens an existing file, checking its header against `expect`.
    pub fn open(path: &Path, expect: FileSpec) -> io::Result<OffloadFile> {
        OffloadFile::open_with(File::open(path)?, path, expect)
    }

    /// Opens an existing file for reading and appending (a saved sequence resumed), checking
    /// its header against `expect`.
    pub fn open_writable(path: &Path, expect: FileSpec) -> io::Result<OffloadFile> {
        OffloadFile::open_with(std::fs::OpenOptions::new().read(true).write(true).open(path)?, path, expect)
    }

    fn open_with(file: File, path: &Path, expect: FileSpec) -> io::Result<OffloadFile> {
        let len = file.metadata()?.len();
        if len < HEADER {
            return Err(bad(path, format!("{len} bytes, shorter than its {HEADER}-byte header")));
        }
        let mut h = vec![0u8; HEADER as usize];
        file.read_exact_at(&mut h, 0)?;
        if &h[..16] != MAGIC {
            return Err(bad(path, "wrong magic (not written by engram's DynaKV offload)"));
        }
        let word = |i: usize| u32::from_le_bytes(h[16 + 4 * i..20 + 4 * i].try_into().expect("4 bytes"));
        let fields = 16 + 6 * 4;
        if blake3::hash(&h[..fields + 32]).as_bytes() != &h[fields + 32..fields + 64] {
            return Err(bad(path, "header checksum mismatch (corrupt)"));
        }
        if word(0) != VERSION {
            return Err(bad(path, format!("format version {} (this build reads {VERSION})", word(0))));
        }
        let found = FileSpec { layers: word(2), heads: word(3), dim: word(4), fingerprint: h[fields..fields + 32].try_into().expect("32") };
        if word(1) as u64 != HEADER || word(5) as usize != found.row_bytes() {
            return Err(bad(path, "inconsistent header lengths"));
        }
        if found != expect {
            return Err(bad(path, "made for another model, shape or sparse configuration (fingerprint differs)"));
        }
        let body = len - HEADER;
        let rb = expect.row_bytes() as u64;
        if body % rb != 0 {
            return Err(bad(path, format!("truncated: {body} row bytes is not a whole number of {rb}-byte rows")));
        }
        Ok(OffloadFile { file, path: path.to_path_buf(), spec: expect, rows: body / rb })
    }

    /// The file's spec.
    pub fn spec(&self) -> FileSpec {
        self.spec
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Rows appended.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Cuts the file back to its first `rows` rows (rows appended after a save; never more
    /// than it holds).
    pub fn truncate_rows(&mut self, rows: u64) -> io::Result<()> {
        assert!(rows <= self.rows, "truncate_rows past the file's end");
        self.file.set_len(HEADER + rows * self.spec.row_bytes() as u64)?;
        self.rows = rows;
        Ok(())
    }

    /// Writes the file's data out to the disk (`fdatasync`).
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Appends whole rows (`bytes.len()` a multiple of the row size); returns the first
    /// appended row's index. On error nothing is counted as appended.
    pub fn append(&mut self, bytes: &[u8]) -> io::Result<u64> {
        let rb = self.spec.row_bytes();
        assert_eq!(bytes.len() % rb, 0, "append of partial rows");
        let first = self.rows;
        self.file.write_all_at(bytes, HEADER + first * rb as u64)?;
        self.rows += (bytes.len() / rb) as u64;
        Ok(first)
    }

    /// Reserves `n` rows at the file's end, unwritten (a hole, no disk used) until
    /// [`OffloadFile::write_rows`] fills them; returns the first one's index.
    pub fn reserve(&mut self, n: u64) -> io::Result<u64> {
        let first = self.rows;
        self.file.set_len(HEADER + (first + n) * self.spec.row_bytes() as u64)?;
        self.rows += n;
        Ok(first)
    }

    /// Writes whole rows at row `first`, inside the rows appended so far (a region's slack);
    /// never past the end (that is [`OffloadFile::append`]).
    pub fn write_rows(&self, first: u64, bytes: &[u8]) -> io::Result<()> {
        let rb = self.spec.row_bytes();
        assert_eq!(bytes.len() % rb, 0, "write of partial rows");
        assert!(first + (bytes.len() / rb) as u64 <= self.rows, "write_rows past the file's end");
        self.file.write_all_at(bytes, HEADER + first * rb as u64)
    }

    /// Reads `out.len() / row_bytes` rows starting at row `first` (one positioned read).
    pub fn read_rows(&self, first: u64, out: &mut [u8]) -> io::Result<()> {
        read_rows(&self.file, &self.path, self.spec.row_bytes(), first, out)
    }

    /// A second handle on the same file (for a reader thread).
    pub fn reader(&self) -> io::Result<RowReader> {
        Ok(RowReader { file: self.file.try_clone()?, path: self.path.clone(), row_bytes: self.spec.row_bytes() })
    }

    /// Writes dirty pages out and drops the file's pages from the OS page cache
    /// (`posix_fadvise(DONTNEED)`), so the next reads come from the disk.
    pub fn evict_page_cache(&self) -> io::Result<()> {
        self.file.sync_data()?;
        // SAFETY: a valid open descriptor; the call only advises the kernel.
        let rc = unsafe { libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }
}

/// A read-only handle that reads rows (what a reader thread owns).
pub struct RowReader {
    file: File,
    path: PathBuf,
    row_bytes: usize,
}

impl RowReader {
    /// Reads `out.len() / row_bytes` rows starting at row `first`.
    pub fn read_rows(&self, first: u64, out: &mut [u8]) -> io::Result<()> {
        read_rows(&self.file, &self.path, self.row_bytes, first, out)
    }

    /// Another handle on the same file (for a second reading thread).
    pub fn try_clone(&self) -> io::Result<RowReader> {
        Ok(RowReader { file: self.file.try_clone()?, path: self.path.clone(), row_bytes: self.row_bytes })
    }

    /// The byte offset of row `first` in the file.
    pub fn offset(&self, first: u64) -> u64 {
        HEADER + first * self.row_bytes as u64
    }

    /// The open descriptor (for io_uring submissions; valid while `self` lives).
    pub fn raw_fd(&self) -> std::os::unix::io::RawFd {
        self.file.as_raw_fd()
    }

    /// The file this handle reads (the same open file as its writer's: the file lives while
    /// this handle does, even once its name is removed).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The file's path when the handle was made.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }
}

fn read_rows(file: &File, path: &Path, rb: usize, first: u64, out: &mut [u8]) -> io::Result<()> {
    file.read_exact_at(out, HEADER + first * rb as u64).map_err(|e| {
        if e.kind() == ErrorKind::UnexpectedEof {
            bad(path, format!("truncated: rows {first}..{} are past its end", first + (out.len() / rb) as u64))
        } else {
            e
        }
    })
}

/// Free bytes for an unprivileged user on the file system holding `dir`.
pub fn free_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|e| io::Error::new(ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

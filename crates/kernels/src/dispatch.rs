//! Which kernel path multiplies each weight format on this CPU: the best path the CPU has
//! ([`Isa::detect`]) unless a row of [`TABLE`] for this micro-architecture — chosen from
//! `engram bench kernels` figures measured on it — names another for that format. `ENGRAM_SIMD`
//! forces one path for every format, as before.
//!
//! ```text
//!  matmul(w, x) ─► kernel_path(w.dtype) ─► ENGRAM_SIMD set?  ─► that path
//!                                        └► a TABLE row for this CPU naming w.dtype (and the
//!                                           CPU runs it) ─► the row's path
//!                                        └► Isa::detect()
//! ```
//! A row may also name packings that pay on its CPU only (`TableRow::packs`, [`packs`]): the
//! loader attaches those formats' [`crate::Packed`] copies there and nowhere else.
//!
//! The choice is made per format once per process, never per call, so a token's output stays
//! bitwise independent of how many tokens share the call (each path keeps that invariant on
//! its own), and the same CPU always makes the same choice (a cache written by one run equals
//! what the next computes). Rows name only CPUs that were measured; any other CPU runs its best
//! path.
//!
//! Invariant: [`kernel_path`] returns a path this CPU runs, and the same one for a format
//! every time in a process (`crates/kernels/tests/it/dispatch.rs`).

use std::ops::RangeInclusive;
use std::sync::OnceLock;

use crate::dtype::DType;
use crate::simd::Isa;

/// A CPU as `cpuid` names it: vendor string, family and model (extended fields folded in).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuModel {
    pub vendor: String,
    pub family: u32,
    pub model: u32,
}

impl CpuModel {
    /// This CPU (`None` off x86-64).
    pub fn this() -> Option<CpuModel> {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: leaves 0 (vendor) and 1 (family, model) exist on every x86-64 CPU (the
            // intrinsic is safe from Rust 1.87; `rust-version` is older).
            #[allow(unused_unsafe)]
            let (l0, l1) = unsafe { (std::arch::x86_64::__cpuid(0), std::arch::x86_64::__cpuid(1)) };
            let vendor: Vec<u8> = [l0.ebx, l0.edx, l0.ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
            let base_family = (l1.eax >> 8) & 0xf;
            let family = if base_family == 0xf { base_family + ((l1.eax >> 20) & 0xff) } else { base_family };
            let base_model = (l1.eax >> 4) & 0xf;
            let model = if base_family == 0x6 || base_family == 0xf { base_model | (((l1.eax >> 16) & 0xf) << 4) } else { base_model };
            Some(CpuModel { vendor: String::from_utf8_lossy(&vendor).into_owned(), family, model })
        }
        #[cfg(not(target_arch = "x86_64"))]
        None
    }
}

/// One micro-architecture's measured choices.
pub struct TableRow {
    /// What the row is, for people (`bench kernels` prints it).
    pub name: &'static str,
    vendor: &'static str,
    family: u32,
    models: &'static [RangeInclusive<u32>],
    /// Formats whose path differs from [`Isa::detect`]'s on this CPU, and the path.
    pub choices: &'static [(DType, Isa)],
    /// Per format, the fewest tokens of a call that the AVX-512 token-lane kernel
    /// (`simd::vnni_k`) takes instead of the decode tiles or packed kernels (formats not
    /// named: [`default_token_lane_min`]).
    pub token_lane_min: &'static [(DType, usize)],
    /// Per format (Q4_0, Q8_0), the fewest tokens of a packed call the AMX tiles take (formats
    /// not named: [`AMX_TOKEN_MIN`]; [`amx_token_min`]).
    pub amx_token_min: &'static [(DType, usize)],
    /// The most weight bytes (KiB) of one chunk of a multi-token F16 or BF16 call (`None`:
    /// [`CHUNK_KIB`], as every format): more rows per chunk reuse each token's activations
    /// more, while the chunk's weights must stay in this CPU's L2.
    pub half_float_chunk_kib: Option<usize>,
    /// Packed formats whose one-token calls run the 512-bit VNNI kernels (`simd::avx512_packed`,
    /// `simd::avx512_packed_k`) on this CPU instead of the AVX2 packed kernels ([`wide_one_token`];
    /// formats not named, and CPUs without a row: the AVX2 kernels).
    pub wide_one_token: &'static [DType],
    /// Formats packed at load on this CPU only ([`MEASURED_PACKINGS`], and on AVX-512 CPUs
    /// [`AVX2_KERNEL_PACKINGS`]; [`packs`]): their packed kernels were measured faster than the
    /// unpacked tiles here, and on other CPUs were not.
    pub packs: &'static [DType],
    /// Where the figures behind the choices are (a section of `docs/cpu-kernels.md`).
    pub measured: &'static str,
}

impl TableRow {
    /// Whether the row describes `cpu`.
    pub fn matches(&self, cpu: &CpuModel) -> bool {
        cpu.vendor == self.vendor && cpu.family == self.family && self.models.iter().any(|m| m.contains(&cpu.model))
    }
}

/// The measured rows. A format a row does not name runs [`Isa::detect`]'s path.
pub const TABLE: &[TableRow] = &[
    TableRow {
        name: "AMD Zen 4 (EPYC 9004, family 25 models 0x10-0x1f)",
        vendor: "AuthenticAMD",
        family: 0x19,
        models: &[0x10..=0x1f],
        // Every format measured runs fastest on the AVX-512 path (packed where it packs).
        choices: &[],
        // Below the threshold the decoded-once panels (`k_panel`) take calls from 8 tokens:
        // ~31–44 ns per row-token at 8–12 tokens; the token-lane kernel ~400 ns per row per call
        // up to 16 tokens (1 thread, CPU time). Packed Q4_K / Q6_K: the packed VNNI kernels ran
        // 14.4–14.6 / 17.3–17.5 ns per row-token at 16–48 tokens, the token lanes 18.3 / 25.5 at
        // 16, 15.0 / 18.7 at 32, 16.7 / 19.7 at 40 and 13.7–14.1 / 16.4 at 48 (1 thread, wall).
        token_lane_min: &[(DType::Q5K, 12), (DType::Q3K, 13), (DType::Q2K, 14), (DType::IQ4XS, 9), (DType::Q4K, 48), (DType::Q6K, 48)],
        // 1 MiB of L2 per core: 768 KiB chunks ran the 2048 × 8192 F16 matrix at 512 tokens in
        // 45 ns per 2048-column row-token against 60 with 256 KiB (1 thread, CPU time).
        amx_token_min: &[],
        half_float_chunk_kib: Some(768),
        // One-token calls from DRAM ran 1.3-6x slower on the 512-bit kernels than on the AVX2
        // ones (docs/cpu-kernels.md, "AVX-512 CPUs run the packed AVX2 kernels").
        wide_one_token: &[],
        // Q5_K packed (AVX2 kernels) decoded the Q5_K_M file at 28-33 tok/s against 37-38 for
        // its unpacked tile (docs/cpu-kernels.md, "AVX-512 CPUs run the packed AVX2 kernels").
        packs: &[],
        measured: "docs/cpu-kernels.md, \"The measured dispatch table\"",
    },
    TableRow {
        name: "Intel Xeon (family 6 model 207)",
        vendor: "GenuineIntel",
        family: 0x6,
        models: &[0xcf..=0xcf],
        // Every format runs the best path (`avx512`); the row sets the token-lane thresholds of
        // IQ3_S and the packed K formats, which one-token packed calls take the 512-bit kernels
        // and which formats with AVX2 packed kernels only are packed.
        choices: &[],
        token_lane_min: XEON_TOKEN_LANE_MIN,
        amx_token_min: &[],
        half_float_chunk_kib: None,
        // One token from DRAM (32768 × 16384 matrices, 2 threads, least of 5, three rounds), ns
        // per row, AVX2 kernels → 512-bit: Q4_0 685-807 → 488-560, Q4_1 762-982 → 549-586,
        // Q8_0 1243-1601 → 911-946, IQ4_NL 780-815 → 516-533, Q4_K 695-869 → 659-846, Q6_K
        // 937-1201 → 874-1061; the model's one-row step 49 → 34-43 ms (Q4_0), 77-89 → 64-69
        // (Q8_0); and 1.03-1.31x faster again with the prefetch on their one-token passes
        // (`simd/prefetch.rs`). Q5_K / IQ4_XS (packed on this row): 681-741 → 518-557 / 648-691
        // → 364-413 (32768 × 16384), 95-99 → 62-63 / 90-91 → 50-56 (131072 × 2048).
        wide_one_token: &[DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::IQ4NL, DType::Q4K, DType::Q5K, DType::Q6K, DType::IQ4XS],
        // One token from DRAM (32768 × 16384, 2 threads, least of 5), ns per row, the 512-bit
        // tiles on the file's bytes → the AVX2 packed kernels: Q3_K 599 → 311, Q2_K 609 → 274,
        // IQ4_XS 778 → 641, Q5_K 824 → 684; at 2 / 4 / 7 tokens (8192 × 4096) 1.0-2.0x faster
        // too. Q5_0 / Q5_1 / MXFP4 stay unpacked: one token 586 / 617 / 521 against 784 / 890 /
        // 618 packed.
        packs: &[DType::Q5K, DType::Q3K, DType::Q2K, DType::IQ4XS],
        measured: "docs/cpu-kernels.md, \"IQ3 and IQ4_NL on AVX-512\", \"One-token packed calls on the 512-bit kernels\" and \"Packed K-quants on AVX-512\" (Intel Xeon)",
    },
    TableRow {
        name: "Intel Xeon with AMX (family 6 model 167)",
        vendor: "GenuineIntel",
        family: 0x6,
        models: &[0xa7..=0xa7],
        // Every format runs the best path: AMX tiles for Q4_0 / Q8_0 calls from `amx_token_min`
        // tokens (fewer: the AVX-512 packed kernels, the same bits), every other format the
        // AVX-512 path (`Isa::for_format`). The token-lane thresholds are the model-207 Xeon's
        // (the same kernels and core family; not measured again here).
        choices: &[],
        token_lane_min: XEON_TOKEN_LANE_MIN,
        // Packed Q4_0 / Q8_0, ns per 2048-column row-token (1 thread, CPU time, least of 7): the
        // AVX-512 packed kernels 12.3 / 13.4 at 16 tokens, 12.2 / 13.0 at 32, 14.6 / 15.3 at 256;
        // the AMX tiles from the packing 11.3 / 13.2, 10.1 / 10.5 and 8.8 / 12.3 (at 8 tokens
        // 20.4 / 23.8 against 12.7 / 14.1). In the model the tiles from 16 tokens lost: `bench
        // step` on the llama-1b Q4_0 file (2 threads, two rounds, builds alternating) ran a
        // 16 / 17-row step in 77-79 / 83-84 ms with the tiles from 32 tokens against 81-83 /
        // 91-96 from 16; 24 / 33 rows 113 / 140 either way.
        amx_token_min: &[(DType::Q4_0, 32), (DType::Q8_0, 32)],
        // 2 MiB of L2 per core: 1 MiB chunks (64 rows of the 8192-column `ffn_down`) reuse each
        // token's activations 4x more than 256 KiB. A C model of the 4 x 4 tiles, 2048 x 8192
        // at 256 tokens (1 thread, CPU time): 41.5 ns per 2048-column row-token with 256 KiB,
        // 35.5 with 512 KiB, 32.5-33.1 with 1 MiB, 33.3-33.8 with 1.5 MiB; the 4 x 6 tiles
        // (`simd::avx512_float_wide`) 30.4-30.7 with 1 MiB (docs/cpu-kernels.md).
        half_float_chunk_kib: Some(1024),
        // One token from DRAM (131072 × 2048, 2 threads, least of 5, two rounds), ns per row,
        // AVX2 packed kernels (Q5_K / IQ4_XS: AVX-512 tiles, unpacked) → the 512-bit packed
        // kernels (packed): Q4_0 81-92 → 77-80, Q4_1 123-152 → 89-91, Q8_0 123-163 → 140-145,
        // IQ4_NL 90-112 → 68-72, Q4_K 75 → 72-74, Q6_K 111-144 → 65-129, Q5_K 189-191 → 55-122,
        // IQ4_XS 151-177 → 45-79. Q8_0 and Q6_K, unclear there, end to end (`bench speed`
        // decode on the llama.cpp-written files, two rounds, builds alternating): 24.42-25.17 /
        // 25.85-25.94 tok/s on the 512-bit kernels against 20.14-20.41 / 24.09-24.36 on the AVX2
        // ones; Q4_K (the Q4_K_M file, three rounds) 35.62-36.24 against 31.61-33.27.
        wide_one_token: &[DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::IQ4NL, DType::Q4K, DType::Q5K, DType::Q6K, DType::IQ4XS],
        // Packed (the AVX2 packed kernels) against the AVX-512 tiles on the file's bytes, ns per
        // row (131072 × 2048, 2 threads, least of 5, two rounds) at 1 / 8 tokens: Q5_0 105-107 /
        // 31-32 → 54-57 / 14-15, Q5_1 110-112 / 36-39 → 78-80 / 15-17, MXFP4 88-89 / 27-28 →
        // 48-49 / 14 (on the model-207 Xeon the tiles won one-token calls of these three).
        packs: &[DType::Q5K, DType::Q3K, DType::Q2K, DType::IQ4XS, DType::Q5_0, DType::Q5_1, DType::MXFP4],
        measured: "docs/cpu-kernels.md, \"AMX CPUs: packed kernels below the tiles' threshold\" (Intel Xeon with AMX)",
    },
    TableRow {
        name: "AMD Zen 1 (EPYC 7001, family 23 model 1)",
        vendor: "AuthenticAMD",
        family: 0x17,
        models: &[0x01..=0x01],
        // Measured: the AVX2 path (packed where the format repacks) beats every other variant of
        // every format at 1-64 tokens a call, so it names no other path (no AVX-512: no token
        // lanes; 512 KiB of L2: the default F16 chunks). The one exception kept: packed Q2_K /
        // IQ4_XS at 64 tokens, whose prefill panel decoded from the packing costs 1-5% more per
        // row-token than from the file's bytes, which a packed matrix never reads.
        choices: &[],
        token_lane_min: &[],
        amx_token_min: &[],
        half_float_chunk_kib: None,
        wide_one_token: &[],
        // Packed Q5_K: one-token calls 109-125 -> 77-91 ns per 2048-column row from L3 / DRAM
        // (2 threads); the Q5_K_M file's decode 1.09-1.15x the unpacked tile's (builds alternating).
        // Packed Q3_K: 100-103 -> 69 / 105-107 -> 72-75 ns; the Q3_K_M file's decode 1.11-1.13x.
        packs: &[DType::Q5K, DType::Q3K],
        measured: "docs/cpu-kernels.md, \"The measured dispatch table\" (Zen 1)",
    },
];

/// Formats whose packing ([`crate::Packed`]) is attached at load only on CPUs whose [`TABLE`]
/// row names them in `packs`: the packed kernel pays on some CPUs and loses on others, or was
/// measured on one CPU only.
pub const MEASURED_PACKINGS: &[DType] = &[DType::Q5K, DType::Q3K];

/// Formats the AVX-512 path packs only where this CPU's row names them in `packs`: their packed
/// kernels there (the AVX2 ones; for Q5_K and IQ4_XS the 512-bit ones of `simd::avx512_packed_k`)
/// were measured against the AVX-512 tiles on that row's CPU only. Packed, their calls below the
/// token lanes run those kernels and the token lanes decode their panels from the packing;
/// elsewhere the AVX-512 path keeps its own tiles on the file's bytes.
pub const AVX2_KERNEL_PACKINGS: &[DType] = &[DType::Q5_0, DType::Q5_1, DType::MXFP4, DType::IQ4XS, DType::Q2K, DType::Q5K, DType::Q3K];

/// Whether a loader packs `dtype` for the kernel path `isa` on this CPU as far as the table goes:
/// on AVX2 every packable format but [`MEASURED_PACKINGS`] (those where this CPU's row names
/// them); on AVX-512 and AMX every packable format but [`AVX2_KERNEL_PACKINGS`] (likewise); on
/// other paths none (they read no packing).
pub fn packs(isa: Isa, dtype: DType) -> bool {
    let named = table_row().is_some_and(|row| row.packs.contains(&dtype));
    match isa.for_format(dtype) {
        Isa::Avx2 => !MEASURED_PACKINGS.contains(&dtype) || named,
        Isa::Avx512 | Isa::Amx => !AVX2_KERNEL_PACKINGS.contains(&dtype) || named,
        _ => false,
    }
}

/// The [`TABLE`] row for this CPU, if it was measured.
pub fn table_row() -> Option<&'static TableRow> {
    static ROW: OnceLock<Option<&'static TableRow>> = OnceLock::new();
    *ROW.get_or_init(|| CpuModel::this().and_then(|cpu| TABLE.iter().find(|r| r.matches(&cpu))))
}

/// The fewest tokens of a packed Q4_0 / Q8_0 call the AMX tiles take where no table row says
/// otherwise; fewer run the AVX-512 packed kernels (the same bits: both are the scalar
/// reference's). A tile pass holds up to 16 tokens and its per-call repack is paid once.
pub const AMX_TOKEN_MIN: usize = 16;

/// The fewest tokens of a packed `dtype` (Q4_0 / Q8_0) call that the AMX tiles take on this
/// CPU: its [`TABLE`] row's figure, else [`AMX_TOKEN_MIN`]. Moves only time.
pub fn amx_token_min(dtype: DType) -> usize {
    table_row().and_then(|row| row.amx_token_min.iter().find(|(d, _)| *d == dtype)).map_or(AMX_TOKEN_MIN, |&(_, n)| n)
}

/// The token-lane thresholds of the Intel Xeon rows: measured on the model-207 Xeon and taken
/// by the AMX Xeon (the same kernels and core family).
///
/// IQ3_S: the gathered-row tiles (`avx512_iq3`, 4-token passes) ran 8 / 9 / 10 / 11
/// tokens at 54.7-57.1 / 68.5-69.0 / 62.8-63.0 / 59.7-59.9 ns per 2048-column row-token,
/// the token lanes at 80.5 / 71.5 / 64.6 / 58.5 (1 thread, CPU time). IQ3_XXS keeps the
/// default 8: tiles 64.4 against lanes 62.5 at 8 tokens. Packed Q4_K / Q6_K: the packed
/// VNNI kernels ran 15.8-17.0 / 23.1-25.3 ns per row-token at 16-48 tokens, the token
/// lanes 22.3-27.8 / 29.4-29.6 at 16, 31.4-31.8 / 37.9-38.6 at 17, 22.4 / 27.0-27.4 at 24,
/// 17.0-17.4 / 20.7-21.0 at 32 and 15.5-15.8 / 17.9-18.0 at 48 (1 thread, CPU time).
/// Packed Q3_K / Q2_K (both rows pack them): the AVX2 packed kernels ran 36.3-37.8 /
/// 27.1-28.3 ns per row-token at 8-48 tokens, the token lanes from the packing 41.6 / 41.2
/// at 8, 33.6 / 33.6 at 10, 28.3 / 28.2 at 12 and 24.6 / 24.6 at 14. Packed Q5_K / IQ4_XS:
/// the 512-bit packed kernels 33.1 / 29.0 at 2 tokens, 25.6 / 23.5 at 4, 22.0 / 23.4 at 8,
/// 24.5 / 23.0 at 9; the token lanes 28.4 / 35.7 at 10, 24.0 / 29.7 at 12, 20.9 / 25.8 at
/// 14, 18.6 / 22.9 at 16 (1 thread, CPU time, least of two rounds).
const XEON_TOKEN_LANE_MIN: &[(DType, usize)] =
    &[(DType::IQ3S, 11), (DType::Q4K, 48), (DType::Q6K, 32), (DType::Q5K, 14), (DType::Q3K, 10), (DType::Q2K, 13), (DType::IQ4XS, 16)];

/// The fewest tokens of a Q5_K / Q3_K / Q2_K / IQ4_XS call the AVX-512 token-lane kernel takes
/// where no table row says otherwise.
pub const TOKEN_LANE_MIN: usize = 8;

/// The fewest tokens of a packed Q4_K / Q6_K call the AVX-512 token-lane kernel takes where no
/// table row says otherwise (one full register of 16 token lanes; below it the packed VNNI
/// kernels, ≤ 8 tokens a pass, cost less per token than half-empty lanes).
pub const TOKEN_LANE_MIN_PACKED: usize = 16;

/// The threshold of `dtype` where no table row names it: [`TOKEN_LANE_MIN_PACKED`] for the
/// formats with packed decode kernels (Q4_K, Q6_K), else [`TOKEN_LANE_MIN`].
pub fn default_token_lane_min(dtype: DType) -> usize {
    match dtype {
        DType::Q4K | DType::Q6K => TOKEN_LANE_MIN_PACKED,
        _ => TOKEN_LANE_MIN,
    }
}

/// The fewest tokens of a `dtype` call that the AVX-512 token-lane kernel takes on this CPU:
/// its [`TABLE`] row's figure, else [`default_token_lane_min`]. Either kernel gives the same
/// bits (both are the scalar reference's), so this moves only time.
pub fn token_lane_min(dtype: DType) -> usize {
    table_row()
        .and_then(|row| row.token_lane_min.iter().find(|(d, _)| *d == dtype))
        .map_or_else(|| default_token_lane_min(dtype), |&(_, n)| n)
}

/// Whether one-token calls of packed `dtype` matrices run the 512-bit VNNI kernels on this
/// AVX-512 CPU: where its [`TABLE`] row names the format in `wide_one_token`. Elsewhere the AVX2
/// packed kernels take them (they read a group-block at a time in address order, which the
/// hardware prefetchers follow; on Zen 4 the 512-bit kernels' one-token calls were slower from
/// DRAM). Both give the scalar reference's bits, so this moves only time.
pub fn wide_one_token(dtype: DType) -> bool {
    table_row().is_some_and(|row| row.wide_one_token.contains(&dtype))
}

/// The most weight bytes (KiB) of one chunk of a multi-token call where no table row says
/// otherwise (a chunk's weights stay in L2 while all the call's tokens pass over them).
pub const CHUNK_KIB: usize = 256;

/// The most weight bytes (KiB) of one chunk of a multi-token `dtype` call on this CPU: its
/// [`TABLE`] row's figure for F16 and BF16, else [`CHUNK_KIB`]. Chunks only split the rows, so this moves
/// only time.
pub fn chunk_kib(dtype: DType) -> usize {
    let half = if matches!(dtype, DType::F16 | DType::BF16) { table_row().and_then(|row| row.half_float_chunk_kib) } else { None };
    half.unwrap_or(CHUNK_KIB)
}

/// The path that multiplies `dtype` on this CPU. See the module doc.
pub fn kernel_path(dtype: DType) -> Isa {
    static FORCED: OnceLock<bool> = OnceLock::new();
    let best = Isa::detect();
    if *FORCED.get_or_init(|| matches!(Isa::forced(), Ok(Some(_)))) {
        return best.for_format(dtype);
    }
    table_row()
        .and_then(|row| row.choices.iter().find(|(d, _)| *d == dtype))
        .map(|&(_, isa)| isa)
        .filter(|isa| isa.is_available())
        .unwrap_or(best)
        .for_format(dtype)
}

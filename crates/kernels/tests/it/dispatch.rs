//! The measured dispatch table: a row names only the CPU it was measured on; the path a format
//! runs is one this CPU has and the same at every call; the public `matmul` gives bitwise what
//! `matmul_with` gives on that path; and on the table's token-lane thresholds a token's output
//! does not depend on how many tokens share its call (the two kernels meet at every threshold).

use crate::common;
use common::*;
use engram_kernels::dispatch::{
    amx_token_min, default_token_lane_min, kernel_path, packs, table_row, token_lane_min, wide_one_token, CpuModel, AVX2_KERNEL_PACKINGS,
    MEASURED_PACKINGS, TABLE, TOKEN_LANE_MIN, TOKEN_LANE_MIN_PACKED,
};
use engram_kernels::internal::{matmul_with, Isa};
use engram_kernels::*;

#[test]
fn a_row_matches_only_the_cpus_it_names() {
    let zen4 = CpuModel { vendor: "AuthenticAMD".into(), family: 25, model: 0x11 };
    let zen3 = CpuModel { vendor: "AuthenticAMD".into(), family: 25, model: 0x01 };
    let zen1 = CpuModel { vendor: "AuthenticAMD".into(), family: 23, model: 0x01 };
    let intel = CpuModel { vendor: "GenuineIntel".into(), family: 6, model: 0x8f };
    let intel_207 = CpuModel { vendor: "GenuineIntel".into(), family: 6, model: 0xcf };
    let rows = |cpu: &CpuModel| TABLE.iter().filter(|r| r.matches(cpu)).count();
    assert_eq!(rows(&zen4), 1, "Zen 4 was measured");
    assert_eq!(rows(&intel_207), 1, "Intel family 6 model 207 was measured (thresholds, one-token kernels)");
    assert_eq!(rows(&zen1), 1, "Zen 1 (family 23 model 1) was measured");
    for d in [DType::Q5K, DType::Q3K] {
        assert!(TABLE.iter().any(|r| r.matches(&zen1) && r.packs.contains(&d)), "{d} packed on Zen 1, where it was measured");
    }
    let zen_plus = CpuModel { vendor: "AuthenticAMD".into(), family: 23, model: 0x08 };
    for other in [&zen3, &zen_plus, &intel] {
        assert_eq!(rows(other), 0, "{other:?} was not measured: it runs its best path");
    }
    assert_eq!(default_token_lane_min(DType::Q4K), TOKEN_LANE_MIN_PACKED);
    assert_eq!(default_token_lane_min(DType::Q6K), TOKEN_LANE_MIN_PACKED);
    assert_eq!(default_token_lane_min(DType::Q5K), TOKEN_LANE_MIN);
    for r in TABLE {
        assert!(r.token_lane_min.iter().all(|&(_, n)| (2..=64).contains(&n)), "{}: a threshold within four registers of lanes", r.name);
        for d in r.packs {
            let per_cpu = MEASURED_PACKINGS.contains(d) || AVX2_KERNEL_PACKINGS.contains(d);
            assert!(per_cpu && Packed::supports(*d, 8), "{}: {d} is a packing chosen per CPU", r.name);
        }
        // Only formats the 512-bit packed kernels take (always packed where AVX-512 runs).
        for d in r.wide_one_token {
            let wide = [DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::IQ4NL, DType::Q4K, DType::Q5K, DType::Q6K, DType::IQ4XS];
            assert!(wide.contains(d), "{}: {d} has no 512-bit one-token packed kernel", r.name);
        }
    }
}

/// A packing measured per CPU (Q5_K, Q3_K; on AVX-512 the formats with AVX2 packed kernels
/// only) is attached only where this CPU's row names it; every other packable format as before.
#[test]
fn measured_packings_follow_the_table_row() {
    let named = |d: DType| table_row().is_some_and(|r| r.packs.contains(&d));
    for d in DType::ALL {
        assert_eq!(packs(Isa::Avx2, d), !MEASURED_PACKINGS.contains(&d) || named(d), "{d} on AVX2");
        assert_eq!(packs(Isa::Avx512, d), !AVX2_KERNEL_PACKINGS.contains(&d) || named(d), "{d} on AVX-512");
        assert!(!packs(Isa::Scalar, d), "{d}: the scalar path reads no packing");
        // The AMX path packs as the AVX-512 path: its tiles read packed Q4_0 / Q8_0, its other
        // formats are AVX-512's.
        assert_eq!(packs(Isa::Amx, d), packs(Isa::Avx512, d), "{d} on AMX");
    }
    assert!(MEASURED_PACKINGS.iter().all(|d| AVX2_KERNEL_PACKINGS.contains(d)));
    let cols = 256;
    // The AMX path runs these formats as the AVX-512 path does (`Isa::for_format`).
    let avx512 = matches!(Isa::detect(), Isa::Avx512 | Isa::Amx);
    let per_cpu = if avx512 { AVX2_KERNEL_PACKINGS } else { MEASURED_PACKINGS };
    for &d in per_cpu {
        let bytes = quantize(d, &data(8 * cols, 5), cols).unwrap();
        let w = WeightMatrix::new(d, 8, cols, &bytes).unwrap();
        if std::env::var("ENGRAM_REPACK").is_err() && kernel_path(d).runs_packed() {
            assert_eq!(Packed::for_this_cpu(&w).is_some(), named(d), "{d} packs where the row says so");
        }
        if !named(d) {
            assert!(Packed::for_this_cpu(&w).is_none(), "no row names {d} here: it stays unpacked");
        }
    }
}

#[test]
fn every_format_runs_a_path_this_cpu_has_the_same_every_time() {
    let row = table_row();
    for d in DType::ALL {
        let isa = kernel_path(d);
        assert!(isa.is_available(), "{d:?} → {isa:?}");
        assert_eq!(kernel_path(d), isa, "{d:?}: chosen once");
        if std::env::var("ENGRAM_SIMD").is_err() && row.is_none_or(|r| r.choices.iter().all(|(f, _)| *f != d)) {
            assert_eq!(isa, Isa::detect().for_format(d), "{d:?}: no table choice, the best path");
        }
        let want = row.and_then(|r| r.token_lane_min.iter().find(|(f, _)| *f == d)).map_or(default_token_lane_min(d), |&(_, n)| n);
        assert_eq!(token_lane_min(d), want);
        assert_eq!(wide_one_token(d), row.is_some_and(|r| r.wide_one_token.contains(&d)), "{d:?}");
    }
}

#[test]
fn matmul_is_the_chosen_path_and_independent_of_the_tokens_per_call_around_the_thresholds() {
    let (rows, cols) = (40, 512);
    // One token past every threshold this CPU's row sets (and past one register of lanes).
    let n = DType::ALL.into_iter().map(|d| token_lane_min(d).max(amx_token_min(d))).max().unwrap_or(0).max(16) + 1;
    let x = data(n * cols, 5);
    for d in DType::ALL.into_iter().filter(|&d| quantize(d, &[0.0; 256], 256).is_ok()) {
        let bytes = quantize(d, &data(rows * cols, 9), cols).unwrap();
        let plain = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
        let packed = Packed::for_this_cpu(&plain);
        let w = packed.as_ref().map_or(plain, |p| plain.with_packed(p));
        let mut all = vec![0.0f32; n * rows];
        matmul(&w, &x, n, &mut all);
        let mut via = vec![0.0f32; n * rows];
        matmul_with(kernel_path(d), &w, &x, n, &mut via);
        assert_eq!(bits(&all), bits(&via), "{d:?}: matmul runs kernel_path's path");
        // Calls of every size from 1 to n tokens (each threshold's both sides): each token's
        // row equals the n-token call's.
        for k in 1..=n {
            let mut part = vec![0.0f32; k * rows];
            matmul(&w, &x[..k * cols], k, &mut part);
            assert_eq!(bits(&part), bits(&all[..k * rows]), "{d:?}: {k} tokens per call");
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

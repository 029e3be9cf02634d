//! Throughput of the AMX-BF16 attention block kernel (`engram_kernels::flash`), single thread:
//! `cargo run --release -p engram-kernels --example flash_speed [ROWS] [KEYS] [f32|f16|q8]`.
//! Both precisions interleaved (`FLASH_PRECISION=exact|bf16` for one). The keys and values are
//! handed over as `f32` slices (`add_chunk`, the default) or as stored f16 / Q8_0 rows
//! (`add_rows`, packed from their bytes as attention over the KV store does). Prints ns per
//! (16-row block × 32-key chunk) and effective GFLOP/s (QKᵀ + PV, 4·hd flops per row-key pair),
//! so changes to the kernel can be compared side by side.

use std::time::Instant;

use engram_kernels::flash::{Flash, Precision, Rows};
use engram_kernels::DType;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (rows, keys, hd) = (num(0, 256), num(1, 16384), 64);
    let format = args.get(2).map_or("f32", |s| s.as_str());
    if !engram_kernels::flash::supported(hd) {
        eprintln!("no AMX-BF16 on this machine");
        return;
    }
    let rnd = |i: usize| (i.wrapping_mul(2654435761) % 1000) as f32 / 500.0 - 1.0;
    let q: Vec<f32> = (0..rows * hd).map(|i| rnd(i) * 0.3).collect();
    let k: Vec<f32> = (0..32 * hd).map(|i| rnd(i + 7)).collect();
    let v: Vec<f32> = (0..32 * hd).map(|i| rnd(i + 13)).collect();
    let encode = |x: &[f32]| -> Vec<u8> {
        match format {
            "f16" => x.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect(),
            "q8" => engram_kernels::quantize(DType::Q8_0, x, hd).expect("quantize"),
            "f32" => Vec::new(),
            other => panic!("format {other}: f32, f16 or q8"),
        }
    };
    let (kb, vb) = (encode(&k), encode(&v));
    fn rows_of<'a>(format: &str, b: &'a [u8]) -> Rows<'a> {
        if format == "f16" {
            Rows::F16(b)
        } else {
            Rows::Q8_0(b)
        }
    }
    for precision in std::env::var("FLASH_PRECISION")
        .map(|p| vec![p.parse::<Precision>().expect("precision"); 3])
        .unwrap_or_else(|_| [Precision::Exact, Precision::Bf16].repeat(3))
    {
        let t = Instant::now();
        let mut f = Flash::with_precision(&q, rows, hd, keys, 1, precision);
        for c in 0..keys / 32 {
            if format == "f32" {
                f.add_chunk(&k, &v, 32, c * 32, None);
            } else {
                f.add_rows(rows_of(format, &kb), rows_of(format, &vb), 32, c * 32, None);
            }
        }
        let mut out = vec![0.0; rows * hd];
        f.finish(&mut out);
        let s = t.elapsed().as_secs_f64();
        let bc = (rows.div_ceil(16) * (keys / 32)) as f64;
        let flops = 4.0 * hd as f64 * rows as f64 * keys as f64;
        println!(
            "{:5} {format} rows {rows} keys {keys}: {:.1} ms, {:.0} ns per block-chunk, {:.1} GFLOP/s (out[0] {:.4})",
            precision.name(),
            s * 1e3,
            s * 1e9 / bc,
            flops / s / 1e9,
            out[0]
        );
    }
}

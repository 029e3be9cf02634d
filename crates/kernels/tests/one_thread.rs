//! One kernel thread walks a matrix chunk by chunk, as the pool does, and gives the pool's
//! bits: every format, several chunks, 1 and 9 tokens per call. (Its own test binary: it sets
//! the global pool size.)

use engram_kernels::{matmul, quantize, set_num_threads, DType, WeightMatrix};

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / (1u32 << 24) as f32 - 0.5).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn one_thread_gives_the_pools_bits() {
    let (rows, cols) = (300, 2048);
    for d in DType::ALL {
        let Ok(bytes) = quantize(d, &data(rows * cols, 1), cols) else { continue };
        let w = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
        for n in [1, 9] {
            let x = data(n * cols, 2);
            let mut pool = vec![0f32; n * rows];
            set_num_threads(2);
            matmul(&w, &x, n, &mut pool);
            let mut one = vec![0f32; n * rows];
            set_num_threads(1);
            matmul(&w, &x, n, &mut one);
            assert_eq!(bits(&one), bits(&pool), "{d:?}, {n} tokens");
        }
    }
}

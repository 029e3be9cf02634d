//! The speed benchmarks through the binary: `bench membw` prints its JSON rows, `bench speed`
//! reports the decode limit beside the measurement with consistent figures, and `ENGRAM_SIMD`
//! forces the kernel path (a path this CPU lacks, or an unknown one, is refused with a clear
//! error and exit status 2 before anything runs); `bench step` measures both shapes of every
//! row count against the one-row step.

use std::process::{Command, Output};

use engram_fixture::{GgufFormat, Shape};

fn engram(args: &[&str], simd: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_engram"));
    c.args(args).env_remove("ENGRAM_SIMD");
    if let Some(v) = simd {
        c.env("ENGRAM_SIMD", v);
    }
    c.output().expect("run engram")
}

fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).expect("a JSON row")).collect()
}

#[test]
fn membw_reports_every_thread_count() {
    let rows = json_lines(&engram(&["bench", "membw", "--mib", "16", "--threads", "2", "--reps", "1", "--json"], None));
    assert_eq!(rows.len(), 2);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["threads"], i + 1);
        assert!(r["read_gb_s"].as_f64().unwrap() > 0.0, "{r}");
        for f in ["q4_0", "q8_0", "q4_k", "q6_k", "f16"] {
            for k in [format!("gemv_{f}_gb_s"), format!("gemv_{f}_cached_gb_s")] {
                assert!(r[&k].as_f64().unwrap() > 0.0, "{k} in {r}");
            }
        }
    }
    let bad = engram(&["bench", "membw", "--mib", "1"], None);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("--mib"));
}

#[test]
fn speed_reports_the_limit_and_honours_a_forced_path() {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &GgufFormat::DEFAULT, &mut |_| {}).unwrap();
    let model = files.gguf(GgufFormat::Q4_0).expect("a q4_0 fixture").to_string_lossy().into_owned();
    let args =
        ["bench", "speed", "--model", &model, "--prompt-tokens", "8", "--decode-tokens", "4", "--reps", "1", "--membw-mib", "16", "--json"];
    for simd in [None, Some("scalar")] {
        let r = &json_lines(&engram(&args, simd))[0];
        let (limit, decode, of) =
            (r["limit_tok_s"].as_f64().unwrap(), r["decode_tok_s"].as_f64().unwrap(), r["of_limit"].as_f64().unwrap());
        assert!(limit > 0.0 && r["weight_bytes_per_token"].as_u64().unwrap() > 0 && r["kv_bytes_per_token"].as_u64().unwrap() > 0, "{r}");
        assert!((of - decode / limit).abs() <= 1e-3 + 1e-3 * of, "{r}");
        if let Some(s) = simd {
            assert_eq!(r["kernels"], s);
        }
    }
    for bad in ["avx512-not-a-path", "sve"] {
        let o = engram(&args, Some(bad));
        assert_eq!(o.status.code(), Some(2));
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(&format!("ENGRAM_SIMD={bad}")) && e.contains("unknown"), "{e}");
    }
    #[cfg(target_arch = "x86_64")]
    {
        let o = engram(&args, Some("neon"));
        assert_eq!(o.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&o.stderr).contains("cannot run the neon path"));
    }
    #[cfg(target_arch = "x86_64")]
    if !std::is_x86_feature_detected!("avx512f") {
        let o = engram(&args, Some("avx512"));
        assert_eq!(o.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&o.stderr).contains("cannot run the avx512 path"));
    }
}

#[test]
fn step_measures_both_shapes_against_the_one_row_step() {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &GgufFormat::DEFAULT, &mut |_| {}).unwrap();
    let model = files.gguf(GgufFormat::Q4_0).expect("a q4_0 fixture").to_string_lossy().into_owned();
    // The one-row step is measured even when not asked for; rows come back in order.
    let rows = json_lines(&engram(&["bench", "step", "--model", &model, "--rows", "3,2", "--context", "5", "--reps", "1", "--json"], None));
    let got: Vec<(String, u64)> = rows.iter().map(|r| (r["shape"].as_str().unwrap().to_string(), r["rows"].as_u64().unwrap())).collect();
    let want: Vec<(String, u64)> =
        [("batch", 1), ("batch", 2), ("batch", 3), ("tree", 2), ("tree", 3)].iter().map(|(s, n)| (s.to_string(), *n)).collect();
    assert_eq!(got, want);
    assert_eq!(rows[0]["wall_x_one_row"].as_f64(), Some(1.0));
    assert_eq!(rows[0]["cpu_x_one_row"].as_f64(), Some(1.0));
    for r in &rows {
        assert!(r["wall_ms"].as_f64().unwrap() > 0.0 && r["cpu_ms"].as_f64().unwrap() > 0.0, "{r}");
    }
    let bad = engram(&["bench", "step", "--model", &model, "--rows", "0,2"], None);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("--rows"), "{}", String::from_utf8_lossy(&bad.stderr));
}

use crate::common;
use common::*;
use engram_gguf::*;
use std::fs;

#[test]
fn open_and_read_tensor_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    sample_writer().write_file(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.path(), path);
    assert_eq!(f.header().tensors.len(), 5);
    let t = f.header().tensor("f32").unwrap();
    assert_eq!(f.tensor_data(t), &(0..24).collect::<Vec<u8>>()[..]);
    let (q, data) = f.find_tensor("q8").unwrap();
    assert_eq!(q.n_bytes as usize, data.len());
    assert!(data.iter().all(|&b| b == 0x11));
    assert_eq!(f.tensor_data(f.header().tensor("bf16").unwrap()), &[0x33; 6]);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u64_opt("u32").unwrap(), Some(4_000_000_000));
    assert_eq!(f.get_f32_opt("f32").unwrap(), Some(1.5));
    assert_eq!(f.get_bool_opt("bool").unwrap(), Some(true));
    assert_eq!(f.get_str_array_opt("tokens").unwrap().unwrap().len(), 3);
    assert_eq!(f.get_f32_array_opt("scores").unwrap().unwrap(), vec![0.5, -1.0]);
    assert_eq!(f.get_i32_array_opt("types").unwrap().unwrap(), vec![1, 2, 3]);
    assert_eq!(f.get_str_opt("unicode").unwrap().as_deref(), Some("héllo ✓"));
    assert_eq!(f.get_str_opt("absent").unwrap(), None);
    // The shared map outlives the GgufFile.
    let map = f.mmap().clone();
    let start = (f.header().data_offset + t.offset) as usize;
    let owned_t = t.clone();
    drop(f);
    assert_eq!(&map[start..start + owned_t.n_bytes as usize], &(0..24).collect::<Vec<u8>>()[..]);
    assert_eq!(fs::read(&path).unwrap(), sample_bytes());
}

#[test]
fn typed_getter_errors_name_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    let mut w = GgufWriter::new();
    w.add("llama.block_count", Value::from("32"));
    w.write_file(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let e = f.get_u64("llama.block_count").unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("{}: metadata key \"llama.block_count\" has type string, expected a non-negative integer", path.display())
    );
    assert_eq!(e.path(), Some(path.as_path()));
    assert!(matches!(e.kind(), GgufError::MetadataType { .. }));
    let e = f.get_f32("missing.key").unwrap_err();
    assert_eq!(e.to_string(), format!("{}: metadata key \"missing.key\" is missing", path.display()));
}

#[test]
fn open_errors_name_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    let e = GgufFile::open(&path).unwrap_err();
    assert!(e.to_string().starts_with(&format!("{}: cannot open: ", path.display())), "{e}");
    assert!(matches!(e.kind(), GgufError::Io { error, .. } if error.kind() == std::io::ErrorKind::NotFound));

    fs::write(&path, b"glTF0000000000000000000000").unwrap();
    let e = GgufFile::open(&path).unwrap_err();
    assert_eq!(e.to_string(), format!("{}: not a GGUF file (magic 0x46546c67, expected \"GGUF\")", path.display()));

    fs::write(&path, b"").unwrap();
    let e = GgufFile::open(&path).unwrap_err();
    assert!(e.to_string().contains("truncated while reading magic"), "{e}");

    let mut bytes = sample_bytes();
    bytes.truncate(bytes.len() - 40);
    fs::write(&path, &bytes).unwrap();
    let e = GgufFile::open(&path).unwrap_err();
    assert!(e.to_string().starts_with(&format!("{}: tensor \"", path.display())), "{e}");
    assert!(e.to_string().contains("lies past the end of the file"), "{e}");
}

#[test]
fn atomic_write_leaves_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.gguf");
    fs::write(&path, b"old contents").unwrap();
    sample_writer().write_file(&path).unwrap();
    let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("out.gguf")]);
    assert_eq!(fs::read(&path).unwrap(), sample_bytes());

    // A failing write (invalid metadata) leaves the old file and no temp file.
    let mut w = sample_writer();
    w.add("bad", Value::Array(vec![Value::U8(1), Value::U16(2)]));
    let e = w.write_file(&path).unwrap_err();
    assert!(e.to_string().starts_with(&format!("{}: metadata key \"bad\"", path.display())), "{e}");
    let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1);
    assert_eq!(fs::read(&path).unwrap(), sample_bytes());

    // Writing into a missing directory fails with the path.
    let missing = dir.path().join("no/such/dir/x.gguf");
    let e = sample_writer().write_file(&missing).unwrap_err();
    assert!(e.to_string().contains("cannot create temporary file"), "{e}");
}

//! Writer -> reader round trips over random valid files, split models, and the corpus replay.

use std::path::PathBuf;

use ferrite_gguf::{quant, Array, GgmlType, GgufFile, GgufWriter, Value};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn f32(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
    }
    fn string(&mut self) -> String {
        let alphabet = ["a", "Z", "0", ".", " ", "é", "✓", "\n", "🦀"];
        (0..self.below(12))
            .map(|_| alphabet[self.below(alphabet.len() as u64) as usize])
            .collect()
    }
}

fn random_array(r: &mut Rng, depth: usize) -> Array {
    let n = r.below(6) as usize;
    match r.below(if depth < 3 { 13 } else { 12 }) {
        0 => Array::U8((0..n).map(|_| r.next() as u8).collect()),
        1 => Array::I8((0..n).map(|_| r.next() as i8).collect()),
        2 => Array::U16((0..n).map(|_| r.next() as u16).collect()),
        3 => Array::I16((0..n).map(|_| r.next() as i16).collect()),
        4 => Array::U32((0..n).map(|_| r.next() as u32).collect()),
        5 => Array::I32((0..n).map(|_| r.next() as i32).collect()),
        6 => Array::F32((0..n).map(|_| r.f32()).collect()),
        7 => Array::Bool((0..n).map(|_| r.next().is_multiple_of(2)).collect()),
        8 => Array::String((0..n).map(|_| r.string()).collect::<Vec<_>>().into()),
        9 => Array::U64((0..n).map(|_| r.next()).collect()),
        10 => Array::I64((0..n).map(|_| r.next() as i64).collect()),
        11 => Array::F64((0..n).map(|_| f64::from(r.f32()) * 1e100).collect()),
        _ => Array::Array((0..n).map(|_| random_array(r, depth + 1)).collect()),
    }
}

fn random_value(r: &mut Rng) -> Value {
    match r.below(13) {
        0 => Value::U8(r.next() as u8),
        1 => Value::I8(r.next() as i8),
        2 => Value::U16(r.next() as u16),
        3 => Value::I16(r.next() as i16),
        4 => Value::U32(r.next() as u32),
        5 => Value::I32(r.next() as i32),
        6 => Value::F32(r.f32()),
        7 => Value::Bool(r.next().is_multiple_of(2)),
        8 => Value::String(r.string()),
        9 => Value::Array(random_array(r, 1)),
        10 => Value::U64(r.next()),
        11 => Value::I64(r.next() as i64),
        _ => Value::F64(f64::from(r.f32()) / 3.0),
    }
}

/// (name, type, dims, bytes) of a tensor written.
type Expected = (String, GgmlType, Vec<u64>, Vec<u8>);

/// A random valid model: metadata of every type, tensors of every known type (supported ones
/// quantized from random floats, the others random bytes), random alignment.
fn random_file(seed: u64) -> (GgufWriter, Vec<(String, Value)>, Vec<Expected>) {
    let mut r = Rng(seed | 1);
    let mut w = GgufWriter::new();
    let mut meta = Vec::new();
    if r.below(2) == 0 {
        let a = 1u32 << r.below(8);
        w.set("general.alignment", Value::U32(a)).unwrap();
        meta.push(("general.alignment".to_string(), Value::U32(a)));
    }
    for i in 0..r.below(20) {
        let key = format!("k{i}.{}", r.string());
        let v = random_value(&mut r);
        w.set(&key, v.clone()).unwrap();
        meta.push((key, v));
    }
    let mut tensors = Vec::new();
    for i in 0..r.below(12) {
        let ty = GgmlType::ALL[r.below(GgmlType::ALL.len() as u64) as usize];
        let n_dims = r.below(5) as usize;
        let mut dims: Vec<u64> = (0..n_dims).map(|_| 1 + r.below(3)).collect();
        if let Some(d0) = dims.first_mut() {
            *d0 *= ty.block_size() as u64;
        } else if ty.block_size() > 1 {
            dims.push(ty.block_size() as u64);
        }
        let n: u64 = dims.iter().product();
        let data = if ty.is_supported() {
            let x: Vec<f32> = (0..n).map(|_| r.f32()).collect();
            quant::quantize_to_vec(ty, &x).unwrap()
        } else {
            (0..ty.bytes_for(n).unwrap())
                .map(|_| r.next() as u8)
                .collect()
        };
        let name = format!("blk.{i}.{}", ty.name().to_lowercase());
        w.add_tensor(&name, ty, &dims, data.clone()).unwrap();
        tensors.push((name, ty, dims, data));
    }
    (w, meta, tensors)
}

#[test]
fn random_valid_files_round_trip() {
    for seed in 0..300u64 {
        let (w, meta, tensors) = random_file(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let bytes = w.to_bytes().unwrap();
        let f = GgufFile::from_bytes(bytes).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(f.version(), 3);
        assert_eq!(f.metadata(), &meta[..], "seed {seed}");
        for (k, v) in &meta {
            assert_eq!(f.get(k), Some(v));
        }
        assert_eq!(f.tensors().len(), tensors.len());
        for (t, (name, ty, dims, data)) in f.tensors().iter().zip(&tensors) {
            assert_eq!((&t.name, t.ty, &t.dims), (name, *ty, dims), "seed {seed}");
            assert_eq!(f.tensor_data(t), &data[..], "seed {seed} tensor {name}");
            assert_eq!(t.offset % f.alignment(), 0);
            assert_eq!(f.tensor(name).map(|t| &t.name), Some(name));
            if ty.is_supported() {
                assert_eq!(
                    f.dequantize(t).unwrap(),
                    quant::dequantize_to_vec(*ty, data).unwrap()
                );
            }
        }
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferrite-gguf-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn written_file_opens_through_mmap() {
    let (w, meta, tensors) = random_file(42);
    let dir = temp_dir("mmap");
    let path = dir.join("m.gguf");
    w.write(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.metadata(), &meta[..]);
    assert_eq!(f.paths(), vec![path.as_path()]);
    for (t, (_, _, _, data)) in f.tensors().iter().zip(&tensors) {
        assert_eq!(f.tensor_data(t), &data[..]);
    }
    // Released pages read back with the same bytes, through slices taken before too.
    let before: Vec<&[u8]> = f.tensors().iter().map(|t| f.tensor_data(t)).collect();
    for t in f.tensors() {
        f.release(t);
    }
    for ((t, (_, _, _, data)), b) in f.tensors().iter().zip(&tensors).zip(before) {
        assert_eq!(f.tensor_data(t), &data[..]);
        assert_eq!(b, &data[..]);
    }
    let e = GgufFile::open(dir.join("missing.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("gguf: ") && e.contains("missing.gguf"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn shard(no: u16, count: u16, total: i32, tensors: &[(&str, f32)]) -> GgufWriter {
    let mut w = GgufWriter::new();
    if no == 0 {
        w.set("general.architecture", Value::String("llama".into()))
            .unwrap();
    }
    w.set("split.no", Value::U16(no)).unwrap();
    w.set("split.count", Value::U16(count)).unwrap();
    w.set("split.tensors.count", Value::I32(total)).unwrap();
    for (name, v) in tensors {
        w.add_f32_tensor(name, GgmlType::F32, &[4], &[*v; 4])
            .unwrap();
    }
    w
}

#[test]
fn split_model_opens_as_one() {
    let dir = temp_dir("split");
    let parts = [
        vec![("a", 1.0), ("b", 2.0)],
        vec![("c", 3.0)],
        vec![("d", 4.0)],
    ];
    for (i, p) in parts.iter().enumerate() {
        shard(i as u16, 3, 4, p)
            .write(dir.join(format!("m-{:05}-of-00003.gguf", i + 1)))
            .unwrap();
    }
    // Any shard's name opens the whole model.
    let f = GgufFile::open(dir.join("m-00002-of-00003.gguf")).unwrap();
    assert_eq!(f.paths().len(), 3);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "d"]);
    assert_eq!(f.tensor("c").unwrap().shard, 1);
    assert_eq!(f.tensor_f32("d").unwrap(), vec![4.0; 4]);
    assert_eq!(f.tensor_f32("a").unwrap(), vec![1.0; 4]);

    // A duplicate tensor across shards, a wrong tensor total, a missing shard.
    shard(2, 3, 4, &[("a", 9.0)])
        .write(dir.join("m-00003-of-00003.gguf"))
        .unwrap();
    let e = GgufFile::open(dir.join("m-00001-of-00003.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("duplicate tensor name 'a'"), "{e}");
    shard(2, 3, 4, &[("d", 4.0), ("e", 5.0)])
        .write(dir.join("m-00003-of-00003.gguf"))
        .unwrap();
    let e = GgufFile::open(dir.join("m-00001-of-00003.gguf"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("split.tensors.count is 4, but the shards hold 5"),
        "{e}"
    );
    std::fs::remove_file(dir.join("m-00002-of-00003.gguf")).unwrap();
    let e = GgufFile::open(dir.join("m-00001-of-00003.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("m-00002-of-00003.gguf"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn writer_rejects_what_the_reader_would() {
    let mut w = GgufWriter::new();
    assert!(w
        .add_tensor("q", GgmlType::Q4_0, &[33], vec![0; 18])
        .is_err());
    assert!(w
        .add_tensor("q", GgmlType::Q4_0, &[32], vec![0; 17])
        .is_err());
    assert!(w.add_tensor("q", GgmlType::F32, &[0], vec![]).is_err());
    assert!(w
        .add_tensor("q", GgmlType::F32, &[1, 1, 1, 1, 1], vec![0; 4])
        .is_err());
    w.add_tensor("q", GgmlType::F32, &[1], vec![0; 4]).unwrap();
    assert!(w.add_tensor("q", GgmlType::F32, &[1], vec![0; 4]).is_err());
    assert!(w.set("general.alignment", Value::U32(3)).is_err());
    assert!(w.set("general.alignment", Value::U64(32)).is_err());
    let deep = Array::Array(vec![Array::Array(vec![Array::Array(vec![Array::U8(
        vec![1],
    )])])]);
    assert!(w.set("deep", Value::Array(deep)).is_err());
}

/// Replays the committed fuzz corpus (fuzz/corpus/gguf_open): nothing may panic.
#[test]
fn fuzz_corpus_replays_without_panic() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/gguf_open");
    let mut n = 0;
    let mut opened = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        if ferrite_gguf::fuzz_open(&bytes).is_ok() {
            opened += 1;
        }
        n += 1;
    }
    assert!(n >= 40, "corpus has {n} files");
    assert!(opened >= 1, "no valid file in the corpus");
}

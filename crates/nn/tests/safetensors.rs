//! The safetensors reader: round trips of every dtype, and one malformed file per validation
//! rule, each rejected with one error that names the file and the problem.
//! `SAFETENSORS_MALFORMED_DIR=dir cargo test -p ferrite-nn --test safetensors` also writes the
//! malformed files there (fuzzer seeds, inputs for `ferrite inspect` checks).

use ferrite_core::{DType, HostBuffer, Tensor};
use ferrite_cpu::cpu;
use ferrite_nn::safetensors::{parse, save, to_bytes, SafetensorsFile};

/// A file from a header string and a data section.
fn file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrite-nn-st-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn every_dtype_round_trips_through_a_file() {
    let dev = cpu();
    let tensors: Vec<(String, Tensor)> = vec![
        (
            "f32".into(),
            Tensor::from_vec(vec![1.5f32, -2.0, 3.25], [3], &dev).unwrap(),
        ),
        (
            "f64".into(),
            Tensor::from_vec(vec![1e-300f64, 2.0], [2, 1], &dev).unwrap(),
        ),
        (
            "f16".into(),
            Tensor::from_host(
                HostBuffer::from_f64_slice(DType::F16, &[0.5, -1.0]),
                [2],
                &dev,
            )
            .unwrap(),
        ),
        (
            "bf16".into(),
            Tensor::from_host(
                HostBuffer::from_f64_slice(DType::BF16, &[3.0, 0.25]),
                [1, 2],
                &dev,
            )
            .unwrap(),
        ),
        (
            "i64".into(),
            Tensor::from_vec(vec![-7i64, 1 << 40], [2], &dev).unwrap(),
        ),
        (
            "i32".into(),
            Tensor::from_vec(vec![-3i32], [1], &dev).unwrap(),
        ),
        (
            "u32".into(),
            Tensor::from_vec(vec![9u32, 10], [2], &dev).unwrap(),
        ),
        (
            "u8".into(),
            Tensor::from_vec(vec![255u8], [1], &dev).unwrap(),
        ),
        (
            "bool".into(),
            Tensor::from_vec(vec![true, false], [2], &dev).unwrap(),
        ),
        (
            "empty".into(),
            Tensor::zeros([0, 3], DType::F32, &dev).unwrap(),
        ),
        (
            "scalar".into(),
            Tensor::from_vec(vec![4.0f32], (), &dev).unwrap(),
        ),
    ];
    let path = tmp("all.safetensors");
    save(&tensors, &path).unwrap();
    let f = SafetensorsFile::open(&path).unwrap();
    assert_eq!(f.entries().len(), tensors.len());
    for (name, t) in &tensors {
        let got = f.tensor(name, &dev).unwrap();
        assert_eq!(got.dtype(), t.dtype(), "{name}");
        assert_eq!(got.dims(), t.dims(), "{name}");
        assert_eq!(got.to_vec_f64().unwrap(), t.to_vec_f64().unwrap(), "{name}");
    }
    let bytes = to_bytes(&tensors).unwrap();
    assert_eq!(bytes, std::fs::read(&path).unwrap());
    let dup = vec![tensors[0].clone(), tensors[0].clone()];
    assert!(save(&dup, tmp("dup.safetensors"))
        .unwrap_err()
        .to_string()
        .contains("duplicate"));
}

/// (name, bytes, a phrase the error must contain).
fn malformed() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let ok = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let two = |a: &str, b: &str| format!(r#"{{"a":{a},"b":{b}}}"#);
    let t = |dt: &str, shape: &str, s: u64, e: u64| {
        format!(r#"{{"dtype":"{dt}","shape":{shape},"data_offsets":[{s},{e}]}}"#)
    };
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    let mut over = 1000u64.to_le_bytes().to_vec();
    over.extend_from_slice(ok.as_bytes());
    let mut bad_utf8 = file(ok, &[0; 8]);
    bad_utf8[10] = 0xff;
    vec![
        ("empty_file", vec![], "no header size"),
        ("short_size", vec![1, 0, 0], "no header size"),
        ("header_size_beyond_file", over, "exceeds"),
        ("header_size_u64_max", huge, "exceeds"),
        ("header_not_json", file("hello", &[]), "not a JSON object"),
        ("header_json_array", file("[1,2]", &[]), "not a JSON object"),
        (
            "header_truncated_json",
            file(r#"{"a":{"dtype":"F32""#, &[]),
            "invalid JSON",
        ),
        ("header_invalid_utf8", bad_utf8, "UTF-8"),
        (
            "duplicate_key",
            file(
                &two(&t("F32", "[2]", 0, 8), &t("F32", "[2]", 0, 8)).replace("\"b\"", "\"a\""),
                &[0; 8],
            ),
            "duplicate key \"a\"",
        ),
        (
            "unknown_dtype",
            file(&format!(r#"{{"a":{}}}"#, t("F7", "[2]", 0, 8)), &[0; 8]),
            "F7",
        ),
        (
            "offset_past_end",
            file(&format!(r#"{{"a":{}}}"#, t("F32", "[2]", 0, 8)), &[0; 4]),
            "incomplete metadata",
        ),
        (
            "overlapping_tensors",
            file(
                &two(&t("F32", "[2]", 0, 8), &t("F32", "[2]", 4, 12)),
                &[0; 12],
            ),
            "invalid offset",
        ),
        (
            "gap_between_tensors",
            file(
                &two(&t("F32", "[1]", 0, 4), &t("F32", "[1]", 8, 12)),
                &[0; 12],
            ),
            "invalid offset",
        ),
        (
            "byte_count_differs_from_shape",
            file(&format!(r#"{{"a":{}}}"#, t("F32", "[3]", 0, 8)), &[0; 8]),
            "invalid shape, data type, or offset",
        ),
        (
            "shape_overflows",
            file(
                &format!(
                    r#"{{"a":{}}}"#,
                    t("F64", "[4294967296,4294967296,4294967296]", 0, 8)
                ),
                &[0; 8],
            ),
            "overflow",
        ),
        ("trailing_bytes", file(ok, &[0; 12]), "incomplete metadata"),
        (
            "start_after_end",
            file(&format!(r#"{{"a":{}}}"#, t("F32", "[0]", 8, 0)), &[0; 8]),
            "invalid offset",
        ),
        (
            "negative_offset",
            file(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[-1,7]}}"#,
                &[0; 8],
            ),
            "invalid JSON",
        ),
        (
            "fractional_dim",
            file(
                r#"{"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
            "invalid JSON",
        ),
        (
            "missing_offsets",
            file(r#"{"a":{"dtype":"F32","shape":[2]}}"#, &[0; 8]),
            "invalid JSON",
        ),
        (
            "tensor_entry_not_an_object",
            file(r#"{"a":5}"#, &[]),
            "invalid JSON",
        ),
        (
            "metadata_not_strings",
            file(r#"{"__metadata__":{"k":[1]}}"#, &[]),
            "invalid JSON",
        ),
        (
            "one_offset",
            file(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}}"#,
                &[0; 8],
            ),
            "invalid JSON",
        ),
        (
            "huge_tensor_claim",
            file(
                r#"{"a":{"dtype":"U8","shape":[2305843009213693951],"data_offsets":[0,2305843009213693951]}}"#,
                &[0; 8],
            ),
            "incomplete metadata",
        ),
        (
            "sub_byte_dtype_misaligned",
            file(
                r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#,
                &[0; 2],
            ),
            "byte boundary",
        ),
        (
            "tensor_count_overflow_offsets",
            file(
                &two(
                    &t("U8", "[18446744073709551615]", 0, 18446744073709551615),
                    &t("U8", "[1]", 18446744073709551615, 0),
                ),
                &[0; 1],
            ),
            "overflow",
        ),
        (
            "offsets_beyond_u64",
            file(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,99999999999999999999999]}}"#,
                &[0; 8],
            ),
            "invalid JSON",
        ),
    ]
}

#[test]
fn malformed_files_are_rejected_with_one_clear_error() {
    let out_dir = std::env::var_os("SAFETENSORS_MALFORMED_DIR").map(std::path::PathBuf::from);
    let cases = malformed();
    assert!(cases.len() >= 20);
    for (name, bytes, phrase) in cases {
        if let Some(d) = &out_dir {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join(format!("{name}.safetensors")), &bytes).unwrap();
        }
        let e = parse(&bytes, name).expect_err(name).to_string();
        assert!(
            e.starts_with(&format!("safetensors: {name}: ")) && e.contains(phrase),
            "{name}: {e}"
        );
        // Through a file too: the error names the path.
        let path = tmp(&format!("{name}.safetensors"));
        std::fs::write(&path, &bytes).unwrap();
        let e = SafetensorsFile::open(&path).err().expect(name).to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains(phrase),
            "{name}: {e}"
        );
    }
}

#[test]
fn valid_edge_cases_parse() {
    // No tensors at all; metadata only; zero-size tensors sharing an offset.
    assert!(parse(&file("{}", &[]), "x").unwrap().is_empty());
    assert!(
        parse(&file(r#"{"__metadata__":{"format":"pt"}}"#, &[]), "x")
            .unwrap()
            .is_empty()
    );
    let h = r#"{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let e = parse(&file(h, &[0; 4]), "x").unwrap();
    assert_eq!(e.len(), 2);
    // A dtype ferrite has no type for parses, and loading it is an error naming it.
    let path = tmp("i16.safetensors");
    std::fs::write(
        &path,
        file(
            r#"{"a":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}}"#,
            &[0; 4],
        ),
    )
    .unwrap();
    let f = SafetensorsFile::open(&path).unwrap();
    let e = f.tensor("a", &cpu()).unwrap_err().to_string();
    assert!(e.contains("I16") && e.contains("\"a\""), "{e}");
    assert!(f
        .tensor("zzz", &cpu())
        .unwrap_err()
        .to_string()
        .contains("zzz"));
}

//! The malformed-file generator: one file per validation rule of the reader (in the spirit of
//! llama.cpp's tests/test-gguf.cpp), each checked to be rejected with the right error.
//! `GGUF_MALFORMED_DIR=dir cargo test -p ferrite-gguf --test malformed` also writes the files
//! there (seeds for the fuzzer, inputs for `ferrite inspect` checks).

use ferrite_gguf::{Error, GgmlType, GgufFile, GgufWriter, Value};

/// Raw GGUF bytes, built field by field so that any field can be wrong.
#[derive(Clone)]
struct Raw {
    magic: [u8; 4],
    version: u32,
    n_tensors: Option<u64>,
    n_kv: Option<u64>,
    kvs: Vec<Vec<u8>>,
    infos: Vec<Vec<u8>>,
    alignment: u64,
    data: Vec<u8>,
}

fn string(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s);
    v
}

/// A key/value pair: key, type id, value bytes.
fn kv(key: &[u8], ty: u32, value: &[u8]) -> Vec<u8> {
    let mut v = string(key);
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(value);
    v
}

fn kv_u32(key: &str, x: u32) -> Vec<u8> {
    kv(key.as_bytes(), 4, &x.to_le_bytes())
}

/// A tensor info: name, n_dims, dims, type id, data offset.
fn info(name: &[u8], dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut v = string(name);
    v.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        v.extend_from_slice(&d.to_le_bytes());
    }
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(&offset.to_le_bytes());
    v
}

impl Raw {
    /// A valid file: two metadata values, an F32 [8, 2] tensor and a Q4_0 [32] tensor.
    fn valid() -> Raw {
        Raw {
            magic: *b"GGUF",
            version: 3,
            n_tensors: None,
            n_kv: None,
            kvs: vec![
                kv(b"general.architecture", 8, &string(b"llama")),
                kv_u32("llama.block_count", 2),
            ],
            infos: vec![info(b"a", &[8, 2], 0, 0), info(b"b", &[32], 2, 64)],
            alignment: 32,
            data: vec![0x3c; 64 + 18],
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut v = self.magic.to_vec();
        v.extend_from_slice(&self.version.to_le_bytes());
        v.extend_from_slice(
            &self
                .n_tensors
                .unwrap_or(self.infos.len() as u64)
                .to_le_bytes(),
        );
        v.extend_from_slice(&self.n_kv.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        self.kvs.iter().for_each(|k| v.extend_from_slice(k));
        self.infos.iter().for_each(|i| v.extend_from_slice(i));
        if !self.infos.is_empty() {
            while !(v.len() as u64).is_multiple_of(self.alignment) {
                v.push(0);
            }
        }
        v.extend_from_slice(&self.data);
        v
    }

    fn with(mut self, f: impl FnOnce(&mut Raw)) -> Raw {
        f(&mut self);
        self
    }
}

type Check = fn(&Error) -> bool;

/// (name, file bytes, expected error kind, text the message must contain).
fn cases() -> Vec<(&'static str, Vec<u8>, Check, &'static str)> {
    let v = Raw::valid;
    let valid_len = v().bytes().len();
    let mut out: Vec<(&'static str, Vec<u8>, Check, &'static str)> = vec![
        (
            "empty",
            vec![],
            |e| matches!(e, Error::BadMagic { len: 0, .. }),
            "not a GGUF file: the file is empty",
        ),
        (
            "bad_magic",
            v().with(|r| r.magic = *b"GGML").bytes(),
            |e| matches!(e, Error::BadMagic { .. }),
            r#"not a GGUF file: it starts with "GGML\x03\x00\x00\x00"; a GGUF file starts with "GGUF""#,
        ),
        (
            "png",
            b"\x89PNG\r\n\x1a\n\x00\x00".to_vec(),
            |e| matches!(e, Error::BadMagic { len: 10, .. }),
            r#"it starts with "\x89PNG\x0d\x0a\x1a\x0a" (a PNG image)"#,
        ),
        (
            "three_bytes",
            b"GGU".to_vec(),
            |e| matches!(e, Error::BadMagic { len: 3, .. }),
            r#"it starts with "GGU" (shorter than GGUF's 4-byte magic)"#,
        ),
        (
            "version_1",
            v().with(|r| r.version = 1).bytes(),
            |e| matches!(e, Error::UnsupportedVersion { version: 1, .. }),
            "obsolete",
        ),
        (
            "version_4",
            v().with(|r| r.version = 4).bytes(),
            |e| matches!(e, Error::UnsupportedVersion { version: 4, .. }),
            "offset 0x4",
        ),
        (
            "version_big_endian",
            v().with(|r| r.version = 3u32.swap_bytes()).bytes(),
            |e| matches!(e, Error::UnsupportedVersion { .. }),
            "big-endian",
        ),
        (
            "truncated_header",
            v().bytes()[..20].to_vec(),
            |e| matches!(e, Error::Truncated { .. }),
            "n_kv (offset 0x10)",
        ),
        (
            "n_kv_huge",
            v().with(|r| r.n_kv = Some(u64::MAX)).bytes(),
            |e| {
                matches!(
                    e,
                    Error::CountTooLarge {
                        count: u64::MAX,
                        ..
                    }
                )
            },
            "n_kv (offset 0x10)",
        ),
        (
            "n_kv_slightly_too_big",
            v().with(|r| r.n_kv = Some(1000)).bytes(),
            |e| matches!(e, Error::CountTooLarge { count: 1000, .. }),
            "n_kv",
        ),
        (
            "n_tensors_huge",
            v().with(|r| r.n_tensors = Some(1 << 60)).bytes(),
            |e| matches!(e, Error::BadValue { .. }),
            "n_tensors (offset 0x8): 1152921504606846976 tensors is more than the supported 65536",
        ),
        (
            "n_tensors_more_than_bytes_hold",
            v().with(|r| r.n_tensors = Some(1000)).bytes(),
            |e| matches!(e, Error::CountTooLarge { count: 1000, .. }),
            "n_tensors (offset 0x8)",
        ),
        (
            "n_tensors_more_than_present",
            v().with(|r| r.n_tensors = Some(3)).bytes(),
            |e| {
                matches!(
                    e,
                    Error::Truncated { .. } | Error::BadData { .. } | Error::CountTooLarge { .. }
                )
            },
            "tensor",
        ),
        (
            "key_length_huge",
            v().with(|r| r.kvs[0] = [u64::MAX.to_le_bytes().to_vec(), vec![0; 8]].concat())
                .bytes(),
            |e| matches!(e, Error::CountTooLarge { .. }),
            "key #0 (string length) (offset 0x18)",
        ),
        (
            "string_value_length_huge",
            v().with(|r| r.kvs[0] = kv(b"k", 8, &(1u64 << 40).to_le_bytes()))
                .bytes(),
            |e| matches!(e, Error::CountTooLarge { .. }),
            "value of 'k' (string length)",
        ),
        (
            "array_length_huge",
            v().with(|r| {
                r.kvs[0] = kv(
                    b"k",
                    9,
                    &[
                        4u32.to_le_bytes().to_vec(),
                        (1u64 << 62).to_le_bytes().to_vec(),
                    ]
                    .concat(),
                )
            })
            .bytes(),
            |e| matches!(e, Error::CountTooLarge { .. }),
            "array length of 'k'",
        ),
        (
            "array_length_overflows_bytes",
            v().with(|r| {
                r.kvs[0] = kv(
                    b"k",
                    9,
                    &[
                        10u32.to_le_bytes().to_vec(),
                        ((1u64 << 61) + 1).to_le_bytes().to_vec(),
                    ]
                    .concat(),
                )
            })
            .bytes(),
            |e| matches!(e, Error::CountTooLarge { .. }),
            "array length of 'k'",
        ),
        (
            "string_array_length_too_big",
            v().with(|r| {
                r.kvs[0] = kv(
                    b"k",
                    9,
                    &[8u32.to_le_bytes().to_vec(), 100u64.to_le_bytes().to_vec()].concat(),
                )
            })
            .bytes(),
            |e| matches!(e, Error::CountTooLarge { count: 100, .. }),
            "array length of 'k'",
        ),
        (
            "unknown_value_type",
            v().with(|r| r.kvs[1] = kv(b"k", 13, &[0; 8])).bytes(),
            |e| matches!(e, Error::UnknownValueType { id: 13, .. }),
            "value type of 'k'",
        ),
        (
            "unknown_array_element_type",
            v().with(|r| {
                r.kvs[1] = kv(
                    b"k",
                    9,
                    &[99u32.to_le_bytes().to_vec(), 1u64.to_le_bytes().to_vec()].concat(),
                )
            })
            .bytes(),
            |e| matches!(e, Error::UnknownValueType { id: 99, .. }),
            "array element type of 'k'",
        ),
        (
            "bool_not_0_or_1",
            v().with(|r| r.kvs[1] = kv(b"k", 7, &[2])).bytes(),
            |e| matches!(e, Error::BadValue { .. }),
            "value of 'k' (offset 0x52): bool byte 2 is neither 0 nor 1",
        ),
        (
            "bool_array_element_not_0_or_1",
            v().with(|r| {
                let arr = [
                    7u32.to_le_bytes().to_vec(),
                    3u64.to_le_bytes().to_vec(),
                    vec![1, 0, 5],
                ];
                r.kvs[1] = kv(b"k", 9, &arr.concat())
            })
            .bytes(),
            |e| matches!(e, Error::BadValue { .. }),
            "element 2 of 'k'",
        ),
        (
            "arrays_nested_too_deep",
            v().with(|r| {
                // array -> array -> array -> array of u8 (4 levels)
                let mut val = [
                    0u32.to_le_bytes().to_vec(),
                    1u64.to_le_bytes().to_vec(),
                    vec![7],
                ]
                .concat();
                for _ in 0..3 {
                    val = [
                        9u32.to_le_bytes().to_vec(),
                        1u64.to_le_bytes().to_vec(),
                        val,
                    ]
                    .concat();
                }
                r.kvs[1] = kv(b"k", 9, &val[4..]);
                r.kvs[1] = kv(b"k", 9, &val);
            })
            .bytes(),
            |e| matches!(e, Error::ArrayTooDeep { max: 3, .. }),
            "nested deeper than 3",
        ),
        (
            "too_many_nested_arrays",
            v().with(|r| {
                // An array of 70000 empty arrays of u8.
                let empty = [0u32.to_le_bytes().to_vec(), 0u64.to_le_bytes().to_vec()].concat();
                let head = [9u32.to_le_bytes().to_vec(), 70000u64.to_le_bytes().to_vec()];
                r.kvs[1] = kv(b"k", 9, &[head.concat(), empty.repeat(70000)].concat())
            })
            .bytes(),
            |e| matches!(e, Error::BadValue { .. }),
            "array length of 'k' (offset 0x56): more than 65536 arrays nested in arrays",
        ),
        (
            "duplicate_key",
            v().with(|r| r.kvs[1] = kv_u32("general.architecture", 1))
                .bytes(),
            |e| matches!(e, Error::DuplicateKey { .. }),
            "duplicate key 'general.architecture'",
        ),
        (
            "key_not_utf8",
            v().with(|r| r.kvs[1] = kv(b"k\xff", 4, &[0; 4])).bytes(),
            |e| matches!(e, Error::NotUtf8 { .. }),
            "key #1",
        ),
        (
            "string_value_not_utf8",
            v().with(|r| r.kvs[0] = kv(b"k", 8, &string(b"\xc3\x28")))
                .bytes(),
            |e| matches!(e, Error::NotUtf8 { .. }),
            "value of 'k'",
        ),
        (
            "alignment_zero",
            v().with(|r| r.kvs.push(kv_u32("general.alignment", 0)))
                .bytes(),
            |e| matches!(e, Error::BadAlignment { .. }),
            "0 is not a power of two",
        ),
        (
            "alignment_not_power_of_two",
            v().with(|r| r.kvs.push(kv_u32("general.alignment", 48)))
                .bytes(),
            |e| matches!(e, Error::BadAlignment { .. }),
            "48 is not a power of two",
        ),
        (
            "alignment_wrong_type",
            v().with(|r| {
                r.kvs
                    .push(kv(b"general.alignment", 10, &32u64.to_le_bytes()))
            })
            .bytes(),
            |e| matches!(e, Error::BadAlignment { .. }),
            "expected u32, found u64",
        ),
        (
            "tensor_name_not_utf8",
            v().with(|r| r.infos[0] = info(b"\xfe", &[8, 2], 0, 0))
                .bytes(),
            |e| matches!(e, Error::NotUtf8 { .. }),
            "tensor #0 name",
        ),
        (
            "tensor_name_length_huge",
            v().with(|r| r.infos[0] = [u64::MAX.to_le_bytes().to_vec(), vec![0; 32]].concat())
                .bytes(),
            |e| matches!(e, Error::CountTooLarge { .. }),
            "tensor #0 name (string length)",
        ),
        (
            "duplicate_tensor",
            v().with(|r| r.infos[1] = info(b"a", &[32], 2, 64)).bytes(),
            |e| matches!(e, Error::DuplicateTensor { .. }),
            "duplicate tensor name 'a'",
        ),
        (
            "n_dims_5",
            v().with(|r| r.infos[0] = info(b"a", &[1, 1, 1, 1, 16], 0, 0))
                .bytes(),
            |e| matches!(e, Error::BadShape { .. }),
            "n_dims 5 > 4",
        ),
        (
            "n_dims_huge",
            v().with(|r| {
                r.infos[0] = info(b"a", &[], 0, 0)
                    .into_iter()
                    .take(9)
                    .chain(u32::MAX.to_le_bytes())
                    .chain([0; 12])
                    .collect()
            })
            .bytes(),
            |e| matches!(e, Error::BadShape { .. }),
            "n_dims 4294967295 > 4",
        ),
        (
            "dim_zero",
            v().with(|r| r.infos[0] = info(b"a", &[8, 0], 0, 0)).bytes(),
            |e| matches!(e, Error::BadShape { .. }),
            "dims[1] is 0",
        ),
        (
            "element_count_overflow",
            v().with(|r| r.infos[0] = info(b"a", &[1 << 32, 1 << 32], 0, 0))
                .bytes(),
            |e| matches!(e, Error::BadShape { .. }),
            "element count overflows",
        ),
        (
            "byte_count_overflow",
            v().with(|r| r.infos[0] = info(b"a", &[1 << 31, 1 << 31], 28, 0))
                .bytes(),
            |e| matches!(e, Error::BadShape { .. }),
            "byte size",
        ),
        (
            "row_not_block_multiple",
            v().with(|r| r.infos[1] = info(b"b", &[33], 2, 64)).bytes(),
            |e| matches!(e, Error::BadShape { .. }),
            "row of 33 elements is not a multiple of the Q4_0 block size 32",
        ),
        (
            "unknown_tensor_type",
            v().with(|r| r.infos[0] = info(b"a", &[8, 2], 1000, 0))
                .bytes(),
            |e| matches!(e, Error::UnknownTensorType { id: 1000, .. }),
            "unknown tensor type id 1000",
        ),
        (
            "removed_tensor_type_q4_2",
            v().with(|r| r.infos[1] = info(b"b", &[32], 4, 64)).bytes(),
            |e| matches!(e, Error::UnknownTensorType { id: 4, .. }),
            "tensor 'b'",
        ),
        (
            "data_misaligned",
            v().with(|r| r.infos[1] = info(b"b", &[32], 2, 65)).bytes(),
            |e| matches!(e, Error::BadData { .. }),
            "not a multiple of the alignment 32",
        ),
        (
            "data_overlap",
            v().with(|r| r.infos[1] = info(b"b", &[32], 2, 32)).bytes(),
            |e| matches!(e, Error::BadData { .. }),
            "overlaps tensor 'a'",
        ),
        (
            "data_past_end",
            v().with(|r| r.infos[1] = info(b"b", &[64], 2, 64)).bytes(),
            |e| matches!(e, Error::BadData { .. }),
            "past end of file",
        ),
        (
            "data_offset_overflows",
            v().with(|r| r.infos[1] = info(b"b", &[32], 2, u64::MAX - 31))
                .bytes(),
            |e| matches!(e, Error::BadData { .. }),
            "past end of file",
        ),
        (
            "data_section_missing",
            {
                let b = v().bytes();
                b[..b.len() - 64 - 18 - 10].to_vec()
            },
            |e| matches!(e, Error::Truncated { .. }),
            "padding before tensor data",
        ),
        (
            "data_truncated",
            v().bytes()[..valid_len - 1].to_vec(),
            |e| matches!(e, Error::BadData { .. }),
            "tensor 'b'",
        ),
        (
            "truncated_in_kv",
            v().with(|r| {
                r.infos.clear();
                r.data.clear();
            })
            .bytes()[..60]
                .to_vec(),
            |e| matches!(e, Error::Truncated { .. }),
            "value of 'general.architecture' (string length)",
        ),
        (
            "truncated_in_tensor_info",
            {
                let r = v();
                let n = 24 + r.kvs.iter().map(Vec::len).sum::<usize>() + 12;
                r.bytes()[..n].to_vec()
            },
            |e| matches!(e, Error::Truncated { .. } | Error::CountTooLarge { .. }),
            "tensor 'a'",
        ),
    ];
    out.sort_by_key(|c| c.0);
    out
}

#[test]
fn valid_base_file_opens() {
    let f = GgufFile::from_bytes(Raw::valid().bytes()).unwrap();
    assert_eq!(f.tensors().len(), 2);
    assert_eq!(f.tensor("b").unwrap().offset, f.data_start() + 64);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
}

#[test]
fn names_with_control_characters_stay_on_one_line_in_errors() {
    let long = format!("a\nb\"c{}", "x".repeat(200));
    let bytes = Raw::valid()
        .with(|r| r.infos[1] = info(long.as_bytes(), &[33], 2, 64))
        .bytes();
    let msg = GgufFile::from_bytes(bytes).unwrap_err().to_string();
    assert!(!msg.contains('\n'), "{msg}");
    assert!(msg.starts_with("gguf: tensor 'a\\nb\\\"cxxx"), "{msg}");
    assert!(msg.contains("xxx...' (offset"), "{msg}");
    let bytes = Raw::valid()
        .with(|r| r.kvs[1] = kv(b"k\r\n", 13, &[]))
        .bytes();
    let msg = GgufFile::from_bytes(bytes).unwrap_err().to_string();
    assert!(
        msg.starts_with("gguf: value type of 'k\\r\\n' (offset"),
        "{msg}"
    );
}

#[test]
fn version_2_files_open() {
    let f = GgufFile::from_bytes(Raw::valid().with(|r| r.version = 2).bytes()).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.tensors().len(), 2);
}

#[test]
fn directories_and_missing_files_are_errors() {
    let e = GgufFile::open(std::env::temp_dir())
        .unwrap_err()
        .to_string();
    assert!(e.ends_with("not a regular file"), "{e}");
    let e = GgufFile::open("/no/such/file.gguf")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("gguf: /no/such/file.gguf: "), "{e}");
}

#[test]
fn every_malformed_file_is_rejected_with_the_right_error() {
    let dir = std::env::var_os("GGUF_MALFORMED_DIR").map(std::path::PathBuf::from);
    if let Some(d) = &dir {
        std::fs::create_dir_all(d).unwrap();
    }
    let cases = cases();
    assert!(cases.len() >= 40);
    for (name, bytes, check, text) in cases {
        if let Some(d) = &dir {
            std::fs::write(d.join(format!("{name}.gguf")), &bytes).unwrap();
        }
        let err = match GgufFile::from_bytes(bytes) {
            Ok(_) => panic!("{name}: accepted"),
            Err(e) => e,
        };
        let msg = err.to_string();
        assert!(check(&err), "{name}: wrong error kind: {msg}");
        assert!(msg.contains(text), "{name}: message {msg:?} lacks {text:?}");
        assert!(msg.starts_with("gguf: "), "{name}: {msg}");
        assert!(!msg.contains('\n'), "{name}: multi-line message {msg:?}");
    }
}

#[test]
fn error_message_format_names_tensor_offset_and_range() {
    let bytes = Raw::valid()
        .with(|r| r.infos[1] = info(b"blk.0.attn_q.weight", &[64], 2, 64))
        .bytes();
    let len = bytes.len();
    let msg = GgufFile::from_bytes(bytes).unwrap_err().to_string();
    // Tensor info 'b' starts after the header (24 bytes), the two kvs and tensor 'a''s info.
    let off =
        24 + Raw::valid().kvs.iter().map(Vec::len).sum::<usize>() + info(b"a", &[8, 2], 0, 0).len();
    assert_eq!(
        msg,
        format!(
            "gguf: tensor 'blk.0.attn_q.weight' (offset {off:#x}): data [{:#x}, {:#x}) past end of file ({len} bytes)",
            len - 82 + 64,
            len - 82 + 64 + 36
        )
    );
}

#[test]
fn every_prefix_of_a_valid_file_is_rejected_without_panic() {
    let bytes = Raw::valid().bytes();
    for n in 0..bytes.len() {
        assert!(
            GgufFile::from_bytes(bytes[..n].to_vec()).is_err(),
            "prefix of {n} bytes accepted"
        );
    }
}

#[test]
fn random_mutations_never_panic() {
    let base = {
        let mut w = GgufWriter::new();
        w.set("s", Value::String("abc".into())).unwrap();
        w.set(
            "a",
            Value::Array(ferrite_gguf::Array::String(vec!["x", "yz"].into())),
        )
        .unwrap();
        w.set(
            "n",
            Value::Array(ferrite_gguf::Array::Array(vec![ferrite_gguf::Array::U16(
                vec![1, 2],
            )])),
        )
        .unwrap();
        w.add_f32_tensor("t", GgmlType::Q4_K, &[256, 2], &[0.5; 512])
            .unwrap();
        w.add_f32_tensor("u", GgmlType::F16, &[3], &[1.0, 2.0, 3.0])
            .unwrap();
        w.to_bytes().unwrap()
    };
    let header_len = GgufFile::from_bytes(base.clone()).unwrap().data_start() as usize;
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut rejected = 0;
    for _ in 0..20_000 {
        let mut b = base.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() as usize) % header_len;
            b[i] = match next() % 4 {
                0 => 0xff,
                1 => 0,
                2 => b[i] ^ (1 << (next() % 8)),
                _ => next() as u8,
            };
        }
        if let Err(e) = GgufFile::from_bytes(b) {
            rejected += 1;
            assert!(!e.to_string().contains('\n'));
        }
    }
    assert!(
        rejected > 10_000,
        "only {rejected} of 20000 mutations rejected"
    );
}

#[test]
fn unsupported_tensor_type_fails_only_when_used() {
    let mut w = GgufWriter::new();
    w.add_tensor("iq", GgmlType::IQ2_XXS, &[256], vec![0; 66])
        .unwrap();
    // amax 127 makes the Q8_0 scale exactly 1, so integers survive exactly.
    let x: Vec<f32> = (0..32)
        .map(|i| if i == 0 { 127.0 } else { i as f32 - 16.0 })
        .collect();
    w.add_f32_tensor("ok", GgmlType::Q8_0, &[32], &x).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.tensor_f32("ok").unwrap(), x);
    let t = f.tensor("iq").unwrap();
    assert_eq!((t.ty, t.n_bytes), (GgmlType::IQ2_XXS, 66));
    assert_eq!(f.tensor_data(t).len(), 66);
    assert_eq!(
        f.tensor_f32("iq").unwrap_err().to_string(),
        "unsupported tensor type IQ2_XXS in tensor iq"
    );
}

//! Datasets, samplers and the DataLoader: file parsing and its errors, order and resumption,
//! workers giving the same batches as the caller's thread.

use ferrite_core::{Device, HostBuffer, Tensor};
use ferrite_train::data::{
    epoch_order, CsvDataset, CsvOptions, CsvTarget, DataLoader, DataLoaderConfig, Dataset,
    DrawContext, HostTensor, IdxDataset, IdxFile, ImageFolder, Sampler, TextWindows, Transform,
    Transformed,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn cpu() -> Device {
    ferrite_cpu::cpu()
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferrite-train-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

/// An IDX file of u8 with the given dims and data, gzipped when `gz`.
fn write_idx(path: &Path, dims: &[u32], data: &[u8], gz: bool) {
    let mut b = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        b.extend(d.to_be_bytes());
    }
    b.extend(data);
    let bytes = if gz {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(&b).expect("gz");
        e.finish().expect("gz")
    } else {
        b
    };
    std::fs::write(path, bytes).expect("write idx");
}

fn mnist_like(dir: &Path, n: usize, gz: bool) -> (PathBuf, PathBuf) {
    let img: Vec<u8> = (0..n * 4 * 3).map(|i| (i * 7 % 256) as u8).collect();
    let lab: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
    let (pi, pl) = (dir.join("img.idx"), dir.join("lab.idx"));
    write_idx(&pi, &[n as u32, 4, 3], &img, gz);
    write_idx(&pl, &[n as u32], &lab, gz);
    (pi, pl)
}

const CTX: DrawContext = DrawContext { seed: 1, epoch: 0 };

#[test]
fn idx_reads_plain_and_gzipped_files() {
    for gz in [false, true] {
        let d = tmpdir(&format!("idx{gz}"));
        let (pi, pl) = mnist_like(&d, 13, gz);
        let ds = IdxDataset::open(&pi, &pl).expect("open");
        assert_eq!(
            (ds.len(), ds.image_size(), ds.num_classes()),
            (13, (4, 3), 10)
        );
        let ex = ds.get(5, CTX).expect("get");
        assert_eq!(ex[0].shape, vec![1, 4, 3]);
        let HostBuffer::F32(px) = &ex[0].data else {
            panic!("f32 image")
        };
        assert_eq!(px[0], ((5 * 12 * 7) % 256) as f32 / 255.0);
        assert_eq!(ex[1].data, HostBuffer::I64(vec![5]));
        let ds = ds.normalized(0.5, 0.25).expect("norm");
        let HostBuffer::F32(px) = &ds.get(0, CTX).expect("get")[0].data else {
            panic!()
        };
        assert_eq!(px[1], (7.0 / 255.0 - 0.5) / 0.25);
    }
}

#[test]
fn idx_errors_name_the_file_and_offset() {
    let d = tmpdir("idxbad");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("short", vec![0, 0], "shorter than the 4-byte"),
        ("magic", vec![1, 0, 8, 1, 0, 0, 0, 1, 5], "not an IDX file"),
        (
            "type",
            vec![0, 0, 0x0d, 1, 0, 0, 0, 1, 5],
            "element type 0x0d",
        ),
        ("dims0", vec![0, 0, 8, 0], "0 dimensions"),
        (
            "header",
            vec![0, 0, 8, 3, 0, 0, 0, 1],
            "inside the 16-byte header",
        ),
        ("data", vec![0, 0, 8, 1, 0, 0, 0, 9, 1, 2], "the file has 2"),
        (
            "huge",
            vec![
                0, 0, 8, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 9,
            ],
            "too large",
        ),
    ];
    for (name, bytes, want) in cases {
        let p = d.join(name);
        std::fs::write(&p, &bytes).expect("write");
        let err = IdxFile::open(&p).expect_err(name).to_string();
        assert!(err.contains(want) && err.contains(name), "{name}: {err}");
    }
    let p = d.join("badgz");
    std::fs::write(&p, [0x1f, 0x8b, 1, 2, 3]).expect("write");
    let err = IdxFile::open(&p).expect_err("gz").to_string();
    assert!(err.contains("gzip"), "{err}");
    let err = IdxDataset::fashion_mnist(Some(&d), true)
        .expect_err("missing")
        .to_string();
    assert!(
        err.contains("train-images-idx3-ubyte.gz") && err.contains("dataset-fashion-mnist"),
        "{err}"
    );
    // Images and labels that disagree in count.
    let (pi, _) = mnist_like(&d, 4, false);
    write_idx(&d.join("lab3"), &[3], &[1, 2, 3], false);
    let err = IdxDataset::open(&pi, &d.join("lab3"))
        .expect_err("count")
        .to_string();
    assert!(
        err.contains("4 images") && err.contains("3 labels"),
        "{err}"
    );
}

#[test]
fn csv_selects_columns_maps_classes_and_names_bad_lines() {
    let d = tmpdir("csv");
    let p = d.join("t.csv");
    std::fs::write(&p, "a,b,label,c\n1,2,cat,3\n4,5,dog,6\n7,8,cat,9\n").expect("write");
    let ds = CsvDataset::open(&p, &CsvOptions::new("label", CsvTarget::Class)).expect("open");
    assert_eq!((ds.len(), ds.num_features()), (3, 3));
    assert_eq!(ds.classes, vec!["cat", "dog"]);
    assert_eq!(ds.feature_names, vec!["a", "b", "c"]);
    let ex = ds.get(1, CTX).expect("row");
    assert_eq!(ex[0].data, HostBuffer::F32(vec![4.0, 5.0, 6.0]));
    assert_eq!(ex[1].data, HostBuffer::I64(vec![1]));
    let mut o = CsvOptions::new("c", CsvTarget::Regression);
    o.features = Some(vec!["b".into(), "0".into()]);
    let ds = CsvDataset::open(&p, &o).expect("open");
    let ex = ds.get(2, CTX).expect("row");
    assert_eq!(ex[0].data, HostBuffer::F32(vec![8.0, 7.0]));
    assert_eq!(
        (ex[1].data.clone(), ex[1].shape.clone()),
        (HostBuffer::F32(vec![9.0]), vec![1])
    );
    // TSV by extension.
    let t = d.join("t.tsv");
    std::fs::write(&t, "x\ty\n1\t0.5\n2\t1.5\n").expect("write");
    let ds = CsvDataset::open(&t, &CsvOptions::new("y", CsvTarget::Regression)).expect("tsv");
    assert_eq!(
        ds.get(1, CTX).expect("row")[0].data,
        HostBuffer::F32(vec![2.0])
    );
    // Errors name the file, the line and the column.
    for (body, want) in [
        ("a,b\n1,2\nx,3\n", "line 3, column 1: `x` is not a number"),
        ("a,b\n1,2\n3\n", "line 3"),
        ("a,b\n1,2\n3,inf\n", "not a finite number"),
        ("a,b\n", "no data rows"),
    ] {
        std::fs::write(&p, body).expect("write");
        let o = CsvOptions::new("b", CsvTarget::Regression);
        let err = CsvDataset::open(&p, &o).expect_err(want).to_string();
        assert!(err.contains("t.csv") && err.contains(want), "{want}: {err}");
    }
    std::fs::write(&p, "a,b\n1,2\n").expect("write");
    let err = CsvDataset::open(&p, &CsvOptions::new("zz", CsvTarget::Class))
        .expect_err("col")
        .to_string();
    assert!(
        err.contains("no column `zz`") && err.contains("a, b"),
        "{err}"
    );
}

#[test]
fn text_windows_shift_targets_by_one() {
    let w = TextWindows::chars("hello world", 4, 3).expect("windows");
    assert_eq!(w.vocab_size(), 8);
    assert_eq!(w.len(), 3);
    let ex = w.get(1, CTX).expect("get");
    let (HostBuffer::U32(x), HostBuffer::U32(y)) = (&ex[0].data, &ex[1].data) else {
        panic!()
    };
    assert_eq!(w.decode(x), "lo w");
    assert_eq!(w.decode(y), "o wo");
    assert!(TextWindows::chars("ab", 4, 1).is_err());
    let err = TextWindows::chars_with_vocab("abz", &['a', 'b'], 1, 1)
        .expect_err("oov")
        .to_string();
    assert!(err.contains("'z'") && err.contains("offset 2"), "{err}");
}

#[test]
fn samplers_are_deterministic_permutations_and_weighted() {
    let s = Sampler::Random {
        replacement: false,
        num_samples: None,
    };
    let a = epoch_order(&s, 1000, 7, 0);
    assert_eq!(
        a,
        epoch_order(&s, 1000, 7, 0),
        "same seed and epoch, same order"
    );
    assert_ne!(a, epoch_order(&s, 1000, 7, 1), "a new order each epoch");
    assert_ne!(a, epoch_order(&s, 1000, 8, 0), "a new order per seed");
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(sorted, (0..1000).collect::<Vec<_>>(), "a permutation");
    let w = Sampler::Weighted {
        weights: vec![0.0, 1.0, 3.0],
        num_samples: 40_000,
        replacement: true,
    };
    let draws = epoch_order(&w, 3, 1, 0);
    let count = |k| draws.iter().filter(|&&i| i == k).count() as f64 / 40_000.0;
    assert_eq!(count(0), 0.0);
    assert!(
        (count(2) - 0.75).abs() < 0.01,
        "weight 3 of 4: {}",
        count(2)
    );
    let wo = Sampler::Weighted {
        weights: vec![1.0, 0.0, 5.0, 2.0],
        num_samples: 3,
        replacement: false,
    };
    let mut d = epoch_order(&wo, 4, 3, 0);
    d.sort();
    assert_eq!(
        d,
        vec![0, 2, 3],
        "without replacement: each positive weight once"
    );
    assert!(Sampler::Weighted {
        weights: vec![1.0],
        num_samples: 2,
        replacement: false
    }
    .validate(1)
    .is_err());
    assert!(Sampler::Weighted {
        weights: vec![-1.0, 1.0],
        num_samples: 1,
        replacement: true
    }
    .validate(2)
    .is_err());
}

/// Example i: [x f32 [2] = (i, -i), y i64 [] = i].
struct Counting(usize);

impl Dataset for Counting {
    fn len(&self) -> usize {
        self.0
    }
    fn get(&self, i: usize, _ctx: DrawContext) -> ferrite_train::Result<Vec<HostTensor>> {
        Ok(vec![
            HostTensor::new(HostBuffer::F32(vec![i as f32, -(i as f32)]), vec![2])?,
            HostTensor::scalar(HostBuffer::I64(vec![i as i64])),
        ])
    }
}

fn labels(
    batches: impl Iterator<Item = ferrite_train::Result<ferrite_train::data::Batch>>,
) -> Vec<Vec<i64>> {
    batches
        .map(|b| b.expect("batch").fields[1].to_vec::<i64>().expect("labels"))
        .collect()
}

#[test]
fn loader_batches_in_order_with_or_without_workers_and_resumes() {
    let dev = cpu();
    let ds: Arc<dyn Dataset> = Arc::new(Counting(23));
    let mut cfg = DataLoaderConfig::new(5).shuffle(42);
    cfg.num_workers = 0;
    let mut plain = DataLoader::new(ds.clone(), cfg.clone()).expect("loader");
    assert_eq!(plain.len(), 5);
    let e0 = labels(plain.iter(&dev));
    assert_eq!(
        e0.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![5, 5, 5, 5, 3]
    );
    let mut all: Vec<i64> = e0.concat();
    all.sort();
    assert_eq!(all, (0..23).collect::<Vec<i64>>());
    let e1 = labels(plain.iter(&dev));
    assert_ne!(e0, e1, "epoch 1 reshuffles");

    for workers in [1, 3, 8] {
        let mut c = cfg.clone();
        c.num_workers = workers;
        c.prefetch = 2;
        let mut l = DataLoader::new(ds.clone(), c).expect("loader");
        assert_eq!(labels(l.iter(&dev)), e0, "{workers} workers, epoch 0");
        assert_eq!(labels(l.iter(&dev)), e1, "{workers} workers, epoch 1");
    }
    // Fields are stacked: x is [B, 2] with rows (i, -i).
    let mut l = DataLoader::new(ds.clone(), cfg.clone()).expect("loader");
    let b = l.iter(&dev).next().expect("one").expect("batch");
    assert_eq!(b.fields[0].dims(), &[5, 2]);
    let x = b.fields[0].to_vec::<f32>().expect("x");
    let y = b.fields[1].to_vec::<i64>().expect("y");
    assert_eq!(x[2], y[1] as f32);
    assert_eq!(x[3], -(y[1] as f32));

    // Interrupt epoch 1 after two batches, save, resume in a fresh loader.
    let mut a = DataLoader::new(ds.clone(), cfg.clone()).expect("loader");
    let _ = labels(a.iter(&dev));
    let first_two = labels(a.iter(&dev).take(2));
    let saved = a.state();
    assert_eq!((saved.epoch, saved.batch), (1, 2));
    let mut r = DataLoader::new(ds.clone(), cfg.clone()).expect("loader");
    r.load_state(saved).expect("resume");
    let rest = labels(r.iter(&dev));
    assert_eq!(
        [first_two, rest].concat(),
        e1,
        "resumed epoch equals the uninterrupted one"
    );
    let mut c = cfg.clone();
    c.drop_last = true;
    let mut d = DataLoader::new(ds.clone(), c).expect("loader");
    assert_eq!(d.len(), 4);
    assert_eq!(labels(d.iter(&dev)).len(), 4);
    assert!(r
        .load_state(ferrite_train::data::LoaderState { epoch: 0, batch: 9 })
        .is_err());
}

#[test]
fn loader_settings_and_collation_errors_are_reported() {
    let ds: Arc<dyn Dataset> = Arc::new(Counting(4));
    assert!(DataLoader::new(ds.clone(), DataLoaderConfig::new(0)).is_err());
    let mut c = DataLoaderConfig::new(2);
    c.prefetch = 0;
    assert!(DataLoader::new(ds.clone(), c).is_err());
    assert!(DataLoader::new(Arc::new(Counting(0)), DataLoaderConfig::new(2)).is_err());

    /// Examples of changing shape cannot be stacked.
    struct Ragged;
    impl Dataset for Ragged {
        fn len(&self) -> usize {
            3
        }
        fn get(&self, i: usize, _: DrawContext) -> ferrite_train::Result<Vec<HostTensor>> {
            Ok(vec![HostTensor::new(
                HostBuffer::F32(vec![0.0; i + 1]),
                vec![i + 1],
            )?])
        }
    }
    let dev = cpu();
    for workers in [0, 2] {
        let mut c = DataLoaderConfig::new(3);
        c.num_workers = workers;
        let mut l = DataLoader::new(Arc::new(Ragged), c).expect("loader");
        let err = l
            .iter(&dev)
            .next()
            .expect("one")
            .expect_err("ragged")
            .to_string();
        assert!(
            err.contains("collate") && err.contains("field 0 of example 1"),
            "{err}"
        );
    }
}

#[test]
fn image_folder_reads_classes_and_applies_seeded_transforms() {
    let d = tmpdir("img");
    for (class, shade) in [("ants", 10u8), ("bees", 200u8)] {
        std::fs::create_dir_all(d.join(class)).expect("mkdir");
        for k in 0..3u8 {
            let img = image::RgbImage::from_fn(6, 4, |x, y| {
                image::Rgb([shade, (x * 40) as u8, (y * 60 + k as u32) as u8])
            });
            img.save(d.join(class).join(format!("{k}.png")))
                .expect("png");
        }
    }
    std::fs::write(d.join("ants").join("notes.txt"), "not an image").expect("txt");
    let plain = ImageFolder::open(&d, vec![], false).expect("open");
    assert_eq!(
        (plain.len(), plain.classes.clone()),
        (6, vec!["ants".to_string(), "bees".to_string()])
    );
    let ex = plain.get(4, CTX).expect("get");
    assert_eq!(ex[0].shape, vec![3, 4, 6]);
    assert_eq!(ex[1].data, HostBuffer::I64(vec![1]));
    let HostBuffer::F32(v) = &ex[0].data else {
        panic!()
    };
    assert_eq!(v[0], 200.0 / 255.0);
    assert_eq!(
        v[4 * 6 + 5],
        200.0 / 255.0 * 0.0 + (5.0 * 40.0) / 255.0,
        "channel 1 at x = 5"
    );

    let flip = ImageFolder::open(&d, vec![Transform::RandomHorizontalFlip { p: 1.0 }], false)
        .expect("flip");
    let HostBuffer::F32(f) = &flip.get(4, CTX).expect("get")[0].data else {
        panic!()
    };
    assert_eq!(f[4 * 6], v[4 * 6 + 5], "mirrored");
    let aug = vec![
        Transform::Resize {
            height: 8,
            width: 8,
        },
        Transform::RandomCrop {
            height: 6,
            width: 6,
            padding: 1,
        },
        Transform::Normalize {
            mean: vec![0.5],
            std: vec![0.25],
        },
    ];
    let ds = ImageFolder::open(&d, aug, true).expect("aug");
    let a = ds.get(2, CTX).expect("a");
    assert_eq!(a[0].shape, vec![1, 6, 6]);
    assert_eq!(
        a,
        ds.get(2, CTX).expect("again"),
        "same (seed, epoch, index), same crop"
    );
    let crops: Vec<_> = (0..8)
        .map(|e| {
            ds.get(2, DrawContext { seed: 1, epoch: e }).expect("crop")[0]
                .data
                .clone()
        })
        .collect();
    assert!(
        crops.iter().any(|c| *c != crops[0]),
        "crops vary across epochs"
    );
    // Errors: missing folder, bad settings, a file that is not an image.
    assert!(ImageFolder::open(&d.join("none"), vec![], false).is_err());
    assert!(
        ImageFolder::open(&d, vec![Transform::RandomHorizontalFlip { p: 2.0 }], false).is_err()
    );
    std::fs::write(d.join("bees").join("broken.png"), "xx").expect("write");
    let ds = ImageFolder::open(&d, vec![], false).expect("open");
    let i = (0..ds.len())
        .find(|&i| ds.get(i, CTX).is_err())
        .expect("broken one fails");
    let err = ds.get(i, CTX).expect_err("broken").to_string();
    assert!(
        err.contains("broken.png") && err.contains("cannot decode"),
        "{err}"
    );
    let big = ImageFolder::open(
        &d,
        vec![Transform::RandomCrop {
            height: 50,
            width: 5,
            padding: 0,
        }],
        false,
    )
    .expect("open");
    assert!(big
        .get(0, CTX)
        .expect_err("crop")
        .to_string()
        .contains("larger than the padded image"));
    let _ = Tensor::zeros([1], ferrite_core::DType::F32, &cpu());
}

/// Transforms over another dataset's images: a crop of a zero-padded IDX image is the image
/// shifted by the drawn offset, a flip mirrors rows, labels pass through; bad fields are
/// errors naming the example.
#[test]
fn transformed_augments_any_image_dataset() {
    let d = tmpdir("transformed");
    let (pi, pl) = mnist_like(&d, 5, false);
    let raw = IdxDataset::open(&pi, &pl).expect("open");
    let crop = Transformed::new(
        raw.clone(),
        vec![Transform::RandomCrop {
            height: 4,
            width: 3,
            padding: 1,
        }],
    )
    .expect("crop");
    let (orig, shifted) = (
        raw.get(3, CTX).expect("raw"),
        crop.get(3, CTX).expect("crop"),
    );
    assert_eq!(shifted[0].shape, vec![1, 4, 3]);
    assert_eq!(shifted[1], orig[1], "the label passes through");
    let (HostBuffer::F32(o), HostBuffer::F32(s)) = (&orig[0].data, &shifted[0].data) else {
        panic!("f32 images")
    };
    // Some shift (dy, dx) in [-1, 1]^2 maps the original onto the crop, zeros outside.
    let at = |y: isize, x: isize| -> f32 {
        if (0..4).contains(&y) && (0..3).contains(&x) {
            o[(y * 3 + x) as usize]
        } else {
            0.0
        }
    };
    let matches = (-1..=1)
        .flat_map(|dy| (-1..=1).map(move |dx| (dy, dx)))
        .filter(|&(dy, dx)| {
            (0..4).all(|y| (0..3).all(|x| s[(y * 3 + x) as usize] == at(y + dy, x + dx)))
        })
        .count();
    assert!(matches >= 1, "the crop is a shifted copy: {o:?} vs {s:?}");
    let shifts: std::collections::HashSet<Vec<u32>> = (0..16)
        .map(|e| {
            let HostBuffer::F32(v) =
                &crop.get(3, DrawContext { seed: 1, epoch: e }).expect("c")[0].data
            else {
                panic!()
            };
            v.iter().map(|f| f.to_bits()).collect()
        })
        .collect();
    assert!(shifts.len() > 1, "offsets vary across epochs");
    let flip = Transformed::new(
        raw.clone(),
        vec![Transform::RandomHorizontalFlip { p: 1.0 }],
    )
    .expect("flip");
    let HostBuffer::F32(f) = &flip.get(3, CTX).expect("flip")[0].data else {
        panic!()
    };
    assert_eq!((f[0], f[2], f[3]), (o[2], o[0], o[5]), "rows mirrored");
    assert!(Transformed::new(raw, vec![Transform::RandomHorizontalFlip { p: -1.0 }]).is_err());
    // A dataset whose first field is not an f32 image.
    let text = TextWindows::chars("hello world", 4, 3).expect("windows");
    let err = Transformed::new(text, vec![])
        .expect("no transforms")
        .get(0, CTX)
        .expect_err("not an image")
        .to_string();
    assert!(
        err.contains("example 0") && err.contains("field 0"),
        "{err}"
    );
}

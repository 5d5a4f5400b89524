//! `Tensor::copy_`: in-place writes into an existing buffer (parameters, buffers).

use ferrite_core::{DType, Tensor};
use ferrite_cpu::{cpu, CpuStorage};

fn addr(t: &Tensor) -> usize {
    t.storage()
        .as_any()
        .downcast_ref::<CpuStorage>()
        .expect("a CPU tensor")
        .as_ptr()
}

#[test]
fn copy_writes_in_place_and_views_see_it() {
    let dev = cpu();
    let dst = Tensor::zeros([2, 3], DType::F32, &dev).unwrap();
    let view = dst.narrow(1, 1, 2).unwrap();
    let before = addr(&dst);
    let src = Tensor::from_vec((0..6).map(|i| i as f32).collect(), [2, 3], &dev).unwrap();
    dst.copy_(&src).unwrap();
    assert_eq!(addr(&dst), before);
    assert_eq!(dst.to_vec::<f32>().unwrap(), [0., 1., 2., 3., 4., 5.]);
    assert_eq!(view.to_vec::<f32>().unwrap(), [1., 2., 4., 5.]);
    // Strided source, broadcast source, cast source.
    dst.copy_(
        &src.reshape([3, 2])
            .unwrap()
            .t()
            .unwrap()
            .contiguous()
            .unwrap()
            .t()
            .unwrap()
            .t()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(dst.to_vec::<f32>().unwrap(), [0., 2., 4., 1., 3., 5.]);
    dst.copy_(&Tensor::from_vec(vec![7.0f64, 8.0, 9.0], [3], &dev).unwrap())
        .unwrap();
    assert_eq!(dst.to_vec::<f32>().unwrap(), [7., 8., 9., 7., 8., 9.]);
    assert_eq!(addr(&dst), before);
}

#[test]
fn copy_from_an_overlapping_view_of_itself() {
    let dev = cpu();
    let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], &dev).unwrap();
    let before = addr(&t);
    t.copy_(&t.t().unwrap()).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), [1., 3., 2., 4.]);
    assert_eq!(addr(&t), before);
    t.copy_(&t).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), [1., 3., 2., 4.]);
}

#[test]
fn copy_errors_name_the_problem() {
    let dev = cpu();
    let dst = Tensor::zeros([2, 3], DType::F32, &dev).unwrap();
    let e = dst
        .copy_(&Tensor::zeros([4], DType::F32, &dev).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("copy_") && e.contains("[4]") && e.contains("[2, 3]"),
        "{e}"
    );
    let e = dst
        .t()
        .unwrap()
        .copy_(&dst.t().unwrap().contiguous().unwrap());
    let e = e.unwrap_err().to_string();
    assert!(e.contains("contiguous"), "{e}");
}

#[test]
fn concurrent_reads_never_see_a_torn_write() {
    // Readers on other threads see either all old or all new values of each write.
    let dev = cpu();
    let n = 1 << 16;
    let t = Tensor::zeros([n], DType::F32, &dev).unwrap();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let t = t.clone();
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let v = t.to_vec::<f32>().unwrap();
                    assert!(v.iter().all(|&x| x == v[0]), "torn read");
                    let s = t.sum_all().unwrap().item::<f32>().unwrap();
                    assert_eq!(s % n as f32, 0.0);
                }
            })
        })
        .collect();
    for k in 1..200 {
        t.copy_(&Tensor::full(k as f64, [n], DType::F32, &dev).unwrap())
            .unwrap();
    }
    for r in readers {
        r.join().unwrap();
    }
}

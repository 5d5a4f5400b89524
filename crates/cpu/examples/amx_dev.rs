//! Times one packed Q4_1 product (1536 x 576, SmolLM2's gate) with 8 q8x2 activation rows:
//! the AVX-512 kernels (two passes of four rows) against the 16-bit pairs (`group_w16`) and,
//! where the CPU has them, the AMX tiles (one pass of eight each), on one thread. `cargo run --release -p ferrite-cpu --example amx_dev`; `AMX_DEV_ROWS=98304`
//! makes the matrix 35 MB, larger than L2, to time the product streaming from L3.
use std::time::Instant;

use ferrite_cpu::quant::packed::{self, AmxTiles, GroupActs};
use ferrite_cpu::quant::q8::{quantize_q8x2, BlockQ8};
use ferrite_cpu::quant::Isa;
use ferrite_gguf::GgmlType;

fn main() {
    let rows: usize = std::env::var("AMX_DEV_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|r: &usize| r.is_multiple_of(16) && *r > 0)
        .unwrap_or(1536);
    let cols = 576usize;
    let nb = cols / 32;
    let mut seed = 1u64;
    let mut rnd = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as u32
    };
    // AMX_DEV_Q8_0=1: a Q8_0 matrix (the output matrix's type) instead of Q4_1.
    let ty = match std::env::var("AMX_DEV_Q8_0").as_deref() {
        Ok("1") => GgmlType::Q8_0,
        _ => GgmlType::Q4_1,
    };
    let block = if ty == GgmlType::Q8_0 { 34 } else { 20 };
    let mut data = vec![0u8; rows * nb * block];
    for b in data.chunks_exact_mut(block) {
        b[0..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        let q0 = if ty == GgmlType::Q8_0 {
            2
        } else {
            b[2..4].copy_from_slice(&half::f16::from_f32(-0.05).to_le_bytes());
            4
        };
        for x in &mut b[q0..] {
            *x = rnd() as u8;
        }
    }
    let p0 = packed::pack(ty, rows, cols, &data).unwrap();
    // AMX_DEV_HUGE=1: the packed matrix in transparent huge pages (madvise before first touch).
    let p: Vec<u8> = if std::env::var("AMX_DEV_HUGE").as_deref() == Ok("1") {
        let mut v: Vec<u8> = Vec::with_capacity(p0.len() + (2 << 20));
        let base = v.as_mut_ptr() as usize;
        let start = base.next_multiple_of(2 << 20);
        unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                (base + v.capacity() - start) & !((2 << 20) - 1),
                libc::MADV_HUGEPAGE,
            );
        }
        v.extend_from_slice(&p0);
        v
    } else {
        p0
    };
    let unit = packed::unit_bytes(ty).unwrap() * nb;
    let mut hi = vec![vec![BlockQ8::default(); nb]; 8];
    let mut lo = hi.clone();
    for k in 0..8 {
        let x: Vec<f32> = (0..cols)
            .map(|_| rnd() as f32 / u32::MAX as f32 - 0.5)
            .collect();
        quantize_q8x2(&x, &mut hi[k], &mut lo[k]);
    }
    let sums_of = |rows: &[Vec<BlockQ8>]| -> Vec<Vec<i32>> {
        rows.iter()
            .map(|r| {
                r.iter()
                    .map(|b| b.qs.iter().map(|&q| q as i32).sum())
                    .collect()
            })
            .collect()
    };
    let (sums, sums_lo) = (sums_of(&hi), sums_of(&lo));
    let iters = (2000 * 1536 / rows).max(1);
    let units_total = (rows / 16 * nb * iters) as f64;
    let mut sink = 0f32;
    let t = Instant::now();
    for _ in 0..iters {
        for g in 0..rows / 16 {
            let u = &p[g * unit..][..unit];
            for k0 in [0, 4] {
                let h: [&[BlockQ8]; 4] = std::array::from_fn(|k| &hi[k0 + k][..]);
                let l: [&[BlockQ8]; 4] = std::array::from_fn(|k| &lo[k0 + k][..]);
                let s: [&[i32]; 4] = std::array::from_fn(|k| &sums[k0 + k][..]);
                let sl: [&[i32]; 4] = std::array::from_fn(|k| &sums_lo[k0 + k][..]);
                sink += packed::group::<4>(Isa::Avx512, ty, u, h, Some(l), s, Some(sl))[0][0];
            }
        }
    }
    let avx = t.elapsed().as_secs_f64();
    let h: Vec<&[BlockQ8]> = hi.iter().map(|v| &v[..]).collect();
    let l: Vec<&[BlockQ8]> = lo.iter().map(|v| &v[..]).collect();
    let s: Vec<&[i32]> = sums.iter().map(|v| &v[..]).collect();
    let sl: Vec<&[i32]> = sums_lo.iter().map(|v| &v[..]).collect();
    let mut a = GroupActs::default();
    a.fill(&h, Some(&l), &s, Some(&sl), Isa::Avx512);
    let t = Instant::now();
    for _ in 0..iters {
        for g in 0..rows / 16 {
            let u = &p[g * unit..][..unit];
            sink += packed::group_w16(Isa::Avx512, ty, u, &a)[0][0];
        }
    }
    let w16 = t.elapsed().as_secs_f64();
    let ns = |secs: f64| secs * 1e9 / units_total;
    print!(
        "per unit (16 rows x 32, 8 q8x2 rows): avx-512 {:.1} ns, avx-512 16-bit pairs {:.1} ns",
        ns(avx),
        ns(w16)
    );
    if let Some(tiles) = AmxTiles::load(Isa::detect()) {
        a.fill(&h, Some(&l), &s, Some(&sl), Isa::Amx);
        let t = Instant::now();
        for _ in 0..iters {
            for g in 0..rows / 16 {
                let u = &p[g * unit..][..unit];
                sink += packed::group_amx(&tiles, ty, u, &a)[0][0];
            }
        }
        print!(", amx {:.1} ns", ns(t.elapsed().as_secs_f64()));
    }
    println!(" ({sink})");
}

//! Sampler: settings validation, greedy, seeds, and sampled frequencies against the
//! probabilities each filter should leave (many draws, checked within 5 standard errors).

use ferrite_llm::sampler::{Rng, Sampler, SamplerConfig, SamplerError, StopStrings};

/// Probabilities -> logits (log p), so the softmax of the logits is `p` again.
fn logits_of(p: &[f64]) -> Vec<f32> {
    p.iter().map(|&x| x.ln() as f32).collect()
}

fn cfg() -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplerConfig::default()
    }
}

/// Draws `n` tokens with `cfg` from fixed logits and checks each token's frequency against
/// `want` (zero where the token must never appear).
fn check_frequencies(cfg: SamplerConfig, logits: &[f32], want: &[f64], n: usize) {
    let mut s = Sampler::new(cfg).unwrap();
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        let mut l = logits.to_vec();
        counts[s.sample(&mut l, &[]).unwrap() as usize] += 1;
    }
    for (i, (&c, &p)) in counts.iter().zip(want).enumerate() {
        let f = c as f64 / n as f64;
        if p == 0.0 {
            assert_eq!(c, 0, "token {i} must be filtered out");
        } else {
            let se = (p * (1.0 - p) / n as f64).sqrt();
            assert!(
                (f - p).abs() < 5.0 * se + 1e-12,
                "token {i}: freq {f:.4}, want {p:.4} (se {se:.5})"
            );
        }
    }
}

const P: [f64; 6] = [0.4, 0.25, 0.15, 0.1, 0.06, 0.04];

#[test]
fn plain_sampling_matches_probabilities() {
    check_frequencies(cfg(), &logits_of(&P), &P, 40_000);
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    // Cumulative: 0.4, 0.65, 0.8, 0.9 -> top_p 0.8 keeps three tokens (0.8 reaches 0.8).
    let want = [0.4 / 0.8, 0.25 / 0.8, 0.15 / 0.8, 0.0, 0.0, 0.0];
    let c = SamplerConfig {
        top_p: 0.79,
        ..cfg()
    };
    check_frequencies(c, &logits_of(&P), &want, 40_000);
}

#[test]
fn top_k_keeps_k() {
    let want = [0.4 / 0.65, 0.25 / 0.65, 0.0, 0.0, 0.0, 0.0];
    check_frequencies(
        SamplerConfig { top_k: 2, ..cfg() },
        &logits_of(&P),
        &want,
        40_000,
    );
}

#[test]
fn min_p_drops_tokens_below_a_fraction_of_the_top() {
    // min_p 0.3: floor 0.12 -> keeps 0.4, 0.25, 0.15.
    let want = [0.4 / 0.8, 0.25 / 0.8, 0.15 / 0.8, 0.0, 0.0, 0.0];
    check_frequencies(
        SamplerConfig {
            min_p: 0.3,
            ..cfg()
        },
        &logits_of(&P),
        &want,
        40_000,
    );
}

#[test]
fn temperature_sharpens_the_distribution() {
    // T = 0.5 squares the probabilities (renormalized).
    let sq: Vec<f64> = P.iter().map(|p| p * p).collect();
    let z: f64 = sq.iter().sum();
    let want: Vec<f64> = sq.iter().map(|p| p / z).collect();
    check_frequencies(
        SamplerConfig {
            temperature: 0.5,
            ..cfg()
        },
        &logits_of(&P),
        &want,
        40_000,
    );
}

#[test]
fn greedy_is_argmax_with_lowest_id_on_ties() {
    let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
    let mut l = vec![0.5, 2.0, f32::NAN, 2.0, -1.0];
    assert_eq!(s.sample(&mut l, &[]).unwrap(), 1);
    let mut l = vec![f32::NAN, f32::NEG_INFINITY];
    assert!(s.sample(&mut l, &[]).is_err());
}

#[test]
fn same_seed_same_tokens() {
    let logits: Vec<f32> = (0..1000)
        .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
        .collect();
    let run = |seed| {
        let mut s = Sampler::new(SamplerConfig {
            seed,
            ..SamplerConfig::default()
        })
        .unwrap();
        let mut hist = Vec::new();
        for _ in 0..64 {
            let mut l = logits.clone();
            hist.push(s.sample(&mut l, &hist).unwrap());
        }
        hist
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
    // The RNG stream itself is fixed (xoshiro256** seeded by splitmix64).
    let mut r = Rng::new(0);
    let first: Vec<u64> = (0..2).map(|_| r.next_u64()).collect();
    assert_eq!(first, [0x99ec5f36cb75f2b4, 0xbf6e1f784956452a]);
}

#[test]
fn penalties_follow_llama_cpp() {
    let c = SamplerConfig {
        repeat_penalty: 2.0,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        penalty_last_n: 3,
        ..SamplerConfig::greedy()
    };
    let mut s = Sampler::new(c).unwrap();
    // History window (last 3): [1, 2, 2]; token 0 is outside the window.
    let mut l = vec![4.0, 3.0, -1.0, 1.0];
    let t = s.sample(&mut l, &[0, 1, 2, 2]).unwrap();
    assert_eq!(l, vec![4.0, 3.0 / 2.0 - 0.25 - 0.5, -2.0 - 0.5 - 0.5, 1.0]);
    assert_eq!(t, 0);
    // A history token outside the vocabulary is an error, not a panic.
    let mut l = vec![0.0; 4];
    assert!(s.sample(&mut l, &[9]).is_err());
}

#[test]
fn bad_settings_are_clear_errors() {
    let bad = [
        (
            SamplerConfig {
                temperature: -0.1,
                ..cfg()
            },
            "temperature",
        ),
        (
            SamplerConfig {
                temperature: f32::NAN,
                ..cfg()
            },
            "temperature",
        ),
        (
            SamplerConfig {
                top_p: 0.0,
                ..cfg()
            },
            "top_p",
        ),
        (
            SamplerConfig {
                top_p: 1.5,
                ..cfg()
            },
            "top_p",
        ),
        (
            SamplerConfig {
                min_p: -0.5,
                ..cfg()
            },
            "min_p",
        ),
        (
            SamplerConfig {
                min_p: 1.01,
                ..cfg()
            },
            "min_p",
        ),
        (
            SamplerConfig {
                repeat_penalty: 0.0,
                ..cfg()
            },
            "repeat_penalty",
        ),
        (
            SamplerConfig {
                presence_penalty: f32::INFINITY,
                ..cfg()
            },
            "presence_penalty",
        ),
    ];
    for (c, name) in bad {
        match Sampler::new(c) {
            Err(SamplerError::Config { name: n, .. }) => assert_eq!(n, name),
            Err(e) => panic!("{name}: unexpected error {e}"),
            Ok(_) => panic!("{name}: accepted"),
        }
    }
    let e = Sampler::new(SamplerConfig {
        top_p: 1.5,
        ..cfg()
    })
    .err()
    .unwrap();
    assert_eq!(e.to_string(), "sampler: top_p must be in (0, 1], got 1.5");
    assert!(Sampler::new(SamplerConfig {
        top_p: 1.0,
        min_p: 1.0,
        ..cfg()
    })
    .is_ok());
}

#[test]
fn stop_strings_hold_back_possible_prefixes() {
    let mut s = StopStrings::new(["</s>", "\n\nUser:"]);
    assert_eq!(s.push("Hello <"), "Hello ");
    assert_eq!(s.push("b> and\n"), "<b> and");
    assert_eq!(s.push("\nUs"), "");
    assert_eq!(s.push("ually"), "\n\nUsually");
    assert_eq!(s.push(" done</"), " done");
    assert_eq!(s.push("s> tail"), "");
    assert!(s.stopped());
    assert_eq!(s.push("more"), "");

    let mut s = StopStrings::new(["STOP"]);
    assert_eq!(s.push("no sto"), "no sto");
    assert_eq!(s.push("ST"), "");
    assert_eq!(s.finish(), "ST");
}

/// A long-tailed distribution over a large vocabulary, where the top-p cut lies far beyond
/// the first sorted block: the kept set is exactly the nucleus, and its mass is respected.
#[test]
fn top_p_over_a_long_tail() {
    let n = 5000;
    // Zipf-like, shuffled ids so order by id says nothing.
    let weights: Vec<f64> = (0..n).map(|i| 1.0 / ((i * 7 % n) as f64 + 1.0)).collect();
    let logits = logits_of(&weights);
    // The probabilities exactly as the sampler sees them: softmax of the f32 logits, in f64.
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let e: Vec<f64> = logits
        .iter()
        .map(|&l| (f64::from(l) - f64::from(max)).exp())
        .collect();
    let z: f64 = e.iter().sum();
    let p: Vec<f64> = e.iter().map(|x| x / z).collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    let top_p = 0.8f32;
    let mut cum = 0.0;
    let mut nucleus = 0;
    while cum < f64::from(top_p) {
        cum += p[order[nucleus]];
        nucleus += 1;
    }
    assert!(nucleus > 256, "nucleus of {nucleus} tokens");
    let mut want = vec![0.0; n];
    for &i in &order[..nucleus] {
        want[i] = p[i] / cum;
    }
    let draws = 20_000;
    let c = SamplerConfig { top_p, ..cfg() };
    let mut s = Sampler::new(c).unwrap();
    let mut counts = vec![0usize; n];
    for _ in 0..draws {
        let mut l = logits.clone();
        counts[s.sample(&mut l, &[]).unwrap() as usize] += 1;
    }
    for i in 0..n {
        if want[i] == 0.0 {
            assert_eq!(counts[i], 0, "token {i} is outside the nucleus");
        }
    }
    // Mass of the top token and of the nucleus' second half, within 5 standard errors.
    let half: f64 = order[nucleus / 2..nucleus].iter().map(|&i| want[i]).sum();
    let got_half: usize = order[nucleus / 2..nucleus].iter().map(|&i| counts[i]).sum();
    for (want, got) in [(want[order[0]], counts[order[0]]), (half, got_half)] {
        let f = got as f64 / draws as f64;
        let se = (want * (1.0 - want) / draws as f64).sqrt();
        assert!((f - want).abs() < 5.0 * se, "freq {f:.4}, want {want:.4}");
    }
}

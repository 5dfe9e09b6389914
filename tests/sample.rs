//! Behaviour of the sampling chain through the public API.

use rill::sample::{Sampler, SamplerConfig};
use rill::Error;

/// Everything off except the given temperature: plain softmax sampling.
fn plain(temperature: f32, seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        seed,
    }
}

/// A deterministic, bumpy logit row with a unique maximum at `peak`.
fn bumpy(n: usize, peak: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 250.0).collect();
    v[peak] = 10.0;
    v
}

fn first_argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn default_and_greedy_configs_validate() {
    let d = SamplerConfig::default();
    assert_eq!(
        (
            d.temperature,
            d.top_k,
            d.top_p,
            d.min_p,
            d.repeat_penalty,
            d.repeat_last_n
        ),
        (0.8, 40, 0.95, 0.05, 1.0, 64)
    );
    d.validate().unwrap();
    SamplerConfig::greedy().validate().unwrap();
    assert!(Sampler::new(SamplerConfig::greedy()).unwrap().is_greedy());
    assert!(!Sampler::new(d).unwrap().is_greedy());
    // Temperature 0 with a penalty must run on the host: not "greedy" for the caller.
    let pen = SamplerConfig {
        repeat_penalty: 1.3,
        ..SamplerConfig::greedy()
    };
    assert!(!Sampler::new(pen).unwrap().is_greedy());
}

#[test]
fn greedy_is_argmax_with_first_max_on_ties() {
    let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
    for peak in [0, 17, 4999] {
        let v = bumpy(5000, peak);
        assert_eq!(s.sample(&v).unwrap(), peak as u32);
        assert_eq!(s.sample(&v).unwrap(), first_argmax(&v));
    }
    assert_eq!(s.sample(&[1.0, 3.0, 2.0, 3.0]).unwrap(), 1);
    assert_eq!(s.sample(&[-5.0]).unwrap(), 0);
}

#[test]
fn same_seed_same_sequence_different_seed_different() {
    let logits: Vec<f32> = (0..1000).map(|i| (i % 13) as f32 * 0.1).collect();
    let run = |seed: u64| {
        let mut s = Sampler::new(plain(1.0, seed)).unwrap();
        (0..64).map(|_| s.sample(&logits).unwrap()).collect::<Vec<u32>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
    // The default chain is reproducible too.
    let run_default = |seed: u64| {
        let mut s = Sampler::new(SamplerConfig {
            seed,
            ..SamplerConfig::default()
        })
        .unwrap();
        (0..64).map(|_| s.sample(&logits).unwrap()).collect::<Vec<u32>>()
    };
    assert_eq!(run_default(7), run_default(7));
}

#[test]
fn top_k_1_is_greedy_at_any_temperature() {
    let v = bumpy(248_320, 123_456);
    for t in [0.1, 1.0, 5.0, 100.0] {
        let mut s = Sampler::new(SamplerConfig {
            top_k: 1,
            ..plain(t, 9)
        })
        .unwrap();
        for _ in 0..20 {
            assert_eq!(s.sample(&v).unwrap(), 123_456);
        }
    }
}

#[test]
fn tiny_top_p_is_greedy() {
    let v = bumpy(248_320, 99);
    let mut s = Sampler::new(SamplerConfig {
        top_p: 1e-6,
        ..plain(3.0, 1)
    })
    .unwrap();
    for _ in 0..20 {
        assert_eq!(s.sample(&v).unwrap(), 99);
    }
}

#[test]
fn min_p_1_is_greedy() {
    let v = bumpy(248_320, 200_000);
    let mut s = Sampler::new(SamplerConfig {
        min_p: 1.0,
        ..plain(3.0, 2)
    })
    .unwrap();
    for _ in 0..20 {
        assert_eq!(s.sample(&v).unwrap(), 200_000);
    }
}

#[test]
fn frequencies_match_softmax_probabilities() {
    let probs = [0.5f32, 0.3, 0.2];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
    let mut s = Sampler::new(plain(1.0, 12345)).unwrap();
    let n = 20_000;
    let mut counts = [0usize; 3];
    for _ in 0..n {
        counts[s.sample(&logits).unwrap() as usize] += 1;
    }
    for (c, p) in counts.iter().zip(probs) {
        let f = *c as f32 / n as f32;
        assert!((f - p).abs() < 0.02, "frequency {f} vs probability {p} ({counts:?})");
    }
}

#[test]
fn top_p_keeps_the_smallest_sufficient_prefix() {
    // Probabilities 0.5, 0.3, 0.2: top_p 0.7 needs the first two, never the third.
    let logits: Vec<f32> = [0.5f32, 0.3, 0.2].iter().map(|p| p.ln()).collect();
    let mut s = Sampler::new(SamplerConfig {
        top_p: 0.7,
        ..plain(1.0, 5)
    })
    .unwrap();
    let mut seen = [0usize; 3];
    for _ in 0..2000 {
        seen[s.sample(&logits).unwrap() as usize] += 1;
    }
    assert_eq!(seen[2], 0);
    assert!(seen[0] > 0 && seen[1] > 0);
}

#[test]
fn top_k_2_never_yields_the_third() {
    let logits: Vec<f32> = [0.2f32, 0.5, 0.3].iter().map(|p| p.ln()).collect();
    let mut s = Sampler::new(SamplerConfig {
        top_k: 2,
        ..plain(1.0, 3)
    })
    .unwrap();
    let mut seen = [0usize; 3];
    for _ in 0..5000 {
        seen[s.sample(&logits).unwrap() as usize] += 1;
    }
    assert_eq!(seen[0], 0);
    assert!(seen[1] > 0 && seen[2] > 0);
}

#[test]
fn repetition_penalty_demotes_recent_token() {
    let cfg = SamplerConfig {
        repeat_penalty: 1.5,
        repeat_last_n: 4,
        ..SamplerConfig::greedy()
    };
    // Positive logits: 3.0 / 1.5 = 2.0 < 2.5.
    let mut s = Sampler::new(cfg).unwrap();
    let v = [0.0, 3.0, 2.5];
    assert_eq!(s.sample(&v).unwrap(), 1); // nothing recent yet
    assert_eq!(s.sample(&v).unwrap(), 2); // token 1 was just generated
                                          // Negative logits are multiplied: -1.0 * 1.5 = -1.5 < -1.2.
    let mut s = Sampler::new(cfg).unwrap();
    s.accept(0);
    assert_eq!(s.sample(&[-1.0, -1.2]).unwrap(), 1);
    // Once the token falls out of the window the penalty no longer applies.
    let mut s = Sampler::new(cfg).unwrap();
    s.accept(1);
    for _ in 0..4 {
        s.accept(0);
    }
    assert_eq!(s.sample(&v).unwrap(), 1);
    // Repeated occurrences are penalised once, not compounded: 3.0 / 1.5 = 2.0 > 1.9.
    let mut s = Sampler::new(cfg).unwrap();
    for _ in 0..4 {
        s.accept(1);
    }
    assert_eq!(s.sample(&[0.0, 3.0, 1.9]).unwrap(), 1);
    // History tokens beyond the vocabulary are ignored.
    s.accept(1_000_000);
    assert!(s.sample(&v).is_ok());
}

#[test]
fn invalid_configs_rejected() {
    let g = SamplerConfig::greedy();
    let bad = [
        SamplerConfig { temperature: -0.1, ..g },
        SamplerConfig {
            temperature: f32::NAN,
            ..g
        },
        SamplerConfig {
            temperature: f32::INFINITY,
            ..g
        },
        SamplerConfig { top_p: 0.0, ..g },
        SamplerConfig { top_p: 1.01, ..g },
        SamplerConfig { top_p: f32::NAN, ..g },
        SamplerConfig { min_p: -0.01, ..g },
        SamplerConfig { min_p: 1.5, ..g },
        SamplerConfig { min_p: f32::NAN, ..g },
        SamplerConfig {
            repeat_penalty: 0.0,
            ..g
        },
        SamplerConfig {
            repeat_penalty: -1.0,
            ..g
        },
        SamplerConfig {
            repeat_penalty: f32::NAN,
            ..g
        },
    ];
    for cfg in bad {
        assert!(matches!(cfg.validate(), Err(Error::InvalidArgument(_))), "{cfg:?}");
        assert!(matches!(Sampler::new(cfg), Err(Error::InvalidArgument(_))), "{cfg:?}");
    }
}

#[test]
fn nan_and_inf_logits_handled() {
    for cfg in [SamplerConfig::greedy(), SamplerConfig::default(), plain(1.0, 0)] {
        let mut s = Sampler::new(cfg).unwrap();
        // NaN is never chosen, even where it sits first.
        for _ in 0..50 {
            let t = s.sample(&[f32::NAN, 1.0, f32::NAN, 0.5]).unwrap();
            assert!(t == 1 || t == 3, "{t}");
        }
        // -inf means "not allowed".
        for _ in 0..50 {
            assert_eq!(s.sample(&[f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY]).unwrap(), 1);
        }
        // +inf wins outright; several +inf share the mass.
        for _ in 0..50 {
            assert_eq!(s.sample(&[5.0, f32::INFINITY, 7.0]).unwrap(), 1);
            let t = s.sample(&[f32::INFINITY, 5.0, f32::INFINITY]).unwrap();
            assert!(t == 0 || t == 2, "{t}");
        }
        // Huge finite logits must not overflow the softmax.
        for _ in 0..50 {
            assert_eq!(s.sample(&[f32::MAX, -f32::MAX, 0.0]).unwrap(), 0);
        }
        assert!(matches!(s.sample(&[]), Err(Error::InvalidArgument(_))));
        assert!(matches!(s.sample(&[f32::NAN; 4]), Err(Error::InvalidArgument(_))));
        assert!(matches!(
            s.sample(&[f32::NAN, f32::NEG_INFINITY]),
            Err(Error::InvalidArgument(_))
        ));
    }
}

#[test]
fn tiny_temperature_does_not_produce_nan() {
    let v = bumpy(1000, 500);
    let mut s = Sampler::new(plain(1e-40, 0)).unwrap();
    for _ in 0..10 {
        assert_eq!(s.sample(&v).unwrap(), 500);
    }
}

#[test]
fn full_vocabulary_default_chain_stays_in_range() {
    // A realistic-size row through the default chain and through top-p without top-k
    // (the partial-sort path over the whole vocabulary).
    let v: Vec<f32> = (0..248_320)
        .map(|i| ((i * 2_654_435_761usize) % 10_007) as f32 / 1000.0)
        .collect();
    for cfg in [
        SamplerConfig::default(),
        SamplerConfig {
            top_k: 0,
            top_p: 0.9,
            ..SamplerConfig::default()
        },
    ] {
        let mut s = Sampler::new(cfg).unwrap();
        for _ in 0..20 {
            let t = s.sample(&v).unwrap() as usize;
            assert!(t < v.len());
        }
    }
}

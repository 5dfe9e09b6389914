//! Deterministic random weights. Every row of every tensor has its own RNG stream, seeded from
//! (seed, tensor name, row index), so rows can be generated in any order on any number of
//! threads and the file is still bit-identical for a given seed.

/// How a tensor's values are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Approximately N(0, std²) (Irwin–Hall sum of 4 uniforms: bounded at ±3.46 std, which
    /// keeps random activations tame and costs one RNG call per value).
    Normal { std: f32 },
    /// U(lo, hi).
    Uniform { lo: f32, hi: f32 },
}

/// splitmix64 step: a fast 64-bit generator with good avalanche, ideal for per-row streams.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// FNV-1a of a tensor name: stable across platforms and Rust versions (unlike `DefaultHasher`).
pub fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The seed of one tensor's stream family.
pub fn tensor_seed(seed: u64, name: &str) -> u64 {
    // Run the combination through one splitmix step so nearby seeds give unrelated streams.
    SplitMix64::new(seed ^ name_hash(name)).next_u64()
}

/// The RNG stream of row `row` of a tensor (or of any other per-row sequence keyed by `seed`).
pub fn row_stream(seed: u64, row: u64) -> SplitMix64 {
    SplitMix64::new(seed ^ row.wrapping_mul(0xD6E8_FEB8_6659_FD93))
}

/// Fill one row with values drawn per `init`, from the stream of row `row`.
pub fn fill_row(tensor_seed: u64, row: u64, init: Init, out: &mut [f32]) {
    let mut rng = row_stream(tensor_seed, row);
    match init {
        Init::Normal { std } => {
            // Sum of four 16-bit uniforms: mean 4·32767.5, variance 4·(65536² − 1)/12.
            const MEAN: f32 = 131_070.0;
            let scale = std * (3.0f32).sqrt() / 65_536.0;
            for v in out.iter_mut() {
                let r = rng.next_u64();
                let s = (r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48);
                *v = (s as f32 - MEAN) * scale;
            }
        }
        Init::Uniform { lo, hi } => {
            let span = hi - lo;
            for v in out.iter_mut() {
                // 24 random bits → [0, 1) exactly representable in f32.
                let u = (rng.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32);
                *v = lo + span * u;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_moments() {
        let mut v = vec![0f32; 200_000];
        fill_row(tensor_seed(1, "x"), 0, Init::Normal { std: 2.0 }, &mut v);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var.sqrt() - 2.0).abs() < 0.02, "std {}", var.sqrt());
    }

    #[test]
    fn uniform_range_and_determinism() {
        let mut a = vec![0f32; 10_000];
        let mut b = vec![0f32; 10_000];
        let init = Init::Uniform { lo: -4.0, hi: -0.02 };
        fill_row(tensor_seed(7, "blk.0.ssm_a"), 3, init, &mut a);
        fill_row(tensor_seed(7, "blk.0.ssm_a"), 3, init, &mut b);
        assert_eq!(a, b);
        assert!(a.iter().all(|&x| (-4.0..-0.02).contains(&x)));
        fill_row(tensor_seed(7, "blk.0.ssm_a"), 4, init, &mut b);
        assert_ne!(a, b);
    }
}

//! The f32 dot-product kernel every `vec_dot` ends in.
//!
//! Sixteen independent lanes let LLVM keep four SSE (or two AVX) accumulators in flight, so the
//! loop is bound by throughput, not by the latency of one serial add chain. The order of the
//! additions therefore differs from a naive left-to-right sum; callers compare to tolerance.

const LANES: usize = 16;

/// A running dot product, kept across blocks of a row.
pub(crate) struct Acc([f32; LANES]);

impl Acc {
    #[inline(always)]
    pub(crate) fn new() -> Self {
        Acc([0.0; LANES])
    }

    /// Accumulate `Σ a[i]·b[i]` over `min(a.len(), b.len())` elements.
    #[inline(always)]
    pub(crate) fn add(&mut self, a: &[f32], b: &[f32]) {
        let mut ca = a.chunks_exact(LANES);
        let mut cb = b.chunks_exact(LANES);
        for (xa, xb) in (&mut ca).zip(&mut cb) {
            for ((s, &p), &q) in self.0.iter_mut().zip(xa).zip(xb) {
                *s += p * q;
            }
        }
        for ((s, &p), &q) in self.0.iter_mut().zip(ca.remainder()).zip(cb.remainder()) {
            *s += p * q;
        }
    }

    /// Pairwise reduction of the lanes.
    #[inline(always)]
    pub(crate) fn sum(&self) -> f32 {
        let mut v = self.0;
        let mut n = LANES;
        while n > 1 {
            n /= 2;
            for i in 0..n {
                v[i] += v[i + n];
            }
        }
        v[0]
    }
}

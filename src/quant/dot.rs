//! The f32 dot-product accumulator every `vec_dot` ends in.
//!
//! Sixteen independent lanes let LLVM keep four SSE (or two AVX) accumulators in flight, so the
//! loop is bound by throughput, not by the latency of one serial add chain. The order of the
//! additions therefore differs from a naive left-to-right sum; callers compare to tolerance.
//! Element `i` of a row always lands in lane `i % 16` (block and sub-block sizes are multiples of
//! 16), whichever kernel produced the product.

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

    /// Accumulate `Σ y(i)·x[i]` over one (sub-)block, `y(i)` computing element `i`'s dequantized
    /// value in registers (the fused kernels: no block buffer, one loop LLVM vectorises). `N` is a
    /// multiple of 16, so element `i` always lands in lane `i % 16`.
    #[inline(always)]
    pub(crate) fn add_with<const N: usize>(&mut self, x: &[f32; N], y: impl Fn(usize) -> f32) {
        for k in 0..N / LANES {
            for l in 0..LANES {
                let i = k * LANES + l;
                self.0[l] += y(i) * x[i];
            }
        }
    }

    /// Pairwise reduction of the lanes.
    ///
    /// Deliberately out of line (once per row, so the call costs nothing): the lanes then end the
    /// kernel as one 16-float store, which LLVM's SLP vectoriser builds full-width vectors from.
    /// Inlined, the reduction's 8/4/2/1-lane steps lead it to split the fused kernels' lanes
    /// into 2-float vectors (measured: less than half the speed).
    #[inline(never)]
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

/// `&s[at..at + N]` as an array reference. Callers' offsets are constants or bounded loop indices
/// inside fixed-size blocks, so the range check folds away.
#[inline(always)]
pub(crate) fn sub<const N: usize, T>(s: &[T], at: usize) -> &[T; N] {
    s[at..at + N].try_into().expect("sub-block inside its block")
}

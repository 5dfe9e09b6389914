//! Run-time CPU feature detection for the multiversioned hot loops (decode GEMV, prefill GEMM).

/// Whether this x86-64 CPU has AVX2 and FMA (detected once; `is_x86_feature_detected!` caches).
/// `RILL_NO_AVX2=1` forces the baseline code (to compare both paths).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var_os("RILL_NO_AVX2").is_none()
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
    })
}

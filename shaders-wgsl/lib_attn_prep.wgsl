// The attention layer's steps between its projections and the attention (attn_qk_prep.wgsl, and
// its halves attn_prep_q.wgsl and attn_prep_kv.wgsl): a workgroup per (token, head), one
// invocation per element of the head (head_dim <= PREP_WG). A query head is split out of the
// interleaved projection (its gate copied out), RMS-normalised and rotated; a kv head is
// normalised and rotated and written with its v to the caches at row pos + t. The arithmetic is
// the separate ops' (rms_norm.wgsl, rope_neox.wgsl, kv_store.wgsl).
struct Params {
    d: u32,          // head_dim
    half: u32,       // n_rot / 2
    nh: u32,         // query heads
    nkv: u32,        // kv heads
    q_rows: u32,     // T * nh: the query workgroups, before the kv ones (attn_qk_prep.wgsl)
    ctx: u32,        // cache rows (rows at or past it are dropped, as kv_store.wgsl does)
    eps: f32,
    log2_theta: f32,
}

@group(0) @binding(0) var<uniform> P: Params;
// [pos0]: read on the device so a replayed step uses the current position.
@group(0) @binding(1) var<storage, read> pos: array<u32>;

// The normalised head, for the rotation's exchange of pairs.
var<workgroup> prep_y: array<f32, PREP_WG>;

// Element j (= the invocation index) of one head after RMSNorm (weight element w_j) and NeoX
// RoPE at position p; v is the head's element j (0 for j >= d, whose result is unused). Called in
// uniform control flow (barriers).
fn prep_head(v: f32, w_j: f32, j: u32, lanes: Lanes, p: u32) -> f32 {
    let s = 1.0 / sqrt(wg_sum(v * v, j, PREP_WG, lanes) / f32(P.d) + P.eps);
    let y = v * s * w_j;
    prep_y[j] = y;
    workgroupBarrier();
    if (j >= 2u * P.half) {
        return y;
    }
    let lo = j < P.half;
    let i = select(j - P.half, j, lo);
    let cs = rope_cs(i, P.half, p, P.log2_theta);
    let a = prep_y[i];
    let b = prep_y[i + P.half];
    return select(a * cs.y + b * cs.x, a * cs.x - b * cs.y, lo);
}

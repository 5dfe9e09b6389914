// MoE routing, one workgroup per token: softmax over all E experts (max-subtracted), top-k by
// rank (ties -> lower index; NaN never beats a number), renormalise the
// selected probabilities (sum clamped >= 6.1035e-5) and multiply by `scale`.
struct Params {
    n_tok: u32,
    n_exp: u32,
    k: u32,
    scale: u32, // f32 bits
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> weights: array<f32>;

const MIN_SUM: f32 = 6.1035e-5;

var<workgroup> sp: array<f32, MOE_MAX_E>;
var<workgroup> rv: array<f32, ROW_WG>;
var<workgroup> sel: array<f32, MOE_MAX_K>;

// Bit test, immune to fast-math assumptions about NaN.
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// The rank of expert i (probability v) in the CPU's selection order: how many experts beat it. A
// number beats NaN, a larger value wins, ties (and NaN vs NaN) go to the lower index, so ranks
// are distinct. Loops split at i (before i a tie wins, after it only a larger value) and unrolled
// four ways: independent workgroup-memory reads in flight, no branch per comparison.
fn rank_of(i: u32, v: f32, ne: u32) -> u32 {
    if (is_nan(v)) {
        // Everything before i beats it (a number, or a NaN of lower index); after it, the numbers.
        var r = i;
        for (var j = i + 1u; j < ne; j++) {
            r += u32(!is_nan(sp[j]));
        }
        return r;
    }
    // v is a number. A NaN sp[j] fails both compares (and cannot occur here anyway: one NaN
    // probability makes the softmax sum, and so every probability of the row, NaN).
    var r = 0u;
    var j = 0u;
    for (; j + 4u <= i; j += 4u) {
        r += u32(sp[j] >= v) + u32(sp[j + 1u] >= v) + u32(sp[j + 2u] >= v) + u32(sp[j + 3u] >= v);
    }
    for (; j < i; j++) {
        r += u32(sp[j] >= v);
    }
    j = i + 1u;
    for (; j + 4u <= ne; j += 4u) {
        r += u32(sp[j] > v) + u32(sp[j + 1u] > v) + u32(sp[j + 2u] > v) + u32(sp[j + 3u] > v);
    }
    for (; j < ne; j++) {
        r += u32(sp[j] > v);
    }
    return r;
}

@compute @workgroup_size(ROW_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let t = linear_wg(wg, nwg);
    // Uniform per workgroup, so the barriers below stay in uniform control flow.
    let live = t < P.n_tok;
    let ne = select(0u, P.n_exp, live);
    let base = t * P.n_exp;

    // Max over the row (NaN ignored, like f32::max).
    var m = from_bits(0xff800000u); // -inf
    for (var i = li; i < ne; i += ROW_WG) {
        let v = logits[base + i];
        m = select(m, v, v > m);
    }
    rv[li] = m;
    for (var off = ROW_WG / 2u; off > 0u; off >>= 1u) {
        workgroupBarrier();
        if (li < off) {
            let o = rv[li + off];
            rv[li] = select(rv[li], o, o > rv[li]);
        }
    }
    workgroupBarrier();
    let mx = rv[0];
    workgroupBarrier();

    // exp and sum.
    var s = 0.0;
    for (var i = li; i < ne; i += ROW_WG) {
        let e = exp(logits[base + i] - mx);
        sp[i] = e;
        s += e;
    }
    rv[li] = s;
    for (var off = ROW_WG / 2u; off > 0u; off >>= 1u) {
        workgroupBarrier();
        if (li < off) {
            rv[li] += rv[li + off];
        }
    }
    workgroupBarrier();
    let sum = rv[0];
    for (var i = li; i < ne; i += ROW_WG) {
        sp[i] = sp[i] / sum;
    }

    workgroupBarrier();
    // Top-k by rank: `better` is a strict total order (ties go to the lower index), so every
    // expert has a distinct rank, the number of experts that beat it; the k of rank < k are
    // the selection, in the CPU's order. One barrier instead of k rounds of a reduction tree
    // (k * log2(ROW_WG) barriers: 37 us per decode token on the H200 at k = 8).
    for (var i = li; i < ne; i += ROW_WG) {
        let v = sp[i];
        let rank = rank_of(i, v, ne);
        if (rank < P.k) {
            ids[t * P.k + rank] = i;
            sel[rank] = v;
        }
    }
    workgroupBarrier();

    if (li == 0u && live) {
        var ssum = 0.0;
        for (var j = 0u; j < P.k; j++) {
            ssum += sel[j];
        }
        // max(ssum, MIN_SUM) with NaN -> MIN_SUM, like f32::max.
        let norm = bitcast<f32>(P.scale) / select(MIN_SUM, ssum, ssum >= MIN_SUM);
        for (var j = 0u; j < P.k; j++) {
            weights[t * P.k + j] = sel[j] * norm;
        }
    }
}

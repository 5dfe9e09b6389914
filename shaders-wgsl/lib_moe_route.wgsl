// MoE routing of one token by one workgroup of RT_WG invocations (declared by the including kernel:
// moe_route.wgsl ROW_WG). The softmax sum is a 256-leaf tree whatever RT_WG:
// an invocation sums its leaves (li + w RT_WG, elements leaf + 256 n) and folds them as the tree's
// first levels would (rt_leaves), then the workgroup reduces the rest; the max and the ranks do not
// depend on the order.
// Softmax over all E experts (max-subtracted), top-k by rank (ties -> lower index; NaN never beats
// a number), renormalise the selected probabilities (sum clamped >= 6.1035e-5), times a scale.
// Reads the including kernel's `logits` binding.
const MIN_SUM: f32 = 6.1035e-5;

var<workgroup> rt_p: array<f32, MOE_MAX_E>;
var<workgroup> rt_red: array<f32, RT_WG>;

// Leaves of the softmax sum's tree (RT_WG divides it).
const RT_LEAVES: u32 = 256u;
var<workgroup> rt_sel: array<f32, MOE_MAX_K>;
var<workgroup> rt_id: array<u32, MOE_MAX_K>;

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
            r += u32(!is_nan(rt_p[j]));
        }
        return r;
    }
    // v is a number. A NaN rt_p[j] fails both compares (and cannot occur here anyway: one NaN
    // probability makes the softmax sum, and so every probability of the row, NaN).
    var r = 0u;
    var j = 0u;
    for (; j + 4u <= i; j += 4u) {
        r += u32(rt_p[j] >= v) + u32(rt_p[j + 1u] >= v) + u32(rt_p[j + 2u] >= v) + u32(rt_p[j + 3u] >= v);
    }
    for (; j < i; j++) {
        r += u32(rt_p[j] >= v);
    }
    j = i + 1u;
    for (; j + 4u <= ne; j += 4u) {
        r += u32(rt_p[j] > v) + u32(rt_p[j + 1u] > v) + u32(rt_p[j + 2u] > v) + u32(rt_p[j + 3u] > v);
    }
    for (; j < ne; j++) {
        r += u32(rt_p[j] > v);
    }
    return r;
}

// Routes the ne experts of the logits row at `base` to k: afterwards every invocation reads slot
// j < k's expert in rt_id[j] and its probability in rt_sel[j]. A workgroup without a token passes
// ne = 0 (and must still call: the barriers; rt_id and rt_sel are then stale). ne, k uniform.
fn rt_route(base: u32, ne: u32, k: u32, li: u32) {
    // Max over the row (NaN ignored, like f32::max).
    var m = from_bits(0xff800000u); // -inf
    for (var i = li; i < ne; i += RT_WG) {
        let v = logits[base + i];
        m = select(m, v, v > m);
    }
    rt_red[li] = m;
    for (var off = RT_WG / 2u; off > 0u; off >>= 1u) {
        workgroupBarrier();
        if (li < off) {
            let o = rt_red[li + off];
            rt_red[li] = select(rt_red[li], o, o > rt_red[li]);
        }
    }
    workgroupBarrier();
    let mx = rt_red[0];
    workgroupBarrier();

    // exp and sum.
    rt_red[li] = rt_leaves(base, ne, mx, li);
    for (var off = RT_WG / 2u; off > 0u; off >>= 1u) {
        workgroupBarrier();
        if (li < off) {
            rt_red[li] += rt_red[li + off];
        }
    }
    workgroupBarrier();
    let sum = rt_red[0];
    for (var i = li; i < ne; i += RT_WG) {
        rt_p[i] = rt_p[i] / sum;
    }

    workgroupBarrier();
    // Top-k by rank: `better` is a strict total order (ties go to the lower index), so every
    // expert has a distinct rank, the number of experts that beat it; the k of rank < k are
    // the selection, in the CPU's order. One barrier instead of k rounds of a reduction tree
    // (k * log2(workgroup) barriers: 37 us per decode token on the H200 at k = 8).
    for (var i = li; i < ne; i += RT_WG) {
        let v = rt_p[i];
        let rank = rank_of(i, v, ne);
        if (rank < k) {
            rt_id[rank] = i;
            rt_sel[rank] = v;
        }
    }
    workgroupBarrier();
}

// Slot j's weight after rt_route: its probability over the selection's sum (max(sum, MIN_SUM),
// NaN -> MIN_SUM, like f32::max), times the scale (f32 bits).
fn rt_weight(j: u32, k: u32, scale: u32) -> f32 {
    var ssum = 0.0;
    for (var i = 0u; i < k; i++) {
        ssum += rt_sel[i];
    }
    let norm = bitcast<f32>(scale) / select(MIN_SUM, ssum, ssum >= MIN_SUM);
    return rt_sel[j] * norm;
}

// Leaf `leaf` of the softmax sum: e = exp(x - mx) of elements leaf, leaf + RT_LEAVES, ... in order
// (stored in rt_p for the ranks).
fn rt_leaf(base: u32, ne: u32, mx: f32, leaf: u32) -> f32 {
    var s = 0.0;
    for (var i = leaf; i < ne; i += RT_LEAVES) {
        let e = exp(logits[base + i] - mx);
        rt_p[i] = e;
        s += e;
    }
    return s;
}

// Invocation li's part of the 256-leaf tree after its first levels: leaf li alone (RT_WG 256),
// li + (li + 128) (128), (li + (li + 128)) + ((li + 64) + (li + 192)) (64).
fn rt_leaves(base: u32, ne: u32, mx: f32, li: u32) -> f32 {
    let a = rt_leaf(base, ne, mx, li);
    if (RT_LEAVES / RT_WG == 1u) {
        return a;
    }
    if (RT_LEAVES / RT_WG == 2u) {
        return a + rt_leaf(base, ne, mx, li + RT_WG);
    }
    let b = rt_leaf(base, ne, mx, li + RT_WG);
    let c = rt_leaf(base, ne, mx, li + 2u * RT_WG);
    let d = rt_leaf(base, ne, mx, li + 3u * RT_WG);
    return (a + c) + (b + d);
}

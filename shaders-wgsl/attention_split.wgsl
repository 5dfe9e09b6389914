// Flash-decoding, first pass: the key range 0..=pos+t of query row `row` (= t * n_head + h) is cut
// into ATT_SPLITS pieces of ceil(n_keys / ATT_SPLITS) keys, one workgroup per (row, piece) on
// grid z; each writes its running max, sum and unnormalised output to
// part[(row * ATT_SPLITS + piece) * (d + 2) ..] = [m, l, o_0 .. o_{d-1}]. attention_combine.wgsl
// merges them. The number of workgroups does not depend on the position, so a recorded decode
// step stays valid as the context grows.

@group(0) @binding(5) var<storage, read_write> part: array<f32>;

@compute @workgroup_size(ATT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = wg.x + wg.y * nwg.x;
    let piece = wg.z;
    let t = row / P.n_head;
    let h = row % P.n_head;
    let d = P.d;
    let n_keys = pos[0] + t + 1u;
    let chunk = (n_keys + ATT_SPLITS - 1u) / ATT_SPLITS;
    let k_begin = min(piece * chunk, n_keys);
    let k_end = min(k_begin + chunk, n_keys);
    let kv_stride = (P.n_head / P.group) * d;
    let a = attend(li, row * d, (h / P.group) * d, kv_stride, d, k_begin, k_end, P.scale);
    let base = (row * ATT_SPLITS + piece) * (d + 2u);
    if (li == 0u) {
        part[base] = a.m;
        part[base + 1u] = a.l;
    }
    for (var r = 0u; r < 4u; r++) {
        let dim = li + r * ATT_WG;
        if (dim < d) {
            part[base + 2u + dim] = a.o[r];
        }
    }
}

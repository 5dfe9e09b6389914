// In place NeoX RoPE of a step whose rows belong to different sequences (backend/rows.rs): row
// b of x [B, nh * D] is rotated at its own position, read from `rows` on the device (so a
// replayed step rotates by the current positions). One invocation per (row, head, pair), as
// rope_neox.wgsl; the rotation and its precision: lib_rope.wgsl.

struct Params {
    n: u32,      // B * nh * half
    cols: u32,   // nh * head_dim
    head_dim: u32,
    half: u32,   // n_rot / 2
    nh: u32,
    log2_theta: f32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> rows: array<u32>; // [B, 2] = (slot, pos) per row
@group(0) @binding(2) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(ELT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let idx = linear_wg(wg, nwg) * ELT_WG + li;
    if (idx >= P.n) {
        return;
    }
    let i = idx % P.half;
    let head = (idx / P.half) % P.nh;
    let b = idx / (P.half * P.nh);

    let cs = rope_cs(i, P.half, rows[2u * b + 1u], P.log2_theta);
    let c = cs.x;
    let s = cs.y;

    let lo = b * P.cols + head * P.head_dim + i;
    let hi = lo + P.half;
    let a0 = x[lo];
    let a1 = x[hi];
    x[lo] = a0 * c - a1 * s;
    x[hi] = a0 * s + a1 * c;
}

// In place NeoX ("rotate half") RoPE on the first n_rot dims of every head of x [T, nh * D]:
// pair (i, i + n_rot/2) of the head at position pos0 + t is rotated by pos * theta^(-2i/n_rot).
// One invocation per (token, head, pair).
//
// The rotation and its precision: lib_rope.wgsl.

struct Params {
    n: u32,      // T * nh * half
    cols: u32,   // nh * head_dim
    head_dim: u32,
    half: u32,   // n_rot / 2
    nh: u32,
    log2_theta: f32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> pos: array<u32>; // [pos0]: read on the device so a replayed step rotates by the current position
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
    let t = idx / (P.half * P.nh);

    let cs = rope_cs(i, P.half, pos[0] + t, P.log2_theta);
    let c = cs.x;
    let s = cs.y;

    let lo = t * P.cols + head * P.head_dim + i;
    let hi = lo + P.half;
    let a = x[lo];
    let b = x[hi];
    x[lo] = a * c - b * s;
    x[hi] = a * s + b * c;
}

// In place NeoX ("rotate half") RoPE on the first n_rot dims of every head of x [T, nh * D]:
// pair (i, i + n_rot/2) of the head at position pos0 + t is rotated by pos * theta^(-2i/n_rot).
// One invocation per (token, head, pair).
//
// Precision (all f32; the CPU reference computes the angle in f64): inv_freq = theta^(-2i/n_rot)
// is exp2(-(2i/n_rot) * log2(theta)) with log2(theta) from the host, and the angle pos * inv_freq
// carries the f32 rounding of both, an absolute error of a few ulp(pos), i.e. ~pos * 2^-23 rad.
// That error grows with the position (this is how llama.cpp's GPU kernels do it too); the rotated
// values then differ from the reference by about |x| * pos * 2^-23. The angle is reduced to
// [-pi, pi] before sin/cos (WGSL only bounds their error on that interval) with a two-part 2*pi
// (Cody-Waite: k * TWO_PI_HI is exact for k < 2^16, i.e. positions up to ~400k).
const TWO_PI_HI: f32 = 6.28125; // 8 significant bits
const TWO_PI_LO: f32 = 0.0019353071795864769; // 2*pi - TWO_PI_HI
const INV_TWO_PI: f32 = 0.15915494309189535;

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

    let inv_freq = exp2(-(f32(2u * i) / f32(2u * P.half)) * P.log2_theta);
    let angle = f32(pos[0] + t) * inv_freq;
    let k = round(angle * INV_TWO_PI);
    let r = (angle - k * TWO_PI_HI) - k * TWO_PI_LO;
    let c = cos(r);
    let s = sin(r);

    let lo = t * P.cols + head * P.head_dim + i;
    let hi = lo + P.half;
    let a = x[lo];
    let b = x[hi];
    x[lo] = a * c - b * s;
    x[hi] = a * s + b * c;
}

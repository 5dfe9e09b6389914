// NeoX RoPE's rotation of pair i (of `half` = n_rot / 2) at position p: (cos, sin) of
// p * theta^(-2i/n_rot) (rope_neox.wgsl, the attention preparation kernels).
//
// Precision (all f32; the CPU reference computes the angle in f64): inv_freq = theta^(-2i/n_rot)
// is exp2(-(2i/n_rot) * log2(theta)) with log2(theta) from the host, and the angle p * inv_freq
// carries the f32 rounding of both, an absolute error of a few ulp(p), i.e. ~p * 2^-23 rad.
// That error grows with the position (this is how llama.cpp's GPU kernels do it too); the rotated
// values then differ from the reference by about |x| * p * 2^-23. The angle is reduced to
// [-pi, pi] before sin/cos (WGSL only bounds their error on that interval) with a two-part 2*pi
// (Cody-Waite: k * TWO_PI_HI is exact for k < 2^16, i.e. positions up to ~400k).
const TWO_PI_HI: f32 = 6.28125; // 8 significant bits
const TWO_PI_LO: f32 = 0.0019353071795864769; // 2*pi - TWO_PI_HI
const INV_TWO_PI: f32 = 0.15915494309189535;

fn rope_cs(i: u32, half: u32, p: u32, log2_theta: f32) -> vec2<f32> {
    let inv_freq = exp2(-(f32(2u * i) / f32(2u * half)) * log2_theta);
    let angle = f32(p) * inv_freq;
    let k = round(angle * INV_TWO_PI);
    let r = (angle - k * TWO_PI_HI) - k * TWO_PI_LO;
    return vec2<f32>(cos(r), sin(r));
}

// Shared helpers, prepended to every shader.

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn silu(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}

// IEEE binary16 bits (low 16 bits of h) to f32, exact for subnormals (no flush to zero).
fn f16_to_f32(h: u32) -> f32 {
    let s = (h >> 15u) & 1u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    var v: f32;
    if (e == 0u) {
        v = f32(m) * 5.9604644775390625e-8; // m * 2^-24
    } else if (e == 31u) {
        v = bitcast<f32>(0x7f800000u | (m << 13u));
    } else {
        v = bitcast<f32>(((e + 112u) << 23u) | (m << 13u));
    }
    return select(v, -v, s == 1u);
}

// Two IEEE binary16 values (low half first) as f32, exactly.
fn f16x2(w: u32) -> vec2<f32> {
    return vec2<f32>(f16_to_f32(w & 0xffffu), f16_to_f32(w >> 16u));
}

// Split a linear workgroup index over a 2-D grid (dispatches are limited per dimension).
fn linear_wg(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.x + wg.y * nwg.x;
}

// f32 from bits at run time: a const-expression that evaluates to NaN or inf is a WGSL creation
// error (browsers' compilers enforce it; naga does not).
fn from_bits(b: u32) -> f32 {
    return bitcast<f32>(b);
}

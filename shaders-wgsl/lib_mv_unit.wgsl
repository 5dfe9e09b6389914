// Pieces every matrix-vector kernel's unit is built from (matvec.wgsl and its relatives define
// xv(i), the i-th vec4 of x). No private array is indexed here or in the units, and nothing is
// indexed by a run-time value: naga does not unroll loops, and a function-scope array indexed
// in a loop (or a by-value array indexed at all, which naga copies into a function variable
// first) is what drivers put in local memory: the NVIDIA driver ran these kernels 10x slower
// with arrays. So x lives in mat4x4 columns and named vec4s read with literal indices, and an
// invocation's rows in vec4 components.

// 16 consecutive elements of x from vec4 i, one column per vec4.
fn mv_xseg(i: u32) -> mat4x4<f32> {
    return mat4x4<f32>(xv(i), xv(i + 1u), xv(i + 2u), xv(i + 3u));
}

// The sum of a segment's 16 elements.
fn mv_xsum(x: mat4x4<f32>) -> f32 {
    return dot(x[0] + x[1] + x[2] + x[3], vec4<f32>(1.0));
}

// dot(q - bias, x) over 16 elements: w holds 16 bytes (each < 256, byte 0 of w.x first), x the
// segment (bytes_f4: exact decoding).
fn mv_seg(w: vec4<u32>, bias: f32, x: mat4x4<f32>) -> f32 {
    var s = bytes_f4(w.x, bias) * x[0];
    s = fma(bytes_f4(w.y, bias), x[1], s);
    s = fma(bytes_f4(w.z, bias), x[2], s);
    s = fma(bytes_f4(w.w, bias), x[3], s);
    return dot(s, vec4<f32>(1.0));
}

// The same for 16 signed bytes (b ^ 0x80 = b + 128 as unsigned).
fn mv_sseg(w: vec4<u32>, x: mat4x4<f32>) -> f32 {
    return mv_seg(w ^ vec4<u32>(0x80808080u), 128.0, x);
}

// Unit u of the first n (a constant after inlining: MV_R or what is left of it; 1 <= n) of the
// four rows at byte offsets rb, one vec4 component per row; the others stay 0.
fn mv_rows4(rb: vec4<u32>, u: u32, x: MvX, n: u32) -> vec4<f32> {
    var s = vec4<f32>(mv_dot(rb.x, u, x), 0.0, 0.0, 0.0);
    if (n > 1u) {
        s.y = mv_dot(rb.y, u, x);
    }
    if (n > 2u) {
        s.z = mv_dot(rb.z, u, x);
        s.w = mv_dot(rb.w, u, x);
    }
    return s;
}

// An invocation's rows: 0..3 in the components of lo, 4..7 (MV_R = 8) in hi; MV_R_HI rows.
struct MvAcc {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

const MV_R_HI: u32 = max(MV_R, 4u) - 4u;

// Row r's value.
fn mv_row(a: MvAcc, r: u32) -> f32 {
    return select(a.lo, a.hi, r >= 4u)[r & 3u];
}

// The sums over each row group's lw lanes (lib_mv_reduce_*.wgsl), valid in its lane 0; called
// in uniform control flow (barriers).
fn mv_sums(a: MvAcc, flat: u32, lw: u32, lanes: MvLanes) -> MvAcc {
    var s = MvAcc(mv_sum(a.lo, flat, lw, lanes), vec4<f32>(0.0));
    if (MV_R_HI > 0u) {
        s.hi = mv_sum(a.hi, flat, lw, lanes);
    }
    return s;
}

// a plus unit u (its x loaded once) of the invocation's rows at byte offsets rb_lo, rb_hi.
fn mv_add(a: MvAcc, rb_lo: vec4<u32>, rb_hi: vec4<u32>, u: u32, x: MvX) -> MvAcc {
    var s = a;
    s.lo += mv_rows4(rb_lo, u, x, MV_R);
    if (MV_R_HI > 0u) {
        s.hi += mv_rows4(rb_hi, u, x, MV_R_HI);
    }
    return s;
}

// The partial sums of an invocation's rows over its units u0, u0 + lw, ...
fn mv_run(rb_lo: vec4<u32>, rb_hi: vec4<u32>, u0: u32, lw: u32, xb: u32) -> MvAcc {
    var a = MvAcc(vec4<f32>(0.0), vec4<f32>(0.0));
    for (var u = u0; u < P.units; u += lw) {
        a = mv_add(a, rb_lo, rb_hi, u, mv_x(u, xb));
    }
    return a;
}

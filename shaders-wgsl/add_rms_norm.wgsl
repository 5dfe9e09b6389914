// The residual add and the next RMSNorm in one pass: acc += x; out = rms_norm(acc; w), over
// groups of d = w.len(); the kernel is lib_norm.wgsl's. acc is updated in place: the plain second
// pass reads back only the elements its invocation updated, the packed-dot one (whose elements
// another invocation updated) first waits on a storage barrier (lib_norm_dot.wgsl).

@group(0) @binding(1) var<storage, read_write> acc: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

fn norm_load(i: u32) -> f32 {
    return acc[i] + x[i];
}

fn norm_keep(i: u32, v: f32) {
    acc[i] = v;
}

fn norm_value(i: u32) -> f32 {
    return acc[i];
}

fn norm_gate(i: u32, y: f32) -> f32 {
    return y;
}

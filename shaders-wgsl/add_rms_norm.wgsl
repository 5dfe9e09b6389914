// The residual add and the next RMSNorm in one pass: acc += x; out = rms_norm(acc; w), over
// groups of d = w.len(); the kernel is lib_norm.wgsl's. Each invocation updates and then reads
// back only its own strided elements of acc, so working in place needs no extra barrier.

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

fn norm_store(i: u32, y: f32) {
    out[i] = y;
}

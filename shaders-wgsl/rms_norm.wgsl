// RMSNorm over groups of d consecutive values (a token's hidden vector, or one head of it):
// out = x / sqrt(mean(x^2) + eps) * w; the kernel is lib_norm.wgsl's.

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn norm_load(i: u32) -> f32 {
    return x[i];
}

fn norm_keep(i: u32, v: f32) {}

fn norm_value(i: u32) -> f32 {
    return x[i];
}

fn norm_gate(i: u32, y: f32) -> f32 {
    return y;
}

// Delta-rule gates per (token, value head): beta = sigmoid(b), g = ssm_a * softplus(a + dt_bias)
// (lib_gates.wgsl).
struct Params {
    n: u32,  // T * Hv
    hv: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> ssm_a: array<f32>;
@group(0) @binding(4) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> g_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> beta_out: array<f32>;

@compute @workgroup_size(ELT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_wg(wg, nwg) * ELT_WG + li;
    if (i < P.n) {
        let j = i % P.hv;
        g_out[i] = gdn_g(a[i], dt_bias[j], ssm_a[j]);
        beta_out[i] = sigmoid(b[i]);
    }
}

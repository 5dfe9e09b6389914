// The Gated DeltaNet's per-token preparation in one dispatch: the conv + q/k L2 norm
// (lib_conv_l2qk.wgsl) in the first P.groups workgroups, the delta rule's gates (lib_gates.wgsl,
// one invocation per (token, value head)) in the ones after. The two parts share no buffer.

@group(0) @binding(5) var<storage, read> ga: array<f32>;
@group(0) @binding(6) var<storage, read> gb: array<f32>;
@group(0) @binding(7) var<storage, read> ssm_a: array<f32>;
@group(0) @binding(8) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(9) var<storage, read_write> g_out: array<f32>;
@group(0) @binding(10) var<storage, read_write> beta_out: array<f32>;

@compute @workgroup_size(CONV_NORM_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    let g = linear_wg(wg, nwg);
    if (g < P.groups) {
        conv_l2qk(g, li, lanes);
        return;
    }
    let i = (g - P.groups) * CONV_NORM_WG + li;
    if (i < P.n_gates) {
        let j = i % P.hv;
        g_out[i] = gdn_g(ga[i], dt_bias[j], ssm_a[j]);
        beta_out[i] = sigmoid(gb[i]);
    }
}

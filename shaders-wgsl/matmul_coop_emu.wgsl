// matmul_coop.wgsl with the cooperative-matrix products done by plain code (RILL_WGPU_COOP_EMULATE=1,
// tests on adapters without cooperative matrices): the same staging, f16 rounding, f32
// accumulation and write-out (lib_coop_tiles.wgsl), so only the coop built-ins go unchecked.

@compute @workgroup_size(COOP_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let tile = linear_wg(wg, nwg);
    let r_base = (tile % P.row_tiles) * TILE_M;
    let t_base = (tile / P.row_tiles) * TILE_N;
    coop_zero_c(li);
    for (var k0 = 0u; k0 < P.n_in; k0 += TILE_K) {
        workgroupBarrier();
        coop_stage(li, k0, r_base, t_base);
        workgroupBarrier();
        for (var i = li; i < TILE_M * TILE_N; i += COOP_WG) {
            let r = i / TILE_N;
            let t = i % TILE_N;
            var s = 0.0;
            for (var k = 0u; k < TILE_K; k++) {
                s += f32(ws16[r * TILE_K + k]) * f32(xs16[k * TILE_N + t]);
            }
            cs[r * CS + t] += s;
        }
    }
    workgroupBarrier();
    coop_store_out(li, r_base, t_base);
}

// matmul_tiled.wgsl on tensor cores (Precision::Fast, f16-rounded inputs, f32 accumulation):
// 4 subgroups of 32 invocations, each owning a 32 x 32 quarter of the 64 x 64 tile as 2 x 2
// coop_mat16x16 accumulators; per k step of TILE_K = 32 two 16-deep products. Tiles are staged by
// lib_coop_tiles.wgsl. Every pointer offset is bound to a `let` first (naga 30's SPIR-V writer
// panics on an index expression inside the pointer argument).

@compute @workgroup_size(COOP_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_id) sg: u32) {
    let tile = linear_wg(wg, nwg);
    let r_base = (tile % P.row_tiles) * TILE_M;
    let t_base = (tile / P.row_tiles) * TILE_N;
    coop_zero_c(li);
    workgroupBarrier();
    let r0 = (sg >> 1u) * 32u;
    let c0 = (sg & 1u) * 32u;
    let o00 = r0 * CS + c0;
    let o01 = r0 * CS + c0 + 16u;
    let o10 = (r0 + 16u) * CS + c0;
    let o11 = (r0 + 16u) * CS + c0 + 16u;
    var acc00 = coopLoadT<coop_mat16x16<f32, C>>(&cs[o00], CS);
    var acc01 = coopLoadT<coop_mat16x16<f32, C>>(&cs[o01], CS);
    var acc10 = coopLoadT<coop_mat16x16<f32, C>>(&cs[o10], CS);
    var acc11 = coopLoadT<coop_mat16x16<f32, C>>(&cs[o11], CS);
    for (var k0 = 0u; k0 < P.n_in; k0 += TILE_K) {
        // The previous step's loads are done before the tiles are overwritten.
        workgroupBarrier();
        coop_stage(li, k0, r_base, t_base);
        workgroupBarrier();
        for (var kk = 0u; kk < TILE_K; kk += 16u) {
            let oa0 = r0 * TILE_K + kk;
            let oa1 = (r0 + 16u) * TILE_K + kk;
            let ob0 = kk * TILE_N + c0;
            let ob1 = kk * TILE_N + c0 + 16u;
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&ws16[oa0], TILE_K);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&ws16[oa1], TILE_K);
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&xs16[ob0], TILE_N);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&xs16[ob1], TILE_N);
            acc00 = coopMultiplyAdd(a0, b0, acc00);
            acc01 = coopMultiplyAdd(a0, b1, acc01);
            acc10 = coopMultiplyAdd(a1, b0, acc10);
            acc11 = coopMultiplyAdd(a1, b1, acc11);
        }
    }
    workgroupBarrier();
    coopStoreT(acc00, &cs[o00], CS);
    coopStoreT(acc01, &cs[o01], CS);
    coopStoreT(acc10, &cs[o10], CS);
    coopStoreT(acc11, &cs[o11], CS);
    workgroupBarrier();
    coop_store_out(li, r_base, t_base);
}

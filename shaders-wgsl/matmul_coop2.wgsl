// The tensor-core prefill kernel, second form (RILL_WGPU_COOP=2; Precision::Fast, f16-rounded
// inputs, f32 accumulation): out[t][row0 + r] = dot(W[r], x[t]) over tiles of C2_R rows x C2_T
// tokens staged by lib_coop2_tiles.wgsl, each subgroup of 32 invocations multiplying its piece as
// eight coop_mat16x16 accumulators. Per k step of C2_K: the next step's weights and x are read
// into registers first, so their loads are in flight during this step's products; then the
// products; then the registers are decoded (Q4_K, Q6_K: lib_c2w_*.wgsl; other formats decode at
// the read) into the other staging buffer and one barrier ends the step (C2_BUF = 2; with one
// buffer a second barrier guards the overwrite). Full tiles are
// stored from the accumulators straight to out; edges go through a per-subgroup scratch.
// Cooperative-matrix forms verified on the H200 (../shared/TOOLCHAIN.md; coopLoad on 2026-12-02 by
// examples/mv_bench against the CPU): coopLoadT / coopStoreT (row-major) and coopLoad (column-major:
// B, the weights staged rows x k), each pointer offset bound to a `let` first (naga 30's SPIR-V
// writer panics on an index expression inside the pointer argument), matrices never passed to
// functions.

// Per subgroup 16 rows of C2_SCS floats: zeros that start the accumulators, and an edge tile's
// blocks on their way out.
var<workgroup> scr2: array<f32, (C2_WG / 32u) * 16u * C2_SCS>;

@compute @workgroup_size(C2_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    // linear_wg written out: naga's uniformity analysis takes any function's result as varying
    // per invocation, and the cooperative operations below must be in uniform control flow.
    let tile = wg.x + wg.y * nwg.x;
    let r_base = (tile % P.row_tiles) * C2_R;
    let t_base = (tile / P.row_tiles) * C2_T;
    // Workgroups past the last tile (a grid rounded up to two dimensions).
    if (t_base >= P.n_tok) {
        return;
    }
    let so = sg * 16u * C2_SCS;
    for (var i = lane; i < 16u * C2_SCS; i += sg_size) {
        scr2[so + i] = 0.0;
    }
    var st = c2_fetch(li, 0u, r_base, t_base);
    c2_put(li, 0u, st);
    workgroupBarrier();
    var acc0 = coopLoadT<coop_mat16x16<f32, C>>(&scr2[so], C2_SCS);
    var acc1 = coopLoadT<coop_mat16x16<f32, C>>(&scr2[so], C2_SCS);
    var acc2 = coopLoadT<coop_mat16x16<f32, C>>(&scr2[so], C2_SCS);
    var acc3 = coopLoadT<coop_mat16x16<f32, C>>(&scr2[so], C2_SCS);
    var acc4 = coopLoadT<coop_mat16x16<f32, C>>(&scr2[so], C2_SCS);
    var acc5 = coopLoadT<coop_mat16x16<f32, C>>(&scr2[so], C2_SCS);
    var acc6 = coopLoadT<coop_mat16x16<f32, C>>(&scr2[so], C2_SCS);
    var acc7 = coopLoadT<coop_mat16x16<f32, C>>(&scr2[so], C2_SCS);
    let r0 = c2_piece_r(sg);
    let t0 = c2_piece_t(sg);
    let steps = P.n_in / C2_K;
    for (var s = 0u; s < steps; s++) {
        let cur = s % C2_BUF;
        st = c2_fetch(li, c2_next_k(s, steps), r_base, t_base);
        for (var kk = 0u; kk < C2_K; kk += 16u) {
            let oa0 = c2_a_at(cur, t0, 0u, kk);
            let oa1 = c2_a_at(cur, t0, 1u, kk);
            let ob0 = c2_b_at(cur, r0, 0u, kk);
            let ob1 = c2_b_at(cur, r0, 1u, kk);
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&xs2[oa0], C2_SA);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&xs2[oa1], C2_SA);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&ws2[ob0], C2_SB);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&ws2[ob1], C2_SB);
            // Accumulator f = A fragment f / C2_NB times B fragment f % C2_NB.
            if (C2_NB == 4u) {
                // 64 rows x 32 tokens: 2 A fragments, 4 B fragments.
                let ob2 = c2_b_at(cur, r0, 2u, kk);
                let ob3 = c2_b_at(cur, r0, 3u, kk);
                let b2 = coopLoad<coop_mat16x16<f16, B>>(&ws2[ob2], C2_SB);
                let b3 = coopLoad<coop_mat16x16<f16, B>>(&ws2[ob3], C2_SB);
                acc0 = coopMultiplyAdd(a0, b0, acc0);
                acc1 = coopMultiplyAdd(a0, b1, acc1);
                acc2 = coopMultiplyAdd(a0, b2, acc2);
                acc3 = coopMultiplyAdd(a0, b3, acc3);
                acc4 = coopMultiplyAdd(a1, b0, acc4);
                acc5 = coopMultiplyAdd(a1, b1, acc5);
                acc6 = coopMultiplyAdd(a1, b2, acc6);
                acc7 = coopMultiplyAdd(a1, b3, acc7);
            } else {
                // 32 rows x 64 tokens: 4 A fragments, 2 B fragments.
                let oa2 = c2_a_at(cur, t0, 2u, kk);
                let oa3 = c2_a_at(cur, t0, 3u, kk);
                let a2 = coopLoadT<coop_mat16x16<f16, A>>(&xs2[oa2], C2_SA);
                let a3 = coopLoadT<coop_mat16x16<f16, A>>(&xs2[oa3], C2_SA);
                acc0 = coopMultiplyAdd(a0, b0, acc0);
                acc1 = coopMultiplyAdd(a0, b1, acc1);
                acc2 = coopMultiplyAdd(a1, b0, acc2);
                acc3 = coopMultiplyAdd(a1, b1, acc3);
                acc4 = coopMultiplyAdd(a2, b0, acc4);
                acc5 = coopMultiplyAdd(a2, b1, acc5);
                acc6 = coopMultiplyAdd(a3, b0, acc6);
                acc7 = coopMultiplyAdd(a3, b1, acc7);
            }
        }
        if (C2_BUF == 1u) {
            // Every subgroup is done with the one buffer before it is overwritten.
            workgroupBarrier();
        }
        c2_put(li, (s + 1u) % C2_BUF, st);
        workgroupBarrier();
    }
    let tb = t_base + t0;
    let rb = r_base + r0;
    // Full, and the host found out's rows aligned for the stores (P.direct); written out for the
    // analysis too.
    if (P.direct != 0u && r_base + C2_R <= P.rows && t_base + C2_T <= P.n_tok) {
        let o0 = c2_out_at(tb + c2_acc_t(0u), rb + c2_acc_r(0u));
        let o1 = c2_out_at(tb + c2_acc_t(1u), rb + c2_acc_r(1u));
        let o2 = c2_out_at(tb + c2_acc_t(2u), rb + c2_acc_r(2u));
        let o3 = c2_out_at(tb + c2_acc_t(3u), rb + c2_acc_r(3u));
        let o4 = c2_out_at(tb + c2_acc_t(4u), rb + c2_acc_r(4u));
        let o5 = c2_out_at(tb + c2_acc_t(5u), rb + c2_acc_r(5u));
        let o6 = c2_out_at(tb + c2_acc_t(6u), rb + c2_acc_r(6u));
        let o7 = c2_out_at(tb + c2_acc_t(7u), rb + c2_acc_r(7u));
        // The stride bound to a `let` too (the same naga bug, for a cooperative store's stride).
        let n_out = P.n_out;
        coopStoreT(acc0, &out[o0], n_out);
        coopStoreT(acc1, &out[o1], n_out);
        coopStoreT(acc2, &out[o2], n_out);
        coopStoreT(acc3, &out[o3], n_out);
        coopStoreT(acc4, &out[o4], n_out);
        coopStoreT(acc5, &out[o5], n_out);
        coopStoreT(acc6, &out[o6], n_out);
        coopStoreT(acc7, &out[o7], n_out);
        return;
    }
    // An edge tile (or an unaligned output): each accumulator through this subgroup's scratch,
    // its elements in range stored one by one. The barriers are the workgroup's (uniform: every
    // subgroup takes this path), each subgroup only touching its own scratch.
    coopStoreT(acc0, &scr2[so], C2_SCS);
    workgroupBarrier();
    c2_scratch_out(so, tb + c2_acc_t(0u), rb + c2_acc_r(0u), lane, sg_size);
    workgroupBarrier();
    coopStoreT(acc1, &scr2[so], C2_SCS);
    workgroupBarrier();
    c2_scratch_out(so, tb + c2_acc_t(1u), rb + c2_acc_r(1u), lane, sg_size);
    workgroupBarrier();
    coopStoreT(acc2, &scr2[so], C2_SCS);
    workgroupBarrier();
    c2_scratch_out(so, tb + c2_acc_t(2u), rb + c2_acc_r(2u), lane, sg_size);
    workgroupBarrier();
    coopStoreT(acc3, &scr2[so], C2_SCS);
    workgroupBarrier();
    c2_scratch_out(so, tb + c2_acc_t(3u), rb + c2_acc_r(3u), lane, sg_size);
    workgroupBarrier();
    coopStoreT(acc4, &scr2[so], C2_SCS);
    workgroupBarrier();
    c2_scratch_out(so, tb + c2_acc_t(4u), rb + c2_acc_r(4u), lane, sg_size);
    workgroupBarrier();
    coopStoreT(acc5, &scr2[so], C2_SCS);
    workgroupBarrier();
    c2_scratch_out(so, tb + c2_acc_t(5u), rb + c2_acc_r(5u), lane, sg_size);
    workgroupBarrier();
    coopStoreT(acc6, &scr2[so], C2_SCS);
    workgroupBarrier();
    c2_scratch_out(so, tb + c2_acc_t(6u), rb + c2_acc_r(6u), lane, sg_size);
    workgroupBarrier();
    coopStoreT(acc7, &scr2[so], C2_SCS);
    workgroupBarrier();
    c2_scratch_out(so, tb + c2_acc_t(7u), rb + c2_acc_r(7u), lane, sg_size);
}

// The 16 x 16 block in the scratch at so (first token tb, first row rb), stored where in range.
fn c2_scratch_out(so: u32, tb: u32, rb: u32, lane: u32, sg_size: u32) {
    for (var e = lane; e < 256u; e += sg_size) {
        c2_edge_put(tb, rb, e, scr2[so + (e / 16u) * C2_SCS + e % 16u]);
    }
}

// matmul_coop2.wgsl with the cooperative-matrix products done by plain code
// (RILL_WGPU_COOP_EMULATE=1 RILL_WGPU_COOP=2: tests on adapters without cooperative matrices):
// the same staging, buffers, barriers, subgroup pieces, fragment offsets and stores
// (lib_coop2_tiles.wgsl), so only the cooperative built-ins go unchecked. Invocation li plays
// lane li % 32 of subgroup li / 32 and holds, of each of the piece's eight 16 x 16 accumulators,
// the elements lane + 32 m (m < 8; token lane / 16 + 2 m, row lane % 16 of the block), as the
// two vec4 of a Deq8 (named variables: private arrays cost lavapipe scratch per dispatch).

// Accumulator f's block (from fragments f / C2_NB and f % C2_NB) of the piece at t0, r0 plus
// this step's products in buffer buf: f16 operands, f32 sums.
fn emu_step(c: Deq8, buf: u32, t0: u32, r0: u32, f: u32, lane: u32) -> Deq8 {
    let ao = c2_a_at(buf, t0, f / C2_NB, 0u) + (lane / 16u) * C2_SA;
    let bo = c2_b_at(buf, r0, f % C2_NB, 0u) + (lane % 16u) * C2_SB;
    var lo = c.a;
    var hi = c.b;
    for (var k = 0u; k < C2_K; k++) {
        let b = f32(ws2[bo + k]);
        let a = ao + k;
        lo += b * vec4<f32>(f32(xs2[a]), f32(xs2[a + 2u * C2_SA]), f32(xs2[a + 4u * C2_SA]),
                            f32(xs2[a + 6u * C2_SA]));
        hi += b * vec4<f32>(f32(xs2[a + 8u * C2_SA]), f32(xs2[a + 10u * C2_SA]), f32(xs2[a + 12u * C2_SA]),
                            f32(xs2[a + 14u * C2_SA]));
    }
    return Deq8(lo, hi);
}

// Store accumulator f of the piece whose first token is tb and first row rb: where the kernel's
// cooperative store puts it (direct), or element by element where in range.
fn emu_out(c: Deq8, f: u32, tb: u32, rb: u32, lane: u32, direct: bool) {
    let bt = tb + c2_acc_t(f);
    let br = rb + c2_acc_r(f);
    for (var m = 0u; m < 8u; m++) {
        let e = lane + 32u * m;
        let v = select(c.b[m & 3u], c.a[m & 3u], m < 4u);
        if (direct) {
            out[c2_out_at(bt, br) + (e / 16u) * P.n_out + e % 16u] = v;
        } else {
            c2_edge_put(bt, br, e, v);
        }
    }
}

@compute @workgroup_size(C2_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let tile = linear_wg(wg, nwg);
    let r_base = (tile % P.row_tiles) * C2_R;
    let t_base = (tile / P.row_tiles) * C2_T;
    if (t_base >= P.n_tok) {
        return;
    }
    let sg = li / 32u;
    let lane = li % 32u;
    var st = c2_fetch(li, 0u, r_base, t_base);
    c2_put(li, 0u, st);
    workgroupBarrier();
    let zero = Deq8(vec4<f32>(0.0), vec4<f32>(0.0));
    var acc0 = zero;
    var acc1 = zero;
    var acc2 = zero;
    var acc3 = zero;
    var acc4 = zero;
    var acc5 = zero;
    var acc6 = zero;
    var acc7 = zero;
    let r0 = c2_piece_r(sg);
    let t0 = c2_piece_t(sg);
    let steps = P.n_in / C2_K;
    for (var s = 0u; s < steps; s++) {
        let cur = s % C2_BUF;
        st = c2_fetch(li, c2_next_k(s, steps), r_base, t_base);
        acc0 = emu_step(acc0, cur, t0, r0, 0u, lane);
        acc1 = emu_step(acc1, cur, t0, r0, 1u, lane);
        acc2 = emu_step(acc2, cur, t0, r0, 2u, lane);
        acc3 = emu_step(acc3, cur, t0, r0, 3u, lane);
        acc4 = emu_step(acc4, cur, t0, r0, 4u, lane);
        acc5 = emu_step(acc5, cur, t0, r0, 5u, lane);
        acc6 = emu_step(acc6, cur, t0, r0, 6u, lane);
        acc7 = emu_step(acc7, cur, t0, r0, 7u, lane);
        if (C2_BUF == 1u) {
            workgroupBarrier();
        }
        c2_put(li, (s + 1u) % C2_BUF, st);
        workgroupBarrier();
    }
    let tb = t_base + t0;
    let rb = r_base + r0;
    let direct = P.direct != 0u && r_base + C2_R <= P.rows && t_base + C2_T <= P.n_tok;
    emu_out(acc0, 0u, tb, rb, lane, direct);
    emu_out(acc1, 1u, tb, rb, lane, direct);
    emu_out(acc2, 2u, tb, rb, lane, direct);
    emu_out(acc3, 3u, tb, rb, lane, direct);
    emu_out(acc4, 4u, tb, rb, lane, direct);
    emu_out(acc5, 5u, tb, rb, lane, direct);
    emu_out(acc6, 6u, tb, rb, lane, direct);
    emu_out(acc7, 7u, tb, rb, lane, direct);
}

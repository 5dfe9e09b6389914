// The second pass of the RMS norms that also write their output's int8 planes for the
// packed-integer-dot matrix-vector units (lib_dot_prep.wgsl; RILL_WGPU_MV_DOT), so the product
// that reads the output needs no mv_dot_prep dispatch: d is whole 32-element blocks, row r's
// planes at vec4 XQ_VEC4 * r * d / 32 of `xq` (the layout mv_dot_prep writes for the whole
// tensor). The binding is declared by lib_norm_xq4.wgsl or lib_norm_xq5.wgsl (after the op's own
// bindings); the exchange within a block by lib_norm_oct_sg.wgsl or lib_norm_oct_plain.wgsl.
//
// Each invocation owns whole vec4s of the output (elements 4j .. 4j + 3, j = flat, flat +
// ROW_WG, ...), so a block is 8 neighbouring invocations (an "oct"): each computes its 4 outputs,
// gets its half block (for the sum) and the block's max |y| from the others, and writes its
// words of the planes from registers. The output is never read back.

// The vec4 of planes `v`, component c.
fn xq_word(v: u32, c: u32, q: u32) {
    xq[v][c] = q;
}

fn norm_out(base: u32, li: u32, s: f32, lanes: Lanes) {
    // The vec4s of a row are not the elements an invocation visited in the first pass; where that
    // pass wrote them (add_rms_norm's acc) they must be visible here. One barrier per row.
    storageBarrier();
    let flat = oct_flat(li, lanes);
    let nv = P.d / 4u;
    // Uniform trip count: every invocation takes part in every round's exchange. A round's vec4s
    // are whole blocks (nv and ROW_WG are multiples of 8), so an oct is all on or all off.
    let rounds = (nv + ROW_WG - 1u) / ROW_WG;
    for (var r = 0u; r < rounds; r++) {
        let j = r * ROW_WG + flat;
        let on = j < nv;
        var y = vec4<f32>(0.0);
        if (on) {
            let i = 4u * j;
            let v = vec4<f32>(norm_value(base + i), norm_value(base + i + 1u), norm_value(base + i + 2u),
                              norm_value(base + i + 3u));
            let a = v * s * vec4<f32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]);
            y = vec4<f32>(norm_gate(base + i, a.x), norm_gate(base + i + 1u, a.y), norm_gate(base + i + 2u, a.z),
                          norm_gate(base + i + 3u, a.w));
            out[base + i] = y.x;
            out[base + i + 1u] = y.y;
            out[base + i + 2u] = y.z;
            out[base + i + 3u] = y.w;
        }
        let g = oct_gather(y, flat, lanes);
        if (on) {
            // vec4 k of its block: planes' half h = k / 4, component c = k % 4.
            let k = j % 8u;
            let h = k / 4u;
            let c = k % 4u;
            let o = XQ_VEC4 * (base / 32u + j / 8u);
            let sc = xp_scale(g.m);
            let p = planes4(y * sc.inv);
            xq_word(o + h, c, p.x);
            xq_word(o + 2u + h, c, p.y);
            xq_word(o + 4u + h, c, p.z);
            // The half's first invocation writes its sum, the block's first also s and the pad.
            let sum = bitcast<u32>(xp_sum(g.quad[0], g.quad[1], g.quad[2], g.quad[3]));
            if (k == 0u) {
                xq[o + 6u].x = sc.word;
                xq[o + 6u].y = sum;
                xq[o + 6u].w = 0u;
            } else if (k == 4u) {
                xq[o + 6u].z = sum;
            }
        }
    }
}

// An oct's exchange through workgroup memory (lib_norm_oct_plain.wgsl; the fallback of
// lib_norm_oct_sg.wgsl): flat is the invocation's slot.
var<workgroup> oct_wg: array<vec4<f32>, ROW_WG>;

fn oct_gather_wg(v: vec4<f32>, flat: u32) -> Oct {
    oct_wg[flat] = v;
    workgroupBarrier();
    let q = flat & ~3u;
    let o = q ^ 4u;
    let quad = mat4x4<f32>(oct_wg[q], oct_wg[q + 1u], oct_wg[q + 2u], oct_wg[q + 3u]);
    let other = max(max(abs(oct_wg[o]), abs(oct_wg[o + 1u])), max(abs(oct_wg[o + 2u]), abs(oct_wg[o + 3u])));
    // oct_wg is rewritten by the next round.
    workgroupBarrier();
    return Oct(quad, max(oct_half_max(quad), xp_absmax(other)));
}

// What an invocation gets from its oct: the four vec4s of its half block (invocations
// flat & ~3 .. + 3, in order) and the largest |element| of the whole block.
struct Oct {
    quad: mat4x4<f32>,
    m: f32,
}

fn oct_half_max(h: mat4x4<f32>) -> f32 {
    return xp_absmax(max(max(abs(h[0]), abs(h[1])), max(abs(h[2]), abs(h[3]))));
}

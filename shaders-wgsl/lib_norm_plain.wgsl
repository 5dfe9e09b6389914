// The second pass of the RMS norms without the packed-dot planes (lib_norm_dot.wgsl): the output,
// four of an invocation's strided elements per round as in the first pass, so each invocation
// reads back only the elements it wrote there: no barrier for in-place updates.
fn norm_out(base: u32, li: u32, s: f32, lanes: Lanes) {
    let last = P.d - 1u;
    for (var i0 = li; i0 < P.d; i0 += 4u * ROW_WG) {
        let i1 = i0 + ROW_WG;
        let i2 = i1 + ROW_WG;
        let i3 = i2 + ROW_WG;
        let a0 = norm_value(base + i0) * s * w[i0];
        let a1 = norm_value(base + min(i1, last)) * s * w[min(i1, last)];
        let a2 = norm_value(base + min(i2, last)) * s * w[min(i2, last)];
        let a3 = norm_value(base + min(i3, last)) * s * w[min(i3, last)];
        out[base + i0] = norm_gate(base + i0, a0);
        if (i1 < P.d) {
            out[base + i1] = norm_gate(base + i1, a1);
        }
        if (i2 < P.d) {
            out[base + i2] = norm_gate(base + i2, a2);
        }
        if (i3 < P.d) {
            out[base + i3] = norm_gate(base + i3, a3);
        }
    }
}

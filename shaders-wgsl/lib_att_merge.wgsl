// Flash-decoding's merge of the ATT_SPLITS pieces of one query row written by
// attention_split.wgsl (attention_combine.wgsl, attention_combine_gate.wgsl):
// M = max m_s, out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s. Empty pieces have m = NEG_BIG
// and l = 0, so they weigh exactly 0. Invocation li gets dims li + r * ATT_WG (component r;
// those past d are 0). Reads the including kernel's `part` binding and P.d.
fn att_merge(row: u32, li: u32) -> vec4<f32> {
    return att_merge_n(row, li, ATT_SPLITS);
}

// The merge of the first n_parts pieces only (attention_rows_combine.wgsl: the pieces past a
// row's keys are never written). n_parts is uniform across the workgroup.
fn att_merge_n(row: u32, li: u32, n_parts: u32) -> vec4<f32> {
    let d = P.d;
    let stride = d + 2u;
    let base = row * ATT_SPLITS * stride;
    var m = -3.0e38;
    for (var s = 0u; s < n_parts; s++) {
        m = max(m, part[base + s * stride]);
    }
    var l = 0.0;
    var o = vec4<f32>(0.0);
    for (var s = 0u; s < n_parts; s++) {
        let p = base + s * stride;
        let f = exp(part[p] - m);
        l += f * part[p + 1u];
        for (var r = 0u; r < 4u; r++) {
            let dim = li + r * ATT_WG;
            if (dim < d) {
                o[r] += f * part[p + 2u + dim];
            }
        }
    }
    return o * (1.0 / l);
}

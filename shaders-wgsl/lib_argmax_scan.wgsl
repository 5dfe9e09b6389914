// The scan of argmax.wgsl and argmax_split.wgsl (their `logits` binding), with lib_argmax.wgsl's
// rule.

// The best of logits[base + i] for i in start..end, scanned by the workgroup with a stride (so
// loads coalesce), in best_val[0], best_idx[0]; indices are relative to base.
fn wg_scan(base: u32, start: u32, end: u32, li: u32) {
    var bv = from_bits(0x7fc00000u); // NaN
    var bi = 0xffffffffu;
    for (var i = start + li; i < end; i += ROW_WG) {
        let x = logits[base + i];
        if (better(x, i, bv, bi)) {
            bv = x;
            bi = i;
        }
    }
    wg_best(bv, bi, li);
}

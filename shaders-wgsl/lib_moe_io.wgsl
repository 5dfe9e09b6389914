// Parameters, bindings and the store of the routed experts' projections (moe_matvec.wgsl for long
// rows, moe_rows.wgsl for short ones), for every (token, slot) s = t * k + j whose expert is in
// this piece of the weight (experts e0 .. e0 + n_e):
//   y[s][r] = dot(W_e[r], inp[s / in_div])      e = ids[s], r < rows, W_e = expert e of W [E, rows, n_in]
// mode 0 stores y into `out` [S, rows]; mode 1 stores silu(out) * y (gate pass first, then up).
// An id >= n_exp reads nothing (its slot is skipped by moe_combine). Each kernel declares the
// input `X` (binding 3) as it loads it.
struct Params {
    n_slots: u32,
    rows: u32,
    n_in: u32,
    row_bytes: u32,
    in_div: u32,
    mode: u32,
    row_groups: u32, // moe_matvec's workgroups per slot
    e0: u32,         // first expert of this piece
    n_e: u32,        // experts in this piece
    units: u32,      // n_in / MV_UNIT (moe_matvec)
    lanes: u32,      // moe_matvec's invocations per row group
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// Stores y[s][r] at o = s * rows + r by the mode.
fn moe_store(o: u32, y: f32) {
    if (P.mode == 0u) {
        out[o] = y;
    } else {
        out[o] = silu(out[o]) * y;
    }
}

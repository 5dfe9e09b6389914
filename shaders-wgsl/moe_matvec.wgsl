// One projection of the routed experts, for every (token, slot) s = t * k + j:
//   y[s][r] = dot(W_e[r], inp[s / in_div])      e = ids[s], r < rows, W_e = expert e of W [E, rows, cols]
// mode 0 stores y into `out` [S, rows]; mode 1 stores silu(out) * y (gate pass first, then up).
// Workgroup: 8 rows x 32 lanes; lanes stride over the row and reduce in workgroup memory.
// An id >= n_exp reads nothing (its slot is skipped by moe_combine).
struct Params {
    n_slots: u32,
    rows: u32,
    cols: u32,
    n_exp: u32,
    row_bytes: u32,
    in_div: u32,
    mode: u32,
    row_groups: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read> inp: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const ROWS: u32 = 8u;
const LANES: u32 = 32u;

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = linear_wg(wg, nwg);
    let s = g / P.row_groups;
    let row = (g % P.row_groups) * ROWS + li / LANES;
    let lane = li % LANES;
    var e = P.n_exp;
    if (s < P.n_slots) {
        e = ids[s];
    }
    let ok = e < P.n_exp && row < P.rows;
    var acc = 0.0;
    if (ok) {
        let wrow = (e * P.rows + row) * P.row_bytes;
        let xrow = (s / P.in_div) * P.cols;
        for (var c = lane; c < P.cols; c += LANES) {
            acc += deq(wrow + (c / QK) * BLOCK_BYTES, c % QK) * inp[xrow + c];
        }
    }
    red[li] = acc;
    for (var off = LANES / 2u; off > 0u; off >>= 1u) {
        workgroupBarrier();
        if (lane < off) {
            red[li] += red[li + off];
        }
    }
    if (ok && lane == 0u) {
        let o = s * P.rows + row;
        if (P.mode == 0u) {
            out[o] = red[li];
        } else {
            out[o] = silu(out[o]) * red[li];
        }
    }
}

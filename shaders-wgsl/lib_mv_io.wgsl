// Parameters and bindings of the matrix-vector kernels (matvec.wgsl, matvec_swiglu.wgsl):
// out[t][row0 + r] for the rows r < rows of one piece of a weight; x [T, n_in] read as vec4.
struct Params {
    n_in: u32,
    n_out: u32,     // row length of out
    rows: u32,      // rows in this piece
    row_bytes: u32,
    row0: u32,      // output index of the piece's first row
    units: u32,     // n_in / MV_UNIT
    lanes: u32,     // invocations per row group (a power of two <= MV_WG)
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn xv(i: u32) -> vec4<f32> {
    return X[i];
}

// The byte offsets of rows r0 .. r0 + 3; rows past the piece re-read its last row and are not
// stored.
fn mv_row_bytes(r0: u32) -> vec4<u32> {
    return min(vec4<u32>(r0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(P.rows - 1u)) * P.row_bytes;
}

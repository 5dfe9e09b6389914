// Parameters and shared bindings of matvec_group.wgsl: up to four products of one token's x, each
// weight (same format, same row length) with its own output. The workgroups are laid out segment
// after segment; a segment is one product. The weight and output bindings and their accessors
// (`wq`, `mvg_store`, selected by `wsel`) are generated per segment count (kernels.rs,
// `group_io`).
struct Params {
    n_in: u32,
    row_bytes: u32,
    units: u32,        // n_in / MV_UNIT
    lanes: u32,        // invocations per row group (a power of two <= MV_WG)
    rows: vec4<u32>,   // rows of each segment's weight (0 past the last segment)
    start: vec4<u32>,  // each segment's first workgroup (past the last segment: the total)
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;

// The workgroup's segment (`wsel`, also what `wq` reads) and that segment's row count: set once
// per workgroup from its index, so uniform across it.
var<private> wsel: u32;
var<private> seg_rows: u32;

fn xv(i: u32) -> vec4<f32> {
    return X[i];
}

// The byte offsets of rows r0 .. r0 + 3 of the segment's weight; rows past it re-read its last
// row and are not stored.
fn mv_row_bytes(r0: u32) -> vec4<u32> {
    return min(vec4<u32>(r0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(seg_rows - 1u)) * P.row_bytes;
}

// Parameters, bindings and token loads of the generic matmul kernels (matmul.wgsl,
// matmul_rows.wgsl): out[t][o] = dot(W[o], x[t]) for a weight W [n_out, n_in] in the block format
// spliced in above (deq/QK/BLOCK_BYTES), x [T, n_in], out [T, n_out]; token tiles of MM_TILE.
struct Params {
    n_in: u32,
    n_out: u32,
    n_tok: u32,
    row_bytes: u32, // bytes of one weight row: n_in / QK * BLOCK_BYTES
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// Element i of the tile's tokens 0..3 (mm_x_lo) and 4..7 (mm_x_hi), b = the index of token 0's
// element i, last = tokens in the tile - 1. Two vec4s rather than a private array (lavapipe leaks
// the scratch of dynamically indexed private arrays on every dispatch); slots past the last token
// re-read the last token's x (in cache) and are never stored.
fn mm_x_lo(b: u32, last: u32) -> vec4<f32> {
    return vec4<f32>(x[b], x[b + min(1u, last) * P.n_in], x[b + min(2u, last) * P.n_in], x[b + min(3u, last) * P.n_in]);
}

fn mm_x_hi(b: u32, last: u32) -> vec4<f32> {
    return vec4<f32>(x[b + min(4u, last) * P.n_in], x[b + min(5u, last) * P.n_in], x[b + min(6u, last) * P.n_in],
                     x[b + min(7u, last) * P.n_in]);
}

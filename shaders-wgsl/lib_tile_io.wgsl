// Parameters and bindings of the tiled matrix-matrix kernels (matmul_tiled.wgsl and the
// cooperative-matrix ones, matmul_coop*.wgsl): out[t][row0 + r] = dot(W[r], x[t]) for the rows of one piece of a
// weight and a batch of n_tok tokens; x [T, n_in] read as vec4, n_in a multiple of TILE_K.
struct Params {
    n_in: u32,
    n_out: u32,
    rows: u32,      // rows in this piece
    row_bytes: u32,
    row0: u32,      // output index of the piece's first row
    n_tok: u32,
    row_tiles: u32, // ceil(rows / tile rows): the grid is (row tiles, token tiles) flattened
    direct: u32,    // matmul_coop2: 1 where full tiles may be stored straight to out (else 0)
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

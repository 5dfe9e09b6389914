// Shared by matmul_coop2.wgsl and matmul_coop2_emu.wgsl: the staging of one C2_R (rows) x C2_T
// (tokens) output tile's operands, C2_K elements of the row per k step, both rounded to f16 in
// workgroup memory, in C2_BUF buffers, each in its own order (k contiguous):
//   xs2[buf][t][k] (stride C2_SA): A, the tile's x (tokens x k), read row-major;
//   ws2[buf][r][k] (stride C2_SB): the tile's weights (rows x k), dequantized once per tile: B
//   (k x rows) read column-major;
// so that C = A B is tokens x rows, the output's own order: a full tile's accumulators go
// straight to `out` with row-major cooperative stores. The strides carry 16 bytes of padding:
// the 8 row segments of 16 bytes a cooperative load reads at once fall in different banks.
// Staging is coalesced: C2_K / 8 neighbouring invocations read one row's (one token's)
// consecutive bytes of the step, 8 elements each, so a subgroup's loads touch C2_K / 8 times
// fewer rows than one row per invocation would (on the H200 that mapping was the kernel's main
// cost: 12288 x 4096 x 512 Q4_K 870 -> 617 us).
// Subgroup s of C2_WG / 32 owns a C2_SR (rows) x C2_ST (tokens) piece of the tile: eight 16 x 16
// accumulators, f = 0..7 at tokens 16 (f / C2_NB) and rows 16 (f % C2_NB) of the piece (the
// product of the piece's A fragment f / C2_NB and B fragment f % C2_NB).
// Every staged row and token exists: rows past the piece and tokens past the batch re-read the
// last one (finite values, never stored), so staging has no branches.
// Uses the kernel's P, X, out and the format's staging (lib_c2w_*.wgsl).

var<workgroup> xs2: array<f16, C2_BUF * C2_XS>;
var<workgroup> ws2: array<f16, C2_BUF * C2_WS>;

// Eight consecutive values of one weight row or one token's x, rounded to f16.
struct H8 {
    a: vec4<f16>,
    b: vec4<f16>,
}

// What one invocation stages for one k step, read from global memory one step ahead: units
// w0 .. of 8 weights (C2_WU of them; as the format's staging file, lib_c2w_*.wgsl, holds them
// between the fetch and the put: `W8`, made by `w8_load`, decoded by `w8_decode`) and x0 .. of 8
// x values (C2_XU); named fields, not arrays, so that they stay in registers (slots past the
// counts are never written).
struct Stage2 {
    w0: W8, w1: W8, w2: W8, w3: W8, w4: W8, w5: W8, w6: W8, w7: W8,
    x0: H8, x1: H8, x2: H8, x3: H8, x4: H8, x5: H8, x6: H8, x7: H8,
}

// Weight unit u of invocation li: row id / (C2_K / 8) of the tile, elements 8 (id % (C2_K / 8))
// .. + 8 of the step at k0.
fn c2_w_unit(li: u32, u: u32, k0: u32, r_base: u32) -> W8 {
    let id = li + u * C2_WG;
    let row = min(r_base + id / (C2_K / 8u), P.rows - 1u);
    let e = k0 + 8u * (id % (C2_K / 8u));
    return w8_load(row * P.row_bytes + (e / QK) * BLOCK_BYTES, e % QK);
}

fn c2_w_put(li: u32, u: u32, buf: u32, h: H8) {
    let id = li + u * C2_WG;
    let o = buf * C2_WS + (id / (C2_K / 8u)) * C2_SB + 8u * (id % (C2_K / 8u));
    ws2[o] = h.a.x;
    ws2[o + 1u] = h.a.y;
    ws2[o + 2u] = h.a.z;
    ws2[o + 3u] = h.a.w;
    ws2[o + 4u] = h.b.x;
    ws2[o + 5u] = h.b.y;
    ws2[o + 6u] = h.b.z;
    ws2[o + 7u] = h.b.w;
}

// x unit u of invocation li: token id / (C2_K / 8) of the tile, elements 8 (id % (C2_K / 8)) .. + 8.
fn c2_x_unit(li: u32, u: u32, k0: u32, t_base: u32) -> H8 {
    let id = li + u * C2_WG;
    let tok = min(t_base + id / (C2_K / 8u), P.n_tok - 1u);
    let xi = tok * (P.n_in / 4u) + (k0 + 8u * (id % (C2_K / 8u))) / 4u;
    return H8(vec4<f16>(X[xi]), vec4<f16>(X[xi + 1u]));
}

fn c2_x_put(li: u32, u: u32, buf: u32, h: H8) {
    let id = li + u * C2_WG;
    let o = buf * C2_XS + (id / (C2_K / 8u)) * C2_SA + 8u * (id % (C2_K / 8u));
    xs2[o] = h.a.x;
    xs2[o + 1u] = h.a.y;
    xs2[o + 2u] = h.a.z;
    xs2[o + 3u] = h.a.w;
    xs2[o + 4u] = h.b.x;
    xs2[o + 5u] = h.b.y;
    xs2[o + 6u] = h.b.z;
    xs2[o + 7u] = h.b.w;
}

// Read the step at k0 (weights and x of the tile at r_base, t_base) into registers.
fn c2_fetch(li: u32, k0: u32, r_base: u32, t_base: u32) -> Stage2 {
    var s: Stage2;
    s.w0 = c2_w_unit(li, 0u, k0, r_base);
    if (C2_WU > 1u) {
        s.w1 = c2_w_unit(li, 1u, k0, r_base);
    }
    if (C2_WU > 2u) {
        s.w2 = c2_w_unit(li, 2u, k0, r_base);
        s.w3 = c2_w_unit(li, 3u, k0, r_base);
    }
    if (C2_WU > 4u) {
        s.w4 = c2_w_unit(li, 4u, k0, r_base);
        s.w5 = c2_w_unit(li, 5u, k0, r_base);
        s.w6 = c2_w_unit(li, 6u, k0, r_base);
        s.w7 = c2_w_unit(li, 7u, k0, r_base);
    }
    s.x0 = c2_x_unit(li, 0u, k0, t_base);
    if (C2_XU > 1u) {
        s.x1 = c2_x_unit(li, 1u, k0, t_base);
    }
    if (C2_XU > 2u) {
        s.x2 = c2_x_unit(li, 2u, k0, t_base);
        s.x3 = c2_x_unit(li, 3u, k0, t_base);
    }
    if (C2_XU > 4u) {
        s.x4 = c2_x_unit(li, 4u, k0, t_base);
        s.x5 = c2_x_unit(li, 5u, k0, t_base);
        s.x6 = c2_x_unit(li, 6u, k0, t_base);
        s.x7 = c2_x_unit(li, 7u, k0, t_base);
    }
    return s;
}

// Write a fetched step into staging buffer buf.
fn c2_put(li: u32, buf: u32, s: Stage2) {
    c2_w_put(li, 0u, buf, w8_decode(s.w0));
    if (C2_WU > 1u) {
        c2_w_put(li, 1u, buf, w8_decode(s.w1));
    }
    if (C2_WU > 2u) {
        c2_w_put(li, 2u, buf, w8_decode(s.w2));
        c2_w_put(li, 3u, buf, w8_decode(s.w3));
    }
    if (C2_WU > 4u) {
        c2_w_put(li, 4u, buf, w8_decode(s.w4));
        c2_w_put(li, 5u, buf, w8_decode(s.w5));
        c2_w_put(li, 6u, buf, w8_decode(s.w6));
        c2_w_put(li, 7u, buf, w8_decode(s.w7));
    }
    c2_x_put(li, 0u, buf, s.x0);
    if (C2_XU > 1u) {
        c2_x_put(li, 1u, buf, s.x1);
    }
    if (C2_XU > 2u) {
        c2_x_put(li, 2u, buf, s.x2);
        c2_x_put(li, 3u, buf, s.x3);
    }
    if (C2_XU > 4u) {
        c2_x_put(li, 4u, buf, s.x4);
        c2_x_put(li, 5u, buf, s.x5);
        c2_x_put(li, 6u, buf, s.x6);
        c2_x_put(li, 7u, buf, s.x7);
    }
}

// The k step after step s of steps (the last step fetches its own again: the fetch then needs no
// branch, and the buffer it fills is not read any more).
fn c2_next_k(s: u32, steps: u32) -> u32 {
    return select(s + 1u, s, s + 1u == steps) * C2_K;
}

// Subgroup sg's piece: its first row and token in the tile.
fn c2_piece_r(sg: u32) -> u32 {
    return (sg % (C2_R / C2_SR)) * C2_SR;
}

fn c2_piece_t(sg: u32) -> u32 {
    return (sg / (C2_R / C2_SR)) * C2_ST;
}

// Accumulator f's block in its piece: first token and first row.
fn c2_acc_t(f: u32) -> u32 {
    return 16u * (f / C2_NB);
}

fn c2_acc_r(f: u32) -> u32 {
    return 16u * (f % C2_NB);
}

// Offsets in buffer buf of A fragment i of a piece at token t0 (tokens t0 + 16 i ..) and of B
// fragment j of a piece at row r0 (rows r0 + 16 j ..), at k = kk of the step.
fn c2_a_at(buf: u32, t0: u32, i: u32, kk: u32) -> u32 {
    return buf * C2_XS + (t0 + 16u * i) * C2_SA + kk;
}

fn c2_b_at(buf: u32, r0: u32, j: u32, kk: u32) -> u32 {
    return buf * C2_WS + (r0 + 16u * j) * C2_SB + kk;
}

// Index in out of token tok, row row of the piece.
fn c2_out_at(tok: u32, row: u32) -> u32 {
    return tok * P.n_out + P.row0 + row;
}

// Element e < 256 of a 16 x 16 block whose first token is tb and first row rb (token e / 16, row
// e % 16 of it), stored where it is in range.
fn c2_edge_put(tb: u32, rb: u32, e: u32, v: f32) {
    let tok = tb + e / 16u;
    let row = rb + e % 16u;
    if (tok < P.n_tok && row < P.rows) {
        out[c2_out_at(tok, row)] = v;
    }
}

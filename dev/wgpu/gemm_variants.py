#!/usr/bin/env python3
"""Ablations and variants of the tensor-core prefill kernel (matmul_coop2.wgsl) from dumped shaders
(RILL_WGPU_SHADER_DUMP of an `mv_bench --tokens T --precision fast` run): gemm_variants.py DUMP OUT
writes OUT/<variant>/matmul_coop2.<fmt>.wgsl; time each with mv_bench --no-check and
RILL_WGPU_SHADER_DIR=OUT/<variant>. The ablations compute wrong results on purpose: they say where
the kernel's time goes (staging, dequantization, products), not how to make it faster.
Each edit must apply (an edit that finds nothing fails)."""
import os, re, sys

FETCH = "st = c2_fetch(li, c2_next_k(s, steps), r_base, t_base);"
PUT = "c2_put(li, (s + 1u) % C2_BUF, st);"
DEQ = """    let w = deq8(row * P.row_bytes + (e / QK) * BLOCK_BYTES, e % QK);
    return H8(vec4<f16>(w.a), vec4<f16>(w.b));"""
# 16 bytes read as eight f16 (what a pre-dequantized f16 weight would cost to stage), kept in the
# buffer by a clamp: the loads stay, the decoding goes.
RAW = """    let q = wq(min(row * (P.row_bytes / 16u) + e / 8u, arrayLength(&W) - 1u));
    return H8(vec4<f16>(vec2<f16>(unpack2x16float(q.x)), vec2<f16>(unpack2x16float(q.y))),
              vec4<f16>(vec2<f16>(unpack2x16float(q.z)), vec2<f16>(unpack2x16float(q.w))));"""


def nomma(src):
    """No products in the k loop: what staging alone costs."""
    out, n = re.subn(r"\n\s*acc\d = coopMultiplyAdd\([^)]*\);", "", src)
    return out if n == 16 else None


def nostage(src):
    """No staging after the first step: products, fragment loads and barriers alone."""
    if FETCH not in src or PUT not in src:
        return None
    return src.replace(FETCH, "").replace(PUT, "")


def nodeq(src):
    """Weights staged as raw f16 words: staging without the format's decoding."""
    return src.replace(DEQ, RAW) if DEQ in src else None


def replace_fn(src, name, new):
    """Replace the whole top-level function `name` (up to its closing brace at column 0)."""
    start = src.find(f"\nfn {name}(")
    if start < 0:
        return None
    end = src.find("\n}\n", start)
    return src[: start + 1] + new.strip("\n") + src[end + 2 :]


def set_const(src, name, value):
    out, n = re.subn(rf"const {name}: u32 = \d+u;", f"const {name}: u32 = {value}u;", src)
    return out if n == 1 else None


# Coalesced staging: unit u of invocation li covers row (token) id / C2_KC of the tile and its
# elements 8 (id % C2_KC) .. + 8 of the step, so that C2_KC neighbouring invocations read one
# row's (token's) contiguous bytes; today's mapping gives each invocation of a subgroup its own row.
M8_W_UNIT = """
fn c2_w_unit(li: u32, u: u32, k0: u32, r_base: u32) -> H8 {
    let id = li + u * C2_WG;
    let row = min(r_base + id / (C2_K / 8u), P.rows - 1u);
    let e = k0 + 8u * (id % (C2_K / 8u));
    let w = deq8(row * P.row_bytes + (e / QK) * BLOCK_BYTES, e % QK);
    return H8(vec4<f16>(w.a), vec4<f16>(w.b));
}"""
M8_X_UNIT = """
fn c2_x_unit(li: u32, u: u32, k0: u32, t_base: u32) -> H8 {
    let id = li + u * C2_WG;
    let tok = min(t_base + id / (C2_K / 8u), P.n_tok - 1u);
    let xi = tok * (P.n_in / 4u) + (k0 + 8u * (id % (C2_K / 8u))) / 4u;
    return H8(vec4<f16>(X[xi]), vec4<f16>(X[xi + 1u]));
}"""
M8_X_PUT = """
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
}"""
# Weights transposed (k x rows), as today.
M8_W_PUT_T = """
fn c2_w_put(li: u32, u: u32, buf: u32, h: H8) {
    let id = li + u * C2_WG;
    let o = buf * C2_WS + 8u * (id % (C2_K / 8u)) * C2_SB + id / (C2_K / 8u);
    ws2[o] = h.a.x;
    ws2[o + C2_SB] = h.a.y;
    ws2[o + 2u * C2_SB] = h.a.z;
    ws2[o + 3u * C2_SB] = h.a.w;
    ws2[o + 4u * C2_SB] = h.b.x;
    ws2[o + 5u * C2_SB] = h.b.y;
    ws2[o + 6u * C2_SB] = h.b.z;
    ws2[o + 7u * C2_SB] = h.b.w;
}"""
# Weights in their own order (rows x k, stride C2_K + 8): B read column-major (coopLoad).
M8_W_PUT_R = """
fn c2_w_put(li: u32, u: u32, buf: u32, h: H8) {
    let id = li + u * C2_WG;
    let o = buf * C2_WS + (id / (C2_K / 8u)) * (C2_K + 8u) + 8u * (id % (C2_K / 8u));
    ws2[o] = h.a.x;
    ws2[o + 1u] = h.a.y;
    ws2[o + 2u] = h.a.z;
    ws2[o + 3u] = h.a.w;
    ws2[o + 4u] = h.b.x;
    ws2[o + 5u] = h.b.y;
    ws2[o + 6u] = h.b.z;
    ws2[o + 7u] = h.b.w;
}"""
B_AT_R = """
fn c2_b_at(buf: u32, r0: u32, j: u32, kk: u32) -> u32 {
    return buf * C2_WS + (r0 + 16u * j) * (C2_K + 8u) + kk;
}"""


def chain(src, *edits):
    for e in edits:
        if src is None:
            return None
        src = e(src)
    return src


def m8(src):
    """Coalesced staging of x and the weights (weights still transposed in workgroup memory)."""
    return chain(
        src,
        lambda s: replace_fn(s, "c2_w_unit", M8_W_UNIT),
        lambda s: replace_fn(s, "c2_x_unit", M8_X_UNIT),
        lambda s: replace_fn(s, "c2_x_put", M8_X_PUT),
        lambda s: replace_fn(s, "c2_w_put", M8_W_PUT_T),
    )


def one_scratch(src):
    """One 16-row scratch block for every subgroup (the zeros only: edge tiles come out wrong;
    frees workgroup memory for timing layouts that need more)."""
    a = "var<workgroup> scr2: array<f32, (C2_WG / 32u) * 16u * C2_SCS>;"
    b = "let so = sg * 16u * C2_SCS;"
    if a not in src or b not in src:
        return None
    return src.replace(a, "var<workgroup> scr2: array<f32, 16u * C2_SCS>;").replace(b, "let so = 0u;")


def m8col(src):
    """m8, the weights kept rows x k in workgroup memory and B loaded column-major."""
    old = "coopLoadT<coop_mat16x16<f16, B>>(&ws2["
    if old not in src:
        return None
    k = int(re.search(r"const C2_K: u32 = (\d+)u;", src).group(1))
    r = int(re.search(r"const C2_R: u32 = (\d+)u;", src).group(1))
    src = re.sub(r"coopLoadT<coop_mat16x16<f16, B>>\(&ws2\[(ob\d)\], C2_SB\)",
                 rf"coopLoad<coop_mat16x16<f16, B>>(&ws2[\1], {k + 8}u)", src)
    return chain(
        src,
        m8,
        lambda s: replace_fn(s, "c2_w_put", M8_W_PUT_R),
        lambda s: replace_fn(s, "c2_b_at", B_AT_R),
        lambda s: set_const(s, "C2_WS", r * (k + 8)),
        one_scratch,
    )


def k64b1(src):
    """k step 64, one staging buffer."""
    t = int(re.search(r"const C2_T: u32 = (\d+)u;", src).group(1))
    r = int(re.search(r"const C2_R: u32 = (\d+)u;", src).group(1))
    wg = int(re.search(r"const C2_WG: u32 = (\d+)u;", src).group(1))
    return chain(
        src,
        lambda s: set_const(s, "C2_K", 64),
        lambda s: set_const(s, "C2_BUF", 1),
        lambda s: set_const(s, "C2_SA", 72),
        lambda s: set_const(s, "C2_SB", r + 8),
        lambda s: set_const(s, "C2_XS", t * 72),
        lambda s: set_const(s, "C2_WS", 64 * (r + 8)),
        lambda s: set_const(s, "C2_WU", r * 64 // 8 // wg),
        lambda s: set_const(s, "C2_XU", t * 64 // 8 // wg),
    )


# Loads only in the fetch, their conversion (x to f16; with `wraw`, the Q4_K decode too) in the
# put after the step's products, so that the loads' latency hides under the products (the
# compiler keeps a conversion next to its load). Default geometry only (two units of each).
RAW_STRUCT = """
struct Raw2 {
    w0: H8, w1: H8,
    h0: vec4<u32>, q0: vec4<u32>, i0: u32,
    h1: vec4<u32>, q1: vec4<u32>, i1: u32,
    x0a: vec4<f32>, x0b: vec4<f32>, x1a: vec4<f32>, x1b: vec4<f32>,
}

fn raw_x(li: u32, u: u32, k0: u32, t_base: u32) -> u32 {
    let id = li + u * C2_WG;
    let tok = min(t_base + id / (C2_K / 8u), P.n_tok - 1u);
    return tok * (P.n_in / 4u) + (k0 + 8u * (id % (C2_K / 8u))) / 4u;
}
"""
Q4_RAW = """
// Q4_K unit: the block header and the 16 bytes holding the unit's 8 bytes of quants.
fn raw_w(li: u32, u: u32, k0: u32, r_base: u32) -> vec4<u32> {
    let id = li + u * C2_WG;
    let row = min(r_base + id / (C2_K / 8u), P.rows - 1u);
    let e = k0 + 8u * (id % (C2_K / 8u));
    return vec4<u32>(row * P.row_bytes + (e / QK) * BLOCK_BYTES, e % QK, 0u, 0u);
}

fn raw_q(bb: u32, i0: u32) -> u32 {
    let j = i0 >> 5u;
    return ((bb + 16u + 32u * (j >> 1u) + (i0 & 31u)) >> 2u) >> 2u;
}

fn deq8_raw(h: vec4<u32>, q: vec4<u32>, i0: u32) -> H8 {
    let d = f16x2(h.x);
    let j = i0 >> 5u;
    let sm = kq_scale_min(j, h.yzw);
    let dl = d.x * f32(sm.x);
    let ml = d.y * f32(sm.y);
    let hi = j & 1u;
    let second = ((i0 & 31u) & 8u) != 0u;
    let lo = select(q.x, q.z, second);
    let up = select(q.y, q.w, second);
    return H8(vec4<f16>(dl * nib4(lo, hi) - ml), vec4<f16>(dl * nib4(up, hi) - ml));
}
"""
FETCH_X = """
fn c2_fetch(li: u32, k0: u32, r_base: u32, t_base: u32) -> Raw2 {
    var s: Raw2;
    s.w0 = c2_w_unit(li, 0u, k0, r_base);
    s.w1 = c2_w_unit(li, 1u, k0, r_base);
    let a = raw_x(li, 0u, k0, t_base);
    let b = raw_x(li, 1u, k0, t_base);
    s.x0a = X[a];
    s.x0b = X[a + 1u];
    s.x1a = X[b];
    s.x1b = X[b + 1u];
    return s;
}"""
PUT_X = """
fn c2_put(li: u32, buf: u32, s: Raw2) {
    c2_w_put(li, 0u, buf, s.w0);
    c2_w_put(li, 1u, buf, s.w1);
    c2_x_put(li, 0u, buf, H8(vec4<f16>(s.x0a), vec4<f16>(s.x0b)));
    c2_x_put(li, 1u, buf, H8(vec4<f16>(s.x1a), vec4<f16>(s.x1b)));
}"""
FETCH_W = """
fn c2_fetch(li: u32, k0: u32, r_base: u32, t_base: u32) -> Raw2 {
    var s: Raw2;
    let w0 = raw_w(li, 0u, k0, r_base);
    let w1 = raw_w(li, 1u, k0, r_base);
    s.h0 = wq(w0.x >> 4u);
    s.q0 = wq(raw_q(w0.x, w0.y));
    s.i0 = w0.y;
    s.h1 = wq(w1.x >> 4u);
    s.q1 = wq(raw_q(w1.x, w1.y));
    s.i1 = w1.y;
    let a = raw_x(li, 0u, k0, t_base);
    let b = raw_x(li, 1u, k0, t_base);
    s.x0a = X[a];
    s.x0b = X[a + 1u];
    s.x1a = X[b];
    s.x1b = X[b + 1u];
    return s;
}"""
PUT_W = """
fn c2_put(li: u32, buf: u32, s: Raw2) {
    c2_w_put(li, 0u, buf, deq8_raw(s.h0, s.q0, s.i0));
    c2_w_put(li, 1u, buf, deq8_raw(s.h1, s.q1, s.i1));
    c2_x_put(li, 0u, buf, H8(vec4<f16>(s.x0a), vec4<f16>(s.x0b)));
    c2_x_put(li, 1u, buf, H8(vec4<f16>(s.x1a), vec4<f16>(s.x1b)));
}"""


def two_units(src):
    if "const C2_WU: u32 = 2u;" not in src or "const C2_XU: u32 = 2u;" not in src:
        return None
    return src


def xraw(src):
    return chain(
        src,
        two_units,
        lambda s: s.replace("\nfn c2_fetch(", RAW_STRUCT + "\nfn c2_fetch(", 1),
        lambda s: replace_fn(s, "c2_fetch", FETCH_X),
        lambda s: replace_fn(s, "c2_put", PUT_X),
    )


def wraw(src):
    """xraw, and for Q4_K the weights' decode in the put too (other formats: xraw)."""
    if "const BLOCK_BYTES: u32 = 144u;" not in src:
        return xraw(src)
    return chain(
        src,
        two_units,
        lambda s: s.replace("\nfn c2_fetch(", RAW_STRUCT + Q4_RAW + "\nfn c2_fetch(", 1),
        lambda s: replace_fn(s, "c2_fetch", FETCH_W),
        lambda s: replace_fn(s, "c2_put", PUT_W),
    )


VARIANTS = {
    "nomma": [nomma],
    "nostage": [nostage],
    "nodeq": [nodeq],
    "m8": [m8],
    "m8col": [m8col],
    "m8k64": [k64b1, m8],
    "m8colk64": [k64b1, m8col],
}
# On a dump of the tree's kernel (coalesced staging since 2026-12-02): the raw-fetch variants.
if os.environ.get("GEMM_VARIANTS") == "raw":
    VARIANTS = {"xraw": [xraw], "wraw": [wraw]}


def main():
    dump, out = sys.argv[1], sys.argv[2]
    files = [f for f in os.listdir(dump) if f.startswith("matmul_coop2.") and f.endswith(".wgsl")]
    if not files:
        sys.exit(f"no matmul_coop2 shaders in {dump}")
    for v, edits in VARIANTS.items():
        os.makedirs(os.path.join(out, v), exist_ok=True)
        for f in files:
            src = open(os.path.join(dump, f)).read()
            for e in edits:
                new = e(src)
                if new is None:
                    sys.exit(f"{v}: edit {e.__name__} does not apply to {f}")
                src = new
            open(os.path.join(out, v, f), "w").write(src)
        print(v, len(files), "files")


main()

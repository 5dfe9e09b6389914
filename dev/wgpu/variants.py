#!/usr/bin/env python3
"""Make kernel variants from dumped wgpu shaders (RILL_WGPU_SHADER_DUMP): variants.py DUMP OUT
writes OUT/<variant>/<file>.wgsl for each variant below; run examples/mv_bench with
RILL_WGPU_SHADER_DIR=OUT/<variant>. Each edit must apply (an edit that finds nothing fails)."""
import os, sys

# Landed (25ebc9a, measured with this harness on the H200; BENCHMARKS.md "tenth session"): the f16
# scales through unpack2x16float and the Q4_K / Q6_K dot segments' planes combined in i32. What is
# left here is the next experiment; add a function per edit and a VARIANTS line per combination.

RUN_OLD = """fn mv_run(rb_lo: vec4<u32>, rb_hi: vec4<u32>, u0: u32, lw: u32, xb: u32) -> MvAcc {
    var a = MvAcc(vec4<f32>(0.0), vec4<f32>(0.0));
    for (var u = u0; u < P.units; u += lw) {
        a = mv_add(a, rb_lo, rb_hi, u, mv_x(u, xb));
    }
    return a;
}"""
# Q4_K dot units, MV_R = 2: the next unit's weight words are loaded before this unit's
# arithmetic (two units' loads in flight per invocation).
RUN_PF = """struct MvW {
    hd: vec4<u32>,
    p: vec4<u32>,
    r: vec4<u32>,
}

fn mv_ld(rb: u32, u: u32) -> MvW {
    let v = u & 3u;
    let q0 = (rb >> 4u) + 9u * (u >> 2u);
    return MvW(wq(q0), wq(q0 + 1u + v), wq(q0 + 5u + v));
}

fn mv_dotw(w: MvW, u: u32, x: MvX) -> f32 {
    let v = u & 3u;
    let lo = vec4<u32>(0x0f0f0f0fu);
    let four = vec4<u32>(4u);
    let sq = dq_unit15(w.p & lo, (w.p >> four) & lo, w.r & lo, (w.r >> four) & lo, x);
    let sm = kq_unit_scales(w.hd, v >> 1u);
    let dm = f16x2(w.hd.x);
    return dm.x * dot(bytes_f4(sm.x, 0.0), sq) - dm.y * dot(bytes_f4(sm.y, 0.0), x.sum);
}

fn mv_run(rb_lo: vec4<u32>, rb_hi: vec4<u32>, u0: u32, lw: u32, xb: u32) -> MvAcc {
    var a = vec4<f32>(0.0);
    var u = u0;
    if (u >= P.units) {
        return MvAcc(a, a);
    }
    var w0 = mv_ld(rb_lo.x, u);
    var w1 = mv_ld(rb_lo.y, u);
    loop {
        let un = u + lw;
        let more = un < P.units;
        let uc = select(u, un, more);
        let n0 = mv_ld(rb_lo.x, uc);
        let n1 = mv_ld(rb_lo.y, uc);
        let x = mv_x(u, xb);
        a.x += mv_dotw(w0, u, x);
        a.y += mv_dotw(w1, u, x);
        if (!more) {
            break;
        }
        w0 = n0;
        w1 = n1;
        u = un;
    }
    return MvAcc(a, vec4<f32>(0.0));
}"""

def pf(src, name):
    if not name.startswith("matvec.q4_k"):
        return src
    if RUN_OLD not in src or "const MV_R: u32 = 2u;" not in src:
        return None
    return src.replace(RUN_OLD, RUN_PF)

Q6_PACK_OLD = """    let lo = (l >> vec4<u32>(4u * hi)) & vec4<u32>(0x0f0f0f0fu);
    return lo | (((qh >> vec4<u32>(2u * k)) & vec4<u32>(0x03030303u)) << vec4<u32>(4u));"""
# Q6_K: bits 2k, 2k + 1 of each qh byte to bits 4, 5 with one shift and one mask (k is a
# constant after inlining, so the select folds).
Q6_PACK_NEW = """    let lo = (l >> vec4<u32>(4u * hi)) & vec4<u32>(0x0f0f0f0fu);
    let up = select(qh << vec4<u32>(4u - 2u * min(k, 2u)), qh >> vec4<u32>(2u), k > 2u);
    return lo | (up & vec4<u32>(0x30303030u));"""

def q6pack(src, name):
    if "q6_k" not in name:
        return src
    return src.replace(Q6_PACK_OLD, Q6_PACK_NEW) if Q6_PACK_OLD in src else None

WIN_OLD = """    let v = realign4(a, b, s1, s2);
    if ((o & 2u) == 0u) {
        return v;
    }
    return half_shift(v, select(select(b.x, b.y, s1), select(b.z, b.w, s1), s2));"""
# Q6_K windows without the branch on the half-word offset (lanes 4 apart read blocks of
# different alignment, so the branch diverged): a funnel shift by 0 or 16 bits, the second
# operand shifted in two steps so that a shift by 0 leaves no bits of it.
WIN_NEW = """    let v = realign4(a, b, s1, s2);
    let n = select(select(b.x, b.y, s1), select(b.z, b.w, s1), s2);
    let sh = vec4<u32>((o & 2u) * 8u);
    return (v >> sh) | ((vec4<u32>(v.yzw, n) << vec4<u32>(8u)) << (vec4<u32>(24u) - sh));"""

def q6win(src, name):
    if "q6_k" not in name:
        return src
    return src.replace(WIN_OLD, WIN_NEW) if WIN_OLD in src else None

VARIANTS = {
    "pf": [pf],
    "q6pack": [q6pack],
    "q6win": [q6win],
    "q6both": [q6pack, q6win],
}

def write_variants(dump, out, prefixes, variants, what):
    """Each variant's edits applied, in order, to every dumped shader whose name starts with one of
    `prefixes`, written to out/<variant>/ (shared with gemm_variants.py)."""
    files = [f for f in os.listdir(dump) if f.endswith(".wgsl") and f.startswith(prefixes)]
    if not files:
        sys.exit(f"no {what} shaders in {dump}")
    for v, edits in variants.items():
        os.makedirs(os.path.join(out, v), exist_ok=True)
        for f in files:
            src = open(os.path.join(dump, f)).read()
            for e in edits:
                new = e(src, f)
                if new is None:
                    sys.exit(f"{v}: edit {e.__name__} does not apply to {f}")
                src = new
            open(os.path.join(out, v, f), "w").write(src)
        print(v, len(files), "files")


if __name__ == "__main__":
    write_variants(sys.argv[1], sys.argv[2], ("matvec", "moe_"), VARIANTS, "matrix-vector")

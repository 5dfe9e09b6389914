#!/usr/bin/env python3
"""Ablations of the tensor-core prefill kernel (matmul_coop2.wgsl) from dumped shaders
(RILL_WGPU_SHADER_DUMP of an `mv_bench --tokens T --precision fast` run): gemm_variants.py DUMP OUT
writes OUT/<variant>/matmul_coop2.<fmt>.wgsl; time each with mv_bench --no-check and
RILL_WGPU_SHADER_DIR=OUT/<variant>. The ablations compute wrong results on purpose: they say where
the kernel's time goes (staging or products), not how to make it faster. The staging variants
measured with this harness, and the two that landed, are in dev/wgpu/DECISIONS.md ("Prefill").
Each edit must apply (an edit that finds nothing fails)."""
import os, re, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from variants import write_variants

FETCH = "st = c2_fetch(li, c2_next_k(s, steps), r_base, t_base);"
PUT = "c2_put(li, (s + 1u) % C2_BUF, st);"


def nomma(src, _name):
    """No products in the k loop: what staging alone costs."""
    out, n = re.subn(r"\n\s*acc\d = coopMultiplyAdd\([^)]*\);", "", src)
    return out if n == 16 else None


def nostage(src, _name):
    """No staging after the first step: products, fragment loads and barriers alone."""
    if FETCH not in src or PUT not in src:
        return None
    return src.replace(FETCH, "").replace(PUT, "")


VARIANTS = {
    "nomma": [nomma],
    "nostage": [nostage],
}

if __name__ == "__main__":
    write_variants(sys.argv[1], sys.argv[2], ("matmul_coop2.",), VARIANTS, "matmul_coop2")

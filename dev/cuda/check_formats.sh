#!/usr/bin/env bash
# Check the CUDA weight decoders (kernels-cuda/formats.cuh) on the CPU, no GPU needed: the header is
# compiled with g++ through dev/cuda/host_shim.h and every format ggml stored in
# tests/fixtures/quants.gguf is decoded and compared bit for bit with ggml's dequantization
# (tests/fixtures/quants.reference.safetensors); the factored dot products are checked too.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - tests/fixtures/quants.gguf tests/fixtures/quants.reference.safetensors "$tmp/vectors.bin" <<'PY'
import json, struct, sys
g = open(sys.argv[1], 'rb').read()
pos = 0
def take(fmt):
    global pos
    v = struct.unpack_from('<' + fmt, g, pos)
    pos += struct.calcsize('<' + fmt)
    return v[0] if len(v) == 1 else v
def string():
    global pos
    n = take('Q'); s = g[pos:pos + n].decode(); pos += n; return s
SIZES = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}
def value(t):
    if t == 8: return string()
    if t == 9:
        et, n = take('I'), take('Q')
        return [value(et) for _ in range(n)]
    return take(SIZES[t])
assert g[:4] == b'GGUF'; pos = 4
version, n_tensors, n_kv = take('I'), take('Q'), take('Q')
align = 32
for _ in range(n_kv):
    k = string(); v = value(take('I'))
    if k == 'general.alignment': align = v
infos = []
for _ in range(n_tensors):
    name = string(); nd = take('I'); dims = [take('Q') for _ in range(nd)]; ty = take('I'); off = take('Q')
    infos.append((name, dims, ty, off))
data0 = (pos + align - 1) // align * align
ends = sorted(o for _, _, _, o in infos) + [len(g) - data0]
s = open(sys.argv[2], 'rb').read()
hn = struct.unpack('<Q', s[:8])[0]
h = json.loads(s[8:8 + hn])
out = open(sys.argv[3], 'wb')
for name, dims, ty, off in infos:
    if not name.startswith('q.') or 'deq.' + name[2:] not in h: continue
    t = name[2:]
    nxt = min(e for e in ends if e > off)
    d = h['deq.' + t]; a, b = d['data_offsets']
    deq = s[8 + hn + a:8 + hn + b]
    cols, rows = dims[0], dims[1]
    # Block bytes: the data up to the next tensor, trimmed to the rows (tensors are aligned).
    blob = g[data0 + off:data0 + nxt]
    per = json.load(open(sys.argv[1].replace('.gguf', '.reference.json')))['types'][t]['bytes_per_row']
    blob = blob[:per * rows]
    out.write(struct.pack('<I', len(t)) + t.encode() + struct.pack('<IIQ', rows, cols, len(blob)) + blob + deq)
# Formats the fixture does not hold, from their definitions: MXFP4 (E8M0 scale, doubled e2m1
# values; exact products), and F32/F16 rows of an odd length (a partial last unit).
import random
random.seed(7)
def emit(t, rows, cols, blob, vals):
    out.write(struct.pack('<I', len(t)) + t.encode() + struct.pack('<IIQ', rows, cols, len(blob)) + blob
              + struct.pack('<%df' % len(vals), *vals))
V = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
blob, vals = b'', []
for _ in range(8 * 512 // 32):
    e = random.randint(118, 125)
    qs = bytes(random.randrange(256) for _ in range(16))
    blob += bytes([e]) + qs
    d = 2.0 ** (e - 128)
    vals += [V[q & 15] * d for q in qs] + [V[q >> 4] * d for q in qs]
emit('MXFP4', 8, 512, blob, vals)
f = [random.uniform(-2, 2) for _ in range(5 * 37)]
f = [struct.unpack('<f', struct.pack('<f', x))[0] for x in f]
emit('F32', 5, 37, struct.pack('<%df' % len(f), *f), f)
h = [struct.unpack('<e', struct.pack('<e', x))[0] for x in f]
emit('F16', 5, 37, struct.pack('<%de' % len(h), *h), h)
PY
g++ -O2 -std=c++17 -ffp-contract=off -Wall -Wno-unknown-pragmas -I kernels-cuda -include dev/cuda/host_shim.h dev/cuda/check_formats.cpp -o "$tmp/check"
"$tmp/check" "$tmp/vectors.bin"

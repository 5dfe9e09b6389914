//! Shared pieces of the fuzz targets: a byte reader that turns fuzzer input into choices, and a
//! builder of tiny Qwen3.5 models (dense or MoE) whose hyper-parameters, metadata types,
//! tensor shapes, types and values all come from the input, mostly valid and sometimes not.

use std::path::PathBuf;

use rill::gguf::{GgmlType, GgufWriter, Value};

/// The repository's fixtures (the fuzz crate lives in `fuzz/`).
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// Fuzzer input read as a stream of choices; past the end every read is 0, so any input
/// (even empty) describes something.
pub struct Choices<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Choices<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Choices { data, pos: 0 }
    }

    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// One of `options` (the first when the input is exhausted).
    pub fn pick<T: Clone>(&mut self, options: &[T]) -> T {
        options[self.u8() as usize % options.len()].clone()
    }

    /// True with probability about `n / 256`; false for a 0 byte (an exhausted input takes
    /// every default).
    pub fn chance(&mut self, n: u8) -> bool {
        self.u8() > 255 - n
    }

    /// The unread rest of the input.
    pub fn rest(&self) -> &'a [u8] {
        self.data.get(self.pos..).unwrap_or(&[])
    }
}

/// Hyper-parameters of a tiny model.
#[derive(Debug, Clone)]
pub struct Shape {
    pub moe: bool,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub block_count: usize,
    pub nextn: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub hk: usize,
    pub hv: usize,
    pub d_state: usize,
    pub conv_kernel: usize,
    pub n_ff: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub interval: usize,
}

impl Shape {
    pub fn from_choices(c: &mut Choices<'_>) -> Shape {
        let n_head_kv = c.pick(&[1, 1, 2]);
        let hk = c.pick(&[1, 1, 2]);
        let n_expert = c.pick(&[2, 3, 4]);
        Shape {
            moe: c.chance(96),
            n_embd: c.pick(&[32, 8, 16, 32, 64]),
            n_vocab: c.pick(&[32, 16, 33, 64]),
            block_count: c.pick(&[2, 1, 3, 4]),
            nextn: c.pick(&[0, 0, 0, 1]),
            n_head: n_head_kv * c.pick(&[2, 1, 3]),
            n_head_kv,
            head_dim: c.pick(&[8, 4, 16]),
            n_rot: c.pick(&[4, 2, 8]),
            hk,
            hv: hk * c.pick(&[2, 1]),
            d_state: c.pick(&[8, 4, 16]),
            conv_kernel: c.pick(&[4, 2, 3]),
            n_ff: c.pick(&[32, 16, 8]),
            n_expert,
            n_expert_used: c.pick(&[1, 2]).min(n_expert),
            interval: c.pick(&[2, 1, 3, 4]),
        }
    }

    /// Trunk layer `i` is gated full attention (else Gated DeltaNet).
    fn is_attention(&self, i: usize) -> bool {
        (i + 1).is_multiple_of(self.interval)
    }
}

/// Deterministic fill values: xorshift64 scaled to about ±`scale`.
struct Fill(u64);

impl Fill {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// One planned tensor: name, ggml `ne`, and the value its elements hover around.
struct Planned {
    name: String,
    ne: Vec<u64>,
    center: f32,
}

fn plan(s: &Shape) -> Vec<Planned> {
    let t = |name: String, ne: &[usize], center: f32| Planned {
        name,
        ne: ne.iter().map(|&x| x as u64).collect(),
        center,
    };
    let (kd, vd) = (s.hk * s.d_state, s.hv * s.d_state);
    let cd = 2 * kd + vd;
    let mut out = vec![
        t("token_embd.weight".into(), &[s.n_embd, s.n_vocab], 0.0),
        t("output_norm.weight".into(), &[s.n_embd], 1.0),
    ];
    for i in 0..s.block_count {
        let p = |n: &str| format!("blk.{i}.{n}");
        out.push(t(p("attn_norm.weight"), &[s.n_embd], 1.0));
        out.push(t(p("post_attention_norm.weight"), &[s.n_embd], 1.0));
        if s.is_attention(i) || i >= s.block_count - s.nextn {
            let (h, hkv, hd) = (s.n_head, s.n_head_kv, s.head_dim);
            out.push(t(p("attn_q.weight"), &[s.n_embd, 2 * h * hd], 0.0));
            out.push(t(p("attn_k.weight"), &[s.n_embd, hkv * hd], 0.0));
            out.push(t(p("attn_v.weight"), &[s.n_embd, hkv * hd], 0.0));
            out.push(t(p("attn_q_norm.weight"), &[hd], 1.0));
            out.push(t(p("attn_k_norm.weight"), &[hd], 1.0));
            out.push(t(p("attn_output.weight"), &[h * hd, s.n_embd], 0.0));
        } else {
            out.push(t(p("attn_qkv.weight"), &[s.n_embd, cd], 0.0));
            out.push(t(p("attn_gate.weight"), &[s.n_embd, vd], 0.0));
            out.push(t(p("ssm_beta.weight"), &[s.n_embd, s.hv], 0.0));
            out.push(t(p("ssm_alpha.weight"), &[s.n_embd, s.hv], 0.0));
            out.push(t(p("ssm_conv1d.weight"), &[s.conv_kernel, cd], 0.0));
            out.push(t(p("ssm_dt.bias"), &[s.hv], 0.0));
            out.push(t(p("ssm_a"), &[s.hv], -1.0));
            out.push(t(p("ssm_norm.weight"), &[s.d_state], 1.0));
            out.push(t(p("ssm_out.weight"), &[vd, s.n_embd], 0.0));
        }
        if s.moe {
            let (e, f) = (s.n_expert, s.n_ff);
            out.push(t(p("ffn_gate_inp.weight"), &[s.n_embd, e], 0.0));
            out.push(t(p("ffn_gate_exps.weight"), &[s.n_embd, f, e], 0.0));
            out.push(t(p("ffn_up_exps.weight"), &[s.n_embd, f, e], 0.0));
            out.push(t(p("ffn_down_exps.weight"), &[f, s.n_embd, e], 0.0));
            out.push(t(p("ffn_gate_inp_shexp.weight"), &[s.n_embd], 0.0));
            out.push(t(p("ffn_gate_shexp.weight"), &[s.n_embd, f], 0.0));
            out.push(t(p("ffn_up_shexp.weight"), &[s.n_embd, f], 0.0));
            out.push(t(p("ffn_down_shexp.weight"), &[f, s.n_embd], 0.0));
        } else {
            out.push(t(p("ffn_gate.weight"), &[s.n_embd, s.n_ff], 0.0));
            out.push(t(p("ffn_up.weight"), &[s.n_embd, s.n_ff], 0.0));
            out.push(t(p("ffn_down.weight"), &[s.n_ff, s.n_embd], 0.0));
        }
    }
    out
}

fn metadata(s: &Shape, c: &mut Choices<'_>) -> Vec<(String, Value)> {
    let a = if s.moe { "qwen35moe" } else { "qwen35" };
    let k = |x: &str| format!("{a}.{x}");
    let u = |x: usize| Value::U32(x as u32);
    let mut kv = vec![
        ("general.architecture".to_string(), Value::String(a.into())),
        (k("block_count"), u(s.block_count)),
        (k("embedding_length"), u(s.n_embd)),
        (k("context_length"), u(64)),
        (k("attention.head_count"), u(s.n_head)),
        (k("attention.head_count_kv"), u(s.n_head_kv)),
        (k("attention.key_length"), u(s.head_dim)),
        (k("attention.value_length"), u(s.head_dim)),
        (
            k("attention.layer_norm_rms_epsilon"),
            Value::F32(c.pick(&[1e-6, 1e-5, 0.0, f32::NAN, 0.5])),
        ),
        (k("rope.dimension_count"), u(s.n_rot)),
        (k("rope.freq_base"), Value::F32(c.pick(&[1e4, 1e7, f32::INFINITY, 1.0]))),
        (k("ssm.conv_kernel"), u(s.conv_kernel)),
        (k("ssm.state_size"), u(s.d_state)),
        (k("ssm.group_count"), u(s.hk)),
        (k("ssm.time_step_rank"), u(s.hv)),
        (k("ssm.inner_size"), u(s.hv * s.d_state)),
    ];
    if s.nextn > 0 {
        kv.push((k("nextn_predict_layers"), u(s.nextn)));
    }
    if c.chance(128) {
        kv.push((k("full_attention_interval"), u(s.interval)));
    } else {
        let extra = c.pick(&[0, 0, 0, 1]);
        let flags = (0..s.block_count + extra).map(|i| Value::Bool(!s.is_attention(i)));
        kv.push((k("attention.recurrent_layers"), Value::Array(flags.collect())));
    }
    if s.moe {
        kv.push((k("expert_count"), u(s.n_expert)));
        kv.push((k("expert_used_count"), u(s.n_expert_used)));
        kv.push((k("expert_feed_forward_length"), u(s.n_ff)));
        kv.push((k("expert_shared_feed_forward_length"), u(s.n_ff)));
        let scale = c.pick(&[0.0, 1.0, 2.5, f32::NAN, -1.0]);
        kv.push((k("expert_weights_scale"), Value::F32(scale)));
    } else {
        kv.push((k("feed_forward_length"), u(s.n_ff)));
    }
    // Occasionally a key with the wrong type or a negative value.
    if c.chance(24) {
        let i = c.u8() as usize % kv.len();
        kv[i].1 = c.pick(&[
            Value::I32(-3),
            Value::String("x".into()),
            Value::Bool(true),
            Value::U64(u64::MAX),
        ]);
    }
    if c.chance(16) {
        let i = c.u8() as usize % kv.len();
        kv.remove(i);
    }
    kv
}

/// A GGUF file of a tiny model described by the choices: usually loadable, sometimes with a
/// wrong key, a missing or misshapen tensor, a quantized type or non-finite weights.
pub fn tiny_model(c: &mut Choices<'_>) -> Vec<u8> {
    let s = Shape::from_choices(c);
    let mut w = GgufWriter::new();
    for (k, v) in metadata(&s, c) {
        w.add_kv(k, v);
    }
    let mut planned = plan(&s);
    if c.chance(16) {
        let i = c.u8() as usize % planned.len();
        planned.remove(i);
    }
    if c.chance(16) {
        let i = c.u8() as usize % planned.len();
        planned[i].ne[0] += 1;
    }
    let mut fill = Fill(u64::from(c.u32()) | 1);
    let poison = c
        .chance(16)
        .then(|| c.pick(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30]));
    let mut datas = Vec::new();
    for t in &planned {
        // Q8_0 where the rows allow it (32-element blocks), else F16 or F32.
        let ty = match c.u8() % 4 {
            0 if t.ne[0] % 32 == 0 => GgmlType::Q8_0,
            1 => GgmlType::F16,
            _ => GgmlType::F32,
        };
        let Ok(idx) = w.add_tensor(t.name.clone(), t.ne.clone(), ty) else {
            continue;
        };
        let n: u64 = t.ne.iter().product();
        let mut vals: Vec<f32> = (0..n).map(|_| t.center + 0.5 * fill.next()).collect();
        if let (Some(p), Some(v)) = (poison, vals.first_mut()) {
            *v = p;
        }
        datas.push((idx, encode(ty, &vals)));
    }
    let mut out = Vec::new();
    if w.write_header(&mut out).is_err() {
        return out;
    }
    for (idx, data) in datas {
        if w.write_tensor_data(&mut out, idx, &data).is_err() {
            break;
        }
    }
    out
}

/// Encode f32 values as `ty` (F32, F16, or Q8_0 with one f16 scale per 32 values).
fn encode(ty: GgmlType, vals: &[f32]) -> Vec<u8> {
    match ty {
        GgmlType::F16 => vals.iter().flat_map(|v| f16_bits(*v).to_le_bytes()).collect(),
        GgmlType::Q8_0 => vals
            .chunks(32)
            .flat_map(|b| {
                let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = if amax > 0.0 && amax.is_finite() {
                    amax / 127.0
                } else {
                    1.0
                };
                let mut block = f16_bits(d).to_le_bytes().to_vec();
                block.extend(b.iter().map(|v| (v / d).round().clamp(-127.0, 127.0) as i8 as u8));
                block
            })
            .collect(),
        _ => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// f32 → IEEE half bits, round toward zero (values here are small; exactness does not matter).
fn f16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xFF) as i32;
    let man = b & 0x7F_FFFF;
    if exp == 0xFF {
        return sign | 0x7C00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1F {
        sign | 0x7C00
    } else if e <= 0 {
        sign
    } else {
        sign | ((e as u16) << 10) | (man >> 13) as u16
    }
}

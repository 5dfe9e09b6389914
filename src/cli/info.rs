//! `rill info`: architecture, hyper-parameters, tensor count and the quant-type mix with sizes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;

use super::common;
use crate::error::Result;
use crate::exec::StatePool;
use crate::gguf::GgufFile;
use crate::model::Config;

#[derive(Args)]
pub struct InfoArgs {
    /// GGUF model file.
    #[arg(short, long)]
    model: PathBuf,
}

/// Human-readable byte count.
pub fn human_bytes(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

/// `(type name, tensor count, bytes)` sorted by bytes, largest first.
pub fn type_mix(file: &GgufFile) -> Vec<(String, usize, u64)> {
    let mut mix: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for t in &file.tensors {
        let e = mix.entry(t.ggml_type.name().to_string()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    let mut v: Vec<_> = mix.into_iter().map(|(k, (c, b))| (k, c, b)).collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.2));
    v
}

pub fn run(a: InfoArgs) -> Result<()> {
    let file = GgufFile::open(&a.model)?;
    let mut o = String::new();
    writeln!(o, "file:         {}", a.model.display())?;
    writeln!(o, "gguf version: {}", file.version)?;
    writeln!(o, "file size:    {}", human_bytes(file.file_len()))?;
    match Config::from_gguf(&file) {
        Ok(c) => print_config(&mut o, &c)?,
        Err(e) => writeln!(o, "model:        not runnable by rill ({e})")?,
    }
    let total: u64 = file.tensors.iter().map(|t| t.n_bytes).sum();
    let params: u64 = file.tensors.iter().map(|t| t.n_elements).sum();
    writeln!(
        o,
        "tensors:      {} ({} parameters, {})",
        file.tensors.len(),
        params,
        human_bytes(total)
    )?;
    writeln!(o, "type mix:")?;
    for (name, count, bytes) in type_mix(&file) {
        writeln!(
            o,
            "  {name:<8} {count:>5} tensors  {:>12}  {:5.1}%",
            human_bytes(bytes),
            100.0 * bytes as f64 / total.max(1) as f64
        )?;
    }
    common::emit(&o)
}

fn print_config(o: &mut String, c: &Config) -> Result<()> {
    let n_attn = c.n_layer - c.n_linear_layers();
    writeln!(o, "architecture: {} ({})", c.arch.gguf_name(), c.name)?;
    writeln!(
        o,
        "layers:       {} ({} Gated DeltaNet, {} gated attention)",
        c.n_layer,
        c.n_linear_layers(),
        n_attn
    )?;
    writeln!(
        o,
        "embedding:    {}  vocab: {}  trained context: {}",
        c.n_embd, c.n_vocab, c.context_length
    )?;
    writeln!(
        o,
        "attention:    {} heads, {} kv heads, head dim {}, rope {} dims theta {}",
        c.attn.n_head, c.attn.n_head_kv, c.attn.head_dim, c.n_rot, c.rope_theta
    )?;
    writeln!(
        o,
        "delta-net:    {} key heads, {} value heads, head dim {}, conv kernel {}",
        c.gdn.hk, c.gdn.hv, c.gdn.dk, c.conv_kernel
    )?;
    match &c.moe {
        Some(m) => writeln!(
            o,
            "ffn:          MoE {} experts, top-{}, expert ffn {}, shared expert ffn {}",
            m.n_expert, m.n_expert_used, m.n_ff_exp, m.n_ff_shexp
        )?,
        None => writeln!(o, "ffn:          dense SwiGLU {}", c.n_ff)?,
    }
    writeln!(o, "rms eps:      {:e}", c.eps)?;
    // What one sequence holds (f32 KV rows of the attention layers, conv and delta state of the
    // others): what `rill serve --parallel` / `--kv-mem` and a session's context cost.
    let per_seq = |n_ctx: usize| human_bytes(StatePool::bytes_needed(c, 1, n_ctx));
    writeln!(
        o,
        "state:        {} a sequence at 4096 tokens, {} at 32768",
        per_seq(4096),
        per_seq(32768)
    )?;
    Ok(())
}

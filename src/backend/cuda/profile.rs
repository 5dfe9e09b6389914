//! `RILL_PROFILE=1`: GPU time of every kernel from CUDA events, summed per kernel, per phase of
//! the model and per class of work (matrix products with their achieved TFLOP/s, delta rule,
//! attention, the rest), printed to stderr when the backend is dropped (at exit). Profiling runs
//! every op as it comes (no recorded steps, no overlapped launches), so the times are per kernel,
//! exclusive.

use std::collections::HashMap;
use std::sync::Mutex;

use cudarc::driver::sys;

use super::driver::{cuda_err, Event};
use crate::error::Result;

/// Where the time of a kernel goes, in the model's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// Mixer projections (GDN qkv/gate/alpha/beta/out, attention q/k/v/output).
    Projections,
    /// Causal conv, gates and the q/k L2 norm.
    Conv,
    DeltaRule,
    /// RoPE, KV store, attention, the q/gate split and output gate.
    Attention,
    /// Dense FFN and MoE (router, experts, shared expert).
    FfnMoe,
    /// Final norm, LM head, argmax, embedding.
    Head,
    /// Norms and residual adds.
    Norms,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Projections => "projections",
            Phase::Conv => "conv",
            Phase::DeltaRule => "delta rule",
            Phase::Attention => "attention",
            Phase::FfnMoe => "FFN/MoE",
            Phase::Head => "head",
            Phase::Norms => "norms/residual",
        }
    }

    /// The phase of a matrix product, from the GGUF name of its weight (`None`: an F32 tensor,
    /// which in these models is a MoE router or the shared expert's gate).
    pub(crate) fn of_weight(name: Option<&str>) -> Phase {
        let Some(n) = name else { return Phase::FfnMoe };
        if n.contains("ffn_") {
            Phase::FfnMoe
        } else if n.starts_with("output") || n.starts_with("token_embd") {
            Phase::Head
        } else {
            Phase::Projections
        }
    }
}

/// The coarse split of the prefill profile (issue 8): where a kernel's time goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Class {
    /// Matrix products (every kernel that reports floating-point operations), split-K sums.
    Gemm,
    DeltaRule,
    /// The attention phase: scores, softmax and values, with RoPE, the KV store and the f16 copies
    /// of the K/V rows the tensor-core kernel reads.
    Attention,
    /// Norms, conv, gates, RoPE, routing, conversions, copies: everything else.
    Rest,
}

impl Class {
    const ALL: [Class; 4] = [Class::Gemm, Class::DeltaRule, Class::Attention, Class::Rest];

    fn of(name: (&'static str, &'static str), phase: Phase, flops: f64) -> Class {
        let n = name.0;
        if flops > 0.0 || n.starts_with("pf_gemm_splitk") {
            Class::Gemm
        } else if phase == Phase::DeltaRule {
            Class::DeltaRule
        } else if phase == Phase::Attention {
            Class::Attention
        } else {
            Class::Rest
        }
    }

    fn name(self) -> &'static str {
        match self {
            Class::Gemm => "GEMMs",
            Class::DeltaRule => "delta rule",
            Class::Attention => "attention",
            Class::Rest => "rest",
        }
    }
}

struct Pending {
    start: Event,
    end: Event,
    name: (&'static str, &'static str),
    phase: Phase,
    flops: f64,
}

#[derive(Default)]
struct Totals {
    pending: Vec<Pending>,
    spare: Vec<Event>,
    /// Launches, milliseconds and floating-point operations per kernel.
    by_kernel: HashMap<String, (u64, f64, f64)>,
    by_phase: HashMap<Phase, f64>,
    /// Milliseconds and floating-point operations per class.
    by_class: HashMap<Class, (f64, f64)>,
}

pub(crate) struct Profiler {
    t: Mutex<Totals>,
}

impl Profiler {
    pub(crate) fn new() -> Profiler {
        Profiler {
            t: Mutex::new(Totals::default()),
        }
    }

    fn event(t: &mut Totals) -> Result<Event> {
        match t.spare.pop() {
            Some(e) => Ok(e),
            None => Event::new(),
        }
    }

    /// Record the start event of a kernel on `stream`.
    pub(crate) fn begin(&self, stream: sys::CUstream) -> Result<Event> {
        let mut t = self.t.lock().map_err(|_| cuda_err("profile lock poisoned"))?;
        let e = Self::event(&mut t)?;
        e.record(stream)?;
        Ok(e)
    }

    /// Record the end event; the pair is resolved at the next `collect`.
    pub(crate) fn end(
        &self,
        start: Event,
        stream: sys::CUstream,
        name: (&'static str, &'static str),
        phase: Phase,
        flops: f64,
    ) -> Result<()> {
        let mut t = self.t.lock().map_err(|_| cuda_err("profile lock poisoned"))?;
        let end = Self::event(&mut t)?;
        end.record(stream)?;
        t.pending.push(Pending {
            start,
            end,
            name,
            phase,
            flops,
        });
        Ok(())
    }

    /// Add up the pending pairs; call only after the stream has been synchronised.
    pub(crate) fn collect(&self) -> Result<()> {
        let mut t = self.t.lock().map_err(|_| cuda_err("profile lock poisoned"))?;
        let pending = std::mem::take(&mut t.pending);
        for p in pending {
            let ms = p.end.elapsed_ms_since(&p.start)? as f64;
            let e = t.by_kernel.entry(format!("{}{}", p.name.0, p.name.1)).or_default();
            e.0 += 1;
            e.1 += ms;
            e.2 += p.flops;
            *t.by_phase.entry(p.phase).or_default() += ms;
            let c = t.by_class.entry(Class::of(p.name, p.phase, p.flops)).or_default();
            c.0 += ms;
            c.1 += p.flops;
            t.spare.push(p.start);
            t.spare.push(p.end);
        }
        Ok(())
    }

    /// The summary printed at exit.
    pub(crate) fn report(&self) -> String {
        let Ok(t) = self.t.lock() else { return String::new() };
        if t.by_kernel.is_empty() {
            return String::new();
        }
        let total: f64 = t.by_kernel.values().map(|v| v.1).sum();
        let mut s = format!("cuda profile: {total:.3} ms of GPU time in kernels\n");
        let mut phases: Vec<_> = t.by_phase.iter().collect();
        phases.sort_by(|a, b| b.1.total_cmp(a.1));
        s.push_str("  by phase:\n");
        for (p, ms) in phases {
            s.push_str(&format!(
                "    {:<16} {:>10.3} ms {:>5.1}%\n",
                p.name(),
                ms,
                100.0 * ms / total.max(1e-12)
            ));
        }
        s.push_str("  by class:\n");
        for c in Class::ALL {
            let (ms, flops) = t.by_class.get(&c).copied().unwrap_or_default();
            s.push_str(&format!(
                "    {:<16} {:>10.3} ms {:>5.1}%{}\n",
                c.name(),
                ms,
                100.0 * ms / total.max(1e-12),
                tflops(flops, ms)
            ));
        }
        let mut ks: Vec<_> = t.by_kernel.iter().collect();
        ks.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        s.push_str("  by kernel:\n");
        for (name, (n, ms, flops)) in ks {
            s.push_str(&format!(
                "    {name:<28} {n:>8} launches {ms:>10.3} ms {:>5.1}% {:>8.2} us/launch{}\n",
                100.0 * ms / total.max(1e-12),
                1000.0 * ms / (*n).max(1) as f64,
                tflops(*flops, *ms)
            ));
        }
        s
    }
}

/// `  12.3 TFLOP in 45.6 ms = 270 TFLOP/s` for kernels that report floating-point operations.
fn tflops(flops: f64, ms: f64) -> String {
    if flops <= 0.0 || ms <= 0.0 {
        return String::new();
    }
    format!(
        " {:>9.3} TFLOP {:>7.1} TFLOP/s",
        flops / 1e12,
        flops / (ms * 1e-3) / 1e12
    )
}

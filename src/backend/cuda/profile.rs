//! `RILL_PROFILE=1`: GPU time of every kernel from CUDA events, summed per kernel and per phase of
//! the model, printed to stderr when the backend is dropped (at exit). Profiling runs every op as
//! it comes (no recorded steps, no overlapped launches), so the times are per kernel, exclusive.

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

struct Pending {
    start: Event,
    end: Event,
    name: (&'static str, &'static str),
    phase: Phase,
}

#[derive(Default)]
struct Totals {
    pending: Vec<Pending>,
    spare: Vec<Event>,
    by_kernel: HashMap<String, (u64, f64)>,
    by_phase: HashMap<Phase, f64>,
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
    ) -> Result<()> {
        let mut t = self.t.lock().map_err(|_| cuda_err("profile lock poisoned"))?;
        let end = Self::event(&mut t)?;
        end.record(stream)?;
        t.pending.push(Pending {
            start,
            end,
            name,
            phase,
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
            *t.by_phase.entry(p.phase).or_default() += ms;
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
        let mut ks: Vec<_> = t.by_kernel.iter().collect();
        ks.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        s.push_str("  by kernel:\n");
        for (name, (n, ms)) in ks {
            s.push_str(&format!(
                "    {name:<28} {n:>8} launches {ms:>10.3} ms {:>5.1}% {:>8.2} us/launch\n",
                100.0 * ms / total.max(1e-12),
                1000.0 * ms / (*n).max(1) as f64
            ));
        }
        s
    }
}

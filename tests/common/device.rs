//! The device op suites (`tests/device_*.rs`): each test runs on every device backend compiled
//! into this build, at every precision tier it has, and compares it with the CPU reference backend
//! on the same inputs (ops a fast tier changes are judged at that tier: `Both::fast`).

use std::cell::Cell;
use std::sync::Arc;

use rill::backend::{Backend, DType, GdnDims, Pos, StepMode, Tensor};

use super::{assert_close, cpu, device_backends_every_tier, is_fast, rel_l2, tagged, FAST_REL_L2};

/// A device backend and the CPU reference.
pub struct Both {
    pub dev: Arc<dyn Backend>,
    pub cpu: Arc<dyn Backend>,
}

/// Which of the two backends an op closure is running on (`Pt::on` picks its tensor).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Dev,
    Cpu,
}

/// The same data on the device and on the CPU.
#[derive(Clone)]
pub struct Pt {
    pub dev: Tensor,
    pub cpu: Tensor,
}

impl Pt {
    pub fn on(&self, side: Side) -> &Tensor {
        match side {
            Side::Dev => &self.dev,
            Side::Cpu => &self.cpu,
        }
    }
}

impl Both {
    /// One pair per device backend compiled into this build and precision tier it has.
    pub fn each() -> Vec<Both> {
        device_backends_every_tier()
            .into_iter()
            .map(|dev| Both { dev, cpu: cpu() })
            .collect()
    }
    /// The device backend's name, with its tier when it is not the exact one (`cuda/fast`).
    pub fn name(&self) -> String {
        tagged(self.dev.as_ref())
    }
    /// Whether the device runs the fast tier (f16-rounded activations on the ops it changes).
    pub fn fast(&self) -> bool {
        is_fast(self.dev.as_ref())
    }
    pub fn be(&self, side: Side) -> &dyn Backend {
        match side {
            Side::Dev => self.dev.as_ref(),
            Side::Cpu => self.cpu.as_ref(),
        }
    }
    /// Build a tensor on both backends.
    pub fn make(&self, f: impl Fn(&dyn Backend) -> rill::Result<Tensor>) -> Pt {
        Pt {
            dev: f(self.dev.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", self.name())),
            cpu: f(self.cpu.as_ref()).unwrap_or_else(|e| panic!("cpu: {e}")),
        }
    }
    pub fn up(&self, data: &[f32], shape: &[usize]) -> Pt {
        self.make(|be| be.upload_f32(data, shape))
    }
    pub fn up_u32(&self, data: &[u32], shape: &[usize]) -> Pt {
        self.make(|be| be.upload_u32(data, shape))
    }
    pub fn zeros(&self, shape: &[usize]) -> Pt {
        self.make(|be| be.alloc(DType::F32, shape))
    }
    pub fn zeros_u32(&self, shape: &[usize]) -> Pt {
        self.make(|be| be.alloc(DType::U32, shape))
    }
    /// The position tensor of a `Pos` (U32 `[1]` holding `pos`).
    pub fn pos(&self, pos: usize) -> Pt {
        self.up_u32(&[u32::try_from(pos).expect("position fits u32")], &[1])
    }
    /// Run `op` on the device, then on the CPU; `side` tells it which tensors to use.
    pub fn run(&self, what: &str, op: impl Fn(&dyn Backend, Side) -> rill::Result<()>) {
        op(self.dev.as_ref(), Side::Dev).unwrap_or_else(|e| panic!("{} {what}: {e}", self.name()));
        op(self.cpu.as_ref(), Side::Cpu).unwrap_or_else(|e| panic!("cpu {what}: {e}"));
    }
    /// Both sides of an F32 tensor, (device, CPU).
    pub fn read(&self, t: &Pt) -> (Vec<f32>, Vec<f32>) {
        (
            self.dev.read_f32(&t.dev).expect("device read"),
            self.cpu.read_f32(&t.cpu).expect("cpu read"),
        )
    }
    pub fn read_u32(&self, t: &Pt) -> (Vec<u32>, Vec<u32>) {
        (
            self.dev.read_u32(&t.dev).expect("device read"),
            self.cpu.read_u32(&t.cpu).expect("cpu read"),
        )
    }
    /// `assert_close` of the device's tensor against the CPU's.
    pub fn check(&self, what: &str, t: &Pt, atol: f32, rtol: f32) {
        let (got, want) = self.read(t);
        assert_close(&format!("{} {what}", self.name()), &got, &want, atol, rtol);
    }
    /// `check` for an op that the fast tier changes: at that tier the device's result must be
    /// within the fixtures' f16-rounded bound (rel L2 <= 6e-3) of the CPU's; at the exact tier,
    /// `check` with `atol`, `rtol`.
    pub fn check_tier(&self, what: &str, t: &Pt, atol: f32, rtol: f32) {
        let (got, want) = self.read(t);
        self.judge_tier(what, &got, &want, || {
            assert_close(&format!("{} {what}", self.name()), &got, &want, atol, rtol)
        });
    }
    /// Judge `got` against the CPU's `want` at the device's tier: the fast tier's bound (finite,
    /// rel L2 <= 6e-3), or at the exact tier the test's own check `exact`.
    pub fn judge_tier(&self, what: &str, got: &[f32], want: &[f32], exact: impl FnOnce()) {
        if !self.fast() {
            return exact();
        }
        assert!(
            got.iter().all(|v| v.is_finite()),
            "{} {what}: non-finite output",
            self.name()
        );
        let e = rel_l2(got, want);
        assert!(
            e <= FAST_REL_L2,
            "{} {what}: rel L2 {e:.2e} > {FAST_REL_L2}",
            self.name()
        );
    }
}

/// Gated DeltaNet dims of the op tests: Qwen3.5's heads (q/k head dim 128), and odd ones.
pub const GDN_REAL: GdnDims = GdnDims {
    hk: 2,
    hv: 4,
    dk: 128,
    dv: 128,
};
pub const GDN_ODD: GdnDims = GdnDims {
    hk: 3,
    hv: 3,
    dk: 5,
    dv: 7,
};

impl Both {
    /// The output `[t, conv_dim]` of the fused conv + q/k L2 norm (`conv1d_silu_l2qk`,
    /// `gdn_conv_gates`) against the CPU's. Error model: the conv output is within 1e-6 + 1e-5
    /// relative of the CPU's (tests/device_ops.rs conv1d_matches_and_carries_state); normalising
    /// a q or k head divides those errors, and the 1e-5 relative error of its norm, by the head's
    /// norm, so they are relative to the normalised head's norm |y|; the normalisation adds its
    /// own 2e-5 (l2_norm_qk_matches). Hence |error| <= 4e-5 |y| per element of a q or k head; v
    /// is the plain conv.
    pub fn check_conv_l2qk(&self, what: &str, out: &Pt, dims: GdnDims, t: usize) {
        let (got, want) = self.read(out);
        let (cd, kd2) = (dims.conv_dim(), 2 * dims.key_dim());
        for r in 0..t {
            let row = r * cd;
            for (h, (gh, wh)) in got[row..row + kd2]
                .chunks(dims.dk)
                .zip(want[row..row + kd2].chunks(dims.dk))
                .enumerate()
            {
                let norm = wh.iter().map(|v| v * v).sum::<f32>().sqrt();
                assert_close(
                    &format!("{} {what} row {r} head {h}", self.name()),
                    gh,
                    wh,
                    4e-5 * norm,
                    0.0,
                );
            }
            assert_close(
                &format!("{} {what} row {r} v", self.name()),
                &got[row + kd2..row + cd],
                &want[row + kd2..row + cd],
                1e-6,
                1e-5,
            );
        }
    }
}

/// A `Pos` at `host` on `side`, with its device tensor from `pt` (made by `Both::pos(host)`).
pub fn pos_on(host: usize, pt: &Pt, side: Side) -> Pos<'_> {
    Pos { host, dev: pt.on(side) }
}

impl Both {
    /// For inputs past a limit of some backend's kernels (a largest head dim, kernel width or
    /// expert count), which the contract allows: the device either refuses with an error, or runs
    /// (then the CPU runs it too and this returns true: the caller compares the outputs).
    pub fn runs_or_refuses(&self, what: &str, op: impl Fn(&dyn Backend, Side) -> rill::Result<()>) -> bool {
        if op(self.dev.as_ref(), Side::Dev).is_err() {
            return false;
        }
        op(self.cpu.as_ref(), Side::Cpu).unwrap_or_else(|e| panic!("cpu {what}: {e}"));
        true
    }
}

/// What a device backend did with a sequence of `Both::step`s.
#[derive(Default)]
pub struct Steps {
    recorded: Cell<bool>,
    replays: Cell<usize>,
}

impl Both {
    /// One decode-like step on both backends: `tokens` (one per row) written to `ids` and `step` to
    /// the position tensor `pos`, then `ops` at that position between `step_begin(key)` and `step_end`, unless
    /// the backend replays its recording of the step, which must then read the token and the
    /// position from their device tensors, as the executor's steps do.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &self,
        steps: &Steps,
        key: u64,
        ids: &Pt,
        tokens: &[u32],
        pos: &Pt,
        step: usize,
        ops: impl Fn(&dyn Backend, Side, Pos) -> rill::Result<()>,
    ) {
        self.run("recorded step", |be, s| {
            be.write_u32(ids.on(s), tokens)?;
            be.write_u32(pos.on(s), &[u32::try_from(step).expect("position fits u32")])?;
            let mode = be.step_begin(key)?;
            if s == Side::Dev {
                match mode {
                    StepMode::Record => steps.recorded.set(true),
                    StepMode::Replayed => steps.replays.set(steps.replays.get() + 1),
                    StepMode::Run => {}
                }
            }
            let r = if mode == StepMode::Replayed {
                Ok(())
            } else {
                ops(be, s, pos_on(step, pos, s))
            };
            be.step_end(key, r.is_ok())?;
            r
        });
    }

    /// After `n` steps: a backend that recorded must have replayed later steps, unless a test
    /// beside this one replaced a buffer the recording binds (it is then dropped and made again):
    /// at least one of the `n - 1` must.
    pub fn assert_replayed(&self, steps: &Steps, n: usize) {
        assert!(
            !steps.recorded.get() || steps.replays.get() >= 1,
            "{}: recorded, but none of {} steps replayed",
            self.name(),
            n - 1
        );
    }
}

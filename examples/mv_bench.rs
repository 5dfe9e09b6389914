//! Decode products in isolation (a measurement for kernel work, not a test): each case is one
//! weight of a real model's shape, run `ITERS` times back to back on one backend (each call
//! depends on the last through its output, as in a decode step; x is an RMSNorm's output), timed by the wall clock around a
//! final read, and checked once against the CPU backend. The calls rotate over copies of the
//! weight that together exceed the GPU's L2 (`--copies-mb`, default 256), so every call streams
//! its weight from memory as a decode step does.
//!
//!   cargo run --release --example mv_bench -- [--backend wgpu] [--iters 500] [--copies-mb 256] [--warm 0.5]
//!       [--tokens 1] [--precision exact|fast] [--wgpu OPTIONS] [CASE ...]
//!
//! `--tokens T` above 1 times the prefill products instead (T tokens per call, the backend's
//! GEMM kernels; `--precision fast` selects the tensor-core ones where the backend has them) and
//! reports TFLOP/s as well as weight GB/s. `--no-check` skips the CPU check (kernel variants that
//! are timed, not checked: the CPU product of a prefill shape takes seconds).
//! A case is `TYPE:ROWS:COLS` (`matmul`) or `TYPE:ROWS:COLS:swiglu` (`matmul_swiglu`, two weights
//! of that shape); without cases, the qwen3.5-9b Q4_K_M products. `--wgpu OPTIONS` runs the wgpu
//! backend in another variant or geometry (a comma list as tests/common's `RILL_TEST_WGPU`, e.g.
//! `mv_wg=256,mv_rows=4,mv_lanes=64` or `coop_tile=128x64x32:1`: `WgpuOptions`).

use std::time::Instant;

use rayon::prelude::*;

use rill::backend::compose;
use rill::backend::{self, Backend, BackendOptions, DType, Precision, Tensor, WeightData};
use rill::gguf::{GgmlType, TensorBytes};
use rill::synth::{self, Init};
use rill::{Error, Result};

/// The 9B Q4_K_M decode products: GDN gate / SSM out / attention out, GDN qkv / attention q (Q4_K
/// and Q6_K layers), FFN gate + up, FFN down (Q4_K and Q6_K layers).
const NINE_B: &[&str] = &[
    "q4_k:4096:4096",
    "q4_k:8192:4096",
    "q6_k:8192:4096",
    "q4_k:12288:4096:swiglu",
    "q4_k:4096:12288",
    "q6_k:4096:12288",
];

struct Case {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    swiglu: bool,
    /// Tokens per call (1: a decode product).
    t: usize,
}

fn parse(spec: &str, t: usize) -> Result<Case> {
    let bad = || Error::InvalidArgument(format!("bad case {spec:?}: TYPE:ROWS:COLS[:swiglu]"));
    let p: Vec<&str> = spec.split(':').collect();
    if p.len() < 3 || p.len() > 4 || (p.len() == 4 && p[3] != "swiglu") {
        return Err(bad());
    }
    let ty = (0..64)
        .filter_map(GgmlType::from_id)
        .find(|t| t.name().eq_ignore_ascii_case(p[0]))
        .ok_or_else(bad)?;
    let rows = p[1].parse().map_err(|_| bad())?;
    let cols = p[2].parse().map_err(|_| bad())?;
    Ok(Case {
        ty,
        rows,
        cols,
        swiglu: p.len() == 4,
        t,
    })
}

/// `n` approximately normal values in rows of `cols`, from rill synth's per-row streams
/// (`synth::fill_row`), rows in parallel (the LM head case is a billion values).
fn normals(n: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut v = vec![0f32; n];
    v.par_chunks_mut(cols)
        .enumerate()
        .for_each(|(r, row)| synth::fill_row(seed, r as u64, Init::Normal { std: 1.0 }, row));
    v
}

fn weight(be: &dyn Backend, ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Tensor> {
    be.upload_weight(&WeightData {
        name: format!("w.{ty}"),
        ggml_type: ty,
        shape: vec![rows, cols],
        bytes: TensorBytes::from_vec(bytes.to_vec()),
    })
}

/// The case's op on `be` with weights `ws` (one, or gate and up).
fn op(be: &dyn Backend, c: &Case, ws: &[Tensor], x: &Tensor, tmp: &[Tensor], out: &Tensor) -> Result<()> {
    if c.swiglu {
        compose::matmul_swiglu(be, &ws[0], &ws[1], x, &tmp[0], &tmp[1], out)
    } else {
        be.matmul(&ws[0], x, out)
    }
}

/// One case's tensors on one backend.
struct On {
    copies: Vec<Vec<Tensor>>,
    x_raw: Tensor,
    ones: Tensor,
    xt: Tensor,
    tmp: [Tensor; 2],
    out: Tensor,
}

impl On {
    /// x is a norm's output, as in a decode step: a backend whose norms also write the products'
    /// form of x (the wgpu packed-dot planes) does so here, once, not per call. Any host access
    /// drops that, so call this again after one.
    fn norm(&self, be: &dyn Backend) -> Result<()> {
        be.rms_norm(&self.x_raw, &self.ones, 1e-6, &self.xt)
    }
    fn call(&self, be: &dyn Backend, c: &Case, i: usize) -> Result<()> {
        op(
            be,
            c,
            &self.copies[i % self.copies.len()],
            &self.xt,
            &self.tmp,
            &self.out,
        )
    }
}

/// A case's weights (`n_copies` copies) and input on `be`, and its output after one call.
fn prepare(be: &dyn Backend, c: &Case, bytes: &[Vec<u8>], x: &[f32], n_copies: usize) -> Result<(On, Vec<f32>)> {
    let mut copies = Vec::new();
    for _ in 0..n_copies {
        copies.push(
            bytes
                .iter()
                .map(|b| weight(be, c.ty, c.rows, c.cols, b))
                .collect::<Result<_>>()?,
        );
    }
    let on = On {
        copies,
        x_raw: be.upload_f32(x, &[c.t, c.cols])?,
        ones: be.upload_f32(&vec![1.0; c.cols], &[c.cols])?,
        xt: be.alloc(DType::F32, &[c.t, c.cols])?,
        tmp: [
            be.alloc(DType::F32, &[c.t, c.rows])?,
            be.alloc(DType::F32, &[c.t, c.rows])?,
        ],
        out: be.alloc(DType::F32, &[c.t, c.rows])?,
    };
    on.norm(be)?;
    on.call(be, c, 0)?;
    let got = be.read_f32(&on.out)?;
    Ok((on, got))
}

/// A case ready to time on the device: its tensors there, weight bytes per call, and the max
/// |dev - cpu| / max |cpu| of one call.
struct Ready {
    case: Case,
    on: On,
    bytes: usize,
    err: f32,
}

fn ready(dev: &dyn Backend, cpu: Option<&dyn Backend>, c: Case, copies_mb: usize, seed: u64) -> Result<Ready> {
    let n_w = if c.swiglu { 2 } else { 1 };
    let row_bytes =
        c.ty.row_size(c.cols as u64)
            .ok_or_else(|| Error::InvalidArgument("whole blocks".into()))? as usize;
    let mut bytes = Vec::new();
    for k in 0..n_w {
        let src = normals(c.rows * c.cols, c.cols, seed + k as u64);
        let mut dst = vec![0u8; row_bytes * c.rows];
        rill::quant::quantize_rows_par(c.ty, &src, c.cols, &mut dst)?;
        bytes.push(dst);
    }
    let x = normals(c.t * c.cols, c.cols, seed + 7);
    let per_call = n_w * row_bytes * c.rows;
    let (on, got) = prepare(dev, &c, &bytes, &x, (copies_mb << 20).div_ceil(per_call).clamp(1, 64))?;
    let err = match cpu {
        Some(cpu) => {
            let (_, want) = prepare(cpu, &c, &bytes, &x, 1)?;
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
            got.iter().zip(&want).fold(0f32, |m, (g, w)| m.max((g - w).abs())) / scale
        }
        None => f32::NAN,
    };
    Ok(Ready {
        case: c,
        on,
        bytes: per_call,
        err,
    })
}

/// Microseconds per call of a ready case: calls for `warm` seconds first (an idle GPU runs at low
/// clocks until it has been busy for a while), then `iters` timed ones.
fn time(dev: &dyn Backend, r: &Ready, iters: usize, warm: f64) -> Result<f64> {
    r.on.norm(dev)?;
    let t = Instant::now();
    let mut i = 0;
    while t.elapsed().as_secs_f64() < warm {
        for _ in 0..50 {
            r.on.call(dev, &r.case, i)?;
            i += 1;
        }
        dev.sync()?;
    }
    let t = Instant::now();
    for i in 0..iters {
        r.on.call(dev, &r.case, i)?;
    }
    dev.sync()?;
    Ok(t.elapsed().as_secs_f64() * 1e6 / iters as f64)
}

/// The value after flag `what` (e.g. `--iters N`), parsed.
fn value<T: std::str::FromStr>(args: &mut impl Iterator<Item = String>, what: &str) -> Result<T> {
    args.next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::InvalidArgument(what.into()))
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut name, mut iters, mut copies_mb, mut warm, mut specs) =
        ("wgpu".to_string(), 500usize, 256usize, 0.5f64, Vec::new());
    let (mut tokens, mut precision, mut check) = (1usize, Precision::Exact, true);
    let mut opts = BackendOptions::default();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--backend" => name = value(&mut args, "--backend NAME")?,
            "--iters" => iters = value(&mut args, "--iters N")?,
            "--warm" => warm = value(&mut args, "--warm SECONDS")?,
            "--copies-mb" => copies_mb = value(&mut args, "--copies-mb N")?,
            "--tokens" => tokens = value::<usize>(&mut args, "--tokens N")?.max(1),
            "--precision" => precision = value(&mut args, "--precision exact|fast")?,
            "--no-check" => check = false,
            #[cfg(feature = "wgpu")]
            "--wgpu" => opts.wgpu = value(&mut args, "--wgpu OPTIONS")?,
            _ => specs.push(a),
        }
    }
    if specs.is_empty() {
        specs = NINE_B.iter().map(|s| s.to_string()).collect();
    }
    opts.precision = precision;
    let dev = backend::create_with(&name, &opts)?;
    let cpu = backend::create("cpu")?;
    // Every case is prepared (and checked) before any is timed, so that the timed calls run
    // back to back on a busy GPU.
    let mut cases = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        cases.push((
            spec,
            ready(
                dev.as_ref(),
                check.then_some(cpu.as_ref()),
                parse(spec, tokens)?,
                copies_mb,
                1000 + i as u64,
            )?,
        ));
    }
    println!(
        "{} ({}, {}), {tokens} token(s), {iters} calls per case after {warm} s of warm-up",
        dev.device_name(),
        dev.name(),
        dev.precision().name()
    );
    for (spec, r) in &cases {
        let us = time(dev.as_ref(), r, iters, warm)?;
        let gb = r.bytes as f64 / (us * 1e3);
        let c = &r.case;
        let n_w = if c.swiglu { 2.0 } else { 1.0 };
        let tflops = 2.0 * n_w * (c.rows * c.cols * c.t) as f64 / (us * 1e6);
        println!(
            "{spec:<26} {us:9.2} us  {gb:7.1} GB/s  {tflops:6.1} TFLOP/s  max err / max |out| {:.2e}",
            r.err
        );
    }
    Ok(())
}

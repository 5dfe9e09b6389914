//! Findings 2 and 4 of the hostile-input review: a model whose logits are all NaN makes greedy
//! decoding fail on every backend (it printed token 0 before), and a long context reserves its
//! KV cache without touching it, failing with a typed error when it cannot fit.

mod common;

use std::path::PathBuf;

use common::gguf::{keep_kv, rewrite_fixture, TensorEdit};
use rill::exec::Model;
use rill::gguf::GgmlType;
use rill::Error;

/// The tiny dense model with every value of `output_norm.weight` (F32) set to NaN, written to
/// a fresh file named by `tag` (tests run in parallel; a file mapped by one must not be rewritten).
fn nan_norm_model(tag: &str) -> PathBuf {
    let out = format!("nonfinite-{tag}.gguf");
    rewrite_fixture("tiny-dense.F16.gguf", &out, keep_kv, Vec::new(), |name, t| {
        if name != "output_norm.weight" {
            return Some(t);
        }
        assert_eq!(t.ty, GgmlType::F32, "fixture layout");
        let data = f32::NAN.to_le_bytes().repeat(t.data.len() / 4);
        Some(TensorEdit { data, ..t })
    })
}

#[test]
fn greedy_fails_on_nan_logits_on_every_backend() {
    let path = nan_norm_model("lib");
    for be in common::backends() {
        let name = be.name();
        let m = Model::open(&path, be).expect("model loads");
        let mut s = m.new_session(16).expect("session");
        match m.prefill_greedy(&mut s, &[1, 2, 3], &mut |_, _| {}) {
            Err(Error::NonFiniteLogits) => {}
            other => panic!("{name}: expected NonFiniteLogits, got {other:?}"),
        }
        let mut s = m.new_session(16).expect("session");
        match m.decode_greedy(&mut s, 5) {
            Err(Error::NonFiniteLogits) => {}
            other => panic!("{name}: decode: expected NonFiniteLogits, got {other:?}"),
        }
        // One step ahead: the next step is enqueued fed the sentinel id before the first token is
        // read; the error reported is the first step's, and no token reaches the callback.
        let mut s = m.new_session(16).expect("session");
        match m.generate_greedy(&mut s, 5, 4, &mut |t| panic!("{name}: token {t} of NaN logits")) {
            Err(Error::NonFiniteLogits) => {}
            other => panic!("{name}: generate: expected NonFiniteLogits, got {other:?}"),
        }
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn cli_greedy_reports_nan_logits() {
    let path = nan_norm_model("cli");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rill"))
        .args(["run", "-m"])
        .arg(&path)
        .args(["-p", "hello", "-n", "4", "--temp", "0", "--backend", "cpu"])
        .output()
        .expect("run rill");
    let _ = std::fs::remove_file(&path);
    assert!(!out.status.success(), "exit status {:?}", out.status);
    assert!(
        out.stdout.is_empty(),
        "printed {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("finite"), "stderr: {err}");
}

/// Resident set size of this process in bytes (Linux).
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("status");
    let kib: u64 = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kib * 1024
}

#[test]
fn long_context_reserves_without_touching_and_fails_typed_when_too_big() {
    let m = Model::open(common::fixture("tiny-dense.F16.gguf"), common::cpu()).expect("model");
    let n_ctx = 1_000_000;
    let bytes = rill::exec::Session::bytes_needed(&m.config, n_ctx);
    assert!(bytes > 1 << 30, "the case must be large: {bytes} bytes");
    let before = rss();
    let mut s = m.new_session(n_ctx).expect("a 1M-token session");
    let mut next = m.prefill_greedy(&mut s, &[1, 2, 3], &mut |_, _| {}).expect("prefill");
    for _ in 0..4 {
        next = m.decode_greedy(&mut s, next).expect("decode");
    }
    let grown = rss().saturating_sub(before);
    // Only the rows in use are touched (other tests of this binary may allocate concurrently,
    // so the bound is loose; committing the cache would add over a GiB).
    assert!(
        grown < bytes / 4,
        "RSS grew by {grown} bytes for a {bytes}-byte reservation"
    );
    drop(s);
    match m.new_session(u32::MAX as usize) {
        Err(Error::OutOfMemory { needed, available, .. }) => assert!(needed > available),
        Err(e) => panic!("expected OutOfMemory, got {e}"),
        Ok(_) => panic!(
            "a {}-byte session cannot fit",
            rill::exec::Session::bytes_needed(&m.config, u32::MAX as usize)
        ),
    }
}

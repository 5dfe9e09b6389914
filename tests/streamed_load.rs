//! Loading the way the browser does: the header parsed from a prefix of the file
//! (`GgufFile::from_prefix`), the tensors read through a `TensorSource` in small pieces that
//! complete asynchronously (`Model::load_async`). The model must be the same as one loaded from
//! the mapped file, on the wgpu backend (pieces streamed to the device with `begin_weight`) and on
//! the CPU backend (no streaming path: the loader collects the pieces).

mod common;

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use rill::backend::ReadFuture;
use rill::exec::{Logits, Model};
use rill::gguf::{GgmlType, GgufFile, TensorBytes};
use rill::model::TensorSource;

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// Pending once before it completes, as a browser read resolves from the event loop.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

/// Serves a file's bytes, advising reads of at most `piece` bytes, and records the reads.
struct Pieces {
    file: GgufFile,
    piece: usize,
    reads: RefCell<Vec<(u64, usize)>>,
}

impl TensorSource for Pieces {
    fn read(&self, start: u64, len: usize) -> ReadFuture<'_, TensorBytes> {
        self.reads.borrow_mut().push((start, len));
        Box::pin(async move {
            YieldOnce(false).await;
            self.file.read(start, len).await
        })
    }
    fn max_read(&self) -> usize {
        self.piece
    }
}

/// The header from the shortest power-of-two prefix (from 1 KiB) that holds it.
fn header(bytes: &[u8]) -> GgufFile {
    let mut n = 1024;
    loop {
        let take = n.min(bytes.len());
        if let Some(f) = GgufFile::from_prefix(bytes[..take].to_vec(), bytes.len() as u64).expect("header") {
            assert!(take < bytes.len(), "the test wants a header shorter than the file");
            return f;
        }
        n *= 2;
    }
}

fn check_same_model(backend_name: &str, fixture: &str) {
    let path = format!("{FIX}/{fixture}");
    let bytes = std::fs::read(&path).expect("fixture");
    let be = common::shared(backend_name);
    let mapped = Model::open(&path, be.clone()).expect("load mapped");

    let head = header(&bytes);
    // 4099 is rounded down to whole words: 4096-byte pieces, and odd-sized last pieces (Q5_0
    // and Q8_0 rows are not multiples of 4 bytes).
    let src = Pieces {
        file: GgufFile::from_bytes(bytes.clone()).expect("parse"),
        piece: 4099,
        reads: RefCell::new(Vec::new()),
    };
    let mut uploaded = 0u64;
    let streamed =
        pollster::block_on(Model::load_async(&head, &src, be.clone(), &mut |n| uploaded += n)).expect("load streamed");
    let total: u64 = head.tensors.iter().map(|t| t.n_bytes).sum();
    assert_eq!(uploaded, total, "{fixture}: progress adds up to the tensor bytes");
    // Matrices arrive in pieces; only the small tensors dequantized on the host (norms, conv
    // taps, routers) are read whole.
    let reads = src.reads.borrow();
    for &(start, len) in reads.iter().filter(|r| r.1 > 4096) {
        let whole = head.tensors.iter().find(|t| head.data_start + t.offset == start);
        assert!(
            whole.is_some_and(|t| t.n_bytes == len as u64 && len <= 1 << 20),
            "{fixture}: a read of {len} bytes at {start} is neither a piece nor a small tensor"
        );
    }
    assert!(
        reads.len() > head.tensors.len(),
        "{fixture}: {} reads for {} tensors: large tensors were not read in pieces",
        reads.len(),
        head.tensors.len()
    );

    // Same weights, same ops: the logits agree bit for bit.
    let prompt = [1u32, 17, 300, 4000, 25, 9];
    let logits = |m: &Model| {
        let mut s = m.new_session(64).expect("session");
        m.prefill(&mut s, &prompt, Logits::All, &mut |_, _| {})
            .expect("prefill")
    };
    let (a, b) = (logits(&mapped), logits(&streamed));
    assert_eq!(a.len(), b.len());
    let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(
        same,
        "{backend_name} {fixture}: streamed and mapped loads give different logits"
    );
}

#[test]
fn streamed_load_equals_mapped_load_cpu() {
    for f in ["tiny-dense.Q4_K_M.gguf", "tiny-moe.F16.gguf"] {
        check_same_model("cpu", f);
    }
}

#[test]
fn streamed_load_equals_mapped_load_wgpu() {
    for f in ["tiny-dense.Q4_K_M.gguf", "tiny-moe.F16.gguf"] {
        check_same_model("wgpu", f);
    }
}

#[test]
fn cpu_backend_has_no_streaming_path() {
    let be = common::shared("cpu");
    assert!(be.begin_weight("w", GgmlType::F32, &[2, 4]).expect("begin").is_none());
}

/// The streamed upload refuses pieces that do not add up to the tensor.
#[test]
fn wgpu_streamed_weight_checks_its_pieces() {
    let be = common::shared("wgpu");
    // F32 [2, 4]: 32 bytes.
    let begin = || {
        be.begin_weight("w", GgmlType::F32, &[2, 4])
            .expect("begin")
            .expect("wgpu streams")
    };

    let mut w = begin();
    w.write(&[0; 36]).expect_err("more bytes than the tensor has");

    let mut w = begin();
    w.write(&[0; 6]).expect("an unaligned piece may be the last");
    w.write(&[0; 4]).expect_err("a piece after an unaligned one");

    let mut w = begin();
    w.write(&[0; 16]).expect("half");
    w.finish().expect_err("finished with 16 of 32 bytes");

    let mut w = begin();
    let data: Vec<f32> = (0..8).map(|i| i as f32 * 0.5).collect();
    let bytes: &[u8] = bytemuck::cast_slice(&data);
    w.write(&bytes[..12]).expect("first piece");
    w.write(&bytes[12..]).expect("second piece");
    let t = w.finish().expect("complete");
    assert_eq!(t.shape, vec![2, 4]);
    // The weight multiplies like an uploaded one: x = e_1 picks column 1 of each row.
    let x = be.upload_f32(&[0.0, 1.0, 0.0, 0.0], &[1, 4]).expect("x");
    let y = be.alloc(rill::backend::DType::F32, &[1, 2]).expect("y");
    be.matmul(&t, &x, &y).expect("matmul");
    assert_eq!(be.read_f32(&y).expect("read"), vec![0.5, 2.5]);
}

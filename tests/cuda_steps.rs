//! CUDA recorded steps: a decode step replayed from a CUDA graph gives bit for bit what the same
//! ops give run one by one; graphs go with the buffers they use; sessions on several threads
//! (recording, replaying and running at once on one device) match their sequential runs.
//! Skipped, with a note, where there is no NVIDIA GPU (or no `cuda` feature).

mod common;

#[cfg(feature = "cuda")]
mod with_cuda {
    use std::path::Path;
    use std::sync::Arc;

    use super::common::run_session as run;
    use rill::backend::cuda::{CudaBackend, CudaOptions};
    use rill::backend::{Backend, DType};
    use rill::exec::Model;
    use rill::Error;

    const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

    /// A CUDA backend of its own (not the shared one) with the given options, or None without a GPU.
    fn backend(graphs: bool, dependent_launch: bool) -> Option<Arc<CudaBackend>> {
        super::common::cuda()?;
        Some(Arc::new(
            CudaBackend::with_options(CudaOptions {
                graphs,
                dependent_launch,
                ..CudaOptions::default()
            })
            .expect("cuda backend"),
        ))
    }

    fn model(be: &Arc<CudaBackend>, file: &str) -> Model {
        let dynb: Arc<dyn Backend> = Arc::clone(be) as Arc<dyn Backend>;
        Model::open(Path::new(FIX).join(file), dynb).expect("model")
    }

    #[test]
    fn replayed_steps_equal_plain_runs_bit_for_bit() {
        let (Some(rec), Some(plain)) = (backend(true, true), backend(false, false)) else {
            return;
        };
        for file in ["tiny-dense.F16.gguf", "tiny-moe.F16.gguf", "tiny-dense.Q4_K_M.gguf"] {
            let want = run(&model(&plain, file), 3, 24);
            let before = rec.graph_stats();
            let got = run(&model(&rec, file), 3, 24);
            let after = rec.graph_stats();
            assert_eq!(got.len(), want.len());
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g == w,
                    "{file}: step {k} differs between graph replay and plain launches"
                );
            }
            // One decode step recorded, the others replayed (the prefill is not a one-token step).
            assert_eq!(after.recorded - before.recorded, 1, "{file}: {after:?}");
            assert_eq!(after.replayed - before.replayed, 23, "{file}: {after:?}");
            assert_eq!(plain.graph_stats().recorded, 0);
        }
    }

    /// Steps of many sequences (`Model::decode_rows`) are recorded once per pool, scratch, batch
    /// size and head, and replayed with new rows (other slots, other positions, joins) bit for
    /// bit as the same ops run one by one.
    #[test]
    fn replayed_steps_of_rows_equal_plain_runs_bit_for_bit() {
        let (Some(rec), Some(plain)) = (backend(true, true), backend(false, false)) else {
            return;
        };
        let run_rows = |be: &Arc<CudaBackend>| {
            let m = model(be, "tiny-dense.Q4_K_M.gguf");
            let mut pool = m.new_pool(6, 48).expect("pool");
            let mut logits = Vec::new();
            // Rows change every step: which slots, in which order, at which positions; slot 4
            // joins empty at step 3 (position 0 beside longer rows).
            let feeds: [&[(usize, u32)]; 6] = [
                &[(0, 1), (2, 5), (5, 9)],
                &[(2, 7), (0, 3), (5, 2)],
                &[(5, 4), (2, 8), (0, 6)],
                &[(4, 11), (0, 12), (2, 13)],
                &[(0, 2), (4, 3), (5, 4)],
                &[(1, 5), (4, 6), (2, 7)],
            ];
            for feed in feeds {
                logits.push(m.decode_rows(&mut pool, feed).expect("rows step"));
            }
            logits
        };
        let want = run_rows(&plain);
        let before = rec.graph_stats();
        let got = run_rows(&rec);
        let after = rec.graph_stats();
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g == w,
                "step {k} of rows differs between graph replay and plain launches"
            );
        }
        assert_eq!(after.recorded - before.recorded, 1, "{after:?}");
        assert_eq!(after.replayed - before.replayed, 5, "{after:?}");
        assert_eq!(plain.graph_stats().recorded, 0);
    }

    #[test]
    fn graphs_go_with_their_session() {
        let Some(be) = backend(true, true) else { return };
        let m = model(&be, "tiny-dense.F16.gguf");
        let mut s = m.new_session(16).expect("session");
        for t in [1u32, 2, 3, 4] {
            m.decode(&mut s, t).expect("decode");
        }
        assert_eq!(be.graph_stats().cached, 1);
        drop(s);
        // Freeing the session's caches drops the graph that used them.
        assert_eq!(be.graph_stats().cached, 0);
        // A new session records afresh and decodes correctly (compared with a plain backend).
        let plain = backend(false, false).expect("second backend");
        let want = run(&model(&plain, "tiny-dense.F16.gguf"), 5, 6);
        assert_eq!(run(&m, 5, 6), want);
    }

    #[test]
    fn threads_recording_and_replaying_match_sequential_runs() {
        let Some(be) = backend(true, true) else { return };
        for file in ["tiny-dense.F16.gguf", "tiny-moe.F16.gguf"] {
            let m = Arc::new(model(&be, file));
            let (threads, steps) = (4, 20);
            let want: Vec<_> = (0..threads).map(|w| run(&m, w, steps)).collect();
            let handles: Vec<_> = (0..threads)
                .map(|w| {
                    let m = Arc::clone(&m);
                    std::thread::spawn(move || run(&m, w, steps))
                })
                .collect();
            for (w, h) in handles.into_iter().enumerate() {
                let got = h.join().expect("thread");
                assert!(got == want[w], "{file}: session {w} differs from its sequential run");
            }
        }
    }

    #[test]
    fn out_of_memory_is_a_typed_error() {
        let Some(be) = backend(true, true) else { return };
        // 4 TiB: more than any GPU has.
        match be.alloc(DType::F32, &[1 << 20, 1 << 20]) {
            Err(Error::OutOfMemory { needed, available, .. }) => assert!(needed > available),
            Err(e) => panic!("expected OutOfMemory, got {e}"),
            Ok(_) => panic!("a 4 TiB tensor cannot fit"),
        }
        let m = model(&be, "tiny-dense.F16.gguf");
        match m.new_session(u32::MAX as usize) {
            Err(Error::OutOfMemory { needed, available, .. }) => assert!(needed > available),
            Err(e) => panic!("expected OutOfMemory, got {e}"),
            Ok(_) => panic!("a 4-billion-token session cannot fit"),
        }
        // The device is still usable.
        let plain = backend(false, false).expect("second backend");
        assert_eq!(run(&m, 1, 3), run(&model(&plain, "tiny-dense.F16.gguf"), 1, 3));
    }
}

//! Every device backend's memory path and one kernel, against the CPU backend.

mod common;

use std::sync::Arc;

use common::*;
use rill::backend::{Backend, DType};

#[test]
fn upload_dispatch_read_roundtrip() {
    for (_, dev) in devices() {
        upload_dispatch_read_roundtrip_on(&dev);
    }
}

fn upload_dispatch_read_roundtrip_on(dev: &Arc<dyn Backend>) {
    let g = Arc::clone(dev);
    let c = cpu();
    let mut rng = Rng::new(1);
    for n in [1usize, 255, 256, 257, 100_000] {
        let a = rng.normals(n, 1.0);
        let b = rng.normals(n, 1.0);
        let (ga, gb) = (up(g.as_ref(), &a, &[n]), up(g.as_ref(), &b, &[n]));
        let (ca, cb) = (up(c.as_ref(), &a, &[n]), up(c.as_ref(), &b, &[n]));
        g.add_assign(&ga, &gb).expect("device add");
        c.add_assign(&ca, &cb).expect("cpu add");
        assert_close(
            "add_assign",
            &g.read_f32(&ga).expect("read"),
            &c.read_f32(&ca).expect("read"),
            0.0,
            0.0,
        );
    }
    // Memory ops: zero, copy, copy_rows, write_u32.
    let t = g.upload_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).expect("up");
    let d = g.alloc(DType::F32, &[2, 2]).expect("alloc");
    g.copy_rows(&t, 1, &d, 0, 2).expect("copy_rows");
    assert_eq!(g.read_f32(&d).expect("read"), [3.0, 4.0, 5.0, 6.0]);
    g.zero(&t).expect("zero");
    assert_eq!(g.read_f32(&t).expect("read"), [0.0; 6]);
    let u = g.alloc(DType::U32, &[3]).expect("alloc");
    g.write_u32(&u, &[7, 8, 9]).expect("write");
    assert_eq!(g.read_u32(&u).expect("read"), [7, 8, 9]);
    let e = g.alloc(DType::F32, &[2, 2]).expect("alloc");
    g.copy(&d, &e).expect("copy");
    assert_eq!(g.read_f32(&e).expect("read"), [3.0, 4.0, 5.0, 6.0]);
    assert!(g.add_assign(&e, &t).is_err(), "shape mismatch must be an error");
}

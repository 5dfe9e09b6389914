//! Every device backend's `matmul_group` (several products of one input: a layer's projections,
//! which the CUDA decode path launches as one kernel per weight format and kernel shape) against
//! the CPU backend, and bit for bit against the same device's `matmul` of each product: groups of 1 to 4 products with row counts that are not a multiple of any block's
//! rows, one format or mixed ones (Q4_K, Q6_K, Q8_0, F32 tensors), at decode and batch sizes.
//! Also its contract errors on every backend.

mod common;

use common::device::{Both, Pt};
use common::weights::{check_matmul, dequant, random_weight, upload};
use common::*;
use rill::backend::compose;
use rill::backend::{Backend, DType, Tensor, MAX_GROUP};
use rill::gguf::GgmlType;

/// A product of a group: its format (`None`: an F32 tensor) and rows.
type Member = (Option<GgmlType>, usize);

/// One product of a group: its weight on both backends and the values the kernels see.
struct Product {
    w: Pt,
    deq: Vec<f32>,
    ty: Option<GgmlType>,
    n_out: usize,
    name: String,
}

/// A weight of `n_out` rows of `n_in` in format `ty` (`None`: an F32 tensor, as the MoE router and
/// the shared expert's gate are).
fn product(p: &Both, ty: Option<GgmlType>, n_out: usize, n_in: usize, rng: &mut Rng) -> Product {
    match ty {
        Some(ty) => {
            let bytes = random_weight(ty, n_out, n_in, 0.5, rng);
            Product {
                w: Pt {
                    dev: upload(p.dev.as_ref(), ty, &[n_out, n_in], &bytes),
                    cpu: upload(p.cpu.as_ref(), ty, &[n_out, n_in], &bytes),
                },
                deq: dequant(ty, &bytes, n_out * n_in),
                ty: Some(ty),
                n_out,
                name: format!("{ty} {n_out}"),
            }
        }
        None => {
            let w = rng.normals(n_out * n_in, 0.3);
            Product {
                w: p.up(&w, &[n_out, n_in]),
                deq: w,
                ty: None,
                n_out,
                name: format!("F32 tensor {n_out}"),
            }
        }
    }
}

/// `matmul_group` of `group` ((format, rows) each) on rows of `n_in`, for each token count in
/// `tokens`: every output against the CPU's within `matmul`'s tolerance, and on the device bit for
/// bit what one `matmul` per product gives (a grouped launch runs each product's rows in the
/// kernel and shape it gets alone), except where CUDA's decode path runs a product in a taller
/// one's tensor-core kernel (`joins_taller`).
fn group_case(p: &Both, group: &[(Option<GgmlType>, usize)], n_in: usize, tokens: &[usize], rng: &mut Rng) {
    let prods: Vec<Product> = group.iter().map(|&(ty, n)| product(p, ty, n, n_in, rng)).collect();
    let names: Vec<&str> = prods.iter().map(|q| q.name.as_str()).collect();
    for &t in tokens {
        let x = rng.normals(t * n_in, 1.0);
        let xt = p.up(&x, &[t, n_in]);
        // Outputs start as garbage: every element must be written.
        let garbage = |rng: &mut Rng, n: usize| p.up(&rng.normals(t * n, 1e3), &[t, n]);
        let outs: Vec<Pt> = prods.iter().map(|q| garbage(rng, q.n_out)).collect();
        let what = format!("{} matmul_group [{}] x {n_in} T {t}", p.name(), names.join(", "));
        p.run(&what, |be, s| {
            let ws: Vec<&Tensor> = prods.iter().map(|q| q.w.on(s)).collect();
            let os: Vec<&Tensor> = outs.iter().map(|o| o.on(s)).collect();
            compose::matmul_group(be, &ws, xt.on(s), &os)
        });
        let alone: Vec<Pt> = prods.iter().map(|q| garbage(rng, q.n_out)).collect();
        p.run(&format!("{what}: one matmul each"), |be, s| {
            prods
                .iter()
                .zip(&alone)
                .try_for_each(|(q, o)| be.matmul(q.w.on(s), xt.on(s), o.on(s)))
        });
        for ((q, out), single) in prods.iter().zip(&outs).zip(&alone) {
            let (got, want) = p.read(out);
            let what = format!("{what}: {}", q.name);
            check_matmul(p.dev.as_ref(), &what, &got, &want, &q.deq, &x, n_in);
            let (single, _) = p.read(single);
            if joins_taller(p, group, q.n_out, q.ty, n_in, t) {
                continue;
            }
            if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != single[i].to_bits()) {
                panic!("{what}: element {i} is {} grouped, {} alone", got[i], single[i]);
            }
        }
    }
}

/// Whether CUDA's decode path runs the product of `n_out` rows of `ty` in `group` in another
/// kernel than its own launch would: tensor-core products of one format share a launch whatever
/// their shapes, in the kernel of the tallest (8192 rows or more: the tall kernels, whose K split
/// differs), so a shorter member's rows take other roundings (the CPU bound still holds); and
/// where a Q6_K product joins the Q4_K ones (Q4_K_M's mixed launch, 16-row blocks for all), a
/// tall Q4_K product leaves its tall kernel.
fn joins_taller(p: &Both, group: &[Member], n_out: usize, ty: Option<GgmlType>, n_in: usize, t: usize) -> bool {
    const TALL_ROWS: usize = 8192;
    let tc = matches!(ty, Some(GgmlType::Q4K | GgmlType::Q8_0));
    let tallest = group.iter().filter(|m| m.0 == ty).map(|m| m.1).max().unwrap_or(0);
    let mixed =
        ty == Some(GgmlType::Q4K) && group.iter().any(|m| m.0 == Some(GgmlType::Q6K)) && n_in.is_multiple_of(2048);
    p.name().starts_with("cuda")
        && tc
        && t <= 4
        && n_in.is_multiple_of(256)
        && tallest >= TALL_ROWS
        && (n_out < TALL_ROWS || mixed)
}

#[test]
fn matmul_group_matches_cpu() {
    use GgmlType::*;
    for p in Both::each() {
        let mut rng = Rng::new(53);
        let tokens = [1usize, 3, 64];
        // Rows of 2048: every tensor-core decode kernel applies (Q6_K needs n_in % 2048 == 0).
        let cases: [&[(Option<GgmlType>, usize)]; 7] = [
            &[(Some(Q4K), 33)],
            &[(Some(Q4K), 264), (Some(Q4K), 32)],
            // Mixed formats: one launch each.
            &[(Some(Q4K), 33), (Some(Q6K), 40), (Some(Q8_0), 17), (None, 7)],
            // Two formats interleaved: two launches of two products.
            &[(Some(Q4K), 33), (Some(Q6K), 32), (Some(Q4K), 1), (Some(Q6K), 65)],
            &[(Some(Q8_0), 32), (Some(Q8_0), 33), (Some(Q8_0), 1)],
            // The MoE router and shared-expert gate.
            &[(None, 65), (None, 1)],
            // Formats whose CUDA kernels take one product per launch (F16, BF16; Q6_K above).
            &[(Some(F16), 33), (Some(Bf16), 7), (Some(F16), 1)],
        ];
        for group in cases {
            group_case(&p, group, 2048, &tokens, &mut rng);
        }
        // The GDN projections' shape (a tall qkv, z, beta, alpha), short rows: on CUDA one launch
        // of the tall kernel for all four.
        for ty in [Q4K, Q8_0] {
            let group = [(Some(ty), 8200), (Some(ty), 33), (Some(ty), 32), (Some(ty), 32)];
            group_case(&p, &group, 256, &tokens, &mut rng);
        }
        // Two products below the tall kernels' 8192 rows and one at it: one launch of the tall
        // kernel; alone, the two short ones take the small kernel (other bits).
        let group = [(Some(Q4K), 4100), (Some(Q4K), 4100), (Some(Q4K), 8192)];
        group_case(&p, &group, 256, &[1, 2], &mut rng);
        // Q4_K_M's attention projections: a tall Q4_K q, a short k and a Q6_K v (on CUDA one
        // launch of both formats).
        let group = [(Some(Q6K), 40), (Some(Q4K), 8200), (Some(Q4K), 33)];
        group_case(&p, &group, 2048, &[1, 3], &mut rng);
        // Rows of 256: Q6_K on the f32 kernels, Q4_K on the tensor cores, in one group.
        let group = [(Some(Q6K), 33), (Some(Q4K), 7), (Some(Q6K), 1)];
        group_case(&p, &group, 256, &tokens, &mut rng);
        // Other row widths, at one and two 64-row tiles too. A Q4_K_M Gated DeltaNet layer (qkv
        // Q6_K in some layers: one product alone, three in a group), one all Q4_K (four in a
        // group; three and one where a wgpu kernel binds at most 8 buffers), row counts off every
        // workgroup multiple.
        let tokens = [1usize, 3, 64, 65];
        let cases: [(usize, &[Member]); 9] = [
            (
                768,
                &[(Some(Q6K), 300), (Some(Q4K), 129), (Some(Q4K), 7), (Some(Q4K), 7)],
            ),
            (
                512,
                &[(Some(Q4K), 515), (Some(Q4K), 33), (Some(Q4K), 1), (Some(Q4K), 8)],
            ),
            // Attention projections: Q8_0, the floats, a format without its own wgpu decoder
            // (Q4_0), groups of two and three, with the odd one out first.
            (2304, &[(Some(Q8_0), 130), (Some(Q8_0), 33), (Some(Q8_0), 33)]),
            (512, &[(Some(Q5K), 3), (Some(F16), 65), (Some(Bf16), 9), (Some(F16), 2)]),
            (320, &[(Some(Q4_0), 40), (Some(Q4_0), 17)]),
            // F32 rows that are not a multiple of the matrix-vector unit (the generic kernel).
            (512, &[(Some(F32), 8), (Some(F32), 1)]),
            (300, &[(Some(F32), 8), (Some(F32), 1), (Some(F32), 5)]),
            // Rows short enough for one invocation per row (wgpu: no group), a group of one.
            (64, &[(Some(F32), 24), (Some(Q8_0), 3)]),
            (1024, &[(Some(Q4K), 77)]),
        ];
        for (n_in, group) in cases {
            group_case(&p, group, n_in, &tokens, &mut rng);
        }
    }
}

/// The contract (`check::matmul_group`): 1 to `MAX_GROUP` pairs, as many outputs as weights,
/// every pair a valid `matmul`, no output sharing a buffer with another.
#[test]
fn matmul_group_contract_errors() {
    for be in common::backends() {
        let g: &dyn Backend = be.as_ref();
        let name = g.name();
        let mut rng = Rng::new(59);
        let w = upload(
            g,
            GgmlType::Q8_0,
            &[4, 64],
            &random_weight(GgmlType::Q8_0, 4, 64, 0.5, &mut rng),
        );
        let x = up(g, &rng.normals(2 * 64, 1.0), &[2, 64]);
        let f = |shape: &[usize]| g.alloc(DType::F32, shape).expect("alloc");
        let (o1, o2) = (f(&[2, 4]), f(&[2, 4]));
        compose::matmul_group(g, &[&w, &w], &x, &[&o1, &o2]).expect("valid group");
        let refused = |r: rill::Result<()>, what: &str| assert!(r.is_err(), "{name}: {what} must be refused");
        refused(compose::matmul_group(g, &[], &x, &[]), "an empty group");
        let many: Vec<Tensor> = (0..=MAX_GROUP).map(|_| f(&[2, 4])).collect();
        let many_refs: Vec<&Tensor> = many.iter().collect();
        refused(
            compose::matmul_group(g, &[&w; MAX_GROUP + 1], &x, &many_refs),
            "more than MAX_GROUP pairs",
        );
        refused(
            compose::matmul_group(g, &[&w, &w], &x, &[&o1]),
            "fewer outputs than weights",
        );
        refused(compose::matmul_group(g, &[&w, &w], &x, &[&o1, &o1]), "an output twice");
        refused(compose::matmul_group(g, &[&w], &x, &[&x]), "the input as an output");
        refused(
            compose::matmul_group(g, &[&w, &w], &x, &[&o1, &f(&[2, 5])]),
            "an n_out mismatch",
        );
        refused(
            compose::matmul_group(g, &[&w], &f(&[2, 32]), &[&o1]),
            "an n_in mismatch",
        );
    }
}

//! ggml quantization test vectors (tests/fixtures/quants.*, see fixtures/README.md):
//! dequantization must reproduce gguf-py/ggml bit for bit, our quantizers must reproduce ggml's
//! blocks for the formats where the reference algorithm is deterministic arithmetic, and our
//! K-quant quantizers must be as accurate as ggml's on the same inputs.

mod common;

use common::fixture;
use common::weights::WEIGHT_TYPES;
use rill::gguf::GgmlType;
use rill::quant::{dequantize, quantize};
use safetensors::SafeTensors;

const ROWS: usize = 8;
const COLS: usize = 512;

/// The 14 types in `quants.gguf`, in the fixture's order: every weight format but F32 and MXFP4.
fn fixture_types() -> impl Iterator<Item = GgmlType> {
    WEIGHT_TYPES
        .into_iter()
        .filter(|ty| !matches!(ty, GgmlType::F32 | GgmlType::Mxfp4))
}

struct Reference {
    bytes: Vec<u8>,
    json: serde_json::Value,
}

impl Reference {
    fn load() -> Self {
        let bytes = std::fs::read(fixture("quants.reference.safetensors")).expect("read safetensors");
        let json = serde_json::from_slice(&std::fs::read(fixture("quants.reference.json")).expect("read json"))
            .expect("parse json");
        Reference { bytes, json }
    }

    /// An F32 [8, 512] tensor as a flat row-major vector.
    fn f32_tensor(&self, name: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.bytes).expect("parse safetensors");
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
        assert_eq!(t.shape(), &[ROWS, COLS], "{name}");
        t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// ggml's relative RMS quantization error per row for `ty`.
    fn ggml_error(&self, ty: GgmlType) -> Vec<f64> {
        self.json["types"][ty.name()]["quant_error_rel_rmse_per_row"]
            .as_array()
            .unwrap_or_else(|| panic!("{ty}: no error list"))
            .iter()
            .map(|v| v.as_f64().expect("number"))
            .collect()
    }
}

fn rel_rms(x: &[f32], y: &[f32]) -> f64 {
    let num: f64 = x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    let den: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
    (num / den).sqrt()
}

fn quantize_matrix(ty: GgmlType, src: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; ty.row_size(COLS as u64).expect("row size") as usize * ROWS];
    quantize(ty, src, &mut q).unwrap_or_else(|e| panic!("quantize {ty}: {e}"));
    q
}

/// Our quantizers (ggml's algorithms) give ggml's quantization error on every fixture row.
#[test]
fn quantizer_error_matches_ggml_per_row() {
    let r = Reference::load();
    for ty in fixture_types() {
        if !rill::quant::can_quantize(ty) {
            continue;
        }
        let src = r.f32_tensor(&format!("src.{}", ty.name()));
        let q = quantize_matrix(ty, &src);
        let mut y = vec![0f32; src.len()];
        dequantize(ty, &q, &mut y).unwrap();
        let ggml = r.ggml_error(ty);
        for (row, &theirs) in ggml.iter().enumerate() {
            let s = row * COLS..(row + 1) * COLS;
            let e = rel_rms(&src[s.clone()], &y[s]);
            eprintln!("{:>5} row {row}: ours {e:.6} ggml {theirs:.6}", ty.name());
            // The JSON rounds to 6 digits; the blocks themselves are compared exactly below.
            assert!(
                (e - theirs).abs() <= 1e-6,
                "{ty} row {row}: rel RMS {e} vs ggml {theirs}"
            );
        }
    }
}

fn stored_blocks(file: &rill::gguf::GgufFile, ty: GgmlType) -> Vec<u8> {
    let name = format!("q.{}", ty.name());
    let info = file.tensor(&name).unwrap_or_else(|| panic!("{name} missing"));
    assert_eq!(info.ggml_type, ty, "{name}");
    assert_eq!(info.ne, vec![COLS as u64, ROWS as u64], "{name}");
    file.tensor_data(info).to_vec()
}

fn open_gguf() -> rill::gguf::GgufFile {
    rill::gguf::GgufFile::open(fixture("quants.gguf")).expect("open quants.gguf")
}

/// Dequantizing ggml's stored blocks reproduces gguf-py's dequantization bit for bit (rows with
/// f16-subnormal scales and all-zero blocks included).
#[test]
fn dequantize_matches_reference_bit_for_bit() {
    let r = Reference::load();
    let file = open_gguf();
    for ty in fixture_types() {
        let blocks = stored_blocks(&file, ty);
        let want = r.f32_tensor(&format!("deq.{}", ty.name()));
        let mut got = vec![0f32; ROWS * COLS];
        dequantize(ty, &blocks, &mut got).unwrap_or_else(|e| panic!("{ty}: {e}"));
        let bad: Vec<usize> = (0..got.len())
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .collect();
        assert!(
            bad.is_empty(),
            "{ty}: {} of {} values differ, first at {}: {} vs {}",
            bad.len(),
            got.len(),
            bad[0],
            got[bad[0]],
            want[bad[0]]
        );

        // Row by row through vec_dot with a one-hot probe gives the same values again.
        let row_bytes = ty.row_size(COLS as u64).unwrap() as usize;
        let mut probe = vec![0f32; COLS];
        for (row, q) in blocks.chunks_exact(row_bytes).enumerate() {
            for col in [0usize, 17, 255, 256, 511] {
                probe[col] = 1.0;
                let v = rill::quant::vec_dot(ty, q, &probe).unwrap();
                probe[col] = 0.0;
                // Value equality: a −0.0 element sums to +0.0.
                assert_eq!(v, want[row * COLS + col], "{ty} row {row} col {col}");
            }
        }
    }
}

/// Our quantizers reproduce ggml's blocks exactly: legacy formats and F16/BF16 (which gguf-py also
/// reproduces) and the K-quants Q4_K, Q5_K, Q6_K (ggml's reference search, same f32 order).
#[test]
fn quantize_reproduces_ggml_blocks() {
    let r = Reference::load();
    let file = open_gguf();
    for ty in fixture_types() {
        if !rill::quant::can_quantize(ty) {
            continue;
        }
        let src = r.f32_tensor(&format!("src.{}", ty.name()));
        let ours = quantize_matrix(ty, &src);
        let theirs = stored_blocks(&file, ty);
        let bs = ty.type_size() as usize;
        let differing: Vec<usize> = ours
            .chunks_exact(bs)
            .zip(theirs.chunks_exact(bs))
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, _)| i)
            .collect();
        assert!(
            differing.is_empty(),
            "{ty}: {} of {} blocks differ (first: block {})",
            differing.len(),
            ours.len() / bs,
            differing[0]
        );
    }
}

//! Malformed GGUF files: each must be rejected with its specific error, quickly, without panicking
//! and without any single allocation larger than the file could justify.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use rill::error::GgufError as G;
use rill::gguf::{GgmlType, GgufFile, GgufWriter, Value};

// ---------------------------------------------------------------------------------------------
// Allocation tracking: the largest single allocation request made by the current thread.

struct CountingAlloc;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with` because the allocator may run while thread-locals are being torn down.
    let _ = LARGEST.try_with(|m| m.set(m.get().max(size)));
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Parse `bytes`, asserting no single allocation exceeded what the file size justifies.
fn parse(bytes: Vec<u8>) -> rill::Result<GgufFile> {
    let limit = 64 * bytes.len() + (1 << 20);
    LARGEST.with(|m| m.set(0));
    let start = Instant::now();
    let result = GgufFile::from_bytes(bytes);
    let largest = LARGEST.with(|m| m.get());
    assert!(
        largest <= limit,
        "allocation of {largest} bytes for a file allowing {limit}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "parse took {:?}",
        start.elapsed()
    );
    result
}

/// The GGUF error of a file that must be rejected.
fn err(bytes: Vec<u8>) -> G {
    match parse(bytes) {
        Err(rill::Error::Gguf(e)) => e,
        Err(e) => panic!("expected a GGUF error, got {e:?}"),
        Ok(f) => panic!("expected an error, file parsed: {f:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// A hand encoder so each case changes exactly one field.

const MAGIC: &[u8; 4] = b"GGUF";
const T_U8: u32 = 0;
const T_U32: u32 = 4;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const F32: u32 = 0;
const Q8_0: u32 = 8;
const Q4_K: u32 = 12;

fn u32b(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}
fn u64b(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}
fn strb(s: &[u8]) -> Vec<u8> {
    [u64b(s.len() as u64), s.to_vec()].concat()
}
fn kv(key: &[u8], ty: u32, body: &[u8]) -> Vec<u8> {
    [strb(key), u32b(ty), body.to_vec()].concat()
}
fn tensor(name: &[u8], ne: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    tensor_dims(name, ne.len() as u32, ne, ty, offset)
}
fn tensor_dims(name: &[u8], n_dims: u32, ne: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let dims: Vec<u8> = ne.iter().flat_map(|d| d.to_le_bytes()).collect();
    [strb(name), u32b(n_dims), dims, u32b(ty), u64b(offset)].concat()
}

struct Spec {
    magic: Vec<u8>,
    version: u32,
    tensor_count: Option<u64>,
    kv_count: Option<u64>,
    kvs: Vec<Vec<u8>>,
    tensors: Vec<Vec<u8>>,
    alignment: usize,
    data_len: usize,
}

/// A valid file: one string KV, an F32 tensor `a` [8] at 0 and a Q8_0 tensor `b` [32, 2] at 32.
fn valid() -> Spec {
    Spec {
        magic: MAGIC.to_vec(),
        version: 3,
        tensor_count: None,
        kv_count: None,
        kvs: vec![kv(b"general.architecture", T_STRING, &strb(b"qwen35"))],
        tensors: vec![tensor(b"a", &[8], F32, 0), tensor(b"b", &[32, 2], Q8_0, 32)],
        alignment: 32,
        data_len: 32 + 68,
    }
}

impl Spec {
    fn header(&self) -> Vec<u8> {
        let mut out = self.magic.clone();
        out.extend(u32b(self.version));
        out.extend(u64b(self.tensor_count.unwrap_or(self.tensors.len() as u64)));
        out.extend(u64b(self.kv_count.unwrap_or(self.kvs.len() as u64)));
        self.kvs.iter().for_each(|k| out.extend(k));
        self.tensors.iter().for_each(|t| out.extend(t));
        out
    }
    fn build(&self) -> Vec<u8> {
        let mut out = self.header();
        out.resize(out.len().div_ceil(self.alignment) * self.alignment, 0);
        out.extend((0..self.data_len).map(|i| i as u8));
        out
    }
    fn with_kv(mut self, k: Vec<u8>) -> Self {
        self.kvs.push(k);
        self
    }
    fn with_tensors(mut self, t: Vec<Vec<u8>>) -> Self {
        self.tensors = t;
        self
    }
}

/// A valid file built by the writer with every value type, for prefix and mutation tests.
fn writer_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::String("qwen35".into()));
    w.add_kv("k.u32", Value::U32(7));
    w.add_kv("k.i16", Value::I16(-3));
    w.add_kv("k.f64", Value::F64(1.25));
    w.add_kv("k.bool", Value::Bool(true));
    w.add_kv("k.empty", Value::String(String::new()));
    let strings = ["a", "bc", "", "Ġdef"].map(|s| Value::String(s.into()));
    w.add_kv("k.tokens", Value::Array(strings.to_vec().into()));
    let nested = Value::Array(
        vec![
            Value::Array(vec![Value::I32(1), Value::I32(2)].into()),
            Value::Array(vec![].into()),
        ]
        .into(),
    );
    w.add_kv("k.nested", nested);
    let a = w.add_tensor("a", vec![8], GgmlType::F32).expect("a");
    let b = w.add_tensor("b", vec![32, 2], GgmlType::Q8_0).expect("b");
    let c = w.add_tensor("c", vec![256], GgmlType::Q4K).expect("c");
    let mut out = Vec::new();
    w.write_header(&mut out).expect("header");
    for i in [a, b, c] {
        let data = vec![0x11; w.tensor_size(i) as usize];
        w.write_tensor_data(&mut out, i, &data).expect("data");
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Sanity: the baselines are valid.

#[test]
fn baselines_are_valid() {
    let f = parse(valid().build()).expect("hand-built baseline");
    assert_eq!(f.tensors.len(), 2);
    let f = parse(writer_file()).expect("writer baseline");
    assert_eq!(f.tensors.len(), 3);
}

// ---------------------------------------------------------------------------------------------
// Header.

#[test]
fn empty_file() {
    assert!(matches!(err(vec![]), G::Truncated { .. }));
}

#[test]
fn truncated_magic() {
    assert!(matches!(err(b"GGU".to_vec()), G::Truncated { .. }));
}

#[test]
fn bad_magic() {
    let mut s = valid();
    s.magic = b"GGML".to_vec();
    assert!(matches!(err(s.build()), G::BadMagic(m) if m == u32::from_le_bytes(*b"GGML")));
}

#[test]
fn truncated_version() {
    assert!(matches!(err(b"GGUF\x03\x00".to_vec()), G::Truncated { offset: 4, .. }));
}

#[test]
fn version_1_and_4() {
    for v in [0, 1, 4, u32::MAX] {
        let mut s = valid();
        s.version = v;
        assert_eq!(err(s.build()), G::UnsupportedVersion(v));
    }
}

#[test]
fn version_2_accepted() {
    let mut s = valid();
    s.version = 2;
    assert_eq!(parse(s.build()).expect("v2").version, 2);
}

#[test]
fn truncated_counts() {
    let full = valid().build();
    for len in 8..24 {
        assert!(matches!(err(full[..len].to_vec()), G::Truncated { .. }), "len {len}");
    }
}

#[test]
fn tensor_count_max() {
    let mut s = valid();
    s.tensor_count = Some(u64::MAX);
    assert!(matches!(err(s.build()), G::TooMany { count: u64::MAX, .. }));
}

#[test]
fn tensor_count_slightly_too_large() {
    let mut s = valid();
    s.tensor_count = Some(1_000_000);
    assert!(matches!(err(s.build()), G::CountTooLarge { count: 1_000_000, .. }));
}

#[test]
fn kv_count_huge() {
    // Above the cap on what is materialised, or above what the bytes left could hold.
    for count in [u64::MAX, u64::MAX / 13 + 1, 1 << 40] {
        let mut s = valid();
        s.kv_count = Some(count);
        assert!(matches!(err(s.build()), G::TooMany { .. }), "count {count}");
    }
    let mut s = valid();
    s.kv_count = Some(1000);
    assert!(matches!(err(s.build()), G::CountTooLarge { count: 1000, .. }));
}

/// A file cut inside its metadata is reported as truncated there, not as an impossible tensor
/// count (the tensor count is checked against the bytes left after the KVs).
#[test]
fn truncated_kv_section_is_truncation_not_a_bad_tensor_count() {
    let mut s = valid();
    s.kvs.push(kv(b"filler", T_STRING, &strb(&[b'f'; 3000])));
    s.kvs.push(kv(b"long", T_STRING, &strb(&[b'x'; 2000])));
    // 200 tensor infos need at least 6400 bytes: more than the cut file has left after the
    // counts, which the old reader reported as "tensor count 200 is impossible".
    s.tensors = (0..200)
        .map(|i| tensor(format!("t{i}").as_bytes(), &[8], F32, 0))
        .collect();
    let long_body = 24 + s.kvs[0].len() + s.kvs[1].len() + (8 + 4) + 4 + 8;
    let header = s.header();
    let e = err(header[..long_body + 1000].to_vec());
    assert!(matches!(e, G::Truncated { needed: 2000, .. }), "{e:?}");
    assert!(e.to_string().contains("truncated"), "{e}");
}

#[test]
fn kv_count_larger_than_present_but_plausible() {
    // Fits the byte bound, but the KVs run out: the tensor infos are parsed as KVs until truncation
    // or a nonsense value type.
    let mut s = valid();
    s.kv_count = Some(3);
    assert!(parse(s.build()).is_err());
}

// ---------------------------------------------------------------------------------------------
// Keys, values, strings, arrays.

#[test]
fn key_length_huge() {
    // A length larger than the whole file is a corrupt length, not a truncated file.
    let s = valid().with_kv([u64b(u64::MAX), u32b(T_U8), vec![0]].concat());
    let e = err(s.build());
    assert!(matches!(e, G::ImpossibleLength { len: u64::MAX, .. }), "{e:?}");
    assert!(e.to_string().contains("metadata key"), "{e}");
    assert!(!e.to_string().contains("truncated"), "{e}");
}

#[test]
fn string_value_length_huge() {
    let s = valid().with_kv(kv(b"k", T_STRING, &u64b(1 << 50)));
    assert!(matches!(err(s.build()), G::ImpossibleLength { len, .. } if len == 1 << 50));
}

#[test]
fn string_value_one_byte_too_long() {
    // The file ends right after "qwen35" but its length says 7 bytes.
    let mut s = valid();
    s.tensors.clear();
    s.kvs = vec![kv(b"general.architecture", T_STRING, &strb(b"qwen35"))];
    let mut bytes = s.header();
    let len_at = bytes.len() - 6 - 8;
    bytes[len_at] = 7;
    assert!(matches!(err(bytes), G::Truncated { needed: 7, .. }));
}

/// A cut file fails either while reading (`Truncated`), when the cut leaves fewer bytes than the
/// declared counts could possibly need at the count bound (`CountTooLarge`), or when a string is
/// cut so early that its length exceeds the whole remaining file (`ImpossibleLength`).
fn is_truncation(e: &G) -> bool {
    matches!(
        e,
        G::Truncated { .. } | G::CountTooLarge { .. } | G::ImpossibleLength { .. }
    )
}

#[test]
fn truncated_inside_key_and_value() {
    let full = valid().build();
    let kv_start = 24;
    let kv_len = valid().kvs[0].len();
    for len in kv_start..kv_start + kv_len {
        let e = err(full[..len].to_vec());
        assert!(is_truncation(&e), "len {len}: {e:?}");
    }
    // Cut in the middle of a key long enough that the count bounds pass.
    let mut s = valid();
    s.tensors.clear();
    s.kvs = vec![kv(&[b'k'; 100], T_U8, &[1])];
    let bytes = s.header();
    assert!(matches!(
        err(bytes[..24 + 8 + 50].to_vec()),
        G::ImpossibleLength {
            offset: 24,
            len: 100,
            file_len: 82,
            ..
        }
    ));
    s.kvs.push(kv(&[b'y'; 100], T_U8, &[1]));
    let bytes = s.header();
    assert!(matches!(
        err(bytes[..24 + 8 + 100 + 5 + 8 + 50].to_vec()),
        G::Truncated {
            offset: 145,
            needed: 100,
            ..
        }
    ));
    // Cut inside the value.
    assert!(matches!(
        err(bytes[..bytes.len() - 1].to_vec()),
        G::Truncated { needed: 1, .. }
    ));
}

#[test]
fn array_count_huge_does_not_allocate() {
    for (elem, count) in [
        (T_U8, u64::MAX),
        (T_U8, 1 << 40),
        (T_STRING, u64::MAX / 8 + 1), // count * 8 overflows u64
        (T_U64, 1 << 61),
        (T_ARRAY, 1 << 60),
    ] {
        let s = valid().with_kv(kv(b"arr", T_ARRAY, &[u32b(elem), u64b(count)].concat()));
        let start = Instant::now();
        assert!(matches!(err(s.build()), G::CountTooLarge { .. }), "{elem} x {count}");
        assert!(start.elapsed() < Duration::from_millis(100));
    }
}

/// Array payloads stay in the file's bytes until read: a large u8 array costs no allocation
/// (issue 12: each element used to become a 32-byte value, 32x the file).
#[test]
fn large_u8_array_stays_encoded() {
    let n = 8 << 20;
    let body = [u32b(T_U8), u64b(n as u64), vec![7u8; n]].concat();
    let bytes = valid().with_kv(kv(b"big", T_ARRAY, &body)).build();
    let len = bytes.len();
    LARGEST.with(|m| m.set(0));
    let f = GgufFile::from_bytes(bytes).expect("parse");
    let largest = LARGEST.with(|m| m.get());
    assert!(
        largest < 1 << 20,
        "largest allocation {largest} bytes for a {len}-byte file"
    );
    let a = f.get("big").and_then(Value::as_array).expect("array");
    assert_eq!((a.len(), a.elem_type_name()), (n, "u8"));
    assert_eq!(a.iter().nth(n - 1), Some(Value::U8(7)));
    assert_eq!(a.iter().count(), n);
    // Debug output shows a few elements, not the payload.
    let shown = format!("{a:?}");
    assert!(shown.len() < 200, "{shown}");
    // Strings are borrowed from the file, not copied.
    let f = parse(writer_file()).expect("writer file");
    let tokens = f.get("k.tokens").and_then(Value::as_array).expect("tokens");
    let strs: Vec<_> = tokens.strs().collect();
    assert_eq!(strs, [Some("a"), Some("bc"), Some(""), Some("Ġdef")]);
    assert!(a.strs().all(|s| s.is_none()), "u8 elements are not strings");
}

#[test]
fn array_truncated() {
    // 100 declared u32 elements, 2 present, nothing after: count passes neither bound nor data.
    let body = [u32b(T_U32), u64b(100), u32b(1), u32b(2)].concat();
    let mut s = valid();
    s.tensors.clear();
    s.data_len = 0;
    s.kvs = vec![kv(b"arr", T_ARRAY, &body)];
    assert!(matches!(err(s.header()), G::CountTooLarge { count: 100, .. }));
    // 3 declared strings fit the minimal-size bound, but the last one's bytes are missing.
    let body = [u32b(T_STRING), u64b(3), strb(b"ok"), strb(b""), u64b(20), vec![0; 4]].concat();
    s.kvs = vec![kv(b"arr", T_ARRAY, &body)];
    assert!(matches!(err(s.header()), G::Truncated { needed: 20, .. }));
}

/// An array nested `levels` deep (`levels` = 1 is a plain array of u8).
fn nested(levels: usize) -> Vec<u8> {
    let mut body = [u32b(T_U8), u64b(1), vec![42]].concat();
    for _ in 1..levels {
        body = [u32b(T_ARRAY), u64b(1), body].concat();
    }
    body
}

#[test]
fn nesting_too_deep() {
    let s = valid().with_kv(kv(b"deep", T_ARRAY, &nested(9)));
    assert!(matches!(err(s.build()), G::NestingTooDeep(8)));
    let s = valid().with_kv(kv(b"deep", T_ARRAY, &nested(1000)));
    assert!(matches!(err(s.build()), G::NestingTooDeep(8)));
}

#[test]
fn nesting_at_limit_is_fine() {
    let s = valid().with_kv(kv(b"deep", T_ARRAY, &nested(8)));
    let f = parse(s.build()).expect("8 levels");
    let mut v = f.get("deep").expect("key").clone();
    for _ in 1..8 {
        v = v.as_array().expect("array").iter().next().expect("one element");
    }
    assert_eq!(
        v.as_array().map(|a| a.iter().collect::<Vec<_>>()),
        Some(vec![Value::U8(42)])
    );
}

#[test]
fn unknown_value_type() {
    let s = valid().with_kv(kv(b"odd", 13, &[0; 8]));
    assert!(matches!(err(s.build()), G::UnknownValueType { ref key, type_id: 13 } if key == "odd"));
    let s = valid().with_kv(kv(b"odd", u32::MAX, &[0; 8]));
    assert!(matches!(err(s.build()), G::UnknownValueType { type_id: u32::MAX, .. }));
}

#[test]
fn unknown_array_element_type() {
    let s = valid().with_kv(kv(b"arr", T_ARRAY, &[u32b(77), u64b(0)].concat()));
    assert!(matches!(err(s.build()), G::UnknownValueType { type_id: 77, .. }));
}

#[test]
fn invalid_utf8_in_key() {
    let s = valid().with_kv(kv(b"bad\xff\xfekey", T_U8, &[1]));
    let key_bytes_at = (24 + valid().kvs[0].len() + 8) as u64;
    assert!(matches!(err(s.build()), G::BadUtf8 { offset } if offset == key_bytes_at));
}

#[test]
fn invalid_utf8_in_string_value_array_and_tensor_name() {
    let s = valid().with_kv(kv(b"k", T_STRING, &strb(b"\xc3\x28")));
    assert!(matches!(err(s.build()), G::BadUtf8 { .. }));
    let arr = [u32b(T_STRING), u64b(2), strb(b"ok"), strb(b"\xed\xa0\x80")].concat();
    let s = valid().with_kv(kv(b"k", T_ARRAY, &arr));
    assert!(matches!(err(s.build()), G::BadUtf8 { .. }));
    let s = valid().with_tensors(vec![tensor(b"\x80", &[8], F32, 0)]);
    assert!(matches!(err(s.build()), G::BadUtf8 { .. }));
}

#[test]
fn duplicate_key() {
    let s = valid().with_kv(kv(b"general.architecture", T_STRING, &strb(b"x")));
    assert!(matches!(err(s.build()), G::DuplicateKey(ref k) if k == "general.architecture"));
}

// ---------------------------------------------------------------------------------------------
// Alignment.

#[test]
fn alignment_zero_and_not_power_of_two() {
    for a in [0u32, 3, 48, u32::MAX] {
        let s = valid().with_kv(kv(b"general.alignment", T_U32, &u32b(a)));
        assert_eq!(err(s.build()), G::BadAlignment(a.into()), "alignment {a}");
    }
}

#[test]
fn alignment_wrong_type() {
    let s = valid().with_kv(kv(b"general.alignment", T_U64, &u64b(32)));
    assert!(matches!(err(s.build()), G::BadAlignmentType(ref t) if t == "u64"));
    let s = valid().with_kv(kv(b"general.alignment", T_STRING, &strb(b"32")));
    assert!(matches!(err(s.build()), G::BadAlignmentType(ref t) if t == "string"));
}

#[test]
fn alignment_other_power_of_two_is_used() {
    let mut s = valid().with_kv(kv(b"general.alignment", T_U32, &u32b(64)));
    s.alignment = 64;
    s.tensors = vec![tensor(b"a", &[8], F32, 0), tensor(b"b", &[32, 2], Q8_0, 64)];
    s.data_len = 64 + 68;
    let f = parse(s.build()).expect("align 64");
    assert_eq!((f.alignment, f.data_start % 64), (64, 0));
    // 32-aligned offset is misaligned under alignment 64.
    let mut s = valid().with_kv(kv(b"general.alignment", T_U32, &u32b(64)));
    s.alignment = 64;
    assert!(matches!(
        err(s.build()),
        G::Misaligned {
            align: 64,
            offset: 32,
            ..
        }
    ));
}

// ---------------------------------------------------------------------------------------------
// Tensor infos.

#[test]
fn unknown_ggml_type() {
    for id in [4, 5, 31, 36, 1000, u32::MAX] {
        let s = valid().with_tensors(vec![tensor(b"t", &[32], id, 0)]);
        assert!(
            matches!(err(s.build()), G::UnknownTensorType { type_id, .. } if type_id == id),
            "{id}"
        );
    }
}

#[test]
fn n_dims_0_and_5() {
    for n in [0, 5, u32::MAX] {
        let s = valid().with_tensors(vec![tensor_dims(b"t", n, &[8, 1, 1, 1, 1], F32, 0)]);
        assert!(
            matches!(err(s.build()), G::BadDims { n_dims, .. } if n_dims == n),
            "{n}"
        );
    }
}

#[test]
fn zero_dimension() {
    let s = valid().with_tensors(vec![tensor(b"t", &[8, 0, 2], F32, 0)]);
    assert!(matches!(err(s.build()), G::BadShape { dim: 1, .. }));
    let s = valid().with_tensors(vec![tensor(b"t", &[0], F32, 0)]);
    assert!(matches!(err(s.build()), G::BadShape { dim: 0, .. }));
}

#[test]
fn element_count_overflows() {
    let s = valid().with_tensors(vec![tensor(b"t", &[1 << 32, 1 << 32], F32, 0)]);
    assert!(matches!(err(s.build()), G::BadShape { dim: 1, .. }));
    let s = valid().with_tensors(vec![tensor(b"t", &[u64::MAX, 2, 2, 2], F32, 0)]);
    assert!(matches!(err(s.build()), G::BadShape { dim: 1, .. }));
}

#[test]
fn byte_size_overflows() {
    // 2^62 elements fit in u64, 2^62 * 4 bytes do not.
    let s = valid().with_tensors(vec![tensor(b"t", &[1 << 62], F32, 0)]);
    assert!(matches!(err(s.build()), G::SizeOverflow { .. }));
}

#[test]
fn row_not_block_multiple() {
    let s = valid().with_tensors(vec![tensor(b"t", &[100, 2], Q4_K, 0)]);
    assert!(matches!(
        err(s.build()),
        G::RowNotBlockMultiple {
            ne0: 100,
            block: 256,
            ..
        }
    ));
}

#[test]
fn offset_misaligned() {
    let s = valid().with_tensors(vec![tensor(b"a", &[8], F32, 0), tensor(b"b", &[32, 2], Q8_0, 33)]);
    assert!(matches!(
        err(s.build()),
        G::Misaligned {
            offset: 33,
            align: 32,
            ..
        }
    ));
}

#[test]
fn offset_past_end() {
    let s = valid().with_tensors(vec![tensor(b"a", &[8], F32, 0), tensor(b"b", &[32, 2], Q8_0, 4096)]);
    assert!(matches!(err(s.build()), G::DataOutOfBounds { ref name, .. } if name == "b"));
    // Offset so large that data_start + offset overflows.
    let s = valid().with_tensors(vec![tensor(b"a", &[8], F32, u64::MAX - 31)]);
    assert!(matches!(err(s.build()), G::DataOutOfBounds { .. }));
}

#[test]
fn size_past_end() {
    let mut s = valid();
    s.data_len = 32 + 67;
    assert!(matches!(err(s.build()), G::DataOutOfBounds { ref name, .. } if name == "b"));
    let s = valid().with_tensors(vec![tensor(b"a", &[8], F32, 0), tensor(b"b", &[1 << 20], F32, 32)]);
    assert!(matches!(err(s.build()), G::DataOutOfBounds { .. }));
}

#[test]
fn duplicate_tensor() {
    let s = valid().with_tensors(vec![tensor(b"a", &[8], F32, 0), tensor(b"a", &[8], F32, 32)]);
    assert!(matches!(err(s.build()), G::DuplicateTensor(ref n) if n == "a"));
}

#[test]
fn overlapping_tensors() {
    // b (68 bytes from 32) overlaps c at 64; listed out of offset order to exercise the sort.
    let s = valid().with_tensors(vec![
        tensor(b"c", &[8], F32, 64),
        tensor(b"a", &[8], F32, 0),
        tensor(b"b", &[32, 2], Q8_0, 32),
    ]);
    assert!(matches!(err(s.build()), G::Overlap { ref a, ref b } if a == "b" && b == "c"));
    // Same offset twice.
    let s = valid().with_tensors(vec![tensor(b"a", &[8], F32, 0), tensor(b"b", &[8], F32, 0)]);
    assert!(matches!(err(s.build()), G::Overlap { .. }));
}

#[test]
fn truncated_inside_tensor_info() {
    let s = valid();
    let header = s.header();
    let info_start = header.len() - s.tensors.iter().map(Vec::len).sum::<usize>();
    for len in info_start..header.len() {
        let e = err(header[..len].to_vec());
        assert!(is_truncation(&e), "len {len}: {e:?}");
    }
    // Cut inside the last tensor's offset: the count bound passes, the read fails.
    assert!(matches!(
        err(header[..header.len() - 3].to_vec()),
        G::Truncated { needed: 8, .. }
    ));
}

#[test]
fn truncated_inside_padding() {
    let s = valid();
    let header_len = s.header().len();
    assert_ne!(header_len % 32, 0, "the baseline header needs padding for this test");
    let full = s.build();
    for len in header_len..header_len.div_ceil(32) * 32 {
        assert!(matches!(err(full[..len].to_vec()), G::Truncated { .. }), "len {len}");
    }
}

#[test]
fn truncated_inside_data() {
    let full = valid().build();
    let data_start = full.len() - 100;
    for len in data_start..full.len() {
        assert!(
            matches!(err(full[..len].to_vec()), G::DataOutOfBounds { .. }),
            "len {len}"
        );
    }
}

#[test]
fn every_prefix_is_rejected() {
    for full in [valid().build(), writer_file()] {
        // Padding after the last tensor is optional, so prefixes are invalid up to its end.
        let f = parse(full.clone()).expect("full file");
        let data_end = f.tensors.iter().map(|t| f.data_start + t.offset + t.n_bytes).max();
        let data_end = data_end.expect("tensors") as usize;
        for len in 0..data_end {
            let e = err(full[..len].to_vec());
            assert!(
                is_truncation(&e) || matches!(e, G::DataOutOfBounds { .. }),
                "len {len}: {e:?}"
            );
        }
        for len in data_end..=full.len() {
            assert!(parse(full[..len].to_vec()).is_ok(), "len {len}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Random mutation: never panic, hang or over-allocate.

#[test]
fn random_mutations_never_panic() {
    let base = writer_file();
    let mut rng = common::Rng::new(1);
    let mut rejected = 0;
    for _ in 0..2000 {
        let mut bytes = base.clone();
        for _ in 0..1 + rng.below(8) {
            let i = rng.below(bytes.len());
            bytes[i] = match rng.below(4) {
                0 => 0,
                1 => 0xFF,
                2 => bytes[i] ^ (1 << rng.below(8)),
                _ => rng.next_u64() as u8,
            };
        }
        if rng.below(8) == 0 {
            bytes.truncate(rng.below(bytes.len()));
        }
        if let Ok(f) = parse(bytes) {
            // Whatever parsed must be internally consistent.
            for t in &f.tensors {
                assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
            }
        } else {
            rejected += 1;
        }
    }
    assert!(rejected > 500, "mutations should mostly be caught, got {rejected}");
}

#[test]
fn allocation_tracker_sees_large_requests() {
    LARGEST.with(|m| m.set(0));
    let v = std::hint::black_box(vec![0u8; 10 << 20]);
    assert!(LARGEST.with(|m| m.get()) >= 10 << 20);
    drop(v);
}

//! `GgufFile::from_prefix`: the header parsed from the first bytes of a file that cannot be
//! mapped (the browser's), with every tensor range checked against the whole file's length.

use rill::error::{Error, GgufError};
use rill::gguf::GgufFile;

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn fixture() -> Vec<u8> {
    std::fs::read(format!("{FIX}/tiny-moe.F16.gguf")).expect("fixture")
}

#[test]
fn a_prefix_holding_the_header_parses_like_the_whole_file() {
    let bytes = fixture();
    let whole = GgufFile::from_bytes(bytes.clone()).expect("whole file");
    let header_end = whole.data_start as usize;
    for take in [header_end, header_end + 1000, bytes.len()] {
        let f = GgufFile::from_prefix(bytes[..take].to_vec(), bytes.len() as u64)
            .expect("parse")
            .unwrap_or_else(|| panic!("a {take}-byte prefix holds the header"));
        assert_eq!(f.tensors, whole.tensors, "prefix of {take}");
        assert_eq!(f.metadata(), whole.metadata(), "prefix of {take}");
        assert_eq!(f.data_start, whole.data_start);
        assert_eq!(f.file_len(), bytes.len() as u64);
    }
}

#[test]
fn a_prefix_that_ends_inside_the_header_asks_for_more() {
    let bytes = fixture();
    let header_end = GgufFile::from_bytes(bytes.clone()).expect("parse").data_start as usize;
    // Inside the fixed header, the metadata (the vocabulary), the tensor infos (the header ends
    // at most 31 bytes of padding before the data).
    for take in [0, 10, 30, 1000, header_end / 2, header_end - 40, header_end - 32] {
        let r = GgufFile::from_prefix(bytes[..take].to_vec(), bytes.len() as u64).expect("not an error");
        assert!(r.is_none(), "a {take}-byte prefix of a {header_end}-byte header parsed");
    }
}

#[test]
fn tensors_are_checked_against_the_whole_file() {
    let bytes = fixture();
    let header_end = GgufFile::from_bytes(bytes.clone()).expect("parse").data_start as usize;
    // The same header, claimed to belong to a file one byte short: the last tensor is cut.
    let r = GgufFile::from_prefix(bytes[..header_end].to_vec(), bytes.len() as u64 - 1);
    assert!(
        matches!(r, Err(Error::Gguf(GgufError::DataOutOfBounds { .. }))),
        "got {:?}",
        r.map(|f| f.map(|f| f.tensors.len()))
    );
}

#[test]
fn malformed_headers_fail_even_from_a_prefix() {
    let mut bytes = fixture();
    bytes[0] = b'X';
    let r = GgufFile::from_prefix(bytes[..4096].to_vec(), bytes.len() as u64);
    assert!(matches!(r, Err(Error::Gguf(GgufError::BadMagic(_)))));

    let bytes = fixture();
    let r = GgufFile::from_prefix(bytes.clone(), bytes.len() as u64 - 1);
    assert!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "a prefix longer than the file"
    );
}

#[test]
fn tensor_bytes_beyond_the_prefix_are_an_error_not_garbage() {
    use rill::model::TensorSource;
    let bytes = fixture();
    let header_end = GgufFile::from_bytes(bytes.clone()).expect("parse").data_start as usize;
    let f = GgufFile::from_prefix(bytes[..header_end].to_vec(), bytes.len() as u64)
        .expect("parse")
        .expect("header");
    let t = &f.tensors[0];
    let r = pollster::block_on(f.read(f.data_start + t.offset, t.n_bytes as usize));
    assert!(r.is_err(), "the prefix does not hold tensor data");
}

#[test]
fn a_tensor_over_a_device_limit_is_named_with_the_limit() {
    use rill::model::limits::check_tensor_sizes;
    let f = GgufFile::from_bytes(fixture()).expect("parse");
    let largest = f.tensors.iter().max_by_key(|t| t.n_bytes).expect("tensors");
    let need = largest.n_bytes.div_ceil(4) * 4;
    check_tensor_sizes(&f, &[("maxBufferSize", need), ("maxStorageBufferBindingSize", need)]).expect("fits exactly");
    let err = check_tensor_sizes(
        &f,
        &[("maxBufferSize", need), ("maxStorageBufferBindingSize", need - 4)],
    )
    .expect_err("one word too small");
    let msg = err.to_string();
    assert!(
        msg.contains("maxStorageBufferBindingSize") && msg.contains(&largest.name),
        "{msg}"
    );
}

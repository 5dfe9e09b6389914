//! GGUF metadata arrays. An array read from a file stays encoded: it is a view of the file's
//! bytes, validated once when the file is parsed and decoded element by element only when a
//! typed accessor asks (as llama.cpp keeps array payloads as raw bytes). A 200M-element u8 array
//! therefore costs nothing beyond its mapping, instead of 32 bytes of `Value` per byte.

use std::fmt;

use super::{min_encoded_size, type_id, Value, MAX_NESTING};
use crate::error::{GgufError, Result};
use crate::gguf::bytes::TensorBytes;
use crate::gguf::cursor::Cursor;

/// A homogeneous metadata array: its element type, its length, and its elements either still
/// encoded (read from a file) or as values (built in memory for the writer).
#[derive(Clone)]
pub struct Array {
    elem: u32,
    len: usize,
    body: Body,
}

#[derive(Clone)]
enum Body {
    /// The encoded elements inside the file's bytes; validated when the file was read.
    Encoded(TensorBytes),
    Values(Vec<Value>),
}

impl Array {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The on-disk type id of the elements.
    pub fn elem_type_id(&self) -> u32 {
        self.elem
    }

    /// A short name of the element type (`u8`, `string`, ...).
    pub fn elem_type_name(&self) -> &'static str {
        type_id::name(self.elem)
    }

    /// The elements, decoded one at a time.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            inner: match &self.body {
                Body::Encoded(bytes) => Inner::Encoded {
                    cur: Cursor::new(bytes.as_slice()),
                    whole: bytes,
                    elem: self.elem,
                    left: self.len,
                },
                Body::Values(v) => Inner::Values(v.iter()),
            },
        }
    }

    /// The elements as string slices, without copying them out of the file; `None` for an
    /// element that is not a string.
    pub fn strs(&self) -> Strs<'_> {
        Strs {
            inner: match &self.body {
                Body::Encoded(bytes) if self.elem == type_id::STRING => StrsInner::Encoded {
                    cur: Cursor::new(bytes.as_slice()),
                    left: self.len,
                },
                Body::Encoded(_) => StrsInner::NotStrings { left: self.len },
                Body::Values(v) => StrsInner::Values(v.iter()),
            },
        }
    }

    /// The encoded elements when they can be copied as they are (the writer's fast path).
    /// Nested arrays are re-encoded element by element instead, so their depth is checked again.
    pub(crate) fn encoded_flat(&self) -> Option<&[u8]> {
        match &self.body {
            Body::Encoded(b) if self.elem != type_id::ARRAY => Some(b.as_slice()),
            _ => None,
        }
    }

    /// The in-memory elements, if this array was built rather than read.
    pub(crate) fn values(&self) -> Option<&[Value]> {
        match &self.body {
            Body::Values(v) => Some(v),
            Body::Encoded(_) => None,
        }
    }

    /// Bytes of the encoded body (element type and count not included), for size hints.
    pub(crate) fn encoded_len(&self) -> Option<usize> {
        match &self.body {
            Body::Encoded(b) => Some(b.len()),
            Body::Values(_) => None,
        }
    }
}

/// An in-memory array; the first element fixes the element type (an empty array is u8). The
/// writer refuses arrays whose elements differ in type.
impl From<Vec<Value>> for Array {
    fn from(items: Vec<Value>) -> Self {
        Array {
            elem: items.first().map_or(type_id::U8, Value::type_id),
            len: items.len(),
            body: Body::Values(items),
        }
    }
}

impl FromIterator<Value> for Array {
    fn from_iter<I: IntoIterator<Item = Value>>(iter: I) -> Self {
        Array::from(iter.into_iter().collect::<Vec<_>>())
    }
}

/// Equal element types and equal elements, however each side is stored.
impl PartialEq for Array {
    fn eq(&self, other: &Self) -> bool {
        self.elem == other.elem && self.len == other.len && self.iter().eq(other.iter())
    }
}

/// Shows the type, the length and the first few elements (never the whole payload).
impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 8;
        write!(f, "Array<{}>[{}] ", self.elem_type_name(), self.len)?;
        let mut list = f.debug_list();
        list.entries(self.iter().take(SHOWN));
        if self.len > SHOWN {
            list.entry(&format_args!("..."));
        }
        list.finish()
    }
}

/// Iterator over an array's elements as owned values.
pub struct Iter<'a> {
    inner: Inner<'a>,
}

enum Inner<'a> {
    Encoded {
        cur: Cursor<'a>,
        whole: &'a TensorBytes,
        elem: u32,
        left: usize,
    },
    Values(std::slice::Iter<'a, Value>),
}

impl Iterator for Iter<'_> {
    type Item = Value;

    fn next(&mut self) -> Option<Value> {
        match &mut self.inner {
            Inner::Encoded { cur, whole, elem, left } => {
                if *left == 0 {
                    return None;
                }
                *left -= 1;
                // The body was validated when the file was read, so this cannot fail; if it
                // somehow did, the iteration ends rather than yielding a wrong value.
                match read_value(cur, *elem, "", 1, whole) {
                    Ok(v) => Some(v),
                    Err(_) => {
                        *left = 0;
                        None
                    }
                }
            }
            Inner::Values(it) => it.next().cloned(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.inner {
            Inner::Encoded { left, .. } => (0, Some(*left)),
            Inner::Values(it) => it.size_hint(),
        }
    }
}

/// Iterator over an array's elements as string slices (`None` for a non-string element).
pub struct Strs<'a> {
    inner: StrsInner<'a>,
}

enum StrsInner<'a> {
    Encoded { cur: Cursor<'a>, left: usize },
    NotStrings { left: usize },
    Values(std::slice::Iter<'a, Value>),
}

impl<'a> Iterator for Strs<'a> {
    type Item = Option<&'a str>;

    fn next(&mut self) -> Option<Option<&'a str>> {
        match &mut self.inner {
            StrsInner::Encoded { cur, left } => {
                if *left == 0 {
                    return None;
                }
                *left -= 1;
                match cur.str("array string") {
                    Ok(s) => Some(Some(s)),
                    Err(_) => {
                        *left = 0;
                        None
                    }
                }
            }
            StrsInner::NotStrings { left } => {
                if *left == 0 {
                    return None;
                }
                *left -= 1;
                Some(None)
            }
            StrsInner::Values(it) => it.next().map(Value::as_str),
        }
    }
}

/// Read one value of type `ty` at the cursor, whose buffer is `whole`'s bytes; `depth` is the
/// number of enclosing arrays. Strings are copied out; arrays become views of `whole`.
pub(crate) fn read_value(c: &mut Cursor<'_>, ty: u32, key: &str, depth: usize, whole: &TensorBytes) -> Result<Value> {
    Ok(match ty {
        type_id::U8 => Value::U8(c.u8("u8 value")?),
        type_id::I8 => Value::I8(c.u8("i8 value")? as i8),
        type_id::U16 => Value::U16(c.u16("u16 value")?),
        type_id::I16 => Value::I16(c.u16("i16 value")? as i16),
        type_id::U32 => Value::U32(c.u32("u32 value")?),
        type_id::I32 => Value::I32(c.u32("i32 value")? as i32),
        type_id::F32 => Value::F32(f32::from_bits(c.u32("f32 value")?)),
        // The spec says 0 or 1; like ggml we read any non-zero byte as true.
        type_id::BOOL => Value::Bool(c.u8("bool value")? != 0),
        type_id::STRING => Value::String(crate::alloc::string(c.str("string value")?, "a metadata string")?),
        type_id::ARRAY => Value::Array(read_array(c, key, depth + 1, whole)?),
        type_id::U64 => Value::U64(c.u64("u64 value")?),
        type_id::I64 => Value::I64(c.u64("i64 value")? as i64),
        type_id::F64 => Value::F64(f64::from_bits(c.u64("f64 value")?)),
        _ => return Err(unknown_value_type(key, ty).into()),
    })
}

/// Validate an array body (`elem_type, count, elems`) at nesting level `depth` (1 = top level)
/// and return it as a view of `whole`, allocating nothing per element.
fn read_array(c: &mut Cursor<'_>, key: &str, depth: usize, whole: &TensorBytes) -> Result<Array> {
    let (elem, count, start) = walk_array(c, key, depth)?;
    let end = c.pos();
    // The cursor reads `whole`'s bytes, so the walked range lies inside it.
    let body = whole.slice(start, end - start).ok_or(GgufError::Truncated {
        what: "array elements".to_owned(),
        offset: start as u64,
        needed: (end - start) as u64,
        file_len: whole.len() as u64,
    })?;
    Ok(Array {
        elem,
        // count * min_size fits in the buffer, so count fits in usize.
        len: count as usize,
        body: Body::Encoded(body),
    })
}

/// Check an array body at nesting level `depth` and move past it: every element is bounds- and
/// UTF-8-checked, nothing is kept. Returns the element type, the count and where the elements start.
fn walk_array(c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<(u32, u64, usize)> {
    if depth > MAX_NESTING {
        return Err(GgufError::NestingTooDeep(MAX_NESTING).into());
    }
    let elem = c.u32("array element type")?;
    let count = c.u64("array count")?;
    let min_size = min_encoded_size(elem).ok_or_else(|| unknown_value_type(key, elem))?;
    c.check_count("array element", count, min_size)?;
    let start = c.pos();
    match (elem, type_id::fixed_size(elem)) {
        // check_count bounded count * size by the bytes left.
        (_, Some(size)) => {
            c.take(count * size, "array elements")?;
        }
        (type_id::STRING, None) => {
            for _ in 0..count {
                c.str("array string")?;
            }
        }
        _ => {
            for _ in 0..count {
                walk_array(c, key, depth + 1)?;
            }
        }
    }
    Ok((elem, count, start))
}

pub(crate) fn unknown_value_type(key: &str, type_id: u32) -> GgufError {
    GgufError::UnknownValueType {
        key: key.to_owned(),
        type_id,
    }
}

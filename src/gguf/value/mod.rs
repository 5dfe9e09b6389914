//! GGUF metadata values (spec/GGUF.md §1.3) and their on-disk type ids.

mod array;

pub(crate) use array::read_value;
pub use array::Array;

/// A metadata value. Arrays are homogeneous (nested arrays allowed); see `Array`.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// On-disk value type ids (spec/GGUF.md §1.3).
pub(crate) mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;

    /// Encoded size of a fixed-size type; `None` for strings, arrays and unknown ids.
    pub fn fixed_size(id: u32) -> Option<u64> {
        Some(match id {
            U8 | I8 | BOOL => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            _ => return None,
        })
    }

    /// A short name of the type for error messages (`u32`, `string`, `array`, ...).
    pub fn name(id: u32) -> &'static str {
        match id {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            BOOL => "bool",
            STRING => "string",
            ARRAY => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
            _ => "unknown",
        }
    }
}

/// Arrays nested deeper than this are rejected (reader) or refused (writer).
pub const MAX_NESTING: usize = 8;

/// Smallest encoded size of one value of type `id`, or `None` for an unknown id.
/// Used to bound array counts by the bytes left in the file before allocating.
pub(crate) fn min_encoded_size(id: u32) -> Option<u64> {
    match id {
        type_id::STRING => Some(8),    // u64 length, possibly zero bytes
        type_id::ARRAY => Some(4 + 8), // element type + count, possibly zero elements
        _ => type_id::fixed_size(id),
    }
}

impl Value {
    /// The on-disk type id of this value.
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => type_id::U8,
            Value::I8(_) => type_id::I8,
            Value::U16(_) => type_id::U16,
            Value::I16(_) => type_id::I16,
            Value::U32(_) => type_id::U32,
            Value::I32(_) => type_id::I32,
            Value::F32(_) => type_id::F32,
            Value::Bool(_) => type_id::BOOL,
            Value::String(_) => type_id::STRING,
            Value::Array(_) => type_id::ARRAY,
            Value::U64(_) => type_id::U64,
            Value::I64(_) => type_id::I64,
            Value::F64(_) => type_id::F64,
        }
    }

    /// Any integer type holding a non-negative value. Writers differ in the widths they use.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type whose value fits in an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    /// F32/F64, or any integer converted (hyperparameters like `rope.freq_base` may be stored either way).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => self
                .as_i64()
                .map(|v| v as f32)
                .or_else(|| self.as_u64().map(|v| v as f32)),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short name of the type for error messages (`u32`, `string`, `array`, ...).
    pub fn type_name(&self) -> &'static str {
        type_id::name(self.type_id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_accessors_convert_widths() {
        assert_eq!(Value::I32(7).as_u64(), Some(7));
        assert_eq!(Value::I32(-1).as_u64(), None);
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::U8(3).as_i64(), Some(3));
        assert_eq!(Value::Bool(true).as_u64(), None);
        assert_eq!(Value::U32(5).as_f32(), Some(5.0));
        assert_eq!(Value::U64(u64::MAX).as_f32(), Some(u64::MAX as f32));
        assert_eq!(Value::F64(0.5).as_f32(), Some(0.5));
        assert_eq!(Value::String("x".into()).as_f32(), None);
    }
}

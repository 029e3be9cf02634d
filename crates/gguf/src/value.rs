//! GGUF metadata values.
//!
//! Owns [`Value`], the in-memory form of a metadata value, and the GGUF value
//! type ids (`GGUF_TYPE_*`) used on disk.  A `Value::Array` read from a file
//! is homogeneous (every element has the on-disk element type); the writer
//! rejects heterogeneous arrays for the same reason.

/// On-disk value type id of [`Value::U8`].
pub const GGUF_TYPE_UINT8: u32 = 0;
/// On-disk value type id of [`Value::I8`].
pub const GGUF_TYPE_INT8: u32 = 1;
/// On-disk value type id of [`Value::U16`].
pub const GGUF_TYPE_UINT16: u32 = 2;
/// On-disk value type id of [`Value::I16`].
pub const GGUF_TYPE_INT16: u32 = 3;
/// On-disk value type id of [`Value::U32`].
pub const GGUF_TYPE_UINT32: u32 = 4;
/// On-disk value type id of [`Value::I32`].
pub const GGUF_TYPE_INT32: u32 = 5;
/// On-disk value type id of [`Value::F32`].
pub const GGUF_TYPE_FLOAT32: u32 = 6;
/// On-disk value type id of [`Value::Bool`].
pub const GGUF_TYPE_BOOL: u32 = 7;
/// On-disk value type id of [`Value::String`].
pub const GGUF_TYPE_STRING: u32 = 8;
/// On-disk value type id of [`Value::Array`].
pub const GGUF_TYPE_ARRAY: u32 = 9;
/// On-disk value type id of [`Value::U64`].
pub const GGUF_TYPE_UINT64: u32 = 10;
/// On-disk value type id of [`Value::I64`].
pub const GGUF_TYPE_INT64: u32 = 11;
/// On-disk value type id of [`Value::F64`].
pub const GGUF_TYPE_FLOAT64: u32 = 12;

/// Name of an on-disk value type id, or `None` if the id is unknown.
pub fn value_type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        GGUF_TYPE_UINT8 => "u8",
        GGUF_TYPE_INT8 => "i8",
        GGUF_TYPE_UINT16 => "u16",
        GGUF_TYPE_INT16 => "i16",
        GGUF_TYPE_UINT32 => "u32",
        GGUF_TYPE_INT32 => "i32",
        GGUF_TYPE_FLOAT32 => "f32",
        GGUF_TYPE_BOOL => "bool",
        GGUF_TYPE_STRING => "string",
        GGUF_TYPE_ARRAY => "array",
        GGUF_TYPE_UINT64 => "u64",
        GGUF_TYPE_INT64 => "i64",
        GGUF_TYPE_FLOAT64 => "f64",
        _ => return None,
    })
}

/// The smallest encoded size of one value of the given type (used to bound
/// array element counts by the bytes actually present).
pub(crate) fn min_encoded_size(id: u32) -> Option<u64> {
    Some(match id {
        GGUF_TYPE_UINT8 | GGUF_TYPE_INT8 | GGUF_TYPE_BOOL => 1,
        GGUF_TYPE_UINT16 | GGUF_TYPE_INT16 => 2,
        GGUF_TYPE_UINT32 | GGUF_TYPE_INT32 | GGUF_TYPE_FLOAT32 => 4,
        GGUF_TYPE_UINT64 | GGUF_TYPE_INT64 | GGUF_TYPE_FLOAT64 => 8,
        GGUF_TYPE_STRING => 8,
        GGUF_TYPE_ARRAY => 4 + 8,
        _ => return None,
    })
}

/// A GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `uint8`
    U8(u8),
    /// `int8`
    I8(i8),
    /// `uint16`
    U16(u16),
    /// `int16`
    I16(i16),
    /// `uint32`
    U32(u32),
    /// `int32`
    I32(i32),
    /// `uint64`
    U64(u64),
    /// `int64`
    I64(i64),
    /// `float32`
    F32(f32),
    /// `float64`
    F64(f64),
    /// `bool` (stored as one byte, 0 or 1)
    Bool(bool),
    /// UTF-8 string
    String(String),
    /// Homogeneous array (elements may themselves be arrays)
    Array(Vec<Value>),
}

impl Value {
    /// The value as a u64 if it is any integer type and non-negative.
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

    /// The value as an i64 if it is any integer type that fits.
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

    /// The value as an f32 if it is `F32` or `F64` (the latter rounded).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// The string, if this is a `String`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The bool, if this is a `Bool`.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements, if this is an `Array`.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Whether this is one of the eight integer variants.
    pub fn is_integer(&self) -> bool {
        matches!(
            self,
            Value::U8(_) | Value::I8(_) | Value::U16(_) | Value::I16(_) | Value::U32(_) | Value::I32(_) | Value::U64(_) | Value::I64(_)
        )
    }

    /// Short type name for messages: `u8`, `i32`, `f32`, `bool`, `string`,
    /// `array`, ...
    pub fn type_name(&self) -> &'static str {
        value_type_name(self.type_id()).unwrap_or("?")
    }

    /// The on-disk GGUF value type id (`GGUF_TYPE_*`).
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => GGUF_TYPE_UINT8,
            Value::I8(_) => GGUF_TYPE_INT8,
            Value::U16(_) => GGUF_TYPE_UINT16,
            Value::I16(_) => GGUF_TYPE_INT16,
            Value::U32(_) => GGUF_TYPE_UINT32,
            Value::I32(_) => GGUF_TYPE_INT32,
            Value::U64(_) => GGUF_TYPE_UINT64,
            Value::I64(_) => GGUF_TYPE_INT64,
            Value::F32(_) => GGUF_TYPE_FLOAT32,
            Value::F64(_) => GGUF_TYPE_FLOAT64,
            Value::Bool(_) => GGUF_TYPE_BOOL,
            Value::String(_) => GGUF_TYPE_STRING,
            Value::Array(_) => GGUF_TYPE_ARRAY,
        }
    }

    /// A longer description for messages: `array of u32`, `empty array`,
    /// or the plain type name.
    pub fn describe(&self) -> String {
        match self {
            Value::Array(a) => match a.first() {
                None => "empty array".to_string(),
                Some(first) => format!("array of {}", first.type_name()),
            },
            v => v.type_name().to_string(),
        }
    }
}

macro_rules! from_impl {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(x: $t) -> Value { Value::$v(x) }
        }
    )*};
}
from_impl!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    u64 => U64, i64 => I64, f32 => F32, f64 => F64, bool => Bool, String => String);

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_string())
    }
}

impl<T: Into<Value>> From<Vec<T>> for Value {
    fn from(v: Vec<T>) -> Value {
        Value::Array(v.into_iter().map(Into::into).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors() {
        assert_eq!(Value::I32(5).as_u64(), Some(5));
        assert_eq!(Value::I32(-5).as_u64(), None);
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::F32(1.0).as_u64(), None);
        assert_eq!(Value::F64(0.5).as_f32(), Some(0.5));
        assert_eq!(Value::U8(1).as_f32(), None);
        assert_eq!(Value::from("x").as_str(), Some("x"));
        assert_eq!(Value::Bool(true).as_bool(), Some(true));
        assert_eq!(Value::from(vec![1u32, 2]).describe(), "array of u32");
        assert_eq!(Value::Array(vec![]).describe(), "empty array");
        assert_eq!(Value::from("s").type_name(), "string");
    }
}

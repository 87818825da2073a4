//! JSON values as native Arrow columns, exactly or not at all.
//!
//! A JSON value gets the Arrow type that holds it with nothing added: an
//! object a struct of its keys (in order), an array a list whose element
//! type unifies its elements', a string utf8, an integer int64, any other
//! number float64, a boolean bool, null the null type. Elements of one list
//! share a type, so unifying adds keys (as nulls) to objects that lack them,
//! widens integers to floats, or fails (a string and an object). Callers
//! build the array, decode it back ([`value_at`]) and compare with the
//! original ([`same`]): only values that come back identical, key order
//! included, are written natively.
//!
//! Also: the `arrow.json` canonical extension type (a utf8 field whose
//! metadata names it), set by hand on the field.

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, ListArray, NullArray,
    StringArray, StructArray,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::{DataType, Field, Fields, Float64Type, Int64Type};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// Field metadata key naming an extension type.
pub const EXTENSION_NAME_KEY: &str = "ARROW:extension:name";
/// Field metadata key of an extension type's parameters.
pub const EXTENSION_METADATA_KEY: &str = "ARROW:extension:metadata";
/// The canonical JSON extension type: utf8 storage, one JSON text per value.
pub const JSON_EXTENSION: &str = "arrow.json";

/// A utf8 field typed `arrow.json` (each value one JSON text).
pub fn json_field(name: &str, nullable: bool) -> Field {
    Field::new(name, DataType::Utf8, nullable).with_metadata(HashMap::from([
        (EXTENSION_NAME_KEY.to_owned(), JSON_EXTENSION.to_owned()),
        (EXTENSION_METADATA_KEY.to_owned(), String::new()),
    ]))
}

/// Why a value has no exact native form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotNative {
    /// Elements of one list whose types cannot share one Arrow type.
    #[error("list elements of incompatible types ({0} and {1})")]
    Incompatible(String, String),
    /// An empty object (Parquet cannot store a struct without fields).
    #[error("an empty object")]
    EmptyObject,
    /// The value read back differs from the original (keys added, numbers widened, order).
    #[error("the value read back differs from the original")]
    Changed,
    /// Building the Arrow array failed.
    #[error("cannot build the array: {0}")]
    Arrow(String),
}

fn item(t: DataType) -> Arc<Field> {
    Arc::new(Field::new("item", t, true))
}

/// The Arrow type holding `v` (see the module docs).
pub fn infer(v: &Value) -> Result<DataType, NotNative> {
    Ok(match v {
        Value::Null => DataType::Null,
        Value::Bool(_) => DataType::Boolean,
        Value::Number(n) if n.is_i64() => DataType::Int64,
        Value::Number(_) => DataType::Float64,
        Value::String(_) => DataType::Utf8,
        Value::Array(a) => {
            let mut t = DataType::Null;
            for e in a {
                t = unify(&t, &infer(e)?)?;
            }
            DataType::List(item(t))
        }
        Value::Object(m) => {
            if m.is_empty() {
                return Err(NotNative::EmptyObject);
            }
            let mut f = Vec::with_capacity(m.len());
            for (k, x) in m {
                f.push(Field::new(k, infer(x)?, true));
            }
            DataType::Struct(Fields::from(f))
        }
    })
}

/// One type for two list elements, or why there is none.
pub fn unify(a: &DataType, b: &DataType) -> Result<DataType, NotNative> {
    use DataType::*;
    Ok(match (a, b) {
        (x, y) if x == y => x.clone(),
        (Null, x) | (x, Null) => x.clone(),
        (Int64, Float64) | (Float64, Int64) => Float64,
        (List(x), List(y)) => List(item(unify(x.data_type(), y.data_type())?)),
        (Struct(x), Struct(y)) => {
            let mut out: Vec<Field> = x.iter().map(|f| f.as_ref().clone()).collect();
            for f in y.iter() {
                match out.iter_mut().find(|o| o.name() == f.name()) {
                    Some(o) => {
                        let t = unify(o.data_type(), f.data_type())?;
                        *o = Field::new(f.name(), t, true);
                    }
                    None => out.push(f.as_ref().clone()),
                }
            }
            Struct(Fields::from(out))
        }
        (x, y) => return Err(NotNative::Incompatible(x.to_string(), y.to_string())),
    })
}

/// Build an array of type `t` from values (`None` or JSON null: a null slot).
/// A value that does not fit `t` becomes null (and fails [`same`] later).
pub fn build(t: &DataType, vals: &[Option<&Value>]) -> Result<ArrayRef, NotNative> {
    let present = |v: &Option<&Value>| v.is_some_and(|v| !v.is_null());
    Ok(match t {
        DataType::Null => Arc::new(NullArray::new(vals.len())),
        DataType::Boolean => Arc::new(BooleanArray::from_iter(
            vals.iter().map(|v| v.and_then(Value::as_bool)),
        )),
        DataType::Int64 => Arc::new(Int64Array::from_iter(
            vals.iter().map(|v| v.and_then(Value::as_i64)),
        )),
        DataType::Float64 => Arc::new(Float64Array::from_iter(
            vals.iter().map(|v| v.and_then(Value::as_f64)),
        )),
        DataType::Utf8 => Arc::new(StringArray::from_iter(
            vals.iter().map(|v| v.and_then(Value::as_str)),
        )),
        DataType::List(f) => {
            let lists: Vec<Option<&Vec<Value>>> =
                vals.iter().map(|v| v.and_then(Value::as_array)).collect();
            let children: Vec<Option<&Value>> = lists
                .iter()
                .flatten()
                .flat_map(|a| a.iter())
                .map(Some)
                .collect();
            let child = build(f.data_type(), &children)?;
            Arc::new(
                ListArray::try_new(
                    f.clone(),
                    OffsetBuffer::from_lengths(lists.iter().map(|a| a.map_or(0, Vec::len))),
                    child,
                    Some(NullBuffer::from_iter(lists.iter().map(Option::is_some))),
                )
                .map_err(|e| NotNative::Arrow(e.to_string()))?,
            )
        }
        DataType::Struct(fields) => {
            let objs: Vec<Option<&Map<String, Value>>> =
                vals.iter().map(|v| v.and_then(Value::as_object)).collect();
            let mut cols = Vec::with_capacity(fields.len());
            for f in fields.iter() {
                let col: Vec<Option<&Value>> = objs
                    .iter()
                    .map(|o| o.and_then(|o| o.get(f.name())))
                    .collect();
                cols.push(build(f.data_type(), &col)?);
            }
            let nulls = NullBuffer::from_iter(vals.iter().map(present));
            Arc::new(
                StructArray::try_new(fields.clone(), cols, Some(nulls))
                    .map_err(|e| NotNative::Arrow(e.to_string()))?,
            )
        }
        other => return Err(NotNative::Arrow(format!("unsupported type {other}"))),
    })
}

/// Read slot `i` of an array built by [`build`] back as JSON (what a reader
/// converting Arrow to Python objects sees: every struct field present).
pub fn value_at(a: &dyn Array, i: usize) -> Value {
    if i >= a.len() || a.is_null(i) {
        return Value::Null;
    }
    match a.data_type() {
        DataType::Boolean => a
            .as_boolean_opt()
            .map_or(Value::Null, |b| Value::Bool(b.value(i))),
        DataType::Int64 => a
            .as_primitive_opt::<Int64Type>()
            .map_or(Value::Null, |x| Value::from(x.value(i))),
        DataType::Float64 => a
            .as_primitive_opt::<Float64Type>()
            .and_then(|x| serde_json::Number::from_f64(x.value(i)))
            .map_or(Value::Null, Value::Number),
        DataType::Utf8 => a
            .as_string_opt::<i32>()
            .map_or(Value::Null, |s| Value::from(s.value(i))),
        DataType::List(_) => a.as_list_opt::<i32>().map_or(Value::Null, |l| {
            let v = l.value(i);
            Value::Array((0..v.len()).map(|j| value_at(v.as_ref(), j)).collect())
        }),
        DataType::Struct(fields) => a.as_struct_opt().map_or(Value::Null, |s| {
            Value::Object(
                fields
                    .iter()
                    .zip(s.columns())
                    .map(|(f, c)| (f.name().clone(), value_at(c.as_ref(), i)))
                    .collect(),
            )
        }),
        _ => Value::Null,
    }
}

/// Exactly equal: same keys in the same order, numbers of the same kind.
pub fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y.iter())
                    .all(|((ka, va), (kb, vb))| ka == kb && same(va, vb))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (x, y) => x == y,
    }
}

/// `v` as a one-slot native array, if it reads back exactly.
pub fn exact(v: &Value) -> Result<(DataType, ArrayRef), NotNative> {
    let t = infer(v)?;
    let a = build(&t, &[Some(v)])?;
    if !same(&value_at(a.as_ref(), 0), v) {
        return Err(NotNative::Changed);
    }
    Ok((t, a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_of_one_shape_read_back_exactly() {
        for v in [
            json!([{"type": "function", "function": {"name": "bash", "parameters":
                {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]),
            json!([{"a": 1, "b": null, "c": [1.5, 2.5], "d": true}, {"a": 2, "b": null, "c": [], "d": false}]),
            json!([]),
            json!([null, "x"]),
        ] {
            let (_, a) = exact(&v).unwrap_or_else(|e| panic!("{v}: {e}"));
            assert!(same(&value_at(a.as_ref(), 0), &v));
        }
    }

    #[test]
    fn unification_that_changes_a_value_is_caught() {
        // Two tools whose parameters differ: the first would gain "path": null.
        let tools = json!([
            {"name": "bash", "parameters": {"command": {"type": "string"}}},
            {"name": "write", "parameters": {"path": {"type": "string"}}},
        ]);
        assert_eq!(exact(&tools).err(), Some(NotNative::Changed));
        // An integer next to a float would be widened.
        assert_eq!(exact(&json!([1, 2.5])).err(), Some(NotNative::Changed));
        // Keys in another order come back in the first element's order.
        assert_eq!(
            exact(&json!([{"a": 1, "b": 2}, {"b": 3, "a": 4}])).err(),
            Some(NotNative::Changed)
        );
        assert!(matches!(
            exact(&json!([{"a": 1}, "x"])),
            Err(NotNative::Incompatible(..))
        ));
        assert_eq!(exact(&json!({})).err(), Some(NotNative::EmptyObject));
        assert_eq!(
            exact(&json!([{"p": {}}])).err(),
            Some(NotNative::EmptyObject)
        );
        // u64 beyond i64 is a float in Arrow: not exact.
        assert_eq!(exact(&json!([u64::MAX])).err(), Some(NotNative::Changed));
    }

    #[test]
    fn same_is_order_and_kind_sensitive() {
        assert!(same(&json!({"a": 1, "b": 2}), &json!({"a": 1, "b": 2})));
        assert!(!same(&json!({"a": 1, "b": 2}), &json!({"b": 2, "a": 1})));
        assert!(!same(&json!(1), &json!(1.0)));
        assert!(!same(&json!({"a": 1}), &json!({"a": 1, "b": null})));
    }

    #[test]
    fn json_field_names_the_extension() {
        let f = json_field("tools", true);
        assert_eq!(f.data_type(), &DataType::Utf8);
        assert_eq!(
            f.metadata().get(EXTENSION_NAME_KEY).map(String::as_str),
            Some(JSON_EXTENSION)
        );
    }
}

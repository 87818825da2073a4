//! Chat messages of an SFT sample ([`Msg`], [`ToolCall`]), normalized from
//! the recorded JSON, and their Arrow `messages` column: its type, built
//! from rows of messages, and read back (Orchard import).

use super::Arguments;
use crate::export::native::json_field;
use crate::export::trajectory::compare::content_text;
use arrow::array::{Array, ArrayRef, ListArray, StringArray, StructArray};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::{DataType, Field, Fields};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// One tool call of a message.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub kind: String,
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    /// The arguments as a JSON value, and whether they were valid JSON
    /// (if not: the model's string as a JSON string).
    pub fn arguments_value(&self) -> (Value, bool) {
        match serde_json::from_str::<Value>(&self.arguments) {
            Ok(v) => (v, true),
            Err(_) => (Value::String(self.arguments.clone()), false),
        }
    }

    /// The `arrow.json` text of the arguments in object mode: the model's
    /// text when it is JSON, else the model's string as a JSON string.
    pub fn arguments_json_text(&self) -> String {
        match serde_json::from_str::<Value>(&self.arguments) {
            Ok(_) => self.arguments.clone(),
            Err(_) => Value::String(self.arguments.clone()).to_string(),
        }
    }
}

/// One chat message, content as text.
#[derive(Debug, Clone, PartialEq)]
pub struct Msg {
    pub role: String,
    pub content: String,
    pub tool_calls: Option<Vec<ToolCall>>,
    pub tool_call_id: Option<String>,
    pub reasoning_content: Option<String>,
}

impl Msg {
    /// A normalized chat message (from the `messages` / `response_message` columns).
    pub fn from_value(v: &Value) -> Msg {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let tool_calls = v.get("tool_calls").and_then(Value::as_array).and_then(|a| {
            (!a.is_empty()).then(|| {
                a.iter()
                    .map(|c| {
                        let f = c.get("function").unwrap_or(c);
                        ToolCall {
                            id: c.get("id").and_then(Value::as_str).unwrap_or("").to_owned(),
                            kind: c
                                .get("type")
                                .and_then(Value::as_str)
                                .unwrap_or("function")
                                .to_owned(),
                            name: f
                                .get("name")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_owned(),
                            arguments: match f.get("arguments") {
                                Some(Value::String(a)) => a.clone(),
                                None | Some(Value::Null) => "{}".to_owned(),
                                Some(a) => a.to_string(),
                            },
                        }
                    })
                    .collect()
            })
        });
        Msg {
            role: s("role").unwrap_or_else(|| "user".into()),
            content: content_text(v.get("content")),
            tool_calls,
            tool_call_id: s("tool_call_id"),
            reasoning_content: s("reasoning_content").filter(|r| !r.is_empty()),
        }
    }

    /// As a JSON object with every key present (null where absent), so
    /// readers infer one schema for all rows.
    pub fn to_value(&self, with_reasoning: bool) -> Value {
        self.to_value_with(with_reasoning, Arguments::String)
    }

    /// As [`Msg::to_value`], arguments written as `args` says.
    pub fn to_value_with(&self, with_reasoning: bool, args: Arguments) -> Value {
        let mut m = Map::new();
        m.insert("role".into(), json!(self.role));
        m.insert("content".into(), json!(self.content));
        m.insert(
            "tool_calls".into(),
            match &self.tool_calls {
                Some(c) => Value::Array(
                    c.iter()
                        .map(|c| {
                            let a = match args {
                                Arguments::Object => c.arguments_value().0,
                                Arguments::String => json!(c.arguments),
                            };
                            json!({"id": c.id, "type": c.kind, "function": {"name": c.name, "arguments": a}})
                        })
                        .collect(),
                ),
                None => Value::Null,
            },
        );
        m.insert("tool_call_id".into(), json!(self.tool_call_id));
        if with_reasoning {
            m.insert("reasoning_content".into(), json!(self.reasoning_content));
        }
        Value::Object(m)
    }
}

fn function_fields(args: Arguments) -> Fields {
    Fields::from(vec![
        Field::new("name", DataType::Utf8, true),
        match args {
            Arguments::Object => json_field("arguments", true),
            Arguments::String => Field::new("arguments", DataType::Utf8, true),
        },
    ])
}

fn tool_call_fields(args: Arguments) -> Fields {
    Fields::from(vec![
        Field::new("id", DataType::Utf8, true),
        Field::new("type", DataType::Utf8, true),
        Field::new("function", DataType::Struct(function_fields(args)), true),
    ])
}

fn message_fields(with_reasoning: bool, args: Arguments) -> Fields {
    let mut f = vec![
        Field::new("role", DataType::Utf8, true),
        Field::new("content", DataType::Utf8, true),
        Field::new(
            "tool_calls",
            DataType::List(Arc::new(Field::new(
                "item",
                DataType::Struct(tool_call_fields(args)),
                true,
            ))),
            true,
        ),
        Field::new("tool_call_id", DataType::Utf8, true),
    ];
    if with_reasoning {
        f.push(Field::new("reasoning_content", DataType::Utf8, true));
    }
    Fields::from(f)
}

/// The Arrow type of a `messages` column: list<struct<role, content,
/// tool_calls: list<struct<id, type, function: struct<name, arguments>>>,
/// tool_call_id[, reasoning_content]>>.
pub fn messages_type(with_reasoning: bool) -> DataType {
    messages_type_with(with_reasoning, Arguments::String)
}

/// As [`messages_type`], `arguments` typed as `args` says (`arrow.json` for objects).
pub fn messages_type_with(with_reasoning: bool, args: Arguments) -> DataType {
    DataType::List(Arc::new(Field::new(
        "item",
        DataType::Struct(message_fields(with_reasoning, args)),
        true,
    )))
}

pub(super) fn offsets(lens: impl Iterator<Item = usize>) -> OffsetBuffer<i32> {
    OffsetBuffer::from_lengths(lens)
}

/// Build a `messages` column from rows of messages.
pub fn messages_array(rows: &[&[Msg]], with_reasoning: bool) -> ArrayRef {
    messages_array_with(rows, with_reasoning, Arguments::String)
}

/// As [`messages_array`], arguments written as `args` says.
pub fn messages_array_with(rows: &[&[Msg]], with_reasoning: bool, args: Arguments) -> ArrayRef {
    let all: Vec<&Msg> = rows.iter().flat_map(|r| r.iter()).collect();
    let calls: Vec<&ToolCall> = all
        .iter()
        .flat_map(|m| m.tool_calls.iter().flatten())
        .collect();
    let arguments: Vec<String> = match args {
        Arguments::Object => calls.iter().map(|c| c.arguments_json_text()).collect(),
        Arguments::String => calls.iter().map(|c| c.arguments.clone()).collect(),
    };
    let function = StructArray::new(
        function_fields(args),
        vec![
            Arc::new(StringArray::from_iter_values(calls.iter().map(|c| &c.name))) as ArrayRef,
            Arc::new(StringArray::from_iter_values(arguments)),
        ],
        None,
    );
    let call_struct = StructArray::new(
        tool_call_fields(args),
        vec![
            Arc::new(StringArray::from_iter_values(calls.iter().map(|c| &c.id))) as ArrayRef,
            Arc::new(StringArray::from_iter_values(calls.iter().map(|c| &c.kind))),
            Arc::new(function),
        ],
        None,
    );
    let tool_calls = ListArray::new(
        Arc::new(Field::new(
            "item",
            DataType::Struct(tool_call_fields(args)),
            true,
        )),
        offsets(
            all.iter()
                .map(|m| m.tool_calls.as_ref().map_or(0, Vec::len)),
        ),
        Arc::new(call_struct),
        Some(NullBuffer::from_iter(
            all.iter().map(|m| m.tool_calls.is_some()),
        )),
    );
    let mut cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(all.iter().map(|m| &m.role))),
        Arc::new(StringArray::from_iter_values(
            all.iter().map(|m| &m.content),
        )),
        Arc::new(tool_calls),
        Arc::new(StringArray::from_iter(
            all.iter().map(|m| m.tool_call_id.as_deref()),
        )),
    ];
    if with_reasoning {
        cols.push(Arc::new(StringArray::from_iter(
            all.iter().map(|m| m.reasoning_content.as_deref()),
        )));
    }
    let msgs = StructArray::new(message_fields(with_reasoning, args), cols, None);
    Arc::new(ListArray::new(
        Arc::new(Field::new(
            "item",
            DataType::Struct(message_fields(with_reasoning, args)),
            true,
        )),
        offsets(rows.iter().map(|r| r.len())),
        Arc::new(msgs),
        None,
    ))
}

/// Read a `messages` column back (Orchard import, tests).
pub fn messages_from_array(a: &dyn Array, row: usize) -> Option<Vec<Value>> {
    use arrow::array::AsArray;
    if a.is_null(row) {
        return None;
    }
    let list = a.as_list_opt::<i32>()?.value(row);
    let st = list.as_struct_opt()?;
    let field = |name: &str| st.column_by_name(name);
    let text = |c: Option<&ArrayRef>, i: usize| -> Value {
        match c {
            Some(c) if !c.is_null(i) => c
                .as_string_opt::<i32>()
                .map_or(Value::Null, |s| json!(s.value(i))),
            _ => Value::Null,
        }
    };
    let mut out = Vec::with_capacity(st.len());
    for i in 0..st.len() {
        let mut m = Map::new();
        m.insert("role".into(), text(field("role"), i));
        m.insert("content".into(), text(field("content"), i));
        if let Some(tc) = field("tool_calls").filter(|c| !c.is_null(i)) {
            let calls = tc.as_list_opt::<i32>().map(|l| l.value(i));
            if let Some(cs) = calls.as_ref().and_then(|c| c.as_struct_opt()) {
                let f = cs
                    .column_by_name("function")
                    .and_then(|f| f.as_struct_opt());
                let v: Vec<Value> = (0..cs.len())
                    .map(|j| {
                        json!({
                            "id": text(cs.column_by_name("id"), j),
                            "type": text(cs.column_by_name("type"), j),
                            "function": {
                                "name": f.map_or(Value::Null, |f| text(f.column_by_name("name"), j)),
                                "arguments": f.map_or(Value::Null, |f| text(f.column_by_name("arguments"), j)),
                            }
                        })
                    })
                    .collect();
                m.insert("tool_calls".into(), Value::Array(v));
            }
        }
        let id = text(field("tool_call_id"), i);
        if !id.is_null() {
            m.insert("tool_call_id".into(), id);
        }
        let r = text(field("reasoning_content"), i);
        if !r.is_null() {
            m.insert("reasoning_content".into(), r);
        }
        out.push(Value::Object(m));
    }
    Some(out)
}

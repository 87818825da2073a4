//! Tests of the SFT export: messages, arguments, and the generic and verl files.

use super::generic::*;
use super::messages::*;
use super::verl::*;
use super::*;
use crate::export::native;
use arrow::datatypes::{DataType, Field};
use serde_json::json;

#[test]
fn messages_column_round_trips() {
    let v = [
        json!({"role": "user", "content": [{"type": "text", "text": "hi"}]}),
        json!({"role": "assistant", "content": null, "reasoning_content": "think",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "c", "content": "x"}),
    ];
    let msgs: Vec<Msg> = v.iter().map(Msg::from_value).collect();
    assert_eq!(msgs[0].content, "hi");
    assert_eq!(msgs[1].content, "");
    let a = messages_array(&[&msgs, &[]], true);
    let back = messages_from_array(a.as_ref(), 0).expect("row");
    let again: Vec<Msg> = back.iter().map(Msg::from_value).collect();
    assert_eq!(again, msgs);
    assert_eq!(messages_from_array(a.as_ref(), 1), Some(vec![]));
}

fn sample(id: &str, msgs: Vec<Value>, tools: Option<Value>) -> SftSample {
    SftSample {
        sample_id: id.into(),
        rollout_id: id.into(),
        segment: 0,
        loss_weights: msgs.iter().map(|_| 0.0).collect(),
        messages: msgs.iter().map(Msg::from_value).collect(),
        tools_text: tools.as_ref().map(Value::to_string),
        tools,
        reward: None,
        status: None,
        model: None,
        harness: None,
        rule: "full".into(),
        group: id.into(),
        sequences: vec![0],
    }
}

fn call(id: &str, name: &str, args: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
}

fn bash_tool() -> Value {
    json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object",
        "properties": {"command": {"type": "string"}}, "required": ["command"]}}}])
}

#[test]
fn arguments_as_objects_or_strings() {
    let m = Msg::from_value(&json!({"role": "assistant", "content": "",
        "tool_calls": [call("a", "bash", "{\"command\": \"ls\"}"), call("b", "bash", "ls -la")]}));
    let o = m.to_value_with(true, Arguments::Object);
    assert_eq!(
        o["tool_calls"][0]["function"]["arguments"],
        json!({"command": "ls"})
    );
    assert_eq!(o["tool_calls"][1]["function"]["arguments"], json!("ls -la"));
    let s = m.to_value_with(true, Arguments::String);
    assert_eq!(
        s["tool_calls"][0]["function"]["arguments"],
        json!("{\"command\": \"ls\"}")
    );
    let calls = m.tool_calls.clone().unwrap_or_default();
    // The arrow.json text: the model's JSON text, or a JSON string of its text.
    assert_eq!(calls[0].arguments_json_text(), "{\"command\": \"ls\"}");
    assert_eq!(calls[1].arguments_json_text(), "\"ls -la\"");
    let smp = sample(
        "r",
        vec![
            json!({"role": "user", "content": "x"}),
            json!({"role": "assistant", "tool_calls": [call("a", "bash", "{}"), call("b", "bash", "{nope")]}),
        ],
        None,
    );
    assert_eq!(arguments_not_json(&smp), 1);
}

#[test]
fn sft_parquet_types_tools_and_arguments_as_arrow_json() {
    use arrow::array::AsArray;
    let tools = bash_tool();
    let s = sample(
        "r",
        vec![
            json!({"role": "user", "content": "x"}),
            json!({"role": "assistant", "tool_calls": [call("a", "bash", "{\"command\":\"ls\"}")]}),
        ],
        Some(tools),
    );
    // Recorded text with its own spacing is kept byte for byte.
    let s = SftSample {
        tools_text: Some("[ {\"type\": \"function\"} ]".into()),
        ..s
    };
    for args in [Arguments::Object, Arguments::String] {
        let b = sft_batch(std::slice::from_ref(&s), args).expect("batch");
        let schema = b.schema();
        let ext = |f: &Field| f.metadata().get(native::EXTENSION_NAME_KEY).cloned();
        let tf = schema.field_with_name("tools").expect("tools");
        assert_eq!(ext(tf).as_deref(), Some("arrow.json"));
        let tools = b.column_by_name("tools").expect("tools").as_string::<i32>();
        assert_eq!(tools.value(0), "[ {\"type\": \"function\"} ]");
        let DataType::List(m) = schema
            .field_with_name("messages")
            .expect("m")
            .data_type()
            .clone()
        else {
            panic!("messages is a list");
        };
        let DataType::Struct(mf) = m.data_type() else {
            panic!("struct")
        };
        let (_, tc) = mf.find("tool_calls").expect("tool_calls");
        let DataType::List(tci) = tc.data_type() else {
            panic!("list")
        };
        let DataType::Struct(tcf) = tci.data_type() else {
            panic!("struct")
        };
        let (_, f) = tcf.find("function").expect("function");
        let DataType::Struct(ff) = f.data_type() else {
            panic!("struct")
        };
        let (_, a) = ff.find("arguments").expect("arguments");
        assert_eq!(ext(a).is_some(), args == Arguments::Object, "{args:?}");
    }
}

#[test]
fn verl_rows_are_native_and_exact_or_fall_back() {
    let user = json!({"role": "user", "content": "x"});
    // One argument shape: native objects.
    let one = sample(
        "a",
        vec![
            user.clone(),
            json!({"role": "assistant", "tool_calls": [
        call("1", "bash", "{\"command\": \"ls\"}"), call("2", "bash", "{\"command\": \"pwd\"}")]}),
        ],
        Some(bash_tool()),
    );
    let ((m_ty, t_ty), row, as_string) = verl_row(one, Arguments::Object).expect("native");
    assert!(!as_string);
    assert_eq!(
        row.messages[1]["tool_calls"][1]["function"]["arguments"],
        json!({"command": "pwd"})
    );
    assert!(m_ty.to_string().contains("command"), "{m_ty}");
    assert!(t_ty.to_string().contains("required"), "{t_ty}");
    let a = native::build(&m_ty, &[Some(&row.messages)]).expect("build");
    assert!(native::same(
        &native::value_at(a.as_ref(), 0),
        &row.messages
    ));
    // Two shapes in one row would unify (a key added as null): strings.
    let two = sample(
        "b",
        vec![
            user.clone(),
            json!({"role": "assistant", "tool_calls": [
        call("1", "bash", "{\"command\": \"ls\"}"), call("2", "write", "{\"path\": \"a\", \"text\": \"b\"}")]}),
        ],
        None,
    );
    let ((m_ty, t_ty), row, as_string) = verl_row(two, Arguments::Object).expect("strings");
    assert!(as_string);
    assert_eq!(
        t_ty.to_string(),
        DataType::new_list(DataType::Null, true).to_string(),
        "no tools: an empty list"
    );
    assert_eq!(
        row.messages[1]["tool_calls"][1]["function"]["arguments"],
        json!("{\"path\": \"a\", \"text\": \"b\"}")
    );
    assert!(!m_ty.to_string().contains("command"), "{m_ty}");
    // Empty arguments have no native form either.
    let empty = sample(
        "c",
        vec![
            user.clone(),
            json!({"role": "assistant", "tool_calls": [call("1", "now", "{}")]}),
        ],
        None,
    );
    assert!(verl_row(empty, Arguments::Object).expect("strings").2);
    // Tools whose parameters differ within the row: left out.
    let tools = json!([
        {"type": "function", "function": {"name": "bash", "parameters": {"properties": {"command": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "write", "parameters": {"properties": {"path": {"type": "string"}}}}},
    ]);
    assert!(verl_row(sample("d", vec![user], Some(tools)), Arguments::Object).is_none());
}

#[test]
fn verl_files_split_by_type_and_stale_parts_go() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::create_dir_all(dir.path().join("verl")).expect("mkdir");
    std::fs::write(dir.path().join("verl/sft-00007.parquet"), b"old").expect("stale");
    std::fs::write(dir.path().join("verl/notes.txt"), b"mine").expect("other");
    let mut w = VerlWriter::create(dir.path(), Arguments::Object).expect("create");
    let mut c = SftCounts::default();
    let user = json!({"role": "user", "content": "x"});
    let asst = |args: &str| json!({"role": "assistant", "tool_calls": [call("1", "bash", args)]});
    w.push(
        sample(
            "a",
            vec![user.clone(), asst("{\"command\": \"ls\"}")],
            Some(bash_tool()),
        ),
        &mut c,
    )
    .expect("a");
    w.push(
        sample("b", vec![user.clone(), asst("{\"path\": \"x\"}")], None),
        &mut c,
    )
    .expect("b");
    w.push(
        sample(
            "c",
            vec![user.clone(), asst("{\"command\": \"pwd\"}")],
            Some(bash_tool()),
        ),
        &mut c,
    )
    .expect("c");
    let files = w.finish().expect("finish");
    assert_eq!(
        files,
        vec!["verl/sft-00000.parquet", "verl/sft-00001.parquet"]
    );
    assert_eq!(
        (c.verl_samples, c.verl_skipped, c.verl_arguments_as_string),
        (3, 0, 0)
    );
    assert!(!dir.path().join("verl/sft-00007.parquet").exists());
    assert!(dir.path().join("verl/notes.txt").exists());
    let f = std::fs::File::open(dir.path().join("verl/sft-00000.parquet")).expect("open");
    let r = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .expect("reader")
        .build()
        .expect("build");
    let rows: usize = r.map(|b| b.expect("batch").num_rows()).sum();
    assert_eq!(rows, 2);
    assert!(
        is_verl_part("sft-00012.parquet")
            && !is_verl_part("sft-1.parquet")
            && !is_verl_part("x.parquet")
    );
}

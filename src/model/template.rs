//! The chat template stored in a GGUF file (`tokenizer.chat_template`),
//! rendered with minijinja the way `transformers` renders it (trim_blocks,
//! lstrip_blocks, Python string methods, `raise_exception`).
//!
//! Templates that know nothing of tools (SmolLM2's among them) still get
//! tool calling: the tools are described in the system message in the
//! Hermes format that Qwen and most open models use, earlier tool calls are
//! written back as `<tool_call>` blocks and tool results as
//! `<tool_response>` user turns. [`super::tools`] parses the same format
//! out of the model's answer.

use super::ModelError;
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{json, Map, Value};

pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template handles `tools` and `tool_calls` itself.
    native_tools: bool,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, ModelError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ModelError::Template(e.to_string()))?;
        env.set_syntax(syntax);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| ModelError::Template(e.to_string()))?;
        Ok(Self {
            env,
            native_tools: source.contains("tools") && source.contains("tool_calls"),
            bos: bos.into(),
            eos: eos.into(),
        })
    }

    /// The prompt for `messages` (Chat Completions shape) and `tools`, with
    /// the assistant's turn opened.
    pub fn render(&self, messages: &[Value], tools: &[Value]) -> Result<String, ModelError> {
        self.render_with(messages, tools, true)
    }

    /// The prompt, with or without the assistant's turn opened.
    pub fn render_with(
        &self,
        messages: &[Value],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        let messages: Vec<Value> = if self.native_tools {
            messages.iter().map(flatten_content).collect()
        } else {
            hermes_messages(messages, tools)
        };
        let mut ctx = json!({
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos,
            "eos_token": self.eos,
        });
        if self.native_tools && !tools.is_empty() {
            ctx["tools"] = Value::Array(tools.to_vec());
        }
        self.env
            .get_template("chat")
            .and_then(|t| t.render(minijinja::value::Serde(ctx)))
            .map_err(|e| ModelError::Template(e.to_string()))
    }
}

/// A message whose content is a list of parts, with the text parts joined
/// by newlines (what vLLM does for string-content templates).
fn flatten_content(m: &Value) -> Value {
    let mut m = m.clone();
    if let Some(parts) = m.get("content").and_then(Value::as_array) {
        let text: Vec<&str> = parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect();
        m["content"] = Value::String(text.join("\n"));
    }
    if m.get("content").is_none_or(Value::is_null) {
        m["content"] = Value::String(String::new());
    }
    m
}

fn text(m: &Value) -> String {
    flatten_content(m)["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The system-prompt section that offers `tools` in the Hermes format.
pub fn tools_prompt(tools: &[Value]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools {
        s.push('\n');
        s.push_str(&t.to_string());
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    s
}

/// Messages rewritten for a template without tool support: tools offered in
/// the system message, tool calls as `<tool_call>` text, tool results as
/// user turns in `<tool_response>` tags (consecutive results share a turn).
fn hermes_messages(messages: &[Value], tools: &[Value]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(messages.len() + 1);
    let mut system_seen = false;
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        match role {
            "system" | "developer" if !system_seen && out.is_empty() => {
                system_seen = true;
                let mut content = text(m);
                if !tools.is_empty() {
                    content.push_str("\n\n");
                    content.push_str(&tools_prompt(tools));
                }
                out.push(json!({"role": "system", "content": content}));
            }
            "assistant" => {
                let mut content = text(m);
                for call in m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let f = &call["function"];
                    let args = match &f["arguments"] {
                        Value::String(s) => {
                            serde_json::from_str(s).unwrap_or(Value::String(s.clone()))
                        }
                        other => other.clone(),
                    };
                    if !content.is_empty() {
                        content.push('\n');
                    }
                    let mut call = Map::new();
                    call.insert("name".into(), f["name"].clone());
                    call.insert("arguments".into(), args);
                    content.push_str(&format!(
                        "<tool_call>\n{}\n</tool_call>",
                        Value::Object(call)
                    ));
                }
                out.push(json!({"role": "assistant", "content": content}));
            }
            "tool" => {
                let response = format!("<tool_response>\n{}\n</tool_response>", text(m));
                match out.last_mut() {
                    Some(last)
                        if last["role"] == "user"
                            && last["content"]
                                .as_str()
                                .is_some_and(|c| c.ends_with("</tool_response>")) =>
                    {
                        let c = format!("{}\n{response}", last["content"].as_str().unwrap_or(""));
                        last["content"] = Value::String(c);
                    }
                    _ => out.push(json!({"role": "user", "content": response})),
                }
            }
            other => {
                let role = if other == "developer" {
                    "system"
                } else {
                    other
                };
                out.push(json!({"role": role, "content": text(m)}));
            }
        }
    }
    if !system_seen && !tools.is_empty() {
        out.insert(0, json!({"role": "system", "content": tools_prompt(tools)}));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOL: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_the_smollm2_template() {
        let t = ChatTemplate::new(SMOL, "<|im_start|>", "<|im_end|>").unwrap();
        let p = t
            .render(
                &[json!({"role": "user", "content": [{"type": "text", "text": "hi"}]})],
                &[],
            )
            .unwrap();
        assert_eq!(
            p,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn tools_go_into_the_system_message_and_history_into_text() {
        let t = ChatTemplate::new(SMOL, "", "").unwrap();
        let tools = [json!({"type": "function", "function": {"name": "bash", "parameters": {}}})];
        let p = t
            .render(
                &[
                    json!({"role": "system", "content": "Be brief."}),
                    json!({"role": "user", "content": "list"}),
                    json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}}]}),
                    json!({"role": "tool", "tool_call_id": "c1", "content": "a.txt"}),
                    json!({"role": "tool", "tool_call_id": "c2", "content": "b.txt"}),
                ],
                &tools,
            )
            .unwrap();
        assert!(
            p.starts_with("<|im_start|>system\nBe brief.\n\n# Tools"),
            "{p}"
        );
        assert!(p.contains("<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"bash\",\"parameters\":{}}}\n</tools>"), "{p}");
        assert!(p.contains("<|im_start|>assistant\n<tool_call>\n{\"name\":\"bash\",\"arguments\":{\"command\":\"ls\"}}\n</tool_call><|im_end|>"), "{p}");
        assert!(p.contains("<|im_start|>user\n<tool_response>\na.txt\n</tool_response>\n<tool_response>\nb.txt\n</tool_response><|im_end|>"), "{p}");
    }

    #[test]
    fn native_templates_get_tools_and_python_methods() {
        let src = "{% if tools %}T{{ tools|length }}{% endif %}{% for m in messages %}[{{ m.role|upper }}:{{ m.content.strip() }}{% if m.tool_calls %}+{{ m.tool_calls|length }}{% endif %}]{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let p = t
            .render(
                &[
                    json!({"role": "user", "content": " x "}),
                    json!({"role": "assistant", "content": "", "tool_calls": [{}]}),
                ],
                &[json!({})],
            )
            .unwrap();
        assert_eq!(p, "T1[USER:x][ASSISTANT:+1]");
    }

    #[test]
    fn template_errors_are_reported() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "", "").unwrap();
        let err = t.render(&[], &[]).err().unwrap().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    }
}

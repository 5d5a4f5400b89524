//! Real-world chat templates (llama.cpp's `models/templates/*.jinja`: Llama 3.1, Qwen 2.5,
//! Qwen 3, Phi-3.5, Gemma 2, Mistral Nemo, DeepSeek R1) rendered by ferrite and by
//! transformers' `apply_chat_template` (`tests/fixtures/chat_templates.json`, from
//! `scripts/llm_fixtures.py --only chat`): same text, or an error where transformers raised.

use std::path::PathBuf;

use ferrite_llm::chat::{ChatTemplate, Message};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[test]
fn templates_render_like_transformers() {
    let fx: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("chat_templates.json")).unwrap(),
    )
    .unwrap();
    let vars = &fx["vars"];
    let extra: Vec<(&str, minijinja::Value)> = fx["extra"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str(), minijinja::Value::from_serialize(v)))
        .collect();
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 28, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let name = case["template"].as_str().unwrap();
        let source = std::fs::read_to_string(fixtures().join("templates").join(name)).unwrap();
        let tmpl = ChatTemplate::new(
            &source,
            vars["bos_token"].as_str().unwrap(),
            vars["eos_token"].as_str().unwrap(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let messages: Vec<Message> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let add_gen = case["add_generation_prompt"].as_bool().unwrap();
        let got = tmpl.render_with(&messages, add_gen, &extra);
        match (case.get("rendered").and_then(Value::as_str), got) {
            (Some(want), Ok(got)) if want == got => {}
            (Some(want), Ok(got)) => {
                failures.push(format!("{name}:\n  want {want:?}\n  got  {got:?}"))
            }
            (Some(_), Err(e)) => failures.push(format!("{name}: unexpected error {e}")),
            (None, Ok(got)) => failures.push(format!(
                "{name}: rendered {got:?}, transformers raised {}",
                case["error"]
            )),
            (None, Err(e)) => {
                let want = case["error"].as_str().unwrap();
                if !e.to_string().contains(want) {
                    failures.push(format!("{name}: error {e}, transformers raised {want:?}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

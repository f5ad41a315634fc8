//! The real models' chat templates (as carried in their GGUF files) render with minijinja
//! exactly as Jinja2 renders them with Hugging Face's settings. Golden made by
//! scripts/openai/make_chat_golden.py.

use moonshine::chat::{ChatTemplate, Message};
use serde_json::Value;

#[test]
fn qwen_and_smollm2_templates_render_like_jinja2() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/chat_templates.json"
    ))
    .expect("golden");
    let golden: Vec<Value> = serde_json::from_str(&text).expect("golden json");
    assert_eq!(golden.len(), 2);
    for g in golden {
        let t = ChatTemplate::new(g["template"].as_str().expect("template"), "", "<|im_end|>")
            .expect("compiles");
        for c in g["cases"].as_array().expect("cases") {
            let msgs: Vec<Message> =
                serde_json::from_value(c["messages"].clone()).expect("messages");
            let got = t
                .render(&msgs, c["add_generation_prompt"].as_bool().expect("flag"))
                .expect("renders");
            assert_eq!(
                got,
                c["text"].as_str().expect("text"),
                "{}: {msgs:?}",
                g["model"]
            );
        }
    }
}

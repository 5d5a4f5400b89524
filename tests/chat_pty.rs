//! `ferrite chat` driven through a pseudo-terminal (rexpect), as a user types: commands,
//! Ctrl-C during a reply and at the prompt, history recall (Up arrow), Ctrl-D, the sliding
//! context, and a system message too long for the context. Uses the default model (fetched on
//! first use) with greedy decoding.

use std::process::Command;

use rexpect::session::{spawn_command, PtySession};

/// Generous: the CI machine is shared and a reply streams at tens of tokens a second.
const TIMEOUT_MS: u64 = 120_000;

fn chat(args: &[&str]) -> PtySession {
    assert!(
        ferrite_gguf::fetch::smollm2_135m_instruct_q4_1().is_ok(),
        "fetching the default model failed"
    );
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrite"));
    c.arg("chat")
        .args(["--temp", "0", "--device", "cpu"])
        .args(args);
    let mut p = spawn_command(c, Some(TIMEOUT_MS)).expect("spawn ferrite chat in a pty");
    p.exp_string("chat: type a message").unwrap();
    p.exp_string("> ").unwrap();
    p
}

fn exited_ok(p: &PtySession) -> bool {
    let status = p.process.wait().expect("wait for ferrite");
    format!("{status:?}").ends_with(", 0)")
}

#[test]
fn chat_commands_ctrl_c_history_and_ctrl_d() {
    // --ignore-eos and a large -n keep the reply streaming until Ctrl-C stops it.
    let mut p = chat(&["-n", "2000", "--ignore-eos", "-c", "4096"]);
    p.send_line("/nonsense").unwrap();
    p.exp_string("unknown command /nonsense; /help lists the commands")
        .unwrap();
    p.send_line("/help").unwrap();
    p.exp_string("/save FILE").unwrap();
    p.send_line("Tell me a long story about a dragon.").unwrap();
    // Let the reply start, then stop it: the prompt comes back, the program lives on.
    p.exp_regex(r"[A-Za-z]{3}").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    p.send_control('c').unwrap();
    p.exp_string("(reply stopped)").unwrap();
    p.exp_string("> ").unwrap();
    // Up arrow recalls the last message; Enter sends it again.
    p.send("\x1b[A").unwrap();
    p.flush().unwrap();
    p.exp_string("Tell me a long story about a dragon.")
        .unwrap();
    p.send("\r").unwrap();
    p.flush().unwrap();
    p.exp_regex(r"[A-Za-z]{3}").unwrap();
    p.send_control('c').unwrap();
    p.exp_string("(reply stopped)").unwrap();
    p.exp_string("> ").unwrap();
    // /save writes the conversation; /load reads it back.
    let file = std::env::temp_dir().join(format!("ferrite-chat-{}.json", std::process::id()));
    p.send_line(&format!("/save {}", file.display())).unwrap();
    p.exp_string("(saved 4 messages").unwrap();
    p.send_line(&format!("/load {}", file.display())).unwrap();
    p.exp_string("(loaded 4 messages").unwrap();
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved["messages"][0]["role"], "user");
    assert_eq!(
        saved["messages"][2]["content"],
        "Tell me a long story about a dragon."
    );
    std::fs::remove_file(&file).ok();
    // Ctrl-D at the prompt quits with success.
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();
    assert!(exited_ok(&p));
}

#[test]
fn chat_ctrl_c_at_the_prompt_quits() {
    let mut p = chat(&["-n", "4"]);
    p.send_control('c').unwrap();
    p.exp_eof().unwrap();
    assert!(exited_ok(&p));
}

#[test]
fn chat_context_slides_keeping_the_system_message() {
    let mut p = chat(&[
        "-n",
        "24",
        "-c",
        "128",
        "-sys",
        "You are a helpful assistant.",
    ]);
    let questions = [
        "What is the capital of France?",
        "What is the capital of Japan?",
        "What is the capital of Italy?",
        "What is the capital of Canada?",
        "What is the capital of Australia?",
    ];
    let mut dropped = false;
    for q in questions {
        p.send_line(q).unwrap();
        let (before, _) = p.exp_regex(r"\[\d+ tokens?, [0-9.]+ tok/s\]").unwrap();
        dropped |= before.contains("(context full: dropped the oldest");
        assert!(!before.contains("error"), "{before}");
        p.exp_string("> ").unwrap();
    }
    assert!(dropped, "five turns in 128 tokens must drop the oldest");
    // The system message is still there: /save shows it first.
    let file = std::env::temp_dir().join(format!("ferrite-slide-{}.json", std::process::id()));
    p.send_line(&format!("/save {}", file.display())).unwrap();
    p.exp_string("(saved").unwrap();
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    std::fs::remove_file(&file).ok();
    assert_eq!(saved["messages"][0]["role"], "system");
    assert_eq!(
        saved["messages"][0]["content"],
        "You are a helpful assistant."
    );
    let last = saved["messages"].as_array().unwrap().len() - 2;
    assert_eq!(saved["messages"][last]["content"], questions[4]);
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();
}

#[test]
fn system_message_that_cannot_fit_is_an_error_at_start() {
    assert!(ferrite_gguf::fetch::smollm2_135m_instruct_q4_1().is_ok());
    let long = "You are a helpful assistant. ".repeat(20);
    let o = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["chat", "--device", "cpu", "-c", "64", "-sys", &long])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the system message takes") && err.contains("context size is 64"),
        "{err}"
    );
}

#[test]
fn chat_says_when_a_reply_is_cut_by_the_full_context() {
    // 64 positions: the prompt takes ~35, the reply (end-of-text ignored) runs into the end.
    let mut p = chat(&["-n", "500", "-c", "64", "--ignore-eos"]);
    p.send_line("What is the capital of France?").unwrap();
    p.exp_string("(reply cut: the context of 64 tokens is full")
        .unwrap();
    p.exp_string("> ").unwrap();
    // The next message still gets a reply: the oldest turns make room.
    p.send_line("And of Japan?").unwrap();
    let (before, _) = p.exp_regex(r"\[\d+ tokens?, [0-9.]+ tok/s\]").unwrap();
    assert!(
        before.contains("(context full: dropped the oldest 2 messages)"),
        "{before}"
    );
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();
}

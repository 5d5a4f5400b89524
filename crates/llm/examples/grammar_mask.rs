//! Times grammar-constrained sampling's per-step work on SmolLM2-135M's vocabulary (49,152
//! tokens): building the token trie once, then for each token of a fixed JSON document the
//! mask computed cold (cache cleared: the trie walk) and the whole `process` call as a
//! request sees it (cached masks, applied to a logit row).
//! Usage: cargo run --release -p ferrite-llm --example grammar_mask [REPS]
use std::sync::Arc;
use std::time::Instant;

use ferrite_llm::grammar::{json_object, json_schema_str, GrammarConstraint, TokenTrie};
use ferrite_llm::logits_processor::LogitsProcessor;
use ferrite_llm::tokenizer::Tokenizer;
use ferrite_llm::Model;

const SCHEMA: &str = r##"{"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 40},
  "age": {"type": "integer"},
  "email": {"type": "string"},
  "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
  "address": {"$ref": "#/$defs/address"},
  "status": {"enum": ["active", "inactive", "banned"]}
}, "required": ["name", "age", "tags", "address", "status"], "additionalProperties": false,
"$defs": {"address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": ["string", "null"]}}, "required": ["city", "zip"]}}}"##;

const DOC: &str = r#"{"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["mathematics", "poetry", "engines"], "address": {"city": "London", "zip": null}, "status": "active"}"#;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reps: usize = std::env::args().nth(1).map_or(Ok(3), |s| s.parse())?;
    let path = ferrite_gguf::fetch::smollm2_135m_instruct_q4_1()?;
    let model = Model::load(&path)?;
    let tok = Tokenizer::from_gguf(model.gguf())?;
    let vocab = model.cfg.vocab;
    let t0 = Instant::now();
    let trie = Arc::new(TokenTrie::from_tokenizer(&tok, vocab));
    println!(
        "trie: {} tokens' vocabulary, {} nodes, built in {:.1} ms",
        vocab,
        trie.n_nodes(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    let ids = tok.encode(DOC, false)?;
    for (name, g) in [
        ("json_object", Arc::new(json_object())),
        ("json_schema", Arc::new(json_schema_str(SCHEMA)?)),
    ] {
        let (mut cold, mut step) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let mut c = GrammarConstraint::new(g.clone(), trie.clone(), tok.eog_tokens().to_vec())?;
            let mut logits = vec![0.0f32; vocab];
            for &id in &ids {
                c.clear_cache();
                let t = Instant::now();
                let mask = c.allowed();
                cold.push(t.elapsed().as_secs_f64() * 1e3);
                if mask[id as usize / 64] >> (id % 64) & 1 == 0 {
                    return Err(
                        format!("{name}: token {id} {:?} is masked", tok.token_bytes(id)).into(),
                    );
                }
                logits.fill(0.0);
                let t = Instant::now();
                c.process(&mut logits, &[])?;
                step.push(t.elapsed().as_secs_f64() * 1e3);
                c.accept(id);
            }
            if !c.is_complete() {
                return Err(format!("{name}: the document is not complete").into());
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        println!(
            "{name}: {} tokens x {reps}: cold mask mean {:.3} ms, p50 {:.3}, p99 {:.3}, max {:.3}; process (cached, applied) mean {:.3} ms",
            ids.len(),
            mean(&cold),
            pct(&mut cold.clone(), 0.5),
            pct(&mut cold.clone(), 0.99),
            pct(&mut cold, 1.0),
            mean(&step),
        );
    }
    Ok(())
}

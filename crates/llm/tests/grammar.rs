//! Grammar-constrained sampling on hand-made vocabularies: the recognizer against
//! serde_json on valid and invalid documents, the trie walk's mask against a token-by-token
//! check, random constrained generations that must always parse (and validate against their
//! schema), the end forced when a document is complete, and schema compile errors.

use std::sync::Arc;

use ferrite_llm::grammar::json::validate;
use ferrite_llm::grammar::{
    json_object, json_schema, json_schema_str, Grammar, GrammarConstraint, TokenTrie,
};
use ferrite_llm::logits_processor::LogitsProcessor;
use serde_json::{json, Value};

const EOS: u32 = 0;

/// Token 0 is EOS (no bytes); then every single byte, then multi-byte pieces that cross
/// JSON's structure (`":`, `"}`, `},{`), numbers, escapes, words, and a UTF-8 character
/// split across tokens.
fn vocab() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = vec![Vec::new()];
    v.extend((0..=255u8).map(|b| vec![b]));
    let pieces: &[&[u8]] = &[
        b"{\"",
        b"\":",
        b"\": ",
        b"\",",
        b"\"}",
        b"\"]",
        b"},{",
        b"}}",
        b"]}",
        b", \"",
        b"true",
        b"false",
        b"null",
        b"0.5",
        b"-0",
        b"e+3",
        b"E-",
        b"01",
        b"12",
        b"345",
        b"\\u00",
        b"e9",
        b"\\ud83d",
        b"\\ude00",
        b"\\n",
        b"\\\"",
        b"\\x",
        b"name",
        b"age",
        b"  ",
        b"\n ",
        b"\n\n",
        b"hello world",
        b" the",
        b"\xc3",
        b"\xa9",
        b"\xc3\xa9",
        b"\xe2\x82",
        b"\xac",
        b"\xff",
        b"\x01",
        b"[1,",
        b"[]",
        b"{}",
        b"\"name\"",
        b"\"age\":",
        b"\"tags\":[",
        b"red",
        b"green",
        b"\"red\"",
        b"\"blue\"",
        b"ok\"}",
    ];
    v.extend(pieces.iter().map(|p| p.to_vec()));
    v
}

fn trie(v: &[Vec<u8>]) -> Arc<TokenTrie> {
    let t: Vec<Option<&[u8]>> = v
        .iter()
        .enumerate()
        .map(|(i, b)| (i as u32 != EOS).then_some(b.as_slice()))
        .collect();
    Arc::new(TokenTrie::new(&t, v.len()))
}

fn constraint(g: &Arc<Grammar>, t: &Arc<TokenTrie>) -> GrammarConstraint {
    GrammarConstraint::new(g.clone(), t.clone(), vec![EOS]).unwrap()
}

/// (prefix alive, complete) after `s`.
fn run(g: &Arc<Grammar>, t: &Arc<TokenTrie>, s: &[u8]) -> (bool, bool) {
    let mut c = constraint(g, t);
    let alive = c.advance_bytes(s);
    (alive, c.is_complete())
}

#[test]
fn recognizer_agrees_with_serde_json() {
    let g = Arc::new(json_object());
    let t = trie(&vocab());
    let valid = [
        r#"{}"#,
        r#"{"a":1}"#,
        r#"{"a": -0.5e+3, "b": [1, 2.25, -0, 0, 1E9, true, false, null], "c": {"d": {}}}"#,
        r#"{"s":"esc \" \\ \/ \b \f \n \r \t \u00e9 \ud83d\ude00 é € 😀"}"#,
        "{\n  \"a\": [\n    1\n  ]\n}",
        r#"{"":""}"#,
        r#"{"a":[[],[[]],{}]}"#,
    ];
    for d in valid {
        assert!(serde_json::from_str::<Value>(d).is_ok(), "{d}");
        assert_eq!(run(&g, &t, d.as_bytes()), (true, true), "valid: {d}");
        for i in 0..d.len() {
            assert!(
                run(&g, &t, &d.as_bytes()[..i]).0,
                "prefix of {d}: {i} bytes"
            );
        }
    }
    let invalid: &[&[u8]] = &[
        b"[]",
        b"1",
        b"{\"a\":01}",
        b"{\"a\":.5}",
        b"{\"a\":1.}",
        b"{\"a\":+1}",
        b"{\"a\":\"\\x\"}",
        b"{\"a\":\"\\ud800\"}",
        b"{\"a\":\"\\ude00\"}",
        b"{\"a\":\"\x01\"}",
        b"{\"a\":\"\xff\"}",
        b"{\"a\":\"\xc3(\"}",
        b"{\"a\":\"\xed\xa0\x80\"}",
        b"{'a':1}",
        b"{\"a\":1,}",
        b"{\"a\" 1}",
        b"{\"a\":tru}",
        b"{\"a\":[1,]}",
        b" {}",
        b"{} ",
        b"{}{}",
        b"{\"a\":NaN}",
    ];
    for d in invalid {
        assert!(!run(&g, &t, d).1, "invalid: {}", String::from_utf8_lossy(d));
    }
    // Incomplete but alive.
    for d in [
        &b"{\"a\":-"[..],
        b"{\"a\":1e",
        b"{\"a\":1.",
        b"{\"a\":\"\\u00",
        b"{\"a\":\"\xe2\x82",
    ] {
        assert_eq!(
            run(&g, &t, d),
            (true, false),
            "{}",
            String::from_utf8_lossy(d)
        );
    }
    // Numbers: at most 16 integral digits, 2 exponent digits.
    assert_eq!(run(&g, &t, b"{\"a\":1234567890123456}"), (true, true));
    assert!(!run(&g, &t, b"{\"a\":12345678901234567").0);
    assert!(!run(&g, &t, b"{\"a\":1e100").0);
}

#[test]
fn whitespace_is_bounded() {
    let g = Arc::new(json_object());
    let t = trie(&vocab());
    let mut s = b"{\n".to_vec();
    s.extend([b' '; 20]);
    assert_eq!(run(&g, &t, &s), (true, false));
    s.push(b' ');
    assert!(!run(&g, &t, &s).0, "21 spaces after a newline");
    assert!(!run(&g, &t, b"{  \"a\":1}").0, "two spaces");
    assert!(!run(&g, &t, b"{\n\n\"a\":1}").0, "two newlines");
}

/// The mask (trie walk, fast paths, cache) equals a token-by-token check.
fn check_mask(g: &Arc<Grammar>, t: &Arc<TokenTrie>, v: &[Vec<u8>], prefix: &[u8]) {
    let mut c = constraint(g, t);
    assert!(c.advance_bytes(prefix));
    let mask = c.allowed();
    for (id, bytes) in v.iter().enumerate() {
        let got = mask[id / 64] >> (id % 64) & 1 == 1;
        let want = id as u32 != EOS && {
            let mut s = prefix.to_vec();
            s.extend_from_slice(bytes);
            run(g, t, &s).0
        };
        assert_eq!(
            got,
            want,
            "token {id} {:?} after {:?}",
            String::from_utf8_lossy(bytes),
            String::from_utf8_lossy(prefix)
        );
    }
}

#[test]
fn the_mask_allows_exactly_the_tokens_that_keep_a_valid_prefix() {
    let v = vocab();
    let g = Arc::new(json_object());
    let t = trie(&v);
    for p in [
        &b""[..],
        b"{",
        b"{\"",
        b"{\"ab",
        b"{\"a\\",
        b"{\"a\\u00",
        b"{\"a\xc3",
        b"{\"a\"",
        b"{\"a\":",
        b"{\"a\":-",
        b"{\"a\":0",
        b"{\"a\":12",
        b"{\"a\":1.5e",
        b"{\"a\":[",
        b"{\"a\":[1",
        b"{\"a\":t",
        b"{\"a\":{}",
        b"{\"a\":\"x\"}",
    ] {
        check_mask(&g, &t, &v, p);
    }
    let g = Arc::new(json_schema_str(PERSON).unwrap());
    for p in [
        &b""[..],
        b"{",
        b"{\"name\":\"",
        b"{\"name\":\"ab\",",
        b"{\"name\":\"ab\",\"age\":3",
    ] {
        check_mask(&g, &t, &v, p);
    }
}

/// Properties in text order: name, age, color, tags, ok, pos.
const PERSON: &str = r##"{
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer"},
        "color": {"enum": ["red", "green", 3, null]},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 1, "maxItems": 3},
        "ok": {"type": ["boolean", "null"]},
        "pos": {"anyOf": [{"type": "number"}, {"const": "origin"}]}
    },
    "required": ["name", "tags"],
    "additionalProperties": false,
    "$defs": {"tag": {"type": "string", "maxLength": 4}}
}"##;

fn person_schema() -> Value {
    serde_json::from_str(PERSON).unwrap()
}

/// A small deterministic generator.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Random constrained generations: every step must leave a token or the end, the stop
/// token must be allowed exactly when the document is complete (and alone when nothing can
/// follow), and every finished document must parse (and pass `check`).
fn random_walks(g: &Arc<Grammar>, v: &[Vec<u8>], walks: u64, check: impl Fn(&Value)) -> usize {
    let t = trie(v);
    let closers: Vec<usize> = (0..v.len())
        .filter(|&i| {
            matches!(
                v[i].as_slice(),
                b"}" | b"]" | b"\"" | b"\"}" | b"]}" | b"}}"
            )
        })
        .collect();
    let mut finished = 0;
    for seed in 0..walks {
        let mut rng = Lcg(seed * 7919 + 1);
        let mut c = constraint(g, &t);
        let mut out = Vec::new();
        for step in 0..600 {
            let mut logits = vec![0.0f32; v.len()];
            c.process(&mut logits, &[]).unwrap();
            let allowed: Vec<usize> = (0..v.len()).filter(|&i| logits[i].is_finite()).collect();
            assert!(
                !allowed.is_empty(),
                "seed {seed}: dead end after {:?}",
                String::from_utf8_lossy(&out)
            );
            let eos_ok = logits[EOS as usize].is_finite();
            assert_eq!(
                eos_ok,
                c.is_complete(),
                "seed {seed}: EOS after {:?}",
                String::from_utf8_lossy(&out)
            );
            if c.is_finished() {
                assert_eq!(allowed, vec![EOS as usize], "only EOS once finished");
            }
            let close: Vec<usize> = closers
                .iter()
                .copied()
                .filter(|&i| logits[i].is_finite())
                .collect();
            let pick = if eos_ok && (step > 20 || rng.next().is_multiple_of(4)) {
                EOS as usize
            } else if step > 40 && !close.is_empty() && rng.next() % 10 < 8 {
                close[rng.next() as usize % close.len()]
            } else {
                allowed[rng.next() as usize % allowed.len()]
            };
            c.accept(pick as u32);
            if pick == EOS as usize {
                let doc: Value = serde_json::from_slice(&out).unwrap_or_else(|e| {
                    panic!("seed {seed}: {e}: {:?}", String::from_utf8_lossy(&out))
                });
                check(&doc);
                finished += 1;
                break;
            }
            out.extend_from_slice(&v[pick]);
        }
    }
    finished
}

#[test]
fn random_json_objects_always_parse() {
    let g = Arc::new(json_object());
    let n = random_walks(&g, &vocab(), 300, |d| assert!(d.is_object(), "{d}"));
    assert!(n > 200, "only {n} of 300 walks finished");
}

#[test]
fn random_schema_documents_always_validate() {
    let schemas = [
        PERSON,
        r#"{"type": "object", "properties": {"a": {"type": "array", "items": {"type": "number"}, "maxItems": 0}}, "required": ["a"]}"#,
        r#"{"type": "object", "additionalProperties": {"type": "integer"}}"#,
        r#"{"type": "object", "properties": {"y": {"const": {"k": [1, "two"]}}, "x": {"oneOf": [{"type": "string", "maxLength": 0}, {"type": "boolean"}]}}, "required": ["y"]}"#,
        r##"{"$ref": "#/definitions/node", "definitions": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/definitions/node"}, {"type": "null"}]}}, "required": ["v", "next"], "additionalProperties": false}}}"##,
        r#"{"type": "object", "properties": {"only": {"type": "string"}}, "required": [], "additionalProperties": false}"#,
    ];
    for text in schemas {
        let s: Value = serde_json::from_str(text).unwrap();
        let g = Arc::new(json_schema_str(text).unwrap_or_else(|e| panic!("{s}: {e}")));
        let n = random_walks(&g, &vocab(), 150, |d| {
            validate(&s, d).unwrap_or_else(|e| panic!("{d} against {s}: {e}"))
        });
        assert!(n > 50, "{s}: only {n} of 150 walks finished");
    }
}

#[test]
fn schema_documents_accept_and_reject() {
    let s = person_schema();
    let g = Arc::new(json_schema_str(PERSON).unwrap());
    let t = trie(&vocab());
    let ok = [
        r#"{"name":"Ann","tags":["a"]}"#,
        r#"{"name":"Ann","age":-3,"color":null,"tags":["a","bcde",""],"ok":false,"pos":1.5}"#,
        r#"{ "name": "Zoë", "tags": [ "x" ], "pos": "origin" }"#,
    ];
    for d in ok {
        validate(&s, &serde_json::from_str(d).unwrap()).unwrap();
        assert_eq!(run(&g, &t, d.as_bytes()), (true, true), "{d}");
    }
    let bad = [
        r#"{"tags":["a"]}"#,                           // name required
        r#"{"name":"","tags":["a"]}"#,                 // minLength
        r#"{"name":"abcdefghi","tags":["a"]}"#,        // maxLength
        r#"{"name":"a","tags":[]}"#,                   // minItems
        r#"{"name":"a","tags":["a","b","c","d"]}"#,    // maxItems
        r#"{"name":"a","tags":["abcde"]}"#,            // $ref'd maxLength
        r#"{"tags":["a"],"name":"a"}"#,                // schema order
        r#"{"name":"a","tags":["a"],"extra":1}"#,      // additionalProperties
        r#"{"name":"a","age":1.5,"tags":["a"]}"#,      // integer
        r#"{"name":"a","color":"blue","tags":["a"]}"#, // enum
        r#"{"name":"a","tags":["a"],"pos":"x"}"#,      // anyOf
    ];
    for d in bad {
        assert!(!run(&g, &t, d.as_bytes()).1, "{d}");
    }
}

#[test]
fn unsupported_or_invalid_schemas_are_refused_by_name() {
    let cases = [
        (json!({"type": "string", "pattern": "^a"}), "\"pattern\""),
        (json!({"type": "string", "format": "date"}), "\"format\""),
        (json!({"type": "integer", "minimum": 0}), "\"minimum\""),
        (
            json!({"type": "array", "uniqueItems": true}),
            "\"uniqueItems\"",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 2}}}),
            "#/properties/a",
        ),
        (
            json!({"type": "object", "properties": {}, "required": ["a"]}),
            "required property \"a\"",
        ),
        (json!({"type": "uuid"}), "unknown type \"uuid\""),
        (
            json!({"$ref": "https://example.com/s.json"}),
            "only local references",
        ),
        (json!({"$ref": "#/$defs/missing"}), "points at nothing"),
        (
            json!({"$ref": "#/$defs/a", "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}}),
            "$ref cycle",
        ),
        (
            json!({"type": "string", "minLength": 5, "maxLength": 2}),
            "maxLength 2 is below minLength 5",
        ),
        (json!({"type": "integer", "enum": ["a"]}), "no enum value"),
        (json!({"anyOf": []}), "non-empty"),
        (
            json!({"type": "array", "items": [{"type": "string"}]}),
            "tuple",
        ),
        (json!(false), "allows no value"),
        (json!(3), "must be an object"),
        (
            json!({"anyOf": [{"type": "null"}], "type": "string"}),
            "anyOf together with type",
        ),
    ];
    for (s, want) in cases {
        let e = json_schema(&s).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(want), "{s}: {e}");
    }
}

#[test]
fn complete_documents_force_the_end() {
    let v = vocab();
    let t = trie(&v);
    let g = Arc::new(json_object());
    let mut c = constraint(&g, &t);
    assert!(c.advance_bytes(b"{\"a\":[1]}"));
    assert!(c.is_finished());
    let mut logits = vec![1.0f32; v.len()];
    c.process(&mut logits, &[]).unwrap();
    let live: Vec<usize> = (0..v.len()).filter(|&i| logits[i].is_finite()).collect();
    assert_eq!(live, vec![EOS as usize]);
    assert_eq!(logits[EOS as usize], 1.0, "EOS keeps its logit");
    // Mid-document, EOS is masked.
    let mut c = constraint(&g, &t);
    c.advance_bytes(b"{\"a\":");
    let mut logits = vec![1.0f32; v.len()];
    c.process(&mut logits, &[]).unwrap();
    assert_eq!(logits[EOS as usize], f32::NEG_INFINITY);
    // A top-level integer may end or go on.
    let g = Arc::new(json_schema(&json!({"type": "integer"})).unwrap());
    let mut c = constraint(&g, &t);
    c.advance_bytes(b"12");
    let mut logits = vec![1.0f32; v.len()];
    c.process(&mut logits, &[]).unwrap();
    assert!(logits[EOS as usize].is_finite() && logits[1 + b'3' as usize].is_finite());
    assert!(
        logits[1 + b'.' as usize].is_infinite(),
        "no fraction in an integer"
    );
}

#[test]
fn enums_are_exact_with_shared_prefixes() {
    let g = Arc::new(
        json_schema_str(r#"{"enum": ["ab", "abc", "abd", "b", 1, 12, null, "a\"b", "abcdefgh"]}"#)
            .unwrap(),
    );
    let t = trie(&vocab());
    for ok in [
        "\"ab\"",
        "\"abc\"",
        "\"abd\"",
        "\"b\"",
        "1",
        "12",
        "null",
        "\"a\\\"b\"",
        "\"abcdefgh\"",
    ] {
        assert_eq!(run(&g, &t, ok.as_bytes()), (true, true), "{ok}");
    }
    for bad in ["\"a\"", "\"abe\"", "123", "\"abcd\"", "\"abcdefg\"", "2"] {
        assert!(!run(&g, &t, bad.as_bytes()).1, "{bad}");
    }
}

/// On SmolLM2's real vocabulary (49,152 byte-level BPE tokens, many ending inside a UTF-8
/// character), the constraint's mask equals advancing the recognizer over each token's
/// bytes, from prefixes inside strings (also mid-character), numbers, escapes and structure.
#[test]
fn smollm2_masks_match_a_token_by_token_check() {
    use ferrite_llm::grammar::pda::{Arena, State};
    let path = ferrite_gguf::fetch::smollm2_135m_instruct_q4_1().unwrap();
    let model = ferrite_llm::Model::load(&path).unwrap();
    let tok = ferrite_llm::tokenizer::Tokenizer::from_gguf(model.gguf()).unwrap();
    let vocab = model.cfg.vocab;
    let trie = Arc::new(TokenTrie::from_tokenizer(&tok, vocab));
    let cases: [(Arc<Grammar>, &[&[u8]]); 2] = [
        (
            Arc::new(json_object()),
            &[
                b"",
                b"{\"na",
                b"{\"a\": \"Zo\xc3",
                b"{\"a\": [1, -0.5e",
                b"{\"a\": \"x\\u00",
            ],
        ),
        (
            Arc::new(json_schema_str(PERSON).unwrap()),
            &[
                b"{\"name\": \"abcde",
                b"{\"name\":\"a\",\"tags\":[",
                b"{\"name\":\"a\",\"tags\":[\"x\"], \"ok\"",
            ],
        ),
    ];
    for (g, prefixes) in cases {
        for &p in prefixes {
            let mut c =
                GrammarConstraint::new(g.clone(), trie.clone(), tok.eog_tokens().to_vec()).unwrap();
            assert!(c.advance_bytes(p), "{:?}", String::from_utf8_lossy(p));
            let mask = c.allowed();
            let mut arena = Arena::default();
            let mut st = arena.start(&g);
            let mut next = State::default();
            for &b in p {
                arena.advance(&g, &st, b, &mut next);
                std::mem::swap(&mut st, &mut next);
            }
            arena.compact(&mut st);
            let mut allowed = 0;
            for id in 0..vocab as u32 {
                let want = trie.token(id).is_some_and(|bytes| {
                    let mut a = arena.clone();
                    let mut s = st.clone();
                    for &b in bytes {
                        a.advance(&g, &s, b, &mut next);
                        std::mem::swap(&mut s, &mut next);
                        if !s.alive() {
                            return false;
                        }
                    }
                    true
                });
                let got = mask[id as usize / 64] >> (id % 64) & 1 == 1;
                assert_eq!(
                    got,
                    want,
                    "token {id} {:?} after {:?}",
                    String::from_utf8_lossy(tok.token_bytes(id)),
                    String::from_utf8_lossy(p)
                );
                allowed += usize::from(got);
            }
            assert!(allowed > 0, "{:?}", String::from_utf8_lossy(p));
        }
    }
}

/// Many properties, optional or not, and deep nesting: neither deepens the recognizer's
/// stack per property (tail calls), so a 300-property object completes.
#[test]
fn many_properties_and_deep_nesting() {
    let n = 300;
    let props: Vec<String> = (0..n)
        .map(|i| format!("\"p{i}\": {{\"type\": \"integer\"}}"))
        .collect();
    let required: Vec<String> = (0..n).step_by(2).map(|i| format!("\"p{i}\"")).collect();
    let schema = format!(
        "{{\"type\": \"object\", \"properties\": {{{}}}, \"required\": [{}], \"additionalProperties\": false}}",
        props.join(", "),
        required.join(", ")
    );
    let g = Arc::new(json_schema_str(&schema).unwrap());
    let t = trie(&vocab());
    let all: Vec<String> = (0..n).map(|i| format!("\"p{i}\":{i}")).collect();
    let doc = format!("{{{}}}", all.join(","));
    assert_eq!(run(&g, &t, doc.as_bytes()), (true, true));
    let evens: Vec<String> = (0..n).step_by(2).map(|i| format!("\"p{i}\":{i}")).collect();
    let doc = format!("{{{}}}", evens.join(", "));
    assert_eq!(run(&g, &t, doc.as_bytes()), (true, true));
    let missing = format!("{{{}}}", evens[1..].join(","));
    assert!(!run(&g, &t, missing.as_bytes()).0);

    let g = Arc::new(json_object());
    let deep = |k: usize| {
        format!(
            "{}{}",
            "{\"a\":".repeat(k),
            "1".to_string() + &"}".repeat(k)
        )
    };
    assert_eq!(run(&g, &t, deep(100).as_bytes()), (true, true));
    let mut arr = String::from("{\"a\":");
    arr.push_str(&"[".repeat(100));
    arr.push_str(&"]".repeat(100));
    arr.push('}');
    assert_eq!(run(&g, &t, arr.as_bytes()), (true, true));
    assert!(!run(&g, &t, deep(200).as_bytes()).0, "nesting is bounded");
}

/// A logit bias chained before the constraint cannot unmask a forbidden token; one on an
/// allowed token still applies.
#[test]
fn a_logit_bias_before_the_grammar_cannot_unmask() {
    use ferrite_llm::logits_processor::{Chain, LogitBias};
    let v = vocab();
    let t = trie(&v);
    let g = Arc::new(json_object());
    let x = 1 + u32::from(b'x');
    let brace = 1 + u32::from(b'{');
    let bias = LogitBias::new(vec![(x, 50.0), (brace, 3.0)], v.len()).unwrap();
    let mut chain = Chain(vec![Box::new(bias), Box::new(constraint(&g, &t))]);
    let mut logits = vec![0.0f32; v.len()];
    chain.process(&mut logits, &[]).unwrap();
    assert_eq!(logits[x as usize], f32::NEG_INFINITY);
    assert_eq!(logits[brace as usize], 3.0);
    chain.accept(brace);
    let mut logits = vec![0.0f32; v.len()];
    chain.process(&mut logits, &[]).unwrap();
    assert!(
        logits[brace as usize].is_infinite(),
        "no object key starts with {{"
    );
    assert!(logits[1 + usize::from(b'"')].is_finite());
}

/// anyOf nested in anyOf multiplies the ways a byte can continue: the recognizer's work per
/// byte is capped (what it drops only narrows the mask), and documents still complete.
#[test]
fn nested_alternatives_are_bounded_per_byte() {
    use ferrite_llm::grammar::pda::{Arena, SETTLE_BUDGET};
    // Shared through $ref, so the grammar stays small while each level multiplies by 60.
    let leaf = r#"{"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}"#;
    let level = |i: usize| {
        let r = format!("{{\"$ref\": \"#/$defs/l{i}\"}}");
        let branches: Vec<&str> = std::iter::repeat_n(r.as_str(), 60).collect();
        format!("{{\"anyOf\": [{}]}}", branches.join(", "))
    };
    let s = format!(
        "{{\"$ref\": \"#/$defs/l3\", \"$defs\": {{\"l0\": {leaf}, \"l1\": {}, \"l2\": {}, \"l3\": {}}}}}",
        level(0),
        level(1),
        level(2)
    );
    let g = Arc::new(json_schema_str(&s).unwrap());
    let mut a = Arena::default();
    let st = a.start(&g);
    assert!(a.exhausted(), "60^3 branches fit {SETTLE_BUDGET} steps?");
    assert!(st.alive());
    let t = trie(&vocab());
    let t0 = std::time::Instant::now();
    let mut c = constraint(&g, &t);
    let _ = c.allowed();
    assert_eq!(run(&g, &t, br#"{"k":1}"#), (true, true));
    assert!(t0.elapsed().as_secs() < 20, "{:?}", t0.elapsed());
    // Ordinary grammars stay far inside the budget.
    let g = Arc::new(json_schema_str(PERSON).unwrap());
    let mut a = Arena::default();
    a.start(&g);
    assert!(!a.exhausted());
}

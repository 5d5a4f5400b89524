//! JSON grammars: [`json_object`] (any JSON object, RFC 8259) and [`json_schema`] (a JSON
//! Schema subset compiled to the same rules), plus [`validate`], the subset's reference
//! validator.
//!
//! Properties are generated in the schema's order: give the schema as text
//! ([`json_schema_str`]) or with its [`KeyOrder`], since a [`Value`] sorts object keys.
//!
//! What every grammar here generates: no whitespace before or after the document; between
//! tokens at most `" "` or a newline and up to 20 spaces or tabs (so a model cannot loop on
//! whitespace); strings of valid UTF-8 without control characters, with the escapes
//! `\" \\ \/ \b \f \n \r \t \uXXXX` (a surrogate only as a valid high-low pair); numbers
//! `-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][+-]?[0-9]{1,2})?` (never `01`, never beyond
//! f64's range); nesting bounded by the recognizer's stack ([`super::pda::MAX_DEPTH`]).
//!
//! The schema subset: `type` (one or a list of object, array, string, number, integer,
//! boolean, null), `properties` (emitted in schema order; those not in `required` may be
//! skipped), `required`, `additionalProperties` (false or true with `properties`; a schema
//! without `properties`: a map of such values), `items`, `minItems`, `maxItems`, `enum`,
//! `const`, `anyOf`, `oneOf` (compiled as `anyOf`: the output matches at least one branch),
//! `$ref` to a local JSON pointer (`#`, `#/$defs/..`, `#/definitions/..`; recursion that
//! consumes input on the way is fine), `minLength`, `maxLength`; the annotations `title`,
//! `description`, `default`, `examples`, `$schema`, `$id`, `$comment`, `deprecated`,
//! `readOnly`, `writeOnly`, `$defs`, `definitions` are ignored. Any other keyword (`pattern`,
//! `format`, `minimum`, `prefixItems`, `uniqueItems`, ...) is an error naming it, since
//! ignoring it could generate output the schema rejects.

use std::collections::HashMap;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::{lit, Alt, Builder, ByteSet, Elem, Grammar, INF};

/// Why a schema cannot be compiled: `at` is the JSON pointer of the offending schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaError {
    pub at: String,
    pub message: String,
}

impl std::fmt::Display for SchemaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "json_schema at #{}: {}", self.at, self.message)
    }
}

impl std::error::Error for SchemaError {}

/// Annotation keywords: accepted and ignored (they do not constrain values).
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
    "definitions",
];

/// Constraining keywords this compiler implements.
const KEYWORDS: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "$ref",
    "minLength",
    "maxLength",
];

/// Largest `minLength` / `minItems` (anything longer could never fit a context).
pub const MAX_MIN_COUNT: u64 = 1 << 16;
/// Most `enum` values of one schema.
pub const MAX_ENUM: usize = 1024;
/// Most `anyOf` / `oneOf` branches of one schema (each branch alive at once costs the
/// recognizer a stack per step).
pub const MAX_BRANCHES: usize = 64;

/// Rules every JSON grammar shares.
struct Base {
    ws: u32,
    string: u32,
    /// One string character: plain byte, UTF-8 sequence or escape.
    chr: u32,
    number: u32,
    integer: u32,
    boolean: u32,
    null: u32,
    value: u32,
    object: u32,
}

fn b1(b: u8) -> Elem {
    Elem::bytes(ByteSet::one(b))
}

fn br(lo: u8, hi: u8) -> Elem {
    Elem::bytes(ByteSet::range(lo, hi))
}

fn seq(parts: &[Alt]) -> Alt {
    parts.concat()
}

fn r(id: u32) -> Alt {
    vec![Elem::rule(id)]
}

impl Base {
    fn new(b: &mut Builder) -> Result<Base, String> {
        let ws = b.add(vec![
            vec![],
            lit(b" "),
            vec![b1(b'\n'), Elem::bytes(ByteSet::of(b" \t")).rep(0, 20)],
        ])?;
        let mut plain = ByteSet::range(0x20, 0x7f);
        plain.remove(b'"');
        plain.remove(b'\\');
        let cont = || br(0x80, 0xbf);
        let utf8 = b.add(vec![
            vec![br(0xc2, 0xdf), cont()],
            vec![b1(0xe0), br(0xa0, 0xbf), cont()],
            vec![br(0xe1, 0xec), cont().rep(2, 2)],
            vec![b1(0xed), br(0x80, 0x9f), cont()],
            vec![br(0xee, 0xef), cont().rep(2, 2)],
            vec![b1(0xf0), br(0x90, 0xbf), cont().rep(2, 2)],
            vec![br(0xf1, 0xf3), cont().rep(3, 3)],
            vec![b1(0xf4), br(0x80, 0x8f), cont().rep(2, 2)],
        ])?;
        let hex = || Elem::bytes(ByteSet::of(b"0123456789abcdefABCDEF"));
        let escape = b.add(vec![
            vec![b1(b'\\'), Elem::bytes(ByteSet::of(b"\"\\/bfnrt"))],
            // \uXXXX outside the surrogates.
            vec![
                b1(b'\\'),
                b1(b'u'),
                Elem::bytes(ByteSet::of(b"0123456789abcABCefEF")),
                hex().rep(3, 3),
            ],
            vec![
                b1(b'\\'),
                b1(b'u'),
                Elem::bytes(ByteSet::of(b"dD")),
                br(b'0', b'7'),
                hex().rep(2, 2),
            ],
            // A high surrogate, then a low one.
            vec![
                b1(b'\\'),
                b1(b'u'),
                Elem::bytes(ByteSet::of(b"dD")),
                Elem::bytes(ByteSet::of(b"89abAB")),
                hex().rep(2, 2),
                b1(b'\\'),
                b1(b'u'),
                Elem::bytes(ByteSet::of(b"dD")),
                Elem::bytes(ByteSet::of(b"cdefCDEF")),
                hex().rep(2, 2),
            ],
        ])?;
        // Free string body: a run of plain bytes, then (UTF-8 or escape, plain run)*. Written
        // so one stack loops on plain bytes, which lets a trie walk allow whole subtrees.
        let rest = b.add(vec![
            vec![Elem::rule(utf8), Elem::bytes(plain).rep(0, INF)],
            vec![Elem::rule(escape), Elem::bytes(plain).rep(0, INF)],
        ])?;
        let string = b.add(vec![vec![
            b1(b'"'),
            Elem::bytes(plain).rep(0, INF),
            Elem::rule(rest).rep(0, INF),
            b1(b'"'),
        ]])?;
        let chr = b.add(vec![vec![Elem::bytes(plain)], r(utf8), r(escape)])?;
        let int_part = b.add(vec![
            lit(b"0"),
            vec![br(b'1', b'9'), br(b'0', b'9').rep(0, 15)],
        ])?;
        let frac = b.add(vec![vec![b1(b'.'), br(b'0', b'9').rep(1, 16)]])?;
        let exp = b.add(vec![vec![
            Elem::bytes(ByteSet::of(b"eE")),
            Elem::bytes(ByteSet::of(b"+-")).rep(0, 1),
            br(b'0', b'9').rep(1, 2),
        ]])?;
        let number = b.add(vec![vec![
            b1(b'-').rep(0, 1),
            Elem::rule(int_part),
            Elem::rule(frac).rep(0, 1),
            Elem::rule(exp).rep(0, 1),
        ]])?;
        let integer = b.add(vec![vec![b1(b'-').rep(0, 1), Elem::rule(int_part)]])?;
        let boolean = b.add(vec![lit(b"true"), lit(b"false")])?;
        let null = b.add(vec![lit(b"null")])?;
        let value = b.reserve()?;
        let member = b.add(vec![seq(&[r(string), r(ws), lit(b":"), r(ws), r(value)])])?;
        let object = container(b, ws, b'{', member, b'}', 0, INF)?;
        let array = container(b, ws, b'[', value, b']', 0, INF)?;
        b.define(
            value,
            vec![
                r(object),
                r(array),
                r(string),
                r(number),
                r(boolean),
                r(null),
            ],
        );
        Ok(Base {
            ws,
            string,
            chr,
            number,
            integer,
            boolean,
            null,
            value,
            object,
        })
    }
}

/// `open ws (item (ws "," ws item){min-1, max-1} ws)? close`, the group required when
/// `min >= 1`, absent when `max == 0`.
fn container(
    b: &mut Builder,
    ws: u32,
    open: u8,
    item: u32,
    close: u8,
    min: u32,
    max: u32,
) -> Result<u32, String> {
    if max == 0 {
        return b.add(vec![seq(&[lit(&[open]), r(ws), lit(&[close])])]);
    }
    let more = b.add(vec![seq(&[r(ws), lit(b","), r(ws), r(item)])])?;
    let rest_max = if max == INF { INF } else { max - 1 };
    let rest_min = min.saturating_sub(1);
    let items = if rest_max == 0 {
        b.add(vec![seq(&[r(item), r(ws)])])?
    } else {
        b.add(vec![vec![
            Elem::rule(item),
            Elem::rule(more).rep(rest_min, rest_max),
            Elem::rule(ws),
        ]])?
    };
    let group = Elem::rule(items).rep(if min == 0 { 0 } else { 1 }, 1);
    b.add(vec![vec![b1(open), Elem::rule(ws), group, b1(close)]])
}

/// The grammar of any JSON object (OpenAI's `json_object`).
pub fn json_object() -> Grammar {
    let mut b = Builder::new();
    let build = |b: &mut Builder| -> Result<u32, String> { Ok(Base::new(b)?.object) };
    // The fixed rules above always build; a failure here is a bug in this file.
    match build(&mut b).and_then(|root| b.build(root)) {
        Ok(g) => g,
        Err(e) => unreachable!("json_object grammar: {e}"),
    }
}

/// The key order of every object in a JSON document (a [`Value`] does not keep it unless
/// serde_json's `preserve_order` feature is on): properties are generated in this order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeyOrder(OrderNode);

#[derive(Clone, Debug, Default, PartialEq)]
enum OrderNode {
    Object(Vec<(String, OrderNode)>),
    Array(Vec<OrderNode>),
    #[default]
    Leaf,
}

/// A JSON value read together with its objects' key order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OrderedValue {
    pub value: Value,
    pub order: KeyOrder,
}

impl<'de> Deserialize<'de> for OrderedValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (value, order) = d.deserialize_any(OrderedVisitor)?;
        Ok(OrderedValue {
            value,
            order: KeyOrder(order),
        })
    }
}

struct OrderedVisitor;

/// Reads one value as (the value, its key-order tree).
struct Pair(Value, OrderNode);

impl<'de> Deserialize<'de> for Pair {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OrderedVisitor).map(|(v, o)| Pair(v, o))
    }
}

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = (Value, OrderNode);
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
        Ok((Value::Bool(b), OrderNode::Leaf))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Self::Value, E> {
        Ok((Value::from(n), OrderNode::Leaf))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Self::Value, E> {
        Ok((Value::from(n), OrderNode::Leaf))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Self::Value, E> {
        Ok((Value::from(n), OrderNode::Leaf))
    }
    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok((Value::String(s.to_string()), OrderNode::Leaf))
    }
    fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
        Ok((Value::String(s), OrderNode::Leaf))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok((Value::Null, OrderNode::Leaf))
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok((Value::Null, OrderNode::Leaf))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
        let (mut v, mut o) = (Vec::new(), Vec::new());
        while let Some(Pair(x, xo)) = a.next_element()? {
            v.push(x);
            o.push(xo);
        }
        Ok((Value::Array(v), OrderNode::Array(o)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
        let (mut v, mut o) = (Map::new(), Vec::new());
        while let Some((k, Pair(x, xo))) = a.next_entry::<String, Pair>()? {
            v.insert(k.clone(), x);
            o.push((k, xo));
        }
        Ok((Value::Object(v), OrderNode::Object(o)))
    }
}

impl KeyOrder {
    /// The keys of the object at JSON pointer `pointer` (`""` is the root), in order.
    pub fn keys_at(&self, pointer: &str) -> Option<Vec<&str>> {
        let mut n = &self.0;
        if !pointer.is_empty() {
            for tok in pointer.strip_prefix('/')?.split('/') {
                let tok = tok.replace("~1", "/").replace("~0", "~");
                n = match n {
                    OrderNode::Object(m) => &m.iter().rev().find(|(k, _)| *k == tok)?.1,
                    OrderNode::Array(a) => a.get(tok.parse::<usize>().ok()?)?,
                    OrderNode::Leaf => return None,
                };
            }
        }
        match n {
            OrderNode::Object(m) => Some(m.iter().map(|(k, _)| k.as_str()).collect()),
            _ => None,
        }
    }
}

/// [`json_schema_ordered`] of a schema given as JSON text, its properties in text order.
pub fn json_schema_str(text: &str) -> Result<Grammar, SchemaError> {
    let v: OrderedValue = serde_json::from_str(text).map_err(|e| SchemaError {
        at: String::new(),
        message: format!("the schema is not valid JSON: {e}"),
    })?;
    json_schema_ordered(&v.value, Some(&v.order))
}

/// [`json_schema_ordered`] with properties in the order `schema`'s maps iterate (sorted by
/// name unless serde_json's `preserve_order` feature is on).
pub fn json_schema(schema: &Value) -> Result<Grammar, SchemaError> {
    json_schema_ordered(schema, None)
}

/// Compiles a JSON Schema (the subset in the module docs) to a grammar of the documents
/// that validate against it; `order` gives the order properties are generated in (that of
/// the schema's text), else the order of `schema`'s maps.
pub fn json_schema_ordered(
    schema: &Value,
    order: Option<&KeyOrder>,
) -> Result<Grammar, SchemaError> {
    let internal = |message: String| SchemaError {
        at: String::new(),
        message,
    };
    let mut b = Builder::new();
    let base = Base::new(&mut b).map_err(internal)?;
    let mut c = Compiler {
        b,
        base,
        root: schema,
        order,
        refs: HashMap::new(),
    };
    let root = c.compile(schema, "")?;
    c.b.build(root).map_err(|e| {
        let message = if e.contains("left recursion") {
            "a $ref cycle reaches itself without generating anything on the way".to_string()
        } else {
            e
        };
        internal(message)
    })
}

struct Compiler<'a> {
    b: Builder,
    base: Base,
    root: &'a Value,
    order: Option<&'a KeyOrder>,
    /// Rule of each `$ref` target compiled so far (or being compiled: recursion).
    refs: HashMap<String, u32>,
}

fn err<T>(at: &str, message: impl Into<String>) -> Result<T, SchemaError> {
    Err(SchemaError {
        at: at.to_string(),
        message: message.into(),
    })
}

/// A non-negative integer keyword, or None when absent.
fn count(m: &Map<String, Value>, key: &str, at: &str) -> Result<Option<u64>, SchemaError> {
    match m.get(key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) => Ok(Some(n)),
            None => err(at, format!("{key} must be a non-negative integer, got {v}")),
        },
    }
}

/// `min..=max` from two count keywords (absent: 0 and unbounded).
fn bounds(
    m: &Map<String, Value>,
    kmin: &str,
    kmax: &str,
    at: &str,
) -> Result<(u32, u32), SchemaError> {
    let min = count(m, kmin, at)?.unwrap_or(0);
    let max = count(m, kmax, at)?;
    if min > MAX_MIN_COUNT {
        return err(
            at,
            format!("{kmin} {min} is over the limit {MAX_MIN_COUNT}"),
        );
    }
    if let Some(max) = max {
        if max < min {
            return err(at, format!("{kmax} {max} is below {kmin} {min}"));
        }
    }
    let max = max.map_or(INF, |m| m.min(u64::from(INF - 1)) as u32);
    Ok((min as u32, max))
}

/// The JSON type names a value has (an integral number is both).
fn types_of(v: &Value) -> &'static [&'static str] {
    match v {
        Value::Null => &["null"],
        Value::Bool(_) => &["boolean"],
        Value::Number(n) => {
            let integral = n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0);
            if integral {
                &["integer", "number"]
            } else {
                &["number"]
            }
        }
        Value::String(_) => &["string"],
        Value::Array(_) => &["array"],
        Value::Object(_) => &["object"],
    }
}

const TYPES: &[&str] = &[
    "object", "array", "string", "number", "integer", "boolean", "null",
];

impl Compiler<'_> {
    fn add(&mut self, alts: Vec<Alt>, at: &str) -> Result<u32, SchemaError> {
        self.b.add(alts).or_else(|e| err(at, e))
    }

    /// The rule of the values valid against `s` (at JSON pointer `at`).
    fn compile(&mut self, s: &Value, at: &str) -> Result<u32, SchemaError> {
        let m = match s {
            Value::Bool(true) => return Ok(self.base.value),
            Value::Bool(false) => return err(at, "the schema false allows no value"),
            Value::Object(m) => m,
            _ => {
                return err(
                    at,
                    format!("a schema must be an object or a boolean, got {s}"),
                )
            }
        };
        for k in m.keys() {
            if !KEYWORDS.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()) {
                return err(
                    at,
                    format!("keyword {k:?} is not supported (it would constrain the output in a way this server cannot enforce)"),
                );
            }
        }
        let constraining: Vec<&str> = m
            .keys()
            .map(String::as_str)
            .filter(|k| KEYWORDS.contains(k))
            .collect();
        let alone = |kw: &str, allowed: &[&str]| -> Result<(), SchemaError> {
            if let Some(o) = constraining
                .iter()
                .find(|&&k| k != kw && !allowed.contains(&k))
            {
                return err(at, format!("{kw} together with {o} is not supported"));
            }
            Ok(())
        };
        if let Some(r) = m.get("$ref") {
            alone("$ref", &[])?;
            let Some(r) = r.as_str() else {
                return err(at, "$ref must be a string");
            };
            return self.reference(r, at);
        }
        for kw in ["anyOf", "oneOf"] {
            if let Some(v) = m.get(kw) {
                alone(kw, &[])?;
                let Some(list) = v.as_array().filter(|l| !l.is_empty()) else {
                    return err(at, format!("{kw} must be a non-empty array of schemas"));
                };
                if list.len() > MAX_BRANCHES {
                    return err(at, format!("{kw} has over {MAX_BRANCHES} branches"));
                }
                let mut alts = Vec::new();
                for (i, sub) in list.iter().enumerate() {
                    alts.push(r(self.compile(sub, &format!("{at}/{kw}/{i}"))?));
                }
                return self.add(alts, at);
            }
        }
        let types: Vec<&str> = match m.get("type") {
            None => Vec::new(),
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(l)) if !l.is_empty() => {
                let mut v = Vec::new();
                for t in l {
                    match t.as_str() {
                        Some(t) => v.push(t),
                        None => {
                            return err(at, format!("type list entries must be strings, got {t}"))
                        }
                    }
                }
                v
            }
            Some(t) => {
                return err(
                    at,
                    format!("type must be a string or a non-empty list, got {t}"),
                )
            }
        };
        if let Some(t) = types.iter().find(|t| !TYPES.contains(t)) {
            return err(
                at,
                format!("unknown type {t:?} (one of {})", TYPES.join(", ")),
            );
        }
        let fits = |v: &Value| types.is_empty() || types.iter().any(|t| types_of(v).contains(t));
        if let Some(v) = m.get("const") {
            alone("const", &["type"])?;
            if !fits(v) {
                return err(
                    at,
                    format!("const {v} does not have type {}", types.join(" or ")),
                );
            }
            return self.add(vec![lit(v.to_string().as_bytes())], at);
        }
        if let Some(v) = m.get("enum") {
            alone("enum", &["type"])?;
            let Some(list) = v.as_array().filter(|l| !l.is_empty()) else {
                return err(at, "enum must be a non-empty array");
            };
            if list.len() > MAX_ENUM {
                return err(at, format!("enum has over {MAX_ENUM} values"));
            }
            let mut lits: Vec<Vec<u8>> = list
                .iter()
                .filter(|v| fits(v))
                .map(|v| v.to_string().into_bytes())
                .collect();
            if lits.is_empty() {
                return err(at, format!("no enum value has type {}", types.join(" or ")));
            }
            lits.sort();
            lits.dedup();
            return self.literals(&lits, 0, at);
        }
        let types = if types.is_empty() {
            let has = |ks: &[&str]| ks.iter().any(|k| m.contains_key(*k));
            if has(&["properties", "required", "additionalProperties"]) {
                vec!["object"]
            } else if has(&["items", "minItems", "maxItems"]) {
                vec!["array"]
            } else if has(&["minLength", "maxLength"]) {
                vec!["string"]
            } else {
                return Ok(self.base.value);
            }
        } else {
            types
        };
        let mut alts = Vec::new();
        for t in &types {
            let id = match *t {
                "object" => self.object(m, at)?,
                "array" => self.array(m, at)?,
                "string" => self.string(m, at)?,
                "number" => self.base.number,
                "integer" => self.base.integer,
                "boolean" => self.base.boolean,
                _ => self.base.null,
            };
            alts.push(r(id));
        }
        if alts.len() == 1 {
            if let Some(crate::grammar::Sym::Rule(id)) = alts[0].first().map(|e| e.sym) {
                return Ok(id);
            }
        }
        self.add(alts, at)
    }

    /// A rule matching exactly the byte strings `lits` (sorted, distinct, sharing their
    /// first `depth` bytes), shaped as their trie so that the recognizer follows one stack
    /// per distinct prefix, not one per value.
    fn literals(&mut self, lits: &[Vec<u8>], depth: usize, at: &str) -> Result<u32, SchemaError> {
        let mut alts = Vec::new();
        let mut i = 0;
        if lits.first().is_some_and(|l| l.len() == depth) {
            alts.push(vec![]);
            i = 1;
        }
        while i < lits.len() {
            let b = lits[i][depth];
            let mut j = i;
            while j < lits.len() && lits[j][depth] == b {
                j += 1;
            }
            // The group's common prefix (first and last share it: sorted) goes in flat, so
            // recursion is as deep as the number of branching points, not the bytes.
            let (first, last) = (&lits[i], &lits[j - 1]);
            let common = first[depth..]
                .iter()
                .zip(&last[depth..])
                .take_while(|(x, y)| x == y)
                .count();
            let mut alt = lit(&first[depth..depth + common]);
            if j - i > 1 {
                alt.push(Elem::rule(self.literals(
                    &lits[i..j],
                    depth + common,
                    at,
                )?));
            }
            alts.push(alt);
            i = j;
        }
        self.add(alts, at)
    }

    fn reference(&mut self, r: &str, at: &str) -> Result<u32, SchemaError> {
        if let Some(&id) = self.refs.get(r) {
            return Ok(id);
        }
        let Some(pointer) = r.strip_prefix('#') else {
            return err(
                at,
                format!("$ref {r:?}: only local references (#/...) are supported"),
            );
        };
        let Some(target) = self.root.pointer(pointer) else {
            return err(at, format!("$ref {r:?} points at nothing in the schema"));
        };
        let id = self.b.reserve().or_else(|e| err(at, e))?;
        self.refs.insert(r.to_string(), id);
        let body = self.compile(target, pointer)?;
        self.b.define(id, vec![vec![Elem::rule(body)]]);
        Ok(id)
    }

    fn string(&mut self, m: &Map<String, Value>, at: &str) -> Result<u32, SchemaError> {
        let (min, max) = bounds(m, "minLength", "maxLength", at)?;
        if (min, max) == (0, INF) {
            return Ok(self.base.string);
        }
        let body = if max == 0 {
            lit(b"\"\"")
        } else {
            vec![b1(b'"'), Elem::rule(self.base.chr).rep(min, max), b1(b'"')]
        };
        self.add(vec![body], at)
    }

    fn array(&mut self, m: &Map<String, Value>, at: &str) -> Result<u32, SchemaError> {
        let item = match m.get("items") {
            None => self.base.value,
            Some(Value::Array(_)) => {
                return err(
                    at,
                    "items as a list (tuple validation) is not supported; use one schema",
                )
            }
            Some(s) => self.compile(s, &format!("{at}/items"))?,
        };
        let (min, max) = bounds(m, "minItems", "maxItems", at)?;
        container(&mut self.b, self.base.ws, b'[', item, b']', min, max).or_else(|e| err(at, e))
    }

    fn object(&mut self, m: &Map<String, Value>, at: &str) -> Result<u32, SchemaError> {
        let empty = Map::new();
        let props = match m.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(p) => return err(at, format!("properties must be an object, got {p}")),
        };
        let mut required: Vec<&str> = Vec::new();
        match m.get("required") {
            None => {}
            Some(Value::Array(l)) => {
                for v in l {
                    let Some(name) = v.as_str() else {
                        return err(at, format!("required entries must be strings, got {v}"));
                    };
                    if !props.contains_key(name) {
                        return err(
                            at,
                            format!("required property {name:?} is not in properties (declare its schema there)"),
                        );
                    }
                    required.push(name);
                }
            }
            Some(v) => return err(at, format!("required must be an array of strings, got {v}")),
        }
        let additional = match m.get("additionalProperties") {
            None | Some(Value::Bool(_)) => None,
            Some(s @ Value::Object(_)) => Some(s),
            Some(v) => {
                return err(
                    at,
                    format!("additionalProperties must be a boolean or a schema, got {v}"),
                )
            }
        };
        if props.is_empty() {
            return match additional {
                None if m.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    self.add(vec![seq(&[lit(b"{"), r(self.base.ws), lit(b"}")])], at)
                }
                None => Ok(self.base.object),
                Some(s) => {
                    let v = self.compile(s, &format!("{at}/additionalProperties"))?;
                    let ws = self.base.ws;
                    let member = self.add(
                        vec![seq(&[r(self.base.string), r(ws), lit(b":"), r(ws), r(v)])],
                        at,
                    )?;
                    container(&mut self.b, ws, b'{', member, b'}', 0, INF).or_else(|e| err(at, e))
                }
            };
        }
        if additional.is_some() {
            return err(
                at,
                "additionalProperties as a schema together with properties is not supported",
            );
        }
        // One key-value rule per property, in schema order.
        let ws = self.base.ws;
        let mut names: Vec<&String> = props.keys().collect();
        if let Some(keys) = self
            .order
            .and_then(|o| o.keys_at(&format!("{at}/properties")))
        {
            let rank = |n: &String| keys.iter().position(|k| *k == n.as_str());
            names.sort_by_key(|n| rank(n));
        }
        let mut kvs = Vec::new();
        for name in names {
            let sub = &props[name];
            let v = self.compile(sub, &format!("{at}/properties/{}", escape_pointer(name)))?;
            let key = Value::String(name.clone()).to_string();
            let kv = self.add(
                vec![seq(&[lit(key.as_bytes()), r(ws), lit(b":"), r(ws), r(v)])],
                at,
            )?;
            kvs.push((kv, required.contains(&name.as_str())));
        }
        // first[i]: properties i.. with none written yet; rest[i]: with one written before
        // (each then follows a comma). An optional property is an alternative that skips it.
        let n = kvs.len();
        let mut first = vec![0u32; n + 1];
        let mut rest = vec![0u32; n + 1];
        first[n] = self.add(vec![vec![]], at)?;
        rest[n] = first[n];
        for i in (0..n).rev() {
            let (kv, req) = kvs[i];
            let with = seq(&[r(ws), lit(b","), r(ws), r(kv), r(rest[i + 1])]);
            rest[i] = if req {
                self.add(vec![with], at)?
            } else {
                self.add(vec![with, r(rest[i + 1])], at)?
            };
            let start = seq(&[r(kv), r(rest[i + 1])]);
            first[i] = if req {
                self.add(vec![start], at)?
            } else {
                self.add(vec![start, r(first[i + 1])], at)?
            };
        }
        self.add(
            vec![seq(&[lit(b"{"), r(ws), r(first[0]), r(ws), lit(b"}")])],
            at,
        )
    }
}

fn escape_pointer(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// Checks `v` against `schema` (the subset [`json_schema`] compiles; anything else in the
/// schema is an error): the reference the constrained output is tested against.
pub fn validate(schema: &Value, v: &Value) -> Result<(), String> {
    check(schema, schema, v, "")
}

fn check(root: &Value, s: &Value, v: &Value, at: &str) -> Result<(), String> {
    let m = match s {
        Value::Bool(true) => return Ok(()),
        Value::Bool(false) => return Err(format!("{at}: false schema")),
        Value::Object(m) => m,
        _ => return Err(format!("{at}: bad schema")),
    };
    for k in m.keys() {
        if !KEYWORDS.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()) {
            return Err(format!("{at}: unsupported keyword {k}"));
        }
    }
    if let Some(r) = m.get("$ref").and_then(Value::as_str) {
        let t = r
            .strip_prefix('#')
            .and_then(|p| root.pointer(p))
            .ok_or_else(|| format!("{at}: bad $ref {r}"))?;
        check(root, t, v, at)?;
    }
    for kw in ["anyOf", "oneOf"] {
        if let Some(list) = m.get(kw).and_then(Value::as_array) {
            let ok = list
                .iter()
                .filter(|s| check(root, s, v, at).is_ok())
                .count();
            if ok == 0 || (kw == "oneOf" && ok > 1) {
                return Err(format!("{at}: {ok} branches of {kw} match {v}"));
            }
        }
    }
    match m.get("type") {
        None => {}
        Some(t) => {
            let list: Vec<&str> = match t {
                Value::String(t) => vec![t.as_str()],
                Value::Array(l) => l.iter().filter_map(Value::as_str).collect(),
                _ => return Err(format!("{at}: bad type")),
            };
            if !list.iter().any(|t| types_of(v).contains(t)) {
                return Err(format!("{at}: {v} is not of type {t}"));
            }
        }
    }
    if let Some(c) = m.get("const") {
        if c != v {
            return Err(format!("{at}: {v} is not the const {c}"));
        }
    }
    if let Some(e) = m.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            return Err(format!("{at}: {v} is not in the enum"));
        }
    }
    match v {
        Value::String(s) => {
            let n = s.chars().count() as u64;
            if count(m, "minLength", at)
                .ok()
                .flatten()
                .is_some_and(|min| n < min)
                || count(m, "maxLength", at)
                    .ok()
                    .flatten()
                    .is_some_and(|max| n > max)
            {
                return Err(format!(
                    "{at}: string of {n} chars is out of the length bounds"
                ));
            }
        }
        Value::Array(items) => {
            let n = items.len() as u64;
            if count(m, "minItems", at)
                .ok()
                .flatten()
                .is_some_and(|min| n < min)
                || count(m, "maxItems", at)
                    .ok()
                    .flatten()
                    .is_some_and(|max| n > max)
            {
                return Err(format!("{at}: array of {n} items is out of the bounds"));
            }
            if let Some(s) = m.get("items") {
                for (i, x) in items.iter().enumerate() {
                    check(root, s, x, &format!("{at}/{i}"))?;
                }
            }
        }
        Value::Object(o) => {
            let props = m.get("properties").and_then(Value::as_object);
            if let Some(req) = m.get("required").and_then(Value::as_array) {
                for k in req.iter().filter_map(Value::as_str) {
                    if !o.contains_key(k) {
                        return Err(format!("{at}: required property {k} is missing"));
                    }
                }
            }
            for (k, x) in o {
                let at = format!("{at}/{k}");
                match props.and_then(|p| p.get(k)) {
                    Some(s) => check(root, s, x, &at)?,
                    None => match m.get("additionalProperties") {
                        Some(Value::Bool(false)) => {
                            return Err(format!("{at}: additional property"))
                        }
                        Some(s @ Value::Object(_)) => check(root, s, x, &at)?,
                        _ => {}
                    },
                }
            }
        }
        _ => {}
    }
    Ok(())
}

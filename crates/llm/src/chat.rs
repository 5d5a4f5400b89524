//! Chat templates: `tokenizer.chat_template` rendered with minijinja, configured to behave like
//! `transformers`' `apply_chat_template` (jinja2 with `trim_blocks`, `lstrip_blocks`, loop
//! controls, `raise_exception`, `strftime_now`, a `tojson` that writes Python's `json.dumps`
//! format, and Python string/dict methods such as `.strip()` and `.items()`).
//!
//! Variables a template sees: `messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
//! plus any extra ones the caller passes (`date_string`, `tools`, ...).

use std::time::{SystemTime, UNIX_EPOCH};

use ferrite_gguf::GgufFile;
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};
use serde::Serialize;

use crate::tokenizer::{Tokenizer, TokenizerError};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChatError {
    #[error(transparent)]
    Gguf(#[from] ferrite_gguf::Error),
    /// The template does not parse.
    #[error("chat template: syntax error: {0:#}")]
    Syntax(minijinja::Error),
    /// Rendering failed: `raise_exception` in the template, or an undefined operation.
    #[error("chat template: {0:#}")]
    Render(minijinja::Error),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

/// One chat message. Templates read `message['role']` and `message['content']`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }
}

/// Where a model's template came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TemplateSource {
    /// `tokenizer.chat_template` of the GGUF file.
    Gguf,
    /// Gemma 3's published template, for gemma3 files that carry none.
    BuiltinGemma3,
    /// ChatML (`<|im_start|>role\n...<|im_end|>\n`), for other files that carry none.
    BuiltinChatml,
}

/// Gemma 3's chat template as published with the instruction-tuned models.
pub const GEMMA3_TEMPLATE: &str = include_str!("templates/gemma3.jinja");

/// ChatML, the fallback llama.cpp uses too.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// A compiled chat template with its special-token variables.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    source: TemplateSource,
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the strings the template sees.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, ChatError> {
        Self::with_source(source, bos_token, eos_token, TemplateSource::Gguf)
    }

    fn with_source(
        template: &str,
        bos_token: &str,
        eos_token: &str,
        source: TemplateSource,
    ) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, template.to_string())
            .map_err(ChatError::Syntax)?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            source,
        })
    }

    /// The template of a GGUF file: `tokenizer.chat_template` when present, else Gemma 3's
    /// for gemma3 files, else ChatML. BOS/EOS strings come from `tok`.
    pub fn from_gguf(file: &GgufFile, tok: &Tokenizer) -> Result<ChatTemplate, ChatError> {
        let text = |id: Option<u32>| {
            id.and_then(|id| tok.token_text(id))
                .unwrap_or_default()
                .to_string()
        };
        let (bos, eos) = (text(tok.bos()), text(tok.eos()));
        if file.get("tokenizer.chat_template").is_some() {
            let source = file.get_str("tokenizer.chat_template")?;
            return Self::with_source(source, &bos, &eos, TemplateSource::Gguf);
        }
        let arch = file
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        if arch == "gemma3" {
            Self::with_source(GEMMA3_TEMPLATE, &bos, &eos, TemplateSource::BuiltinGemma3)
        } else {
            Self::with_source(CHATML_TEMPLATE, &bos, &eos, TemplateSource::BuiltinChatml)
        }
    }

    pub fn source(&self) -> TemplateSource {
        self.source
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's
    /// reply begins.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_with(messages, add_generation_prompt, &[])
    }

    /// `render` with any serializable messages (e.g. `serde_json::Value` with list contents)
    /// and extra template variables (`("date_string", ...)`, `("tools", ...)`).
    pub fn render_with<M: Serialize>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
        extra: &[(&str, Value)],
    ) -> Result<String, ChatError> {
        let tmpl = self.env.get_template(NAME).map_err(ChatError::Render)?;
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", Value::from_serialize(messages)),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("bos_token", Value::from(self.bos_token.as_str())),
            ("eos_token", Value::from(self.eos_token.as_str())),
        ];
        ctx.extend(extra.iter().cloned());
        let ctx: Value = ctx.into_iter().collect();
        tmpl.render(ctx).map_err(ChatError::Render)
    }
}

impl ChatTemplate {
    /// Renders `messages` and tokenizes the result: the template's markup parses into control
    /// tokens, while the messages' own text is plain text (a user writing `<|im_end|>` cannot
    /// end a turn) unless `special`. BOS as in [`encode_prompt`].
    pub fn encode(
        &self,
        tok: &Tokenizer,
        messages: &[Message],
        add_generation_prompt: bool,
        special: bool,
    ) -> Result<Vec<u32>, ChatError> {
        const OPEN: char = '\u{F8F0}';
        const CLOSE: char = '\u{F8F1}';
        let marked = !special && !messages.iter().any(|m| m.content.contains([OPEN, CLOSE]));
        if !marked {
            let text = self.render(messages, add_generation_prompt)?;
            return Ok(encode_prompt(tok, &text)?);
        }
        // Render with each content replaced by a private-use marker, then put the contents
        // back, remembering where they lie.
        let stand_in: Vec<Message> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| Message::new(m.role.clone(), format!("{OPEN}{i}{CLOSE}")))
            .collect();
        let rendered = self.render(&stand_in, add_generation_prompt)?;
        let mut text = String::with_capacity(rendered.len());
        let mut plain = Vec::new();
        let mut rest = rendered.as_str();
        while let Some(a) = rest.find(OPEN) {
            text.push_str(&rest[..a]);
            let after = &rest[a + OPEN.len_utf8()..];
            let Some(b) = after.find(CLOSE) else { break };
            let Some(m) = after[..b]
                .parse::<usize>()
                .ok()
                .and_then(|i| messages.get(i))
            else {
                break;
            };
            plain.push(text.len()..text.len() + m.content.len());
            text.push_str(&m.content);
            rest = &after[b + CLOSE.len_utf8()..];
        }
        text.push_str(rest);
        if text.contains([OPEN, CLOSE]) {
            // The template transformed a marker (e.g. sliced the content): render as is.
            let text = self.render(messages, add_generation_prompt)?;
            return Ok(encode_prompt(tok, &text)?);
        }
        let mut ids = Vec::new();
        if tok.add_bos() {
            let bos = tok.bos();
            let written = bos
                .and_then(|id| tok.token_text(id))
                .is_some_and(|t| text.starts_with(t));
            if !written {
                ids.extend(bos);
            }
        }
        ids.extend(tok.encode_plain_ranges(&text, false, true, &plain)?);
        Ok(ids)
    }
}

/// Token ids of a rendered chat prompt: special tokens written in it are parsed, and BOS is
/// prepended only when the metadata asks for one and the template did not write it already
/// (as llama.cpp does; for templates that write BOS this equals transformers'
/// `apply_chat_template(tokenize=True)`).
pub fn encode_prompt(tok: &Tokenizer, rendered: &str) -> Result<Vec<u32>, TokenizerError> {
    let mut ids = Vec::new();
    if tok.add_bos() {
        let bos = tok.bos();
        let written = bos
            .and_then(|id| tok.token_text(id))
            .is_some_and(|t| rendered.starts_with(t));
        if !written {
            ids.extend(bos);
        }
    }
    ids.extend(tok.encode(rendered, false)?);
    Ok(ids)
}

fn raise_exception(msg: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(format)`: the current UTC time, C `strftime` codes %Y %y %m %d %e %H %M %S
/// %j %b %B %a %A %p %%.
fn strftime_now(format: String) -> Result<Value, minijinja::Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Ok(Value::from(strftime(&format, secs)))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats `unix_secs` (UTC) with C `strftime` codes; unknown codes are copied through.
pub fn strftime(format: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let tod = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let (hh, mm, ss) = (tod / 3600, tod / 60 % 60, tod % 60);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('b') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 -> (year, month 1..=12, day 1..=31), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent)`:
/// `", "` and `": "` separators on one line, or `indent` spaces per level; no HTML escaping.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_json(&json, indent, sort_keys.unwrap_or(false), 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_json(
    v: &serde_json::Value,
    indent: Option<usize>,
    sort: bool,
    depth: usize,
    out: &mut String,
) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(item, indent, sort, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            let mut entries: Vec<_> = map.iter().collect();
            if sort {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                out.push_str(&J::String(k.clone()).to_string());
                out.push_str(": ");
                write_json(item, indent, sort, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_dates() {
        // 2024-07-26 00:00:00 UTC was a Friday.
        let t = 1_721_952_000;
        assert_eq!(strftime("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime("%A %B %e, %y %H:%M:%S %j %%", t + 3661),
            "Friday July 26, 24 01:01:01 208 %"
        );
        assert_eq!(strftime("%Y-%m-%d", 951_782_400), "2000-02-29");
        assert_eq!(strftime("%Y-%m-%d %a", 0), "1970-01-01 Thu");
    }

    #[test]
    fn tojson_is_pythons_json_dumps() {
        let t = ChatTemplate::new(
            "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ '<a&b>' | tojson }}",
            "",
            "",
        )
        .unwrap();
        let x: Value = serde_json::from_str::<serde_json::Value>(r#"{"a": [1, "ü"], "b": {}}"#)
            .map(|j| Value::from_serialize(&j))
            .unwrap();
        let out = t.render_with::<Message>(&[], false, &[("x", x)]).unwrap();
        assert_eq!(
            out,
            "{\"a\": [1, \"ü\"], \"b\": {}}|{\n  \"a\": [\n    1,\n    \"ü\"\n  ],\n  \"b\": {}\n}|\"<a&b>\""
        );
    }

    #[test]
    fn raise_exception_is_an_error_with_its_message() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "", "").unwrap();
        let e = t.render(&[], false).unwrap_err().to_string();
        assert!(e.contains("roles must alternate"), "{e}");
    }

    #[test]
    fn syntax_errors_are_reported() {
        let e = ChatTemplate::new("{% for %}", "", "")
            .err()
            .unwrap()
            .to_string();
        assert!(e.starts_with("chat template: syntax error"), "{e}");
    }

    #[test]
    fn python_string_methods_and_loop_vars() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ loop.index }}:{{ m.content.strip() }}{% if not loop.last %},{% endif %}{% endfor %}{{ bos_token }}",
            "<s>",
            "</s>",
        )
        .unwrap();
        let out = t
            .render(&[Message::user("  a "), Message::assistant("b\n")], false)
            .unwrap();
        assert_eq!(out, "1:a,2:b<s>");
    }
}

//! Chat templates: Jinja templates from `tokenizer_config.json` /
//! `chat_template.jinja` / GGUF `tokenizer.chat_template`, rendered the way
//! `transformers` renders them.
//!
//! Owner: `engram-tokenizer`. Invariants (mirroring transformers'
//! `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`):
//! * `trim_blocks` and `lstrip_blocks` on, `keep_trailing_newline` off;
//! * `minijinja_contrib` filters/functions and the pycompat method callback
//!   (`.strip()`, `.startswith()`, `.items()`, `.split()`, ...);
//! * `raise_exception(msg)` aborts rendering with an error carrying `msg`;
//! * `strftime_now(fmt)` formats the current UTC time;
//! * `tojson` behaves like transformers' (Python `json.dumps`, `ensure_ascii=False`,
//!   no HTML escaping; `indent`, `sort_keys` and `separators` keyword arguments);
//! * variables: `messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
//!   and `tools` / `documents` (none unless given, as transformers passes them), plus
//!   any extra ones given to [`ChatTemplate::render_with`] (as
//!   `apply_chat_template`'s keyword arguments, e.g. Qwen3's `enable_thinking`, or the
//!   request's `tools`);
//! * transformers' `{% generation %}` ... `{% endgeneration %}` markers are accepted
//!   and render their body unchanged;
//! * the template is compiled once in [`ChatTemplate::new`].

use crate::error::{Result, TokenizerError};
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The message text.
    pub content: String,
    /// Further fields the template sees on the message, as transformers passes them
    /// (`tool_calls`, `tool_call_id`, `name`, `reasoning_content`); empty for most messages.
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

impl ChatMessage {
    /// Build a message from a role and its text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into(), fields: serde_json::Map::new() }
    }

    /// The message with the further field `key` set to `value`.
    pub fn with(mut self, key: &str, value: serde_json::Value) -> Self {
        self.fields.insert(key.to_string(), value);
        self
    }
}

const NAME: &str = "chat_template";

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("source_len", &self.source.len()).finish()
    }
}

impl Clone for ChatTemplate {
    fn clone(&self) -> Self {
        ChatTemplate::new(&self.source).expect("template compiled before")
    }
}

impl ChatTemplate {
    /// Compile `source` (syntax errors are reported here, not at render time).
    pub fn new(source: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        let prepared = neutralize_generation_tags(source);
        env.add_template_owned(NAME, prepared).map_err(|e| TokenizerError::ChatTemplate(format!("does not compile: {}", describe(&e))))?;
        Ok(ChatTemplate { env, source: source.to_string() })
    }

    /// The template source as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render a conversation. `add_generation_prompt` asks the template to open an
    /// assistant turn at the end.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool, bos_token: &str, eos_token: &str) -> Result<String> {
        self.render_with(messages, add_generation_prompt, bos_token, eos_token, &serde_json::Map::new())
    }

    /// [`ChatTemplate::render`] with extra template variables, as transformers passes
    /// `apply_chat_template`'s keyword arguments (`enable_thinking=False` for Qwen3's
    /// template, `tools`). The standard variables above take precedence over an extra of the
    /// same name (`tools` and `documents` aside, which an extra sets).
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let tmpl = self.env.get_template(NAME).map_err(|e| TokenizerError::ChatTemplate(describe(&e)))?;
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token,
            eos_token => eos_token,
            tools => extra.get("tools").map(Value::from_serialize).unwrap_or(Value::from(())),
            documents => extra.get("documents").map(Value::from_serialize).unwrap_or(Value::from(())),
            ..Value::from_serialize(extra)
        };
        tmpl.render(ctx).map_err(|e| TokenizerError::ChatTemplate(describe(&e)))
    }
}

fn describe(e: &Error) -> String {
    let mut s = match e.kind() {
        ErrorKind::InvalidOperation if e.detail().is_some() => e.detail().unwrap_or("").to_string(),
        _ => e.to_string(),
    };
    if let Some(line) = e.line() {
        s.push_str(&format!(" (template line {line})"));
    }
    s
}

fn raise_exception(msg: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// Replace `{% generation %}` / `{% endgeneration %}` (any whitespace control)
/// by `{% if true %}` / `{% endif %}`.
fn neutralize_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(pos) = rest.find("{%") {
        out.push_str(&rest[..pos]);
        let tag = &rest[pos..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[body.len() - 1..]),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{lead} {r} {trail}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

// ---------------------------------------------------------------- tojson

fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let _ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent: Option<String> = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => {
            if let Some(s) = v.as_str() {
                Some(s.to_string())
            } else {
                let n = i64::try_from(v.clone())
                    .map_err(|_| Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an int or a string"))?;
                Some(" ".repeat(n.max(0) as usize))
            }
        }
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let a = v.get_item(&Value::from(0))?;
            let b = v.get_item(&Value::from(1))?;
            match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => (a.to_string(), b.to_string()),
                _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair of strings")),
            }
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let fmt = JsonFmt { indent: indent.as_deref(), item_sep: &item_sep, key_sep: &key_sep, sort_keys: sort_keys.unwrap_or(false) };
    let mut out = String::new();
    fmt.write(value, 0, &mut out)?;
    Ok(Value::from(out))
}

/// Python `json.dumps` formatting over minijinja values (maps keep their order).
struct JsonFmt<'a> {
    indent: Option<&'a str>,
    item_sep: &'a str,
    key_sep: &'a str,
    sort_keys: bool,
}

impl JsonFmt<'_> {
    fn newline(&self, level: usize, out: &mut String) {
        if let Some(ind) = self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn string(s: &str, out: &mut String) {
        out.push_str(&serde_json::to_string(s).unwrap_or_default());
    }

    fn write(&self, v: &Value, level: usize, out: &mut String) -> std::result::Result<(), Error> {
        use minijinja::value::ValueKind as K;
        match v.kind() {
            K::Undefined | K::None => out.push_str("null"),
            K::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            K::String => Self::string(v.as_str().unwrap_or(""), out),
            K::Number => {
                if v.is_integer() {
                    out.push_str(&v.to_string());
                    return Ok(());
                }
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                if f.is_nan() {
                    out.push_str("NaN");
                } else if f.is_infinite() {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                } else if f.fract() == 0.0 && f.abs() < 1e16 {
                    out.push_str(&format!("{f:.1}"));
                } else {
                    out.push_str(&format!("{f}"));
                }
            }
            K::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                if self.sort_keys {
                    keys.sort();
                }
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(level + 1, out);
                    match k.as_str() {
                        Some(s) => Self::string(s, out),
                        None => Self::string(&k.to_string(), out),
                    }
                    out.push_str(self.key_sep);
                    self.write(&v.get_item(k)?, level + 1, out)?;
                }
                self.newline(level, out);
                out.push('}');
            }
            K::Seq | K::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(level + 1, out);
                    self.write(item, level + 1, out)?;
                }
                self.newline(level, out);
                out.push(']');
            }
            _ => Self::string(&v.to_string(), out),
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- strftime_now

fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    strftime_utc(&fmt, secs)
}

const MONTHS: [&str; 12] =
    ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Days since 1970-01-01 -> (year, month 1..=12, day 1..=31) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// (year, month, day) -> days since 1970-01-01 (inverse of `civil_from_days`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A subset of C `strftime` over a UTC Unix time: `%Y %y %m %d %e %H %I %M %S %p
/// %b %B %h %a %A %j %u %w %F %T %D %Z %z %%`, with `-` (no padding) as in `%-d`.
pub(crate) fn strftime_utc(fmt: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let sod = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (sod / 3600, (sod / 60) % 60, sod % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday (Mon=0)
    let jan1 = days_from_civil(y, 1, 1);
    let yday = days - jan1 + 1;
    let mut out = String::new();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let nopad = chars.peek() == Some(&'-');
        if nopad {
            chars.next();
        }
        let num = |v: i64, w: usize| {
            if nopad {
                v.to_string()
            } else {
                format!("{v:0w$}")
            }
        };
        let Some(spec) = chars.next() else {
            out.push('%');
            break;
        };
        let s = match spec {
            'Y' => y.to_string(),
            'y' => num(y.rem_euclid(100), 2),
            'm' => num(m as i64, 2),
            'd' => num(d as i64, 2),
            'e' => format!("{d:>2}"),
            'H' => num(hh, 2),
            'I' => num(if hh % 12 == 0 { 12 } else { hh % 12 }, 2),
            'M' => num(mm, 2),
            'S' => num(ss, 2),
            'p' => (if hh < 12 { "AM" } else { "PM" }).to_string(),
            'b' | 'h' => MONTHS[m as usize - 1][..3].to_string(),
            'B' => MONTHS[m as usize - 1].to_string(),
            'a' => DAYS[weekday][..3].to_string(),
            'A' => DAYS[weekday].to_string(),
            'j' => num(yday, 3),
            'u' => (weekday + 1).to_string(),
            'w' => ((weekday + 1) % 7).to_string(),
            'F' => format!("{y:04}-{m:02}-{d:02}"),
            'T' => format!("{hh:02}:{mm:02}:{ss:02}"),
            'D' => format!("{m:02}/{d:02}/{:02}", y.rem_euclid(100)),
            'Z' => "UTC".to_string(),
            'z' => "+0000".to_string(),
            '%' => "%".to_string(),
            other => format!("%{}{other}", if nopad { "-" } else { "" }),
        };
        out.push_str(&s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_python() {
        // Values from Python: datetime.fromtimestamp(ts, timezone.utc).strftime(FMT)
        const FMT: &str = "%Y-%m-%d %H:%M:%S %a %A %b %B %j %-d %I %p %y %e|%u %w";
        for (ts, want) in [
            (0, "1970-01-01 00:00:00 Thu Thursday Jan January 001 1 12 AM 70  1|4 4"),
            (951782400, "2000-02-29 00:00:00 Tue Tuesday Feb February 060 29 12 AM 00 29|2 2"),
            (1735689599, "2024-12-31 23:59:59 Tue Tuesday Dec December 366 31 11 PM 24 31|2 2"),
            (1709164800, "2024-02-29 00:00:00 Thu Thursday Feb February 060 29 12 AM 24 29|4 4"),
            (-86400, "1969-12-31 00:00:00 Wed Wednesday Dec December 365 31 12 AM 69 31|3 3"),
        ] {
            assert_eq!(strftime_utc(FMT, ts), want, "ts={ts}");
        }
        assert_eq!(strftime_utc("100%% %Q", 0), "100% %Q");
    }

    #[test]
    fn generation_tags_are_neutralized() {
        assert_eq!(
            neutralize_generation_tags("a{%- generation %}b{% endgeneration -%}c{% if x %}"),
            "a{%- if true %}b{% endif -%}c{% if x %}"
        );
        let t = ChatTemplate::new("{% generation %}[{{ eos_token }}]{% endgeneration %}").unwrap();
        assert_eq!(t.render(&[], false, "", "E").unwrap(), "[E]");
    }

    #[test]
    fn extra_variables_reach_the_template_and_do_not_override_the_standard_ones() {
        let t =
            ChatTemplate::new("{% if enable_thinking is defined and enable_thinking is false %}off{% else %}on{% endif %}|{{ eos_token }}")
                .unwrap();
        assert_eq!(t.render(&[], false, "", "E").unwrap(), "on|E");
        let mut extra = serde_json::Map::new();
        extra.insert("enable_thinking".into(), serde_json::Value::Bool(false));
        extra.insert("eos_token".into(), serde_json::Value::String("X".into()));
        assert_eq!(t.render_with(&[], false, "", "E", &extra).unwrap(), "off|E");
    }

    #[test]
    fn tools_and_message_fields_reach_the_template() {
        let src = "{% if tools %}{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% endif %}\
                   {% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls[0].function.name }}{% endif %}\
                   {% if m.tool_call_id is defined %}#{{ m.tool_call_id }}{% endif %};{% endfor %}";
        let t = ChatTemplate::new(src).unwrap();
        let msgs = [
            ChatMessage::new("assistant", "").with("tool_calls", serde_json::json!([{"function": {"name": "f"}}])),
            ChatMessage::new("tool", "42").with("tool_call_id", serde_json::json!("c1")),
        ];
        assert_eq!(t.render(&msgs, false, "", "").unwrap(), "assistant:f;tool:42#c1;", "no tools: none");
        let mut extra = serde_json::Map::new();
        extra.insert("tools".into(), serde_json::json!([{"type": "function", "function": {"name": "f"}}]));
        assert_eq!(t.render_with(&msgs, false, "", "", &extra).unwrap(), "[f]assistant:f;tool:42#c1;");
    }

    #[test]
    fn tojson_like_python() {
        let t = ChatTemplate::new(
            "{{ {'z': 1, 'a': [1.5, 'é\"<'], 'e': {}} | tojson }}#{{ {'z': 1, 'a': 2} | tojson(indent=2, sort_keys=true) }}#{{ [1,2] | tojson(separators=[',', ':']) }}",
        )
        .unwrap();
        // json.dumps({"z": 1, "a": [1.5, 'é"<'], "e": {}}, ensure_ascii=False) etc.
        assert_eq!(
            t.render(&[], false, "", "").unwrap(),
            "{\"z\": 1, \"a\": [1.5, \"é\\\"<\"], \"e\": {}}#{\n  \"a\": 2,\n  \"z\": 1\n}#[1,2]"
        );
    }
}

//! The `tojson` filter as transformers defines it for chat templates: Python's
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
//! minijinja's own `tojson` differs in ways that change the prompt (and so the token ids): no space after
//! `,` and `:`, HTML-escaped `<>&'`, and key order not kept when values came through serde_json.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

struct Style {
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

/// The filter: `value | tojson`, `tojson(indent=4)`, `tojson(4)`, plus `ensure_ascii`, `separators`,
/// `sort_keys` keyword arguments as in Python.
pub fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let indent = match indent {
        Some(indent) => Some(indent),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => Some(" ".repeat(usize::try_from(v)?)),
        },
    };
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let (item_separator, key_separator) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => return Err(Error::new(ErrorKind::InvalidOperation, "separators must be two strings")),
        // Python's defaults: no trailing space before the newline when indenting.
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let style = Style {
        indent,
        item_separator,
        key_separator,
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_value(&mut out, value, &style, 0)?;
    Ok(out)
}

fn write_value(out: &mut String, value: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    match value.kind() {
        // Lenient where Python would raise: an undefined value serializes as null.
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Map => write_map(out, value, style, depth)?,
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, ('[', ']'), items.len(), style, depth, |out, i| {
                write_value(out, &items[i], style, depth + 1)
            })?;
        }
        ValueKind::Plain => write_string(out, &value.to_string(), style.ensure_ascii),
        kind => return Err(Error::new(ErrorKind::InvalidOperation, format!("cannot serialize {kind} to JSON"))),
    }
    Ok(())
}

fn write_map(out: &mut String, value: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    let mut entries: Vec<(String, Value)> = Vec::new();
    for key in value.try_iter()? {
        let item = value.get_item(&key)?;
        // JSON keys are strings; Python writes non-string keys with their JSON spelling.
        let key = match key.as_str() {
            Some(s) => s.to_owned(),
            None => tojson_scalar_key(&key),
        };
        entries.push((key, item));
    }
    if style.sort_keys {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
    }
    write_container(out, ('{', '}'), entries.len(), style, depth, |out, i| {
        write_string(out, &entries[i].0, style.ensure_ascii);
        out.push_str(&style.key_separator);
        write_value(out, &entries[i].1, style, depth + 1)
    })
}

fn tojson_scalar_key(key: &Value) -> String {
    match key.kind() {
        ValueKind::None | ValueKind::Undefined => "null".to_owned(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_owned(),
        _ => key.to_string(),
    }
}

/// Brackets, separators and Python's indentation (`"[\n" + indent*(depth+1) + item ...`).
fn write_container(
    out: &mut String,
    (open, close): (char, char),
    len: usize,
    style: &Style,
    depth: usize,
    mut write_item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    let newline_indent = |level: usize| style.indent.as_ref().map(|unit| format!("\n{}", unit.repeat(level)));
    let inner = newline_indent(depth + 1);
    for i in 0..len {
        if i > 0 {
            out.push_str(&style.item_separator);
        }
        if let Some(inner) = &inner {
            out.push_str(inner);
        }
        write_item(out, i)?;
    }
    if let Some(outer) = newline_indent(depth) {
        out.push_str(&outer);
    }
    out.push(close);
    Ok(())
}

fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        out.push_str(&value.to_string());
        return;
    }
    let x = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    out.push_str(&python_float_repr(x));
}

/// Python's `repr(float)`: shortest round-trip digits, fixed notation for exponents -4..16, otherwise
/// `1e+20` style; always a `.0` on integral values. json.dumps spells non-finite values NaN/Infinity.
fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return (if x > 0.0 { "Infinity" } else { "-Infinity" }).into();
    }
    let scientific = format!("{x:e}"); // e.g. "-1.25e-7": shortest digits, as Python picks them
    let (mantissa, exponent) = scientific.split_once('e').expect("{:e} has an exponent");
    let exponent: i32 = exponent.parse().expect("{:e} exponent is an integer");
    if (-4..16).contains(&exponent) {
        let fixed = format!("{x}");
        return if fixed.contains('.') { fixed } else { format!("{fixed}.0") };
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.abs())
}

fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use minijinja::{context, Environment};

    fn render(template: &str, ctx: minijinja::Value) -> String {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        env.render_str(template, ctx).unwrap()
    }

    #[test]
    fn matches_python_json_dumps_defaults() {
        let data: serde_json::Value = serde_json::from_str(
            r#"{"zeta": 1, "alpha": [true, null, 2.5, "<a & 'b'>"], "uni": "日本\n", "empty": {}}"#,
        )
        .unwrap();
        // What json.dumps(data, ensure_ascii=False) prints, key order included: insertion order, as
        // Python's dicts keep it (tools in chat templates are rendered this way).
        assert_eq!(
            render("{{ data | tojson }}", context! { data }),
            r#"{"zeta": 1, "alpha": [true, null, 2.5, "<a & 'b'>"], "uni": "日本\n", "empty": {}}"#
        );
    }

    #[test]
    fn indent_and_keyword_arguments_follow_python() {
        let data: serde_json::Value = serde_json::from_str(r#"{"a": [1, 2], "b": []}"#).unwrap();
        assert_eq!(
            render("{{ data | tojson(indent=2) }}", context! { data }),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": []\n}"
        );
        let data = serde_json::json!({"b": "é", "a": 1});
        assert_eq!(
            render("{{ data | tojson(ensure_ascii=true, sort_keys=true, separators=[',', ':']) }}", context! { data }),
            r#"{"a":1,"b":"\u00e9"}"#
        );
    }

    #[test]
    fn floats_print_like_python_repr() {
        let cases = [(1.0, "1.0"), (0.1, "0.1"), (1e16, "1e+16"), (1.5e-7, "1.5e-07"), (123456.75, "123456.75")];
        for (x, expected) in cases {
            assert_eq!(super::python_float_repr(x), expected, "{x}");
        }
        assert_eq!(render("{{ x | tojson }}", context! { x => 0.0001 }), "0.0001");
    }
}

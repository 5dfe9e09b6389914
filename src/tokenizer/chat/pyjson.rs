//! Values as the Qwen3.5 chat template prints them. The template runs under Python Jinja, so
//! `tojson` is `json.dumps(x, ensure_ascii=False)` (separators `", "` and `": "`, keys in insertion
//! order, floats as Python's `repr`) and `| string` is Python's `str` (`True`, `None`, ...).

use serde_json::Value;

/// `json.dumps(v, ensure_ascii=False)`.
pub fn tojson(v: &Value) -> String {
    let mut out = String::new();
    write_json(v, &mut out);
    out
}

/// Jinja's `| string` of a JSON value under Python: strings raw, containers as JSON.
pub fn to_py_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(_) => tojson(v),
        // The template serialises mappings and sequences with `tojson` before `| string`.
        Value::Array(_) | Value::Object(_) => tojson(v),
    }
}

fn write_json(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (_, Some(u), _) => out.push_str(&u.to_string()),
            (_, _, Some(f)) => out.push_str(&py_float(f)),
            _ => out.push_str(&n.to_string()),
        },
        // serde_json escapes exactly the characters Python's dumps escapes when non-ASCII is kept
        // (`"`, `\`, and control characters, with the same short forms and lowercase `\u00XX`).
        Value::String(s) => out.push_str(&serde_json::to_string(s).unwrap_or_default()),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_json(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push_str(": ");
                write_json(item, out);
            }
            out.push('}');
        }
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, positional for exponents in -4..16,
/// otherwise `d.ddde+XX` with at least two exponent digits.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` prints the shortest digits that round-trip, like Python's repr.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        };
        format!("{sign}{body}")
    } else {
        let frac = &digits[1..];
        let m = if frac.is_empty() {
            digits[..1].to_string()
        } else {
            format!("{}.{}", &digits[..1], frac)
        };
        format!("{sign}{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_like_python_repr() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.0, "123456789012345.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.2345e-7, "1.2345e-07"),
            (0.0, "0.0"),
        ] {
            assert_eq!(py_float(f), want, "{f}");
        }
    }

    #[test]
    fn json_like_python_dumps() {
        let v: Value = serde_json::from_str(r#"{"b": [1, 2.5, "x\"y\n", null, true], "a": {"é": false}}"#).unwrap();
        assert_eq!(
            tojson(&v),
            r#"{"b": [1, 2.5, "x\"y\n", null, true], "a": {"é": false}}"#
        );
        assert_eq!(to_py_string(&Value::Bool(true)), "True");
        assert_eq!(to_py_string(&Value::Null), "None");
        assert_eq!(to_py_string(&Value::String("raw \"s\"".into())), "raw \"s\"");
    }
}

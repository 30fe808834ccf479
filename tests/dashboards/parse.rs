//! The two text parsers the dashboard tests need: a flattener for the block YAML of the
//! provisioning files, and the metric selectors of a PromQL expression.

use std::collections::BTreeMap;

/// Flattens the block YAML of the provisioning files (mappings, lists of mappings, scalars,
/// comments) into "path = value", e.g. "datasources.0.type" = "prometheus". Anything else (flow
/// collections, multi-line scalars) is not used there and is reported as an error.
pub fn flatten_yaml(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    // Open mappings: the indentation of the key that opened them, and their path.
    let mut open: Vec<(isize, String)> = vec![(-1, String::new())];
    let mut items: BTreeMap<String, usize> = BTreeMap::new();
    for (n, raw) in text.lines().enumerate() {
        let line = match raw.find(" #") {
            Some(i) => &raw[..i],
            None if raw.trim_start().starts_with('#') => "",
            None => raw,
        };
        if line.trim().is_empty() {
            continue;
        }
        let mut indent = (line.len() - line.trim_start().len()) as isize;
        let mut rest = line.trim();
        while open.last().unwrap().0 >= indent {
            open.pop();
        }
        let join = |parent: &str, key: &str| {
            if parent.is_empty() {
                key.to_string()
            } else {
                format!("{parent}.{key}")
            }
        };
        if let Some(item) = rest.strip_prefix("- ") {
            let list = open.last().unwrap().1.clone();
            let index = items.entry(list.clone()).or_default();
            open.push((indent, join(&list, &index.to_string())));
            *index += 1;
            rest = item.trim_start();
            indent += 2;
        }
        let (key, value) = rest
            .split_once(':')
            .filter(|(k, v)| !k.contains(' ') && (v.is_empty() || v.starts_with(' ')))
            .ok_or_else(|| format!("line {}: expected `key: value`, found {raw:?}", n + 1))?;
        let path = join(&open.last().unwrap().1, key);
        let value = value.trim().trim_matches('"').trim_matches('\'');
        if value.is_empty() {
            open.push((indent, path));
        } else if value.starts_with(['{', '[', '|', '>']) {
            return Err(format!(
                "line {}: flow collections and block scalars are not expected here",
                n + 1
            ));
        } else {
            out.insert(path, value.to_string());
        }
    }
    Ok(out)
}

/// The metric selectors inside a PromQL expression (`name`, `name{matchers}` or `{matchers}`,
/// without ranges): what an alert's expression reads, whatever it compares them with.
pub fn selectors(expr: &str) -> Vec<String> {
    // Words that are not metric names: operators, modifiers and aggregations (functions are
    // recognised by the parenthesis after them), and the modifiers a label list follows.
    const KEYWORDS: &[&str] = &[
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "inf",
        "nan",
    ];
    const LABEL_LISTS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let c: Vec<char> = expr.chars().collect();
    let skip_to = |mut i: usize, close: char| {
        let mut quote = None;
        while i < c.len() {
            match (quote, c[i]) {
                (Some(q), ch) if ch == q => quote = None,
                (Some(_), '\\') => i += 1,
                (None, '"' | '\'' | '`') => quote = Some(c[i]),
                (None, ch) if ch == close => return i + 1,
                _ => {}
            }
            i += 1;
        }
        i
    };
    let word = |ch: char| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':';
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '"' || ch == '\'' || ch == '`' {
            i = skip_to(i + 1, ch);
        } else if ch == '[' {
            i = skip_to(i + 1, ']');
        } else if ch == '{' {
            let end = skip_to(i + 1, '}');
            out.push(c[i..end].iter().collect());
            i = end;
        } else if ch.is_ascii_digit() || ch == '.' {
            while i < c.len() && (word(c[i]) || c[i] == '.') {
                i += 1;
            }
        } else if word(ch) {
            let start = i;
            while i < c.len() && word(c[i]) {
                i += 1;
            }
            let name: String = c[start..i].iter().collect();
            let mut next = i;
            while next < c.len() && c[next].is_whitespace() {
                next += 1;
            }
            let lower = name.to_ascii_lowercase();
            if LABEL_LISTS.contains(&lower.as_str()) && c.get(next) == Some(&'(') {
                i = skip_to(next + 1, ')');
            } else if c.get(next) == Some(&'(')
                || KEYWORDS.contains(&lower.as_str())
                || LABEL_LISTS.contains(&lower.as_str())
            {
                // A function call or a keyword: its arguments are scanned as they come.
            } else if c.get(next) == Some(&'{') {
                let end = skip_to(next + 1, '}');
                out.push(format!("{name}{}", c[next..end].iter().collect::<String>()));
                i = end;
            } else {
                out.push(name);
            }
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn the_yaml_flattener_reads_lists_of_mappings() {
    let text =
        "# c\napiVersion: 1\nitems:\n  - name: a # c\n    opts:\n      path: /x\n  - name: 'b'\n";
    let flat = flatten_yaml(text).unwrap();
    let expected: BTreeMap<String, String> = [
        ("apiVersion", "1"),
        ("items.0.name", "a"),
        ("items.0.opts.path", "/x"),
        ("items.1.name", "b"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(flat, expected);
    assert!(flatten_yaml("a: [1, 2]\n").is_err());
}

#[test]
fn selectors_of_an_alert_expression_are_its_metric_selectors() {
    let expr = r#"max by (mpi_job, phase) (sev{span="window", x="a}b"} and on (mpi_job) (firing == 1)) >= 0.5
        and on (mpi_job) (max by (mpi_job) (rate(running[5m] offset 1m)) == 1) unless {__name__="x"} > bool 1e3"#;
    assert_eq!(
        selectors(expr),
        [
            r#"sev{span="window", x="a}b"}"#,
            "firing",
            "running",
            r#"{__name__="x"}"#
        ]
    );
}

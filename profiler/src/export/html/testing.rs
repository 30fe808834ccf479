//! What the view tests share: just enough of an XML parser to check that the SVG is well formed
//! and to count what it draws, and the job whose strings the page must escape.

use std::collections::BTreeMap;

use crate::{store::JobMeta, test_support::JobMetaBuilder};

/// A parsed XML element: just enough XML to check well-formedness and count things.
#[derive(Debug)]
pub(super) struct Element {
    pub(super) name: String,
    pub(super) attrs: Vec<(String, String)>,
    pub(super) children: Vec<Element>,
}

impl Element {
    pub(super) fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn walk<'a>(&'a self, out: &mut Vec<&'a Element>) {
        out.push(self);
        for c in &self.children {
            c.walk(out);
        }
    }

    fn all(&self) -> Vec<&Element> {
        let mut out = Vec::new();
        self.walk(&mut out);
        out
    }

    pub(super) fn find(&self, name: &str, attr: &str, value: &str) -> Option<&Element> {
        self.all()
            .into_iter()
            .find(|e| e.name == name && e.attr(attr) == Some(value))
    }
}

fn check_entities(s: &str) -> Result<(), String> {
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        rest = &rest[i + 1..];
        let end = rest
            .find(';')
            .ok_or_else(|| format!("unterminated entity in {s:?}"))?;
        let name = &rest[..end];
        let ok = matches!(name, "amp" | "lt" | "gt" | "quot" | "apos")
            || name
                .strip_prefix("#x")
                .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()))
            || name
                .strip_prefix('#')
                .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()));
        if !ok {
            return Err(format!("bad entity &{name}; in {s:?}"));
        }
    }
    if s.contains('<') {
        return Err(format!("raw < in {s:?}"));
    }
    Ok(())
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
}

/// Parses one XML element (no prolog, comments, CDATA or processing instructions: the SVG
/// here has none), checking names, quoting, entities and nesting.
pub(super) fn parse_xml(s: &str) -> Result<Element, String> {
    let mut stack: Vec<Element> = Vec::new();
    let mut root = None;
    let mut rest = s;
    while !rest.is_empty() {
        let Some(lt) = rest.find('<') else {
            check_entities(rest)?;
            if !rest.trim().is_empty() && stack.is_empty() {
                return Err("text outside the root".into());
            }
            break;
        };
        let text = &rest[..lt];
        check_entities(text)?;
        if !text.trim().is_empty() && stack.is_empty() {
            return Err(format!("text outside the root: {text:?}"));
        }
        rest = &rest[lt + 1..];
        let gt = rest.find('>').ok_or("unterminated tag")?;
        let tag = &rest[..gt];
        rest = &rest[gt + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack
                .pop()
                .ok_or_else(|| format!("</{name}> without an open element"))?;
            if open.name != name.trim_end() {
                return Err(format!("<{}> closed by </{name}>", open.name));
            }
            match stack.last_mut() {
                Some(parent) => parent.children.push(open),
                None if root.is_none() => root = Some(open),
                None => return Err("two roots".into()),
            }
            continue;
        }
        let (tag, empty) = match tag.strip_suffix('/') {
            Some(t) => (t, true),
            None => (tag, false),
        };
        let name_end = tag.find(char::is_whitespace).unwrap_or(tag.len());
        let name = &tag[..name_end];
        if !is_name(name) {
            return Err(format!("bad element name {name:?}"));
        }
        let mut attrs: Vec<(String, String)> = Vec::new();
        let mut a = tag[name_end..].trim_start();
        while !a.is_empty() {
            let eq = a
                .find('=')
                .ok_or_else(|| format!("attribute without value in <{tag}>"))?;
            let key = &a[..eq];
            if !is_name(key) {
                return Err(format!("bad attribute name {key:?} in <{tag}>"));
            }
            let after = &a[eq + 1..];
            let quote = after
                .chars()
                .next()
                .filter(|c| *c == '"' || *c == '\'')
                .ok_or_else(|| format!("unquoted attribute in <{tag}>"))?;
            let close = after[1..]
                .find(quote)
                .ok_or_else(|| format!("unterminated attribute in <{tag}>"))?;
            let value = &after[1..1 + close];
            check_entities(value)?;
            if attrs.iter().any(|(k, _)| k == key) {
                return Err(format!("duplicate attribute {key} in <{tag}>"));
            }
            attrs.push((key.to_string(), value.to_string()));
            let next = &after[close + 2..];
            if !next.is_empty() && !next.starts_with(char::is_whitespace) {
                return Err(format!("no space between attributes in <{tag}>"));
            }
            a = next.trim_start();
        }
        let element = Element {
            name: name.to_string(),
            attrs,
            children: Vec::new(),
        };
        if empty {
            match stack.last_mut() {
                Some(parent) => parent.children.push(element),
                None if root.is_none() => root = Some(element),
                None => return Err("two roots".into()),
            }
        } else {
            stack.push(element);
        }
    }
    if let Some(open) = stack.last() {
        return Err(format!("<{}> never closed", open.name));
    }
    root.ok_or_else(|| "no element".to_string())
}

#[test]
fn the_checker_rejects_malformed_xml() {
    assert!(parse_xml(r#"<svg a="1"><g><rect/></g></svg>"#).is_ok());
    assert!(parse_xml("<svg><g></svg>").is_err());
    assert!(parse_xml(r#"<svg a=1/>"#).is_err());
    assert!(parse_xml("<svg>a & b</svg>").is_err());
    assert!(parse_xml(r#"<svg a="x" a="y"/>"#).is_err());
    assert!(parse_xml("<svg/><svg/>").is_err());
}

pub(super) fn svgs(html: &str) -> Vec<Element> {
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(start) = rest.find("<svg") {
        let end = rest[start..].find("</svg>").expect("closed svg") + start + "</svg>".len();
        out.push(parse_xml(&rest[start..end]).unwrap_or_else(|e| panic!("malformed SVG: {e}")));
        rest = &rest[end..];
    }
    out
}

/// A job of `size` ranks whose id, node and executable the page must escape, first seen half a
/// second before the synthetic job's first burst.
pub(super) fn meta_needing_escapes(size: u32) -> JobMeta {
    JobMetaBuilder::new("pmix:<a&b>")
        .node("node\"1\"")
        .size(size)
        .executable("/bin/app <x>")
        .first_seen_ns(1_700_000_000_000_000_000 - 500_000_000)
        .build()
}

/// Fill per cluster id (or "filtered") of the groups in the points or bursts group of an SVG,
/// and the number of circles or rects in each.
pub(super) fn groups(svg: &Element, class: &str, shape: &str) -> BTreeMap<String, (String, usize)> {
    let container = svg.find("g", "class", class).expect(class);
    container
        .children
        .iter()
        .map(|g| {
            let id = g
                .attr("data-cluster")
                .expect("group names its cluster")
                .to_string();
            let fill = g.attr("fill").expect("group has a fill").to_string();
            assert!(
                g.children.iter().all(|c| c.name == shape),
                "{class} holds only {shape}"
            );
            (id, (fill, g.children.len()))
        })
        .collect()
}

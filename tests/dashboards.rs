//! The Grafana dashboards (dashboards/grafana), their provisioning files (dashboards/provisioning)
//! and the Prometheus rules (dashboards/rules). Without root: the dashboards' structure, panel
//! ids and types, data source and variable references, promtool's checks and unit tests of every
//! rule file, and the provisioning keys Grafana reads. With root: every panel query, variable
//! query and rule against a real Prometheus scraping the real daemon while a real MPI job runs.
//!
//! Alert expressions are empty while nothing is wrong, so for an alert the live test requires
//! data from each metric selector inside its expression (the expression itself may be empty);
//! panels, variables and recording rules must return data themselves. Queries that need
//! hardware counters are skipped on a machine without a PMU, and the panel that lists what is not
//! measured must then have data.

use std::{
    collections::{BTreeMap, BTreeSet},
    ops::Range,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use mpiburst_tests::*;
use parse::{flatten_yaml, selectors};
use serde_json::Value;

#[path = "dashboards/parse.rs"]
mod parse;

fn dashboards_dir() -> PathBuf {
    rules_dir().join("..")
}

/// The data source every panel and target must use: the dashboard's `datasource` variable.
fn datasource_ref() -> Value {
    serde_json::json!({"type": "prometheus", "uid": "${datasource}"})
}

/// Grafana's global variables that may appear in queries.
const BUILTINS: &[&str] = &[
    "__dashboard",
    "__from",
    "__to",
    "__interval",
    "__interval_ms",
    "__name",
    "__org",
    "__user",
    "__range",
    "__range_s",
    "__range_ms",
    "__rate_interval",
    "__rate_interval_ms",
    "timeFilter",
    "__timeFilter",
];

/// Core Grafana panel types (a typo or a plugin panel would show as an error in Grafana).
const PANEL_TYPES: &[&str] = &[
    "row",
    "timeseries",
    "stat",
    "gauge",
    "bargauge",
    "table",
    "xychart",
    "text",
    "barchart",
    "piechart",
    "heatmap",
    "histogram",
    "state-timeline",
    "status-history",
    "logs",
    "nodeGraph",
    "trend",
];

/// Panel types whose values need a unit.
const UNIT_PANELS: &[&str] = &["timeseries", "stat", "gauge", "bargauge"];

/// Names in a query that only hardware counters (a PMU) produce.
const PMU_ONLY: &[&str] = &[
    "mpiburst_phase_ipc",
    "\"cpi\"",
    "llc_misses_per_instruction",
    "branch_misses_per_instruction",
    "core_frequency",
    "phase_ipc",
    "phase_instruction_balance",
];

struct Dashboard {
    file: String,
    json: Value,
}

fn dashboards() -> Vec<Dashboard> {
    let dir = dashboards_dir().join("grafana");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 3,
        "expected the three dashboards in {}",
        dir.display()
    );
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let json = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", p.display()));
            Dashboard {
                file: p.file_name().unwrap().to_string_lossy().into_owned(),
                json,
            }
        })
        .collect()
}

/// Every panel, including those nested in rows.
fn panels(d: &Dashboard) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&d.json["panels"], &mut out);
    out
}

fn variables(d: &Dashboard) -> BTreeMap<String, &Value> {
    d.json["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| (v["name"].as_str().unwrap_or_default().to_string(), v))
        .collect()
}

fn variable_query(v: &Value) -> &str {
    v["query"]["query"]
        .as_str()
        .or(v["query"].as_str())
        .unwrap_or_default()
}

/// A variable that can take several values, so its queries must match it with a regex.
fn multi_valued(v: &Value) -> bool {
    v["multi"] == true || v["includeAll"] == true
}

/// A query and where it comes from, for the failure list.
struct Query {
    origin: String,
    expr: String,
}

fn panel_queries(d: &Dashboard) -> Vec<Query> {
    panels(d)
        .into_iter()
        .flat_map(|p| {
            p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |t| Query {
                    origin: format!(
                        "{}: panel {:?} target {}",
                        d.file,
                        p["title"].as_str().unwrap_or("?"),
                        t["refId"]
                    ),
                    expr: t["expr"].as_str().unwrap_or_default().to_string(),
                })
        })
        .collect()
}

/// Grafana variable references in a text (`$name`, `${name}`, `${name:format}`, `[[name]]`) and
/// where they are.
fn var_refs(text: &str) -> Vec<(Range<usize>, String)> {
    let b = text.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let (end, inner) = if text[i..].starts_with("${") {
            match text[i..].find('}') {
                Some(e) => (i + e + 1, &text[i + 2..i + e]),
                None => break,
            }
        } else if text[i..].starts_with("[[") {
            match text[i..].find("]]") {
                Some(e) => (i + e + 2, &text[i + 2..i + e]),
                None => break,
            }
        } else if b[i] == b'$' && b.get(i + 1).is_some_and(|&c| ident(c)) {
            let e = (i + 1..b.len()).find(|&j| !ident(b[j])).unwrap_or(b.len());
            (e, &text[i + 1..e])
        } else {
            i += 1;
            continue;
        };
        out.push((i..end, inner.split(':').next().unwrap().to_string()));
        i = end;
    }
    out
}

fn same_thresholds(thresholds: &Value, steps: &[(f64, &str)]) -> bool {
    steps.iter().all(|(value, color)| {
        thresholds["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["value"].as_f64() == Some(*value) && s["color"] == *color)
    })
}

/// Every thresholds object of a panel: its defaults and its overrides.
fn panel_thresholds(p: &Value) -> Vec<&Value> {
    let overrides = p["fieldConfig"]["overrides"]
        .as_array()
        .into_iter()
        .flatten();
    let from_overrides = overrides
        .flat_map(|o| o["properties"].as_array().into_iter().flatten())
        .filter(|prop| prop["id"] == "thresholds")
        .map(|prop| &prop["value"]);
    std::iter::once(&p["fieldConfig"]["defaults"]["thresholds"])
        .chain(from_overrides)
        .collect()
}

fn overlaps(a: &Value, b: &Value) -> bool {
    let r = |g: &Value, k: &str| g[k].as_i64().unwrap_or(0);
    r(a, "x") < r(b, "x") + r(b, "w")
        && r(b, "x") < r(a, "x") + r(a, "w")
        && r(a, "y") < r(b, "y") + r(b, "h")
        && r(b, "y") < r(a, "y") + r(a, "h")
}

/// Problems of one dashboard, all of them.
fn dashboard_problems(d: &Dashboard) -> Vec<String> {
    let mut problems = Vec::new();
    let mut problem = |what: String| problems.push(format!("{}: {what}", d.file));
    for key in ["uid", "title"] {
        if d.json[key].as_str().unwrap_or_default().is_empty() {
            problem(format!("no {key}"));
        }
    }
    let vars = variables(d);
    let ds = vars.get("datasource");
    if ds.is_none_or(|v| v["type"] != "datasource" || v["query"] != "prometheus") {
        problem("needs a variable `datasource` of type datasource with query prometheus".into());
    }
    for name in ["mpi_job", "node"] {
        if !vars.contains_key(name) {
            problem(format!("needs the template variable `{name}`"));
        }
    }
    for (name, v) in &vars {
        if v["type"] != "query" {
            continue;
        }
        if v["datasource"] != datasource_ref() {
            problem(format!(
                "variable {name}: datasource must be {}",
                datasource_ref()
            ));
        }
        let q = variable_query(v);
        if !(q.starts_with("label_values(") && q.ends_with(')') && q.contains(',')) {
            problem(format!(
                "variable {name}: expected label_values(selector, label), found {q:?}"
            ));
        }
        if v["includeAll"] == true && v["allValue"] != ".+" {
            problem(format!("variable {name}: \"All\" must be the regex .+ (allValue), not a list of every value"));
        }
    }

    let all = panels(d);
    let mut ids = BTreeSet::new();
    for p in &all {
        let title = p["title"].as_str().unwrap_or_default();
        let kind = p["type"].as_str().unwrap_or_default();
        let at = format!("panel {title:?}");
        match p["id"].as_u64() {
            Some(id) if !ids.insert(id) => problem(format!("{at}: id {id} used twice")),
            None => problem(format!("{at}: no numeric id")),
            _ => {}
        }
        if !PANEL_TYPES.contains(&kind) {
            problem(format!("{at}: unknown panel type {kind:?}"));
        }
        let g = &p["gridPos"];
        if g["x"].as_i64().unwrap_or(-1) < 0
            || g["x"].as_i64().unwrap_or(0) + g["w"].as_i64().unwrap_or(99) > 24
        {
            problem(format!("{at}: gridPos {g} leaves the 24 columns"));
        }
        if kind == "row" {
            continue;
        }
        if title.is_empty() || p["description"].as_str().unwrap_or_default().is_empty() {
            problem(format!(
                "{at}: needs a title and a description saying what it shows and what to do"
            ));
        }
        if UNIT_PANELS.contains(&kind)
            && p["fieldConfig"]["defaults"]["unit"]
                .as_str()
                .unwrap_or_default()
                .is_empty()
        {
            problem(format!("{at}: no unit"));
        }
        let targets = p["targets"].as_array().cloned().unwrap_or_default();
        if !targets.is_empty() && p["datasource"] != datasource_ref() {
            problem(format!("{at}: datasource must be {}", datasource_ref()));
        }
        let mut refs = BTreeSet::new();
        for t in &targets {
            if t["datasource"] != datasource_ref() {
                problem(format!(
                    "{at} target {}: datasource must be {}",
                    t["refId"],
                    datasource_ref()
                ));
            }
            if !refs.insert(t["refId"].to_string()) {
                problem(format!("{at}: refId {} used twice", t["refId"]));
            }
            if t["expr"].as_str().unwrap_or_default().trim().is_empty() {
                problem(format!("{at} target {}: empty expr", t["refId"]));
            }
        }
        let exprs: Vec<&str> = targets.iter().filter_map(|t| t["expr"].as_str()).collect();
        if exprs.iter().any(|e| e.contains("_severity"))
            && !panel_thresholds(p)
                .iter()
                .any(|t| same_thresholds(t, &[(0.2, "orange"), (0.5, "red")]))
        {
            problem(format!(
                "{at}: shows severities, so needs thresholds orange at 0.2 and red at 0.5"
            ));
        }
        if kind == "xychart" {
            // The plotted fields are named by the panel's organize transformation.
            let renamed: BTreeSet<&str> = p["transformations"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|t| {
                    t["options"]["renameByName"]
                        .as_object()
                        .into_iter()
                        .flatten()
                })
                .filter_map(|(_, to)| to.as_str())
                .collect();
            for s in p["options"]["series"].as_array().into_iter().flatten() {
                for axis in ["x", "y"] {
                    if !renamed.contains(s[axis].as_str().unwrap_or_default()) {
                        problem(format!(
                            "{at}: series {axis} {} is no field the transformations produce",
                            s[axis]
                        ));
                    }
                }
            }
        }
    }
    let top: Vec<&Value> = d.json["panels"].as_array().into_iter().flatten().collect();
    for (i, a) in top.iter().enumerate() {
        for b in &top[i + 1..] {
            if overlaps(&a["gridPos"], &b["gridPos"]) {
                problem(format!("panels {} and {} overlap", a["title"], b["title"]));
            }
        }
    }

    // Variable references: defined or built in; multi-valued ones only inside regex matchers.
    let mut texts: Vec<(String, String)> = panel_queries(d)
        .into_iter()
        .map(|q| (q.origin, q.expr))
        .collect();
    texts.extend(vars.iter().map(|(n, v)| {
        (
            format!("{}: variable {n}", d.file),
            variable_query(v).to_string(),
        )
    }));
    let decorations = all.iter().map(|p| {
        let text = format!(
            "{} {}",
            p["title"].as_str().unwrap_or_default(),
            p["repeat"]
                .as_str()
                .map(|r| format!("${r}"))
                .unwrap_or_default()
        );
        (
            format!("{}: panel {} title/repeat", d.file, p["title"]),
            text,
        )
    });
    for (is_query, (origin, text)) in texts
        .iter()
        .map(|t| (true, t.clone()))
        .chain(decorations.map(|t| (false, t)))
    {
        for (range, name) in var_refs(&text) {
            match vars.get(&name) {
                None if !BUILTINS.contains(&name.as_str()) => {
                    problems.push(format!("{origin}: undefined variable ${name}"))
                }
                Some(v)
                    if is_query
                        && multi_valued(v)
                        && !(text[..range.start].ends_with("=~\"")
                            || text[..range.start].ends_with("!~\"")) =>
                {
                    problems.push(format!(
                        "{origin}: ${name} takes several values: match it with =~ or !~"
                    ))
                }
                _ => {}
            }
        }
    }
    problems
}

#[test]
fn dashboards_are_consistent_grafana_json() {
    let all = dashboards();
    let mut problems: Vec<String> = all.iter().flat_map(dashboard_problems).collect();
    let mut uids = BTreeSet::new();
    for d in &all {
        if !uids.insert(d.json["uid"].to_string()) {
            problems.push(format!(
                "{}: uid {} used by another dashboard",
                d.file, d.json["uid"]
            ));
        }
    }
    let queries: usize = all.iter().map(|d| panel_queries(d).len()).sum();
    eprintln!("{} dashboards, {queries} panel queries", all.len());
    assert!(
        problems.is_empty(),
        "dashboard problems:\n{}",
        problems.join("\n")
    );
}

/// The job dashboard opens on the job over all nodes: its severities and rank distributions,
/// outside the collapsed row of each node's view, come from the job-wide recording rules, not
/// from one node's series (which a `node` selection would pick, or a max over nodes would
/// hide the other nodes behind).
#[test]
fn the_job_dashboard_shows_job_wide_severities_and_rank_distributions_by_default() {
    let job = dashboards()
        .into_iter()
        .find(|d| d.file == "mpiburst-job.json")
        .expect("the job dashboard");
    let shown: Vec<&Value> = job.json["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] != "row")
        .collect();
    let mut per_node = Vec::new();
    let mut job_wide = 0;
    for p in shown {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_default();
            if expr.contains("mpiburst_property_severity") || expr.contains("property_rank_value") {
                if expr.contains("mpi_job:mpiburst_property_") {
                    job_wide += 1;
                } else {
                    per_node.push(format!("{}: {expr}", p["title"]));
                }
            }
        }
    }
    assert!(
        per_node.is_empty(),
        "panels shown by default that query one node's properties:\n{}",
        per_node.join("\n")
    );
    assert!(job_wide >= 5, "{job_wide} job-wide property queries");
    let collapsed: Vec<&Value> = job.json["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "row" && p["collapsed"] == true)
        .flat_map(|r| r["panels"].as_array().into_iter().flatten())
        .collect();
    assert!(
        collapsed.iter().any(|p| p["targets"][0]["expr"]
            .as_str()
            .is_some_and(|e| e.contains("node=~\"$node\"") && e.contains("_severity"))),
        "a collapsed row shows each node's severities"
    );
}

#[test]
fn the_recommendations_table_maps_every_property_to_its_recommendation() {
    // The metric carries the property only; the panel's value mapping on the property column
    // holds the texts, which must be the catalogue's.
    let all = dashboards();
    let job = all.iter().find(|d| d.file == "mpiburst-job.json").unwrap();
    let table = panels(job)
        .into_iter()
        .find(|p| p["title"] == "Active recommendations")
        .expect("the job dashboard has the recommendations table");
    let mapping = table["fieldConfig"]["overrides"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["matcher"]["options"] == "property")
        .map(|o| &o["properties"][0]["value"][0]["options"])
        .expect("a value mapping on the property column");
    let expected: BTreeMap<String, String> = mpiburst::properties::catalogue()
        .into_iter()
        .filter_map(|p| {
            Some((
                p.name.to_string(),
                format!("{}: {}", p.name, p.recommendation?),
            ))
        })
        .collect();
    let mapped: BTreeMap<String, String> = mapping
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v["text"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(mapped, expected);
}

#[test]
fn variable_references_are_found_in_every_form() {
    let refs: Vec<String> =
        var_refs(r#"rate(x{a=~"$mpi_job",b=~"${node:regex}"}[$__rate_interval]) [[old]] 5$ "a$""#)
            .into_iter()
            .map(|(_, n)| n)
            .collect();
    assert_eq!(refs, ["mpi_job", "node", "__rate_interval", "old"]);
}

fn rule_files(suffix: &str) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(rules_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(suffix))
        .collect();
    out.sort();
    out
}

#[test]
fn every_rule_file_passes_promtool_checks_and_unit_tests() {
    // The harness's Prometheus (and an operator's rule_files glob) loads every *.rules.yml, so a
    // test file must never be named like one, and every YAML file must be one of the two kinds.
    let yaml = rule_files(".yml");
    let (rules, tests) = (rule_files(".rules.yml"), rule_files(".test.yml"));
    let stray: Vec<_> = yaml
        .iter()
        .filter(|f| !rules.contains(f) && !tests.contains(f))
        .collect();
    assert!(
        stray.is_empty(),
        "{stray:?} in dashboards/rules: name rule files *.rules.yml and their tests *.test.yml"
    );
    for f in &rules {
        promtool(&["check", "rules", f], None);
    }
    let mut tested = BTreeSet::new();
    for f in &tests {
        promtool(&["test", "rules", f], None);
        let text = std::fs::read_to_string(rules_dir().join(f)).unwrap();
        tested.extend(
            rules
                .iter()
                .filter(|r| text.lines().any(|l| l.trim() == format!("- {r}"))),
        );
    }
    let untested: Vec<_> = rules.iter().filter(|r| !tested.contains(r)).collect();
    assert!(
        untested.is_empty(),
        "rule files without unit tests (rule_files of a *.test.yml): {untested:?}"
    );
}

#[test]
fn provisioning_files_have_the_keys_grafana_reads() {
    let read = |rel: &str| {
        let p = dashboards_dir().join("provisioning").join(rel);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        flatten_yaml(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let ds = read("datasources/mpiburst.yml");
    let expect =
        |map: &BTreeMap<String, String>, key: &str, ok: &dyn Fn(&str) -> bool, what: &str| {
            let v = map.get(key).map(String::as_str).unwrap_or_default();
            assert!(
                ok(v),
                "provisioning: {key} = {v:?}, expected {what}; parsed {map:?}"
            );
        };
    expect(&ds, "apiVersion", &|v| v == "1", "1");
    // The dashboards' datasource variable lists data sources of this type.
    expect(
        &ds,
        "datasources.0.type",
        &|v| v == "prometheus",
        "prometheus",
    );
    expect(&ds, "datasources.0.name", &|v| !v.is_empty(), "a name");
    expect(&ds, "datasources.0.access", &|v| v == "proxy", "proxy");
    expect(
        &ds,
        "datasources.0.url",
        &|v| v.starts_with("http://") || v.starts_with("https://"),
        "a URL",
    );
    expect(
        &ds,
        "datasources.0.jsonData.timeInterval",
        &|v| v.ends_with('s'),
        "the scrape interval",
    );
    let dash = read("dashboards/mpiburst.yml");
    expect(&dash, "apiVersion", &|v| v == "1", "1");
    expect(&dash, "providers.0.name", &|v| !v.is_empty(), "a name");
    expect(&dash, "providers.0.type", &|v| v == "file", "file");
    expect(
        &dash,
        "providers.0.options.path",
        &|v| v.starts_with('/'),
        "an absolute directory",
    );
}

/// Grafana's variables replaced as it would for "All" and a 1 s scrape interval.
fn substitute(text: &str, vars: &BTreeMap<String, &Value>) -> String {
    let mut out = String::new();
    let mut last = 0;
    for (range, name) in var_refs(text) {
        let value = match name.as_str() {
            "__rate_interval" => "10s".to_string(),
            "__interval" => "5s".to_string(),
            "__range" => "1m".to_string(),
            _ => match vars.get(&name) {
                Some(v) => v["allValue"].as_str().unwrap_or(".+").to_string(),
                None => continue,
            },
        };
        out.push_str(&text[last..range.start]);
        out.push_str(&value);
        last = range.end;
    }
    out.push_str(&text[last..]);
    out
}

/// `label_values(selector, label)` as an instant query with the same answer.
fn label_values_query(q: &str) -> String {
    let args = q
        .trim()
        .trim_start_matches("label_values(")
        .trim_end_matches(')');
    let (selector, label) = args
        .rsplit_once(',')
        .expect("label_values(selector, label)");
    format!("count by ({}) ({selector})", label.trim())
}

/// The result of an instant query through promtool: Ok(has data) or Err(the query error).
fn has_data(prometheus: &Prometheus, expr: &str) -> Result<bool, String> {
    let out = Command::new("promtool")
        .args([
            "query",
            "instant",
            &format!("http://{}", prometheus.addr),
            expr,
        ])
        .output()
        .expect("promtool (Debian package prometheus)");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(!String::from_utf8_lossy(&out.stdout).trim().is_empty())
}

/// What a query needs to have data here.
enum Needs {
    Anything,
    /// Hardware counters: skipped without a PMU.
    Pmu,
    /// No PMU: the list of what is not measured is sure to have data only without hardware
    /// counters (their properties are then not measured); skipped with a PMU.
    NoPmu,
}

struct LiveQuery {
    origin: String,
    expr: String,
    needs: Needs,
}

impl LiveQuery {
    /// Whether the query must have data on this machine.
    fn applies(&self, pmu: bool) -> bool {
        match self.needs {
            Needs::Anything => true,
            Needs::Pmu => pmu,
            Needs::NoPmu => !pmu,
        }
    }
}

fn needs(expr: &str) -> Needs {
    if PMU_ONLY.iter().any(|n| expr.contains(n)) {
        Needs::Pmu
    } else if expr.contains("mpiburst_property_not_measured") {
        Needs::NoPmu
    } else {
        Needs::Anything
    }
}

/// Every dashboard query with Grafana's variables substituted, and every rule as Prometheus
/// loaded it (alerts as the selectors inside them).
fn live_queries(prometheus: &Prometheus) -> Vec<LiveQuery> {
    let mut out = Vec::new();
    for d in dashboards() {
        let vars = variables(&d);
        for q in panel_queries(&d) {
            let expr = substitute(&q.expr, &vars);
            out.push(LiveQuery {
                origin: q.origin,
                needs: needs(&expr),
                expr,
            });
        }
        for (name, v) in vars.iter().filter(|(_, v)| v["type"] == "query") {
            let expr = label_values_query(&substitute(variable_query(v), &vars));
            out.push(LiveQuery {
                origin: format!("{}: variable {name}", d.file),
                needs: Needs::Anything,
                expr,
            });
        }
    }
    for rule in loaded_rules(prometheus) {
        let query = rule["query"].as_str().unwrap().to_string();
        let origin = format!("{}: {} {}", rule["file"], rule["type"], rule["name"]);
        if rule["type"] == "alerting" {
            for s in selectors(&query) {
                out.push(LiveQuery {
                    origin: format!("{origin}, selector"),
                    needs: needs(&s),
                    expr: s,
                });
            }
        } else {
            out.push(LiveQuery {
                origin,
                needs: needs(&query),
                expr: query,
            });
        }
    }
    out
}

/// The rules Prometheus loaded, each with its group's file; every rule file must be among them.
fn loaded_rules(prometheus: &Prometheus) -> Vec<Value> {
    let body: Value = serde_json::from_str(&http_get(&prometheus.addr, "/api/v1/rules")).unwrap();
    let mut files = BTreeSet::new();
    let mut out = Vec::new();
    for g in body["data"]["groups"].as_array().into_iter().flatten() {
        let file = Path::new(g["file"].as_str().unwrap())
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        files.insert(file.clone());
        for r in g["rules"].as_array().into_iter().flatten() {
            let mut r = r.clone();
            r["file"] = Value::String(file.clone());
            out.push(r);
        }
    }
    let missing: Vec<_> = rule_files(".rules.yml")
        .into_iter()
        .filter(|f| !files.contains(f))
        .collect();
    assert!(
        missing.is_empty(),
        "Prometheus did not load {missing:?}: {body}"
    );
    out
}

/// The failures among `queries`: (origin, expression, why).
fn failing(
    prometheus: &Prometheus,
    queries: &[LiveQuery],
    pmu: bool,
) -> Vec<(String, String, String)> {
    queries
        .iter()
        .filter(|q| q.applies(pmu))
        .filter_map(|q| match has_data(prometheus, &q.expr) {
            Ok(true) => None,
            Ok(false) => Some((q.origin.clone(), q.expr.clone(), "no data".to_string())),
            Err(e) => Some((q.origin.clone(), q.expr.clone(), e)),
        })
        .collect()
}

/// tests/mpi/imbalance_io under Open MPI in the background, stopped through its stop file (all
/// ranks leave after the same iteration), or killed when it does not stop in time.
struct BackgroundJob {
    child: Child,
    dir: tempfile::TempDir,
}

impl BackgroundJob {
    fn start(seconds: u32) -> BackgroundJob {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Mpi::OpenMpi.launcher(2);
        cmd.arg(program("imbalance_io", Mpi::OpenMpi))
            .arg(dir.path())
            .arg(seconds.to_string());
        let child = cmd
            .stdout(Stdio::null())
            .spawn()
            .expect("start mpirun.openmpi");
        BackgroundJob { child, dir }
    }

    fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            std::fs::write(self.dir.path().join("stop"), "").unwrap();
            let st = wait_with_timeout(&mut self.child, Duration::from_secs(30));
            assert!(
                st.is_some_and(|s| s.success()),
                "imbalance_io did not stop cleanly: {st:?}"
            );
        }
    }
}

impl Drop for BackgroundJob {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = std::fs::write(self.dir.path().join("stop"), "");
            let _ = wait_with_timeout(&mut self.child, Duration::from_secs(30));
        }
    }
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn every_panel_variable_and_rule_query_has_data_from_a_live_daemon() {
    // 5 s analysis windows instead of 30 s, so window and phase metrics come within seconds;
    // the BPF statistics on, so the health dashboard's run-time panels have data.
    let daemon = Daemon::with_config(
        "[capture]\nbpf_stats = true\n\n[analysis]\nwindow_s = 5.0\nlateness_s = 1.0\n",
        &[],
    );
    let prometheus = Prometheus::start(&[&daemon.addr]);
    // Runs until stopped below; 240 s only bounds it if the test dies without stopping it.
    let mut job = BackgroundJob::start(240);

    // Prometheus answers queries once it is ready, and `up` once it scraped the daemon.
    let deadline = Instant::now() + Duration::from_secs(30);
    while has_data(&prometheus, r#"up{job="mpiburst"}"#) != Ok(true) {
        assert!(
            Instant::now() < deadline,
            "Prometheus did not scrape the daemon within 30 s"
        );
        thread::sleep(Duration::from_millis(500));
    }
    let pmu = has_data(&prometheus, r#"mpiburst_counters_info{hardware="true"}"#).unwrap();
    let queries = live_queries(&prometheus);
    // Window metrics need a closed window and rates two scrapes: poll until every query has
    // data, bounded.
    let deadline = Instant::now() + Duration::from_secs(150);
    let failures = loop {
        let failures = failing(&prometheus, &queries, pmu);
        if failures.is_empty() || Instant::now() > deadline {
            break failures;
        }
        eprintln!(
            "{} of {} queries without data yet",
            failures.len(),
            queries.len()
        );
        thread::sleep(Duration::from_secs(3));
    };
    let rules: Vec<Value> = loaded_rules(&prometheus);
    let unhealthy: Vec<String> = rules
        .iter()
        .filter(|r| r["health"] != "ok")
        .map(|r| {
            format!(
                "{} {}: health {} {}",
                r["file"], r["name"], r["health"], r["lastError"]
            )
        })
        .collect();
    // The small I/O requests of imbalance_io make a property severe: its alert is pending (its
    // `for` is minutes) and carries the recommendation of that property.
    let alerts: Value =
        serde_json::from_str(&http_get(&prometheus.addr, "/api/v1/alerts")).unwrap();
    let severe: Vec<&Value> = alerts["data"]["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["labels"]["alertname"] == "MpiburstPropertySevere")
        .collect();
    let without_recommendation: Vec<String> = severe
        .iter()
        .filter(|a| {
            a["annotations"]["recommendation"]
                .as_str()
                .unwrap_or_default()
                .is_empty()
        })
        .map(|a| a["labels"].to_string())
        .collect();
    job.stop();
    let metrics = http_get(&daemon.addr, "/metrics");
    daemon.stop();

    let skipped: Vec<&str> = queries
        .iter()
        .filter(|q| !q.applies(pmu))
        .map(|q| q.origin.as_str())
        .collect();
    eprintln!(
        "{} queries, PMU {}; skipped {} that need {}: {skipped:#?}",
        queries.len(),
        if pmu { "present" } else { "absent" },
        skipped.len(),
        if pmu { "no PMU" } else { "a PMU" }
    );
    let report: Vec<String> = failures
        .iter()
        .map(|(o, e, why)| format!("{o}\n    {e}\n    -> {why}"))
        .collect();
    let missing_metrics: BTreeSet<String> = failures
        .iter()
        .flat_map(|(_, e, _)| selectors(e))
        .map(|s| s.split('{').next().unwrap().to_string())
        .filter(|m| m.starts_with("mpiburst_") && !metrics.contains(&format!("# TYPE {m} ")))
        .collect();
    assert!(
        failures.is_empty() && unhealthy.is_empty(),
        "{} of {} queries failed:\n{}\nmetrics the daemon does not export: {missing_metrics:?}\nrules with errors: {unhealthy:#?}",
        failures.len(),
        queries.len(),
        report.join("\n")
    );
    eprintln!(
        "pending or firing MpiburstPropertySevere alerts: {}",
        severe.len()
    );
    assert!(
        !severe.is_empty(),
        "no MpiburstPropertySevere alert for imbalance_io's 4 KiB requests: {alerts}"
    );
    assert!(
        without_recommendation.is_empty(),
        "severe-property alerts without a recommendation: {without_recommendation:?}"
    );
}

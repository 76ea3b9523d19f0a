//! The architecture as `docs/ARCHITECTURE.md` states it, checked: which crate may depend on
//! which (directly and through everything it links), and that no crate's modules import each
//! other in a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_owned()
}

fn read_toml(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse().unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Workspace members by package name: (folder, normal dependencies).
fn members() -> BTreeMap<String, (PathBuf, BTreeSet<String>)> {
    let root = workspace();
    let ws = read_toml(&root.join("Cargo.toml"));
    let list = ws["workspace"]["members"].as_array().expect("workspace members");
    list.iter()
        .map(|m| {
            let dir = root.join(m.as_str().expect("member path"));
            let manifest = read_toml(&dir.join("Cargo.toml"));
            let name = manifest["package"]["name"].as_str().expect("package name").to_owned();
            let deps = manifest
                .get("dependencies")
                .and_then(|d| d.as_table())
                .map(|t| t.keys().cloned().collect())
                .unwrap_or_default();
            (name, (dir, deps))
        })
        .collect()
}

/// Every package `name` links (normal dependencies of workspace crates, then whatever
/// Cargo.lock records for external ones).
fn closure(name: &str) -> BTreeSet<String> {
    let members = members();
    let lock = read_toml(&workspace().join("Cargo.lock"));
    let mut lock_deps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in lock["package"].as_array().expect("lock packages") {
        let n = p["name"].as_str().expect("name").to_owned();
        let deps = p
            .get("dependencies")
            .and_then(|d| d.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|d| d.as_str())
                    .map(|d| d.split(' ').next().unwrap_or(d).to_owned())
                    .collect()
            })
            .unwrap_or_default();
        lock_deps.entry(n).or_default().extend::<Vec<String>>(deps);
    }
    let mut seen = BTreeSet::new();
    let mut todo = vec![name.to_owned()];
    while let Some(p) = todo.pop() {
        if !seen.insert(p.clone()) {
            continue;
        }
        match members.get(&p) {
            Some((_, deps)) => todo.extend(deps.iter().cloned()),
            None => todo.extend(lock_deps.get(&p).cloned().unwrap_or_default()),
        }
    }
    seen.remove(name);
    seen
}

#[test]
fn crates_depend_only_on_what_the_architecture_allows() {
    let members = members();
    // (crate, crates it must never link, directly or transitively)
    let rules: &[(&str, &[&str])] = &[
        ("cairn-protocol", &["cairn-proto", "cairn-raft", "cairn-storage", "openraft", "sled", "tonic"]),
        (
            "cairn-client",
            &["cairn-raft", "cairn-storage", "cairn-coordinator", "cairn-taskrt", "openraft", "sled"],
        ),
        (
            "cairn-process",
            &["cairn-raft", "cairn-storage", "cairn-coordinator", "cairn-taskrt", "openraft", "sled"],
        ),
        ("cairn-coordinator", &["cairn-taskrt"]),
        ("cairn-taskrt", &["cairn-coordinator", "cairn-raft", "cairn-storage", "openraft", "sled"]),
        (
            "cairn-ctl",
            &["cairn-coordinator", "cairn-taskrt", "cairn-raft", "cairn-storage", "openraft", "sled"],
        ),
        (
            "cairn-console",
            &["cairn-coordinator", "cairn-taskrt", "cairn-raft", "cairn-storage", "openraft", "sled"],
        ),
    ];
    for (name, forbidden) in rules {
        assert!(members.contains_key(*name), "{name} is not a workspace member");
        let links = closure(name);
        for f in *forbidden {
            assert!(!links.contains(*f), "{name} links {f}, which docs/ARCHITECTURE.md forbids");
        }
    }
    // And the planes meet in the contract.
    for plane in ["cairn-coordinator", "cairn-taskrt", "cairn-ctl"] {
        assert!(members[plane].1.contains("cairn-protocol"), "{plane} does not use the contract crate");
    }
}

/// A crate's module graph: module path → modules it imports (`crate::`, `super::`, `self::`).
fn module_graph(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "bin") {
                    walk(&p, out);
                }
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    // `a/b.rs` and `a/b/mod.rs` are both module `a::b`; `lib.rs` is the crate root.
    let module_of = |p: &Path| -> Vec<String> {
        let rel = p.strip_prefix(src).unwrap_or(p).with_extension("");
        let mut parts: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
            parts.pop();
        }
        parts
    };
    let known: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(f)).collect();
    let resolve = |path: Vec<String>| -> Option<Vec<String>> {
        (0..=path.len()).rev().map(|i| path[..i].to_vec()).find(|p| known.contains(p))
    };
    let mut graph = BTreeMap::new();
    for f in &files {
        let here = module_of(f);
        let text = std::fs::read_to_string(f).unwrap_or_default();
        // Test modules may reach anywhere; the rule is about the code itself.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let mut edges = BTreeSet::new();
        for line in code.lines().map(str::trim).filter(|l| !l.starts_with("//")) {
            for (start, _) in line.match_indices(['c', 's']) {
                let rest = &line[start..];
                if start > 0 && line[..start].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let (mut base, tail) = if let Some(t) = rest.strip_prefix("crate::") {
                    (Vec::new(), t)
                } else if let Some(t) = rest.strip_prefix("super::") {
                    (here[..here.len().saturating_sub(1)].to_vec(), t)
                } else if let Some(t) = rest.strip_prefix("self::") {
                    (here.clone(), t)
                } else {
                    continue;
                };
                let mut tail = tail;
                while let Some(t) = tail.strip_prefix("super::") {
                    base.pop();
                    tail = t;
                }
                // Expand one level of `{a, b::c}` groups.
                let targets: Vec<String> = match tail.strip_prefix('{') {
                    Some(group) => group
                        .split(['}', ';'])
                        .next()
                        .unwrap_or_default()
                        .split(',')
                        .map(|s| s.trim().to_owned())
                        .collect(),
                    None => vec![tail.to_owned()],
                };
                for t in targets {
                    let mut path = base.clone();
                    for seg in t.split("::") {
                        let seg: String =
                            seg.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                        if seg.is_empty() || !seg.starts_with(|c: char| c.is_ascii_lowercase()) {
                            break;
                        }
                        path.push(seg);
                    }
                    if let Some(target) = resolve(path)
                        && target != here
                    {
                        edges.insert(target);
                    }
                }
            }
        }
        graph.insert(here, edges);
    }
    graph
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Vec<String>) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let Some((w, _)) = s.graph.get_key_value(w) else { continue };
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.push(if w.is_empty() { "lib".to_owned() } else { w.join("/") });
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    for (name, (dir, _)) in members() {
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        let found = cycles(&module_graph(&src));
        assert!(found.is_empty(), "{name} has modules importing each other in a cycle: {found:?}");
    }
}

#[test]
fn the_cycle_check_sees_a_cycle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").expect("write");
    std::fs::write(src.join("a.rs"), "use crate::b::B;\npub struct A;\n").expect("write");
    std::fs::write(src.join("b.rs"), "use super::a::A;\npub struct B;\n").expect("write");
    assert_eq!(cycles(&module_graph(src)), vec![vec!["a".to_owned(), "b".to_owned()]]);
    std::fs::write(src.join("b.rs"), "pub struct B;\n#[cfg(test)]\nmod tests { use super::super::a::A; }\n")
        .expect("write");
    assert!(cycles(&module_graph(src)).is_empty(), "test modules are not part of the rule");
}

//! Arrows point down: no two modules of `src/` use each other, directly or through others.
//!
//! Each file under `src/` is a module; a module uses another when it names a path into it
//! (`use super::norm::...`, `crate::backend::cuda::launch::...`, `use super::{a, b}`). Uses of a
//! module's own ancestors (the types a parent declares for its children) and descendants are the
//! ordinary shape of a Rust crate and are not counted; among all other modules the graph must
//! be acyclic.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The module path of a source file: `src/backend/cuda/ops/norm.rs` -> `backend::cuda::ops::norm`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Expand one `use` tree (without `use` and `;`) into full paths.
fn expand(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let base = join(prefix, head);
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&inner[start..i], &base, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand(&inner[start..], &base, out);
    } else if !tree.is_empty() {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        out.push(join(prefix, path));
    }
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}::{b}"),
    }
}

/// Paths a file names: its `use` trees and inline `crate::`/`super::` paths.
fn paths_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut rest = code.as_str();
    while let Some(i) = rest.find("use ") {
        let before = &rest[..i];
        let at_start = before.is_empty() || before.ends_with(|c: char| c.is_whitespace() || c == ';' || c == '{');
        rest = &rest[i + 4..];
        if !at_start {
            continue;
        }
        if let Some(end) = rest.find(';') {
            expand(&rest[..end], "", &mut out);
        }
    }
    for start in ["crate::", "super::"] {
        let mut s = code.as_str();
        while let Some(i) = s.find(start) {
            let tail = &s[i..];
            let len = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            out.push(tail[..len].trim_end_matches(':').to_string());
            s = &s[i + start.len()..];
        }
    }
    out
}

/// The module a path from `from` lands in (the longest prefix that is a module file).
fn resolve(path: &str, from: &[String], modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: Vec<String> = match segs.first() {
        Some(&"crate") => {
            segs.remove(0);
            Vec::new()
        }
        Some(&"self") => {
            segs.remove(0);
            from.to_vec()
        }
        Some(&"super") => {
            // A module's `super` is its parent, whether it is a file or a `mod.rs`.
            let mut b = from.to_vec();
            while segs.first() == Some(&"super") {
                segs.remove(0);
                b.pop();
            }
            b
        }
        _ => return None,
    };
    let mut best = None;
    for s in segs {
        base.push(s.to_string());
        if modules.contains(&base) {
            best = Some(base.clone());
        } else {
            break;
        }
    }
    best
}

fn is_prefix(a: &[String], b: &[String]) -> bool {
    a.len() <= b.len() && b[..a.len()] == *a
}

#[test]
fn no_two_modules_use_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut fs = Vec::new();
    files(&src, &mut fs);
    let modules: BTreeSet<Vec<String>> = fs.iter().map(|f| module_of(&src, f)).collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for f in &fs {
        let from = module_of(&src, f);
        let text = std::fs::read_to_string(f).expect("read");
        for p in paths_in(&text) {
            let Some(to) = resolve(&p, &from, &modules) else {
                continue;
            };
            if to == from || is_prefix(&to, &from) || is_prefix(&from, &to) {
                continue;
            }
            edges.entry(from.clone()).or_default().insert(to);
        }
    }
    // A cycle shows as a module reachable from one of its own successors.
    let name = |m: &Vec<String>| m.join("::");
    let mut cycles = Vec::new();
    for (a, outs) in &edges {
        for b in outs {
            let mut seen = BTreeSet::new();
            let mut stack = vec![b.clone()];
            let mut path_back = false;
            while let Some(n) = stack.pop() {
                if n == *a {
                    path_back = true;
                    break;
                }
                if seen.insert(n.clone()) {
                    if let Some(next) = edges.get(&n) {
                        stack.extend(next.iter().cloned());
                    }
                }
            }
            if path_back {
                cycles.push(format!("{} -> {}", name(a), name(b)));
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "edges on import cycles between modules:\n  {}",
        cycles.join("\n  ")
    );
    // The check sees the uses it should: the backends use the contract, the executor the backends'.
    assert!(
        edges.values().map(BTreeSet::len).sum::<usize>() > 50,
        "too few module uses found"
    );
}

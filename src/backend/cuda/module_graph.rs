//! The CUDA backend's modules use each other without cycles: a module that uses an item of
//! another is above it, and shared items live in a module below both (`op.rs` under `launch.rs`
//! and `buffer.rs`, `ops/mv.rs` under `ops/linear.rs` and `ops/matvec_tc.rs`). The test reads
//! the sources and follows every path that names a sibling module; the parents (`mod.rs`,
//! `ops/mod.rs`), which declare their children, are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The modules under `dir` by name (`buffer`, `ops/linear`), their sources without comments.
fn modules(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        let stem = p.file_stem().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            modules(&p, &format!("{prefix}{stem}/"), out);
        } else if p.extension().is_some_and(|e| e == "rs") && stem != "mod" {
            let src = std::fs::read_to_string(&p).unwrap();
            let code: Vec<&str> = src.lines().map(|l| l.split("//").next().unwrap_or("")).collect();
            out.insert(format!("{prefix}{stem}"), code.join("\n"));
        }
    }
}

/// Whether `src` has `path` followed by something that ends an identifier.
fn names(src: &str, path: &str) -> bool {
    src.match_indices(path).any(|(i, _)| {
        let before = src[..i].chars().next_back();
        let after = src[i + path.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// Whether a use-list `prefix{ .. }` in `src` holds `leaf`.
fn lists(src: &str, prefix: &str, leaf: &str) -> bool {
    let open = format!("{prefix}{{");
    src.match_indices(&open).any(|(i, _)| {
        let rest = &src[i + open.len()..];
        let list = &rest[..rest.find('}').unwrap_or(rest.len())];
        list.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|w| w == leaf)
    })
}

/// The sibling modules `name` uses.
fn uses(name: &str, src: &str, all: &BTreeMap<String, String>) -> BTreeSet<String> {
    let parent = |m: &str| m.rsplit_once('/').map_or("", |(p, _)| p).to_string();
    let mine = parent(name);
    let mut out = BTreeSet::new();
    for target in all.keys().filter(|t| *t != name) {
        let theirs = parent(target);
        let leaf = target.rsplit('/').next().unwrap_or(target);
        let full = format!("crate::backend::cuda::{}", target.replace('/', "::"));
        let full_parent = format!("crate::backend::cuda::{}", theirs.replace('/', "::"));
        let mut hit = names(src, &full);
        hit |= theirs.is_empty() && lists(src, "crate::backend::cuda::", leaf);
        hit |= !theirs.is_empty() && lists(src, &format!("{full_parent}::"), leaf);
        if theirs == mine {
            hit |= names(src, &format!("super::{leaf}")) || lists(src, "super::", leaf);
        }
        if theirs.is_empty() && mine == "ops" {
            hit |= names(src, &format!("super::super::{leaf}"));
        }
        if theirs == "ops" && mine.is_empty() {
            hit |= names(src, &format!("super::ops::{leaf}"));
        }
        if hit {
            out.insert(target.clone());
        }
    }
    out
}

/// A cycle of `graph` through `at`, if any (depth first; `state` 1 on the path, 2 done).
fn cycle(
    at: &str,
    graph: &BTreeMap<String, BTreeSet<String>>,
    state: &mut BTreeMap<String, u8>,
    path: &mut Vec<String>,
) -> Option<Vec<String>> {
    state.insert(at.to_string(), 1);
    path.push(at.to_string());
    for next in &graph[at] {
        match state.get(next).copied().unwrap_or(0) {
            1 => {
                let from = path.iter().position(|m| m == next).unwrap_or(0);
                let mut c = path[from..].to_vec();
                c.push(next.clone());
                return Some(c);
            }
            0 => {
                if let Some(c) = cycle(next, graph, state, path) {
                    return Some(c);
                }
            }
            _ => {}
        }
    }
    path.pop();
    state.insert(at.to_string(), 2);
    None
}

#[test]
fn cuda_modules_use_each_other_without_cycles() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/backend/cuda");
    let mut all = BTreeMap::new();
    modules(&dir, "", &mut all);
    assert!(
        all.contains_key("ops/linear") && all.contains_key("launch"),
        "{:?}",
        all.keys()
    );
    let graph: BTreeMap<String, BTreeSet<String>> =
        all.iter().map(|(m, src)| (m.clone(), uses(m, src, &all))).collect();
    // The reader sees the edges it must: a known one of each kind of path.
    assert!(graph["ops/linear"].contains("ops/matvec_tc"));
    assert!(graph["ops/matvec_tc"].contains("ops/mv"));
    assert!(graph["launch"].contains("op"));
    let mut state = BTreeMap::new();
    for m in graph.keys() {
        if state.get(m).copied().unwrap_or(0) == 0 {
            let found = cycle(m, &graph, &mut state, &mut Vec::new());
            assert!(
                found.is_none(),
                "import cycle: {}",
                found.unwrap_or_default().join(" -> ")
            );
        }
    }
}

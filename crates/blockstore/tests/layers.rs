//! The store's modules stack without a cycle: each names (`crate::m`)
//! only modules below it in `LAYERS`. A new module must be placed in the
//! list; a reference upwards fails here with the line that makes it.

use std::path::Path;

/// Lowest first: the on-disk formats and in-memory tables, the shared
/// state, then the tasks and paths that work on it, the public API last.
const LAYERS: &[&str] = &[
    "error",
    "format",
    "alloc",
    "cursor",
    "oidtable",
    "csum",
    "index",
    "pglog",
    "journal",
    "undo",
    "state",
    "read",
    "writer",
    "checkpoint",
    "replay",
    "store",
    "undoable",
];

/// Every module a `crate::` path in the code of `text` names (comments
/// left out, but a trailing comment after code is cut off, not the code
/// before it), with its line: `crate::m::…` names `m`; `crate::{a::X,
/// b}` names `a` and `b`; `crate::Name` names the module `lib.rs`
/// re-exports `Name` from (`exports`), or itself if `lib.rs` does not
/// re-export it (then no module owns it and the check fails).
fn references(text: &str, exports: &[(String, String)]) -> Vec<(usize, String)> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let resolve = |name: String| -> String {
        match exports.iter().find(|(n, _)| *n == name) {
            Some((_, m)) => m.clone(),
            None => name,
        }
    };
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or("");
                for part in inner.split(',') {
                    out.push((n + 1, resolve(ident(part.trim()))));
                }
            } else {
                out.push((n + 1, resolve(ident(rest))));
            }
        }
    }
    out
}

/// `lib.rs`'s re-exports, `pub use m::{A, B};` or `pub use m::A;`: name →
/// module.
fn exports(lib: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in lib.lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, names)) = rest.trim_end_matches(';').split_once("::") else {
            continue;
        };
        let names = names.trim_start_matches('{').trim_end_matches('}');
        for name in names.split(',') {
            out.push((name.trim().to_string(), module.to_string()));
        }
    }
    out
}

/// Items of `lib.rs` itself that any module may use.
const FROM_LIB: &[&str] = &["strict_assert", "strict"];

#[test]
fn modules_name_only_modules_below_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let exports = exports(&std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs"));
    assert!(
        exports.iter().any(|(n, m)| n == "Store" && m == "state"),
        "lib.rs's re-exports not read: {exports:?}"
    );
    let mut wrong = Vec::new();
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&src).expect("src") {
        let path = entry.expect("entry").path();
        let module = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            wrong.push(format!(
                "{module}/: a module directory, not placed in LAYERS"
            ));
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") || module == "lib" {
            continue;
        }
        let Some(rank) = LAYERS.iter().position(|m| *m == module) else {
            wrong.push(format!("{module}: not placed in LAYERS"));
            continue;
        };
        seen.push(module.clone());
        let text = std::fs::read_to_string(&path).expect("read");
        for (line, name) in references(&text, &exports) {
            if name == module || FROM_LIB.contains(&name.as_str()) {
                continue;
            }
            match LAYERS.iter().position(|m| *m == name) {
                Some(r) if r < rank => {}
                Some(_) => wrong.push(format!("{module}.rs:{line} names {name}, above it")),
                None => wrong.push(format!(
                    "{module}.rs:{line} names {name:?}, not a module in LAYERS"
                )),
            }
        }
    }
    for m in LAYERS {
        if !seen.iter().any(|s| s == m) {
            wrong.push(format!("{m}: in LAYERS but no such module"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn references_are_found_in_code_and_not_in_comments() {
    let exports = exports("pub use store::{Memory, Space};\npub use state::Store;\n");
    let text = "use crate::state::{Inner, State};\n\
                /// [`crate::store::Store`]\n\
                let x = crate::undo::hidden(o); // crate::writer\n\
                use crate::{read::X, writer};\n\
                let m: crate::Memory = crate::Store::new();\n\
                crate::Unknown::f();\n";
    let found: Vec<(usize, String)> = references(text, &exports);
    let want = [
        (1, "state"),
        (3, "undo"),
        (4, "read"),
        (4, "writer"),
        (5, "store"),
        (5, "state"),
        (6, "Unknown"),
    ];
    let want: Vec<(usize, String)> = want.iter().map(|(l, m)| (*l, m.to_string())).collect();
    assert_eq!(found, want);
}

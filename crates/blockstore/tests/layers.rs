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

/// Every `crate::name` in the code of `text` (comments left out, but a
/// trailing comment after code is cut off, not the code before it), with
/// its line.
fn references(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            out.push((n + 1, name));
        }
    }
    out
}

#[test]
fn modules_name_only_modules_below_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&src).expect("src") {
        let path = entry.expect("entry").path();
        let module = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.extension().is_none_or(|e| e != "rs") || module == "lib" {
            continue;
        }
        let Some(rank) = LAYERS.iter().position(|m| *m == module) else {
            wrong.push(format!("{module}: not placed in LAYERS"));
            continue;
        };
        seen.push(module.clone());
        let text = std::fs::read_to_string(&path).expect("read");
        for (line, name) in references(&text) {
            // Macros defined in lib.rs (`crate::strict_assert!`).
            if name == module || name.is_empty() || name == "strict_assert" {
                continue;
            }
            match LAYERS.iter().position(|m| *m == name) {
                Some(r) if r < rank => {}
                Some(_) => wrong.push(format!("{module}.rs:{line} names {name}, above it")),
                None => wrong.push(format!("{module}.rs:{line} names {name}, not in LAYERS")),
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
    let text = "use crate::state::{Inner, State};\n/// [`crate::store::Store`]\nlet x = crate::undo::hidden(o); // crate::writer\n";
    let found: Vec<(usize, String)> = references(text);
    assert_eq!(
        found,
        vec![(1, "state".to_string()), (3, "undo".to_string())]
    );
}

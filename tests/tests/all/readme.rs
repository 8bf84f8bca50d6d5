//! The porting guide (`docs/porting.md`, once the README's section) compiles: every piece of
//! code in the cuda-mem column of its tables appears in `readme_snippets.rs` (compiled with
//! this test binary), outside comments. (Its fenced code blocks are doctests:
//! `tests/src/lib.rs`.)

const PORTING: &str = include_str!("../../../docs/porting.md");
const SNIPPETS: &str = include_str!("readme_snippets.rs");

/// Cells that name things in prose rather than being code to compile.
const PROSE: [&str; 3] = [
    "copy_range_async(..)", // "or `copy_range_async(..)`": the call elided
    "std::thread::scope",   // "like `std::thread::scope`"
    "cuda_mem_probes::Probes::xor_checksum", // "... is an example"
];

/// The code spans of the last column of every table row of the porting guide, unescaped
/// (`\|` is `|` inside a table).
fn table_code(page: &str) -> Vec<String> {
    let guide = &page[page
        .find("# Porting guide")
        .expect("docs/porting.md is the porting guide")..];
    let mut spans = Vec::new();
    for line in guide.lines().filter(|l| l.starts_with('|')) {
        // Cells split on `|` not preceded by a backslash.
        let mut cells = Vec::new();
        let mut cell = String::new();
        let mut prev = ' ';
        for c in line.chars() {
            if c == '|' && prev != '\\' {
                cells.push(std::mem::take(&mut cell));
            } else {
                cell.push(c);
            }
            prev = c;
        }
        let Some(last) = cells.iter().rev().find(|c| !c.trim().is_empty()) else {
            continue;
        };
        if last.trim_start().starts_with("---") {
            continue;
        }
        spans.extend(
            last.split('`')
                .skip(1)
                .step_by(2)
                .map(|s| s.replace("\\|", "|")),
        );
    }
    spans
}

/// Whether a span is code to compile: it calls, binds, accesses or names a path, and is not a
/// C API name (`cudaHostAlloc(DEFAULT)`) or prose.
fn is_code(span: &str) -> bool {
    let code_like = span.contains(['(', '?', ';', '=', '.']) || span.contains("::");
    let c_name = span.starts_with("cuda") && span[4..].starts_with(char::is_uppercase);
    code_like && !c_name && !PROSE.contains(&span)
}

/// Rust source without `//` comments and without whitespace, for matching code that rustfmt
/// may have laid out differently.
fn squeeze_code(src: &str) -> String {
    src.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
        .collect()
}

#[test]
fn every_porting_guide_table_cell_is_compiled() {
    let spans = table_code(PORTING);
    let code: Vec<&String> = spans.iter().filter(|s| is_code(s)).collect();
    assert!(
        code.len() > 150,
        "only {} cells found: is the parser broken?",
        code.len()
    );
    let compiled = squeeze_code(SNIPPETS);
    let missing: Vec<&&String> = code
        .iter()
        .filter(|s| !compiled.contains(&squeeze_code(s)))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/porting.md table code not compiled in tests/tests/all/readme_snippets.rs:\n{}",
        missing
            .iter()
            .map(|s| format!("  `{s}`"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    for prose in PROSE {
        assert!(
            spans.iter().any(|s| s == prose),
            "PROSE entry {prose:?} is no longer in docs/porting.md"
        );
    }
}

#[test]
fn the_parser_finds_cells_and_skips_prose() {
    let t = "## Porting guide\n| C++ | cuda-mem |\n|---|---|\n| `a` | `x.f()?` and `A \\| B` or `cudaFoo(X)` |\n";
    assert_eq!(table_code(t), ["x.f()?", "A | B", "cudaFoo(X)"]);
    assert!(is_code("x.f()?"));
    assert!(!is_code("A | B"));
    assert!(!is_code("cudaFoo(X)"));
    assert!(is_code("HostAllocFlags::PORTABLE | HostAllocFlags::MAPPED"));
    assert_eq!(squeeze_code("let a = b; // c\n  f(a)?"), "leta=b;f(a)?");
}

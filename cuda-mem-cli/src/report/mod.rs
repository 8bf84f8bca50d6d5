//! Writers over the plain results of `results`: text tables, JSON, SVG, the comparison with a
//! baseline, and progress on stderr. Pure functions (but progress), tested on fixed sample
//! data.

pub mod compare;
pub mod json;
pub mod progress;
pub mod svg;
pub mod table;

use std::io::Write;

use anyhow::Context;

use crate::args::Output;

/// Writes `text` to stdout; a closed pipe (`cuda-mem info | head -1`) is not an error.
pub fn to_stdout(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("cannot write to stdout")
        }
        _ => Ok(()),
    }
}

/// Writes `text` to stderr, ignoring failures (progress and diagnostics only).
pub fn to_stderr(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Writes `text` to `out`.
pub fn emit(out: &Output, text: &str) -> anyhow::Result<()> {
    match out {
        Output::Stdout => to_stdout(text),
        Output::File(p) => {
            std::fs::write(p, text).with_context(|| format!("cannot write {}", p.display()))
        }
    }
}

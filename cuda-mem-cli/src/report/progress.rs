//! Progress on stderr: on a terminal, a bar per stage of `bench` (indicatif), with result
//! lines printed above it; otherwise (a pipe, a log file, CI) plain `cuda-mem bench: ...`
//! lines, as a log wants. Colour follows `NO_COLOR` (the console crate reads it).

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// The bar of the current stage, when drawing bars.
static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Whether stderr is a terminal (bars) or not (plain lines).
pub fn bars() -> bool {
    std::io::stderr().is_terminal()
}

fn style() -> ProgressStyle {
    let colour = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let template = if colour {
        "{prefix:>10.cyan.bold} [{bar:30.green/blue}] {pos}/{len} {elapsed:>4} {wide_msg}"
    } else {
        "{prefix:>10} [{bar:30}] {pos}/{len} {elapsed:>4} {wide_msg}"
    };
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

fn finish(bar: Option<ProgressBar>) {
    if let Some(b) = bar {
        b.set_position(b.length().unwrap_or(0));
        b.finish_with_message("done");
    }
}

/// Starts stage `name` with `steps` steps (the previous stage's bar is finished).
pub fn stage(name: &str, steps: u64) {
    let Ok(mut cur) = BAR.lock() else { return };
    finish(cur.take());
    if bars() {
        let b = ProgressBar::new(steps.max(1)).with_style(style());
        b.set_prefix(name.to_string());
        b.enable_steady_tick(Duration::from_millis(200));
        *cur = Some(b);
    }
}

/// Ends the last stage.
pub fn done() {
    if let Ok(mut cur) = BAR.lock() {
        finish(cur.take());
    }
}

/// One step of the current stage: `what` it measures now. A plain line off a terminal.
pub fn step(what: &str) {
    match BAR.lock().ok().as_deref() {
        Some(Some(b)) => {
            b.inc(1);
            b.set_message(what.to_string());
        }
        _ => line(what),
    }
}

/// A line to keep (a result, a skipped kind): above the bar on a terminal.
pub fn note(what: &str) {
    match BAR.lock().ok().as_deref() {
        Some(Some(b)) => b.println(format!("  {}", what.trim_start())),
        _ => line(what),
    }
}

fn line(what: &str) {
    crate::report::to_stderr(&format!("cuda-mem bench: {what}\n"));
}

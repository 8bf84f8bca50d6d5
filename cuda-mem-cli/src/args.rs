//! The command line, parsed by hand: `info [--json]` and `bench [options]`.

use std::path::PathBuf;

use crate::units::{fmt_size, parse_size};

/// The usage text of `--help`.
pub const USAGE: &str = "\
cuda-mem: what each kind of CUDA memory costs on this machine

Usage:
  cuda-mem info [--json]
  cuda-mem bench [--quick] [--json PATH|-] [--svg PATH|-] [--sizes LIST] [--samples N]
                 [--out-dir DIR]
  cuda-mem --help | --version

info     runtime and driver versions, then every device: name, compute capability, PCI bus
         id, free/total memory and memory capabilities.
  --json           print JSON instead of text

bench    copy bandwidth (pageable, pinned, write-combined, mapped, registered host memory
         to and from the device, and device to device), kernel read/write bandwidth (device,
         zero-copy mapped, managed), allocation + free latency; each through the safe
         cuda-mem API and through raw cuda-mem-sys calls, so the overhead shows as a ratio.
  --quick          a short run (under 30 s): 5 sizes up to 64 MiB, 5 samples
  --json PATH|-    write the results as JSON to PATH, or to stdout with '-' (the table then
                   goes to stderr)
  --svg PATH|-     write a plot of copy bandwidth against transfer size (SVG)
  --sizes LIST     copy sizes, comma-separated, multiples of 16 bytes, binary units
                   (e.g. 4K,1M,256M,1G); default: powers of two from 4KiB to 1GiB
  --samples N      timed samples per measurement, median reported (3..=1000; default 15,
                   5 with --quick)
  --out-dir DIR    write bench.txt, bench.json and bench.svg into DIR

Progress goes to stderr. Exit status: 0 success, 1 failure (no driver or device, a CUDA
error, data that did not verify), 2 bad command line.
";

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `--help`, `-h`, `help`.
    Help,
    /// `--version`, `-V`.
    Version,
    /// `info`.
    Info {
        /// `--json`.
        json: bool,
    },
    /// `bench`.
    Bench(BenchArgs),
}

/// Where an output goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// `-`: standard output.
    Stdout,
    /// A file.
    File(PathBuf),
}

/// The options of `bench`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BenchArgs {
    /// `--quick`.
    pub quick: bool,
    /// `--json`.
    pub json: Option<Output>,
    /// `--svg`.
    pub svg: Option<Output>,
    /// `--sizes`, sorted, without duplicates.
    pub sizes: Option<Vec<u64>>,
    /// `--samples`.
    pub samples: Option<u32>,
    /// `--out-dir`.
    pub out_dir: Option<PathBuf>,
}

/// A command-line error: the message to print before the usage hint (exit status 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

/// Parses the arguments after the program name.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command, UsageError> {
    let mut args = args.into_iter();
    let Some(cmd) = args.next() else {
        return err("no command given");
    };
    let rest: Vec<String> = args.collect();
    // `--help` anywhere wins, so that `cuda-mem bench --help` never starts a run.
    if rest.iter().any(|a| a == "--help" || a == "-h") {
        return Ok(Command::Help);
    }
    match cmd.as_str() {
        "--help" | "-h" | "help" => Ok(Command::Help),
        "--version" | "-V" => Ok(Command::Version),
        "info" => parse_info(&rest),
        "bench" => parse_bench(&rest).map(Command::Bench),
        other if other.starts_with('-') => err(format!("unknown option '{other}'")),
        other => err(format!("unknown command '{other}' (commands: info, bench)")),
    }
}

fn parse_info(rest: &[String]) -> Result<Command, UsageError> {
    let mut json = false;
    for a in rest {
        match a.as_str() {
            "--json" => json = true,
            other => return err(format!("unknown option '{other}' for 'info'")),
        }
    }
    Ok(Command::Info { json })
}

/// Splits `--flag=value` into `("--flag", Some("value"))`.
fn split_flag(arg: &str) -> (&str, Option<&str>) {
    match arg.split_once('=') {
        Some((f, v)) if f.starts_with("--") => (f, Some(v)),
        _ => (arg, None),
    }
}

fn parse_bench(rest: &[String]) -> Result<BenchArgs, UsageError> {
    let mut out = BenchArgs::default();
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = split_flag(arg);
        let mut value = |name: &str| -> Result<String, UsageError> {
            match inline {
                Some(v) => Ok(v.to_string()),
                None => match it.next() {
                    Some(v) => Ok(v.clone()),
                    None => err(format!("{name} needs a value")),
                },
            }
        };
        match flag {
            "--quick" if inline.is_none() => out.quick = true,
            "--json" => out.json = Some(output(&value("--json")?, "--json")?),
            "--svg" => out.svg = Some(output(&value("--svg")?, "--svg")?),
            "--sizes" => out.sizes = Some(sizes(&value("--sizes")?)?),
            "--samples" => out.samples = Some(samples(&value("--samples")?)?),
            "--out-dir" => {
                let v = value("--out-dir")?;
                if v.is_empty() {
                    return err("--out-dir needs a directory");
                }
                out.out_dir = Some(PathBuf::from(v));
            }
            _ => return err(format!("unknown option '{arg}' for 'bench'")),
        }
    }
    if out.json == Some(Output::Stdout) && out.svg == Some(Output::Stdout) {
        return err("--json - and --svg - cannot both write to stdout");
    }
    Ok(out)
}

fn output(v: &str, name: &str) -> Result<Output, UsageError> {
    match v {
        "" => err(format!("{name} needs a path, or '-' for stdout")),
        "-" => Ok(Output::Stdout),
        p => Ok(Output::File(PathBuf::from(p))),
    }
}

fn sizes(v: &str) -> Result<Vec<u64>, UsageError> {
    let mut out = Vec::new();
    for part in v.split(',').filter(|p| !p.trim().is_empty()) {
        let n = parse_size(part).map_err(|e| UsageError(format!("--sizes: {e}")))?;
        if n < 16 || n % 16 != 0 {
            return err(format!(
                "--sizes: {} is not a positive multiple of 16 bytes",
                part.trim()
            ));
        }
        if n > 64 << 30 {
            return err(format!("--sizes: {} is over 64GiB", fmt_size(n)));
        }
        out.push(n);
    }
    if out.is_empty() {
        return err("--sizes needs at least one size, e.g. 4K,1M,64M");
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn samples(v: &str) -> Result<u32, UsageError> {
    match v.trim().parse::<u32>() {
        Ok(n) if (3..=1000).contains(&n) => Ok(n),
        _ => err(format!(
            "--samples: '{v}' is not a number from 3 to 1000 (the median needs at least 3)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn commands() {
        assert_eq!(p(&["--help"]), Ok(Command::Help));
        assert_eq!(p(&["help"]), Ok(Command::Help));
        assert_eq!(p(&["bench", "--quick", "-h"]), Ok(Command::Help));
        assert_eq!(p(&["-V"]), Ok(Command::Version));
        assert_eq!(p(&["info"]), Ok(Command::Info { json: false }));
        assert_eq!(p(&["info", "--json"]), Ok(Command::Info { json: true }));
        assert_eq!(p(&["bench"]), Ok(Command::Bench(BenchArgs::default())));
    }

    #[test]
    fn bench_options() {
        let got = p(&[
            "bench",
            "--quick",
            "--json",
            "-",
            "--svg=plot.svg",
            "--sizes",
            "1M,4K,4096,64MiB",
            "--samples=7",
            "--out-dir",
            "out",
        ]);
        assert_eq!(
            got,
            Ok(Command::Bench(BenchArgs {
                quick: true,
                json: Some(Output::Stdout),
                svg: Some(Output::File("plot.svg".into())),
                sizes: Some(vec![4096, 1 << 20, 64 << 20]),
                samples: Some(7),
                out_dir: Some("out".into()),
            }))
        );
    }

    #[test]
    fn errors_are_clear() {
        let msg = |a: &[&str]| p(a).unwrap_err().0;
        assert!(p(&[]).is_err());
        assert_eq!(
            msg(&["frobnicate"]),
            "unknown command 'frobnicate' (commands: info, bench)"
        );
        assert_eq!(msg(&["--frob"]), "unknown option '--frob'");
        assert_eq!(
            msg(&["info", "--quick"]),
            "unknown option '--quick' for 'info'"
        );
        assert_eq!(
            msg(&["bench", "--fast"]),
            "unknown option '--fast' for 'bench'"
        );
        assert_eq!(msg(&["bench", "--json"]), "--json needs a value");
        assert!(msg(&["bench", "--samples", "2"]).contains("3 to 1000"));
        assert!(msg(&["bench", "--samples", "x"]).contains("3 to 1000"));
        assert!(msg(&["bench", "--sizes", "17"]).contains("multiple of 16"));
        assert!(msg(&["bench", "--sizes", "4Q"]).contains("unknown unit"));
        assert!(msg(&["bench", "--sizes", ","]).contains("at least one size"));
        assert!(msg(&["bench", "--sizes", "128G"]).contains("over 64GiB"));
        assert!(msg(&["bench", "--json", "-", "--svg", "-"]).contains("both"));
        assert!(msg(&["bench", "--quick=yes"]).contains("unknown option"));
    }
}

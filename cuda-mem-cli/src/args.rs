//! The command line (clap, derive): `info`, `bench`, `compare` and `completions`.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::units::{fmt_size, parse_size};

/// What each kind of CUDA memory costs on this machine.
///
/// Exit status: 0 success, 1 failure (no driver or device, a CUDA error, data that did not
/// verify, a regression with --fail-on-regression), 2 bad command line.
#[derive(Debug, Parser)]
#[command(name = "cuda-mem", about, long_about, max_term_width = 100)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// A command.
#[derive(Debug, Clone, PartialEq, Subcommand)]
pub enum Command {
    /// Runtime and driver versions, then every device: name, compute capability, PCI bus id
    /// and link, free/total memory, memory capabilities, pools and copy engines.
    Info {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Copy bandwidth (every kind of host memory to and from the device, device to device,
    /// both directions at once), kernel bandwidth, allocation latency and per-call cost; each
    /// through the safe cuda-mem API and through raw cuda-mem-sys calls, so the overhead
    /// shows as a ratio.
    ///
    /// Progress goes to stderr: a bar per stage on a terminal, plain lines otherwise.
    Bench(BenchArgs),
    /// Compare two saved `bench --json` files: each figure of NEW against BASELINE.
    Compare(CompareArgs),
    /// Redraw the SVG plot from a saved `bench --json` file.
    Plot {
        /// The saved run.
        #[arg(value_name = "BENCH.json")]
        input: PathBuf,
        /// Where the SVG goes: PATH, or '-' for stdout.
        #[arg(short, long, value_name = "PATH|-", default_value = "-", value_parser = output)]
        output: Output,
    },
    /// Print a shell completion script, e.g. `cuda-mem completions bash > /etc/bash_completion.d/cuda-mem`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Where an output goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// `-`: standard output.
    Stdout,
    /// A file.
    File(PathBuf),
}

/// The default noise threshold, percent.
const NOISE_THRESHOLD: f64 = 2.0;

/// How a run is compared with a baseline.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct Thresholds {
    /// Changes smaller than this (percent) are noise even when beyond the spread, as
    /// criterion's noise threshold.
    #[arg(long, value_name = "PCT", default_value_t = NOISE_THRESHOLD, value_parser = percent)]
    pub noise_threshold: f64,
    /// Exit with status 1 when a figure regressed.
    #[arg(long)]
    pub fail_on_regression: bool,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            noise_threshold: NOISE_THRESHOLD,
            fail_on_regression: false,
        }
    }
}

/// The options of `bench`.
#[derive(Debug, Clone, Default, PartialEq, Args)]
pub struct BenchArgs {
    /// A short run (under 30 s): 5 sizes up to 64 MiB, 5 samples.
    #[arg(long)]
    pub quick: bool,
    /// Write the results as JSON to PATH, or to stdout with '-' (the table then goes to stderr).
    #[arg(long, value_name = "PATH|-", value_parser = output)]
    pub json: Option<Output>,
    /// Write a plot of copy bandwidth against transfer size (SVG) to PATH, or '-'.
    #[arg(long, value_name = "PATH|-", value_parser = output)]
    pub svg: Option<Output>,
    /// Copy sizes, comma-separated, multiples of 16 bytes, binary units (e.g. 4K,1M,256M,1G);
    /// default: powers of two from 4KiB to 1GiB.
    #[arg(long, value_name = "LIST", value_parser = sizes)]
    pub sizes: Option<Sizes>,
    /// Timed samples per measurement, median reported (3..=1000; default 15, 5 with --quick).
    #[arg(long, value_name = "N", value_parser = samples)]
    pub samples: Option<u32>,
    /// Write bench.txt, bench.json and bench.svg into DIR.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
    /// Compare with a saved `--json` file and flag each figure that moved beyond its
    /// run-to-run spread.
    #[arg(long, value_name = "FILE.json")]
    pub baseline: Option<PathBuf>,
    /// Thresholds of the comparison.
    #[command(flatten)]
    pub thresholds: Thresholds,
    /// Run only these sections, comma-separated: copies, bidir, kernels, alloc, pools, calls,
    /// host, graphs, shmoo, peers, multi (default: all), and ipc (two processes: only when
    /// named).
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = [
        "copies", "bidir", "kernels", "alloc", "pools", "calls", "host", "graphs", "shmoo",
        "peers", "multi", "ipc"
    ])]
    pub sections: Option<Vec<String>>,
    /// The graphs section's tiny kernel from this file (a cubin, fatbin or PTX with an entry
    /// `bump(unsigned*, int)`, as `nvcc -cubin -arch=sm_90 scripts/diag/bumpk.cu` builds
    /// graphs.cu's), for cuda-mem's and cudarc's sides, instead of the probes' PTX: the same
    /// machine code as the C++ reference.
    #[arg(long, value_name = "PATH")]
    pub kernel_image: Option<PathBuf>,
    /// graphs.cu's executable (shared/refbench: `nvcc -O2 -arch=sm_90 -o graphs graphs.cu`):
    /// the graphs section runs it beside its own sides, each side graphs.cu's whole protocol
    /// in a fresh process, in rotating order (without it, the sides are set beside raw
    /// runtime calls from Rust).
    #[arg(long, value_name = "PATH")]
    pub graphs_reference: Option<PathBuf>,
}

/// The options of `compare`.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct CompareArgs {
    /// The new run (`bench --json` output).
    #[arg(value_name = "NEW.json")]
    pub new: PathBuf,
    /// The run to compare with.
    #[arg(value_name = "BASELINE.json")]
    pub baseline: PathBuf,
    /// Thresholds of the comparison.
    #[command(flatten)]
    pub thresholds: Thresholds,
}

/// Copy sizes, ascending, without duplicates (a newtype: clap would read a `Vec` as a
/// repeated option).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizes(pub Vec<u64>);

fn output(v: &str) -> Result<Output, String> {
    match v {
        "" => Err("needs a path, or '-' for stdout".into()),
        "-" => Ok(Output::Stdout),
        p => Ok(Output::File(PathBuf::from(p))),
    }
}

fn sizes(v: &str) -> Result<Sizes, String> {
    let mut out = Vec::new();
    for part in v.split(',').filter(|p| !p.trim().is_empty()) {
        let n = parse_size(part)?;
        if n < 16 || n % 16 != 0 {
            return Err(format!(
                "{} is not a positive multiple of 16 bytes",
                part.trim()
            ));
        }
        if n > 64 << 30 {
            return Err(format!("{} is over 64GiB", fmt_size(n)));
        }
        out.push(n);
    }
    if out.is_empty() {
        return Err("needs at least one size, e.g. 4K,1M,64M".into());
    }
    out.sort_unstable();
    out.dedup();
    Ok(Sizes(out))
}

fn samples(v: &str) -> Result<u32, String> {
    match v.trim().parse::<u32>() {
        Ok(n) if (3..=1000).contains(&n) => Ok(n),
        _ => Err("not a number from 3 to 1000 (the median needs at least 3)".into()),
    }
}

fn percent(v: &str) -> Result<f64, String> {
    match v.trim().trim_end_matches('%').parse::<f64>() {
        Ok(x) if (0.0..=100.0).contains(&x) => Ok(x),
        _ => Err("not a percentage from 0 to 100".into()),
    }
}

/// The version line: the package's, the CUDA headers it was built with, and the cuda-mem
/// library features compiled in (`testing` there means the fault seams are too: a workspace
/// build, not the shipped binary, which `cargo build -p cuda-mem-cli` builds alone).
pub fn version() -> String {
    format!(
        "{} (built with CUDA {} headers; library features: {})",
        env!("CARGO_PKG_VERSION"),
        cuda_mem::format_version(cuda_mem::BUILT_CUDART_VERSION as i32),
        cuda_mem::measure::library_features().join(", ")
    )
}

/// The clap command, with the version line.
pub fn command() -> clap::Command {
    Cli::command().version(version())
}

/// Parses `args` (the program name first). `Err` is clap's: help and version are "errors"
/// that print to stdout and exit 0, the others print to stderr and exit 2.
pub fn parse<I, T>(args: I) -> Result<Command, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut cmd = command();
    let matches = cmd.try_get_matches_from_mut(args)?;
    let cli = Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))?;
    if let Command::Bench(b) = &cli.command {
        if b.json == Some(Output::Stdout) && b.svg == Some(Output::Stdout) {
            return Err(cmd.error(
                ErrorKind::ArgumentConflict,
                "--json - and --svg - cannot both write to stdout",
            ));
        }
        if b.thresholds.fail_on_regression && b.baseline.is_none() {
            return Err(cmd.error(
                ErrorKind::MissingRequiredArgument,
                "--fail-on-regression needs --baseline FILE.json",
            ));
        }
    }
    Ok(cli.command)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind as K;

    fn p(args: &[&str]) -> Result<Command, clap::Error> {
        parse(std::iter::once("cuda-mem").chain(args.iter().copied()))
    }

    fn kind(args: &[&str]) -> K {
        p(args).unwrap_err().kind()
    }

    fn msg(args: &[&str]) -> String {
        p(args).unwrap_err().to_string()
    }

    #[test]
    fn clap_definition_is_consistent() {
        command().debug_assert();
    }

    #[test]
    fn commands() {
        assert_eq!(kind(&["--help"]), K::DisplayHelp);
        assert_eq!(kind(&["bench", "--quick", "-h"]), K::DisplayHelp);
        assert_eq!(kind(&["-V"]), K::DisplayVersion);
        assert_eq!(p(&["info"]).unwrap(), Command::Info { json: false });
        assert_eq!(
            p(&["info", "--json"]).unwrap(),
            Command::Info { json: true }
        );
        assert_eq!(p(&["bench"]).unwrap(), Command::Bench(BenchArgs::default()));
        assert_eq!(
            p(&["completions", "zsh"]).unwrap(),
            Command::Completions {
                shell: clap_complete::Shell::Zsh
            }
        );
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
            "--baseline",
            "old.json",
            "--fail-on-regression",
            "--noise-threshold",
            "5%",
            "--kernel-image",
            "bump.cubin",
            "--graphs-reference",
            "/tmp/graphs",
        ])
        .unwrap();
        assert_eq!(
            got,
            Command::Bench(BenchArgs {
                quick: true,
                json: Some(Output::Stdout),
                svg: Some(Output::File("plot.svg".into())),
                sizes: Some(Sizes(vec![4096, 1 << 20, 64 << 20])),
                samples: Some(7),
                out_dir: Some("out".into()),
                baseline: Some("old.json".into()),
                thresholds: Thresholds {
                    noise_threshold: 5.0,
                    fail_on_regression: true
                },
                sections: None,
                kernel_image: Some("bump.cubin".into()),
                graphs_reference: Some("/tmp/graphs".into()),
            })
        );
        let Command::Compare(c) = p(&["compare", "a.json", "b.json"]).unwrap() else {
            panic!("compare")
        };
        assert_eq!(c.new, PathBuf::from("a.json"));
        assert_eq!(c.thresholds.noise_threshold, 2.0);
    }

    #[test]
    fn errors_are_clear() {
        assert_eq!(kind(&[]), K::DisplayHelpOnMissingArgumentOrSubcommand);
        assert_eq!(kind(&["frobnicate"]), K::InvalidSubcommand);
        assert!(msg(&["frobnicate"]).contains("unrecognized subcommand 'frobnicate'"));
        assert_eq!(kind(&["--frob"]), K::UnknownArgument);
        assert_eq!(kind(&["info", "--quick"]), K::UnknownArgument);
        assert!(msg(&["bench", "--fast"]).contains("unexpected argument '--fast'"));
        assert!(msg(&["bench", "--json"]).contains("a value is required for '--json <PATH|->'"));
        assert!(msg(&["bench", "--samples", "2"]).contains("3 to 1000"));
        assert!(msg(&["bench", "--samples", "x"]).contains("3 to 1000"));
        assert!(msg(&["bench", "--sizes", "17"]).contains("multiple of 16"));
        assert!(msg(&["bench", "--sizes", "4Q"]).contains("unknown unit"));
        assert!(msg(&["bench", "--sizes", ","]).contains("at least one size"));
        assert!(msg(&["bench", "--sizes", "128G"]).contains("over 64GiB"));
        assert!(msg(&["bench", "--json", "-", "--svg", "-"]).contains("both"));
        assert!(msg(&["bench", "--fail-on-regression"]).contains("needs --baseline"));
        assert!(msg(&["bench", "--noise-threshold", "150"]).contains("percentage"));
        assert_eq!(kind(&["bench", "--quick=yes"]), K::TooManyValues);
        assert_eq!(kind(&["completions", "tcsh"]), K::InvalidValue);
        assert_eq!(kind(&["compare", "a.json"]), K::MissingRequiredArgument);
        // Every usage error exits 2.
        for args in [
            &["bench", "--fast"][..],
            &["frobnicate"],
            &["bench", "--json", "-", "--svg", "-"],
        ] {
            assert_eq!(p(args).unwrap_err().exit_code(), 2, "{args:?}");
        }
    }
}

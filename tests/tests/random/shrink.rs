//! Shrinking a failing program to a minimal one: delta debugging (Zeller's ddmin) over its
//! phases, then its threads' operation lists, then single operations (nested ones too).
//!
//! GPU races depend on timing, so a candidate counts as failing if *any* of several runs fails.
//! The search stops early at a budget of runs or time, keeping the smallest failing program so
//! far.

use std::collections::BTreeSet;
use std::time::Instant;

use crate::program::Program;

/// Limits of a search.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Runs of each candidate; it fails if any run fails.
    pub runs: usize,
    /// Most candidate programs tried.
    pub max_tests: usize,
    /// Give up (keeping the best so far) at this time.
    pub deadline: Option<Instant>,
}

/// The result of a search.
#[derive(Debug)]
pub struct Shrunk {
    pub program: Program,
    /// The failure of the smallest program (the last failing run's message).
    pub failure: String,
    /// Candidates tried.
    pub tests: usize,
    /// Whether the budget ran out before the search was done.
    pub exhausted: bool,
}

/// ddmin: a 1-minimal subset of `items` on which `fails` holds (given that it holds on all of
/// `items`), trying halves, then complements, then finer splits.
pub fn ddmin<T: Clone>(items: Vec<T>, fails: &mut dyn FnMut(&[T]) -> bool) -> Vec<T> {
    let mut items = items;
    let mut n = 2usize;
    'outer: while items.len() >= 2 {
        let chunks: Vec<Vec<T>> = split(&items, n);
        for c in &chunks {
            if fails(c) {
                items = c.clone();
                n = 2;
                continue 'outer;
            }
        }
        if chunks.len() > 2 {
            for i in 0..chunks.len() {
                let rest: Vec<T> = chunks
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != i)
                    .flat_map(|(_, c)| c.iter().cloned())
                    .collect();
                if fails(&rest) {
                    items = rest;
                    n = (n - 1).max(2);
                    continue 'outer;
                }
            }
        }
        if n >= items.len() {
            break;
        }
        n = (n * 2).min(items.len());
    }
    if items.len() == 1 && fails(&[]) {
        items.clear();
    }
    items
}

/// `items` in `n` contiguous chunks of nearly equal size.
fn split<T: Clone>(items: &[T], n: usize) -> Vec<Vec<T>> {
    let n = n.min(items.len()).max(1);
    let (q, r) = (items.len() / n, items.len() % n);
    let mut out = Vec::with_capacity(n);
    let mut at = 0;
    for i in 0..n {
        let len = q + usize::from(i < r);
        out.push(items[at..at + len].to_vec());
        at += len;
    }
    out
}

/// Shrinks `program`, which failed, with `run` (one execution: `Err` with a description on
/// failure).
pub fn shrink(
    program: &Program,
    budget: Budget,
    run: &mut dyn FnMut(&Program) -> Result<(), String>,
) -> Shrunk {
    let mut tests = 0usize;
    let mut exhausted = false;
    let mut last_failure = String::new();
    // A candidate is the set of pre-order operation numbers kept.
    let mut test = |keep: &BTreeSet<usize>, last: &mut String| -> bool {
        if tests >= budget.max_tests || budget.deadline.is_some_and(|d| Instant::now() >= d) {
            exhausted = true;
            return false;
        }
        tests += 1;
        let candidate = program.retain(&|i| keep.contains(&i));
        for _ in 0..budget.runs.max(1) {
            if let Err(e) = run(&candidate) {
                *last = e;
                return true;
            }
        }
        false
    };
    let numbering = program.numbering();
    let all: BTreeSet<usize> = numbering.iter().flatten().flatten().copied().collect();
    let mut keep = all.clone();
    if !test(&keep, &mut last_failure) {
        return Shrunk {
            program: program.clone(),
            failure: format!(
                "the failure did not reproduce in {} runs: not shrunk",
                budget.runs
            ),
            tests,
            exhausted,
        };
    }
    let union = |groups: &[Vec<usize>]| -> BTreeSet<usize> {
        groups
            .iter()
            .flatten()
            .copied()
            .collect::<BTreeSet<usize>>()
    };
    // Level 1: phases; level 2: one thread's list in one phase; level 3: operations.
    let phases: Vec<Vec<usize>> = numbering
        .iter()
        .map(|p| p.iter().flatten().copied().collect())
        .collect();
    let lists: Vec<Vec<usize>> = numbering.iter().flatten().cloned().collect();
    for level in 0..3 {
        let groups: Vec<Vec<usize>> = match level {
            0 => phases.clone(),
            1 => lists.clone(),
            _ => keep.iter().map(|&i| vec![i]).collect(),
        };
        let groups: Vec<Vec<usize>> = groups
            .into_iter()
            .map(|g| {
                g.into_iter()
                    .filter(|i| keep.contains(i))
                    .collect::<Vec<_>>()
            })
            .filter(|g| !g.is_empty())
            .collect();
        let kept = ddmin(groups, &mut |gs: &[Vec<usize>]| {
            test(&union(gs), &mut last_failure)
        });
        keep = union(&kept);
    }
    let mut best = program.retain(&|i| keep.contains(&i));
    let compact = best.without_empty_phases();
    if compact.phases.len() < best.phases.len() {
        let mut ok = false;
        for _ in 0..budget.runs.max(1) {
            if let Err(e) = run(&compact) {
                last_failure = e;
                ok = true;
                break;
            }
        }
        if ok {
            best = compact;
        }
    }
    Shrunk {
        program: best,
        failure: last_failure,
        tests,
        exhausted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{generate, GenConfig};
    use crate::program::{Op, StreamSel};

    /// All operations of a program in pre-order (nested ones after their parent).
    fn flat(p: &Program) -> Vec<Op> {
        fn walk(ops: &[Op], out: &mut Vec<Op>) {
            for op in ops {
                out.push(op.clone());
                walk(op.body(), out);
            }
        }
        let mut out = Vec::new();
        for phase in &p.phases {
            for ops in &phase.threads {
                walk(ops, &mut out);
            }
        }
        out
    }

    const A: Op = Op::Spin {
        stream: StreamSel::Legacy,
        dev: 0,
        us: 123_456,
    };
    const B: Op = Op::FailRecords { n: 77 };

    /// A generated program of `ops` operations with `A` planted in the first phase and `B` in
    /// the last (inside thread lists among the random operations).
    fn planted(seed: u64, ops: usize) -> Program {
        let mut p = generate(
            seed,
            &GenConfig {
                ops,
                max_threads: 4,
                devices: 1,
            },
        );
        let last = p.phases.len() - 1;
        let t = p.threads - 1;
        let first = &mut p.phases[0].threads[0];
        first.insert(first.len() / 2, A);
        let end = &mut p.phases[last].threads[t];
        end.insert(end.len() / 2, B);
        p
    }

    /// The 'bug': operation A runs somewhere before operation B.
    fn a_then_b(p: &Program) -> bool {
        let ops = flat(p);
        let a = ops.iter().position(|o| *o == A);
        let b = ops.iter().rposition(|o| *o == B);
        matches!((a, b), (Some(a), Some(b)) if a < b)
    }

    fn budget() -> Budget {
        Budget {
            runs: 3,
            max_tests: 100_000,
            deadline: None,
        }
    }

    /// A fake executor whose bug needs A then B shrinks to exactly those two operations.
    #[test]
    fn a_failing_program_shrinks_to_the_two_operations_that_fail_it() {
        for seed in [1u64, 2, 3] {
            let p = planted(seed, 200);
            assert!(p.count() > 200);
            let mut runs = 0;
            let s = shrink(&p, budget(), &mut |p| {
                runs += 1;
                if a_then_b(p) {
                    Err("A then B".into())
                } else {
                    Ok(())
                }
            });
            assert_eq!(flat(&s.program), vec![A, B], "seed {seed}:\n{}", s.program);
            assert_eq!(s.failure, "A then B");
            assert!(!s.exhausted);
            assert_eq!(s.program.phases.len(), 2, "empty phases are dropped");
            assert!(runs < 3000, "{runs} runs");
        }
    }

    /// A failure that shows only in some runs (a race) is kept as long as any of the runs of
    /// a candidate fails.
    #[test]
    fn a_flaky_failure_is_kept_when_any_run_fails() {
        let p = planted(4, 150);
        let mut calls = 0u64;
        let s = shrink(&p, budget(), &mut |p| {
            calls += 1;
            // Fails one run in three, when the bug is present.
            if a_then_b(p) && calls % 3 == 0 {
                Err("flaky".into())
            } else {
                Ok(())
            }
        });
        assert_eq!(flat(&s.program), vec![A, B], "{}", s.program);
    }

    /// Operations nested in a guard-holding operation are shrunk too, and the parent goes
    /// when nothing needs it.
    #[test]
    fn nested_operations_shrink() {
        let mut p = planted(5, 60);
        p.phases[0].threads[0].push(Op::HoldRead {
            slot: 0,
            stream: StreamSel::PerThread,
            body: vec![Op::FailRecords { n: 1 }, B, Op::FailRecords { n: 2 }],
            into: None,
            forget: true,
        });
        // Only the nested B (after A) fails now: remove the planted one.
        let last = p.phases.len() - 1;
        let t = p.threads - 1;
        p.phases[last].threads[t].retain(|o| *o != B);
        let s = shrink(&p, budget(), &mut |p| {
            if a_then_b(p) {
                Err("nested".into())
            } else {
                Ok(())
            }
        });
        let ops = flat(&s.program);
        assert_eq!(ops.len(), 3, "{}", s.program);
        assert_eq!(ops[0], A);
        assert!(matches!(&ops[1], Op::HoldRead { body, .. } if body == &vec![B]));
        assert_eq!(ops[2], B);
    }

    /// A failure that does not reproduce is reported, not shrunk to nothing.
    #[test]
    fn a_failure_that_does_not_reproduce_is_left_alone() {
        let p = planted(6, 50);
        let s = shrink(&p, budget(), &mut |_| Ok(()));
        assert_eq!(s.program, p);
        assert!(s.failure.contains("did not reproduce"));
    }

    #[test]
    fn ddmin_finds_a_minimal_subset() {
        let items: Vec<u32> = (0..50).collect();
        let got = ddmin(items, &mut |s: &[u32]| {
            s.contains(&7) && s.contains(&31) && s.contains(&32)
        });
        assert_eq!(got, vec![7, 31, 32]);
        let got = ddmin((0..10).collect::<Vec<u32>>(), &mut |_: &[u32]| true);
        assert!(got.is_empty());
    }
}

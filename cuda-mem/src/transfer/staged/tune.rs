//! The store kind of large copies, tried on the first ones.
//!
//! Calibration measures non-temporal stores on 16 MiB copies; on the 16-core H200 host the
//! answer flipped for copies of hundreds of MiB (host to device: non-temporal stores won at
//! 16 and 64 MiB, ordinary ones at 256 MiB and 1 GiB by 10–12%), and copies that large take
//! too long to measure at first use. So the process-wide stager tries both on the first
//! copies of each size class from 64 MiB up (a power of two per class, per direction): two
//! copies each way, alternating, then it keeps the faster, which must beat the calibrated
//! choice by 3% to replace it. A trial counts only when no other staged copy ran meanwhile
//! (two copies at once share the bandwidth). [`staged_config`](super::staged_config) lists the
//! choices made ([`LargeCopyChoice`]).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::{lock, Dir};

/// Smallest copy whose store kind is tried.
pub(super) const FROM: usize = 64 << 20;
/// Size classes tried: 2^26 (64 MiB) to 2^40 and beyond.
const CLASSES: usize = 15;
/// Trials of each store kind before choosing.
const TRIALS: usize = 2;

/// What the process-wide stager chose for large copies of one size class and direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LargeCopyChoice {
    /// Host to device (else device to host).
    pub to_device: bool,
    /// The size class: copies from this many bytes up to twice as many.
    pub from_bytes: usize,
    /// Non-temporal stores chosen.
    pub nt_stores: bool,
    /// GB/s of the trials with non-temporal stores, and with ordinary stores (means).
    pub gbps_nt: f64,
    /// GB/s of the trials with ordinary stores.
    pub gbps_plain: f64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Class {
    /// GB/s of the valid trials, non-temporal and ordinary stores.
    nt: [f64; TRIALS],
    plain: [f64; TRIALS],
    n_nt: usize,
    n_plain: usize,
    decided: Option<bool>,
}

/// The trials and choices of one stager.
pub(super) struct Tuner {
    classes: Mutex<[[Class; CLASSES]; 2]>,
    /// Directions whose store kind is fixed (by the environment): never tried.
    fixed: [bool; 2],
    /// Off once the configuration is set by hand.
    on: AtomicBool,
    /// Staged copies running, and started so far: a trial is valid when it ran alone.
    active: AtomicUsize,
    started: AtomicU64,
}

/// A copy run as a trial.
#[derive(Debug, Clone, Copy)]
pub(super) struct Trial {
    dir: Dir,
    class: usize,
    nt: bool,
    bytes: usize,
    /// `started` after this copy started, if it started alone.
    alone: Option<u64>,
}

fn class_of(bytes: usize) -> usize {
    let log = usize::BITS - 1 - bytes.leading_zeros();
    (log as usize).saturating_sub(26).min(CLASSES - 1)
}

impl Tuner {
    pub(super) fn new(fixed: [bool; 2]) -> Tuner {
        Tuner {
            classes: Mutex::new([[Class::default(); CLASSES]; 2]),
            fixed,
            on: AtomicBool::new(true),
            active: AtomicUsize::new(0),
            started: AtomicU64::new(0),
        }
    }

    /// Stops trying (the configuration was set by hand: its store kinds hold for every size).
    pub(super) fn off(&self) {
        self.on.store(false, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, [[Class; CLASSES]; 2]> {
        lock(&self.classes)
    }

    /// The store kind for a staged copy of `bytes` in `dir` whose configuration says
    /// `configured`: a choice made, or a trial (to [`end`](Self::end) once the copy is done).
    pub(super) fn choose(&self, dir: Dir, bytes: usize, configured: bool) -> (bool, Option<Trial>) {
        if bytes < FROM || self.fixed[dir.index()] || !self.on.load(Ordering::Relaxed) {
            return (configured, None);
        }
        let class = class_of(bytes);
        let c = self.lock()[dir.index()][class];
        if let Some(nt) = c.decided {
            return (nt, None);
        }
        // Alternate, the configured kind first.
        let (n_conf, n_other) = if configured {
            (c.n_nt, c.n_plain)
        } else {
            (c.n_plain, c.n_nt)
        };
        let nt = if n_conf <= n_other {
            configured
        } else {
            !configured
        };
        (
            nt,
            Some(Trial {
                dir,
                class,
                nt,
                bytes,
                alone: None,
            }),
        )
    }

    /// Counts a staged copy starting; for a trial, notes whether it started alone.
    pub(super) fn start(&self, trial: &mut Option<Trial>) {
        let was = self.active.fetch_add(1, Ordering::SeqCst);
        let n = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(t) = trial {
            t.alone = (was == 0).then_some(n);
        }
    }

    /// Counts a staged copy ending after `secs` seconds; a trial that ran alone is recorded,
    /// and once both kinds have their trials the class's choice is made (kept if the other
    /// kind is not at least 3% faster than `configured`).
    pub(super) fn end(&self, trial: Option<Trial>, secs: f64, ok: bool, configured: bool) {
        self.active.fetch_sub(1, Ordering::SeqCst);
        let Some(t) = trial else { return };
        let alone = t.alone == Some(self.started.load(Ordering::SeqCst));
        if !ok || !alone || secs <= 0.0 {
            return;
        }
        let gbps = t.bytes as f64 / secs / 1e9;
        let mut all = self.lock();
        let c = &mut all[t.dir.index()][t.class];
        if c.decided.is_some() {
            return;
        }
        if t.nt && c.n_nt < TRIALS {
            c.nt[c.n_nt] = gbps;
            c.n_nt += 1;
        } else if !t.nt && c.n_plain < TRIALS {
            c.plain[c.n_plain] = gbps;
            c.n_plain += 1;
        }
        if c.n_nt == TRIALS && c.n_plain == TRIALS {
            let (nt, plain) = (mean(&c.nt), mean(&c.plain));
            c.decided = Some(if configured {
                plain <= 1.03 * nt
            } else {
                nt > 1.03 * plain
            });
        }
    }

    /// The choices made so far.
    pub(super) fn choices(&self) -> Vec<LargeCopyChoice> {
        let all = self.lock();
        let mut out = Vec::new();
        for (d, row) in all.iter().enumerate() {
            for (k, c) in row.iter().enumerate() {
                if let Some(nt) = c.decided {
                    out.push(LargeCopyChoice {
                        to_device: d == 0,
                        from_bytes: FROM << k,
                        nt_stores: nt,
                        gbps_nt: mean(&c.nt),
                        gbps_plain: mean(&c.plain),
                    });
                }
            }
        }
        out
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run one copy through the tuner as the stager does, taking `secs`.
    fn copy(t: &Tuner, dir: Dir, bytes: usize, configured: bool, secs: impl Fn(bool) -> f64) {
        let (nt, mut trial) = t.choose(dir, bytes, configured);
        t.start(&mut trial);
        t.end(trial, secs(nt), true, configured);
    }

    #[test]
    fn size_classes_are_powers_of_two_from_64_mib() {
        assert_eq!(class_of(64 << 20), 0);
        assert_eq!(class_of((128 << 20) - 1), 0);
        assert_eq!(class_of(128 << 20), 1);
        assert_eq!(class_of(1 << 30), 4);
        assert_eq!(class_of(usize::MAX), CLASSES - 1);
    }

    /// Both kinds are tried twice, alternating from the configured one; then the faster is
    /// kept for that class and direction only, and only if 3% faster than the configured.
    #[test]
    fn trials_alternate_then_the_faster_kind_is_kept() {
        let t = Tuner::new([false, false]);
        let big = 256 << 20;
        let mut seen = Vec::new();
        for _ in 0..4 {
            let (nt, mut trial) = t.choose(Dir::ToDevice, big, true);
            assert!(trial.is_some());
            seen.push(nt);
            t.start(&mut trial);
            // Ordinary stores 10% faster.
            t.end(trial, if nt { 1.1 } else { 1.0 }, true, true);
        }
        assert_eq!(seen, [true, false, true, false]);
        assert_eq!(
            t.choose(Dir::ToDevice, big, true).into_pair(),
            (false, None)
        );
        // Other classes and the other direction are still open.
        assert!(t.choose(Dir::ToDevice, 64 << 20, true).1.is_some());
        assert!(t.choose(Dir::ToHost, big, true).1.is_some());
        // Below the first class: the configuration, no trial.
        assert_eq!(
            t.choose(Dir::ToHost, 8 << 20, true).into_pair(),
            (true, None)
        );
        let ch = t.choices();
        assert_eq!(ch.len(), 1);
        assert!(ch[0].to_device && !ch[0].nt_stores && ch[0].from_bytes == 256 << 20);
        // Within 3%: the configured kind stays.
        for _ in 0..4 {
            copy(&t, Dir::ToHost, big, true, |nt| if nt { 1.02 } else { 1.0 });
        }
        assert_eq!(t.choose(Dir::ToHost, big, true).into_pair(), (true, None));
    }

    /// A trial that overlapped another staged copy is not counted; a fixed direction and a
    /// tuner turned off never try.
    #[test]
    fn overlapping_trials_fixed_directions_and_off_do_not_count() {
        let t = Tuner::new([false, true]);
        let big = 128 << 20;
        let (_, mut a) = t.choose(Dir::ToDevice, big, true);
        t.start(&mut a);
        let mut other = None;
        t.start(&mut other); // another copy starts meanwhile
        t.end(other, 1.0, true, true);
        t.end(a, 1.0, true, true);
        assert_eq!(t.lock()[0][1].n_nt, 0, "an overlapped trial was counted");
        assert_eq!(t.choose(Dir::ToHost, big, false).into_pair(), (false, None));
        t.off();
        assert_eq!(t.choose(Dir::ToDevice, big, true).into_pair(), (true, None));
    }

    /// A choice with the trial reduced to whether there is one.
    trait IntoPair {
        fn into_pair(self) -> (bool, Option<()>);
    }
    impl IntoPair for (bool, Option<Trial>) {
        fn into_pair(self) -> (bool, Option<()>) {
            (self.0, self.1.map(|_| ()))
        }
    }
}

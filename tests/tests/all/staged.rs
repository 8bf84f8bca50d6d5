//! Staged pageable copies with a measured configuration (issue 21 §3): data exact both ways
//! around the threshold, at odd sizes and offsets; the process-wide stager uses what it
//! measured, `set_staged_config` takes effect at once, the `CUDA_MEM_STAGED_*` settings reach
//! it, and an invalid one is a clear error while `copy` still copies.

use std::time::Duration;

use cuda_mem::{
    copy, copy_range, copy_staged, set_staged_config, staged_config, ConfigSource, DeviceBuffer,
    Misuse, PinnedPool, PinnedPoolConfig, Stager, StagingConfig,
};
use cuda_mem_tests::{gpu_or_skip, run_child};

use crate::pattern;

/// Pool allocations so far (a staged copy takes its staging blocks from the pool).
fn pool_uses(pool: &PinnedPool) -> u64 {
    let s = pool.stats();
    s.hits + s.misses
}

fn bytes(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + i / 977 + seed) as u8).collect()
}

/// Both directions at the threshold, one byte either side, and odd sizes past it, at aligned
/// and odd offsets on both sides: every byte lands, nothing around the range is touched, and
/// exactly the copies from the threshold up go through the staging blocks.
#[test]
fn staged_copies_are_exact_around_the_threshold_both_ways() {
    let _dev = gpu_or_skip!();
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    let thr = 1 << 20;
    let cfg = StagingConfig {
        threads: 4,
        ..StagingConfig::default()
    }
    .with_min_bytes(thr);
    let st = Stager::new(cfg, pool.clone()).unwrap();
    for len in [thr - 1, thr, thr + 1, thr + 4097, 3 * thr + 13] {
        for (doff, soff) in [(0usize, 0usize), (13, 7)] {
            let src = bytes(len + soff, len);
            let mut dev = DeviceBuffer::<u8>::zeroed(len + doff + 5).unwrap();
            let before = pool_uses(&pool);
            st.copy_range(&mut dev, doff, &src, soff, len).unwrap();
            let staged = pool_uses(&pool) > before;
            assert_eq!(staged, len >= thr, "{len} to the device: staged {staged}");
            let all = dev.to_vec().unwrap();
            assert!(
                all[..doff].iter().all(|&b| b == 0),
                "{len}: before the range"
            );
            assert!(all[doff..doff + len] == src[soff..], "{len}: to the device");
            assert!(all[doff + len..].iter().all(|&b| b == 0), "{len}: after");
            let mut back = vec![0u8; len + 9];
            let before = pool_uses(&pool);
            st.copy_range(&mut back, 3, &dev, doff, len).unwrap();
            let staged = pool_uses(&pool) > before;
            assert_eq!(staged, len >= thr, "{len} to the host: staged {staged}");
            assert!(back[..3].iter().all(|&b| b == 0));
            assert!(back[3..3 + len] == src[soff..], "{len}: back to the host");
            assert!(back[3 + len..].iter().all(|&b| b == 0));
        }
    }
    // Typed, an odd element count just past the threshold.
    let n = thr / 4 + 3;
    let data = pattern(n, 77);
    let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
    st.copy(&mut dev, &data).unwrap();
    let mut out = vec![0u32; n];
    st.copy(&mut out, &dev).unwrap();
    assert!(out == data);
    assert_eq!(
        pool.stats().in_use_bytes,
        0,
        "every staging block went back"
    );
}

/// The process-wide stager measured its configuration, and uses it: `copy` stages from each
/// direction's threshold up and not below; `set_staged_config` changes that at once (and
/// refuses more threads than were started); the measured configuration, set back, works as
/// before.
#[test]
fn the_process_wide_stager_uses_its_measured_configuration_and_overrides() {
    let _dev = gpu_or_skip!();
    let setup = staged_config().unwrap();
    eprintln!("staged configuration: {setup}");
    if !setup.env.is_empty() {
        cuda_mem_tests::skip("staged: CUDA_MEM_STAGED_* set in the environment");
        return;
    }
    let global = Stager::global().unwrap();
    let pool = PinnedPool::global();
    assert_eq!(
        global.config(),
        setup.config,
        "the stager runs what it reports"
    );
    let calibrated = matches!(setup.source, ConfigSource::Calibrated);
    if calibrated {
        let cal = setup.calibration.as_ref().unwrap();
        eprintln!("{cal}");
        assert!(!cal.points.is_empty());
        assert!(
            cal.took < Duration::from_secs(5),
            "calibration took {:?}",
            cal.took
        );
        for t in [
            setup.config.to_device.min_bytes,
            setup.config.to_host.min_bytes,
        ] {
            assert!(
                [1usize << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20].contains(&t),
                "a threshold calibration cannot choose: {t}"
            );
        }
    }
    // Just below and at each direction's threshold.
    for to_device in [true, false] {
        let thr = if to_device {
            setup.config.to_device.min_bytes
        } else {
            setup.config.to_host.min_bytes
        };
        for (len, want) in [(thr - 4096, false), (thr, true)] {
            let src = bytes(len, 5);
            let mut dev = DeviceBuffer::<u8>::zeroed(len).unwrap();
            let mut back = vec![0u8; len];
            let staged = if to_device {
                let before = pool_uses(pool);
                copy(&mut dev, &src).unwrap();
                let staged = pool_uses(pool) > before;
                copy(&mut back, &dev).unwrap();
                staged
            } else {
                copy(&mut dev, &src).unwrap();
                let before = pool_uses(pool);
                copy(&mut back, &dev).unwrap();
                pool_uses(pool) > before
            };
            let way = if to_device {
                "to the device"
            } else {
                "to the host"
            };
            assert_eq!(staged, want, "{len} B {way}, threshold {thr}");
            assert!(back == src, "{len} B {way}: data");
        }
    }
    // An override takes effect at once.
    let big = setup.config.with_min_bytes(64 << 20);
    set_staged_config(big).unwrap();
    let now = staged_config().unwrap();
    assert_eq!((now.config, now.source), (big, ConfigSource::Override));
    let src = bytes(16 << 20, 9);
    let mut dev = DeviceBuffer::<u8>::zeroed(src.len()).unwrap();
    let before = pool_uses(pool);
    copy(&mut dev, &src).unwrap();
    assert_eq!(pool_uses(pool), before, "staged below the new threshold");
    assert!(dev.to_vec().unwrap() == src);
    let e = set_staged_config(StagingConfig {
        threads: setup.workers + 1,
        ..big
    })
    .unwrap_err();
    assert!(
        matches!(e.misuse(), Some(Misuse::InvalidArgument { .. })),
        "{e}"
    );
    assert_eq!(
        staged_config().unwrap().config,
        big,
        "the refused one changed nothing"
    );
    // Back to the measured configuration: 16 MiB is staged again.
    set_staged_config(setup.config).unwrap();
    let before = pool_uses(pool);
    let mut back = vec![0u8; src.len()];
    copy_range(&mut back, 0, &dev, 0, src.len()).unwrap();
    assert!(
        pool_uses(pool) > before,
        "not staged with the measured configuration"
    );
    assert!(back == src);
}

const CHILD: &str = "CUDA_MEM_STAGED_TEST_CHILD";

/// The child of `environment_settings_reach_the_process_wide_stager`.
#[test]
fn staged_env_child() {
    let Ok(which) = std::env::var(CHILD) else {
        return;
    };
    let src = bytes(24 << 20, 3);
    let mut dev = DeviceBuffer::<u8>::zeroed(src.len()).unwrap();
    if which == "good" {
        let s = staged_config().unwrap();
        println!("SETUP {s}");
        assert_eq!(s.config.to_device.min_bytes, 3 << 20);
        assert!(!s.config.to_device.nt_stores && !s.config.to_host.nt_stores);
        assert_eq!(s.config.threads, 2);
        assert_eq!(s.env.len(), 3, "{:?}", s.env);
        // Calibration still ran for what the environment left.
        assert!(matches!(s.source, ConfigSource::Calibrated), "{s}");
        copy_staged(&mut dev, &src).unwrap();
    } else {
        let e = staged_config().unwrap_err();
        println!("ERROR {e}");
        assert!(
            matches!(e.misuse(), Some(Misuse::InvalidArgument { .. })),
            "{e}"
        );
        assert!(e.to_string().contains("CUDA_MEM_STAGED_THREADS"), "{e}");
        let e = copy_staged(&mut dev, &src).unwrap_err();
        assert!(e.to_string().contains("CUDA_MEM_STAGED_THREADS"), "{e}");
        assert!(Stager::global().is_none());
        // `copy` still copies (the driver's path).
        copy(&mut dev, &src).unwrap();
    }
    assert!(dev.to_vec().unwrap() == src);
    println!("CHILD-OK");
}

/// `CUDA_MEM_STAGED_*` settings reach the process-wide stager (and calibration measures the
/// rest); an invalid one is a misuse error naming it, from `staged_config` and `copy_staged`,
/// while `copy` still copies by the driver's path.
#[test]
fn environment_settings_reach_the_process_wide_stager() {
    let _dev = gpu_or_skip!();
    let (ok, out) = run_child(
        "staged::staged_env_child",
        &[
            (CHILD, "good"),
            ("CUDA_MEM_STAGED_MIN_BYTES_H2D", "3M"),
            ("CUDA_MEM_STAGED_NT", "0"),
            ("CUDA_MEM_STAGED_THREADS", "2"),
        ],
        Duration::from_secs(120),
    )
    .expect("child must not hang");
    assert!(ok && out.contains("CHILD-OK"), "child failed:\n{out}");
    let (ok, out) = run_child(
        "staged::staged_env_child",
        &[(CHILD, "bad"), ("CUDA_MEM_STAGED_THREADS", "lots")],
        Duration::from_secs(120),
    )
    .expect("child must not hang");
    assert!(ok && out.contains("CHILD-OK"), "child failed:\n{out}");
}

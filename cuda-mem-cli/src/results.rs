//! Plain results, filled by `info` and `bench` and read by the writers in `report`: no CUDA
//! in here, so the writers can be tested on fixed sample data.

use cuda_mem::MemoryCapabilities;

/// One device, as `info` lists it and `bench` names it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    /// The ordinal.
    pub ordinal: i32,
    /// E.g. `NVIDIA H200`.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// E.g. `0000:18:00.0`.
    pub pci_bus_id: String,
    /// Free device memory, bytes.
    pub free_bytes: u64,
    /// Total device memory, bytes.
    pub total_bytes: u64,
    /// The memory capabilities.
    pub caps: MemoryCapabilities,
    /// What the newer capabilities need.
    pub extra: DeviceExtra,
}

/// Attributes behind stream-ordered pools, bidirectional copies and the PCIe link; `None`
/// where the runtime (or, for the link, sysfs) does not say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceExtra {
    /// `cudaDevAttrMemoryPoolsSupported`: `cudaMallocAsync` and memory pools.
    pub memory_pools: Option<bool>,
    /// `cudaDevAttrHostMemoryPoolsSupported` (144, CUDA 12.6+): pools of pinned host memory.
    pub host_memory_pools: Option<bool>,
    /// `cudaDevAttrAsyncEngineCount`: copy engines; 2 or more can copy both ways at once.
    pub copy_engines: Option<i32>,
    /// The PCIe link, from `/sys/bus/pci/devices/<bus id>/` (the runtime API does not report
    /// link speed or width).
    pub pcie_link: Option<PcieLink>,
}

/// A PCIe link as sysfs reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PcieLink {
    /// `current_link_speed`, e.g. `32.0 GT/s PCIe`.
    pub speed: String,
    /// `current_link_width`, lanes.
    pub width: Option<u32>,
    /// `max_link_speed`.
    pub max_speed: Option<String>,
    /// `max_link_width`.
    pub max_width: Option<u32>,
}

/// Versions, formatted `major.minor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versions {
    /// The CUDA runtime in use (`cudaRuntimeGetVersion`).
    pub runtime: String,
    /// The newest CUDA version the driver supports (`cudaDriverGetVersion`).
    pub driver: String,
    /// The toolkit headers this program was built against.
    pub built_with: String,
}

/// What `info` found.
#[derive(Debug, Clone, PartialEq)]
pub struct InfoReport {
    /// Versions.
    pub versions: Versions,
    /// Every device.
    pub devices: Vec<DeviceInfo>,
}

/// How `bench` measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Method {
    /// `--quick`.
    pub quick: bool,
    /// Untimed warm-up runs before each measurement.
    pub warmup: u32,
    /// Timed samples per measurement (the median is reported).
    pub samples: u32,
    /// Copy sizes, bytes.
    pub sizes: Vec<u64>,
    /// Whether a spin kernel held the stream while each sample was queued (nvbandwidth's
    /// method), so that host-side call overhead is not timed.
    pub blocking_kernel: bool,
    /// Bytes each kernel reads or writes (device and mapped).
    pub kernel_bytes: u64,
    /// Bytes of the managed buffer (at most a quarter of the free device memory).
    pub managed_bytes: u64,
}

/// Copy bandwidth of one kind, direction and size, ours and raw.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyRow {
    /// Memory kind: `pageable`, `pinned`, `write_combined`, `mapped`, `registered`, `device`.
    pub kind: &'static str,
    /// `h2d`, `d2h` or `d2d`.
    pub direction: &'static str,
    /// Bytes per copy.
    pub bytes: u64,
    /// Copies per timed sample (small copies are repeated to rise above the event resolution).
    pub reps: u32,
    /// Timed samples.
    pub samples: u32,
    /// Median GB/s through the cuda-mem API.
    pub gbps: f64,
    /// Median GB/s through raw cuda-mem-sys calls.
    pub raw_gbps: f64,
    /// Ours / raw bandwidth, the median over the interleaved sample pairs (robust to drift):
    /// 1.0 is parity, below 1 ours is slower.
    pub ratio: f64,
    /// Spread of ours: first and third quartile of the samples, GB/s (NaN when unknown).
    pub spread: (f64, f64),
}

/// Bandwidth of one probe kernel over one kind of memory.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelRow {
    /// `device`, `mapped` (zero-copy), `managed_fault` (pages on the host, migrated by page
    /// faults), `managed_prefetched` (prefetched to the device first).
    pub kind: &'static str,
    /// `read`, `write`, or `prefetch` (the migration itself, `cudaMemPrefetchAsync`).
    pub op: &'static str,
    /// Bytes read or written.
    pub bytes: u64,
    /// Timed samples.
    pub samples: u32,
    /// Median GB/s.
    pub gbps: f64,
    /// First and third quartile of the samples, GB/s.
    pub spread: (f64, f64),
}

/// Allocation + free latency of one kind and size, ours and raw.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocRow {
    /// `device`, `pinned`, `write_combined`, `mapped`, `managed`, `registered`.
    pub kind: &'static str,
    /// Bytes allocated.
    pub bytes: u64,
    /// Timed alloc + free cycles.
    pub reps: u32,
    /// Median microseconds through the cuda-mem API.
    pub us: f64,
    /// Median microseconds through raw cuda-mem-sys calls.
    pub raw_us: f64,
    /// Ours / raw time, the median over the interleaved pairs: 1.0 is parity, above 1 ours is
    /// slower.
    pub ratio: f64,
    /// What ours does beyond the raw calls, if anything.
    pub note: Option<&'static str>,
    /// First and third quartile of ours, µs.
    pub spread: (f64, f64),
}

/// One data check made after the timed runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What was checked, e.g. `pinned h2d+d2h copies`.
    pub what: String,
    /// Bytes compared.
    pub bytes: u64,
    /// Whether every byte matched.
    pub ok: bool,
    /// The first mismatch, when not ok.
    pub detail: Option<String>,
}

/// A kind that could not be measured, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindError {
    /// The memory kind.
    pub kind: String,
    /// `copies`, `bidirectional`, `kernels`, `alloc` or `calls`.
    pub stage: &'static str,
    /// E.g. `unsupported: device 0 does not support cudaDevAttrCanMapHostMemory`.
    pub message: String,
}

/// The per-call cost of asynchronous copies (`bench::calls`).
#[derive(Debug, Clone, PartialEq)]
pub struct CallRow {
    /// `loop` (one `copy_async` per copy, µs per copy until synchronized), `enqueue` (host µs
    /// per call while the stream is held), `quarters_4_streams` / `quarters_1_stream` (µs for
    /// four quarter copies until synchronized).
    pub test: &'static str,
    /// `h2d` or `d2h`.
    pub direction: &'static str,
    /// Bytes per copy (for the quarters, of the whole buffer).
    pub bytes: u64,
    /// Calls per sample.
    pub calls: u32,
    /// Ours, µs (median).
    pub us: f64,
    /// Raw `cudaMemcpyAsync`, µs (median).
    pub raw_us: f64,
    /// Speed relative to raw: raw time / ours (1.0 = parity), interquartile mean of pairs.
    pub ratio: f64,
    /// First and third quartile of ours, µs.
    pub spread: (f64, f64),
}

/// Everything `bench` measured.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchResults {
    /// This program's version.
    pub version: String,
    /// Versions of CUDA.
    pub versions: Versions,
    /// The device measured.
    pub device: DeviceInfo,
    /// How.
    pub method: Method,
    /// Copy bandwidth.
    pub copies: Vec<CopyRow>,
    /// Kernel bandwidth.
    pub kernels: Vec<KernelRow>,
    /// Allocation latency.
    pub allocs: Vec<AllocRow>,
    /// Per-call cost of asynchronous copies.
    pub calls: Vec<CallRow>,
    /// Data checks.
    pub checks: Vec<Check>,
    /// Kinds not measured.
    pub errors: Vec<KindError>,
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
    /// Two-GPU measurements (`bench::multi`); empty on one GPU.
    pub multi: Vec<MultiRow>,
    /// Copies both ways at once (`bench::bidir`).
    pub bidir: Vec<BidirRow>,
    /// Host-side speed: pinned pool, cold pinning, staged copies (`bench::host`).
    pub host: Vec<HostRow>,
    /// NVIDIA bandwidthTest's shmoo, ours beside raw (`bench::shmoo`): one row per direction
    /// and size (`config` empty), then per direction the bands' geometric means and the
    /// lowest ratio of any size (`config` says which).
    pub shmoo: Vec<HostRow>,
    /// The same operations through cudarc in the same run (`bench::peers`): ours beside
    /// cudarc's (`reference`); `ratio` is the speed of ours over cudarc's.
    pub peers: Vec<HostRow>,
    /// graphs.cu's protocol run process by process (`bench::graphs::procs`): each side's
    /// medians over its processes beside the reference's (`reference`: graphs.cu where
    /// `--graphs-reference` names it, else raw `cuda-mem-sys` calls from Rust); `ratio` is the
    /// speed of the side over the reference's, paired by round (the median over rounds of the
    /// reference's figure over the side's).
    pub processes: Vec<HostRow>,
}

/// One figure beside its reference from the same run: host-side (`bench::host`), the shmoo
/// (`bench::shmoo`, reference: raw calls) and the peers (`bench::peers`, reference: cudarc).
#[derive(Debug, Clone, PartialEq)]
pub struct HostRow {
    /// `memcpy`, `pool`, `pool_threads`, `host_pool_vs_pinned_pool`, `cold_pin`,
    /// `cold_pin_free`, `cold_pin_copy`, `staged_h2d`, `staged_d2h`, `staged_sweep_h2d`,
    /// `staged_sweep_d2h`.
    pub test: &'static str,
    /// The configuration measured, e.g. `threads=8 huge=true`.
    pub config: String,
    /// Bytes per operation.
    pub bytes: u64,
    /// `GB/s`, `us` or `ms`.
    pub unit: &'static str,
    /// Ours (median, or the percentile the configuration names).
    pub ours: f64,
    /// The reference (the driver's path, `cudaHostAlloc`, one thread; see `bench::host`).
    pub reference: f64,
    /// Speed of ours relative to the reference (> 1: ours is faster); NaN where there is
    /// no reference.
    pub ratio: f64,
}

/// Host-to-device and device-to-host copies of pinned memory at once, on two streams.
#[derive(Debug, Clone, PartialEq)]
pub struct BidirRow {
    /// Bytes per copy in each direction.
    pub bytes: u64,
    /// Copy pairs per timed sample.
    pub reps: u32,
    /// Timed samples.
    pub samples: u32,
    /// One way alone, same streams and method: host to device, GB/s (median).
    pub h2d_gbps: f64,
    /// One way alone: device to host, GB/s (median).
    pub d2h_gbps: f64,
    /// Both at once, through cuda-mem: bytes moved both ways / time, GB/s (median).
    pub gbps: f64,
    /// Both at once through raw `cudaMemcpyAsync`, GB/s (median).
    pub raw_gbps: f64,
    /// Ours / raw aggregate bandwidth, interquartile mean over interleaved pairs.
    pub ratio: f64,
    /// First and third quartile of the aggregate through cuda-mem, GB/s.
    pub spread: (f64, f64),
}

/// One two-GPU measurement (`bench::multi`): ours against the raw runtime path.
#[derive(Debug, Clone, PartialEq)]
pub struct MultiRow {
    /// `peer_copy`, `peer_latency`, `nopeer_copy`, `staged` or `nccl_all_reduce`.
    pub test: &'static str,
    /// `0to1`, `1to0`, or `2 ranks`.
    pub direction: &'static str,
    /// Bytes per copy or per rank's buffer.
    pub bytes: u64,
    /// `GB/s`, `us`, or `GB/s busbw`.
    pub unit: &'static str,
    /// Ours (median).
    pub ours: f64,
    /// Raw (median): `cudaMemcpyPeerAsync`, or the two serial copies for `staged`; NaN where
    /// the reference runs outside this program (`nccl_peer.py`).
    pub raw: f64,
    /// Speed of ours relative to raw (raw time / our time; 1 = parity), interquartile mean
    /// of interleaved pairs.
    pub ratio: f64,
    /// First and third quartile of ours (NaN when unknown).
    pub spread: (f64, f64),
}

/// No spread measured.
pub const NO_SPREAD: (f64, f64) = (f64::NAN, f64::NAN);

impl BenchResults {
    /// Whether every data check passed (and at least one was made).
    pub fn all_verified(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.ok)
    }
}

/// The copy kinds, in report order. For `host_pool` (pinned memory from a host-location pool,
/// `bench::pools`) the raw column is `cudaHostAlloc` memory through the same calls.
pub const COPY_KINDS: [&str; 7] = [
    "pageable",
    "pinned",
    "write_combined",
    "mapped",
    "registered",
    "device",
    "host_pool",
];

/// The kernel kinds, in report order.
pub const KERNEL_KINDS: [&str; 4] = ["device", "mapped", "managed_fault", "managed_prefetched"];

/// The allocation kinds, in report order; the `pool*` and `host_pool` rows are stream-ordered
/// allocation (`bench::pools`; `pool_bookkeeping_only` is an ablation of `pool`).
pub const ALLOC_KINDS: [&str; 11] = [
    "device",
    "pinned",
    "write_combined",
    "mapped",
    "managed",
    "registered",
    "pool_default_sync",
    "pool_sync",
    "pool",
    "pool_bookkeeping_only",
    "host_pool",
];

#[cfg(test)]
pub mod sample {
    //! Fixed sample data for the writers' tests.
    use super::*;

    /// A small, complete result set with one error.
    pub fn results() -> BenchResults {
        let caps = MemoryCapabilities {
            can_map_host_memory: true,
            unified_addressing: true,
            managed_memory: true,
            concurrent_managed_access: true,
            pageable_memory_access: false,
            host_native_atomics: false,
        };
        let mut copies = Vec::new();
        for (kind, dirs, peak) in [
            ("pageable", &["h2d", "d2h"][..], 20.0),
            ("pinned", &["h2d", "d2h"][..], 55.0),
            ("device", &["d2d"][..], 1800.0),
        ] {
            for dir in dirs {
                for (i, bytes) in [4096u64, 1 << 20, 64 << 20].into_iter().enumerate() {
                    let gbps = peak * (i as f64 + 1.0) / 3.0;
                    copies.push(CopyRow {
                        kind,
                        direction: dir,
                        bytes,
                        reps: if bytes < 1 << 24 { 16 } else { 1 },
                        samples: 5,
                        gbps,
                        raw_gbps: gbps / 0.99,
                        ratio: 0.99,
                        spread: (gbps * 0.98, gbps * 1.01),
                    });
                }
            }
        }
        BenchResults {
            version: "0.1.0".into(),
            versions: Versions {
                runtime: "13.0".into(),
                driver: "13.0".into(),
                built_with: "13.0".into(),
            },
            device: DeviceInfo {
                ordinal: 0,
                name: "NVIDIA H200".into(),
                compute_capability: (9, 0),
                pci_bus_id: "0000:18:00.0".into(),
                free_bytes: 140 << 30,
                total_bytes: 141 << 30,
                caps,
                extra: DeviceExtra {
                    memory_pools: Some(true),
                    host_memory_pools: Some(true),
                    copy_engines: Some(3),
                    pcie_link: Some(PcieLink {
                        speed: "32.0 GT/s PCIe".into(),
                        width: Some(16),
                        max_speed: Some("32.0 GT/s PCIe".into()),
                        max_width: Some(16),
                    }),
                },
            },
            method: Method {
                quick: true,
                warmup: 1,
                samples: 5,
                sizes: vec![4096, 1 << 20, 64 << 20],
                blocking_kernel: true,
                kernel_bytes: 64 << 20,
                managed_bytes: 64 << 20,
            },
            copies,
            kernels: vec![
                KernelRow {
                    kind: "device",
                    op: "read",
                    bytes: 64 << 20,
                    samples: 5,
                    gbps: 4000.0,
                    spread: (3990.0, 4010.0),
                },
                KernelRow {
                    kind: "managed_prefetched",
                    op: "prefetch",
                    bytes: 64 << 20,
                    samples: 5,
                    gbps: 40.0,
                    spread: NO_SPREAD,
                },
            ],
            allocs: vec![AllocRow {
                kind: "pinned",
                bytes: 4096,
                reps: 9,
                us: 12.5,
                raw_us: 12.0,
                ratio: 1.0417,
                note: None,
                spread: (12.3, 12.9),
            }],
            calls: vec![CallRow {
                test: "loop",
                direction: "h2d",
                bytes: 4096,
                calls: 2000,
                us: 2.05,
                raw_us: 2.0,
                ratio: 0.9756,
                spread: (2.04, 2.07),
            }],
            checks: vec![Check {
                what: "pinned h2d+d2h copies".into(),
                bytes: 64 << 20,
                ok: true,
                detail: None,
            }],
            errors: vec![KindError {
                kind: "mapped".into(),
                stage: "copies",
                message: "unsupported: device 0 does not support \"mapping\"".into(),
            }],
            seconds: 12.5,
            multi: vec![MultiRow {
                test: "peer_copy",
                direction: "0to1",
                bytes: 256 << 20,
                unit: "GB/s",
                ours: 392.0,
                raw: 393.0,
                ratio: 0.9975,
                spread: NO_SPREAD,
            }],
            bidir: vec![BidirRow {
                bytes: 256 << 20,
                reps: 2,
                samples: 5,
                h2d_gbps: 55.0,
                d2h_gbps: 55.5,
                gbps: 91.5,
                raw_gbps: 91.9,
                ratio: 0.9956,
                spread: (91.0, 91.8),
            }],
            host: vec![HostRow {
                test: "staged_h2d",
                config: "default".into(),
                bytes: 256 << 20,
                unit: "GB/s",
                ours: 30.5,
                reference: 8.3,
                ratio: 3.67,
            }],
            shmoo: vec![
                HostRow {
                    test: "shmoo_h2d",
                    config: String::new(),
                    bytes: 22_000,
                    unit: "GB/s",
                    ours: 8.1,
                    reference: 8.3,
                    ratio: 0.976,
                },
                HostRow {
                    test: "shmoo_h2d",
                    config: "band 22 kB-1 MB (geometric mean of 29 sizes)".into(),
                    bytes: 1_000_000,
                    unit: "GB/s",
                    ours: 20.2,
                    reference: 20.4,
                    ratio: 0.99,
                },
            ],
            peers: vec![HostRow {
                test: "alloc_free_pinned",
                config: "pool / cudarc alloc_pinned".into(),
                bytes: 4096,
                unit: "us",
                ours: 0.15,
                reference: 5.9,
                ratio: 39.3,
            }],
            processes: vec![HostRow {
                test: "graphs_processes_kernels",
                config: "cuda-mem launcher / graphs.cu: graph, host time per round, medians of \
                         7 / 7 processes"
                    .into(),
                bytes: 4096,
                unit: "us",
                ours: 1.52,
                reference: 1.5,
                ratio: 0.987,
            }],
        }
    }
}

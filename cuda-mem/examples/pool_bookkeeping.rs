//! The host bookkeeping of a pooled buffer (`DeviceBuffer::from_pool` + drop without the two
//! runtime calls: pool and stream handles, fence, allocation recorded, free ordered), timed on
//! the CPU with stand-in handles (`cuda_mem::measure::detached_pool_pairs`): needs no GPU and
//! no driver. The GPU-side counterpart is `cuda-mem bench`'s `pool_bookkeeping_only` row.
//!
//! Run: `cargo run --release -p cuda-mem --features measure --example pool_bookkeeping`
//! (optional arguments: samples, pairs per sample).

use cuda_mem::measure::detached_pool_pairs;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u32>());
    let samples = args.next().transpose()?.unwrap_or(21).max(1);
    let pairs = args.next().transpose()?.unwrap_or(200_000).max(1);
    detached_pool_pairs(pairs, 4096)?; // warm-up
    let mut ns: Vec<f64> = (0..samples)
        .map(|_| detached_pool_pairs(pairs, 4096).map(|t| t.as_secs_f64() * 1e9 / f64::from(pairs)))
        .collect::<cuda_mem::Result<_>>()?;
    ns.sort_by(f64::total_cmp);
    println!(
        "pooled alloc + free bookkeeping: {:.1} ns per pair (median of {samples} x {pairs} pairs; \
         min {:.1}, max {:.1})",
        ns[ns.len() / 2],
        ns[0],
        ns[ns.len() - 1]
    );
    Ok(())
}

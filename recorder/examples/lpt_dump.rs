//! Print a short digest of an `.lpt` trace: counts per record kind, the
//! header, threads and images. A debugging aid for recorder work.

use lrnprof_format::{Record, TraceReader};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: lpt_dump TRACE [--all]")?;
    let all = std::env::args().any(|a| a == "--all");
    let r = TraceReader::open(&path)?;
    println!("{:?}", r.header());
    println!("report: {:?}", r.report());
    let (mut samples, mut stack_bytes, mut chain) = (0u64, 0u64, 0u64);
    for rec in r.records() {
        match rec? {
            Record::Sample(s) => {
                samples += 1;
                stack_bytes += s.stack.bytes.len() as u64;
                chain += s.kernel_callchain.len() as u64;
                if all {
                    println!(
                        "sample t={} tid={} ip={:#x} sp={:#x} stack={} flags={} chain={:x?}",
                        s.time.0,
                        s.tid.0,
                        s.regs.ip(),
                        s.regs.sp(),
                        s.stack.bytes.len(),
                        s.flags.0,
                        s.kernel_callchain
                    );
                }
            }
            Record::Blob(b) => println!(
                "blob {} {:?} {} bytes at {} of {}",
                b.build_id,
                b.kind,
                b.data.len(),
                b.offset,
                b.total_len
            ),
            other => println!("{other:?}"),
        }
    }
    println!(
        "samples {samples}, avg live stack {} B, avg callchain {}",
        stack_bytes / samples.max(1),
        chain as f64 / samples.max(1) as f64
    );
    Ok(())
}
